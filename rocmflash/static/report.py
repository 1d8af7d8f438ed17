"""Turn a static sweep into what a user reads: rows, a rich table, CSV, markdown and plots."""

from __future__ import annotations

import collections
import dataclasses
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
    """One line per row, the columns :data:`ROW_KEYS` then :data:`EXTRA_KEYS`; None is an empty cell.

    The stdlib writer keeps every value as Python prints it, so ``duplicate_of`` stays a row number
    (``12``, never ``12.0`` beside blanks) and a column a row lacks is an empty cell, not an error.
    """
    import csv

    columns = list(ROW_KEYS + EXTRA_KEYS)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: "" if row.get(k) is None else row.get(k) for k in columns} for row in rows)


@dataclasses.dataclass(frozen=True)
class VerdictStyle:
    """How one verdict looks in a plot: its legend words, an Okabe-Ito colour and a marker (colour and shape
    both differ between verdicts, so the plot reads in grey print and for every kind of colour blindness)."""

    label: str
    colour: str
    marker: str


#: the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal Design"): eight colours told apart with any
#: common colour-vision deficiency; yellow goes to the one verdict that is never drawn (no VGPR count)
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73",
             "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7"}
#: one style per verdict a row can carry (:func:`verdict_kind`), in legend order: kept first, then the
#: pruner's rules in the order it applies them (prune.REASONS)
VERDICT_STYLES = {
    "kept": VerdictStyle("kept", OKABE_ITO["bluish green"], "o"),
    HARMLESS_SPILL: VerdictStyle("kept, harmless spill", OKABE_ITO["sky blue"], "D"),
    "spills": VerdictStyle("spill", OKABE_ITO["vermillion"], "X"),
    "lds_over_budget": VerdictStyle("LDS over budget", OKABE_ITO["reddish purple"], "s"),
    "below_occupancy_floor": VerdictStyle("below occupancy floor", OKABE_ITO["orange"], "v"),
    "cliff_victim": VerdictStyle("cliff victim", OKABE_ITO["blue"], "^"),
    "duplicate_binary": VerdictStyle("duplicate binary", OKABE_ITO["black"], "+"),
    "compile_failed": VerdictStyle("compile failed", OKABE_ITO["yellow"], "*"),
}


def verdict_kind(row: dict) -> str:
    """The :data:`VERDICT_STYLES` key of a row: ``kept`` (also a config kept because all were pruned),
    ``harmless_spill`` for a kept config that spills where it costs little, else the pruning reason."""
    if row["verdict"] == "kept":
        return HARMLESS_SPILL if row["reason"] == HARMLESS_SPILL else "kept"
    return row["reason"]


def plot_vgprs(rows: list[dict], arch: str, path: str, title: str) -> None:
    """One panel per variant: allocated VGPRs of each config over its tile, marked by verdict, with the arch's
    occupancy cliffs (the VGPR counts where a SIMD loses a wave) drawn and labelled on every panel; beside
    them the register cost of each variant on the tiles all of them compiled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compiled = [r for r in rows if r["allocated_vgprs"] is not None]
    by_variant = collections.Counter(r["variant"] for r in compiled)
    variants = sorted(by_variant, key=lambda v: (-by_variant[v], v))  # the biggest first: it gets the wide panel
    cliffs = vgpr_cliffs(arch) if arch.startswith("gfx") else []
    values = [r["allocated_vgprs"] for r in compiled] or [64]
    span = (max(0, min(values + [v for v, _ in cliffs[:4]]) - 24), max(values) * 1.08)  # cliffs 8w..5w apart
    cols, rest = 4, variants[1:] + ["cost"]
    fig = plt.figure(figsize=(18, 4.6 * (1 + -(-len(rest) // cols))))
    grid = fig.add_gridspec(1 + -(-len(rest) // cols), cols)
    panels = [(fig.add_subplot(grid[0, :cols - 1]), variants[0] if variants else "cost")]
    panels += [(fig.add_subplot(grid[1 + i // cols, i % cols]), name) for i, name in enumerate(rest if variants else [])]
    for ax, name in panels:
        if name == "cost":
            _plot_variant_cost(ax, compiled)
        else:
            _plot_variant_panel(ax, [r for r in compiled if r["variant"] == name], name)
        _draw_cliffs(ax, cliffs, span)
    _verdict_legend(fig.add_subplot(grid[0, cols - 1]), rows, arch)
    fig.suptitle(title + ": allocated VGPRs per config, by verdict", fontsize=13)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _tile_positions(rows: list[dict]) -> tuple[list[float], list[tuple]]:
    """An x position per row and the tiles in x order (by area, then BLOCK_M). Inside its tile's slot a row sits
    left for fewer warps, right for more, and its other knobs (stages, waves_per_eu, mfma, ...) spread it a
    little, in a fixed order, so configs with equal VGPR counts stay apart."""
    tiles = sorted({(r["BLOCK_M"], r["BLOCK_N"]) for r in rows}, key=lambda t: (t[0] * t[1], t[0]))
    warps = sorted({r["num_warps"] for r in rows})
    groups = collections.defaultdict(list)
    for i, r in enumerate(rows):
        groups[(r["BLOCK_M"], r["BLOCK_N"], r["num_warps"])].append(i)
    slot = 0.8 / max(1, len(warps))
    xs = [0.0] * len(rows)
    for (m, n, w), members in groups.items():
        left = tiles.index((m, n)) - 0.4 + warps.index(w) * slot
        for j, i in enumerate(sorted(members, key=lambda i: config_label(rows[i]))):
            xs[i] = left + slot * (j + 0.5) / len(members)
    return xs, tiles


def _plot_variant_panel(ax, rows: list[dict], variant: str) -> None:
    """One variant's configs: x the tile (BLOCK_M x BLOCK_N), y allocated VGPRs, colour and marker the verdict."""
    xs, tiles = _tile_positions(rows)
    for kind, style in VERDICT_STYLES.items():
        pts = [(x, r["allocated_vgprs"]) for x, r in zip(xs, rows) if verdict_kind(r) == kind]
        if pts:
            ax.scatter(*zip(*pts), s=22, c=style.colour, marker=style.marker, alpha=0.85,
                       linewidths=1.2 if style.marker in ("+", "x") else 0.3,
                       edgecolors=None if style.marker in ("+", "x") else "white")
    warps = sorted({r["num_warps"] for r in rows})
    ax.set_xticks(range(len(tiles)))
    ax.set_xticklabels([f"{m}x{n}" for m, n in tiles], fontsize=8, rotation=30 if len(tiles) > 6 else 0)
    ax.set_xlim(-0.6, len(tiles) - 0.4)
    ax.set_xlabel("tile BLOCK_M x BLOCK_N (in a tile, left to right: " + ", ".join(f"w{w}" for w in warps) + ")",
                  fontsize=8)
    ax.set_ylabel("allocated VGPRs (incl. AGPRs)", fontsize=8)
    ax.set_title(f"{variant} ({len(rows)} configs)", fontsize=10)
    ax.grid(axis="x", color="0.92", lw=0.6)


