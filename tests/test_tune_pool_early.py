"""``--gpus``: the timing workers start before the tune process imports torch (issue #29: a process's fixed costs),
where the node's devices can be told without torch, and are kept only when torch agrees."""

import os
import subprocess
import sys
import types

import pytest

from rocmflash.tuning import pool as P


def _node(tmp_path, nvidia=0, amd=0, cpu_nodes=1):
    dev, kfd = tmp_path / "dev", tmp_path / "kfd"
    dev.mkdir(parents=True)
    kfd.mkdir(parents=True)
    for name in [f"nvidia{i}" for i in range(nvidia)] + ["nvidiactl", "nvidia-uvm"] * bool(nvidia):
        (dev / name).write_text("")
    for i in range(cpu_nodes + amd):
        (kfd / str(i)).mkdir()
        (kfd / str(i) / "gpu_id").write_text("0\n" if i < cpu_nodes else f"{1000 + i}\n")
    return str(dev), str(kfd)


def test_devices_told_without_torch_from_device_files_and_kfd_nodes(tmp_path):
    dev, kfd = _node(tmp_path / "n", nvidia=2)
    assert P.gpus_without_torch({}, dev, kfd) == (2, False)
    dev, kfd = _node(tmp_path / "a", amd=8)
    assert P.gpus_without_torch({}, dev, kfd) == (8, True)
    # narrowed by the user, or nothing / both kinds present: torch decides
    assert P.gpus_without_torch({"HIP_VISIBLE_DEVICES": "1"}, dev, kfd) is None
    dev, kfd = _node(tmp_path / "none")
    assert P.gpus_without_torch({}, dev, kfd) is None


def test_an_early_pool_starts_its_workers_without_importing_torch(tmp_path):
    script = f"""
import sys
from rocmflash.tuning import live, pool
from rocmflash.tuning.live_worker import LiveSettings
started = []
live.LiveRunner.start_worker = lambda self: started.append(("worker", self.device_index))
live.LiveRunner.start_prewarm = lambda self: started.append(("prewarm", self.device_index))
p = pool.early_node_pool("all", LiveSettings(), {str(tmp_path)!r}, probe=lambda: (2, True))
assert p.early == ([0, 1], True), p.early
assert started == [("worker", 0), ("prewarm", 0), ("worker", 1)], started
assert p.runners[1].worker_env == {{"HIP_VISIBLE_DEVICES": "1"}}, p.runners[1].worker_env
assert "torch" not in sys.modules, "torch imported before the workers started"
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.endswith("VISIBLE_DEVICES")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


class FakePool:
    runners = ()  # the timing workers (none: torch identifies the devices)

    def __init__(self, early):
        self.early, self.closed = early, False

    def close(self):
        self.closed = True


def _args(gpus="all"):
    return types.SimpleNamespace(gpus=gpus, cache_dir=None, workers=None, timeout=60.0)


@pytest.fixture
def node(monkeypatch):
    """torch sees 2 CUDA GPUs of one kind; node_pool records what it builds."""
    import torch

    import rocmflash.hw.platform as platform

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(platform, "is_rocm", lambda: False)
    monkeypatch.setattr(P, "node_gpu", lambda indices: "h100")
    built = []
    monkeypatch.setattr(P, "node_pool", lambda indices, *a, **k: built.append(indices) or ("fresh", indices))
    return built


def test_the_early_pool_is_kept_when_torch_agrees(monkeypatch, node):
    from rocmflash.cli import model as M
    from rocmflash.tuning.live_worker import LiveSettings

    early = FakePool(([0, 1], False))
    monkeypatch.setattr(P, "early_node_pool", lambda *a, **k: early)
    pool, gpu, indices = M._node_pool(_args(), LiveSettings())
    assert pool is early and not early.closed and indices == [0, 1] and node == []


@pytest.mark.parametrize("guess", [([0, 1, 2], False), ([0, 1], True)])
def test_an_early_pool_torch_disagrees_with_is_closed_and_rebuilt(monkeypatch, node, guess):
    from rocmflash.cli import model as M
    from rocmflash.tuning.live_worker import LiveSettings

    early = FakePool(guess)
    monkeypatch.setattr(P, "early_node_pool", lambda *a, **k: early)
    pool, gpu, indices = M._node_pool(_args(), LiveSettings())
    assert early.closed and pool == ("fresh", [0, 1]) and node == [[0, 1]]


def test_an_early_pool_is_closed_when_the_devices_are_refused(monkeypatch, node):
    from rocmflash.cli import model as M
    from rocmflash.tuning.live_worker import LiveSettings

    early = FakePool(([0, 1], False))
    monkeypatch.setattr(P, "early_node_pool", lambda *a, **k: early)
    with pytest.raises(ValueError, match="does not exist"):
        M._node_pool(_args("0,5"), LiveSettings())
    assert early.closed


class SlowClose:
    def __init__(self, log):
        self.log = log

    def close(self):
        import time

        self.log.append(("start", time.perf_counter()))
        time.sleep(0.5)
        self.log.append(("end", time.perf_counter()))


def test_a_pool_closes_its_runners_at_once_not_one_after_another():
    log = []
    P.WorkerPool([SlowClose(log), SlowClose(log)]).close()
    starts = [t for what, t in log if what == "start"]
    ends = [t for what, t in log if what == "end"]
    assert len(ends) == 2 and max(starts) < min(ends)  # the second began before the first ended
