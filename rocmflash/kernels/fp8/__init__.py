"""The fp8 forward (inference only): the kernel and its launch (``forward``), the K-major V layout gfx942's
fp8 dots want (``vlayout``), and the per-device error word its descale checks raise (``errors``).
"""
