"""Where rocmflash's online kernel spills, from the assembly: the evidence behind the ``spills`` rule.

Sweeps the real online config spaces (the ``rocmflash vgpr-report`` path: the GPU's
default space, :func:`rocmflash.static.compile.sweep` with its cache, :func:`rocmflash.static.prune.prune`)
and tabulates every spilling config: spill counts, scratch bytes, scratch loads/stores
inside loops versus outside, SGPR spills kept in VGPR lanes, and the verdict.

    python benchmarks/evidence/spill_evidence.py --out docs/evidence/spill-evidence-2026-11-23.md
    python benchmarks/evidence/spill_evidence.py --gpu mi300x --head-dim 128 --causal-only   # a slice
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import sys
import time

from rocmflash.static.compile import kernel_source_hash, sweep
from rocmflash.config import Problem
from rocmflash.hw.gpus import get_gpu
from rocmflash.static.prune import HARMLESS_LANE_SHARE, HARMLESS_SPILL, HARMLESS_SPILL_BYTES, prune
from rocmflash.static.report import config_label
from rocmflash.static.space import default_space

COLUMNS = ("gpu", "D", "causal", "config", "V spills", "S spills", "scratch B", "loads", "stores", "in loop",
           "outside", "loop B", "outside B", "lane ops (loop)", "loop instr", "verdict")


def spilling_rows(gpu_name: str, head_dim: int, causal: bool, cache_dir=None, workers=None) -> tuple[list, dict]:
    """Rows for every spilling config of one online space, and counts for the whole space."""
    gpu = get_gpu(gpu_name)
    problem = Problem(head_dim=head_dim, causal=causal)
    configs = default_space(gpu, ["online"]).configs(problem, gpu)
    start = time.perf_counter()
    observations, stats = sweep(configs, problem, gpu, cache_dir=cache_dir, workers=workers)
    verdicts = prune(observations)
    rows = []
    for cfg, obs, verdict in zip(configs, observations, verdicts):
        if obs["status"] != "ok":
            continue
        k = obs["kernels"][0]
        if not (k["vgpr_spill_count"] or k["sgpr_spill_count"] or k["scratch_bytes"]):
            continue
        label = config_label({**cfg.to_dict(), "arch": gpu.arch})
        loop_ops = k["scratch_loop_loads"] + k["scratch_loop_stores"]
        rows.append({
            "gpu": gpu.name, "D": head_dim, "causal": causal, "config": label,
            "V spills": k["vgpr_spill_count"], "S spills": k["sgpr_spill_count"], "scratch B": k["scratch_bytes"],
            "loads": k["scratch_loads"], "stores": k["scratch_stores"], "in loop": loop_ops,
            "outside": k["scratch_loads"] + k["scratch_stores"] - loop_ops, "loop B": k["scratch_loop_bytes"],
            "outside B": k["scratch_outside_bytes"],
            "lane ops (loop)": f"{k['scratch_lane_ops']} ({k['scratch_loop_lane_ops']})",
            "loop instr": k["scratch_loop_instructions"],
            "verdict": ("kept: " + (verdict.reason or "") if verdict.kept else verdict.reason).rstrip(": "),
            "_verdict": verdict,
        })
    summary = {"configs": len(configs), "compiled": stats.compiled, "cache_hits": stats.cache_hits,
               "failed": stats.failed, "seconds": time.perf_counter() - start,
               "kept": sum(v.kept for v in verdicts)}
    return rows, summary


def classify(row: dict) -> str:
    """in_loop, outside_only (scratch, none in loops), lanes_only (SGPR spills in VGPR lanes, no scratch)."""
    if row["in loop"]:
        return "in_loop"
    if row["loads"] + row["stores"]:
        return "outside_only"
    return "lanes_only"


def _md_table(rows: list[dict], keys) -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def distribution(rows: list[dict]) -> list[dict]:
    """Scratch bytes per lane, bucketed, for each class of spill."""
    buckets = [(1, 32), (33, 64), (65, 128), (129, 256), (257, 512), (513, 10 ** 9)]
    out = []
    for cls in ("in_loop", "outside_only", "lanes_only"):
        members = [r for r in rows if classify(r) == cls]
        if not members:
            continue
        rec = {"class": cls, "configs": len(members)}
        zero = sum(1 for r in members if r["scratch B"] == 0)
        rec["0 B"] = zero
        for lo, hi in buckets:
            rec[f"{lo}-{hi if hi < 10 ** 9 else ''} B".replace("- B", "+ B")] = sum(
                1 for r in members if lo <= r["scratch B"] <= hi)
        spills = sorted(r["V spills"] for r in members)
        rec["V spills min/median/max"] = f"{spills[0]}/{spills[len(spills) // 2]}/{spills[-1]}"
        if cls == "in_loop":
            ops = sorted(r["in loop"] for r in members)
            rec["in-loop ops min/median/max"] = f"{ops[0]}/{ops[len(ops) // 2]}/{ops[-1]}"
        out.append(rec)
    return out


def markdown(problems: list, all_rows: list[dict], summaries: dict, command: str) -> str:
    import triton

    parts = [
        f"# Where the online kernel spills: evidence for the `spills` rule ({datetime.date.today().isoformat()})\n",
        f"- Triton {triton.__version__}; cross-compiled on this CPU (no GPU); forward-kernel source hash "
        f"`{kernel_source_hash()[:12]}`",
        f"- command: `{command}`",
        "- each space is what `rocmflash vgpr-report --gpu G --variant online --head-dim D [--causal]` sweeps "
        "(same space, same cache, same pruner)\n",
        "## Per space\n",
    ]
    per_space = []
    for key in problems:
        rows = [r for r in all_rows if (r["gpu"], r["D"], r["causal"]) == key]
        classes = collections.Counter(classify(r) for r in rows)
        s = summaries[key]
        per_space.append({
            "gpu": key[0], "D": key[1], "causal": key[2], "configs": s["configs"], "spilling": len(rows),
            "in loop": classes["in_loop"], "outside only": classes["outside_only"],
            "SGPR lanes only": classes["lanes_only"],
            "kept harmless": sum(1 for r in rows if r["_verdict"].reason == HARMLESS_SPILL),
            "pruned spills": sum(1 for r in rows if r["_verdict"].reason == "spills"),
            "kept (space)": s["kept"],
        })
    parts.append(_md_table(per_space, list(per_space[0])))
    parts += ["\n## Scratch bytes per lane by class (all spaces)\n", _dist_table(all_rows),
              overlap_line(all_rows),
              f"\nBudget for a harmless outside-the-loop spill: {HARMLESS_SPILL_BYTES} B per lane.\n",
              "\n## SGPR spills kept in VGPR lanes: lane moves inside loops, as a share of loop instructions\n",
              lane_share_table(all_rows),
              f"\nBudget: {HARMLESS_LANE_SHARE:.1%} (1/32) of a loop's instructions.\n",
              "\n## Every spilling config\n",
              "`in loop`/`outside`: scratch loads+stores inside/outside loop bodies; `loop B`/`outside B`: bytes "
              "per lane those instructions move, each counted once; `lane ops (loop)`: v_writelane/v_readlane "
              "(SGPR spills kept in VGPR lanes), in loops in brackets; `loop instr`: instructions in loop bodies.\n",
              _md_table(all_rows, COLUMNS)]
    return "\n".join(parts)


def lane_share_table(rows: list[dict]) -> str:
    """SGPR-lane-only spills: v_writelane/v_readlane inside loops as a share of the loop instructions."""
    shares = sorted(_loop_lane_ops(r) / max(1, r["loop instr"]) for r in rows if classify(r) == "lanes_only")
    if not shares:
        return "_none_\n"
    edges = [(0, 0), (1e-9, 0.01), (0.01, 0.02), (0.02, 0.03), (0.03, 0.05), (0.05, 0.10), (0.10, 1)]
    record = {f"{lo:.0%}" if lo == hi else f"({lo:.0%}, {hi:.0%}]": sum(1 for x in shares if lo <= x <= hi and
                                                                       (x > lo or lo == hi)) for lo, hi in edges}
    record["largest below 1/32"] = f"{max((x for x in shares if x <= 1 / 32), default=0):.1%}"
    record["smallest above 1/32"] = f"{min((x for x in shares if x > 1 / 32), default=0):.1%}"
    return _md_table([record], list(record))


def _loop_lane_ops(row: dict) -> int:
    return int(row["lane ops (loop)"].split("(")[1].rstrip(")"))


def overlap_line(rows: list[dict]) -> str:
    """How much the in-loop and outside-only spills overlap in size (why size alone cannot decide)."""
    outside = [r for r in rows if classify(r) == "outside_only"]
    in_loop = [r for r in rows if classify(r) == "in_loop"]
    if not outside or not in_loop:
        return ""
    biggest = max(r["scratch B"] for r in outside)
    small = [r for r in in_loop if r["scratch B"] <= biggest]
    fewest = min(r["V spills"] for r in in_loop)
    return (f"\nOutside-only spills use at most {biggest} B of scratch per lane "
            f"({max(r['V spills'] for r in outside)} VGPRs); {len(small)} of the {len(in_loop)} in-loop spills are "
            f"no bigger (the smallest: {fewest} VGPRs, {min(r['scratch B'] for r in in_loop)} B), so size alone "
            f"does not separate them; where the scratch accesses sit does.\n")


def _dist_table(rows: list[dict]) -> str:
    dist = distribution(rows)
    if not dist:
        return "_no spilling config_\n"
    keys = list(dict.fromkeys(k for rec in dist for k in rec))
    return _md_table([{k: rec.get(k, "-") for k in keys} for rec in dist], keys)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", nargs="+", default=["mi300x", "mi355x"])
    parser.add_argument("--head-dim", nargs="+", type=int, default=[128, 64])
    parser.add_argument("--causal-only", action="store_true")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", default=None, help="markdown file to write (default: print it)")
    args = parser.parse_args(argv)
    causal = (True,) if args.causal_only else (False, True)
    problems = [(g, d, c) for g in args.gpu for d in args.head_dim for c in causal]
    all_rows, summaries = [], {}
    for gpu, d, causal in problems:
        rows, summary = spilling_rows(gpu, d, causal, args.cache_dir, args.workers)
        key = (get_gpu(gpu).name, d, causal)
        summaries[key] = summary
        all_rows += rows
        print(f"{key}: {summary['configs']} configs, {len(rows)} spill, {summary['compiled']} compiled, "
              f"{summary['seconds']:.0f} s", file=sys.stderr)
    text = markdown([(get_gpu(g).name, d, c) for g, d, c in problems], all_rows, summaries,
                    "python " + " ".join([os.path.relpath(__file__), *(argv or sys.argv[1:])]))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
