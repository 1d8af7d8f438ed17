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
from rocmflash.kernels import launch as L
from rocmflash.kernels.backward.host import _bwd_dq


def _key(tensors, scalars=(), backend="cuda", cfg=KernelConfig()):
    return C.launch_key(_bwd_dq, scalars, tensors, cfg, backend)


def test_key_tracks_alignment_dtype_shape_strides_and_scalars():
    base = torch.empty(64, dtype=torch.float16)
    aligned, shifted = base[:32], base[1:33]  # 2 bytes apart: only one is 16-byte aligned
    assert aligned.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 != 0
    k0 = _key((aligned,), (True, 0.125))
    assert k0 == _key((torch.empty(64, dtype=torch.float16)[:32],), (True, 0.125))  # same specialisation
    assert k0 != _key((shifted,), (True, 0.125))
    assert k0 != _key((aligned.to(torch.bfloat16),), (True, 0.125))
    assert k0 != _key((base[:16],), (True, 0.125))  # another shape
    assert k0 != _key((base[:64:2],), (True, 0.125))  # another stride
    assert k0 != _key((aligned,), (False, 0.125))
    assert k0 != _key((aligned,), (True, 0.5))
    assert k0 != _key((aligned,), (True, 0.125), cfg=KernelConfig(BLOCK_M=32))
    assert k0 != _key((aligned,), (True, 0.125), backend="hip")


def test_key_on_hip_tracks_the_2gib_buffer_bit(monkeypatch):
    small = torch.empty(16, dtype=torch.float16)
    monkeypatch.setattr(L, "MAX_INT32", 64)  # pretend 2 GiB is 64 bytes: a 128-byte storage is "large"
    large_view = torch.empty(64, dtype=torch.float16)[:16]  # same shape/stride/alignment, 128-byte storage
    assert _key((small,), backend="hip") != _key((large_view,), backend="hip")
    assert _key((small,), backend="cuda") == _key((large_view,), backend="cuda")


def test_a_kept_key_is_equal_to_and_hashes_like_the_plain_key():
    """``KeptKey`` (a key hashed once, kept by kv_decode.launch) finds plans stored under the plain key and back."""
    t = torch.empty(16, dtype=torch.float16)
    plain = _key((t,), (True, 0.125))
    kept = C.KeptKey(plain)
    assert kept == plain and hash(kept) == hash(plain)
    assert {plain: "plan"}.get(kept) == "plan" and {kept: "plan"}.get(plain) == "plan"
    assert kept != _key((t,), (False, 0.125))


def _same_args(a, b):
    return len(a) == len(b) and all(x is y if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


def test_replayed_launches_pass_exactly_what_triton_would_be_given(fake_triton):
    """Forward and both backward kernels: each replay's arguments equal a fresh build's, for new
    tensors (same key), and a new shape, stride, scale or flag goes through Triton again."""
    from rocmflash.kernels.backward import host as kb
    from rocmflash.kernels import get_variant

    cfg = KernelConfig(BLOCK_M=32, BLOCK_N=32)
    bcfg = kb.default_bwd_config(None, 64)

    def tensors(S, transposed=False):
        shape = (2, S, 4, 64) if transposed else (2, 4, S, 64)
        q, k, v, out, do = (torch.randn(shape, dtype=torch.bfloat16) for _ in range(5))
        if transposed:
            q, k, v, out, do = (t.transpose(1, 2) for t in (q, k, v, out, do))
        lse, delta = torch.randn(2, 4, S), torch.randn(2, 4, S)
        return q, k, v, out, do, lse, delta

    def calls(ts, scale, causal):
        q, k, v, out, do, lse, delta = ts
        dq, dk, dv = ts_grads[id(ts)]
        get_variant("online").launch(q, k, v, cfg, causal, scale, out=out, lse=lse)
        kb.launch_dq(q, k, v, out, do, lse, None, delta, dq, causal, scale, bcfg.dq, "cuda")
        kb.launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, bcfg.dkdv, 1, "cuda")

    ts_grads = {}

    def new(S, transposed=False):
        ts = tensors(S, transposed)
        ts_grads[id(ts)] = tuple(torch.empty_like(t) for t in ts[:3])
        return ts

    def through_jit(ts, scale, causal):
        """What the same calls pass when no plan exists: every launch through the JIT."""
        saved = dict(L._PLANS)
        L._PLANS.clear()
        calls(ts, scale, causal)
        L._PLANS.clear()
        L._PLANS.update(saved)
        return fake_triton[-3:]

    calls(new(64), 0.125, True)
    assert [kind for kind, *_ in fake_triton] == ["jit"] * 3 and len(L._PLANS) == 3
    for _ in range(2):  # new tensors, same key: replayed with this call's tensors in their places
        ts = new(64)
        n = len(fake_triton)
        calls(ts, 0.125, True)
        replayed = fake_triton[n:]
        assert [kind for kind, *_ in replayed] == ["replay"] * 3
        for (_, grid_r, args_r), (_, grid_e, args_e) in zip(replayed, through_jit(ts, 0.125, True)):
            assert grid_r == grid_e and _same_args(args_r, args_e)
    for S, scale, causal, transposed in ((96, 0.125, True, False), (64, 0.5, True, False),
                                         (64, 0.125, False, False), (64, 0.125, True, True)):
        n = len(fake_triton)
        calls(new(S, transposed), scale, causal)
        assert [kind for kind, *_ in fake_triton[n:]] == ["jit"] * 3, (S, scale, causal, transposed)


