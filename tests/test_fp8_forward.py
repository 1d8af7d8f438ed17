"""fp8 forward (rocmflash.api.fp8, kernels/fp8/forward): numerics in Triton's interpreter, formats per arch, bad input.

The reference is fp64 attention of the *dequantised* inputs (``x_fp8 * descale``). The bound
each element is held to (derived in ``rocmflash/kernels/fp8/forward.py``):

    |O - O_ref| <= u * sum_j(P_j |V_j|) + n_keys * delta * max|V| + u_out * |O_ref| + 2**-12 * max|V|

with ``u = 2**-(m+1)`` V's fp8 unit roundoff (e4m3: 2**-4, e5m2: 2**-3) -- P is rounded to fp8 --,
``delta`` half P's subnormal spacing at the kernel's scale, ``u_out`` the output cast (bf16 2**-8,
fp16 2**-11) and the last term the fp32 work (S summation, exp2, rescales). Compiled GPU runs add the
fp8 MMAs' reduced-precision accumulation (:data:`MMA_UNIT`: scores and P·V sums, see the kernel
docstring); :func:`test_gpu_bound_covers_a_truncating_fp22_mma` shows the exact bound failing and the
GPU bound holding under a truncating FP22 model. Every run also holds the relative L2 error to ``u``
(P's rounding errors have rms below ``u/sqrt(3)``): the sharp check where the GPU bound is loose.
"""

import math

import numpy as np
import pytest
import torch

import rocmflash
from rocmflash.api import fp8
from rocmflash.config import KernelConfig
from rocmflash.kernels.fp8 import forward as fp8_forward

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
IDS = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MANTISSA = {torch.float8_e4m3fn: 3, torch.float8_e4m3fnuz: 3, torch.float8_e5m2: 2, torch.float8_e5m2fnuz: 2}


def _descales(B, Hkv, gen, lo=0.25, hi=2.0):
    return [torch.empty(B, Hkv).uniform_(lo, hi, generator=gen) for _ in range(3)]


def _reference(q, k, v, qd, kd, vd, causal, scale):
    """fp64 attention of the dequantised inputs: ``(out, lse, weights P (B, Hq, Sq, Sk))``."""
    group = q.shape[1] // k.shape[1]
    deq = lambda x, d: x.double() * d.double()[:, :, None, None]  # noqa: E731
    qf = deq(q, qd.repeat_interleave(group, 1))
    kf, vf = (deq(x, d).repeat_interleave(group, 1) for x, d in ((k, kd), (v, vd)))
    s = (qf @ kf.transpose(-1, -2)) * scale
    Sq, Sk = q.shape[2], k.shape[2]
    if causal:
        i, j = torch.arange(Sq)[:, None], torch.arange(Sk)[None, :]
        s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return p @ vf, lse, p, vf


#: GPU fp8 MMAs (compiled runs) keep 13 fraction bits of their sums, truncated (FP22: SageAttention2, arXiv:2411.10958;
#: "around 14 bits" on H800: DeepSeek-V3, arXiv:2412.19437 section 3.3.2), not fp32's 23
MMA_UNIT = 2.0 ** -13


def _mma_gamma(n):
    """Relative error (of sum |terms|) of an n-term fp8 MMA dot on a GPU: each product and each 32-deep
    instruction's sum truncated to 13 fraction bits (+8 instructions: a last key block, up to 256 wide, runs whole)."""
    return (n + math.ceil(n / 32) + 8) * MMA_UNIT


def _score_abs(q, k, qd, kd, scale):
    """``|scale| * sum_d |q_d k_d|`` of the dequantised inputs, ``(B, Hq, Sq, Sk)``: what the error of a GPU score scales with."""
    group = q.shape[1] // k.shape[1]
    qa = q.double().abs() * qd.double().abs().repeat_interleave(group, 1)[:, :, None, None]
    ka = (k.double().abs() * kd.double().abs()[:, :, None, None]).repeat_interleave(group, 1)
    return abs(scale) * (qa @ ka.transpose(-1, -2))


