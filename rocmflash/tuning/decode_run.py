"""The decode tune end to end: static phase, live phase on a matching GPU, database entry, summary.

Kept apart from :mod:`rocmflash.tuning.decode` (problem, space, kernels' compile entry, worker
measurement, run-time lookup) so the orchestration reads on its own.
"""

from __future__ import annotations

import time
from typing import Optional

from rocmflash.families import FamilyStatic, FamilyTuneResult, timed_line
from rocmflash.tuning.decode import DecodeProblem, lookup_decode, measure_decode, static_phase
from rocmflash.tuning.spec import NEAR_BEST_PCT


def _measure_all(survivors: list, problem: DecodeProblem, timeout_s: float, interpret: bool, on_result=None,
                 pool=None, compute_units: int = 0) -> list:
    """Every survivor in one isolated worker pinned to the current device (a crash or hang costs that config);
    on a GPU every survivor is compiled first, in parallel."""
    from rocmflash.tuning.isolated import measure_isolated, prewarm_parallel

    if not interpret:
        import torch

        from rocmflash.kernels.common import num_compute_units
        from rocmflash.kernels.kv_decode import DecodeConfig
        from rocmflash.tuning.decode import prewarm_decode, split_choices

        # a cluster's driver may have no GPU: its actors' GPU is the plan's, whose CU count the catalog knows
        units = num_compute_units(torch.device("cuda")) if torch.cuda.is_available() else compute_units
        warm = [{"config": r["config"], "problem": problem.to_dict(),
                 "splits": split_choices(problem, DecodeConfig.from_dict(r["config"]), units)} for r in survivors]
        if pool is not None:
            pool.prewarm_tasks(warm, prewarm_decode, timeout_s)
        else:
            prewarm_parallel(warm, prewarm_decode, timeout_s)
    tasks = [{"config": r["config"], "problem": problem.to_dict()} for r in survivors]
    return measure_isolated(tasks, measure_decode, timeout_s, interpret, on_result, pool=pool)


def measured_entry(gpu, problem: DecodeProblem, static: FamilyStatic, results: list, env: dict,
                   interpret: bool) -> dict:
    timed = [(t, int(n), r["config"]) for r in results if r["status"] == "ok" for n, t in r["times_ms"].items()]
    counts = {"space": len(static.rows), "survivors": len(static.ranked), "timed": len(results),
              **{s: sum(1 for r in results if r["status"] == s) for s in ("ok", "incorrect", "failed", "timeout",
                                                                         "crashed")}}
    entry = {"mode": "decode", "problem": problem.to_dict(), "measured": bool(timed), "strategy": "all-survivors",
             "counts": counts, "timing": "interpreter" if interpret else "gpu graph replay (cold K/V copies)", "fingerprint": env,
             "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not timed:
        entry.update(best=None, time_ms=None)
        return entry
    timed.sort(key=lambda x: x[0])
    best_t, best_n, best_cfg = timed[0]
    gbs = problem.kv_bytes() / (best_t * 1e-3) / 1e9
    entry.update(best=dict(best_cfg, num_splits=best_n), time_ms=round(best_t, 5), kv_gbs=round(gbs, 1),
                 hbm_efficiency=round(gbs / (gpu.hbm_tbs * 1e3), 3),
                 near_best=[dict(c, num_splits=n, time_ms=round(t, 5)) for t, n, c in timed[1:]
                            if t <= best_t * (1 + NEAR_BEST_PCT / 100)][:10])
    return entry


def static_entry(problem: DecodeProblem, static: FamilyStatic, why: str, env: dict) -> dict:
    top = static.ranked[0]["config"] if static.ranked else None
    return {"mode": "decode", "problem": problem.to_dict(), "measured": False, "why_unmeasured": why,
            "strategy": "static", "best": dict(top, num_splits=0) if top else None, "time_ms": None,
            "counts": {"space": len(static.rows), "survivors": len(static.ranked), "timed": 0},
            "fingerprint": env, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def tune_decode(gpu_name: str, problem: DecodeProblem, db_path: Optional[str] = None, cache_dir=None, workers=None,
                timeout_s: float = 120.0, on_result=None, configs: Optional[list] = None,
                pool=None) -> FamilyTuneResult:
    """Static phase for ``gpu_name``'s arch; on a matching live GPU every survivor is gated and timed; the
    entry is written to the database (atomically, under the tune lock). ``configs`` replaces the
    default space (a list of DecodeConfig dicts)."""
    from rocmflash.db import default_db_path, environment, store_entry
    from rocmflash.kernels.common import interpreting
    from rocmflash.tuning.run import _no_live_reason, resolve_gpu

    start = time.perf_counter()
    problem.validate()
    gpu, live = resolve_gpu(gpu_name)
    static = static_phase(gpu, problem, cache_dir, workers, configs=configs)
    measuring = pool is not None or (live is not None and live.name == gpu.name)
    interpret = interpreting()
    device_name = None
    if pool is not None:
        device_name = pool.device
    elif measuring:
        import torch

        device_name = torch.cuda.get_device_properties(torch.cuda.current_device()).name
    env = environment(device_name)
    results, why = [], None
    if measuring:
        results = _measure_all(static.ranked, problem, timeout_s, interpret, on_result, pool, gpu.compute_units)
        entry = measured_entry(gpu, problem, static, results, env, interpret)
    else:
        why = _no_live_reason(gpu)
        entry = static_entry(problem, static, why, env)
    path = db_path or default_db_path(gpu.name)
    store_entry(path, gpu, env, problem.key(), entry, measuring)
    lookup_decode.cache_clear()
    from rocmflash.decode import clear_cache

    clear_cache()
    return FamilyTuneResult(gpu, problem, static, problem.key(), entry, path, measuring, why, results,
                            time.perf_counter() - start)


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
