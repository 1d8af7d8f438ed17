"""``fp8_forward``: the online-softmax forward for fp8 Q, K, V with per-(batch, kv head) descales (inference only).

The same one-pass algorithm as :mod:`rocmflash.kernels.forward.online` (one program per ``BLOCK_M``
query rows of one (batch, head); fp32 running max ``m``, row sum ``l`` and accumulator), with
both GEMMs in fp8 as flash-attn 3 runs them:

* ``S = Q·Kᵀ``: fp8 x fp8 matrix instructions (MFMA on gfx942/gfx950, MMA on sm_89+), fp32
  accumulation; then ``S * (q_descale * k_descale * softmax_scale * log2 e)``. Products of two
  fp8 values are exact in fp32, so S equals the dequantised ``q·k`` up to fp32 summation. The
  scale multiplies the scores *before* the row max, so any sign of the descales is exact (the
  bf16 kernels fold the sign into q instead, :mod:`rocmflash.api.scale`) and masking comes after it.
* softmax in fp32 (``exp2``, running max, rescale ``alpha``), as in ``online``.
* ``P·V``: ``P`` (in ``[0, 1]``, relative to the running max) is quantised to V's fp8 format
  **scaled by the format's largest value** ``P_SCALE`` (448 e4m3fn, 240 e4m3fnuz, 57344 e5m2):
  ``P8 = fp8(P * P_SCALE)`` (round to nearest even), then an fp8 x fp8 dot into the fp32
  accumulator; the output is ``acc * v_descale / (l * P_SCALE)`` with ``l`` the fp32 sum of the
  unquantised ``P``. Scaling by the format's max puts ``P = 1`` at the top of the range, so
  every ``P >= 2**emin / P_SCALE`` (e4m3fn: 3.5e-5, e4m3fnuz: 3.3e-5) is a normal fp8 number.

**Error bound** (against fp32 attention of the *dequantised* inputs). With ``u = 2**-(m+1)`` the
unit roundoff of V's format (m mantissa bits: ``u = 2**-4`` for e4m3, ``2**-3`` for e5m2) and
``delta = 2**(emin - m - 1) / P_SCALE`` half the subnormal spacing below the normal range, each
quantised weight obeys ``|P8/P_SCALE - P| <= u * P + delta``. Summed over the keys of a row,
``|O - O_ref| <= u * sum_j(P_j |V_j|) / l + n_keys * delta * max|V| + (fp32 terms)``, then the
output cast (bf16: ``2**-9 |O|``; fp16: ``2**-11 |O|``). The softmax denominator is exact fp32, so
the first term is at most ``u * max_j |V_j|``: a 6.25 % (e4m3) or 12.5 % (e5m2) worst case per
element; on random data the per-key errors cancel and the typical error is ~``u / sqrt(keys)``.
``tests/test_fp8_forward.py`` checks this bound element by element and that ``P`` really is
rounded at this scale. Typical error: P's rounding errors (``|e| <= u``, rms about ``0.4 u`` for
weights spread over binades) enter each key's share of ``O``, so for zero-mean ``V`` the relative L2
error is about the rms of ``e``: 2-2.5e-2 for e4m3 against bf16's 2e-3 (an H100 measured 2.0-2.5e-2
against the dequantised reference; the interpreter gives 2.3-2.4e-2 on the same kind of data). It is
P's quantisation, as in flash-attn 3, not the GPU's arithmetic.

**Compiled on a GPU** the fp8 MMAs do not accumulate in fp32: Hopper keeps about 14 significant bits
(DeepSeek-V3 report, arXiv:2412.19437, section 3.3.2; SageAttention2, arXiv:2411.10958: an FP22
accumulator, 13 fraction bits). With ``u_mma = 2**-13`` (truncation) an n-term dot is off by at most
``g(n) = (n + ceil(n/32) + 8) * u_mma`` times ``sum |terms|`` (each product and each 32-deep
instruction's sum cut once; a last key block runs whole). Two more terms follow: (1) a score
``q·k_j`` off by ``eps_j = |softmax_scale * qd * kd| * g(D) * sum_d |q_d k_jd|`` moves weight j by at most
``p_j r_j``, ``r_j = max(e^eps_j / sum_k p_k e^-eps_k - 1, 1 - e^-eps_j / sum_k p_k e^eps_k)``, adding
``sum_j p_j r_j |V_j|``; (2) P·V's sums add ``g(n_keys) * (1 + u) * sum_j p'_j |V_j|``. The interpreter's
bound has neither (exact fp32). Worst cases: with scores of standard deviation 2 the first term makes
the bound ~17x the exact one; with integer q, k (every partial score sum exact in 14 bits) ~2x.

**V layout.** The P·V dot's B operand is V with the keys as K. Where :func:`kmajor_v` (sm_89/sm_90/
sm_12x, gfx942) :func:`launch` reads V K-major -- memory ``(B, Hkv, D, Sk16)``, one copy of
``2 * B * Hkv * Sk * D`` bytes per call (read + write) unless ``v.stride(2) == 1`` already -- so
Hopper's fp8 ``wgmma`` gets K-major tiles by ``cp.async`` instead of a synchronous load transposed
into shared memory byte by byte.

Head-dim pieces and key blocks are at least 32 wide (NVIDIA's 8-bit MMA needs K >= 32; on AMD the
fp8 MFMAs take K = 16 or 32 per instruction); non-causal and causal (bottom-right aligned), GQA,
any lengths, D in 16..256, any strides. Every program checks that its descale product and
``v_descale`` are finite and sets a bit of :func:`rocmflash.kernels.fp8.errors.error_word` when not.

Under Triton 3.6's interpreter fp8 needs two repairs, applied only around interpreted launches
(:func:`_interpreter_fp8`): FNUZ element types fail with "fail to convert fp8e4b8 to ir type"
(the interpreter's ``dtype.to_ir`` lists only the OCP ones), and ``fp32 -> fp8`` rounding is
wrong (``_convert_float`` rounds half-up on one guard bit, ORs a mantissa carry into the exponent
field instead of adding it, and does not saturate): the conversion is replaced by torch's,
which rounds to nearest even as the hardware conversions do.
"""

