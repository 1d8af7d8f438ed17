"""Timing on a Ray cluster: one actor per GPU, results merged by the one process that writes (the driver).

``rocmflash tune ... --cluster ray://HOST:PORT`` (or ``auto``: the cluster this machine
belongs to; ``local``: start a Ray instance on this machine) needs the optional extra
``pip install rocmflash[ray]``. Each actor holds one :class:`rocmflash.tuning.live.LiveRunner`
on the GPU Ray assigns it (``num_gpus=1``: Ray sets the device visibility variable, and
the runner's isolated worker inherits it), so a config that crashes or hangs costs that
config only, exactly as on one GPU. The driver runs the static phase (CPU), keeps the
journal and the database, and hands configs to the actors through a
:class:`~rocmflash.tuning.pool.WorkerPool`: an actor whose node leaves raises
:class:`~rocmflash.tuning.pool.WorkerLost`, and its in-flight config goes to another actor.

Ray is the engine (as in kernel_tuner); nothing here speaks a protocol of its own.
"""

from __future__ import annotations

import os
from typing import Optional

from rocmflash.tuning.pool import WorkerLost, WorkerPool


class ClusterError(ValueError):
    """A ``--cluster`` that cannot be used (Ray missing, unreachable, no GPUs, mixed GPU kinds)."""


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError("--cluster needs Ray: pip install 'rocmflash[ray]'") from None
    return ray


class TimingActor:
    """What runs inside each Ray actor: a runner bound to the actor's GPU (or a replayed journal)."""

    def __init__(self, settings: Optional[dict] = None, replay: Optional[str] = None, cache_dir: Optional[str] = None,
                 fail_after: Optional[int] = None):
        from rocmflash.tuning.live_worker import LiveSettings

        self.calls = 0
        self.fail_after = fail_after  #: test hook: the actor's process exits at this call (a node leaving)
        if replay:
            from rocmflash.tuning.runners import ReplayRunner

            self.runner = ReplayRunner.from_journal(replay)
        else:
            from rocmflash.static.compile import triton_cache_dir
            from rocmflash.tuning.live import LiveRunner

            self.runner = LiveRunner(LiveSettings(**(settings or {})), triton_cache_dir=triton_cache_dir(cache_dir),
                                     device_index=0)

    def _tick(self) -> None:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            os._exit(1)

    def describe(self) -> dict:
        """``{"host", "pid", "device", "gpu", "visible", "device_ids"}``: where this actor runs and on what.

        ``visible``: the device visibility variables Ray (or the user) set here; ``device_ids``:
        the node's ids of the devices they leave this actor (:func:`rocmflash.hw.platform.visible_device_ids`:
        Ray pins an actor with ``CUDA_VISIBLE_DEVICES`` on NVIDIA, ``HIP_VISIBLE_DEVICES`` or, in older
        releases, ``ROCR_VISIBLE_DEVICES`` on AMD), None when nothing narrows them.
        """
        import socket

        from rocmflash.hw.detect import identify_live_device
        from rocmflash.hw.platform import VISIBILITY_VARS, is_rocm, visible_device_ids

        match = None if self.runner.device == "replay" else identify_live_device(0)
        gpu = match.gpu.name if match is not None and match.gpu is not None else None
        visible = {k: os.environ[k] for k in VISIBILITY_VARS if k in os.environ}
        return {"host": socket.gethostname(), "pid": os.getpid(), "device": self.runner.device, "gpu": gpu,
                "visible": visible, "device_ids": visible_device_ids(os.environ, is_rocm())}

    def measure(self, config: dict, shape: dict, inject=None, budget=None) -> dict:
        from rocmflash.config import KernelConfig
        from rocmflash.hw.roofline import Shape

        self._tick()
        kwargs = {"budget": budget} if budget else {}
        return self.runner.measure(KernelConfig.from_dict(config), Shape.from_dict(shape), inject=inject, **kwargs)

    def call(self, fn, task: dict, timeout_s: float) -> dict:
        self._tick()
        return self.runner.call(fn, task, timeout_s)

    def prewarm(self, configs: list, shape: dict) -> dict:
        from rocmflash.config import KernelConfig
        from rocmflash.hw.roofline import Shape

        return self.runner.prewarm([KernelConfig.from_dict(c) for c in configs], Shape.from_dict(shape))

    def prewarm_tasks(self, tasks: list, fn, timeout_s: float) -> None:
        if hasattr(self.runner, "prewarm_tasks"):
            self.runner.prewarm_tasks(tasks, fn, timeout_s)

    def close(self) -> None:
        self.runner.close()


