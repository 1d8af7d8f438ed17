"""GPU: the torch ops under torch.compile(fullgraph=True) with Inductor, forward and backward; opcheck."""

import pytest
import torch
import torch.nn.functional as F

import rocmflash
import rocmflash.api.ops  # noqa: F401
from rocmflash.api.sdpa import patch_sdpa

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _qkv(B=2, Hq=8, Hkv=2, S=1024, D=128, dtype=torch.bfloat16):
    dev = "cuda"
    return (torch.randn(B, Hq, S, D, device=dev, dtype=dtype, requires_grad=True),
            torch.randn(B, Hkv, S, D, device=dev, dtype=dtype, requires_grad=True),
            torch.randn(B, Hkv, S, D, device=dev, dtype=dtype, requires_grad=True))


def test_gpu_opcheck():
    q, k, v = _qkv(B=1, Hq=4, Hkv=2, S=257, D=64)
    torch.library.opcheck(torch.ops.rocmflash.attn_fwd.default, (q, k, v, True, 0.125, "online", ""))


def _block(q, k, v, w):
    # a little projection around attention, so Inductor fuses something around the op
    o = rocmflash.attention(q * w, k, v, causal=True)
    return torch.nn.functional.silu(o).sum(dim=-1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_gpu_compile_fullgraph_forward_backward(dynamic):
    torch._dynamo.reset()
    q, k, v = _qkv()
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    eager = _block(q, k, v, w)
    g_eager = torch.autograd.grad(eager.float().square().sum(), (q, k, v, w))
    compiled = torch.compile(_block, fullgraph=True, dynamic=dynamic)
    out = compiled(q, k, v, w)
    g = torch.autograd.grad(out.float().square().sum(), (q, k, v, w))
    assert _rel(out, eager) < 2e-2
    for a, b in zip(g, g_eager):
        assert torch.isfinite(a).all() and _rel(a, b) < 2e-2
    if dynamic:  # a second sequence length reuses the graph (no recompile per length)
        q2, k2, v2 = _qkv(S=777)
        out2 = compiled(q2, k2, v2, w)
        assert _rel(out2, _block(q2, k2, v2, w)) < 2e-2
    torch._dynamo.reset()


def test_gpu_compile_fullgraph_patched_sdpa():
    torch._dynamo.reset()
    q, k, v = _qkv(Hkv=8)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with patch_sdpa():
        fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), fullgraph=True)
        out = fn(q, k, v)
        out.float().sum().backward()
    assert _rel(out, ref) < 2e-2 and torch.isfinite(q.grad).all()
    torch._dynamo.reset()


def test_gpu_flash_attn_func_matches_sdpa_with_grads():
    q, k, v = (torch.randn(2, 2048, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = rocmflash.flash_attn_func(q, k, v, causal=True)
    do = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k, v), do)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    ref = F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True)
    g_ref = torch.autograd.grad(ref, (q, k, v), t(do))
    assert _rel(out, t(ref)) < 2e-2
    for a, b in zip(g, g_ref):
        assert _rel(a, b) < 2e-2
