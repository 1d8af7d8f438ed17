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

from rocmflash.db.lookups.backward import clear_cache
from rocmflash.static.families import timed_line
from rocmflash.tuning.backward import KERNELS


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


def tune_backward(spec, console=None, on_result: Optional[Callable[[dict], None]] = None,
                  pool=None) -> BwdTuneResult:
    """Tune the backward of every problem of ``spec`` (a validated :class:`TuneSpec`); see the module doc.
    Its problems are :class:`~rocmflash.tuning.items_bwd.BackwardItem` s run through the tune pipeline.

    ``pool`` (a :class:`rocmflash.tuning.pool.WorkerPool` of GPUs of ``spec.gpu``'s kind) times on all of
    its GPUs at once instead of the current device."""
    from rocmflash.api import selection
    from rocmflash.db import default_db_path, tune_lock
    from rocmflash.tuning.items import backward_items, open_context, run_items, timing_workers
    from rocmflash.tuning.items_base import current_device_runner
    from rocmflash.tuning.run import _no_live_reason, resolve_gpu
    from rocmflash.tuning.spec import NoLiveGPUError

    start = time.perf_counter()
    spec.validate()
    gpu, live = resolve_gpu(spec.gpu)
    own_runner = pool is None and live is not None and live.name == gpu.name
    measuring = pool is not None or own_runner
    why = None if measuring else _no_live_reason(gpu)
    if spec.strategy == "exhaustive" and not measuring:
        raise NoLiveGPUError(f"--strategy exhaustive times every config and needs a live {gpu.name}: {why}")
    path = spec.db_path or default_db_path(gpu.name)
    runner, items = pool, []
    lock = tune_lock(path)
    try:
        if own_runner:
            runner = current_device_runner(spec.live_settings)
        ctx = open_context(gpu, path, getattr(runner, "device", None), measuring, why, console,
                           prewarmer=runner, runners=getattr(runner, "runners", [runner]) if runner else None)
        items = backward_items(ctx, spec, on_result)
        run_items(items, timing_workers(runner), ctx)
    finally:
        if own_runner and runner is not None:
            runner.close()
        lock.release()
        clear_cache()
        selection.clear_cache()
    return BwdTuneResult(gpu, path, measuring, why, [i.outcome() for i in items], time.perf_counter() - start)


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


__all__ = ["tune_backward", "print_backward_summary", "BwdTuneResult"]
