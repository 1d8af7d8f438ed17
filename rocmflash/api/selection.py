"""Run-time config selection: the tuned database entry for the live GPU, else a safe default.

``select_config`` is what :func:`rocmflash.attention` / :func:`rocmflash.flash_attn_func`
(and the torch ops behind them) use when the caller passes no config:

1. the live GPU of the tensor's device (catalog name via :func:`rocmflash.hw.detect.detect_live_gpu`,
   its arch from the device itself when it is not in the catalog) -- detected once per
   device and cached;
2. :func:`rocmflash.db.lookup` for that GPU: same head dim, dtype, causal flag, GQA ratio
   and variant, nearest sequence-length bucket (the key length: it sets the work per
   query block); only entries measured on a live GPU (``measured_only=True``), as
   :func:`rocmflash.api.attention._resolve_config` does;
3. if there is no entry (or no database, or ``rocmflash.db`` is unavailable, or its
   config is unusable), :func:`rocmflash.config.default_config` for the arch -- the
   per-arch default the kernel tests run with.

:func:`rocmflash.api.selection_fp8.select_fp8_config` is the fp8 forward's (fp8 q/k/v): the measured
entry keyed by the inputs' own format (``d128-fp8e4m3fnuz-...``, written by ``rocmflash tune --dtype
fp8``), else None (the fp8 kernel's per-arch default, :func:`rocmflash.kernels.fp8.forward.default_config`).

:func:`select_varlen_config` (``flash_attn_varlen_func``'s forward) reads the packed kernel's own
``varlen-`` entries first and falls back to the above for the dense problem of the longest sequence;
:func:`select_varlen_bwd_config` (its backward) reads ``varlen-bwd-`` entries, then the dense ``bwd-``
entry, then the per-arch backward default, and serves only configs that build as the varlen kernels.

On a live GPU, a forward entry's config is checked at its first compiled launch against the profile the
entry records (:mod:`rocmflash.api.build_check`; ``ROCMFLASH_NO_BUILD_CHECK=1`` turns it off): one that no
longer holds under the installed compiler is replaced by the entry's next near-best config (then ranked, then
the arch default), and the answer cached here becomes that (:func:`pending_check`; ``selection_details``'s
``"build_check"`` says why).

Nothing is ever tuned here. Every answer is cached per (device, problem key), so a
repeat call is one dict lookup (well under a microsecond; see
``tests/test_selection_interp.py``). ``ROCMFLASH_NO_DB=1`` skips step 2 (defaults only).
:func:`clear_cache` forgets everything (call it after writing a database in-process;
:func:`rocmflash.db.clear_cache` is called with it).
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Optional

from rocmflash.api import build_check
from rocmflash.api.clear_hooks import register_clear, run_clear_hooks
from rocmflash.config import KernelConfig, default_config, normalize_dtype
from rocmflash.kernels.launch import env_reader

NO_DB_ENV = "ROCMFLASH_NO_DB"
_log = logging.getLogger("rocmflash.api.selection")

_DEVICE: dict = {}  # device key -> (gpu catalog name or None, arch or None)
_FWD: dict = {}  # problem key -> KernelConfig
_BWD: dict = {}
_VARLEN: dict = {}  # packed-forward problem key -> KernelConfig
_VARLEN_BWD: dict = {}  # packed-backward problem key -> BwdConfig
_LAST_SOURCE: dict = {}  # problem key -> "db" | "default" (introspection / tests)
_PENDING: dict = {}  # forward problem key -> its entry's undecided first-use build check (build_check.Check)


_OVERRIDES: dict = {}  # family -> the config every problem of it runs (rocmflash.api.select.Selector.override)


def overridden(family: str):
    """The config :meth:`rocmflash.api.select.Selector.override` forces on ``family`` now, or None."""
    return _OVERRIDES.get(family) if _OVERRIDES else None


def set_override(family: str, config) -> None:
    """Force ``config`` on every problem of ``family`` (None: stop); callers clear the kept choices
    (:meth:`rocmflash.api.select.Selector.override` does both)."""
    if config is None:
        _OVERRIDES.pop(family, None)
    else:
        _OVERRIDES[family] = config


def clear_cache() -> None:
    """Forget the detected devices and every selected config (also the database's caches and what callers
    keep from a selection: :mod:`rocmflash.api.ops`'s per-signature call plans, :func:`register_clear` of
    :mod:`rocmflash.api.clear_hooks`)."""
    run_clear_hooks()
    _DEVICE.clear()
    _FWD.clear()
    _BWD.clear()
    _VARLEN.clear()
    _VARLEN_BWD.clear()
    _LAST_SOURCE.clear()
    _PENDING.clear()
    build_check.clear()
    _INCUMBENT.clear()
    try:
        from rocmflash import db
    except ImportError:
        return
    clear = getattr(db, "clear_cache", None)
    if clear is not None:
        clear()
    from rocmflash.db.lookups.backward import clear_cache as clear_bwd
    from rocmflash.db.lookups.varlen import clear_cache as clear_varlen
    from rocmflash.db.lookups.varlen_bwd import clear_cache as clear_varlen_bwd

    clear_bwd()
    clear_varlen()
    clear_varlen_bwd()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def device_identity(device) -> tuple:
    """``(gpu_name, arch)`` of a torch device: tuning-target name (None if off-catalog) and arch
    (``gfx942``, ``sm_90``; None without a GPU). Cached per device.

    Under the interpreter (CPU tensors) the current GPU, if there is one, stands in for the
    device: the same database is read as the compiled run would read.
    """
    dev_type = getattr(device, "type", str(device))
    index = getattr(device, "index", None)
    interp = _interpreting()
    key = (dev_type, index, interp)
    hit = _DEVICE.get(key)
    if hit is not None:
        return hit
    _DEVICE[key] = _identify(dev_type, index, interp)
    return _DEVICE[key]


def _identify(dev_type: str, index, interp: bool) -> tuple:
    import torch

    if not ((dev_type == "cuda" and not interp) or (interp and torch.cuda.is_available())):
        return (None, None)
    if dev_type != "cuda" or index is None:
        index = torch.cuda.current_device()
    try:
        from rocmflash.hw.detect import identify_torch_device

        match = identify_torch_device(index)
    except Exception as err:  # pragma: no cover - catalog problems must never break attention
        warnings.warn(f"rocmflash: could not identify GPU {index} ({err}); using default configs",
                      RuntimeWarning, stacklevel=4)
        return (None, None)
    return (match.gpu.name if match.gpu is not None else None, match.arch or None)


def db_disabled() -> bool:
    """Whether ``ROCMFLASH_NO_DB`` asks for the per-arch defaults only."""
    return os.environ.get(NO_DB_ENV, "0") not in ("", "0")


def _db_lookup(gpu_name, head_dim, dtype, causal, gqa_ratio, seqlen, variant):
    """The database's match for this problem (:class:`rocmflash.db.DBMatch`), or None."""
    if gpu_name is None or db_disabled():
        return None
    try:
        from rocmflash import db
    except ImportError:
        return None
    try:
        match = db.lookup_match(gpu_name, head_dim, dtype, causal, gqa_ratio, seqlen, variant=variant,
                                measured_only=True)
    except Exception as err:  # a broken database must not break attention: warn, use the default
        warnings.warn(f"rocmflash: config database lookup failed ({err}); using the default config",
                      RuntimeWarning, stacklevel=4)
        return None
    if match is None:
        return None
    try:
        match.config.validate()
    except (ValueError, TypeError):
        return None
    if match.config.variant != variant:
        return None
    return match


