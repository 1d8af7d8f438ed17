"""The fp8 KV cache of ``flash_attn_with_kvcache``: its argument checks (host side, metadata only).

An fp8 cache (``k_cache``/``v_cache`` of one of torch's fp8 dtypes, the format of the arch: FNUZ on
gfx942, OCP on gfx950 and NVIDIA sm_89+, none on gfx90a -- :mod:`rocmflash.api.fp8`) holds
``k / k_descale[b, h]`` and ``v / v_descale[b, h]``; ``q`` and new ``k``/``v`` stay bf16/fp16.
The kernels are :mod:`rocmflash.kernels.decode.host` (reads, dequantising in registers) and
:mod:`rocmflash.kernels.decode.quant` (the quantising append).

Scale *values* are not read here: on the default path the kernels check them (finite and > 0)
and report through the decode error word; ``check_values=True`` checks them on the host
(:func:`descale_flags`, :func:`raise_bad_descale`), with the others, before anything runs.
"""

from __future__ import annotations

import torch

from rocmflash.api import fp8 as F8A
from rocmflash.hw import fp8 as F8


def check_caches(q, k_cache, v_cache, layout: str) -> bool:
    """Whether the caches are fp8 (checked: 4-D, one fp8 dtype for both, on q's device); False leaves
    a 16-bit cache's checks to the caller. Raises ``TypeError``/``ValueError`` naming the argument."""
    if not (isinstance(k_cache, torch.Tensor) and F8.is_fp8(k_cache.dtype)) and not (
            isinstance(v_cache, torch.Tensor) and F8.is_fp8(v_cache.dtype)):
        return False
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all must share a device")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache and v_cache must share one dtype (an fp8 cache is both fp8), got {k_cache.dtype} "
                        f"and {v_cache.dtype}")
    return True


def check_descales(fp8: bool, q, batch: int, kv_heads: int, k_descale, v_descale) -> None:
    """An fp8 cache needs fp32 ``(batch, kv_heads)`` ``k_descale`` and ``v_descale`` on q's device (any strides;
    :func:`rocmflash.api.fp8.check_descale`, the fp8 forward's check too); a 16-bit cache takes neither.
    ``ValueError``/``TypeError`` naming the argument otherwise. Values (finite and > 0: the cache holds
    ``k / k_descale``) are the kernels' to check, or :func:`descale_flags`' with ``check_values=True``."""
    for name, d in (("k_descale", k_descale), ("v_descale", v_descale)):
        if fp8:
            F8A.check_descale(name, d, batch, kv_heads, q.device, "an fp8 cache (it holds k / k_descale)")
        elif d is not None:
            raise TypeError(f"{name} applies to an fp8 cache only; k_cache is {q.dtype} (pass {name}=None)")


def check_arch(device, dtype) -> None:
    """One-line ``TypeError`` unless ``device``'s arch computes in fp8 ``dtype``'s family (unknown arch, e.g.
    the CPU interpreter without a GPU: every fp8 dtype runs)."""
    from rocmflash.api.selection import device_identity

    F8.check_format(dtype, device_identity(device)[1], "k_cache")


def descale_flags(k_descale, v_descale) -> tuple:
    """``(bad_k, bad_v)`` bool ``(B, Hkv)`` device tensors: the scales that are not finite and > 0."""
    return tuple(~(torch.isfinite(d) & (d > 0)) for d in (k_descale, v_descale))


def raise_bad_descale(bad_k, bad_v, k_descale, v_descale) -> None:
    """The host check's message (``check_values=True``): the first bad scale, its index and value."""
    for name, bad, d in (("k_descale", bad_k, k_descale), ("v_descale", bad_v, v_descale)):
        if bool(bad.any()):
            b, h = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"{name}[{b}, {h}] = {float(d[b, h])}: descales must be finite and > 0 (the cache holds "
                             f"k / k_descale); nothing was written to the cache")


def kv_format(kv_fp8):
    """The cache format a decode entry is looked up under (:func:`rocmflash.db.lookups.decode.lookup_decode`): ""
    for a 16-bit cache (``kv_fp8`` False), the database name of an fp8 cache's torch dtype (``fp8e4m3fnuz``,
    ``fp8e4m3fn``, ...: the key of an entry tuned with ``--kv-dtype fp8`` on that GPU), None when the
    format is not known (``kv_fp8`` True: no entry is looked up)."""
    if kv_fp8 is False or kv_fp8 is None:
        return ""
    if not F8.is_fp8(kv_fp8):
        return None
    from rocmflash.db import key_dtype

    return key_dtype(kv_fp8)


__all__ = ["check_caches", "check_descales", "check_arch", "descale_flags", "raise_bad_descale", "kv_format"]
