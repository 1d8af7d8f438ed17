"""rocmflash: tune Triton FlashAttention kernels for AMD wave-64 GPUs from compiler truth.

``import rocmflash`` is cheap: the attention API (which imports torch and triton)
is loaded on first use of ``rocmflash.attention`` / ``rocmflash.flash_attn_func`` /
``rocmflash.flash_attn_varlen_func`` / ``rocmflash.flash_attn_with_kvcache`` / ``rocmflash.patch_sdpa``.
"""

__version__ = "0.1.0"

_LAZY = {"attention": "rocmflash.api", "flash_attn_func": "rocmflash.api",
         "flash_attn_varlen_func": "rocmflash.varlen", "flash_attn_with_kvcache": "rocmflash.decode",
         "patch_sdpa": "rocmflash.sdpa", "unpatch_sdpa": "rocmflash.sdpa"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups are plain attribute reads (no per-call import machinery)
        return value
    raise AttributeError(f"module 'rocmflash' has no attribute {name!r}")


__all__ = ["attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "patch_sdpa", "unpatch_sdpa", "__version__"]
