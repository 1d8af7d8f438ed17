"""What a database file and a tuning journal are on disk: their formats and keys, the entry records
(:class:`ConfigDB`), the append-only :class:`Journal`, atomic writes and the per-database tune lock.

:mod:`rocmflash.db` (where the files are, and the run-time lookup) re-exports every public name here.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
import threading
from typing import Any, Optional

from rocmflash.config import KernelConfig, normalize_dtype
from rocmflash.db.entries import check_entries, parse_key

DB_FORMAT = "rocmflash-config-db"
JOURNAL_FORMAT = "rocmflash-tune-journal"
#: 2: entries may record what their verdicts rested on (``static_profile`` beside each config, ``compiler`` per
#: entry: :mod:`rocmflash.static.db_record`); a schema-1 file reads unchanged (it has no record) and is written
#: as schema 2 by the next save
SCHEMA_VERSION = 2
#: the database schemas this rocmflash reads
READABLE_SCHEMA_VERSIONS = (1, 2)
#: the journal's own schema (its records did not change with the database's schema 2)
JOURNAL_SCHEMA_VERSION = 1
CONFIG_DIR_ENV = "ROCMFLASH_CONFIG_DIR"


#: called after every save in this process: the run-time lookup (:mod:`rocmflash.db`, which imports
#: this module, never the reverse) registers the clearing of its caches here
AFTER_SAVE: list = []


class DBError(ValueError):
    """A database or journal that cannot be used as it is (wrong schema, other GPU, corrupt)."""


class DBLockedError(DBError):
    """Another process holds the database's tune lock."""


# ---------------------------------------------------------------------- keys and paths
def seqlen_bucket(seqlen: int) -> int:
    """The next power of two >= ``seqlen`` (1 -> 1, 1000 -> 1024, 2048 -> 2048, 3000 -> 4096)."""
    s = int(seqlen)
    if s < 1:
        raise ValueError(f"sequence length must be >= 1, got {seqlen}")
    return 1 << (s - 1).bit_length()


#: the dtype part of a key for fp8 inputs, by torch's name of the format: ``fp8`` and the format, so a key says
#: which family it was tuned in (FNUZ on gfx942, OCP on gfx950 and sm_89+) and an entry is found only by
#: inputs of that very format
FP8_KEY_DTYPES = {"float8_e4m3fn": "fp8e4m3fn", "float8_e5m2": "fp8e5m2", "float8_e4m3fnuz": "fp8e4m3fnuz",
                  "float8_e5m2fnuz": "fp8e5m2fnuz"}


def key_dtype(dtype: Any) -> str:
    """The dtype part of a database key: ``fp16``/``bf16`` (:func:`~rocmflash.config.normalize_dtype`), or for
    an fp8 format (a torch fp8 dtype, its name, or the key's own name) :data:`FP8_KEY_DTYPES`' name.

    The bare ``fp8`` of a tune (the arch's e4m3) names no format: ``ValueError`` asking for the format
    (:func:`rocmflash.static.space.fp8_format` gives a GPU's); anything else is normalize_dtype's error."""
    text = str(dtype).lower()
    text = text[len("torch."):] if text.startswith("torch.") else text
    if text in FP8_KEY_DTYPES:
        return FP8_KEY_DTYPES[text]
    if text in FP8_KEY_DTYPES.values():
        return text
    if text in ("fp8", "float8"):
        raise ValueError(f"dtype {dtype!r} names no fp8 format; a database key needs the format (float8_e4m3fnuz "
                         "on gfx942, float8_e4m3fn on gfx950 and sm_89+)")
    return normalize_dtype(dtype)


def problem_key(head_dim: int, dtype: Any, causal: bool, gqa_ratio: int, bucket: int) -> str:
    """``d128-bf16-causal-gqa1-s2048`` (``full`` for non-causal); fp8 inputs: ``d128-fp8e4m3fnuz-...``
    (:func:`key_dtype`)."""
    return f"d{int(head_dim)}-{key_dtype(dtype)}-{'causal' if causal else 'full'}-gqa{int(gqa_ratio)}-s{int(bucket)}"


def journal_path(db_path: str) -> str:
    """``configs/h100.json`` -> ``configs/h100.journal.jsonl``, beside the real file of a symlinked database
    (:func:`real_path`), so every path to one database shares its journal."""
    db_path = real_path(db_path)
    base = db_path[:-5] if db_path.endswith(".json") else db_path
    return base + ".journal.jsonl"


def real_path(db_path: str) -> str:
    """The file a database path names, symlinks followed (a dangling link: the file it would create).

    A database is written where it really is: :func:`atomic_write_json` replaces the link's target, not
    the link, and the tune lock and journal live beside that target, so two paths to one file (a link in
    ``~/.config/rocmflash`` to a shared tune, say) share one lock and one journal."""
    return os.path.realpath(db_path)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


