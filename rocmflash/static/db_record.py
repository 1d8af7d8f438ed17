"""The builds behind a database entry: which configs it serves or keeps as alternatives, how each is compiled, and
where its static profile is recorded (:mod:`rocmflash.static.profile`).

One map, per family, from an entry to its :class:`Build` rows, used twice: at tune time (:func:`record_entry`,
from :meth:`rocmflash.tuning.items_base.TuneContext.store`) to write each config's profile and the entry's
compiler, and by ``rocmflash check-db`` (:mod:`rocmflash.static.check_db`) to compile the same configs again with
the installed Triton. Each build compiles the problem and config dicts the family's static phase compiled (same
compile-cache fingerprint), so recording after a tune's static phase, and a warm re-check, compile nothing.

Where a profile lives (every key added beside what the entry already holds; schema 2):

* forward, fp8 forward, varlen forward: ``entry["static_profile"]`` (the served ``best``), and
  ``"static_profile"`` in each ``near_best`` and ``ranked`` row;
* backward, varlen backward: ``entry["static_profile"] = {"dq": ..., "dkdv": ...}``, and ``"static_profile"``
  in each row of ``near_best["dq"]`` / ``near_best["dkdv"]``;
* decode: ``entry["static_profile"]``, and ``"static_profile"`` in each ``near_best`` row;
* every family: ``entry["compiler"]`` (:func:`~rocmflash.static.profile.compiler_identity`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

from rocmflash.db.entries import BWD, DECODE, FORWARD, VARLEN, VARLEN_BWD, family

#: the keys a stored alternative row may carry besides its config's own fields (dropped before it is compiled)
_ROW_EXTRAS = ("time_ms", "tflops", "head_splits", "static_profile")
#: the compile families of :mod:`rocmflash.static.families` (None: the forward sweep)
_COMPILE_FAMILY = {FORWARD: None, VARLEN: "varlen", BWD: "backward", VARLEN_BWD: "varlen_bwd", DECODE: "decode"}


@dataclasses.dataclass
class Build:
    """One config an entry serves or keeps: ``role`` (``best``, ``near_best``, ``ranked``; ``default`` for the
    arch default), ``kernel`` (``dq``/``dkdv`` of a backward, else None), its position among its role's rows,
    what to compile (``compile_family`` None: the forward sweep), and ``path``, where its profile is recorded
    (None: nowhere, e.g. the arch default)."""

    role: str
    kernel: Optional[str]
    index: int
    config: dict  #: the stored config as a reader takes it (a KernelConfig / DecodeConfig dict, extras dropped)
    compile_family: Optional[str]
    compile_config: dict
    problem: dict
    path: Optional[tuple]
    row: Optional[dict] = None  #: the stored row (near-best timings, head splits), when there is one

    @property
    def label(self) -> str:
        """``best``, ``near_best[1]``, ``best.dq``, ``ranked[3]``, ``default.dkdv``."""
        text = self.role if self.role in ("best", "default") else f"{self.role}[{self.index}]"
        return f"{text}.{self.kernel}" if self.kernel else text


class CannotCheck(ValueError):
    """Why an entry's builds cannot be rebuilt here (an unknown key family, a problem this rocmflash cannot read)."""


# ---------------------------------------------------------------------- the builds of an entry
def entry_builds(gpu, key: str, entry: dict, roles=("best", "near_best", "ranked")) -> list:
    """The :class:`Build` rows of one (usable, :func:`rocmflash.db.entries.check_entry`-checked) entry, served
    config first, then its alternatives in the order a fix tries them; :class:`CannotCheck` naming why not."""
    fam = family(key)
    if fam not in _COMPILE_FAMILY:
        raise CannotCheck(f"key {key!r} is of no family this rocmflash compiles")
    try:
        problem = _problem(gpu, fam, key, entry)
        builds = []
        if fam in (BWD, VARLEN_BWD):
            builds += _bwd_builds(fam, entry, problem, roles)
        else:
            builds += _single_builds(fam, entry, problem, roles)
    except CannotCheck:
        raise
    except (KeyError, TypeError, ValueError) as err:
        raise CannotCheck(f"its problem or configs cannot be read ({type(err).__name__}: {err})") from None
    return builds


