"""The keys of decode entries and their run-time lookup (written by ``rocmflash tune --mode decode``,
:mod:`rocmflash.tuning.decode`).

Keys: ``decode-d{D}-{dtype}-gqa{G}-kv{bucket}-b{batch bucket}[-p{page size}][-kv{fp8 format}]``. At run time
:func:`lookup_decode` serves the measured entry of the same head dim, dtype, GQA ratio and cache format (and page
size) with the nearest KV-length bucket, then the nearest batch bucket.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from rocmflash.config import normalize_dtype
from rocmflash.db import key_dtype

#: key prefix of decode entries in a config database
PREFIX = "decode"


def _bucket(n: int) -> int:
    return 1 << (max(1, int(n)) - 1).bit_length()


def decode_key(head_dim: int, dtype, group: int, seqlen_k: int, batch: int, page_size: int = 0,
               kv_dtype: str = "") -> str:
    """``decode-d128-bf16-gqa8-kv8192-b32[-p256][-kvfp8e4m3fnuz]`` (``kv_dtype``: an fp8 cache's format name)."""
    key = f"{PREFIX}-d{int(head_dim)}-{normalize_dtype(dtype)}-gqa{int(group)}-kv{_bucket(seqlen_k)}-b{_bucket(batch)}"
    key += f"-p{int(page_size)}" if page_size else ""
    return key + (f"-kv{key_dtype(kv_dtype)}" if kv_dtype else "")


def parse_decode_key(key: str) -> Optional[dict]:
    """Inverse of :func:`decode_key` (with ``kv_dtype`` only for an fp8 cache); None for another key."""
    parts = key.split("-")
    kv_dtype = ""
    if len(parts) > 6 and parts[-1].startswith("kvfp8"):
        kv_dtype = parts.pop()[2:]
    if len(parts) not in (6, 7) or parts[0] != PREFIX:
        return None
    try:
        out = {"head_dim": int(parts[1][1:]), "dtype": parts[2], "group": int(parts[3][3:]),
               "kv_bucket": int(parts[4][2:]), "batch_bucket": int(parts[5][1:]),
               "page_size": int(parts[6][1:]) if len(parts) == 7 else 0}
    except ValueError:
        return None
    if kv_dtype:
        out["kv_dtype"] = kv_dtype
    return out


# ----------------------------------------------------------------------------- run-time lookup
@functools.lru_cache(maxsize=1024)
def lookup_decode(gpu_name: str, head_dim: int, dtype, group: int, seqlen_k: int, batch: int, page_size: int = 0,
                  kv_dtype: str = ""):
    """The measured decode entry nearest to this problem, as a DecodeConfig.

    ``kv_dtype``: an fp8 cache's format (a key name such as ``fp8e4m3fnuz``, or its torch dtype); "" (a
    16-bit cache) and each format see only their own entries.

    Nearest = fewest powers of two away in KV length and batch together (ties: the nearer KV
    bucket, then the user's file). The entry's split count is kept only for its own buckets;
    elsewhere ``num_splits`` is 0 (the per-call heuristic), since a split count that fills
    the GPU at one batch starves or floods it at another. Entries of another page size are
    used only when none of this page size exists. None when the GPU's databases hold no
    measured decode entry of this head dim, dtype and GQA ratio.
    """
    from rocmflash.db import iter_database_entries
    from rocmflash.kernels.decode.host import DecodeConfig

    def config(entry, distance):
        try:
            cfg = DecodeConfig.from_dict(entry["best"])
        except (TypeError, ValueError):
            return None
        # a split count fits the grid it was timed on only: elsewhere choose per call
        return dataclasses.replace(cfg, num_splits=0) if distance else cfg

    found = nearest_decode_entry(iter_database_entries(gpu_name), head_dim, dtype, group, seqlen_k, batch, page_size,
                                 kv_dtype, value=config)
    return found[3] if found else None


def nearest_decode_entry(rows, head_dim: int, dtype, group: int, seqlen_k: int, batch: int, page_size: int = 0,
                         kv_dtype: str = "", same_page_size: bool = False, value=None) -> Optional[tuple]:
    """``(distance, key, entry, value)`` of the servable decode entry among ``rows`` (``(order, path, key,
    entry)``, :func:`rocmflash.db.iter_database_entries`) nearest to this problem, or None: the rule of
    :func:`lookup_decode` (fewest powers of two away in KV length and batch together; ties: the nearer KV
    bucket, then the earlier file; another page size only when none of this one exists, never with
    ``same_page_size``). ``distance`` counts those powers of two. ``value(entry, distance)``: what the caller
    takes from an entry (None: unusable, the next nearest is tried); without it, the entry."""
    from rocmflash.db import servable

    want_kv, want_b = _bucket(seqlen_k).bit_length(), _bucket(batch).bit_length()
    want = (head_dim, normalize_dtype(dtype), group, key_dtype(kv_dtype) if kv_dtype else "")
    best = None
    for order, _path, key, entry in rows:
        p = parse_decode_key(key)
        if p is None or (p["head_dim"], p["dtype"], p["group"], p.get("kv_dtype", "")) != want:
            continue
        if same_page_size and p["page_size"] != page_size:
            continue
        if not isinstance(entry, dict) or not servable(entry) or not entry.get("best"):
            continue
        d_kv = abs(p["kv_bucket"].bit_length() - want_kv)
        d_b = abs(p["batch_bucket"].bit_length() - want_b)
        rank = (p["page_size"] != page_size, d_kv + d_b, d_kv, order)
        if best is None or rank < best[0]:
            taken = value(entry, d_kv + d_b) if value is not None else entry
            if taken is not None:
                best = (rank, key, entry, taken)
    return (best[0][1], best[1], best[2], best[3]) if best else None


def clear_cache() -> None:
    lookup_decode.cache_clear()


__all__ = ["PREFIX", "decode_key", "parse_decode_key", "lookup_decode", "nearest_decode_entry", "clear_cache"]
