"""``flash_attn_with_kvcache`` as ``torch.library`` custom ops: what ``torch.compile`` traces.

Two ops of one signature (one Python function, registered twice), differing in what they declare to mutate:

``torch.ops.rocmflash.kvcache_fwd(q, k_cache, v_cache, k, v, cache_seqlens, cache_seqlens_int, cache_leftpad,
block_table, k_descale, v_descale, softmax_scale, causal, window_left, window_right, softcap, num_splits,
want_lse, check_values, s_aux=None) -> (out, lse)``
    Attention over the cache as it is (``k``/``v`` None: nothing appended); mutates nothing.
``torch.ops.rocmflash.kvcache_append_fwd(...)`` (the same arguments)
    Appends ``k``/``v`` into ``k_cache``/``v_cache`` in place first: declared in ``mutates_args``, so
    functionalization orders it and later reads of the caches see the new rows (``cache_seqlens`` is read,
    never written: the lengths after the append are a new tensor, as in an eager call).

The arguments are :func:`rocmflash.api.decode.flash_attn_with_kvcache`'s after its flash-attn compatibility step
(rotary embedding and ``cache_batch_idx``, torch ops that stay in the graph: :mod:`rocmflash.api.kvcache_compat`),
so the optional tensors are ``Optional[Tensor]`` and an int ``cache_seqlens`` is ``cache_seqlens_int``
(``cache_seqlens`` None then); ``window_size`` is its two ints. ``out`` is ``torch.empty_like(q)``, ``lse`` fp32
``(B, Hq, Sq)`` contiguous when ``want_lse``, else an empty ``(0,)`` placeholder (a schema cannot return None).

The implementation is the eager call itself, so everything that reads values -- the error-word poll, the host
checks of ``check_values=True``, the kept per-signature plans, the config and split count -- runs per call at run
time exactly as eagerly. What the public function runs while torch.compile traces (``decode._traced``) checks the
metadata at trace time: the same checks, which the implementation repeats at run time, with those a trace cannot
see (e.g. the fp8 format of the device's arch).
Imported by :mod:`rocmflash.api.ops` (the module ``torch.ops.rocmflash`` loads on first use).

Adding an optional tensor argument (e.g. attention sinks) is one line: :func:`_kvcache` gets it at its end with a
``None`` default (both ops and the fake take their schema from it, the fake reads ``want_lse`` by name), and
``decode._traced`` passes it on.
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch

from rocmflash.api import decode as D


def _kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
             v: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor], cache_seqlens_int: Optional[int],
             cache_leftpad: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
             k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor], softmax_scale: Optional[float],
             causal: bool, window_left: int, window_right: int, softcap: float, num_splits: int, want_lse: bool,
             check_values: bool, s_aux: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Both ops' implementation: the eager call on the prepared arguments (it runs when the graph runs, not
    while it is traced -- tracing sees :func:`_kvcache_fake` -- so the public function's torch.compile branch is
    not taken here)."""
    got = D.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, None, None,
                                    cache_seqlens if cache_seqlens is not None else cache_seqlens_int, None,
                                    cache_leftpad, block_table, softmax_scale, causal, (window_left, window_right),
                                    softcap, True, None, num_splits, want_lse, check_values=check_values,
                                    k_descale=k_descale, v_descale=v_descale, s_aux=s_aux)
    if want_lse:
        return got
    return got, torch.empty((0,), dtype=torch.float32, device=q.device)


def _kvcache_fake(q, *args, **kwargs):
    """The ops' outputs' metadata: ``empty_like(q)`` and the LSE's (or the placeholder's)."""
    bound = _SIGNATURE.bind(q, *args, **kwargs)
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if bound.arguments["want_lse"] else (0,)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


_SIGNATURE = inspect.signature(_kvcache)  #: how the fake finds ``want_lse`` whatever is added after it

kvcache_fwd = torch.library.custom_op("rocmflash::kvcache_fwd", _kvcache, mutates_args=())
kvcache_append_fwd = torch.library.custom_op("rocmflash::kvcache_append_fwd", _kvcache,
                                             mutates_args=("k_cache", "v_cache"))
kvcache_fwd.register_fake(_kvcache_fake)
kvcache_append_fwd.register_fake(_kvcache_fake)


__all__ = ["kvcache_fwd", "kvcache_append_fwd"]
