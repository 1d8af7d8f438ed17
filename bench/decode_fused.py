"""Decode: the fused merge (the last split of each group merges) against the separate combine launch.

For each decode problem (one new token, D=128, Hq=32 / Hkv=4, bf16, contiguous cache) and a few
tiles x split counts (multiples of what :func:`rocmflash.kernels.kv_decode.choose_num_splits`
picks), the split kernel runs once with ``fused=True`` and once with ``fused=False`` (split
kernel + combine kernel), each checked against an fp32 reference, then timed as the tuner times
decode: a CUDA/HIP graph of back-to-back calls cycling through copies of the K/V cache larger
than the last-level cache together. SDPA (default backend, dense cache) is timed the same way.
Then the public API (``flash_attn_with_kvcache`` with the shipped configs) eager, unchecked,
and graph-replayed, with each merge, interleaved.

Usage (on a GPU)::

    python bench/decode_fused.py --out $OUT [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys

from decode import hbm_peak
from interleaved import capture_graph, interleaved_medians

PROBLEMS = ((1, 8192), (1, 32768), (1, 65536), (8, 2048), (8, 8192), (8, 32768), (32, 2048), (32, 8192))
TILES = ((64, 4, 3), (128, 4, 1), (128, 8, 1), (64, 4, 1))
FACTORS = (0.5, 1, 2, 4)
HQ, HKV, D = 32, 4, 128
CALLS_PER_GRAPH = 20


def _copies(torch, batch, kv):
    """K/V cache copies whose total exceeds twice the L2 (at least 2)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    one = 2 * batch * kv * HKV * D * 2
    return max(2, min(8, -(-2 * l2 // one)))


def _rel_err(torch, out, ref) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def kernel_rows(torch, F, KD, M, problems, tiles, saved=lambda rows: None):
    from rocmflash.kernels.common import num_compute_units
    from rocmflash.tuning.isolated import graph_replay_ms

    dev, dt = "cuda", torch.bfloat16
    cus = num_compute_units(torch.device(dev))
    rows = []
    for batch, kv in problems:
        n = _copies(torch, batch, kv)
        q = torch.randn(batch, 1, HQ, D, device=dev, dtype=dt)
        caches = [(torch.randn(batch, kv, HKV, D, device=dev, dtype=dt),
                   torch.randn(batch, kv, HKV, D, device=dev, dtype=dt)) for _ in range(n)]
        lens = torch.full((batch,), kv, device=dev, dtype=torch.int32)
        kc, vc = caches[0]
        ref = F.scaled_dot_product_attention(q.transpose(1, 2).float(), kc.transpose(1, 2).float(),
                                             vc.transpose(1, 2).float(), enable_gqa=True).transpose(1, 2)
        call = KD.DecodeCall(batch, 1, HKV, HQ // HKV, D, False, 0, D ** -0.5, 0.0, *M.band_offsets(False, (-1, -1)))
        gbytes = 2 * batch * kv * HKV * D * 2 / 1e9
        sdpa = [functools.partial(F.scaled_dot_product_attention, q.transpose(1, 2), k.transpose(1, 2),
                                  v.transpose(1, 2), enable_gqa=True) for k, v in caches]
        sdpa_us = graph_replay_ms(sdpa, CALLS_PER_GRAPH, 5, warmup=2) * 1e3
        for bn, warps, stages in tiles:
            cfg = KD.DecodeConfig(BLOCK_N=bn, num_warps=warps, num_stages=stages)
            auto = KD.choose_num_splits(batch, HKV, kv, bn, cus, KD.programs_per_cu(cfg))
            seen = set()
            for factor in FACTORS:
                splits = max(2, min(128, -(-kv // bn), int(auto * factor)))
                if splits in seen:
                    continue
                seen.add(splits)
                for fused in (True, False):
                    out = torch.full_like(q, float("nan"))
                    KD.launch(call, q, kc, vc, lens, lens, cfg, splits, out, fused=fused)
                    torch.cuda.synchronize()
                    err = _rel_err(torch, out, ref)
                    outs = [torch.empty_like(q) for _ in caches]
                    fns = [functools.partial(KD.launch, call, q, k, v, lens, lens, cfg, splits, o, fused=fused)
                           for (k, v), o in zip(caches, outs)]
                    us = graph_replay_ms(fns, CALLS_PER_GRAPH, 5, warmup=2) * 1e3
                    # a replayed graph re-uses its counters: every output must still be right
                    replay_err = max(_rel_err(torch, o, ref) for o in outs[:1])
                    rows.append(dict(batch=batch, kv=kv, BLOCK_N=bn, num_warps=warps, num_stages=stages,
                                     splits=splits, auto_splits=auto, fused=fused, us=us, gbs=gbytes / (us * 1e-6),
                                     sdpa_us=sdpa_us, rel_err=err, replay_rel_err=replay_err))
        print(f"B{batch} KV{kv}: {len(rows)} rows", flush=True)
        saved(rows)
        del caches
        torch.cuda.empty_cache()
    return rows


def api_rows(torch, KD, problems, rounds, iters):
    """Public API, shipped configs: eager unchecked and graph-replayed, fused vs separate, interleaved."""
    import rocmflash
    from rocmflash.decode import decode_config

    dev, dt = "cuda", torch.bfloat16
    real_launch = KD.launch
    separate = functools.partial(real_launch, fused=False)
    rows = []
    for batch, kv in problems:
        q = torch.randn(batch, 1, HQ, D, device=dev, dtype=dt)
        kc, vc = torch.randn(batch, kv, HKV, D, device=dev, dtype=dt), torch.randn(batch, kv, HKV, D, device=dev,
                                                                                   dtype=dt)
        lens = torch.full((batch,), kv, dtype=torch.int32, device=dev)

        def with_launch(launch, fn):
            def run():
                KD.launch = launch
                try:
                    return fn()
                finally:
                    KD.launch = real_launch
            return run

        call = lambda: rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, check_values=False)  # noqa: E731
        paths = {}
        for label, launch in (("fused", real_launch), ("separate", separate)):
            fn = with_launch(launch, call)
            paths[f"{label} eager"] = fn
            paths[f"{label} graph"] = capture_graph(torch, fn)
        med = interleaved_medians(torch, paths, rounds, iters)
        cfg = decode_config(q.device, D, q.dtype, HQ // HKV, kv, batch)
        served = f"BN{cfg.BLOCK_N} w{cfg.num_warps} s{cfg.num_stages} x{cfg.num_splits or 'auto'}"
        for path, us in med.items():
            rows.append(dict(batch=batch, kv=kv, path=path, us=us,
                             gbs=2 * batch * kv * HKV * D * 2 / (us * 1e-6) / 1e9, served=served))
        print(f"api B{batch} KV{kv}: " + ", ".join(f"{p} {t:.1f}" for p, t in med.items()), flush=True)
    return rows


def markdown(krows, arows, peak, meta) -> str:
    lines = [f"# Decode: fused merge vs separate combine ({meta['device']})", "",
             f"- date: {meta['date']}; torch {meta['torch']}, Triton {meta['triton']}; HBM peak {peak} GB/s",
             f"- command: `{meta['command']}`",
             f"- one new token, D=128, Hq32/Hkv4, bf16, contiguous cache; graph of {CALLS_PER_GRAPH} calls over "
             "K/V copies > 2x L2; µs per call (median of 5 replays); rel err vs fp32 SDPA", "",
             "## Kernels: best of each merge per problem", "",
             "| B | KV | SDPA µs | fused best | µs (% HBM) | separate best | µs (% HBM) | separate / fused | "
             "max rel err fused / separate |", "|---|---|---|---|---|---|---|---|---|"]
    by_problem = {}
    for r in krows:
        by_problem.setdefault((r["batch"], r["kv"]), []).append(r)
    for (batch, kv), rs in by_problem.items():
        best = {f: min((r for r in rs if r["fused"] == f), key=lambda r: r["us"]) for f in (True, False)}
        label = lambda r: f"BN{r['BLOCK_N']} w{r['num_warps']} s{r['num_stages']} x{r['splits']}"  # noqa: E731
        errs = {f: max(max(r["rel_err"], r["replay_rel_err"]) for r in rs if r["fused"] == f) for f in (True, False)}
        lines.append(f"| {batch} | {kv} | {rs[0]['sdpa_us']:.1f} | {label(best[True])} | {best[True]['us']:.1f} "
                     f"({best[True]['gbs'] / peak:.0%}) | {label(best[False])} | {best[False]['us']:.1f} "
                     f"({best[False]['gbs'] / peak:.0%}) | {best[False]['us'] / best[True]['us']:.3f}x | "
                     f"{errs[True]:.1e} / {errs[False]:.1e} |")
    lines += ["", "## Kernels: every config (µs; fused / separate)", "",
              "| B | KV | tile | splits | fused µs | separate µs | separate / fused |", "|---|---|---|---|---|---|---|"]
    pairs = {}
    for r in krows:
        pairs.setdefault((r["batch"], r["kv"], r["BLOCK_N"], r["num_warps"], r["num_stages"], r["splits"]),
                         {})[r["fused"]] = r["us"]
    for (b, kv, bn, w, s, n), t in pairs.items():
        lines.append(f"| {b} | {kv} | BN{bn} w{w} s{s} | {n} | {t[True]:.1f} | {t[False]:.1f} | "
                     f"{t[False] / t[True]:.3f}x |")
    if arows:
        lines += ["", "## Public API (`flash_attn_with_kvcache`, shipped configs, `check_values=False`)", "",
                  "| B | KV | served config | path | µs | % HBM |", "|---|---|---|---|---|---|"]
        for r in arows:
            lines.append(f"| {r['batch']} | {r['kv']} | {r['served']} | {r['path']} | {r['us']:.1f} | "
                         f"{r['gbs'] / peak:.0%} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true", help="B8 KV8k and B1 KV32k, two tiles")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    import triton

    from rocmflash.kernels import kv_decode as KD
    from rocmflash.kernels import masks as M

    if not torch.cuda.is_available():
        print("bench/decode_fused.py needs a GPU", file=sys.stderr)
        return 2
    problems = ((8, 8192), (1, 32768)) if args.quick else PROBLEMS
    tiles = TILES[:2] if args.quick else TILES
    name = torch.cuda.get_device_name()
    meta = dict(device=name, date=datetime.date.today().isoformat(), torch=torch.__version__,
                triton=triton.__version__, command="python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]))
    os.makedirs(args.out, exist_ok=True)

    def save(krows, arows=()):  # after every problem: a run cut short keeps what it measured
        with open(os.path.join(args.out, "decode-fused.md"), "w") as f:
            f.write(markdown(krows, arows, hbm_peak(name), meta))
        with open(os.path.join(args.out, "decode-fused.json"), "w") as f:
            json.dump({"meta": meta, "kernels": krows, "api": list(arows)}, f, indent=1)

    krows = kernel_rows(torch, F, KD, M, problems, tiles, save)
    arows = api_rows(torch, KD, problems, args.rounds, args.iters)
    save(krows, arows)
    print(markdown(krows, arows, hbm_peak(name), meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
