"""``online``: the classic one-pass online-softmax forward kernel (FlashAttention-2).

One program owns ``BLOCK_M`` query rows of one (batch, head) and walks every allowed
key block once. It carries the fp32 output accumulator ``acc[BLOCK_M, D]`` plus the
running row max ``m_i`` and row sum ``l_i`` across the whole loop; each new block
rescales ``acc`` by ``alpha = exp2(m_old - m_new)``. That accumulator is what dominates
register use on wave-64 hardware (``BLOCK_M * D / (64 * num_warps)`` VGPRs per lane);
the other variants trade it away.

The key loop runs in two parts: whole blocks that need no mask (no tail, fully below
the causal diagonal) and the few blocks that do. Fully masked causal blocks are never
visited. ``PRE_LOAD_V`` issues the V load together with K (more registers live, more
latency hidden).

Head dims that are not powers of two use two head-dim pieces (see
:mod:`rocmflash.kernels.common`): two accumulating dots for QKᵀ and two accumulator
tiles ``acc0[BLOCK_M, D0]``, ``acc1[BLOCK_M, D1]``.

**Register budget on AMD.** MFMA takes both operands from VGPRs, and every wave of a
``[num_warps, 1]`` layout multiplies by the *whole* K and V tiles. At AMD's default
tile (128x64, 4 warps, ``waves_per_eu=2``: at most 256 registers per lane) and D=128,
the one-piece kernel (gfx942, Triton 3.6) has 147 VGPRs live into every iteration: the
accumulator (64) plus ``m``/``l``, Q in operand form (32), ~35 loop-invariant LDS and
global addresses that LLVM hoists out of the loop, and the lane indices the masked loop
and the epilogue need. One key block then wants S, P (fp32 while ``exp2`` and, on
gfx942, a software bf16 conversion run) and the whole V tile as operands (64): the peak
(248 live) is at P's conversion, and the 4 lane-index values held across the unmasked
loop for the masked one go to scratch. So when a config asks for that occupancy and the
accumulator plus one V tile alone fill half of the budget (:func:`_halve_head_dim`), a
power-of-two D runs as two pieces D/2 + D/2 as well: the same arithmetic, but K, V and
Q are staged and read as two narrower tiles, so the scheduler can hold half of V at the
peak (gfx950: 229 -> 207 VGPRs) and hoists fewer addresses (gfx942: 256 + 4 spilled ->
250). All of AMD's 128x64 ``waves_per_eu=2`` siblings (mfma 0/16/32, kpack 1/2,
``PRE_LOAD_V``) then fit on gfx942 and gfx950 at D=64/128 with no spills (Triton 3.6 and
3.9); ``benchmarks/evidence/amd_tiles.py`` prints the table (``docs/evidence/amd-tiles-2026-11-23.md``).
With 128-wide key blocks (128x128 w4, 256x128 w8) the masked blocks also run half as wide
and, except with 16x16 MFMAs, before the unmasked ones (:func:`_masked_blocks`).

**Attention sinks** (gpt-oss: one learnable logit per query head joined to the softmax
denominator): ``Sinks`` is an optional fp32 ``(Hq,)`` pointer; each row's running max and sum
start at the sink instead of ``-inf`` / 0 (:func:`rocmflash.kernels.common.softmax_start`). Without
sinks it is the constexpr None: no kernel argument and the same code as before.
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.config import KernelConfig, Problem
from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit


@kernel_jit
def online_block(acc0, acc1, m_i, l_i, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
                 stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
                 CAUSAL: tl.constexpr, MASK: tl.constexpr, PRE_LOAD_V: tl.constexpr):
    """One online-softmax step over keys ``[start_n, start_n + BLOCK_N)`` (shared with split_kv)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    s = C.qk_scores(q0, q1, K_base, offs_n, stride_kn, stride_kd, SEQ_K,
                    HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    if PRE_LOAD_V:
        v0, v1 = C.load_v_pieces(V_base, offs_n, stride_vn, stride_vd, SEQ_K, HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    if MASK:
        s = C.mask_scores(s, offs_m, offs_n, SEQ_Q, SEQ_K, CAUSAL)
    # new running max, in the log2 domain (qk_scale already holds log2(e))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    if MASK:
        # a row with no allowed key so far keeps m = -inf; subtract 0 instead of -inf
        # so that exp2 gives 0 rather than NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(s * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)  # rescale of everything accumulated so far
    l_i = l_i * alpha + tl.sum(p, 1)
    if not PRE_LOAD_V:
        v0, v1 = C.load_v_pieces(V_base, offs_n, stride_vn, stride_vd, SEQ_K, HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    p = p.to(v0.dtype)
    acc0 = tl.dot(p, v0, acc0 * alpha[:, None])
    if BLOCK_D1 > 0:
        acc1 = tl.dot(p, v1, acc1 * alpha[:, None])
    return acc0, acc1, m_new, l_i


@kernel_jit
def _fwd_online(Q, K, V, O, LSE, Sinks, qk_scale,
                stride_qz, stride_qh, stride_qm, stride_qd,
                stride_kz, stride_kh, stride_kn, stride_kd,
                stride_vz, stride_vh, stride_vn, stride_vd,
                stride_oz, stride_oh, stride_om, stride_od,
                H_Q, GROUP, SEQ_Q, SEQ_K,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
                CAUSAL: tl.constexpr, PRE_LOAD_V: tl.constexpr, STORE_LSE: tl.constexpr,
                MASKED_N: tl.constexpr, MASKED_FIRST: tl.constexpr):
    start_m, off_bh, off_z, off_h, off_hk = C.program_heads(H_Q, GROUP, BLOCK_M, CAUSAL)
    Q_base, K_base, V_base, O_base, offs_m = C.program_bases(
        Q, K, V, O, stride_qz, stride_qh, stride_kz, stride_kh, stride_vz, stride_vh, stride_oz, stride_oh,
        start_m, off_z, off_h, off_hk, BLOCK_M)
    q0, q1 = C.load_q(Q_base, offs_m, stride_qm, stride_qd, SEQ_Q, HEAD_DIM, BLOCK_D0, BLOCK_D1)

    m_i, l_i = C.softmax_start(Sinks, off_h, BLOCK_M)
    acc0, acc1 = C.zero_accumulators(BLOCK_M, BLOCK_D0, BLOCK_D1)

    full_end, hi = C.kv_bounds(start_m, SEQ_Q, SEQ_K, BLOCK_M, BLOCK_N, CAUSAL)
    # AMD wide tiles run the masked blocks MASKED_N = BLOCK_N / 2 keys wide, and before the unmasked
    # ones when MASKED_FIRST (_masked_blocks); elsewhere MASKED_N = BLOCK_N, last. full_end is a
    # multiple of BLOCK_N, and every masked block holds an allowed key of the tile's last row.
    if MASKED_FIRST:
        for start_n in range(full_end, hi, MASKED_N):  # diagonal / tail blocks
            acc0, acc1, m_i, l_i = online_block(
                acc0, acc1, m_i, l_i, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
                stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
                HEAD_DIM, MASKED_N, BLOCK_D0, BLOCK_D1, CAUSAL, True, PRE_LOAD_V)
    for start_n in range(0, full_end, BLOCK_N):  # unmasked blocks
        acc0, acc1, m_i, l_i = online_block(
            acc0, acc1, m_i, l_i, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
            HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1, CAUSAL, False, PRE_LOAD_V)
    if not MASKED_FIRST:
        for start_n in range(full_end, hi, MASKED_N):  # diagonal / tail blocks
            acc0, acc1, m_i, l_i = online_block(
                acc0, acc1, m_i, l_i, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
                stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
                HEAD_DIM, MASKED_N, BLOCK_D0, BLOCK_D1, CAUSAL, True, PRE_LOAD_V)

    # rows that saw no key (causal, Sq > Sk) have l = 0: output 0, LSE -inf (with a sink: l = 1, output 0,
    # LSE = the sink)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    inv_l = 1.0 / l_safe
    C.store_o(O_base, acc0 * inv_l[:, None], offs_m, 0, stride_om, stride_od, SEQ_Q, HEAD_DIM,
              BLOCK_D0, BLOCK_D0 > HEAD_DIM)
    if BLOCK_D1 > 0:
        C.store_o(O_base, acc1 * inv_l[:, None], offs_m, BLOCK_D0, stride_om, stride_od, SEQ_Q,
                  HEAD_DIM, BLOCK_D1, BLOCK_D0 + BLOCK_D1 > HEAD_DIM)
    if STORE_LSE:
        lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453  # log2 domain -> natural log
        tl.store(LSE + off_bh.to(tl.int64) * SEQ_Q + offs_m, lse, mask=offs_m < SEQ_Q)


KERNELS = ("_fwd_online",)


def _constexprs(cfg: KernelConfig, head_dim: int, causal: bool, store_lse: bool) -> dict:
    d0, d1 = C.resolve_pieces(cfg, head_dim)
    if _halve_head_dim(cfg, d0, d1):
        d0 = d1 = d0 // 2
    masked_n, masked_first = _masked_blocks(cfg, d0 + d1)
    # Sinks=None: no attention sinks, a constexpr (no kernel argument); a launch with sinks passes the
    # tensor in its place (common.launch_forward)
    return dict(HEAD_DIM=head_dim, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D0=d0,
                BLOCK_D1=d1, CAUSAL=bool(causal), PRE_LOAD_V=cfg.PRE_LOAD_V, STORE_LSE=bool(store_lse),
                MASKED_N=masked_n, MASKED_FIRST=masked_first, Sinks=None)


def _masked_blocks(cfg: KernelConfig, width_d: int) -> tuple[int, bool]:
    """``(width, first)`` of the masked (diagonal / tail) key blocks: ``(BLOCK_N, False)`` except on AMD wide tiles.

    With 128-wide key blocks and an occupancy target (``waves_per_eu >= 2``: 256 registers),
    a masked block needs more registers than an unmasked one (the mask, the ``-inf`` guard,
    exec-masked K/V loads) on top of an S tile of 64 fp32 per lane (128x128, 4 warps): at
    D=128, gfx950 spilled 19 VGPRs causal and reloaded them inside both loops. So there the
    masked blocks run ``BLOCK_N / 2`` keys at a time (the same keys; half the S, P and V
    registers at once) and *before* the unmasked loop, so that their lane-index values and
    LDS addresses are dead during it instead of held across it (run after it, 4-5 of them
    spill around it). With 16x16 MFMAs (``matrix_instr_nonkdim=16``) the unmasked loop is
    itself at the 256 cap and fits only as the first loop (masked blocks first: 4-5 VGPRs
    spilled, 2 reloaded inside it), so there the half-width masked blocks stay last. gfx950, D=128,
    128x128 w4: 0 spills (mfma 0/32), 0-1 outside the loops (mfma16); 256x128 w8: 1-2
    outside the loops. Online softmax does not depend on the block order beyond rounding; a
    row with no allowed key among the masked blocks keeps ``m = -inf`` and its first
    unmasked block rescales by ``exp2(-inf) = 0``. ``waves_per_eu`` is an AMD-only option
    (0 on NVIDIA), so CUDA builds keep ``(BLOCK_N, False)`` and their code. Only where the fp32
    accumulator (``width_d`` = the head-dim pieces together) takes 64 or more VGPRs per lane:
    at D=64 these tiles fit either way, and on gfx942 128x128 mfma16 causal bf16 spilled more
    with half-width masked blocks (9 -> 13 VGPRs, 4 reloads in the loop).
    """
    acc = cfg.BLOCK_M * width_d // (64 * cfg.num_warps)  # fp32 accumulator, VGPRs per lane (wave64)
    if cfg.waves_per_eu < 2 or cfg.BLOCK_N < 128 or acc < 64:
        return cfg.BLOCK_N, False
    return cfg.BLOCK_N // 2, cfg.matrix_instr_nonkdim != 16


def _halve_head_dim(cfg: KernelConfig, d0: int, d1: int) -> bool:
    """Run a one-piece head dim >= 128 as two halves when an AMD occupancy target makes registers scarce.

    ``waves_per_eu >= 2`` caps a wave at 256 registers (512 / 2; VGPRs and AGPRs share
    them on gfx90a+). The split pays off only where the fp32 accumulator and one V tile
    in MFMA operand form take half of that on their own (128x64 and 128x128 with 4 warps
    at D=128, 64x64 at D=256) -- elsewhere it only adds addressing (128x32 and 64x64 at
    D=128 need more registers split). Each thread must also load at least 16 elements
    of a V half: with fewer (256x64 with 8 warps) Triton 3.6 stages the halves through
    an unvectorised shared layout, one 16-bit LDS read per element. ``waves_per_eu`` is
    an AMD-only option (0 on NVIDIA), so CUDA builds never take this path.
    """
    if d1 or d0 < 128 or cfg.waves_per_eu < 2:
        return False
    acc = cfg.BLOCK_M * d0 // (64 * cfg.num_warps)  # fp32 accumulator, VGPRs per lane (wave64)
    v_tile = cfg.BLOCK_N * d0 // 128  # one 16-bit V tile as an MFMA operand, VGPRs per lane
    per_thread = cfg.BLOCK_N * (d0 // 2) // (64 * cfg.num_warps)  # elements of a V half per thread
    return acc + v_tile >= 128 and per_thread >= 16


def launch(q, k, v, cfg: KernelConfig, causal: bool, sm_scale: float, out=None, lse=None, sinks=None):
    """Run the online kernel on validated ``(B, H, S, D)`` tensors; returns ``(out, lse)``.

    ``out`` may be any-strided ``(B, Hq, Sq, D)`` of q's dtype; ``lse`` (optional) a
    contiguous fp32 ``(B, Hq, Sq)`` tensor, filled with the natural-log LSE. ``sinks`` (optional):
    a contiguous fp32 ``(Hq,)`` tensor of attention-sink logits (:func:`rocmflash.kernels.common.softmax_start`);
    the LSE then includes the sink."""
    return C.launch_forward(_fwd_online, "online", _constexprs, q, k, v, cfg, causal, sm_scale, out, lse,
                            sinks=sinks)


def compile_for(target, cfg: KernelConfig, problem: Problem):
    """Cross-compile for ``target`` without tensors; returns ``(main_kernel,)``."""
    return C.compile_forward(_fwd_online, "online", _constexprs, target, cfg, problem)