# ---------------------------------------------------------------------- fingerprint
def environment(device_name: Optional[str] = None) -> dict:
    """rocmflash, Triton, torch and GPU-runtime versions, and the device name (None: no live device)."""
    from rocmflash._version import __version__

    env = {"rocmflash": __version__, "triton": None, "torch": None, "runtime": None,
           "device": device_name}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        pass
    version = torch_version_module()
    if version is not None:
        env["torch"] = version.__version__
        if getattr(version, "hip", None):
            env["runtime"] = f"hip {version.hip}"
        elif getattr(version, "cuda", None):
            env["runtime"] = f"cuda {version.cuda}"
        else:
            env["runtime"] = "cpu"
    return env


def torch_version_module():
    """``torch.version`` (``__version__``, ``cuda``, ``hip``), or None without torch. Read from its file where
    torch is not imported yet: a ``--gpus`` tune plans while torch imports in a thread, and ``import torch``
    here would wait for it (``torch/version.py`` is plain assignments, written when torch is built)."""
    import sys

    imported = getattr(sys.modules.get("torch"), "version", None)  # torch may be half-imported by another thread
    if imported is not None and hasattr(imported, "__version__"):
        return imported
    try:
        import importlib.util
        import types

        spec = importlib.util.find_spec("torch")
        path = os.path.join(os.path.dirname(spec.origin), "version.py")
        with open(path, encoding="utf-8") as f:
            module = types.ModuleType("torch.version")
            exec(compile(f.read(), path, "exec"), module.__dict__)
        str(module.__version__)
        return module
    except Exception:  # noqa: BLE001 - no readable file: ask torch itself
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is checked by rocmflash.hw.compat
            return None
        return torch.version


def env_id(env: dict) -> str:
    """Short hash of an environment: journal results are reused only under the same one."""
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- atomic writes
def atomic_write_json(path: str, data: Any) -> None:
    """Write JSON to a private temporary file beside ``path``, fsync it, rename it into place.

    A ``path`` that is a symlink stays one: the temporary file goes beside its target, which it replaces
    (renaming onto the link itself would turn the link into a regular file and leave the target stale)."""
    path = real_path(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a database is an ordinary shared file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------- the database
class ConfigDB:
    """An in-memory database bound to its path; :meth:`save` writes it atomically."""

    def __init__(self, path: str, data: dict):
        self.path = path
        self.data = data
        self._lock = threading.RLock()  # problems tuned in parallel threads share one writer

    @staticmethod
    def new_data(gpu_name: str, arch: str, fingerprint: dict, compute_units: Optional[int] = None) -> dict:
        return {"format": DB_FORMAT, "schema_version": SCHEMA_VERSION, "gpu": gpu_name, "arch": arch,
                "compute_units": compute_units, "fingerprint": fingerprint, "updated": now_iso(), "entries": {}}

    @classmethod
    def read(cls, path: str) -> dict:
        """Parse and validate a database file's header; :class:`DBError` on any mismatch. Its entries are
        as stored: :func:`rocmflash.db.read_database` gives the ones a reader may use."""
        with open(path, "rb") as f:
            return cls.parse(path, f.read())

    @classmethod
    def parse(cls, path: str, raw: bytes) -> dict:
        """:meth:`read` of a file's bytes (``path`` names it in errors)."""
        try:
            data = json.loads(raw.decode("utf-8"))
        except json.JSONDecodeError as err:
            raise DBError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}); move it away or pass --db") from None
        except UnicodeDecodeError:
            raise DBError(f"{path}: not a text file; move it away or pass --db") from None
        if not isinstance(data, dict) or data.get("format") != DB_FORMAT:
            raise DBError(f"{path}: not a rocmflash config database (format {data.get('format') if isinstance(data, dict) else None!r}, "
                          f"expected {DB_FORMAT!r})")
        if data.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
            raise DBError(f"{path}: schema version {data.get('schema_version')!r}, this rocmflash reads "
                          f"{' and '.join(map(str, READABLE_SCHEMA_VERSIONS))}; move it away or pass --db")
        if not isinstance(data.get("entries"), dict):
            raise DBError(f"{path}: 'entries' is missing or not an object")
        return data

    @classmethod
    def open(cls, path: str, gpu_name: str, arch: str, fingerprint: dict,
             compute_units: Optional[int] = None) -> "ConfigDB":
        """Load ``path`` (or start an empty database); the header must name the same GPU and CU count.

        The CU count tells a compute partition (``mi300x-cpx``, 38 CUs) from the whole GPU;
        a database written before it was recorded gets it on its next save.
        """
        if os.path.isdir(path):
            raise DBError(f"{path} is a directory; --db takes a database file such as {gpu_name}.json")
        if os.path.exists(path):
            data = cls.read(path)
            # one warning per malformed entry (never served; kept in the file as it is, a save rewrites it as read)
            check_entries(path, data["entries"])
            if data.get("gpu") != gpu_name:
                raise DBError(f"{path} holds configs for {data.get('gpu')!r}, not {gpu_name!r}; pass --db for another file")
            recorded = data.get("compute_units")
            if recorded is not None and compute_units is not None and recorded != compute_units:
                raise DBError(f"{path} was tuned on {recorded} CUs, this {gpu_name} has {compute_units}; "
                              "pass --db for another file")
            if compute_units is not None:
                data["compute_units"] = compute_units
            return cls(path, data)
        return cls(path, cls.new_data(gpu_name, arch, fingerprint, compute_units))

    @property
    def entries(self) -> dict:
        return self.data["entries"]

    def put(self, key: str, entry: dict) -> None:
        with self._lock:
            self.entries[key] = entry

    def save(self, fingerprint: Optional[dict] = None) -> None:
        with self._lock:
            if fingerprint is not None:
                self.data["fingerprint"] = fingerprint
            self.data["updated"] = now_iso()
            self.data["schema_version"] = SCHEMA_VERSION  # a schema-1 file read, now written with this one's keys
            self.data["entries"] = dict(sorted(self.entries.items(), key=lambda kv: _key_order(kv[0])))
            atomic_write_json(self.path, self.data)
            for forget in AFTER_SAVE:  # the run-time lookup's caches (rocmflash.db registers them)
                forget()


