"""The shipped AMD databases' static verdicts under several Tritons: ``rocmflash check-db`` run by each given
Python (one virtual environment per Triton), on a copy of each shipped database, then ``--fix`` on that copy to
say what rocmflash would serve instead. CPU only; writes ``triton-range-<date>.md`` (and the raw JSON) to --out.

    python benchmarks/triton_range.py --python .venv/bin/python --python ../venv38/bin/python \
        --python ../venv39/bin/python --gpus mi250,mi300x,mi355x --out reports

Each environment needs rocmflash's dependencies (not rocmflash itself: the checkout is put on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_db(python: str, gpu: str, db: str, fix: bool, cache_dir: str) -> dict:
    """One ``check-db --json`` run; its JSON (exit code inside)."""
    env = dict(os.environ, PYTHONPATH=HERE, ROCMFLASH_CACHE_DIR=cache_dir, TRITON_DEFAULT_FP_FUSION="1")
    cmd = [python, "-m", "rocmflash.cli", "check-db", "--gpu", gpu, "--db", db, "--json"] + (["--fix"] if fix else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"{' '.join(cmd)} gave no JSON (exit {done.returncode}): {done.stderr.strip()[-500:]}")


def _label(cfg: dict) -> str:
    if not cfg:
        return "-"
    parts = [f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}" if "BLOCK_M" in cfg else f"BN{cfg.get('BLOCK_N')}",
             f"w{cfg.get('num_warps')}", f"s{cfg.get('num_stages')}"]
    for key, short in (("waves_per_eu", "wpe"), ("matrix_instr_nonkdim", "m"), ("kpack", "k")):
        if cfg.get(key):
            parts.append(f"{short}{cfg[key]}")
    if cfg.get("PRE_LOAD_V"):
        parts.append("pv")
    return " ".join(parts)


def _profile(p: dict) -> str:
    if not p:
        return "-"
    if p.get("status") != "ok":
        return "fails to build"
    text = f"{p.get('vgprs')}v {p.get('waves_per_simd')}w"
    if p.get("spills_in_loop"):
        text += f" spill-loop {p.get('scratch_bytes')}B"
    elif p.get("scratch_bytes"):
        text += f" spill {p.get('scratch_bytes')}B"
    return text


def run(pythons: list, gpus: list, out: str) -> str:
    cache_dir = tempfile.mkdtemp(prefix="triton-range-cache-")
    results = {}
    for python in pythons:
        for gpu in gpus:
            work = tempfile.mkdtemp(prefix=f"triton-range-{gpu}-")
            db = os.path.join(work, f"{gpu}.json")
            shutil.copy(os.path.join(HERE, "configs", f"{gpu}.json"), db)
            checked = check_db(python, gpu, db, False, cache_dir)
            fixed = check_db(python, gpu, db, True, cache_dir)
            with open(db) as f:
                after = json.load(f)["entries"]
            results[(python, gpu)] = (checked, fixed, after)
            print(f"{checked['compiler']['triton']} {gpu}: exit {checked['exit_code']}, "
                  f"{len(checked['failing'])} served config(s) do not hold", file=sys.stderr)
    return _write(results, pythons, gpus, out)


def _write(results: dict, pythons: list, gpus: list, out: str) -> str:
    today = datetime.date.today().isoformat()
    tritons = [results[(p, gpus[0])][0]["compiler"] for p in pythons]
    lines = [f"# Shipped AMD databases across Tritons ({today}, CPU cross-compiles, no AMD GPU)", "",
             "Command: `python benchmarks/triton_range.py " + " ".join(f"--python {p}" for p in pythons)
             + f" --gpus {','.join(gpus)} --out {out}`", "",
             "Each served config (`best`) of each entry, cross-compiled for the database's arch under each Triton by "
             "`rocmflash check-db` and compared with the profile recorded when it was tuned (Triton 3.6). `now`: "
             "VGPRs, waves/SIMD, spills; `--fix serves`: what `check-db --fix` serves instead where it no longer "
             "holds (`ranked[i]`: the static phase's i-th config; `default`: the arch default).", "",
             f"Machine: {os.cpu_count()} CPUs, no GPU needed (cross-compiles).", "",
             "Compilers: " + "; ".join(f"Triton {c['triton']} (LLVM {c.get('llvm')} {str(c.get('llvm_hash'))[:12]})"
                                       for c in tritons), ""]
    summary = ["| GPU | " + " | ".join(f"Triton {c['triton']}" for c in tritons) + " |",
               "|---|" + "---|" * len(tritons)]
    for gpu in gpus:
        cells = []
        for p in pythons:
            checked = results[(p, gpu)][0]
            served = [r for r in checked["rows"] if r.get("served")]
            cells.append(f"{len(served) - len(checked['failing'])} of {len(served)} hold")
        summary.append(f"| {gpu} | " + " | ".join(cells) + " |")
    lines += summary + [""]
    for gpu in gpus:
        lines += [f"## {gpu}", "", "| entry | served config | recorded | "
                  + " | ".join(f"{c['triton']}: now / verdict / --fix serves" for c in tritons) + " |",
                  "|---|---|---|" + "---|" * len(tritons)]
        first = results[(pythons[0], gpu)][0]
        for row in (r for r in first["rows"] if r.get("served")):
            cells = []
            for p in pythons:
                checked, fixed, after = results[(p, gpu)]
                now = next(r for r in checked["rows"] if r["key"] == row["key"] and r.get("served"))
                fix = fixed["fixed"].get(next(iter(fixed["fixed"]), ""), {}).get(row["key"])
                served = "-" if not fix else f"{fix.get('best')}: {_label(after[row['key']].get('best') or {})}"
                cells.append(f"{_profile(now.get('now'))} / {now['verdict']} / {served}")
            lines.append(f"| {row['key']} | {_label(row['config'])} | {_profile(row.get('then'))} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"triton-range-{today}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    raw = {f"{results[(p, g)][0]['compiler']['triton']}/{g}": results[(p, g)][0] for p in pythons for g in gpus}
    with open(os.path.join(out, f"triton-range-{today}.json"), "w") as f:
        json.dump(raw, f, indent=1, sort_keys=True)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", required=True, help="a Python with one Triton (repeat)")
    parser.add_argument("--gpus", default="mi250,mi300x,mi355x")
    parser.add_argument("--out", default="reports")
    args = parser.parse_args(argv)
    print(run(args.python, args.gpus.split(","), args.out))


if __name__ == "__main__":
    main()