def select_config(device, head_dim: int, dtype, causal: bool, gqa_ratio: int, seqlen_q: int,
                  seqlen_k: int, variant: str = "online") -> KernelConfig:
    """The forward config for this problem on ``device`` (database entry, else per-arch default)."""
    if _OVERRIDES and "forward" in _OVERRIDES:
        return _OVERRIDES["forward"]
    key = (getattr(device, "type", str(device)), getattr(device, "index", None), _interpreting(),
           int(head_dim), str(dtype), bool(causal), int(gqa_ratio), _bucket(seqlen_k), variant)
    cfg = _FWD.get(key)
    if cfg is not None:
        return cfg
    gpu_name, arch = device_identity(device)
    match = _db_lookup(gpu_name, int(head_dim), dtype, bool(causal), int(gqa_ratio), max(int(seqlen_k), 1), variant)
    cfg = match.config if match is not None else default_config(arch, int(head_dim), variant)
    _LAST_SOURCE[key] = _describe(match, gpu_name, arch, int(head_dim), dtype, bool(causal), int(gqa_ratio),
                                  int(seqlen_k), cfg)
    check = _build_check(device, match, gpu_name, arch, int(head_dim), dtype, bool(causal), int(gqa_ratio), variant)
    if check is not None:  # the entry's decision under this compiler (made, or made at the first compiled launch)
        cfg = check.config()
        _LAST_SOURCE[key]["build_check"] = check.summary()
        if not check.final:
            _PENDING[key] = check
            check.listeners.append(lambda c, key=key: _rechecked(key, c))
    _log.info("rocmflash: %s", _LAST_SOURCE[key]["text"])
    _FWD[key] = cfg
    return cfg


