"""All four kernel variants against an fp64 reference, on CPU through Triton's interpreter.

Small but awkward shapes: odd lengths (1, 17, 33, 65, 97, 1025), Sq != Sk both ways,
head dims 16/64/80/96/128/160/256, GQA ratios 1/4/8, causal both, fp16 and bf16. Inputs
are fresh ``torch.randn``; outputs and LSE are poisoned with NaN before every launch, so
an unwritten element fails the finiteness check.
"""

import math
import warnings

import pytest
import torch

from rocmflash.config import KernelConfig
from rocmflash.kernels import get_variant

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}

# (B, Hq, Hkv, Sq, Sk, D)
SHAPES = [
    (1, 2, 2, 17, 17, 16),
    (2, 4, 1, 33, 97, 64),     # GQA 4, Sq < Sk
    (1, 8, 1, 97, 33, 80),     # GQA 8 (MQA), Sq > Sk: causal rows with no key
    (1, 2, 2, 1, 65, 128),     # decode-like single query
    (1, 2, 1, 65, 1, 160),     # single key
    (1, 1, 1, 33, 33, 256),
    (1, 2, 2, 49, 50, 96),
]

# small tiles so that the loops, tails and diagonal blocks all run several times
VARIANT_CFGS = {
    "online": [KernelConfig(BLOCK_M=32, BLOCK_N=16), KernelConfig(BLOCK_M=16, BLOCK_N=32, PRE_LOAD_V=True)],
    "split_kv": [KernelConfig(BLOCK_M=32, BLOCK_N=16, variant="split_kv", num_splits=3),
                 KernelConfig(BLOCK_M=16, BLOCK_N=16, variant="split_kv", num_splits=0)],
    "two_phase": [KernelConfig(BLOCK_M=32, BLOCK_N=16, variant="two_phase"),
                  KernelConfig(BLOCK_M=16, BLOCK_N=32, variant="two_phase", PRE_LOAD_V=True)],
    "split_d": [KernelConfig(BLOCK_M=32, BLOCK_N=16, variant="split_d", d_chunks=2),
                KernelConfig(BLOCK_M=16, BLOCK_N=32, variant="split_d", d_chunks=4, PRE_LOAD_V=True)],
}


def _check(variant, cfg, shape, causal, dtype, ref_fn, scale=None, seed=0):
    B, Hq, Hkv, Sq, Sk, D = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Sk, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Sk, D, generator=g).to(dtype)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Sq), float("nan"), dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy exp2/log2 of -inf in the interpreter
        get_variant(variant).launch(q, k, v, cfg, causal, scale, out=out, lse=lse)
    ref, ref_lse = ref_fn(q, k, v, causal, scale)
    assert torch.isfinite(out).all(), "unwritten or non-finite output elements"
    assert out.dtype == dtype
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-12)).item()
    assert err <= TOL[dtype], f"relative error {err:.3e} > {TOL[dtype]}"
    finite = torch.isfinite(ref_lse)
    assert not torch.isnan(lse).any(), "unwritten LSE elements"
    assert torch.equal(torch.isfinite(lse), finite), "LSE -inf pattern differs from the reference"
    assert (lse[~finite] == float("-inf")).all()
    if finite.any():
        assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < 1e-3
    if (~finite).any():  # rows with no allowed key produce exact zeros
        assert (out.float().permute(0, 1, 2, 3)[~finite] == 0).all()


