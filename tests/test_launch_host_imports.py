"""A warm forward launch runs no import statement (#28/#30): ``kernels.common.torch_backend`` used to import
``hw.platform.is_rocm`` on every call (~1 us of import machinery per launch), and ``launch_forward`` asks it
each launch. The answer is still read per call, so a ROCm build faked at run time (``tests/fake_rocm.py``) is seen."""

import builtins

import torch

from rocmflash.config import KernelConfig


def _imports_during(fn, monkeypatch) -> list:
    """Names of the modules ``fn()`` imports (every ``import`` statement goes through ``builtins.__import__``)."""
    seen = []
    real = builtins.__import__

    def spy(name, *args, **kwargs):
        seen.append(name)
        return real(name, *args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(builtins, "__import__", spy)
        fn()
    return seen


def test_spy_sees_an_import_statement(monkeypatch):
    def imports():
        import json  # noqa: F401

    assert _imports_during(imports, monkeypatch) == ["json"]


def test_warm_launch_forward_and_torch_backend_import_nothing(monkeypatch):
    from rocmflash.hw.platform import is_rocm
    from rocmflash.kernels import common as C
    from rocmflash.kernels.forward import online as online

    launches = []
    monkeypatch.setattr(C, "launch_cached", lambda *args: launches.append(args))
    q = torch.zeros(1, 2, 16, 16, dtype=torch.float16)
    cfg = KernelConfig(BLOCK_M=16, BLOCK_N=16)

    def launch(out=None):
        C.launch_forward(online._fwd_online, "online", online._constexprs, q, q, q, cfg, True, 0.25, out)

    launch()  # the first call may import (torch, lazily)
    assert _imports_during(launch, monkeypatch) == []
    assert _imports_during(lambda: launch(torch.empty_like(q)), monkeypatch) == []
    assert _imports_during(C.torch_backend, monkeypatch) == []
    assert launches[-1][-1] == C.torch_backend() == ("hip" if is_rocm() else "cuda")


def test_torch_backend_follows_a_rocm_build_faked_at_run_time(monkeypatch):
    from rocmflash.kernels.common import torch_backend

    monkeypatch.setattr(torch.version, "hip", None)
    assert torch_backend() == "cuda"
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    assert torch_backend() == "hip"
    monkeypatch.setattr(torch.version, "hip", None)
    assert torch_backend() == "cuda"
