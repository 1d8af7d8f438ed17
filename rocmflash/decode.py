"""``flash_attn_with_kvcache``: attention of a few new tokens over a KV cache (decode), flash-attn's conventions.

::

    from rocmflash import flash_attn_with_kvcache
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens, causal=True)

``q (B, Sq, Hq, D)``; the cache is contiguous ``(B, S_max, Hkv, D)`` or paged
``(num_blocks, page_size, Hkv, D)`` with ``block_table (B, max_blocks)`` int32. New
``k``/``v`` ``(B, Sk_new, Hkv, D)`` are written into the cache in place at
``cache_seqlens[b]`` (torch indexing: no host sync), then attention runs over
``cache_seqlens[b] + Sk_new`` keys per sequence, through the split-KV decode kernels of
:mod:`rocmflash.kernels.kv_decode`. ``num_splits=0`` takes the split count from the tuned
database (``rocmflash tune --mode decode``) or a CU-count heuristic.

Bad input raises ``ValueError``/``TypeError`` naming the argument before any kernel runs
and before anything is written to the cache. Checking the *values* of ``cache_seqlens``
and ``block_table`` reads them on the host (one small copy); while a CUDA/HIP graph is
being captured only shapes and dtypes are checked.
"""

from __future__ import annotations

import math
from typing import Optional

from rocmflash.compat import require_supported_versions

require_supported_versions()

import torch  # noqa: E402

from rocmflash.kernels import kv_decode as KD  # noqa: E402
from rocmflash.varlen import _capturing, check_options  # noqa: E402

_DTYPES = (torch.float16, torch.bfloat16)


def _check4(name: str, t, layout: str, like=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != 4:
        raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}.dtype must be torch.float16 or torch.bfloat16, got {t.dtype}")
    if like is not None:
        if t.dtype != like.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must match q.dtype ({like.dtype})")
        if t.device != like.device:
            raise ValueError(f"{name} is on {t.device} but q is on {like.device}; all must share a device")


def _int_tensor(name: str, t, ndim: int, device, dtypes=(torch.int32,)) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}; all must share a device")


def _interpreting() -> bool:
    """Whether CPU tensors are accepted (Triton's interpreter); a hook ``bench/host_profile.py --cpu-stub`` replaces."""
    from rocmflash.kernels.common import interpreting

    return interpreting()


