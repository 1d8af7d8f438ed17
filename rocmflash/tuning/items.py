"""Kernel families as plug-in items of the one tune pipeline (:mod:`rocmflash.tuning.pipeline`).

An item is one (family, problem) of a tune: :class:`~rocmflash.tuning.items_fwd.ForwardItem`
(race / pruned / exhaustive over the forward space), :class:`~rocmflash.tuning.items_bwd.BackwardItem`
(dQ and dK/dV), :class:`~rocmflash.tuning.items_decode.DecodeItem` and the varlen forward and
backward (:mod:`rocmflash.tuning.items_varlen`). Each runs its static phase (compile, prune, rank,
pre-warm) on the pipeline's compile pool, hands its timed configs out as batches of jobs (a race
round each), appends every result to the one journal as it arrives (so ``--resume`` and a plain
re-run skip what is there, for every family) and writes its database entry when it finishes. What
the items of one tune share lives in a :class:`~rocmflash.tuning.items_base.TuneContext`.

:func:`items_for_plan` builds the items of a model plan (:mod:`rocmflash.tuning.plan`) in plan
order; :func:`run_items` runs items through one pipeline. The tune entry points
(:func:`rocmflash.tuning.run.tune`, ``backward_run.tune_backward``, ``decode_run.tune_decode``,
``varlen_run.tune_varlen[_backward]``, ``model_run.tune_model``) build items and call it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from rocmflash.tuning.items_base import (FamilyTiming, SharedStatics, TuneContext, cached_compile_seconds,  # noqa: F401
                                         config_json, family_results, open_context)
from rocmflash.tuning.items_bwd import BackwardItem, backward_items
from rocmflash.tuning.items_decode import DecodeItem
from rocmflash.tuning.items_fwd import ForwardItem, forward_items


# ---------------------------------------------------------------------- plans
def items_for_plan(plan, db_path: Optional[str] = None, strategy: str = "race", cache_dir: Optional[str] = None,
                   workers: Optional[int] = None, timeout_s: float = 120.0, seeds: bool = True, resume: bool = False,
                   console=None, progress: bool = False, device: Optional[str] = "replay", measuring: bool = True,
                   why: Optional[str] = None, prewarmer=None, runners: Optional[list] = None,
                   incumbent: bool = True, ctx: Optional[TuneContext] = None) -> list:
    """The items of ``plan`` (:class:`~rocmflash.tuning.plan.TunePlan`) in plan order: per dtype its
    forward problems, backward problems, then decode problems. The static phases run on the CPU when the
    pipeline calls ``static()``; the runners are the caller's (``runners``, if given, only tell whether
    they run worker tasks: the incumbent). ``device`` names the timing device in the environment
    fingerprint; ``measuring=False`` gives items that write static entries. The caller holds the
    database's tune lock. ``ctx``: an open :class:`TuneContext` to use instead."""
    from rocmflash.db import default_db_path
    from rocmflash.tuning.live_worker import LiveSettings
    from rocmflash.static.space import default_space
    from rocmflash.tuning.decode import DecodeProblem
    from rocmflash.tuning.spec import TuneSpec

    model, gpu = plan.model, plan.gpu
    if ctx is None:
        ctx = open_context(gpu, db_path or default_db_path(gpu.name), device, measuring, why, console, progress,
                           prewarmer, runners)
    if resume:
        ctx.out.note(f"resuming from {ctx.journal.path}: {len(ctx.journal.records)} recorded result(s)"
                     if ctx.journal is not None else "--resume: nothing to resume (nothing is measured)")
    space = default_space(gpu, None)
    items: list = []
    for dtype in plan.dtypes:
        spec = TuneSpec(gpu=gpu.name, head_dim=model.head_dim, dtype=dtype, seqlens=list(plan.seqlens), causal=True,
                        heads=model.heads_q, kv_heads=model.heads_kv, strategy=strategy, db_path=db_path,
                        resume=resume, cache_dir=cache_dir, workers=workers, seeds=seeds, incumbent=incumbent,
                        live_settings=LiveSettings(timeout_s=timeout_s)).validate()
        if "fwd" in plan.passes:
            items += forward_items(ctx, spec, space)
        if "bwd" in plan.passes:
            items += backward_items(ctx, spec)
        if plan.decode:
            for s in plan.seqlens:
                problem = DecodeProblem(head_dim=model.head_dim, dtype=dtype, heads_q=model.heads_q,
                                        heads_kv=model.heads_kv, batch=plan.decode_batch, seqlen_k=s).validate()
                items.append(DecodeItem(ctx, problem, cache_dir, workers, timeout_s, incumbent=incumbent))
    return items


