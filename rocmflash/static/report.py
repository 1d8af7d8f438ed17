"""Turn a static sweep into what a user reads: rows, a rich table, CSV, markdown and plots."""

from __future__ import annotations

import collections
from typing import Optional

from isa_tools import vgpr_cliffs
from rocmflash.static.dedupe import binary_twins
from rocmflash.static.prune import HARMLESS_SPILL

#: ``rocmflash vgpr-report --json`` promises these keys (one object per config)
ROW_KEYS = ("variant", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "waves_per_eu", "vgpr_count",
            "agpr_count", "allocated_vgprs", "vgpr_spill_count", "lds_bytes", "waves_per_simd", "limiter",
            "vgprs_past_cliff", "verdict", "reason")
EXTRA_KEYS = ("PRE_LOAD_V", "matrix_instr_nonkdim", "kpack", "schedule_hint", "num_splits", "d_chunks",
              "sgpr_count", "scratch_bytes", "waves_per_simd_static", "vgpr_headroom", "detail",
              "compile_seconds", "arch", "duplicate_of")


def make_console(stderr: bool = False):
    """A rich console; piped output gets a wide fixed width instead of 80 squeezed columns."""
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr) if stream.isatty() else Console(stderr=stderr, width=200)


def config_label(row: dict) -> str:
    """Short human label of a config, e.g. ``128x64 w4 s1 wpe2 mfma16 kp1 plv``."""
    parts = [f"{row['BLOCK_M']}x{row['BLOCK_N']}", f"w{row['num_warps']}", f"s{row['num_stages']}"]
    if row.get("arch", "").startswith("gfx"):
        parts += [f"wpe{row['waves_per_eu']}", f"mfma{row['matrix_instr_nonkdim']}", f"kp{row['kpack']}"]
    if row.get("PRE_LOAD_V"):
        parts.append("plv")
    if row.get("schedule_hint") not in (None, "", "none"):  # else two hints' rows would read alike
        parts.append(f"hint={row['schedule_hint']}")
    return " ".join(parts)


def rows_from_sweep(configs: list, observations: list[dict], verdicts: list) -> list[dict]:
    """One flat row per config: its knobs, the main kernel's resources, occupancy and the verdict.

    ``lds_bytes`` is the LDS a workgroup really gets: static plus Triton's dynamic LDS.
    Spill and scratch counts cover every kernel of the variant (split_kv's combine too).
    ``duplicate_of``: the row (0-based, this order) whose config compiled to the same code
    object and represents it (:mod:`rocmflash.static.dedupe`; None: the row is its binary's
    representative). It marks duplicates without changing a verdict: a duplicate of a kept
    config is pruned as ``duplicate_binary``, a duplicate of a pruned one keeps its own reason.
    """
    rows = []
    twins = binary_twins(observations, verdicts)
    for cfg, obs, verdict, twin in zip(configs, observations, verdicts, twins):
        row = {key: None for key in ROW_KEYS + EXTRA_KEYS}
        row["duplicate_of"] = twin
        row.update({k: v for k, v in cfg.to_dict().items() if k in row})
        row["arch"] = obs["arch"]
        row["compile_seconds"] = obs.get("compile_seconds")
        if obs["status"] == "ok":
            main = obs["kernels"][0]
            for key in ("vgpr_count", "agpr_count", "allocated_vgprs", "waves_per_simd", "limiter",
                        "vgprs_past_cliff", "sgpr_count", "waves_per_simd_static", "vgpr_headroom"):
                row[key] = main[key]
            row["lds_bytes"] = main["lds_bytes"] + main["dynamic_lds_bytes"]
            row["vgpr_spill_count"] = sum(k["vgpr_spill_count"] for k in obs["kernels"])
            row["scratch_bytes"] = max(k["scratch_bytes"] for k in obs["kernels"])
        row["verdict"] = verdict.label
        row["reason"] = verdict.reason
        row["detail"] = verdict.detail
        rows.append(row)
    return rows


def duplicate_count(rows: list[dict]) -> int:
    """How many rows compiled to the code object of another row (their ``duplicate_of`` is set)."""
    return sum(1 for r in rows if r.get("duplicate_of") is not None)


def reason_counts(rows: list[dict]) -> dict:
    """``{reason: count}`` over pruned rows, plus ``kept`` and, when some kept configs spill harmlessly,
    ``kept: harmless_spill`` (a part of ``kept``)."""
    counts = collections.Counter(r["reason"] for r in rows if r["verdict"] == "pruned")
    counts["kept"] = sum(1 for r in rows if r["verdict"] == "kept")
    harmless = sum(1 for r in rows if r["verdict"] == "kept" and r["reason"] == HARMLESS_SPILL)
    if harmless:
        counts[f"kept: {HARMLESS_SPILL}"] = harmless
    return dict(counts)


