"""``flash_attn_varlen_func`` as ``torch.library`` custom ops: what ``torch.compile`` traces.

Two functional ops (no input is mutated, outputs never alias inputs):

``torch.ops.rocmflash.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, softcap,
window_left, window_right, strict_end, check_values, sinks=None) -> (out, lse)``
    The varlen kernel's forward (:mod:`rocmflash.kernels.varlen.host`): ``q (total_q, Hq, D)``, ``k/v (total_k, Hkv,
    D)``, int32 ``cu_seqlens`` ``(batch + 1,)``; ``window_left/right`` the band of
    :func:`rocmflash.api.varlen_checks.check_options` (``-1``/``UNBOUNDED`` conventions of the kernels);
    ``strict_end``: ``cu_seqlens[-1]`` must be the packed length (False: the HF packing, rows after it zero).
    ``out`` is ``torch.empty_like(q)`` (q's strides), ``lse`` fp32 ``(Hq, total_q)`` contiguous, always
    computed (the backward needs it; a traced call that drops it costs one small store). ``sinks``: checked fp32
    ``(Hq,)`` attention sinks (the LSE includes them; rows no sequence owns then hold LSE ``-inf``).
``torch.ops.rocmflash.varlen_bwd(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
max_seqlen_k, scale, softcap, window_left, window_right, strict_end, sinks=None) -> (dq, dk, dv, dsinks)``
    The varlen backward; ``dlse`` optional; gradients laid out as ``empty_like`` of q, k and v; ``dsinks`` the
    sinks' gradient (fp32 ``(Hq,)``), an empty ``(0,)`` tensor without sinks.

The forward has an autograd formula calling the backward op, so AOTAutograd sees a differentiable op. Everything
that needs tensor *values* or the database runs in the ops' implementations, i.e. per call at run time, exactly
as an eager call does it: the config choice, the error-word poll (and on the CPU, the read right after the
launch), and ``check_values=True``'s host checks. What :func:`rocmflash.api.varlen.flash_attn_varlen_func` runs
while torch.compile traces (``varlen_kernel._traced``) does only the metadata checks, at trace time. Imported by
:mod:`rocmflash.api.ops` (the module ``torch.ops.rocmflash`` loads on first use).

Adding an optional tensor argument (e.g. attention sinks) is one line in an op's signature, at its end with a
``None`` default: the fake implementations take the options as ``*_``, and the autograd formula returns one
``None`` per non-differentiable input however many there are (``ctx.num_inputs``).
"""

from __future__ import annotations

from typing import Optional

import torch

from rocmflash.api import varlen_errors as VE
from rocmflash.api import varlen_kernel as VR
from rocmflash.api.varlen_checks import check_cu_seqlens
from rocmflash.kernels import launch as L
from rocmflash.kernels.varlen import host as VK


def _call(q, k, cu_q, max_q: int, max_k: int, scale: float, softcap: float, left: int, right: int,
          strict_end: bool) -> VK.VarlenCall:
    """The kernels' :class:`~rocmflash.kernels.varlen.host.VarlenCall` of the ops' arguments (as
    ``varlen_kernel._run``)."""
    return VK.VarlenCall(cu_q.shape[0] - 1, q.shape[1], k.shape[1], q.shape[2], int(max_q), int(max_k), float(scale),
                         float(softcap), int(left), int(right), bool(strict_end))


# ----------------------------------------------------------------------------- forward op
@torch.library.custom_op("rocmflash::varlen_fwd", mutates_args=())
def varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, scale: float, softcap: float,
               window_left: int, window_right: int, strict_end: bool,
               check_values: bool, sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    device = q.device
    if check_values:  # the values on the host, as the eager call checks them (index and value in the message)
        batch = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, device)
        check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, device, batch)
        VE.check_errors(device)
    else:
        VE._poll_errors(device)  # what earlier calls' kernels found wrong, never waiting (as the eager call)
    call = _call(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, scale, softcap, window_left, window_right,
                 strict_end)
    # rows after the last sequence (strict_end False) are never written: zero, not garbage
    out = torch.empty_like(q) if strict_end else torch.zeros_like(q)
    if sinks is None:
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=device)
    else:  # the sinks' gradient sums every row: rows no sequence owns (never written) must add 0
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=device)
    if q.shape[0]:
        cfg = VR._forward_config(device, call.head_dim, q.dtype, window_right == 0, call.group, call.max_seqlen_k,
                                 call.softcap, call.win_left)
        with L.on_device(q):
            VK.launch_forward(call, q, k, v, cu_seqlens_q, cu_seqlens_k, cfg, out, lse, sinks)
        if device.type != "cuda":  # Triton's interpreter: reading the word waits for nothing (as the eager call)
            VE._read_and_report(device, "this call")
    return out, lse


@varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, *_):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


# ----------------------------------------------------------------------------- backward op
@torch.library.custom_op("rocmflash::varlen_bwd", mutates_args=())
def varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
               lse: torch.Tensor, dlse: Optional[torch.Tensor], cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, scale: float, softcap: float,
               window_left: int, window_right: int, strict_end: bool,
               sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if q.shape[0] == 0 or k.shape[0] == 0:
        dsinks = _no_sinks(q) if sinks is None else VR._no_key_sink_grad(sinks, lse, dlse)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), dsinks
    call = _call(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, scale, softcap, window_left, window_right,
                 strict_end)
    cfg = VR._backward_config(q.device, q.dtype, call)
    with L.on_device(q):
        grads = VK.launch_backward(call, dout, q, k, v, out, lse, dlse.contiguous() if dlse is not None else None,
                                   cu_seqlens_q, cu_seqlens_k, cfg, sinks)
    return grads[0], grads[1], grads[2], grads[3] if sinks is not None else _no_sinks(q)


def _no_sinks(q) -> torch.Tensor:
    """``varlen_bwd``'s ``dsinks`` of a call without sinks (an op's outputs are tensors): empty."""
    return q.new_empty((0,), dtype=torch.float32)


@varlen_bwd.register_fake
def _varlen_bwd_fake(dout, q, k, v, out, lse, dlse, cu_q, cu_k, max_q, max_k, scale, softcap, left, right,
                     strict_end, sinks=None):
    dsinks = _no_sinks(q) if sinks is None else torch.empty_like(sinks)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


# ----------------------------------------------------------------------------- autograd
def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k = inputs[:5]
    out, lse = output
    sinks = inputs[13] if len(inputs) > 13 else None
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, sinks)
    ctx.options = tuple(inputs[5:12])  # max_seqlen_q .. strict_end: what the backward op takes after cu_seqlens_k
    ctx.num_inputs = len(inputs)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k, sinks = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv, dsinks = torch.ops.rocmflash.varlen_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k, *ctx.options,
                                                        sinks)
    grads = (dq, dk, dv) + (None,) * (ctx.num_inputs - 3)
    if sinks is not None:  # (the sinks are the forward's 14th input)
        grads = grads[:13] + (dsinks,)
    return grads


varlen_fwd.register_autograd(_backward, setup_context=_setup_context)


__all__ = ["varlen_fwd", "varlen_bwd"]