#: set to a file path, every pipeline event of a tune (static phases, jobs, workers, on the wall clock since the
#: pipeline started) is appended to it as JSON lines: the per-worker timeline of a run (benchmarks/scale_gpus.py)
TRACE_ENV = "ROCMFLASH_PIPELINE_TRACE"


def run_items(items: list, runners, ctx: Optional[TuneContext] = None, labels: Optional[list] = None,
              compile_slots: int = 1, gate=None):
    """Run ``items`` through one :class:`~rocmflash.tuning.pipeline.Pipeline` on ``runners`` (a list, or a
    :class:`~rocmflash.tuning.pool.WorkerPool`: its runners, labels and stats, which then count what the
    pipeline's workers did); with ``ctx``'s progress on, one display for the whole run. Its stats.

    The static phases start in the items' order; on several timing workers the workers take the jobs of the
    largest items first (:func:`~rocmflash.tuning.pipeline.largest_first`: the longest timing starts first,
    the short jobs of small items end the run); on one, in the items' order (the total is the same).
    ``compile_slots``: static phases at once (their compile workers should split the cores). ``gate``: the
    pipeline's (:class:`~rocmflash.tuning.pipeline.Pipeline`), a plan made on a guess confirmed there."""
    import contextlib

    from rocmflash.tuning.pipeline import Pipeline, largest_first

    n_workers = len(getattr(runners, "runners", None) or runners or [])
    trace = _Trace.open()
    pipe = Pipeline(items, runners, compile_slots=compile_slots, labels=labels, on_event=trace,
                    priority=largest_first(items) if n_workers > 1 else None,
                    on_statics_done=ctx.release_prewarm if ctx is not None else None, gate=gate)
    pool_stats = getattr(runners, "stats", None)
    if pool_stats is not None and len(pool_stats) == len(pipe.workers):
        pipe.workers = pool_stats  # the pool's own display and counts follow the pipeline's workers
    show = ctx is not None and ctx.measuring and ctx.out.progress and ctx.out.live is None
    if ctx is not None:
        ctx.start_prewarm()  # its processes start beside the first static phase's cross-compile
    with (ctx.out.shared(_Workers(pipe.workers), len(items)) if show else contextlib.nullcontext()):
        try:
            return pipe.run()
        finally:
            if trace is not None:
                trace.close()
            if pool_stats is not None and hasattr(runners, "_alive"):  # WorkerPool.parallelism counts the living
                runners._alive = sum(not s.lost for s in pool_stats)


def trace_mark(name: str) -> None:
    """Append ``{"event": "mark", "name": name, "wall": time.time()}`` to ``$ROCMFLASH_PIPELINE_TRACE`` (no-op
    unset): where a tune process spends its time outside the pipeline (start-up, workers, saving, closing), on
    the wall clock a caller that started the process can subtract from (benchmarks/scale_gpus.py)."""
    import os
    import time

    path = os.environ.get(TRACE_ENV)
    if path:
        trace = _Trace.open()
        trace({"event": "mark", "name": name, "wall": time.time()})
        trace.close()


class _Trace:
    """The pipeline's events as JSON lines in ``$ROCMFLASH_PIPELINE_TRACE`` (see :data:`TRACE_ENV`)."""

    def __init__(self, f):
        self.f = f

    @classmethod
    def open(cls):
        import os

        path = os.environ.get(TRACE_ENV)
        if not path:
            return None
        try:
            return cls(open(path, "a", encoding="utf-8"))
        except OSError as err:
            raise ValueError(f"${TRACE_ENV}={path}: cannot write it ({err})") from None

    def __call__(self, event: dict) -> None:
        import json

        self.f.write(json.dumps(event, default=str) + "\n")

    def close(self) -> None:
        self.f.close()


def timing_workers(runner):
    """What a tune's ``runner`` argument gives the pipeline: a pool as itself (its runners), one runner as a
    list of one, None (static only: no job ever reaches a worker) as a placeholder worker."""
    if runner is not None and hasattr(runner, "runners") and hasattr(runner, "stats"):
        return runner
    return [runner]


@dataclasses.dataclass
class _Workers:
    """What the shared progress display reads: the workers' stats."""

    stats: list


__all__ = ["ForwardItem", "BackwardItem", "DecodeItem", "forward_items", "backward_items", "items_for_plan",
           "run_items", "TRACE_ENV", "timing_workers", "TuneContext", "SharedStatics", "open_context", "family_results",
           "config_json", "FamilyTiming", "cached_compile_seconds"]
