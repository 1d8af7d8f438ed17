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
import threading

import torch
import torch.nn.functional as F

from rocmflash.api.attention import _kv_signature, served_incumbent
from rocmflash.api.selection import register_clear
from rocmflash.kernels.launch import interpreting

_LOCK = threading.RLock()
#: the function the installed wrapper falls back to (the real SDPA, normally)
_ORIGINAL = None
_STATS = {"routed": 0, "fallback": 0}


_interpreting = interpreting  #: TRITON_INTERPRET, read per call at a dict read's cost (tests swap it here)


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


#: signature of a routed call (what :func:`supported` reads of the tensors, and the flags) -> its ops plan;
#: :func:`rocmflash.api.selection.clear_cache` forgets them
_PLANS: dict = {}
_MAX_PLANS = 4096
register_clear(_PLANS.clear)
_FORWARD: list = []  #: :func:`rocmflash.api.ops.attention_forward`, bound on the first routed call


def _signature(query, key, value, is_causal, enable_gqa) -> tuple:
    """What :func:`supported` read of a routed call, but key's and value's dtypes and devices (:func:`_kv_signature`,
    compared only where rocmflash's kernels run it: SDPA checks them itself)."""
    return (query.shape, query.stride(), key.shape, value.shape, query.dtype, query.get_device(), is_causal,
            enable_gqa, True if query.is_cuda else (query.device, _interpreting()))


def _planned(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The ops plan of a call whose signature :func:`supported` accepted before, or None (check it in full): plain
    strided tensors, no mask, a float dropout of 0, bool flags and a scale that needs no check (None or a finite
    float) -- everything else :func:`supported` reads is in the signature."""
    if (attn_mask is not None or type(query) is not torch.Tensor or type(key) is not torch.Tensor
            or type(value) is not torch.Tensor or query.is_nested or key.is_nested or value.is_nested
            or type(dropout_p) is not float or dropout_p != 0.0 or type(is_causal) is not bool
            or type(enable_gqa) is not bool or not (scale is None or type(scale) is float and math.isfinite(scale))):
        return None
    return _PLANS.get(_signature(query, key, value, is_causal, enable_gqa))


def _keep_plan(query, key, value, is_causal, enable_gqa) -> None:
    if type(query) is torch.Tensor and type(key) is torch.Tensor and type(value) is torch.Tensor \
            and not torch.compiler.is_compiling():
        from rocmflash.api.ops import _call_plan, attention_forward

        if not _FORWARD:
            _FORWARD.append(attention_forward)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[_signature(query, key, value, is_causal, enable_gqa)] = (_call_plan(query, key, is_causal),
                                                                      _kv_signature(key, value))


def _make_wrapper(original):
    @functools.wraps(original)
    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False, **kwargs):
        if _ACTIVE and not kwargs:
            plan = _planned(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            if plan is not None and plan[0].serving:  # the entry's incumbent: SDPA's call, nothing between
                serve = served_incumbent(plan[0], query, key, value)
                if serve is not None:
                    _STATS["routed"] += 1
                    return serve(query, key, value, scale)
            if plan is not None and _kv_signature(key, value) == plan[1]:  # checked before: no checks
                _STATS["routed"] += 1
                call = plan[0]
                out, _ = _FORWARD[0](query, key, value, is_causal, call.scale if scale is None else scale,
                                     "online", None, False, call)
                return out
        if _ACTIVE and not kwargs and supported(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                enable_gqa):
            _STATS["routed"] += 1
            out, _ = _attention_op()(query, key, value, causal=is_causal,
                                     scale=None if scale is None else float(scale), need_lse=False)
            _keep_plan(query, key, value, is_causal, enable_gqa)
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
