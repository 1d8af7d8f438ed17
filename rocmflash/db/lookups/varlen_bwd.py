"""The varlen backward's entry keys and run-time lookup (``varlen-bwd-...`` entries, written by
``rocmflash tune --mode varlen --pass bwd``, :mod:`rocmflash.tuning.varlen_bwd`): the varlen forward's rules
(:func:`rocmflash.db.lookups.varlen.nearest_entry`) over entries in the dense backward's format.
"""

from __future__ import annotations

import functools
from typing import Optional

from rocmflash.db.lookups.backward import entry_config
from rocmflash.db.lookups.varlen import VarlenMatch, nearest_entry, parse_varlen_key, varlen_key

#: key prefix of varlen backward entries in a config database
PREFIX = "varlen-bwd"


def varlen_bwd_key(head_dim: int, dtype, group: int, causal: bool, max_seqlen: int) -> str:
    """``varlen-bwd-d128-bf16-gqa4-causal-s4096``: the varlen forward's key pattern under ``varlen-bwd``."""
    return varlen_key(head_dim, dtype, group, causal, max_seqlen, prefix=PREFIX)


def parse_varlen_bwd_key(key: str) -> Optional[dict]:
    """Inverse of :func:`varlen_bwd_key` (None for any other key)."""
    return parse_varlen_key(key, prefix=PREFIX)


@functools.lru_cache(maxsize=1024)
def lookup_varlen_bwd(gpu_name: str, head_dim: int, dtype, group: int, causal: bool,
                      max_seqlen: int) -> Optional[VarlenMatch]:
    """The measured varlen backward entry nearest to this problem (its config a
    :class:`~rocmflash.kernels.backward.host.BwdConfig`), or None.

    Same rules as the forward's :func:`~rocmflash.db.lookups.varlen.lookup_varlen`: same head dim, dtype,
    GQA ratio and causal flag, nearest bucket of the longest key sequence (ties: the larger, then the
    user's file); entries not measured on a GPU are never served. Cached; :func:`clear_cache` forgets.
    """
    # entries have the dense backward's format ({"dkdv", "dq", "head_splits"}; the varlen kernels use no head splits)
    return nearest_entry(gpu_name, PREFIX, head_dim, dtype, group, causal, max_seqlen, entry_config)


def clear_cache() -> None:
    lookup_varlen_bwd.cache_clear()


__all__ = ["PREFIX", "varlen_bwd_key", "parse_varlen_bwd_key", "lookup_varlen_bwd", "clear_cache"]