def _build_check(device, match, gpu_name, arch, head_dim: int, dtype, causal: bool, gqa_ratio: int, variant: str):
    """The first-use build check (:mod:`rocmflash.api.build_check`) of the entry ``match`` names, or None: no entry,
    no live GPU, or ``ROCMFLASH_NO_BUILD_CHECK`` is set."""
    if match is None or not build_check.armed(device):
        return None
    entry = match_entry(gpu_name, head_dim, dtype, causal, gqa_ratio, match)
    if not entry:
        return None
    from rocmflash.kernels.common import torch_backend

    return build_check.check_for(match.path, match.key, entry, match.config, arch, head_dim, variant,
                                 torch_backend())


def _rechecked(key: tuple, check) -> None:
    """A build check moved on: the selection of problem ``key`` serves what it serves now (and says why)."""
    _FWD[key] = check.config()
    details = _LAST_SOURCE.get(key)
    if details is not None:
        details["build_check"] = check.summary()
        details["config"] = check.config().to_dict()
    if check.final:
        _PENDING.pop(key, None)
        _log.info("rocmflash: build check of %s: %s", check.key, check.summary())


def pending_check(device, head_dim: int, dtype, causal: bool, gqa_ratio: int, seqlen_k: int,
                  variant: str = "online"):
    """The undecided first-use build check of a forward problem :func:`select_config` answered, or None (the usual
    case: decided, no entry, or not checked). A launcher asks this once, at a call signature's first launch."""
    if not _PENDING:
        return None
    return _PENDING.get((getattr(device, "type", str(device)), getattr(device, "index", None), _interpreting(),
                         int(head_dim), str(dtype), bool(causal), int(gqa_ratio), _bucket(seqlen_k), variant))


_INCUMBENT: dict = {}  #: (device, problem, bucket, train) -> the entry's SDPA backend (before the switch) or None


def incumbent_disabled() -> bool:
    """Whether ``ROCMFLASH_NO_INCUMBENT`` forbids running the platform's SDPA in place of rocmflash's kernels.
    Read on every call (a change of ``os.environ`` acts on the next call), at a dict read's cost
    (:func:`rocmflash.kernels.launch.env_reader`: ``os.environ.get`` of an unset name costs ~1 µs)."""
    return _NO_INCUMBENT() not in _OFF


def select_incumbent(device, head_dim: int, dtype, causal: bool, gqa_ratio: int, seqlen_k: int,
                     train: bool = False) -> Optional[str]:
    """The SDPA backend to run instead of rocmflash's kernel for this problem, or None (the usual case).

    A backend is named only when the database entry that :func:`select_config` serves carries an
    ``incumbent`` (timed beside the Triton configs by ``rocmflash tune``, :mod:`rocmflash.api.incumbent`)
    that was faster -- forward alone, or forward+backward when ``train`` -- and ``ROCMFLASH_NO_INCUMBENT``
    is not set. Cached per bucket (:func:`entry_incumbent`); the switch is read on every call."""
    if incumbent_disabled() or (_OVERRIDES and "forward" in _OVERRIDES):
        return None
    return entry_incumbent(device, head_dim, dtype, causal, gqa_ratio, seqlen_k, train)


def entry_incumbent(device, head_dim: int, dtype, causal: bool, gqa_ratio: int, seqlen_k: int,
                    train: bool = False) -> Optional[str]:
    """:func:`select_incumbent` before the ``ROCMFLASH_NO_INCUMBENT`` switch: what the served entry says
    (a caller that keeps the answer reads the switch itself, :func:`incumbent_disabled`). Cached per bucket."""
    key = (getattr(device, "type", str(device)), getattr(device, "index", None), _interpreting(), int(head_dim),
           str(dtype), bool(causal), int(gqa_ratio), _bucket(seqlen_k), bool(train))
    try:
        return _INCUMBENT[key]
    except KeyError:
        pass
    from rocmflash.api.incumbent import winner

    gpu_name, _ = device_identity(device)
    match = _db_lookup(gpu_name, int(head_dim), dtype, bool(causal), int(gqa_ratio), max(int(seqlen_k), 1), "online")
    field, why_not = _entry_timing(gpu_name, int(head_dim), dtype, bool(causal), int(gqa_ratio), match)
    _INCUMBENT[key] = backend = None if why_not else winner(field, bool(train))
    return backend