def default_builds(gpu, key: str, entry: dict) -> list:
    """The arch default of the entry's family, as :class:`Build` rows (a backward: one per kernel): what run time
    serves without the entry, and what a fix falls back to."""
    fam = family(key)
    problem = _problem(gpu, fam, key, entry)
    if fam in (BWD, VARLEN_BWD):
        from rocmflash.kernels.backward.host import default_bwd_config

        cfg = default_bwd_config(gpu.arch, int(problem["head_dim"]))
        return [_kernel_build(fam, "default", kernel, 0, getattr(cfg, kernel).to_dict(), problem, None)
                for kernel in ("dq", "dkdv")]
    if fam == DECODE:
        from rocmflash.kernels.decode.host import default_decode_config

        cfg = default_decode_config(gpu.arch, problem["head_dim"], bool(problem.get("kv_dtype")))
        return [_single(fam, "default", 0, dataclasses.asdict(cfg), problem, None)]
    from rocmflash.config import FP8, default_config

    if fam == FORWARD and problem.get("dtype") == FP8:
        from rocmflash.kernels.fp8.forward import default_config as fp8_default

        cfg = fp8_default(gpu.arch, problem["head_dim"])
    else:
        cfg = default_config(gpu.arch, problem["head_dim"])
    return [_single(fam, "default", 0, cfg.to_dict(), problem, None)]


def _problem(gpu, fam: str, key: str, entry: dict) -> dict:
    """The compile-only problem dict the family's static phase built for this entry (its cache key)."""
    if fam == FORWARD:
        return _forward_problem(key, entry)
    if fam == BWD:
        from rocmflash.hw.roofline import Shape
        from rocmflash.tuning.spec import static_problem

        return dataclasses.replace(static_problem(Shape.from_dict(entry["problem"])), batch=1).to_dict()
    if fam == DECODE:
        from rocmflash.tuning.decode import DecodeProblem

        return DecodeProblem(**entry["problem"]).static_problem().to_dict()
    from rocmflash.tuning.varlen import VarlenProblem  # VARLEN, VARLEN_BWD

    return VarlenProblem.from_dict(entry["problem"]).compile_dict()


def _forward_problem(key: str, entry: dict) -> dict:
    """A forward entry's static problem (:func:`rocmflash.tuning.spec.static_problem` of its ``shape``); an entry
    without a shape: the key's head dim, dtype, causal flag and GQA ratio at the default head count."""
    from rocmflash.config import FP8, Problem
    from rocmflash.db import parse_key
    from rocmflash.hw.roofline import Shape
    from rocmflash.tuning.spec import static_problem

    if isinstance(entry.get("shape"), dict):
        return static_problem(Shape.from_dict(entry["shape"])).to_dict()
    p = parse_key(key)
    dtype = FP8 if p["dtype"].startswith("fp8") else p["dtype"]
    return Problem(head_dim=p["head_dim"], dtype=dtype, causal=p["causal"], heads_q=16 * p["gqa_ratio"],
                   heads_kv=16).to_dict()


def _single_builds(fam: str, entry: dict, problem: dict, roles) -> list:
    """Forward, varlen forward and decode: ``best``, then ``near_best`` (time order), then ``ranked`` (static
    order; the served config's own row left out)."""
    builds = [_single(fam, "best", 0, entry["best"], problem, ("static_profile",))] if "best" in roles else []
    for role in ("near_best", "ranked"):
        rows = entry.get(role)
        if role not in roles or not isinstance(rows, list):
            continue
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                continue
            cfg = row.get("config") if fam != DECODE else {k: v for k, v in row.items() if k not in _ROW_EXTRAS}
            if not isinstance(cfg, dict):
                continue
            builds.append(_single(fam, role, i, cfg, problem, (role, i, "static_profile"), row))
    return builds


