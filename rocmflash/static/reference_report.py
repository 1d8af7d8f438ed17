"""``rocmflash vgpr-report --reference``: where AMD's published configs land in rocmflash's static pipeline.

For one GPU and problem, every forward reference config of the GPU's arch whose head-dim
scope admits the problem (:mod:`rocmflash.static.reference`) is mapped to rocmflash's kernel,
compiled through the same cached sweep (:func:`rocmflash.static.compile.sweep`), judged by the
same pruner (:func:`rocmflash.static.prune.judge`) and placed among the survivors of the
tuner's static phase with the tuner's own static score (:func:`rocmflash.tuning.static_phase`
and :func:`rocmflash.tuning.static_key`):

* a config of rocmflash's space gets its rank from the static phase itself (1-based);
  a ``duplicate_binary`` one gets the rank of the kept config with its code object;
* a config outside the space is compiled and judged alone; if kept it either compiles to
  the same code object as a kept space config (and shares its rank) or gets the place it
  would take among the survivors ("would be #k").

Nothing here is timed: the rank is the static score's, not a measurement.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from rocmflash.config import KernelConfig, Problem
from rocmflash.hw.gpus import GPU
from rocmflash.static.prune import HARMLESS_SPILL, PruneSettings, Verdict, judge
from rocmflash.static.reference import ReferenceConfig, load, select

@dataclasses.dataclass
class RefRow:
    """One distinct rocmflash config and every reference entry that maps to it."""

    config: KernelConfig
    refs: list  #: ReferenceConfig entries (empty for the static #1 row)
    applies: Optional[str]  #: None when some entry is selected for this problem, else why none is
    in_space: bool
    observation: dict
    verdict: Verdict
    rank: Optional[int] = None  #: 1-based static rank (in space and kept, or via a same-binary twin)
    would_rank: Optional[int] = None  #: outside the space, kept, no twin: the place it would take
    twin: Optional[KernelConfig] = None  #: the space config with the same code object (a kept one preferred)
    #: outside the space: ``("mfma/kpack", rank or pruning reason)`` of the space configs that differ only in
    #: matrix_instr_nonkdim/kpack (the knobs AMD's sources leave at Triton's defaults)
    siblings: list = dataclasses.field(default_factory=list)
    is_top: bool = False

    @property
    def kernel(self) -> dict:
        """The main kernel's summary ({} when the compile failed)."""
        return self.observation["kernels"][0] if self.observation.get("kernels") else {}

    @property
    def spills(self) -> Optional[int]:
        """VGPR + SGPR spills over every kernel of the variant (None when the compile failed)."""
        if not self.observation.get("kernels"):
            return None
        return sum(k["vgpr_spill_count"] + (k["sgpr_spill_count"] or 0) for k in self.observation["kernels"])

    @property
    def lds(self) -> Optional[int]:
        """Static + dynamic LDS bytes per workgroup of the main kernel."""
        k = self.kernel
        return k["lds_bytes"] + k["dynamic_lds_bytes"] if k else None

    @property
    def sort_key(self) -> tuple:
        """Static #1 first, then by (would-be) rank, then the pruned ones."""
        place = self.rank or self.would_rank
        return (not self.is_top, place is None, place or 0, self.verdict.reason or "")


@dataclasses.dataclass
class ReferenceResult:
    """Every reference row of one GPU/problem, with the size of the space and of its survivor set."""

    gpu: GPU
    problem: Problem
    rows: list
    space_size: int
    survivors: int
    compiled_outside_space: int
    settings: PruneSettings


def config_label(cfg: KernelConfig) -> str:
    """``online 128x64 w4 s1 wpe2 mfma0 kp1`` (+ ``plv``)."""
    text = (f"{cfg.variant} {cfg.BLOCK_M}x{cfg.BLOCK_N} w{cfg.num_warps} s{cfg.num_stages} wpe{cfg.waves_per_eu} "
            f"mfma{cfg.matrix_instr_nonkdim} kp{cfg.kpack}")
    return text + (" plv" if cfg.PRE_LOAD_V else "")


