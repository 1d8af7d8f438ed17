"""The forward kernels: one module per accumulator-lifetime variant (``online``, ``split_kv``, ``two_phase``,
``split_d``), each with its ``@jit`` kernel, its host ``launch`` and its compile-only ``compile_for``.

:func:`rocmflash.kernels.get_variant` loads one by name; the config space the tuner sweeps is
:mod:`rocmflash.space`, the per-arch defaults :mod:`rocmflash.config`.
"""
