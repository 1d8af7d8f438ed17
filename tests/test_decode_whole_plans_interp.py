"""A decode-shaped dense call keeps its decode plan under a short key (``attend_whole_cache``'s ``owner``: the
dense call's own plan, plus what that plan's key leaves out) instead of the whole signature. The key must
still tell apart every call that needs another plan -- K/V laid out otherwise under the same shapes, another
scale, the LSE wanted or not -- and a new tune's ``clear_cache`` must forget it. Triton's interpreter (CPU);
every output against fp64 on fresh random inputs."""

import math

import pytest
import torch

from test_decode_routing_interp import _ref
from varlen_reference import rel_err

TOL = 1e-2  # fp16


def _inputs(seed, B=2, Sq=1, Sk=300, Hq=8, Hkv=2, D=32, kv_bshd=False):
    """q (B, Hq, Sq, D) contiguous; k, v (B, Hkv, Sk, D), contiguous or views of (B, Sk, Hkv, D) memory."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=gen).half()
    if kv_bshd:
        k, v = (torch.randn(B, Sk, Hkv, D, generator=gen).half().transpose(1, 2) for _ in range(2))
    else:
        k, v = (torch.randn(B, Hkv, Sk, D, generator=gen).half() for _ in range(2))
    return q, k, v


def _call(q, k, v, scale=None, lse=False):
    """``rocmflash.attention`` through the dense route's plan, its output checked against fp64."""
    import rocmflash
    from rocmflash.api import ops

    got = rocmflash.attention(q, k, v, softmax_scale=scale, return_lse=lse)
    out = got[0] if lse else got
    s = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    ref, ref_lse = _ref(q.double() * (s * math.sqrt(q.shape[-1])), k, v, False)  # _ref scales by 1/sqrt(D)
    assert torch.isfinite(out).all() and rel_err(out, ref) < TOL, rel_err(out, ref)
    if lse:
        assert (got[1].double() - ref_lse).abs().max() < 1e-3
    return ops._call_plan(q, k, False)


@pytest.fixture
def fresh_plans(interpret):
    from rocmflash.api import decode as Dm
    from rocmflash.api import selection

    selection.clear_cache()
    Dm.clear_cache()
    yield Dm
    Dm.clear_cache()


def _kept_for(Dm, owner) -> list:
    return [key for key in Dm._WHOLE_PLANS if key[0] is owner]


def test_a_repeat_call_is_served_from_its_kept_plan(fresh_plans, monkeypatch):
    Dm = fresh_plans
    q, k, v = _inputs(1)
    owner = _call(q, k, v)  # first call: checked, nothing kept
    assert not _kept_for(Dm, owner)
    _call(q, k, v)  # second: the signature's plan is kept, and so is its short key
    assert len(_kept_for(Dm, owner)) == 1
    # the third call does not build the signature: it finds the plan by its short key
    monkeypatch.setattr(Dm, "_signature", lambda *a, **kw: pytest.fail("signature built on a kept call"))
    for seed in (2, 3):
        q2, k2, v2 = _inputs(seed)
        assert _call(q2, k2, v2) is owner


def test_another_kv_layout_under_the_same_shapes_gets_its_own_plan(fresh_plans):
    """The dense plan's key holds k's shape, not its strides: contiguous K/V and (B, S, H, D) views share the
    owner, and each must be served by a plan made for its own strides."""
    Dm = fresh_plans
    for kv_bshd in (False, True, False, True):
        owner = _call(*_inputs(10 + kv_bshd, kv_bshd=kv_bshd))
    strides = {key[1] for key in _kept_for(Dm, owner)}
    assert len(strides) == 2, strides
    for seed, kv_bshd in ((20, True), (21, False)):  # fresh values through both kept plans
        _call(*_inputs(seed, kv_bshd=kv_bshd))


def test_the_scale_and_the_lse_are_part_of_the_key(fresh_plans):
    Dm = fresh_plans
    q, k, v = _inputs(30)
    for scale, lse in ((None, False), (0.05, False), (None, True), (0.05, True)):
        for _ in range(2):
            owner = _call(q, k, v, scale=scale, lse=lse)
    assert len(_kept_for(Dm, owner)) == 4
    _call(*_inputs(31), scale=0.05)  # and each still gives its own answer
    _call(*_inputs(32), lse=True)


def test_clear_cache_forgets_the_kept_plans(fresh_plans):
    """A decode tune in this process calls ``clear_cache``: a kept plan would serve the old config."""
    Dm = fresh_plans
    q, k, v = _inputs(40)
    for _ in range(2):
        _call(q, k, v)
    assert Dm._WHOLE_PLANS
    Dm.clear_cache()
    assert not Dm._WHOLE_PLANS


def test_on_rocm_the_key_holds_the_2gib_bits(fresh_plans, monkeypatch):
    """Triton specialises AMD buffer loads on a storage under 2 GiB: a view of a larger buffer needs its own plan."""
    Dm = fresh_plans
    from rocmflash.kernels import common as C

    q, k, v = _inputs(50)
    monkeypatch.setattr(C, "torch_backend", lambda: "hip")
    key = Dm._whole_cache_key(object(), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, False)
    assert key[-3:] == (True, True, True)
    monkeypatch.setattr(C, "torch_backend", lambda: "cuda")
    assert len(Dm._whole_cache_key(object(), q, k, v, None, False)) == len(key) - 3
