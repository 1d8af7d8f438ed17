"""torch.library registration: schemas, fake impls, autograd (opcheck), output layouts, on CPU.

``torch.compile(fullgraph=True)`` itself needs a GPU (the interpreter cannot run inside an
Inductor graph); here the pieces it relies on are checked with ``torch.library.opcheck``
(schema, fake tensor, autograd registration, AOT dispatch) and a trace under FakeTensorMode.
"""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rocmflash
import rocmflash.api.ops  # noqa: F401  (registers torch.ops.rocmflash)
from rocmflash.config import KernelConfig

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

CFG = KernelConfig(BLOCK_M=16, BLOCK_N=16).to_json()


def _qkv(B=1, Hq=4, Hkv=2, Sq=19, Sk=23, D=32, dtype=torch.float16, grad=False):
    q = torch.randn(B, Hq, Sq, D, dtype=dtype, requires_grad=grad)
    k = torch.randn(B, Hkv, Sk, D, dtype=dtype, requires_grad=grad)
    v = torch.randn(B, Hkv, Sk, D, dtype=dtype, requires_grad=grad)
    return q, k, v


@pytest.mark.parametrize("config", ["", CFG], ids=["runtime-select", "explicit"])
def test_opcheck_forward(config):
    q, k, v = _qkv(grad=True)
    torch.library.opcheck(torch.ops.rocmflash.attn_fwd.default, (q, k, v, True, 0.2, "online", config))


def test_opcheck_backward():
    q, k, v = _qkv(dtype=torch.bfloat16)
    out, lse = torch.ops.rocmflash.attn_fwd(q, k, v, False, 0.25, "online", CFG)
    do = torch.randn_like(out)
    torch.library.opcheck(torch.ops.rocmflash.attn_bwd.default, (do, q, k, v, out, lse, None, False, 0.25))
    torch.library.opcheck(torch.ops.rocmflash.attn_bwd.default,
                          (do, q, k, v, out, lse, torch.randn_like(lse), False, 0.25))


def test_fake_impl_shapes_and_layouts():
    """Fake outputs have the real outputs' shapes, dtypes and strides (BSHD inputs give BSHD memory)."""
    qb = torch.randn(2, 11, 4, 32, dtype=torch.float16)  # (B, S, H, D)
    kb = torch.randn(2, 13, 2, 32, dtype=torch.float16)
    q, k, v = qb.transpose(1, 2), kb.transpose(1, 2), kb.transpose(1, 2)
    real_out, real_lse = torch.ops.rocmflash.attn_fwd(q, k, v, True, 0.2, "online", CFG)
    assert real_out.transpose(1, 2).is_contiguous()  # (B, S, H, D) memory: transposing back is free
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out, lse = torch.ops.rocmflash.attn_fwd(fq, fk, fv, True, 0.2, "online", CFG)
        dq, dk, dv = torch.ops.rocmflash.attn_bwd(out, fq, fk, fv, out, lse, None, True, 0.2)
    assert out.shape == real_out.shape and out.stride() == real_out.stride() and out.dtype == torch.float16
    assert lse.shape == real_lse.shape and lse.dtype == torch.float32
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    # contiguous (B, H, S, D) inputs give contiguous outputs
    q2, k2, v2 = _qkv()
    o2, _ = torch.ops.rocmflash.attn_fwd(q2, k2, v2, False, 0.2, "online", CFG)
    assert o2.is_contiguous()


