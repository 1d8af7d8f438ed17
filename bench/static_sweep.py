"""Benchmark the static sweep on this CPU: cold and warm time, configs/s, pruning ratio per reason.

    python bench/static_sweep.py --gpu mi250 mi300x mi355x --out reports/static-sweep-<date>-cpu.md

Each GPU is swept twice into a fresh cache directory: cold (every config compiled)
and warm (every observation read back). Nothing here needs a GPU.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import sys
import tempfile
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", nargs="+", default=["mi250", "mi300x", "mi355x"])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", default=None, help="markdown file to write (default: print only)")
    args = parser.parse_args(argv)

    import triton

    from rocmflash.config import Problem
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.static.compile import sweep
    from rocmflash.static.prune import prune
    from rocmflash.static.space import default_space

    problem = Problem(head_dim=args.head_dim, dtype=args.dtype)
    rows = []
    for name in args.gpu:
        gpu = get_gpu(name)
        configs = default_space(gpu).configs(problem, gpu)
        with tempfile.TemporaryDirectory(prefix="rocmflash-sweep-bench-") as cache:
            t0 = time.perf_counter()
            observations, cold = sweep(configs, problem, gpu, cache_dir=cache, workers=args.workers)
            cold_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            _, warm = sweep(configs, problem, gpu, cache_dir=cache, workers=args.workers)
            warm_s = time.perf_counter() - t0
        assert warm.compiled == 0, "warm run compiled something"
        reasons = collections.Counter(v.reason or "kept" for v in prune(observations))
        row = {"gpu": name, "arch": gpu.arch, "configs": len(configs), "cold_s": round(cold_s, 1),
               "configs_per_s": round(len(configs) / cold_s, 2), "warm_s": round(warm_s, 2),
               "failed": cold.failed}
        for reason in ("kept", "spills", "lds_over_budget", "below_occupancy_floor", "cliff_victim",
                       "duplicate_binary", "compile_failed", "kept_best_of_pruned"):
            row[reason] = f"{reasons.get(reason, 0)} ({100 * reasons.get(reason, 0) / len(configs):.0f}%)"
        rows.append(row)
        print(row, flush=True)

    header = list(rows[0])
    lines = [
        f"# Static sweep on a CPU — {datetime.date.today().isoformat()}",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, no GPU; Python {platform.python_version()}, "
        f"Triton {triton.__version__}",
        f"- problem: head_dim={args.head_dim}, {args.dtype}, non-causal; default config space per GPU, all variants",
        f"- command: `python bench/static_sweep.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "- cold = fresh cache, every config cross-compiled and read; warm = the same sweep again (cache reads only)",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(str(r[k]) for k in header) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