def _bound(dtype, out_dtype, p, vf, n_keys, sabs=None):
    """The element-wise error bound of the module docstring, from the format's bit counts.

    ``sabs`` (:func:`_score_abs`) given: a compiled GPU run, whose fp8 MMAs accumulate with
    :data:`MMA_UNIT`; None: exact fp32 accumulation (the interpreter)."""
    m = MANTISSA[dtype]
    info = torch.finfo(dtype)
    u = 2.0 ** -(m + 1)
    emin = math.log2(info.tiny)  # smallest normal exponent
    delta = 2.0 ** (emin - m - 1) / fp8.fp8_max(dtype)
    u_out = torch.finfo(out_dtype).eps / 2  # bf16 2**-8, fp16 2**-11
    vmax = vf.abs().amax(dim=(-1, -2), keepdim=True)
    ref = p @ vf
    tail = n_keys * delta * vmax + u_out * ref.abs() + 2.0 ** -12 * vmax
    if sabs is None:
        return u * (p @ vf.abs()) + tail
    # scores off by at most eps_j (natural log): the weights p'_j = p_j e^d_j / sum_k p_k e^d_k, |d_j| <= eps_j,
    # are within p_j * r_j of p_j
    live = p > 0
    eps = _mma_gamma(vf.shape[-1]) * sabs
    up, down = torch.exp(eps), torch.exp(-eps)
    a_hi = torch.where(live, p * up, 0.0).sum(-1, keepdim=True)
    a_lo = torch.where(live, p * down, 0.0).sum(-1, keepdim=True)
    r = torch.where(live, torch.maximum(up / a_lo - 1, 1 - down / a_hi), 0.0)
    moved = (p * r).clamp(max=1.0)  # |p'_j - p_j|, at most 1 (r may overflow)
    pv = (p + moved).clamp(max=1.0) @ vf.abs()  # >= sum_j p'_j |V_j|
    accumulate = _mma_gamma(n_keys) * ((1 + u) * pv + n_keys * delta * vmax)  # P·V's GPU sums
    return u * pv + (moved @ vf.abs() + accumulate) * (1 + u_out) + tail


def test_unit_roundoff_is_the_formats_rounding_error():
    """u = 2**-(m+1) is the worst relative rounding error over the normal range (probed through torch)."""
    for dtype in FP8:
        x = torch.linspace(1.0, 2.0, 20481)  # holds every midpoint of [1, 2] (spacing 2**-m)
        r = x.to(dtype).float()
        assert ((r - x).abs() / r).max().item() == fp8.unit_roundoff(dtype), dtype  # reached at midpoints
        assert ((r - x).abs() / x).max().item() <= fp8.unit_roundoff(dtype)
        assert fp8.unit_roundoff(dtype) == 2.0 ** -(MANTISSA[dtype] + 1)
        assert fp8.fp8_max(dtype) == torch.finfo(dtype).max