def test_make_fx_traces_forward_and_backward_without_breaks():
    """A symbolic trace of forward + backward sees exactly the two rocmflash ops (no fallback)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, k, v, do):
        out, _ = rocmflash.api.ops.attention_op(q, k, v, causal=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
        return out, dq, dk, dv

    q, k, v = _qkv(grad=True)
    do = torch.randn(1, 4, 19, 32, dtype=torch.float16)
    gm = make_fx(step, tracing_mode="fake")(q, k, v, do)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert any("rocmflash.attn_fwd" in t for t in targets), targets
    assert any("rocmflash.attn_bwd" in t for t in targets), targets


def test_empty_inputs():
    q, k, v = _qkv(Sk=0)
    out, lse = torch.ops.rocmflash.attn_fwd(q, k, v, False, 0.2, "online", "")
    assert (out == 0).all() and (lse == float("-inf")).all()
    dq, dk, dv = torch.ops.rocmflash.attn_bwd(torch.randn_like(out), q, k, v, out, lse, None, False, 0.2)
    assert (dq == 0).all() and dk.numel() == 0


def test_api_validation_unchanged():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="variant='nope' is unknown"):
        rocmflash.attention(q, k, v, variant="nope")
    with pytest.raises(ValueError, match="config.variant"):
        rocmflash.attention(q, k, v, variant="online", config=KernelConfig(variant="split_d"))
    with pytest.raises(TypeError, match="causal must be a bool"):
        rocmflash.attention(q, k, v, causal=1)


def test_runtime_selection_in_op_matches_explicit(attention_reference):
    q, k, v = _qkv(dtype=torch.bfloat16)
    out, lse = torch.ops.rocmflash.attn_fwd(q, k, v, True, 1 / math.sqrt(32), "online", "")
    ref, _ = attention_reference(q, k, v, True, 1 / math.sqrt(32))
    assert ((out.double() - ref).norm() / ref.norm()).item() < 2e-2


def test_dynamo_fullgraph_traces_api_and_patched_sdpa():
    """torch.compile(fullgraph=True) traces attention, flash_attn_func and patched SDPA with no graph break.

    backend="aot_eager" runs the captured forward/backward graphs eagerly (the ops run through the
    interpreter); the GPU tests run the same with Inductor.
    """
    import torch.nn.functional as F

    from rocmflash.api.sdpa import patch_sdpa

    torch._dynamo.reset()
    try:
        q, k, v = (torch.randn(1, 2, 17, 32, dtype=torch.float16, requires_grad=True) for _ in range(3))
        fns = [lambda q, k, v: rocmflash.attention(q, k, v, causal=True),
               lambda q, k, v: rocmflash.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                         causal=True).transpose(1, 2)]
        eager = fns[0](q, k, v)
        (gq,) = torch.autograd.grad(eager.float().sum(), (q,))
        for fn in fns:
            out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
            (cq,) = torch.autograd.grad(out.float().sum(), (q,))
            assert torch.allclose(out, eager) and torch.allclose(cq, gq)
        with patch_sdpa():
            sd = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               fullgraph=True, backend="aot_eager")
            assert torch.allclose(sd(q, k, v), eager)
    finally:
        torch._dynamo.reset()


def test_eager_fast_path_skips_the_dispatcher_and_matches_the_op(monkeypatch):
    """Plain eager tensors run the implementation directly; results and gradients equal the op's."""
    calls = {"impl": 0, "eager_fn": 0}
    impl, apply = rocmflash.api.ops._forward_impl, rocmflash.api.ops._EagerAttention.apply

    def counting_impl(*args, **kwargs):
        calls["impl"] += 1
        return impl(*args, **kwargs)

    def counting_apply(*args):
        calls["eager_fn"] += 1
        return apply(*args)

    monkeypatch.setattr(rocmflash.api.ops, "_forward_impl", counting_impl)
    monkeypatch.setattr(rocmflash.api.ops._EagerAttention, "apply", counting_apply)
    q, k, v = _qkv(dtype=torch.bfloat16, grad=True)
    cfg = KernelConfig.from_json(CFG)
    out, lse = rocmflash.attention(q, k, v, causal=True, config=cfg, return_lse=True)
    assert calls == {"impl": 1, "eager_fn": 1}
    do, dlse = torch.randn_like(out), torch.randn_like(lse)
    fast = torch.autograd.grad((out, lse), (q, k, v), (do, dlse))
    o_op, lse_op = torch.ops.rocmflash.attn_fwd(q, k, v, True, 1 / math.sqrt(q.shape[-1]), "online", CFG)
    assert calls["eager_fn"] == 1  # the op went through the dispatcher, not the fast path's Function
    slow = torch.autograd.grad((o_op, lse_op), (q, k, v), (do, dlse))
    assert torch.equal(out, o_op) and torch.equal(lse, lse_op)
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
    with torch.no_grad():  # no gradient: no autograd Function, and no LSE is allocated unless asked
        rocmflash.attention(q, k, v, config=cfg)
    assert calls["eager_fn"] == 1


def test_subclasses_and_modes_still_use_the_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = _qkv(dtype=torch.float16)
    with Record() as mode:
        rocmflash.attention(q, k, v, config=KernelConfig.from_json(CFG))
    assert any("rocmflash.attn_fwd" in name for name in mode.ops), mode.ops
    with FakeTensorMode() as fake:
        fq, fk, fv = (fake.from_tensor(t) for t in (q, k, v))
        out = rocmflash.attention(fq, fk, fv)  # a fake tensor never reaches a kernel
    assert out.shape == q.shape
