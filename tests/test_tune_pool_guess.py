"""``tune --model --gpus``: a plan made for the GPU kind the driver's files name while torch imports in a thread
(issue #29: a cold tune's first seconds), confirmed by torch before the first job, made again when torch
disagrees."""

import types

import pytest

from rocmflash.hw.gpus import get_gpu
from rocmflash.tuning import pool as P
from rocmflash.tuning.pool import DiscardPlan
from rocmflash.tuning.pool_confirm import TorchConfirmation
from test_tune_pool_early import FakePool, _args


@pytest.fixture
def torch_sees(monkeypatch):
    """torch sees ``count`` CUDA GPUs, each the catalog GPU ``name`` (set by the test)."""
    import torch

    import rocmflash.hw.platform as platform

    seen = {"count": 2, "name": "h100", "device_name": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: seen["count"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: seen["device_name"])
    monkeypatch.setattr(platform, "is_rocm", lambda: False)
    monkeypatch.setattr(P, "node_gpu", lambda indices, identify=None: get_gpu(seen["name"]))
    return seen


def _speculated(monkeypatch, guess, gpu_name="auto", rocm=False, name="NVIDIA H100 80GB HBM3"):
    from rocmflash.cli import model as M
    from rocmflash.hw import node_probe
    from rocmflash.tuning.live_worker import LiveSettings

    early = FakePool(([0, 1], rocm))
    monkeypatch.setattr(P, "early_node_pool", lambda *a, **k: early)
    if rocm:
        import rocmflash.hw.platform as platform

        monkeypatch.setattr(platform, "is_rocm", lambda: True)
    monkeypatch.setattr(node_probe, "nvidia_reports", lambda: [])  # the fakes below answer, not this machine
    monkeypatch.setattr(node_probe, "guess_node_gpu", lambda rocm, nvidia=None: get_gpu(guess) if guess else None)
    monkeypatch.setattr(node_probe, "nvidia_device_name", lambda nvidia=None: name)
    return early, M._node_pool(_args(), LiveSettings(), speculate=True, gpu_name=gpu_name)


def test_a_guessed_pool_returns_at_once_and_torch_confirms_it(monkeypatch, torch_sees):
    early, (pool, gpu, indices) = _speculated(monkeypatch, "h100")
    assert pool is early and gpu is get_gpu("h100") and indices == [0, 1] and not early.closed
    assert early.device == "NVIDIA H100 80GB HBM3"  # the tune's environment names the device without torch
    early.confirm()  # torch agrees: returns


def test_torch_naming_the_device_otherwise_discards_the_plan(monkeypatch, torch_sees):
    torch_sees.update(device_name="NVIDIA H100 PCIe")
    early, _ = _speculated(monkeypatch, "h100")
    with pytest.raises(DiscardPlan, match="PCIe"):
        early.confirm()


@pytest.mark.parametrize("count,name,match", [(2, "h200", "reports h200"), (3, "h100", "GPU\\(s\\) 0, 1, 2")])
def test_torch_disagreeing_with_the_guess_discards_the_plan(monkeypatch, torch_sees, count, name, match):
    torch_sees.update(count=count, name=name)
    early, (pool, gpu, indices) = _speculated(monkeypatch, "h100")
    with pytest.raises(DiscardPlan, match=match):
        early.confirm()


def test_an_error_while_torch_confirms_is_a_discarded_plan_not_a_traceback(monkeypatch, torch_sees):
    def refuse(indices, identify=None):
        raise ValueError("GPU 1 is not in rocmflash's catalog")

    monkeypatch.setattr(P, "node_gpu", refuse)
    confirm = TorchConfirmation("all", FakePool(([0, 1], False)), get_gpu("h100"))
    with pytest.raises(DiscardPlan, match="not in rocmflash's catalog"):
        confirm()


@pytest.mark.parametrize("guess,gpu_name,name,rocm", [(None, "auto", "NVIDIA H100 80GB HBM3", False),
                                                      ("h100", "h200", "NVIDIA H100 80GB HBM3", False),
                                                      ("h100", "auto", None, False),  # GPUs of two names
                                                      ("mi300x", "auto", None, True)])  # AMD: KFD names no device
def test_no_guess_or_another_named_gpu_takes_the_torch_path(monkeypatch, torch_sees, guess, gpu_name, name, rocm):
    early, (pool, gpu, indices) = _speculated(monkeypatch, guess, gpu_name, rocm, name)
    assert pool is early and not hasattr(early, "confirm") and gpu is get_gpu("h100")


def test_a_discarded_plan_is_made_again_without_the_guess(monkeypatch):
    from rocmflash.cli import model as M

    calls = []

    def plan_and_tune(args, console, passes, mode, speculate):
        calls.append(speculate)
        if speculate:
            raise DiscardPlan("torch reports h200 on GPU(s) 0, 1, not the h100 the driver's files name")
        return 0

    monkeypatch.setattr(M, "_plan_and_tune", plan_and_tune)
    printed = []
    console = types.SimpleNamespace(print=lambda text, **k: printed.append(text))
    args = types.SimpleNamespace(head_dim=None, heads=None, kv_heads=None, replay=None, variant=None, top_k=None,
                                 pass_=None, mode="all")
    assert M.run_model_tune(args, console) == 0
    assert calls == [True, False] and "planning again" in printed[0] and "reports h200" in printed[0]