@pytest.mark.parametrize("dtype", FP8, ids=IDS)
def test_interpreter_fp32_to_fp8_rounds_like_torch(dtype):
    """The interpreter repair: kernel-side ``fp32 -> fp8`` equals torch's round-to-nearest-even on every
    representable interval (Triton 3.6's own conversion sends 127.99 to 64 in e4m3fn and rounds ties up)."""
    import triton.language as tl

    dst = getattr(tl, {"fp8e4nv": "float8e4nv", "fp8e5": "float8e5", "fp8e4b8": "float8e4b8",
                       "fp8e5b16": "float8e5b16"}[fp8.triton_type(dtype)])
    top = fp8.fp8_max(dtype)
    x = np.concatenate([np.linspace(0, top, 200001), np.linspace(0, 1e-3, 20001), [127.99, 1.0625, 15.5]])
    x = x.astype(np.float32)
    bits = fp8_forward._to_fp8_bits(x, dst)
    assert bits.dtype == np.uint8
    assert np.array_equal(bits, torch.from_numpy(x).to(dtype).view(torch.uint8).numpy())


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("dtype", FP8, ids=IDS)
def test_p_is_rounded_to_fp8_at_the_formats_max(dtype):
    """Two keys with weights 1 and p = 0.29 and one-hot values: the output shows P·V ran on fp8(p * MAX) / MAX
    (not on p), with the exact fp32 denominator 1 + p. Also a negative descale product, handled exactly."""
    D, p = 32, 0.29
    q = torch.zeros(1, 1, 1, D)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 2, D)
    k[0, 0, 1, 0] = 1.0  # s = (0, -ln p) after a negative q_descale: weights 1 and p
    v = torch.zeros(1, 1, 2, D)
    v[0, 0, 0, 0] = v[0, 0, 1, 1] = 1.0
    q, k, v = (x.to(dtype) for x in (q, k, v))
    qd, kd, vd = torch.tensor([[-1.0]]), torch.tensor([[1.0]]), torch.tensor([[1.0]])
    out = torch.full((1, 1, 1, D), float("nan"), dtype=torch.float32).to(torch.bfloat16)
    fp8_forward.launch(q, k, v, qd, kd, vd, KernelConfig(BLOCK_M=16, BLOCK_N=32), False, -math.log(p), out)
    top = fp8.fp8_max(dtype)
    p8 = torch.tensor(p * top).to(dtype).float().item() / top
    got = out[0, 0, 0, :2].double()
    tol = 2.0 ** -8  # bf16 output rounding
    assert abs(p8 - p) > 3 * tol * p8  # the case tells rounded from unrounded P apart
    assert got[1].item() == pytest.approx(p8 / (1 + p), rel=tol), (got, p8)
    assert got[0].item() == pytest.approx(1 / (1 + p), rel=tol)
    assert (out[0, 0, 0, 2:] == 0).all()


CASES = [  # B, Hq, Hkv, Sq, Sk, D, causal
    (2, 4, 2, 37, 45, 64, True),
    (1, 2, 2, 45, 37, 64, True),  # Sq > Sk: the first 8 rows see no key
    (1, 6, 2, 29, 61, 80, False),  # D = 64 + 32 pieces, GQA 3
    (2, 2, 1, 1, 70, 128, True),  # one query row, MQA
    (1, 2, 2, 33, 33, 16, False),  # D padded to 32
]


def _rel_l2(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def _run_case(dtype, case, arch=None, pre_transposed=False):
    """One interpreted launch of ``case`` against the dequantised reference: the bound, relative L2 <= u, LSE.

    ``arch``: the launch's arch (``sm_90``/``gfx942`` read V K-major, copied); ``pre_transposed``: V given
    K-major (a view of ``(B, Hkv, D, Sk)`` memory), which the launch must take without a copy."""
    B, Hq, Hkv, Sq, Sk, D, causal = case
    gen = torch.Generator().manual_seed(hash((str(dtype), case)) % 2**31)
    amp = min(fp8.fp8_max(dtype) / 8, 64.0)  # values spread over the format's range
    q, k, v = (torch.randn(B, h, s, D, generator=gen).mul(amp).to(dtype)
               for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    if pre_transposed:
        v = v.transpose(2, 3).contiguous().transpose(2, 3)
    qd, kd, vd = _descales(B, Hkv, gen)
    qd[0, 0] = -qd[0, 0]  # a negative descale product: exact, the scale multiplies before the row max
    scale = 0.5 / (amp * amp * math.sqrt(D))
    out = torch.full((B, Hq, Sq, D), float("nan")).to(torch.bfloat16)
    lse = torch.full((B, Hq, Sq), float("nan"))
    cfg = KernelConfig(BLOCK_M=16, BLOCK_N=64 if Sk > 64 else 32, PRE_LOAD_V=causal)  # both V-load orders
    fp8_forward.launch(q, k, v, qd, kd, vd, cfg, causal, scale, out, lse, arch=arch)
    ref, ref_lse, p, vf = _reference(q, k, v, qd, kd, vd, causal, scale)
    err = (out.double() - ref).abs()
    bound = _bound(dtype, torch.bfloat16, p, vf, Sk)
    assert not out.isnan().any()
    assert (err <= bound).all(), (err - bound).max()
    # the typical error: P's relative rounding errors (|e| <= u, rms <= u/sqrt(3)) scale each key's share of O
    assert _rel_l2(out, ref) <= fp8.unit_roundoff(dtype)
    live = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), live)
    assert (lse.double() - ref_lse)[live].abs().max() < 1e-4
    if causal and Sq > Sk:
        assert (out[:, :, : Sq - Sk] == 0).all()


