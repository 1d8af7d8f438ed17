"""The config database (``configs/<gpu>.json``), its tuning journal, and run-time lookup.

Files
-----
``<dir>/<gpu>.json`` -- the database a model reads at run time::

    {"format": "rocmflash-config-db", "schema_version": 2, "gpu": "h100", "arch": "sm_90",
     "fingerprint": {"rocmflash": ..., "triton": ..., "torch": ..., "runtime": ..., "device": ...},
     "updated": "<UTC ISO time>",
     "entries": {"d128-bf16-causal-gqa1-s2048": {<entry>}, ...}}

  An entry (one per problem key) holds ``problem``, the ``shape`` that was tuned,
  ``measured`` (true: timed on a live GPU; false: static ranking only, nothing was
  benchmarked), ``best`` (a :class:`~rocmflash.config.KernelConfig` dict), ``tflops``
  and ``time_ms`` of the best (None when unmeasured), ``near_best`` (the configs within
  ``near_best_pct`` percent of the best time), ``best_per_variant``, ``roofline`` and
  ``efficiency``, ``strategy``, ``counts``, ``complete`` (false after an interrupted
  tune), ``when`` and the ``fingerprint`` of the environment that produced it. Schema 2 adds the static
  record (:mod:`rocmflash.static.db_record`): ``static_profile`` beside the served config and each near-best
  or ranked one (registers, spills, in-loop or not, LDS, waves/SIMD: what its verdict rested on) and the
  ``compiler`` that produced them; ``rocmflash check-db`` (:mod:`rocmflash.static.check_db`) compares them
  with the installed Triton. Schema-1 files read unchanged (no record) and are written as schema 2.

``<dir>/<gpu>.journal.jsonl`` -- the journal: a header line, then one JSON line per
  measured config, appended (and fsynced) as each result arrives. It is the source of
  truth of a tune: the database entries are rebuilt from it, a killed tune loses at
  most the config that was running, and a re-run (or ``--resume``) skips every config
  already in it for the same problem, shape and environment -- failed, incorrect,
  timed-out and crashed configs included, so they are never retried. A torn last line
  (a kill mid-write) is ignored on load.

Both headers must match on reload (format and ``schema_version``; the journal's GPU);
otherwise :class:`DBError` names the file and the mismatch. Database writes are atomic
(temporary file + ``os.replace``) and a tune holds ``<gpu>.json.lock``
(:mod:`filelock`) for its whole run, so a second concurrent tune of the same database
fails at once with :class:`DBLockedError` instead of interleaving. A database that is a
symlink is written through it (its target is replaced, the link stays a link), and its
lock and journal live beside the target (:func:`~rocmflash.db.files.real_path`).

Every reader (run-time lookups of each family, ``explain``, ``export``, ``tune``, ``doctor``)
sees a file's entries checked once (:mod:`rocmflash.db.entries`, :func:`read_database`): a
malformed entry is skipped with one warning naming the file, the key and what is wrong, and
an entry that holds no config (``best`` null, ``failed``) is absent.

Problem keys and sequence-length buckets
----------------------------------------
``d{D}-{dtype}-{causal|full}-gqa{ratio}-s{bucket}``, where ``bucket`` is the next power
of two >= the sequence length (:func:`seqlen_bucket`) and ``dtype`` is ``fp16``, ``bf16`` or, for fp8
inputs, ``fp8`` with the format (``fp8e4m3fnuz`` on gfx942, ``fp8e4m3fn`` on gfx950 and sm_89+:
:func:`key_dtype`), so fp8 inputs find only entries of their own format. A tune at S=3000 lands in the
4096 bucket; at run time :func:`lookup` returns the entry of the nearest bucket (in
powers of two; ties go to the larger bucket), so a new sequence length never needs a
new tune.

Where the databases live
------------------------
Two places, read in this order at run time (:func:`database_paths`):

1. the user's own tunes: ``$ROCMFLASH_CONFIG_DIR`` if set, else the user config
   directory (``platformdirs.user_config_dir("rocmflash")``, e.g.
   ``~/.config/rocmflash/<gpu>.json``). ``rocmflash tune`` writes here unless given ``--db``;
2. the databases shipped with rocmflash (``rocmflash/configs/``, packaged in the wheel;
   in a source checkout the same files as ``configs/``).

A lookup takes the entry of the nearest sequence-length bucket among both files; at the
same distance the user's file wins. ``lookup(..., db_path=...)`` reads one file only.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from typing import Any, NamedTuple, Optional

from rocmflash.config import KernelConfig, installed_triton_version
from rocmflash.db.entries import check_entries, parse_key
from rocmflash.db.files import (  # noqa: F401  (re-exported: the code moved there)
    AFTER_SAVE,
    CONFIG_DIR_ENV,
    DB_FORMAT,
    FP8_KEY_DTYPES,
    JOURNAL_FORMAT,
    SCHEMA_VERSION,
    ConfigDB,
    DBError,
    DBLockedError,
    Journal,
    atomic_write_json,
    env_id,
    environment,
    journal_path,
    key_dtype,
    now_iso,
    problem_key,
    real_path,
    seqlen_bucket,
    store_entry,
    tune_lock,
)


def user_config_dir() -> str:
    """Where a user's tunes go: ``$ROCMFLASH_CONFIG_DIR``, else the platform's user config directory."""
    env = os.environ.get(CONFIG_DIR_ENV)
    if env:
        return env
    import platformdirs

    return platformdirs.user_config_dir("rocmflash")


def shipped_config_dir() -> str:
    """The databases shipped with rocmflash (package data; ``configs/`` of a source checkout)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def default_db_path(gpu_name: str) -> str:
    """The database ``rocmflash tune`` writes by default: the user's, never the shipped one."""
    return os.path.join(user_config_dir(), f"{gpu_name}.json")


