"""Where a cold tune's timing workers lose time against a warm one: per job, the seconds a cold run spent over the warm
run's same job, from two runs' pipeline traces (``trace.jsonl``, ``$ROCMFLASH_PIPELINE_TRACE``, as
``bench/scale_gpus.py`` keeps them per run) and their journals (``gpu.journal.jsonl``: a forward record's
``worker_s``, its time inside the worker).

    python bench/trace_first_uses.py COLD_RUN_DIR WARM_RUN_DIR [--top 12]

Prints the workers' busy seconds of each run, then the jobs with the largest excess (item, label, when the cold job
started, cold s, warm s), and the forward records whose time inside the worker was largest in the cold run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def jobs(run_dir: str) -> dict:
    """``{(item, label): [(start s, seconds), ...]}`` of a run's trace (job_start/job_done per worker)."""
    started, out = {}, {}
    with open(os.path.join(run_dir, "trace.jsonl"), encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "job_start":
                started[e.get("worker")] = (e["t"], e.get("item"), e.get("label"))
            elif e.get("event") == "job_done" and e.get("worker") in started:
                t0, item, label = started.pop(e.get("worker"))
                out.setdefault((item, label), []).append((t0, e["t"] - t0))
    return out


def worker_seconds(run_dir: str, top: int) -> list:
    """The ``top`` journal records with the most seconds inside the worker: ``(worker_s, wall_s, key, variant)``."""
    rows = []
    with open(os.path.join(run_dir, "gpu.journal.jsonl"), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("worker_s") is not None:
                rows.append((r["worker_s"], r.get("wall_s"), r.get("key"), (r.get("config") or {}).get("variant")))
    return sorted(rows, reverse=True)[:top]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cold")
    ap.add_argument("warm")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    cold, warm = jobs(args.cold), jobs(args.warm)
    for name, run in (("cold", cold), ("warm", warm)):
        print(f"{name}: workers busy {sum(d for v in run.values() for _, d in v):.1f} s in all")
    excess = []
    for key, done in cold.items():
        if key in warm:
            c, w = sum(d for _, d in done), sum(d for _, d in warm[key])
            excess.append((c - w, key, done[0][0], c, w))
    excess.sort(key=lambda x: -x[0])
    print(f"\nexcess of the cold run over the warm one: {sum(x[0] for x in excess):.1f} s; largest:\n")
    print("| item | job | cold start s | cold s | warm s | excess s |\n|---|---|---|---|---|---|")
    for ex, (item, label), t0, c, w in excess[:args.top]:
        print(f"| {item} | {label} | {t0:.1f} | {c:.2f} | {w:.2f} | {ex:.2f} |")
    print("\ncold run, forward records with the most seconds inside the worker:\n")
    print("| worker s | wall s | key | variant |\n|---|---|---|---|")
    for ws, wall, key, variant in worker_seconds(args.cold, min(args.top, 6)):
        print(f"| {ws} | {wall} | {key} | {variant} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