@pytest.mark.parametrize("variant", list(VARIANT_CFGS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}x{}S{}x{}D{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_variant_matches_reference(variant, shape, causal, dtype, attention_reference):
    # alternate the two configs of each variant over the grid
    idx = (SHAPES.index(shape) + causal + (dtype == torch.bfloat16)) % 2
    seed = hash((variant, shape, causal, str(dtype))) % 2**31
    _check(variant, VARIANT_CFGS[variant][idx], shape, causal, dtype, attention_reference, seed=seed)


@pytest.mark.parametrize("variant", list(VARIANT_CFGS))
def test_long_odd_sequence(variant, attention_reference):
    """S = 1025: one past a power of two, many blocks, causal."""
    cfg = KernelConfig(BLOCK_M=64, BLOCK_N=64, variant=variant, num_splits=4)
    _check(variant, cfg, (1, 1, 1, 1025, 1025, 16), True, torch.float16, attention_reference)


@pytest.mark.parametrize("variant", list(VARIANT_CFGS))
@pytest.mark.parametrize("D", [72, 80, 192])
def test_head_dim_padding_mode(variant, D, attention_reference):
    """``pad_head_dim=True`` (next power of two) agrees with the reference as the split does."""
    cfg = KernelConfig(BLOCK_M=32, BLOCK_N=32, variant=variant, pad_head_dim=True)
    _check(variant, cfg, (1, 2, 1, 40, 45, D), True, torch.bfloat16, attention_reference)


def test_softmax_scale_is_used(attention_reference):
    cfg = KernelConfig(BLOCK_M=32, BLOCK_N=16)
    _check("online", cfg, (1, 2, 2, 33, 40, 64), False, torch.float16, attention_reference, scale=0.37)


@pytest.mark.parametrize("D", [128, 112, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("plv", [False, True], ids=["", "plv"])
def test_online_head_dim_halves(D, causal, plv, attention_reference):
    """An AMD occupancy target (``waves_per_eu=2``) runs a power-of-two D as two halves (online._halve_head_dim).

    D=112 pads to 128 and masks the second half's last 16 columns; D=256 becomes 128 + 128.
    """
    from rocmflash.kernels.forward import online as online

    cfg = KernelConfig(BLOCK_M=32, BLOCK_N=64, num_warps=1, waves_per_eu=2, PRE_LOAD_V=plv)
    pieces = online._constexprs(cfg, D, causal, True)
    assert (pieces["BLOCK_D0"], pieces["BLOCK_D1"]) == (max(128, D) // 2,) * 2
    dtype = torch.bfloat16 if plv else torch.float16
    _check("online", cfg, (1, 2, 1, 70, 75, D), causal, dtype, attention_reference, seed=D + causal)


@pytest.mark.parametrize("nonkdim", [0, 16], ids=["masked-first", "masked-last"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 2, 1, 150, 333, 128), (1, 1, 1, 290, 170, 192)], ids=["Sq<Sk", "Sq>Sk"])
def test_online_wide_tile_half_masked_blocks(nonkdim, causal, shape, attention_reference):
    """AMD's 128x128 w4 wpe2 tile runs its masked blocks 64 keys wide, before the unmasked loop
    except with 16x16 MFMAs (online._masked_blocks): diagonal, key tail, rows with no key (Sq > Sk)."""
    from rocmflash.kernels.forward import online as online

    cfg = KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=1, waves_per_eu=2,
                       matrix_instr_nonkdim=nonkdim)
    c = online._constexprs(cfg, shape[-1], causal, True)
    assert (c["MASKED_N"], c["MASKED_FIRST"]) == (64, nonkdim != 16)
    dtype = torch.bfloat16 if nonkdim else torch.float16
    _check("online", cfg, shape, causal, dtype, attention_reference, seed=shape[3] + causal)


@pytest.mark.parametrize("variant", list(VARIANT_CFGS))
@pytest.mark.parametrize("shape", [(1, 2, 1, 150, 170, 64), (1, 2, 2, 170, 150, 32)], ids=["Sq<Sk", "Sq>Sk"])
def test_wide_block_causal_mask(variant, shape, attention_reference):
    """BLOCK_N >= 128 takes mask_scores' one-compare causal mask (j <= min(i + Sk - Sq, Sk - 1)): diagonal and tail."""
    cfg = KernelConfig(BLOCK_M=32, BLOCK_N=128, variant=variant, num_splits=2)
    _check(variant, cfg, shape, True, torch.bfloat16, attention_reference, seed=shape[3])
