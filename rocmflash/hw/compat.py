"""Which torch and Triton this rocmflash supports, checked before any kernel is built.

rocmflash never installs torch or Triton: ROCm PyTorch brings its own Triton as the
distribution ``pytorch-triton-rocm`` (CUDA PyTorch as ``triton``; nightlies as
``pytorch-triton``), all importing as ``triton``. So the package declares neither as a
dependency and instead checks, here, the versions the user already has.

The check reads installed distributions' metadata (no torch/Triton import, a few ms)
and runs when a part that builds kernels is first imported (``rocmflash.kernels``,
hence ``rocmflash.attention``, the tuner, the sweep). Outside the range it raises
:class:`UnsupportedVersionError` (an ``ImportError``) with a one-line message saying
what was found, what is supported and what to do. ``ROCMFLASH_SKIP_VERSION_CHECK=1``
turns the failure into a warning for users who want to try anyway.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import warnings
from dataclasses import dataclass
from typing import Optional

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: Triton releases rocmflash supports (ROCm PyTorch 2.8-2.13 ship pytorch-triton-rocm 3.4-3.8)
SUPPORTED_TRITON_RANGE = ">=3.4,<3.10"
#: torch releases rocmflash supports (custom ops with fake implementations; the Triton 3.4+ era)
SUPPORTED_TORCH_RANGE = ">=2.8"
SUPPORTED_TRITON = SpecifierSet(SUPPORTED_TRITON_RANGE)
SUPPORTED_TORCH = SpecifierSet(SUPPORTED_TORCH_RANGE)
#: the distributions that provide the ``triton`` module, in the order they are looked for
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-nightly")
SKIP_ENV = "ROCMFLASH_SKIP_VERSION_CHECK"


class UnsupportedVersionError(ImportError):
    """torch or Triton is missing, or its version is outside the supported range."""


@dataclass(frozen=True)
class Installed:
    """One installed package: the distribution that provides it and its version (None: missing)."""

    module: str
    distribution: Optional[str]
    version: Optional[str]

    @property
    def found(self) -> bool:
        return self.version is not None

    def describe(self) -> str:
        if not self.found:
            return f"{self.module} not installed"
        if self.distribution and self.distribution != self.module:
            return f"{self.module} {self.version} (from {self.distribution})"
        return f"{self.module} {self.version}"


def _distribution_version(name: str) -> Optional[str]:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def installed_triton() -> Installed:
    """Which distribution provides ``triton`` here, and its version."""
    for dist in TRITON_DISTRIBUTIONS:
        version = _distribution_version(dist)
        if version is not None:
            return Installed("triton", dist, version)
    return Installed("triton", None, _module_version("triton"))


def installed_torch() -> Installed:
    version = _distribution_version("torch")
    return Installed("torch", "torch" if version else None, version or _module_version("torch"))


def _module_version(module: str) -> Optional[str]:
    """``module.__version__`` for a module importable without distribution metadata (a source build)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return None
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # an import that fails is reported as missing
        return None


def in_range(version: Optional[str], spec: SpecifierSet) -> bool:
    """Whether ``version`` is in ``spec``; local labels (``+rocm6.4``, ``+git1a2b``) and pre-releases count."""
    if version is None:
        return False
    try:
        release = Version(version)
    except InvalidVersion:
        return False
    return spec.contains(Version(release.base_version), prereleases=True)


def version_problems(torch: Installed, triton: Installed) -> list[str]:
    """One sentence per problem with these installed versions (empty: supported)."""
    problems = []
    if not torch.found:
        problems.append("torch is not installed (install the PyTorch build for your GPU: ROCm, CUDA or CPU)")
    elif not in_range(torch.version, SUPPORTED_TORCH):
        problems.append(f"{torch.describe()} is outside the supported range torch{SUPPORTED_TORCH_RANGE}")
    if not triton.found:
        problems.append("triton is not installed (ROCm and CUDA PyTorch bring it; on a CPU-only box: "
                        "pip install triton)")
    elif not in_range(triton.version, SUPPORTED_TRITON):
        problems.append(f"{triton.describe()} is outside the supported range triton{SUPPORTED_TRITON_RANGE}")
    return problems


@functools.lru_cache(maxsize=1)
def _checked() -> tuple:
    return tuple(version_problems(installed_torch(), installed_triton()))


def require_supported_versions() -> None:
    """Raise :class:`UnsupportedVersionError` (one line) unless torch and Triton are supported.

    With ``ROCMFLASH_SKIP_VERSION_CHECK=1`` a problem is a warning instead.
    """
    problems = _checked()
    if not problems:
        return
    message = ("rocmflash: " + "; ".join(problems)
               + f". Supported: torch{SUPPORTED_TORCH_RANGE}, triton{SUPPORTED_TRITON_RANGE} (`rocmflash doctor` shows what "
                 f"is installed; {SKIP_ENV}=1 tries anyway)")
    if os.environ.get(SKIP_ENV, "0") not in ("", "0"):
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return
    raise UnsupportedVersionError(message)


__all__ = ["SUPPORTED_TORCH", "SUPPORTED_TRITON", "SUPPORTED_TORCH_RANGE", "SUPPORTED_TRITON_RANGE", "UnsupportedVersionError", "Installed", "installed_torch",
           "installed_triton", "in_range", "version_problems", "require_supported_versions"]
