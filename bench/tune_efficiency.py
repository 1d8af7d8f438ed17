"""Tuning-efficiency benchmark: ``--strategy pruned`` vs exhaustive tuning, on a live GPU.

For bf16 and fp16, D = 64 and 128, S = 2k and 8k, causal both (16 problems; B = 16384/S,
H = 2048/D): an exhaustive tune (every config of ``default_space(gpu)``) and a pruned
tune (static pruner + static score, top-K timed) of the same problem, each with its own
journal and database so neither reuses the other's timings. Per problem it records
best-of-pruned / best-of-exhaustive (TFLOP/s, independent measurements), the fraction
of the space the pruned tune timed, wall time of each, and, where the pruned tune
missed the exhaustive winner, that winner's static verdict (pruned, and why; or kept
but ranked below K).

Order: per (dtype, D, causal) the pruned tunes of both S first, then the exhaustive
ones, so the exhaustive tunes find the pruned configs' kernels already compiled (the
pruned wall times are not helped by the exhaustive ones). One live runner (timing
worker + pre-warm pool) serves every tune; the cold, one-problem CLI tune is measured
separately (``--cold``).

Usage (device):  python bench/tune_efficiency.py run --out DIR --work DIR [--dtypes bf16] [--budget-s 420]
                 python bench/tune_efficiency.py cold --out DIR --work DIR        # one CLI tune, cold caches
Usage (CPU):     python bench/tune_efficiency.py report --results DIR [DIR...] --md reports/tune-....md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

PROBLEMS = [(dtype, D, causal, S) for dtype in ("bf16", "fp16") for D in (128, 64) for causal in (False, True)
            for S in (2048, 8192)]


def log(*a):
    print(*a, flush=True)


def _summ(entry: dict, wall: float) -> dict:
    c = entry["counts"]
    return {"best_tflops": entry.get("tflops"), "best_ms": entry.get("time_ms"), "best_config": entry.get("best"),
            "timed": c["timed"], "space": c["space"], "survivors": c["survivors"], "ok": c["ok"],
            "incorrect": c["incorrect"], "failed": c["failed"], "timeout": c["timeout"], "crashed": c["crashed"],
            "wall_s": round(wall, 2), "efficiency": entry.get("efficiency"), "roofline": entry.get("roofline"),
            "best_static_rank": entry.get("best_static_rank"), "best_verdict": entry.get("best_verdict")}


def _plan(text: str) -> list:
    """``"fp16/128/0/pe,bf16/64/1/p"`` -> [(dtype, D, causal, strategies)] (p = pruned, e = exhaustive)."""
    out = []
    for item in filter(None, text.split(",")):
        dtype, d, c, strat = item.split("/")
        out.append((dtype, int(d), c == "1", [{"p": "pruned", "e": "exhaustive"}[x] for x in strat]))
    return out


def run(args) -> int:
    import torch

    from rocmflash.hw.gpus import get_gpu
    from rocmflash.static.compile import ObservationCache
    from rocmflash.static.space import default_space
    from rocmflash.tune import TuneSpec, shape_key, static_phase, static_problem, tune
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    os.makedirs(args.out, exist_ok=True)
    settings = LiveSettings(timeout_s=90, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, min_reps=10, max_reps=100)
    cache = args.cache_dir
    triton_cache = os.path.join(ObservationCache(cache).root, "live-triton")
    results_path = os.path.join(args.out, "results.json")
    results = []
    start = time.time()
    runner = LiveRunner(settings, triton_cache_dir=triton_cache, prewarm_workers=args.prewarm_workers)
    log(f"device {torch.cuda.get_device_name(0)}; torch {torch.__version__}; settings {settings}")
    if args.plan:
        groups = _plan(args.plan)
    else:
        dtypes = args.dtypes.split(",")
        groups = []
        for dtype, D, causal, S in PROBLEMS:
            if dtype in dtypes and (dtype, D, causal, ["pruned", "exhaustive"]) not in groups:
                groups.append((dtype, D, causal, ["pruned", "exhaustive"]))
    gpu = get_gpu("h100")
    try:
        for dtype, D, causal, strategies in groups:
            if time.time() - start > args.budget_s:
                log(f"budget reached after {time.time() - start:.0f} s: stopping before {dtype} D={D} causal={causal}")
                break
            group = {}
            static_rows = None
            for strategy in strategies:
                for S in (2048, 8192):
                    spec = TuneSpec(gpu="auto", head_dim=D, dtype=dtype, seqlens=[S], causal=causal, strategy=strategy,
                                    db_path=os.path.join(args.work, strategy, "h100.json"), cache_dir=cache,
                                    workers=args.workers, live_settings=settings)
                    key = shape_key(spec.validate().shape(S))
                    t0 = time.time()
                    res = tune(spec, runner=runner, console=None, progress=False)
                    wall = time.time() - t0
                    entry = res.outcomes[0].entry
                    group.setdefault(key, {"key": key, "dtype": dtype, "D": D, "S": S, "causal": causal,
                                           "shape": entry["shape"]})[strategy] = _summ(entry, wall)
                    log(f"{key} {strategy}: best {entry.get('tflops')} TFLOP/s, timed {entry['counts']['timed']}"
                        f"/{entry['counts']['space']}, {wall:.1f} s")
                    if static_rows is None:  # the static features, for re-ranking offline
                        st = static_phase(gpu, static_problem(spec.shape(S)), default_space(gpu), cache, args.workers)
                        static_rows = [{"config": c.config.to_dict(), "kept": c.kept, "reason": c.reason,
                                        "static_rank": c.static_rank,
                                        **{k: (c.observation["kernels"][0].get(k) if c.observation.get("kernels")
                                               else None)
                                           for k in ("waves_per_simd", "allocated_vgprs", "lds_bytes",
                                                     "dynamic_lds_bytes", "vgpr_spill_count")}}
                                       for c in st.candidates]
            for key, r in group.items():
                r["static"] = static_rows
                if "pruned" in r and "exhaustive" in r and r["exhaustive"]["best_tflops"]:
                    r["ratio"] = round((r["pruned"]["best_tflops"] or 0) / r["exhaustive"]["best_tflops"], 4)
                    r["fraction_timed"] = round(r["pruned"]["timed"] / r["pruned"]["space"], 4)
                results.append(r)
                log(f"{key}: ratio {r.get('ratio')}, fraction {r.get('fraction_timed')}")
            with open(results_path, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        runner.close()
        log(f"timing worker restarts: {runner.restarts}; total {time.time() - start:.0f} s")
    return 0


def cold(args) -> int:
    """One full pruned tune through the CLI with empty compile caches (the 'minutes' claim)."""
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, ROCMFLASH_CACHE_DIR=os.path.join(args.work, "coldcache"), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "rocmflash.cli.tune", "tune", "--gpu", "auto", "--head-dim", "128", "--dtype",
           "bf16", "--seqlen", "4096", "--db", os.path.join(args.work, "cold", "h100.json")]
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    log(proc.stdout[-6000:])
    log(proc.stderr[-3000:])
    rec = {"command": " ".join(["rocmflash", *cmd[3:]]), "exit_code": proc.returncode, "wall_s": round(wall, 1)}
    with open(os.path.join(args.out, "cold.json"), "w") as f:
        json.dump(rec, f, indent=1)
    log(f"cold pruned tune via CLI: exit {proc.returncode}, {wall:.1f} s")
    return proc.returncode


# ====================================================================== report (CPU)
def _label(cfg):
    from rocmflash.tune import _label as label

    return label(cfg) if cfg else "-"


def _journal(path):
    recs = []
    if os.path.exists(path):
        for line in open(path):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "config" in r:
                recs.append(r)
    return recs


def _spearman(xs, ys):
    import numpy as np

    if len(xs) < 3:
        return None
    rx, ry = np.argsort(np.argsort(xs)), np.argsort(np.argsort(ys))
    return float(np.corrcoef(rx, ry)[0, 1])


def _replay_pruned(r: dict, meas: dict, k: int):
    """Best-of-top-K under the current static score, from the recorded static features and exhaustive timings."""
    from rocmflash.config import KernelConfig
    from rocmflash.tune import static_key

    rows = [x for x in r.get("static") or [] if x["kept"]]
    if not rows:
        return None, None
    order = sorted(range(len(rows)), key=lambda i: static_key(KernelConfig.from_dict(rows[i]["config"]),
                                                              {"kernels": [rows[i]]}, i))
    top = [KernelConfig.from_dict(rows[i]["config"]).to_json() for i in order[:k]]
    best = max(top, key=lambda c: meas.get((r["key"], c), 0))
    return meas.get((r["key"], best), 0), json.loads(best)


def report(args) -> int:
    # later directories win per key; a ratio is only formed within one directory (one machine, one run)
    merged, journals = {}, {}
    for d in args.results:
        p = os.path.join(d, "results.json")
        if os.path.exists(p):
            for r in json.load(open(p)):
                if "ratio" in r or r["key"] not in merged:
                    merged[r["key"]] = dict(r, source=d)
        journals[d] = _journal(os.path.join(d, "exhaustive.journal.jsonl"))
    results = list(merged.values())
    order = {(dt, D, c, S): i for i, (dt, D, c, S) in enumerate(PROBLEMS)}
    results.sort(key=lambda r: order.get((r["dtype"], r["D"], r["causal"], r["S"]), 99))
    meas = {}
    for d, recs in journals.items():
        for rec in recs:
            if merged.get(rec["key"], {}).get("source") == d:
                from rocmflash.config import KernelConfig

                meas[(rec["key"], KernelConfig.from_dict(rec["config"]).to_json())] = rec["tflops"] or 0
    head = ("| dtype | D | causal | S | exhaustive best TFLOP/s | exhaustive winner | pruned (live, first score) | ratio "
            "| winner's static verdict (first score) | pruned (replay, current score) | ratio (replay) | timed | "
            "wall pruned (s) | wall exhaustive (s) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    ratios, replays = [], []
    for r in results:
        e, p = r.get("exhaustive"), r.get("pruned")
        if not e or not p:
            continue
        verdict, rank, k = e.get("best_verdict"), e.get("best_static_rank"), p["timed"]
        if verdict and verdict != "kept":
            why = f"pruned ({verdict})"
        elif rank is not None and rank >= k:
            why = f"kept, rank {rank + 1} > K={k}: not timed"
        else:
            why = f"kept, rank {rank + 1 if rank is not None else '?'}: timed"
        rep, rep_cfg = _replay_pruned(r, meas, k)
        rep_ratio = rep / e["best_tflops"] if rep else None
        ratios.append(r["ratio"])
        if rep_ratio:
            replays.append(rep_ratio)
        lines.append(f"| {r['dtype']} | {r['D']} | {'yes' if r['causal'] else 'no'} | {r['S']} | {e['best_tflops']:.1f} | "
                     f"{_label(e['best_config'])} | {p['best_tflops']:.1f} ({_label(p['best_config'])}) | "
                     f"{r['ratio']:.3f} | {why} | "
                     + (f"{rep:.1f} ({_label(rep_cfg)}) | {rep_ratio:.3f}" if rep_ratio else "- (no exhaustive journal) | -")
                     + f" | {k}/{p['space']} ({r['fraction_timed']:.1%}) | {p['wall_s']:.1f} | "
                     f"{e['wall_s']:.1f} |")
    out = ["\n".join(lines), ""]
    if ratios:
        import statistics

        out.append(f"Live pruned / exhaustive (first static score): min {min(ratios):.3f}, median "
                   f"{statistics.median(ratios):.3f}, {sum(x >= 0.98 for x in ratios)}/{len(ratios)} problems >= 0.98.")
    if replays:
        import statistics

        out.append(f"Replayed pruned / exhaustive (current static score, exhaustive timings): min {min(replays):.3f}, "
                   f"median {statistics.median(replays):.3f}, {sum(x >= 0.98 for x in replays)}/{len(replays)} "
                   "problems >= 0.98.")
    statuses = {}
    for d, recs in journals.items():
        for rec in recs:
            if merged.get(rec["key"], {}).get("source") == d:
                statuses[rec["status"]] = statuses.get(rec["status"], 0) + 1
    if statuses:
        out.append("Exhaustive journal statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) + ".")
    text = "\n".join(out) + "\n"
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    print(text)
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--cache-dir", default=os.environ.get("ROCMFLASH_CACHE_DIR"))
    r.add_argument("--dtypes", default="bf16,fp16")
    r.add_argument("--budget-s", type=float, default=420)
    r.add_argument("--workers", type=int, default=None)
    r.add_argument("--prewarm-workers", type=int, default=None)
    r.add_argument("--warmup-ms", type=float, default=10)
    r.add_argument("--rep-ms", type=float, default=40)
    r.add_argument("--plan", default=None, help="dtype/D/causal/strategies items, e.g. fp16/128/0/pe,bf16/64/1/p")
    c = sub.add_parser("cold")
    c.add_argument("--out", required=True)
    c.add_argument("--work", required=True)
    rp = sub.add_parser("report")
    rp.add_argument("--results", nargs="+", required=True)
    rp.add_argument("--md", default=None)
    args = ap.parse_args()
    return {"run": run, "cold": cold, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
