"""flash_attn_varlen_func on an equal-length packed batch runs the dense path (rocmflash.api.varlen._as_dense_batch),
on the CPU interpreter.

Sizes alone say that every sequence is ``max_seqlen`` long (``batch * max_seqlen == total``: none may be longer),
so the batch goes to ``flash_attn_func`` on ``(batch, S, H, D)`` views with nothing read on the host; a tiny
launch checks the cumulative lengths by the varlen forward's rules and reports through its error word.
"""

import math

import pytest
import torch

import rocmflash
from rocmflash.api import varlen as api_varlen
from rocmflash.kernels.varlen import host as VK

pytestmark = [pytest.mark.usefixtures("interpret", "fresh_selection"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _packed(lengths_q, lengths_k, hq=4, hkv=2, d=32, seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), hq, d, generator=g).to(dtype).requires_grad_(True)
    k, v = (torch.randn(sum(lengths_k), hkv, d, generator=g).to(dtype).requires_grad_(True) for _ in range(2))
    cu = [torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32) for n in (lengths_q, lengths_k)]
    return q, k, v, cu[0], cu[1]


def _reference(q, k, v, lengths_q, lengths_k, causal, scale):
    """fp32 attention per sequence, bottom-right causal, GQA by head grouping: ``(total_q, Hq, D)``."""
    group = q.shape[1] // k.shape[1]
    out, qo, ko = [], 0, 0
    for nq, nk in zip(lengths_q, lengths_k):
        qs = q[qo:qo + nq].float().transpose(0, 1)
        ks, vs = (t[ko:ko + nk].float().repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))
        s = qs @ ks.transpose(-1, -2) * scale
        if causal:
            i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
            s = s.masked_fill(j > i + nk - nq, float("-inf"))
        out.append((torch.softmax(s, -1).nan_to_num(0.0) @ vs).transpose(0, 1))
        qo, ko = qo + nq, ko + nk
    return torch.cat(out)


def _spy_varlen_kernel(monkeypatch):
    calls = []
    real = VK.launch_forward

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(VK, "launch_forward", spy)
    return calls


def _rel(a, b):
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths_q, lengths_k", [([40] * 3, [40] * 3), ([8] * 3, [24] * 3)], ids=["square", "Sq<Sk"])
def test_equal_lengths_run_the_dense_path_with_the_varlen_answer(monkeypatch, causal, lengths_q, lengths_k):
    """No varlen kernel runs; the output and the gradients are attention per sequence (bottom-right causal), as
    the varlen kernel's are."""
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k)
    calls = _spy_varlen_kernel(monkeypatch)
    out = rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, lengths_q[0], lengths_k[0], causal=causal)
    assert not calls and out.shape == q.shape and out.dtype == q.dtype
    scale = 1.0 / math.sqrt(q.shape[-1])
    ref = _reference(q, k, v, lengths_q, lengths_k, causal, scale)
    assert _rel(out, ref) < 5e-3
    go = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), go)
    qr, kr, vr = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    want = torch.autograd.grad(_reference(qr, kr, vr, lengths_q, lengths_k, causal, scale), (qr, kr, vr), go.float())
    assert all(_rel(g, w) < 1e-2 for g, w in zip(grads, want))
    kernel = api_varlen.packed_varlen(q, k, v, cu_q, cu_k, lengths_q[0], lengths_k[0], scale, causal, -1, 0.0)
    assert calls and _rel(kernel, ref) < 5e-3  # the varlen kernel agrees


def test_unequal_lengths_and_other_options_keep_the_varlen_kernel(monkeypatch):
    """A batch of other lengths, or a call that asks for the LSE, a window or a soft cap, runs the varlen kernel."""
    calls = _spy_varlen_kernel(monkeypatch)
    q, k, v, cu_q, cu_k = _packed([30, 50], [30, 50])
    rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 50, 50, causal=True)
    assert len(calls) == 1
    q, k, v, cu_q, cu_k = _packed([40, 40], [40, 40])
    rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True, return_lse=True)
    rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True, window_size=(16, 0))
    rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, softcap=20.0)
    assert len(calls) == 4
    rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True)
    assert len(calls) == 4  # the plain call: dense


def test_lengths_that_break_max_seqlen_are_reported_not_served_silently():
    """Lengths [30, 50] with max_seqlen 40 sum to 2 x 40: the sizes say "equal", the values say otherwise. The
    length check reports it as the varlen forward would (the interpreter: at once); check_values=True on the host
    before anything runs."""
    q, k, v, cu_q, cu_k = _packed([30, 50], [30, 50])
    with pytest.raises(ValueError, match="longer than max_seqlen_q"):
        rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True)
    rocmflash.api.varlen.check_errors()  # the report was reset by the raise
    with pytest.raises(ValueError, match="max_seqlen_q=40 is smaller than the longest sequence"):
        rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True, check_values=True)
    bad = cu_q.clone()
    bad[0] = 1
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        rocmflash.flash_attn_varlen_func(q, k, v, bad, cu_k, 40, 40)
    q, k, v, cu_q, cu_k = _packed([40, 40], [40, 40])
    out = rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, causal=True)
    assert torch.isfinite(out).all()
