"""The decode config a call runs: the tuned database entry of its buckets, else the per-arch default (kept per
bucket). :mod:`rocmflash.api.decode` (``flash_attn_with_kvcache``) re-exports :func:`decode_config` and clears
the kept choices in its ``clear_cache``.
"""

from __future__ import annotations

from rocmflash.api import decode_fp8 as F8D
from rocmflash.api import selection as S
from rocmflash.kernels import common as C
from rocmflash.kernels.decode import host as KD


def decode_config(device, head_dim: int, dtype, group: int, max_seqlen_k: int, batch: int,
                  page_size: int = 0, kv_fp8: bool = False) -> "KD.DecodeConfig":
    """The decode config for this problem: the tuned database entry (``rocmflash tune --mode decode``) of the
    nearest KV-length and batch buckets, else the per-arch default. An fp8 cache (``kv_fp8``: its torch fp8
    dtype, or True) reads only the entries tuned for its format (``--kv-dtype fp8``: twice the keys per byte
    of a 16-bit cache's), else the per-arch fp8 default.

    Kept per bucket, not per length: the lookup reads the KV length and batch only through their
    next powers of two (``tuning.decode._bucket``), so a cache one key longer each call
    (transformers' generate) finds its config kept instead of looking it up anew every step.
    """
    if S._OVERRIDES and "decode" in S._OVERRIDES:  # rocmflash.api.select.Selector.override
        return S._OVERRIDES["decode"]
    key = (device, head_dim, dtype, group, C.next_pow2(max_seqlen_k), C.next_pow2(batch), page_size, kv_fp8)
    cfg = _DECODE_CONFIGS.get(key)
    if cfg is None:
        from rocmflash.db.lookups.decode import lookup_decode

        gpu_name, arch = S.device_identity(device)
        hit = None
        kv_format = F8D.kv_format(kv_fp8)
        if gpu_name is not None and kv_format is not None:
            hit = lookup_decode(gpu_name, int(head_dim), dtype, int(group), int(max_seqlen_k), int(batch),
                                int(page_size), kv_format)
        cfg = _DECODE_CONFIGS[key] = hit or KD.default_decode_config(arch, int(head_dim), bool(kv_fp8))
    return cfg


_DECODE_CONFIGS: dict = {}  #: per (device, problem) choice; cleared with :func:`clear_cache`


__all__ = ["decode_config"]