def _validate(q, k_cache, v_cache, k, v, cache_seqlens, block_table, num_splits, check_values=True):
    """Everything but the options; returns ``(paged, page_size, capacity, seqlens_before (B,) int32 tensor)``."""
    _check4("q", q, "(B, Sq, Hq, D)")
    paged = block_table is not None
    layout = "(num_blocks, page_size, Hkv, D)" if paged else "(B, S_max, Hkv, D)"
    _check4("k_cache", k_cache, layout, q)
    _check4("v_cache", v_cache, layout, q)
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"q is on {q.device}; rocmflash kernels need a CUDA or ROCm GPU tensor "
                         "(or set TRITON_INTERPRET=1 to run CPU tensors through Triton's interpreter)")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    if k_cache.shape[3] != D:
        raise ValueError(f"q and k_cache must share the head dim: q has {D}, the cache has {k_cache.shape[3]}")
    if not 16 <= D <= 256:
        raise ValueError(f"head dim must be in 16..256, got {D}")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"number of query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (new keys and values to append), or both None")
    new = 0
    if k is not None:
        _check4("k", k, "(B, Sk_new, Hkv, D)", q)
        _check4("v", v, "(B, Sk_new, Hkv, D)", q)
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.shape[0] != B or k.shape[2] != Hkv or k.shape[3] != D:
            raise ValueError(f"k must be (B={B}, Sk_new, Hkv={Hkv}, D={D}), got {tuple(k.shape)}")
        new = k.shape[1]
    if paged:
        _int_tensor("block_table", block_table, 2, q.device)
        if block_table.shape[0] != B:
            raise ValueError(f"block_table has {block_table.shape[0]} rows but q has batch {B}")
        page_size = k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
    else:
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache has batch {k_cache.shape[0]} but q has {B} (a paged cache needs block_table)")
        page_size, capacity = 0, k_cache.shape[1]
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 0 <= num_splits <= 128:
        raise ValueError(f"num_splits must be an int in 0..128 (0 = automatic), got {num_splits!r}")

    if cache_seqlens is None:
        if paged:
            raise ValueError("cache_seqlens is required with a paged cache (block_table)")
        if new:
            raise ValueError("cache_seqlens is required to append k/v (where do the new keys go?)")
        lens = torch.full((B,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if not 0 <= cache_seqlens <= capacity - new:
            raise ValueError(f"cache_seqlens={cache_seqlens} plus {new} new key(s) does not fit the cache "
                             f"(capacity {capacity})")
        lens = torch.full((B,), cache_seqlens, dtype=torch.int32, device=q.device)
    else:
        _int_tensor("cache_seqlens", cache_seqlens, 1, q.device, (torch.int32, torch.int64))
        if cache_seqlens.shape[0] != B:
            raise ValueError(f"cache_seqlens must be (B={B},), got shape {tuple(cache_seqlens.shape)}")
        lens = cache_seqlens.to(torch.int32)
    if check_values:
        _check_values(cache_seqlens, lens, block_table, k_cache, new, capacity, page_size, q.device)
    return paged, page_size, capacity, lens, new


def _check_values(cache_seqlens, lens, block_table, k_cache, new, capacity, page_size, device) -> None:
    """Values that need a host read: tensor lengths within the cache, used pages inside it (skipped while
    a graph is captured; a plain int length was checked on the host already). The checks run on the
    device and come back as two flags in one small copy; details are looked up only on failure."""
    if _capturing(device) or not (isinstance(cache_seqlens, torch.Tensor) or block_table is not None):
        return
    bad_len = (lens < 0) | (lens + new > capacity)
    checks = [bad_len.any()]
    if block_table is not None:
        num_blocks = k_cache.shape[0]
        used = torch.arange(block_table.shape[1], device=device)[None, :] < (
            (lens.clamp(min=0) + new + page_size - 1) // page_size)[:, None]
        bad_page = used & ((block_table < 0) | (block_table >= num_blocks))
        checks.append(bad_page.any())
    flags = torch.stack(checks).tolist()
    if flags[0]:
        b = int(bad_len.nonzero()[0, 0])
        raise ValueError(f"cache_seqlens[{b}]={int(lens[b])} plus {new} new key(s) is outside the cache "
                         f"(capacity {capacity} keys per sequence)")
    if len(flags) > 1 and flags[1]:
        b, p = (int(x) for x in bad_page.nonzero()[0])
        raise ValueError(f"block_table[{b}] points outside the cache: block {int(block_table[b, p])} "
                         f"(the cache has {num_blocks} blocks)")


def _append(k_cache, v_cache, k, v, lens, block_table, page_size) -> None:
    """Write the new keys/values at positions ``lens[b] + t`` (in place, no host sync)."""
    B, new = k.shape[0], k.shape[1]
    pos = lens.to(torch.int64)[:, None] + torch.arange(new, device=k.device)[None, :]  # (B, new)
    if block_table is None:
        rows = torch.arange(B, device=k.device)[:, None].expand(B, new)
        k_cache[rows, pos] = k
        v_cache[rows, pos] = v
    else:
        blocks = torch.gather(block_table.to(torch.int64), 1, pos // page_size)
        k_cache[blocks, pos % page_size] = k
        v_cache[blocks, pos % page_size] = v


def decode_config(device, head_dim: int, dtype, group: int, max_seqlen_k: int, batch: int,
                  page_size: int = 0) -> "KD.DecodeConfig":
    """The decode config for this problem: the tuned database entry (``rocmflash tune --mode decode``) of the
    nearest KV-length and batch buckets, else the per-arch default."""
    key = (device, head_dim, dtype, group, max_seqlen_k, batch, page_size)
    cfg = _DECODE_CONFIGS.get(key)
    if cfg is None:
        from rocmflash.selection import device_identity
        from rocmflash.tuning.decode import lookup_decode

        gpu_name, arch = device_identity(device)
        hit = None
        if gpu_name is not None:
            hit = lookup_decode(gpu_name, int(head_dim), dtype, int(group), int(max_seqlen_k), int(batch),
                                int(page_size))
        cfg = _DECODE_CONFIGS[key] = hit or KD.default_decode_config(arch, int(head_dim))
    return cfg


_DECODE_CONFIGS: dict = {}  #: per (device, problem) choice; cleared with :func:`clear_cache`


def clear_cache() -> None:
    """Forget cached decode choices (after a new tune in this process)."""
    from rocmflash.tuning.decode import lookup_decode

    _DECODE_CONFIGS.clear()
    lookup_decode.cache_clear()


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: tuple = (-1, -1), softcap: float = 0.0, num_splits: int = 0,
                            return_lse: bool = False, *, check_values: bool = True):
    """Decode attention over a KV cache (flash-attn's ``flash_attn_with_kvcache``); see the module docstring.

    Returns ``(B, Sq, Hq, D)`` in q's dtype, or ``(out, lse)`` with ``lse`` fp32 ``(B, Hq, Sq)``
    (natural log; rows that see no key: output 0, LSE ``-inf``). Causal masking is bottom-right
    aligned: new token ``t`` sits at position ``L - Sq + t`` of its sequence's ``L`` keys.
    Not differentiable (inference).

    ``check_values=False`` (keyword only, not in flash-attn) skips the host read of the
    *values* of ``cache_seqlens`` and ``block_table`` -- the one step that makes a call wait
    for the GPU. Shapes, dtypes and devices are always checked. Use it in a decode loop whose
    lengths and tables are known to fit the cache (a captured graph skips the read anyway).
    """
    paged, page_size, capacity, lens, new = _validate(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                                      num_splits, check_values)
    left, right = check_options(softmax_scale, causal, window_size, softcap)
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    if new:
        _append(k_cache, v_cache, k, v, lens, block_table, page_size)
    seqlens = lens + new if new else lens
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    call = KD.DecodeCall(B, Sq, Hkv, Hq // Hkv, D, paged, page_size, scale, float(softcap), left, right)
    cfg = decode_config(q.device, D, q.dtype, Hq // Hkv, capacity, B, page_size)
    splits = num_splits or cfg.num_splits
    if not splits:
        from rocmflash.kernels.common import num_compute_units

        splits = KD.choose_num_splits(B, Hkv, capacity, cfg.BLOCK_N, num_compute_units(q.device),
                                      KD.programs_per_cu(cfg))
    splits = max(1, min(splits, -(-capacity // cfg.BLOCK_N)))
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if return_lse else None
    if out.numel():
        KD.launch(call, q, k_cache, v_cache, block_table if paged else seqlens, seqlens, cfg, splits, out, lse)
    return (out, lse) if return_lse else out


__all__ = ["flash_attn_with_kvcache", "decode_config", "clear_cache"]
