"""Does a shipped database tell the truth? Its stored TFLOP/s against what a user gets.

For every measured entry of ``configs/<gpu>.json`` (the live GPU's), at the entry's tuned
shape and with its best config, in interleaved rounds in one process:

* ``tune``: the live runner's own timing (:func:`rocmflash.tuning.live._time`: rotating inputs,
  L2 flush, events around each launch, median), the way the stored figure was made;
* ``api``: ``rocmflash.attention(q, k, v, causal, config=best)`` in
  ``triton.testing.do_bench`` (median), the way a user calls it;
* ``api (selected)``: the same without ``config=``, i.e. what run-time selection picks.

It prints the stored figure beside both and their ratios. ``--write-db PATH`` stores the
API figure in each entry as ``api_tflops`` (with ``api_measured``), so the database
carries both numbers.

Usage (on the GPU): python bench/db_truth.py --out DIR [--rounds 3] [--write-db configs/h100.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys


def _entries(gpu_name: str, db_path: str, keys=None):
    """The measured forward entries of ``db_path`` (``keys``: only these); decode, backward and varlen
    entries are other kernels, not ``rocmflash.attention``'s, and are left out."""
    from rocmflash.cli.tune import NOT_FORWARD_MODES
    from rocmflash.db import ConfigDB

    data = ConfigDB.read(db_path)
    if data["gpu"] != gpu_name:
        raise SystemExit(f"{db_path} is for {data['gpu']}, the live GPU is {gpu_name}")
    unknown = sorted(set(keys or ()) - set(data["entries"]))
    if unknown:
        raise SystemExit(f"no entry {', '.join(unknown)} in {db_path}")
    return data, {k: e for k, e in data["entries"].items()
                  if e.get("measured") and e.get("best") and e.get("mode") not in NOT_FORWARD_MODES
                  and (not keys or k in keys)}


def measure(entries: dict, rounds: int) -> dict:
    import torch
    import triton

    import rocmflash
    from rocmflash.config import KernelConfig
    from rocmflash.hw.roofline import Shape, tflops
    from rocmflash.kernels import get_variant
    from rocmflash.tuning.live_worker import LiveSettings, _time

    settings = LiveSettings()
    out = {}
    for key, entry in entries.items():
        shape = Shape.from_dict(entry["shape"])
        cfg = KernelConfig.from_dict(entry["best"])
        dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[shape.dtype]
        q = torch.randn(shape.batch, shape.heads_q, shape.seqlen_q, shape.head_dim, device="cuda", dtype=dt)
        k = torch.randn(shape.batch, shape.heads_kv, shape.seqlen_k, shape.head_dim, device="cuda", dtype=dt)
        v = torch.randn_like(k)
        mod = get_variant(cfg.variant)
        runs = {
            "tune": lambda: statistics.median(_time(mod, cfg, shape, settings)),
            "api": lambda: triton.testing.do_bench(
                lambda: rocmflash.attention(q, k, v, causal=shape.causal, config=cfg), warmup=25, rep=100,
                return_mode="median"),
            "api (selected)": lambda: triton.testing.do_bench(
                lambda: rocmflash.attention(q, k, v, causal=shape.causal), warmup=25, rep=100, return_mode="median"),
        }
        samples = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                samples[name].append(tflops(shape, run()))
        out[key] = {"stored": entry["tflops"], **{n: statistics.median(s) for n, s in samples.items()},
                    "config": cfg.to_dict()}
        print(key, {n: round(v, 1) if isinstance(v, float) else v for n, v in out[key].items() if n != "config"},
              flush=True)
    return out


def markdown(results: dict, meta: dict) -> str:
    lines = [f"# Stored vs delivered TFLOP/s: {meta['db']}", "",
             f"- date: {meta['date']}; device: {meta['device']}; torch {meta['torch']}, Triton {meta['triton']}",
             f"- command: `{meta['command']}`", "",
             "stored = the database's figure; tune = the live runner's timing now; api = rocmflash.attention with the "
             "entry's config in triton.testing.do_bench; selected = the same with run-time selection. Medians of "
             "interleaved rounds.", "",
             "| entry | stored | tune now | api | api (selected) | api / stored | api / tune |", "|---|---|---|---|---|---|---|"]
    ratios = []
    for key, r in results.items():
        ratios.append(r["api"] / r["stored"])
        lines.append(f"| {key} | {r['stored']:.1f} | {r['tune']:.1f} | {r['api']:.1f} | {r['api (selected)']:.1f} | "
                     f"{r['api'] / r['stored']:.3f} | {r['api'] / r['tune']:.3f} |")
    lines += ["", f"api / stored: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}; "
              f"{sum(abs(x - 1) <= 0.03 for x in ratios)}/{len(ratios)} within 3%", ""]
    return "\n".join(lines)


def write_db(path: str, results: dict, when: str) -> None:
    """Store the API figure beside the tuned one (atomic write)."""
    from rocmflash.db import ConfigDB, atomic_write_json

    data = ConfigDB.read(path)
    for key, r in results.items():
        entry = data["entries"][key]
        entry["api_tflops"] = round(r["api"], 2)
        entry["api_measured"] = {"when": when, "how": "rocmflash.attention(config=best) in triton.testing.do_bench, "
                                                       "median (bench/db_truth.py)"}
    atomic_write_json(path, data)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=None, help="database to check (default: the shipped one of the live GPU)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--write-db", default=None, metavar="PATH", help="store api_tflops into this database file")
    ap.add_argument("--keys", default=None, metavar="K1,K2", help="check only these entries (default: every forward entry)")
    args = ap.parse_args(argv)
    import torch
    import triton

    from rocmflash.hw.detect import detect_live_gpu
    from rocmflash.db import shipped_db_path

    gpu = detect_live_gpu()
    if gpu is None:
        raise SystemExit("needs a live GPU in the catalog")
    db_path = args.db or shipped_db_path(gpu.name)
    _, entries = _entries(gpu.name, db_path, args.keys.split(",") if args.keys else None)
    results = measure(entries, args.rounds)
    meta = {"db": os.path.relpath(db_path), "date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:])}
    text = markdown(results, meta)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "db_truth.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "db_truth.json"), "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    if args.write_db:
        write_db(args.write_db, results, datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        print(f"wrote api_tflops into {args.write_db}")
    return 0 if all(math.isfinite(r["api"]) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
