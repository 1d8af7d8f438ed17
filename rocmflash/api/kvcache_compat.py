"""flash-attn's ``flash_attn_with_kvcache`` arguments that rocmflash's decode kernels do not take themselves.

:func:`rocmflash.api.decode.flash_attn_with_kvcache` hands them here before its own checks, which then see an
ordinary call:

* ``rotary_cos``/``rotary_sin`` (``rotary_interleaved``): the rotary embedding of ``q`` and of the new ``k``, done
  with torch ops on the device (no host read) into new tensors -- the caller's ``q`` and ``k`` are not changed;
  the rotated ``k`` is what the append writes into the cache.
* ``cache_batch_idx``: the cache rows the batch uses. A ``(B_cache, S_max, Hkv, D)`` cache is read as a paged
  cache of ``B_cache`` pages of ``S_max`` keys and a one-column block table, ``cache_batch_idx[:, None]``: no copy,
  and the append writes into the caller's ``k_cache``/``v_cache`` in place. Out-of-range indices are then what
  out-of-range pages are to the paged path: caught on the GPU (or on the host with ``check_values=True``).
* ``alibi_slopes``: not implemented (a one-line ``NotImplementedError``).
"""

from __future__ import annotations

import torch

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def prepare(q, k_cache, k, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table, causal,
            window_size, rotary_interleaved, alibi_slopes) -> tuple:
    """``(q, k, cache_seqlens, block_table)`` for the decode path: rotated where rotary tables are given, and
    ``cache_batch_idx`` turned into a block table (see the module docstring). Raises before anything is written."""
    if alibi_slopes is not None:
        raise NotImplementedError("rocmflash: ALiBi (alibi_slopes) is not implemented; pass alibi_slopes=None")
    if cache_batch_idx is not None:
        cache_seqlens, block_table = _batch_idx_as_pages(q, k_cache, cache_seqlens, cache_batch_idx, block_table)
    if rotary_cos is not None or rotary_sin is not None:
        q, k = _rotate(q, k_cache, k, rotary_cos, rotary_sin, cache_seqlens, block_table, causal, window_size,
                       rotary_interleaved)
    return q, k, cache_seqlens, block_table


def _batch_idx_as_pages(q, k_cache, cache_seqlens, cache_batch_idx, block_table) -> tuple:
    """``(cache_seqlens, block_table)`` reading cache row ``cache_batch_idx[b]`` for batch row ``b``."""
    if block_table is not None:
        raise NotImplementedError("rocmflash: cache_batch_idx with a paged cache (block_table) is not implemented; "
                                  "index the block table's rows instead (block_table[cache_batch_idx])")
    if not isinstance(cache_batch_idx, torch.Tensor):
        raise TypeError(f"cache_batch_idx must be a torch.Tensor, got {type(cache_batch_idx).__name__}")
    if cache_batch_idx.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cache_batch_idx must have dtype torch.int32 or torch.int64, got {cache_batch_idx.dtype}")
    if not isinstance(q, torch.Tensor) or q.ndim != 4 or not isinstance(k_cache, torch.Tensor) or k_cache.ndim != 4:
        return cache_seqlens, block_table  # the decode path's checks name what is wrong with q or the cache
    if cache_batch_idx.shape != (q.shape[0],):
        raise ValueError(f"cache_batch_idx must be (B={q.shape[0]},), got shape {tuple(cache_batch_idx.shape)}")
    if cache_batch_idx.device != q.device:
        raise ValueError(f"cache_batch_idx is on {cache_batch_idx.device} but q is on {q.device}; "
                         "all must share a device")
    if cache_seqlens is None:  # flash-attn: every used row is full (the paged path needs the lengths said)
        cache_seqlens = k_cache.shape[1]
    # a row of S_max keys is one page: the caller's cache, in place (the paged path's strides are the cache's)
    return cache_seqlens, cache_batch_idx.to(torch.int32).view(-1, 1)


