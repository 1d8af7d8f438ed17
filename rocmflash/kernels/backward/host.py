"""FlashAttention-2 backward: dQ, dK, dV from the forward's output and LSE (no atomics).

Two kernels, both fp32-accumulating, launched in this order:

1. ``_bwd_dq`` -- one program owns ``BLOCK_M`` query rows of one (batch, query head) and
   loops over key blocks: ``dQ += dS K``. It first computes, for its rows, ``delta =
   rowsum(dO * O)`` (minus the incoming gradient of the LSE, when the caller
   differentiates through it) and stores it for the second kernel: no separate
   preprocessing launch (one launch fewer per step: host time is what small problems pay).
   Both kernels turn the forward's LSE into base 2 per row, rows that attend nothing
   (LSE ``-inf``) into ``+inf`` so that every probability recomputed for them is exactly 0.
2. ``_bwd_dkdv`` -- one program owns ``BLOCK_N`` keys of one (batch, **key/value** head)
   and keeps ``dK``/``dV`` tiles in registers while it loops over every query block of
   *every query head of its GQA group*: ``dV += Pᵀ dO``, ``dK += dSᵀ Q`` with ``dS = P ∘
   (dP - delta)``, ``dP = dO Vᵀ``. The group's contributions are summed in registers, so
   GQA/MQA needs neither atomics nor a ``(B, Hq, Sk, D)`` scratch buffer plus a reduction.
   When that leaves too few programs to fill the GPU (MQA, small batches), the group is
   split over ``head_splits`` programs that write fp32 partials, summed by one reduction
   (:func:`choose_head_splits`; H100, MQA 32:1 S=2048: 1.40 -> 0.29 ms).

Why two kernels and not one with atomics: the single-kernel variant (dK/dV loop that also
``atomic_add``\\s dQ) saves recomputing ``QKᵀ`` and ``dO Vᵀ`` once more, but needs an fp32
dQ buffer, a conversion pass, fp32 atomics (slow on CDNA: gfx90a has no packed fp32
atomic add to global memory and MI300's are still contended), and its result depends on
the order in which programs finish. The two-kernel form is deterministic, bit-for-bit
reproducible, keeps GQA a register-level sum, and runs unchanged under Triton's
interpreter.

Causal masking is bottom-right aligned as in the forward (query ``i`` sees key ``j``
iff ``j <= i + Sk - Sq``). Key loops skip fully masked blocks and run unmasked for
blocks that are fully visible; only diagonal and tail blocks pay for masks.

Head dims: every head dim the forward accepts (16..256). The head dim is padded to the
next power of two (>= 16) with masked loads -- correct for every D; non-power-of-two
head dims pay for the padding (the forward's two-piece split is not used here).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, TYPE_CHECKING

import triton

from rocmflash.config import KernelConfig, Problem
from rocmflash.kernels import common as C
from rocmflash.kernels.backward.kernel import (
    _bwd_dkdv,
    _bwd_dq,
)

if TYPE_CHECKING:  # annotations only: torch is imported where a launch needs it
    import torch

LOG2E = C.LOG2E

#: head dims the backward accepts (the same as the forward)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


KERNELS = ("_bwd_dq", "_bwd_dkdv")


# ----------------------------------------------------------------------------- configs
@dataclasses.dataclass(frozen=True)
class BwdConfig:
    """Tiles and compile options of the two main backward kernels.

    ``dkdv`` and ``dq`` are :class:`KernelConfig` records (only ``BLOCK_M``, ``BLOCK_N``,
    ``num_warps``, ``num_stages`` and the AMD options are used). For the dK/dV kernel
    ``BLOCK_N`` is the key block it owns and ``BLOCK_M`` the query block it loops over;
    for the dQ kernel the other way round.
    """

    dkdv: KernelConfig
    dq: KernelConfig
    #: programs per K/V head and key block in the dK/dV kernel (a divisor of the GQA group);
    #: 0 = chosen per call by :func:`choose_head_splits`
    head_splits: int = 0

    def validate(self) -> "BwdConfig":
        for name in ("dkdv", "dq"):
            cfg = getattr(self, name)
            if not isinstance(cfg, KernelConfig):
                raise TypeError(f"BwdConfig.{name} must be a KernelConfig, got {type(cfg).__name__}")
            cfg.validate()
        if isinstance(self.head_splits, bool) or not isinstance(self.head_splits, int) or self.head_splits < 0:
            raise ValueError(f"BwdConfig.head_splits must be an int >= 0 (0 = automatic), got {self.head_splits!r}")
        return self


def space_point(kernel: str, cfg: KernelConfig) -> dict:
    """A :class:`KernelConfig` as a point of the backward space (the fields the backward uses): how the backward
    tune (:mod:`rocmflash.tuning.backward`), its static phase and the run-time varlen build check
    (:func:`rocmflash.api.build_check.build_rejection`) name one kernel's config."""
    return dict(kernel=kernel, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages, waves_per_eu=cfg.waves_per_eu)