def _draw_cliffs(ax, cliffs: list, span: tuple) -> None:
    """The occupancy cliffs as dashed lines, each labelled with the waves/SIMD a config at or under it gets;
    ``span``: the VGPR range every panel shows (the same on each, so panels compare by eye)."""
    import matplotlib.transforms as transforms

    ax.set_ylim(*span)
    label_at = transforms.blended_transform_factory(ax.transAxes, ax.transData)
    labelled = None
    for vgprs, waves in sorted(cliffs, reverse=True):  # most VGPRs first: the cliffs that matter keep a label
        if not span[0] <= vgprs <= span[1]:
            continue
        ax.axhline(vgprs, color="0.45", lw=0.7, ls="--", zorder=0)
        if labelled is not None and labelled - vgprs < 0.05 * (span[1] - span[0]):
            continue  # too close to the label above to be read: the line alone
        labelled = vgprs
        ax.text(0.995, vgprs, f"{waves}w <={vgprs}", transform=label_at, ha="right", va="bottom", fontsize=6.5,
                color="0.3")


def _verdict_legend(ax, rows: list[dict], arch: str) -> None:
    """The verdict legend (with each verdict's count) and the cliff line's meaning, in a panel of its own."""
    from matplotlib.lines import Line2D

    counts = collections.Counter(verdict_kind(r) for r in rows)
    ax.axis("off")
    handles = []
    for kind, style in VERDICT_STYLES.items():
        if kind == "compile_failed" and not counts[kind]:
            continue
        words = f"{style.label} ({counts[kind]})" + (": no VGPR count, not drawn" if kind == "compile_failed" else "")
        handles.append(Line2D([], [], ls="", marker=style.marker, color=style.colour, markersize=8,
                              markeredgewidth=1.5 if style.marker in ("+", "x") else 0.5, label=words))
    handles.append(Line2D([], [], color="0.45", lw=0.9, ls="--",
                          label=f"occupancy cliff on {arch}: at or under it, Nw waves/SIMD"))
    ax.legend(handles=handles, loc="center", fontsize=9, title="verdict (configs)", frameon=False)


def _plot_variant_cost(ax, rows: list[dict]) -> None:
    """Least allocated VGPRs of each variant on the tiles every variant was compiled for (waves_per_eu=0, no
    PRE_LOAD_V). The variants are told apart by grey and hatching, so no colour means two things in one figure."""
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
        ax.bar([i + j * width for i in range(len(tiles))], values, width, label=variant,
               color=str(0.25 + 0.5 * j / max(1, len(variants) - 1)), hatch=("", "//", "..", "xx")[j % 4],
               edgecolor="black", linewidth=0.4)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tiles))])
    ax.set_xticklabels([f"{m}x{n}\nw{w}" for m, n, w in tiles], fontsize=7)
    ax.set_xlabel("tile BLOCK_M x BLOCK_N, warps", fontsize=8)
    ax.set_ylabel("least allocated VGPRs (waves_per_eu=0)", fontsize=8)
    ax.set_title("register cost per variant, same tile", fontsize=10)
    if variants:
        ax.legend(fontsize=7, loc="upper left")


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
