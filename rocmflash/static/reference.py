"""AMD-published attention configs with provenance (``rocmflash/reference/amd_published.json``).

Each entry of the data file is one config that AMD (or an AMD-maintained project) ships
for a Triton attention kernel: the repository, file and commit it was read at, where in
the file it sits, the arch it serves, the problem scope it is selected for, the config
as the source spells it, and the nearest rocmflash config (forward: a
:class:`~rocmflash.config.KernelConfig`, normally the ``online`` FA2 variant; backward:
the ``dkdv`` and ``dq`` KernelConfigs of rocmflash's two-kernel backward, ``dq`` null when
the source's kernel has no separate dQ tile).

:func:`load` reads and validates the file (a bad file raises :class:`ReferenceFileError`
naming the entry and the field), :func:`select` filters by GPU name, arch, pass and
problem. This module imports neither torch nor Triton.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Iterable, Mapping, Optional

from rocmflash.config import KernelConfig, Problem, normalize_dtype

FORMAT = "rocmflash-amd-reference"
SCHEMA_VERSION = 1
PASSES = ("fwd", "bwd")
ROLES = ("default", "autotune_candidate", "fallback", "alternative")
ARCHS = ("gfx90a", "gfx942", "gfx950")
DTYPES = ("fp16", "bf16", "fp32")
#: package data at ``rocmflash/reference/`` (this module lives in ``rocmflash/static/``)
DEFAULT_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference",
                            "amd_published.json")

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_ENTRY_KEYS = {"id", "source", "gpu", "arch", "pass", "role", "kernel", "problem", "config", "rocmflash_config",
               "notes"}
_SOURCE_KEYS = {"repo", "path", "commit", "key"}
_SOURCE_OPTIONAL = {"last_changed", "previous_path", "branch"}
_PROBLEM_KEYS = {"head_dim", "head_dim_range", "causal", "dtypes", "when"}


class ReferenceFileError(ValueError):
    """The reference file is missing, not JSON, or an entry breaks the schema (the message names it)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a config was read: ``repo`` (owner/name), ``path``, ``commit`` (40 hex) and ``key`` inside the file."""

    repo: str
    path: str
    commit: str
    key: str
    last_changed: Optional[str] = None  #: the last commit that changed the file, when known
    previous_path: Optional[str] = None  #: the file's earlier name, when it was renamed
    branch: Optional[str] = None

    @property
    def url(self) -> str:
        """A permalink to the file at the commit read (GitHub)."""
        return f"https://github.com/{self.repo}/blob/{self.commit}/{self.path}"


@dataclasses.dataclass(frozen=True)
class Scope:
    """The problems the source selects a config for; None means "any".

    ``head_dim_range`` is inclusive. ``when`` names a condition beyond shape and dtype
    (dropout, a PE head, another kernel such as extend attention); an entry with a
    ``when`` does not apply to rocmflash's plain attention problem.
    """

    head_dim: Optional[int] = None
    head_dim_range: Optional[tuple] = None
    causal: Optional[bool] = None
    dtypes: Optional[tuple] = None
    when: Optional[str] = None

    def admits_head_dim(self, head_dim: int) -> bool:
        """True when the scope allows this head dim."""
        if self.head_dim is not None and head_dim != self.head_dim:
            return False
        if self.head_dim_range is not None:
            lo, hi = self.head_dim_range
            return lo <= head_dim <= hi
        return True

    def mismatch(self, problem: Problem) -> Optional[str]:
        """Why the config is not selected for ``problem`` (plain attention, no dropout), or None if it is."""
        if not self.admits_head_dim(problem.head_dim):
            want = self.head_dim if self.head_dim is not None else "{}..{}".format(*self.head_dim_range)
            return f"head dim {want} only"
        if self.dtypes is not None and problem.dtype not in self.dtypes:
            return "/".join(self.dtypes) + " only"
        if self.causal is not None and self.causal != problem.causal:
            return "causal only" if self.causal else "non-causal only"
        if self.when:
            return self.when
        return None

    def describe(self) -> str:
        """Short text, e.g. ``D 17..64, fp16/bf16, causal``."""
        parts = []
        if self.head_dim is not None:
            parts.append(f"D {self.head_dim}")
        elif self.head_dim_range is not None:
            parts.append("D {}..{}".format(*self.head_dim_range))
        if self.dtypes is not None:
            parts.append("/".join(self.dtypes))
        if self.causal is not None:
            parts.append("causal" if self.causal else "non-causal")
        if self.when:
            parts.append(self.when)
        return ", ".join(parts) or "any"


@dataclasses.dataclass(frozen=True)
class ReferenceConfig:
    """One validated entry of the reference file."""

    id: str
    source: Source
    gpu: Optional[str]  #: the GPU the source names (its file name), None when it names only an arch family
    arch: str
    pass_: str  #: "fwd" or "bwd"
    role: str  #: default, autotune_candidate, fallback or alternative
    kernel: str
    scope: Scope
    config: dict  #: the config exactly as the source gives it
    rocmflash: Optional[KernelConfig]  #: forward: the mapped rocmflash config
    rocmflash_bwd: Optional[dict]  #: backward: ``{"dkdv": KernelConfig, "dq": KernelConfig or None}``
    notes: str

    @property
    def label(self) -> str:
        """Short label of the mapped config, e.g. ``online 128x64 w4 s1 wpe2 mfma0 kp1``."""
        if self.rocmflash is None:
            return " / ".join(f"{name} {_short(cfg)}" for name, cfg in self.rocmflash_bwd.items() if cfg is not None)
        return f"{self.rocmflash.variant} {_short(self.rocmflash)}"


def _short(cfg: KernelConfig) -> str:
    text = (f"{cfg.BLOCK_M}x{cfg.BLOCK_N} w{cfg.num_warps} s{cfg.num_stages} wpe{cfg.waves_per_eu} "
            f"mfma{cfg.matrix_instr_nonkdim} kp{cfg.kpack}")
    return text + (" plv" if cfg.PRE_LOAD_V else "")


# ---------------------------------------------------------------------- loading
def load(path: Optional[str] = None) -> list[ReferenceConfig]:
    """Read and validate a reference file (default: the packaged ``amd_published.json``)."""
    path = path or DEFAULT_PATH
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ReferenceFileError(f"{path}: reference file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ReferenceFileError(f"{path}: cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise ReferenceFileError(f"{path}: not valid JSON: {err}") from None
    return parse(data, origin=path)


def parse(data: Any, origin: str = "<reference>") -> list[ReferenceConfig]:
    """Validate a decoded reference document and return its entries as records."""
    if not isinstance(data, dict):
        raise ReferenceFileError(f"{origin}: expected a JSON object at the top level")
    if data.get("format") != FORMAT:
        raise ReferenceFileError(f"{origin}: format is {data.get('format')!r}; expected {FORMAT!r}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ReferenceFileError(f"{origin}: schema_version {data.get('schema_version')!r} is unsupported; "
                                 f"expected {SCHEMA_VERSION}")
    entries = data.get("entries")
    if not isinstance(entries, list) or not entries:
        raise ReferenceFileError(f"{origin}: 'entries' must be a non-empty list")
    out, seen = [], set()
    for index, raw in enumerate(entries):
        where = f"{origin}: entry #{index}" + (f" ({raw.get('id')})" if isinstance(raw, dict) else "")
        record = _entry(raw, where)
        if record.id in seen:
            raise ReferenceFileError(f"{where}: duplicate id {record.id!r}")
        seen.add(record.id)
        out.append(record)
    return out


def _fail(where: str, text: str):
    raise ReferenceFileError(f"{where}: {text}")


def _entry(raw: Any, where: str) -> ReferenceConfig:
    if not isinstance(raw, dict):
        _fail(where, "expected an object")
    missing, unknown = sorted(_ENTRY_KEYS - set(raw)), sorted(set(raw) - _ENTRY_KEYS)
    if missing or unknown:
        _fail(where, f"missing key(s) {missing}" if missing else f"unknown key(s) {unknown}")
    for key in ("id", "kernel", "notes"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            _fail(where, f"'{key}' must be a non-empty string")
    if raw["arch"] not in ARCHS:
        _fail(where, f"arch {raw['arch']!r} is not one of {ARCHS}")
    if raw["pass"] not in PASSES:
        _fail(where, f"pass {raw['pass']!r} is not one of {PASSES}")
    if raw["role"] not in ROLES:
        _fail(where, f"role {raw['role']!r} is not one of {ROLES}")
    if raw["gpu"] is not None and not isinstance(raw["gpu"], str):
        _fail(where, "'gpu' must be a string or null")
    if not isinstance(raw["config"], dict) or not raw["config"]:
        _fail(where, "'config' must be a non-empty object (the source's values)")
    fwd, bwd = _rocmflash(raw["rocmflash_config"], raw["pass"], where)
    return ReferenceConfig(id=raw["id"], source=_source(raw["source"], where), gpu=raw["gpu"], arch=raw["arch"],
                           pass_=raw["pass"], role=raw["role"], kernel=raw["kernel"],
                           scope=_scope(raw["problem"], where), config=dict(raw["config"]), rocmflash=fwd,
                           rocmflash_bwd=bwd, notes=raw["notes"])


def _source(raw: Any, where: str) -> Source:
    if not isinstance(raw, dict):
        _fail(where, "'source' must be an object")
    missing, unknown = sorted(_SOURCE_KEYS - set(raw)), sorted(set(raw) - _SOURCE_KEYS - _SOURCE_OPTIONAL)
    if missing or unknown:
        _fail(where, f"source: missing key(s) {missing}" if missing else f"source: unknown key(s) {unknown}")
    for key in _SOURCE_KEYS:
        if not isinstance(raw[key], str) or not raw[key]:
            _fail(where, f"source.{key} must be a non-empty string")
    if raw["repo"].count("/") != 1:
        _fail(where, f"source.repo {raw['repo']!r} is not owner/name")
    for key in ("commit", "last_changed"):
        value = raw.get(key)
        if value is not None and not (isinstance(value, str) and _COMMIT.match(value)):
            _fail(where, f"source.{key} {value!r} is not a 40-hex commit")
    return Source(**{k: raw.get(k) for k in _SOURCE_KEYS | _SOURCE_OPTIONAL})


def _scope(raw: Any, where: str) -> Scope:
    if not isinstance(raw, dict):
        _fail(where, "'problem' must be an object")
    unknown = sorted(set(raw) - _PROBLEM_KEYS)
    if unknown:
        _fail(where, f"problem: unknown key(s) {unknown}")
    head_dim, span, causal = raw.get("head_dim"), raw.get("head_dim_range"), raw.get("causal")
    dtypes, when = raw.get("dtypes"), raw.get("when")
    if head_dim is not None and (type(head_dim) is not int or not 16 <= head_dim <= 256):
        _fail(where, f"problem.head_dim {head_dim!r} must be null or an int in 16..256")
    if span is not None and not (isinstance(span, list) and len(span) == 2 and all(type(v) is int for v in span)
                                 and span[0] <= span[1]):
        _fail(where, f"problem.head_dim_range {span!r} must be null or [lo, hi] with lo <= hi")
    if causal is not None and not isinstance(causal, bool):
        _fail(where, f"problem.causal {causal!r} must be true, false or null")
    if dtypes is not None:
        if not isinstance(dtypes, list) or not dtypes or any(d not in DTYPES for d in dtypes):
            _fail(where, f"problem.dtypes {dtypes!r} must be null or a list of {DTYPES}")
        dtypes = tuple(d if d == "fp32" else normalize_dtype(d) for d in dtypes)
    if when is not None and (not isinstance(when, str) or not when.strip()):
        _fail(where, "problem.when must be null or a non-empty string")
    return Scope(head_dim, tuple(span) if span else None, causal, dtypes, when)


def _kernel_config(raw: Any, where: str, name: str) -> KernelConfig:
    if not isinstance(raw, Mapping):
        _fail(where, f"{name} must be an object of KernelConfig fields")
    try:
        return KernelConfig.from_dict(raw)
    except (TypeError, ValueError) as err:
        _fail(where, f"{name} is not a valid KernelConfig: {err}")


def _rocmflash(raw: Any, pass_: str, where: str):
    if pass_ == "fwd":
        return _kernel_config(raw, where, "rocmflash_config"), None
    if not isinstance(raw, dict) or set(raw) != {"dkdv", "dq"}:
        _fail(where, "a backward rocmflash_config must be an object with exactly the keys 'dkdv' and 'dq'")
    dq = None if raw["dq"] is None else _kernel_config(raw["dq"], where, "rocmflash_config.dq")
    return None, {"dkdv": _kernel_config(raw["dkdv"], where, "rocmflash_config.dkdv"), "dq": dq}


# ---------------------------------------------------------------------- filtering
def select(refs: Iterable[ReferenceConfig], gpu: Optional[str] = None, arch: Optional[str] = None,
           pass_: Optional[str] = None, problem: Optional[Problem] = None, strict: bool = True,
           roles: Optional[Iterable[str]] = None) -> list[ReferenceConfig]:
    """The entries matching every filter given, in file order.

    ``gpu`` matches the GPU the source names (``mi300x``; sources that name only an arch
    have none, so filter by ``arch`` to get every config for a target). ``problem``:
    with ``strict`` only entries selected for exactly that problem (head dim, dtype,
    causal, no extra condition); without, every entry whose head-dim scope admits the
    problem's head dim.
    """
    if pass_ is not None and pass_ not in PASSES:
        raise ValueError(f"pass {pass_!r} is not one of {PASSES}")
    wanted_roles = None if roles is None else set(roles)
    out = []
    for ref in refs:
        if gpu is not None and ref.gpu != gpu.lower():
            continue
        if arch is not None and ref.arch != arch:
            continue
        if pass_ is not None and ref.pass_ != pass_:
            continue
        if wanted_roles is not None and ref.role not in wanted_roles:
            continue
        if problem is not None:
            if strict and ref.scope.mismatch(problem) is not None:
                continue
            if not strict and not ref.scope.admits_head_dim(problem.head_dim):
                continue
        out.append(ref)
    return out
