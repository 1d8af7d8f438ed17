"""rocmflash attention as ``torch.library`` custom ops: fake impls, autograd, torch.compile.

Two ops, both functional (no input is mutated, outputs never alias inputs):

``torch.ops.rocmflash.attn_fwd(q, k, v, causal, scale, variant, config) -> (out, lse)``
    ``q (B, Hq, Sq, D)``, ``k/v (B, Hkv, Sk, D)`` (any strides), ``config`` a
    :class:`~rocmflash.config.KernelConfig` as JSON, or ``""`` to select one at run time
    (:func:`rocmflash.selection.select_config`: the live GPU's database entry, else the
    per-arch default). ``out`` is ``(B, Hq, Sq, D)``; its memory is ``(B, S, H, D)`` when q
    is a transposed view of a contiguous ``(B, S, H, D)`` tensor (HF and flash-attn
    layouts: transposing back is free), else contiguous. ``lse`` is fp32 ``(B, Hq, Sq)``.

``torch.ops.rocmflash.attn_bwd(dout, q, k, v, out, lse, dlse, causal, scale) -> (dq, dk, dv)``
    The Triton backward (:mod:`rocmflash.kernels.backward`); ``dlse`` is optional.

The forward op has an autograd formula (``register_autograd``) that calls the backward op,
so both eager autograd and ``torch.compile`` (AOTAutograd) see a differentiable op. Fake
implementations allocate outputs with the same layout rule, so ``torch.compile(...,
fullgraph=True)`` traces through without graph breaks; Inductor treats the ops as opaque
calls and runs the real kernels (which pick their config at run time).

Input validation lives in :mod:`rocmflash.api` (the public functions); :func:`attention_op`
here is the thin differentiable entry used by the API, :mod:`rocmflash.sdpa` and
:mod:`rocmflash.integrations.hf`.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from rocmflash.config import KernelConfig
from rocmflash.kernels import get_variant
from rocmflash.kernels.backward import backward, empty_like_layout
from rocmflash.kernels import launch as L
from rocmflash.decode import attend_whole_cache, is_decode_shaped
from rocmflash.scale import fold_scale_sign
from rocmflash.incumbent import sdpa_attention, shape_excludes
from rocmflash.selection import select_bwd_config, select_config, select_incumbent


def _fresh_out(q: torch.Tensor) -> torch.Tensor:
    return empty_like_layout(q)


def _lse_empty(q: torch.Tensor) -> torch.Tensor:
    B, H, S, _ = q.shape
    return torch.empty((B, H, S), dtype=torch.float32, device=q.device)


def _device_ctx(t):
    """Make ``t``'s GPU current for the launch (a no-op when it is): :func:`rocmflash.kernels.launch.on_device`."""
    return L.on_device(t)


# ----------------------------------------------------------------------------- implementations
@functools.lru_cache(maxsize=1024)
def _config_from_json(config: str) -> KernelConfig:
    return KernelConfig.from_json(config)


def _forward_impl(q, k, v, causal: bool, scale: float, variant: str, cfg: Optional[KernelConfig],
                  need_lse: bool = True):
    """Allocate, select a config if none is given, launch; ``(out, lse or None)``."""
    out = _fresh_out(q)
    lse = _lse_empty(q) if need_lse else None
    if out.numel() == 0 or k.shape[2] == 0:  # nothing to launch: no rows, or no keys to attend
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse
    if scale <= 0:  # legal but odd: the forward kernels need a positive scale (rocmflash/scale.py); the
        q, scale = fold_scale_sign(q, scale)  # backward recomputes exp(scale * q·k - lse), exact for any sign
    if cfg is None and variant == "online" and is_decode_shaped(q.shape[2], k.shape[2], q.shape[1] // k.shape[1]):
        # a few query tokens over a long key set: the split-KV decode kernel, on (B, S, H, D) views
        attend_whole_cache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, causal,
                           out.transpose(1, 2), lse)
        return out, lse
    if cfg is None:
        cfg = select_config(q.device, q.shape[3], q.dtype, causal, q.shape[1] // k.shape[1],
                            q.shape[2], k.shape[2], variant)
    with _device_ctx(q):
        get_variant(variant).launch(q, k, v, cfg, bool(causal), float(scale), out=out, lse=lse)
    return out, lse


