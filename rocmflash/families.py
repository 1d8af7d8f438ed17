"""Kernel families the static phase compiles besides the forward variants (decode, backward, varlen).

A family names the module that builds its kernels and the source files whose contents
decide what they compile to (the compile cache key). Its module provides:

* ``compile_task(target, config: dict, problem: dict)`` -> tuple of Triton ``CompiledKernel``
  (main kernel first), built without tensors for any ``GPUTarget``;
* ``task_compile_options(config: dict, backend: str)`` -> the compile options a config
  passes to Triton on that backend (part of the cache key).

:func:`rocmflash.compile.sweep_family` observes a family's configs in the same process
pool and cache as the forward sweep; :mod:`rocmflash.prune` judges the observations.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import os


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    module: str
    sources: tuple  #: paths relative to the rocmflash package

    def _mod(self):
        return importlib.import_module(self.module)

    @functools.lru_cache(maxsize=None)
    def source_hash(self) -> str:
        here = os.path.dirname(os.path.abspath(__file__))
        digest = hashlib.sha256()
        for name in self.sources:
            digest.update(name.encode())
            with open(os.path.join(here, name), "rb") as f:
                digest.update(f.read())
        return digest.hexdigest()

    def compile_options(self, config: dict, backend: str) -> dict:
        return self._mod().task_compile_options(config, backend)

    def compile_task(self, target, config: dict, problem: dict):
        return self._mod().compile_task(target, config, problem)


FAMILIES = {
    "decode": Family("decode", "rocmflash.tuning.decode",
                     ("config.py", "kernels/common.py", "kernels/masks.py", "kernels/kv_decode.py", "tuning/decode.py")),
    "backward": Family("backward", "rocmflash.tuning.backward",
                       ("config.py", "kernels/common.py", "kernels/backward.py", "tuning/backward.py")),
    "varlen": Family("varlen", "rocmflash.tuning.varlen",
                     ("config.py", "kernels/common.py", "kernels/masks.py", "kernels/varlen.py", "tuning/varlen.py")),
}


def get_family(name: str) -> Family:
    """The family called ``name``; ValueError listing the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"kernel family {name!r} is unknown; expected one of {sorted(FAMILIES)}") from None


__all__ = ["Family", "FAMILIES", "get_family"]
