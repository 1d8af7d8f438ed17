"""Held-out check of the ``race`` strategy against exhaustive tuning, on a live GPU.

Problems no static score or strategy was fitted on (the static score was fitted on
D = 64/128, S = 2k/8k, no GQA): D = 80/96/192/256, GQA 8:1, fp16 and bf16, causal both,
S = 1k/4k/16k. Per problem, in one process with one live runner:

1. a ``race`` tune, then an ``exhaustive`` tune, each as a user would run it cold: its own
   journal, database, static-phase cache, Triton cache and live runner (neither reuses the
   other's timings or compiles);
2. both winners measured again, alternating, 3 times each with the full settings: the
   ratio of those medians separates a strategy miss from measurement noise;
3. Spearman's rank correlation between the static rank and the measured speed of the
   exhaustive tune's kept configs.

Usage (device)::

    python bench/race_heldout.py run --out $OUT --work /tmp/race [--problems 0-5]
    python bench/race_heldout.py report --results DIR [DIR ...] --md reports/race-heldout-....md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: (dtype, D, causal, S, heads, kv_heads); heads None = 2048 // D
PROBLEMS = [
    ("bf16", 80, True, 1024, None, None),
    ("fp16", 80, False, 4096, None, None),
    ("bf16", 96, False, 16384, None, None),
    ("fp16", 96, True, 4096, None, None),
    ("bf16", 192, True, 4096, None, None),
    ("fp16", 192, False, 1024, None, None),
    ("bf16", 256, False, 4096, None, None),
    ("fp16", 256, True, 16384, None, None),
    ("bf16", 128, True, 4096, 32, 4),
    ("fp16", 128, False, 16384, 32, 4),
    ("bf16", 64, True, 1024, 32, 4),
    ("fp16", 80, True, 16384, 32, 4),
]


def log(*a):
    print(*a, flush=True)


def _indices(text: str) -> list:
    out = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def run(args) -> int:
    import torch

    from rocmflash.config import KernelConfig
    from rocmflash.static.compile import triton_cache_dir
    from rocmflash.tune import TuneSpec, shape_key, tune
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    os.makedirs(args.out, exist_ok=True)
    settings = LiveSettings(timeout_s=90)
    caches = {s: os.path.join(args.work, s, "cache") for s in ("race", "exhaustive")}
    # as tune() wires its own runner: the workers launch from the static phase's Triton cache
    runners = {s: LiveRunner(settings, triton_cache_dir=triton_cache_dir(c), prewarm_workers=args.prewarm_workers)
               for s, c in caches.items()}
    log(f"device {torch.cuda.get_device_name(0)}; torch {torch.__version__}; settings {settings}")
    results_path = os.path.join(args.out, f"race-heldout-{args.label}.json")
    results = []
    try:
        for i in _indices(args.problems):
            dtype, D, causal, S, heads, kv = PROBLEMS[i]
            row = {"index": i, "dtype": dtype, "D": D, "causal": causal, "S": S, "heads": heads, "kv_heads": kv}
            for strategy in ("race", "exhaustive"):
                spec = TuneSpec(gpu="auto", head_dim=D, dtype=dtype, seqlens=[S], causal=causal, heads=heads,
                                kv_heads=kv, strategy=strategy, db_path=os.path.join(args.work, strategy, "gpu.json"),
                                cache_dir=caches[strategy], workers=args.workers, live_settings=settings)
                row["key"] = shape_key(spec.validate().shape(S))
                t0 = time.time()
                res = tune(spec, runner=runners[strategy], console=None, progress=False)
                e = res.outcomes[0].entry
                row[strategy] = {"wall_s": round(time.time() - t0, 2), "best": e.get("best"),
                                 "tflops": e.get("tflops"), "counts": e["counts"],
                                 "best_static_rank": e.get("best_static_rank"),
                                 "static_s": round(res.outcomes[0].static_seconds, 2),
                                 "records_s": _records_seconds(args.work, strategy, row["key"])}
                log(f"[{i}] {row['key']} {strategy}: {e.get('tflops')} TFLOP/s, {row[strategy]['wall_s']} s, "
                    f"counts {e['counts']}")
            shape = spec.shape(S)
            # both winners again, alternating, full settings
            again = {"race": [], "exhaustive": []}
            for _ in range(3):
                for strategy in again:
                    best = row[strategy]["best"]
                    if best:
                        r = runners["exhaustive"].measure(KernelConfig.from_dict(best), shape)
                        if r.get("status") == "ok":
                            again[strategy].append(r["median_ms"])
            if again["race"] and again["exhaustive"]:
                row["remeasured_ratio"] = round(statistics.median(again["exhaustive"]) /
                                                statistics.median(again["race"]), 4)
            if row["race"]["tflops"] and row["exhaustive"]["tflops"]:
                row["ratio"] = round(row["race"]["tflops"] / row["exhaustive"]["tflops"], 4)
                row["wall_fraction"] = round(row["race"]["wall_s"] / row["exhaustive"]["wall_s"], 4)
            row["spearman"] = _static_correlation(args.work, row["key"])
            results.append(row)
            log(f"[{i}] ratio {row.get('ratio')}, again {row.get('remeasured_ratio')}, "
                f"wall fraction {row.get('wall_fraction')}, spearman {row['spearman']}")
            with open(results_path, "w") as f:
                json.dump(results, f, indent=1)
            _copy_journals(args)  # after every problem: a run cut short keeps what it measured
    finally:
        for r in runners.values():
            r.close()
    return 0


def _records_seconds(work: str, strategy: str, key: str) -> float:
    """Wall seconds of the strategy's timing records of ``key`` (what is neither static phase nor pre-warm)."""
    total = 0.0
    with open(os.path.join(work, strategy, "gpu.journal.jsonl")) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("key") == key and r.get("wall_s"):
                total += r["wall_s"]
    return round(total, 2)