def _single(fam: str, role: str, index: int, cfg: dict, problem: dict, path, row=None) -> Build:
    if fam == DECODE:
        from rocmflash.kernels.decode.host import DecodeConfig

        config = DecodeConfig.from_dict(cfg).to_dict()
        compile_config = dict(config, num_splits=0)  # a launch argument: the static phase compiles every config at 0
    else:
        from rocmflash.config import KernelConfig

        config = compile_config = KernelConfig.from_dict({k: v for k, v in cfg.items()
                                                          if k not in _ROW_EXTRAS}).to_dict()
    return Build(role, None, index, config, _COMPILE_FAMILY[fam], compile_config, problem, path, row)


def _bwd_builds(fam: str, entry: dict, problem: dict, roles) -> list:
    """Backward and varlen backward: each kernel's ``best``, then its ``near_best`` rows (time order)."""
    builds = []
    best = entry["best"]
    for kernel in ("dq", "dkdv"):
        if "best" in roles:
            builds.append(_kernel_build(fam, "best", kernel, 0, best[kernel], problem, ("static_profile", kernel)))
        rows = (entry.get("near_best") or {}).get(kernel) if isinstance(entry.get("near_best"), dict) else None
        if "near_best" not in roles or not isinstance(rows, list):
            continue
        for i, row in enumerate(rows):
            if isinstance(row, dict):
                cfg = {k: v for k, v in row.items() if k not in _ROW_EXTRAS}
                builds.append(_kernel_build(fam, "near_best", kernel, i, cfg, problem,
                                            ("near_best", kernel, i, "static_profile"), row))
    return builds


def _kernel_build(fam: str, role: str, kernel: str, index: int, cfg: dict, problem: dict, path, row=None) -> Build:
    from rocmflash.config import KernelConfig
    from rocmflash.kernels.backward.host import space_point

    config = KernelConfig.from_dict(cfg).to_dict()
    return Build(role, kernel, index, config, _COMPILE_FAMILY[fam], space_point(kernel, KernelConfig.from_dict(cfg)),
                 problem, path, row)


# ---------------------------------------------------------------------- compiling them
def observe_builds(gpu, builds: list, cache_dir: Optional[str] = None, workers: Optional[int] = None,
                   timeout_s: Optional[float] = None) -> tuple:
    """``(observations, stats)``: one observation per build (same order), from the compile cache or compiled in the
    static phase's process pool, one sweep per (family, problem); ``stats``: ``{"configs", "compiled",
    "cache_hits", "seconds"}`` summed over the sweeps."""
    from rocmflash.config import KernelConfig, Problem
    from rocmflash.static.compile import DEFAULT_TIMEOUT_S, sweep, sweep_family

    groups: dict = {}
    for i, b in enumerate(builds):
        groups.setdefault((b.compile_family, json.dumps(b.problem, sort_keys=True)), []).append(i)
    out: list = [None] * len(builds)
    stats = {"configs": 0, "compiled": 0, "cache_hits": 0, "seconds": 0.0}
    for (fam, _), indices in groups.items():
        seen: dict = {}  # one compile per distinct config of a group
        for i in indices:
            seen.setdefault(json.dumps(builds[i].compile_config, sort_keys=True), i)
        firsts = list(seen.values())
        problem = builds[indices[0]].problem
        kwargs = {"cache_dir": cache_dir, "workers": workers, "timeout_s": timeout_s or DEFAULT_TIMEOUT_S}
        if fam is None:
            obs, st = sweep([KernelConfig.from_dict(builds[i].compile_config) for i in firsts],
                            Problem.from_dict(problem), gpu, **kwargs)
        else:
            obs, st = sweep_family(fam, [builds[i].compile_config for i in firsts], problem, gpu, **kwargs)
        by_config = {json.dumps(builds[i].compile_config, sort_keys=True): o for i, o in zip(firsts, obs)}
        for i in indices:
            out[i] = by_config[json.dumps(builds[i].compile_config, sort_keys=True)]
        stats["configs"] += st.configs
        stats["compiled"] += st.compiled
        stats["cache_hits"] += st.cache_hits
        stats["seconds"] += st.seconds
    return out, stats


