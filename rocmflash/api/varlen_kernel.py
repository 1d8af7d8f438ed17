"""``flash_attn_varlen_func``'s own route: the packed (varlen) kernel, forward and backward, on checked arguments.

What runs once a packed call is neither the dense route nor the platform's varlen attention
(:mod:`rocmflash.api.varlen` decides): the configs (:func:`_forward_config`, :func:`_backward_config`: the
database's ``varlen-`` entries, else the dense problem's), the autograd function over
:mod:`rocmflash.kernels.varlen.host`, and what runs while torch.compile traces (one ``torch.ops.rocmflash.varlen_fwd``,
:mod:`rocmflash.api.varlen_ops`). Its entry points for callers with packings of their own: :func:`packed_forward`
(:func:`rocmflash.flash_attn_func`'s windows and soft caps, one sequence per batch row) and :func:`packed_varlen`
(the HF integration's packing built on the device). :mod:`rocmflash.api.varlen` re-exports :func:`packed_varlen`.
"""

from __future__ import annotations

import math

import torch

from rocmflash.api import varlen_errors as VE
from rocmflash.api.sinks import check_sinks
from rocmflash.api.varlen_checks import check_cu_seqlens, check_options, check_qkv
from rocmflash.kernels import launch as L
from rocmflash.kernels import masks as M
from rocmflash.kernels.varlen import host as VK


# ----------------------------------------------------------------------------- configs
def _forward_config(device, head_dim: int, dtype, causal: bool, group: int, max_seqlen_k: int, softcap: float,
                    window_left: int):
    """The forward config, cached per problem and bucket: the measured varlen entry of the nearest bucket
    (``rocmflash tune --mode varlen``), else the dense problem's (database entry or per-arch default). On
    AMD the tile becomes the one the varlen kernel needs when a cap or a left window adds registers (the
    tune measured neither)."""
    from rocmflash.api.selection import device_identity, select_varlen_config

    fwd = select_varlen_config(device, head_dim, dtype, causal, group, max(1, max_seqlen_k))
    _, arch = device_identity(device)
    return VK.amd_forward_tile(fwd, arch, head_dim, softcap > 0, window_left < M.UNBOUNDED)


def _backward_config(device, dtype, call: VK.VarlenCall):
    """The backward config, chosen when a backward runs (a forward-only call never reads a backward entry
    nor builds one): :func:`rocmflash.api.selection.select_varlen_bwd_config` -- the measured ``varlen-bwd-``
    entry of the nearest bucket (``rocmflash tune --mode varlen --pass bwd``), else the dense ``bwd-``
    entry, else the per-arch default, each kernel checked to build as the varlen kernel with this call's
    cap and window. Cached per problem, bucket and flags."""
    from rocmflash.api.selection import select_varlen_bwd_config

    return select_varlen_bwd_config(device, call.head_dim, dtype, call.win_right == 0, call.group,
                                    max(1, call.max_seqlen_k), call.softcap > 0, call.win_left < M.UNBOUNDED)


