"""rocmflash in torch's flash attention registry (``torch.nn.attention.activate_flash_attention_impl``).

On the CPU the kernels are activated for the ``CPU`` dispatch key (torch has no CPU kernel of the flash op)
and run in Triton's interpreter: the op's schema, its autograd formula (torch's, which calls the backward
op) and rocmflash's numerics are exercised exactly as a GPU's SDPA flash backend would reach them."""

import gc
import math

import pytest
import torch

import rocmflash  # noqa: F401  (registers the name with torch)
from rocmflash.api import sdpa_registry as R

attention = R.registry(torch)
pytestmark = pytest.mark.skipif(attention is None, reason="this torch has no flash attention registry")


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _reference(q, k, v, causal, scale):
    """fp64 attention with the key/value heads repeated for GQA (a causal mask is square here)."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = (t.detach().double() for t in (q, k, v))
    kd, vd = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    s = (qd @ kd.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ vd


@pytest.fixture
def cpu_kernels():
    handle = R.activate("CPU")
    yield
    handle.remove()
    gc.collect()  # the Library's finaliser unregisters the kernels


def test_the_name_is_registered_and_activation_is_torchs():
    assert R.IMPL_NAME in attention.list_flash_attention_impls()
    attention.activate_flash_attention_impl(R.IMPL_NAME)
    try:
        assert attention.current_flash_attention_impl() == R.IMPL_NAME
    finally:
        attention.restore_flash_attention_impl()
    assert attention.current_flash_attention_impl() is None


@pytest.mark.parametrize("causal, heads_kv, scale", [(False, 4, None), (True, 4, 0.2), (True, 2, None)],
                         ids=["plain", "causal-scale", "causal-gqa2"])
def test_the_flash_op_runs_rocmflash_forward_and_backward(interpret, cpu_kernels, causal, heads_kv, scale):
    B, Hq, S, D = 2, 4, 24, 32
    q = torch.randn(B, Hq, S, D, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, heads_kv, S, D, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, heads_kv, S, D, dtype=torch.bfloat16, requires_grad=True)
    before = R.stats()
    out, lse, *_rest = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    used = 1 / math.sqrt(D) if scale is None else scale
    ref = _reference(q, k, v, causal, used)
    assert _rel(out, ref) < 1e-2
    do = torch.randn_like(out)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    _reference_grad = torch.autograd.grad(_graph(qd, kd, vd, causal, used), (qd, kd, vd), do.double())
    grads = torch.autograd.grad(out, (q, k, v), do)
    for got, want in zip(grads, _reference_grad):
        assert got.shape == want.shape and _rel(got, want) < 2e-2
    after = R.stats()
    assert after["forward"] - before["forward"] == 1 and after["backward"] - before["backward"] == 1
    assert lse.dtype == torch.float32 and lse.shape == (B, Hq, S)


def _graph(q, k, v, causal, scale):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("kwargs, sq, message", [
    (dict(dropout_p=0.1), 16, "has no dropout"),
    (dict(is_causal=True), 8, "top-left aligned"),
    (dict(return_debug_mask=True), 16, "no debug attention mask"),
])
def test_what_rocmflash_cannot_compute_exactly_is_one_clear_error(interpret, cpu_kernels, kwargs, sq, message):
    q = torch.randn(1, 2, sq, 32, dtype=torch.float16)
    k = v = torch.randn(1, 2, 16, 32, dtype=torch.float16)
    args = dict(dropout_p=0.0, is_causal=False, return_debug_mask=False)
    args.update(kwargs)
    with pytest.raises(RuntimeError, match=message) as err:
        torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, args["dropout_p"], args["is_causal"],
                                                           args["return_debug_mask"])
    assert "restore_flash_attention_impl" in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("heads_kv", [16, 4])
def test_gpu_sdpa_flash_backend_is_rocmflash_once_activated(compiled, heads_kv):
    """SDPA's flash backend, also through a reference bound before activation, runs rocmflash's kernels and
    matches torch's own flash kernel (outputs and gradients); restore gives torch's kernel back."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as bound_before

    B, Hq, S, D = 2, 16, 1024, 128
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, heads_kv, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, heads_kv, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn_like(q)
    gqa = heads_kv != Hq
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        ref = bound_before(q, k, v, is_causal=True, enable_gqa=gqa)
        ref_grads = torch.autograd.grad(ref, (q, k, v), do)
        before = R.stats()
        attention.activate_flash_attention_impl(R.IMPL_NAME)
        try:
            out = bound_before(q, k, v, is_causal=True, enable_gqa=gqa)
            grads = torch.autograd.grad(out, (q, k, v), do)
        finally:
            attention.restore_flash_attention_impl()
        after = R.stats()
        again = bound_before(q, k, v, is_causal=True, enable_gqa=gqa)
    assert after["forward"] - before["forward"] == 1 and after["backward"] - before["backward"] == 1
    assert R.stats() == after  # restored: torch's kernel ran the last call
    assert _rel(out, ref) < 1e-2 and torch.equal(again, ref)
    for got, want in zip(grads, ref_grads):
        assert _rel(got, want) < 2e-2
