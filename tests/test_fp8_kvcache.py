"""fp8 KV cache in ``flash_attn_with_kvcache`` (Triton's interpreter, CPU); cross-compiles (gfx942, gfx950, sm_90).

Numerics are checked against an fp64 reference computed from the *dequantised* cache
(``cache.float() * descale``), so the only error left is the kernel's own; its bound is derived in
:func:`_kernel_bound`. One test also bounds the error against the unquantised K/V, from the fp8
format's rounding (:func:`_fp8_bound`). Appended rows must be torch's own quantisation, byte for byte.
Bad input (format for the arch, descales missing / misshaped / not finite) raises and leaves the
cache's bytes as they were. Unused cache slots hold NaN bytes: a kernel reading past a sequence fails.
"""

import math

import pytest
import torch

from varlen_reference import attention_fp64

FNUZ = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
OCP = (torch.float8_e4m3fn, torch.float8_e5m2)
NAN_BYTE = {torch.float8_e4m3fn: 0x7F, torch.float8_e5m2: 0x7F, torch.float8_e4m3fnuz: 0x80,
            torch.float8_e5m2fnuz: 0x80}


pytestmark = pytest.mark.usefixtures("fresh_decode")  # no error bits or kept plans from another test


def _quantise(x, descale, dtype):
    """torch's quantisation, the reference of the append: saturate ``x / descale`` and round to ``dtype``."""
    from rocmflash.hw.fp8 import fp8_max

    m = fp8_max(dtype)
    return (x.float() / descale[:, None, :, None]).clamp(-m, m).to(dtype)