def test_a_tensor_argument_outside_the_key_is_never_replayed(fake_triton):
    a, b = torch.randn(4), torch.randn(4)
    hidden = torch.randn(4)
    build = lambda: ((1,), {"Q": a, "K": hidden}, {})  # noqa: E731  K is not among the call's tensors

    class _Fn:
        arg_names = ("Q", "K")

    for _ in range(2):
        C.launch_cached(_Fn, (), (a, b), build, KernelConfig(), "cuda")
    assert [kind for kind, *_ in fake_triton] == ["jit", "jit"] and not L._PLANS


class _TwoTensorFn:
    arg_names = ("CU_Q", "CU_K")


def test_a_plan_made_with_one_tensor_in_two_places_never_serves_two_tensors(fake_triton):
    """Self-attention packing passes one ``cu_seqlens`` as both ``cu_seqlens_q`` and ``cu_seqlens_k``. A plan made
    from that call must not replay a later call with two tensors of the same shapes: it would pass ``cu_q`` as
    ``CU_K`` (the varlen backward then reads every sequence's keys from the query offsets). The aliasing is in
    the key: each kind of call gets its own plan, and each replay passes that call's own tensors."""
    def launch(a, b):
        C.launch_cached(_TwoTensorFn, (), (a, b), lambda: ((1,), {"CU_Q": a, "CU_K": b}, {}), KernelConfig(), "cuda")
        return fake_triton[-1]

    one = torch.arange(4, dtype=torch.int32)
    launch(one, one)
    for _ in range(2):
        a, b = torch.arange(4, dtype=torch.int32), torch.arange(4, dtype=torch.int32) * 2
        kind, _, args = launch(a, b)
        assert args[0] is a and args[1] is b, kind
        same = torch.arange(4, dtype=torch.int32)
        kind, _, args = launch(same, same)
        assert args[0] is same and args[1] is same, kind
    assert [kind for kind, *_ in fake_triton] == ["jit", "jit", "replay", "replay", "replay"]


