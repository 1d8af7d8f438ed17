"""``rocmflash db``: maintenance of a GPU's config database.

``rocmflash db refresh-incumbents`` times the platform's SDPA backends beside every measured forward entry of a
GPU's database. For each measured dense forward entry (``d128-bf16-causal-gqa1-s8192``...), the stored winner is
timed again and every SDPA backend this torch offers is gated and timed, forward and forward+backward (with
rocmflash's served forward+backward beside it), in one live-runner worker on this GPU -- both sides of the
comparison from one run. The entries get their ``incumbent`` field (:mod:`rocmflash.api.incumbent`), which
run-time dispatch reads. Writes a copy of the database (``--out-db``) and a table.

``--decode`` does the same for the dense decode entries (``decode-d128-bf16-gqa8-kv8192-b32``...), timed as a
user's eager call pays (:func:`rocmflash.tuning.incumbent_worker.measure_decode`: host time included, back-to-back
calls between events), and adds an entry for every problem of the decode grid (B 1/8/32 x KV 2k-64k x Hkv 8/32,
Hq 32, D128, bf16) the database lacks: it keeps the config run-time selection serves today (its ``strategy`` says
so) and carries the measured incumbent. In this process, one problem after another (about 3 minutes on an H100).

``--small`` adds an entry for every short dense problem of :data:`SMALL_GRID` (sequence buckets 16, 64 and 256,
where a call is host-bound) the database lacks, timed the same eager way, forward and forward+backward
(:func:`rocmflash.tuning.incumbent_worker.measure_eager`): each keeps the forward config run-time selection
serves today (its ``strategy`` says so) and the measured incumbent, which decides for calls one bucket away.

Usage (on a GPU)::

    rocmflash db refresh-incumbents --db configs/h100.json --out-db $OUT/h100.json --out $OUT
    rocmflash db refresh-incumbents --decode --db configs/h100.json --out-db $OUT/h100.json --out $OUT
    rocmflash db refresh-incumbents --small --db configs/h100.json --out-db $OUT/h100.json --out $OUT

This was the script ``refresh_incumbents.py`` of the old ``bench/`` folder (same flags, same behaviour, same tables). Its argument errors are the
CLI's: one line and exit code 2, found before torch is imported or a GPU is looked for.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

from rocmflash.cli.tune_args import int_at_least


def add_parser(sub) -> None:
    """Add ``db`` (with its one command, ``refresh-incumbents``) to the CLI's subparsers ``sub``."""
    db = sub.add_parser("db", help="maintain a GPU's config database (refresh-incumbents)",
                        description="Maintain a GPU's config database.")
    commands = db.add_subparsers(dest="db_command", metavar="DB_COMMAND")
    commands.required = True
    refresh = commands.add_parser(
        "refresh-incumbents", help="time the platform's SDPA beside a database's entries (on a GPU)",
        description=__doc__.split("\n\n")[1].replace("``", "`"))
    refresh.add_argument("--db", required=True, help="the database to refresh (read)")
    refresh.add_argument("--out-db", required=True, help="where the refreshed copy is written")
    refresh.add_argument("--out", default=".", help="directory for incumbents.md")
    refresh.add_argument("--keys", default="", help="comma-separated entry keys (default: every forward entry; with "
                         "--decode: every decode entry and grid problem)")
    which = refresh.add_mutually_exclusive_group()
    which.add_argument("--decode", action="store_true",
                       help="refresh the decode entries (eager, host time included) and add the decode grid's "
                            "missing ones")
    which.add_argument("--small", action="store_true",
                       help="add entries for the short dense problems of SMALL_GRID (eager, host time included)")
    refresh.add_argument("--rounds", type=int_at_least(1), default=3,
                         help="--decode/--small: interleaved rounds per problem")
    refresh.add_argument("--iters", type=int_at_least(1), default=20,
                         help="--decode/--small: back-to-back calls per path and round")


def run(args: argparse.Namespace) -> int:
    """Run ``rocmflash db COMMAND``; a bad path raises ValueError (the CLI prints it as one line, exit code 2)."""
    if args.db_command == "refresh-incumbents":
        check_refresh_args(args)
        return refresh_incumbents(args)
    raise ValueError(f"unknown db command {args.db_command!r}")


