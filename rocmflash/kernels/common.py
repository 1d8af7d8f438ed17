"""Pieces shared by the four forward-attention variants.

Device side (``@kernel_jit`` helpers): loading the Q tile, computing the score tile
``Q Kᵀ`` over one or two head-dim pieces, masking (key tail + causal diagonal), loading
a V tile, and the causal loop bounds. Host side: the head-dim split rule, a
:class:`Geometry` record built either from tensors (launch) or from a
:class:`~rocmflash.config.Problem` (compile-only), and :func:`compile_kernel` (from
:mod:`rocmflash.kernels.build`), which builds a kernel for any ``GPUTarget`` with exactly
the argument specialisation and attributes a real launch would get.

Conventions used by every kernel:

* Scores are computed in fp32; the softmax scale is pre-multiplied by ``log2(e)`` so the
  kernels use ``exp2`` (one MUFU/v_exp op) instead of ``exp``.
* Causal masking is **bottom-right aligned** (flash-attn convention): query ``i`` may
  attend key ``j`` iff ``j <= i + (Sk - Sq)``. With ``Sq > Sk`` the first ``Sq - Sk``
  queries see no key: their output is 0 and their LSE is ``-inf``.
* LSE is returned in natural log, fp32, shape ``(B, Hq, Sq)``.

**Non-power-of-two head dims.** ``tl.arange`` needs power-of-two extents and ``tl.dot``
needs K >= 16. :func:`head_dim_pieces` splits D into a power-of-two main piece plus a
second power-of-two piece (>= 16) when that is narrower than padding: 72 and 80 -> 64+16,
96 -> 64+32, 160 -> 128+32, 192 -> 128+64; otherwise (e.g. 112, 24) D is padded to the next
power of two with masked loads. Both QKᵀ (two accumulating dots) and the output
accumulator (two tiles) use the pieces, so the fp32 accumulator shrinks with D instead
of being sized for the next power of two. The measured register cost is in
``docs/evidence/attention-2026-11-21-h100.md``; ``KernelConfig.pad_head_dim=True`` forces padding.

**Interpreter and compiler in one process.** ``triton.jit`` decides at decoration time
between a compiled ``JITFunction`` and an ``InterpretedFunction``. :func:`kernel_jit`
always builds the ``JITFunction`` (so compile-only builds work anywhere) and gives it an
interpreted twin; launches pick the twin when ``TRITON_INTERPRET=1`` *at call time*.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Optional

import triton.language as tl
from triton.runtime.jit import JITFunction

from rocmflash.config import KernelConfig, Problem
# compile-only builds live in build.py and launches in launch.py; re-exported here, where the
# kernel modules reach them as ``C.*``
from rocmflash.kernels.build import (MAX_32BIT_RANGE, Ptr, as_target, compile_kernel,  # noqa: F401
                                     int_type, launch_attributes, specialise_int)
from rocmflash.kernels.launch import (KeptKey, compile_options, interpreting, kept_key,  # noqa: F401
                                      launch_cached, launch_key, launch_kernel, observe_launches)

LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------- jit plumbing
class _DualJIT(JITFunction):
    """A JITFunction that also runs under Triton's interpreter.

    The compiler never calls a JITFunction (it inlines it), so ``__call__`` is only
    reached when an interpreted kernel calls a helper: forward it to the interpreted twin.
    """

    def __init__(self, fn, do_not_specialize=(), **kwargs):
        super().__init__(fn, do_not_specialize=tuple(do_not_specialize), **kwargs)
        #: the integer arguments Triton leaves unspecialised (by name): a compile-only build types them by
        #: range only (:func:`~rocmflash.kernels.build.compile_kernel`), and a launch plan takes their values
        #: per call (:func:`~rocmflash.kernels.launch.launch_cached`'s ``loose``)
        self.unspecialised = tuple(do_not_specialize)

    @property
    def interpreted(self):
        twin = self.__dict__.get("_twin")
        if twin is None:
            from triton.runtime.interpreter import InterpretedFunction

            twin = InterpretedFunction(self.fn)
            self.__dict__["_twin"] = twin
        return twin

    def __call__(self, *args, **kwargs):
        return self.interpreted(*args, **kwargs)


def kernel_jit(fn):
    """Decorator used instead of ``triton.jit`` for every kernel and helper of this package."""
    return _DualJIT(fn)


def jit_unspecialised(names):
    """``kernel_jit`` with the integer arguments ``names`` left unspecialised by Triton (``do_not_specialize``):
    one binary serves every value of them (of one integer width), so sizes that change from call to call
    neither compile again nor miss a launch plan."""
    return lambda fn: _DualJIT(fn, do_not_specialize=names)



# ----------------------------------------------------------------------------- device helpers
@kernel_jit
def load_2d(ptrs, rmask, cmask, MASK_R: tl.constexpr, MASK_C: tl.constexpr):
    """Load a 2-D tile, masking rows and/or columns only where the caller says it is needed."""
    if MASK_R:
        if MASK_C:
            x = tl.load(ptrs, mask=rmask[:, None] & cmask[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=rmask[:, None], other=0.0)
    else:
        if MASK_C:
            x = tl.load(ptrs, mask=cmask[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@kernel_jit
def load_q(Q_base, offs_m, stride_qm, stride_qd, SEQ_Q,
           HEAD_DIM: tl.constexpr, BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr):
    """The Q tile as one or two head-dim pieces ``(q0, q1)``; ``q1`` is a dummy when BLOCK_D1 == 0."""
    offs_d0 = tl.arange(0, BLOCK_D0)
    q0 = load_2d(Q_base + offs_m[:, None] * stride_qm + offs_d0[None, :] * stride_qd,
                 offs_m < SEQ_Q, offs_d0 < HEAD_DIM, True, BLOCK_D0 > HEAD_DIM)
    q1 = q0
    if BLOCK_D1 > 0:
        offs_d1 = BLOCK_D0 + tl.arange(0, BLOCK_D1)
        q1 = load_2d(Q_base + offs_m[:, None] * stride_qm + offs_d1[None, :] * stride_qd,
                     offs_m < SEQ_Q, offs_d1 < HEAD_DIM, True, BLOCK_D0 + BLOCK_D1 > HEAD_DIM)
    return q0, q1


@kernel_jit
def qk_scores(q0, q1, K_base, offs_n, stride_kn, stride_kd, SEQ_K,
              HEAD_DIM: tl.constexpr, BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
              MASK_N: tl.constexpr):
    """Raw fp32 scores ``Q Kᵀ`` for one key block: one dot per head-dim piece, accumulated.

    K is loaded transposed (``[D, BLOCK_N]``); key rows past ``SEQ_K`` are loaded as 0
    only in masked blocks (``MASK_N``) -- full blocks issue unmasked loads.
    """
    offs_d0 = tl.arange(0, BLOCK_D0)
    k0 = load_2d(K_base + offs_d0[:, None] * stride_kd + offs_n[None, :] * stride_kn,
                 offs_d0 < HEAD_DIM, offs_n < SEQ_K, BLOCK_D0 > HEAD_DIM, MASK_N)
    s = tl.dot(q0, k0)
    if BLOCK_D1 > 0:
        offs_d1 = BLOCK_D0 + tl.arange(0, BLOCK_D1)
        k1 = load_2d(K_base + offs_d1[:, None] * stride_kd + offs_n[None, :] * stride_kn,
                     offs_d1 < HEAD_DIM, offs_n < SEQ_K, BLOCK_D0 + BLOCK_D1 > HEAD_DIM, MASK_N)
        s = tl.dot(q1, k1, s)
    return s


@kernel_jit
def mask_scores(s, offs_m, offs_n, SEQ_Q, SEQ_K, CAUSAL: tl.constexpr):
    """Set disallowed scores to -inf: keys past the end, and (causal) keys ``j > i + Sk - Sq``."""
    if CAUSAL:
        if s.shape[1] >= 128:
            # Wide blocks: one compare per score, j < Sk and j <= i + Sk - Sq  <=>  j <= min(i + Sk - Sq, Sk - 1).
            # On AMD every compare is a 64-bit lane mask in SGPRs; at 64 scores per lane (128x128,
            # 4 warps) two compares and their AND per score ran out of SGPRs (gfx950: 28 SGPR spills
            # at D=64). Narrower blocks keep the two compares, which LLVM schedules at least as well.
            last = tl.minimum(offs_m + (SEQ_K - SEQ_Q), SEQ_K - 1)
            keep = offs_n[None, :] <= last[:, None]
        else:
            keep = (offs_n[None, :] < SEQ_K) & (offs_n[None, :] <= offs_m[:, None] + (SEQ_K - SEQ_Q))
    else:
        keep = offs_n[None, :] < SEQ_K
    return tl.where(keep, s, float("-inf"))


@kernel_jit
def load_v(V_base, offs_n, d_start, stride_vn, stride_vd, SEQ_K, D_END,
           BLOCK_D: tl.constexpr, MASK_N: tl.constexpr, MASK_D: tl.constexpr):
    """V tile ``[BLOCK_N, BLOCK_D]`` for head-dim columns ``d_start + arange(BLOCK_D)`` (< D_END)."""
    offs_d = d_start + tl.arange(0, BLOCK_D)
    return load_2d(V_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                   offs_n < SEQ_K, offs_d < D_END, MASK_N, MASK_D)


@kernel_jit
def load_v_pieces(V_base, offs_n, stride_vn, stride_vd, SEQ_K, HEAD_DIM,
                  BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr, MASK_N: tl.constexpr):
    """The V tile as the same one or two head-dim pieces as Q (``v1`` is a dummy when BLOCK_D1 == 0)."""
    v0 = load_v(V_base, offs_n, 0, stride_vn, stride_vd, SEQ_K, HEAD_DIM, BLOCK_D0, MASK_N, BLOCK_D0 > HEAD_DIM)
    v1 = v0
    if BLOCK_D1 > 0:
        v1 = load_v(V_base, offs_n, BLOCK_D0, stride_vn, stride_vd, SEQ_K, HEAD_DIM,
                    BLOCK_D1, MASK_N, BLOCK_D0 + BLOCK_D1 > HEAD_DIM)
    return v0, v1


@kernel_jit
def zero_accumulators(BLOCK_M: tl.constexpr, BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr):
    """fp32 output accumulators for the head-dim pieces (``acc1`` is a dummy, never updated, when BLOCK_D1 == 0)."""
    acc0 = tl.zeros([BLOCK_M, BLOCK_D0], tl.float32)
    acc1 = acc0
    if BLOCK_D1 > 0:
        acc1 = tl.zeros([BLOCK_M, BLOCK_D1], tl.float32)
    return acc0, acc1


@kernel_jit
def softmax_start(Sinks, off_h, BLOCK_M: tl.constexpr):
    """Each row's online-softmax state ``(m, l)`` before its first key block (``m`` in the log2 domain).

    Without sinks (``Sinks`` is None, a constexpr: this code is exactly the plain kernel's) ``m = -inf``,
    ``l = 0``. With attention sinks (gpt-oss; fp32 ``(Hq,)`` logits in the scaled-score domain) every row
    starts as if it had seen one virtual key whose score is its head's sink and whose V row is zero: ``m =
    sink * log2(e)``, ``l = 1``. The sink then joins the softmax denominator (``out = acc / l``) and the LSE,
    and drops out of the numerator -- ``softmax(cat([q·kᵀ * scale, sink]))`` with the sink column dropped.
    A ``-inf`` sink is no sink: the first key block rescales ``l`` by ``exp2(-inf) = 0``. A ``+inf`` sink takes
    all the weight (output 0, as torch's softmax gives): it starts at the largest finite ``m``, since ``m = inf``
    would make every rescale ``exp2(inf - inf)`` NaN. A NaN sink gives NaN rows, as the eager formula does.
    """
    if Sinks is not None:
        sink = tl.load(Sinks + off_h).to(tl.float32) * 1.4426950408889634
        sink = tl.where(sink == float("inf"), 3.0e38, sink)
        m_i = tl.zeros([BLOCK_M], tl.float32) + sink
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    return m_i, l_i


@kernel_jit
def store_o(O_base, acc, offs_m, d_start, stride_om, stride_od, SEQ_Q, D_END,
            BLOCK_D: tl.constexpr, MASK_D: tl.constexpr):
    """Store an output tile (cast to O's dtype); rows past SEQ_Q and columns past D_END skipped."""
    offs_d = d_start + tl.arange(0, BLOCK_D)
    ptrs = O_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    if MASK_D:
        tl.store(ptrs, acc.to(O_base.dtype.element_ty),
                 mask=(offs_m[:, None] < SEQ_Q) & (offs_d[None, :] < D_END))
    else:
        tl.store(ptrs, acc.to(O_base.dtype.element_ty), mask=offs_m[:, None] < SEQ_Q)


@kernel_jit
def kv_bounds(start_m, SEQ_Q, SEQ_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr):
    """``(full_end, hi)`` for a query block starting at ``start_m``.

    Keys ``[0, full_end)`` are unmasked for every row of the block (whole blocks, no mask
    work); keys ``[full_end, hi)`` need the tail/causal mask; keys ``>= hi`` are never
    visited (fully masked blocks are skipped by the loop bounds, not masked).
    """
    if CAUSAL:
        shift = SEQ_K - SEQ_Q  # bottom-right alignment
        hi = tl.minimum(SEQ_K, tl.maximum(0, start_m + BLOCK_M + shift))
        full_end = (tl.maximum(0, tl.minimum(hi, start_m + shift + 1)) // BLOCK_N) * BLOCK_N
    else:
        hi = SEQ_K
        full_end = (SEQ_K // BLOCK_N) * BLOCK_N
    return full_end, hi


@kernel_jit
def query_block(CAUSAL: tl.constexpr):
    """Index of this program's query block; causal grids start with the longest rows."""
    if CAUSAL:
        pid = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid = tl.program_id(0)
    return pid


@kernel_jit
def program_heads(H_Q, GROUP, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """This forward program's ``(start_m, off_bh, off_z, off_h, off_hk)``: its first query row
    (:func:`query_block`), grid axis 1 = batch ``off_z`` x query head ``off_h``, and the K/V head
    ``off_hk`` (GQA/MQA: ``GROUP`` query heads share one)."""
    start_m = query_block(CAUSAL) * BLOCK_M
    off_bh = tl.program_id(1)
    off_z = off_bh // H_Q
    off_h = off_bh % H_Q
    off_hk = off_h // GROUP
    return start_m, off_bh, off_z, off_h, off_hk


@kernel_jit
def program_bases(Q, K, V, O, stride_qz, stride_qh, stride_kz, stride_kh, stride_vz, stride_vh, stride_oz, stride_oh,
                  start_m, off_z, off_h, off_hk, BLOCK_M: tl.constexpr):
    """``(Q_base, K_base, V_base, O_base, offs_m)``: the base pointers of :func:`program_heads`' heads and the
    program's ``BLOCK_M`` query rows. Two helpers, not one: the fp8 forward loads its descales between them,
    the order its code was compiled with (gfx942/gfx950/sm_90 code unchanged by the move)."""
    # 64-bit base offsets: batch*head strides overflow int32 on large tensors
    Q_base = Q + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    K_base = K + off_z.to(tl.int64) * stride_kz + off_hk.to(tl.int64) * stride_kh
    V_base = V + off_z.to(tl.int64) * stride_vz + off_hk.to(tl.int64) * stride_vh
    O_base = O + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    offs_m = start_m + tl.arange(0, BLOCK_M)
    return Q_base, K_base, V_base, O_base, offs_m


# ----------------------------------------------------------------------------- host helpers
def next_pow2(x: int) -> int:
    return 1 << (max(int(x), 1) - 1).bit_length()


def head_dim_pieces(head_dim: int, pad: bool = False) -> tuple[int, int]:
    """``(BLOCK_D0, BLOCK_D1)`` covering ``head_dim`` (BLOCK_D1 == 0: one piece).

    A two-piece split ``prev_pow2(D) + next_pow2(max(D - prev_pow2(D), 16))`` is used when
    it is narrower than padding to ``next_pow2(D)``; otherwise (or with ``pad=True``) D is
    padded to ``max(16, next_pow2(D))``.
    """
    padded = max(16, next_pow2(head_dim))
    if pad or padded == head_dim:
        return padded, 0
    d0 = 1 << (int(head_dim).bit_length() - 1)
    d1 = max(16, next_pow2(head_dim - d0))
    if d0 >= 16 and d0 + d1 < padded:
        return d0, d1
    return padded, 0


class Geometry(NamedTuple):
    """Sizes and element strides of one attention call, from tensors or from a Problem.

    A named tuple, not a dataclass: one is built per launch, and a tuple is built in a
    fraction of the time (host cost per call is part of what a user feels).
    """

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str  # "fp16" | "bf16"
    q_strides: tuple
    k_strides: tuple
    v_strides: tuple
    o_strides: tuple

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @classmethod
    def from_problem(cls, p: Problem) -> "Geometry":
        def contig(h, s, d):
            return (h * s * d, s * d, d, 1)

        return cls(p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.dtype,
                   contig(p.heads_q, p.seqlen_q, p.head_dim), contig(p.heads_kv, p.seqlen_k, p.head_dim),
                   contig(p.heads_kv, p.seqlen_k, p.head_dim), contig(p.heads_q, p.seqlen_q, p.head_dim))

    @classmethod
    def from_tensors(cls, q, k, v, o) -> "Geometry":
        B, Hq, Sq, D = q.shape
        dt = _DTYPE_NAMES.get(q.dtype) or _dtype_name(q.dtype)
        return cls(B, Hq, k.shape[1], Sq, k.shape[2], D, dt, q.stride(), k.stride(), v.stride(), o.stride())


_DTYPE_NAMES: dict = {}  # torch dtype -> "fp16" / "bf16", filled on first use


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES[dtype] = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}[str(dtype)]
    return name


def attention_args(g: Geometry, q, k, v, o, lse, sm_scale: float) -> dict:
    """The argument prefix common to the main kernels, in kernel-signature order."""
    return dict(
        Q=q, K=k, V=v, O=o, LSE=lse, qk_scale=float(sm_scale) * LOG2E,
        stride_qz=g.q_strides[0], stride_qh=g.q_strides[1], stride_qm=g.q_strides[2], stride_qd=g.q_strides[3],
        stride_kz=g.k_strides[0], stride_kh=g.k_strides[1], stride_kn=g.k_strides[2], stride_kd=g.k_strides[3],
        stride_vz=g.v_strides[0], stride_vh=g.v_strides[1], stride_vn=g.v_strides[2], stride_vd=g.v_strides[3],
        stride_oz=g.o_strides[0], stride_oh=g.o_strides[1], stride_om=g.o_strides[2], stride_od=g.o_strides[3],
        H_Q=g.heads_q, GROUP=g.group, SEQ_Q=g.seqlen_q, SEQ_K=g.seqlen_k,
    )


def compile_args(g: Geometry, store_lse: bool) -> dict:
    """``attention_args`` for a compile-only build: pointers replaced by :class:`Ptr` of the problem's sizes."""
    t = "*" + g.dtype
    q_bytes = 2 * g.batch * g.heads_q * g.seqlen_q * g.head_dim
    kv_bytes = 2 * g.batch * g.heads_kv * g.seqlen_k * g.head_dim
    lse_bytes = 4 * g.batch * g.heads_q * g.seqlen_q if store_lse else 0
    return attention_args(g, Ptr(t, q_bytes), Ptr(t, kv_bytes), Ptr(t, kv_bytes), Ptr(t, q_bytes),
                          Ptr("*fp32", lse_bytes), 1.0)


_TORCH: list = []  #: ``[torch]``, bound by the first :func:`_torch` call


def torch_backend() -> str:
    """"hip" on ROCm builds of torch, else "cuda" (:func:`rocmflash.hw.platform.is_rocm`'s rule).

    Called by every launch: read on each call (tests fake a ROCm build at run time) but with no import
    statement after the first (an import per call cost a launch ~1 us). ``hw/platform.py`` itself is not
    imported here: it is no kernel source (``static.compile.FORWARD_SOURCES``, the compile cache key)."""
    return "hip" if getattr(_torch().version, "hip", None) else "cuda"


def _torch():
    """The torch module, imported on first use only (as everywhere in this module: none at import)."""
    if not _TORCH:
        import torch

        _TORCH.append(torch)
    return _TORCH[0]


_DUMMY_LSE: dict = {}


def dummy_lse(device):
    """A 1-element fp32 buffer passed as LSE when the caller does not want it (never written; one per device)."""
    buf = _DUMMY_LSE.get(device)
    if buf is None:
        import torch

        buf = _DUMMY_LSE[device] = torch.empty(1, device=device, dtype=torch.float32)
    return buf



@functools.lru_cache(maxsize=4096)
def _constexprs(constexprs_for, cfg: KernelConfig, head_dim: int, causal: bool, store_lse: bool) -> dict:
    return constexprs_for(cfg, head_dim, causal, store_lse)


_COMPUTE_UNITS: dict = {}


def num_compute_units(device) -> int:
    """CUs/SMs of the device (132 when unknown, e.g. under the interpreter); cached per device."""
    hit = _COMPUTE_UNITS.get(device)
    if hit is not None:
        return hit
    import torch

    count = 132
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        count = torch.cuda.get_device_properties(device).multi_processor_count
    _COMPUTE_UNITS[device] = count
    return count


def resolve_pieces(cfg: KernelConfig, head_dim: int) -> tuple[int, int]:
    return head_dim_pieces(head_dim, cfg.pad_head_dim)


def launch_forward(fn, variant: str, constexprs_for, q, k, v, cfg: KernelConfig, causal: bool, sm_scale: float,
                   out=None, lse=None, extra_grid: tuple = (), sinks=None):
    """Launch a one-kernel forward variant on validated ``(B, H, S, D)`` tensors; returns ``(out, lse)``.

    ``constexprs_for(cfg, head_dim, causal, store_lse)`` gives the kernel's constexprs;
    the grid is (query blocks, batch x query heads, *extra_grid). ``sinks``: a contiguous fp32 ``(Hq,)``
    tensor for a kernel with a ``Sinks`` argument (:func:`softmax_start`), whose constexprs give
    ``Sinks=None`` (the build without sinks); here the tensor takes that constexpr's place.
    """
    cfg = check_problem_config(cfg, variant)
    if out is None:
        out = _torch().empty_like(q)
    store_lse = lse is not None
    lse_arg = lse if store_lse else dummy_lse(q.device)
    causal, sm_scale = bool(causal), float(sm_scale)

    def build():
        g = Geometry.from_tensors(q, k, v, out)
        grid = ((g.seqlen_q + cfg.BLOCK_M - 1) // cfg.BLOCK_M, g.batch * g.heads_q, *extra_grid)
        args = attention_args(g, q, k, v, out, lse_arg, sm_scale)
        constexprs = _constexprs(constexprs_for, cfg, g.head_dim, causal, store_lse)
        if sinks is not None:  # a tensor argument instead of the constexpr None (a copy: the dict is cached)
            args["Sinks"] = sinks
            constexprs = {name: value for name, value in constexprs.items() if name != "Sinks"}
        return grid, args, constexprs

    # the tensors lead the kernel's arguments in this order (LSE, then Sinks): a launch plan picks them as given
    tensors = (q, k, v, out, lse_arg) if sinks is None else (q, k, v, out, lse_arg, sinks)
    launch_cached(fn, (constexprs_for, causal, sm_scale, store_lse, extra_grid), tensors, build,
                  cfg, torch_backend())
    return out, lse


def compile_forward(fn, variant: str, constexprs_for, target, cfg: KernelConfig, problem: Problem):
    """Cross-compile a one-kernel forward variant for ``target`` without tensors; returns ``(kernel,)``."""
    cfg = check_problem_config(cfg, variant)
    g = Geometry.from_problem(problem)
    return (compile_kernel(fn, target, compile_args(g, problem.store_lse),
                           constexprs_for(cfg, g.head_dim, problem.causal, problem.store_lse), cfg),)


def check_problem_config(cfg: KernelConfig, variant: str, problem: Optional[Problem] = None) -> KernelConfig:
    """``cfg`` validated and set to ``variant`` (cached: a launch validates each config once)."""
    return _checked_config(cfg, variant)


@functools.lru_cache(maxsize=4096)
def _checked_config(cfg: KernelConfig, variant: str) -> KernelConfig:
    cfg = cfg.validate()
    if cfg.variant != variant:
        cfg = dataclasses.replace(cfg, variant=variant)
    return cfg