# ----------------------------------------------------------------------------- autograd
class _VarlenAttention(torch.autograd.Function):
    """The varlen kernel's forward (``out``, and the LSE when it is wanted or a gradient is) and backward (dQ, dK,
    dV, and the sinks' gradient), with the backward's config chosen when a backward runs."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, call, fwd_cfg, need_lse, sinks=None):
        # rows after the last sequence (call.strict_end False) are never written: zero, not garbage
        out = torch.empty_like(q) if call.strict_end else torch.zeros_like(q)
        needs_grad = any(ctx.needs_input_grad[:3]) or (sinks is not None and ctx.needs_input_grad[8])
        lse = None
        if need_lse or needs_grad:
            if sinks is None:
                lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
            else:  # the sinks' gradient sums every row: rows no sequence owns (never written) must add 0
                lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
        if q.shape[0]:
            with L.on_device(q):
                VK.launch_forward(call, q, k, v, cu_q, cu_k, fwd_cfg, out, lse, sinks)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, *((sinks,) if sinks is not None else ()))
        ctx.call = call
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k, *sinks = ctx.saved_tensors
        sinks = sinks[0] if sinks else None
        if dout is None:
            dout = torch.zeros_like(out)
        if q.shape[0] == 0 or k.shape[0] == 0:
            dsinks = None if sinks is None else _no_key_sink_grad(sinks, lse, dlse)
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None, None, None, None, dsinks
        bwd_cfg = _backward_config(q.device, q.dtype, ctx.call)
        dlse = dlse.contiguous() if dlse is not None else None
        with L.on_device(q):
            grads = VK.launch_backward(ctx.call, dout, q, k, v, out, lse, dlse, cu_q, cu_k, bwd_cfg, sinks)
        dsinks = grads[3] if sinks is not None else None
        return grads[0], grads[1], grads[2], None, None, None, None, None, dsinks


def _no_key_sink_grad(sinks, lse, dlse):
    """The sinks' gradient of a packed batch without queries or keys: with no key, each row's probabilities are
    its sink's alone (LSE = the sink), so only the LSE's gradient reaches it."""
    if dlse is None or lse is None or lse.numel() == 0:
        return torch.zeros_like(sinks)
    return VK.sink_grad(sinks, lse, -dlse.to(torch.float32))


# ----------------------------------------------------------------------------- checked calls
def checked_lengths(q, k, cu_q, cu_k, max_q, max_k, check_values: bool) -> int:
    """The batch size of a packed call whose q/k/v passed their checks: ``cu_seqlens_q``/``cu_seqlens_k`` checked
    against q and k (their values too with ``check_values``), then the device's error word -- reported at once with
    ``check_values`` (what earlier unchecked calls left: the call waits anyway), else polled without waiting."""
    batch = check_cu_seqlens("cu_seqlens_q", cu_q, q.shape[0], max_q, q.device, read_values=check_values)
    check_cu_seqlens("cu_seqlens_k", cu_k, k.shape[0], max_k, q.device, batch, read_values=check_values)
    if check_values:
        VE.check_errors(q.device)
    else:
        VE._poll_errors(q.device)
    return batch


def packed_forward(q, k, v, cu_q, cu_k, max_q: int, max_k: int, softmax_scale, causal: bool, window_size: tuple,
                   softcap: float, sinks=None) -> tuple:
    """``(out (total_q, Hq, D), lse (Hq, total_q))`` of packed q/k/v by the varlen kernel, ``cu_seqlens`` values
    never read on the host: :func:`rocmflash.api.varlen.flash_attn_varlen_func` with ``return_lse=True`` (a call
    neither its dense route nor the platform's varlen attention serves: they return no LSE) and
    ``check_values=False``, ``sinks`` its ``s_aux``. :func:`rocmflash.flash_attn_func` runs its windows and soft
    caps through this, on one sequence per batch row."""
    check_qkv(q, k, v)
    band = check_options(softmax_scale, causal, window_size, softcap)
    if sinks is not None:
        sinks = check_sinks(sinks, q.shape[1], q.device, "s_aux", read_values=False)
    if torch.compiler.is_compiling():
        return _traced(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, softcap, band, True, True, False, sinks)
    batch = checked_lengths(q, k, cu_q, cu_k, max_q, max_k, False)
    return _run(q, k, v, cu_q, cu_k, batch, max_q, max_k, softmax_scale, softcap, band, True, True, q.device, sinks)


def packed_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                  causal: bool, window_left: int, softcap: float, sinks=None):
    """:func:`rocmflash.api.varlen.flash_attn_varlen_func` over a packing built on the device (the HF integration):
    the last ``cu_seqlens`` entries may stop short of the packed rows -- the rows after them are unused, zero in the
    output and in the gradients -- so the caller never needs the number of real tokens on the host.
    Values are never read on the host; wrong ones are reported as ``flash_attn_varlen_func`` says.
    ``sinks``: attention sinks, as ``flash_attn_varlen_func``'s ``s_aux`` (transformers' ``s_aux``)."""
    check_qkv(q, k, v)
    left, right = check_options(softmax_scale, causal, (window_left, -1), softcap)
    if sinks is not None:
        sinks = check_sinks(sinks, q.shape[1], q.device)
    if torch.compiler.is_compiling():
        return _traced(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
                       (left, right), False, False, False, sinks)
    batch = checked_lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, False)
    device = q.device
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
                (left, right), False, False, device, sinks)


def _run(q, k, v, cu_q, cu_k, batch: int, max_q: int, max_k: int, softmax_scale, softcap, band: tuple,
         return_lse, strict_end: bool, device, sinks=None):
    """Launch a validated call (autograd); on the CPU, report what its kernel found wrong at once.
    ``sinks``: checked fp32 ``(Hq,)`` attention-sink logits (:func:`rocmflash.api.sinks.check_sinks`) or None."""
    D = q.shape[2]
    left, right = band
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    call = VK.VarlenCall(batch, q.shape[1], k.shape[1], D, int(max_q), int(max_k), scale, float(softcap), left, right,
                         strict_end)
    fwd_cfg = _forward_config(device, D, q.dtype, right == 0, call.group, int(max_k), float(softcap), left)
    out, lse = _VarlenAttention.apply(q, k, v, cu_q, cu_k, call, fwd_cfg, bool(return_lse), sinks)
    if device.type != "cuda" and q.shape[0]:  # Triton's interpreter: reading the word waits for nothing
        VE._read_and_report(device, "this call")
    return (out, lse) if return_lse else out


def _traced(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, softcap, band: tuple, return_lse, strict_end: bool,
            check_values: bool, sinks=None):
    """What :func:`rocmflash.api.varlen.flash_attn_varlen_func`, :func:`packed_forward` and :func:`packed_varlen` run
    while torch.compile traces, after their option checks: ``cu_seqlens``' metadata checked at trace time, then one
    ``torch.ops.rocmflash.varlen_fwd`` (:mod:`rocmflash.api.varlen_ops`), differentiable through ``varlen_bwd``. No
    dense route and no incumbent (as the dense op while tracing: one op keeps the graph whole); the values' checks,
    the error words and the config are the op's, per call at run time. ``sinks``: checked attention sinks (the op's
    last argument)."""
    batch = check_cu_seqlens("cu_seqlens_q", cu_q, q.shape[0], max_q, q.device, read_values=False)
    check_cu_seqlens("cu_seqlens_k", cu_k, k.shape[0], max_k, q.device, batch, read_values=False)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[2])
    out, lse = torch.ops.rocmflash.varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, float(softcap), band[0],
                                              band[1], strict_end, check_values, sinks)
    return (out, lse) if return_lse else out


__all__ = ["checked_lengths", "packed_forward", "packed_varlen"]