def check_refresh_args(args: argparse.Namespace) -> None:
    """The paths, before torch is imported: ``--db`` a readable database, ``--out-db``'s and ``--out``'s folders
    usable. A mistyped path is found here, not after minutes of timing."""
    from rocmflash.db.files import ConfigDB

    if not os.path.isfile(args.db):
        raise ValueError(f"--db {args.db}: {'is a directory' if os.path.isdir(args.db) else 'no such file'}")
    head = ConfigDB.read(args.db)  # DBError (a ValueError) names what is wrong with the file
    if not head.get("gpu") or not head.get("arch"):
        raise ValueError(f"--db {args.db}: the header names no 'gpu' or 'arch'")
    if os.path.isdir(args.out_db):
        raise ValueError(f"--out-db {args.out_db} is a directory; it takes the file the refreshed copy goes to")
    parent = os.path.dirname(os.path.abspath(args.out_db))
    if not os.path.isdir(parent):
        raise ValueError(f"--out-db {args.out_db}: its folder {parent} does not exist")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out} is a file; it takes the folder the table goes to")


def refresh_incumbents(args: argparse.Namespace) -> int:
    """Refresh (or, with ``--decode``/``--small``, add) the incumbents of ``args.db``'s entries into
    ``args.out_db``, on this process's GPU; 2 where there is none."""
    import json
    import shutil

    import torch
    import triton

    from rocmflash.db import ConfigDB, environment
    from rocmflash.tuning import incumbents
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    if not torch.cuda.is_available():
        print("error: rocmflash db refresh-incumbents needs a GPU", file=sys.stderr)
        return 2
    if os.path.abspath(args.db) != os.path.abspath(args.out_db):
        shutil.copyfile(args.db, args.out_db)

    with open(args.out_db) as f:
        head = json.load(f)
    env = environment(torch.cuda.get_device_name())
    db = ConfigDB.open(args.out_db, head["gpu"], head["arch"], head.get("fingerprint") or env)
    lines = [f"# SDPA backends beside the shipped forward entries ({datetime.date.today()})", "",
             f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}",
             f"- command: `rocmflash {' '.join(sys.argv[1:])}`",
             "- one live-runner worker: the stored winner re-timed and each SDPA backend gated and timed on the same "
             "rotating inputs with the same cache flush (forward: the tuner's median; forward+backward: median of "
             "flushed steps, rocmflash's served step beside it)", ""]
    if args.decode:
        return _main_decode(args, db, lines)
    if args.small:
        return _main_small(args, db, lines)
    settings = LiveSettings()
    with LiveRunner(settings, device_index=0) as runner:
        n = incumbents.refresh(db, runner, settings.to_dict(), note=lambda s: (print(s, flush=True), lines.append(f"- {s}")),
                               keys=set(args.keys.split(",")) if args.keys else None)
    lines.append("")
    lines.append(f"{n} entries refreshed")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "incumbents.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


# ----------------------------------------------------------------------------- decode
#: the decode grid every database should carry an incumbent for (issue 28's decode verification grid)
DECODE_GRID = {"batch": (1, 8, 32), "seqlen_k": (2048, 8192, 32768, 65536), "heads_kv": (8, 32), "heads_q": 32,
               "head_dim": 128, "dtype": "bf16"}
ADDED_STRATEGY = ("served-config: not tuned; the config run-time selection served when the incumbent was timed "
                  "(rocmflash db refresh-incumbents --decode); `rocmflash tune --mode decode` replaces it")


def grid_problems(grid: dict = DECODE_GRID) -> list:
    """The grid's problems as DecodeProblem dicts (one query token, unpaged 16-bit cache)."""
    return [{"head_dim": grid["head_dim"], "dtype": grid["dtype"], "heads_q": grid["heads_q"], "heads_kv": hkv,
             "batch": b, "seqlen_k": n, "seqlen_q": 1, "page_size": 0}
            for hkv in grid["heads_kv"] for b in grid["batch"] for n in grid["seqlen_k"]]


def decode_work(entries: dict, grid: dict = DECODE_GRID) -> list:
    """``[(key, problem, existing entry or None), ...]``: every dense 16-bit unpaged decode entry with a config
    (by key order), then each grid problem whose key the database lacks."""
    from rocmflash.db.lookups.decode import parse_decode_key
    from rocmflash.tuning.decode import DecodeProblem

    work, keys = [], set()
    for key in sorted(entries):
        entry, p = entries[key], parse_decode_key(key)
        if (p is None or p["page_size"] or p.get("kv_dtype") or not isinstance(entry, dict) or not entry.get("best")
                or not isinstance(entry.get("problem"), dict)):
            continue
        work.append((key, dict(entry["problem"]), entry))
        keys.add(key)
    for problem in grid_problems(grid):
        key = DecodeProblem(**problem).key()
        if key not in keys and key not in entries:
            work.append((key, problem, None))
            keys.add(key)
    return work


