"""Decode kernel sweep: which tiles, stages and split counts reach the memory bandwidth, on one GPU.

For each decode problem (one new token, D=128, Hq=32 / Hkv=4, bf16, contiguous cache), every
config of a small grid -- ``BLOCK_N`` x warps x stages x split count (a multiple of what
:func:`rocmflash.kernels.decode.host.choose_num_splits` picks) -- runs the split and combine
kernels captured in a CUDA/HIP graph (20 calls per replay), so what is timed is GPU time. The
same is done for SDPA on the dense cache. Each replay cycles through copies of the K/V cache
larger than twice the last-level cache together (each call finds its cache cold, as each layer
of a model does; the decode tuner times the same way). Output: per problem the best configs,
the heuristic's own pick, and % of the HBM peak (K+V bytes / time).

Usage (on a GPU)::

    python bench/decode_sweep.py --out $OUT [--quick | --problems 8x8192,1x32768] [--label NAME]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import itertools
import json
import os
import sys

from decode import hbm_peak
from interleaved import kernel_device_us

PROBLEMS = ((1, 32768), (8, 8192), (8, 32768), (8, 65536), (32, 8192), (32, 32768))
CALLS_PER_GRAPH = 20


def _graph_time(torch, fns, reps: int = 5) -> float:
    """µs per call of ``fns`` (cycled) replayed from a CUDA graph of CALLS_PER_GRAPH calls (median of ``reps`` replays)."""
    from rocmflash.tuning.isolated import graph_replay_ms

    return graph_replay_ms(fns, CALLS_PER_GRAPH, reps, warmup=2) * 1e3


def _copies(torch, nbytes: int) -> int:
    """How many K/V cache copies exceed twice the L2 together (2..8)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(8, -(-2 * l2 // nbytes)))


#: the tile grid per ``--grid``: (BLOCK_N values, warps, stages, split-count factors of the heuristic's pick)
GRIDS = {"default": ((64, 128), (4, 8), (1, 2, 3), (0.5, 1, 2, 4)),
         "wide": ((64, 128, 256), (4, 8), (2, 3, 4), (0.5, 1, 2, 4, 8)),
         # split counts between the powers of two the tuner times: how far filling the GPU's program slots goes
         "splits": ((32, 64, 128), (2, 4), (3, 4), (0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3))}


def sweep(torch, F, problems, kv_heads: int = 4, kv_dtype: str = "bf16", grid: str = "default"):
    from rocmflash.hw.fp8 import FAMILY_DTYPES
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels import masks as M
    from rocmflash.kernels.common import num_compute_units

    dev, dt, Hq, Hkv, D = "cuda", torch.bfloat16, 32, kv_heads, 128
    fp8 = kv_dtype == "fp8"
    arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    cache_dt = FAMILY_DTYPES["fnuz" if arch.startswith(("gfx940", "gfx941", "gfx942")) else "ocp"][0] if fp8 else dt
    cus = num_compute_units(torch.device(dev))
    block_ns, warp_list, stage_list, factors = GRIDS[grid]
    rows = []
    for batch, kv in problems:
        gbytes = 2 * batch * kv * Hkv * D * (1 if fp8 else 2) / 1e9
        q = torch.randn(batch, 1, Hq, D, device=dev, dtype=dt)
        caches = [tuple(torch.randn(batch, kv, Hkv, D, device=dev, dtype=dt).to(cache_dt) for _ in range(2))
                  for _ in range(_copies(torch, int(gbytes * 1e9)))]
        scales = torch.ones(batch, Hkv, device=dev) if fp8 else None
        seqlens = torch.full((batch,), kv, device=dev, dtype=torch.int32)
        out = torch.empty_like(q)
        call = KD.DecodeCall(batch, 1, Hkv, Hq // Hkv, D, False, 0, D ** -0.5, 0.0, *M.band_offsets(False, (-1, -1)),
                             kv_fp8=fp8)
        if fp8:  # SDPA has no fp8: the anchor is a copy of the cache (read + write bytes)
            dst = [torch.empty_like(k) for k, _ in caches]
            sdpa_us = _graph_time(torch, [functools.partial(d.copy_, k) for d, (k, _) in zip(dst, caches)])
            copy_gbs = 2 * caches[0][0].numel() / (sdpa_us * 1e-6) / 1e9
            del dst
        else:
            sdpa_us = _graph_time(torch, [functools.partial(F.scaled_dot_product_attention, q.transpose(1, 2),
                                                            k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
                                          for k, v in caches])
            copy_gbs = None
        for bn, warps, stages in itertools.product(block_ns, warp_list, stage_list):
            cfg = KD.DecodeConfig(BLOCK_N=bn, num_warps=warps, num_stages=stages)
            auto = KD.choose_num_splits(batch, Hkv, kv, bn, cus, KD.programs_per_cu(cfg, fp8))
            blocks = -(-kv // bn)
            seen = set()
            for factor in factors:
                splits = max(1, min(128, blocks, int(auto * factor)))
                if splits in seen:
                    continue
                seen.add(splits)
                rows_per_split = batch * Hkv * splits
                ws = (torch.empty(rows_per_split * call.block_m * call.block_d, device=dev, dtype=torch.float32),
                      torch.empty(rows_per_split * call.block_m, device=dev, dtype=torch.float32))
                fns = [functools.partial(KD.launch, call, q, k, v, seqlens, seqlens, cfg, splits, out, None, ws,
                                         k_descale=scales, v_descale=scales) for k, v in caches]
                try:
                    us = _graph_time(torch, fns)
                except Exception as err:  # noqa: BLE001 - a config the GPU cannot run (shared memory): recorded
                    rows.append(dict(batch=batch, kv=kv, BLOCK_N=bn, num_warps=warps, num_stages=stages,
                                     splits=splits, error=f"{type(err).__name__}: {str(err)[:100]}"))
                    continue
                rows.append(dict(batch=batch, kv=kv, BLOCK_N=bn, num_warps=warps, num_stages=stages,
                                 splits=splits, auto_splits=auto, factor=factor, us=us, gbs=gbytes / (us * 1e-6),
                                 sdpa_us=sdpa_us, copy_gbs=copy_gbs, kv_dtype=kv_dtype, fns=fns))
        timed = sorted((r for r in rows if r.get("fns") and r["batch"] == batch and r["kv"] == kv),
                       key=lambda r: r["us"])
        for r in timed[:3]:  # where the best configs' time goes: split and combine kernels apart
            r["kernel_us"] = kernel_device_us(torch, r["fns"][0])
        for r in rows:
            r.pop("fns", None)
        print(f"B{batch} KV{kv}: done ({len(rows)} rows)", flush=True)
        del caches
        torch.cuda.empty_cache()
    return [r for r in rows if "us" in r], [r for r in rows if "error" in r]


def markdown(rows, peak, meta) -> str:
    lines = [f"# Decode kernel sweep ({meta['device']})", "",
             f"- date: {meta['date']}; torch {meta['torch']}, Triton {meta['triton']}; HBM peak {peak} GB/s",
             f"- command: `{meta['command']}`",
             f"- one new token, D=128, Hq32/Hkv{meta.get('kv_heads', 4)}, bf16 q, {meta.get('kv_dtype', 'bf16')} "
             "contiguous cache; split + combine kernels replayed from a "
             f"graph ({CALLS_PER_GRAPH} calls per replay, cycling through K/V copies > 2x L2), SDPA (default "
             "backend, dense cache) the same way", ""]
    if meta.get("label"):
        lines.insert(3, f"- label: {meta['label']}")
    kernels = []
    by_problem = {}
    for r in rows:
        by_problem.setdefault((r["batch"], r["kv"]), []).append(r)
    lines += ["| B | KV | SDPA µs (% HBM) | best config | µs (% HBM) | vs SDPA | heuristic splits, best tile µs | "
              "5 best |", "|---|---|---|---|---|---|---|---|"]
    for (batch, kv), rs in by_problem.items():
        rs = sorted(rs, key=lambda r: r["us"])
        for r in rs[:3]:
            if r.get("kernel_us"):
                kernels.append(f"B{batch} KV{kv} BN{r['BLOCK_N']} w{r['num_warps']} s{r['num_stages']} "
                               f"x{r['splits']}: {r['us']:.1f} us replayed; per kernel (eager, profiler): "
                               + ", ".join(f"{k} {v}" for k, v in r["kernel_us"].items()))
        best = rs[0]
        gb = best["gbs"] * best["us"] * 1e-6
        same_tile = [r for r in rs if r["factor"] == 1 and (r["BLOCK_N"], r["num_warps"], r["num_stages"]) ==
                     (best["BLOCK_N"], best["num_warps"], best["num_stages"])]
        top = "; ".join(f"BN{r['BLOCK_N']} w{r['num_warps']} s{r['num_stages']} x{r['splits']}: {r['us']:.1f}"
                        for r in rs[:5])
        lines.append(f"| {batch} | {kv} | {best['sdpa_us']:.1f} ({gb / (best['sdpa_us'] * 1e-6) / peak:.0%}) | "
                     f"BN{best['BLOCK_N']} w{best['num_warps']} s{best['num_stages']} x{best['splits']} | "
                     f"{best['us']:.1f} ({best['gbs'] / peak:.0%}) | {best['sdpa_us'] / best['us']:.2f}x | "
                     f"{same_tile[0]['splits'] if same_tile else '-'}: "
                     f"{same_tile[0]['us'] if same_tile else float('nan'):.1f} | {top} |")
    if any(r.get("kv_dtype") == "fp8" for r in rows):
        lines += ["", "fp8 cache: the 'SDPA' column is a device copy of one K cache (torch has no fp8 attention); "
                  "its read+write rate: " + ", ".join(sorted({f"{r['copy_gbs']:.0f} GB/s" for r in rows
                                                              if r.get("copy_gbs")}))]
    if kernels:
        lines += ["", "Per kernel of the 3 best configs of each problem:", ""] + [f"- {k}" for k in kernels]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true", help="B1 KV32k and B8 KV32k only")
    ap.add_argument("--problems", default=None, help="comma-separated BxKV, e.g. 8x8192,1x32768")
    ap.add_argument("--kv-heads", type=int, default=4, help="K/V heads (Hq is 32)")
    ap.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16",
                    help="the cache's dtype (fp8: the arch's e4m3 format, descales 1; anchor: a cache copy)")
    ap.add_argument("--grid", choices=tuple(GRIDS), default="default", help="the tile grid swept")
    ap.add_argument("--label", default="", help="names this run in the output files (decode-sweep-LABEL.md)")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    import triton

    problems = ((1, 32768), (8, 32768)) if args.quick else PROBLEMS
    if args.problems:
        problems = tuple(tuple(int(x) for x in p.split("x")) for p in args.problems.split(","))
    rows, failed = sweep(torch, F, problems, args.kv_heads, args.kv_dtype, args.grid)
    name = torch.cuda.get_device_name()
    meta = dict(device=name, date=datetime.date.today().isoformat(), torch=torch.__version__,
                triton=triton.__version__, command="python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]), label=args.label,
                kv_heads=args.kv_heads, kv_dtype=args.kv_dtype)
    text = markdown(rows, hbm_peak(name), meta)
    os.makedirs(args.out, exist_ok=True)
    stem = "decode-sweep" + (f"-{args.label}" if args.label else "")
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "failed": failed}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