def config_diff(cfg: KernelConfig, base: KernelConfig) -> str:
    """The knobs where ``cfg`` differs from ``base``, e.g. ``mfma32`` or ``wpe0 mfma32``."""
    mine, theirs = config_label(cfg).split(), config_label(base).split()
    extra = [t for t in mine if t not in theirs]
    return " ".join(extra) or "identical knobs"


def ref_tag(ref: ReferenceConfig) -> str:
    """A short tag of an entry: its id without the arch and pass."""
    return ref.id.replace(f"-{ref.arch}", "").replace(f"-{ref.pass_}", "")


# ---------------------------------------------------------------------- computing
def compare(gpu: GPU, problem: Problem, variants=None, cache_dir=None, workers=None,
            settings: PruneSettings = PruneSettings(), refs: Optional[list] = None, static=None,
            space=None, reference_file: Optional[str] = None) -> ReferenceResult:
    """Compile, judge and rank every forward reference config for ``gpu``'s arch that admits ``problem``'s head dim.

    ``static`` (a :class:`rocmflash.tuning.StaticResult`) and ``space`` default to the
    tuner's static phase over ``default_space(gpu, variants)``.
    """
    from rocmflash.static.compile import sweep
    from rocmflash.static.space import default_space
    from rocmflash.tuning import static_phase

    if refs is None:
        refs = select(load(reference_file), arch=gpu.arch, pass_="fwd", problem=problem, strict=False)
    if static is None:
        space = space or default_space(gpu, variants)
        static = static_phase(gpu, problem, space, cache_dir, workers, settings)
    groups: dict = {}
    for ref in refs:
        groups.setdefault(ref.rocmflash, []).append(ref)
    index = {c.config: i for i, c in enumerate(static.candidates)}
    outside = [cfg for cfg in groups if cfg not in index]
    observations, _ = sweep(outside, problem, gpu, cache_dir=cache_dir, workers=workers) if outside else ([], None)
    outside_obs = dict(zip(outside, observations))
    ranked = static.ranked
    rows = [_top_row(ranked[0])] if ranked else []
    for cfg, entries in groups.items():
        if cfg in index:
            rows.append(_space_row(cfg, entries, static, index[cfg], problem))
        else:
            rows.append(_outside_row(cfg, entries, outside_obs[cfg], static, settings, problem))
    rows.sort(key=lambda r: r.sort_key)
    return ReferenceResult(gpu, problem, rows, len(static.candidates), len(ranked), len(outside), settings)


def _applies(entries: list, problem: Problem) -> Optional[str]:
    reasons = [ref.scope.mismatch(problem) for ref in entries]
    if any(r is None for r in reasons):
        return None
    return "; ".join(dict.fromkeys(reasons))


def _top_row(cand) -> RefRow:
    return RefRow(cand.config, [], None, True, cand.observation, Verdict(True, None, cand.detail),
                  rank=cand.static_rank + 1, is_top=True)


def _twin(static, observation: dict, exclude: Optional[int] = None):
    """The space candidate that compiled to the same code object (a kept one first), or None."""
    sha = observation.get("binary_sha256")
    same = [c for i, c in enumerate(static.candidates)
            if sha and i != exclude and c.observation.get("binary_sha256") == sha]
    return next((c for c in same if c.kept), same[0] if same else None)


def _siblings(cfg: KernelConfig, static) -> list:
    """``(label, rank text)`` of space configs equal to ``cfg`` but for matrix_instr_nonkdim and kpack."""
    out = []
    for cand in static.candidates:
        c = cand.config
        if c.replace(matrix_instr_nonkdim=cfg.matrix_instr_nonkdim, kpack=cfg.kpack) == cfg:
            where = f"#{cand.static_rank + 1}" if cand.kept else cand.reason
            out.append((f"{c.matrix_instr_nonkdim}/{c.kpack}", where))
    return out


def _space_row(cfg, entries, static, i, problem) -> RefRow:
    cand = static.candidates[i]
    row = RefRow(cfg, entries, _applies(entries, problem), True, cand.observation,
                 Verdict(cand.kept, cand.reason, cand.detail))
    if cand.kept:
        row.rank = cand.static_rank + 1
    elif cand.reason == "duplicate_binary":
        twin = _twin(static, cand.observation, exclude=i)
        if twin is not None and twin.kept:
            row.rank, row.twin = twin.static_rank + 1, twin.config
    return row


