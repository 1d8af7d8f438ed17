"""GPU: ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` under torch.compile(fullgraph=True) with Inductor.

The CPU twin (``tests/test_compile_varlen_kvcache_interp.py``) checks the ops with ``aot_eager`` in the interpreter;
here Inductor compiles the graphs around the opaque ops (``rocmflash::varlen_fwd``/``varlen_bwd``,
``rocmflash::kvcache_append_fwd``/``kvcache_fwd``), forward and backward, static and dynamic shapes, and the append's
mutation of the caches (reinplaced or copied back by Inductor) must equal the eager call's.
"""

import pytest
import torch

import rocmflash
from varlen_reference import varlen_fp64

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _packed(lens_q, lens_k, hq=8, hkv=2, d=128, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    return tuple(torch.randn(n, h, d, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
                 for n, h in ((sum(lens_q), hq), (sum(lens_k), hkv), (sum(lens_k), hkv))) + (cu_q, cu_k)


def _varlen_block(q, k, v, cu_q, cu_k, max_q, max_k, w):
    out, lse = rocmflash.flash_attn_varlen_func(q * w, k, v, cu_q, cu_k, max_q, max_k, causal=True, return_lse=True)
    return torch.nn.functional.silu(out).sum(-1), lse  # work around the op for Inductor to fuse


def _varlen_block_fp64(q, k, v, cu_q, cu_k, max_q, max_k, w):
    """``_varlen_block`` in fp64 on the CPU: the reference both the eager and the compiled call must match."""
    out, lse = varlen_fp64(q * w, k, v, cu_q.cpu(), cu_k.cpu(), q.shape[-1] ** -0.5, causal=True)
    return torch.nn.functional.silu(out).sum(-1), lse


RESULTS = ("out", "lse", "dq", "dk", "dv", "dw")


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_gpu_varlen_inductor_fullgraph_forward_backward(dynamic):
    """Eager and Inductor-compiled, forward and backward, each against an fp64 reference of the same inputs
    (a packing with a one-query and an empty sequence); the compiled graph also against the eager call."""
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(_varlen_block, fullgraph=True, dynamic=dynamic)
    shapes = [([300, 1, 777, 0, 64], [300, 513, 777, 9, 64])]
    if dynamic:  # a second packing and new max_seqlen reuse the graph
        shapes.append(([129, 1000], [200, 1000]))
    for lens_q, lens_k in shapes:
        q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, seed=len(lens_q))
        args = (q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), w)
        results = []
        for fn in (_varlen_block, compiled, _varlen_block_fp64):
            if fn is _varlen_block_fp64:
                args = tuple(a.detach().cpu().double().requires_grad_() if a.is_floating_point() else a
                             for a in args[:5]) + args[5:7] + (w.detach().cpu().double().requires_grad_(),)
            out, lse = fn(*args)
            grads = torch.autograd.grad(out.float().square().sum() + lse.sum(), (args[0], args[1], args[2], args[7]))
            results.append((out, lse) + grads)
        eager, comp, ref = results
        for name, e, c, r in zip(RESULTS, eager, comp, ref):
            for label, got in (("eager", e), ("compiled", c)):
                assert torch.isfinite(got).all(), f"{label} {name} {lens_q}: not finite"
                assert _rel(got.cpu(), r) < 2e-2, f"{label} {name} {lens_q}: rel {_rel(got.cpu(), r):.3g} to fp64"
            assert _rel(c, e) < 2e-2, f"compiled {name} {lens_q}: rel {_rel(c, e):.3g} to eager"


def _cache(B, cap, hkv, d, page=0, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if page:
        blocks = B * (cap // page) + 3
        kc, vc = (torch.randn(blocks, page, hkv, d, device="cuda", generator=gen, dtype=torch.bfloat16)
                  for _ in range(2))
        table = torch.randperm(blocks, device="cuda", generator=gen)[:B * (cap // page)].view(B, -1).int()
        return kc, vc, table
    kc, vc = (torch.randn(B, cap, hkv, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
    return kc, vc, None


@pytest.mark.parametrize("page", [0, 64], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_gpu_kvcache_inductor_fullgraph_append(page, dynamic):
    """Decode steps through the compiled function: the outputs, LSE and both caches equal the eager steps'."""
    B, cap, hq, hkv, d = 4, 1024, 32, 8, 128
    kc, vc, table = _cache(B, cap, hkv, d, page)
    kc_c, vc_c = kc.clone(), vc.clone()
    lens = torch.tensor([0, 77, 500, 1000], dtype=torch.int32, device="cuda")

    def step(q, kc, vc, kn, vn, lens, table):
        out, lse = rocmflash.flash_attn_with_kvcache(q * 2, kc, vc, kn, vn, cache_seqlens=lens, block_table=table,
                                                     causal=True, return_softmax_lse=True)
        return out.float().sum(-1), lse, kc.float().sum()  # a read of the cache after the append

    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(3):
        q = torch.randn(B, 1, hq, d, device="cuda", generator=gen, dtype=torch.bfloat16)
        kn, vn = (torch.randn(B, 1, hkv, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
        want = step(q, kc, vc, kn, vn, lens, table)
        got = compiled(q, kc_c, vc_c, kn, vn, lens, table)
        for g, w in zip(got, want):
            assert torch.isfinite(g).all() and _rel(g, w) < 1e-2
        assert torch.equal(kc_c, kc) and torch.equal(vc_c, vc)
        lens = lens + 1
    rocmflash.check_errors()


def test_gpu_kvcache_inductor_fullgraph_read_only():
    B, cap, hq, hkv, d = 2, 2048, 16, 2, 64
    kc, vc, _ = _cache(B, cap, hkv, d, seed=3)
    q = torch.randn(B, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([1500, 2048], dtype=torch.int32, device="cuda")
    fn = lambda q, kc, vc, lens: rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)  # noqa: E731
    before = kc.clone()
    got = torch.compile(fn, fullgraph=True)(q, kc, vc, lens)
    assert _rel(got, fn(q, kc, vc, lens)) < 1e-2 and torch.equal(kc, before)
