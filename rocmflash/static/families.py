"""Kernel families the static phase compiles besides the forward variants (decode, backward, varlen and
the varlen backward).

A family names the module that builds its kernels and the source files whose contents
decide what they compile to (the compile cache key). Its module provides:

* ``compile_task(target, config: dict, problem: dict)`` -> tuple of Triton ``CompiledKernel``
  (main kernel first), built without tensors for any ``GPUTarget``;
* ``task_compile_options(config: dict, backend: str)`` -> the compile options a config
  passes to Triton on that backend (part of the cache key).

:func:`rocmflash.static.compile.sweep_family` observes a family's configs in the same process
pool and cache as the forward sweep; :mod:`rocmflash.static.prune` judges the observations.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import os
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    module: str
    sources: tuple  #: paths relative to the rocmflash package

    def _mod(self):
        return importlib.import_module(self.module)

    @functools.lru_cache(maxsize=None)
    def source_hash(self) -> str:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the rocmflash package
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


#: every family compiles through these (kernel helpers, the compile-only build, the launch path)
_SHARED = ("config.py", "kernels/common.py", "kernels/build.py", "kernels/launch.py")


def _package(family: str) -> tuple:
    """Every source file of ``kernels/<family>/`` (a family is one package: whatever its kernels import from it
    decides what they compile to), sorted, as paths relative to the rocmflash package."""
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels", family)
    return tuple(f"kernels/{family}/{name}" for name in sorted(os.listdir(here)) if name.endswith(".py"))


FAMILIES = {
    "decode": Family("decode", "rocmflash.tuning.decode",
                     _SHARED + ("kernels/masks.py",) + _package("decode") + ("tuning/decode.py",)),
    "backward": Family("backward", "rocmflash.tuning.backward",
                       _SHARED + _package("backward") + ("tuning/backward.py",)),
    "varlen": Family("varlen", "rocmflash.tuning.varlen",
                     _SHARED + ("kernels/masks.py",) + _package("varlen") + ("tuning/varlen.py",)),
    "varlen_bwd": Family("varlen_bwd", "rocmflash.tuning.varlen_bwd",
                         _SHARED + ("kernels/masks.py",) + _package("varlen") + ("tuning/varlen_bwd.py",)),
}


def get_family(name: str) -> Family:
    """The family called ``name``; ValueError listing the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"kernel family {name!r} is unknown; expected one of {sorted(FAMILIES)}") from None


# ----------------------------------------------------------------------------- static-phase rows
def family_rows(configs: list, observations: list, verdicts: list, key) -> list:
    """One row per config of a family's static phase, space order, with its static rank.

    Row: ``{"config", "kept", "reason", "detail", "static_rank", "kernel"}`` (``kernel``: the main
    kernel's summary). Kept rows are ranked 0, 1, ... by ``key(config, observation, index)``
    (smaller first; ``index`` is the position in ``configs``, a stable tie-break); pruned rows
    have ``static_rank`` None.
    """
    rows = [{"config": cfg, "kept": v.kept, "reason": v.reason, "detail": v.detail, "static_rank": None,
             "kernel": obs["kernels"][0] if obs.get("kernels") else {}}
            for cfg, obs, v in zip(configs, observations, verdicts)]
    kept = sorted((i for i, row in enumerate(rows) if row["kept"]),
                  key=lambda i: key(configs[i], observations[i], i))
    for rank, i in enumerate(kept):
        rows[i]["static_rank"] = rank
    return rows


@dataclasses.dataclass
class FamilyStatic:
    """A family's static phase for one problem: its rows (:func:`family_rows`) and the sweep's stats."""

    problem: object
    rows: list
    stats: object

    @property
    def ranked(self) -> list:
        """The kept rows, best static rank first."""
        return sorted((r for r in self.rows if r["kept"]), key=lambda r: r["static_rank"])

    @property
    def report_order(self) -> list:
        """Kept rows by rank, then the pruned ones (the order of ``vgpr-report``'s tables)."""
        return self.ranked + [r for r in self.rows if not r["kept"]]


@dataclasses.dataclass
class FamilyTuneResult:
    """What a one-GPU family tune (``--mode decode`` / ``--mode varlen``) did: its static phase, the entry
    it wrote under ``key`` in ``db_path``, and the live results (empty when not ``measured``)."""

    gpu: object
    problem: object
    static: FamilyStatic
    key: str
    entry: dict
    db_path: str
    measured: bool
    why_unmeasured: Optional[str]
    results: list
    seconds: float


__all__ = ["Family", "FAMILIES", "get_family", "family_rows", "FamilyStatic", "FamilyTuneResult"]


def timed_line(counts: dict) -> str:
    """The summary line of a family tune's live phase: ``timed N on the live GPU (ok, incorrect, failed)``."""
    failed = counts["failed"] + counts["timeout"] + counts["crashed"]
    return (f"timed {counts['timed']} on the live GPU ({counts['ok']} ok, {counts['incorrect']} incorrect, "
            f"{failed} failed)")
