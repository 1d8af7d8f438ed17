"""What a usable database entry is, per family, checked once as a database file is read.

Every reader of a config database -- run-time lookups of every family, ``rocmflash explain``, ``export``,
``tune`` and ``doctor`` -- sees a file's entries through :func:`check_entries`, so none of them meets a
malformed one: a user's hand-edited ``best`` that is a list, an ``incumbent`` that is a string or a time
that is ``NaN`` is skipped with one warning naming the file, the key and what is wrong, and the rest of
the file serves as before. A problem with the whole file (not JSON, another format) is
:class:`~rocmflash.db.files.DBError`'s one line, as before.

The families, by key (:func:`family`):

* ``d{D}-{dtype}-...`` (16-bit and fp8 forward) and ``varlen-...`` (the packed forward): ``best`` is a
  :class:`~rocmflash.config.KernelConfig` dict; keys it leaves out take the record's defaults (an entry
  written before ``PRE_LOAD_V`` existed still serves, and exports, with ``PRE_LOAD_V: false``);
  ``best_per_variant`` (forward) maps a variant to ``{"config": <KernelConfig dict>, "tflops": ...}``;
* ``bwd-...`` and ``varlen-bwd-...``: ``best`` is ``{"dkdv": <KernelConfig dict>, "dq": <KernelConfig
  dict>, "head_splits": int >= 0}`` (:class:`~rocmflash.kernels.backward.host.BwdConfig`);
* ``decode-...``: ``best`` holds :class:`~rocmflash.kernels.decode.host.DecodeConfig`'s fields
  (``BLOCK_N``, ``num_warps``, ``num_stages``, optional ``waves_per_eu`` and ``num_splits``).

Every family: the entry is an object; ``measured`` (if present) is true or false; ``incumbent`` (if present
and not null) is an object whose times are finite numbers >= 0; ``tflops``, ``time_ms`` and the other
numbers a reader uses are finite numbers >= 0 or null; ``shape`` (if present) is an object; the static record
of schema 2 (``static_profile``, ``compiler``; :mod:`rocmflash.static.db_record`), when present, is made of
objects. A schema-1 entry has no record and reads as it always did.

An entry that holds no config is *absent*, without a warning: ``best`` null (what a tune writes when no
timed config passed) or a ``failed`` entry (a tune that recorded its failure). Keys of no known family are
passed through as long as the entry is an object (no reader looks them up).

The checks need only :mod:`rocmflash.config` (no Triton import): ``rocmflash doctor`` runs them with an
unsupported Triton. What depends on the arch and the installed Triton (``kpack=2`` on gfx950) is checked
where a config is served (:func:`rocmflash.db.entry_config`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple, Optional

from rocmflash.config import KernelConfig

FORWARD, VARLEN, BWD, VARLEN_BWD, DECODE = "forward", "varlen", "bwd", "varlen-bwd", "decode"

#: ``(key prefix, family)``, longest prefix first (``varlen-bwd-`` before ``varlen-``)
_PREFIXES = (("varlen-bwd-", VARLEN_BWD), ("varlen-", VARLEN), ("bwd-", BWD), ("decode-", DECODE))

#: the tile fields a stored config must name (the others have defaults every rocmflash agrees on)
_TILE = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
#: DecodeConfig's fields (:class:`rocmflash.kernels.decode.host.DecodeConfig`, not imported: it imports Triton)
_DECODE_REQUIRED = ("BLOCK_N", "num_warps", "num_stages")
_DECODE_FIELDS = _DECODE_REQUIRED + ("waves_per_eu", "num_splits")
_DECODE_BLOCKS = (16, 32, 64, 128, 256)

#: entry fields read as numbers (times, rates, ratios): finite and >= 0 when present and not null
_NUMBERS = ("tflops", "efficiency", "hbm_efficiency", "kv_gbs", "api_tflops", "speedup_vs_default",
            "speedup_vs_baseline")
#: the entry-level fields of the static record (:mod:`rocmflash.static.db_record`)
_RECORD = ("static_profile", "compiler")
#: ``shape`` fields read as numbers (:func:`rocmflash.api.host_bound.work_scale`)
_SHAPE_NUMBERS = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim")
#: incumbent-field (and its ``train`` side's) times
_INCUMBENT_NUMBERS = ("time_ms", "triton_ms")
_BACKEND_NUMBERS = ("time_ms", "train_ms")

_WARNED: set = set()  #: ``(path, key, what is wrong)`` already reported in this process


class Malformed(ValueError):
    """What is wrong with one entry (its message is the warning's reason)."""


class EntryCheck(NamedTuple):
    """One file's entries, sorted: ``usable`` (normalised copies), ``malformed`` (``{key: why}``) and
    ``no_config`` (keys of well-formed entries that hold no config: ``best`` null or ``failed``)."""

    usable: dict
    malformed: dict
    no_config: list


def parse_key(key: str) -> dict:
    """Inverse of :func:`rocmflash.db.files.problem_key`."""
    d, dtype, causal, gqa, s = key.split("-")
    return {"head_dim": int(d[1:]), "dtype": dtype, "causal": causal == "causal", "gqa_ratio": int(gqa[3:]),
            "seqlen_bucket": int(s[1:])}


def family(key: str) -> Optional[str]:
    """The family of a database key (:data:`FORWARD`, :data:`VARLEN`, ...), or None for a key of none."""
    for prefix, name in _PREFIXES:
        if key.startswith(prefix):
            return name
    try:
        parse_key(key)
    except (ValueError, IndexError):
        return None
    return FORWARD


def check_entries(path: str, entries: dict, warn: bool = True) -> EntryCheck:
    """Sort a file's ``entries`` into usable, malformed and config-less ones (:class:`EntryCheck`).

    ``warn``: each malformed entry gets one ``RuntimeWarning`` per process (file, key and reason), e.g.
    ``rocmflash: skipping entry 'd128-bf16-full-gqa1-s2048' in /x/h100.json: 'best' is a list, expected an
    object``; ``rocmflash doctor`` passes False and reports them itself.
    """
    usable, malformed, no_config = {}, {}, []
    for key, entry in entries.items():
        try:
            checked = check_entry(key, entry)
        except Malformed as err:
            malformed[key] = str(err)
            if warn:
                warn_malformed(path, key, str(err))
            continue
        if checked is None:
            no_config.append(key)
        else:
            usable[key] = checked
    return EntryCheck(usable, malformed, no_config)


def warn_malformed(path: str, key: str, why: str) -> None:
    """The one warning of a skipped entry (once per file, key and reason in a process)."""
    if (path, key, why) in _WARNED:
        return
    _WARNED.add((path, key, why))
    warnings.warn(f"rocmflash: skipping entry {key!r} in {path}: {why}", RuntimeWarning, stacklevel=4)


def check_entry(key: str, entry: Any) -> Optional[dict]:
    """The entry as readers may take it (a copy whose configs are complete), None when it holds no config,
    :class:`Malformed` naming what is wrong."""
    if not isinstance(entry, dict):
        raise Malformed(f"the entry is {_what(entry)}, expected an object")
    fam = family(key)
    if fam is None:
        return entry  # no reader looks it up (another rocmflash's family?): passed through as it is
    if entry.get("failed"):
        return None  # a tune recorded that it found nothing: absent, nothing to warn about
    if "best" not in entry:
        raise Malformed("it has no 'best' (null when a tune found no config)")
    best = entry["best"]
    if best is None:
        return None  # what a tune writes when no timed config passed: absent
    if not isinstance(best, dict):
        raise Malformed(f"'best' is {_what(best)}, expected an object")
    _check_common(entry)
    out = dict(entry)
    if fam in (FORWARD, VARLEN):
        out["best"] = _kernel_config(best, "'best'")
        _number(entry, "time_ms", "'time_ms'")
        if fam == FORWARD:
            _forward_extras(entry, out)
    elif fam in (BWD, VARLEN_BWD):
        out["best"] = _bwd_config(best)
        _numbers_of(entry, "time_ms", "'time_ms'")  # {"dkdv", "dq", "total"}
    else:
        _decode_config(best)
        _number(entry, "time_ms", "'time_ms'")
    return out


# ---------------------------------------------------------------------- fields every family shares
def _check_common(entry: dict) -> None:
    measured = entry.get("measured")
    if measured is not None and not isinstance(measured, bool):
        raise Malformed(f"'measured' is {_what(measured)}, expected true or false")
    timing = entry.get("timing")
    if timing is not None and not isinstance(timing, str):
        raise Malformed(f"'timing' is {_what(timing)}, expected a string")
    for name in _NUMBERS:
        _number(entry, name, repr(name))
    for name in _RECORD:  # the static record (schema 2; absent from a schema-1 entry): objects when present
        if entry.get(name) is not None and not isinstance(entry[name], dict):
            raise Malformed(f"{name!r} is {_what(entry[name])}, expected an object")
    shape = entry.get("shape")
    if shape is not None:
        if not isinstance(shape, dict):
            raise Malformed(f"'shape' is {_what(shape)}, expected an object")
        for name in _SHAPE_NUMBERS:
            _number(shape, name, f"'shape.{name}'")
    _check_incumbent(entry.get("incumbent"))


def _check_incumbent(field: Any) -> None:
    """An ``incumbent`` field (:mod:`rocmflash.api.incumbent`): null, or an object of finite times."""
    if field is None:
        return
    if not isinstance(field, dict):
        raise Malformed(f"'incumbent' is {_what(field)}, expected an object")
    for side, where in ((field, "incumbent"), (field.get("train"), "incumbent.train")):
        if side is None:
            continue
        if not isinstance(side, dict):
            raise Malformed(f"'{where}' is {_what(side)}, expected an object")
        for name in ("backend", "timing"):
            if side.get(name) is not None and not isinstance(side[name], str):
                raise Malformed(f"'{where}.{name}' is {_what(side[name])}, expected a string")
        for name in _INCUMBENT_NUMBERS:
            _number(side, name, f"'{where}.{name}'")
    backends = field.get("backends")
    if backends is None:
        return
    if not isinstance(backends, dict):
        raise Malformed(f"'incumbent.backends' is {_what(backends)}, expected an object")
    for name, row in backends.items():
        if not isinstance(row, dict):
            raise Malformed(f"'incumbent.backends.{name}' is {_what(row)}, expected an object")
        for number in _BACKEND_NUMBERS:
            _number(row, number, f"'incumbent.backends.{name}.{number}'")


# ---------------------------------------------------------------------- the families' configs
def _kernel_config(cfg: Any, where: str) -> dict:
    """A complete, valid :class:`KernelConfig` dict from a stored one (missing optional keys: defaults)."""
    if not isinstance(cfg, dict):
        raise Malformed(f"{where} is {_what(cfg)}, expected an object")
    missing = [name for name in _TILE if name not in cfg]
    if missing:
        raise Malformed(f"{where} names no {', '.join(missing)}")
    try:
        return KernelConfig.from_dict(cfg).to_dict()
    except (TypeError, ValueError) as err:
        raise Malformed(f"{where} is not a valid config: {err}") from None


def _forward_extras(entry: dict, out: dict) -> None:
    """``best_per_variant`` of a forward entry: ``{variant: {"config": ..., "tflops": ...}}``, completed."""
    per = entry.get("best_per_variant")
    if per is None:
        return
    if not isinstance(per, dict):
        raise Malformed(f"'best_per_variant' is {_what(per)}, expected an object")
    completed = {}
    for variant, row in per.items():
        where = f"'best_per_variant.{variant}'"
        if not isinstance(row, dict):
            raise Malformed(f"{where} is {_what(row)}, expected an object")
        _number(row, "tflops", f"'best_per_variant.{variant}.tflops'")
        completed[variant] = dict(row, config=_kernel_config(row.get("config"), f"{where[:-1]}.config'"))
    out["best_per_variant"] = completed


def _bwd_config(best: dict) -> dict:
    """A backward ``best`` (:class:`~rocmflash.kernels.backward.host.BwdConfig`'s dict), its two configs completed."""
    out = dict(best)
    for kernel in ("dkdv", "dq"):
        if kernel not in best:
            raise Malformed(f"'best' has no {kernel!r} config (a backward entry holds 'dkdv' and 'dq')")
        out[kernel] = _kernel_config(best[kernel], f"'best.{kernel}'")
    splits = best.get("head_splits", 0)
    if type(splits) is not int or splits < 0:
        raise Malformed(f"'best.head_splits' is {_what(splits)}, expected an int >= 0 (0 = automatic)")
    return out


def _decode_config(best: dict) -> None:
    """A decode ``best``: DecodeConfig's rules (the block is a KernelConfig key block of 16..256 with a
    16-query tile; other keys are ignored by DecodeConfig, as here)."""
    missing = [name for name in _DECODE_REQUIRED if name not in best]
    if missing:
        raise Malformed(f"'best' names no {', '.join(missing)}")
    block = best["BLOCK_N"]
    if type(block) is not int or block not in _DECODE_BLOCKS:
        raise Malformed(f"'best.BLOCK_N' is {_what(block)}, expected one of {_DECODE_BLOCKS}")
    fields = {name: best[name] for name in _DECODE_FIELDS if name in best}
    try:
        KernelConfig(BLOCK_M=16, **fields).validate()
    except (TypeError, ValueError) as err:
        raise Malformed(f"'best' is not a valid decode config: {err}") from None


# ---------------------------------------------------------------------- values
def _number(holder: dict, name: str, where: str) -> None:
    """``holder[name]``, when present and not null, must be a finite number >= 0."""
    value = holder.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise Malformed(f"{where} is {_what(value)}, expected a finite number >= 0")


def _numbers_of(holder: dict, name: str, where: str) -> None:
    """``holder[name]``: null, one number or an object of numbers (a backward's ``{"dkdv", "dq", "total"}``)."""
    value = holder.get(name)
    if isinstance(value, dict):
        for part in value:
            _number(value, part, f"{where[:-1]}.{part}'")
    else:
        _number(holder, name, where)


def _what(value: Any) -> str:
    """A JSON value as a warning names it: ``a list``, ``an object``, ``a string ('x')``, ``null``, ``nan``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        text = value if len(value) <= 24 else value[:21] + "..."
        return f"a string ({text!r})"
    return repr(value)


__all__ = ["FORWARD", "VARLEN", "BWD", "VARLEN_BWD", "DECODE", "Malformed", "EntryCheck", "family",
           "check_entries", "check_entry", "warn_malformed"]
