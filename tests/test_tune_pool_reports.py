"""A speculative ``--gpus`` plan is confirmed from the timing workers' own device reports (issue #29: a cold
tune's first seconds): the tune process opens no device runtime to identify its GPUs, which cost it 0.5-1.9 s
beside a full compile pool on the 2-GPU H200 runs of 2026-11-27."""

import types

import pytest
import torch

from rocmflash.hw.detect import identify_device
from rocmflash.hw.gpus import get_gpu
from rocmflash.tuning import pool as P
from rocmflash.tuning.pool import DiscardPlan
from rocmflash.tuning.pool_confirm import TorchConfirmation, worker_reports

H100_REPORT = {"name": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "compute_units": 132, "warp_size": 32,
               "vendor": "nvidia", "memory_bytes": None, "rocm": False}
MI300X = {"name": "AMD Instinct MI300X", "gcn_arch_name": "gfx942:sramecc+:xnack-", "multi_processor_count": 304,
          "total_memory": 192 * 1024**3}


class ReportingRunner:
    def __init__(self, index, report):
        self.device_index, self.report, self.asked = index, report, []

    def reported_device(self, timeout_s=None):
        self.asked.append(timeout_s)
        return self.report


def _pool(*reports):
    pool = types.SimpleNamespace(runners=[ReportingRunner(i, r) for i, r in enumerate(reports)], early=(
        list(range(len(reports))), False))
    return pool


@pytest.fixture
def no_device_here(monkeypatch):
    """torch sees two CUDA GPUs by count only: opening a device in this process fails the test."""
    import rocmflash.hw.platform as platform

    def opened(*a, **k):
        raise AssertionError("the tune process opened a device to identify it")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(platform, "is_rocm", lambda: False)
    for name in ("get_device_properties", "get_device_name", "init", "is_available"):
        monkeypatch.setattr(torch.cuda, name, opened)


def test_the_workers_reports_confirm_the_guess_without_a_device_here(no_device_here):
    pool = _pool(H100_REPORT, H100_REPORT)
    TorchConfirmation("all", pool, get_gpu("h100"), device_name="NVIDIA H100 80GB HBM3")()
    assert all(r.asked for r in pool.runners)


@pytest.mark.parametrize("second,match", [
    ({**H100_REPORT, "name": "NVIDIA H200", "memory_bytes": None}, "--gpus mixes GPU kinds"),
    ({**H100_REPORT, "name": "NVIDIA H100 PCIe"}, "PCIe"),
    ({**H100_REPORT, "rocm": True}, "not the tune's build"),
])
def test_a_worker_reporting_another_device_discards_the_plan(no_device_here, second, match):
    with pytest.raises(DiscardPlan, match=match):
        TorchConfirmation("all", _pool(H100_REPORT, second), get_gpu("h100"), device_name=H100_REPORT["name"])()


def test_a_worker_without_a_report_leaves_the_identification_to_torch(monkeypatch):
    import rocmflash.hw.platform as platform

    asked = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(platform, "is_rocm", lambda: False)
    monkeypatch.setattr(P, "node_gpu", lambda indices, identify=None: asked.append(identify) or get_gpu("h100"))
    pool = _pool(H100_REPORT, None)
    assert worker_reports(pool, [0, 1]) is None
    TorchConfirmation("all", pool, get_gpu("h100"))()
    assert asked == [None]  # torch's own identification


def test_the_reports_are_read_for_the_devices_the_plan_times_on():
    pool = _pool(H100_REPORT, {**H100_REPORT, "name": "other"})
    assert worker_reports(pool, [0]) == {0: H100_REPORT}
    assert not pool.runners[1].asked


@pytest.mark.parametrize("fake_rocm", [MI300X], indirect=True)
def test_a_live_timing_worker_reports_its_device(fake_rocm, tmp_path):
    """A real timing worker (a spawned Python under the fake ROCm layer) answers with its device, from which the
    catalog GPU follows; this process's own device calls are not used."""
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    runner = LiveRunner(LiveSettings(timeout_s=60), triton_cache_dir=str(tmp_path), device_index=0, rocm=True)
    try:
        assert runner.reported_device() is None  # not started: nothing asked
        runner.start_worker()
        report = runner.reported_device(120)
    finally:
        runner.close()
    assert report["rocm"] is True and report["arch"].startswith("gfx942") and report["name"] == MI300X["name"]
    assert identify_device(**{k: v for k, v in report.items() if k != "rocm"}).gpu.name == "mi300x"


def test_the_driver_names_the_runners_devices_on_a_guessed_plan(monkeypatch):
    """On a speculative plan every runner is given the driver's device name, so that a pre-warm's record never
    opens a device in the tune process to ask it."""
    from rocmflash.cli import model as M
    from rocmflash.hw import node_probe
    from rocmflash.tuning.live_worker import LiveSettings
    from test_tune_pool_early import _args

    runners = [types.SimpleNamespace(device=None, device_index=i) for i in range(2)]
    early = types.SimpleNamespace(early=([0, 1], False), runners=runners, close=lambda: None)
    monkeypatch.setattr(P, "early_node_pool", lambda *a, **k: early)
    monkeypatch.setattr(node_probe, "nvidia_reports", lambda: [])
    monkeypatch.setattr(node_probe, "guess_node_gpu", lambda rocm, nvidia=None: get_gpu("h100"))
    monkeypatch.setattr(node_probe, "nvidia_device_name", lambda nvidia=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(TorchConfirmation, "_run", lambda self, gpus: None)
    pool, gpu, indices = M._node_pool(_args(), LiveSettings(), speculate=True)
    assert pool is early and [r.device for r in runners] == ["NVIDIA H100 80GB HBM3"] * 2
