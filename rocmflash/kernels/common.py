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
``reports/attention-*.md``; ``KernelConfig.pad_head_dim=True`` forces padding.

**Interpreter and compiler in one process.** ``triton.jit`` decides at decoration time
between a compiled ``JITFunction`` and an ``InterpretedFunction``. :func:`kernel_jit`
always builds the ``JITFunction`` (so compile-only builds work anywhere) and gives it an
interpreted twin; launches pick the twin when ``TRITON_INTERPRET=1`` *at call time*.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Any, NamedTuple, Optional

import triton
import triton.language as tl
from triton.language import core as _tl_core  # noqa: F401  (see _jit_functions_interpreted)
from triton.runtime.jit import JITFunction

from rocmflash.config import KernelConfig, Problem
# compile-only builds live in build.py; re-exported here, where the kernel modules reach them as ``C.*``
from rocmflash.kernels.build import (MAX_32BIT_RANGE, Ptr, as_target, compile_kernel,  # noqa: F401
                                     launch_attributes, specialise_int)

LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------- jit plumbing
class _DualJIT(JITFunction):
    """A JITFunction that also runs under Triton's interpreter.

    The compiler never calls a JITFunction (it inlines it), so ``__call__`` is only
    reached when an interpreted kernel calls a helper: forward it to the interpreted twin.
    """

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


def interpreting() -> bool:
    """True when launches should go through Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


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


# ----------------------------------------------------------------------------- interpreter
_BF16_DOT_PATCHED = False


def _patch_interpreter_bf16_dot() -> None:
    """Work around Triton 3.6's interpreter multiplying bf16 dot operands as raw uint16.

    The interpreter stores bf16 as uint16 and ``create_dot`` calls ``np.matmul`` on that
    storage (garbage results). Widen bf16 operands to fp32 first -- exact, and what the
    tensor cores do (exact products, fp32 accumulation). Only the interpreter is touched.
    """
    global _BF16_DOT_PATCHED
    if _BF16_DOT_PATCHED:
        return
    import numpy as np
    from triton.runtime import interpreter as I

    original = I.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):
            if x.dtype.scalar == tl.bfloat16:
                data = I._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
                return I.TensorHandle(data, tl.float32)
            return x

        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    I.InterpreterBuilder.create_dot = create_dot
    _BF16_DOT_PATCHED = True


@contextlib.contextmanager
def _jit_functions_interpreted():
    """While an interpreted kernel runs, let *any* JITFunction it calls run interpreted.

    Triton's own ``@jit`` helpers (``tl.zeros``, ``tl.cdiv``, ...) are compiled-mode
    JITFunctions when triton was imported without ``TRITON_INTERPRET=1``; calling one
    raises "Cannot call @triton.jit'd outside of the scope of a kernel". The compiler
    never calls ``JITFunction.__call__`` (it inlines), so patching it for the duration
    of an interpreted launch changes nothing else.
    """
    from triton.runtime.interpreter import InterpretedFunction

    original = JITFunction.__call__

    def call(self, *args, **kwargs):
        twin = self.__dict__.get("_rocmflash_twin")
        if twin is None:
            twin = self.__dict__["_rocmflash_twin"] = InterpretedFunction(self.fn)
        return twin(*args, **kwargs)

    # Nested interpreted calls patch triton.language / triton.language.core without
    # undoing it; a leaked patch breaks later real compiles in this process. Patch both
    # modules here first and restore everything on the way out.
    from triton.runtime import interpreter as I

    scope = I._patch_lang(_interpreter_probe)
    if scope is None:  # Triton <= 3.5 patches for good and gives nothing to restore
        raise RuntimeError(f"rocmflash's CPU interpreter path (TRITON_INTERPRET=1) needs Triton >= 3.6; this is "
                           f"{triton.__version__} (compiled GPU launches are unaffected)")
    JITFunction.__call__ = call
    try:
        yield
    finally:
        JITFunction.__call__ = original
        scope.restore()


def _interpreter_probe():
    """Never called: its ``__globals__`` (this module: ``tl`` and ``_tl_core``) drive the patch scope."""


_LAUNCH_OBSERVERS: list = []


@contextlib.contextmanager
def observe_launches():
    """Record every kernel launch made inside the block; yields the list of records.

    Each record is ``{"kernel", "backend", "options", "interpreted"}``: the compile
    options are those a compiled launch passes to Triton for that backend, also when the
    interpreter ran the kernel (so CPU tests see what a GPU launch would choose).
    """
    seen: list = []
    _LAUNCH_OBSERVERS.append(seen)
    try:
        yield seen
    finally:
        _LAUNCH_OBSERVERS.remove(seen)


#: reuse compiled kernels through :func:`launch_cached`'s own cache (False: every launch
#: goes through ``JITFunction.run``); ``ROCMFLASH_JIT_LAUNCH=1`` turns it off at import
FAST_LAUNCH = os.environ.get("ROCMFLASH_JIT_LAUNCH", "0") in ("", "0")
_PLANS: dict = {}  # launch key -> _LaunchPlan
_MAX_PLANS = 4096
_MAX_INT32 = 2**31 - 1


class _LaunchPlan(NamedTuple):
    """A compiled launch ready to replay: Triton's runner for one grid, the argument list in
    kernel order with the tensors left out, and where each tensor of the call goes."""

    runner: Any
    template: tuple
    slots: tuple  # ((position in the argument list, index in the call's tensors), ...)


def _jit_launch(fn, grid, kwargs: dict):
    """One launch through ``JITFunction.run`` (compiles on first use); returns Triton's ``CompiledKernel``."""
    return fn[grid](**kwargs)