def shipped_db_path(gpu_name: str) -> str:
    return os.path.join(shipped_config_dir(), f"{gpu_name}.json")


def database_paths(gpu_name: str) -> list[str]:
    """The files a run-time lookup reads for ``gpu_name``, in precedence order (user's, then shipped)."""
    paths = [default_db_path(gpu_name)]
    shipped = shipped_db_path(gpu_name)
    if os.path.realpath(shipped) != os.path.realpath(paths[0]):
        paths.append(shipped)
    return paths


_READ: dict = {}  #: ``{path: (the file's bytes, read_database's answer)}``


def read_database(path: str) -> dict:
    """One database file with only the entries a reader may use (:mod:`rocmflash.db.entries`: each
    malformed entry skipped with one warning, config-less ones absent, stored configs completed);
    :class:`DBError` or ``OSError`` for the file as a whole, as :meth:`ConfigDB.read`.

    The checked answer is kept while the file's bytes stay the same (reading them costs what it did;
    checking every entry again does not recur). Treat it as read-only: callers share it."""
    with open(path, "rb") as f:
        raw = f.read()
    hit = _READ.get(path)
    if hit is not None and hit[0] == raw:
        return hit[1]
    data = ConfigDB.parse(path, raw)
    data = dict(data, entries=check_entries(path, data["entries"]).usable)
    _READ[path] = (raw, data)
    return data


def iter_database_entries(gpu_name: str):
    """``(order, path, key, entry)`` of every usable entry (:func:`read_database`) in the files a lookup reads
    for ``gpu_name`` (the user's first, ``order`` 0); a missing or unreadable file is skipped."""
    for order, path in enumerate(database_paths(gpu_name)):
        if not os.path.exists(path):
            continue
        try:
            entries = read_database(path)["entries"]
        except (DBError, OSError):
            continue
        for key, entry in entries.items():
            yield order, path, key, entry