def refresh_decode(entries: dict, measure, served_config, stamp: dict, note=print, keys=None) -> dict:
    """``{key: new entry}`` for :func:`decode_work` (``keys``: only these): ``measure(problem, config or None)``
    (the worker's :func:`~rocmflash.tuning.incumbent_worker.measure_decode`) gives each its ``incumbent``; an
    existing entry is timed with its own config, an added one with what the selection serves
    (``served_config(problem)``, a DecodeConfig dict, stored as its ``best``; ``stamp``: its ``when`` and
    ``fingerprint``). A problem whose route failed keeps its entry unchanged."""
    from rocmflash.api.incumbent import decode_field

    out = {}
    for key, problem, entry in decode_work(entries):
        if keys and key not in keys:
            continue
        result = measure(problem, entry["best"] if entry else None)
        field = decode_field(result)
        if field.get("error"):
            note(f"{key}: not refreshed ({field['error']})")
            continue
        if entry is not None:
            out[key] = dict(entry, incumbent=field)
        else:
            out[key] = {"mode": "decode", "problem": problem, "measured": True, "strategy": ADDED_STRATEGY,
                        "best": served_config(problem), **stamp, "incumbent": field}
        note(f"{key}{' (added)' if entry is None else ''}: {field['backend']} {field['time_ms']} ms vs rocmflash "
             f"{field['triton_ms']} ms per eager call -> "
             f"{'SDPA' if field['time_ms'] is not None and field['time_ms'] < field['triton_ms'] else 'decode kernel'}")
    return out


def _main_decode(args, db, lines) -> int:
    import torch

    from rocmflash.tuning.incumbent_worker import measure_decode

    def measure(problem, config):
        return measure_decode(problem, config, rounds=args.rounds, iters=args.iters)

    def served_config(problem):
        from rocmflash.api.decode import decode_config

        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[problem["dtype"]]
        return decode_config(torch.device("cuda"), problem["head_dim"], dtype,
                             problem["heads_q"] // problem["heads_kv"], problem["seqlen_k"], problem["batch"]).to_dict()

    lines[0] = lines[0].replace("the shipped forward entries", "the decode entries (eager, host time included)")
    lines[-2] = ("- per problem, in this process: rocmflash.attention(q, k, v) served by the decode kernel (the "
                 "entry's config; an added entry: the served one) and by each SDPA backend through the dispatch, "
                 f"gated against fp32, then {args.rounds} interleaved rounds of {args.iters} back-to-back eager calls "
                 "between events (host time included)")

    return _refresh_and_write(args, db, lines, refresh_decode, measure, served_config, "incumbents_decode.md",
                              "decode entries refreshed or added")


def _refresh_and_write(args, db, lines: list, refresh, measure, served_config, table: str, counted: str) -> int:
    """Run ``refresh(entries, measure, served_config, stamp, note, keys)``, put its entries into ``db`` and save
    it, and write ``lines`` (the notes appended) to ``args.out/table``."""
    import torch

    from rocmflash.db import environment, now_iso

    def note(s):
        print(s, flush=True)
        lines.append(f"- {s}")

    stamp = {"when": now_iso(), "fingerprint": environment(torch.cuda.get_device_name())}
    new = refresh(db.data.get("entries", {}), measure, served_config, stamp, note,
                  set(args.keys.split(",")) if args.keys else None)
    for key, entry in new.items():
        db.put(key, entry)
    db.save()
    lines += ["", f"{len(new)} {counted}"]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, table), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


# ----------------------------------------------------------------------------- short dense problems
#: short dense problems (host-bound in eager use) every database should carry an eager-timed incumbent for: one
#: sequence of 8 query heads (K/V heads 8 / gqa), each (head dim, dtype, mask, GQA) at sequence buckets 16, 64, 256
SMALL_GRID = {"head_dim": (64, 128), "dtype": ("bf16", "fp16"), "causal": (False, True), "gqa": (1, 4),
              "seqlen": (16, 64, 256), "batch": 1, "heads_q": 8}
