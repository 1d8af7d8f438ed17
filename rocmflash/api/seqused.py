"""flash-attn 3's ``seqused_q``/``seqused_k``: packed attention over the first rows of each sequence's span.

``flash_attn_varlen_func(..., seqused_q=..., seqused_k=...)`` (:mod:`rocmflash.flash_attn_interface`): sequence
``b`` is still rows ``cu_seqlens[b]:cu_seqlens[b + 1]`` of the packed tensors, but only its first
``seqused[b]`` rows take part -- as if it were that long (causal masks and windows align to the used lengths).
rocmflash's varlen kernel reads sequences as whole spans, so the used rows are gathered into a packing of their
own (an extra copy of q, k and v; the offsets are built on the device, nothing is read back) with a tail of unused
rows the kernel leaves alone, and the output is gathered back to the caller's rows: rows past ``seqused_q[b]``
get 0 (LSE ``-inf``) and no gradient. Both gathers are differentiable.

The caller's ``cu_seqlens`` go through :func:`rocmflash.kernels.varlen.host.launch_sanitised_lengths` (one small
launch): wrong values are reported through the varlen error word as the plain call reports them, and the copies
used here stay inside the packed tensors. ``seqused`` values outside ``0..span`` are clamped into it (they address
nothing outside the span), or raise with ``check_values=True``.
"""

from __future__ import annotations

import torch

from rocmflash.api import varlen_errors as VE
from rocmflash.api import varlen_kernel as VR
from rocmflash.api.varlen_checks import _capturing, _check_fa2_options, check_cu_seqlens, check_options, check_qkv
from rocmflash.kernels import launch as L
from rocmflash.kernels.varlen import host as VK


def varlen_seqused(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q, seqused_k, softmax_scale, causal, window_size,
                   softcap, deterministic, return_lse, check_values):
    """The call described in the module docstring: ``out``, or ``(out, lse)`` with ``return_lse`` (flash-attn 3's
    returns). Always rocmflash's kernel, whose backward is deterministic (``deterministic`` needs nothing more)."""
    check_qkv(q, k, v)
    left, right = check_options(softmax_scale, causal, window_size, softcap)
    _check_fa2_options(None, deterministic, return_lse, check_values)
    device = q.device
    batch = check_cu_seqlens("cu_seqlens_q", cu_q, q.shape[0], max_q, device, read_values=check_values)
    check_cu_seqlens("cu_seqlens_k", cu_k, k.shape[0], max_k, device, batch, read_values=check_values)
    for name, used in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        _check_used(name, used, batch, device, check_values, cu_q if name == "seqused_q" else cu_k)
    if check_values:
        VE.check_errors(device)
    if batch == 0:
        out = torch.zeros_like(q)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=device)
        return (out, lse) if return_lse else out
    with L.on_device(q):
        safe_q, safe_k = VK.launch_sanitised_lengths(cu_q, cu_k, batch, q.shape[0], k.shape[0], max_q, max_k)
    if device.type != "cuda":  # Triton's interpreter ran the check: reading the word waits for nothing
        VE._read_and_report(device, "this call")
    cu_q2, rows_q = _repack(safe_q, seqused_q, q.shape[0])
    cu_k2, rows_k = _repack(safe_k, seqused_k, k.shape[0])
    q2 = q if rows_q is None else q.index_select(0, rows_q)
    k2, v2 = (k, v) if rows_k is None else (k.index_select(0, rows_k), v.index_select(0, rows_k))
    got = VR._run(q2, k2, v2, cu_q2, cu_k2, batch, max_q, max_k, softmax_scale, softcap, (left, right), True,
                  False, device)  # strict_end False: the packings' tails are rows no sequence uses
    out, lse = got
    if rows_q is not None:
        back, kept = _unpack_rows(safe_q, cu_q2, q.shape[0])
        out = torch.where(kept[:, None, None], out.index_select(0, back), 0)
        lse = torch.where(kept[None, :], lse.index_select(1, back), float("-inf"))
    return (out, lse) if return_lse else out


def _check_used(name: str, used, batch: int, device, check_values: bool, cu) -> None:
    if used is None:
        return
    if not isinstance(used, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(used).__name__}")
    if used.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must have dtype torch.int32, got {used.dtype}")
    if used.shape != (batch,):
        raise ValueError(f"{name} must be (batch={batch},), got shape {tuple(used.shape)}")
    if used.device != device:
        raise ValueError(f"{name} is on {used.device} but q is on {device}; all must share a device")
    if check_values and not _capturing(device):
        spans = (cu[1:] - cu[:-1]).tolist()
        for b, (n, span) in enumerate(zip(used.tolist(), spans)):
            if not 0 <= n <= span:
                raise ValueError(f"{name}[{b}]={n} is outside its sequence's span 0..{span} (cu_seqlens)")


def _repack(cu, used, total: int):
    """``(cu_used, rows)``: offsets of a packing of each sequence's first ``used[b]`` rows (0 first, int32) and, per
    row of that packing, the caller's row it copies (``total`` rows: the used ones, then a tail no sequence
    reads, pointing anywhere inside); ``(cu, None)`` when ``used`` is None (the caller's packing as it is)."""
    if used is None:
        return cu, None
    spans = cu[1:] - cu[:-1]
    n = torch.minimum(used.to(spans.dtype).clamp(min=0), spans)
    cu_used = torch.cat((cu[:1] * 0, torch.cumsum(n, 0))).to(torch.int32)
    r = torch.arange(total, device=cu.device, dtype=torch.int32)
    b = torch.searchsorted(cu_used[1:], r, right=True).clamp_(max=cu.shape[0] - 2)
    rows = (cu[b] + r - cu_used[b]).clamp_(0, max(total - 1, 0))
    return cu_used, rows.to(torch.long)


def _unpack_rows(cu, cu_used, total: int):
    """``(rows, kept)``: per caller row, its row in the used packing and whether it is a used row (else the output
    is 0)."""
    i = torch.arange(total, device=cu.device, dtype=torch.int32)
    b = torch.searchsorted(cu[1:], i, right=True).clamp_(max=cu.shape[0] - 2)
    pos = i - cu[b]
    kept = (pos < cu_used[b + 1] - cu_used[b]) & (i < cu[-1])
    rows = (cu_used[b] + pos).clamp_(0, max(total - 1, 0))
    return rows.to(torch.long), kept
