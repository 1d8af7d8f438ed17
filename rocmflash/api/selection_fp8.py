"""Run-time config selection for fp8 inputs: the fp8 forward's measured entry of the inputs' own format.

``rocmflash tune --dtype fp8`` writes entries keyed by the GPU's fp8 format (``d128-fp8e4m3fnuz-...`` on
MI300X, ``d128-fp8e4m3fn-...`` on MI355X and H100: :func:`rocmflash.db.key_dtype`); fp8 q/k/v of that
format find them through the same lookup as 16-bit inputs (:mod:`rocmflash.api.selection`: measured
entries only, nearest sequence-length bucket), and inputs of another format or of 16 bits never do.
Choices are kept in :mod:`rocmflash.api.selection`'s caches (its ``clear_cache`` forgets them).
"""

from __future__ import annotations

from typing import Optional

from rocmflash.api.selection import (_FWD, _LAST_SOURCE, _bucket, _db_lookup, _describe, _interpreting, _log,
                                     device_identity, overridden)
from rocmflash.config import KernelConfig


def select_fp8_config(device, head_dim: int, dtype, causal: bool, gqa_ratio: int,
                      seqlen_k: int) -> Optional[KernelConfig]:
    """The fp8 forward's config for fp8 inputs of torch dtype ``dtype`` on ``device``: the nearest measured entry of
    that format (``rocmflash tune --dtype fp8``: same head dim, causal flag and GQA ratio, nearest bucket of the
    key length), or None (the caller uses the fp8 kernel's per-arch default). An entry whose config the fp8
    kernel cannot run (another variant, key blocks under 32) is not served. Cached per bucket; logged once.
    Under :meth:`rocmflash.api.select.Selector.override` of ``"fp8"``: the forced config."""
    forced = overridden("fp8")
    if forced is not None:
        return forced
    key = _key(device, head_dim, dtype, causal, gqa_ratio, seqlen_k)
    if key in _FWD:
        return _FWD[key]
    gpu_name, arch = device_identity(device)
    match = _db_lookup(gpu_name, int(head_dim), dtype, bool(causal), int(gqa_ratio), max(int(seqlen_k), 1), "online")
    cfg = match.config if match is not None else None
    if cfg is not None:
        from rocmflash.kernels.fp8.forward import check_config

        try:
            cfg = check_config(cfg)
        except ValueError:
            cfg, match = None, None
    details = _describe(match, gpu_name, arch, int(head_dim), dtype, bool(causal), int(gqa_ratio), int(seqlen_k),
                        cfg)
    _LAST_SOURCE[key] = details
    _log.info("rocmflash: fp8 %s", details["text"])
    _FWD[key] = cfg
    return cfg


def fp8_selection_details(device, head_dim, dtype, causal, gqa_ratio, seqlen_k) -> Optional[dict]:
    """For fp8 inputs already selected on ``device``: ``{"source": "db" | "default", "asked", "entry", ...}``
    (as :func:`selection_details`), else None."""
    return _LAST_SOURCE.get(_key(device, head_dim, dtype, causal, gqa_ratio, seqlen_k))


def _key(device, head_dim, dtype, causal, gqa_ratio, seqlen_k) -> tuple:
    """The cache key of a selection: ``device`` as the error words key it (``"cuda"`` is the current GPU's index,
    as a tensor's ``.device`` names it), so ``fp8_selection_details(torch.device("cuda"), ...)`` finds what a call
    on ``cuda:0`` chose."""
    from rocmflash.kernels.error_words import device_key

    device = device_key(device)
    return ("fp8", device.type, device.index, _interpreting(), int(head_dim), str(dtype), bool(causal),
            int(gqa_ratio), _bucket(seqlen_k))


__all__ = ["select_fp8_config", "fp8_selection_details"]
