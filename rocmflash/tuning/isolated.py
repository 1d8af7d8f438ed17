"""Timing tasks in isolated worker processes, for the tunes that time every survivor (decode, backward).

:class:`TaskPrewarmPool` builds every survivor's binaries first, in parallel processes kept for the
whole tune (Triton's disk cache), so the timing pays no JIT compile per config.
:func:`measure_isolated` then runs one task at a time in a single worker pinned to the
current device: a crash or a hang costs that task only (the worker is replaced), and the
result says which (``status`` "timeout" or "crashed").

Tasks are dicts holding at least ``"config"``; ``fn`` is a module-level function (it is
pickled into a spawned process) returning a result dict with ``"config"`` and ``"status"``.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Optional

# the timers live in rocmflash.measure (re-exported: their users imported them from here)
from rocmflash.measure import back_to_back_ms, capture_graph, graph_replay_ms, time_flushed  # noqa: F401


def _device_env() -> dict:
    import torch

    from rocmflash.tuning.live_worker import worker_env

    return worker_env(torch.cuda.current_device()) if torch.cuda.is_available() else {}


#: the most pre-warm workers a runner keeps by default. Each holds torch and a device context, and all of them start
#: with the tune, beside the compile pool and the timing workers; most pre-warms find the static phase's build in
#: Triton's cache and only launch it, and a static phase's stream pre-warms at most
#: :data:`rocmflash.tuning.stream.PREWARM_THREADS` at once
MAX_PREWARM_WORKERS = 16


def prewarm_pool_size(max_workers: Optional[int] = None) -> int:
    """Pre-warm workers of a runner: ``max_workers`` (``--workers``) or every core but one, at most
    :data:`MAX_PREWARM_WORKERS`."""
    return max(1, max_workers or min(MAX_PREWARM_WORKERS, (os.cpu_count() or 2) - 1))


class TaskPrewarmPool:
    """A pool of spawned build workers kept for a whole tune: every pre-warm of the tune (the forward's
    configs, each backward, decode and varlen problem's tasks) reuses the same processes instead of starting
    (and importing torch in) new ones per problem. Static phases running at once (compile slots) share it:
    their builds queue on its workers. ``close()`` stops them."""

    def __init__(self, triton_cache_dir: Optional[str], env: dict, max_workers: Optional[int] = None):
        self.triton_cache_dir, self.env = triton_cache_dir, env
        self.max_workers = prewarm_pool_size(max_workers)
        self._pool = None
        self._lock = threading.Lock()  # two compile-pool threads may start it at once

    def _started(self):
        import pebble

        from rocmflash.tuning.live_worker import prewarm_init

        with self._lock:
            if self._pool is None:
                self._pool = pebble.ProcessPool(max_workers=self.max_workers,
                                                context=multiprocessing.get_context("spawn"), initializer=prewarm_init,
                                                initargs=(self.triton_cache_dir, self.env))
            return self._pool

    def start(self) -> None:
        """Start every worker now (non-blocking): each imports torch and opens the device while the caller goes on."""
        from rocmflash.tuning.output import trace_mark

        pool = self._started()
        ready = []

        def started(_future) -> None:  # trace marks: when the first and the last worker could take a build
            ready.append(1)
            if len(ready) in (1, self.max_workers):
                trace_mark(f"prewarm_{'first' if len(ready) == 1 else 'all'}_ready")
        for _ in range(self.max_workers):
            future = pool.schedule(_started_worker)
            if hasattr(future, "add_done_callback"):
                future.add_done_callback(started)

    def schedule(self, fn: Callable, task: dict, timeout_s: float):
        """``fn(task)`` on a kept worker; its future."""
        return self._started().schedule(fn, args=(task,), timeout=timeout_s)

    def run(self, tasks: list, fn: Callable, timeout_s: float) -> list:
        """``fn(task)`` for every task in the kept workers: each task's result (a pre-warm's: None, or its error
        line), or a line saying why there is none where it raised, hung or its worker died (the task fails again,
        isolated, when timed)."""
        if not tasks:
            return []
        results = []
        for future in [self.schedule(fn, task, timeout_s) for task in tasks]:
            try:
                results.append(future.result())
            except Exception as err:  # a crash or hang here shows again in the timing worker
                results.append(f"pre-warm failed: {type(err).__name__}")
        return results

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
            pool.join(timeout=30)


def _started_worker() -> bool:
    """A no-op task: scheduling it makes the pool start a worker (its initializer) ahead of the first build."""
    return True


#: what a timing worker's first task imports, so that no family's first measurement pays it
WARM_MODULES = ("rocmflash.tuning.live_worker", "rocmflash.tuning.live_gate", "rocmflash.tuning.backward",
                "rocmflash.tuning.decode", "rocmflash.tuning.incumbent_worker", "rocmflash.kernels.backward.host",
                "rocmflash.kernels.decode.host")


def report_device() -> Optional[dict]:
    """A timing worker's report of its device (:func:`rocmflash.hw.detect.torch_device_report` of the one device
    it is pinned to, plus ``rocm``: a HIP build of torch), or None without one. Its first task: the tune process
    learns what its GPUs are from the workers, which open their devices anyway, instead of initialising CUDA/HIP
    itself (:class:`rocmflash.tuning.pool_confirm.TorchConfirmation`)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from rocmflash.hw.detect import torch_device_report

    report = torch_device_report(torch.cuda.current_device())
    report["rocm"] = bool(getattr(torch.version, "hip", None))
    return report


