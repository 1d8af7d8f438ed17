"""The platform's own varlen attention as the packed forward's incumbent, timed by the varlen tune.

torch ships a varlen attention of its own, :func:`torch.nn.attention.varlen.varlen_attn` (FlashAttention's varlen
kernel on CUDA; on ROCm what torch builds for it): packed ``(total, H, D)`` tensors and ``cu_seqlens``, as
``flash_attn_varlen_func`` takes them -- no nested tensors, no copies, lengths never read on the host. ``rocmflash
tune --mode varlen`` times it beside the Triton winner, in the same worker, on the same packed batch, with the same
fp32 gate, L2 flush and repetitions (:func:`rocmflash.tuning.varlen_worker.measure_varlen_incumbent`), and the entry
keeps it as ``incumbent`` (:func:`rocmflash.api.incumbent.incumbent_field`'s layout; ``--no-incumbent`` skips it)::

    "incumbent": {"backend": "varlen_attn", "time_ms": 0.41, "triton_ms": 0.38,
                  "backends": {"varlen_attn": {...}}}

Not yet served at run time: torch's kernel addresses memory by the ``cu_seqlens`` values, which rocmflash never
reads on the host, so a call may only be handed to it with lengths made safe on the device first (clamped into the
packed tensors, non-decreasing), as the Triton kernel clamps them itself. Until then the entry's field says, per
GPU, how the platform's varlen attention compares. What it computes is rocmflash's function where :func:`excludes`
lets a call through: no LSE, no window, no soft cap, and causal only with one ``cu_seqlens`` tensor for queries and
keys (each sequence attends to itself, so the two conventions of the causal diagonal agree). The names of this
torch's function and keywords are read from its signature, never assumed: a torch without it (or without
``enable_gqa`` for a GQA call, or ``scale``) has no incumbent for that call.
"""

from __future__ import annotations

import inspect
import math
from typing import Optional

#: the backend name an entry stores
NAME = "varlen_attn"

_FN: list = []  #: [torch's varlen_attn, or None] and its keyword names, bound on first use


def _function() -> tuple:
    """``(varlen_attn or None, frozenset of its parameter names)``."""
    if not _FN:
        try:
            from torch.nn.attention.varlen import varlen_attn

            names = frozenset(inspect.signature(varlen_attn).parameters)
        except (ImportError, AttributeError, TypeError, ValueError):
            varlen_attn, names = None, frozenset()
        _FN.extend((varlen_attn, names))
    return _FN[0], _FN[1]


def excludes(causal: bool, same_cu: bool, group: int, head_dim: int, scale: Optional[float], want_lse: bool = False,
             windowed: bool = False, softcap: float = 0.0, needs_grad: bool = False) -> Optional[str]:
    """Why this call never runs the incumbent, or None. ``same_cu``: queries and keys share one ``cu_seqlens``
    tensor; ``scale``: the softmax scale asked (None: ``1/sqrt(D)``)."""
    fn, names = _function()
    if fn is None:
        return "this torch has no torch.nn.attention.varlen.varlen_attn"
    if needs_grad:
        return "the call needs gradients and the varlen tune timed the forward only"
    if want_lse:
        return "the call returns the LSE"
    if windowed or softcap:
        return "a window or a soft cap (the tune timed neither)"
    if causal and not same_cu:
        return "causal with separate cu_seqlens_q/cu_seqlens_k (the causal diagonal's alignment may differ)"
    if causal and "window_size" not in names and "is_causal" not in names:
        return "this torch's varlen_attn takes no causal flag"
    if group > 1 and "enable_gqa" not in names:
        return "GQA, which this torch's varlen_attn does not take"
    if scale is not None and not math.isclose(scale, 1.0 / math.sqrt(head_dim), rel_tol=1e-6) and "scale" not in names:
        return "a softmax scale other than 1/sqrt(D), which this torch's varlen_attn does not take"
    return None


def run(q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: Optional[float]):
    """``(total_q, Hq, D)``: torch's ``varlen_attn`` of packed tensors (a call :func:`excludes` lets through)."""
    fn, names = _function()
    kwargs = {}
    if causal:
        if "window_size" in names:
            kwargs["window_size"] = (-1, 0)
        else:
            kwargs["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        kwargs["enable_gqa"] = True
    if scale is not None and "scale" in names:
        kwargs["scale"] = float(scale)
    return fn(q, k, v, cu_q, cu_k, int(max_q), int(max_k), **kwargs)


__all__ = ["NAME", "excludes", "run"]
