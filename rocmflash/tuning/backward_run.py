"""The backward tune end to end: static phase, live phase on a matching GPU, database entries, summary.

Kept apart from :mod:`rocmflash.tuning.backward` (keys, space, compile entry, worker
measurement, run-time lookup) so the orchestration reads on its own. One tune covers the
problems of a :class:`~rocmflash.tuning.spec.TuneSpec` (one per sequence length), as the
forward tune does; ``rocmflash tune --pass both`` runs the forward tune, then this one.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

from rocmflash.families import timed_line
from rocmflash.tuning.backward import (KERNELS, BwdStatic, bwd_key, clear_cache, measure_bwd, prewarm_bwd,
                                       space_point, static_phase)

#: results within this many percent of a kernel's best time are listed as near-best
NEAR_BEST_PCT = 3.0


@dataclasses.dataclass
class BwdOutcome:
    key: str
    shape: object
    static: BwdStatic
    entry: dict
    results: list
    seconds: float


@dataclasses.dataclass
class BwdTuneResult:
    gpu: object
    db_path: str
    measured: bool
    why_unmeasured: Optional[str]
    outcomes: list
    seconds: float


def _label(config: dict, splits: Optional[int] = None) -> str:
    text = f"{config['BLOCK_M']}x{config['BLOCK_N']} w{config['num_warps']} s{config['num_stages']}"
    text += f" wpe{config['waves_per_eu']}" if config.get("waves_per_eu") else ""
    return text + (f" hs{splits}" if splits and splits > 1 else "")


def to_time(static: BwdStatic, strategy: str, top_k: Optional[int], defaults: dict) -> list:
    """The space points to measure: every survivor (``race``: the race's guarantee, with no ranking
    needed at this size), every config (``exhaustive``) or the top ``top_k`` survivors per kernel
    (``pruned``); the per-arch default of each kernel always, so the entry says what tuning gained."""
    chosen = []
    for kernel in KERNELS:
        if strategy == "exhaustive":
            rows = [r for r in static.of(kernel) if r["kernel"]]
        else:
            rows = static.ranked(kernel)
            if strategy == "pruned" and top_k:
                rows = rows[:top_k]
        chosen += [r["config"] for r in rows]
        if defaults[kernel] not in chosen:
            chosen.append(defaults[kernel])
    return chosen


def _kernel_best(results: list, kernel: str) -> list:
    """``[(ms, head_splits, config), ...]`` of one kernel's correct results, fastest first."""
    timed = [(t, int(n), r["config"]) for r in results if r["status"] == "ok" and r["config"]["kernel"] == kernel
             for n, t in r["times_ms"].items()]
    return sorted(timed, key=lambda x: x[0])