def _cache(B, Hkv, D, capacity, page, dtype, gen):
    """(k_cache, v_cache, block_table or None), every byte NaN; paged caches get shuffled pages."""
    if page:
        pages = -(-capacity // page)
        shape, table = (B * pages + 2, page, Hkv, D), torch.randperm(B * pages + 2, generator=gen)[:B * pages]
        table = table.view(B, pages).to(torch.int32)
    else:
        shape, table = (B, capacity, Hkv, D), None
    nan = torch.full(shape, NAN_BYTE[dtype], dtype=torch.uint8)
    return nan.view(dtype), nan.clone().view(dtype), table


def _rows(cache, table, b, n, page):
    if table is None:
        return cache[b, :n]
    idx = torch.arange(n)
    return cache[table[b][idx // page].long(), idx % page]


def _fill(cache, table, b, n, page, values):
    if table is None:
        cache[b, :n] = values
    else:
        idx = torch.arange(n)
        cache[table[b][idx // page].long(), idx % page] = values


def _kernel_bound(v_deq, qdtype, keys: int) -> float:
    """Bound on |out - ref| against the fp64 reference of the dequantised cache.

    With an fp8 cache the kernel's dots run in fp16 (kv_quant.fp8_setup): K and V widen to fp16
    exactly (every fp8 value is an fp16 value), q is scaled by a power of two into fp16 exactly
    (bf16's 8 significant bits fit fp16's 11; elements below max|q| 2^-28 err by < max|q| 2^-39), and
    the scales are fp32 scalars: scores and the softmax sum are exact up to fp32 rounding. Two
    roundings remain: P to fp16 before P.V (relative u_p = 2^-11), giving
    ``|sum_j p_j d_j v_j| / sum_j p_j <= u_p max|v|``, and the output to q's dtype, ``u |out| <= u max|v|``
    with u = 2^-11 for fp16 and 2^-7 for bf16 (a GPU rounds to nearest, 2^-8, but Triton 3.6's interpreter
    truncates fp32 -> bf16: up to one ulp). fp32 work (scale products, exp2, the split combine) adds
    ~2^-20 relative, covered by 2^-14; p in fp16's subnormal range (absolute error <= 2^-25 per key)
    adds ``keys * 2^-25``.
    """
    u_out = 2.0 ** -7 if qdtype == torch.bfloat16 else 2.0 ** -11
    return (2.0 ** -11 + u_out + 2.0 ** -14 + keys * 2.0 ** -25) * v_deq.abs().max().item()


def _scales(B, Hkv, gen, lo=0.002, hi=0.02):
    return torch.rand(B, Hkv, generator=gen) * (hi - lo) + lo


def _run(lengths, Sq, group, D, dtype, page, qdtype=torch.bfloat16, num_splits=0, leftpad=None, append=True,
         causal=True, Hkv=2, capacity=96, seed=0, window=(-1, -1), softcap=0.0):
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api.decode import check_errors

    gen = torch.Generator().manual_seed(seed)
    B = len(lengths)
    kc, vc, table = _cache(B, Hkv, D, capacity, page, dtype, gen)
    ks, vs = _scales(B, Hkv, gen), _scales(B, Hkv, gen)
    for b, n in enumerate(lengths):
        for c, s in ((kc, ks), (vc, vs)):
            _fill(c, table, b, n, page, _quantise(torch.randn(1, n, Hkv, D, generator=gen), s[b:b + 1], dtype)[0])
    q = torch.randn(B, Sq, Hkv * group, D, generator=gen).to(qdtype)
    k_new = (torch.randn(B, Sq, Hkv, D, generator=gen) * 3).to(qdtype) if append else None
    v_new = (torch.randn(B, Sq, Hkv, D, generator=gen) * 3).to(qdtype) if append else None
    before_k, before_v = kc.view(torch.uint8).clone(), vc.view(torch.uint8).clone()
    lens = torch.tensor(lengths, dtype=torch.int32)
    starts = torch.tensor(leftpad, dtype=torch.int32) if leftpad is not None else None
    out, lse = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table, causal=causal,
                                       window_size=window, softcap=softcap, num_splits=num_splits, return_lse=True,
                                       cache_leftpad=starts, k_descale=ks, v_descale=vs)
    check_errors()  # nothing was out of range
    new = Sq if append else 0
    changed = 0
    for b, n in enumerate(lengths):
        keys, vals = _rows(kc, table, b, n + new, page), _rows(vc, table, b, n + new, page)
        if append:  # the appended rows are torch's quantisation of k / k_descale, byte for byte
            for got, x, s in ((keys, k_new, ks), (vals, v_new, vs)):
                assert torch.equal(got[n:].view(torch.uint8), _quantise(x[b:b + 1], s[b:b + 1], dtype)[0].view(torch.uint8))
        changed += new
        first = leftpad[b] if leftpad is not None else 0
        k_deq = keys[first:].float() * ks[b][None, :, None]
        v_deq = vals[first:].float() * vs[b][None, :, None]
        # causal/window positions count from the cache's start: keys before `first` are simply absent
        ref, ref_lse = attention_fp64(q[b], k_deq, v_deq, 1 / math.sqrt(D), causal, window, softcap)
        if v_deq.numel():
            err = (out[b].double() - ref).abs().max().item()
            assert err <= _kernel_bound(v_deq, qdtype, n + new), (b, err)
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse[b]), seen)
        assert (out[b].transpose(0, 1)[~seen] == 0).all()
        if seen.any():
            assert (lse[b][seen].double() - ref_lse[seen]).abs().max().item() < 1e-4
    # bytes outside the appended rows are unchanged (the appended ones were checked above)
    for after, before in ((kc, before_k), (vc, before_v)):
        rows_changed = (after.view(torch.uint8) != before).any(-1).any(-1)
        assert int(rows_changed.sum()) <= changed


@pytest.mark.parametrize("dtype,page,group,Sq,splits,D,qdtype", [
    (torch.float8_e4m3fn, 0, 4, 1, 3, 64, torch.bfloat16),
    (torch.float8_e4m3fnuz, 16, 8, 1, 0, 64, torch.bfloat16),
    (torch.float8_e5m2, 64, 1, 3, 1, 80, torch.float16),
    (torch.float8_e5m2fnuz, 0, 4, 3, 2, 80, torch.bfloat16),
    (torch.float8_e4m3fnuz, 64, 4, 2, 1, 64, torch.float16),
])
def test_fp8_cache_matches_the_dequantised_reference(interpret, dtype, page, group, Sq, splits, D, qdtype):
    """Contiguous and paged (16: a key block spans pages; 64: whole pages), GQA 1/4/8, lengths 0, 1 and odd,
    1-3 new tokens appended, split and direct paths, odd head dim 80, bf16 and fp16 queries."""
    _run([0, 1, 37, 90 - Sq], Sq, group, D, dtype, page, qdtype, num_splits=splits, seed=page + group + Sq)


@pytest.mark.parametrize("dtype,page", [(torch.float8_e4m3fn, 16), (torch.float8_e5m2fnuz, 0)])
def test_fp8_cache_with_leftpad_and_without_append(interpret, dtype, page):
    """cache_leftpad (keys before each start are left out of the reference), with and without appended keys,
    causal and not."""
    _run([20, 57, 70], 2, 4, 64, dtype, page, leftpad=[3, 0, 41], num_splits=2, seed=5)
    _run([20, 57, 70], 1, 4, 64, dtype, page, leftpad=[19, 10, 0], append=False, causal=False, seed=6)


def test_fp8_cache_with_window_and_softcap(interpret):
    """The key scale also enters soft-capping (through sm_scale, not qk_scale): a sliding window with softcap."""
    _run([40, 90 - 2], 2, 2, 64, torch.float8_e4m3fnuz, 16, window=(20, -1), softcap=5.0, num_splits=2, seed=9)


def _fp8_bound(q, k, v, ks, vs, dtype, scale: float) -> float:
    """Bound on |out - ref| of one sequence against the fp64 reference of the *unquantised* k/v (plus the kernel's).

    Quantising ``x`` with descale ``s`` (no saturation: ``s >= amax / max``) errs by at most
    ``u8 |x| + s 2^(-bias-M)`` (``u8 = 2^-(M+1)``: round to nearest, normal range; the second term is half
    the subnormal quantum). A score then moves by at most ``E_j = scale sum_d |q_d| (u8 |k_jd| + ks 2^(-bias-M))``,
    so with ``E = max_j E_j`` every softmax weight moves by a factor in ``[e^-2E, e^2E]`` and
    ``sum_j |p'_j - p_j| <= e^2E - 1``; the output moves by at most ``(e^2E - 1) max|v'|`` from the weights and
    ``max_j |v'_j - v_j|`` from V. Per (row, head) this is computed exactly and the worst is returned.
    """
    from rocmflash.kernels.decode.quant import LAYOUTS

    lay = LAYOUTS[dtype]
    u8, sub = 2.0 ** -(lay.mant + 1), 2.0 ** (-lay.bias - lay.mant)
    group = q.shape[1] // k.shape[1]
    k_err = u8 * k.abs().double() + (ks * sub)[None, :, None]  # (Sk, Hkv, D)
    e = scale * torch.einsum("qhd,khd->hqk", q.abs().double(), k_err.repeat_interleave(group, 1))
    big_e = e.amax(-1)  # (Hq, Sq)
    v_max = v.abs().max().item() * (1 + u8) + vs.max().item() * sub
    dv = u8 * v.abs().max().item() + vs.max().item() * sub
    return (torch.expm1(2 * big_e).max().item() * v_max + dv)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2fnuz])