def _outside_row(cfg, entries, observation, static, settings, problem) -> RefRow:
    from rocmflash.tuning import static_key

    verdict = judge(observation, settings)
    row = RefRow(cfg, entries, _applies(entries, problem), False, observation, verdict,
                 siblings=_siblings(cfg, static))
    twin = _twin(static, observation)
    if twin is not None:
        row.twin = twin.config
        row.rank = twin.static_rank + 1 if twin.kept and verdict.kept else None
    if not verdict.kept or twin is not None:
        return row
    mine = static_key(cfg, observation, len(static.candidates))
    row.would_rank = 1 + sum(static_key(c.config, c.observation, i) < mine
                             for i, c in enumerate(static.candidates) if c.kept)
    return row


# ---------------------------------------------------------------------- presenting
def rank_text(row: RefRow, survivors: int) -> str:
    """``#87 of 159``, ``= #3 (same code object as …)``, ``not in space; would be #12``, ``pruned``…"""
    prefix = "" if row.in_space else "not in space; "
    same = f"same code object as {config_diff(row.twin, row.config)}" if row.twin is not None else ""
    if row.twin is not None and row.rank is None:
        return f"{prefix}pruned ({same})"
    if row.twin is not None:
        return f"{prefix}= #{row.rank} of {survivors} ({same})"
    if row.rank is not None:
        return f"#{row.rank} of {survivors}"
    if row.would_rank is not None:
        return f"{prefix}would be #{row.would_rank} of {survivors} + 1"
    return f"{prefix}pruned"


def verdict_text(row: RefRow) -> str:
    """``kept``, ``kept: harmless_spill`` or ``pruned: spills``."""
    if row.verdict.kept:
        return f"kept: {HARMLESS_SPILL}" if row.verdict.reason == HARMLESS_SPILL else "kept"
    return f"pruned: {row.verdict.reason}"


def _who(row: RefRow, sep: str = ", ") -> str:
    return "rocmflash static #1" if row.is_top else sep.join(ref_tag(r) for r in row.refs)


def to_records(result: ReferenceResult) -> list[dict]:
    """One JSON-ready dict per row."""
    out = []
    for row in result.rows:
        k = row.kernel
        out.append({
            "references": [r.id for r in row.refs], "static_top": row.is_top, "config": row.config.to_dict(),
            "label": config_label(row.config), "applies": row.applies is None, "why_not": row.applies,
            "in_space": row.in_space, "verdict": "kept" if row.verdict.kept else "pruned", "reason": row.verdict.reason,
            "detail": row.verdict.detail, "static_rank": row.rank, "would_rank": row.would_rank,
            "same_binary_as": None if row.twin is None else row.twin.to_dict(),
            "siblings": [{"mfma_kpack": knobs, "rank": place} for knobs, place in row.siblings],
            "survivors": result.survivors, "vgpr_count": k.get("vgpr_count"),
            "agpr_count": k.get("agpr_count"), "allocated_vgprs": k.get("allocated_vgprs"), "spills": row.spills,
            "scratch_bytes": k.get("scratch_bytes"), "lds_bytes": row.lds, "waves_per_simd": k.get("waves_per_simd"),
            "limiter": k.get("limiter"), "rank_text": rank_text(row, result.survivors)})
    return out


def _applies_text(row: RefRow, width: Optional[int] = None) -> str:
    if row.is_top:
        return "-"
    if row.applies is None:
        return "yes"
    why = row.applies if width is None or len(row.applies) <= width else row.applies[:width - 1] + "…"
    return f"no ({why})"


def _cells(row: RefRow, survivors: int, width: Optional[int] = None, sep: str = ", ") -> list[str]:
    k = row.kernel

    def s(v):
        return "-" if v is None else str(v)

    return [_who(row, sep), config_label(row.config), _applies_text(row, width),
            s(k.get("vgpr_count")), s(k.get("agpr_count")), s(k.get("allocated_vgprs")), s(row.spills), s(row.lds),
            s(k.get("waves_per_simd")), verdict_text(row), rank_text(row, survivors),
            _siblings_text(row.siblings)]


