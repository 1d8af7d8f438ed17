"""The fp8 KV cache of a decode tune (``rocmflash tune --mode decode --kv-dtype fp8``): the cache format names,
their resolution per GPU, and the worker's fp8 caches.

``--kv-dtype`` takes vLLM's ``kv_cache_dtype`` names: ``auto`` (the cache is q's dtype), ``fp8`` and
``fp8_e4m3`` (the GPU's e4m3: FNUZ ``float8_e4m3fnuz`` on gfx942, OCP ``float8_e4m3fn`` on gfx950 and
sm_89+), ``fp8_e5m2`` (its e5m2). A problem keeps the resolved format's database name
(:data:`rocmflash.db.FP8_KEY_DTYPES`: ``fp8e4m3fnuz``, ...), which its entry key ends with.

The worker's fp8 caches hold values spread over the format's range with fp32 ``(B, Hkv)`` descales
(:func:`rocmflash.tuning.live_fp8.fill`, :func:`~rocmflash.tuning.live_fp8.descales`: dequantised
``N(0, s^2)``, ``s`` in [0.5, 1.5] per (sequence, kv head)); the gate's reference reads the cache
dequantised (:func:`dequantised`).
"""

from __future__ import annotations

from rocmflash.db import FP8_KEY_DTYPES, key_dtype

#: ``--kv-dtype`` names that mean "the GPU's fp8 format" (vLLM's ``kv_cache_dtype``): its e4m3 or e5m2
KV_FP8_NAMES = {"fp8": 0, "fp8_e4m3": 0, "fp8_e5m2": 1}


def kv_name(kv_dtype) -> str:
    """A cache format as :attr:`DecodeProblem.kv_dtype` keeps it: "" (``auto``/None), a ``--kv-dtype`` fp8 name,
    or an fp8 format's key name (from a torch fp8 dtype or its name); ``ValueError`` naming the choices."""
    text = str(kv_dtype or "").strip().lower()
    if text in ("", "auto"):
        return ""
    if text in KV_FP8_NAMES:
        return text
    try:
        name = key_dtype(text)
    except ValueError:
        name = ""
    if name not in FP8_KEY_DTYPES.values():
        raise ValueError(f"--kv-dtype {kv_dtype!r} is unsupported; expected auto, fp8, fp8_e4m3 or fp8_e5m2 (or an "
                         f"fp8 format: {', '.join(FP8_KEY_DTYPES)})")
    return name


def kv_format(kv_dtype, gpu) -> str:
    """The cache format key name of ``kv_dtype`` on ``gpu``: "" for a 16-bit cache, ``fp8``/``fp8_e4m3`` -> the
    e4m3 of the GPU's fp8 family (``fp8e4m3fnuz`` on gfx942, ``fp8e4m3fn`` on gfx950/sm_89+), ``fp8_e5m2`` -> its
    e5m2; a named format is kept. ``ValueError`` (one line, naming the arch) where there is no fp8, or the
    format is the other family's."""
    from rocmflash.hw.fp8 import FAMILY_DTYPES, check_format, fp8_family

    name = kv_name(kv_dtype)
    if not name:
        return ""
    family = fp8_family(gpu.arch)
    if family is None:
        raise ValueError(f"--kv-dtype {kv_dtype}: {gpu.name} ({gpu.arch}) has no fp8 matrix instructions; an fp8 KV "
                         f"cache needs gfx942 (FNUZ), gfx950 or sm_89+ (OCP); use --kv-dtype auto on {gpu.arch}")
    if name in KV_FP8_NAMES:
        return key_dtype(FAMILY_DTYPES[family][KV_FP8_NAMES[name]])
    torch_name = next(t for t, k in FP8_KEY_DTYPES.items() if k == name)
    try:
        import torch

        check_format(getattr(torch, torch_name), gpu.arch, "k_cache")
    except TypeError as err:
        raise ValueError(f"--kv-dtype {kv_dtype}: {err}") from None
    return name


def fp8_caches(shape: tuple, batch: int, heads_kv: int, dtype, device, generator=None) -> tuple:
    """``(k_cache, v_cache, k_descale, v_descale)``: two fp8 caches of ``shape`` in ``dtype`` and their
    fp32 ``(batch, heads_kv)`` descales (see the module docstring)."""
    import torch

    from rocmflash.tuning.live_fp8 import descales, fill

    k, v = (fill(torch.empty(shape, device=device, dtype=dtype), generator) for _ in range(2))
    ks, vs, _ = descales(batch, heads_kv, dtype, device, generator)
    return k, v, ks, vs


def dequantised(rows, descale):
    """fp32 values of one sequence's cache rows ``(L, Hkv, D)`` (fp8) with its ``(Hkv,)`` descales."""
    return rows.float() * descale[None, :, None]


__all__ = ["KV_FP8_NAMES", "kv_name", "kv_format", "fp8_caches", "dequantised"]
