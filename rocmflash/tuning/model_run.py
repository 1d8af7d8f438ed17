"""``rocmflash tune --model``: every attention problem of a model, on one GPU, every GPU of a node, or a cluster.

The plan (:mod:`rocmflash.tuning.plan`) runs through ONE pipeline (:mod:`rocmflash.tuning.pipeline`):
its items (:func:`rocmflash.tuning.items.items_for_plan`: per dtype the forward, backward and
decode problems) are compiled and pruned on the CPU ahead of the timing, and every timing worker
(one per GPU of the pool, or the current device) takes the next timed config of any item as soon
as it is free, with no barrier between passes or dtypes. Everything lands in the one database
and journal, with the guarantees a single-GPU tune has (resume, crash isolation, atomic writes).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from rocmflash.tuning.plan import TunePlan


@dataclasses.dataclass
class ModelTuneResult:
    plan: TunePlan
    db_path: Optional[str]
    measured: bool
    why_unmeasured: Optional[str]
    forward: list  #: TuneResult per dtype
    backward: list  #: BwdTuneResult per dtype
    decode: list  #: FamilyTuneResult per decode problem
    seconds: float
    workers: list  #: WorkerStats of the pipeline's timing workers (those of the pool; empty on one GPU without one)


def tune_model(plan: TunePlan, pool=None, db_path: Optional[str] = None, strategy: str = "race",
               cache_dir: Optional[str] = None, workers: Optional[int] = None, timeout_s: float = 120.0,
               seeds: bool = True, resume: bool = False, console=None, progress: bool = True,
               on_stage=None) -> ModelTuneResult:
    """Run ``plan`` through one pipeline; ``pool`` (a :class:`~rocmflash.tuning.pool.WorkerPool`) times on
    its workers, None times on the current device when it is the plan's GPU (else the static phase only).

    Several static phases run at once (:func:`~rocmflash.tuning.pipeline.default_compile_slots`), each
    cross-compiling on its share of the cores (``workers``, when given, is each one's compile processes)."""
    from rocmflash.db import default_db_path, tune_lock
    from rocmflash.tuning.items import items_for_plan, run_items, timing_workers
    from rocmflash.tuning.output import trace_mark
    from rocmflash.tuning.pipeline import compile_workers, default_compile_slots

    start = time.perf_counter()
    gpu = plan.gpu
    say = on_stage or (lambda text: console.print(text, highlight=False) if console is not None else None)
    runner, own_runner, measuring, why, device = _model_runner(gpu, pool, timeout_s, cache_dir, workers)
    trace_mark("runner_found")
    path = db_path or default_db_path(gpu.name)
    lock = tune_lock(path)
    items: list = []
    stats = None
    try:
        if own_runner:
            runner = _live_runner(timeout_s, cache_dir, workers)
        runners = list(getattr(runner, "runners", None) or ([runner] if runner is not None else []))
        slots = default_compile_slots()
        items = items_for_plan(plan, db_path, strategy, cache_dir, workers or compile_workers(slots), timeout_s, seeds,
                               resume, console, progress, device, measuring, why, prewarmer=runner, runners=runners)
        say(f"[bold]{plan.model.name}[/bold]: {len(items)} problem(s) in one pipeline "
            f"({', '.join(sorted({i.family for i in items}))}; {len(runners) or 'no'} timing worker(s))")
        trace_mark("items_made")
        stats = run_items(items, timing_workers(runner), items[0].ctx if items else None, compile_slots=slots,
                          gate=getattr(pool, "confirm", None))
        trace_mark("pipeline_done")
    finally:
        if own_runner and runner is not None:
            runner.close()
            trace_mark("runner_closed")
        lock.release()
        _clear_lookups()
    forward, backward, decode = _results(plan, items, path, measuring, why)
    trace_mark("results_made")
    return ModelTuneResult(plan, path, measuring, why, forward, backward, decode, time.perf_counter() - start,
                           list(stats.workers) if stats is not None and pool is not None else [])


def _model_runner(gpu, pool, timeout_s, cache_dir, workers):
    """``(runner, own_runner, measuring, why, device name)``: the pool, or the current device when it is
    ``gpu`` (its runner made once the lock is held), or nothing (static only, and why)."""
    from rocmflash.tuning.run import _no_live_reason, resolve_gpu

    if pool is not None:
        return pool, False, True, None, pool.device
    _, live = resolve_gpu(gpu.name)
    if live is not None and live.name == gpu.name:
        import torch

        return None, True, True, None, torch.cuda.get_device_properties(torch.cuda.current_device()).name
    return None, False, False, _no_live_reason(gpu), None


def _live_runner(timeout_s, cache_dir, workers):
    import torch

    from rocmflash.static.compile import triton_cache_dir
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    return LiveRunner(LiveSettings(timeout_s=timeout_s), triton_cache_dir=triton_cache_dir(cache_dir),
                      prewarm_workers=workers, device_index=torch.cuda.current_device())


def _results(plan, items, path, measuring, why) -> tuple:
    """Today's result types from the items: a TuneResult and a BwdTuneResult per dtype, a FamilyTuneResult
    per decode problem."""
    from rocmflash.tuning.backward_run import BwdTuneResult
    from rocmflash.tuning.run import TuneResult

    forward, backward, decode = [], [], []
    journal = items[0].ctx.journal if items else None
    for dtype in plan.dtypes:
        fwd = [i for i in items if i.family == "fwd" and i.spec.dtype == dtype]
        bwd = [i for i in items if i.family == "bwd" and i.spec.dtype == dtype]
        if fwd:
            forward.append(TuneResult(plan.gpu, path, journal.path if journal is not None else None, measuring, why,
                                      [i.outcome for i in fwd], sum(i.outcome.seconds for i in fwd)))
        if bwd:
            backward.append(BwdTuneResult(plan.gpu, path, measuring, why, [i.outcome() for i in bwd],
                                          sum(i.seconds for i in bwd)))
        decode += [i.result(path) for i in items if i.family == "decode" and i.problem.dtype == dtype]
    return forward, backward, decode


def _clear_lookups() -> None:
    """Run-time lookups read the new entries (the backward's and decode's caches, selection's)."""
    from rocmflash.api import selection
    from rocmflash.db.lookups.backward import clear_cache

    clear_cache()
    selection.clear_cache()


def measured_cell(entry: dict) -> str:
    """The summary's "measured" cell: FAILED for a problem no config passed (the tune exits non-zero)."""
    return "FAILED" if entry.get("failed") else "yes" if entry.get("measured") else "no"


def print_model_summary(result: ModelTuneResult, console, n_gpus: int, cpu_cores: int) -> None:
    """One row per problem (pass, key, best config, time, measured) and the wall time against the plan."""
    from rich.table import Table

    from rocmflash.tuning.output import _label

    plan = result.plan
    table = Table(title=f"rocmflash tune --model {plan.model.name}: {plan.gpu.name} -> {result.db_path}")
    for col in ("pass", "key", "measured", "best config", "time", "timed"):
        table.add_column(col)
    for r in result.forward:
        for o in r.outcomes:
            e = o.entry or {}
            table.add_row("fwd", o.key, measured_cell(e),
                          _label(e["best"]) if e.get("best") else "-",
                          f"{e['time_ms']:.3f} ms" if e.get("time_ms") else "-",
                          str((e.get("counts") or {}).get("timed", "-")))
    for r in result.backward:
        for o in r.outcomes:
            e = o.entry or {}
            best = e.get("best") or {}
            text = " + ".join(f"{k} {v['BLOCK_M']}x{v['BLOCK_N']} w{v['num_warps']}" for k, v in best.items()
                              if isinstance(v, dict) and "BLOCK_M" in v)
            table.add_row("bwd", o.key, measured_cell(e), text or "-",
                          f"{e['time_ms']['total']:.3f} ms" if e.get("time_ms") else "-",
                          str((e.get("counts") or {}).get("timed", "-")))
    for r in result.decode:
        e = r.entry or {}
        best = e.get("best") or {}
        text = (f"n{best['BLOCK_N']} w{best['num_warps']} s{best['num_stages']} splits {best.get('num_splits')}"
                if best else "-")
        table.add_row("decode", r.key, measured_cell(e), text,
                      f"{1e3 * e['time_ms']:.1f} µs" if e.get("time_ms") else "-",
                      str((e.get("counts") or {}).get("timed", "-")))
    console.print(table)
    est = plan.estimate_seconds(n_gpus, cpu_cores)
    what = "total" if result.measured else "static"
    console.print(f"wall time {result.seconds:.0f} s (plan estimate ~{est[what]:.0f} s, if nothing was cached)",
                  highlight=False)
    for s in result.workers:
        console.print(f"  worker {s.label}: {s.done} timed ({s.failed} not ok), busy {s.busy_s:.0f} s"
                      + (", LOST" if s.lost else ""), highlight=False)
    if not result.measured:
        console.print(f"nothing was timed: {result.why_unmeasured}; entries are static rankings "
                      "(\"measured\": false)", highlight=False)


__all__ = ["ModelTuneResult", "tune_model", "print_model_summary"]