def CASE_IDS(c):
    return "x".join(map(str, c[:6])) + ("-causal" if c[6] else "")


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("dtype", FP8, ids=IDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matches_dequantised_reference_within_the_fp8_bound(dtype, case):
    _run_case(dtype, case)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("dtype, arch", [(torch.float8_e4m3fn, "sm_90"), (torch.float8_e4m3fnuz, "gfx942"),
                                         (torch.float8_e5m2, None)], ids=["sm_90", "gfx942", "pre-transposed"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_kmajor_v_matches_the_reference(dtype, arch, case):
    """V read K-major: copied by the launch (sm_90, gfx942; odd key counts padded) or given so (no copy)."""
    _run_case(dtype, case, arch=arch, pre_transposed=arch is None)


def test_kmajor_v_per_arch():
    assert [fp8_forward.kmajor_v(a) for a in ("sm_89", "sm_90", "sm_90a", "sm_120", "gfx942", "gfx942:sramecc+")] == [True] * 6
    assert [fp8_forward.kmajor_v(a) for a in ("sm_100", "sm_103", "gfx950", "sm_80", None)] == [False] * 5


@pytest.mark.parametrize("Sk", [1, 37, 64])
def test_as_kmajor_v_layout(Sk):
    """One copy into (B, H, D, Sk16) memory, the pad zeroed (16-byte aligned rows); a K-major V is not copied."""
    v = torch.randn(2, 3, Sk, 40).to(torch.float8_e4m3fn)
    t, seq_v = fp8_forward.as_kmajor_v(v)
    assert seq_v == -(-Sk // 16) * 16 and t.shape == v.shape and t.stride(2) == 1 and t.stride(3) == seq_v
    assert torch.equal(t.view(torch.uint8), v.view(torch.uint8))
    base = t.transpose(2, 3)  # (B, H, D, Sk) view of the buffer; its pad columns follow each row
    pad = torch.as_strided(base, (2, 3, 40, seq_v - Sk), base.stride(), base.storage_offset() + Sk)
    assert (pad.view(torch.uint8) == 0).all()
    again, seq_again = fp8_forward.as_kmajor_v(t)
    if Sk > 1:
        assert again is t and seq_again == Sk


# ----------------------------------------------------------------------------- public API
@pytest.mark.usefixtures("interpret")
def test_flash_attn_func_fp8_layout_out_dtype_and_lse():
    dtype, gen = torch.float8_e4m3fn, torch.Generator().manual_seed(1)
    B, Sq, Sk, Hq, Hkv, D = 2, 21, 34, 4, 2, 64
    q, k, v = (torch.randn(B, s, h, D, generator=gen).mul(4).to(dtype) for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
    qd, kd, vd = _descales(B, Hkv, gen)
    out, lse, none = rocmflash.flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                               q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.shape == (B, Sq, Hq, D) and out.dtype == torch.bfloat16 and out.is_contiguous() and none is None
    ref, ref_lse, p, vf = _reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), qd, kd, vd, True,
                                     1 / math.sqrt(D))
    assert ((out.transpose(1, 2).double() - ref).abs() <= _bound(dtype, torch.bfloat16, p, vf, Sk)).all()
    assert (lse.double() - ref_lse).abs().max() < 1e-4
    half = rocmflash.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                               q_descale=qd, k_descale=kd, v_descale=vd.expand(B, Hkv), out_dtype=torch.float16)
    assert half.dtype == torch.float16 and half.shape == (B, Hq, Sq, D) and half.is_contiguous()
    assert ((half.double() - ref).abs() <= _bound(dtype, torch.float16, p, vf, Sk)).all()


@pytest.mark.usefixtures("interpret")
def test_empty_and_broadcast_descales():
    dtype = torch.float8_e4m3fn
    q = torch.randn(1, 2, 5, 32).to(dtype)
    empty = torch.zeros(1, 2, 0, 32).to(dtype)
    one = torch.ones(1, 1).expand(1, 2)  # stride-0 descales
    out, lse = rocmflash.attention(q, empty, empty, return_lse=True, q_descale=one, k_descale=one, v_descale=one)
    assert (out == 0).all() and (lse == float("-inf")).all()


def test_backward_is_a_clear_error(interpret):
    dtype = torch.float8_e4m3fn
    q = torch.randn(1, 8, 2, 32).to(dtype).requires_grad_(True)
    d = torch.ones(1, 2)
    out = rocmflash.flash_attn_func(q, q.detach(), q.detach(), q_descale=d, k_descale=d, v_descale=d)
    with pytest.raises(NotImplementedError, match="inference-only"):
        out.float().sum().backward()


# ----------------------------------------------------------------------------- formats per arch
def test_format_family_per_arch():
    assert [fp8.fp8_family(a) for a in ("gfx940", "gfx941", "gfx942", "gfx942:sramecc+:xnack-")] == ["fnuz"] * 4
    assert [fp8.fp8_family(a) for a in ("gfx950", "sm_89", "sm_90", "sm_100", "sm_120")] == ["ocp"] * 5
    assert [fp8.fp8_family(a) for a in ("gfx90a", "gfx908", "gfx1100", "sm_80", "sm_86", None)] == [None] * 6


@pytest.mark.parametrize("arch, good, bad, expected", [
    ("gfx942", torch.float8_e4m3fnuz, torch.float8_e4m3fn, "FNUZ fp8: expected torch.float8_e4m3fnuz or torch.float8_e5m2fnuz"),
    ("gfx950", torch.float8_e5m2, torch.float8_e5m2fnuz, "OCP fp8: expected torch.float8_e4m3fn or torch.float8_e5m2"),
    ("sm_90", torch.float8_e4m3fn, torch.float8_e4m3fnuz, "OCP fp8: expected torch.float8_e4m3fn or torch.float8_e5m2"),
])
def test_wrong_family_names_arch_and_format(arch, good, bad, expected):
    fp8.check_format(good, arch)
    with pytest.raises(TypeError, match=f"{arch} computes in {expected}") as err:
        fp8.check_format(bad, arch)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fake_rocm, ok, refused", [
    ({"gcn_arch_name": "gfx942:sramecc+:xnack-", "name": "AMD Instinct MI300X", "multi_processor_count": 304},
     torch.float8_e4m3fnuz, torch.float8_e4m3fn),
    ({"gcn_arch_name": "gfx950", "name": "AMD Instinct MI355X", "multi_processor_count": 256},
     torch.float8_e4m3fn, torch.float8_e4m3fnuz),
], indirect=["fake_rocm"], ids=["gfx942", "gfx950"])
def test_live_arch_decides_the_format(fake_rocm, ok, refused):
    """The arch of the tensor's device (a faked ROCm GPU): its format runs, the other family is refused."""
    arch = fake_rocm.gcn_arch_name.split(":")[0]
    d = torch.ones(1, 1)
    q = torch.randn(1, 40, 1, 32)
    out = rocmflash.flash_attn_func(q.to(ok), q.to(ok), q.to(ok), q_descale=d, k_descale=d, v_descale=d)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    with pytest.raises(TypeError, match=f"{arch} computes in"):
        rocmflash.flash_attn_func(q.to(refused), q.to(refused), q.to(refused), q_descale=d, k_descale=d, v_descale=d)