def database_summary(path: str) -> dict:
    """``{"path", "exists", "entries", "measured", "malformed", "no_config", "error"}`` of one database file
    (for ``rocmflash doctor``): ``entries`` counts every stored entry, ``measured`` the usable ones a GPU
    measured, ``malformed`` is ``{key: what is wrong}`` of those every reader skips, ``no_config`` counts
    those that hold no config (``best`` null: a tune that found nothing). No warning: the report says it."""
    info = {"path": path, "exists": os.path.exists(path), "entries": 0, "measured": 0, "malformed": {},
            "no_config": 0, "error": None}
    if info["exists"]:
        try:
            entries = ConfigDB.read(path)["entries"]
        except (DBError, OSError) as err:
            info["error"] = str(err)
        else:
            checked = check_entries(path, entries, warn=False)
            info.update(entries=len(entries), malformed=checked.malformed, no_config=len(checked.no_config),
                        measured=sum(1 for e in checked.usable.values() if servable(e)))
    return info


# ---------------------------------------------------------------------- run-time lookup
_INDEX: dict = {}
_ARCH: dict = {}  #: ``{path: arch}`` of each loaded database's header
_WARNED: set = set()  #: ``(path, key, config json)`` of entries already reported as unusable


def clear_cache() -> None:
    """Forget every loaded database and cached lookup (called after every save in this process)."""
    _INDEX.clear()
    _ARCH.clear()
    _READ.clear()
    _WARNED.clear()
    lookup_match.cache_clear()


AFTER_SAVE.append(clear_cache)  # every save in this process invalidates what the lookup read


def _index(path: str) -> dict:
    """``{(D, dtype, causal, gqa): [(bucket, entry), ...]}`` of one database (empty when missing/unreadable)."""
    index = _INDEX.get(path)
    if index is None:
        index = {}
        if os.path.exists(path):
            try:
                data = read_database(path)
            except (DBError, OSError) as err:
                warnings.warn(f"rocmflash: ignoring config database: {err}", RuntimeWarning, stacklevel=3)
                data = {"entries": {}}
            _ARCH[path] = data.get("arch") if isinstance(data.get("arch"), str) else None
            for key, entry in data["entries"].items():
                try:
                    p = parse_key(key)
                except (ValueError, IndexError):
                    continue
                group = (p["head_dim"], p["dtype"], p["causal"], p["gqa_ratio"])
                index.setdefault(group, []).append((p["seqlen_bucket"], entry))
        _INDEX[path] = index
    return index


def _pick(entry: dict, variant: Optional[str]) -> Optional[dict]:
    """The config of ``variant`` (None: the overall best) an entry read by :func:`read_database` holds, or None."""
    best = entry.get("best")
    if not best:
        return None
    if variant is None or best.get("variant", "online") == variant:
        return best
    per = (entry.get("best_per_variant") or {}).get(variant)
    return per["config"] if per else None


class DBMatch(NamedTuple):
    """The entry a lookup chose: its config, key, bucket, distance from the asked bucket, file."""

    config: KernelConfig
    key: str
    bucket: int
    bucket_distance: int  #: |log2(entry bucket) - log2(asked bucket)|: 0 = the asked bucket itself
    path: str
    measured: bool


def entries_for(gpu_name: str, head_dim: int, dtype: Any, causal: bool, gqa_ratio: int,
                db_path: Optional[str] = None) -> list:
    """``[(path, bucket, entry), ...]`` of every entry with this head dim, dtype, causal flag and GQA
    ratio, in the files a lookup reads (user's first)."""
    paths = [db_path] if db_path else database_paths(gpu_name)
    group_key = (int(head_dim), key_dtype(dtype), bool(causal), int(gqa_ratio))
    return [(path, bucket, entry) for path in paths for bucket, entry in _index(path).get(group_key, ())]


def groups_for(gpu_name: str, db_path: Optional[str] = None) -> dict:
    """``{(head_dim, dtype, causal, gqa_ratio): [bucket, ...]}`` held in the files a lookup reads."""
    out: dict = {}
    for path in ([db_path] if db_path else database_paths(gpu_name)):
        for group, items in _index(path).items():
            out.setdefault(group, []).extend(b for b, _ in items)
    return out


def servable(entry: dict) -> bool:
    """Whether run-time selection may serve an entry: measured on a GPU (not static-ranked, not
    timed in the CPU interpreter)."""
    return bool(entry.get("measured")) and entry.get("timing") != "interpreter"


