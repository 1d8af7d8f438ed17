"""The decode tune end to end: static phase, live phase on a matching GPU, database entry, summary.

Kept apart from :mod:`rocmflash.tuning.decode` (problem, space, kernels' compile entry, worker
measurement, run-time lookup) so the orchestration reads on its own.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

from rocmflash.static.families import FamilyTuneResult, timed_line
from rocmflash.tuning.decode import DecodeProblem


def tune_decode(gpu_name: str, problem: DecodeProblem, db_path: Optional[str] = None, cache_dir=None, workers=None,
                timeout_s: float = 120.0, on_result=None, configs: Optional[list] = None,
                pool=None, incumbent: bool = True) -> FamilyTuneResult:
    """Static phase for ``gpu_name``'s arch; on a matching live GPU (or ``pool``'s) every survivor is gated and
    timed; the entry is written to the database (atomically, under the tune lock). ``configs`` replaces the
    default space (a list of DecodeConfig dicts). ``incumbent``: time the platform's SDPA beside the winner
    (dense 16-bit caches) and store it in the entry's ``incumbent``. The problem is a
    :class:`~rocmflash.tuning.items_decode.DecodeItem` run through the tune pipeline.

    ``problem.kv_dtype`` ``fp8``/``fp8_e4m3``/``fp8_e5m2`` is resolved to the GPU's format first
    (:meth:`~rocmflash.tuning.decode.DecodeProblem.for_gpu`: a one-line ``ValueError`` on gfx90a)."""
    from rocmflash.tuning.items_decode import DecodeItem

    return tune_one(gpu_name, problem,
                    lambda ctx: DecodeItem(ctx, problem.for_gpu(ctx.gpu), cache_dir, workers, timeout_s, configs,
                                           on_result, incumbent),
                    db_path, timeout_s, pool)


def tune_one(gpu_name: str, problem, make_item: Callable, db_path: Optional[str], timeout_s: float, pool=None):
    """Tune one problem of a worker-task family through the pipeline: on ``pool``'s workers, else on the
    current device when it is ``gpu_name`` (else the static phase only); the entry stored under the tune
    lock. ``make_item(ctx)`` -> the :class:`TaskItem`. Returns its FamilyTuneResult."""
    from rocmflash.db import default_db_path, tune_lock
    from rocmflash.tuning.items import open_context, run_items, timing_workers
    from rocmflash.tuning.items_base import current_device_runner
    from rocmflash.tuning.live_worker import LiveSettings
    from rocmflash.tuning.run import _no_live_reason, resolve_gpu

    start = time.perf_counter()
    problem.validate()
    gpu, live = resolve_gpu(gpu_name)
    own_runner = pool is None and live is not None and live.name == gpu.name
    measuring = pool is not None or own_runner
    why = None if measuring else _no_live_reason(gpu)
    path = db_path or default_db_path(gpu.name)
    runner = pool
    lock = tune_lock(path)
    try:
        if own_runner:
            runner = current_device_runner(LiveSettings(timeout_s=timeout_s))
        ctx = open_context(gpu, path, getattr(runner, "device", None), measuring, why,
                           prewarmer=runner, runners=getattr(runner, "runners", [runner]) if runner else None)
        item = make_item(ctx)
        run_items([item], timing_workers(runner), ctx)
    finally:
        if own_runner and runner is not None:
            runner.close()
        lock.release()
    return dataclasses.replace(item.result(path), seconds=time.perf_counter() - start)


def print_decode_summary(result: FamilyTuneResult, console) -> None:
    e = result.entry
    s = result.static
    console.print(f"decode tune {result.gpu.name} ({result.gpu.arch}) {result.key}: {len(s.rows)} configs, "
                  f"{len(s.ranked)} survive the static phase")
    if result.measured:
        c = e["counts"]
        console.print(timed_line(c))
        if e.get("best"):
            console.print(f"best: {e['best']}  {e['time_ms'] * 1e3:.1f} µs, K/V read at {e['kv_gbs']:.0f} GB/s "
                          f"({100 * e['hbm_efficiency']:.0f}% of {result.gpu.name}'s HBM peak)")
    else:
        console.print(f"not measured ({result.why_unmeasured}); static #1 written with \"measured\": false: "
                      f"{e.get('best')}")
    console.print(f"database: {result.db_path}")


def page_size_rows(results: list) -> list:
    """One row per page size tuned, fastest first: ``(page_size, best config, µs, HBM fraction, time / fastest)``.

    A page size is a choice of the serving engine, not of rocmflash: the rows tell the user
    which page size the decode kernels read fastest on this GPU (a page size that is a multiple
    of ``BLOCK_N`` lets a key block look up one page instead of one per key). Unmeasured results
    (no live GPU) have no time and are left out."""
    timed = [(r.problem.page_size, r.entry["best"], r.entry["time_ms"] * 1e3, r.entry.get("hbm_efficiency"))
             for r in results if r.measured and r.entry.get("time_ms")]
    timed.sort(key=lambda row: row[2])
    return [(page, best, us, hbm, us / timed[0][2]) for page, best, us, hbm in timed]


def print_page_size_comparison(results: list, console) -> None:
    """The page sizes of one decode problem side by side (rich table), or why there is nothing to compare."""
    from rich.table import Table

    rows = page_size_rows(results)
    if not rows:
        console.print("page sizes not compared: nothing was timed (static phase only)")
        return
    table = Table(title=f"page sizes, {results[0].problem.key().rsplit('-p', 1)[0]}")
    for column in ("page size", "best config", "µs", "HBM", "vs fastest"):
        table.add_column(column)
    for page, best, us, hbm, ratio in rows:
        label = "contiguous" if page == 0 else str(page)
        config = f"BN{best['BLOCK_N']} w{best['num_warps']} s{best['num_stages']} x{best['num_splits']}"
        table.add_row(label, config, f"{us:.1f}", f"{100 * hbm:.0f}%" if hbm else "-", f"{ratio:.2f}x")
    console.print(table)
