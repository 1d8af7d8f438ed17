"""The backward kernels themselves: the dK/dV and dQ ``@jit`` functions and their loop steps.

What they compute (two kernels, no atomics) and how they are launched: :mod:`rocmflash.kernels.backward.host`
(the host side).
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit


# ----------------------------------------------------------------------------- kernels
@kernel_jit
def _row_lse2(LSE_base, offs, MASK: tl.constexpr, SEQ):
    """The forward's LSE in base 2 for rows ``offs``; rows that attend nothing (``-inf``, and rows
    past the end when masked) become ``+inf`` so every probability recomputed for them is 0."""
    if MASK:
        lse = tl.load(LSE_base + offs, mask=offs < SEQ, other=float("-inf"))
    else:
        lse = tl.load(LSE_base + offs)
    return tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)


@kernel_jit
def _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_base, Delta_base, start_m, offs_n, qk_scale,
               stride_qm, stride_qd, stride_dom, stride_dod, SEQ_Q, SHIFT,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
               CAUSAL: tl.constexpr, MASK: tl.constexpr):
    """One query block's contribution to a key block's dK/dV (transposed tiles: [BLOCK_N, BLOCK_M])."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = C.load_2d(Q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                  offs_m < SEQ_Q, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    do = C.load_2d(DO_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                   offs_m < SEQ_Q, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    lse2 = _row_lse2(LSE_base, offs_m, MASK, SEQ_Q)
    if MASK:
        delta = tl.load(Delta_base + offs_m, mask=offs_m < SEQ_Q, other=0.0)
    else:
        delta = tl.load(Delta_base + offs_m)
    s_t = tl.dot(k, tl.trans(q))  # [BLOCK_N, BLOCK_M] raw scores
    p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
    if MASK:
        if CAUSAL:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + SHIFT, p_t, 0.0)
    dv = tl.dot(p_t.to(do.dtype), do, dv)
    dp_t = tl.dot(v, tl.trans(do))
    ds_t = p_t * (dp_t - delta[None, :])
    dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@kernel_jit