_SHORT_REASON = {"below_occupancy_floor": "<floor", "cliff_victim": "cliff", "duplicate_binary": "dup",
                 "lds_over_budget": "lds", "compile_failed": "failed"}


def _siblings_text(siblings: list) -> str:
    """``16/1 #53, 32/1 spills`` or ``all 4 spills`` (pruning reasons shortened: <floor, cliff, dup, lds)."""
    if not siblings:
        return "-"
    places = {where for _, where in siblings}
    if len(places) == 1 and not siblings[0][1].startswith("#"):
        return f"all {len(siblings)} {_SHORT_REASON.get(siblings[0][1], siblings[0][1])}"
    return ", ".join(f"{knobs} {_SHORT_REASON.get(where, where)}" for knobs, where in siblings)


HEADERS = ["reference", "rocmflash config", "selected for this problem", "VGPR", "AGPR", "alloc", "spills",
           "LDS B", "waves/SIMD", "verdict", "static rank", "in-space siblings (mfma/kpack)"]


def print_table(result: ReferenceResult, console) -> None:
    """A rich table of the rows (static #1 first, then by rank, pruned last)."""
    from rich.table import Table

    p = result.problem
    title = (f"AMD-published configs on rocmflash's {result.gpu.name} ({result.gpu.arch}) pipeline, "
             f"D={p.head_dim} {p.dtype}{' causal' if p.causal else ''}")
    table = Table(title=title, header_style="bold")
    for h in HEADERS:
        numeric = h in ("VGPR", "AGPR", "alloc", "spills", "LDS B", "waves/SIMD")
        table.add_column(h, justify="right" if numeric else "left", overflow="fold")
    for row in result.rows:
        style = "bold" if row.is_top else ("green" if row.verdict.kept else "dim")
        table.add_row(*_cells(row, result.survivors, width=32, sep="\n"), style=style)
    console.print(table)
    console.print(f"space {result.space_size} configs, {result.survivors} survive the pruner; "
                  f"{result.compiled_outside_space} reference config(s) outside the space were compiled and judged "
                  "alone. "
                  "Ranks are the tuner's static score (no timing).", highlight=False)


def markdown(result: ReferenceResult) -> str:
    """The "Reference configs" section of report.md."""
    p = result.problem
    what = f"D={p.head_dim} {p.dtype}{' causal' if p.causal else ''}"
    lines = [
        "\n## Reference configs (AMD-published)\n",
        f"Every forward config in `rocmflash/reference/amd_published.json` for {result.gpu.arch} whose head-dim "
        f"scope admits D={p.head_dim}, mapped to rocmflash's kernel (`rocmflash_config`), compiled through the same "
        "cached sweep, judged by the same pruner, and ranked with the tuner's static score among the "
        f"{result.survivors} survivors of the {result.space_size}-config space (1 = best; no timing).\n",
        "- A config outside rocmflash's space is compiled and judged alone. It shares the rank of a kept space "
        "config that compiled to the same code object (\"= #k\"), else it is placed where its static key would "
        "sort (\"would be #k of N + 1\").",
        "- The last column lists, for such a config, the space configs that differ only in "
        "`matrix_instr_nonkdim`/`kpack` (as `mfma/kpack`) with their rank or pruning reason (<floor = "
        "below_occupancy_floor, cliff = cliff_victim, dup = duplicate_binary). AMD's sources mostly leave both "
        "knobs at Triton's defaults (mfma0: the compiler picks the MFMA shape; kp1); rocmflash's space lists "
        "mfma16/32 explicitly.",
        f"- \"selected for this problem\": whether the source would pick the config for {what} without dropout, "
        "and if not, why.",
        "- Spills: VGPR + SGPR spills of every kernel. LDS: static + dynamic bytes per workgroup.\n",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    for row in result.rows:
        cells = [c.replace("|", "\\|") for c in _cells(row, result.survivors)]
        if row.is_top:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Sources (commit read; `key` = where in the file):", ""]
    for row in result.rows:
        for ref in row.refs:
            s = ref.source
            lines.append(f"- `{ref_tag(ref)}`: [{s.repo} `{s.path}` @ `{s.commit[:12]}`]({s.url}), `{s.key}` "
                         f"({ref.role}; scope: {ref.scope.describe()})")
    return "\n".join(lines) + "\n"