#: ``ROCMFLASH_NO_INCUMBENT=1``: never run the platform's SDPA in place of rocmflash's kernels
NO_INCUMBENT_ENV = "ROCMFLASH_NO_INCUMBENT"
_NO_INCUMBENT = env_reader(NO_INCUMBENT_ENV)  #: reads the switch as os.environ holds it now (a dict lookup)
_OFF = (None, "", "0", b"", b"0")
#: an entry's incumbent decides only for problems within this many length buckets (powers of two) of it
INCUMBENT_MAX_BUCKET_DISTANCE = 1


def incumbent_timing(gpu_name, head_dim: int, dtype, causal: bool, gqa_ratio: int, match) -> tuple:
    """``(the served entry's incumbent field or None, why that timing does not decide or None)`` for the entry
    ``match`` (a :class:`rocmflash.db.DBMatch`): it does not when the switch is set, when there is no measured
    entry or no timing in it, when the entry is more than :data:`INCUMBENT_MAX_BUCKET_DISTANCE` buckets away
    (an incumbent timed at S=8192 says little about S=256), or when it was timed on another platform than this
    torch's (:func:`rocmflash.api.incumbent.platform_refusal`). Run-time dispatch and ``rocmflash explain`` both
    ask this."""
    field, why_not = _entry_timing(gpu_name, head_dim, dtype, causal, gqa_ratio, match)
    if incumbent_disabled():
        return field, f"{NO_INCUMBENT_ENV} is set"
    return field, why_not


def match_entry(gpu_name, head_dim: int, dtype, causal: bool, gqa_ratio: int, match) -> dict:
    """The database entry a lookup's ``match`` (:class:`rocmflash.db.DBMatch`) names ({} for None or none)."""
    if match is None:
        return {}
    from rocmflash import db

    return next((e for _, b, e in db.entries_for(gpu_name, head_dim, dtype, causal, gqa_ratio, match.path)
                 if b == match.bucket), None) or {}


def _entry_timing(gpu_name, head_dim: int, dtype, causal: bool, gqa_ratio: int, match) -> tuple:
    """:func:`incumbent_timing` before the switch."""
    field = match_entry(gpu_name, head_dim, dtype, causal, gqa_ratio, match).get("incumbent") or None
    if match is None:
        return None, "no measured entry: rocmflash's per-arch default (no incumbent timed)"
    if match.bucket_distance > INCUMBENT_MAX_BUCKET_DISTANCE:
        return field, f"the entry is {match.bucket_distance} buckets away: its incumbent timing is not used"
    if field is None:
        return None, "the entry has no incumbent timing (tuned with --no-incumbent or before it existed)"
    from rocmflash.api.incumbent import database_platform, platform_refusal

    return field, platform_refusal(field, database_platform(match.path))  # timed on another platform: not here


def _describe(match, gpu_name, arch, head_dim, dtype, causal, gqa_ratio, seqlen_k, cfg) -> dict:
    """What a selection chose and how far it is from the problem asked (logged once per problem); ``cfg`` None:
    the fp8 kernel's own default (:func:`select_fp8_config`)."""
    from rocmflash.db.files import key_dtype  # the key's dtype (fp8: its format); works without rocmflash.db

    dt = key_dtype(dtype)
    bucket = _bucket(seqlen_k)
    asked = f"d{head_dim}-{dt}-{'causal' if causal else 'full'}-gqa{gqa_ratio}-s{bucket}"  # rocmflash.db's key
    if match is None:
        why = ("no GPU in the catalog" if gpu_name is None else
               f"no measured {gpu_name} entry for d{head_dim}/{dtype}/{'causal' if causal else 'full'}/"
               f"gqa{gqa_ratio}" if not db_disabled() else f"{NO_DB_ENV} is set")
        return {"source": "default", "asked": asked, "entry": None, "bucket_distance": None, "path": None,
                "config": cfg.to_dict() if cfg is not None else None,
                "text": f"{asked}: per-arch default for {arch or 'no GPU'} ({why})"
                        + (f": {cfg.to_json()}" if cfg is not None else "")}
    off = ("the asked bucket" if match.bucket_distance == 0 else
           f"{match.bucket_distance} bucket(s) ({2 ** match.bucket_distance}x in length) from s{bucket}")
    return {"source": "db", "asked": asked, "entry": match.key, "bucket_distance": match.bucket_distance,
            "path": match.path, "config": cfg.to_dict(),
            "text": f"{asked}: database entry {match.key} ({off}) of {match.path}: {cfg.to_json()}"}


