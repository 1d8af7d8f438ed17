"""Cross-compile AMD's own Triton FA forward kernel at AMD's published configs and read its registers and spills.

Evidence for issue #15 (are the autotune-list tiles rocmflash's pruner rejects ones AMD's own kernel can run
without spilling?). No AMD code ships with rocmflash: extract the kernel yourself from the commit named in
``reports/reference-2026-11-24/README.md`` into one file that defines ``attn_fwd`` (a ``@triton.jit`` function,
its ``@triton.autotune`` decorator dropped, host code and imports that need a GPU removed), then:

    python bench/amd_own_kernel.py --kernel-file /tmp/amd_fa_kernel.py --kind perf --out results.json
    python bench/amd_own_kernel.py --kernel-file /tmp/fa2_kernel.py --kind fa --out results.json

``--kind perf``: ROCm/triton ``main_perf`` ``python/perf-kernels/flash-attention.py`` (``attn_fwd``);
``--kind fa``: ROCm/flash-attention ``main_perf`` ``flash_attn/flash_attn_triton_amd/fwd_prefill.py``.
Arguments are specialised the way AMD's launcher passes them for a plain bf16 call: no bias / alibi /
dropout / int8 / varlen / persistent, None for unused tensors (a constexpr in Triton), strides as Triton
specialises ints (== 1 -> constexpr, multiples of 16 -> ``tt.divisibility``), 16-byte aligned pointers;
``--buffer-ops yes`` marks pointers < 2 GB (``tt.pointer_range = 32``) as a ROCm launch of small tensors does.
Registers, spills and in-loop scratch are read with :mod:`isa_tools`. CPU only (Triton cross-compiles).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.util
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ARCHS = ("gfx942", "gfx950")
NUM_CU = {"gfx942": 304, "gfx950": 256}
# (BLOCK_M, BLOCK_N, num_warps, waves_per_eu, PRE_LOAD_V)
CONFIGS = [
    (128, 128, 4, 2, False),
    (128, 64, 4, 2, False),
    (128, 64, 4, 3, False),
    (128, 64, 4, 3, True),
    (128, 64, 4, 1, False),
    (64, 64, 4, 1, False),
    (64, 64, 4, 2, False),
    (128, 32, 4, 2, False),
    (256, 64, 8, 2, False),
    (256, 128, 8, 2, False),
    (64, 64, 8, 4, False),
    (32, 32, 8, 4, False),
]
D = 128
B, HQ, HK = 4, 16, 16  # a perf-kernels benchmark shape: (4, 16, 16, 4096, 4096)


def specialise_int(v: int):
    if v == 1:
        return "constexpr", False
    ty = "i32" if -2**31 <= v < 2**31 else ("u64" if v >= 2**63 else "i64")
    return ty, v % 16 == 0


def launch_args(arch: str, seq_q: int, seq_k: int, cfg, causal: bool) -> tuple[dict, dict]:
    """(runtime args, constexprs) exactly as `attn_fwd[grid](...)` in _attention.forward passes them."""
    BM, BN, nw, wpe, plv = cfg
    P = lambda ty: ("ptr", ty)
    # bhsd contiguous q/k/v/o: strides (H*S*D, S*D, D, 1)
    qs = (HQ * seq_q * D, seq_q * D, D, 1)
    ks = (HK * seq_k * D, seq_k * D, D, 1)
    args = {"Q": P("*bf16"), "K": P("*bf16"), "V": P("*bf16"), "L": P("*fp32"), "Out": P("*bf16"),
            "atomic_counter": P("*i32"),
            "dropout_p": 0.0, "philox_seed": 0x1BF52, "philox_offset_base": 0x1D4B42}
    for names, vals in ((("stride_qz", "stride_qh", "stride_qm", "stride_qk"), qs),
                        (("stride_kz", "stride_kh", "stride_kn", "stride_kk"), ks),
                        (("stride_vz", "stride_vh", "stride_vk", "stride_vn"), ks),
                        (("stride_oz", "stride_oh", "stride_om", "stride_on"), qs),
                        (("stride_bz", "stride_bh", "stride_bm", "stride_bn"), (0, 0, 0, 0)),
                        (("stride_az", "stride_ah"), (0, 0))):
        args.update(zip(names, vals))
    consts = {
        "bias": None, "Q_descale": None, "K_descale": None, "P_scale": None, "P_descale": None, "V_descale": None,
        "cu_seqlens_q": None, "cu_seqlens_k": None, "encoded_softmax": None, "alibi_slopes": None,
        "SM_SCALE": D ** -0.5, "PERSISTENT": False, "PERSISTENT_DYNAMIC": False, "NUM_CU": NUM_CU[arch],
        "GRID_CU_MULTIP": 2, "B": B, "HQ": HQ, "HK": HK, "ACTUAL_BLOCK_DMODEL": D, "MAX_SEQLENS_Q": seq_q,
        "MAX_SEQLENS_K": seq_k, "VARLEN": False, "IS_CAUSAL": causal, "BLOCK_M": BM, "BLOCK_DMODEL": D,
        "BLOCK_N": BN, "PRE_LOAD_V": plv, "USE_BIAS": False, "ENABLE_DROPOUT": False,
        "RETURN_ENCODED_SOFTMAX": False, "USE_ALIBI": False, "INT8": False, "USE_P_SCALE": False,
        "INT8_KV": False,
    }
    return args, consts


def launch_args_fa(arch: str, seq_q: int, seq_k: int, cfg, causal: bool) -> tuple[dict, dict]:
    """ROCm/flash-attention `attention_prefill_forward_triton_impl` for flash_attn_func (bshd, not varlen, no
    dropout/alibi/bias/fp8, USE_EXP2=True from interface_fa, FLIP_GRID=True, philox from MetaData.need_dropout)."""
    BM, BN, nw, wpe, plv = cfg
    P = lambda ty: ("ptr", ty)
    # bshd contiguous (B, S, H, D): stride_b = S*H*D, stride_h = D, stride_m = H*D, stride_d = 1
    qs = (seq_q * HQ * D, D, HQ * D, 1)
    ks = (seq_k * HK * D, D, HK * D, 1)
    args = {"Q": P("*bf16"), "K": P("*bf16"), "V": P("*bf16"), "LSE": P("*fp32"), "Out": P("*bf16"),
            "dropout_p": 0.0, "philox_seed": 0x1BF58, "philox_offset_base": 0x1D4B49}
    for names, vals in ((("stride_qz", "stride_qh", "stride_qm", "stride_qk"), qs),
                        (("stride_kz", "stride_kh", "stride_kn", "stride_kk"), ks),
                        (("stride_vz", "stride_vh", "stride_vk", "stride_vn"), ks),
                        (("stride_oz", "stride_oh", "stride_om", "stride_on"), qs),
                        (("stride_bz", "stride_bh", "stride_bm", "stride_bn"), (0, 0, 0, 0)),
                        (("stride_az", "stride_ah"), (0, 0)),
                        (("stride_sz", "stride_sh", "stride_sm", "stride_sn"), (0, 0, 0, 0)),
                        # softmax_lse (B, HQ, S) contiguous
                        (("stride_lse_z", "stride_lse_h", "stride_lse_m"), (HQ * seq_q, seq_q, 1))):
        args.update(zip(names, vals))
    consts = {n: None for n in ("bias", "Cache_seqlens", "Cache_batch_idx", "Descale_Q", "Descale_K", "Descale_V",
                                "Descale_O", "stride_descale_q_z", "stride_descale_k_z", "stride_descale_v_z",
                                "stride_descale_o_z", "cu_seqlens_q", "cu_seqlens_k", "sd_mask", "dropout_mask",
                                "alibi_slopes", "FP8_MAX")}
    consts.update({
        "SM_SCALE": D ** -0.5, "HQ": HQ, "HK": HK, "ACTUAL_BLOCK_DMODEL": D, "MAX_SEQLENS_Q": seq_q,
        "MAX_SEQLENS_K": seq_k, "IS_VARLEN": False, "IS_INFERENCE": False, "IS_CAUSAL": causal, "BLOCK_M": BM,
        "BLOCK_DMODEL": D, "BLOCK_N": BN, "PRE_LOAD_V": plv, "USE_BIAS": False, "ENABLE_DROPOUT": False,
        "RETURN_SCORES": False, "USE_ALIBI": False, "USE_EXP2": True, "IS_FP8": False, "FP8_OUTPUT": False,
        "FLIP_GRID": True,
    })
    return args, consts


def build(job):
    arch, cfg, causal, buffer_ops, seq_q, seq_k, kernel, kernel_file, asm_dir = job
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location("amd_attn_fwd", kernel_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    attn_fwd = module.attn_fwd
    while not hasattr(attn_fwd, "arg_names"):  # an autotuned (or heuristics) kernel wraps the JITFunction
        attn_fwd = attn_fwd.fn
    from isa_tools import read_code_object
    from isa_tools.summary import kernel_summary

    BM, BN, nw, wpe, plv = cfg
    args, consts = (launch_args if kernel == "perf" else launch_args_fa)(arch, seq_q, seq_k, cfg, causal)
    signature, cx, attrs = {}, {}, {}
    for i, name in enumerate(attn_fwd.arg_names):
        if name in consts:
            signature[name] = "constexpr"
            cx[name] = consts[name]
            continue
        v = args[name]
        if isinstance(v, tuple):
            signature[name] = v[1]
            attrs[(i,)] = [["tt.divisibility", 16]] + ([["tt.pointer_range", 32]] if buffer_ops else [])
        elif isinstance(v, float):
            signature[name] = "fp32"
        else:
            ty, div = specialise_int(v)
            signature[name] = ty
            if ty == "constexpr":
                cx[name] = v
            elif div:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=attn_fwd, signature=signature, constexprs=cx, attrs=attrs)
    opts = {"num_warps": nw, "num_stages": 1, "waves_per_eu": wpe, "enable_fp_fusion": True}
    t0 = time.time()
    rec = {"kernel": kernel, "arch": arch, "BLOCK_M": BM, "BLOCK_N": BN, "num_warps": nw, "waves_per_eu": wpe, "PRE_LOAD_V": plv,
           "causal": causal, "buffer_ops": buffer_ops, "seq_q": seq_q, "seq_k": seq_k}
    try:
        k = triton.compile(src, target=GPUTarget("hip", arch, 64), options=opts)
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return rec
    asm = k.asm["amdgcn"]
    res = read_code_object(k.asm["hsaco"])[0]
    s = kernel_summary(res, dynamic_lds_bytes=k.metadata.shared, num_warps=nw, asm=asm)
    rec.update({key: s[key] for key in (
        "vgpr_count", "agpr_count", "sgpr_count", "vgpr_spill_count", "sgpr_spill_count", "scratch_bytes",
        "lds_bytes", "dynamic_lds_bytes", "accum_offset", "allocated_vgprs", "waves_per_simd", "limiter",
        "scratch_loads", "scratch_stores", "scratch_loop_loads", "scratch_loop_stores", "scratch_loop_bytes",
        "scratch_outside_bytes", "scratch_lane_ops", "scratch_loop_lane_ops", "scratch_loops")})
    from rocmflash.static.prune import judge  # what rocmflash's pruner says of AMD's own kernel at this config

    verdict = judge({"status": "ok", "config": {"waves_per_eu": wpe}, "kernels": [dict(s, name="attn_fwd")]})
    rec["verdict"] = verdict.reason if not verdict.kept else ("kept" + (f" ({verdict.reason})" if verdict.reason else ""))
    rec["buffer_load_insts"] = sum(1 for ln in asm.splitlines() if ln.strip().startswith("buffer_load"))
    rec["global_load_insts"] = sum(1 for ln in asm.splitlines() if ln.strip().startswith("global_load"))
    rec["compile_s"] = round(time.time() - t0, 1)
    if not asm_dir:
        return rec
    os.makedirs(asm_dir, exist_ok=True)
    tag = (f"{kernel}_{arch}_{BM}x{BN}_w{nw}_wpe{wpe}{'_plv' if plv else ''}_{'causal' if causal else 'noncausal'}"
           f"_{'buf' if buffer_ops else 'glob'}_s{seq_q}x{seq_k}")
    with open(os.path.join(asm_dir, tag + ".amdgcn"), "w") as f:
        f.write(asm)
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--kernel-file", required=True, help="a file defining AMD's attn_fwd (see the module doc)")
    ap.add_argument("--out", required=True, help="results JSON (merged with an existing one)")
    ap.add_argument("--asm-dir", default="", help="also write each build's assembly here")
    ap.add_argument("--seq", type=int, nargs=2, default=[4096, 4096], help="MAX_SEQLENS_Q MAX_SEQLENS_K")
    ap.add_argument("--buffer-ops", choices=("yes", "no", "both"), default="both")
    ap.add_argument("--arch", nargs="+", default=list(ARCHS))
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--kind", choices=("perf", "fa"), default="perf",
                    help="perf: ROCm/triton perf-kernels attn_fwd; fa: ROCm/flash-attention fwd_prefill attn_fwd")
    a = ap.parse_args()
    bufs = {"yes": (True,), "no": (False,), "both": (False, True)}[a.buffer_ops]
    if not os.path.isfile(a.kernel_file):
        sys.exit(f"--kernel-file {a.kernel_file}: no such file (extract AMD's kernel first; see --help)")
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(os.path.dirname(os.path.abspath(a.out)), "triton-cache"))
    jobs = [(arch, cfg, causal, bo, a.seq[0], a.seq[1], a.kind, os.path.abspath(a.kernel_file), a.asm_dir)
            for bo in bufs for arch in a.arch for cfg in CONFIGS for causal in (False, True)]
    if a.limit:
        jobs = jobs[:a.limit]
    t0 = time.time()
    out = []
    with cf.ProcessPoolExecutor(a.workers) as ex:
        for r in ex.map(build, jobs, chunksize=1):
            out.append(r)
            print(json.dumps(r), flush=True)
    prev = json.load(open(a.out)) if os.path.exists(a.out) else []
    key = lambda r: (r.get("kernel", "perf"), r["arch"], r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["waves_per_eu"], r["PRE_LOAD_V"],
                     r["causal"], r["buffer_ops"], r["seq_q"], r["seq_k"])
    merged = {key(r): r for r in prev}
    merged.update({key(r): r for r in out})
    json.dump(list(merged.values()), open(a.out, "w"), indent=1)
    print(f"{len(jobs)} builds in {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
