"""A timing worker's warm-up (:mod:`rocmflash.tuning.worker_warm`): nothing without a GPU, every step tried in order
on one, a failing step recorded (not raised) and the steps after it still run; the CPU-runnable steps do what a
measurement does (the gate's reference, SDPA's backends) without error."""

import torch

from rocmflash.tuning import worker_warm


def test_nothing_without_a_gpu_or_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert worker_warm.warm_device() == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert worker_warm.warm_device() == {}


def test_every_step_runs_and_a_failure_is_recorded(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    seen = []

    def ok(dev):
        seen.append(("ok", dev))

    def broken(dev):
        seen.append(("broken", dev))
        raise RuntimeError("no such backend here\nsecond line")

    done = worker_warm.warm_device((("first", ok), ("second", broken), ("third", ok)))
    assert [name for name, _ in seen] == ["ok", "broken", "ok"]
    assert all(dev == torch.device("cuda", 0) for _, dev in seen)
    assert isinstance(done["first"], float) and isinstance(done["third"], float)
    assert done["second"] == "RuntimeError: no such backend here"


def test_the_gate_and_sdpa_steps_run_on_the_cpu():
    """The same calls a worker makes, on CPU tensors (the GPU run is tests/test_worker_warm_gpu.py)."""
    cpu = torch.device("cpu")
    worker_warm._torch_ops(cpu)
    worker_warm._flush(cpu)  # no flush buffer off a GPU
    worker_warm._sdpa_backends(cpu)
    assert [name for name, _ in worker_warm.STEPS] == ["torch", "flush", "triton", "sdpa"]
