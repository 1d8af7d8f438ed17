"""The packed (varlen) kernels themselves: the forward, dQ and dK/dV ``@jit`` functions and their loop steps.

What they compute, their layout and masks: :mod:`rocmflash.kernels.varlen.host` (the host side: call records,
launch arguments, launches, compile-only builds).
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.kernels import common as C
from rocmflash.kernels import masks as M
from rocmflash.kernels.varlen import checks as VC
from rocmflash.kernels.common import kernel_jit


# ----------------------------------------------------------------------------- forward
@kernel_jit
def _fwd_step(acc, m_i, l_i, q, K_base, V_base, start_n, offs_m, SEQ_K, lo_off, hi_off,
              qk_scale, sm_scale, softcap, stride_kt, stride_kd, stride_vt, stride_vd,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              SOFTCAP: tl.constexpr, MASK: tl.constexpr, PRE_LOAD_V: tl.constexpr,
              LOWER: tl.constexpr, UPPER: tl.constexpr):
    """One online-softmax step over keys ``[start_n, start_n + BLOCK_N)`` of this sequence."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = C.load_2d(K_base + offs_d[:, None] * stride_kd + offs_n[None, :] * stride_kt,
                  offs_d < HEAD_DIM, offs_n < SEQ_K, BLOCK_D > HEAD_DIM, MASK)
    if PRE_LOAD_V:
        v = C.load_2d(V_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                      offs_n < SEQ_K, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    x = M.log2_scores(tl.dot(q, k), qk_scale, sm_scale, softcap, SOFTCAP)
    if MASK:
        x = tl.where(M.band_keep(offs_m, offs_n, SEQ_K, lo_off, hi_off, LOWER, UPPER), x, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(x, 1))
    if MASK:  # a row with no visible key yet keeps m = -inf: subtract 0, not -inf (no NaN)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(x - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    if not PRE_LOAD_V:
        v = C.load_2d(V_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                      offs_n < SEQ_K, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@C.jit_unspecialised(VC.UNSPECIALISED)
def _varlen_fwd(Q, K, V, O, LSE, CU_Q, CU_K, ERR, Sinks, sm_scale, qk_scale, softcap,
                stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd,
                stride_vt, stride_vh, stride_vd, stride_ot, stride_oh, stride_od,
                stride_lh, H_Q, GROUP, WIN_LEFT, WIN_RIGHT, TOTAL_Q, TOTAL_K, MAX_Q, MAX_K, STRICT_END,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr, PRE_LOAD_V: tl.constexpr,
                STORE_LSE: tl.constexpr, BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr):
    # causal / right-bounded bands: launch the longest rows (last query blocks) first, so the
    # short diagonal blocks fill the tail of the grid instead of the long ones
    start_m = C.query_block(BOUNDED_RIGHT) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = off_bh // H_Q
    off_h = off_bh % H_Q
    if (tl.program_id(0) == 0) & (off_h == 0):  # one program per sequence checks its lengths
        VC.report_lengths(CU_Q, CU_K, ERR, off_b, tl.num_programs(1) // H_Q - 1, TOTAL_Q, TOTAL_K, MAX_Q, MAX_K,
                        STRICT_END)
    q_start, SEQ_Q = VC.seq_range(CU_Q, off_b, TOTAL_Q)
    if start_m >= SEQ_Q:  # the grid is sized for the longest sequence
        return
    k_start, SEQ_K = VC.seq_range(CU_K, off_b, TOTAL_K)
    off_hk = off_h // GROUP
    Q_base = Q + q_start.to(tl.int64) * stride_qt + off_h.to(tl.int64) * stride_qh
    K_base = K + k_start.to(tl.int64) * stride_kt + off_hk.to(tl.int64) * stride_kh
    V_base = V + k_start.to(tl.int64) * stride_vt + off_hk.to(tl.int64) * stride_vh
    O_base = O + q_start.to(tl.int64) * stride_ot + off_h.to(tl.int64) * stride_oh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = C.load_2d(Q_base + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                  offs_m < SEQ_Q, offs_d < HEAD_DIM, True, BLOCK_D > HEAD_DIM)
    m_i, l_i = C.softmax_start(Sinks, off_h, BLOCK_M)  # Sinks None (constexpr): -inf / 0; else the sink's
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    shift = SEQ_K - SEQ_Q  # bottom-right alignment, per sequence
    lo_off = shift - WIN_LEFT
    hi_off = shift + WIN_RIGHT
    lo, full_lo, full_hi, hi = M.band_bounds(start_m, SEQ_Q, SEQ_K, lo_off, hi_off, BLOCK_M, BLOCK_N)
    if BOUNDED_LEFT:
        for start_n in range(lo, full_lo, BLOCK_N):  # left edge of a sliding window
            acc, m_i, l_i = _fwd_step(acc, m_i, l_i, q, K_base, V_base, start_n, offs_m, SEQ_K, lo_off, hi_off,
                                      qk_scale, sm_scale, softcap, stride_kt, stride_kd, stride_vt, stride_vd,
                                      HEAD_DIM, BLOCK_N, BLOCK_D, SOFTCAP, True, PRE_LOAD_V, BOUNDED_LEFT, BOUNDED_RIGHT)
    for start_n in range(full_lo, full_hi, BLOCK_N):  # seen in full by every row
        acc, m_i, l_i = _fwd_step(acc, m_i, l_i, q, K_base, V_base, start_n, offs_m, SEQ_K, lo_off, hi_off,
                                  qk_scale, sm_scale, softcap, stride_kt, stride_kd, stride_vt, stride_vd,
                                  HEAD_DIM, BLOCK_N, BLOCK_D, SOFTCAP, False, PRE_LOAD_V, BOUNDED_LEFT, BOUNDED_RIGHT)
    for start_n in range(full_hi, hi, BLOCK_N):  # causal diagonal / right window edge / key tail
        acc, m_i, l_i = _fwd_step(acc, m_i, l_i, q, K_base, V_base, start_n, offs_m, SEQ_K, lo_off, hi_off,
                                  qk_scale, sm_scale, softcap, stride_kt, stride_kd, stride_vt, stride_vd,
                                  HEAD_DIM, BLOCK_N, BLOCK_D, SOFTCAP, True, PRE_LOAD_V, BOUNDED_LEFT, BOUNDED_RIGHT)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # rows that see no key: output 0, LSE -inf (a sink: l = 1, LSE sink)
    C.store_o(O_base, acc / l_safe[:, None], offs_m, 0, stride_ot, stride_od, SEQ_Q, HEAD_DIM,
              BLOCK_D, BLOCK_D > HEAD_DIM)
    if STORE_LSE:
        lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453
        lse = tl.where(l_i == 0.0, float("-inf"), lse)
        tl.store(LSE + off_h.to(tl.int64) * stride_lh + q_start + offs_m, lse, mask=offs_m < SEQ_Q)


# ----------------------------------------------------------------------------- backward
@kernel_jit
def _lse2_rows(LSE_row, offs, SEQ):
    """Base-2 LSE of rows ``offs``; rows that saw no key or lie past the end -> +inf (p = 0)."""
    lse = tl.load(LSE_row + offs, mask=offs < SEQ, other=float("-inf"))
    return tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)


@kernel_jit
def _dq_step(dq, q, do, lse2, delta, K_base, V_base, start_n, offs_m, SEQ_K, lo_off, hi_off,
             qk_scale, sm_scale, softcap, stride_kt, stride_kd, stride_vt, stride_vd,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             SOFTCAP: tl.constexpr, MASK: tl.constexpr, LOWER: tl.constexpr, UPPER: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = C.load_2d(K_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                  offs_n < SEQ_K, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    v = C.load_2d(V_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                  offs_n < SEQ_K, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    x = M.log2_scores(tl.dot(q, tl.trans(k)), qk_scale, sm_scale, softcap, SOFTCAP)
    p = tl.math.exp2(x - lse2[:, None])
    if MASK:
        p = tl.where(M.band_keep(offs_m, offs_n, SEQ_K, lo_off, hi_off, LOWER, UPPER), p, 0.0)
    ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
    ds = ds * M.softcap_grad(x, softcap, SOFTCAP)
    return tl.dot(ds.to(k.dtype), k, dq)


@C.jit_unspecialised(VC.BWD_UNSPECIALISED)
def _varlen_bwd_dq(Q, K, V, O, DO, LSE, DLSE, Delta, DQ, CU_Q, CU_K, sm_scale, qk_scale, softcap,
                   stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd,
                   stride_vt, stride_vh, stride_vd, stride_ot, stride_oh, stride_od,
                   stride_dot, stride_doh, stride_dod, stride_dqt, stride_dqh, stride_dqd,
                   stride_lh, H_Q, GROUP, WIN_LEFT, WIN_RIGHT, TOTAL_Q, TOTAL_K,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr, HAS_DLSE: tl.constexpr,
                   BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr):
    start_m = C.query_block(BOUNDED_RIGHT) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = off_bh // H_Q
    off_h = off_bh % H_Q
    q_start, SEQ_Q = VC.seq_range(CU_Q, off_b, TOTAL_Q)
    if start_m >= SEQ_Q:
        return
    k_start, SEQ_K = VC.seq_range(CU_K, off_b, TOTAL_K)
    off_hk = off_h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mmask = offs_m < SEQ_Q
    dmask = offs_d < HEAD_DIM
    q_row = q_start.to(tl.int64)
    q = C.load_2d(Q + q_row * stride_qt + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                  mmask, dmask, True, BLOCK_D > HEAD_DIM)
    do = C.load_2d(DO + q_row * stride_dot + off_h * stride_doh + offs_m[:, None] * stride_dot
                   + offs_d[None, :] * stride_dod, mmask, dmask, True, BLOCK_D > HEAD_DIM)
    o = C.load_2d(O + q_row * stride_ot + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od,
                  mmask, dmask, True, BLOCK_D > HEAD_DIM)
    row = off_h.to(tl.int64) * stride_lh + q_start + offs_m
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # read again by the dK/dV kernel
    if HAS_DLSE:
        delta -= tl.load(DLSE + row, mask=mmask, other=0.0)
    tl.store(Delta + row, delta, mask=mmask)
    lse2 = _lse2_rows(LSE + off_h.to(tl.int64) * stride_lh + q_start, offs_m, SEQ_Q)
    K_base = K + k_start.to(tl.int64) * stride_kt + off_hk.to(tl.int64) * stride_kh
    V_base = V + k_start.to(tl.int64) * stride_vt + off_hk.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    shift = SEQ_K - SEQ_Q
    lo_off = shift - WIN_LEFT
    hi_off = shift + WIN_RIGHT
    lo, full_lo, full_hi, hi = M.band_bounds(start_m, SEQ_Q, SEQ_K, lo_off, hi_off, BLOCK_M, BLOCK_N)
    if BOUNDED_LEFT:
        for start_n in range(lo, full_lo, BLOCK_N):
            dq = _dq_step(dq, q, do, lse2, delta, K_base, V_base, start_n, offs_m, SEQ_K, lo_off, hi_off,
                          qk_scale, sm_scale, softcap, stride_kt, stride_kd, stride_vt, stride_vd,
                          HEAD_DIM, BLOCK_N, BLOCK_D, SOFTCAP, True, BOUNDED_LEFT, BOUNDED_RIGHT)
    for start_n in range(full_lo, full_hi, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, delta, K_base, V_base, start_n, offs_m, SEQ_K, lo_off, hi_off,
                      qk_scale, sm_scale, softcap, stride_kt, stride_kd, stride_vt, stride_vd,
                      HEAD_DIM, BLOCK_N, BLOCK_D, SOFTCAP, False, BOUNDED_LEFT, BOUNDED_RIGHT)
    for start_n in range(full_hi, hi, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, delta, K_base, V_base, start_n, offs_m, SEQ_K, lo_off, hi_off,
                      qk_scale, sm_scale, softcap, stride_kt, stride_kd, stride_vt, stride_vd,
                      HEAD_DIM, BLOCK_N, BLOCK_D, SOFTCAP, True, BOUNDED_LEFT, BOUNDED_RIGHT)
    tl.store(DQ + q_row * stride_dqt + off_h * stride_dqh + offs_m[:, None] * stride_dqt + offs_d[None, :] * stride_dqd,
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=mmask[:, None] & dmask[None, :])


@kernel_jit
def _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_row, Delta_row, start_m, offs_n, SEQ_Q, lo_off, hi_off,
               qk_scale, sm_scale, softcap, stride_qt, stride_qd, stride_dot, stride_dod,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
               SOFTCAP: tl.constexpr, MASK: tl.constexpr, LOWER: tl.constexpr, UPPER: tl.constexpr):
    """One query block's contribution to a key block's dK/dV; tiles are transposed ``[BLOCK_N, BLOCK_M]``."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = C.load_2d(Q_base + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                  offs_m < SEQ_Q, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    do = C.load_2d(DO_base + offs_m[:, None] * stride_dot + offs_d[None, :] * stride_dod,
                   offs_m < SEQ_Q, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    lse2 = _lse2_rows(LSE_row, offs_m, SEQ_Q)
    delta = tl.load(Delta_row + offs_m, mask=offs_m < SEQ_Q, other=0.0)
    x_t = M.log2_scores(tl.dot(k, tl.trans(q)), qk_scale, sm_scale, softcap, SOFTCAP)
    p_t = tl.math.exp2(x_t - lse2[None, :])
    if MASK:  # rows = keys, columns = queries
        p_t = tl.where(M.band_keep(offs_n, offs_m, SEQ_Q, lo_off, hi_off, LOWER, UPPER), p_t, 0.0)
    dv = tl.dot(p_t.to(do.dtype), do, dv)
    ds_t = p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])
    ds_t = ds_t * M.softcap_grad(x_t, softcap, SOFTCAP)
    return tl.dot(ds_t.to(q.dtype), q, dk), dv


@C.jit_unspecialised(VC.BWD_UNSPECIALISED)
def _varlen_bwd_dkdv(Q, K, V, DO, LSE, Delta, DK, DV, CU_Q, CU_K, sm_scale, qk_scale, softcap,
                     stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd,
                     stride_vt, stride_vh, stride_vd, stride_dot, stride_doh, stride_dod,
                     stride_dkt, stride_dkh, stride_dkd, stride_dvt, stride_dvh, stride_dvd,
                     stride_lh, H_KV, GROUP, WIN_LEFT, WIN_RIGHT, TOTAL_Q, TOTAL_K,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr,
                     BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    off_bhk = tl.program_id(1)
    off_b = off_bhk // H_KV
    off_hk = off_bhk % H_KV
    k_start, SEQ_K = VC.seq_range(CU_K, off_b, TOTAL_K)
    if start_n >= SEQ_K:
        return
    q_start, SEQ_Q = VC.seq_range(CU_Q, off_b, TOTAL_Q)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    nmask = offs_n < SEQ_K
    dmask = offs_d < HEAD_DIM
    k_row = k_start.to(tl.int64)
    K_base = K + k_row * stride_kt + off_hk.to(tl.int64) * stride_kh
    V_base = V + k_row * stride_vt + off_hk.to(tl.int64) * stride_vh
    k = C.load_2d(K_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                  nmask, dmask, True, BLOCK_D > HEAD_DIM)
    v = C.load_2d(V_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                  nmask, dmask, True, BLOCK_D > HEAD_DIM)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    # key j is seen by queries i with j - shift - right <= i <= j - shift + left
    shift = SEQ_K - SEQ_Q
    lo_off = -shift - WIN_RIGHT
    hi_off = -shift + WIN_LEFT
    lo, full_lo, full_hi, hi = M.band_bounds(start_n, SEQ_K, SEQ_Q, lo_off, hi_off, BLOCK_N, BLOCK_M)
    q_row = q_start.to(tl.int64)
    for g in range(0, GROUP):  # the GQA group's query heads, summed in registers
        off_h = off_hk * GROUP + g
        Q_base = Q + q_row * stride_qt + off_h.to(tl.int64) * stride_qh
        DO_base = DO + q_row * stride_dot + off_h.to(tl.int64) * stride_doh
        LSE_row = LSE + off_h.to(tl.int64) * stride_lh + q_start
        Delta_row = Delta + off_h.to(tl.int64) * stride_lh + q_start
        if BOUNDED_RIGHT:  # causal / right window: the first queries that see this key block
            for start_m in range(lo, full_lo, BLOCK_M):
                dk, dv = _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_row, Delta_row, start_m, offs_n, SEQ_Q,
                                    lo_off, hi_off, qk_scale, sm_scale, softcap, stride_qt, stride_qd,
                                    stride_dot, stride_dod, HEAD_DIM, BLOCK_M, BLOCK_D, SOFTCAP, True, BOUNDED_RIGHT, BOUNDED_LEFT)
        for start_m in range(full_lo, full_hi, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_row, Delta_row, start_m, offs_n, SEQ_Q,
                                lo_off, hi_off, qk_scale, sm_scale, softcap, stride_qt, stride_qd,
                                stride_dot, stride_dod, HEAD_DIM, BLOCK_M, BLOCK_D, SOFTCAP, False, BOUNDED_RIGHT, BOUNDED_LEFT)
        for start_m in range(full_hi, hi, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_row, Delta_row, start_m, offs_n, SEQ_Q,
                                lo_off, hi_off, qk_scale, sm_scale, softcap, stride_qt, stride_qd,
                                stride_dot, stride_dod, HEAD_DIM, BLOCK_M, BLOCK_D, SOFTCAP, True, BOUNDED_RIGHT, BOUNDED_LEFT)

    smask = nmask[:, None] & dmask[None, :]
    tl.store(DK + k_row * stride_dkt + off_hk * stride_dkh + offs_n[:, None] * stride_dkt + offs_d[None, :] * stride_dkd,
             (dk * sm_scale).to(DK.dtype.element_ty), mask=smask)
    tl.store(DV + k_row * stride_dvt + off_hk * stride_dvh + offs_n[:, None] * stride_dvt + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=smask)
