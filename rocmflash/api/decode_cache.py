"""What a decode call does to the KV cache itself: the cache lengths it reads, the checks of their values
(``cache_seqlens``, ``cache_leftpad``, ``block_table``) where reading them costs nothing (the append of the new
tokens is one kernel: :mod:`rocmflash.kernels.decode.append`). :mod:`rocmflash.api.decode` (``flash_attn_with_kvcache``)
re-exports these names.
"""

from __future__ import annotations

from typing import Optional

import torch

from rocmflash.api import decode_fp8 as F8D
from rocmflash.api.decode_errors import _capturing
from rocmflash.kernels.decode import checks as KC
from rocmflash.kernels.decode import host as KD


def as_int32(t: torch.Tensor, backend: Optional[str] = None) -> torch.Tensor:
    """``t`` as int32: itself when it is already (``Tensor.to`` returns it too, at ~1 µs of a decode step's host
    time for the call), else a converted copy. ``backend`` given (the default path, which reads no value): an
    int64 value outside int32 saturates and sets ``BAD_WIDE`` in the decode error word, one launch as the torch
    conversion (:func:`rocmflash.kernels.decode.checks.narrow_int32`); None: torch's conversion, which wraps (for
    values the host checks, ``check_values=True``: :func:`_check_values` compares them with the original)."""
    if t.dtype is torch.int32:
        return t
    if backend is None:
        return t.to(torch.int32)
    return KC.narrow_int32(t, KD.error_word(t.device), backend)


def _lengths(cache_seqlens, batch: int, capacity: int, device, backend: Optional[str] = None):
    """The validated ``cache_seqlens`` as an int32 ``(B,)`` tensor (None: the whole cache); ``backend``: see
    :func:`as_int32`."""
    if isinstance(cache_seqlens, torch.Tensor):
        return as_int32(cache_seqlens, backend)
    fill = capacity if cache_seqlens is None else cache_seqlens
    return torch.full((batch,), fill, dtype=torch.int32, device=device)


def _check_values(cache_seqlens, lens, block_table, k_cache, new, capacity, page_size, device,
                  starts=None, descales=None, cache_leftpad=None) -> None:
    """Values that need a host read: tensor lengths within the cache, start keys (``cache_leftpad``,
    as int32 ``starts``) within their sequences, used pages inside the cache (skipped while a graph is
    captured; a plain int length was checked on the host already), an fp8 cache's ``descales``
    ``(k_descale, v_descale)`` finite and > 0, and an int64 ``cache_seqlens``/``cache_leftpad`` (the caller's
    tensors, before ``lens``/``starts`` narrowed them) inside int32. The checks run on the device and come back
    as flags in one small copy; details are looked up only on failure."""
    if _capturing(device) or not (isinstance(cache_seqlens, torch.Tensor) or block_table is not None
                                  or starts is not None or descales is not None):
        return
    wide = [(name, t) for name, t in (("cache_seqlens", cache_seqlens), ("cache_leftpad", cache_leftpad))
            if isinstance(t, torch.Tensor) and t.dtype is torch.int64]
    bad_wide = [(t < -2**31) | (t > 2**31 - 1) for _, t in wide]
    bad_len = (lens < 0) | (lens > capacity - new)  # (not lens + new: it wraps past int32)
    checks = [bad_len.any()]
    if starts is not None:
        bad_start = (starts < 0) | (starts > lens + new)
        checks.append(bad_start.any())
    page_flag = len(checks)  # where the block-table flag lands, if there is one
    if block_table is not None:
        num_blocks = k_cache.shape[0]
        pages = torch.arange(block_table.shape[1], device=device)[None, :]
        used = pages < ((lens.clamp(min=0) + new + page_size - 1) // page_size)[:, None]
        if starts is not None:  # pages wholly before a sequence's start are never read
            used &= pages >= (starts.clamp(min=0) // page_size)[:, None]
        bad_page = used & ((block_table < 0) | (block_table >= num_blocks))
        checks.append(bad_page.any())
    if descales is not None:
        bad_scales = F8D.descale_flags(*descales)
        checks += [bad.any() for bad in bad_scales]
    wide_flag = len(checks)
    checks += [bad.any() for bad in bad_wide]
    flags = torch.stack(checks).tolist()
    for (name, t), bad, flag in zip(wide, bad_wide, flags[wide_flag:]):  # first: the narrowed values mean nothing
        if flag:
            b = int(bad.nonzero()[0, 0])
            raise ValueError(f"{name}[{b}]={int(t[b])} does not fit int32 (the kernels' lengths): not a length")
    if descales is not None and (flags[wide_flag - 1] or flags[wide_flag - 2]):
        F8D.raise_bad_descale(*bad_scales, *descales)
    if flags[0]:
        b = int(bad_len.nonzero()[0, 0])
        raise ValueError(f"cache_seqlens[{b}]={int(lens[b])} plus {new} new key(s) is outside the cache "
                         f"(capacity {capacity} keys per sequence)")
    if starts is not None and flags[1]:
        b = int(bad_start.nonzero()[0, 0])
        raise ValueError(f"cache_leftpad[{b}]={int(starts[b])} must be in 0..{int(lens[b]) + new} (the "
                         f"sequence's keys end there: cache_seqlens[{b}] plus {new} new key(s))")
    if block_table is not None and flags[page_flag]:
        b, p = (int(x) for x in bad_page.nonzero()[0])
        raise ValueError(f"block_table[{b}] points outside the cache: block {int(block_table[b, p])} "
                         f"(the cache has {num_blocks} blocks)")