def test_gfx90a_refuses_every_fp8_format(fake_rocm):
    """The default fake device is an MI250 GCD (gfx90a): no fp8 matrix instructions."""
    d = torch.ones(1, 1)
    q = torch.randn(1, 40, 1, 32)
    for dtype in FP8:
        with pytest.raises(TypeError, match="gfx90a has no fp8 matrix instructions") as err:
            rocmflash.flash_attn_func(q.to(dtype), q.to(dtype), q.to(dtype), q_descale=d, k_descale=d, v_descale=d)
        assert "gfx942 (FNUZ" in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- bad input
def _call(q=None, k=None, v=None, **kw):
    dtype = torch.float8_e4m3fn
    base = torch.randn(2, 9, 4, 32).to(dtype)
    kv = torch.randn(2, 11, 2, 32).to(dtype)
    d = torch.ones(2, 2)
    args = dict(q_descale=d, k_descale=d, v_descale=d)
    args.update(kw)
    return rocmflash.flash_attn_func(base if q is None else q, kv if k is None else k, kv if v is None else v, **args)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("kw, err, match", [
    (dict(q_descale=None), ValueError, "q_descale is required with fp8 inputs"),
    (dict(k_descale=torch.ones(2, 4)), ValueError, r"k_descale must have shape \(batch, kv_heads\) = \(2, 2\)"),
    (dict(v_descale=torch.ones(2)), ValueError, r"v_descale must have shape"),
    (dict(q_descale=torch.ones(2, 2, dtype=torch.float64)), TypeError, "q_descale.dtype must be torch.float32"),
    (dict(k_descale=1.0), TypeError, "k_descale must be a torch.Tensor"),
    (dict(v_descale=torch.ones(2, 2, device="meta")), ValueError, "v_descale is on meta"),
    (dict(out_dtype=torch.float32), TypeError, "out_dtype must be torch.bfloat16 or torch.float16"),
    (dict(window_size=(4, 0)), NotImplementedError, "window_size/softcap with fp8"),
    (dict(softcap=30.0), NotImplementedError, "window_size/softcap with fp8"),
])
def test_bad_descales_and_options(kw, err, match):
    with pytest.raises(err, match=match) as info:
        _call(**kw)
    assert "\n" not in str(info.value)


