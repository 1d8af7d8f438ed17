import torch, sys
sys.argv = ["x"]
from rocmflash.kernels import kv_decode as KD
from rocmflash.kernels import masks as M
torch.manual_seed(0)
worst = 0
for fp8 in (False, True):
    for (B, Hq, Hkv, KV, pack, splits, bn) in ((8, 32, 8, 8192, 4, 16, 32), (8, 32, 8, 3001, 2, 8, 64), (3, 32, 8, 1000, 4, 4, 16), (2, 16, 8, 777, 8, 3, 32)):
        D = 128
        q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(B, KV, Hkv, D, device="cuda", dtype=torch.bfloat16); vc = torch.randn_like(kc)
        ks = vs = None
        if fp8:
            ks = torch.rand(B, Hkv, device="cuda") + 0.5; vs = torch.rand(B, Hkv, device="cuda") + 0.5
            kc = (kc.float() / ks[:, None, :, None]).to(torch.float8_e4m3fn); vc = (vc.float() / vs[:, None, :, None]).to(torch.float8_e4m3fn)
        seq = torch.randint(KV // 2, KV + 1, (B,), device="cuda", dtype=torch.int32)
        outs = []
        for p, sp in ((1, max(1, splits // pack)), (pack, splits)):
            call = KD.DecodeCall(B, 1, Hkv // p, (Hq // Hkv) * p, D, False, 0, D ** -0.5, 0.0, *M.band_offsets(False, (-1, -1)), kv_fp8=fp8, pack=p)
            out = torch.full_like(q, float("nan"))
            KD.launch(call, q, kc, vc, seq, seq, KD.DecodeConfig(BLOCK_N=bn, num_warps=4, num_stages=2), sp, out, None, k_descale=ks, v_descale=vs)
            outs.append(out.float())
        kf = kc.float() * (ks[:, None, :, None] if fp8 else 1); vf = vc.float() * (vs[:, None, :, None] if fp8 else 1)
        g = Hq // Hkv
        kr = kf.repeat_interleave(g, 2); vr = vf.repeat_interleave(g, 2)
        mask = torch.arange(KV, device="cuda")[None, :] < seq[:, None]
        s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kr) * D ** -0.5
        ref = torch.einsum("bhqk,bkhd->bqhd", s.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1), vr)
        e = [((o - ref).norm() / ref.norm()).item() for o in outs]
        worst = max(worst, e[1])
        print(f"fp8={fp8} B{B} Hkv{Hkv} KV{KV} pack{pack}: rel err unpacked {e[0]:.2e} packed {e[1]:.2e} nan {outs[1].isnan().any().item()}")
print("WORST packed", worst)
