"""Tune one model preset end to end on the live GPU, with and without the worker pool, and kill a worker midway.

    python benchmarks/model_tune.py --model llama-3.2-1b --dtype bf16 --seqlen 2048 --out DIR [--kill-after 20]

Runs, one after the other, through the CLI a user types:

1. ``rocmflash tune --gpu auto --model M ...`` (one GPU, no pool: the single-GPU path);
2. ``rocmflash tune --gpu auto --model M ... --gpus all`` (the node pool; on a one-GPU machine one worker),
   while a watcher SIGKILLs the pool's timing worker (the GPU process of the tune using the most device
   memory) once the forward journal holds ``--kill-after`` records.

Writes ``DIR/model-tune.json`` and ``DIR/model-tune.md``: wall time of each run and the plan's estimate,
every database entry of each (best config and time), the ratio of their times per problem, and what the
kill cost (journal records with status ``crashed``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _descendants(pid: int) -> set:
    children: dict = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _gpu_processes() -> list:
    """``[(pid, used MiB)]`` of the compute processes on the GPUs (nvidia-smi; rocm-smi has no such query)."""
    try:
        text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            rows.append((int(parts[0]), float(parts[1]) if parts[1].replace(".", "").isdigit() else 0.0))
    return rows


def _journal_records(path: str) -> int:
    try:
        with open(path) as f:
            return max(0, sum(1 for _ in f) - 1)
    except OSError:
        return 0


def _watch_and_kill(proc, journal: str, after: int, log: dict) -> None:
    while proc.poll() is None:
        if _journal_records(journal) >= after:
            mine = _descendants(proc.pid)
            gpu = sorted(((mem, pid) for pid, mem in _gpu_processes() if pid in mine), reverse=True)
            if gpu:
                mem, pid = gpu[0]
                os.kill(pid, signal.SIGKILL)
                log.update(killed_pid=pid, killed_mib=mem, at_record=_journal_records(journal),
                           at_s=round(time.time() - log["start"], 1))
                return
        time.sleep(0.5)


def _run(argv: list, log_path: str, env: dict, kill_after=None, journal=None) -> dict:
    start = time.time()
    info = {"argv": argv, "start": start}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "rocmflash.cli", *argv], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        watcher = None
        if kill_after:
            watcher = threading.Thread(target=_watch_and_kill, args=(proc, journal, kill_after, info), daemon=True)
            watcher.start()
        proc.wait()
        if watcher:
            watcher.join(timeout=5)
    info.update(rc=proc.returncode, wall_s=round(time.time() - start, 1))
    info.pop("start")
    return info


def _entries(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    return data["entries"]


def _time(e: dict):
    t = e.get("time_ms")
    return t.get("total") if isinstance(t, dict) else t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--seqlen", type=int, action="append", default=None)
    ap.add_argument("--kill-after", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    seqlens = args.seqlen or [2048]
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, COLUMNS="160", ROCMFLASH_CACHE_DIR=os.path.join(args.out, "cache"))
    base = ["tune", "--gpu", "auto", "--model", args.model, "--dtype", args.dtype]
    for s in seqlens:
        base += ["--seqlen", str(s)]
    runs = {}
    for name, extra, kill in (("one-gpu", [], None), ("pool", ["--gpus", "all"], args.kill_after)):
        db = os.path.join(args.out, name, "h100.json")
        os.makedirs(os.path.dirname(db), exist_ok=True)
        journal = db[:-5] + ".journal.jsonl"
        runs[name] = _run(base + extra + ["--db", db], os.path.join(args.out, f"{name}.log"), env, kill, journal)
        runs[name]["db"] = db
        with open(journal) as f:
            recs = [json.loads(line) for line in f][1:]
        runs[name]["journal"] = {"records": len(recs),
                                 "by_status": {s: sum(r["status"] == s for r in recs) for s in
                                               {r["status"] for r in recs}},
                                 "crashed": [{"config": r["config"], "error": r.get("error"), "worker": r.get("worker")}
                                             for r in recs if r["status"] == "crashed"]}
    one, pool = (_entries(runs[n]["db"]) for n in ("one-gpu", "pool"))
    rows = []
    for key in sorted(set(one) | set(pool)):
        a, b = one.get(key, {}), pool.get(key, {})
        ta, tb = _time(a), _time(b)
        rows.append({"key": key, "one_gpu_best": a.get("best"), "pool_best": b.get("best"), "one_gpu_ms": ta,
                     "pool_ms": tb, "same_best": a.get("best") == b.get("best"),
                     "time_ratio_pool_over_one": round(tb / ta, 4) if ta and tb else None,
                     "measured": (a.get("measured"), b.get("measured"))})
    import torch

    meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0),
            "gpus": torch.cuda.device_count(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "command": " ".join(sys.argv)}
    report = {"meta": meta, "runs": runs, "entries": rows}
    with open(os.path.join(args.out, "model-tune.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    lines = [f"# model tune {args.model} {args.dtype} S={seqlens}: one GPU vs --gpus all", "",
             f"{meta['date']}, {meta['device']} x{meta['gpus']}, torch {meta['torch']}, triton {meta['triton']}",
             f"command: `{meta['command']}`", "", "| run | rc | wall s | records | statuses | killed |", "|---|---|---|---|---|---|"]
    for name, r in runs.items():
        killed = f"pid {r['killed_pid']} at record {r['at_record']} ({r['at_s']} s)" if r.get("killed_pid") else "-"
        lines.append(f"| {name} | {r['rc']} | {r['wall_s']} | {r['journal']['records']} | {r['journal']['by_status']} "
                     f"| {killed} |")
    lines += ["", "| key | same best | one-GPU ms | pool ms | pool/one |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['key']} | {row['same_best']} | {row['one_gpu_ms']} | {row['pool_ms']} | "
                     f"{row['time_ratio_pool_over_one']} |")
    with open(os.path.join(args.out, "model-tune.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["rc"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