@functools.lru_cache(maxsize=4096)
def lookup_match(gpu_name: str, head_dim: int, dtype: Any, causal: bool, gqa_ratio: int, seqlen: int,
                 variant: Optional[str] = None, measured_only: bool = False,
                 db_path: Optional[str] = None) -> Optional[DBMatch]:
    """What :func:`lookup` chose and where from (None: no usable entry); same rules, same cache life."""
    candidates = entries_for(gpu_name, head_dim, dtype, causal, gqa_ratio, db_path)  # user's file first
    target = seqlen_bucket(seqlen).bit_length()
    # nearest bucket first (ties: the larger), then the user's file before the shipped one (stable sort)
    for path, bucket, entry in sorted(candidates, key=lambda c: (abs(c[1].bit_length() - target), -c[1])):
        if measured_only and not servable(entry):
            continue
        cfg = _pick(entry, variant)
        if cfg is not None:
            key = problem_key(head_dim, dtype, causal, gqa_ratio, bucket)
            config = entry_config(cfg, _ARCH.get(path) or _catalog_arch(gpu_name), path, key)
            if config is None:
                continue
            return DBMatch(config, key, bucket,
                           abs(bucket.bit_length() - target), path, bool(entry.get("measured")))
    return None


def _catalog_arch(gpu_name: str) -> Optional[str]:
    """The catalog arch of ``gpu_name`` (for a database whose header names none); None if unknown."""
    from rocmflash.hw.gpus import get_gpu

    try:
        return get_gpu(gpu_name).arch
    except ValueError:
        return None


def entry_config(cfg: Any, arch: Optional[str], path: str = "", key: str = "") -> Optional[KernelConfig]:
    """The :class:`KernelConfig` of a database entry's config dict, validated for the database's arch
    and the installed Triton; None (with one warning per entry) when this rocmflash cannot use it.

    One bad entry never makes the rest of a database unusable: e.g. ``kpack=2`` in a gfx950 file
    (Triton 3.4 cannot build it, 3.5+ would silently build kpack=1) or a key an older rocmflash
    does not know is skipped, and the lookup goes on to the next-nearest entry.
    """
    try:
        if not isinstance(cfg, dict):
            raise TypeError(f"expected a config object, got {type(cfg).__name__}")
        return KernelConfig.from_dict(cfg).validate(arch=arch, triton_version=installed_triton_version())
    except (TypeError, ValueError) as err:
        if (path, key, json.dumps(cfg, sort_keys=True, default=str)) not in _WARNED:
            _WARNED.add((path, key, json.dumps(cfg, sort_keys=True, default=str)))
            warnings.warn(f"rocmflash: skipping entry {key or '?'!r} in {path or 'a config database'}: {err}",
                          RuntimeWarning, stacklevel=3)
        return None


def lookup(gpu_name: str, head_dim: int, dtype: Any, causal: bool, gqa_ratio: int, seqlen: int,
           variant: Optional[str] = None, measured_only: bool = False,
           db_path: Optional[str] = None) -> Optional[KernelConfig]:
    """The best :class:`KernelConfig` of the nearest sequence-length bucket, or None.

    Head dim, dtype, causal and GQA ratio must match an entry exactly; among those, the
    bucket nearest to ``seqlen_bucket(seqlen)`` in powers of two wins (ties: the larger),
    searched in the user's database and the shipped one (:func:`database_paths`; at the
    same distance the user's wins), or in ``db_path`` alone when given.
    ``variant`` asks for the best config of that variant (None: the overall best);
    ``measured_only`` skips static-ranked (unmeasured) entries. Results are cached per
    argument tuple (a repeat call costs well under a microsecond); saving a database in
    this process clears the cache, :func:`clear_cache` does it by hand.
    """
    match = lookup_match(gpu_name, head_dim, dtype, causal, gqa_ratio, seqlen, variant, measured_only, db_path)
    return match.config if match is not None else None
