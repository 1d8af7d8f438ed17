"""``split_d``: split the output head dimension into chunks, one program per chunk.

The grid gets a third axis over output head-dim chunks. Each program still computes
the full score tile ``Q Kᵀ`` (all of D, so softmax statistics are exact) but owns only
``acc[BLOCK_M, BLOCK_DV]`` with ``BLOCK_DV = next_pow2(ceil(D / d_chunks))`` and loads only
that slice of V. Accumulator registers drop by the chunk factor; the price is the
``Q Kᵀ`` product and softmax recomputed once per chunk (``c`` chunks: ``(c + 1) / 2`` times
the matrix work of ``online``) and K read ``c`` times. The number of chunks actually
launched is ``ceil(D / BLOCK_DV)``; the last one is masked when it runs past D (e.g.
D=80, d_chunks=2: chunks of 64 and 16). Chunk 0 writes the LSE.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rocmflash.config import KernelConfig, Problem
from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit


@kernel_jit
def chunk_block(acc, m_i, l_i, q0, q1, K_base, V_base, start_n, d_start, offs_m, qk_scale,
                stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
                HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr, BLOCK_DV: tl.constexpr,
                CAUSAL: tl.constexpr, MASK: tl.constexpr, MASK_DV: tl.constexpr,
                PRE_LOAD_V: tl.constexpr):
    """Online-softmax step for one key block, accumulating one head-dim chunk of P @ V."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    s = C.qk_scores(q0, q1, K_base, offs_n, stride_kn, stride_kd, SEQ_K,
                    HEAD_DIM, BLOCK_D0, BLOCK_D1, MASK)
    if PRE_LOAD_V:
        v = C.load_v(V_base, offs_n, d_start, stride_vn, stride_vd, SEQ_K, HEAD_DIM,
                     BLOCK_DV, MASK, MASK_DV)
    if MASK:
        s = C.mask_scores(s, offs_m, offs_n, SEQ_Q, SEQ_K, CAUSAL)
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    if MASK:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(s * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    if not PRE_LOAD_V:
        v = C.load_v(V_base, offs_n, d_start, stride_vn, stride_vd, SEQ_K, HEAD_DIM,
                     BLOCK_DV, MASK, MASK_DV)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@kernel_jit
def _fwd_split_d(Q, K, V, O, LSE, qk_scale,
                 stride_qz, stride_qh, stride_qm, stride_qd,
                 stride_kz, stride_kh, stride_kn, stride_kd,
                 stride_vz, stride_vh, stride_vn, stride_vd,
                 stride_oz, stride_oh, stride_om, stride_od,
                 H_Q, GROUP, SEQ_Q, SEQ_K,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr, BLOCK_DV: tl.constexpr,
                 CAUSAL: tl.constexpr, PRE_LOAD_V: tl.constexpr, STORE_LSE: tl.constexpr):
    start_m = C.query_block(CAUSAL) * BLOCK_M
    off_bh = tl.program_id(1)
    chunk = tl.program_id(2)
    d_start = chunk * BLOCK_DV
    # only the last chunk can run past D (constexpr: masks vanish when D % BLOCK_DV == 0)
    MASK_DV: tl.constexpr = (HEAD_DIM % BLOCK_DV) != 0
    off_z = off_bh // H_Q
    off_h = off_bh % H_Q
    off_hk = off_h // GROUP
    Q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    K_base = K + off_z.to(tl.int64) * stride_kz + off_hk.to(tl.int64) * stride_kh
    V_base = V + off_z.to(tl.int64) * stride_vz + off_hk.to(tl.int64) * stride_vh
    O_base = O + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q0, q1 = C.load_q(Q_base, offs_m, stride_qm, stride_qd, SEQ_Q, HEAD_DIM, BLOCK_D0, BLOCK_D1)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    full_end, hi = C.kv_bounds(start_m, SEQ_Q, SEQ_K, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = chunk_block(
            acc, m_i, l_i, q0, q1, K_base, V_base, start_n, d_start, offs_m, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
            HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1, BLOCK_DV, CAUSAL, False, MASK_DV, PRE_LOAD_V)
    for start_n in range(full_end, hi, BLOCK_N):
        acc, m_i, l_i = chunk_block(
            acc, m_i, l_i, q0, q1, K_base, V_base, start_n, d_start, offs_m, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
            HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1, BLOCK_DV, CAUSAL, True, MASK_DV, PRE_LOAD_V)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    C.store_o(O_base, acc / l_safe[:, None], offs_m, d_start, stride_om, stride_od, SEQ_Q, HEAD_DIM,
              BLOCK_DV, MASK_DV)
    if STORE_LSE:
        if chunk == 0:  # every chunk computed the same statistics; one of them writes them
            lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453
            tl.store(LSE + off_bh.to(tl.int64) * SEQ_Q + offs_m, lse, mask=offs_m < SEQ_Q)


KERNELS = ("_fwd_split_d",)


def chunk_width(cfg: KernelConfig, head_dim: int) -> int:
    """``BLOCK_DV``: a power of two >= 16 covering ``ceil(D / d_chunks)``."""
    return max(16, C.next_pow2(triton.cdiv(head_dim, cfg.d_chunks)))


def _constexprs(cfg: KernelConfig, head_dim: int, causal: bool, store_lse: bool) -> dict:
    d0, d1 = C.resolve_pieces(cfg, head_dim)
    return dict(HEAD_DIM=head_dim, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D0=d0,
                BLOCK_D1=d1, BLOCK_DV=chunk_width(cfg, head_dim), CAUSAL=bool(causal),
                PRE_LOAD_V=cfg.PRE_LOAD_V, STORE_LSE=bool(store_lse))


def launch(q, k, v, cfg: KernelConfig, causal: bool, sm_scale: float, out=None, lse=None):
    """Run the head-dim-split kernel on validated ``(B, H, S, D)`` tensors; returns ``(out, lse)``."""
    cfg = C.check_problem_config(cfg, "split_d")
    head_dim = q.shape[3]
    chunks = triton.cdiv(head_dim, chunk_width(cfg, head_dim))  # grid axis 2: one program per output chunk
    return C.launch_forward(_fwd_split_d, "split_d", _constexprs, q, k, v, cfg, causal, sm_scale, out, lse,
                            extra_grid=(chunks,))


def compile_for(target, cfg: KernelConfig, problem: Problem):
    """Cross-compile for ``target`` without tensors; returns ``(main_kernel,)``."""
    return C.compile_forward(_fwd_split_d, "split_d", _constexprs, target, cfg, problem)