def _copy_journals(args) -> None:
    import shutil

    for strategy in ("race", "exhaustive"):  # the raw timings, every round
        src = os.path.join(args.work, strategy, "gpu.journal.jsonl")
        if os.path.exists(src):
            shutil.copy(src, os.path.join(args.out, f"journal-{args.label}-{strategy}.jsonl"))


def _static_correlation(work: str, key: str):
    """Spearman(static rank, measured speed) over the exhaustive tune's kept, successfully timed configs."""
    path = os.path.join(work, "exhaustive", "gpu.journal.jsonl")
    ranks, speeds = [], []
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("key") == key and r.get("status") == "ok" and r.get("static_rank") is not None:
            ranks.append(r["static_rank"])
            speeds.append(-r["tflops"])  # rank 0 = best static = should be fastest
    from tune_efficiency import _spearman  # bench/ is this script's directory

    rho = _spearman(ranks, speeds)
    return None if rho is None else round(rho, 3)


def _split(tune_row: dict) -> str:
    """``"compile / timing"`` seconds of one tune: timing = its records' wall time, compile = the rest
    (static phase, pre-warm, set-up); ``-`` for runs that did not record it."""
    if tune_row.get("records_s") is None:
        return "-"
    return f"{tune_row['wall_s'] - tune_row['records_s']:.1f} / {tune_row['records_s']:.1f}"


def report(args) -> int:
    rows = []
    for d in args.results:
        for name in sorted(os.listdir(d)):
            if name.startswith("race-heldout") and name.endswith(".json"):
                rows.extend(json.load(open(os.path.join(d, name))))
    rows.sort(key=lambda r: r["index"])
    from rocmflash.tune import _label

    lines = ["| problem | exhaustive best | winner | race best | race winner | ratio | same-run re-measure "
             "(exh./race time) | timed: race rounds | exhaustive timed | wall race / exhaustive (s) | fraction | "
             "Spearman (static rank vs speed) | race: compile / timing (s) | exhaustive: compile / timing (s) |",
             "|" + "---|" * 14]
    for r in rows:
        e, ra = r["exhaustive"], r["race"]
        gqa = f" GQA {r['heads'] // r['kv_heads']}:1" if r.get("kv_heads") else ""
        name = f"{r['dtype']} D{r['D']}{gqa} {'causal' if r['causal'] else 'full'} S{r['S']}"
        rounds = " > ".join(map(str, ra["counts"].get("rounds", [])))
        lines.append(f"| {name} | {e['tflops']} | {_label(e['best']) if e['best'] else '-'} | {ra['tflops']} | "
                     f"{_label(ra['best']) if ra['best'] else '-'} | {r.get('ratio')} | {r.get('remeasured_ratio')} | "
                     f"{rounds} | {e['counts']['timed']} | {ra['wall_s']} / {e['wall_s']} | {r.get('wall_fraction')} | "
                     f"{r.get('spearman')} | {_split(ra)} | {_split(e)} |")
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    again = [r["remeasured_ratio"] for r in rows if r.get("remeasured_ratio")]
    fractions = [r["wall_fraction"] for r in rows if r.get("wall_fraction")]
    summary = []
    if ratios:
        summary.append(f"race / exhaustive best (each tune's own measurement): min {min(ratios):.3f}, median "
                       f"{statistics.median(ratios):.3f}, {sum(x >= 0.99 for x in ratios)}/{len(ratios)} >= 0.99")
    if again:
        summary.append(f"winners re-measured in one run (exhaustive winner time / race winner time): min "
                       f"{min(again):.3f}, median {statistics.median(again):.3f}, "
                       f"{sum(x >= 0.99 for x in again)}/{len(again)} >= 0.99")
    if fractions:
        summary.append(f"wall time race / exhaustive: median {statistics.median(fractions):.3f}, max {max(fractions):.3f}")
    text = "\n".join(lines) + "\n\n" + "\n".join(f"- {s}" for s in summary) + "\n"
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    print(text)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--problems", default=f"0-{len(PROBLEMS) - 1}")
    r.add_argument("--label", default="gpu")
    r.add_argument("--workers", type=int, default=None)
    r.add_argument("--prewarm-workers", type=int, default=None)
    rp = sub.add_parser("report")
    rp.add_argument("--results", nargs="+", required=True)
    rp.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    return {"run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