# ---------------------------------------------------------------------- the record in an entry
def get_path(entry: dict, path: tuple):
    """The value at ``path`` (keys and list indices) in ``entry``, or None where any step is missing."""
    node = entry
    for step in path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def set_path(entry: dict, path: tuple, value) -> None:
    """Set the value at ``path`` in ``entry``, making the objects of a missing ``static_profile`` on the way."""
    node = entry
    for step in path[:-1]:
        if isinstance(node, dict) and step not in node:
            node[step] = {}
        node = node[step]
    node[path[-1]] = value


def recorded_profile(entry: dict, build: Build) -> Optional[dict]:
    """The profile the entry records for ``build`` (None: schema 1, or a row written before the record)."""
    if build.path is None:
        return None
    profile = get_path(entry, build.path)
    return profile if isinstance(profile, dict) else None


def write_record(entry: dict, builds: list, observations: list, compiler: dict) -> None:
    """Record each build's profile (:func:`~rocmflash.static.profile.static_profile`) at its path in ``entry``
    (the stored entry, in place) and the compiler that produced them as ``entry["compiler"]``."""
    from rocmflash.static.profile import static_profile

    for build, obs in zip(builds, observations):
        if build.path is not None and obs is not None:
            set_path(entry, build.path, static_profile(obs))
    entry["compiler"] = dict(compiler)  # no time of its own: the same tune re-run writes the same entry


def cached_observations(gpu, builds: list, cache_dir: Optional[str] = None) -> list:
    """The compile cache's observation of each build (None where it holds none); compiles nothing."""
    from rocmflash.config import KernelConfig, Problem
    from rocmflash.static.compile import ObservationCache, default_cache_dir, family_fingerprint, fingerprint
    from rocmflash.static.families import get_family

    cache = ObservationCache(cache_dir or default_cache_dir())
    out = []
    for b in builds:
        if b.compile_family is None:
            key = fingerprint(KernelConfig.from_dict(b.compile_config), Problem.from_dict(b.problem), gpu)
        else:
            key = family_fingerprint(get_family(b.compile_family), b.compile_config, b.problem, gpu)
        out.append(cache.get(key))
    return out


def record_entry(gpu, key: str, entry: dict, cache_dir: Optional[str] = None) -> bool:
    """At tune time: write the record into ``entry`` (in place) from the compile cache the tune's static phase
    filled; True when it wrote one. Nothing is compiled here: a config the cache does not hold (not compiled by
    this static phase) gets no profile, and an entry with none (no known family, no config, unreadable builds)
    is left as it is. The record is evidence; a tune never waits or fails for it."""
    from rocmflash.db.entries import Malformed, check_entry
    from rocmflash.static.profile import compiler_identity

    try:
        usable = check_entry(key, entry)
    except Malformed:
        return False
    if usable is None or family(key) is None:
        return False
    try:
        builds = entry_builds(gpu, key, usable)
    except CannotCheck:
        return False
    observations = cached_observations(gpu, builds, cache_dir)
    if not any(o is not None for o in observations):
        return False
    write_record(entry, builds, observations, compiler_identity(gpu.triton_target().backend))
    return True


__all__ = ["Build", "CannotCheck", "entry_builds", "default_builds", "observe_builds", "get_path", "set_path",
           "recorded_profile", "write_record", "cached_observations", "record_entry"]
