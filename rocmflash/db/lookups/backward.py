"""The backward's entry keys and run-time lookup (``bwd-...`` entries, written by ``rocmflash tune --pass bwd``,
:mod:`rocmflash.tuning.backward`).

At run time :func:`lookup_bwd` serves the measured entry of the same head dim, dtype, causal flag and GQA ratio
with the nearest sequence-length bucket; its ``head_splits`` is kept only in its own bucket (elsewhere it is
chosen per call).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Optional

from rocmflash.config import KernelConfig, normalize_dtype

#: key prefix of backward entries in a config database
PREFIX = "bwd"


def bwd_key(head_dim: int, dtype, causal: bool, group: int, seqlen: int) -> str:
    """``bwd-d128-bf16-causal-gqa1-s4096``: ``bwd-`` and the forward's key of the same problem."""
    from rocmflash.db import problem_key, seqlen_bucket

    return f"{PREFIX}-{problem_key(head_dim, dtype, causal, group, seqlen_bucket(seqlen))}"


def parse_bwd_key(key: str) -> Optional[dict]:
    """Inverse of :func:`bwd_key` (None for any other key)."""
    from rocmflash.db import parse_key

    if not key.startswith(PREFIX + "-"):
        return None
    try:
        return parse_key(key[len(PREFIX) + 1:])
    except (ValueError, IndexError):
        return None


class BwdMatch(NamedTuple):
    """The entry :func:`lookup_bwd` chose: its config, key, distance from the asked bucket, file."""

    config: object  #: rocmflash.kernels.backward.host.BwdConfig
    key: str
    bucket_distance: int
    path: str


def entry_config(entry: dict):
    """The :class:`~rocmflash.kernels.backward.host.BwdConfig` an entry stores (ValueError/TypeError if unreadable)."""
    from rocmflash.kernels.backward.host import BwdConfig

    best = entry["best"]
    return BwdConfig(KernelConfig.from_dict(best["dkdv"]), KernelConfig.from_dict(best["dq"]),
                     head_splits=int(best.get("head_splits", 0))).validate()


@functools.lru_cache(maxsize=1024)
def lookup_bwd(gpu_name: str, head_dim: int, dtype, causal: bool, group: int, seqlen: int) -> Optional[BwdMatch]:
    """The measured backward entry nearest to this problem (None: use the per-arch default).

    Same head dim, dtype, causal flag and GQA ratio; the nearest sequence-length bucket
    (ties: the larger, then the user's file before the shipped one). The entry's
    ``head_splits`` is kept only for its own bucket: elsewhere it is 0 (chosen per call),
    since a split that fills the GPU at one length floods it at another.
    """
    from rocmflash.db import iter_database_entries, seqlen_bucket, servable

    want = seqlen_bucket(seqlen).bit_length()
    best = None
    for order, path, key, entry in iter_database_entries(gpu_name):
        p = parse_bwd_key(key)
        if p is None or (p["head_dim"], p["dtype"], p["causal"], p["gqa_ratio"]) != (
                head_dim, normalize_dtype(dtype), bool(causal), group):
            continue
        if not servable(entry) or not entry.get("best"):
            continue
        distance = abs(p["seqlen_bucket"].bit_length() - want)
        rank = (distance, -p["seqlen_bucket"], order)
        if best is None or rank < best[0]:
            try:
                cfg = entry_config(entry)
            except (KeyError, TypeError, ValueError):
                continue
            if distance:
                cfg = dataclasses.replace(cfg, head_splits=0)
            best = (rank, BwdMatch(cfg, key, distance, path))
    return best[1] if best else None


def clear_cache() -> None:
    lookup_bwd.cache_clear()


__all__ = ["PREFIX", "bwd_key", "parse_bwd_key", "BwdMatch", "entry_config", "lookup_bwd", "clear_cache"]
