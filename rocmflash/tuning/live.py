"""Live runner: gate and time one config at a time in an isolated worker process that owns the GPU.

Isolation. Every candidate runs in a worker subprocess (``spawn``, via :mod:`pebble`)
with a timeout. A segfault or abort kills only that worker (``crashed``), a hang is
killed at the timeout (``timeout``), a Triton compile error or out-of-resources is a
``failed`` result, and a sticky device error (an illegal memory access leaves the
CUDA/HIP context unusable) is reported as ``crashed`` and the worker is replaced before
the next candidate. One config is lost, never the tune.

Numeric gate (before any timing): :mod:`rocmflash.tuning.live_gate` -- every config's output checked
against an fp32 reference of the tuned shape; a config that fails is ``incorrect`` and is never timed.

Timing. Rotating input sets (``n_inputs`` of them, each a full ``q, k, v, out``) so no
run finds its inputs in cache; the caches are flushed before every timed run by zeroing a
buffer twice the larger of the GPU's L2 and last-level cache (:func:`rocmflash.hw.gpus.flush_bytes`:
512 MiB on an MI300X, whose Infinity Cache is 256 MiB); warm-up first (which also absorbs
Triton's JIT); then ``n`` runs timed with device events (``n`` from ``rep_ms`` over a first
estimate, clamped to ``[min_reps, max_reps]``), median reported, raw times kept. This is what
``triton.testing.do_bench(..., return_mode="median")`` does, plus the input rotation.
TFLOP/s = 4·B·H·S²·D / t (half for causal). Vendor-neutral: ``torch.cuda`` is HIP on ROCm.

Pre-warm. Triton compiles a kernel at its first launch (seconds each) and caches it on
disk. :meth:`LiveRunner.prewarm` launches every candidate once, at a tiny shape with the
same argument specialisation (each tensor on the timed tensor's side of the 2 GiB line:
:func:`prewarm_specs`), in parallel processes sharing the timing worker's Triton
cache directory, so the serial timing loop finds every kernel compiled.

Device. A runner times on one device (``device_index``, default 0, in this process's
numbering). Its workers are pinned to it through their environment
(:func:`rocmflash.hw.platform.visible_devices_env`: ``HIP_VISIBLE_DEVICES`` on ROCm,
``CUDA_VISIBLE_DEVICES`` on CUDA), so inside a worker it is device 0; every result
reports the worker's visibility variables (``device_env``).

Interpreter mode (CPU CI). When the parent has ``TRITON_INTERPRET=1`` set, the workers
run the kernels in Triton's interpreter instead of dropping the variable: inputs on the
CPU, the same numeric gate at the same shape, then timing of a tiny shape
(:func:`interpreted_shape`) with ``time.perf_counter`` (no events, no L2 flush; the
times measure the interpreter, never a GPU, and the result says ``"interpreted": true``).
Pre-warm then cross-compiles every candidate for Triton's active target (the live GPU's
arch, as a real launch would compile) into the runner's Triton cache, so what the
runner would build -- arch, AMD options -- can be read with :mod:`isa_tools`.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Optional

from rocmflash.config import KernelConfig
from rocmflash.hw.roofline import Shape
from rocmflash.tuning.live_gate import interpreting as _interpreting
from rocmflash.tuning.live_worker import (
    LiveSettings,
    _ready,
    measure,
    prewarm_one,
    worker_env,
    worker_init,
)


# ====================================================================== parent side
def _device_name(index: int = 0) -> Optional[str]:
    try:
        import torch

        return torch.cuda.get_device_properties(index).name if torch.cuda.is_available() else None
    except Exception:  # pragma: no cover
        return None


#: a device name not asked of torch yet
_UNKNOWN = object()


def _pool_broken(err: BaseException) -> bool:
    """Whether a pool error means its worker process died (pebble's "All workers expired" after a SIGKILL
    of the worker reaches the caller as BrokenProcessPool, not ProcessExpired)."""
    from concurrent.futures.process import BrokenProcessPool

    return isinstance(err, BrokenProcessPool)


class LiveRunner:
    """Times configs on the live GPU, one at a time, each in an isolated worker process.

    ``device_index`` is the device to time on, in this process's numbering; the workers
    are pinned to it (see the module docstring). Whether kernels run in Triton's
    interpreter is decided here, from ``TRITON_INTERPRET``, and passed to the workers.
    """

    live = True

    def __init__(self, settings: LiveSettings = LiveSettings(), triton_cache_dir: Optional[str] = None,
                 prewarm_workers: Optional[int] = None, device_index: int = 0, rocm: Optional[bool] = None):
        self.settings = settings
        self.triton_cache_dir = triton_cache_dir
        self.prewarm_workers = prewarm_workers
        self.device_index = device_index
        self.rocm = rocm  #: None: torch says (imports it); a bool: a runner made before torch was imported
        self.worker_env = worker_env(device_index, rocm=rocm)
        self.interpret = _interpreting()
        self._pool = None
        #: the pre-warm workers of every family (forward configs, backward/decode/varlen tasks), kept for the
        #: runner's life: one pool, started once, that concurrent static phases share
        self._task_prewarm = None
        # a pre-warm (compile-pool thread) and a measurement (timing thread) may both start the timing pool,
        # and two static phases (compile slots) the pre-warm pool
        self._pool_lock = threading.Lock()
        self.restarts = 0
        self._device = _UNKNOWN if rocm is not None else _device_name(device_index)
        self._worker_started = False
        self._report = None  #: the future of the timing worker's device report (:meth:`reported_device`)
        self._record = _UNKNOWN  #: the builds already pre-warmed in this cache (:mod:`.prewarm_record`), on first use
        self._closing: list = []  #: threads closing pre-warm pools released early (:meth:`release_prewarm`)

    @property
    def device(self) -> Optional[str]:
        """The device's name (asked of torch on first use by a runner made before torch was imported)."""
        if self._device is _UNKNOWN:
            self._device = _device_name(self.device_index)
        return self._device

    @device.setter
    def device(self, name: Optional[str]) -> None:
        """A name known without torch (the driver's, for a plan made before torch was imported): this process then
        never opens the device to ask it. The plan's confirmation checks it against the worker's report."""
        self._device = name

    def reported_device(self, timeout_s: Optional[float] = None) -> Optional[dict]:
        """The timing worker's report of its device (:func:`~rocmflash.tuning.isolated.report_device`, its first
        task once :meth:`start_worker` ran), waiting up to ``timeout_s``; None when it has none or failed."""
        future = self._report
        if future is None:
            return None
        try:
            return future.result(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - no report: the caller asks torch itself
            return None

    # -------------------------------------------------------------- pool management
    def _get_pool(self):
        with self._pool_lock:
            return self._timing_pool()

    def _timing_pool(self):
        if self._pool is None:
            import pebble

            self._pool = pebble.ProcessPool(max_workers=1, context=multiprocessing.get_context("spawn"),
                                            initializer=worker_init,
                                            initargs=(self.triton_cache_dir, self.worker_env, self.interpret))
        return self._pool

    def _restart(self) -> None:
        self.restarts += 1
        self._close_timing_pool()

    def _prewarm_workers(self):
        """The runner's one kept pre-warm pool (:class:`~rocmflash.tuning.isolated.TaskPrewarmPool`)."""
        from rocmflash.tuning.isolated import TaskPrewarmPool

        with self._pool_lock:
            if self._task_prewarm is None:
                self._task_prewarm = TaskPrewarmPool(self.triton_cache_dir, self.worker_env, self.prewarm_workers)
            return self._task_prewarm

    def start_worker(self) -> None:
        """Start the timing worker now (non-blocking): its process imports torch, opens the device and imports the
        families' modules (:func:`~rocmflash.tuning.isolated.warm_up`) while the static phases run, instead of
        inside the first measurement. The tune pipeline calls it on every runner when it starts."""
        from rocmflash.tuning.isolated import report_device, warm_up

        with self._pool_lock:
            if self._worker_started:  # started early (the CLI, before the plan): once is enough
                return
            self._worker_started = True
        from rocmflash.tuning.output import trace_mark

        pool = self._get_pool()
        # a runner made before torch was imported (an early pool) learns its device from its worker: the tune
        # process then never opens one (:class:`~rocmflash.tuning.pool_confirm.TorchConfirmation`)
        self._report = pool.schedule(report_device) if self.rocm is not None else None
        future = pool.schedule(warm_up)
        if hasattr(future, "add_done_callback"):  # a trace mark when the worker is up (a stand-in pool may give none)
            future.add_done_callback(lambda _future: trace_mark(f"timing_worker{self.device_index}_ready"))

    def start_prewarm(self) -> None:
        """Start the kept pre-warm pool's processes now (non-blocking; :meth:`TuneContext.start_prewarm
        <rocmflash.tuning.items_base.TuneContext.start_prewarm>`) -- unless this Triton cache was pre-warmed before
        (:func:`~rocmflash.tuning.prewarm_record.has_markers`): a re-tune finds its builds there, and the processes
        start at the first build that is not (their start-up would only slow the tune's own start)."""
        from rocmflash.tuning.prewarm_record import has_markers

        if self.interpret or not has_markers(self.triton_cache_dir):
            self._prewarm_workers().start()

    def release_prewarm(self) -> None:
        """Close the pre-warm pool in the background (every static phase is done): its processes' device contexts
        are torn down while the timing goes on, not at :meth:`close`. A later pre-warm starts a new pool."""
        with self._pool_lock:
            pool, self._task_prewarm = self._task_prewarm, None
        if pool is not None:
            t = threading.Thread(target=pool.close, daemon=True, name="rocmflash-prewarm-close")
            t.start()
            self._closing.append(t)

    def _prewarm_record(self):
        if self._record is _UNKNOWN:
            from rocmflash.tuning.prewarm_record import open_record

            self._record = None if self.interpret else open_record(self.triton_cache_dir, self.device)
        return self._record

    def close(self) -> None:
        """Stop the timing worker and the pre-warm pool, both at once (each join waits for processes to exit)."""
        prewarm = None
        if self._task_prewarm is not None:
            prewarm = threading.Thread(target=self._task_prewarm.close, daemon=True, name="rocmflash-close")
            prewarm.start()
        self._close_timing_pool()
        if prewarm is not None:
            prewarm.join()
        for t in self._closing:
            t.join()
        self._closing = []

    def _close_timing_pool(self) -> None:
        self._worker_started = False
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.stop()
            pool.join(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -------------------------------------------------------------- work
    def prewarm(self, configs: list[KernelConfig], shape: Shape) -> dict:
        """Compile every config in parallel (one GPU launch each at a tiny shape, or a cross-compile for
        the active target under the interpreter); ``{config json: error or None}``."""
        if not configs:
            return {}
        shape_dict = shape.to_dict()
        record, todo = self._unmarked("fwd", [[cfg.to_dict(), shape_dict] for cfg in configs])
        keys = [cfg.to_json() for cfg in configs]
        errors = {key: None for key in keys}  # a marked build is in the cache already
        if not todo:
            return errors
        pool = self._prewarm_workers()  # kept for the runner's life: workers start (import torch) once
        # the timing worker starts (imports torch, creates its device context: seconds) while the configs compile
        self._get_pool().schedule(_ready)
        futures = {keys[i]: pool.schedule(prewarm_one, {"config": configs[i].to_dict(), "shape": shape_dict,
                                                        "cross_compile": self.interpret}, self.settings.timeout_s)
                   for i, _ in todo}
        for key, future in futures.items():
            try:
                errors[key] = future.result()
            except FutureTimeout:
                errors[key] = f"pre-warm timed out after {self.settings.timeout_s:g} s"
            except Exception as err:  # a crashed pre-warm worker: the timing worker will meet it too
                errors[key] = f"pre-warm worker died: {type(err).__name__}"
        if record is not None:
            record.add(d for i, d in todo if errors[keys[i]] is None)
        return errors

    def _unmarked(self, family: str, builds: list) -> tuple:
        """``(the pre-warm record or None, [(index, marker)] of the builds to pre-warm)``: every build without a
        record (no live device, the interpreter), else those whose marker (:mod:`.prewarm_record`) is missing."""
        record = self._prewarm_record()
        if record is None:
            return None, [(i, None) for i in range(len(builds))]
        marks = ((i, record.digest(family, what)) for i, what in enumerate(builds))
        return record, [(i, d) for i, d in marks if not record.has(d)]

    def call(self, fn, task: dict, timeout_s: float) -> dict:
        """``fn(task)`` in this runner's isolated worker (the decode and backward tunes' tasks): a hang or a
        crash is a ``timeout`` / ``crashed`` result and the worker is replaced."""
        from pebble import ProcessExpired

        start = time.perf_counter()
        try:
            result = self._get_pool().schedule(fn, args=(task,), timeout=timeout_s).result()
        except FutureTimeout:
            result = {"config": task.get("config"), "status": "timeout", "error": f"no result after {timeout_s:g} s"}
        except ProcessExpired as err:
            result = {"config": task.get("config"), "status": "crashed", "worker_died": True,
                      "error": f"worker died (exit code {err.exitcode})"}
        except Exception as err:
            result = {"config": task.get("config"), "status": "crashed",
                      "error": f"worker pool failed: {type(err).__name__}: {err}"}
            if _pool_broken(err):
                result["worker_died"] = True
        if result.get("status") in ("timeout", "crashed"):
            self._restart()
        result.setdefault("wall_s", round(time.perf_counter() - start, 3))
        return result

    def prewarm_tasks(self, tasks: list, fn, timeout_s: float) -> None:
        """``fn(task)`` for every task in parallel processes sharing this runner's Triton cache (the kept pool:
        each problem's pre-warm reuses its processes)."""
        record, todo = self._unmarked(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}",
                                      tasks)
        if todo or record is None:  # without a record the pool is asked even for no tasks (it starts it)
            results = self._prewarm_workers().run([tasks[i] for i, _ in todo], fn, timeout_s)
            if record is not None:
                record.add(d for (_, d), r in zip(todo, results) if r is None)

    def measure(self, cfg: KernelConfig, shape: Shape, inject: Optional[str] = None,
                budget: Optional[dict] = None) -> dict:
        """Gate and time one config in the worker; always returns a result dict with a status.

        ``budget`` (a race round's): ``rep_ms``, ``warmup_ms``, ``min_reps`` override the
        settings for this measurement, ``gate=False`` skips the correctness gate.
        """
        from pebble import ProcessExpired

        settings, gate = self.settings, True
        if budget:
            gate = bool(budget.get("gate", True))
            settings = dataclasses.replace(settings, **{k: v for k, v in budget.items()
                                                        if k in ("rep_ms", "warmup_ms", "min_reps")})
        task = {"config": cfg.to_dict(), "shape": shape.to_dict(), "settings": settings.to_dict(),
                "inject": inject, "gate": gate}
        start = time.perf_counter()
        future = self._get_pool().schedule(measure, args=(task,), timeout=self.settings.timeout_s)
        try:
            result = future.result()
        except FutureTimeout:
            result = {"status": "timeout",
                      "error": f"no result after {self.settings.timeout_s:g} s: worker killed and replaced"}
        except ProcessExpired as err:
            result = {"status": "crashed", "worker_died": True,  # the pipeline retries it once
                      "error": f"worker died (exit code {err.exitcode}): replaced, tune goes on"}
        except Exception as err:  # a broken pool: start a fresh one
            result = {"status": "crashed", "error": f"worker pool failed: {type(err).__name__}: {err}", "fatal": True}
            if _pool_broken(err):  # its process was killed under it (a SIGKILL): the pipeline retries it once
                result["worker_died"] = True
        result["wall_s"] = round(time.perf_counter() - start, 3)
        if result.pop("fatal", False):
            self._restart()
        return result