def print_table(rows: list[dict], console, title: str, limit: Optional[int] = None) -> None:
    """A rich table of the rows (kept first, then by occupancy)."""
    from rich.table import Table

    table = Table(title=title, header_style="bold")
    headers = ["config", "variant", "VGPR", "AGPR", "alloc", "spills", "LDS", "waves st/full", "limiter",
               "past cliff", "verdict", "reason"]
    for h in headers:
        table.add_column(h, justify="left" if h in ("config", "variant", "limiter", "verdict", "reason") else "right")
    ordered = sorted(rows, key=lambda r: (r["verdict"] != "kept", -(r["waves_per_simd"] or 0)))
    for r in ordered[:limit] if limit else ordered:
        style = "green" if r["verdict"] == "kept" else "dim"
        table.add_row(
            config_label(r), r["variant"], _s(r["vgpr_count"]), _s(r["agpr_count"]), _s(r["allocated_vgprs"]),
            _s(r["vgpr_spill_count"]), _s(r["lds_bytes"]),
            f"{_s(r['waves_per_simd_static'])}/{_s(r['waves_per_simd'])}", _s(r["limiter"]),
            _s(r["vgprs_past_cliff"]), r["verdict"], r["reason"] or "", style=style,
        )
    console.print(table)
    if limit and len(rows) > limit:
        console.print(f"[dim]… {len(rows) - limit} more rows in the CSV / --json output[/dim]")


def _s(value) -> str:
    return "-" if value is None else str(value)


def write_csv(rows: list[dict], path: str) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(ROW_KEYS + EXTRA_KEYS))
    frame["duplicate_of"] = frame["duplicate_of"].astype("Int64")  # a row number, not 12.0 beside blanks
    frame.to_csv(path, index=False)


def plot_vgprs(rows: list[dict], arch: str, path: str, title: str) -> None:
    """Allocated VGPRs per config with the arch's cliff lines, coloured by verdict; and per-variant cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compiled = [r for r in rows if r["allocated_vgprs"] is not None]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [3, 1.4]})
    colours = {"kept": "tab:green", "pruned": "tab:red"}
    for verdict in ("pruned", "kept"):
        pts = [(i, r["allocated_vgprs"]) for i, r in enumerate(compiled) if r["verdict"] == verdict]
        if pts:
            ax.scatter(*zip(*pts), s=12, c=colours[verdict], label=verdict, alpha=0.8)
    if arch.startswith("gfx"):
        for vgprs, waves in vgpr_cliffs(arch):
            if waves < 8:
                ax.axhline(vgprs, color="grey", lw=0.7, ls="--")
                ax.text(len(compiled) * 1.005, vgprs, f"{waves}w ≤{vgprs}", va="center", fontsize=7)
    ax.set_xlabel("config (sweep order)")
    ax.set_ylabel("allocated VGPRs (descriptor, incl. AGPRs)")
    ax.set_title(title)
    ax.legend(loc="upper left")
    _plot_variant_cost(bx, compiled)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_variant_cost(ax, rows: list[dict]) -> None:
    """Median allocated VGPRs of each variant on the tiles every variant was compiled for."""
    by_tile = collections.defaultdict(dict)
    for r in rows:
        if r["waves_per_eu"] == 0 and not r["PRE_LOAD_V"]:
            by_tile[(r["BLOCK_M"], r["BLOCK_N"], r["num_warps"])].setdefault(r["variant"], []).append(
                r["allocated_vgprs"])
    variants = sorted({v for d in by_tile.values() for v in d})
    tiles = sorted(t for t, d in by_tile.items() if len(d) == len(variants) and len(variants) > 1)
    width = 0.8 / max(1, len(variants))
    for j, variant in enumerate(variants):
        values = [min(by_tile[t][variant]) for t in tiles]
        ax.bar([i + j * width for i in range(len(tiles))], values, width, label=variant)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tiles))])
    ax.set_xticklabels([f"{m}x{n}\nw{w}" for m, n, w in tiles], fontsize=7)
    ax.set_ylabel("allocated VGPRs (waves_per_eu=0)")
    ax.set_title("register cost per variant, same tile")
    ax.legend(fontsize=7)


def variant_comparison(rows: list[dict]) -> list[dict]:
    """Per tile shared by all variants (waves_per_eu=0, no PRE_LOAD_V): each variant's VGPRs and waves."""
    by_tile = collections.defaultdict(dict)
    for r in rows:
        if r["allocated_vgprs"] is None or r["waves_per_eu"] != 0 or r["PRE_LOAD_V"]:
            continue
        key = (r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["matrix_instr_nonkdim"])
        best = by_tile[key].get(r["variant"])
        if best is None or r["allocated_vgprs"] < best["allocated_vgprs"]:
            by_tile[key][r["variant"]] = r
    variants = sorted({v for d in by_tile.values() for v in d})
    out = []
    for key in sorted(by_tile):
        entry = by_tile[key]
        if len(entry) < 2:
            continue
        row = {"tile": f"{key[0]}x{key[1]} w{key[2]} mfma{key[3]}"}
        for v in variants:
            r = entry.get(v)
            row[v] = "-" if r is None else (f"{r['allocated_vgprs']} ({r['vgpr_spill_count']} spill) "
                                            f"→ {r['waves_per_simd']}w")
        out.append(row)
    return out
