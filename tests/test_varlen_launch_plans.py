"""Varlen launches replay one launch plan across packings.

A packed batch has new totals, longest sequences and sequence count on every call (training with a new packing
per step, serving prefill). Those reach the kernels as unspecialised integers and through the grid, so one plan
per kernel and layout serves them all: each replay must pass exactly what Triton would be given by a fresh launch
of that call (the recording stand-in ``fake_triton``, from conftest), and anything else that changes (a layout, a
head count, a flag) must go through Triton again.
"""

import itertools

import torch

from rocmflash.config import KernelConfig
from rocmflash.kernels import launch as L
from rocmflash.kernels import masks as M
from rocmflash.kernels.varlen import host as VK

_CFG = KernelConfig(BLOCK_M=32, BLOCK_N=32)
_KERNELS = 5  # forward, dQ, dK/dV, the length check, the safe lists


def _packing(lens_q, lens_k, hq=4, hkv=2, d=64, transposed_q=False):
    """Fresh packed tensors of these sequence lengths, every buffer a launch takes."""
    def rows(total, heads):
        return torch.randn(total, heads, d, dtype=torch.bfloat16)

    tq, tk = sum(lens_q), sum(lens_k)
    q = rows(tq, hq)
    if transposed_q:  # same shape, other strides: (H, T, D) storage read as (T, H, D)
        q = torch.randn(hq, tq, d, dtype=torch.bfloat16).transpose(0, 1)
    k, v = rows(tk, hkv), rows(tk, hkv)
    out, do, dq = rows(tq, hq), rows(tq, hq), rows(tq, hq)
    dk, dv = rows(tk, hkv), rows(tk, hkv)
    lse, delta = torch.randn(hq, tq), torch.randn(hq, tq)
    cu = [torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32) for lens in (lens_q, lens_k)]
    return dict(q=q, k=k, v=v, out=out, do=do, dq=dq, dk=dk, dv=dv, lse=lse, delta=delta, cu_q=cu[0], cu_k=cu[1],
                lens_q=lens_q, lens_k=lens_k)


def _launch_all(p, causal=True, lse=True):
    """Every varlen launch of one training step on packing ``p`` (forward, dQ, dK/dV) and both length kernels."""
    hq, hkv, d = p["q"].shape[1], p["k"].shape[1], p["q"].shape[2]
    batch, max_q, max_k = len(p["lens_q"]), max(p["lens_q"]), max(p["lens_k"])
    call = VK.VarlenCall(batch, hq, hkv, d, max_q, max_k, d ** -0.5, 0.0, M.UNBOUNDED, 0 if causal else M.UNBOUNDED)
    VK.launch_forward(call, p["q"], p["k"], p["v"], p["cu_q"], p["cu_k"], _CFG, p["out"], p["lse"] if lse else None)
    VK.launch_dq(call, p["do"], p["q"], p["k"], p["v"], p["out"], p["lse"], None, p["delta"], p["dq"], p["cu_q"],
                 p["cu_k"], _CFG)
    VK.launch_dkdv(call, p["do"], p["q"], p["k"], p["v"], p["lse"], p["delta"], p["dk"], p["dv"], p["cu_q"],
                   p["cu_k"], _CFG)
    totals = (p["q"].shape[0], p["k"].shape[0])
    VK.launch_length_check(p["cu_q"], p["cu_k"], batch, *totals, max_q, max_k)
    VK.launch_sanitised_lengths(p["cu_q"], p["cu_k"], batch, *totals, max_q, max_k)


def _same(a, b, given: dict):
    """Equal argument lists: the packing's own tensors in the same places, buffers a launch allocates (the safe
    lists) alike in layout, every other value equal."""
    mine = {id(t) for t in given.values() if isinstance(t, torch.Tensor)}

    def alike(x, y):
        if not isinstance(x, torch.Tensor):
            return x == y
        if id(x) in mine or id(y) in mine:
            return x is y
        return (x.shape, x.stride(), x.dtype) == (y.shape, y.stride(), y.dtype)

    return len(a) == len(b) and all(alike(x, y) for x, y in zip(a, b))


def _through_jit(log, p, **kw):
    """What the same launches pass when no plan exists (every one through the JIT)."""
    saved = dict(L._PLANS)
    L._PLANS.clear()
    _launch_all(p, **kw)
    L._PLANS.clear()
    L._PLANS.update(saved)
    return log[-_KERNELS:]


def test_new_packings_replay_with_exactly_what_a_fresh_launch_passes(fake_triton):
    torch.manual_seed(0)
    _launch_all(_packing([37, 5, 64], [40, 9, 64]))
    assert [kind for kind, *_ in fake_triton] == ["jit"] * _KERNELS and len(L._PLANS) == _KERNELS
    packings = ([[37, 5, 64], [40, 9, 64]],  # the same sizes, new tensors
                [[100, 3], [128, 3]],  # fewer sequences, a longer one: another grid, new totals
                [[16, 16, 32, 16], [16, 16, 32, 16]],  # totals divisible by 16 (the LSE's row stride too)
                [[1], [1]],  # a total of 1
                [[300, 7, 0, 22, 91], [310, 1, 0, 30, 100]])  # an empty sequence
    for lens_q, lens_k in packings:
        p = _packing(lens_q, lens_k)
        n = len(fake_triton)
        _launch_all(p)
        replayed = fake_triton[n:]
        assert [kind for kind, *_ in replayed] == ["replay"] * _KERNELS, (lens_q, lens_k)
        for (_, grid_r, args_r), (kind, grid_e, args_e) in zip(replayed, _through_jit(fake_triton, p)):
            assert kind == "jit" and grid_r == grid_e and _same(args_r, args_e, p), (lens_q, lens_k, grid_r, grid_e)
    assert len(L._PLANS) == _KERNELS  # one plan per kernel served every packing


def test_what_the_key_holds_goes_through_triton_again(fake_triton):
    torch.manual_seed(1)
    _launch_all(_packing([37, 5], [40, 9]))
    for p, kw, fresh in ((_packing([50, 2], [50, 2], transposed_q=True), {}, 3),  # q's strides: its 3 kernels
                         (_packing([50, 2], [50, 2], hq=8), {}, 3),  # another head count (the length kernels
                         # read no heads: they replay)
                         (_packing([50, 2], [50, 2]), dict(causal=False), 3),  # another band
                         (_packing([50, 2], [50, 2]), dict(lse=False), 1)):  # the forward without its LSE
        n = len(fake_triton)
        _launch_all(p, **kw)
        kinds = [kind for kind, *_ in fake_triton[n:]]
        assert kinds.count("jit") == fresh, (kw, kinds)


def test_a_plan_keeps_one_runner_per_grid(fake_triton, monkeypatch):
    monkeypatch.setattr(L, "_MAX_RUNNERS", 3)
    _launch_all(_packing([10], [10]))
    plan = next(p for p in L._PLANS.values() if p.grid[0] == 1 and p.grid[1] == 4)  # the forward: one block
    for longest in (40, 70, 100, 130, 160):
        _launch_all(_packing([longest], [longest]))
    assert 0 < len(plan.runners) <= 3
    assert all(grid[0] > 1 for grid in plan.runners)  # other grids only: its own stays its runner
