"""Small stand-alone Triton kernels for demos and for testing isa_tools on real compiler output.

They are deliberately independent of rocmflash's own attention kernels, so the
code-object reader and occupancy model are checked on plain GEMM- and FA-shaped
code whose register pressure spans the whole range (from a few VGPRs to spills).
"""

import triton
import triton.language as tl

#: Triton signature of :func:`fa_like_kernel` for ``ASTSource`` (fp16 tensors)
FA_LIKE_SIGNATURE = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "o_ptr": "*fp16", "seqlen": "i32",
                     "stride_s": "i32", "sm_scale": "fp32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
                     "HEAD_DIM": "constexpr"}


@triton.jit
def gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :])
        b = tl.load(b_ptr + (k0 + offs_k)[:, None] * stride_bk + offs_n[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def fa_like_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seqlen, stride_s, sm_scale,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Online-softmax attention forward for one head: the classic accumulator lifetime."""
    start_m = tl.program_id(0) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + offs_m[:, None] * stride_s + offs_d[None, :])
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, seqlen, BLOCK_N):
        k = tl.load(k_ptr + (start_n + offs_n)[None, :] * stride_s + offs_d[:, None])
        s = tl.dot(q, k) * sm_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + (start_n + offs_n)[:, None] * stride_s + offs_d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None] * stride_s + offs_d[None, :], acc.to(o_ptr.dtype.element_ty))


@triton.jit
def lds_reduce_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """A row reduction whose cross-warp tl.sum needs LDS scratch."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + tl.program_id(0) * n + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + tl.program_id(0), tl.sum(x * x, 0))
