"""``two_phase``: exact row statistics first, then an accumulation with no rescale.

Pass 1 walks the keys only (``Q Kᵀ``, no V, no accumulator) and computes each row's max
``m`` and sum ``l = sum 2^(s - m)`` -- only two fp32 values per row are live. Pass 2
walks keys and values again and accumulates already-normalised probabilities
``P = 2^(s - m) / l`` into ``acc``: no running max, no ``alpha`` rescale of the
accumulator, and no final division. The accumulator is still ``[BLOCK_M, D]`` fp32, but
the rescale's temporaries and its multiply over ``acc`` every block are gone; the price
is a second ``Q Kᵀ`` (about 1.5x the matrix work of ``online``). Both passes live in one
kernel launch, so ``compile_for`` returns a single kernel.
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.config import KernelConfig, Problem
from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit


@kernel_jit
def stats_block(m_i, l_i, q0, q1, K_base, start_n, offs_m, qk_scale, stride_kn, stride_kd,
                SEQ_Q, SEQ_K, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
                CAUSAL: tl.constexpr, MASK: tl.constexpr):
    """Pass 1 step: update row max and row sum (log2 domain) with one key block."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    s = C.qk_scores(q0, q1, K_base, offs_n, stride_kn, stride_kd, SEQ_K,
                    HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    if MASK:
        s = C.mask_scores(s, offs_m, offs_n, SEQ_Q, SEQ_K, CAUSAL)
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    if MASK:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    l_i = l_i * tl.math.exp2(m_i - m_use) + tl.sum(tl.math.exp2(s * qk_scale - m_use[:, None]), 1)
    return m_new, l_i


@kernel_jit
def accumulate_block(acc0, acc1, m_use, inv_l, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
                     stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
                     HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
                     CAUSAL: tl.constexpr, MASK: tl.constexpr, PRE_LOAD_V: tl.constexpr):
    """Pass 2 step: ``acc += (2^(s - m) / l) @ V`` -- final probabilities, nothing to rescale."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    s = C.qk_scores(q0, q1, K_base, offs_n, stride_kn, stride_kd, SEQ_K,
                    HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    if PRE_LOAD_V:
        v0, v1 = C.load_v_pieces(V_base, offs_n, stride_vn, stride_vd, SEQ_K, HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    if MASK:
        s = C.mask_scores(s, offs_m, offs_n, SEQ_Q, SEQ_K, CAUSAL)
    p = tl.math.exp2(s * qk_scale - m_use[:, None]) * inv_l[:, None]
    if not PRE_LOAD_V:
        v0, v1 = C.load_v_pieces(V_base, offs_n, stride_vn, stride_vd, SEQ_K, HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    p = p.to(v0.dtype)
    acc0 = tl.dot(p, v0, acc0)
    if BLOCK_D1 > 0:
        acc1 = tl.dot(p, v1, acc1)
    return acc0, acc1


@kernel_jit
def _fwd_two_phase(Q, K, V, O, LSE, qk_scale,
                   stride_qz, stride_qh, stride_qm, stride_qd,
                   stride_kz, stride_kh, stride_kn, stride_kd,
                   stride_vz, stride_vh, stride_vn, stride_vd,
                   stride_oz, stride_oh, stride_om, stride_od,
                   H_Q, GROUP, SEQ_Q, SEQ_K,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
                   CAUSAL: tl.constexpr, PRE_LOAD_V: tl.constexpr, STORE_LSE: tl.constexpr):
    start_m = C.query_block(CAUSAL) * BLOCK_M
    off_bh = tl.program_id(1)
    off_z = off_bh // H_Q
    off_h = off_bh % H_Q
    off_hk = off_h // GROUP
    Q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    K_base = K + off_z.to(tl.int64) * stride_kz + off_hk.to(tl.int64) * stride_kh
    V_base = V + off_z.to(tl.int64) * stride_vz + off_hk.to(tl.int64) * stride_vh
    O_base = O + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q0, q1 = C.load_q(Q_base, offs_m, stride_qm, stride_qd, SEQ_Q, HEAD_DIM, BLOCK_D0, BLOCK_D1)
    full_end, hi = C.kv_bounds(start_m, SEQ_Q, SEQ_K, BLOCK_M, BLOCK_N, CAUSAL)

    # ---- pass 1: row statistics only (no accumulator is live here)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for start_n in range(0, full_end, BLOCK_N):
        m_i, l_i = stats_block(m_i, l_i, q0, q1, K_base, start_n, offs_m, qk_scale, stride_kn,
                               stride_kd, SEQ_Q, SEQ_K, HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1,
                               CAUSAL, False)
    for start_n in range(full_end, hi, BLOCK_N):
        m_i, l_i = stats_block(m_i, l_i, q0, q1, K_base, start_n, offs_m, qk_scale, stride_kn,
                               stride_kd, SEQ_Q, SEQ_K, HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1,
                               CAUSAL, True)
    # rows without any allowed key: m = -inf, l = 0 -> P = 0, output 0, LSE -inf
    m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    inv_l = 1.0 / l_safe

    # ---- pass 2: accumulate normalised P @ V
    acc0, acc1 = C.zero_accumulators(BLOCK_M, BLOCK_D0, BLOCK_D1)
    for start_n in range(0, full_end, BLOCK_N):
        acc0, acc1 = accumulate_block(
            acc0, acc1, m_use, inv_l, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
            HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1, CAUSAL, False, PRE_LOAD_V)
    for start_n in range(full_end, hi, BLOCK_N):
        acc0, acc1 = accumulate_block(
            acc0, acc1, m_use, inv_l, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
            HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1, CAUSAL, True, PRE_LOAD_V)

    C.store_o(O_base, acc0, offs_m, 0, stride_om, stride_od, SEQ_Q, HEAD_DIM,
              BLOCK_D0, BLOCK_D0 > HEAD_DIM)
    if BLOCK_D1 > 0:
        C.store_o(O_base, acc1, offs_m, BLOCK_D0, stride_om, stride_od, SEQ_Q, HEAD_DIM,
                  BLOCK_D1, BLOCK_D0 + BLOCK_D1 > HEAD_DIM)
    if STORE_LSE:
        lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453
        tl.store(LSE + off_bh.to(tl.int64) * SEQ_Q + offs_m, lse, mask=offs_m < SEQ_Q)


KERNELS = ("_fwd_two_phase",)


def _constexprs(cfg: KernelConfig, head_dim: int, causal: bool, store_lse: bool) -> dict:
    d0, d1 = C.resolve_pieces(cfg, head_dim)
    return dict(HEAD_DIM=head_dim, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D0=d0,
                BLOCK_D1=d1, CAUSAL=bool(causal), PRE_LOAD_V=cfg.PRE_LOAD_V, STORE_LSE=bool(store_lse))


def launch(q, k, v, cfg: KernelConfig, causal: bool, sm_scale: float, out=None, lse=None):
    """Run the two-phase kernel on validated ``(B, H, S, D)`` tensors; returns ``(out, lse)``."""
    return C.launch_forward(_fwd_two_phase, "two_phase", _constexprs, q, k, v, cfg, causal, sm_scale, out, lse)


def compile_for(target, cfg: KernelConfig, problem: Problem):
    """Cross-compile for ``target`` without tensors; returns ``(main_kernel,)``."""
    return C.compile_forward(_fwd_two_phase, "two_phase", _constexprs, target, cfg, problem)