def _key_order(key: str):
    try:
        p = parse_key(key)
        return (p["head_dim"], p["dtype"], p["causal"], p["gqa_ratio"], p["seqlen_bucket"])
    except (ValueError, IndexError):
        return (10**9, key, False, 0, 0)


# ---------------------------------------------------------------------- the journal
class Journal:
    """Append-only JSON-lines results, one line per config, fsynced as each arrives."""

    def __init__(self, path: str, gpu_name: str):
        self.path = path
        self.gpu_name = gpu_name
        self.records: list[dict] = []
        self.torn_lines = 0
        self._lock = threading.Lock()  # one writer for every thread of a parallel tune
        if os.path.exists(path):
            self._load()
        else:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._write_line({"format": JOURNAL_FORMAT, "schema_version": JOURNAL_SCHEMA_VERSION, "gpu": gpu_name,
                              "created": now_iso()})

    def _load(self) -> None:
        with open(self.path, "rb") as f:
            raw = f.read()
        lines = raw.split(b"\n")
        try:
            header = json.loads(lines[0]) if lines and lines[0].strip() else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != JOURNAL_FORMAT:
            raise DBError(f"{self.path}: not a rocmflash tune journal; move it away or pass --db")
        if header.get("schema_version") != JOURNAL_SCHEMA_VERSION:
            raise DBError(f"{self.path}: journal schema version {header.get('schema_version')!r}, this rocmflash "
                          f"reads {JOURNAL_SCHEMA_VERSION}; move it away or pass --db")
        if header.get("gpu") != self.gpu_name:
            raise DBError(f"{self.path} is a journal for {header.get('gpu')!r}, not {self.gpu_name!r}")
        for line in lines[1:]:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                self.torn_lines += 1  # a kill mid-write: that config simply runs again
                continue
            if isinstance(record, dict) and "key" in record and "config" in record:
                self.records.append(record)
        if raw and not raw.endswith(b"\n"):
            self._write_raw(b"\n")  # the next record must start on its own line

    def _write_raw(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)  # one write call: a Ctrl-C cannot land in the middle of a line
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_line(self, obj: dict) -> None:
        self._write_raw((json.dumps(obj, sort_keys=True) + "\n").encode())

    def append(self, record: dict) -> None:
        with self._lock:
            self._write_line(record)
            self.records.append(record)

    def results(self, key: str, shape: dict, env: str, rnd: Optional[int] = None) -> dict:
        """``{config json: record}`` for one problem key, shape and environment (the latest wins):
        records of race round ``rnd``, or (None) those of single-round strategies."""
        out = {}
        for r in self.records:
            if r["key"] == key and r.get("shape") == shape and r.get("env") == env and r.get("round") == rnd:
                out[KernelConfig.from_dict(r["config"]).to_json()] = r
        return out

    def stale(self, key: str, shape: dict, env: str) -> int:
        """Records of this problem and shape made under another environment (ignored)."""
        return sum(1 for r in self.records if r["key"] == key and r.get("shape") == shape and r.get("env") != env)


# ---------------------------------------------------------------------- the lock
def tune_lock(db_path: str):
    """Acquire ``<db>.lock`` without waiting; :class:`DBLockedError` when another tune holds it.

    The lock is beside the real file of a symlinked database (:func:`real_path`): every path to it shares it."""
    import filelock

    lock_path = real_path(db_path) + ".lock"
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    lock = filelock.FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise DBLockedError(f"another rocmflash tune is writing {db_path} (lock {lock_path} is held); "
                            "wait for it or pass another --db") from None
    return lock


def store_entry(db_path: str, gpu, fingerprint: dict, key: str, entry: dict, measured: bool) -> None:
    """Write one tuned entry into ``db_path`` under the tune lock (atomic save).

    ``measured``: the entry was timed on this machine, so the database's fingerprint becomes
    this environment's; a static-only entry leaves the fingerprint as it was.
    """
    lock = tune_lock(db_path)
    try:
        db = ConfigDB.open(db_path, gpu.name, gpu.arch, fingerprint, gpu.compute_units)
        db.put(key, entry)
        db.save(fingerprint if measured else None)
    finally:
        lock.release()
