"""A gradient asked for deterministically never runs the platform's SDPA (its flash backward adds dQ with
atomics; rocmflash's backward has none): ``flash_attn_func(deterministic=True)`` and
``torch.use_deterministic_algorithms(True)`` keep training calls on rocmflash's kernels, where the database
entry would serve SDPA -- first calls and planned repeats alike (Triton's interpreter, CPU)."""

import contextlib

import pytest
import torch

from rocmflash.api import selection
from rocmflash.kernels.launch import observe_launches
from test_incumbent_interp import _entry_db, _qkv

pytestmark = pytest.mark.usefixtures("fresh_selection")

#: SDPA wins the forward and the training step
SDPA_WINS = {"backend": "default", "time_ms": 0.1, "triton_ms": 0.2,
             "train": {"backend": "default", "time_ms": 0.3, "triton_ms": 0.5}}


@contextlib.contextmanager
def _deterministic_mode():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _kernels(fn):
    with observe_launches() as seen:
        fn()
    return [r["kernel"] for r in seen]


def _train_step(call):
    def step():
        out = call()
        out.float().sum().backward()
    return step


@pytest.mark.parametrize("how", ["flag", "torch-mode"])
def test_a_deterministic_training_call_runs_rocmflash_not_sdpa(interpret, tmp_path, monkeypatch, how):
    import rocmflash

    _entry_db(tmp_path, monkeypatch, SDPA_WINS)
    q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in _qkv())  # (B, S, H, D)
    free = _train_step(lambda: rocmflash.flash_attn_func(q, k, v))
    assert _kernels(free) == []  # the entry's SDPA runs the training step
    for _ in range(2):  # the first call, then the planned repeat
        if how == "flag":
            step = _train_step(lambda: rocmflash.flash_attn_func(q, k, v, deterministic=True))
            kernels = _kernels(step)
        else:
            with _deterministic_mode():
                kernels = _kernels(_train_step(lambda: rocmflash.flash_attn_func(q, k, v)))
        assert any("bwd" in n for n in kernels) and len(kernels) >= 2, kernels
    assert _kernels(free) == []  # outside deterministic mode the entry's choice stands


def test_deterministic_mode_keeps_attention_and_patch_sdpa_training_on_rocmflash(interpret, tmp_path, monkeypatch):
    import torch.nn.functional as F

    import rocmflash

    _entry_db(tmp_path, monkeypatch, SDPA_WINS)
    q, k, v = _qkv(grad=True)
    with _deterministic_mode():
        for _ in range(2):
            kernels = _kernels(_train_step(lambda: rocmflash.attention(q, k, v)))
            assert any("bwd" in n for n in kernels), kernels
        with rocmflash.patch_sdpa():
            kernels = _kernels(_train_step(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
        assert any("bwd" in n for n in kernels), kernels
    # forward-only calls may still run SDPA (its forward is deterministic)
    with _deterministic_mode(), torch.no_grad():
        assert _kernels(lambda: rocmflash.attention(q, k, v)) == []
    assert selection.select_incumbent(q.device, 32, q.dtype, False, 2, 64, train=True) == "default"
