"""`rocmflash tune --model` on one GPU against every GPU of the node (`--gpus all`), cold and warm.

    python benchmarks/scale_gpus.py --model llama-3-8b --dtype bf16 --seqlen 2048 --seqlen 8192 --out DIR \
        [--runs one-cold,all-cold,one-warm,all-warm,all-kill] [--code DIR --tag old] [--kill-after 30]
        [--default-buckets] [--shared-cache]

Each run is the CLI a user types, in its own process, with its own database and journal:

* ``one-cold`` / ``all-cold``: a fresh compile cache and Triton cache of their own (nothing compiled);
* ``one-warm`` / ``all-warm``: the cache their cold run filled (the database and journal are fresh, so
  every config is timed again);
* ``all-kill``: as ``all-warm``, while a watcher SIGKILLs the GPU process of one timing worker once the
  journal holds ``--kill-after`` records: what it had in flight is the only work repeated.

``--code DIR`` runs another checkout of rocmflash (``PYTHONPATH=DIR``; e.g. the commit before a change)
with its runs named ``<tag>-<run>``, so a before/after comparison is one call on one machine.

Writes ``DIR/scale-gpus.json`` and ``DIR/scale-gpus.md``: wall time per run, the speed-up of every ``all``
run over its ``one`` run, each worker's busy seconds (from the tune's summary), every database entry of
each run against the one-GPU cold run's entry (same best, time ratio, inside the 3 % near-best band), and
what the kill cost. Each run also records the pipeline's events (``$ROCMFLASH_PIPELINE_TRACE``:
``DIR/<run>/trace.jsonl``, beside its ``gpu.journal.jsonl``), summed up per worker in ``timeline``: when
its first job started, its idle gaps between jobs (and which static phases ran meanwhile), its idle tail,
and each problem's static phase.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from model_tune import _descendants, _gpu_processes, _journal_records

NEAR_BEST = 1.03
RUNS = ("one-cold", "all-cold", "one-warm", "all-warm", "all-kill")


def _watch_and_kill(proc, journal: str, after: int, info: dict) -> None:
    """SIGKILL the GPU process of this tune holding the most device memory (a timing worker: its inputs and
    L2 flush buffer; pre-warm processes hold a context only) once the journal holds ``after`` records."""
    while proc.poll() is None:
        if _journal_records(journal) >= after:
            mine = _descendants(proc.pid)
            gpu = sorted(((mem, pid) for pid, mem in _gpu_processes() if pid in mine), reverse=True)
            if gpu:
                mem, pid = gpu[0]
                os.kill(pid, signal.SIGKILL)
                info.update(killed_pid=pid, killed_mib=mem, at_record=_journal_records(journal),
                            at_s=round(time.time() - info["start"], 1))
                return
        time.sleep(0.2)


def _run(name: str, argv: list, out: str, env: dict, kill_after=None) -> dict:
    db = os.path.join(out, name, "gpu.json")
    os.makedirs(os.path.dirname(db), exist_ok=True)
    journal = db[:-5] + ".journal.jsonl"
    trace = os.path.join(os.path.dirname(db), "trace.jsonl")
    env = dict(env, ROCMFLASH_PIPELINE_TRACE=trace)
    info = {"name": name, "argv": argv + ["--db", db], "start": time.time(), "db": db}
    log_path = os.path.join(out, f"{name}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "rocmflash.cli", *argv, "--db", db], cwd=out, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        watcher = None
        if kill_after:
            watcher = threading.Thread(target=_watch_and_kill, args=(proc, journal, kill_after, info), daemon=True)
            watcher.start()
        proc.wait()
        if watcher:
            watcher.join(timeout=5)
    start = info.pop("start")
    info.update(rc=proc.returncode, wall_s=round(time.time() - start, 1), marks=marks(trace, start))
    with open(log_path) as f:
        text = f.read()
    info["workers"] = [{"label": m[0], "timed": int(m[1]), "busy_s": float(m[2])}
                       for m in re.findall(r"worker (\S+): (\d+) timed .*?busy (\d+) s", text)]
    m = re.search(r"wall time (\d+) s", text)
    info["tune_wall_s"] = float(m.group(1)) if m else None
    recs = [r for r in _json_lines(journal) if "status" in r]
    info["timeline"] = timeline(trace)
    info["journal"] = {"records": len(recs), "by_status": {s: sum(r["status"] == s for r in recs)
                                                           for s in sorted({r["status"] for r in recs})},
                       "retried": sum(1 for r in recs if r.get("retried_after") or r.get("retries"))}
    return info


#: an idle stretch of a worker shorter than this is the scheduler's own latency, not a gap
GAP_S = 0.5


def marks(trace: str, start: float) -> dict:
    """``{mark name: seconds since the process was started}`` of the tune's ``mark`` events
    (:func:`rocmflash.tuning.items.trace_mark`): where the process spends its time outside the pipeline."""
    return {e["name"]: round(e["wall"] - start, 2) for e in _json_lines(trace) if e.get("event") == "mark"}


def _json_lines(path: str) -> list:
    """The JSON objects of a JSON-lines file, skipping lines that are not one (a run killed mid-write); [] when
    there is no file."""
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict):
                    out.append(r)
    return out


def timeline(trace: str) -> dict:
    """Per worker of a run's pipeline trace: ``first_job_s`` (idle before its first job), ``gaps_s`` (idle
    between jobs, stretches over :data:`GAP_S`), ``gaps`` (the 5 longest: start, seconds, static phases then in
    flight), ``tail_s`` (idle after its last job until the pipeline ended), ``busy_s``; and every static
    phase's ``[start, end]`` (pipeline seconds)."""
    events = []
    try:
        with open(trace) as f:
            events = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return {}
    events = [e for e in events if "t" in e]  # the process's marks (:func:`marks`) are on the wall clock
    if not events:
        return {}
    end = max(e["t"] for e in events)
    statics, workers, open_jobs = {}, {}, {}
    for e in events:
        if e["event"] == "static_start":
            statics[e["item"]] = [round(e["t"], 2), None]
        elif e["event"] == "static_done" and e["item"] in statics:
            statics[e["item"]][1] = round(e["t"], 2)
        elif e["event"] == "job_start":
            workers.setdefault(e["worker"], {"jobs": [], "first": e["t"]})
            open_jobs[e["worker"]] = e["t"]
        elif e["event"] in ("job_done", "job_retry") and e["worker"] in open_jobs:
            workers[e["worker"]]["jobs"].append((open_jobs.pop(e["worker"]), e["t"]))
    out = {}
    for label, w in sorted(workers.items()):
        jobs = sorted(w["jobs"])
        gaps = [(a_end, b_start - a_end) for (_, a_end), (b_start, _) in zip(jobs, jobs[1:]) if b_start - a_end > GAP_S]
        longest = sorted(gaps, key=lambda g: -g[1])[:5]
        out[label] = {"first_job_s": round(w["first"], 2), "gaps_s": round(sum(g for _, g in gaps), 2),
                      "gaps": [[round(at, 2), round(g, 2), sorted(k for k, (s0, s1) in statics.items()
                                                               if s0 < at + g and (s1 is None or s1 > at))]
                               for at, g in longest],
                      "tail_s": round(end - jobs[-1][1], 2) if jobs else None,
                      "busy_s": round(sum(b - a for a, b in jobs), 2)}
    return {"pipeline_s": round(end, 2), "workers": out, "statics": statics}


