"""Backward kernels (dQ, dK, dV) against fp64 autograd reference gradients, on CPU (interpreter).

Small awkward shapes: odd lengths, Sq != Sk both ways (causal rows that see no key),
GQA/MQA (dK/dV summed over the group), power-of-two and padded head dims, strided
inputs. Inputs are fresh ``torch.randn`` (never zeros), gradient outputs are poisoned
with NaN before the launch so an unwritten element fails.
"""

import math
import warnings

import pytest
import torch

import rocmflash
from rocmflash.config import KernelConfig
from rocmflash.kernels import get_variant
from rocmflash.kernels.backward.host import BwdConfig, backward, check_head_dim, default_bwd_config

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
K = KernelConfig
SMALL = BwdConfig(K(BLOCK_M=16, BLOCK_N=16), K(BLOCK_M=16, BLOCK_N=16))
MIXED = BwdConfig(K(BLOCK_M=16, BLOCK_N=32), K(BLOCK_M=32, BLOCK_N=16))

# (B, Hq, Hkv, Sq, Sk, D)
SHAPES = [
    (1, 2, 2, 17, 17, 16),
    (1, 4, 1, 33, 47, 64),    # MQA, Sq < Sk
    (1, 4, 2, 41, 23, 32),    # GQA 2, Sq > Sk: causal rows with no key
    (2, 2, 1, 20, 35, 80),    # non-power-of-two head dim (padded to 128)
    (1, 2, 2, 1, 29, 128),    # single query
    (1, 1, 1, 9, 18, 256),
]


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


def _reference_grads(q, k, v, do, causal, scale, ref_fn, dlse=None):
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    out, lse = ref_fn(qd, kd, vd, causal, scale)
    loss = (out * do.double()).sum()
    if dlse is not None:
        fin = torch.isfinite(lse)
        loss = loss + (torch.where(fin, lse, torch.zeros_like(lse)) * dlse.double()).sum()
    loss.backward()
    return qd.grad, kd.grad, vd.grad


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}x{}S{}x{}D{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_backward_matches_fp64_reference(shape, causal, dtype, attention_reference):
    B, Hq, Hkv, Sq, Sk, D = shape
    g = torch.Generator().manual_seed(hash((shape, causal, str(dtype))) % 2**31)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Sk, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Sk, D, generator=g).to(dtype)
    do = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    scale = 1.0 / math.sqrt(D)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Sq), float("nan"))
    get_variant("online").launch(q, k, v, K(BLOCK_M=16, BLOCK_N=16), causal, scale, out=out, lse=lse)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    cfg = SMALL if (SHAPES.index(shape) + causal) % 2 == 0 else MIXED
    backward(do, q, k, v, out, lse, causal, scale, config=cfg, dq=dq, dk=dk, dv=dv)
    refs = _reference_grads(q, k, v, do, causal, scale, attention_reference)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        assert torch.isfinite(got).all(), f"{name}: unwritten or non-finite elements"
        assert got.dtype == dtype
        if ref.norm() == 0:  # e.g. keys no query sees
            assert (got == 0).all(), name
            continue
        err = _rel(got, ref)
        assert err <= TOL[dtype], f"{name}: relative error {err:.3e} > {TOL[dtype]}"


def test_autograd_through_attention_gqa_strided_and_lse(attention_reference):
    """rocmflash.attention is differentiable: strided GQA inputs, custom scale, a gradient through LSE."""
    torch.manual_seed(1)
    base = torch.randn(1, 27, 4, 2 * 32, dtype=torch.float16)  # (B, S, H, 2D): strided views
    q = base[..., :32].transpose(1, 2).detach().requires_grad_()
    kv = torch.randn(1, 2, 31, 64, dtype=torch.float16)
    k = kv[..., ::2].detach().requires_grad_()
    v = kv[..., 1::2].detach().requires_grad_()
    out, lse = rocmflash.attention(q, k, v, causal=True, softmax_scale=0.3, return_lse=True,
                                   config=KernelConfig(BLOCK_M=16, BLOCK_N=16))
    do = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    ((out * do).sum() + (lse * dlse).sum()).backward()
    refs = _reference_grads(q, k, v, do, True, 0.3, attention_reference, dlse=dlse)
    for name, got, ref in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), refs):
        assert got.shape == ref.shape
        assert _rel(got, ref) <= 1e-2, name