def default_bwd_config(arch: Optional[str], head_dim: int) -> BwdConfig:
    """A per-architecture backward config known to compile and be correct.

    * sm_90 (H100/H200): dK/dV, the best of a 5-config sweep on an H200 for D <= 64 and
      D <= 128 (4 warps; 64x64 tiles at D=128, 32x64 at D=64), confirmed by the 45-config
      sweep below (within 4%); dQ 128x64, 8 warps, from that sweep; D > 128: the best of 54 dK/dV
      and 54 dQ configs timed on an H100 at D = 192/256, causal and not
      (``archive/reports:bench/bwd_sweep.py``, ``docs/evidence/bwd-sweep-2026-11-23-h100.md``): a 32-key dK/dV
      block looping over 64 queries and a 64-query dQ block over 32 keys, 4 warps.
    * AMD CDNA (gfx9xx): ``num_stages=1`` (AMD's guidance for fused GEMM chains) and 4
      waves; D > 128 halves the key tile so two fp32 ``BLOCK_N x D`` accumulators fit the
      512 VGPR/AGPR budget of a wave-64 lane. Reasoned from register counts, not timed.
    * anything else (including the CPU interpreter): 32/64 tiles, 4 warps, 2 stages.
    """
    arch = arch or "generic"
    K = KernelConfig
    if arch == "sm_90":
        # best of 5 configs timed on an H200 (benchmarks/e2e.py --attn-sweep, causal bf16 S=4096,
        # docs/evidence/e2e-2026-11-21-h200.md): 2.28 ms (D=64) and 2.15 ms (D=128)
        # dQ: 128x64, 8 warps, 3 stages won the dQ sweep at D = 64/96/128 (bwd_sweep, H100:
        # 0.70-0.93x the time of the earlier 64x32 / 64x64 choices)
        if head_dim <= 64:
            return BwdConfig(K(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3),
                             K(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3))
        if head_dim <= 128:
            return BwdConfig(K(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
                             K(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3))
        # bwd_sweep D=256 S=4096: dK/dV 12.3 -> 3.7 ms, dQ 7.4 -> 1.7 ms against 16x64 / 64x16, 8 warps
        return BwdConfig(K(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
                         K(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3))
    if arch.startswith("gfx9"):
        if head_dim <= 128:
            return BwdConfig(K(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=1),
                             K(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1))
        return BwdConfig(K(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
                         K(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1))
    if arch.startswith("sm_"):
        if head_dim <= 128:
            return BwdConfig(K(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),
                             K(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2))
        return BwdConfig(K(BLOCK_M=16, BLOCK_N=64, num_warps=8, num_stages=1),
                         K(BLOCK_M=64, BLOCK_N=16, num_warps=8, num_stages=1))
    return BwdConfig(K(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),
                     K(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2))


def check_head_dim(head_dim: int) -> None:
    if not MIN_HEAD_DIM <= int(head_dim) <= MAX_HEAD_DIM:
        raise ValueError(
            f"backward: head dim {head_dim} is unsupported; supported head dims are "
            f"{MIN_HEAD_DIM}..{MAX_HEAD_DIM}"
        )


def block_d(head_dim: int) -> int:
    return max(16, C.next_pow2(head_dim))


# ----------------------------------------------------------------------------- host side
def empty_like_layout(t: torch.Tensor, dtype=None) -> torch.Tensor:
    """A new ``(B, H, S, D)`` tensor shaped like ``t``: ``(B, S, H, D)`` in memory when ``t`` is
    a transposed view of a contiguous ``(B, S, H, D)`` tensor (HF / flash-attn layout), else
    contiguous. Deterministic from shape and strides, so fake tensors get the same layout."""
    import torch

    dtype = dtype or t.dtype
    if t.dim() == 4 and not t.is_contiguous() and t.transpose(1, 2).is_contiguous():
        return torch.empty((t.shape[0], t.shape[2], t.shape[1], t.shape[3]), dtype=dtype,
                           device=t.device).transpose(1, 2)
    return torch.empty(t.shape, dtype=dtype, device=t.device)


def _strides(t):
    return tuple(t.stride())


_STRIDE_NAMES = {p: tuple(f"stride_{p}{c}" for c in ("z", "h", "m" if p in ("q", "o", "do", "dq") else "n", "d"))
                 for p in ("q", "k", "v", "o", "do", "dq", "dk", "dv")}

#: programs per compute unit below which the dK/dV kernel splits a GQA group across programs.
#: H100, D=128 causal: B1 Hq32 Hkv8 S1025 (136 programs on 132 SMs) unsplit 0.14 ms, split in
#: 2 or 4 0.19-0.20 ms; B1 Hq32 Hkv1 S2048 (32 programs) unsplit 1.40 ms, split in 2/4/8
#: 0.74/0.39/0.29 ms. Splitting pays only below one program per SM.
SPLIT_BELOW_PROGRAMS_PER_CU = 1


def _named_strides(prefix: str, strides) -> dict:
    """``{"stride_qz": ..., "stride_qh": ..., "stride_qm": ..., "stride_qd": ...}`` (names built once)."""
    return dict(zip(_STRIDE_NAMES[prefix], strides))


@functools.lru_cache(maxsize=256)
def _validated(config: "BwdConfig") -> "BwdConfig":
    return config.validate()


def choose_head_splits(batch: int, heads_kv: int, group: int, seqlen_k: int, block_n: int,
                       compute_units: int) -> int:
    """How many programs share one K/V head's key block in the dK/dV kernel.

    One program per (key block, K/V head) sums its whole GQA group in registers: no extra
    memory, but only ``batch * heads_kv * cdiv(seqlen_k, block_n)`` programs, each looping
    over ``group`` query heads. When that leaves the GPU under-filled (fewer than
    :data:`SPLIT_BELOW_PROGRAMS_PER_CU` programs per CU/SM), the group is split over the
    smallest divisor of ``group`` that fills it (else the whole group): each program then
    writes a partial fp32 dK/dV that one reduction sums.
    """
    if group <= 1:
        return 1
    programs = batch * heads_kv * triton.cdiv(seqlen_k, block_n)
    want = SPLIT_BELOW_PROGRAMS_PER_CU * compute_units
    if programs >= want:
        return 1
    for splits in range(2, group + 1):
        if group % splits == 0 and programs * splits >= want:
            return splits
    return group


def dkdv_call(q, k, v, do, lse, delta, dk_out, dv_out, causal: bool, sm_scale: float, cfg: KernelConfig,
              head_splits: int):
    """``(grid, args, constexprs)`` of one dK/dV launch writing ``dk_out``/``dv_out`` (no launch)."""
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    named = _named_strides
    args = dict(Q=q, K=k, V=v, DO=do, LSE=lse, Delta=delta, DK=dk_out, DV=dv_out,
                sm_scale=float(sm_scale), qk_scale=float(sm_scale) * LOG2E,
                **named("q", _strides(q)), **named("k", _strides(k)), **named("v", _strides(v)),
                **named("do", _strides(do)), **named("dk", _strides(dk_out)), **named("dv", _strides(dv_out)),
                H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, HEAD_SPLITS=head_splits, SEQ_Q=Sq, SEQ_K=Sk)
    constexprs = dict(HEAD_DIM=D, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D=block_d(D), CAUSAL=bool(causal))
    return (triton.cdiv(Sk, cfg.BLOCK_N), B * Hkv * head_splits), args, constexprs


def dq_call(q, k, v, out, do, lse, dlse, delta, dq, causal: bool, sm_scale: float, cfg: KernelConfig):
    """``(grid, args, constexprs)`` of one dQ launch, which also writes ``delta`` (no launch)."""
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    named = _named_strides
    args = dict(Q=q, K=k, V=v, O=out, DO=do, LSE=lse, DLSE=delta if dlse is None else dlse, Delta=delta, DQ=dq,
                sm_scale=float(sm_scale), qk_scale=float(sm_scale) * LOG2E,
                **named("q", _strides(q)), **named("k", _strides(k)), **named("v", _strides(v)),
                **named("o", _strides(out)), **named("do", _strides(do)), **named("dq", _strides(dq)),
                H_Q=Hq, GROUP=Hq // Hkv, SEQ_Q=Sq, SEQ_K=Sk)
    constexprs = dict(HEAD_DIM=D, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_D=block_d(D), CAUSAL=bool(causal),
                      HAS_DLSE=dlse is not None)
    return (triton.cdiv(Sq, cfg.BLOCK_M), B * Hq), args, constexprs


def launch_dq(q, k, v, out, do, lse, dlse, delta, dq, causal: bool, sm_scale: float, cfg: KernelConfig,
              backend: str) -> None:
    """dQ into ``dq`` and ``delta = rowsum(dO * O) - dLSE`` into ``delta`` (fp32 ``(B, Hq, Sq)``)."""
    dlse_arg = delta if dlse is None else dlse
    C.launch_cached(_bwd_dq, (bool(causal), float(sm_scale), dlse is None), (q, k, v, out, do, lse, dlse_arg, delta, dq),
                    lambda: dq_call(q, k, v, out, do, lse, dlse, delta, dq, causal, sm_scale, cfg), cfg, backend)


def launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal: bool, sm_scale: float, cfg: KernelConfig,
                head_splits: int, backend: str) -> None:
    """dK and dV into ``dk``/``dv`` (``delta`` from :func:`launch_dq`); ``head_splits > 1`` goes
    through fp32 partials and one sum."""
    import torch

    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    if (Hq // Hkv) % head_splits:
        raise ValueError(f"backward: head_splits={head_splits} must divide the GQA group size {Hq // Hkv}")
    if head_splits > 1:
        dk_out = torch.empty((B, Hkv * head_splits, Sk, D), device=q.device, dtype=torch.float32)
        dv_out = torch.empty_like(dk_out)
    else:
        dk_out, dv_out = dk, dv
    C.launch_cached(_bwd_dkdv, (bool(causal), float(sm_scale), head_splits), (q, k, v, do, lse, delta, dk_out, dv_out),
                    lambda: dkdv_call(q, k, v, do, lse, delta, dk_out, dv_out, causal, sm_scale, cfg, head_splits),
                    cfg, backend)
    if head_splits > 1:
        dk.copy_(dk_out.view(B, Hkv, head_splits, Sk, D).sum(2))
        dv.copy_(dv_out.view(B, Hkv, head_splits, Sk, D).sum(2))


def backward(do, q, k, v, out, lse, causal: bool, sm_scale: float, dlse=None,
             config: Optional[BwdConfig] = None, dq=None, dk=None, dv=None, sinks=None):
    """dQ, dK, dV of ``out = attention(q, k, v)`` given ``dO`` (and optionally dLSE).

    ``q (B, Hq, Sq, D)``, ``k/v (B, Hkv, Sk, D)``, ``out``/``do`` like q (any strides),
    ``lse`` the forward's fp32 ``(B, Hq, Sq)`` natural-log LSE. Returns ``(dq, dk, dv)`` in
    the input dtype.

    ``sinks``: the forward's fp32 ``(Hq,)`` attention-sink logits (its LSE includes them, so the kernels'
    probabilities ``exp(S - LSE)`` and ``dS`` need no change); then returns ``(dq, dk, dv, dsinks)``
    (:func:`sink_grad`, fp32).
    """
    import torch

    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    check_head_dim(D)
    if config is None:
        config = default_bwd_config(None, D)
    _validated(config)
    dq = empty_like_layout(q) if dq is None else dq
    dk = empty_like_layout(k) if dk is None else dk
    dv = empty_like_layout(v) if dv is None else dv
    if q.numel() == 0 or k.numel() == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        if sinks is None:
            return dq, dk, dv
        if q.numel() == 0:  # no rows: nothing depends on the sinks
            return dq, dk, dv, torch.zeros_like(sinks)
        # no keys: every row's probabilities are the sink's alone (1), whatever the sink: delta = -dLSE
        delta = torch.zeros_like(lse) if dlse is None else -dlse.to(torch.float32)
        return dq, dk, dv, sink_grad(sinks, lse, delta)
    backend = C.torch_backend()
    lse = lse.contiguous()
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    delta = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    splits = config.head_splits or choose_head_splits(B, Hkv, Hq // Hkv, Sk, config.dkdv.BLOCK_N,
                                                      C.num_compute_units(q.device))
    launch_dq(q, k, v, out, do, lse, dlse, delta, dq, causal, sm_scale, config.dq, backend)  # writes delta
    launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal, sm_scale, config.dkdv, splits, backend)
    if sinks is not None:
        return dq, dk, dv, sink_grad(sinks, lse, delta)
    return dq, dk, dv


def sink_grad(sinks, lse, delta):
    """The gradient of attention-sink logits ``sinks`` (fp32 ``(Hq,)``), on the device (no host read).

    A sink is a key whose value row is zero, so its probability ``P_sink = exp(sink - lse)`` (``lse`` the
    forward's natural-log LSE, which includes it; rows ``(..., Hq, rows)``) gets ``dP_sink = dO · 0 = 0`` and
    ``dsink = sum over rows of P_sink * (dP_sink - delta) = -sum P_sink * delta``, with the kernels' ``delta =
    rowsum(dO * O) - dLSE`` (the LSE's own gradient enters through it: ``d lse / d sink = P_sink``). Rows of
    LSE ``-inf`` (only with a ``-inf`` sink, which is no sink) count 0, as the kernels count them.
    """
    import torch

    heads = sinks.shape[0]
    lse_rows = lse.reshape(-1, heads, lse.shape[-1]) if lse.dim() == 3 else lse.reshape(1, heads, -1)
    delta_rows = delta.reshape(lse_rows.shape)
    # -inf rows -> +inf, so exp(sink - lse) = 0 there (a -inf sink and an empty row would give exp(nan))
    lse_rows = torch.where(lse_rows == float("-inf"), float("inf"), lse_rows)
    p_sink = torch.exp(sinks.to(torch.float32).view(1, heads, 1) - lse_rows)
    return -(p_sink * delta_rows).sum(dim=(0, 2))


class _Operand(C.Ptr):
    """A compile-only stand-in for a tensor argument: element type, shape, contiguous strides."""

    def __init__(self, ty: str, shape: tuple):
        super().__init__(ty)
        self.shape = tuple(shape)
        strides, step = [], 1
        for extent in reversed(self.shape):
            strides.append(step)
            step *= extent
        self._strides = tuple(reversed(strides))

    def stride(self) -> tuple:
        return self._strides


def compile_kernel_for(target, kernel: str, cfg: KernelConfig, problem: Problem, head_splits: int = 1):
    """Cross-compile one backward kernel (``"dkdv"`` or ``"dq"``) for ``target`` without tensors.

    The arguments are built by :func:`dkdv_call` / :func:`dq_call`, as for a launch on
    contiguous ``(B, H, S, D)`` tensors, so a compile-only build specialises exactly like one.
    """
    if kernel not in ("dkdv", "dq"):
        raise ValueError(f"backward kernel {kernel!r} is unknown; expected 'dkdv' or 'dq'")
    cfg.validate()
    check_head_dim(problem.head_dim)
    p = problem
    t = "*" + p.dtype
    q_like = (p.batch, p.heads_q, p.seqlen_q, p.head_dim)
    kv_like = (p.batch, p.heads_kv, p.seqlen_k, p.head_dim)
    q, out, do, dq = (_Operand(t, q_like) for _ in range(4))
    k, v, dk, dv = (_Operand(t, kv_like) for _ in range(4))
    lse, delta = (_Operand("*fp32", q_like[:3]) for _ in range(2))
    if kernel == "dkdv":
        _, args, constexprs = dkdv_call(q, k, v, do, lse, delta, dk, dv, p.causal, 1.0, cfg, head_splits)
        return C.compile_kernel(_bwd_dkdv, target, args, constexprs, cfg)
    _, args, constexprs = dq_call(q, k, v, out, do, lse, None, delta, dq, p.causal, 1.0, cfg)
    return C.compile_kernel(_bwd_dq, target, args, constexprs, cfg)


def compile_for(target, config: BwdConfig, problem: Problem):
    """Cross-compile the dK/dV and dQ kernels of ``config`` for ``target`` (register studies)."""
    config.validate()
    return (compile_kernel_for(target, "dkdv", config.dkdv, problem, config.head_splits or 1),
            compile_kernel_for(target, "dq", config.dq, problem))
