"""Kept plans of fp8 forward calls: a repeat call whose signature passed every check skips them.

An fp8 call (:func:`rocmflash.attention` or :func:`rocmflash.flash_attn_func` on fp8 q/k/v) checks nine tensors
(q, k, v and three descales: type, dtype, shape, device), the options, the fp8 format against the arch, selects
its config and computes two launch keys: about four times the host work of a 16-bit call, all of it a function of
what :func:`signature` holds. The first call of a signature runs the checked path; its second keeps a
:class:`Fp8Plan` (config, whether V is read K-major, scale, output layout and the launch keys of the V copy and
the kernel, :func:`rocmflash.kernels.launch.kept_key`), and later calls of that signature run :func:`run` with no
checks.
Exact ``torch.Tensor`` inputs only, eager only (a subclass, a traced call or an unusual option type takes the
checked path). The descales' *values* are never read on the host, planned or not: the kernel checks them
(:mod:`rocmflash.api.fp8`). :func:`rocmflash.api.selection.clear_cache` forgets the plans.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from rocmflash.api.selection import register_clear
from rocmflash.config import KernelConfig
from rocmflash.kernels.fp8 import errors as FE
from rocmflash.kernels.fp8 import forward as FF
from rocmflash.kernels import launch as L
from rocmflash.kernels.common import torch_backend


class Fp8Plan(NamedTuple):
    """What a checked fp8 call worked out, for its signature's later calls."""

    cfg: KernelConfig  #: checked: the database entry, or the fp8 kernel's default
    kmajor: bool  #: V is read K-major on this arch (:func:`rocmflash.kernels.fp8.forward.kmajor_v`)
    causal: bool
    scale: float  #: the softmax scale
    out_shape: tuple  #: the output's allocation: (B, Sq, Hq, D) for (B, S, H, D) inputs, else (B, Hq, Sq, D)
    bshd: bool  #: the inputs (and the output's memory) are ``(B, S, H, D)``
    out_dtype: torch.dtype
    lse_shape: Optional[tuple]  #: ``(B, Hq, Sq)`` when the call returns the LSE
    empty: bool  #: no query rows or no keys: output 0, LSE -inf, no launch
    keys: dict  #: kept launch keys (:func:`rocmflash.kernels.launch.kept_key`)


_PLANS: dict = {}  #: :func:`signature` -> Fp8Plan (from a signature's second checked call on)
_SEEN: set = set()  #: hashes of signatures checked once (:func:`rocmflash.kernels.launch.seen_before`)
_MAX_PLANS = 1024  #: a full table is emptied: a new shape every call never grows it without bound
_OUT_DTYPES = (None, torch.bfloat16, torch.float16)


