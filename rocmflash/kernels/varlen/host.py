"""Variable-length (packed) attention: forward, dQ and dK/dV kernels over cumulative sequence lengths.

Layout (flash-attn's): ``q (total_q, Hq, D)``, ``k/v (total_k, Hkv, D)``; sequence ``b``
owns query rows ``cu_q[b]:cu_q[b+1]`` and key rows ``cu_k[b]:cu_k[b+1]``. No padding is
stored or computed: a program whose tile starts past its sequence's end returns at once,
so the grid is sized by the longest sequence but the work by the real tokens.

Masks are bands (:mod:`rocmflash.kernels.masks`): causal and sliding windows, bottom-right
aligned per sequence. Each program splits its loop into the blocks every row sees in
full (no mask work) and the few edge blocks that need one, exactly like the dense
``online`` kernel does for the causal diagonal; blocks outside the band are never visited.

The backward follows :mod:`rocmflash.kernels.backward.host` (two kernels, no atomics, dQ
first: it computes ``delta = rowsum(dO * O)`` for its rows and the dK/dV kernel reads it;
dK/dV sums the GQA group in registers). Soft-capping adds the ``1 - tanh²`` factor to
``dS``. LSE and delta are ``(Hq, total_q)`` fp32, as flash-attn's varlen LSE.

Head dims 16..256 are padded to the next power of two with masked loads (the dense
kernel's two-piece split is not used here).

``cu_seqlens`` values are never read on the host: every kernel clamps each sequence into the
packed rows, so wrong values never address memory outside the tensors, and the forward ORs
what was wrong into a per-device error word (:mod:`rocmflash.kernels.varlen.checks`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, TYPE_CHECKING

from rocmflash.config import KernelConfig
from rocmflash.kernels import common as C
from rocmflash.kernels import masks as M
from rocmflash.kernels.varlen import checks as VC
from rocmflash.kernels.backward.host import sink_grad
from rocmflash.kernels.varlen.kernel import (
    _varlen_bwd_dkdv,
    _varlen_bwd_dq,
    _varlen_fwd,
)

if TYPE_CHECKING:  # annotations only: torch is imported where a launch needs it
    import torch

KERNELS = ("_varlen_fwd", "_varlen_bwd_dq", "_varlen_bwd_dkdv")


# ----------------------------------------------------------------------------- host side
@dataclasses.dataclass(frozen=True)
class VarlenCall:
    """What every varlen launch shares: the band, the cap, the scale and the packed geometry."""

    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    max_seqlen_q: int
    max_seqlen_k: int
    sm_scale: float
    softcap: float
    win_left: int  # :data:`rocmflash.kernels.masks.UNBOUNDED` for an unbounded side
    win_right: int
    #: the last ``cu_seqlens`` entries must be the packed lengths (flash_attn_varlen_func); False: at most,
    #: the rows after them unused (zero in the output and the gradients; the HF integration's packing)
    strict_end: bool = True

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def block_d(self) -> int:
        return max(16, C.next_pow2(self.head_dim))

    def bounded(self) -> dict:
        return dict(BOUNDED_LEFT=self.win_left < M.UNBOUNDED, BOUNDED_RIGHT=self.win_right < M.UNBOUNDED)

    def scalars(self) -> dict:
        softcap = float(self.softcap)
        return dict(sm_scale=float(self.sm_scale), qk_scale=float(self.sm_scale) * C.LOG2E,
                    softcap=softcap if softcap > 0 else 1.0)


def _strides3(prefix: str, t: torch.Tensor) -> dict:
    s = t.stride()
    return {f"stride_{prefix}t": s[0], f"stride_{prefix}h": s[1], f"stride_{prefix}d": s[2]}


def _fwd_constexprs(call: VarlenCall, cfg: KernelConfig, store_lse: bool, sinks: bool = False) -> dict:
    """The forward's constexprs; without ``sinks`` its ``Sinks`` argument is the constexpr None (the build
    without attention sinks), with them it is a tensor argument (:func:`forward_args`)."""
    extra = {} if sinks else dict(Sinks=None)
    return dict(HEAD_DIM=call.head_dim, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D=call.block_d,
                SOFTCAP=call.softcap > 0, PRE_LOAD_V=bool(cfg.PRE_LOAD_V), STORE_LSE=bool(store_lse), **call.bounded(),
                **extra)


def forward_args(call: VarlenCall, q, k, v, out, lse, cu_q, cu_k, err, totals: Optional[tuple] = None,
                 sinks=None) -> dict:
    """Arguments of ``_varlen_fwd`` in signature order (``lse`` a ``(Hq, total_q)`` fp32 buffer, ``err``
    the error word, ``totals`` the packed rows of q and k: their lengths when None, ``sinks`` the fp32
    ``(Hq,)`` attention-sink logits or None: then ``Sinks`` is a constexpr, :func:`_fwd_constexprs`)."""
    totals = totals or (q.shape[0], k.shape[0])
    extra = {} if sinks is None else dict(Sinks=sinks)
    return dict(Q=q, K=k, V=v, O=out, LSE=lse, CU_Q=cu_q, CU_K=cu_k, ERR=err, **extra, **call.scalars(),
                **_strides3("q", q), **_strides3("k", k), **_strides3("v", v), **_strides3("o", out),
                stride_lh=_lse_row_stride(lse), H_Q=call.heads_q, GROUP=call.group,
                WIN_LEFT=call.win_left, WIN_RIGHT=call.win_right, TOTAL_Q=totals[0], TOTAL_K=totals[1],
                MAX_Q=call.max_seqlen_q, MAX_K=call.max_seqlen_k, STRICT_END=int(call.strict_end))


def _lse_row_stride(lse) -> int:
    return lse.stride(0) if getattr(lse, "ndim", 0) == 2 else 0


class _StridedPtr(C.Ptr):
    """A compile-only tensor stand-in: its Triton pointer type and the strides a launch would pass."""

    def __init__(self, ty: str, strides: tuple, nbytes: int = 0):
        super().__init__(ty, nbytes)
        self._strides = tuple(strides)
        self.ndim = len(self._strides)

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]


# A packed batch's sizes change every call: the totals, the longest sequences, the sequence count. They reach the
# kernels only as unspecialised integers (``varlen_checks.UNSPECIALISED``...) and through the grid, so a launch's
# key leaves them out (:func:`_packed_key`) and one launch plan per kernel and layout serves every packing: its
# replay takes this call's sizes (``loose``) and grid, never Triton's JIT launch.
_LOOSE = {n: tuple(range(n)) for n in range(1, 12)}  #: every tensor of an n-tensor launch: rows loose


def _packed_key(call: VarlenCall, tensors: tuple, loose: tuple) -> tuple:
    """What decides a varlen launch beyond its packed sizes (``loose``, the grid): the call without its sizes, each
    tensor's shape and strides but a packed tensor's rows (dim 0 of ``(total, H, D)``) and an ``(H, total)`` row
    buffer's row stride (LSE, delta: ``stride_lh``, loose), and the sizes' integer widths."""
    parts = [call.heads_q, call.heads_kv, call.head_dim, call.sm_scale, call.softcap, call.win_left, call.win_right,
             call.strict_end, tuple(C.int_type(v) for v in loose)]
    for t in tensors:
        if t.ndim == 2:
            parts.append((t.shape[0], t.stride(1)))
        else:
            parts.append((t.shape[1:], t.stride()))
    return tuple(parts)


def launch_forward(call: VarlenCall, q, k, v, cu_q, cu_k, cfg: KernelConfig, out, lse: Optional[torch.Tensor],
                   sinks: Optional[torch.Tensor] = None):
    """Run ``_varlen_fwd`` into ``out`` (``(total_q, Hq, D)``) and, when given, ``lse`` (``(Hq, total_q)``).
    ``sinks``: contiguous fp32 ``(Hq,)`` attention-sink logits (:func:`rocmflash.kernels.common.softmax_start`),
    which the LSE then includes; None: none (the kernel built without them)."""
    lse_arg = lse if lse is not None else C.dummy_lse(q.device)
    err = VC.error_word(q.device)
    tensors = (q, k, v, out, lse_arg, cu_q, cu_k, err) + (() if sinks is None else (sinks,))
    loose = (q.shape[0], k.shape[0], call.max_seqlen_q, call.max_seqlen_k, int(call.strict_end),
             _lse_row_stride(lse_arg))  # in UNSPECIALISED's order
    grid = (triton_cdiv(call.max_seqlen_q, cfg.BLOCK_M), call.batch * call.heads_q)
    C.launch_cached(_varlen_fwd, (_packed_key(call, tensors, loose), lse is not None), tensors,
                    lambda: (grid, forward_args(call, q, k, v, out, lse_arg, cu_q, cu_k, err, sinks=sinks),
                             _fwd_constexprs(call, cfg, lse is not None, sinks is not None)), cfg, C.torch_backend(),
                    loose=loose, loose_tensors=_LOOSE[len(tensors)], grid=grid)


_CHECK_CONFIG = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)


def launch_length_check(cu_q, cu_k, batch: int, total_q: int, total_k: int, max_q: int, max_k: int) -> None:
    """OR into the varlen error word what the forward would find wrong in ``cu_q``/``cu_k`` (the same ``BAD_*``
    bits, strict end), without running attention: one tiny launch of ``batch`` programs, no host read."""
    err = VC.error_word(cu_q.device)
    tensors = (cu_q, cu_k, err)
    loose = (total_q, total_k, max_q, max_k, batch)  # in CHECK_UNSPECIALISED's order
    scalars = ("check", tuple(C.int_type(v) for v in loose), cu_q.stride(), cu_k.stride())
    C.launch_cached(VC._check_lengths, scalars, tensors,
                    lambda: ((batch,), dict(CU_Q=cu_q, CU_K=cu_k, ERR=err, TOTAL_Q=total_q, TOTAL_K=total_k,
                                            MAX_Q=max_q, MAX_K=max_k, BATCH=batch), {}),
                    _CHECK_CONFIG, C.torch_backend(), loose=loose, loose_tensors=_LOOSE[3], grid=(batch,))


#: entries of ``cu_seqlens`` one step of :func:`launch_sanitised_lengths`'s running maximum reads
SANITISE_BLOCK = 128


def launch_sanitised_lengths(cu_q, cu_k, batch: int, total_q: int, total_k: int, max_q: int, max_k: int) -> tuple:
    """``(safe_q, safe_k)``: int32 copies of ``cu_q``/``cu_k`` that keep every sequence inside the packed tensors
    (0 first, clamped into ``0..total``, non-decreasing: ``varlen_checks._safe_entry``), equal to the inputs when
    they are right, for a kernel that addresses memory by them without clamping (torch's varlen attention); and
    what the forward would find wrong ORed into the varlen error word (its ``BAD_*`` bits, strict end). One tiny
    launch of ``batch + 1`` programs, no host read."""
    import torch

    err = VC.error_word(cu_q.device)
    safe_q = torch.empty(batch + 1, dtype=torch.int32, device=cu_q.device)
    safe_k = torch.empty(batch + 1, dtype=torch.int32, device=cu_q.device)
    tensors = (cu_q, cu_k, safe_q, safe_k, err)
    loose = (total_q, total_k, max_q, max_k, batch)  # in CHECK_UNSPECIALISED's order
    scalars = ("sanitise", tuple(C.int_type(v) for v in loose), cu_q.stride(), cu_k.stride())
    C.launch_cached(VC._sanitise_lengths, scalars, tensors,
                    lambda: ((batch + 1,), dict(CU_Q=cu_q, CU_K=cu_k, SAFE_Q=safe_q, SAFE_K=safe_k, ERR=err,
                                                TOTAL_Q=total_q, TOTAL_K=total_k, MAX_Q=max_q, MAX_K=max_k,
                                                BATCH=batch), dict(BLOCK=SANITISE_BLOCK)),
                    _CHECK_CONFIG, C.torch_backend(), loose=loose, loose_tensors=_LOOSE[5], grid=(batch + 1,))
    return safe_q, safe_k


def dq_args(call: VarlenCall, q, k, v, out, do, lse, dlse, delta, dq, cu_q, cu_k, totals=None) -> dict:
    totals = totals or (q.shape[0], k.shape[0])
    return dict(Q=q, K=k, V=v, O=out, DO=do, LSE=lse, DLSE=dlse if dlse is not None else lse, Delta=delta, DQ=dq,
                CU_Q=cu_q, CU_K=cu_k, **call.scalars(),
                **_strides3("q", q), **_strides3("k", k), **_strides3("v", v), **_strides3("o", out),
                **_strides3("do", do), **_strides3("dq", dq), stride_lh=_lse_row_stride(lse),
                H_Q=call.heads_q, GROUP=call.group, WIN_LEFT=call.win_left, WIN_RIGHT=call.win_right,
                TOTAL_Q=totals[0], TOTAL_K=totals[1])


def dkdv_args(call: VarlenCall, q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, totals=None) -> dict:
    totals = totals or (q.shape[0], k.shape[0])
    return dict(Q=q, K=k, V=v, DO=do, LSE=lse, Delta=delta, DK=dk, DV=dv, CU_Q=cu_q, CU_K=cu_k, **call.scalars(),
                **_strides3("q", q), **_strides3("k", k), **_strides3("v", v), **_strides3("do", do),
                **_strides3("dk", dk), **_strides3("dv", dv), stride_lh=_lse_row_stride(lse),
                H_KV=call.heads_kv, GROUP=call.group, WIN_LEFT=call.win_left, WIN_RIGHT=call.win_right,
                TOTAL_Q=totals[0], TOTAL_K=totals[1])


def _dq_constexprs(call: VarlenCall, cfg: KernelConfig, has_dlse: bool) -> dict:
    return dict(HEAD_DIM=call.head_dim, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D=call.block_d,
                SOFTCAP=call.softcap > 0, HAS_DLSE=bool(has_dlse), **call.bounded())


def _dkdv_constexprs(call: VarlenCall, cfg: KernelConfig) -> dict:
    return dict(HEAD_DIM=call.head_dim, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D=call.block_d,
                SOFTCAP=call.softcap > 0, **call.bounded())


def launch_dq(call: VarlenCall, do, q, k, v, out, lse, dlse, delta, dq, cu_q, cu_k, cfg: KernelConfig):
    """Run ``_varlen_bwd_dq`` with ``cfg``: ``dq`` and, for its rows, ``delta = rowsum(dO * O) - dLSE``."""
    dlse_arg = dlse if dlse is not None else lse
    tensors = (q, k, v, out, do, lse, dlse_arg, delta, dq, cu_q, cu_k)
    loose = (q.shape[0], k.shape[0], _lse_row_stride(lse))  # in BWD_UNSPECIALISED's order
    grid = (triton_cdiv(call.max_seqlen_q, cfg.BLOCK_M), call.batch * call.heads_q)
    C.launch_cached(_varlen_bwd_dq, (_packed_key(call, tensors, loose), dlse is None), tensors,
                    lambda: (grid, dq_args(call, q, k, v, out, do, lse, dlse, delta, dq, cu_q, cu_k),
                             _dq_constexprs(call, cfg, dlse is not None)), cfg, C.torch_backend(),
                    loose=loose, loose_tensors=_LOOSE[len(tensors)], grid=grid)


def launch_dkdv(call: VarlenCall, do, q, k, v, lse, delta, dk, dv, cu_q, cu_k, cfg: KernelConfig):
    """Run ``_varlen_bwd_dkdv`` with ``cfg`` (reads the ``delta`` the dQ kernel wrote): ``dk`` and ``dv``."""
    tensors = (q, k, v, do, lse, delta, dk, dv, cu_q, cu_k)
    loose = (q.shape[0], k.shape[0], _lse_row_stride(lse))  # in BWD_UNSPECIALISED's order
    grid = (triton_cdiv(call.max_seqlen_k, cfg.BLOCK_N), call.batch * call.heads_kv)
    C.launch_cached(_varlen_bwd_dkdv, (_packed_key(call, tensors, loose),), tensors,
                    lambda: (grid, dkdv_args(call, q, k, v, do, lse, delta, dk, dv, cu_q, cu_k),
                             _dkdv_constexprs(call, cfg)), cfg, C.torch_backend(),
                    loose=loose, loose_tensors=_LOOSE[len(tensors)], grid=grid)


def launch_backward(call: VarlenCall, do, q, k, v, out, lse, dlse, cu_q, cu_k, bwd_cfg, sinks=None):
    """``(dq, dk, dv)`` of the packed inputs; ``bwd_cfg`` a :class:`~rocmflash.kernels.backward.host.BwdConfig`
    (its ``head_splits`` is not used: the dK/dV kernel sums the whole GQA group in registers).

    ``sinks``: the forward's fp32 ``(Hq,)`` attention-sink logits (its LSE includes them: the kernels need no
    change); then ``(dq, dk, dv, dsinks)`` (:func:`rocmflash.kernels.backward.host.sink_grad`). Rows no sequence
    owns must then hold LSE ``-inf`` (the forward's buffer filled so): their delta stays 0 here, so they add 0."""
    import torch

    # rows after the last sequence (strict_end=False) are never written by the kernels: zero, not garbage
    alloc = torch.empty_like if call.strict_end else torch.zeros_like
    dq, dk, dv = alloc(q), alloc(k), alloc(v)
    delta = torch.empty_like(lse) if sinks is None else torch.zeros_like(lse)
    launch_dq(call, do, q, k, v, out, lse, dlse, delta, dq, cu_q, cu_k, bwd_cfg.dq)
    launch_dkdv(call, do, q, k, v, lse, delta, dk, dv, cu_q, cu_k, bwd_cfg.dkdv)
    if sinks is not None:
        return dq, dk, dv, sink_grad(sinks, lse, delta)
    return dq, dk, dv


def amd_forward_tile(cfg: KernelConfig, arch: Optional[str], head_dim: int, softcap: bool,
                     window: bool) -> KernelConfig:
    """The forward tile on AMD CDNA when soft-capping or a left window adds live registers.

    The tanh of the cap and the window's second compare (plus its masked loop) push the
    dense kernel's tiles over the 256 registers of ``waves_per_eu=2``: cross-compiled with
    Triton 3.6, 128x64 at D=128 spills 13 VGPRs on gfx90a with a cap and 2 on gfx942 with a
    window; 64x32 at D=256 spills 22-41 with a cap. 128x32 (D <= 128) and 32x32 (D > 128)
    compile with no VGPR spill and no scratch on gfx90a, gfx942 and gfx950
    (``tests/test_varlen_amd_registers.py``). Chosen from register counts, not timed.
    Other architectures, and plain causal/full masks, keep ``cfg``.
    """
    if not (arch or "").startswith("gfx9") or not (softcap or window):
        return cfg
    block_m, block_n = (128, 32) if head_dim <= 128 else (32, 32)
    return dataclasses.replace(cfg, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, PRE_LOAD_V=False)


def triton_cdiv(a: int, b: int) -> int:
    return max(1, (int(a) + b - 1) // b)


def _compile_geometry(head_dim: int, group: int, heads_kv: int, softcap: bool, window: bool, causal: bool):
    """The :class:`VarlenCall` of a compile-only build and the ``(q-like, kv-like)`` packed strides."""
    left = 256 if window else M.UNBOUNDED
    right = 0 if causal else M.UNBOUNDED
    call = VarlenCall(4, heads_kv * group, heads_kv, head_dim, VC.AS_UNSPECIALISED, VC.AS_UNSPECIALISED, 0.125,
                      30.0 if softcap else 0.0, left, right)
    return call, (call.heads_q * head_dim, head_dim, 1), (call.heads_kv * head_dim, head_dim, 1)


def _compile_ptrs(call: VarlenCall, D3: tuple, K3: tuple, dtype: str, total_tokens: int):
    """Stand-in factories ``(q_like(), kv_like(), rows())`` of a compile-only build: packed ``(T, Hq, D)`` and
    ``(T, Hkv, D)`` tensors and ``(Hq, T)`` fp32 LSE/delta rows, each with the storage of ``total_tokens``
    packed tokens ``T`` (0: every tensor well under 2 GiB). On AMD a tensor past 2 GiB is read with global
    loads instead of buffer loads (another binary), so a build for a large packed batch must be told its size."""
    if type(total_tokens) is not int or total_tokens < 0:
        raise ValueError(f"varlen compile: total_tokens {total_tokens!r} is invalid; expected an int >= 0")
    t = "*" + dtype
    return (lambda: _StridedPtr(t, D3, 2 * total_tokens * call.heads_q * call.head_dim),
            lambda: _StridedPtr(t, K3, 2 * total_tokens * call.heads_kv * call.head_dim),
            lambda: _StridedPtr("*fp32", (8 * 4096, 1), 4 * call.heads_q * total_tokens))


def compile_forward_for(target, fwd_cfg: KernelConfig, head_dim: int, dtype: str = "bf16", group: int = 1,
                        causal: bool = True, heads_kv: int = 8, softcap: bool = False, window: bool = False,
                        total_tokens: int = 0):
    """Cross-compile ``_varlen_fwd`` alone (LSE stored, as a training forward runs it) for ``target``.

    The varlen tune's static phase (:mod:`rocmflash.tuning.varlen`) compiles this; ``heads_kv``
    only sets the strides Triton specialises on (multiples of 16 or not). ``total_tokens``: the
    packed batch's tokens the build stands for, which size every tensor's storage (0: a batch
    well under 2 GiB; on AMD a tensor past it is read with global loads, not buffer loads).
    """
    call, D3, K3 = _compile_geometry(head_dim, group, heads_kv, softcap, window, causal)
    q_like, kv_like, rows = _compile_ptrs(call, D3, K3, dtype, total_tokens)
    q, o, k, v = q_like(), q_like(), kv_like(), kv_like()
    lse, cu = rows(), _StridedPtr("*i32", ())
    args = forward_args(call, q, k, v, o, lse, cu, cu, _StridedPtr("*i32", ()), VC.COMPILE_TOTALS)
    args["STRICT_END"] = VC.AS_UNSPECIALISED
    return C.compile_kernel(_varlen_fwd, target, args, _fwd_constexprs(call, fwd_cfg, True), fwd_cfg)


def compile_backward_kernel_for(target, kernel: str, cfg: KernelConfig, head_dim: int, dtype: str = "bf16",
                                group: int = 1, causal: bool = True, heads_kv: int = 8, softcap: bool = False,
                                window: bool = False, total_tokens: int = 0):
    """Cross-compile one varlen backward kernel (``"dq"`` or ``"dkdv"``) for ``target`` without tensors.

    The varlen backward tune's static phase (:mod:`rocmflash.tuning.varlen_bwd`) compiles this;
    ``heads_kv`` only sets the strides Triton specialises on. The dQ build is the one a call without
    an LSE gradient runs. ``total_tokens``: as :func:`compile_forward_for`'s.
    """
    if kernel not in ("dq", "dkdv"):
        raise ValueError(f"varlen backward kernel {kernel!r} is unknown; expected 'dq' or 'dkdv'")
    call, D3, K3 = _compile_geometry(head_dim, group, heads_kv, softcap, window, causal)
    q_like, kv_like, rows = _compile_ptrs(call, D3, K3, dtype, total_tokens)
    q, o, do, dq = (q_like() for _ in range(4))
    k, v, dk, dv = (kv_like() for _ in range(4))
    lse, delta = rows(), rows()
    cu = _StridedPtr("*i32", ())
    if kernel == "dq":
        return C.compile_kernel(_varlen_bwd_dq, target,
                                dq_args(call, q, k, v, o, do, lse, None, delta, dq, cu, cu, VC.COMPILE_TOTALS),
                                _dq_constexprs(call, cfg, False), cfg)
    return C.compile_kernel(_varlen_bwd_dkdv, target,
                            dkdv_args(call, q, k, v, do, lse, delta, dk, dv, cu, cu, VC.COMPILE_TOTALS),
                            _dkdv_constexprs(call, cfg), cfg)


def compile_for(target, fwd_cfg: KernelConfig, bwd_cfg, head_dim: int, dtype: str = "bf16", group: int = 1,
                softcap: bool = False, window: bool = False, causal: bool = True, total_tokens: int = 0):
    """Cross-compile the three varlen kernels for ``target`` without tensors: ``(fwd, dq, dkdv)``.

    Sizes are runtime values in every kernel (lengths come from ``cu_seqlens``), so one
    build serves every packed batch whose tensors are on the same side of 2 GiB
    (``total_tokens``: as :func:`compile_forward_for`'s); ``window`` (a left window) and
    ``causal`` decide which sides of the band are bounded (constexprs: an unbounded side has
    no loop and no compare).
    """
    fwd = compile_forward_for(target, fwd_cfg, head_dim, dtype, group, causal, 8, softcap, window, total_tokens)
    return (fwd, *(compile_backward_kernel_for(target, kernel, getattr(bwd_cfg, kernel), head_dim, dtype, group,
                                               causal, 8, softcap, window, total_tokens)
                   for kernel in ("dq", "dkdv")))
