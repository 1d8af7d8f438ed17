"""``rocmflash doctor``: what rocmflash sees here, in a form to paste into a bug report.

Versions (rocmflash, Python, torch, Triton and which distribution provides it, the
ROCm/CUDA runtime), the supported-range check, every visible GPU with its catalog
target, arch, CU count and compute partition, the databases each GPU's lookups would
read (user's, then shipped) with their measured-entry counts and any malformed entry
every reader skips, the user config directory ``rocmflash tune`` saves into (whether it
can, and the other databases in it), and the environment variables that change
rocmflash's behaviour. It ends with a one-line verdict. It never builds a kernel, so it
runs on a CPU-only box and with an unsupported Triton.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys

from rocmflash.hw import compat
from rocmflash.messages import error_line

#: environment variables worth showing in a bug report
ENV_VARS = ("ROCMFLASH_CONFIG_DIR", "ROCMFLASH_CACHE_DIR", "ROCMFLASH_NO_DB", "ROCMFLASH_NO_INCUMBENT",
            "ROCMFLASH_FIRST_USE_TIMING", compat.SKIP_ENV, "TRITON_INTERPRET", "TRITON_CACHE_DIR", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def gather() -> dict:
    """Everything the report shows, as plain data (``rocmflash doctor --json`` prints it)."""
    import rocmflash

    torch_info, triton_info = compat.installed_torch(), compat.installed_triton()
    report = {
        "rocmflash": rocmflash.__version__,
        "python": f"{platform.python_version()} ({sys.platform} {platform.machine()})",
        "torch": dataclasses.asdict(torch_info),
        "triton": dataclasses.asdict(triton_info),
        "supported": {"torch": compat.SUPPORTED_TORCH_RANGE, "triton": compat.SUPPORTED_TRITON_RANGE},
        "version_problems": compat.version_problems(torch_info, triton_info),
        "runtime": None,
        "gpus": [],
        "gpu_error": None,
        "environment": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
    }
    if torch_info.found:
        try:
            report["runtime"], report["gpus"] = _torch_devices()
        except Exception as err:  # a broken driver or torch build: report it, never crash the doctor
            report["gpu_error"] = error_line(err, 10_000)
    report["config_dir"] = config_dir_report(report["gpus"])
    report["verdict"] = verdict(report)
    return report


def config_dir_report(gpus: list) -> dict:
    """The user config directory (``$ROCMFLASH_CONFIG_DIR`` or the platform's): ``{"path", "source", "problem"
    (why ``rocmflash tune`` cannot save there, or None), "databases"}`` -- the databases in it that no GPU row
    lists already. Nothing is left behind by the write check."""
    from rocmflash.cli.tune_args import _unwritable_dir
    from rocmflash.db import CONFIG_DIR_ENV, database_summary, user_config_dir

    path = user_config_dir()
    info = {"path": path, "source": f"${CONFIG_DIR_ENV}" if os.environ.get(CONFIG_DIR_ENV) else "default",
            "problem": _unwritable_dir(path), "databases": []}
    if info["problem"] is None and os.path.isdir(path):
        listed = {os.path.realpath(d["path"]) for g in gpus for d in g["databases"]}
        names = sorted(n for n in os.listdir(path) if n.endswith(".json"))
        info["databases"] = [database_summary(os.path.join(path, n)) for n in names
                             if os.path.realpath(os.path.join(path, n)) not in listed]
    return info


def _torch_devices() -> tuple[str, list]:
    import torch

    from rocmflash.hw.detect import identify_torch_device

    if getattr(torch.version, "hip", None):
        runtime = f"ROCm/HIP {torch.version.hip}"
    elif torch.version.cuda:
        runtime = f"CUDA {torch.version.cuda}"
    else:
        runtime = "CPU only (this torch has no CUDA or ROCm support)"
    if not torch.cuda.is_available():
        return runtime, []
    return runtime, [_gpu_row(index, identify_torch_device(index)) for index in range(torch.cuda.device_count())]


def _gpu_row(index: int, match) -> dict:
    from rocmflash.db import database_paths, database_summary

    row = {"index": index, "name": match.name, "arch": match.arch, "compute_units": match.compute_units,
           "warp_size": match.warp_size, "target": match.gpu.name if match.gpu else None,
           "partition": match.partition or None, "note": match.problem or None, "databases": []}
    if match.gpu is not None:
        row["databases"] = [database_summary(p) for p in database_paths(match.gpu.name)]
    return row


def verdict(report: dict) -> str:
    """One line: ready (and for what), or what to fix first."""
    if report["version_problems"]:
        return "NOT READY: " + "; ".join(report["version_problems"])
    if report["gpu_error"]:
        return f"NOT READY: torch could not list the GPUs ({report['gpu_error']})"
    config = report.get("config_dir") or {}
    if config.get("problem"):
        return (f"PARTLY READY: rocmflash tune cannot save to the config directory {config['path']} "
                f"({config['source']}): {config['problem']}; point it at a writable directory or pass --db "
                "(run-time selection, explain, export and vgpr-report still work)")
    gpus = report["gpus"]
    if not gpus:
        return ("READY for static work on this CPU (vgpr-report, isa, tune --gpu NAME ranks without timing); "
                "no GPU visible, so nothing can be timed here")
    off = [g for g in gpus if g["target"] is None]
    if off:
        return (f"PARTLY READY: GPU {off[0]['index']} ({off[0]['name'] or 'no name'}, {off[0]['arch']}) is not a "
                f"catalog target: {off[0]['note']}")
    targets = sorted({g["target"] for g in gpus})
    measured = sum(d["measured"] for g in gpus[:1] for d in g["databases"])
    tuned = f"{measured} measured database entries" if measured else "no measured entries yet (defaults until you tune)"
    return f"READY: {len(gpus)} GPU(s) as {', '.join(targets)}; GPU 0 has {tuned}"


def render(report: dict) -> str:
    """The plain-text report (a few dozen lines, no colour: it is meant to be pasted)."""
    t, tr = report["torch"], report["triton"]
    lines = [f"rocmflash {report['rocmflash']}  python {report['python']}",
             f"torch   {_version_line(t, report['supported']['torch'])}",
             f"triton  {_version_line(tr, report['supported']['triton'])}",
             f"runtime {report['runtime'] or 'unknown (torch not importable)'}"]
    if report["gpu_error"]:
        lines.append(f"GPUs    error: {report['gpu_error']}")
    elif not report["gpus"]:
        lines.append("GPUs    none visible")
    for g in report["gpus"]:
        target = g["target"] or "not in the catalog"
        part = f", partition {g['partition'].upper()}" if g["partition"] else ""
        lines.append(f"GPU {g['index']}   {g['name'] or '(no name)'}: {g['arch']}, wave{g['warp_size']}, "
                     f"{g['compute_units']} CUs -> {target}{part}")
        if g["note"]:
            lines.append(f"        note: {g['note']}")
        lines += [line for d in g["databases"] for line in _db_lines(d)]
    config = report.get("config_dir")
    if config:
        state = f"PROBLEM: {config['problem']}" if config["problem"] else "writable (rocmflash tune saves here)"
        lines.append(f"config  {config['path']} ({config['source']}): {state}")
        lines += [line for d in config["databases"] for line in _db_lines(d)]
    for key, value in report["environment"].items():
        lines.append(f"env     {key}={value}")
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines)


#: malformed entries a report names one by one, per database (the rest are counted)
MALFORMED_SHOWN = 5


def _db_lines(d: dict) -> list:
    """A database's report lines: its state (entries, measured ones, config-less and malformed ones), then
    each malformed entry and what is wrong with it."""
    malformed = d.get("malformed") or {}
    if d["error"]:
        state = f"error: {d['error']}"
    elif not d["exists"]:
        state = "not present"
    else:
        state = f"{d['entries']} entries, {d['measured']} measured"
        if d.get("no_config"):
            state += f", {d['no_config']} without a config (a tune found none)"
        if malformed:
            state += f", {len(malformed)} malformed (skipped by every reader)"
    lines = [f"        db {d['path']} ({state})"]
    lines += [f"          skipped {key!r}: {why}" for key, why in list(malformed.items())[:MALFORMED_SHOWN]]
    if len(malformed) > MALFORMED_SHOWN:
        lines.append(f"          ... and {len(malformed) - MALFORMED_SHOWN} more")
    return lines


def _version_line(info: dict, supported: str) -> str:
    if info["version"] is None:
        return f"not installed (supported: {supported})"
    source = f" (from {info['distribution']})" if info["distribution"] not in (None, info["module"]) else ""
    ok = "supported" if compat.in_range(info["version"], compat.SpecifierSet(supported)) else "NOT SUPPORTED"
    return f"{info['version']}{source}: {ok} ({info['module']}{supported})"


def main(as_json: bool = False, out=None) -> int:
    """Print the report; exit code 0 when ready (a CPU-only box included), 1 otherwise."""
    out = out or sys.stdout
    report = gather()
    print(json.dumps(report, indent=1) if as_json else render(report), file=out)
    return 1 if report["verdict"].startswith("NOT READY") else 0