def _time(e: dict):
    t = e.get("time_ms")
    return t.get("total") if isinstance(t, dict) else t


def _entries(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)["entries"]
    except (OSError, ValueError, KeyError):
        return {}


def _compare(base: dict, other: dict) -> list:
    rows = []
    for key in sorted(set(base) | set(other)):
        a, b = base.get(key, {}), other.get(key, {})
        ta, tb = _time(a), _time(b)
        ratio = round(tb / ta, 4) if ta and tb else None
        rows.append({"key": key, "same_best": a.get("best") == b.get("best"), "base_ms": ta, "ms": tb,
                     "ratio": ratio, "in_band": ratio is not None and 1 / NEAR_BEST <= ratio <= NEAR_BEST})
    return rows


def _write(results: dict, prefix: str, base: list, out: str, tag: str, code: str) -> None:
    """The JSON and markdown reports of the runs so far (rewritten after every run: a cut-off call keeps them)."""
    reference = _entries(results.get(prefix + "one-cold", {}).get("db", ""))
    for name, r in results.items():
        r["entries"] = _compare(reference, _entries(r["db"])) if reference else []
    speedups = {}
    for mode in ("cold", "warm"):
        one, many = results.get(f"{prefix}one-{mode}"), results.get(f"{prefix}all-{mode}")
        if one and many and one["rc"] == 0 and many["rc"] == 0:
            speedups[mode] = round(one["wall_s"] / many["wall_s"], 3)
    import torch

    meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0),
            "gpus": torch.cuda.device_count(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "code": code, "command": " ".join(sys.argv)}
    report = {"meta": meta, "speedups": speedups, "runs": results}
    with open(os.path.join(out, f"{prefix}scale-gpus.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    lines = [f"# {' '.join(base)}: one GPU vs --gpus all ({tag or 'this checkout'})", "",
             (f"{meta['date']}, {meta['device']} x{meta['gpus']}, {meta['cpus']} CPUs, torch {meta['torch']}, "
             f"triton {meta['triton']}"), f"command: `{meta['command']}`", "",
             "| run | rc | wall s | speed-up | workers (timed, busy s) | journal | killed | entries in band |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        mode = name.rsplit("-", 1)[-1]
        sp = speedups.get(mode) if "-all-" in f"-{name}" else None
        workers = "; ".join(f"{w['label']} {w['timed']}, {w['busy_s']:.0f}" for w in r["workers"]) or "-"
        killed = f"pid {r['killed_pid']} at record {r['at_record']} ({r['at_s']} s)" if r.get("killed_pid") else "-"
        band = f"{sum(e['in_band'] for e in r['entries'])}/{len(r['entries'])}" if r["entries"] else "-"
        lines.append(f"| {name} | {r['rc']} | {r['wall_s']} | {f'{sp:.2f}x' if sp else '-'} | {workers} | "
                     f"{r['journal']['records']} {r['journal']['by_status']} | {killed} | {band} |")
    lines += ["", "| run | worker | idle before 1st job s | idle gaps s (longest: at s, for s) | idle tail s | busy s |",
              "|---|---|---|---|---|---|"]
    for name, r in results.items():
        for label, w in (r.get("timeline") or {}).get("workers", {}).items():
            longest = ", ".join(f"{at:.0f}+{g:.1f}" for at, g, _ in w["gaps"][:3]) or "-"
            lines.append(f"| {name} | {label} | {w['first_job_s']:.1f} | {w['gaps_s']:.1f} ({longest}) | "
                         f"{w['tail_s']} | {w['busy_s']:.1f} |")
    lines += ["", "Process marks (s since the process was started): " + "; ".join(
        f"{name}: " + ", ".join(f"{k} {v}" for k, v in (r.get("marks") or {}).items()) for name, r in results.items())]
    with open(os.path.join(out, f"{prefix}scale-gpus.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--seqlen", type=int, action="append", default=None)
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--kill-after", type=int, default=30)
    ap.add_argument("--code", default=ROOT, help="the rocmflash checkout to run (default: this one)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--default-buckets", action="store_true",
                    help="no --seqlen: the model's default plan of sequence buckets (the whole model)")
    ap.add_argument("--shared-cache", action="store_true",
                    help="one compile cache for the one- and all-GPU runs: a cold run fills it, every warm run "
                         "reuses it (a warm-only comparison after a single cold run)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        ap.error(f"unknown run(s) {unknown}; expected some of {', '.join(RUNS)}")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    code = os.path.abspath(args.code)
    base = ["tune", "--gpu", "auto", "--model", args.model, "--dtype", args.dtype]
    if args.default_buckets and args.seqlen:
        ap.error("--default-buckets and --seqlen exclude each other")
    for s in [] if args.default_buckets else (args.seqlen or [2048, 8192]):
        base += ["--seqlen", str(s)]
    prefix = f"{args.tag}-" if args.tag else ""
    results = {}
    for run in runs:
        which, mode = run.split("-")
        # a cold run starts it, its warm run reuses it (--shared-cache: every warm run reuses the last cold run's)
        cache = os.path.join(out, f"{prefix}cache" if args.shared_cache else f"{prefix}cache-{which}")
        if mode == "cold" and os.path.exists(cache):
            import shutil

            shutil.rmtree(cache)
        env = dict(os.environ, COLUMNS="160", PYTHONPATH=code + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   ROCMFLASH_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton-direct"))
        extra = ["--gpus", "all"] if which == "all" else []
        name = prefix + run
        print(f"== {name}", flush=True)
        results[name] = _run(name, base + extra, out, env, args.kill_after if mode == "kill" else None)
        print(json.dumps({k: v for k, v in results[name].items() if k != "argv"}), flush=True)
        _write(results, prefix, base, out, args.tag, code)
    return 0 if all(r["rc"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
