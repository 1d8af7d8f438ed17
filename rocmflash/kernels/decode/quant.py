"""fp8 KV cache: the kernel that quantises new keys/values into an fp8 cache, and the fp8 layouts it writes.

``flash_attn_with_kvcache`` with an fp8 ``k_cache``/``v_cache`` takes new ``k``/``v`` in bf16/fp16
and writes ``saturate(k / k_descale[b, h])`` rounded to the nearest fp8 value (ties to even) at
``cache_seqlens[b] + t`` -- the same bytes as torch's
``(k.float() / k_descale[:, None, :, None]).clamp(-max, max).to(cache.dtype)``: fp32 division
correctly rounded (``div_rn``), one rounding to fp8 (RNE), out-of-range values (and ``inf``)
saturated to the format's largest finite value, NaN kept NaN.

**One launch, integer rounding.** The append is one program per (sequence, new token, K/V head),
K and V together, instead of a dozen torch ops (a decode step is host-bound at small batch). The
fp32 -> fp8 rounding is done with integer ops (:func:`_fp8_bits`), not with ``.to(fp8)``:
Triton 3.6's interpreter rounds fp8 half-up without carrying into the exponent and has no FNUZ
types at all, so only integer rounding gives the same bytes in the CPU tests and on every GPU.
(It costs a few ALU ops per appended element; the append moves ``B * Sk_new`` rows, not the cache.)

**Bad scales write nothing.** Every program reads all of ``k_descale``/``v_descale`` (``B * Hkv``
floats, from cache) and stores nothing when any is not finite and > 0, so a call with a bad scale
leaves the cache bytes exactly as they were -- decided on the GPU, without a host read -- and sets
``kv_decode.BAD_DESCALE`` in the decode error word. **Nor do bad lengths or pages:** a sequence whose length or
new rows' page is out of range stores none of its rows, as in the 16-bit append (:mod:`.append`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import triton.language as tl

from rocmflash.hw import fp8 as F8
from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit
from rocmflash.kernels.decode import append as KA
from rocmflash.kernels.decode.append import append_rows, report_unstored


class Fp8Layout(NamedTuple):
    """Bit layout of an fp8 format: mantissa bits, exponent bias, FNUZ (no -0 nor inf; NaN is 0x80)."""

    mant: int
    bias: int
    fnuz: bool


# Written out, not read from torch.finfo: torch 2.13's finfo(float8_e5m2fnuz).eps says 3 mantissa bits (it has 2).
# The largest finite values come from rocmflash.hw.fp8 (fp8_max).
# ``LAYOUTS`` (torch dtype -> Fp8Layout) and ``OCP_TWIN`` are made at their first use: the static phase's compile
# workers import this module to cross-compile and never import torch (seconds per process).
@functools.lru_cache(maxsize=None)
def _tables() -> tuple:
    import torch

    layouts = {
        torch.float8_e4m3fn: Fp8Layout(3, 7, False),
        torch.float8_e5m2: Fp8Layout(2, 15, False),
        torch.float8_e4m3fnuz: Fp8Layout(3, 8, True),
        torch.float8_e5m2fnuz: Fp8Layout(2, 16, True),
    }
    # the OCP format with the same bit layout as each FNUZ one (its exponent bias is one lower: a FNUZ
    # value is half the OCP value of the same byte, except the codes of NaN/inf, which the cache never holds)
    ocp_twin = {torch.float8_e4m3fnuz: torch.float8_e4m3fn, torch.float8_e5m2fnuz: torch.float8_e5m2}
    return layouts, ocp_twin


def __getattr__(name: str):
    if name == "LAYOUTS":
        return _tables()[0]
    if name == "OCP_TWIN":
        return _tables()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@kernel_jit
def _fp8_bits(x, MANT: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr, FMAX: tl.constexpr):
    """fp32 ``x`` -> the fp8 byte (int32 0..255): saturated to ``±FMAX``, rounded to nearest, ties to even.

    ``|x|`` = ``m24 * 2^(e - 23)`` with the 24-bit significand ``m24``; the fp8 quantum at exponent
    ``e`` is ``2^(max(e, 1 - BIAS) - MANT)`` (below ``2^(1 - BIAS)`` the format is subnormal), so the
    code's significand is ``m24`` shifted right by ``s = 23 - MANT + (max(e, 1 - BIAS) - e)``, rounded
    to even on the bits shifted out. The code is ``((e_eff + BIAS - 1) << MANT) + q``: a normal
    ``q >= 2^MANT`` supplies the exponent's implicit one, and a rounding carry into ``2^(MANT+1)``
    moves to the next exponent by itself. Saturating first keeps every code finite.
    """
    ibits = x.to(tl.int32, bitcast=True)
    negative = ibits < 0
    a = tl.minimum(tl.abs(x), FMAX)
    bits = a.to(tl.int32, bitcast=True)
    e_field = bits >> 23
    mant = bits & 0x7FFFFF
    m24 = tl.where(e_field == 0, mant, mant | 0x800000)
    e = tl.maximum(e_field, 1) - 127
    e_eff = tl.maximum(e, 1 - BIAS)
    s = tl.minimum(23 - MANT + (e_eff - e), 30)  # past 25 every m24 < 2^24 rounds to 0 anyway
    q = m24 >> s
    rem = m24 & ((1 << s) - 1)
    half = 1 << (s - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    code = ((e_eff + BIAS - 1) << MANT) + q
    if FNUZ:  # no negative zero (0x80 is NaN)
        code = tl.where(negative & (code != 0), code | 0x80, code)
        code = tl.where(x != x, 0x80, code)  # noqa: PLR0124 (NaN test)
    else:
        code = tl.where(negative, code | 0x80, code)
        code = tl.where(x != x, tl.where(negative, 0xFF, 0x7F), code)  # noqa: PLR0124 (NaN test)
    return code


@kernel_jit
def fp8_setup(q, KS_PTR, VS_PTR, FNUZ_VIEW: tl.constexpr):
    """A decode program's fp8 set-up: ``(q16, k_mult, v_mult, bad)``.

    The dots run in fp16 whatever q's dtype: the hardware widens fp8 to fp16 directly (H100:
    ``cvt.rn.f16x2.e4m3x2``; bf16 would take a second, scalar conversion per element, which
    made the first H100 build slower than the bf16 cache), P in fp16 keeps 3 more bits than in
    bf16, and every fp8 value is an fp16 value. q (bf16's range) is scaled by ``2^-s`` into
    ``[2^14, 2^15)`` at its largest element, so it neither overflows fp16 nor loses bits above
    ``max|q| 2^-28``; ``k_mult = k_descale * 2^s`` undoes it with the key scale (exact powers of two).
    ``bad``: a scale that is not finite and > 0 (NaN fails every compare).
    """
    ks = tl.load(KS_PTR)
    vs = tl.load(VS_PTR)
    bad = ~((ks > 0.0) & (ks < float("inf")) & (vs > 0.0) & (vs < float("inf")))
    if FNUZ_VIEW:  # interpreter only: a FNUZ cache read as its OCP twin is twice the value (launch_views)
        ks = ks * 0.5
        vs = vs * 0.5
    qf = q.to(tl.float32)
    qmax = tl.max(tl.max(tl.abs(qf), 1), 0)
    e = ((qmax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2(qmax)) (normal qmax)
    s = tl.minimum(tl.maximum(e - 14, -100), 100)
    down = ((127 - s) << 23).to(tl.float32, bitcast=True)  # 2^-s, exactly
    up = ((127 + s) << 23).to(tl.float32, bitcast=True)
    if FNUZ_VIEW:  # the twin's doubled values pass fp16's range (e5m2fnuz's top binade): interpreter dots in fp32
        return qf * down, ks * up, vs, bad
    return (qf * down).to(tl.float16), ks * up, vs, bad


@kernel_jit
def _scales_bad(KS, VS, stride_ksb, stride_ksh, stride_vsb, stride_vsh, NUM, H_KV, SCALE_BLOCK: tl.constexpr):
    """1 when any of the ``(B, Hkv)`` descales is not finite and > 0 (NaN fails both compares), else 0."""
    bad = 0
    for i0 in range(0, NUM, SCALE_BLOCK):
        idx = i0 + tl.arange(0, SCALE_BLOCK)
        live = idx < NUM
        b, h = idx // H_KV, idx % H_KV
        ks = tl.load(KS + b * stride_ksb + h * stride_ksh, mask=live, other=1.0)
        vs = tl.load(VS + b * stride_vsb + h * stride_vsh, mask=live, other=1.0)
        wrong = ~((ks > 0.0) & (ks < float("inf")) & (vs > 0.0) & (vs < float("inf")))
        bad = bad | tl.max(wrong.to(tl.int32), 0)
    return bad


@kernel_jit
def _quant_append(KN, VN, KC, VC, BT, SEQLENS, SEQ_OUT, KS, VS, ERR,
                  stride_knb, stride_knt, stride_knh, stride_knd, stride_vnb, stride_vnt, stride_vnh, stride_vnd,
                  stride_kcb, stride_kcn, stride_kch, stride_kcd, stride_vcb, stride_vcn, stride_vch, stride_vcd,
                  stride_btb, stride_ksb, stride_ksh, stride_vsb, stride_vsh,
                  NEW, H_KV, NUM_SCALES, CAPACITY, PAGE_SIZE, NUM_BLOCKS,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGED: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                  MANT: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr, FMAX: tl.constexpr,
                  BAD_DESCALE: tl.constexpr):
    bt_idx = tl.program_id(0)  # sequence * NEW + new token
    h = tl.program_id(1)
    b = bt_idx // NEW
    t = bt_idx % NEW
    given = tl.load(SEQLENS + b)
    if (t == 0) & (h == 0):  # the lengths the attention reads (a bad scale still leaves them right)
        tl.store(SEQ_OUT + b, given + NEW)
    bad = _scales_bad(KS, VS, stride_ksb, stride_ksh, stride_vsb, stride_vsh, NUM_SCALES, H_KV, SCALE_BLOCK)
    if bad != 0:  # write nothing anywhere; one program reports
        if (bt_idx == 0) & (h == 0):
            tl.atomic_or(ERR, BAD_DESCALE, sem="relaxed")
        return
    # as the 16-bit append (kv_append): a sequence with a length or page out of range stores nothing, and says so
    k_row, v_row, rows_bad = append_rows(b, t, given, BT, stride_btb, stride_kcb, stride_kcn, stride_vcb,
                                         stride_vcn, NEW, CAPACITY, PAGE_SIZE, NUM_BLOCKS, PAGED)
    report_unstored(ERR, rows_bad, (t == 0) & (h == 0))
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    smask = dmask & (rows_bad == 0)
    ks = tl.load(KS + b * stride_ksb + h * stride_ksh)
    vs = tl.load(VS + b * stride_vsb + h * stride_vsh)
    k = tl.load(KN + b.to(tl.int64) * stride_knb + t * stride_knt + h * stride_knh + offs_d * stride_knd,
                mask=dmask, other=0.0).to(tl.float32)
    v = tl.load(VN + b.to(tl.int64) * stride_vnb + t * stride_vnt + h * stride_vnh + offs_d * stride_vnd,
                mask=dmask, other=0.0).to(tl.float32)
    kq = _fp8_bits(tl.math.div_rn(k, ks), MANT, BIAS, FNUZ, FMAX)
    vq = _fp8_bits(tl.math.div_rn(v, vs), MANT, BIAS, FNUZ, FMAX)
    tl.store(KC + k_row + h * stride_kch + offs_d * stride_kcd, kq.to(tl.uint8), mask=smask)
    tl.store(VC + v_row + h * stride_vch + offs_d * stride_vcd, vq.to(tl.uint8), mask=smask)


@functools.lru_cache(maxsize=256)
def _constexprs(dtype, head_dim: int, paged: bool, num_scales: int, bad_bit: int) -> dict:
    lay = _tables()[0][dtype]
    return dict(HEAD_DIM=head_dim, BLOCK_D=max(16, C.next_pow2(head_dim)), PAGED=paged,
                SCALE_BLOCK=min(1024, max(16, C.next_pow2(num_scales))), MANT=lay.mant, BIAS=lay.bias,
                FNUZ=lay.fnuz, FMAX=F8.fp8_max(dtype), BAD_DESCALE=bad_bit)


def append_args(k, v, k_cache, v_cache, block_table, seqlens, k_descale, v_descale, err, page_size: int,
                bt=None, *, seq_out) -> dict:
    """The append kernel's arguments: the 16-bit append's (:func:`rocmflash.kernels.decode.append.append_args`) and
    the scales; ``k_cache``/``v_cache`` as uint8 views (the kernel stores bytes); ``bt``: the tensor standing in
    for ``block_table`` (None: ``seqlens``) in a contiguous cache's launch; ``seq_out``: where the lengths after
    the append go."""
    args = KA.append_args(k, v, k_cache, v_cache, block_table, seqlens, seq_out, page_size, err=err)
    if block_table is None and bt is not None:
        args["BT"] = bt
    sks, svs = k_descale.stride(), v_descale.stride()
    args.update(KS=k_descale, VS=v_descale, stride_ksb=sks[0], stride_ksh=sks[1], stride_vsb=svs[0],
                stride_vsh=svs[1], H_KV=k.shape[2], NUM_SCALES=k_descale.shape[0] * k_descale.shape[1])
    return args


def append_quantised(k_cache, v_cache, k, v, lens, block_table, page_size: int, k_descale, v_descale, err,
                     bad_bit: int, backend: str):
    """Quantise ``k``/``v`` ``(B, Sk_new, Hkv, D)`` into the fp8 caches at ``lens[b] + t`` (one launch, no host
    read); ``err``: the device's decode error word, into which ``bad_bit`` is ORed when a scale is bad
    (nothing is written to the caches then), and the bits of a sequence whose length or page is out of range
    (its rows are not written: :func:`rocmflash.kernels.decode.append.append_rows`). Returns the int32 ``(B,)``
    lengths after the append (``lens + Sk_new``), written by the same launch."""
    import torch

    B, new, hkv, d = k.shape
    kc, vc = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    bt = block_table if block_table is not None else lens  # unread without pages
    seq_out = torch.empty_like(lens)
    tensors = (k, v, kc, vc, bt, lens, seq_out, k_descale, v_descale, err)
    C.launch_cached(_quant_append, (k_cache.dtype, page_size, block_table is not None, bad_bit), tensors,
                    lambda: ((B * new, hkv),
                             append_args(k, v, kc, vc, block_table, lens, k_descale, v_descale, err, page_size,
                                         bt, seq_out=seq_out),
                             _constexprs(k_cache.dtype, d, block_table is not None, B * hkv, bad_bit)),
                    KA.append_config(), backend)
    return seq_out


def launch_views(kv_fp8: bool, k_cache, v_cache, k_descale, v_descale, seqlens) -> tuple:
    """``(k_cache, v_cache, k_scales, v_scales, fnuz_view)`` as ``kv_decode.launch`` passes them: a 16-bit
    cache gets ``seqlens`` as unread scale stand-ins. Under Triton 3.6's interpreter, which has no FNUZ
    types, a FNUZ cache is read as its OCP twin (same layout, bias one lower: twice the value) and the
    kernel halves the scales and dots in fp32 (``fnuz_view``: the doubled e5m2 values pass fp16's range);
    compiled builds read the FNUZ types themselves and dot in fp16."""
    if kv_fp8 != (k_descale is not None and v_descale is not None):
        raise ValueError("k_descale and v_descale must be given exactly when the DecodeCall has kv_fp8=True")
    if not kv_fp8:
        return k_cache, v_cache, seqlens, seqlens, False
    twin = _tables()[1]
    fnuz_view = k_cache.dtype in twin and C.interpreting()
    if fnuz_view:
        k_cache, v_cache = k_cache.view(twin[k_cache.dtype]), v_cache.view(twin[v_cache.dtype])
    return k_cache, v_cache, k_descale, v_descale, fnuz_view


def check_kv_type(kv_dtype: str, target) -> str:
    """``kv_dtype`` (a Triton fp8 type name) when ``target`` computes in its format, else a one-line ``TypeError``
    naming the arch and the types expected (a build of the other family fails deep in LLVM, or aborts it)."""
    t = C.as_target(target)
    arch = t.arch if t.backend == "hip" else f"sm_{t.arch}"
    if F8.TRITON_FAMILY.get(kv_dtype, "") == F8.fp8_family(arch):  # the cross-compile's case: no torch import
        return kv_dtype
    by_name = {F8.triton_type(d): d for d in F8.FP8_DTYPES}
    if kv_dtype not in by_name:
        raise TypeError(f"kv_dtype must be one of {', '.join(by_name)} (an fp8 cache), got {kv_dtype!r}")
    F8.check_format(by_name[kv_dtype], arch, "k_cache")
    return kv_dtype


__all__ = ["LAYOUTS", "OCP_TWIN",  # noqa: F822 (made at their first use, by __getattr__)
           "append_args", "append_quantised", "check_kv_type", "fp8_setup", "launch_views"]