def _backward_impl(dout, q, k, v, out, lse, dlse, causal: bool, scale: float):
    cfg = select_bwd_config(q.device, q.shape[3], q.dtype, causal, q.shape[1] // k.shape[1], k.shape[2])
    with _device_ctx(q):
        return backward(dout, q, k, v, out, lse, bool(causal), float(scale), dlse=dlse, config=cfg)


# ----------------------------------------------------------------------------- forward op
@torch.library.custom_op("rocmflash::attn_fwd", mutates_args=())
def attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
             variant: str, config: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_impl(q, k, v, causal, scale, variant, _config_from_json(config) if config else None)


@attn_fwd.register_fake
def _attn_fwd_fake(q, k, v, causal, scale, variant, config):
    return _fresh_out(q), _lse_empty(q)


# ----------------------------------------------------------------------------- backward op
@torch.library.custom_op("rocmflash::attn_bwd", mutates_args=())
def attn_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, dlse: Optional[torch.Tensor], causal: bool,
             scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dout, q, k, v, out, lse, dlse, causal, scale)


@attn_bwd.register_fake
def _attn_bwd_fake(dout, q, k, v, out, lse, dlse, causal, scale):
    return empty_like_layout(q), empty_like_layout(k), empty_like_layout(v)


# ----------------------------------------------------------------------------- autograd
def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, variant, config = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal = causal
    ctx.scale = scale  # lse stays differentiable: its gradient enters the backward as dlse


def _input_grads(ctx, dout, dlse, backward_fn):
    """dq, dk, dv (and None for the non-tensor inputs) from the saved forward, by ``backward_fn``."""
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = backward_fn(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None


def _backward(ctx, dout, dlse):
    return _input_grads(ctx, dout, dlse, attn_bwd)  # the op: what torch.compile's AOTAutograd traces


attn_fwd.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------- eager fast path
class _EagerAttention(torch.autograd.Function):
    """The op's autograd formula without the dispatcher, for plain tensors in eager mode."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, variant, cfg):
        out, lse = _forward_impl(q, k, v, causal, scale, variant, cfg)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.set_materialize_grads(False)  # an unused LSE gives dlse=None, not a tensor of zeros
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return _input_grads(ctx, dout, dlse, _backward_impl)


def _needs_dispatcher(q, k, v) -> bool:
    """Whether this call must go through the torch op: tracing, tensor subclasses, modes, functorch.

    Everything else (plain tensors in eager mode, the common case) skips the dispatcher,
    which costs more host time per call than rocmflash's own launch path.
    """
    if torch.compiler.is_compiling() or not (type(q) is torch.Tensor and type(k) is torch.Tensor
                                             and type(v) is torch.Tensor):
        return True
    if torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active():
        return True
    return _get_current_dispatch_mode() is not None


def _incumbent(q, k, v, causal: bool) -> Optional[str]:
    """The SDPA backend the served database entry says is faster here (:mod:`rocmflash.incumbent`), or None.
    Not while torch.compile traces (the op keeps the graph whole) and never where SDPA computes another
    function (causal with ``Sq != Sk``) or for a decode-shaped call (the decode kernel has its own entries)."""
    Sq, Sk, group = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    if torch.compiler.is_compiling() or shape_excludes(causal, Sq, Sk, group) is not None:
        return None
    train = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return select_incumbent(q.device, q.shape[3], q.dtype, causal, group, Sk, train)


def attention_forward(q, k, v, causal: bool, scale: float, variant: str = "online",
                      config: Optional[KernelConfig] = None, need_lse: bool = True):
    """``(out, lse)`` of validated tensors, differentiable; ``lse`` is None when not needed and no grad flows.

    Plain eager calls run the implementation directly (an autograd Function when a gradient
    is needed); traced, subclassed or mode-wrapped calls go through ``torch.ops.rocmflash.attn_fwd``.
    """
    if config is None and variant == "online" and not need_lse:
        backend = _incumbent(q, k, v, causal)
        if backend is not None:  # the tune measured the platform's own attention faster for this problem
            return sdpa_attention(backend, q, k, v, bool(causal), float(scale)), None
    if _needs_dispatcher(q, k, v):
        return torch.ops.rocmflash.attn_fwd(q, k, v, bool(causal), float(scale), variant,
                                            config.to_json() if config is not None else "")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerAttention.apply(q, k, v, bool(causal), float(scale), variant, config)
    return _forward_impl(q, k, v, bool(causal), float(scale), variant, config, need_lse)


# ----------------------------------------------------------------------------- entry point
def attention_op(q, k, v, causal: bool = False, scale: Optional[float] = None, variant: str = "online",
                 config: Optional[KernelConfig] = None, need_lse: bool = True):
    """``(out, lse)`` (differentiable; no input validation here); see :func:`attention_forward`."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return attention_forward(q, k, v, causal, scale, variant, config, need_lse)


__all__ = ["attn_fwd", "attn_bwd", "attention_op", "attention_forward"]