from __future__ import annotations

import contextlib
import functools

import triton.language as tl

from rocmflash.config import KernelConfig, Problem
from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit
from rocmflash.kernels.fp8.errors import error_word
from rocmflash.kernels.fp8.vlayout import V_ROW_ALIGN, kmajor_copy, padded_keys

MIN_PIECE = 32  #: narrowest head-dim piece and key block (8-bit dots need K >= 32 on NVIDIA)


@kernel_jit
def fp8_block(acc0, acc1, m_i, l_i, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
              stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K, SEQ_V,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
              CAUSAL: tl.constexpr, MASK: tl.constexpr, PRE_LOAD_V: tl.constexpr, P_SCALE: tl.constexpr):
    """One online-softmax step over keys ``[start_n, start_n + BLOCK_N)``: fp8 dots, fp32 softmax.

    V rows ``[SEQ_K, SEQ_V)`` are zeros the launcher padded (their weights are 0): masking V at
    ``SEQ_V``, a multiple of 16, keeps a K-major V's masked loads 16 bytes wide."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    s = C.qk_scores(q0, q1, K_base, offs_n, stride_kn, stride_kd, SEQ_K, HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    if PRE_LOAD_V:
        v0, v1 = C.load_v_pieces(V_base, offs_n, stride_vn, stride_vd, SEQ_V, HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    s = s * qk_scale  # log2 domain; before the max and the mask, so a negative descale product is exact
    if MASK:
        s = C.mask_scores(s, offs_m, offs_n, SEQ_Q, SEQ_K, CAUSAL)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASK:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2(-inf) = 0, not NaN
    else:
        m_use = m_new
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)  # the unquantised weights: an exact fp32 denominator
    if not PRE_LOAD_V:
        v0, v1 = C.load_v_pieces(V_base, offs_n, stride_vn, stride_vd, SEQ_V, HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    p8 = (p * P_SCALE).to(v0.dtype)  # P = 1 at the format's largest value: the whole range in use
    acc0 = tl.dot(p8, v0, acc0 * alpha[:, None])
    if BLOCK_D1 > 0:
        acc1 = tl.dot(p8, v1, acc1 * alpha[:, None])
    return acc0, acc1, m_new, l_i


@kernel_jit
def _fwd_fp8(Q, K, V, O, LSE, ERR, QD, KD, VD, sm_scale,
             stride_qz, stride_qh, stride_qm, stride_qd,
             stride_kz, stride_kh, stride_kn, stride_kd,
             stride_vz, stride_vh, stride_vn, stride_vd,
             stride_oz, stride_oh, stride_om, stride_od,
             stride_qdz, stride_qdh, stride_kdz, stride_kdh, stride_vdz, stride_vdh,
             H_Q, GROUP, SEQ_Q, SEQ_K, SEQ_V,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr, CAUSAL: tl.constexpr,
             PRE_LOAD_V: tl.constexpr, STORE_LSE: tl.constexpr, P_SCALE: tl.constexpr):
    start_m, off_bh, off_z, off_h, off_hk = C.program_heads(H_Q, GROUP, BLOCK_M, CAUSAL)
    # GQA/MQA: descales are per K/V head (off_hk), as in flash-attn 3
    qd = tl.load(QD + off_z * stride_qdz + off_hk * stride_qdh)
    kd = tl.load(KD + off_z * stride_kdz + off_hk * stride_kdh)
    vd = tl.load(VD + off_z * stride_vdz + off_hk * stride_vdh)
    qk_scale = qd * kd * sm_scale * 1.4426950408889634  # softmax scale x log2(e): the kernel uses exp2
    # |x| < inf is false for NaN and +-inf (and for a product that overflowed): report, do not stop
    ok = (tl.abs(qk_scale) < float("inf")) & (tl.abs(vd) < float("inf"))
    tl.store(ERR, 1, mask=ok == 0)

    Q_base, K_base, V_base, O_base, offs_m = C.program_bases(
        Q, K, V, O, stride_qz, stride_qh, stride_kz, stride_kh, stride_vz, stride_vh, stride_oz, stride_oh,
        start_m, off_z, off_h, off_hk, BLOCK_M)
    q0, q1 = C.load_q(Q_base, offs_m, stride_qm, stride_qd, SEQ_Q, HEAD_DIM, BLOCK_D0, BLOCK_D1)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc0, acc1 = C.zero_accumulators(BLOCK_M, BLOCK_D0, BLOCK_D1)
    full_end, hi = C.kv_bounds(start_m, SEQ_Q, SEQ_K, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in range(0, full_end, BLOCK_N):  # unmasked blocks
        acc0, acc1, m_i, l_i = fp8_block(
            acc0, acc1, m_i, l_i, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K, SEQ_V,
            HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1, CAUSAL, False, PRE_LOAD_V, P_SCALE)
    for start_n in range(full_end, hi, BLOCK_N):  # diagonal / tail blocks
        acc0, acc1, m_i, l_i = fp8_block(
            acc0, acc1, m_i, l_i, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K, SEQ_V,
            HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1, CAUSAL, True, PRE_LOAD_V, P_SCALE)

    # rows that saw no key (causal, Sq > Sk) have l = 0: output 0, LSE -inf
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out_scale = vd / (l_safe * P_SCALE)  # undo P's scaling, apply V's descale
    C.store_o(O_base, acc0 * out_scale[:, None], offs_m, 0, stride_om, stride_od, SEQ_Q, HEAD_DIM,
              BLOCK_D0, BLOCK_D0 > HEAD_DIM)
    if BLOCK_D1 > 0:
        C.store_o(O_base, acc1 * out_scale[:, None], offs_m, BLOCK_D0, stride_om, stride_od, SEQ_Q,
                  HEAD_DIM, BLOCK_D1, BLOCK_D0 + BLOCK_D1 > HEAD_DIM)
    if STORE_LSE:
        lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453  # log2 domain -> natural log
        tl.store(LSE + off_bh.to(tl.int64) * SEQ_Q + offs_m, lse, mask=offs_m < SEQ_Q)


KERNELS = ("_fwd_fp8",)


# ----------------------------------------------------------------------------- host side
def fp8_pieces(head_dim: int, pad: bool = False) -> tuple[int, int]:
    """``(BLOCK_D0, BLOCK_D1)`` as :func:`~rocmflash.kernels.common.head_dim_pieces`, every piece >= 32 wide.

    A 16-wide second piece becomes 32 when that is still narrower than padding (72, 80 -> 64+32),
    else D is padded (48 -> 64); D <= 32 is one 32-wide piece."""
    d0, d1 = C.head_dim_pieces(head_dim, pad)
    d0 = max(d0, MIN_PIECE)
    if d1 and d1 < MIN_PIECE:
        d1 = MIN_PIECE
        if d0 + d1 >= C.next_pow2(head_dim):
            return C.next_pow2(head_dim), 0
    return d0, d1


def check_config(cfg: KernelConfig) -> KernelConfig:
    """``cfg`` validated, with the fp8 kernel's own bound: ``BLOCK_N >= 32`` (the P·V dot's K)."""
    cfg = C.check_problem_config(cfg, cfg.variant)
    if cfg.BLOCK_N < MIN_PIECE:
        raise ValueError(f"fp8 attention needs BLOCK_N >= {MIN_PIECE} (the K of the fp8 P·V dot), got {cfg.BLOCK_N}")
    return cfg


def kmajor_v(arch) -> bool:
    """Whether the kernel should read V K-major (keys contiguous, memory ``(B, Hkv, D, Sk)``) on ``arch``.

    The P·V dot's B operand is V with the keys as its K dimension. Cross-compiled with Triton 3.6
    (``tests/test_fp8_compile.py``): on sm_90 a row-major V is loaded synchronously and transposed
    through shared memory one byte at a time (64 ``st.shared.b8`` per thread per kernel at D=128)
    because fp8 ``wgmma`` reads only K-major B tiles; on sm_89/sm_120 (``mma.sync``) it costs 416
    ``prmt`` byte shuffles instead of 32; on gfx942 32 two-byte ``ds_write_b16`` LDS stores and 3-31
    more VGPRs. K-major V removes all of these. sm_100 (``tcgen05``) builds the same code either
    way and gfx950 reads V transposed from LDS in hardware (``ds_read_b64_tr_b8``; K-major costs
    6-10 more VGPRs there): those keep V as given. None (interpreter) keeps V as given."""
    arch = str(arch or "").split(":", 1)[0].lower()
    if arch == "gfx942":
        return True
    digits = "".join(c for c in arch[3:] if c.isdigit()) if arch.startswith("sm_") else ""
    return bool(digits) and int(digits) >= 89 and int(digits) // 10 != 10


def as_kmajor_v(v, keys=None):
    """``(v_kmajor, seq_v)``: ``v`` (``(B, H, Sk, D)``) as a view with ``stride(2) == 1``, and the key rows the
    kernel may read (``keys``: a kept plan's launch keys, :func:`launch_kept`).

    A ``v`` that already has keys contiguous is returned as is (``seq_v = Sk``). Otherwise one copy
    (reads and writes ``B*H*Sk*D`` bytes each, :func:`rocmflash.kernels.fp8.vlayout.kmajor_copy`) into
    ``(B, H, D, Sk16)`` memory, ``Sk16`` = Sk rounded up to :data:`V_ROW_ALIGN` with the pad zeroed (read by
    masked loads: weight 0, but never NaN): every row 16-byte aligned, ``seq_v = Sk16``."""
    Sk = v.shape[2]
    if v.stride(2) == 1 and Sk > 1:
        return v, Sk
    return kmajor_copy(v, keys)


@functools.lru_cache(maxsize=256)
def default_config(arch, head_dim: int) -> KernelConfig:
    """The fp8 kernel's default config on ``arch``: :func:`rocmflash.config.default_config` with key blocks >= 32,
    except sm_90 at D <= 128: BLOCK_N 128 (BM 128, 8 warps, 3 stages).

    An fp8 key tile holds twice the keys of a bf16 one in the same bytes, and with a K-major V
    the P·V ``wgmma`` takes K = BLOCK_N: 128 gives 4 k32 steps per key block instead of 2.
    Cross-compiled (ptxas, Triton 3.6): 200/247 registers (non-causal/causal) at D=128, 182
    at D=64, no local memory, 112 KiB / 56 KiB shared memory: one 8-warp CTA per SM, as BN 64. Cached (a call
    without a measured entry asks on every call; configs are immutable)."""
    from rocmflash.config import default_config as base

    cfg = base(arch, head_dim)
    if arch == "sm_90" and head_dim <= 128:
        cfg = cfg.replace(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
    return check_config(cfg.replace(BLOCK_N=max(cfg.BLOCK_N, MIN_PIECE)))


@functools.lru_cache(maxsize=1024)
def _constexprs(cfg: KernelConfig, head_dim: int, causal: bool, store_lse: bool, p_scale: float) -> dict:
    d0, d1 = fp8_pieces(head_dim, cfg.pad_head_dim)
    return dict(HEAD_DIM=head_dim, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D0=d0, BLOCK_D1=d1,
                CAUSAL=bool(causal), PRE_LOAD_V=cfg.PRE_LOAD_V, STORE_LSE=bool(store_lse), P_SCALE=float(p_scale))


def _args(q_strides, k_strides, v_strides, o_strides, d_strides, shape, tensors, sm_scale: float) -> dict:
    """The kernel's non-constexpr arguments in signature order."""
    _, Hq, Hkv, Sq, Sk, seq_v = shape
    q, k, v, o, lse, err, qd, kd, vd = tensors
    names = ("z", "h", "m", "d")
    args = dict(Q=q, K=k, V=v, O=o, LSE=lse, ERR=err, QD=qd, KD=kd, VD=vd, sm_scale=float(sm_scale))
    for prefix, strides in (("q", q_strides), ("k", k_strides), ("v", v_strides), ("o", o_strides)):
        for axis, stride in zip(names if prefix in "qo" else ("z", "h", "n", "d"), strides):
            args[f"stride_{prefix}{axis}"] = stride
    for prefix, (sz, sh) in zip(("qd", "kd", "vd"), d_strides):
        args[f"stride_{prefix}z"], args[f"stride_{prefix}h"] = sz, sh
    args.update(H_Q=Hq, GROUP=Hq // Hkv, SEQ_Q=Sq, SEQ_K=Sk, SEQ_V=seq_v)
    return args


def launch(q, k, v, q_descale, k_descale, v_descale, cfg: KernelConfig, causal: bool, sm_scale: float,
           out, lse=None, arch=None):
    """Run the fp8 kernel on validated ``(B, H, S, D)`` fp8 tensors and fp32 ``(B, Hkv)`` descales.

    ``out``: any-strided ``(B, Hq, Sq, D)`` bf16/fp16 tensor; ``lse`` (optional) contiguous fp32
    ``(B, Hq, Sq)``. ``arch`` (the device's, e.g. ``sm_90``): where :func:`kmajor_v`, V is read
    K-major (:func:`as_kmajor_v`: no copy when ``v.stride(2) == 1`` already). Sets
    :func:`rocmflash.kernels.fp8.errors.error_word` on a non-finite descale; returns ``(out, lse)``."""
    return launch_kept(q, k, v, q_descale, k_descale, v_descale, check_config(cfg), causal, sm_scale, out, lse,
                       kmajor_v(arch))


def launch_kept(q, k, v, q_descale, k_descale, v_descale, cfg: KernelConfig, causal: bool, sm_scale: float, out,
                lse, kmajor: bool, keys=None):
    """:func:`launch` with its config already checked and ``kmajor`` (:func:`kmajor_v` of the arch) decided: what a
    kept plan of a checked call runs (:mod:`rocmflash.api.fp8_plans`). ``keys``: that plan's dict of kept launch
    keys (:func:`rocmflash.kernels.launch.kept_key`; the caller promises the tensors' dtypes, shapes, strides and
    device are those the plan was made for), or None."""
    v, seq_v = as_kmajor_v(v, keys) if kmajor else (v, v.shape[2])
    store_lse = lse is not None
    lse_arg = lse if store_lse else C.dummy_lse(q.device)
    err = error_word(q.device)
    causal, sm_scale = bool(causal), float(sm_scale)
    tensors = (q, k, v, out, lse_arg, err, q_descale, k_descale, v_descale)
    scalars = ("fp8", causal, sm_scale, store_lse, seq_v)

    def build():
        from rocmflash.hw.fp8 import fp8_max

        B, Hq, Sq, D = q.shape
        shape = (B, Hq, k.shape[1], Sq, k.shape[2], seq_v)
        grid = ((Sq + cfg.BLOCK_M - 1) // cfg.BLOCK_M, B * Hq)
        args = _args(q.stride(), k.stride(), v.stride(), out.stride(),
                     (q_descale.stride(), k_descale.stride(), v_descale.stride()), shape, tensors, sm_scale)
        return grid, args, _constexprs(cfg, D, causal, store_lse, fp8_max(v.dtype))

    backend = C.torch_backend()
    key = C.kept_key(keys, ("fp8",), _fwd_fp8, scalars, tensors, cfg, backend)
    with _interpreter_fp8() if C.interpreting() else contextlib.nullcontext():
        C.launch_cached(_fwd_fp8, scalars, tensors, build, cfg, backend, key)
    return out, lse


def compile_for(target, cfg: KernelConfig, problem: Problem, fp8_dtype=None):
    """Cross-compile for ``target`` without tensors; returns ``(kernel,)``.

    ``problem.dtype`` is the *output* dtype (bf16/fp16); ``fp8_dtype`` the inputs' torch fp8 dtype,
    by default the e4m3 format of the target's family (FNUZ on gfx940-942, OCP on gfx950/sm_89+).
    V has the layout :func:`launch` gives it on this arch (K-major where :func:`kmajor_v`, its
    key count padded as :func:`as_kmajor_v` pads it). A target without fp8 matrix instructions,
    or a dtype of the other family, is a ``TypeError``."""
    import torch

    from rocmflash.hw.fp8 import FAMILY_DTYPES, check_format, fp8_family, fp8_max, triton_type

    cfg = check_config(cfg)
    t = C.as_target(target)
    arch = str(t.arch) if t.backend == "hip" else f"sm_{t.arch}"
    if fp8_dtype is None:
        family = fp8_family(arch)
        fp8_dtype = FAMILY_DTYPES[family][0] if family else torch.float8_e4m3fn
    check_format(fp8_dtype, arch, "fp8_dtype")
    if t.backend == "hip":
        _claim_amd_generation(arch)
    p = problem

    def in_bytes(h, s):  # one-byte elements
        return p.batch * h * s * p.head_dim

    def contig(h, s):  # strides of a contiguous (B, H, S, D) tensor
        return (h * s * p.head_dim, s * p.head_dim, p.head_dim, 1)

    v_strides, seq_v = contig(p.heads_kv, p.seqlen_k), p.seqlen_k
    if kmajor_v(arch):  # memory (B, Hkv, D, Sk16), as as_kmajor_v lays it out
        seq_v = padded_keys(p.seqlen_k)
        v_strides = (p.heads_kv * p.head_dim * seq_v, p.head_dim * seq_v, 1, seq_v)
    ty = "*" + triton_type(fp8_dtype)
    ptrs = (C.Ptr(ty, in_bytes(p.heads_q, p.seqlen_q)), C.Ptr(ty, in_bytes(p.heads_kv, p.seqlen_k)),
            C.Ptr(ty, in_bytes(p.heads_kv, seq_v)), C.Ptr("*" + p.dtype, 2 * in_bytes(p.heads_q, p.seqlen_q)),
            C.Ptr("*fp32", 4 * p.batch * p.heads_q * p.seqlen_q if p.store_lse else 0), C.Ptr("*i32", 4),
            *(C.Ptr("*fp32", 4 * p.batch * p.heads_kv) for _ in range(3)))
    args = _args(contig(p.heads_q, p.seqlen_q), contig(p.heads_kv, p.seqlen_k), v_strides,
                 contig(p.heads_q, p.seqlen_q), ((p.heads_kv, 1),) * 3,
                 (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, seq_v), ptrs, 1.0)
    consts = _constexprs(cfg, p.head_dim, p.causal, p.store_lse, fp8_max(fp8_dtype))
    return (C.compile_kernel(_fwd_fp8, t, args, consts, cfg),)


_AMD_GENERATION: list = []  #: the CDNA generation of this process's first AMD fp8 compile


def _claim_amd_generation(arch: str) -> None:
    """Refuse an AMD fp8 compile for another CDNA generation than this process's first one.

    Triton 3.6's AMD backend builds its fp8 conversion table once per process (a function-local
    ``static DenseMap`` in ``ElementwiseOpToLLVM.cpp``, filled with the converters of the first
    compile's ISA family). After a gfx942 compile, gfx950 gets CDNA3's software ``fp32 -> fp8``
    conversion (no ``v_cvt_scalef32_pk_fp8_f32``; D=128 causal: 244 VGPRs instead of 178); after
    a gfx950 compile, gfx942 fails in ``Fp32_to_Fp8E4M3FNUZ_SW``. Either would be a wrong static
    number, so the second generation is an error: compile it in another process."""
    generation = "CDNA4" if arch == "gfx950" else "CDNA3"
    if not _AMD_GENERATION:
        _AMD_GENERATION.append((generation, arch))
    elif _AMD_GENERATION[0][0] != generation:
        first = _AMD_GENERATION[0][1]
        raise RuntimeError(f"cannot compile fp8 attention for {arch} in a process that compiled it for {first}: "
                           "Triton 3.6 keeps the first AMD generation's fp8 conversions for the whole process "
                           "(wrong code or a failed build); compile each of gfx942/gfx950 in its own process")


# ----------------------------------------------------------------------------- interpreter repairs
@contextlib.contextmanager
def _interpreter_fp8():
    """Let Triton 3.6's interpreter run this kernel's fp8: FNUZ element types and exact ``fp32 -> fp8`` rounding.

    Both patches are undone on the way out (compiled launches never see them)."""
    from triton.runtime import interpreter as I

    core, convert = I._patch_lang_core, I.InterpreterBuilder.create_fp_to_fp

    def patch_core(lang, scope):
        core(lang, scope)
        inner = lang.dtype.to_ir

        def to_ir(self, builder):
            if self.name == "fp8e4b8":
                return builder.get_fp8e4b8_ty()
            if self.name == "fp8e5b16":
                return builder.get_fp8e5b16_ty()
            return inner(self, builder)

        scope.set_attr(lang.dtype, "to_ir", to_ir)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        dst = dst_type.scalar
        if not (dst.is_fp8() and src.dtype.scalar.is_fp32()):
            return convert(self, src, dst_type, rounding_mode)
        return I.TensorHandle(_to_fp8_bits(src.data, dst), dst)

    I._patch_lang_core, I.InterpreterBuilder.create_fp_to_fp = patch_core, create_fp_to_fp
    try:
        yield
    finally:
        I._patch_lang_core, I.InterpreterBuilder.create_fp_to_fp = core, convert


def _to_fp8_bits(data, dst):
    """fp32 numpy array -> uint8 array of the fp8 type ``dst``, rounded to nearest even by torch."""
    import numpy as np
    import torch

    from rocmflash.hw.fp8 import FP8_DTYPES

    dtype = next(d for d, info in FP8_DTYPES.items() if info[1] == dst.name)
    x = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
    return x.to(dtype).view(torch.uint8).numpy().reshape(np.shape(data))


__all__ = ["launch", "launch_kept", "compile_for", "fp8_pieces", "check_config", "kmajor_v", "as_kmajor_v",
           "default_config", "KERNELS", "MIN_PIECE", "V_ROW_ALIGN"]