def _is_compiled_kernel(obj) -> bool:
    from triton.compiler import CompiledKernel

    return isinstance(obj, CompiledKernel)


def launch_key(fn, scalars, tensors: tuple, cfg: KernelConfig, backend: str) -> tuple:
    """What decides the compiled binary, grid and argument values of a launch, conservatively.

    Triton specialises a launch on each tensor's dtype and 16-byte alignment (and, on AMD,
    on whether its storage fits 2 GiB: buffer loads), on integer values (``== 1``,
    divisible by 16) and on the constexprs and options. The key holds, per tensor, its
    dtype, shape, strides, 16-byte alignment and (on ``hip``) the 2 GiB bit, plus the
    device, the config and the caller's ``scalars`` (every non-tensor input of the launch):
    the integer arguments are functions of these, so a new shape, stride or scalar misses
    and goes through Triton once, never onto another specialisation or stale values.
    """
    parts = [id(fn), cfg, backend, scalars, tensors[0].get_device()]  # kernels live for the process: id is stable
    if backend == "hip":
        for t in tensors:
            parts += (t.dtype, t.shape, t.stride(), t.data_ptr() % 16 == 0,
                      t.untyped_storage().nbytes() <= _MAX_INT32)
    else:
        for t in tensors:
            parts += (t.dtype, t.shape, t.stride(), t.data_ptr() % 16 == 0)
    return tuple(parts)


class KeptKey(tuple):
    """A :func:`launch_key` that hashes once, for a caller that keeps a key across many launches
    (``kv_decode.launch``): hashing a key hashes the dataclasses in it, in Python, on every lookup.
    Equal to, and hashing like, the plain key, so either finds the other's plan."""

    def __new__(cls, key: tuple):
        self = super().__new__(cls, key)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


def _make_plan(fn, grid, args: dict, constexprs: dict, tensors: tuple, compiled) -> Optional[_LaunchPlan]:
    """A plan from a first launch, or None when some tensor argument is not one of ``tensors``
    (its value could change between calls with the same key: never replay it)."""
    import torch

    template, slots = [], []
    for position, name in enumerate(fn.arg_names):
        value = args[name] if name in args else constexprs[name]
        if isinstance(value, torch.Tensor):
            index = next((i for i, t in enumerate(tensors) if t is value), None)
            if index is None:
                return None
            slots.append((position, index))
            value = None
        template.append(value)
    grid3 = (tuple(grid) + (1, 1))[:3]  # CompiledKernel launches take all three grid dimensions
    return _LaunchPlan(compiled[grid3], tuple(template), tuple(slots))


