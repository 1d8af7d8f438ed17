"""GPU: attention sinks (gpt-oss's ``s_aux``) through the compiled online and varlen kernels, forward and backward.

References are the eager gpt-oss formula (``softmax(cat([q·kᵀ * scale, sink]))`` without the sink column) in fp32
on the GPU, gradients by fp32 autograd of it; inputs fresh ``randn``. The interpreter tests
(``tests/test_sinks_interp.py``) cover the small awkward shapes; these run real sizes and torch.compile.
"""

import math

import pytest
import torch

import rocmflash
from rocmflash.kernels.launch import observe_launches

from varlen_reference import band_mask, rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


def _eager(q, k, v, sinks, scale, causal, window=(-1, -1)):
    """gpt-oss's eager attention in fp32 on ``(B, H, S, D)`` (differentiable): ``(out, lse)``."""
    q, k, v = q.float(), k.float(), v.float()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    s = s.masked_fill(~band_mask(q.shape[2], k.shape[2], causal, window).to(q.device), float("-inf"))
    full = torch.cat([s, sinks.float().view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    lse = torch.logsumexp(full, -1)
    return torch.exp(full - lse[..., None])[..., :-1] @ v, lse


def _inputs(B, Hq, Hkv, Sq, Sk, D, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(*shape, device="cuda", generator=g).to(dtype).requires_grad_()
            for shape in ((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D))] + \
        [(2 * torch.randn(Hq, device="cuda", generator=g)).requires_grad_()]


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_attention_with_sinks_matches_eager(D, causal):
    leaves = _inputs(2, 8, 2, 1000, 1031, D, seed=D + causal)
    out, lse = rocmflash.attention(*leaves[:3], causal=causal, return_lse=True, sinks=leaves[3])
    do = torch.randn_like(out)
    grads = torch.autograd.grad((out.float() * do.float()).sum() + lse.sum(), leaves)
    ref_out, ref_lse = _eager(*leaves, 1 / math.sqrt(D), causal)
    ref_grads = torch.autograd.grad((ref_out * do.float()).sum() + ref_lse.sum(), leaves)
    assert rel_err(out, ref_out) < 2e-2 and (lse - ref_lse).abs().max().item() < 1e-2
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), grads, ref_grads):
        assert torch.isfinite(got).all() and rel_err(got, want) < 3e-2, name


@pytest.mark.parametrize("window", [(-1, -1), (4, 0), (127, 0)], ids=["no-window", "window5", "window128"])
def test_gpu_varlen_with_sinks_matches_eager(window):
    """gpt-oss's sliding layers are sinks + a left window (its HF path runs them through the varlen kernel)."""
    lengths = [300, 0, 1025, 77]
    Hq, Hkv, D = 8, 2, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    T = sum(lengths)
    q, k, v = (torch.randn(T, h, D, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
               for h in (Hq, Hkv, Hkv))
    sinks = (2 * torch.randn(Hq, device="cuda", generator=g)).requires_grad_()
    out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, s_aux=sinks,
                                           window_size=window)
    do = torch.randn_like(out)
    grads = torch.autograd.grad((out.float() * do.float()).sum(), (q, k, v, sinks))
    refs = []
    for b in range(len(lengths)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        refs.append(_eager(*(x[rows].transpose(0, 1)[None] for x in (q, k, v)), sinks, D ** -0.5, True, window)[0][0]
                    .transpose(0, 1))
    ref = torch.cat(refs)
    ref_grads = torch.autograd.grad((ref * do.float()).sum(), (q, k, v, sinks))
    assert rel_err(out, ref) < 2e-2
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), grads, ref_grads):
        assert torch.isfinite(got).all() and rel_err(got, want) < 3e-2, name


def test_gpu_decode_shaped_call_with_sinks_runs_the_online_kernel():
    q, k, v, sinks = (x.detach() for x in _inputs(4, 8, 1, 1, 4096, 64, seed=5))
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v, sinks=sinks)
    assert [r["kernel"] for r in seen] == ["_fwd_online"]
    assert rel_err(out, _eager(q, k, v, sinks, 0.125, False)[0]) < 2e-2


def test_gpu_compile_fullgraph_with_sinks():
    torch._dynamo.reset()
    leaves = _inputs(1, 8, 2, 513, 513, 64, seed=9)

    def fn(q, k, v, s):
        return torch.nn.functional.silu(rocmflash.attention(q, k, v, causal=True, sinks=s)).sum(-1)

    eager = fn(*leaves)
    g_eager = torch.autograd.grad(eager.float().square().sum(), leaves)
    out = torch.compile(fn, fullgraph=True)(*leaves)
    g = torch.autograd.grad(out.float().square().sum(), leaves)
    assert rel_err(out, eager) < 2e-2
    for a, b in zip(g, g_eager):
        assert torch.isfinite(a).all() and rel_err(a, b) < 2e-2
    torch._dynamo.reset()