@pytest.mark.usefixtures("interpret")
def test_bad_fp8_tensors():
    kv = torch.randn(2, 11, 2, 32)
    with pytest.raises(TypeError, match=r"k.dtype \(torch.bfloat16\) must match q.dtype"):
        _call(k=kv.to(torch.bfloat16))
    with pytest.raises(TypeError, match="share one format"):
        _call(k=kv.to(torch.float8_e5m2), v=kv.to(torch.float8_e5m2))
    with pytest.raises(TypeError, match="q_descale applies to fp8 inputs only"):
        rocmflash.flash_attn_func(kv.half(), kv.half(), kv.half(), q_descale=torch.ones(2, 2))
    with pytest.raises(TypeError, match="out_dtype applies to fp8 inputs only"):
        rocmflash.attention(kv.half(), kv.half(), kv.half(), out_dtype=torch.float16)
    q = torch.randn(2, 4, 9, 32).to(torch.float8_e4m3fn)
    d = torch.ones(2, 4)
    with pytest.raises(ValueError, match="fp8 attention has one kernel"):
        rocmflash.attention(q, q, q, variant="split_kv", q_descale=d, k_descale=d, v_descale=d)
    with pytest.raises(ValueError, match="BLOCK_N >= 32"):
        rocmflash.attention(q, q, q, config=KernelConfig(BLOCK_M=16, BLOCK_N=16), q_descale=d, k_descale=d,
                            v_descale=d)


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("which, value", [("q_descale", float("nan")), ("v_descale", float("inf")),
                                          ("k_descale", 1e30)], ids=["nan-q", "inf-v", "overflowing-q*k"])
def test_non_finite_descales_raise_without_a_host_read(which, value, monkeypatch):
    """The kernel flags the non-finite product (q_descale = 1e30 too: 1e30 * 1e30 overflows fp32); the
    host never reads a descale value (Tensor.item/tolist/__bool__ are refused during the call)."""
    d = torch.ones(2, 2)
    bad = d.clone()
    bad[1, 0] = value
    kw = {which: bad}
    if which == "k_descale":
        kw["q_descale"] = bad.clone()
    read = []
    for name in ("item", "tolist", "__bool__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, **k: (
            read.append(self.shape) if self.dtype == torch.float32 and self.shape == (2, 2) else None) or _o(self, *a, **k))
    with pytest.raises(ValueError, match="non-finite q_descale \\* k_descale \\* softmax_scale or v_descale") as err:
        _call(**kw)
    assert "\n" not in str(err.value) and read == []
    assert int(fp8.error_word(torch.device("cpu"))[0]) == 0  # reported once, then reset
    out = _call()  # the next good call is fine
    assert torch.isfinite(out.float()).all()
    fp8.check_errors()


