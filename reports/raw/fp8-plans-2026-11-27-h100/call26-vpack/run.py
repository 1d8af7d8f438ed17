"""Experiment: the fp8-KV decode split kernel with V read as packed int32 words (VPACK=1: shifts, VPACK=2: PTX cvt),
patched over rocmflash's before running bench/decode_sweep.py; VPACK=0: the shipped kernel. Also a GPU correctness
check against an fp32 reference over the dequantised cache."""
import importlib.util, os, sys
import torch
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "bench"))
from rocmflash.kernels import kv_decode as KD
vpack = int(os.environ.get("VPACK", "0"))
if vpack:
    spec = importlib.util.spec_from_file_location("proto_kvj", os.path.join(here, "proto_kvj.py"))
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    KD._decode_split = mod._decode_split


def check():
    import rocmflash
    torch.manual_seed(1)
    errs = []
    for B, L, cap in ((8, 8192, 8192), (3, 1000, 1536)):
        q = torch.randn(B, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        kf, vf = (torch.randn(B, cap, 8, 128, device="cuda") * 3 for _ in range(2))
        ks, vs = (torch.rand(B, 8, device="cuda") + 0.5 for _ in range(2))
        kc = (kf / ks[:, None, :, None]).to(torch.float8_e4m3fn)
        vc = (vf / vs[:, None, :, None]).to(torch.float8_e4m3fn)
        lens = torch.randint(L // 2, L + 1, (B,), device="cuda", dtype=torch.int32)
        out = rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, k_descale=ks, v_descale=vs)
        kd = kc.float() * ks[:, None, :, None]
        vd = vc.float() * vs[:, None, :, None]
        qf = q.float()
        ref = torch.empty_like(qf)
        for b in range(B):
            n = int(lens[b])
            kk = kd[b, :n].repeat_interleave(4, dim=1)
            vv = vd[b, :n].repeat_interleave(4, dim=1)
            s = torch.einsum("hd,nhd->hn", qf[b, 0], kk) / 128 ** 0.5
            ref[b, 0] = torch.einsum("hn,nhd->hd", s.softmax(-1), vv)
        errs.append(((out.float() - ref).norm() / ref.norm()).item())
    print(f"VPACK={vpack} rel L2 err vs fp32 reference: {errs}", flush=True)


if __name__ == "__main__":
    check()
    import decode_sweep
    sys.exit(decode_sweep.main(sys.argv[1:]))
