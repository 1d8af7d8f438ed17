"""KV-cache decode (``flash_attn_with_kvcache`` and every decode-shaped call).

* ``shape``: which calls are decode steps (no Triton import: the entry points ask it first);
* ``kernel``: the split-KV and combine ``@jit`` kernels;
* ``host``: the decode config, split choice and launch;
* ``append`` / ``quant``: appending new K/V rows to a 16-bit / fp8 cache;
* ``checks``: the error bits the kernels raise on values they will not use, and the per-device word they
  are ORed into (below every kernel module, so none of them imports another's host side).
"""
