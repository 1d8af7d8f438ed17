"""Where an fp8-cache decode step loses bandwidth: the cache's access pattern or the kernel's work per byte.

For one decode problem (one token, Hq 32, D 128, contiguous ``(B, S, Hkv, D)`` cache), three kernels
with the decode kernel's grid (``num_splits`` x ``B * Hkv`` programs, each a contiguous chunk of
key blocks) and its K (``[D, BLOCK_N]``) and V (``[BLOCK_N, D]``) tile addressing are replayed from a
CUDA/HIP graph over cache copies larger than twice the L2:

* ``bytes``: the tiles are loaded and folded with an integer max of their raw bytes (no conversion,
  no dot): the rate the access pattern allows;
* ``widen``: the tiles are widened fp8 -> fp16 and summed in fp32 (the decode kernel's conversions,
  no dot);
* ``decode``: the decode kernel itself (:mod:`rocmflash.kernels.decode.host`, split + combine).

A bf16 cache with half the K/V heads (the same bytes) runs ``bytes`` and ``decode`` too. Output: µs and %
of the HBM peak per kernel.

What the first run showed (H100, ``reports/decode-fp8-sweep-2026-11-26-h100.md``): ``bytes`` and ``widen`` were
*slower* than the decode kernel (their per-block cross-thread reductions cost more than its two small dots),
so they bound nothing; the useful rows are ``decode`` over the fp8 cache against ``decode`` over the bf16
cache of the same bytes.

Usage (on a GPU)::

    python bench/decode_fp8_probe.py --out $OUT --problems 8x8192,8x16384
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import triton
import triton.language as tl

from decode import hbm_peak


@triton.jit
def _stream(K, V, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh, OUT, SEQ_K, H_KV,
            NUM_SPLITS, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, WIDEN: tl.constexpr,
            BYTE: tl.constexpr):
    split = tl.program_id(0)
    off_bhk = tl.program_id(1)
    off_b = off_bhk // H_KV
    off_hk = off_bhk % H_KV
    offs_d = tl.arange(0, HEAD_DIM)
    blocks_per_split = tl.cdiv(tl.cdiv(SEQ_K, BLOCK_N), NUM_SPLITS)
    s_lo = split * blocks_per_split * BLOCK_N
    s_hi = tl.minimum(SEQ_K, s_lo + blocks_per_split * BLOCK_N)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    acc_i = tl.zeros([HEAD_DIM], tl.int32)
    for start_n in range(s_lo, s_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_rows = off_b.to(tl.int64) * stride_kb + offs_n.to(tl.int64) * stride_kn
        v_rows = off_b.to(tl.int64) * stride_vb + offs_n.to(tl.int64) * stride_vn
        k = tl.load(K + off_hk * stride_kh + k_rows[None, :] + offs_d[:, None])
        v = tl.load(V + off_hk * stride_vh + v_rows[:, None] + offs_d[None, :])
        if WIDEN:
            acc += tl.sum(k.to(tl.float16).to(tl.float32), 1) + tl.sum(v.to(tl.float16).to(tl.float32), 0)
        else:
            if BYTE:
                kb = k.to(tl.int8, bitcast=True)
                vb = v.to(tl.int8, bitcast=True)
            else:
                kb = k.to(tl.int16, bitcast=True)
                vb = v.to(tl.int16, bitcast=True)
            acc_i = tl.maximum(acc_i, tl.max(kb, 1).to(tl.int32)) + tl.max(vb, 0).to(tl.int32)
    tl.store(OUT + off_bhk * NUM_SPLITS * HEAD_DIM + split * HEAD_DIM + offs_d, acc + acc_i.to(tl.float32))


def _graph_us(fns) -> float:
    from rocmflash.tuning.isolated import graph_replay_ms

    return graph_replay_ms(fns, 20, 5, warmup=2) * 1e3


def probe(torch, batch: int, kv: int, kv_heads: int, dtype, configs) -> list:
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels import masks as M

    Hq, D, dev = 32, 128, "cuda"
    nbytes = 2 * batch * kv * kv_heads * D * dtype.itemsize
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = max(2, min(8, -(-2 * l2 // nbytes)))
    caches = [tuple(torch.randn(batch, kv, kv_heads, D, device=dev).to(dtype) for _ in range(2)) for _ in range(copies)]
    fp8 = dtype.itemsize == 1
    q = torch.randn(batch, 1, Hq, D, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    seqlens = torch.full((batch,), kv, device=dev, dtype=torch.int32)
    scales = torch.ones(batch, kv_heads, device=dev) if fp8 else None
    call = KD.DecodeCall(batch, 1, kv_heads, Hq // kv_heads, D, False, 0, D ** -0.5, 0.0,
                         *M.band_offsets(False, (-1, -1)), kv_fp8=fp8)
    rows = []
    for bn, warps, stages, splits in configs:
        sink = torch.empty(batch * kv_heads * splits * D, device=dev)
        grid = (splits, batch * kv_heads)
        kinds = {"bytes": False, "widen": True} if fp8 else {"bytes": False}
        for kind, widen in kinds.items():
            fns = [functools.partial(_stream[grid], k, v, k.stride(0), k.stride(1), k.stride(2), v.stride(0),
                                     v.stride(1), v.stride(2), sink, kv, kv_heads, splits, BLOCK_N=bn, HEAD_DIM=D,
                                     WIDEN=widen, BYTE=fp8, num_warps=warps, num_stages=stages) for k, v in caches]
            us = _graph_us(fns)
            rows.append(dict(kind=kind, batch=batch, kv=kv, kv_heads=kv_heads, dtype=str(dtype), BLOCK_N=bn,
                             num_warps=warps, num_stages=stages, splits=splits, us=us, gbs=nbytes / us / 1e3))
        ws = (torch.empty(batch * kv_heads * splits * call.block_m * call.block_d, device=dev),
              torch.empty(batch * kv_heads * splits * call.block_m, device=dev))
        cfg = KD.DecodeConfig(BLOCK_N=bn, num_warps=warps, num_stages=stages)
        fns = [functools.partial(KD.launch, call, q, k, v, seqlens, seqlens, cfg, splits, out, None, ws,
                                 k_descale=scales, v_descale=scales) for k, v in caches]
        us = _graph_us(fns)
        rows.append(dict(kind="decode", batch=batch, kv=kv, kv_heads=kv_heads, dtype=str(dtype), BLOCK_N=bn,
                         num_warps=warps, num_stages=stages, splits=splits, us=us, gbs=nbytes / us / 1e3))
        for r in rows[-len(kinds) - 1:]:
            print(json.dumps(r), flush=True)
    del caches
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--problems", default="8x8192,8x16384")
    ap.add_argument("--configs", default="64x4x3x4,64x4x4x4,128x4x3x4,64x4x3x8,128x8x3x4,256x8x3x4",
                    help="BLOCK_N x warps x stages x splits, comma-separated")
    args = ap.parse_args(argv)
    import torch

    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    peak = hbm_peak(torch.cuda.get_device_name())
    rows = []
    for p in args.problems.split(","):
        b, kv = (int(x) for x in p.split("x"))
        rows += probe(torch, b, kv, 8, torch.float8_e4m3fn, configs)
        rows += probe(torch, b, kv, 4, torch.bfloat16, configs)  # the same bytes in a bf16 cache (Hkv 4)
    lines = [f"# fp8 decode probe ({torch.cuda.get_device_name()}), HBM peak {peak} GB/s", "",
             "| kind | cache | B | KV | Hkv | BN w s splits | µs | GB/s (% peak) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kind']} | {r['dtype']} | {r['batch']} | {r['kv']} | {r['kv_heads']} | {r['BLOCK_N']} "
                     f"{r['num_warps']} {r['num_stages']} {r['splits']} | {r['us']:.1f} | {r['gbs']:.0f} "
                     f"({r['gbs'] / peak:.0%}) |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode-fp8-probe.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "decode-fp8-probe.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
