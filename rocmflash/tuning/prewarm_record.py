"""Which pre-warms already filled a Triton cache, so that a warm re-tune does not wait for them again.

A pre-warm builds a config's binary for the live GPU in a spawned process (its one launch at a tiny shape
fills Triton's on-disk cache, so the timing worker only loads it). On a re-tune with the same cache every
build is already there, yet the pre-warm processes still had to start -- import torch, open the device --
before the first config could be timed: 5-8 s at the start of a warm tune, and their device contexts' teardown
at its end (docs/evidence/scale-gpus-2026-11-26e-h200x2.md).

So each pre-warmed build leaves an empty marker file in ``<triton cache>/rocmflash-prewarmed/``, named by a
digest of what decides the binary: the device's name, the torch/Triton/rocmflash versions, a digest of the
kernel sources, the family, and the config with the shape or task. A build whose marker is there is not
pre-warmed again. Clearing the Triton cache clears the markers with it; a marker whose binary is gone anyway
costs only speed (the timing worker compiles it, as it would without any pre-warm), never a result.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Iterable, Optional

MARKERS = "rocmflash-prewarmed"


def triton_cache_root(triton_cache_dir: Optional[str]) -> str:
    """The Triton cache a worker uses: the runner's ``triton_cache_dir``, else ``TRITON_CACHE_DIR``, else
    Triton's documented default ``$TRITON_HOME/.triton/cache`` (``TRITON_HOME`` defaulting to the home folder)."""
    if triton_cache_dir:
        return triton_cache_dir
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    return os.path.join(os.environ.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache")


def has_markers(triton_cache_dir: Optional[str]) -> bool:
    """Whether this cache was pre-warmed before (a re-tune): then the pre-warm workers start at their first
    build instead of with the tune. Reads one folder, imports nothing (callable before torch is imported)."""
    try:
        with os.scandir(os.path.join(triton_cache_root(triton_cache_dir), MARKERS)) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _sources_digest() -> str:
    """A digest of the kernel sources (a kernel edited without a version bump builds another binary)."""
    import rocmflash.kernels as kernels

    h = hashlib.sha256()
    folder = os.path.dirname(kernels.__file__)
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _versions() -> tuple:
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "-"

    import rocmflash

    triton = next((v for v in (version(d) for d in ("triton", "pytorch-triton-rocm", "pytorch-triton")) if v != "-"),
                  "-")
    return version("torch"), triton, getattr(rocmflash, "__version__", "-"), _sources_digest()


class PrewarmRecord:
    """The markers of one Triton cache for one device (:func:`open_record`)."""

    def __init__(self, folder: str, device: str):
        self.folder, self.device = folder, device

    def digest(self, family: str, what) -> str:
        """The marker name of a build: ``family`` (``fwd``, or the task function's name) and ``what`` (the config
        and shape, or the task: anything JSON can write, others by their ``repr``)."""
        blob = json.dumps([self.device, _versions(), family, what], sort_keys=True, default=repr)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def has(self, digest: str) -> bool:
        return os.path.exists(os.path.join(self.folder, digest))

    def add(self, digests: Iterable[str]) -> None:
        """Mark these builds pre-warmed (a marker that cannot be written only costs a pre-warm next time)."""
        try:
            os.makedirs(self.folder, exist_ok=True)
            for d in digests:
                with open(os.path.join(self.folder, d), "a"):
                    pass
        except OSError:
            pass


def open_record(triton_cache_dir: Optional[str], device: Optional[str]) -> Optional[PrewarmRecord]:
    """The record of builds pre-warmed for ``device`` in this cache, or None without a device name (no live GPU,
    or the interpreter: nothing to record)."""
    if not device:
        return None
    return PrewarmRecord(os.path.join(triton_cache_root(triton_cache_dir), MARKERS), str(device))


__all__ = ["MARKERS", "PrewarmRecord", "open_record", "has_markers", "triton_cache_root"]