def _varlen_key(device, head_dim, dtype, causal, gqa_ratio, max_seqlen_k) -> tuple:
    return ("varlen", getattr(device, "type", str(device)), getattr(device, "index", None), _interpreting(),
            int(head_dim), str(dtype), bool(causal), int(gqa_ratio), _bucket(max_seqlen_k))


def select_varlen_config(device, head_dim: int, dtype, causal: bool, gqa_ratio: int,
                         max_seqlen_k: int) -> KernelConfig:
    """The packed (varlen) forward's config on ``device``: the nearest measured ``varlen-`` entry of the
    live GPU's databases (``rocmflash tune --mode varlen``, :func:`rocmflash.db.lookups.varlen.lookup_varlen`:
    same head dim, dtype, causal flag and GQA ratio, nearest bucket of the longest key sequence), else
    what the dense problem of that length selects (:func:`select_config`, online variant).

    Cached per problem and length bucket: ``flash_attn_varlen_func`` calls this on every call, and a
    training loop's longest sequence changes from batch to batch. The choice is logged once.
    """
    if _OVERRIDES and "varlen" in _OVERRIDES:
        return _OVERRIDES["varlen"]
    key = _varlen_key(device, head_dim, dtype, causal, gqa_ratio, max_seqlen_k)
    cfg = _VARLEN.get(key)
    if cfg is not None:
        return cfg
    gpu_name, _ = device_identity(device)
    match = None
    if gpu_name is not None and not db_disabled():
        try:
            from rocmflash.db.lookups.varlen import lookup_varlen

            match = lookup_varlen(gpu_name, int(head_dim), normalize_dtype(dtype), int(gqa_ratio), bool(causal),
                                  max(int(max_seqlen_k), 1))
        except Exception as err:  # a broken database must not break attention: warn, use the dense choice
            warnings.warn(f"rocmflash: varlen config lookup failed ({err}); using the dense problem's config",
                          RuntimeWarning, stacklevel=3)
    if match is not None:
        cfg = match.config
        distance = "the asked bucket" if match.bucket_distance == 0 else f"{match.bucket_distance} bucket(s) away"
        text = f"varlen: database entry {match.key} ({distance}) of {match.path}: {cfg.to_json()}"
    else:
        cfg = select_config(device, head_dim, dtype, causal, gqa_ratio, max(int(max_seqlen_k), 1),
                            max(int(max_seqlen_k), 1), "online")
        text = f"varlen: no measured varlen entry; the dense problem's choice: {cfg.to_json()}"
    _LAST_SOURCE[key] = {"source": "varlen-db" if match is not None else "dense", "entry": match and match.key,
                         "bucket_distance": match and match.bucket_distance, "path": match and match.path,
                         "config": cfg.to_dict(), "text": text}
    _log.info("rocmflash: %s", text)
    _VARLEN[key] = cfg
    return cfg


def varlen_selection_details(device, head_dim, dtype, causal, gqa_ratio, max_seqlen_k) -> Optional[dict]:
    """For a packed forward already selected on ``device``: ``{"source": "varlen-db" | "dense", "entry",
    "bucket_distance", "path", "config", "text"}``, else None."""
    return _LAST_SOURCE.get(_varlen_key(device, head_dim, dtype, causal, gqa_ratio, max_seqlen_k))


def selection_details(device, head_dim, dtype, causal, gqa_ratio, seqlen_k, variant="online") -> Optional[dict]:
    """For a problem already selected on ``device``: ``{"source": "db" | "default", "asked", "entry",
    "bucket_distance", "path", "config", "text"}``, else None. The same text is logged once per
    problem at INFO level on the ``rocmflash.api.selection`` logger."""
    key = (getattr(device, "type", str(device)), getattr(device, "index", None), _interpreting(),
           int(head_dim), str(dtype), bool(causal), int(gqa_ratio), _bucket(seqlen_k), variant)
    return _LAST_SOURCE.get(key)