def test_fp8_error_against_unquantised_kv_is_within_the_format_bound(interpret, dtype):
    """The whole sequence appended in one call (Sk_new = 70) with per-head scales ``amax / max`` (the usual
    recipe), then a one-token step: the error against the unquantised bf16 K/V stays within _fp8_bound."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.hw.fp8 import fp8_max

    gen = torch.Generator().manual_seed(3)
    B, n, Hkv, group, D = 2, 70, 2, 4, 64
    kc, vc, _ = _cache(B, Hkv, D, 80, 0, dtype, gen)
    k = torch.randn(B, n, Hkv, D, generator=gen).bfloat16()
    v = torch.randn(B, n, Hkv, D, generator=gen).bfloat16()
    ks = k.float().abs().amax(dim=(1, 3)) / fp8_max(dtype)
    vs = v.float().abs().amax(dim=(1, 3)) / fp8_max(dtype)
    q = torch.randn(B, 1, Hkv * group, D, generator=gen).bfloat16()
    lens = torch.zeros(B, dtype=torch.int32)
    out = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, k_descale=ks, v_descale=vs, causal=True)
    for b in range(B):
        ref, _ = attention_fp64(q[b], k[b], v[b], D ** -0.5, True)
        err = (out[b].double() - ref).abs().max().item()
        bound = _fp8_bound(q[b], k[b], v[b], ks[b], vs[b], dtype, D ** -0.5) + _kernel_bound(v[b].float(), q.dtype, n)
        assert err <= bound, (b, err, bound)


@pytest.mark.parametrize("dtype", OCP + FNUZ)
def test_append_writes_torchs_bytes_for_every_kind_of_value(interpret, dtype):
    """Every fp8 value, every midpoint between neighbours (ties to even) and the floats just beside it,
    subnormals, -0, out-of-range values and +-inf (saturated), +-NaN, divided by per-head scales that are not
    powers of two: the appended bytes equal torch's, for K and V, contiguous and paged."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.hw.fp8 import fp8_max

    grid = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    top = fp8_max(dtype)
    special = torch.tensor([0.0, -0.0, 1e-30, -1e-30, top * 1.06, -top * 9, float("inf"), -float("inf"),
                            float("nan"), -float("nan")])
    ks = torch.tensor([[1.0, 0.37], [3.3, 1e-3]])
    # values in scaled units: k / ks lands on the grid and its midpoints for every (b, h)
    mids = mids.bfloat16()  # exact (M + 1 <= 4 significant bits); its bf16 neighbours sit just beside each tie
    vals = torch.cat([grid, mids.float(), mids.nextafter(torch.tensor(float("inf")).bfloat16()).float(),
                      mids.nextafter(torch.tensor(-float("inf")).bfloat16()).float(), special])
    D = 64
    rows = -(-vals.numel() // D)
    flat = torch.zeros(rows * D)
    flat[:vals.numel()] = vals
    # head (0, 0) has scale 1: exactly the values above; the others divide bf16 values by scales that are not
    # powers of two (the fp32 division must round as torch's does)
    k = (flat.view(1, rows, 1, D) * ks[:, None, :, None]).bfloat16()
    for page in (0, 16):
        gen = torch.Generator().manual_seed(0)
        kc, vc, table = _cache(2, 2, D, rows + 5, page, dtype, gen)
        lens = torch.tensor([5, 2], dtype=torch.int32)
        flash_attn_with_kvcache(torch.zeros(2, 1, 2, D).bfloat16(), kc, vc, k, -k, cache_seqlens=lens,
                                block_table=table, k_descale=ks, v_descale=ks.flip(0))
        for b in range(2):
            n = int(lens[b])
            got_k = _rows(kc, table, b, n + rows, page)[n:].view(torch.uint8)
            got_v = _rows(vc, table, b, n + rows, page)[n:].view(torch.uint8)
            assert torch.equal(got_k, _quantise(k[b:b + 1], ks[b:b + 1], dtype)[0].view(torch.uint8))
            assert torch.equal(got_v, _quantise(-k[b:b + 1], ks.flip(0)[b:b + 1], dtype)[0].view(torch.uint8))


# ----------------------------------------------------------------------------- bad input
def _args(dtype=torch.float8_e4m3fn, page=16, B=3, Hkv=2):
    gen = torch.Generator().manual_seed(1)
    kc, vc, table = _cache(B, Hkv, 32, 64, page, dtype, gen)
    kc.view(torch.uint8).zero_()
    vc.view(torch.uint8).zero_()
    return dict(q=torch.randn(B, 1, 2 * Hkv, 32).bfloat16(), k_cache=kc, v_cache=vc,
                k=torch.randn(B, 1, Hkv, 32).bfloat16(), v=torch.randn(B, 1, Hkv, 32).bfloat16(),
                cache_seqlens=torch.tensor([3, 10, 0], dtype=torch.int32), block_table=table,
                k_descale=torch.full((B, Hkv), 0.01), v_descale=torch.full((B, Hkv), 0.02))


def _call_keeps_cache(args, exc, words, **kw):
    from rocmflash import flash_attn_with_kvcache

    before = [args[n].view(torch.uint8).clone() for n in ("k_cache", "v_cache")]
    with pytest.raises(exc) as info:
        flash_attn_with_kvcache(**args, **kw)
    msg = str(info.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    for name, b in zip(("k_cache", "v_cache"), before):
        assert torch.equal(args[name].view(torch.uint8), b), f"{name} was written"


@pytest.mark.parametrize("arch,dtype,words", [
    ("gfx942", torch.float8_e4m3fn, ["gfx942", "FNUZ", "float8_e4m3fnuz"]),
    ("gfx942", torch.float8_e5m2, ["gfx942", "FNUZ"]),
    ("gfx950", torch.float8_e4m3fnuz, ["gfx950", "OCP", "float8_e4m3fn"]),
    ("sm_90", torch.float8_e5m2fnuz, ["sm_90", "OCP"]),
    ("gfx90a", torch.float8_e4m3fnuz, ["gfx90a", "no fp8"]),
    ("sm_80", torch.float8_e4m3fn, ["sm_80", "no fp8"]),
])
def test_wrong_format_for_the_arch_is_refused(interpret, monkeypatch, arch, dtype, words):
    from rocmflash.api import selection

    monkeypatch.setattr(selection, "device_identity", lambda device: (None, arch))
    _call_keeps_cache(_args(dtype), TypeError, words)


@pytest.mark.parametrize("arch,dtype", [("gfx942", torch.float8_e4m3fnuz), ("gfx950", torch.float8_e5m2),
                                        ("sm_90", torch.float8_e4m3fn)])
def test_the_archs_own_format_runs(interpret, monkeypatch, arch, dtype):
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api import selection

    monkeypatch.setattr(selection, "device_identity", lambda device: (None, arch))
    out = flash_attn_with_kvcache(**_args(dtype))
    assert torch.isfinite(out).all()


def _bad(**change):
    return change


@pytest.mark.parametrize("change,exc,words", [
    (_bad(k_descale=None), ValueError, ["k_descale is required", "(3, 2)"]),
    (_bad(k_descale=None, v_descale=None), ValueError, ["k_descale is required"]),
    (_bad(v_descale=None), ValueError, ["v_descale is required"]),
    (_bad(k_descale=torch.full((3, 2), 0.01).half()), TypeError, ["k_descale.dtype", "float32"]),
    (_bad(v_descale=torch.full((2, 3), 0.01)), ValueError, ["v_descale", "(3, 2)", "(2, 3)"]),
    (_bad(k_descale=torch.full((3,), 0.01)), ValueError, ["k_descale", "(batch, kv_heads)"]),
    (_bad(k_descale=torch.full((3, 2, 1), 0.01)), ValueError, ["k_descale", "(batch, kv_heads)"]),
    (_bad(k_descale=0.01), TypeError, ["k_descale", "torch.Tensor"]),
    (_bad(v_descale=torch.full((3, 2), 0.01, device="meta")), ValueError, ["v_descale", "meta"]),
])
def test_missing_or_misshaped_descales(interpret, change, exc, words):
    args = _args()
    args.update(change)
    _call_keeps_cache(args, exc, words)


def test_mixed_or_16bit_caches_with_descales(interpret):
    args = _args()
    args["v_cache"] = torch.zeros(args["v_cache"].shape, dtype=torch.bfloat16)
    _call_keeps_cache(args, TypeError, ["k_cache and v_cache", "float8_e4m3fn", "bfloat16"])
    args = _args()
    args["v_cache"] = args["v_cache"].view(torch.float8_e5m2)
    _call_keeps_cache(args, TypeError, ["k_cache and v_cache", "float8_e5m2"])
    args = _args()
    for name in ("k_cache", "v_cache"):
        args[name] = torch.zeros(args[name].shape, dtype=torch.bfloat16)
    _call_keeps_cache(args, TypeError, ["k_descale applies to an fp8 cache only"])
    args["k_descale"] = None
    _call_keeps_cache(args, TypeError, ["v_descale applies to an fp8 cache only"])
    args = _args()
    args["k"] = args["k"].float()  # new keys in q's dtype only
    _call_keeps_cache(args, TypeError, ["k.dtype"])


BAD_VALUES = [float("nan"), float("inf"), -float("inf"), 0.0, -0.5]


@pytest.mark.parametrize("page", [0, 16])
@pytest.mark.parametrize("which", ["k_descale", "v_descale"])
@pytest.mark.parametrize("value", BAD_VALUES)
def test_bad_descale_values_write_nothing_and_are_reported(interpret, page, which, value):
    """Default path: no host read; the append kernel writes nothing anywhere (not even other sequences' rows)
    and the error word reports it -- through check_errors, and the next call."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api.decode import check_errors

    args = _args(page=page)
    args[which][2, 1] = value
    before = [args[n].view(torch.uint8).clone() for n in ("k_cache", "v_cache")]
    flash_attn_with_kvcache(**args)  # returns: values are not read on the host
    assert torch.equal(args["k_cache"].view(torch.uint8), before[0])
    assert torch.equal(args["v_cache"].view(torch.uint8), before[1])
    with pytest.raises(ValueError, match="k_descale/v_descale not finite and > 0"):
        check_errors()
    check_errors()  # reported once
    flash_attn_with_kvcache(**dict(args, k=None, v=None))  # no append: the decode kernel reports it too
    with pytest.raises(ValueError, match="an earlier call got .*k_descale/v_descale"):
        flash_attn_with_kvcache(**dict(args, k=None, v=None))


@pytest.mark.parametrize("which", ["k_descale", "v_descale"])
def test_bad_descale_with_check_values_raises_before_writing(interpret, which):
    args = _args()
    args[which][1, 0] = float("nan")
    _call_keeps_cache(args, ValueError, [f"{which}[1, 0] = nan", "finite and > 0"], check_values=True)


def test_default_fp8_call_reads_no_descale_back(interpret, monkeypatch):
    """No ``.tolist()``/``.item()``/``float()``/``bool()`` of the descales on the default path."""
    from rocmflash import flash_attn_with_kvcache

    args = _args()
    reads = []
    for name in ("tolist", "item", "__float__", "__int__", "__bool__", "nonzero"):
        real = getattr(torch.Tensor, name)

        def spy(self, *a, _real=real, _name=name, **kw):
            if self.dtype == torch.float32 and self.shape == (3, 2):
                reads.append(_name)
            return _real(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, spy)
    flash_attn_with_kvcache(**args)
    assert reads == []


# ----------------------------------------------------------------------------- cross-compiles
def _summary(kernel):
    from isa_tools import kernel_summary, read_code_object

    (res,) = read_code_object(kernel.asm["hsaco"])
    return kernel_summary(res, num_warps=kernel.metadata.num_warps, asm=kernel.asm["amdgcn"])


MLIR_TYPE = {"fp8e4b8": "f8E4M3FNUZ", "fp8e5b16": "f8E5M2FNUZ", "fp8e4nv": "f8E4M3FN", "fp8e5": "f8E5M2"}


@pytest.mark.parametrize("arch,kv_dtype,cvt", [("gfx942", "fp8e4b8", "v_cvt_pk_f32_fp8"),
                                               ("gfx942", "fp8e5b16", "v_cvt_pk_f32_bf8"),
                                               ("gfx950", "fp8e4nv", None), ("gfx950", "fp8e5", None)])
@pytest.mark.parametrize("paged", [False, True])
def test_fp8_decode_cross_compiles_for_amd(arch, kv_dtype, cvt, paged):
    """The arch's own fp8 cache builds with the per-arch default: no spill, no scratch, the occupancy of the
    bf16-cache build; half the bytes per cache load (byte loads of K/V, not 16-bit ones); on gfx942 the
    cache is widened with the hardware fp8/bf8 -> f32 conversions (Triton 3.6 converts in software on gfx950)."""
    from rocmflash.kernels.decode import host as KD

    cfg = KD.default_decode_config(arch, 128)
    fp8 = KD.compile_for(arch, cfg, 128, "bf16", group=8, paged=paged, kv_dtype=kv_dtype)[0]
    bf16 = KD.compile_for(arch, cfg, 128, "bf16", group=8, paged=paged)[0]
    s8, s16 = _summary(fp8), _summary(bf16)
    assert s8["arch"] == arch
    assert s8["vgpr_spill_count"] == 0 and s8["sgpr_spill_count"] == 0 and s8["scratch_bytes"] == 0, s8
    assert s8["waves_per_simd"] == s16["waves_per_simd"] >= 2, (s8, s16)
    assert MLIR_TYPE[kv_dtype] in fp8.asm["ttgir"]  # the cache is loaded as fp8
    # 16-byte loads: q's tile (16 rows x 128 bf16 over 256 lanes: one each) is the same in both builds and
    # every K/V tile load halves, so n16 = q + 2c and n8 = q + c: q = 2 n8 - n16 must be that one load
    n8, n16 = (k.asm["amdgcn"].count("buffer_load_dwordx4") for k in (fp8, bf16))
    assert n8 < n16 and 2 * n8 - n16 == 1, (n8, n16)
    if cvt:
        assert cvt in fp8.asm["amdgcn"] and cvt not in bf16.asm["amdgcn"]


def test_fp8_decode_cross_compiles_for_sm90():
    """sm_90 (the H100 the benchmark runs on): the fp8 default builds the e4m3 cache without spills, widening
    it with the hardware fp8 -> f16x2 conversion straight into fp16 MMAs (no second, scalar f16 -> bf16
    conversion per element: that made the first H100 build slower than the bf16 cache)."""
    from isa_tools import read_cubin
    from rocmflash.kernels.decode import host as KD

    k = KD.compile_for("sm_90", KD.default_decode_config("sm_90", 128, kv_fp8=True), 128, "bf16",
                       kv_dtype="fp8e4nv")[0]
    ptx = k.asm["ptx"]
    assert "cvt.rn.f16x2.e4m3x2" in ptx and "cvt.bf16.f16" not in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx and ".bf16.bf16" not in ptx
    (res,) = [r for r in read_cubin(k.asm["cubin"]) if r.name == "_decode_split"]
    assert res.arch == "sm_90" and res.local_bytes == 0, res


@pytest.mark.parametrize("arch,kv_dtype,words", [("gfx942", "fp8e4nv", ["gfx942", "FNUZ"]),
                                                 ("gfx950", "fp8e5b16", ["gfx950", "OCP"]),
                                                 ("gfx90a", "fp8e4b8", ["gfx90a", "no fp8"]),
                                                 ("gfx942", "fp16", ["kv_dtype", "fp8e4b8"])])
def test_fp8_decode_build_for_the_wrong_format_is_refused(arch, kv_dtype, words):
    """Refused before compiling: Triton 3.6 asserts (gfx950 FNUZ) or LLVM aborts the process (gfx90a)."""
    from rocmflash.kernels.decode import host as KD

    with pytest.raises(TypeError) as info:
        KD.compile_for(arch, KD.default_decode_config(arch, 128), 128, "bf16", kv_dtype=kv_dtype)
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("arch,dtype", [("gfx942", torch.float8_e4m3fnuz), ("gfx950", torch.float8_e4m3fn),
                                        ("sm_90", torch.float8_e5m2)])
def test_quantise_append_kernel_cross_compiles(arch, dtype):
    """The append kernel (integer rounding, div_rn, one atomic) builds for each arch's format without spills."""
    from rocmflash.config import KernelConfig
    from rocmflash.kernels import common as C
    from rocmflash.kernels.decode import quant as KQ

    class P(C.Ptr):
        def __init__(self, ty, strides):
            super().__init__(ty)
            self._s = strides

        def stride(self, dim=None):
            return self._s if dim is None else self._s[dim]

    class T(P):  # shapes too: append_args reads the cache's and the scales' extents
        def __init__(self, ty, strides, shape):
            super().__init__(ty, strides)
            self.shape = shape

    D = 128
    new = T("*bf16", (8 * D, 8 * D, D, 1), (8, 1, 8, D))
    cache = T("*u8", (4096 * 8 * D, 8 * D, D, 1), (8, 4096, 8, D))
    scale = T("*fp32", (8, 1), (8, 8))
    i32 = P("*i32", (1,))
    args = KQ.append_args(new, new, cache, cache, None, i32, scale, scale, i32, 0, seq_out=i32)
    k = C.compile_kernel(KQ._quant_append, arch, args, KQ._constexprs(dtype, D, False, 64, 8),
                         KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1))
    if arch.startswith("gfx"):
        s = _summary(k)
        assert s["arch"] == arch and s["vgpr_spill_count"] == 0 and s["scratch_bytes"] == 0, s
    else:
        assert "div.rn.f32" in k.asm["ptx"]


# ----------------------------------------------------------------------------- graph capture (found on the H100)
def test_poll_never_queries_an_event_while_a_graph_is_captured(monkeypatch):
    """A copy of the error word started by an eager call (every ERROR_POLL_CALLS calls) may still be pending
    when the next call is being captured into a CUDA graph, and ``Event.query()`` is not permitted during
    capture (CUDA error: operation not permitted when stream is capturing; the H100 fp8 benchmark hit it).
    The poll must leave the pending copy alone until capture ends."""
    from rocmflash.api import decode_errors as DE

    class PendingEvent:
        def query(self):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    dev = torch.device("cuda", 0)
    watch = DE._ErrorWatch()
    watch.event = PendingEvent()
    monkeypatch.setitem(DE._WATCHES, dev, watch)
    monkeypatch.setattr(DE, "_capturing", lambda device: True)
    DE._poll_errors(dev)  # capturing: no query, no copy
    assert isinstance(watch.event, PendingEvent)


def test_fp8_cache_gets_its_own_config_and_twice_the_programs(interpret, monkeypatch):
    """On NVIDIA an fp8 cache takes the fp8 default -- twice the key block (the bf16 block's bytes) and two
    programs per SM, since a pipelined loop then has half the bytes in flight (H100, kv_decode.programs_per_cu and
    default_decode_config) -- and never a database entry tuned for the 16-bit cache."""
    from rocmflash.api import decode as Dm
    from rocmflash.api import selection
    from rocmflash.kernels.decode import host as KD
    from rocmflash.db.lookups import decode as TD

    tuned = KD.DecodeConfig(BLOCK_N=32, num_warps=8, num_stages=2)
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    # a database holding one entry, tuned for the 16-bit cache: an fp8 cache looks up its own format's (none here)
    monkeypatch.setattr(TD, "lookup_decode", lambda *a, **k: None if a[7:] and a[7] else tuned)
    B, Hkv, D, S = 8, 4, 128, 32768
    q = torch.zeros(B, 1, 4 * Hkv, D).bfloat16()
    kv16 = torch.empty(B, S, Hkv, D, dtype=torch.bfloat16)
    kv8 = torch.empty(B, S, Hkv, D, dtype=torch.float8_e4m3fn)
    ones = torch.ones(B, Hkv)
    p16, p8 = (Dm._plan(q, c, c, None, None, S, None, None, False, (-1, -1), 0.0, 0, False, None, None, *d)
               for c, d in ((kv16, (None, None)), (kv8, (ones, ones))))
    assert p16.cfg == tuned  # the 16-bit cache is served the database entry
    assert p8.cfg == KD.default_decode_config("sm_90", D, kv_fp8=True)
    assert p8.cfg.BLOCK_N == 2 * KD.default_decode_config("sm_90", D).BLOCK_N and p8.cfg.num_stages >= 2
    assert KD.programs_per_cu(p8.cfg, True) == 2 * KD.programs_per_cu(p8.cfg)
    # 132 SMs, B * Hkv = 32 programs per split: round(2 * 132 / 32) = 8 splits (one program per SM: 4)
    assert p8.splits == KD.choose_num_splits(B, Hkv, S, p8.cfg.BLOCK_N, 132, 2) == 8
