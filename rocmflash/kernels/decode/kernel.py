"""The KV-cache decode kernels themselves: the split-KV and combine ``@jit`` functions, their loop
steps, and the error-word bits the split kernel raises.

What they compute and how they are launched: :mod:`rocmflash.kernels.decode.host` (the host side).
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.kernels import common as C
from rocmflash.kernels.decode import quant as KQ
# the bits of the error word the split kernel raises (``tl.atomic_or``) on values it would not use; defined with
# the appends' (checks), which the kernels here import
from rocmflash.kernels.decode.checks import (
    BAD_DESCALE, BAD_LENGTH, BAD_PAGE, BAD_SINK, BAD_START)
from rocmflash.kernels import masks as M
from rocmflash.kernels.common import kernel_jit


#: the split kernel's integers that follow the cache's length: its rows and the strides that multiply them in
#: transformers' (B, Hkv, L, D) cache read as (B, L, Hkv, D), or in a (B, L, Hkv, D) cache that grows by
#: concatenation. Left unspecialised (one binary for every length, and one launch plan: a cache one key longer
#: each call replays it); ``KV_ALIGNED`` gives the strides back the divisibility Triton's specialisation gave.
LENGTH_ARGS = ("CAPACITY", "stride_kb", "stride_kh", "stride_vb", "stride_vh")

# ----------------------------------------------------------------------------- kernels
@kernel_jit
def _key_rows(BT_row, start_n, offs_n, off_b, stride_kb, stride_kn, PAGE_SIZE, NUM_BLOCKS, PAGED: tl.constexpr,
              WHOLE_PAGES: tl.constexpr):
    """``(element offsets (before the head/dim terms) of keys offs_n of sequence off_b, error bits)``.

    ``WHOLE_PAGES``: the key block lies inside one page (the page size is a multiple of
    ``BLOCK_N``), so one page number serves the block -- a scalar load, not a gather. Keys
    past the sequence's end then still address that page (in bounds; their loads are masked).
    A page number outside the pool (``0..NUM_BLOCKS-1``) is read as page 0 -- never an address
    outside the cache -- and the bits say :data:`BAD_PAGE` (the caller ORs them into the error word
    once, after its loops: an atomic inside the key loop would cost every iteration).
    """
    if PAGED:
        if WHOLE_PAGES:
            page = tl.load(BT_row + start_n // PAGE_SIZE)
            outside = (page < 0) | (page >= NUM_BLOCKS)
            bits = tl.where(outside, BAD_PAGE, 0)
            page = tl.where(outside, 0, page)
            rows = page.to(tl.int64) * stride_kb + ((start_n % PAGE_SIZE) + (offs_n - start_n)).to(tl.int64) * stride_kn
        else:
            page = tl.load(BT_row + offs_n // PAGE_SIZE)
            outside = (page < 0) | (page >= NUM_BLOCKS)
            bits = tl.max(tl.where(outside, BAD_PAGE, 0), 0)
            page = tl.where(outside, 0, page)
            rows = page.to(tl.int64) * stride_kb + (offs_n % PAGE_SIZE).to(tl.int64) * stride_kn
    else:
        rows = off_b.to(tl.int64) * stride_kb + offs_n.to(tl.int64) * stride_kn
        bits = 0
    return rows, bits


@kernel_jit
def _decode_step(acc, m_i, l_i, q, K, V, BT_row, start_n, off_b, off_hk, offs_t, SEQ_K, K_START, lo_off, hi_off,
                 qk_scale, sm_scale, softcap, stride_kb, stride_kn, stride_kh, stride_kd,
                 stride_vb, stride_vn, stride_vh, stride_vd, PAGE_SIZE, NUM_BLOCKS, err,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAGED: tl.constexpr,
                 WHOLE_PAGES: tl.constexpr, SOFTCAP: tl.constexpr, MASK: tl.constexpr, LOWER: tl.constexpr,
                 UPPER: tl.constexpr, LEFTPAD: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    nmask = offs_n < SEQ_K
    if LEFTPAD:  # keys before the sequence's start (K_START) are neither loaded nor attended
        nmask = nmask & (offs_n >= K_START)
    if MASK and not WHOLE_PAGES:  # keys outside [K_START, SEQ_K) may have no page: address the first key
        offs_safe = tl.where(nmask, offs_n, K_START)
    else:
        offs_safe = offs_n
    k_rows, bits = _key_rows(BT_row, start_n, offs_safe, off_b, stride_kb, stride_kn, PAGE_SIZE, NUM_BLOCKS, PAGED,
                             WHOLE_PAGES)
    v_rows, _ = _key_rows(BT_row, start_n, offs_safe, off_b, stride_vb, stride_vn, PAGE_SIZE, NUM_BLOCKS, PAGED,
                          WHOLE_PAGES)
    # an fp8 cache is widened to q's dtype (fp16 then, exact: every fp8 value is an fp16 value) in registers; its
    # scales are folded into qk_scale/sm_scale and the output by the caller. A 16-bit cache: no-op casts
    k = C.load_2d(K + off_hk * stride_kh + k_rows[None, :] + offs_d[:, None] * stride_kd,
                  offs_d < HEAD_DIM, nmask, BLOCK_D > HEAD_DIM, MASK).to(q.dtype)
    x = M.log2_scores(tl.dot(q, k), qk_scale, sm_scale, softcap, SOFTCAP)
    if MASK:
        keep = M.band_keep(offs_t, offs_n, SEQ_K, lo_off, hi_off, LOWER, UPPER)
        if LEFTPAD:
            keep = keep & nmask[None, :]
        x = tl.where(keep, x, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(x, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(x, 1))
        m_use = m_new
    p = tl.math.exp2(x - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    # V is loaded after the softmax, not with K: on the H100 loading it with K made one-stage
    # loops 6-9 % slower (docs/evidence/decode-overhead-2026-11-25-h100.md)
    v = C.load_2d(V + off_hk * stride_vh + v_rows[:, None] + offs_d[None, :] * stride_vd,
                  nmask, offs_d < HEAD_DIM, MASK, BLOCK_D > HEAD_DIM).to(q.dtype)
    acc = tl.dot(p.to(q.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i, err | bits


@kernel_jit
def _join_sink(SINK, offs_h, rmask, split, stride_sh, m_i, l_i, err):
    """The rows' running ``(max, sum, error bits)`` with the attention sink of each row's query head joined.

    A sink is one more logit per query head (natural-log units, after the scale: gpt-oss's ``s_aux``) in the
    softmax's denominator, a virtual key whose value row is zero. It must join exactly once per row, so split 0
    alone starts from it -- running max ``sink * log2(e)`` (the kernel's exp2 units), sum ``2^0 = 1`` -- and the
    other splits from nothing: the combine (or fused merge) then weighs split 0's partial by an LSE that holds
    the sink, and a row's LSE is that of keys and sink. A ``-inf`` sink is no sink (sum 0); NaN or ``+inf``
    makes its rows NaN and raises :data:`BAD_SINK` (no host read)."""
    sink = tl.load(SINK + offs_h * stride_sh, mask=rmask, other=float("-inf")).to(tl.float32) * 1.4426950408889634
    bad = (sink != sink) | (sink == float("inf"))
    err = err | tl.max(tl.where(bad, BAD_SINK, 0), 0)
    first = split == 0
    m_i = tl.where(first, sink, m_i)
    l_i = tl.where(first & (sink != float("-inf")), 1.0, l_i)
    return m_i, l_i, err


@C.jit_unspecialised(LENGTH_ARGS)
def _decode_split(Q, K, V, BT, SEQLENS, LEFTPADS, PO, PL, O, LSE, ERR, KS, VS, SEM, SINK, sm_scale, qk_scale, softcap,
                  stride_qb, stride_qt, stride_qh, stride_qd,
                  stride_kb, stride_kn, stride_kh, stride_kd,
                  stride_vb, stride_vn, stride_vh, stride_vd,
                  stride_ob, stride_ot, stride_oh, stride_od,
                  stride_btb, stride_ksb, stride_ksh, stride_vsb, stride_vsh, stride_sh,
                  PAGE_SIZE, NUM_BLOCKS, CAPACITY, NEW_KEYS, H_KV, GROUP, SEQ_Q, NUM_SPLITS,
                  WIN_LEFT, WIN_RIGHT, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  PAGED: tl.constexpr, WHOLE_PAGES: tl.constexpr, SOFTCAP: tl.constexpr,
                  BOUNDED_LEFT: tl.constexpr, BOUNDED_RIGHT: tl.constexpr, DIRECT: tl.constexpr,
                  STORE_LSE: tl.constexpr, LEFTPAD: tl.constexpr, KV_FP8: tl.constexpr, FNUZ_VIEW: tl.constexpr,
                  FUSED: tl.constexpr, SPLITS_PAD: tl.constexpr, KV_ALIGNED: tl.constexpr,
                  WHOLE_CACHE: tl.constexpr, SINKS: tl.constexpr):
    if KV_ALIGNED:
        # the launch checked that these strides are multiples of 16; rounding them down to one (a no-op) tells the
        # compiler so, as the specialisation did (tl.multiple_of cannot mark a kernel argument): wide row loads
        stride_kb = stride_kb // 16 * 16
        stride_kh = stride_kh // 16 * 16
        stride_vb = stride_vb // 16 * 16
        stride_vh = stride_vh // 16 * 16
    split = tl.program_id(0)
    off_bhk = tl.program_id(1)
    off_b = off_bhk // H_KV
    off_hk = off_bhk % H_KV
    # a length outside NEW_KEYS..CAPACITY (the appended keys .. the cache's rows) is clamped -- the cache is
    # never addressed outside -- and reported through the error word (no host read: flash_attn_with_kvcache)
    if WHOLE_CACHE:  # no lengths given: every sequence is the whole cache (nothing to read, nothing to clamp)
        SEQ_K = CAPACITY
        err = tl.full([], 0, tl.int32)
    else:
        len_given = tl.load(SEQLENS + off_b)
        SEQ_K = tl.minimum(tl.maximum(len_given, NEW_KEYS), CAPACITY)
        err = tl.where(SEQ_K != len_given, BAD_LENGTH, 0)
    # rows r = (token t, group head g): t = r // GROUP, query head = hk * GROUP + g
    offs_r = tl.arange(0, BLOCK_M)
    offs_t = offs_r // GROUP
    offs_h = off_hk * GROUP + offs_r % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    rmask = offs_r < SEQ_Q * GROUP
    q = C.load_2d(Q + off_b.to(tl.int64) * stride_qb + offs_t[:, None] * stride_qt + offs_h[:, None] * stride_qh
                  + offs_d[None, :] * stride_qd, rmask, offs_d < HEAD_DIM, True, BLOCK_D > HEAD_DIM)
    if KV_FP8:  # fp16 dots over the widened cache; this program's scales fold into scalars (kv_quant.fp8_setup)
        q, k_mult, vs, bad = KQ.fp8_setup(q, KS + off_b * stride_ksb + off_hk * stride_ksh,
                                          VS + off_b * stride_vsb + off_hk * stride_vsh, FNUZ_VIEW)
        err = err | tl.where(bad, BAD_DESCALE, 0)
        qk_scale = qk_scale * k_mult
        sm_scale = sm_scale * k_mult
    BT_row = BT + off_b.to(tl.int64) * stride_btb
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if SINKS:
        m_i, l_i, err = _join_sink(SINK, offs_h, rmask, split, stride_sh, m_i, l_i, err)

    shift = SEQ_K - SEQ_Q
    lo_off = shift - WIN_LEFT
    hi_off = shift + WIN_RIGHT
    lo, full_lo, full_hi, hi = M.band_bounds(0, SEQ_Q, SEQ_K, lo_off, hi_off, BLOCK_M, BLOCK_N)
    if LEFTPAD:  # the sequence starts at key K_START: from its block on, masked up to the next block
        start_given = tl.load(LEFTPADS + off_b)
        K_START = tl.minimum(tl.maximum(start_given, 0), SEQ_K)
        err = err | tl.where(K_START != start_given, BAD_START, 0)
        lo = tl.maximum(lo, (K_START // BLOCK_N) * BLOCK_N)
        hi = tl.maximum(hi, lo)
        full_lo = tl.minimum(tl.maximum(full_lo, tl.cdiv(K_START, BLOCK_N) * BLOCK_N), hi)
        full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    else:
        K_START = 0
    # this split's chunk of whole key blocks of [lo, hi)
    blocks_per_split = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), NUM_SPLITS)
    s_lo = lo + split * blocks_per_split * BLOCK_N
    s_hi = tl.minimum(hi, s_lo + blocks_per_split * BLOCK_N)
    if BOUNDED_LEFT or LEFTPAD:
        for start_n in range(s_lo, tl.minimum(s_hi, full_lo), BLOCK_N):
            acc, m_i, l_i, err = _decode_step(acc, m_i, l_i, q, K, V, BT_row, start_n, off_b, off_hk, offs_t,
                                              SEQ_K, K_START, lo_off, hi_off, qk_scale, sm_scale, softcap, stride_kb,
                                              stride_kn, stride_kh, stride_kd, stride_vb, stride_vn, stride_vh,
                                              stride_vd, PAGE_SIZE, NUM_BLOCKS, err, HEAD_DIM, BLOCK_N, BLOCK_D, PAGED,
                                              WHOLE_PAGES, SOFTCAP, True, BOUNDED_LEFT, BOUNDED_RIGHT, LEFTPAD)
    for start_n in range(tl.maximum(s_lo, full_lo), tl.minimum(s_hi, full_hi), BLOCK_N):
        acc, m_i, l_i, err = _decode_step(acc, m_i, l_i, q, K, V, BT_row, start_n, off_b, off_hk, offs_t, SEQ_K,
                                          K_START, lo_off, hi_off, qk_scale, sm_scale, softcap, stride_kb, stride_kn,
                                          stride_kh, stride_kd, stride_vb, stride_vn, stride_vh, stride_vd, PAGE_SIZE,
                                          NUM_BLOCKS, err, HEAD_DIM, BLOCK_N, BLOCK_D, PAGED, WHOLE_PAGES, SOFTCAP,
                                          False, BOUNDED_LEFT, BOUNDED_RIGHT, False)
    for start_n in range(tl.maximum(s_lo, full_hi), s_hi, BLOCK_N):
        acc, m_i, l_i, err = _decode_step(acc, m_i, l_i, q, K, V, BT_row, start_n, off_b, off_hk, offs_t, SEQ_K,
                                          K_START, lo_off, hi_off, qk_scale, sm_scale, softcap, stride_kb, stride_kn,
                                          stride_kh, stride_kd, stride_vb, stride_vn, stride_vh, stride_vd, PAGE_SIZE,
                                          NUM_BLOCKS, err, HEAD_DIM, BLOCK_N, BLOCK_D, PAGED, WHOLE_PAGES, SOFTCAP,
                                          True, BOUNDED_LEFT, BOUNDED_RIGHT, LEFTPAD)

    if err != 0:  # once per program, after the loops
        tl.atomic_or(ERR, err, sem="relaxed")
    if KV_FP8:
        acc = acc * vs
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    if DIRECT:  # one split: this program holds the whole row, so it writes the output (no combine launch)
        o_ptrs = (O + off_b.to(tl.int64) * stride_ob + offs_t[:, None] * stride_ot + offs_h[:, None] * stride_oh
                  + offs_d[None, :] * stride_od)
        tl.store(o_ptrs, (acc / l_safe[:, None]).to(O.dtype.element_ty),
                 mask=rmask[:, None] & (offs_d[None, :] < HEAD_DIM))
        if STORE_LSE:  # (B, Hq, Sq) natural log; a row that sees no key: -inf
            lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
            tl.store(LSE + (off_b.to(tl.int64) * (H_KV * GROUP) + offs_h) * SEQ_Q + offs_t, lse, mask=rmask)
        return
    # normalised partial output and log2 LSE (an empty chunk: 0 and -inf); padded tiles, stored whole
    row = off_bhk.to(tl.int64) * NUM_SPLITS + split
    tl.store(PO + row * (BLOCK_M * BLOCK_D) + offs_r[:, None] * BLOCK_D + offs_d[None, :], acc / l_safe[:, None])
    tl.store(PL + row * BLOCK_M + offs_r, tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe)))
    if FUSED:  # the last of this (sequence, K/V head)'s NUM_SPLITS programs merges them: no combine launch
        _merge_if_last(PO, PL, O, LSE, SEM, off_bhk, off_b, offs_r, offs_t, offs_h, offs_d, rmask, stride_ob,
                       stride_ot, stride_oh, stride_od, H_KV, GROUP, SEQ_Q, NUM_SPLITS, HEAD_DIM, BLOCK_M, BLOCK_D,
                       SPLITS_PAD, STORE_LSE)


@kernel_jit
def _merge_if_last(PO, PL, O, LSE, SEM, off_bhk, off_b, offs_r, offs_t, offs_h, offs_d, rmask, stride_ob, stride_ot,
                   stride_oh, stride_od, H_KV, GROUP, SEQ_Q, NUM_SPLITS, HEAD_DIM: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS_PAD: tl.constexpr, STORE_LSE: tl.constexpr):
    """Count this program's partial in; the program that brings the count to ``NUM_SPLITS`` merges every split
    of its (sequence, K/V head) into ``O``/``LSE`` and sets the count back to 0 for the next launch.

    Ordering: every thread's partial stores come before the barrier, and the count is a release (their
    partials are visible to whoever sees the count) and an acquire (the merging program sees every other
    program's partials). The merge reads the partials past the per-CU/SM cache (``.cg``), where a line of them
    could be older than the other program's store."""
    tl.debug_barrier()
    arrived = tl.atomic_add(SEM + off_bhk, 1, sem="acq_rel", scope="gpu")
    if arrived == NUM_SPLITS - 1:
        tl.atomic_xchg(SEM + off_bhk, 0, sem="relaxed", scope="gpu")
        offs_s = tl.arange(0, SPLITS_PAD)
        rows = off_bhk.to(tl.int64) * NUM_SPLITS + offs_s
        smask = offs_s < NUM_SPLITS
        # (splits, rows) log2 LSEs; their max per row, then weights 2^(L_s - max) (empty splits: 0)
        l_s = tl.load(PL + rows[:, None] * BLOCK_M + offs_r[None, :], mask=smask[:, None], other=float("-inf"),
                      cache_modifier=".cg")
        m = tl.max(l_s, 0)
        m_use = tl.where(m == float("-inf"), 0.0, m)
        w = tl.math.exp2(l_s - m_use[None, :])
        total = tl.sum(w, 0)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for s in range(0, NUM_SPLITS):
            w_s = tl.math.exp2(tl.load(PL + (off_bhk.to(tl.int64) * NUM_SPLITS + s) * BLOCK_M + offs_r,
                                       cache_modifier=".cg") - m_use)
            o_s = tl.load(PO + (off_bhk.to(tl.int64) * NUM_SPLITS + s) * (BLOCK_M * BLOCK_D)
                          + offs_r[:, None] * BLOCK_D + offs_d[None, :], cache_modifier=".cg")
            acc += w_s[:, None] * o_s
        t_safe = tl.where(total == 0.0, 1.0, total)
        o_ptrs = (O + off_b.to(tl.int64) * stride_ob + offs_t[:, None] * stride_ot + offs_h[:, None] * stride_oh
                  + offs_d[None, :] * stride_od)
        tl.store(o_ptrs, (acc / t_safe[:, None]).to(O.dtype.element_ty),
                 mask=rmask[:, None] & (offs_d[None, :] < HEAD_DIM))
        if STORE_LSE:  # (B, Hq, Sq) natural log
            lse = tl.where(total == 0.0, float("-inf"), (m_use + tl.math.log2(t_safe)) * 0.6931471805599453)
            tl.store(LSE + (off_b.to(tl.int64) * (H_KV * GROUP) + offs_h) * SEQ_Q + offs_t, lse, mask=rmask)


@kernel_jit
def _decode_combine(PO, PL, O, LSE, stride_ob, stride_ot, stride_oh, stride_od,
                    H_KV, GROUP, SEQ_Q, NUM_SPLITS,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                    SPLITS_PAD: tl.constexpr, STORE_LSE: tl.constexpr):
    # one program per (sequence, K/V head, row): every split of the row is read in one 2-D load
    # (a loop over splits in a few programs was latency-bound: B=1 has only Hkv of them)
    off_bhk = tl.program_id(0)
    r = tl.program_id(1)
    if r >= SEQ_Q * GROUP:  # padding rows of the split kernel's tile
        return
    off_b = off_bhk // H_KV
    off_hk = off_bhk % H_KV
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    smask = offs_s < NUM_SPLITS
    rows = off_bhk.to(tl.int64) * NUM_SPLITS + offs_s
    l_s = tl.load(PL + rows * BLOCK_M + r, mask=smask, other=float("-inf"))
    m = tl.max(l_s, 0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(l_s - m_use)  # empty splits (and padding): weight 0
    o_s = tl.load(PO + rows[:, None] * (BLOCK_M * BLOCK_D) + r * BLOCK_D + offs_d[None, :], mask=smask[:, None],
                  other=0.0)
    total = tl.sum(w, 0)
    t_safe = tl.where(total == 0.0, 1.0, total)
    o = tl.sum(o_s * w[:, None], 0) / t_safe
    t = r // GROUP
    h = off_hk * GROUP + r % GROUP
    tl.store(O + off_b.to(tl.int64) * stride_ob + t * stride_ot + h * stride_oh + offs_d * stride_od,
             o.to(O.dtype.element_ty), mask=offs_d < HEAD_DIM)
    if STORE_LSE:  # (B, Hq, Sq) natural log
        lse = tl.where(total == 0.0, float("-inf"), (m_use + tl.math.log2(t_safe)) * 0.6931471805599453)
        tl.store(LSE + (off_b.to(tl.int64) * (H_KV * GROUP) + h) * SEQ_Q + t, lse)