def selection_source(device, head_dim, dtype, causal, gqa_ratio, seqlen_k, variant="online") -> Optional[str]:
    """``"db"`` or ``"default"`` for a problem already selected, else None (introspection)."""
    details = selection_details(device, head_dim, dtype, causal, gqa_ratio, seqlen_k, variant)
    return details["source"] if details else None


def select_bwd_config(device, head_dim: int, dtype=None, causal: bool = False, gqa_ratio: int = 1,
                      seqlen_k: Optional[int] = None):
    """The backward config (:class:`rocmflash.kernels.backward.host.BwdConfig`) for this problem on ``device``.

    With ``dtype`` and ``seqlen_k`` given, the nearest measured ``bwd-`` entry of the live
    GPU's databases (same head dim, dtype, causal flag and GQA ratio; written by
    ``rocmflash tune --pass bwd``, :func:`rocmflash.db.lookups.backward.lookup_bwd`), else the
    per-arch default. Cached per problem; the choice is logged once, like the forward's.
    """
    if _OVERRIDES and "backward" in _OVERRIDES:
        return _OVERRIDES["backward"]
    bucket = _bucket(seqlen_k) if seqlen_k is not None else None
    key = ("bwd", getattr(device, "type", str(device)), getattr(device, "index", None), _interpreting(),
           int(head_dim), str(dtype), bool(causal), int(gqa_ratio), bucket)
    cfg = _BWD.get(key)
    if cfg is not None:
        return cfg
    from rocmflash.kernels.backward.host import default_bwd_config

    gpu_name, arch = device_identity(device)
    match = None
    if gpu_name is not None and dtype is not None and bucket is not None and not db_disabled():
        try:
            from rocmflash.db.lookups.backward import lookup_bwd

            match = lookup_bwd(gpu_name, int(head_dim), normalize_dtype(dtype), bool(causal), int(gqa_ratio),
                               int(seqlen_k))
        except Exception as err:  # a broken database must not break training: warn, use the default
            warnings.warn(f"rocmflash: backward config lookup failed ({err}); using the default config",
                          RuntimeWarning, stacklevel=3)
    cfg = match.config if match is not None else default_bwd_config(arch, int(head_dim))
    if match is not None:
        text = (f"backward: database entry {match.key} ("
                f"{'the asked bucket' if match.bucket_distance == 0 else f'{match.bucket_distance} bucket(s) away'}) "
                f"of {match.path}")
    else:
        text = f"backward: per-arch default for {arch or 'no GPU'}"
    _LAST_SOURCE[key] = {"source": "db" if match is not None else "default", "entry": match and match.key,
                         "bucket_distance": match and match.bucket_distance, "path": match and match.path,
                         "config": cfg, "text": text}
    _log.info("rocmflash: %s", text)
    _BWD[key] = cfg
    return cfg


def bwd_selection_details(device, head_dim, dtype, causal, gqa_ratio, seqlen_k) -> Optional[dict]:
    """For a backward already selected on ``device``: ``{"source": "db" | "default", "entry",
    "bucket_distance", "path", "config", "text"}``, else None."""
    key = ("bwd", getattr(device, "type", str(device)), getattr(device, "index", None), _interpreting(),
           int(head_dim), str(dtype), bool(causal), int(gqa_ratio), _bucket(seqlen_k))
    return _LAST_SOURCE.get(key)


def _varlen_bwd_key(device, head_dim, dtype, causal, gqa_ratio, max_seqlen_k, softcap, window) -> tuple:
    return ("varlen-bwd", getattr(device, "type", str(device)), getattr(device, "index", None), _interpreting(),
            int(head_dim), str(dtype), bool(causal), int(gqa_ratio), _bucket(max_seqlen_k), bool(softcap),
            bool(window))


