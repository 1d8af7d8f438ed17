"""The host checks of ``flash_attn_varlen_func``'s arguments: packed q/k/v, the scalar options, ``cu_seqlens``.

Types, ranks, dtypes, devices and sizes are checked on every call; the *values* of ``cu_seqlens`` only when the
caller asks (``check_values=True``: a host read waits for the GPU), else the kernels check them and report
through the varlen error word (:mod:`rocmflash.api.varlen_errors`). :func:`check_options` (scale, causal flag,
window, soft cap) is shared by the dense API's windows and the decode path. :mod:`rocmflash.api.varlen` re-exports
the public names.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from rocmflash.api.scale import check_softmax_scale
from rocmflash.kernels import error_words as EW
from rocmflash.kernels import masks as M
from rocmflash.kernels.launch import check_device

_DTYPES = (torch.float16, torch.bfloat16)
#: what a ``max_seqlen`` may be: a torch.SymInt is a Python int torch.compile traces as a dynamic size (a new
#: ``max_seqlen`` every batch would otherwise recompile)
_INTS = (int, torch.SymInt)
_capturing = EW.capturing  #: whether a CUDA graph is being captured on the device (no host read, no copy then)


def _check_tensor(name: str, t, ndim: int, layout: str) -> None:
    """Raise unless ``t`` is a tensor of ``ndim`` dimensions (``layout`` names them in the message)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")


def check_qkv(q, k, v, layout_q: str = "(total_q, Hq, D)", layout_kv: str = "(total_k, Hkv, D)") -> None:
    """Types, ranks, dtypes, devices, head dim (16..256) and the GQA ratio of packed q/k/v."""
    _check_tensor("q", q, 3, layout_q)
    _check_tensor("k", k, 3, layout_kv)
    _check_tensor("v", v, 3, layout_kv)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype must be torch.float16 or torch.bfloat16, got {t.dtype}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must match q.dtype ({q.dtype})")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all must share a device")
    check_device("q", q)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    D = q.shape[2]
    if k.shape[2] != D:
        raise ValueError(f"q, k and v must share the head dim: q has {D}, k/v have {k.shape[2]}")
    if not 16 <= D <= 256:
        raise ValueError(f"head dim must be in 16..256, got {D}")
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"number of query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")


def check_options(softmax_scale, causal, window_size, softcap) -> tuple[int, int]:
    """Validate the scalar options; returns the band ``(left, right)`` for the kernels."""
    check_softmax_scale(softmax_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right) of ints >= -1, got {window_size!r}")
    for side, w in zip(("left", "right"), window_size):
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"window_size {side} must be an int, got {type(w).__name__}")
        if w < -1:
            raise ValueError(f"window_size {side} must be >= -1 (-1 = unbounded), got {w}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if not 0 <= softcap < math.inf:  # (not math.isfinite: torch.compile(dynamic=True) cannot trace it on a float)
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off), got {softcap}")
    return M.band_offsets(causal, tuple(window_size))


def check_cu_seqlens(name: str, cu, total: int, max_seqlen, device, batch: Optional[int] = None,
                     read_values: bool = True) -> int:
    """Check a cumulative-lengths tensor against its packed operand; returns the batch size.

    Shape and dtype always; values (starts at 0, non-decreasing, ends at ``total``, no
    sequence longer than ``max_seqlen``) when ``read_values`` and no graph is being captured.
    """
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; all must share a device")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"{name} has {cu.shape[0]} entries but cu_seqlens_q has {batch + 1}; "
                         "both must be (batch + 1,)")
    mname = name.replace("cu_seqlens", "max_seqlen")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, _INTS) or max_seqlen < 0:
        raise ValueError(f"{mname} must be an int >= 0, got {max_seqlen!r}")
    if not read_values or _capturing(device):
        return cu.shape[0] - 1
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    if values[-1] != total:
        raise ValueError(f"{name}[-1] ({values[-1]}) must equal the number of packed tokens ({total})")
    lengths = [b - a for a, b in zip(values, values[1:])]
    if any(n < 0 for n in lengths):
        bad = next(i for i, n in enumerate(lengths) if n < 0)
        raise ValueError(f"{name} must be non-decreasing; it drops at index {bad + 1} ({values[bad]} -> {values[bad + 1]})")
    if lengths and max(lengths) > max_seqlen:
        raise ValueError(f"{mname}={max_seqlen} is smaller than the longest sequence in {name} ({max(lengths)})")
    return cu.shape[0] - 1


def _check_fa2_options(alibi_slopes, deterministic, return_attn_probs, check_values) -> None:
    """flash-attn 2's options rocmflash takes (bools) or refuses (one-line ``NotImplementedError``s)."""
    if alibi_slopes is not None:
        raise NotImplementedError("rocmflash: ALiBi (alibi_slopes) is not implemented; pass alibi_slopes=None")
    for name, flag in (("deterministic", deterministic), ("return_attn_probs", return_attn_probs),
                       ("check_values", check_values)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")


__all__ = ["check_qkv", "check_options", "check_cu_seqlens"]