def _rotate(q, k_cache, k, cos, sin, cache_seqlens, block_table, causal, window_size, interleaved) -> tuple:
    """``(q, k)`` rotated as flash-attn 2 documents: new key ``t`` of sequence ``b`` at position
    ``cache_seqlens[b] + t``; the queries at ``cache_seqlens[b] + t`` too when causal or local
    (``window_size != (-1, -1)``), else all at ``cache_seqlens[b]``. Positions count from the cache's first row
    (with ``cache_leftpad`` too, as flash-attn's kernel does)."""
    if not _check_rotary(q, k_cache, k, cos, sin, cache_seqlens, block_table, interleaved):
        return q, k  # inputs the decode path rejects (naming what is wrong) before anything runs
    B, Sq = q.shape[0], q.shape[1]
    base = _positions_base(cache_seqlens, B, q.device)  # (B, 1) int64
    local = not (isinstance(window_size, (tuple, list)) and tuple(window_size) == (-1, -1))
    steps_q = torch.arange(Sq, device=q.device) if causal is True or local \
        else torch.zeros(Sq, dtype=torch.long, device=q.device)
    limit = cos.shape[0] - 1  # an out-of-range length is the decode path's error to report: index in bounds here
    pos_q = (base + steps_q).clamp_(0, limit)
    pos_k = (base + torch.arange(k.shape[1], device=q.device)).clamp_(0, limit)
    return apply_rotary(q, cos, sin, pos_q, interleaved), apply_rotary(k, cos, sin, pos_k, interleaved)


def _positions_base(cache_seqlens, batch: int, device) -> torch.Tensor:
    if isinstance(cache_seqlens, torch.Tensor):
        return cache_seqlens.to(torch.long).view(batch, 1)
    return torch.full((batch, 1), int(cache_seqlens), dtype=torch.long, device=device)


def _check_rotary(q, k_cache, k, cos, sin, cache_seqlens, block_table, interleaved) -> bool:
    """Raise for bad rotary arguments; False where the decode path's own checks will reject q, k, the cache or
    ``cache_seqlens`` (then nothing is rotated: that call raises before anything runs)."""
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (rotary_cos and rotary_sin go together), "
                            f"got {type(t).__name__}")
        if t.ndim != 2 or t.dtype not in _FLOATS:
            raise ValueError(f"{name} must be a 2-D (seqlen_ro, rotary_dim / 2) float tensor, "
                             f"got {t.dtype} {tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary_cos and rotary_sin must have the same shape, got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"rotary_interleaved must be a bool, got {type(interleaved).__name__}")
    if k is None:  # flash-attn leaves q unrotated then, silently: say so instead
        raise ValueError("rotary_cos/rotary_sin rotate q and the new keys: pass k and v to append "
                         "(without them flash-attn applies no rotary embedding at all)")
    if cache_seqlens is None:
        raise ValueError("cache_seqlens is required to append k/v (where do the new keys go?)")
    if not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in (q, k, k_cache)) or k.shape[0] != q.shape[0] \
            or not _lengths_accepted(cache_seqlens, q):
        return False
    if cos.device != q.device or sin.device != q.device:
        raise ValueError(f"rotary_cos/rotary_sin are on {cos.device}/{sin.device} but q is on {q.device}; "
                         "all must share a device")
    D = q.shape[3]
    if 2 * cos.shape[1] > D or cos.shape[1] == 0:
        raise ValueError(f"rotary_cos is (seqlen_ro, rotary_dim / 2) with 0 < rotary_dim <= head dim {D}, got "
                         f"rotary_dim {2 * cos.shape[1]}")
    capacity = block_table.shape[1] * k_cache.shape[1] if isinstance(block_table, torch.Tensor) \
        and block_table.ndim == 2 else k_cache.shape[1]
    if cos.shape[0] < capacity:
        raise ValueError(f"rotary_cos has {cos.shape[0]} positions but the cache holds {capacity} keys; "
                         "it needs one row per cache position (flash-attn's rule)")
    return True


def _lengths_accepted(cache_seqlens, q) -> bool:
    """Whether the decode path accepts ``cache_seqlens``'s kind and metadata (an int, or an int tensor ``(B,)``
    on q's device)."""
    if isinstance(cache_seqlens, torch.Tensor):
        return cache_seqlens.dtype in (torch.int32, torch.int64) and cache_seqlens.shape == (q.shape[0],) \
            and cache_seqlens.device == q.device
    return isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool)


def apply_rotary(x, cos, sin, positions, interleaved: bool):
    """``x (B, S, H, D)`` with its first ``rotary_dim = 2 * cos.shape[1]`` features rotated at
    ``positions (B, S)`` (rows of ``cos``/``sin``), in fp32, returned in ``x``'s dtype; features past
    ``rotary_dim`` unchanged. ``interleaved``: pairs ``(0, 1), (2, 3), ...`` (GPT-J); else
    ``(i, i + rotary_dim / 2)`` (GPT-NeoX)."""
    half = cos.shape[1]
    c = cos.float()[positions].unsqueeze(2)  # (B, S, 1, half)
    s = sin.float()[positions].unsqueeze(2)
    xr = x[..., :2 * half].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)