def test_flash_attn_func_backward(attention_reference):
    torch.manual_seed(2)
    q = torch.randn(2, 19, 4, 48, dtype=torch.bfloat16, requires_grad=True)  # (B, S, H, D), D padded to 64
    k = torch.randn(2, 25, 1, 48, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 25, 1, 48, dtype=torch.bfloat16, requires_grad=True)
    out = rocmflash.flash_attn_func(q, k, v, causal=True)
    do = torch.randn_like(out)
    out.backward(do)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    refs = _reference_grads(t(q), t(k), t(v), t(do), True, 1 / math.sqrt(48), attention_reference)
    for got, ref in zip((q.grad, k.grad, v.grad), refs):
        assert _rel(t(got), ref) <= 2e-2


def test_unsupported_head_dim_is_a_clear_error():
    with pytest.raises(ValueError, match=r"supported head dims are 16\.\.256"):
        check_head_dim(8)
    with pytest.raises(ValueError, match="head dim 320"):
        check_head_dim(320)


@pytest.mark.parametrize("arch", [None, "sm_90", "sm_80", "gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("head_dim", [16, 64, 80, 128, 192, 256])
def test_default_bwd_configs_validate(arch, head_dim):
    cfg = default_bwd_config(arch, head_dim).validate()
    assert cfg.dkdv.BLOCK_N >= 16 and cfg.dq.BLOCK_M >= 16


@pytest.mark.parametrize("splits", [2, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_head_splits_match_reference_and_unsplit(splits, causal, attention_reference):
    """dK/dV with the GQA group split over programs (fp32 partials, one sum) equal the unsplit result."""
    B, Hq, Hkv, Sq, Sk, D = 2, 8, 2, 37, 29, 32
    g = torch.Generator().manual_seed(1234 + splits + 10 * causal)
    q, do = (torch.randn(B, Hq, Sq, D, generator=g).to(torch.float16) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Sk, D, generator=g).to(torch.float16) for _ in range(2))
    scale = 1.0 / math.sqrt(D)
    out, lse = torch.full_like(q, float("nan")), torch.full((B, Hq, Sq), float("nan"))
    get_variant("online").launch(q, k, v, K(BLOCK_M=16, BLOCK_N=16), causal, scale, out=out, lse=lse)
    grads = {}
    for s in (1, splits):
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        cfg = BwdConfig(SMALL.dkdv, SMALL.dq, head_splits=s)
        backward(do, q, k, v, out, lse, causal, scale, config=cfg, dq=dq, dk=dk, dv=dv)
        grads[s] = (dq, dk, dv)
    refs = _reference_grads(q, k, v, do, causal, scale, attention_reference)
    for i, name in enumerate(("dq", "dk", "dv")):
        assert torch.isfinite(grads[splits][i]).all(), name
        assert _rel(grads[splits][i], refs[i]) <= TOL[torch.float16], name
        # fp32 partials summed once vs registers: equal up to one fp16 rounding
        assert torch.allclose(grads[splits][i].float(), grads[1][i].float(), rtol=2e-3, atol=2e-3), name


def test_head_splits_that_do_not_divide_the_group_are_refused(attention_reference):
    q = torch.randn(1, 6, 8, 16).half()
    k = v = torch.randn(1, 2, 8, 16).half()
    out, lse = torch.empty_like(q), torch.empty(1, 6, 8)
    get_variant("online").launch(q, k, v, K(BLOCK_M=16, BLOCK_N=16), False, 0.25, out=out, lse=lse)
    with pytest.raises(ValueError, match="head_splits=2 must divide the GQA group size 3"):
        backward(torch.randn_like(q), q, k, v, out, lse, False, 0.25,
                 config=BwdConfig(SMALL.dkdv, SMALL.dq, head_splits=2))
    with pytest.raises(ValueError, match="head_splits must be an int >= 0"):
        BwdConfig(SMALL.dkdv, SMALL.dq, head_splits=-1).validate()


@pytest.mark.parametrize("batch, heads_kv, group, seqlen_k, expected", [
    (1, 8, 4, 1025, 1),     # 17 key blocks x 8 heads = 136 programs >= 132 SMs: one wave already
    (1, 8, 8, 1024, 2),     # 16 x 8 = 128 programs < 132: 2 -> 256
    (1, 1, 32, 2048, 8),    # MQA: 32 programs; 4 -> 128 is short, 8 -> 256
    (4, 8, 1, 1024, 1),     # no GQA: nothing to split
    (1, 1, 6, 256, 6),      # 4 programs: the whole group is not enough either
])
def test_choose_head_splits(batch, heads_kv, group, seqlen_k, expected):
    from rocmflash.kernels.backward.host import choose_head_splits

    got = choose_head_splits(batch, heads_kv, group, seqlen_k, block_n=64, compute_units=132)
    assert got == expected and group % got == 0