SMALL_STRATEGY = ("served-config: not tuned; the forward config run-time selection served when the incumbent was "
                  "timed eagerly, host time included (rocmflash db refresh-incumbents --small)")


def small_problems(grid: dict = SMALL_GRID) -> list:
    """``[(entry key, problem), ...]`` of the grid (``problem``: :func:`measure_eager`'s fields)."""
    from rocmflash.db.files import problem_key

    out = []
    for d in grid["head_dim"]:
        for dt in grid["dtype"]:
            for causal in grid["causal"]:
                for gqa in grid["gqa"]:
                    for s in grid["seqlen"]:
                        problem = {"batch": grid["batch"], "heads_q": grid["heads_q"], "heads_kv": grid["heads_q"] // gqa,
                                   "seqlen": s, "head_dim": d, "dtype": dt, "causal": causal}
                        out.append((problem_key(d, dt, causal, gqa, 1 << (s - 1).bit_length()), problem))
    return out


def small_entry(problem: dict, field: dict, config: dict, stamp: dict) -> dict:
    """The database entry of a short dense problem: the served ``config`` as its ``best`` and the eager ``field``
    as its ``incumbent`` (no Triton tuning record: ``time_ms`` is the served forward's eager time)."""
    gqa = problem["heads_q"] // problem["heads_kv"]
    s = problem["seqlen"]
    return {"problem": {"head_dim": problem["head_dim"], "dtype": problem["dtype"], "causal": problem["causal"],
                        "gqa_ratio": gqa, "seqlen_bucket": 1 << (s - 1).bit_length()},
            "shape": {"batch": problem["batch"], "heads_q": problem["heads_q"], "heads_kv": problem["heads_kv"],
                      "seqlen_q": s, "seqlen_k": s, "head_dim": problem["head_dim"], "dtype": problem["dtype"],
                      "causal": problem["causal"]},
            "measured": True, "strategy": SMALL_STRATEGY, "complete": False, "best": config,
            "time_ms": field.get("triton_ms"), **stamp, "incumbent": field}


def refresh_small(entries: dict, measure, served_config, stamp: dict, note=print, keys=None) -> dict:
    """``{key: new entry}`` for each :data:`SMALL_GRID` problem whose key ``entries`` lacks (``keys``: only these):
    ``measure(problem)`` (:func:`~rocmflash.tuning.incumbent_worker.measure_eager`) gives its ``incumbent``,
    ``served_config(problem)`` its ``best``. A problem whose rocmflash route failed is left out (noted)."""
    from rocmflash.api.incumbent import eager_field

    out = {}
    for key, problem in small_problems():
        if key in entries or key in out or (keys and key not in keys):
            continue
        field = eager_field(measure(problem))
        if field.get("error"):
            note(f"{key}: not added ({field['error']})")
            continue
        out[key] = small_entry(problem, field, served_config(problem), stamp)
        train = field.get("train") or {}
        note(f"{key} (added, B{problem['batch']} Hq{problem['heads_q']} Hkv{problem['heads_kv']} S{problem['seqlen']}): "
             f"forward {field['backend']} {field['time_ms']} ms vs rocmflash {field['triton_ms']} ms; forward+backward "
             f"{train.get('backend')} {train.get('time_ms')} ms vs rocmflash {train.get('triton_ms')} ms per eager call")
    return out


def _main_small(args, db, lines) -> int:
    import torch

    from rocmflash.api.selection import select_config
    from rocmflash.tuning.incumbent_worker import measure_eager

    def served_config(problem):
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[problem["dtype"]]
        s = problem["seqlen"]
        return select_config(torch.device("cuda"), problem["head_dim"], dtype, problem["causal"],
                             problem["heads_q"] // problem["heads_kv"], s, s).to_dict()

    lines[0] = lines[0].replace("the shipped forward entries", "short dense problems (eager, host time included)")
    lines[-2] = ("- per problem, in this process: rocmflash.attention(q, k, v, causal) served by the Triton kernels "
                 "(the configs selection serves) and by each SDPA backend through the dispatch, forward gated against "
                 f"fp32, then {args.rounds} interleaved rounds of {args.iters} back-to-back eager calls between events "
                 "(host time included), forward and forward + autograd.grad of q, k, v")

    return _refresh_and_write(args, db, lines, refresh_small,
                              lambda p: measure_eager(p, rounds=args.rounds, iters=args.iters), served_config,
                              "incumbents_small.md", "short dense entries added")
