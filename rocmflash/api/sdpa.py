"""``patch_sdpa``: route supported ``F.scaled_dot_product_attention`` calls to rocmflash.

Usage::

    with rocmflash.api.sdpa.patch_sdpa():      # context manager: restored on exit, also on exception
        model(x)
    handle = rocmflash.api.sdpa.patch_sdpa()   # plain call: patched until handle.restore()
    ...
    handle.restore()                       # or rocmflash.api.sdpa.unpatch_sdpa() to drop every patch

A call goes to rocmflash only when rocmflash computes *exactly the same function* as
SDPA would (up to rounding):

* no ``attn_mask``; ``dropout_p == 0``;
* query/key/value are plain 4-D ``(B, H, S, D)`` fp16/bf16 tensors of one dtype, on a
  CUDA/ROCm device (or CPU under ``TRITON_INTERPRET=1``), same batch size, no broadcasting;
* key and value share their shape, and query/key/value share the head dim, 16..256;
* ``Hq == Hkv``, or ``enable_gqa=True`` with ``Hq % Hkv == 0`` (SDPA's head mapping
  ``h -> h // (Hq // Hkv)`` is rocmflash's);
* ``is_causal`` only with ``Sq == Sk``: SDPA's causal mask is *top-left* aligned while
  rocmflash's is bottom-right, so they differ when ``Sq != Sk``;
* no empty dimension; ``scale`` is honoured (None: ``1/sqrt(D)``).

Everything else -- masks, dropout, fp32/fp64, nested tensors, ``Sq != Sk`` causal,
mismatched heads without ``enable_gqa`` -- goes to the original function with the
original arguments, unchanged. Calls that go to rocmflash are differentiable (Triton
backward) and traceable by ``torch.compile``. A routed call is served as ``rocmflash.attention``
serves it (:func:`rocmflash.api.ops.attention_forward`): where the GPU's database entry timed the
platform's SDPA faster for the problem (a decode-shaped call: its ``decode-`` entry, timed eagerly
with host time), the original SDPA runs it after all, with the caller's tensors and no copies.

Patching replaces the attribute ``torch.nn.functional.scaled_dot_product_attention``;
code that bound the function earlier (``from torch.nn.functional import
scaled_dot_product_attention`` at import time) keeps the original. Nested use works: each
handle may be restored in any order; the original comes back with the last one.
"""

from __future__ import annotations

import functools
import math
import os
import threading

import torch
import torch.nn.functional as F

_LOCK = threading.RLock()
#: the function the installed wrapper falls back to (the real SDPA, normally)
_ORIGINAL = None
_STATS = {"routed": 0, "fallback": 0}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def supported(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False) -> bool:
    """True when rocmflash computes the same result as SDPA for these arguments."""
    if attn_mask is not None:
        return False
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or dropout_p != 0.0:
        return False
    if not isinstance(is_causal, bool) or not isinstance(enable_gqa, bool):
        return False
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(float(scale)):
            return False
    for t in (query, key, value):  # a loop, not three generator passes: this runs on every patched call
        if not isinstance(t, torch.Tensor) or t.is_nested or t.layout != torch.strided or t.dim() != 4:
            return False
    dtype = query.dtype
    if dtype not in (torch.float16, torch.bfloat16) or key.dtype != dtype or value.dtype != dtype:
        return False
    dev = query.device
    if key.device != dev or value.device != dev:
        return False
    if not (query.is_cuda or (dev.type == "cpu" and _interpreting())):
        return False
    B, Hq, Sq, D = query.shape
    if key.shape != value.shape:
        return False
    Bk, Hkv, Sk, Dk = key.shape
    if Bk != B or Dk != D or not 16 <= D <= 256:
        return False
    if min(B, Hq, Sq, Sk) == 0:
        return False
    if Hkv != Hq:
        if not enable_gqa or Hkv == 0 or Hq % Hkv:
            return False
    if is_causal and Sq != Sk:
        return False  # SDPA: top-left aligned; rocmflash: bottom-right
    return True


_OPS: list = []


def _attention_op():
    """:func:`rocmflash.api.ops.attention_op`, imported on first use and kept (an import per call costs ~1 µs)."""
    if not _OPS:
        from rocmflash.api.ops import attention_op

        _OPS.append(attention_op)
    return _OPS[0]


_ACTIVE: list = []  # open handles; the wrapper routes while any is open
_WRAPPER = None  # the one wrapper installed over the original


def _make_wrapper(original):
    @functools.wraps(original)
    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False, **kwargs):
        if _ACTIVE and not kwargs and supported(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                enable_gqa):
            _STATS["routed"] += 1
            out, _ = _attention_op()(query, key, value, causal=is_causal,
                                     scale=None if scale is None else float(scale), need_lse=False)
            return out
        _STATS["fallback"] += 1
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa, **kwargs)

    scaled_dot_product_attention._rocmflash_original = original
    return scaled_dot_product_attention


class patch_sdpa:
    """Patch ``torch.nn.functional.scaled_dot_product_attention`` now; a handle and a context manager.

    ``patch_sdpa()`` patches immediately (plain call) and returns this handle;
    ``with patch_sdpa():`` restores on exit, also when the block raises. :meth:`restore`
    is idempotent; handles may be restored in any order -- the original function is put
    back when the last open handle is restored (if nobody patched on top of rocmflash
    meanwhile; otherwise the wrapper stays installed but passes every call through).
    """

    def __init__(self):
        global _ORIGINAL, _WRAPPER
        with _LOCK:
            current = F.scaled_dot_product_attention
            if current is not _WRAPPER or _WRAPPER is None:
                _ORIGINAL = current
                _WRAPPER = _make_wrapper(current)
                F.scaled_dot_product_attention = _WRAPPER
            _ACTIVE.append(self)
            self.active = True

    def restore(self) -> None:
        global _WRAPPER
        with _LOCK:
            if not self.active:
                return
            self.active = False
            _ACTIVE.remove(self)
            if not _ACTIVE and F.scaled_dot_product_attention is _WRAPPER:
                F.scaled_dot_product_attention = _ORIGINAL
                _WRAPPER = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False


def unpatch_sdpa() -> None:
    """Close every open handle and restore the original SDPA."""
    for handle in list(_ACTIVE):
        handle.restore()


def is_patched() -> bool:
    """True while a patch_sdpa handle is open."""
    return bool(_ACTIVE)


def stats() -> dict:
    """How many calls were routed to rocmflash and how many fell back (since import)."""
    return dict(_STATS)


__all__ = ["patch_sdpa", "unpatch_sdpa", "is_patched", "supported", "stats"]