def measured_entry(shape, static: BwdStatic, results: list, defaults: dict, strategy: str, env: dict,
                   interpret: bool, auto_splits: int = 1) -> dict:
    """The database entry of a measured backward problem: the best of each kernel, its time, the
    default's time (dK/dV at ``auto_splits``, the split count the run time would choose for it),
    near-best alternatives and counts."""
    from rocmflash.tuning.backward import kernel_config

    counts = {"space": len(static.rows), "survivors": sum(len(static.ranked(k)) for k in KERNELS),
              "timed": len(results),
              **{s: sum(1 for r in results if r["status"] == s) for s in ("ok", "incorrect", "failed", "timeout",
                                                                         "crashed")}}
    entry = {"mode": "bwd", "problem": shape.to_dict(), "strategy": strategy, "counts": counts,
             "timing": "interpreter" if interpret else "gpu", "fingerprint": env,
             "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    best = {k: _kernel_best(results, k) for k in KERNELS}
    if not all(best.values()):
        missing = [k for k in KERNELS if not best[k]]
        entry.update(measured=False, best=None, time_ms=None,
                     why_unmeasured=f"no {' or '.join(missing)} config passed the gate")
        return entry
    (t_dq, _, c_dq), (t_dkdv, splits, c_dkdv) = best["dq"][0], best["dkdv"][0]
    entry.update(measured=True, best={"dkdv": kernel_config(c_dkdv).to_dict(), "dq": kernel_config(c_dq).to_dict(),
                                      "head_splits": splits},
                 time_ms={"dq": round(t_dq, 5), "dkdv": round(t_dkdv, 5), "total": round(t_dq + t_dkdv, 5)})
    default_ms = {}
    for kernel in KERNELS:  # the per-arch default as run-time selection runs it (dK/dV: automatic head splits)
        own = {n: t for t, n, c in best[kernel] if c == defaults[kernel]}
        pick = own.get(auto_splits if kernel == "dkdv" else 1, min(own.values()) if own else None)
        default_ms[kernel] = round(pick, 5) if pick is not None else None
    if all(default_ms.values()):
        default_ms["total"] = round(default_ms["dq"] + default_ms["dkdv"], 5)
        entry["speedup_vs_default"] = round(default_ms["total"] / entry["time_ms"]["total"], 3)
    entry["default_time_ms"] = default_ms
    entry["near_best"] = {k: [dict(kernel_config(c).to_dict(), head_splits=n, time_ms=round(t, 5))
                              for t, n, c in best[k][1:] if t <= best[k][0][0] * (1 + NEAR_BEST_PCT / 100)][:5]
                          for k in KERNELS}
    return entry


def static_entry(shape, static: BwdStatic, why: str, env: dict) -> dict:
    """The static #1 of each kernel, ``"measured": false`` (never served at run time)."""
    from rocmflash.tuning.backward import kernel_config

    tops = {k: static.ranked(k) for k in KERNELS}
    best = ({"dkdv": kernel_config(tops["dkdv"][0]["config"]).to_dict(),
             "dq": kernel_config(tops["dq"][0]["config"]).to_dict(), "head_splits": 0}
            if all(tops.values()) else None)
    return {"mode": "bwd", "problem": shape.to_dict(), "measured": False, "why_unmeasured": why, "strategy": "static",
            "best": best, "time_ms": None,
            "counts": {"space": len(static.rows), "survivors": sum(len(v) for v in tops.values()), "timed": 0},
            "fingerprint": env, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _measure(chosen: list, shape, timeout_s: float, interpret: bool, on_result, pool=None) -> list:
    from rocmflash.tuning.isolated import measure_isolated, prewarm_parallel

    tasks = [{"config": c, "shape": shape.to_dict()} for c in chosen]
    if not interpret:
        if pool is not None:
            pool.prewarm_tasks(tasks, prewarm_bwd, timeout_s)
        else:
            prewarm_parallel(tasks, prewarm_bwd, timeout_s)
    # dQ first: each dQ launch also writes delta, which the dK/dV configs read
    tasks.sort(key=lambda t: KERNELS.index(t["config"]["kernel"]))
    return measure_isolated(tasks, measure_bwd, timeout_s, interpret, on_result, pool=pool)


def _auto_splits(shape, block_n: int, interpret: bool, compute_units: int = 0) -> int:
    """The head splits run-time selection gives the default dK/dV config on the tuned device (a cluster's
    driver may have no GPU: then the catalog's CU count of the GPU tuned)."""
    import torch

    from rocmflash.kernels.backward import choose_head_splits
    from rocmflash.kernels.common import num_compute_units

    if interpret:
        units = num_compute_units(None)
    elif torch.cuda.is_available():
        units = num_compute_units(torch.device("cuda"))
    else:
        units = compute_units
    return choose_head_splits(shape.batch, shape.heads_kv, shape.heads_q // shape.heads_kv, shape.seqlen_k, block_n,
                              units)


def tune_backward(spec, console=None, on_result: Optional[Callable[[dict], None]] = None,
                  pool=None) -> BwdTuneResult:
    """Tune the backward of every problem of ``spec`` (a validated :class:`TuneSpec`); see the module doc.

    ``pool`` (a :class:`rocmflash.tuning.pool.WorkerPool` of GPUs of ``spec.gpu``'s kind) times on all of
    its GPUs at once instead of the current device."""
    from rocmflash.db import ConfigDB, default_db_path, environment, tune_lock
    from rocmflash.kernels.backward import default_bwd_config
    from rocmflash.kernels.common import interpreting
    from rocmflash.tuning.run import _no_live_reason, resolve_gpu
    from rocmflash.tuning.spec import NoLiveGPUError, static_problem

    start = time.perf_counter()
    spec.validate()
    gpu, live = resolve_gpu(spec.gpu)
    measuring = pool is not None or (live is not None and live.name == gpu.name)
    why = None if measuring else _no_live_reason(gpu)
    if spec.strategy == "exhaustive" and not measuring:
        raise NoLiveGPUError(f"--strategy exhaustive times every config and needs a live {gpu.name}: {why}")
    interpret = interpreting()
    device_name = None
    if pool is not None:
        device_name = pool.device
    elif measuring:
        import torch

        device_name = torch.cuda.get_device_properties(torch.cuda.current_device()).name
    env = environment(device_name)
    default = default_bwd_config(gpu.arch, spec.head_dim)
    defaults = {"dkdv": space_point("dkdv", default.dkdv), "dq": space_point("dq", default.dq)}
    path = spec.db_path or default_db_path(gpu.name)
    statics, outcomes = {}, []
    lock = tune_lock(path)
    try:
        db = ConfigDB.open(path, gpu.name, gpu.arch, env, gpu.compute_units)
        for seqlen in spec.seqlens:
            t0 = time.perf_counter()
            shape = spec.shape(seqlen)
            sp = dataclasses.replace(static_problem(shape), batch=1)
            if sp not in statics:
                statics[sp] = static_phase(gpu, sp, spec.cache_dir, spec.workers, spec.prune_settings)
            static = statics[sp]
            key = bwd_key(shape.head_dim, shape.dtype, shape.causal, shape.heads_q // shape.heads_kv, shape.seqlen_k)
            results = []
            if measuring:
                chosen = to_time(static, spec.strategy, spec.top_k, defaults)
                if console is not None:
                    console.print(f"backward {key}: timing {len(chosen)} dQ and dK/dV configs on the live GPU")
                results = _measure(chosen, shape, spec.live_settings.timeout_s, interpret, on_result, pool)
                entry = measured_entry(shape, static, results, defaults, spec.strategy, env, interpret,
                                       _auto_splits(shape, default.dkdv.BLOCK_N, interpret, gpu.compute_units))
            else:
                entry = static_entry(shape, static, why, env)
            db.put(key, entry)
            db.save(env if measuring else None)
            outcomes.append(BwdOutcome(key, shape, static, entry, results, time.perf_counter() - t0))
    finally:
        lock.release()
        clear_cache()
        from rocmflash import selection

        selection.clear_cache()
    return BwdTuneResult(gpu, path, measuring, why, outcomes, time.perf_counter() - start)


def print_backward_summary(result: BwdTuneResult, console) -> None:
    for o in result.outcomes:
        e, s = o.entry, o.static
        survivors = {k: len(s.ranked(k)) for k in KERNELS}
        console.print(f"backward {o.key} on {result.gpu.name} ({result.gpu.arch}): {len(s.rows)} configs "
                      f"(dQ {len(s.of('dq'))}, dK/dV {len(s.of('dkdv'))}), {survivors['dq']} dQ and "
                      f"{survivors['dkdv']} dK/dV survive the static phase")
        if result.measured:
            c = e["counts"]
            console.print(f"  {timed_line(c)}")
        if e.get("measured"):
            b, t = e["best"], e["time_ms"]
            gain = (f"; per-arch default {e['default_time_ms']['total']:.3f} ms ({e['speedup_vs_default']:.2f}x)"
                    if e.get("speedup_vs_default") else "")
            console.print(f"  best dQ {_label(b['dq'])} {t['dq']:.3f} ms + dK/dV {_label(b['dkdv'], b['head_splits'])} "
                          f"{t['dkdv']:.3f} ms = {t['total']:.3f} ms{gain}")
            if e.get("timing") == "interpreter":
                console.print("  (timed in Triton's CPU interpreter: recorded, never served at run time)")
        elif result.measured:
            console.print(f"  not measured: {e.get('why_unmeasured')}")
        else:
            console.print(f"  not measured ({result.why_unmeasured}); static #1 of each kernel written with "
                          f"\"measured\": false")
    console.print(f"database: {result.db_path}")


__all__ = ["tune_backward", "print_backward_summary", "BwdTuneResult", "BwdOutcome", "measured_entry",
           "static_entry", "to_time"]
