"""The kernels, one package per family: ``forward`` (one module per accumulator-lifetime variant), ``fp8``,
``backward``, ``decode`` and ``varlen``; beside them the helpers every family shares (``common``, ``masks``,
``build`` for compile-only builds, ``launch`` for kept launch plans, ``error_words``).

Each forward variant's module (:func:`get_variant`) exposes ``launch(q, k, v, cfg, causal, sm_scale, out=None, lse=None)``
returning ``(out, lse)`` and ``compile_for(target, cfg, problem)`` returning a tuple of
Triton ``CompiledKernel`` objects, main kernel first (``split_kv`` also returns its
combine kernel second). ``KERNELS`` in each module names the kernels in that order.
"""

from __future__ import annotations

import importlib

from rocmflash.hw.compat import require_supported_versions

require_supported_versions()  # before any Triton import: an unsupported Triton fails here, in one line

from rocmflash.config import VARIANTS  # noqa: E402

_MODULES = {name: f"rocmflash.kernels.forward.{name}" for name in VARIANTS}


_LOADED: dict = {}


def get_variant(name: str):
    """The kernel module of a variant (``online``, ``split_kv``, ``two_phase``, ``split_d``)."""
    module = _LOADED.get(name)
    if module is None:
        if name not in _MODULES:
            raise ValueError(f"variant={name!r} is unknown; expected one of {tuple(_MODULES)}")
        module = _LOADED[name] = importlib.import_module(_MODULES[name])
    return module


def registry() -> dict:
    """``{variant name: kernel module}`` for every variant (imports all of them)."""
    return {name: get_variant(name) for name in _MODULES}


__all__ = ["get_variant", "registry", "VARIANTS"]
