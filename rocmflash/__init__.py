"""rocmflash: tune Triton FlashAttention kernels for AMD wave-64 GPUs from compiler truth.

``import rocmflash`` is cheap: the attention API (which imports torch and triton)
is loaded on first use of ``rocmflash.attention`` / ``rocmflash.flash_attn_func``.
"""

__version__ = "0.1.0"

_LAZY_API = {"attention", "flash_attn_func"}


def __getattr__(name):
    if name in _LAZY_API:
        from rocmflash import api

        return getattr(api, name)
    raise AttributeError(f"module 'rocmflash' has no attribute {name!r}")


__all__ = ["attention", "flash_attn_func", "__version__"]