def test_kept_keys_are_per_aliasing_through_their_callers_signatures():
    """``kept_key``'s callers promise their tensors' layout per signature; which arguments are one tensor is part
    of it: the decode and fp8 signatures differ when k_cache is v_cache (or the descales are one tensor), so a
    key kept for one never serves the other; and the launch key itself holds the aliasing."""
    from rocmflash.api import decode as AD
    from rocmflash.api import fp8_plans as FP

    a, b = (torch.empty(2, 64, 2, 16, dtype=torch.float16) for _ in range(2))
    q = torch.empty(2, 1, 4, 16, dtype=torch.float16)
    lens = torch.full((2,), 5, dtype=torch.int32)

    def sig(kc, vc):  # the tensors as flash_attn_with_kvcache passes them
        return AD._signature("cuda", (q, kc, vc, None, None, lens, None, None, None, None, None, None),
                             (None, True, 0.0, 0, False), (-1, -1))

    assert sig(a, a) != sig(a, b) and sig(a, b) == sig(b, a) and sig(a, a) == sig(b, b)
    assert AD._length_free(sig(a, a)) != AD._length_free(sig(a, b))
    s1, s2 = (torch.ones(2, 2) for _ in range(2))
    fsig = lambda ks, vs: FP.signature(q, a, b, True, None, False, (ks, vs), None, "bshd")  # noqa: E731
    assert fsig(s1, s1) != fsig(s1, s2) and fsig(s1, s2) == fsig(s2, s1)
    one, x, y = (torch.empty(16, dtype=torch.float16) for _ in range(3))
    assert C.launch_key(_bwd_dq, (), (one, one), KernelConfig(), "cuda") != \
        C.launch_key(_bwd_dq, (), (x, y), KernelConfig(), "cuda")
    assert L.alias_pattern((one, x, one, None, None)) == (0, 1, 0, 3, 3) and L.alias_pattern((one, x)) == ()


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
    from rocmflash.api.selection import NO_INCUMBENT_ENV

    monkeypatch.setenv(NO_INCUMBENT_ENV, "1")  # rocmflash's kernels, whatever the shipped entry says of SDPA here
    monkeypatch.setattr(L, "FAST_LAUNCH", False)
    L._PLANS.clear()
    jit = _step(*leaves, do, causal)
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    first = _step(*leaves, do, causal)  # fills the cache through Triton
    assert L._PLANS, "nothing was cached"
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


def _varlen_step(lens_q, lens_k, shared_cu: bool, seed: int):
    """A packed causal GQA call's out, dq, dk, dv and its fp64 reference's (on the CPU)."""
    from varlen_reference import varlen_fp64

    gen = torch.Generator(device="cuda").manual_seed(seed)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = cu_q if shared_cu else \
        torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(sum(n), h, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
               for n, h in ((lens_q, 8), (lens_k, 2), (lens_k, 2)))
    do = torch.randn(q.shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    out = rocmflash.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    got = (out,) + torch.autograd.grad(out, leaves, do)
    ref_leaves = [t.detach().cpu().double().requires_grad_() for t in leaves]
    ref, _ = varlen_fp64(*ref_leaves, cu_q.cpu(), cu_k.cpu(), 128 ** -0.5, causal=True)
    return got, (ref,) + torch.autograd.grad(ref, ref_leaves, do.cpu().double())


@pytest.mark.gpu
@pytest.mark.usefixtures("compiled")
def test_gpu_varlen_plans_of_a_shared_cu_seqlens_never_serve_separate_ones(monkeypatch):
    """The regression: self-attention packing (one ``cu_seqlens`` for queries and keys) made the varlen kernels'
    plans, and a later call with separate ``cu_seqlens_q``/``cu_seqlens_k`` of the same heads was replayed with
    ``cu_q`` in ``CU_K``'s place (dK/dV wrong, rel 1.0, found by the GPU test chain). Every call, whichever came
    first, within bf16 error of fp64."""
    from rocmflash.api.selection import NO_INCUMBENT_ENV

    monkeypatch.setenv(NO_INCUMBENT_ENV, "1")  # rocmflash's kernels, whatever a shipped entry says of torch's
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    L._PLANS.clear()
    calls = [([300, 0, 1025, 77], None), ([300, 1, 777, 0, 64], [300, 513, 777, 9, 64]), ([129, 64], None),
             ([64, 1000], [200, 1000])]
    for seed, (lens_q, lens_k) in enumerate(calls * 2):
        got, want = _varlen_step(lens_q, lens_k or lens_q, lens_k is None, seed)
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
            err = ((g.cpu().double() - w).norm() / w.norm()).item()
            assert err < 2e-2, f"{name} of {lens_q}/{lens_k}: relative error {err:.3g} to fp64"
    assert L._PLANS, "no launch was kept: the replays were not tested"
