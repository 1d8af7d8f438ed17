"""Variable-length (packed) attention, ``flash_attn_varlen_func``: the ``@jit`` kernels (``kernel``), their
host side (``host``: forward and backward launch, compile-only builds) and the device-side checks of
``cu_seqlens`` (``checks``).
"""