def signature(q, k, v, causal, softmax_scale, return_lse, descales: tuple, out_dtype, layout: str) -> Optional[tuple]:
    """Everything the checks, the config selection and the launch keys of an fp8 call read, or None: a call that
    is not planned (inputs that are not exact tensors, a non-bool flag, a scale that is not None or a finite
    float, an ``out_dtype`` other than None/bf16/fp16: each goes to the checks, which may raise).

    Per tensor (q, k, v and the descales): dtype, shape, strides, device (a GPU's index; other devices whole:
    ``get_device()`` is -1 for the CPU and ``meta`` alike), and on ROCm the 2 GiB storage bit Triton specialises
    on; whether q's device can run here (the CPU only under the interpreter, read per call); which tensors are
    one object (the kept launch keys' promise). Alignment is not in it: the kept launch keys check it per call."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor \
            or not (causal is True or causal is False) or not (return_lse is True or return_lse is False) \
            or not (softmax_scale is None or type(softmax_scale) is float and math.isfinite(softmax_scale)) \
            or not any(out_dtype is d for d in _OUT_DTYPES):
        return None
    hip = torch_backend() == "hip"
    parts = [layout, causal, softmax_scale, return_lse, out_dtype,
             True if q.is_cuda else (q.device, L.interpreting())]
    tensors = (q, k, v) + descales
    for t in tensors:
        if type(t) is not torch.Tensor:
            return None
        parts.append((t.dtype, t.shape, t.stride(), t.get_device() if t.is_cuda else t.device,
                      hip and L.fits_buffer_addressing(t)))
    pattern = L.alias_pattern(tensors)  # one tensor in two places (k_descale is v_descale): its own launch plans
    if pattern:
        parts.append(pattern)
    return tuple(parts)


def planned(sig: Optional[tuple]) -> Optional[Fp8Plan]:
    """The kept plan of ``sig``, or None (run the checked path, then :func:`keep`). Never under torch.compile."""
    if sig is None or torch.compiler.is_compiling():
        return None
    return _PLANS.get(sig)


def make(q, k, cfg: KernelConfig, kmajor: bool, causal: bool, scale: float, out_dtype, bshd: bool,
         return_lse: bool) -> Fp8Plan:
    """The plan of a call that passed the checks (``(B, H, S, D)`` views ``q``/``k``; ``bshd``: the caller's inputs,
    and so the output's memory, are ``(B, S, H, D)``), with an empty dict for its launch keys."""
    B, Hq, Sq, D = q.shape
    return Fp8Plan(cfg, kmajor, causal, scale, (B, Sq, Hq, D) if bshd else (B, Hq, Sq, D), bshd, out_dtype,
                   (B, Hq, Sq) if return_lse else None, q.numel() == 0 or k.shape[2] == 0, {})


def keep(sig: Optional[tuple], plan: Fp8Plan) -> None:
    """After a checked call of ``sig`` that passed: keep its plan from the signature's second call on
    (:func:`rocmflash.kernels.launch.seen_before`)."""
    if sig is None or torch.compiler.is_compiling() or not L.seen_before(_SEEN, sig, _MAX_PLANS):
        return
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[sig] = plan


def clear() -> None:
    """Forget every plan (:func:`rocmflash.api.selection.clear_cache` calls this)."""
    _PLANS.clear()
    _SEEN.clear()


register_clear(clear)


class _InferenceOnly(torch.autograd.Function):
    """Passes the fp8 output through; its backward is a clear error (there is no fp8 backward kernel). What
    :func:`execute` wraps an output in when autograd records the call."""

    @staticmethod
    def forward(ctx, out, *inputs):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("fp8 attention is inference-only: rocmflash has no fp8 backward; run the "
                                  "training step in bfloat16/float16, or call under torch.no_grad()")


def run(plan: Fp8Plan, q, k, v, q_descale, k_descale, v_descale):
    """The planned call on inputs of its signature, as the caller passed them (``(B, S, H, D)`` when ``plan.bshd``):
    :func:`execute` on their ``(B, H, S, D)`` views."""
    if plan.bshd:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return execute(plan, q, k, v, q_descale, k_descale, v_descale)


def execute(plan: Fp8Plan, q, k, v, q_descale, k_descale, v_descale):
    """Run ``plan`` on ``(B, H, S, D)`` views: allocate the output (its memory ``(B, S, H, D)`` when ``plan.bshd``) and
    the LSE, launch :mod:`rocmflash.kernels.fp8.forward` (no launch for no rows or no keys: output 0, LSE -inf),
    poll the error word; with autograd recording, the output's backward raises (inference only). Returns
    ``(out (B, Hq, Sq, D), lse or None)``: the one path of checked and planned calls alike."""
    out = torch.empty(plan.out_shape, dtype=plan.out_dtype, device=q.device)
    if plan.bshd:
        out = out.transpose(1, 2)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=q.device) if plan.lse_shape else None
    if plan.empty:
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
    else:
        with L.on_device(q):
            FF.launch_kept(q, k, v, q_descale, k_descale, v_descale, plan.cfg, plan.causal, plan.scale, out, lse,
                           plan.kmajor, plan.keys)
        FE.poll_errors(q.device)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or q_descale.requires_grad
                                    or k_descale.requires_grad or v_descale.requires_grad):
        out = _InferenceOnly.apply(out, q, k, v, q_descale, k_descale, v_descale)
    return out, lse


__all__ = ["Fp8Plan", "signature", "planned", "make", "keep", "clear", "run", "execute"]