def launch_cached(fn: _DualJIT, scalars, tensors: tuple, build, cfg: KernelConfig, backend: str,
                  key: Optional[tuple] = None) -> None:
    """Launch ``fn`` with the arguments ``build()`` returns as ``(grid, args, constexprs)``,
    building them only on the first launch of each specialisation.

    ``tensors`` are every tensor argument of the launch, and ``scalars`` (hashable) every
    other input ``build`` reads: together with the config they decide the grid, the
    arguments and Triton's specialisation (:func:`launch_key`). The first launch of a key
    goes through ``JITFunction.run`` and leaves a :class:`_LaunchPlan`; later launches put
    this call's tensors into the saved argument list and call Triton's cached runner
    (``CompiledKernel[grid](*args)``, its launch API since 3.0), which skips the argument
    binding and the per-call argument dictionaries: most of a launch's host cost. Under the
    interpreter, with ``observe_launches`` active or with ``FAST_LAUNCH`` off this is
    :func:`launch_kernel`.

    ``key``: this launch's :func:`launch_key`, when the caller kept it from an earlier launch
    and knows that nothing the key reads has changed since (see ``kv_decode.launch``);
    computing the key is a large part of a cached launch's cost. None: computed here.
    """
    if not FAST_LAUNCH or _LAUNCH_OBSERVERS or interpreting():
        grid, args, constexprs = build()
        launch_kernel(fn, grid, args, constexprs, cfg, backend)
        return
    if key is None:
        key = launch_key(fn, scalars, tensors, cfg, backend)
    plan = _PLANS.get(key)
    if plan is not None:
        call = list(plan.template)
        for position, index in plan.slots:
            call[position] = tensors[index]
        plan.runner(*call)
        return
    grid, args, constexprs = build()
    compiled = _jit_launch(fn, grid, {**args, **constexprs, **compile_options(cfg, backend)})
    if _is_compiled_kernel(compiled) and len(_PLANS) < _MAX_PLANS:
        plan = _make_plan(fn, grid, args, constexprs, tensors, compiled)
        if plan is not None:
            _PLANS[key] = plan


def launch_kernel(fn: _DualJIT, grid, args: dict, constexprs: dict, cfg: KernelConfig, backend: str):
    """Launch ``fn`` (compiled, or interpreted when TRITON_INTERPRET=1) with keyword arguments.

    The compile options are chosen the same way in both modes (AMD-only names on ``hip``
    only); the interpreter has no compiler, so it is not given them. Every compiled launch
    goes through ``JITFunction.run``; hot paths use :func:`launch_cached`.
    """
    options = compile_options(cfg, backend)
    interp = interpreting()
    for seen in _LAUNCH_OBSERVERS:
        seen.append({"kernel": fn.__name__, "backend": backend, "options": dict(options), "interpreted": interp})
    if interp:
        _patch_interpreter_bf16_dot()
        with _jit_functions_interpreted():
            fn.interpreted[grid](**args, **constexprs)
    else:
        _jit_launch(fn, grid, {**args, **constexprs, **options})


def torch_backend() -> str:
    """"hip" on ROCm builds of torch, else "cuda"."""
    from rocmflash.platform import is_rocm  # not at import: platform.py is no kernel source (compile cache key)

    return "hip" if is_rocm() else "cuda"


_DUMMY_LSE: dict = {}


def dummy_lse(device):
    """A 1-element fp32 buffer passed as LSE when the caller does not want it (never written; one per device)."""
    buf = _DUMMY_LSE.get(device)
    if buf is None:
        import torch

        buf = _DUMMY_LSE[device] = torch.empty(1, device=device, dtype=torch.float32)
    return buf


@functools.lru_cache(maxsize=4096)
def compile_options(cfg: KernelConfig, backend: str) -> dict:
    """``cfg.compile_options(backend)``, computed once per config (callers must not mutate it)."""
    return cfg.compile_options(backend)


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
                   out=None, lse=None, extra_grid: tuple = ()):
    """Launch a one-kernel forward variant on validated ``(B, H, S, D)`` tensors; returns ``(out, lse)``.

    ``constexprs_for(cfg, head_dim, causal, store_lse)`` gives the kernel's constexprs;
    the grid is (query blocks, batch x query heads, *extra_grid).
    """
    cfg = check_problem_config(cfg, variant)
    if out is None:
        import torch

        out = torch.empty_like(q)
    store_lse = lse is not None
    lse_arg = lse if store_lse else dummy_lse(q.device)
    causal, sm_scale = bool(causal), float(sm_scale)

    def build():
        g = Geometry.from_tensors(q, k, v, out)
        grid = ((g.seqlen_q + cfg.BLOCK_M - 1) // cfg.BLOCK_M, g.batch * g.heads_q, *extra_grid)
        return (grid, attention_args(g, q, k, v, out, lse_arg, sm_scale),
                _constexprs(constexprs_for, cfg, g.head_dim, causal, store_lse))

    launch_cached(fn, (constexprs_for, causal, sm_scale, store_lse, extra_grid), (q, k, v, out, lse_arg), build,
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