# ----------------------------------------------------------------------------- GPU accumulation
def _truncate(x, ref, bits=13):
    """``x`` truncated toward zero to a multiple of ``2**(floor(log2 |ref|) - bits)``."""
    step = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(1e-300))) - bits)
    return torch.trunc(x / step) * step


def _fp22_mma(a, b, c):
    """``c + a @ b`` as a truncating FP22 fp8 MMA is modelled: per 32-deep step, ``c`` and the exact products are
    aligned to the largest and cut to 13 fraction bits, their sum cut to 13 fraction bits."""
    for k0 in range(0, a.shape[-1], 32):
        terms = torch.cat([c[..., :, None, :], a[..., :, k0:k0 + 32, None] * b[..., None, k0:k0 + 32, :]], -2)
        total = _truncate(terms, terms.abs().amax(-2, keepdim=True)).sum(-2)
        c = _truncate(total, total)
    return c


def _emulated_gpu_kernel(q, k, v, qd, kd, vd, scale, dtype, block_n=64):
    """The kernel's causal online softmax in fp64 with both dots through :func:`_fp22_mma` and P rounded as it does."""
    group, top = q.shape[1] // k.shape[1], fp8.fp8_max(dtype)
    kf, vf = (x.double().repeat_interleave(group, 1) for x in (k, v))
    qk = (qd[:, :, None, None] * kd[:, :, None, None]).double().repeat_interleave(group, 1) * scale / math.log(2)
    Sq, Sk = q.shape[2], k.shape[2]
    m = torch.full(q.shape[:3] + (1,), float("-inf"), dtype=torch.float64)
    l, acc = torch.zeros_like(m), torch.zeros(q.shape, dtype=torch.float64)
    for n0 in range(0, Sk, block_n):
        kb, vb = kf[:, :, n0:n0 + block_n], vf[:, :, n0:n0 + block_n]
        s = _fp22_mma(q.double(), kb.transpose(-1, -2), torch.zeros(q.shape[:3] + (kb.shape[2],), dtype=torch.float64))
        keys = n0 + torch.arange(kb.shape[2])
        s = (s * qk).masked_fill(keys[None, :] > torch.arange(Sq)[:, None] + (Sk - Sq), float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp2(s - m_new), torch.exp2(m - m_new)
        l = l * alpha + p.sum(-1, keepdim=True)
        acc = _fp22_mma((p * top).to(dtype).double(), vb, acc * alpha)
        m = m_new
    return acc * vd.double().repeat_interleave(group, 1)[:, :, None, None] / (l * top)


def test_gpu_bound_covers_a_truncating_fp22_mma():
    """Under the FP22 model the exact-accumulation bound fails (as the H100 run of the GPU test's former data did),
    and the compiled-run bound holds."""
    dtype, gen = torch.float8_e4m3fn, torch.Generator().manual_seed(3)
    B, Hq, Hkv, Sq, Sk, D = 1, 2, 1, 100, 517, 128
    q, k, v = (torch.randn(B, h, s, D, generator=gen).mul(8).to(dtype) for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    qd, kd, vd = _descales(B, Hkv, gen)
    scale = 1 / math.sqrt(D)
    ref, _, p, vf = _reference(q, k, v, qd, kd, vd, True, scale)
    err = (_emulated_gpu_kernel(q, k, v, qd, kd, vd, scale, dtype).float().to(torch.bfloat16).double() - ref).abs()
    assert (err > _bound(dtype, torch.bfloat16, p, vf, Sk)).any()
    assert (err <= _bound(dtype, torch.bfloat16, p, vf, Sk, _score_abs(q, k, qd, kd, scale))).all()


# ----------------------------------------------------------------------------- GPU
def _gpu_case(dtype, kind, causal):
    """``(q, k, v, descales, scale, sabs)``, scores with a standard deviation near 2 (as in trained models).

    ``integer``: q and k small integers, so every partial sum of a score is an integer below 2**13, which
    a 14-significant-bit sum holds exactly: scores exact on the GPU (``sabs`` 0), only P·V's sums and P's
    rounding left, a bound within ~2x of the interpreter's. ``random``: values over the format's range,
    the worst-case score term (:func:`_score_abs`)."""
    gen = torch.Generator().manual_seed(3 + causal)
    B, Hq, Hkv, Sq, Sk, D = 2, 8, 2, 300, 517, 128
    amp = min(fp8.fp8_max(dtype) / 8, 64.0)
    v = torch.randn(B, Hkv, Sk, D, generator=gen).mul(amp).to(dtype)
    if kind == "integer":  # |q_d k_d| <= 64: |partial sums| <= 128 * 64 = 2**13
        q, k = (torch.randn(B, h, s, D, generator=gen).mul(3).round().clamp(-8, 8).to(dtype) for h, s in ((Hq, Sq), (Hkv, Sk)))
        scale = 2.0 / (9 * math.sqrt(D))
    else:
        q, k = (torch.randn(B, h, s, D, generator=gen).mul(amp).to(dtype) for h, s in ((Hq, Sq), (Hkv, Sk)))
        scale = 2.0 / (amp * amp * math.sqrt(D))
    qd, kd, vd = _descales(B, Hkv, gen, 0.5, 1.5)
    sabs = torch.zeros(B, Hq, Sq, Sk, dtype=torch.float64) if kind == "integer" else _score_abs(q, k, qd, kd, scale)
    return q, k, v, (qd, kd, vd), scale, sabs


@pytest.mark.gpu
@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("kind", ["integer", "random"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_fp8_forward_on_gpu_and_deferred_descale_error(kind, causal):
    """Compiled, through the public API, V as given (copied K-major where the arch wants it) and V K-major
    (not copied): the compiled-run bound element-wise, and the typical error (relative L2 <= u)."""
    from rocmflash.api.selection import device_identity

    dev = torch.device("cuda")
    family = fp8.fp8_family(device_identity(dev)[1])
    if family is None:
        pytest.skip("this GPU has no fp8 matrix instructions")
    dtype = fp8.FAMILY_DTYPES[family][0]
    q, k, v, (qd, kd, vd), scale, sabs = _gpu_case(dtype, kind, causal)
    ref, _, p, vf = _reference(q, k, v, qd, kd, vd, causal, scale)
    bound = _bound(dtype, torch.bfloat16, p, vf, k.shape[2], sabs)
    qg, kg, vg = (x.to(dev) for x in (q, k, v))
    descales = {"q_descale": qd.to(dev), "k_descale": kd.to(dev), "v_descale": vd.to(dev)}
    for name, v_in in (("as given", vg), ("K-major", vg.transpose(2, 3).contiguous().transpose(2, 3))):
        out = rocmflash.attention(qg, kg, v_in, causal=causal, softmax_scale=scale, **descales).cpu()
        err = (out.double() - ref).abs()
        print(f"\n{kind} {name}: max err/bound {(err / bound).max().item():.3g}, relative L2 {_rel_l2(out, ref):.3g}")
        assert (err <= bound).all(), name
        assert _rel_l2(out, ref) <= fp8.unit_roundoff(dtype), name
    assert torch.equal(vg.cpu().view(torch.uint8), v.view(torch.uint8))  # the caller's V is untouched
    bad = qd.clone().to(dev)
    bad[0, 0] = float("inf")
    rocmflash.attention(qg, kg, vg, q_descale=bad, k_descale=kd.to(dev), v_descale=vd.to(dev))
    with pytest.raises(ValueError, match="non-finite"):
        fp8.check_errors(dev)
