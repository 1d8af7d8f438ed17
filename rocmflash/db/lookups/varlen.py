"""The varlen forward's entry keys and run-time lookup (``varlen-...`` entries, written by
``rocmflash tune --mode varlen``, :mod:`rocmflash.tuning.varlen`), and :func:`nearest_entry`, which the varlen
backward's lookup shares.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

from rocmflash.config import KernelConfig, normalize_dtype

#: key prefix of varlen entries in a config database
PREFIX = "varlen"


def _bucket(n: int) -> int:
    return 1 << (max(1, int(n)) - 1).bit_length()


def varlen_key(head_dim: int, dtype, group: int, causal: bool, max_seqlen: int, prefix: str = PREFIX) -> str:
    """``varlen-d128-bf16-gqa4-causal-s4096`` (no ``-causal`` for full attention); ``prefix`` names the
    kernels (``varlen-bwd`` for the backward's, :mod:`rocmflash.tuning.varlen_bwd`)."""
    causal_part = "-causal" if causal else ""
    return f"{prefix}-d{int(head_dim)}-{normalize_dtype(dtype)}-gqa{int(group)}{causal_part}-s{_bucket(max_seqlen)}"


def parse_varlen_key(key: str, prefix: str = PREFIX) -> Optional[dict]:
    """Inverse of :func:`varlen_key` for keys of ``prefix`` (None for any other key)."""
    if not key.startswith(prefix + "-"):
        return None
    parts = key[len(prefix) + 1:].split("-")
    if len(parts) not in (4, 5) or (len(parts) == 5 and parts[3] != "causal"):
        return None
    if not (parts[0].startswith("d") and parts[2].startswith("gqa") and parts[-1].startswith("s")):
        return None
    try:
        return {"head_dim": int(parts[0][1:]), "dtype": parts[1], "group": int(parts[2][3:]),
                "causal": len(parts) == 5, "bucket": int(parts[-1][1:])}
    except ValueError:
        return None


class VarlenMatch(NamedTuple):
    """The entry a varlen lookup chose: its config (a :class:`KernelConfig`; for the backward's
    :func:`~rocmflash.db.lookups.varlen_bwd.lookup_varlen_bwd` a ``BwdConfig``), key, distance from the
    asked bucket, file."""

    config: object
    key: str
    bucket_distance: int
    path: str


def nearest_entry(gpu_name: str, prefix: str, head_dim: int, dtype, group: int, causal: bool, max_seqlen: int,
                  read_config) -> Optional[VarlenMatch]:
    """The servable entry of ``prefix`` keys nearest to this problem, its config read by ``read_config(entry)``.

    Same head dim, dtype, GQA ratio and causal flag; the nearest bucket of the longest sequence in
    powers of two (ties: the larger, then the user's file). Entries not measured on a GPU, and
    entries ``read_config`` cannot read (TypeError/ValueError/KeyError), are skipped.
    """
    from rocmflash.db import iter_database_entries, servable

    want = _bucket(max_seqlen).bit_length()
    asked = (int(head_dim), normalize_dtype(dtype), int(group), bool(causal))
    best = None
    for order, path, key, entry in iter_database_entries(gpu_name):
        p = parse_varlen_key(key, prefix)
        if p is None or (p["head_dim"], p["dtype"], p["group"], p["causal"]) != asked:
            continue
        if not servable(entry) or not entry.get("best"):
            continue
        distance = abs(p["bucket"].bit_length() - want)
        rank = (distance, -p["bucket"], order)
        if best is None or rank < best[0]:
            try:
                cfg = read_config(entry)
            except (KeyError, TypeError, ValueError):  # an entry this rocmflash cannot read: skip it
                continue
            best = (rank, VarlenMatch(cfg, key, distance, path))
    return best[1] if best else None


@functools.lru_cache(maxsize=1024)
def lookup_varlen(gpu_name: str, head_dim: int, dtype, group: int, causal: bool,
                  max_seqlen: int) -> Optional[VarlenMatch]:
    """The measured varlen forward entry nearest to this problem, or None (then the dense choice serves).

    :func:`nearest_entry` over ``varlen-`` keys: same head dim, dtype, GQA ratio and causal flag;
    the nearest bucket of the longest sequence in powers of two (ties: the larger, then the user's
    file). Entries not measured on a GPU (static or interpreter-timed) are never served. Cached per
    argument tuple; :func:`clear_cache` forgets (a tune in this process calls it).
    """
    return nearest_entry(gpu_name, PREFIX, head_dim, dtype, group, causal, max_seqlen,
                         lambda entry: KernelConfig.from_dict(entry["best"]).validate())


def clear_cache() -> None:
    lookup_varlen.cache_clear()


__all__ = ["PREFIX", "_bucket", "varlen_key", "parse_varlen_key", "VarlenMatch", "nearest_entry", "lookup_varlen", "clear_cache"]
