"""``rocmflash tune``: static phase, live phase, journal, database (the tuning package).

Flow for one tune (one GPU, head dim, dtype, causal flag, one or more sequence lengths):

1. **Static phase** (always): the config space (:func:`rocmflash.static.space.default_space`)
   is cross-compiled on the CPU (:func:`rocmflash.static.compile.sweep`, cached) and pruned
   (:func:`rocmflash.static.prune.prune`). Survivors are ranked by the static score below.
2. **Live phase**, only when the live GPU is the one asked for: the strategy picks the
   configs to time, each is gated and timed in an isolated worker
   (:mod:`rocmflash.tuning.live`), every result is appended to the journal as it arrives, and
   the database entry is rebuilt from the journal (:mod:`rocmflash.db`).
3. Without a matching live GPU the static ranking is written with ``"measured": false``
   and the output says that nothing was benchmarked, and why.

Strategies
----------
``race`` (default): every static survivor, in successive rounds (:mod:`rocmflash.tuning.race`):
  a short ungated screen of all, then the fastest quarter (and near-ties) measured
  longer with the gate, then the fastest third of those with the full settings. The
  static score orders the work; it never decides alone what is not timed.
``exhaustive``: time every config of the space, in space order, pruned or not (the
  baseline; the static verdicts are still recorded beside each result).
``pruned``: time only the top ``K`` survivors of the static pruner by static score
  (``--top-k``; default 15% of the space, at least 4). If fewer survive, all are timed.

Static score (the ranking when nothing is measured, the order of ``pruned`` and ``race``)
--------------------------------------------------------------------------------
Survivors are sorted by this key, smallest first:

1. the variant's **work factor**: matrix FLOPs relative to ``online`` (``online`` 1,
   ``split_kv`` 1.05 for its partial writes and combine launch, ``split_d`` (c+1)/2
   for c head-dim chunks recomputing QKᵀ, ``two_phase`` 1.5 for its second QKᵀ pass);
2. **rows per warp** ``BLOCK_M / num_warps`` of at least 16 first: the warps of a
   program split its query rows, and fewer than 16 rows per warp leaves the matrix
   instruction's M dimension (16) part empty (on AMD the default space already
   excludes such configs);
NVIDIA (fitted on H100 timings):

3. **occupancy**: warps per scheduler, more first;
4. fewer **registers** per thread: headroom before the next cliff;
5. larger ``BLOCK_N`` (fewer loop trips), then more ``num_stages``, then space order.

AMD (fitted on AMD's published defaults; no AMD timing here):

3. tiles that keep **2 waves/SIMD** first (AMD's defaults run at ``waves_per_eu=2``);
4. larger ``BLOCK_M`` up to 128, then larger ``BLOCK_N`` up to 64 (K/V and Q reuse per
   wave, which AMD's defaults choose over a third wave);
5. occupancy, fewer allocated VGPRs, more ``num_stages``, then space order.

It uses compiler truth only (the code object's registers and LDS), never a timing.
History: the first version ranked ``min(BLOCK_M, 128)`` (K/V reuse) before occupancy
everywhere; on the H100 it missed the ``64x64, 4 warps`` winner of 9 of 16 benchmark
problems (docs/evidence/tune-2026-11-21-h100.md), so NVIDIA ranks occupancy first. On AMD the
occupancy-first key put aiter's MI300X default 128x64 at #111 of 185 survivors; the
tile-first AMD key puts it at #23 (docs/evidence/reference-2026-11-23/README.md). Under the
default ``race`` strategy the score only orders the work.

Modules, in the order data flows: :mod:`~rocmflash.tuning.spec` (what is asked),
:mod:`~rocmflash.tuning.static` (compile, prune, rank), :mod:`~rocmflash.tuning.strategies`
(what is timed, in which rounds), :mod:`~rocmflash.tuning.runners` (what times it: replay;
the live GPU runner is :class:`rocmflash.tuning.live.LiveRunner`), :mod:`~rocmflash.tuning.entries`
(database entries), :mod:`~rocmflash.tuning.output` (console observer) and
:mod:`~rocmflash.tuning.run` (the tune). ``rocmflash.tune`` re-exports them.
"""

# Lazy (PEP 562): importing ``rocmflash.tuning.x`` costs only ``x`` and what it imports, not the whole tune
# (run, the items, the pipeline); a name below is imported from its module the first time it is read.
_NAMES = {
    "rocmflash.tuning.entries": ("measured_entry", "shape_key", "static_entry"),
    "rocmflash.tuning.output": ("print_summary",),
    "rocmflash.tuning.items_fwd": ("ProblemOutcome",),
    "rocmflash.tuning.run": ("TuneInterrupted", "TuneResult", "resolve_gpu", "tune"),
    "rocmflash.tuning.runners": ("ReplayRunner",),
    "rocmflash.tuning.spec": ("DEFAULT_TOP_K_FRACTION", "HEADS_TIMES_D", "INJECT_ENV", "NEAR_BEST_PCT",
                              "STATIC_SCORE_DOC", "STRATEGIES", "TOKENS_PER_BATCH", "NoLiveGPUError", "TuneSpec",
                              "parse_inject", "static_problem"),
    "rocmflash.tuning.static": ("Candidate", "StaticResult", "default_top_k", "static_key", "static_phase",
                                "work_factor"),
    "rocmflash.tuning.strategies": ("choose", "seeded"),
}
#: public name -> the module that defines it
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}

__all__ = ["tune", "TuneSpec", "TuneResult", "TuneInterrupted", "ProblemOutcome", "NoLiveGPUError", "ReplayRunner",
           "static_phase", "static_problem", "static_key", "work_factor", "Candidate", "StaticResult", "choose",
           "seeded", "default_top_k", "measured_entry", "static_entry", "shape_key", "resolve_gpu", "print_summary",
           "parse_inject", "STRATEGIES", "NEAR_BEST_PCT", "DEFAULT_TOP_K_FRACTION", "INJECT_ENV",
           "TOKENS_PER_BATCH", "HEADS_TIMES_D", "STATIC_SCORE_DOC"]


def __getattr__(name: str):
    """A public name of the package, imported from its module on first use (then kept as a global)."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