def select_varlen_bwd_config(device, head_dim: int, dtype, causal: bool, gqa_ratio: int, max_seqlen_k: int,
                             softcap: bool = False, window: bool = False):
    """The packed (varlen) backward's :class:`~rocmflash.kernels.backward.host.BwdConfig` on ``device``, in order:

    1. the nearest measured ``varlen-bwd-`` entry (``rocmflash tune --mode varlen --pass bwd``,
       :func:`rocmflash.db.lookups.varlen_bwd.lookup_varlen_bwd`: same head dim, dtype, causal flag and GQA
       ratio, nearest bucket of the longest key sequence);
    2. else the dense backward's choice (:func:`select_bwd_config` with the longest key sequence: the
       nearest measured ``bwd-`` entry);
    3. else the per-arch backward default.

    A config from 1 or 2 that was not measured as this build -- every dense entry, and a varlen entry
    when ``softcap`` or a left ``window`` adds registers (the tune measured neither) -- is cross-compiled
    for the device's arch as the varlen kernels (in this process, cached on disk) and each kernel that
    fails to compile, spills in a loop or overflows LDS is replaced by the per-arch default's
    (:func:`rocmflash.api.build_check.usable_config`). Cached per problem, bucket and flags; logged once.
    """
    if _OVERRIDES and "varlen_bwd" in _OVERRIDES:
        return _OVERRIDES["varlen_bwd"]
    key = _varlen_bwd_key(device, head_dim, dtype, causal, gqa_ratio, max_seqlen_k, softcap, window)
    cfg = _VARLEN_BWD.get(key)
    if cfg is not None:
        return cfg
    from rocmflash.kernels.backward.host import default_bwd_config

    gpu_name, arch = device_identity(device)
    seqlen = max(int(max_seqlen_k), 1)
    match = None
    if gpu_name is not None and not db_disabled():
        try:
            from rocmflash.db.lookups.varlen_bwd import lookup_varlen_bwd

            match = lookup_varlen_bwd(gpu_name, int(head_dim), normalize_dtype(dtype), int(gqa_ratio), bool(causal),
                                      seqlen)
        except Exception as err:  # a broken database must not break training: warn, use the dense choice
            warnings.warn(f"rocmflash: varlen backward config lookup failed ({err}); using the dense choice",
                          RuntimeWarning, stacklevel=3)
    if match is not None:
        cfg, source, entry = match.config, "varlen-db", match.key
        distance = "the asked bucket" if match.bucket_distance == 0 else f"{match.bucket_distance} bucket(s) away"
        text = f"varlen backward: database entry {match.key} ({distance}) of {match.path}"
        measured_build = not (softcap or window)
    else:
        cfg = select_bwd_config(device, head_dim, dtype, causal, gqa_ratio, seqlen)
        dense = bwd_selection_details(device, head_dim, dtype, causal, gqa_ratio, seqlen)
        source, entry = ("dense-db", dense["entry"]) if dense["source"] == "db" else ("default", None)
        text = f"varlen backward: no measured varlen-bwd entry; the dense choice: {dense['text']}"
        measured_build = source == "default"  # the per-arch default is register-checked as the varlen kernels
    replaced = {}
    if not measured_build:
        cfg, replaced = build_check.usable_config(gpu_name, cfg, default_bwd_config(arch, int(head_dim)),
                                                  build_check.build_problem(head_dim, dtype, gqa_ratio, causal,
                                                                            softcap, window))
        for kernel, why in replaced.items():
            text += f"; its {kernel} config does not build as the varlen kernel ({why}): per-arch default instead"
    _LAST_SOURCE[key] = {"source": source, "entry": entry, "bucket_distance": match and match.bucket_distance,
                         "path": match and match.path, "config": cfg, "replaced": replaced, "text": text}
    _log.info("rocmflash: %s", text)
    _VARLEN_BWD[key] = cfg
    return cfg


def varlen_bwd_selection_details(device, head_dim, dtype, causal, gqa_ratio, max_seqlen_k, softcap=False,
                                 window=False) -> Optional[dict]:
    """For a packed backward already selected on ``device``: ``{"source": "varlen-db" | "dense-db" | "default",
    "entry", "bucket_distance", "path", "config", "replaced": {kernel: why}, "text"}``, else None."""
    return _LAST_SOURCE.get(_varlen_bwd_key(device, head_dim, dtype, causal, gqa_ratio, max_seqlen_k, softcap,
                                            window))


def _bucket(seqlen: int) -> int:
    s = max(int(seqlen), 1)
    return 1 << (s - 1).bit_length()


__all__ = ["select_config", "select_bwd_config", "select_varlen_config", "select_varlen_bwd_config",
           "varlen_selection_details", "varlen_bwd_selection_details", "bwd_selection_details", "clear_cache",
           "device_identity", "selection_source", "selection_details", "select_incumbent", "entry_incumbent",
           "incumbent_disabled", "incumbent_timing", "register_clear", "pending_check", "overridden", "set_override"]
