"""Backward tuning, before/after: ``rocmflash tune --pass bwd`` on the user grid, then fwd+bwd through the API.

Phase 1 (``--tune``): for every grid problem of ``benchmarks/user_grid.py`` (and D=192), one CLI tune
``rocmflash tune --gpu auto --pass bwd ...`` into ``<out>/configs`` (its wall time, configs timed
and the tuner's own dQ/dK/dV times are recorded).

Phase 2 (``--bench``): one process, ``ROCMFLASH_CONFIG_DIR=<out>/configs``; per problem,
forward+backward through ``rocmflash.attention`` (shipped forward entries, host time included)
with the per-arch default backward ("before") and with the tuned entry that run-time selection
serves ("after"), against SDPA flash, cuDNN and SDPA's default, interleaved rounds of
back-to-back steps between CUDA events (``benchmarks/interleaved.py``). The "after" path must have
been served by the database (checked), and its gradients are compared with the fp32 reference
of the first GQA group. TFLOP/s count fwd+bwd as 3.5x the forward's flops.

Usage (on a GPU)::

    python benchmarks/bwd_tune.py --out $OUT --tune --bench [--problems "D256 S4096 B4 H8,..."] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interleaved import MarkdownTable, interleaved_medians  # noqa: E402
from user_grid import GRID, _flops  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBLEMS = dict(GRID, **{"D192 S4096 B4 H8": (4, 8, 8, 4096, 192, False, "bf16")})


def tune_all(names, out: str, log) -> dict:
    configs = os.path.join(out, "configs")
    env = dict(os.environ, ROCMFLASH_CONFIG_DIR=configs, PYTHONUNBUFFERED="1")
    env.pop("ROCMFLASH_NO_DB", None)
    walls = {}
    for name in names:
        B, Hq, Hkv, S, D, causal, dt = PROBLEMS[name]
        cmd = [sys.executable, "-m", "rocmflash.cli", "tune", "--gpu", "auto", "--pass", "bwd", "--head-dim", str(D),
               "--dtype", dt, "--seqlen", str(S), "--batch", str(B), "--heads", str(Hq), "--kv-heads", str(Hkv)]
        cmd += ["--causal"] if causal else []
        t0 = time.time()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        walls[name] = round(time.time() - t0, 1)
        log(f"{name}: exit {done.returncode} in {walls[name]} s\n{done.stdout[-1200:]}{done.stderr[-1200:]}")
    return walls


def _entry(name, gpu_name, configs):
    from rocmflash.db import ConfigDB
    from rocmflash.tuning.backward import bwd_key

    B, Hq, Hkv, S, D, causal, dt = PROBLEMS[name]
    path = os.path.join(configs, f"{gpu_name}.json")
    return ConfigDB.read(path)["entries"].get(bwd_key(D, dt, causal, Hq // Hkv, S)) if os.path.exists(path) else None


def bench_all(names, out: str, rounds: int, walls: dict, log) -> list:
    import torch
    import torch.nn.functional as F

    import rocmflash
    from rocmflash.api import ops
    from rocmflash.api import selection
    from rocmflash.hw.detect import detect_live_gpu
    from rocmflash.kernels.backward.host import default_bwd_config
    from rocmflash.tuning.backward import reference_grads
    from user_grid import _build

    configs = os.path.join(out, "configs")
    os.environ["ROCMFLASH_CONFIG_DIR"] = configs
    os.environ.pop("ROCMFLASH_NO_DB", None)
    selection.clear_cache()
    gpu = detect_live_gpu()
    real_select = ops.select_bwd_config
    rows = []
    for name in names:
        B, Hq, Hkv, S, D, causal, dt = PROBLEMS[name]
        steps, marks, (q, k, v, do) = _build(torch, F, rocmflash, PROBLEMS[name], True, seed=1)
        tuned_step = steps.pop("rocmflash")
        arch = selection.device_identity(q.device)[1]
        default = default_bwd_config(arch, D)

        def before(step=tuned_step, default=default):
            ops.select_bwd_config = lambda *a, **kw: default
            try:
                step()
            finally:
                ops.select_bwd_config = real_select

        paths = {"default bwd": before, "tuned bwd": tuned_step, **{p: s for p, s in steps.items() if s}}
        tuned_step()
        details = selection.bwd_selection_details(q.device, D, q.dtype, causal, Hq // Hkv, S) or {}
        q.grad = k.grad = v.grad = None
        out_ = rocmflash.attention(q, k, v, causal=causal)
        gq, gk, gv = torch.autograd.grad(out_, (q, k, v), do)
        ref = reference_grads(q.detach(), k.detach(), v.detach(), do, causal, 1 / math.sqrt(D))
        g = Hq // Hkv
        err = max(((a[0, :g] if a is gq else a[0, 0]).float() - b).norm().item() / b.norm().item()
                  for a, b in zip((gq, gk, gv), ref))
        iters = max(3, min(50, int(2e12 / _flops(B, Hq, S, D, causal, True))))
        us = interleaved_medians(torch, paths, rounds, iters)
        tf = {p: _flops(B, Hq, S, D, causal, True) / (t * 1e-6) / 1e12 for p, t in us.items()}
        entry = _entry(name, gpu.name, configs) or {}
        row = {"problem": name, "tune_s": walls.get(name), "served": details.get("source"), "entry": details.get("entry"),
               "rel_err": err, "tflops": tf, "us": us, "marks": marks,
               "tuned": entry.get("best"), "tuner_ms": entry.get("time_ms"), "tuner_default_ms": entry.get("default_time_ms"),
               "timed": (entry.get("counts") or {}).get("timed")}
        rows.append(row)
        log(json.dumps(row, default=str))
        del q, k, v, do, steps, paths
        torch.cuda.empty_cache()
    return rows


def _label(cfg):
    return f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}"


def write_table(rows, out: str, command: str) -> None:
    import torch
    import triton

    head = [f"# Backward tuning before/after (fwd+bwd through rocmflash.attention) -- {datetime.date.today()}", "",
            f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}, Triton {triton.__version__}",
            f"- command: `{command}`",
            "- TFLOP/s of fwd+bwd (3.5x the forward's flops), public API, host time included, median of interleaved "
            "rounds; 'default bwd' = per-arch default backward configs, 'tuned bwd' = the bwd- entry run-time "
            "selection served (checked: 'served'); forward = shipped database in both", "",
            "| problem | tune s | timed | tuned dQ / dK/dV (hs) | tuner ms default -> tuned | default bwd | tuned bwd "
            "| gain | SDPA flash | cuDNN | SDPA default | tuned vs flash | vs cuDNN | served | rel err |",
            "|" + "---|" * 15]
    lines = []
    for r in rows:
        t = r["tflops"]
        best = r["tuned"] or {}
        tuned = (f"{_label(best['dq'])} / {_label(best['dkdv'])} (hs{best.get('head_splits')})" if best else "-")
        tm, dm = r["tuner_ms"] or {}, r["tuner_default_ms"] or {}
        tuner = f"{dm.get('total', float('nan')):.3f} -> {tm.get('total', float('nan')):.3f}" if tm else "-"

        def col(p):
            return f"{t[p]:.0f}{r['marks'].get(p, '')}" if p in t else "n/a"

        def ratio(p):
            return f"{t['tuned bwd'] / t[p]:.2f}x" if p in t else "n/a"

        lines.append(f"| {r['problem']} | {r['tune_s']} | {r['timed']} | {tuned} | {tuner} | {t['default bwd']:.0f} | "
                     f"{t['tuned bwd']:.0f} | {t['tuned bwd'] / t['default bwd']:.2f}x | {col('sdpa flash')} | "
                     f"{col('sdpa cudnn')} | {col('sdpa default')} | {ratio('sdpa flash')} | {ratio('sdpa cudnn')} | "
                     f"{r['served']} | {r['rel_err']:.2e} |")
    table = MarkdownTable(os.path.join(out, "bwd-tune.md"), head)
    for line in lines:
        table.add(line)
    table.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--problems", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.problems.split(",")] if args.problems else list(PROBLEMS)
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "bwd-tune.log"), "a")

    def log(text):
        print(text, flush=True)
        logf.write(text + "\n")
        logf.flush()

    walls_path = os.path.join(args.out, "tune-walls.json")
    walls = json.load(open(walls_path)) if os.path.exists(walls_path) else {}
    if args.tune:
        walls.update(tune_all(names, args.out, log))
        json.dump(walls, open(walls_path, "w"), indent=1)
    if args.bench:
        rows = bench_all(names, args.out, args.rounds, walls, log)
        json.dump(rows, open(os.path.join(args.out, "bwd-tune.json"), "w"), indent=1, default=str)
        write_table(rows, args.out, "python benchmarks/bwd_tune.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
