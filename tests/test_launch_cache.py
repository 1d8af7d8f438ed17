"""The launch cache reuses a compiled kernel only for launches Triton would specialise the same way.

CPU tests check the key; GPU tests check that cached launches give bit-identical results to
``JITFunction.run`` launches and that a misaligned view never runs an aligned-only binary.
"""

import math

import pytest
import torch

import rocmflash
from rocmflash.config import KernelConfig
from rocmflash.kernels import common as C
from rocmflash.kernels.backward import _bwd_dq


@pytest.fixture
def on_device_zero(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def _key(args, backend="cuda", **constexprs):
    return C._launch_key(_bwd_dq, args, constexprs or {"BLOCK_M": 64}, KernelConfig(), backend)


def test_key_tracks_alignment_dtype_and_exact_ints_not_floats(on_device_zero):
    base = torch.empty(64, dtype=torch.float16)
    aligned, shifted = base[:32], base[1:33]  # 2 bytes apart: only one is 16-byte aligned
    assert aligned.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 != 0
    k0 = _key({"Q": aligned, "SEQ_Q": 128, "sm_scale": 0.125})
    assert k0 == _key({"Q": base[:16], "SEQ_Q": 128, "sm_scale": 0.5})  # same specialisation
    assert k0 != _key({"Q": shifted, "SEQ_Q": 128, "sm_scale": 0.125})
    assert k0 != _key({"Q": aligned.to(torch.bfloat16), "SEQ_Q": 128, "sm_scale": 0.125})
    assert k0 != _key({"Q": aligned, "SEQ_Q": 129, "sm_scale": 0.125})
    assert k0 != _key({"Q": aligned, "SEQ_Q": 128, "sm_scale": 0.125}, BLOCK_M=32)
    assert k0 != _key({"Q": aligned, "SEQ_Q": 128, "sm_scale": 0.125}, backend="hip")


def test_key_on_hip_tracks_the_2gib_buffer_bit(on_device_zero, monkeypatch):
    small = torch.empty(16, dtype=torch.float16)
    monkeypatch.setattr(C, "_MAX_INT32", 31)  # pretend 2 GiB is 31 bytes: a 32-byte storage is "large"
    assert _key({"Q": small}, backend="hip") != _key({"Q": torch.empty(8, dtype=torch.float16)}, backend="hip")
    assert _key({"Q": small}, backend="cuda") == _key({"Q": torch.empty(8, dtype=torch.float16)}, backend="cuda")


# ----------------------------------------------------------------------------- GPU
def _step(q, k, v, do, causal):
    for t in (q, k, v):
        t.grad = None
    out = rocmflash.attention(q, k, v, causal=causal)
    out.backward(do)
    return [x.detach().clone() for x in (out, q.grad, k.grad, v.grad)]


@pytest.mark.gpu
@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("causal", [False, True])
def test_cached_launches_equal_jit_launches_and_respect_alignment(causal, monkeypatch, attention_reference):
    torch.manual_seed(7)
    dev, dt = "cuda", torch.bfloat16
    B, Hq, Hkv, S, D = 2, 8, 2, 200, 64
    leaves = [torch.randn(B, h, S, D, device=dev, dtype=dt, requires_grad=True) for h in (Hq, Hkv, Hkv)]
    do = torch.randn(B, Hq, S, D, device=dev, dtype=dt)
    monkeypatch.setattr(C, "FAST_LAUNCH", False)
    C._LAUNCHERS.clear()
    jit = _step(*leaves, do, causal)
    monkeypatch.setattr(C, "FAST_LAUNCH", True)
    first = _step(*leaves, do, causal)  # fills the cache through Triton
    assert C._LAUNCHERS, "nothing was cached"
    cached = _step(*leaves, do, causal)  # runs from the cache
    for a, b, c in zip(jit, first, cached):
        assert torch.equal(a, b) and torch.equal(a, c)

    # the same shapes and strides from misaligned storage: a different specialisation
    def shifted(x):
        flat = torch.empty(x.numel() + 1, device=dev, dtype=dt)
        view = flat[1:].view(x.shape)
        view.copy_(x.detach())
        return view.requires_grad_()

    mis = [shifted(x) for x in leaves]
    assert all(x.data_ptr() % 16 for x in mis)
    got = _step(*mis, do, causal)
    ref_out, _ = attention_reference(*(x.detach().double() for x in leaves), causal, 1 / math.sqrt(D))
    err = ((got[0].double() - ref_out).norm() / ref_out.norm()).item()
    assert err < 2e-2, f"misaligned inputs through the cache: relative error {err:.2e}"
    for a, b in zip(jit, got):
        assert torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2)
