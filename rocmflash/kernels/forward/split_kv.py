"""``split_kv``: split-K along the key/value sequence, then a combine kernel.

The grid gets a third axis over ``num_splits`` chunks of the (causally allowed) key
range of each query block. Each program runs the same online-softmax step as
``online`` over its chunk only -- a shorter loop, and more programs in flight when
``batch * heads * query blocks`` is too small to fill the GPU (decode, small batches,
long keys). It writes a normalised fp32 partial output ``O_s`` and its log2-domain
log-sum-exp ``L_s`` (``-inf`` and zeros for an empty chunk). The combine kernel then
merges the splits of each row::

    L = log2(sum_s 2^L_s)        O = sum_s 2^(L_s - L) * O_s

Cost: the partials are fp32 ``num_splits * B * Hq * Sq * D`` written and read once more,
plus a second launch. ``compile_for`` returns ``(main, combine)``; ``KERNELS`` names them
in that order. ``KernelConfig.num_splits=0`` picks the split count at launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rocmflash.config import KernelConfig, Problem
from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit
from rocmflash.kernels.forward.online import online_block


@kernel_jit
def _fwd_split_kv(Q, K, V, O, LSE, qk_scale,
                  stride_qz, stride_qh, stride_qm, stride_qd,
                  stride_kz, stride_kh, stride_kn, stride_kd,
                  stride_vz, stride_vh, stride_vn, stride_vd,
                  stride_oz, stride_oh, stride_om, stride_od,
                  H_Q, GROUP, SEQ_Q, SEQ_K, NUM_SPLITS,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
                  CAUSAL: tl.constexpr, PRE_LOAD_V: tl.constexpr):
    # O here is the fp32 partial buffer [B*Hq, NUM_SPLITS, SEQ_Q, HEAD_DIM] (contiguous;
    # stride_oz is unused) and LSE the partial log2-LSE [B*Hq, NUM_SPLITS, SEQ_Q].
    start_m = C.query_block(CAUSAL) * BLOCK_M
    off_bh = tl.program_id(1)
    split = tl.program_id(2)
    off_z = off_bh // H_Q
    off_h = off_bh % H_Q
    off_hk = off_h // GROUP
    Q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    K_base = K + off_z.to(tl.int64) * stride_kz + off_hk.to(tl.int64) * stride_kh
    V_base = V + off_z.to(tl.int64) * stride_vz + off_hk.to(tl.int64) * stride_vh
    row = off_bh.to(tl.int64) * NUM_SPLITS + split  # (bh, split) row of the partials
    O_base = O + row * stride_oh
    L_base = LSE + row * SEQ_Q

    offs_m = start_m + tl.arange(0, BLOCK_M)
    q0, q1 = C.load_q(Q_base, offs_m, stride_qm, stride_qd, SEQ_Q, HEAD_DIM, BLOCK_D0, BLOCK_D1)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc0, acc1 = C.zero_accumulators(BLOCK_M, BLOCK_D0, BLOCK_D1)

    # This split's share of the allowed key blocks: chunks of whole blocks, balanced
    # over the causal range of this query block (not over all of SEQ_K).
    full_end, hi = C.kv_bounds(start_m, SEQ_Q, SEQ_K, BLOCK_M, BLOCK_N, CAUSAL)
    blocks_per_split = tl.cdiv(tl.cdiv(hi, BLOCK_N), NUM_SPLITS)
    lo = split * blocks_per_split * BLOCK_N
    end = tl.minimum(hi, lo + blocks_per_split * BLOCK_N)
    for start_n in range(lo, tl.minimum(end, full_end), BLOCK_N):
        acc0, acc1, m_i, l_i = online_block(
            acc0, acc1, m_i, l_i, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
            HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1, CAUSAL, False, PRE_LOAD_V)
    for start_n in range(tl.maximum(lo, full_end), end, BLOCK_N):
        acc0, acc1, m_i, l_i = online_block(
            acc0, acc1, m_i, l_i, q0, q1, K_base, V_base, start_n, offs_m, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd, SEQ_Q, SEQ_K,
            HEAD_DIM, BLOCK_N, BLOCK_D0, BLOCK_D1, CAUSAL, True, PRE_LOAD_V)

    # Partial results are written even for empty splits (l = 0): O_s = 0, L_s = -inf.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    inv_l = 1.0 / l_safe
    C.store_o(O_base, acc0 * inv_l[:, None], offs_m, 0, stride_om, stride_od, SEQ_Q, HEAD_DIM,
              BLOCK_D0, BLOCK_D0 > HEAD_DIM)
    if BLOCK_D1 > 0:
        C.store_o(O_base, acc1 * inv_l[:, None], offs_m, BLOCK_D0, stride_om, stride_od, SEQ_Q,
                  HEAD_DIM, BLOCK_D1, BLOCK_D0 + BLOCK_D1 > HEAD_DIM)
    tl.store(L_base + offs_m, m_i + tl.math.log2(l_safe), mask=offs_m < SEQ_Q)


@kernel_jit
def _combine_split_kv(OP, LP, O, LSE, H_Q, SEQ_Q, NUM_SPLITS,
                      stride_oz, stride_oh, stride_om, stride_od,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DP: tl.constexpr,
                      STORE_LSE: tl.constexpr):
    """Merge the ``NUM_SPLITS`` partials of ``BLOCK_M`` rows: log-sum-exp weighted sum."""
    off_bh = tl.program_id(1)
    off_z = off_bh // H_Q
    off_h = off_bh % H_Q
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DP)
    row_ok = offs_m < SEQ_Q
    tile_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    base = off_bh.to(tl.int64) * NUM_SPLITS
    # pass 1: the largest split LSE of each row
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(0, NUM_SPLITS):
        m = tl.maximum(m, tl.load(LP + (base + s) * SEQ_Q + offs_m, mask=row_ok, other=float("-inf")))
    m_use = tl.where(m == float("-inf"), 0.0, m)  # rows no split saw
    # pass 2: weights 2^(L_s - m), weighted sum of the normalised partials
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DP], tl.float32)
    for s in range(0, NUM_SPLITS):
        w = tl.math.exp2(tl.load(LP + (base + s) * SEQ_Q + offs_m, mask=row_ok, other=float("-inf")) - m_use)
        o_s = tl.load(OP + ((base + s) * SEQ_Q + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
                      mask=tile_ok, other=0.0)
        l += w
        acc += w[:, None] * o_s
    l_safe = tl.where(l == 0.0, 1.0, l)
    O_base = O + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    tl.store(O_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=tile_ok)
    if STORE_LSE:
        lse = (m + tl.math.log2(l_safe)) * 0.6931471805599453
        tl.store(LSE + off_bh.to(tl.int64) * SEQ_Q + offs_m, lse, mask=row_ok)


KERNELS = ("_fwd_split_kv", "_combine_split_kv")
COMBINE_BLOCK_M = 32


def choose_splits(cfg: KernelConfig, batch_heads: int, seqlen_q: int, seqlen_k: int, cus: int) -> int:
    """``cfg.num_splits``, or (0) enough splits for ~2 programs per CU, at most 16 or one per key block."""
    max_useful = max(1, triton.cdiv(seqlen_k, cfg.BLOCK_N))
    if cfg.num_splits:
        return min(cfg.num_splits, max_useful)
    programs = triton.cdiv(seqlen_q, cfg.BLOCK_M) * batch_heads
    return max(1, min(16, max_useful, triton.cdiv(2 * cus, programs)))


def _main_constexprs(cfg, head_dim, causal):
    d0, d1 = C.resolve_pieces(cfg, head_dim)
    return dict(HEAD_DIM=head_dim, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D0=d0,
                BLOCK_D1=d1, CAUSAL=bool(causal), PRE_LOAD_V=cfg.PRE_LOAD_V)


def _combine_constexprs(head_dim, store_lse):
    return dict(HEAD_DIM=head_dim, BLOCK_M=COMBINE_BLOCK_M, BLOCK_DP=max(16, C.next_pow2(head_dim)),
                STORE_LSE=bool(store_lse))


def _partial_geometry(g: C.Geometry, splits: int) -> C.Geometry:
    """Geometry whose output strides address the contiguous fp32 partial buffer."""
    D, Sq = g.head_dim, g.seqlen_q
    return C.Geometry(g.batch, g.heads_q, g.heads_kv, Sq, g.seqlen_k, D, g.dtype,
                      g.q_strides, g.k_strides, g.v_strides, (0, Sq * D, D, 1))


def _combine_args(g: C.Geometry, op, lp, o, lse, splits: int) -> dict:
    return dict(OP=op, LP=lp, O=o, LSE=lse, H_Q=g.heads_q, SEQ_Q=g.seqlen_q, NUM_SPLITS=splits,
                stride_oz=g.o_strides[0], stride_oh=g.o_strides[1], stride_om=g.o_strides[2],
                stride_od=g.o_strides[3])


def launch(q, k, v, cfg: KernelConfig, causal: bool, sm_scale: float, out=None, lse=None):
    """Run split-KV + combine on validated ``(B, H, S, D)`` tensors; returns ``(out, lse)``."""
    import torch

    cfg = C.check_problem_config(cfg, "split_kv")
    if out is None:
        out = torch.empty_like(q)
    bh = q.shape[0] * q.shape[1]
    splits = choose_splits(cfg, bh, q.shape[2], k.shape[2], C.num_compute_units(q.device))
    o_part = torch.empty((bh, splits, q.shape[2], q.shape[3]), device=q.device, dtype=torch.float32)
    l_part = torch.empty((bh, splits, q.shape[2]), device=q.device, dtype=torch.float32)
    lse_arg = lse if lse is not None else C.dummy_lse(q.device)
    causal, sm_scale = bool(causal), float(sm_scale)
    backend = C.torch_backend()

    def build_main():
        g = C.Geometry.from_tensors(q, k, v, out)
        args = C.attention_args(_partial_geometry(g, splits), q, k, v, o_part, l_part, sm_scale)
        args["NUM_SPLITS"] = splits
        grid = (triton.cdiv(g.seqlen_q, cfg.BLOCK_M), bh, splits)
        return grid, args, _main_constexprs(cfg, g.head_dim, causal)

    def build_combine():
        g = C.Geometry.from_tensors(q, k, v, out)
        return ((triton.cdiv(g.seqlen_q, COMBINE_BLOCK_M), bh),
                _combine_args(g, o_part, l_part, out, lse_arg, splits), _combine_constexprs(g.head_dim, lse is not None))

    C.launch_cached(_fwd_split_kv, (causal, sm_scale, splits), (q, k, v, out, o_part, l_part), build_main, cfg,
                    backend)
    ccfg = cfg.replace(num_warps=4, num_stages=1, waves_per_eu=0, schedule_hint="none")
    C.launch_cached(_combine_split_kv, (splits, lse is not None), (q, k, v, out, o_part, l_part, lse_arg),
                    build_combine, ccfg, backend)
    return out, lse


def compile_for(target, cfg: KernelConfig, problem: Problem):
    """Cross-compile for ``target`` without tensors; returns ``(main_kernel, combine_kernel)``."""
    cfg = C.check_problem_config(cfg, "split_kv")
    g = C.Geometry.from_problem(problem)
    splits = max(cfg.num_splits, 2)
    args = C.compile_args(_partial_geometry(g, splits), problem.store_lse)
    args["O"] = C.Ptr("*fp32")
    args["NUM_SPLITS"] = splits
    main = C.compile_kernel(_fwd_split_kv, target, args, _main_constexprs(cfg, g.head_dim, problem.causal), cfg)
    ccfg = cfg.replace(num_warps=4, num_stages=1, waves_per_eu=0, schedule_hint="none")
    cargs = _combine_args(g, C.Ptr("*fp32"), C.Ptr("*fp32"), C.Ptr("*" + g.dtype), C.Ptr("*fp32"), splits)
    combine = C.compile_kernel(_combine_split_kv, target, cargs,
                               _combine_constexprs(g.head_dim, problem.store_lse), ccfg)
    return main, combine
