"""``rocmflash export``: a tuned database as JSON or as ``triton.Config`` lines, forward entries only.

The database is read as every reader reads it (:func:`rocmflash.db.read_database`): a malformed entry is
left out with one warning, an entry without a config (a tune that found none) is absent, and a stored
config missing an optional key (``PRE_LOAD_V``, ...) exports with the config record's default.

:mod:`rocmflash.cli.tune` re-exports every name here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rocmflash.cli.tune_args import _error
from rocmflash.hw.gpus import UnknownGPUError

#: entry modes of other kernels (decode, the backward, the packed forward): export lists forward entries only
NOT_FORWARD_MODES = ("decode", "bwd", "varlen")


def _triton_kwargs(cfg: dict, vendor: str) -> tuple[dict, dict]:
    kwargs = {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "PRE_LOAD_V": cfg["PRE_LOAD_V"]}
    if vendor == "amd":
        kwargs.update(waves_per_eu=cfg["waves_per_eu"], matrix_instr_nonkdim=cfg["matrix_instr_nonkdim"],
                      kpack=cfg["kpack"])
    return kwargs, {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}


def _forward(key: str, entry: dict) -> bool:
    """Whether export lists an entry: a forward key (not decode, backward or varlen) holding a config."""
    from rocmflash.db_entries import FORWARD, family

    return bool(entry.get("best")) and family(key) == FORWARD and entry.get("mode") not in NOT_FORWARD_MODES


def export_json(data: dict, vendor: str) -> dict:
    """The export's JSON of ``data`` (entries as :func:`rocmflash.db.read_database` gives them)."""
    entries = {}
    for key, e in data["entries"].items():
        if not _forward(key, e):
            continue
        online = e["best"] if e["best"]["variant"] == "online" else ((e.get("best_per_variant") or {}).get("online") or {}).get("config")
        item = {"measured": bool(e.get("measured")), "tflops": e.get("tflops"), "best": e["best"], "when": e.get("when")}
        if online:
            kw, opts = _triton_kwargs(online, vendor)
            item["triton_config"] = {"kwargs": kw, **opts}
        entries[key] = item
    return {"format": "rocmflash-export", "schema_version": data["schema_version"], "gpu": data["gpu"],
            "arch": data.get("arch"), "fingerprint": data.get("fingerprint"),
            "measured": any(e["measured"] for e in entries.values()), "entries": entries}


def export_triton(data: dict, vendor: str) -> str:
    """``triton.Config`` lines of ``data``'s best online configs (entries as :func:`rocmflash.db.read_database`
    gives them)."""
    fp = data.get("fingerprint") if isinstance(data.get("fingerprint"), dict) else {}
    lines = [f"# rocmflash export: {data['gpu']} ({data.get('arch')}); device {fp.get('device')}, "
             f"triton {fp.get('triton')}, torch {fp.get('torch')}",
             "# the best online (FA2-style) config per problem; key = d<head_dim>-<dtype>-<causal|full>-gqa<ratio>-s<seqlen bucket>",
             "import triton", "", "CONFIGS = {"]
    unique = []
    for key, e in data["entries"].items():
        best = e.get("best")
        if not _forward(key, e):
            continue
        cfg = best if best["variant"] == "online" else ((e.get("best_per_variant") or {}).get("online") or {}).get("config")
        if not cfg:
            continue
        kw, opts = _triton_kwargs(cfg, vendor)
        if e.get("measured"):
            tf = next((v.get("tflops") for v in [{"config": e["best"], "tflops": e.get("tflops")},
                                                  *(e.get("best_per_variant") or {}).values()] if v["config"] == cfg), None)
            note = f"measured, {tf:.1f} TFLOP/s" if tf else "measured"
        else:
            note = "UNMEASURED: static ranking"
        text = (f"triton.Config({json.dumps(kw).replace('true', 'True').replace('false', 'False')}, "
                f"num_warps={opts['num_warps']}, num_stages={opts['num_stages']})")
        lines.append(f"    {key!r}: {text},  # {note}")
        if text not in unique:
            unique.append(text)
    lines += ["}", "", "# the distinct configs, e.g. for @triton.autotune(configs=AUTOTUNE_CONFIGS, ...)",
              "AUTOTUNE_CONFIGS = ["] + [f"    {t}," for t in unique] + ["]"]
    return "\n".join(lines) + "\n"


def run_export(args: argparse.Namespace) -> int:
    from rocmflash.db import DBError, database_paths, read_database
    from rocmflash.hw.gpus import get_gpu

    try:
        gpu = get_gpu(args.gpu)
        if args.db and os.path.isdir(args.db):
            raise ValueError(f"--db {args.db} is a directory; --db takes a database file such as {gpu.name}.json")
        candidates = [args.db] if args.db else database_paths(gpu.name)
        path = next((p for p in candidates if os.path.isfile(p)), None)
        if path is None:
            raise ValueError(f"no config database for {gpu.name} at {' or '.join(candidates)}; run "
                             f"`rocmflash tune --gpu {gpu.name} ...` first or pass --db")
        data = read_database(path)
        if data.get("gpu") != gpu.name:
            raise ValueError(f"{path} holds configs for {data.get('gpu')!r}, not {gpu.name!r}")
    except (UnknownGPUError, DBError, ValueError) as err:
        return _error(str(err))
    if args.format == "json":
        print(json.dumps(export_json(data, gpu.vendor), indent=1))
    else:
        sys.stdout.write(export_triton(data, gpu.vendor))
    return 0