class RayRunner:
    """The driver's handle on one actor, with the runner interface; a dead actor is :class:`WorkerLost`."""

    live = True

    def __init__(self, actor, info: dict):
        self.actor, self.info = actor, info
        self.device = info.get("device")
        self.triton_cache_dir = None

    def _get(self, ref):
        ray = _ray()
        gone = tuple(getattr(ray.exceptions, name) for name in ("RayActorError", "WorkerCrashedError", "NodeDiedError")
                     if hasattr(ray.exceptions, name))
        try:
            return ray.get(ref)
        except gone as err:
            raise WorkerLost(f"{type(err).__name__} on {self.info.get('host')}") from None

    def measure(self, cfg, shape, inject=None, budget=None) -> dict:
        return self._get(self.actor.measure.remote(cfg.to_dict(), shape.to_dict(), inject, budget))

    def call(self, fn, task: dict, timeout_s: float) -> dict:
        return self._get(self.actor.call.remote(fn, task, timeout_s))

    def prewarm(self, configs, shape) -> dict:
        try:
            return self._get(self.actor.prewarm.remote([c.to_dict() for c in configs], shape.to_dict()))
        except WorkerLost:
            return {}  # the timing call will find it gone

    def prewarm_tasks(self, tasks: list, fn, timeout_s: float) -> None:
        try:
            self._get(self.actor.prewarm_tasks.remote(tasks, fn, timeout_s))
        except WorkerLost:
            pass

    def close(self) -> None:
        ray = _ray()
        try:
            ray.get(self.actor.close.remote(), timeout=60)
        except Exception:
            pass
        ray.kill(self.actor)


def connect(address: str, num_cpus: Optional[int] = None) -> None:
    """``ray.init`` for ``ray://HOST:PORT``, ``auto`` or ``local`` (a new instance on this machine)."""
    ray = _ray()
    if ray.is_initialized():
        return
    text = str(address).strip()
    kwargs = dict(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    # the actors import rocmflash from the same place as this driver
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}}
    try:
        if text == "local":
            ray.init(num_cpus=num_cpus, runtime_env=env, **kwargs)
        elif text == "auto" or text.startswith("ray://") or ":" in text:
            ray.init(address=text, runtime_env=env, **kwargs)
        else:
            raise ClusterError(f"--cluster {address!r} is invalid; expected ray://HOST:PORT, auto or local")
    except ClusterError:
        raise
    except Exception as err:  # ConnectionError, RuntimeError ...: one line for the user
        raise ClusterError(f"--cluster {address}: cannot reach a Ray cluster ({type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''})") from None


def cluster_pool(address: str, settings: Optional[dict] = None, cache_dir: Optional[str] = None,
                 replay: Optional[str] = None, actors: Optional[int] = None, fail_after: Optional[dict] = None,
                 num_cpus: Optional[int] = None) -> WorkerPool:
    """One actor per GPU of the cluster (``actors`` CPU actors replaying a journal in tests), as a pool.

    ``fail_after`` (tests): ``{actor index: calls}`` after which that actor's process exits.
    """
    ray = _ray()
    connect(address, num_cpus)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if replay is None and gpus < 1:
        raise ClusterError(f"--cluster {address}: the cluster has no GPUs (resources: "
                           f"{ray.cluster_resources()})")
    count = actors or gpus
    remote = ray.remote(TimingActor).options(num_gpus=0 if replay else 1, num_cpus=0 if replay else 1,
                                             max_restarts=0)
    handles = [remote.remote(settings, replay, cache_dir, (fail_after or {}).get(i)) for i in range(count)]
    infos = ray.get([h.describe.remote() for h in handles])
    runners = [RayRunner(h, info) for h, info in zip(handles, infos)]
    labels = [actor_label(info, i) if not replay else f"actor{i}" for i, info in enumerate(infos)]
    if not replay:
        kinds = {info["gpu"] for info in infos}
        if None in kinds or len(kinds) > 1:
            seen = ", ".join(f"{label}: {info['gpu'] or info['device']}" for label, info in zip(labels, infos))
            raise ClusterError(f"--cluster {address}: the GPUs are not all one catalog kind ({seen}); a config "
                               "database is per GPU kind")
    return WorkerPool(runners, labels=labels, shared_cache=False, device=infos[0].get("device"))


def actor_label(info: dict, index: int) -> str:
    """``HOST:DEVICE`` for an actor's :meth:`TimingActor.describe`: the node's id of its GPU (its actor index
    when nothing narrowed the actor's devices)."""
    ids = info.get("device_ids")
    return f"{info['host']}:{','.join(ids) if ids else index}"


def cluster_gpu(pool: WorkerPool):
    """The catalog GPU of a cluster pool's actors."""
    from rocmflash.hw.gpus import get_gpu

    return get_gpu(pool.runners[0].info["gpu"])


def shutdown() -> None:
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()


__all__ = ["ClusterError", "TimingActor", "RayRunner", "connect", "cluster_pool", "actor_label", "cluster_gpu",
           "shutdown"]
