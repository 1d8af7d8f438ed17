"""Several timing workers used at once: every GPU of a node, or every actor of a cluster.

:class:`WorkerPool` puts a list of runners (one per GPU) behind the runner interface
(:mod:`rocmflash.tuning.runners`), plus ``parallelism`` (how many measurements it takes at
once) and ``call(fn, task, timeout_s)`` for the isolated tasks of the decode and backward
tunes. Strategies submit from several threads; each call waits for a free runner, so no
GPU ever times two configs at once. A runner that is gone (a cluster node that left)
raises :class:`WorkerLost`: the pool drops it and gives its in-flight config to another
runner once, so a lost node costs at most a repeat of what it had in flight. Crashes and
hangs of a config are the runner's business (its isolated worker is replaced) and cost
that config only, as on one GPU.

:func:`node_pool` builds one :class:`rocmflash.tuning.live.LiveRunner` per local GPU, each with
its workers pinned through the platform's visibility variable.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from typing import Callable, Optional


class WorkerLost(RuntimeError):
    """A runner that can take no more work (its node or actor is gone)."""


class NoWorkersLeft(RuntimeError):
    """Every runner of the pool is gone: the tune stops; what is journaled stays, a re-run resumes."""


class DiscardPlan(Exception):
    """Raised by a pipeline's ``gate``: the plan was made for a GPU kind the devices are not (read without torch,
    torch disagreed). Nothing was timed or written; the caller plans again."""


@dataclasses.dataclass
class WorkerStats:
    """What one runner of a pool has done (the progress display reads these)."""

    label: str
    done: int = 0
    failed: int = 0
    busy_s: float = 0.0
    current: str = ""
    lost: bool = False


class WorkerPool:
    """Runners used concurrently, one measurement each at a time (see the module docstring)."""

    live = True

    def __init__(self, runners: list, labels: Optional[list] = None, shared_cache: bool = True,
                 device: Optional[str] = None):
        if not runners:
            raise ValueError("a worker pool needs at least one runner")
        self.runners = list(runners)
        self.stats = [WorkerStats(str(label)) for label in (labels or range(len(runners)))]
        self.shared_cache = shared_cache  #: runners share one Triton cache (one node): pre-warm once
        self._device = device
        self.triton_cache_dir = getattr(runners[0], "triton_cache_dir", None)
        self._free: "queue.Queue[int]" = queue.Queue()
        for i in range(len(self.runners)):
            self._free.put(i)
        self._lock = threading.Lock()
        self._alive = len(self.runners)

    @property
    def device(self) -> Optional[str]:
        """The timing device's name (the first runner's, asked when first needed)."""
        return self._device or getattr(self.runners[0], "device", None)

    @device.setter
    def device(self, value: Optional[str]) -> None:
        self._device = value

    def start(self) -> None:
        """Start every runner's timing worker and the pre-warm pool now (non-blocking; a runner without these
        starts them at its first use): their processes import torch and open the device while the caller plans."""
        prewarmers = self.runners[:1] if self.shared_cache else self.runners
        for runner in self.runners:
            for name in ("start_worker",) + (("start_prewarm",) if runner in prewarmers else ()):
                start = getattr(runner, name, None)
                if callable(start):
                    try:
                        start()
                    except Exception:  # noqa: BLE001 - an optimisation: the pipeline starts them again
                        pass

    @property
    def parallelism(self) -> int:
        return max(1, self._alive)

    def _acquire(self) -> int:
        while True:
            with self._lock:
                if self._alive == 0:
                    raise NoWorkersLeft("every timing worker of the pool is gone")
            try:
                return self._free.get(timeout=0.5)
            except queue.Empty:
                continue

    def _run(self, what: str, label: str, fn: Callable[[object], dict]) -> dict:
        """``fn(runner)`` on a free runner; a lost runner is dropped and the work retried once elsewhere."""
        lost_on = []
        while True:
            i = self._acquire()
            stats = self.stats[i]
            stats.current, start = label, time.perf_counter()
            try:
                result = fn(self.runners[i])
            except WorkerLost as err:
                with self._lock:
                    stats.lost, stats.current = True, ""
                    self._alive -= 1
                lost_on.append(f"{stats.label}: {err}")
                if len(lost_on) > 1:  # two workers gone under one config: it is the config's doing
                    return {"status": "crashed", "error": "timing worker lost twice: " + "; ".join(lost_on),
                            "worker": stats.label}
                continue  # another worker takes it (none left: NoWorkersLeft, nothing recorded)
            except Exception as err:  # a runner bug must not take its GPU out of the pool
                result = {"status": "crashed", "error": f"{type(err).__name__}: {err}"}
            stats.busy_s += time.perf_counter() - start
            stats.current = ""
            stats.done += 1
            stats.failed += result.get("status") != "ok"
            self._free.put(i)
            result = dict(result)
            result["worker"] = stats.label
            if lost_on:
                result["retried_after"] = lost_on[0]
            return result

    def measure(self, cfg, shape, inject: Optional[str] = None, budget: Optional[dict] = None) -> dict:
        """A runner's ``measure`` on the first free runner."""
        kwargs = {"budget": budget} if budget else {}
        return self._run("measure", _short(cfg), lambda r: r.measure(cfg, shape, inject=inject, **kwargs))

    def call(self, fn: Callable, task: dict, timeout_s: float) -> dict:
        """``fn(task)`` in the isolated worker of the first free runner (decode and backward tasks)."""
        return self._run("call", _short(task.get("config")), lambda r: r.call(fn, task, timeout_s))

    def prewarm(self, configs, shape) -> dict:
        """Build the configs' binaries: once when the runners share a Triton cache, else on every runner."""
        targets = self.runners[:1] if self.shared_cache else [r for r, s in zip(self.runners, self.stats)
                                                               if not s.lost]
        errors: dict = {}
        threads = [threading.Thread(target=lambda r=r: errors.update(r.prewarm(configs, shape) or {}))
                   for r in targets if hasattr(r, "prewarm")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors

    def prewarm_tasks(self, tasks: list, fn: Callable, timeout_s: float) -> None:
        """Run ``fn(task)`` for every task to fill the Triton cache(s) (decode and backward)."""
        targets = self.runners[:1] if self.shared_cache else self.runners
        for r in targets:
            if hasattr(r, "prewarm_tasks"):
                r.prewarm_tasks(tasks, fn, timeout_s)

    def close(self) -> None:
        """Close every runner, all at once: each stops and joins its worker processes (seconds with a device
        context each), which the user would otherwise wait for one runner after another at the end of a tune."""
        threads = [threading.Thread(target=_close_quietly, args=(r,), daemon=True, name="rocmflash-close")
                   for r in self.runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _close_quietly(runner) -> None:
    try:
        runner.close()
    except Exception:  # pragma: no cover - closing a lost worker
        pass


def _short(cfg) -> str:
    if cfg is None:
        return ""
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    parts = [str(d.get("variant") or d.get("kernel") or "")]
    if "BLOCK_M" in d:
        parts.append(f"{d['BLOCK_M']}x{d['BLOCK_N']}")
    elif "BLOCK_N" in d:
        parts.append(f"n{d['BLOCK_N']}")
    if "num_warps" in d:
        parts.append(f"w{d['num_warps']}")
    return " ".join(p for p in parts if p)


# ---------------------------------------------------------------------- devices of this node
def parse_gpus(text: str, device_count: int) -> list:
    """``"all"`` or ``"0,1,3"`` -> device indices (this process's numbering); a clear error otherwise."""
    value = str(text).strip().lower()
    if device_count < 1:
        raise ValueError(f"--gpus {text}: no GPU is visible to this process")
    if value == "all":
        return list(range(device_count))
    indices = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--gpus {text!r} is invalid; expected all or device indices like 0,1,2")
        index = int(part)
        if index >= device_count:
            raise ValueError(f"--gpus {text}: device {index} does not exist; this process sees {device_count} "
                             f"GPU(s), 0..{device_count - 1}")
        if index in indices:
            raise ValueError(f"--gpus {text}: device {index} is named twice (two workers on one GPU would "
                             "disturb each other's timings)")
        indices.append(index)
    return indices


def node_gpu(indices: list, identify: Optional[Callable] = None):
    """The catalog GPU all ``indices`` are; refuses a mix of kinds (the database is per GPU)."""
    from rocmflash.hw.detect import identify_live_device

    identify = identify or identify_live_device
    kinds = {}
    for i in indices:
        match = identify(i)
        name = match.gpu.name if match is not None and match.gpu is not None else None
        if name is None:
            raise ValueError(f"GPU {i} is not in rocmflash's catalog: "
                             f"{match.describe() if match is not None else 'no device'}")
        kinds.setdefault(name, []).append(i)
    if len(kinds) > 1:
        mix = "; ".join(f"{name} on {', '.join(map(str, idx))}" for name, idx in kinds.items())
        raise ValueError(f"--gpus mixes GPU kinds ({mix}); a config database is per GPU kind: tune each kind "
                         "in its own run with --gpus naming only its devices")
    from rocmflash.hw.gpus import get_gpu

    return get_gpu(next(iter(kinds)))


def node_pool(indices: list, settings, triton_cache_dir: Optional[str], prewarm_workers: Optional[int] = None,
              rocm: Optional[bool] = None):
    """One :class:`~rocmflash.tuning.live.LiveRunner` per device index, sharing one Triton cache (``rocm``: made
    before torch is imported, :func:`early_node_pool`)."""
    from rocmflash.tuning.live import LiveRunner

    runners = [LiveRunner(settings, triton_cache_dir=triton_cache_dir, prewarm_workers=prewarm_workers,
                          device_index=i, rocm=rocm) for i in indices]
    return WorkerPool(runners, labels=[f"gpu{i}" for i in indices], shared_cache=True)


_VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


def gpus_without_torch(environ=None, dev_dir: str = "/dev",
                       kfd_nodes: str = "/sys/class/kfd/kfd/topology/nodes") -> Optional[tuple]:
    """``(device count, rocm)`` of this node read without importing torch (its import takes seconds the timing
    workers can use to start): the NVIDIA device files (``nvidiaN``) or the AMD KFD nodes with a GPU; None when
    a ``*_VISIBLE_DEVICES`` variable narrows the devices, both kinds or none are present (torch decides)."""
    import glob
    import re

    env = os.environ if environ is None else environ
    if any(var in env for var in _VISIBLE_VARS):
        return None
    nvidia = [p for p in glob.glob(os.path.join(dev_dir, "nvidia*"))
              if re.fullmatch(r"nvidia\d+", os.path.basename(p))]
    amd = 0
    for path in glob.glob(os.path.join(kfd_nodes, "*", "gpu_id")):
        try:
            with open(path, encoding="ascii") as f:
                amd += int(f.read().strip() or 0) != 0
        except (OSError, ValueError):
            return None
    if bool(nvidia) == bool(amd):
        return None
    return (len(nvidia), False) if nvidia else (amd, True)


def early_node_pool(gpus: str, settings, triton_cache_dir: Optional[str], prewarm_workers: Optional[int] = None,
                    probe: Optional[Callable] = None) -> Optional["WorkerPool"]:
    """A started :func:`node_pool` for ``--gpus gpus`` made before torch is imported (its workers import torch,
    open their devices and start the pre-warm pool while this process imports torch and plans), or None where
    the devices cannot be told without torch. The caller checks it with :func:`early_pool_matches` once torch
    is imported, and closes it when it does not match."""
    found = (probe or gpus_without_torch)()
    if found is None:
        return None
    count, rocm = found
    try:
        indices = parse_gpus(gpus, count)
    except ValueError:
        return None  # torch's count decides, and gives the error
    pool = node_pool(indices, settings, triton_cache_dir, prewarm_workers, rocm=rocm)
    pool.early = (indices, rocm)
    pool.start()
    return pool


def early_pool_matches(pool, indices: list, rocm: bool) -> bool:
    """Whether :func:`early_node_pool`'s guess is what torch says: the same device indices and the same build."""
    return pool is not None and getattr(pool, "early", None) == (list(indices), bool(rocm))


__all__ = ["WorkerPool", "WorkerStats", "WorkerLost", "NoWorkersLeft", "DiscardPlan", "parse_gpus", "node_gpu",
           "node_pool", "gpus_without_torch", "early_node_pool", "early_pool_matches"]