def _bwd_dkdv(Q, K, V, DO, LSE, Delta, DK, DV, sm_scale, qk_scale,
              stride_qz, stride_qh, stride_qm, stride_qd,
              stride_kz, stride_kh, stride_kn, stride_kd,
              stride_vz, stride_vh, stride_vn, stride_vd,
              stride_doz, stride_doh, stride_dom, stride_dod,
              stride_dkz, stride_dkh, stride_dkn, stride_dkd,
              stride_dvz, stride_dvh, stride_dvn, stride_dvd,
              H_Q, H_KV, GROUP, HEAD_SPLITS, SEQ_Q, SEQ_K,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    # HEAD_SPLITS programs share one K/V head's key block, each summing GROUP / HEAD_SPLITS
    # query heads into its own partial dK/dV row block (HEAD_SPLITS == 1 specialises away)
    split = tl.program_id(1) % HEAD_SPLITS
    off_bhk = tl.program_id(1) // HEAD_SPLITS
    off_z = off_bhk // H_KV
    off_hk = off_bhk % H_KV
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    nmask = offs_n < SEQ_K
    dmask = offs_d < HEAD_DIM
    K_base = K + off_z.to(tl.int64) * stride_kz + off_hk.to(tl.int64) * stride_kh
    V_base = V + off_z.to(tl.int64) * stride_vz + off_hk.to(tl.int64) * stride_vh
    # key rows past SEQ_K load as 0; their dK/dV rows are never stored, and they do not
    # touch other rows (dK_j, dV_j depend on key j only)
    k = C.load_2d(K_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                  nmask, dmask, True, BLOCK_D > HEAD_DIM)
    v = C.load_2d(V_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                  nmask, dmask, True, BLOCK_D > HEAD_DIM)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    SHIFT = SEQ_K - SEQ_Q
    q_full = (SEQ_Q // BLOCK_M) * BLOCK_M  # query blocks below this need no row mask
    if CAUSAL:
        # the first query that sees any key of this block, rounded down to a block
        lo = (tl.maximum(0, start_n - SHIFT) // BLOCK_M) * BLOCK_M
        # query blocks starting at or after this see every key of the block
        last = tl.maximum(0, start_n + BLOCK_N - 1 - SHIFT)
        diag_end = tl.maximum(lo, tl.minimum(((last + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, q_full))
    else:
        lo = 0
        diag_end = 0
    tail_start = tl.maximum(diag_end, q_full)

    heads_per_split = GROUP // HEAD_SPLITS
    for g in range(split * heads_per_split, (split + 1) * heads_per_split):  # summed in registers
        off_h = off_hk * GROUP + g
        off_bh = off_z * H_Q + off_h
        Q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
        DO_base = DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
        LSE_base = LSE + off_bh.to(tl.int64) * SEQ_Q
        Delta_base = Delta + off_bh.to(tl.int64) * SEQ_Q
        for start_m in range(lo, diag_end, BLOCK_M):  # causal diagonal blocks
            dk, dv = _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_base, Delta_base, start_m, offs_n,
                                qk_scale, stride_qm, stride_qd, stride_dom, stride_dod, SEQ_Q, SHIFT,
                                HEAD_DIM, BLOCK_M, BLOCK_D, CAUSAL, True)
        for start_m in range(diag_end, q_full, BLOCK_M):  # fully visible, full blocks
            dk, dv = _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_base, Delta_base, start_m, offs_n,
                                qk_scale, stride_qm, stride_qd, stride_dom, stride_dod, SEQ_Q, SHIFT,
                                HEAD_DIM, BLOCK_M, BLOCK_D, CAUSAL, False)
        for start_m in range(tail_start, SEQ_Q, BLOCK_M):  # the query tail block
            dk, dv = _dkdv_step(dk, dv, k, v, Q_base, DO_base, LSE_base, Delta_base, start_m, offs_n,
                                qk_scale, stride_qm, stride_qd, stride_dom, stride_dod, SEQ_Q, SHIFT,
                                HEAD_DIM, BLOCK_M, BLOCK_D, CAUSAL, True)

    out_h = off_hk * HEAD_SPLITS + split
    DK_base = DK + off_z.to(tl.int64) * stride_dkz + out_h.to(tl.int64) * stride_dkh
    DV_base = DV + off_z.to(tl.int64) * stride_dvz + out_h.to(tl.int64) * stride_dvh
    smask = nmask[:, None] & dmask[None, :]
    tl.store(DK_base + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             (dk * sm_scale).to(DK.dtype.element_ty), mask=smask)
    tl.store(DV_base + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=smask)


@kernel_jit
def _dq_step(dq, q, do, lse2, delta, K_base, V_base, start_n, offs_m, qk_scale,
             stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             CAUSAL: tl.constexpr, MASK: tl.constexpr):
    """One key block's contribution to a query block's dQ."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = C.load_2d(K_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                  offs_n < SEQ_K, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    v = C.load_2d(V_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                  offs_n < SEQ_K, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM)
    s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
    p = tl.math.exp2(s * qk_scale - lse2[:, None])
    if MASK:
        keep = offs_n[None, :] < SEQ_K
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + (SEQ_K - SEQ_Q))
        p = tl.where(keep, p, 0.0)
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    return tl.dot(ds.to(k.dtype), k, dq)


@kernel_jit
def _bwd_dq(Q, K, V, O, DO, LSE, DLSE, Delta, DQ, sm_scale, qk_scale,
            stride_qz, stride_qh, stride_qm, stride_qd,
            stride_kz, stride_kh, stride_kn, stride_kd,
            stride_vz, stride_vh, stride_vn, stride_vd,
            stride_oz, stride_oh, stride_om, stride_od,
            stride_doz, stride_doh, stride_dom, stride_dod,
            stride_dqz, stride_dqh, stride_dqm, stride_dqd,
            H_Q, GROUP, SEQ_Q, SEQ_K,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_DLSE: tl.constexpr):
    start_m = C.query_block(CAUSAL) * BLOCK_M
    off_bh = tl.program_id(1)
    off_z = off_bh // H_Q
    off_h = off_bh % H_Q
    off_hk = off_h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mmask = offs_m < SEQ_Q
    dmask = offs_d < HEAD_DIM
    Q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    DO_base = DO + off_z.to(tl.int64) * stride_doz + off_h.to(tl.int64) * stride_doh
    K_base = K + off_z.to(tl.int64) * stride_kz + off_hk.to(tl.int64) * stride_kh
    V_base = V + off_z.to(tl.int64) * stride_vz + off_hk.to(tl.int64) * stride_vh
    q = C.load_2d(Q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                  mmask, dmask, True, BLOCK_D > HEAD_DIM)
    do = C.load_2d(DO_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                   mmask, dmask, True, BLOCK_D > HEAD_DIM)
    O_base = O + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    o = C.load_2d(O_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                  mmask, dmask, True, BLOCK_D > HEAD_DIM)
    # delta_i = rowsum(dO * O)_i, which the dK/dV kernel (launched after this one) reads too
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row = off_bh.to(tl.int64) * SEQ_Q + offs_m
    if HAS_DLSE:  # d lse_i / d s_ij = p_ij: an LSE gradient shifts delta
        delta -= tl.load(DLSE + row, mask=mmask, other=0.0)
    tl.store(Delta + row, delta, mask=mmask)
    lse2 = _row_lse2(LSE + off_bh.to(tl.int64) * SEQ_Q, offs_m, True, SEQ_Q)  # rows past the end: p = 0
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    full_end, hi = C.kv_bounds(start_m, SEQ_Q, SEQ_K, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in range(0, full_end, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, delta, K_base, V_base, start_n, offs_m, qk_scale,
                      stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
                      HEAD_DIM, BLOCK_N, BLOCK_D, CAUSAL, False)
    for start_n in range(full_end, hi, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, delta, K_base, V_base, start_n, offs_m, qk_scale,
                      stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
                      HEAD_DIM, BLOCK_N, BLOCK_D, CAUSAL, True)

    DQ_base = DQ + off_z.to(tl.int64) * stride_dqz + off_h.to(tl.int64) * stride_dqh
    tl.store(DQ_base + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=mmask[:, None] & dmask[None, :])