def warm_up() -> bool:
    """A timing worker's first task, scheduled when the tune starts (:meth:`rocmflash.tuning.live.LiveRunner.
    start_worker`): the worker process starts (its initializer imports torch and opens the device), imports
    the modules every family's measurement needs and uses the device once as a measurement would
    (:func:`rocmflash.tuning.worker_warm.warm_device`), while the static phases run."""
    import importlib

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the measurement that needs it reports the error
            pass
    try:
        from rocmflash.tuning.worker_warm import warm_device

        warm_device()
    except Exception:  # noqa: BLE001 - best effort, as each of its steps
        pass
    return True


def measure_isolated(tasks: list, fn: Callable, timeout_s: float, interpret: bool,
                     on_result: Optional[Callable[[dict], None]] = None, pool=None) -> list:
    """``[fn(task), ...]`` in order, each in one worker pinned to the current device; a timed-out or
    crashed task gets a result with that status and the worker is replaced.

    With ``pool`` (a :class:`rocmflash.tuning.pool.WorkerPool`: several GPUs), the tasks run on all of
    its workers at once; results keep the task order, ``on_result`` sees them as they arrive.
    """
    if pool is not None:
        return _measure_on_pool(tasks, fn, timeout_s, on_result, pool)
    import pebble
    from pebble import ProcessExpired

    from rocmflash.tuning.live_worker import worker_init

    env = _device_env()
    results, pool = [], None
    try:
        for task in tasks:
            if pool is None:
                pool = pebble.ProcessPool(max_workers=1, context=multiprocessing.get_context("spawn"),
                                          initializer=worker_init, initargs=(None, env, interpret))
            future = pool.schedule(fn, args=(task,), timeout=timeout_s)
            try:
                result = future.result()
            except FutureTimeout:
                result = {"config": task["config"], "status": "timeout", "error": f"no result after {timeout_s:g} s"}
            except ProcessExpired as err:
                result = {"config": task["config"], "status": "crashed",
                          "error": f"worker died (exit code {err.exitcode})"}
            if result["status"] in ("timeout", "crashed"):
                pool.stop()
                pool.join(timeout=30)
                pool = None
            results.append(result)
            if on_result:
                on_result(result)
    finally:
        if pool is not None:
            pool.stop()
            pool.join(timeout=30)
    return results


def _measure_on_pool(tasks: list, fn: Callable, timeout_s: float, on_result, pool) -> list:
    from concurrent.futures import ThreadPoolExecutor, as_completed

    results: list = [None] * len(tasks)
    with ThreadPoolExecutor(max_workers=pool.parallelism) as threads:
        futures = {threads.submit(pool.call, fn, task, timeout_s): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            result = future.result()
            result.setdefault("config", tasks[futures[future]]["config"])
            results[futures[future]] = result
            if on_result:
                on_result(result)
    return results


__all__ = ["TaskPrewarmPool", "prewarm_pool_size", "warm_up", "measure_isolated", "time_flushed",
           "back_to_back_ms", "capture_graph", "graph_replay_ms"]
