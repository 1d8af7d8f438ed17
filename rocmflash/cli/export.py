"""``rocmflash export``: a tuned database as JSON or as Python for a user's ``@triton.autotune``.

Every family of the database is exported, each in a section of its own (:data:`FAMILIES`): the forward
(``d{D}-...``: its best online, FA2-style config, as before), decode (``decode-...``: flash_attn_with_kvcache's
split-KV kernels), the packed forward (``varlen-...``) and the backward's dQ and dK/dV kernels (``bwd-...`` and
``varlen-bwd-...``). Each exported config comes with the problem fields it was tuned for, named as a kernel's
``@triton.autotune(key=[...])`` names them (``HEAD_DIM``, ``IS_CAUSAL``, ``N_CTX``, ...), and says how it was
chosen (:func:`entry_status`): ``measured`` (timed on a GPU), ``static`` (ranked on compiler truth only, nothing
timed) or ``interpreter`` (timed in Triton's CPU interpreter, which says nothing of a GPU). A problem whose tune
found no config (``best`` null, a ``failed`` entry) is listed under ``not_exported`` / ``NOT_EXPORTED`` with its
cause, never as a config. Both outputs start with the device: the GPU, its arch and the database's fingerprint
(the rocmflash, Triton and torch that tuned it).

The database is read as every reader reads it (:func:`rocmflash.db.read_database`): a malformed entry is
left out with one warning, and a stored config missing an optional key (``PRE_LOAD_V``, ...) exports with the
config record's default.

:mod:`rocmflash.cli.tune` re-exports every name here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, NamedTuple, Optional

from rocmflash.cli.tune_args import _error
from rocmflash.db.entries import BWD, DECODE, FORWARD, VARLEN, VARLEN_BWD
from rocmflash.hw.gpus import UnknownGPUError

#: entry modes of other kernels (decode, the backward, the packed forward): never read as forward entries
NOT_FORWARD_MODES = ("decode", "bwd", "varlen")

#: the config fields each kernel takes as arguments (the others are launch options, or rocmflash's own knobs)
FORWARD_TILE = ("BLOCK_M", "BLOCK_N", "PRE_LOAD_V")
BWD_TILE = ("BLOCK_M", "BLOCK_N")
DECODE_TILE = ("BLOCK_N",)
#: AMD compile options a ``triton.Config`` carries as kwargs (the hip backend reads them at launch)
AMD_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
#: how a config was chosen (:func:`entry_status`), as the Python output's comments say it
LABELS = {"measured": "measured", "static": "UNMEASURED: static ranking",
          "interpreter": "UNMEASURED: timed in the CPU interpreter, not on a GPU"}


class ExportFamily(NamedTuple):
    """How one family of database entries is exported."""

    name: str  #: its :func:`rocmflash.db.entries.family`
    prefix: str  #: of its Python names (``<prefix>_KEY``, ``<prefix>_PROBLEMS``, ...)
    title: str  #: what its kernels are (the section's heading)
    key_form: str  #: its database keys
    fields: Callable[[str], Optional[dict]]  #: a key's problem fields (autotune names), None if it does not parse
    autotune_key: tuple  #: the fields for ``@triton.autotune(key=[...])`` (no dtype: Triton keys on dtypes itself)
    tile: tuple  #: the config fields passed as kernel arguments
    kernels: tuple = ()  #: ``()``: one config per entry; a backward's ``("dq", "dkdv")``: one per kernel


def _forward_fields(key: str) -> Optional[dict]:
    from rocmflash.db.entries import parse_key

    try:
        p = parse_key(key)
    except (ValueError, IndexError):
        return None
    return {"HEAD_DIM": p["head_dim"], "DTYPE": p["dtype"], "IS_CAUSAL": p["causal"], "GQA_RATIO": p["gqa_ratio"],
            "N_CTX": p["seqlen_bucket"]}


def _bwd_fields(key: str) -> Optional[dict]:
    """``bwd-<the forward's key>``: the forward's fields."""
    return _forward_fields(key[len("bwd-"):])


def _varlen_fields(key: str, prefix: str = "varlen") -> Optional[dict]:
    from rocmflash.db.lookups.varlen import parse_varlen_key

    p = parse_varlen_key(key, prefix)
    if p is None:
        return None
    return {"HEAD_DIM": p["head_dim"], "DTYPE": p["dtype"], "IS_CAUSAL": p["causal"], "GQA_RATIO": p["group"],
            "MAX_SEQLEN": p["bucket"]}


def _decode_fields(key: str) -> Optional[dict]:
    from rocmflash.db.lookups.decode import parse_decode_key

    p = parse_decode_key(key)
    if p is None:
        return None
    # a 16-bit cache holds the queries' dtype: the key names a cache dtype only for fp8 formats
    return {"HEAD_DIM": p["head_dim"], "DTYPE": p["dtype"], "KV_DTYPE": p.get("kv_dtype", p["dtype"]),
            "GQA_RATIO": p["group"], "N_CTX_K": p["kv_bucket"], "BATCH": p["batch_bucket"],
            "PAGE_SIZE": p["page_size"]}


#: every family, in the order of both outputs
FAMILIES = (
    ExportFamily(FORWARD, "FORWARD", "forward (rocmflash.attention, flash_attn_func): the best online (FA2-style) "
                 "config per problem", "d<head_dim>-<dtype>-<causal|full>-gqa<ratio>-s<seqlen bucket>",
                 _forward_fields, ("HEAD_DIM", "IS_CAUSAL", "GQA_RATIO", "N_CTX"), FORWARD_TILE),
    ExportFamily(DECODE, "DECODE", "decode (flash_attn_with_kvcache's split-KV kernels; BLOCK_M is their 16-query "
                 "tile; DECODE_NUM_SPLITS: the tuned split count, 0 = chosen per call)",
                 "decode-d<head_dim>-<dtype>-gqa<ratio>-kv<cached keys bucket>-b<batch bucket>[-p<page size>]"
                 "[-kv<fp8 cache format>]", _decode_fields, ("HEAD_DIM", "GQA_RATIO", "N_CTX_K", "BATCH", "PAGE_SIZE"),
                 DECODE_TILE),
    ExportFamily(VARLEN, "VARLEN", "packed forward (flash_attn_varlen_func)",
                 "varlen-d<head_dim>-<dtype>-gqa<ratio>[-causal]-s<longest sequence bucket>", _varlen_fields,
                 ("HEAD_DIM", "IS_CAUSAL", "GQA_RATIO", "MAX_SEQLEN"), FORWARD_TILE),
    ExportFamily(BWD, "BWD", "backward (the autograd backward's dQ and dK/dV kernels; BWD_HEAD_SPLITS: the dK/dV "
                 "kernel's head splits, 0 = automatic)", "bwd-<the forward's key>", _bwd_fields,
                 ("HEAD_DIM", "IS_CAUSAL", "GQA_RATIO", "N_CTX"), BWD_TILE, ("dq", "dkdv")),
    ExportFamily(VARLEN_BWD, "VARLEN_BWD", "packed backward (flash_attn_varlen_func's dQ and dK/dV kernels; "
                 "VARLEN_BWD_HEAD_SPLITS as BWD_HEAD_SPLITS)", "varlen-bwd-<the packed forward's key without varlen->",
                 lambda key: _varlen_fields(key, "varlen-bwd"), ("HEAD_DIM", "IS_CAUSAL", "GQA_RATIO", "MAX_SEQLEN"),
                 BWD_TILE, ("dq", "dkdv")),
)
_BY_NAME = {fam.name: fam for fam in FAMILIES}


class Row(NamedTuple):
    """One exported entry: its key, the stored entry, its problem fields and how it was chosen."""

    key: str
    entry: dict
    fields: dict
    status: str  #: :func:`entry_status`
    #: ``{kernel: (kwargs, {"num_warps", "num_stages"})}`` (kernel None for a one-kernel family); empty for a
    #: forward entry whose best is of another variant with no online config recorded
    configs: dict
    note: str  #: what the Python output's comment adds after the label (a rate, the variant that won, ...)


# ---------------------------------------------------------------------- what each entry holds
def entry_status(entry: dict) -> str:
    """How an entry's config was chosen: ``measured`` (timed on a GPU: what run-time selection serves,
    :func:`rocmflash.db.servable`), ``interpreter`` (timed in Triton's CPU interpreter: no GPU's numbers) or
    ``static`` (``measured: false``: ranked on compiler truth, nothing timed)."""
    from rocmflash.db import servable

    if servable(entry):
        return "measured"
    return "interpreter" if entry.get("measured") else "static"


def _triton_kwargs(cfg: dict, vendor: str, tile: tuple = FORWARD_TILE,
                   amd: tuple = AMD_OPTIONS) -> tuple[dict, dict]:
    """``(kwargs, {"num_warps", "num_stages"})`` of a ``triton.Config`` for a stored config: the kernel's
    ``tile`` fields, and on AMD its compile options (``schedule_hint`` only when one is set)."""
    kwargs = {name: cfg[name] for name in tile}
    if vendor == "amd":
        kwargs.update((name, cfg[name]) for name in amd)
        if cfg.get("schedule_hint", "none") != "none":
            kwargs["schedule_hint"] = cfg["schedule_hint"]
    return kwargs, {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}


def _online(entry: dict) -> Optional[dict]:
    """A forward entry's best online config (the best itself, or the online row of ``best_per_variant``)."""
    if entry["best"].get("variant", "online") == "online":
        return entry["best"]
    return ((entry.get("best_per_variant") or {}).get("online") or {}).get("config")


def _forward_configs(entry: dict, vendor: str, measured: bool) -> tuple[dict, str]:
    """``(configs, note)`` of a forward entry: its best online config (and, when ``measured``, its rate), or
    none and why."""
    cfg = _online(entry)
    if not cfg:
        return {}, f"its best is {entry['best'].get('variant')!r} (a kernel of rocmflash's own) and no online " \
                   "config was recorded"
    rows = [{"config": entry["best"], "tflops": entry.get("tflops")}, *(entry.get("best_per_variant") or {}).values()]
    tflops = next((row.get("tflops") for row in rows if row.get("config") == cfg), None) if measured else None
    note = f"{tflops:.1f} TFLOP/s" if tflops else ""
    if measured and not note and cfg is entry["best"]:
        note = _rate(entry)  # an entry timed without a FLOP rate (served, not tuned): its time
    if cfg is not entry["best"]:
        note = ", ".join(filter(None, [note, f"the best online config; {entry['best'].get('variant')} was faster"]))
    return {None: _triton_kwargs(cfg, vendor)}, note


def _rate(entry: dict) -> str:
    """An entry's measured speed in words: TFLOP/s, else its time (a backward's total), else nothing."""
    if entry.get("tflops"):
        return f"{entry['tflops']:.1f} TFLOP/s"
    ms = entry.get("time_ms")
    ms = ms.get("total") if isinstance(ms, dict) else ms
    return f"{ms:.4g} ms" if isinstance(ms, (int, float)) and not isinstance(ms, bool) else ""


def _configs(fam: ExportFamily, entry: dict, vendor: str, measured: bool) -> tuple[dict, str]:
    """``(configs, note)`` of an entry of ``fam`` (:class:`Row`); a rate only for a ``measured`` entry (an
    interpreter's time says nothing of a GPU)."""
    if fam.name == FORWARD:
        return _forward_configs(entry, vendor, measured)
    best, note = entry["best"], _rate(entry) if measured else ""
    if fam.name == DECODE:  # DecodeConfig's defaults for what an older entry leaves out
        cfg = {"waves_per_eu": 0, "num_splits": 0, **best}
        return {None: _triton_kwargs(cfg, vendor, fam.tile, ("waves_per_eu",))}, note
    if fam.kernels:
        return {kernel: _triton_kwargs(best[kernel], vendor, fam.tile) for kernel in fam.kernels}, note
    return {None: _triton_kwargs(best, vendor, fam.tile)}, note


def _no_config_reason(entry) -> str:
    """Why a config-less entry exports no config: a tune's recorded failure, else what it says."""
    if not isinstance(entry, dict):
        return "the entry is not an object"
    if entry.get("failed"):
        return f"failed: {entry['failed']}"
    why = entry.get("why_unmeasured") or entry.get("note")
    return f"no config (best is null: a tune found none{f'; {why}' if why else ''})"


def sort_entries(data: dict, vendor: str, no_config: Optional[dict] = None) -> tuple[dict, dict]:
    """``({family name: [Row, ...]}, {key: why it is not exported})`` of ``data``'s entries.

    ``data``: entries as :func:`rocmflash.db.read_database` gives them (config-less ones absent: pass them as
    ``no_config``, ``{key: stored entry}``); a config-less entry in ``data`` itself is not exported either."""
    from rocmflash.db.entries import family

    rows: dict = {fam.name: [] for fam in FAMILIES}
    skipped = {key: _no_config_reason(entry) for key, entry in (no_config or {}).items()}
    for key, entry in data["entries"].items():
        fam = _BY_NAME.get(family(key))
        if not isinstance(entry, dict) or not entry.get("best"):
            skipped[key] = _no_config_reason(entry)
            continue
        if fam is None or (fam.name == FORWARD and entry.get("mode") in NOT_FORWARD_MODES):
            skipped[key] = f"not an entry of a family export knows (mode {entry.get('mode')!r})"
            continue
        fields = fam.fields(key)
        if fields is None:
            skipped[key] = f"the key is not a {fam.name} key ({fam.key_form})"
            continue
        status = entry_status(entry)
        configs, note = _configs(fam, entry, vendor, status == "measured")
        rows[fam.name].append(Row(key, entry, fields, status, configs, note))
    return rows, skipped


def _label(row: Row) -> str:
    """The comment of a config: how it was chosen, then its note (a measured one's rate, ...)."""
    return ", ".join(filter(None, [LABELS[row.status], row.note]))


def _kernel_label(row: Row, kernel: Optional[str]) -> str:
    """:func:`_label` of one kernel's config: a measured backward kernel's own time, not the pair's."""
    ms = row.entry.get("time_ms")
    if row.status == "measured" and kernel and isinstance(ms, dict) and isinstance(ms.get(kernel), (int, float)):
        return f"{LABELS['measured']}, {kernel} {ms[kernel]:.4g} ms of {row.note or 'the pair'}"
    return _label(row)


# ---------------------------------------------------------------------- the header
def _fingerprint(data: dict) -> dict:
    return data.get("fingerprint") if isinstance(data.get("fingerprint"), dict) else {}


def device_header(data: dict) -> dict:
    """The device a database was tuned for and on: the catalog GPU, its arch, the timing device's name and the
    database's fingerprint (rocmflash, Triton, torch, runtime)."""
    from rocmflash.hw.gpus import get_gpu

    fp = _fingerprint(data)
    try:
        marketing = get_gpu(data["gpu"]).marketing_name
    except (ValueError, TypeError, KeyError):
        marketing = None
    return {"gpu": data.get("gpu"), "marketing_name": marketing, "arch": data.get("arch"), "name": fp.get("device"),
            "rocmflash": fp.get("rocmflash"), "triton": fp.get("triton"), "torch": fp.get("torch"),
            "runtime": fp.get("runtime")}


# ---------------------------------------------------------------------- JSON
def _json_config(kwargs_opts: tuple) -> dict:
    kwargs, opts = kwargs_opts
    return {"kwargs": kwargs, **opts}


def _json_item(fam: ExportFamily, row: Row, header_fp: dict) -> dict:
    """One exported entry as JSON: the forward's keys as before (``measured``, ``tflops``, ``best``, ``when``,
    ``triton_config``), then how it was chosen, its fields and its family's extras."""
    e = row.entry
    item = {"measured": row.status == "measured", "tflops": e.get("tflops"), "best": e["best"], "when": e.get("when"),
            "status": row.status, "label": _label(row), "fields": row.fields}
    for name in ("time_ms", "timing", "strategy", "complete", "why_unmeasured"):
        if e.get(name) is not None:
            item[name] = e[name]
    if isinstance(e.get("fingerprint"), dict) and e["fingerprint"] != header_fp:
        item["fingerprint"] = e["fingerprint"]  # tuned in another environment than the file's header says
    if fam.kernels:
        item["triton_config"] = {kernel: _json_config(row.configs[kernel]) for kernel in fam.kernels}
        item["head_splits"] = e["best"].get("head_splits", 0)
    elif row.configs:
        item["triton_config"] = _json_config(row.configs[None])
    else:
        item["no_triton_config"] = row.note
    if fam.name == DECODE:
        item["num_splits"] = e["best"].get("num_splits", 0)
    return item


def export_json(data: dict, vendor: str, no_config: Optional[dict] = None) -> dict:
    """The export's JSON of ``data`` (entries as :func:`rocmflash.db.read_database` gives them; ``no_config``:
    the config-less entries it leaves out, :func:`sort_entries`).

    ``entries`` (and ``measured``) are the forward's, as before; ``families`` holds every family (the forward's
    ``entries`` again) with its autotune ``key``; ``not_exported`` says why each config-less entry has none."""
    rows, skipped = sort_entries(data, vendor, no_config)
    fp = _fingerprint(data)
    families = {}
    for fam in FAMILIES:
        entries = {row.key: _json_item(fam, row, fp) for row in rows[fam.name]}
        families[fam.name] = {"title": fam.title, "key_form": fam.key_form, "key": list(fam.autotune_key),
                              "measured": any(item["measured"] for item in entries.values()), "entries": entries}
    forward = families[FORWARD]
    return {"format": "rocmflash-export", "schema_version": data["schema_version"], "gpu": data["gpu"],
            "arch": data.get("arch"), "fingerprint": data.get("fingerprint"), "measured": forward["measured"],
            "entries": forward["entries"], "device": device_header(data), "updated": data.get("updated"),
            "families": families, "not_exported": skipped}


# ---------------------------------------------------------------------- Python for @triton.autotune
def _py(value) -> str:
    """JSON data as a Python literal (JSON's own text, with Python's True, False and None)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return repr(value)
    return json.dumps(value)


def _config_text(kwargs_opts: tuple) -> str:
    kwargs, opts = kwargs_opts
    return f"triton.Config({_py(kwargs)}, num_warps={opts['num_warps']}, num_stages={opts['num_stages']})"


def _config_names(fam: ExportFamily, kernel: Optional[str]) -> tuple[str, str]:
    """``(per-key dict, distinct list)`` names of a family's (kernel's) configs; the forward's are the names
    this export always had, ``CONFIGS`` and ``AUTOTUNE_CONFIGS``."""
    if fam.name == FORWARD:
        return "CONFIGS", "AUTOTUNE_CONFIGS"
    stem = fam.prefix + (f"_{kernel.upper()}" if kernel else "")
    return f"{stem}_CONFIGS", f"{stem}_AUTOTUNE_CONFIGS"


def _dict_lines(name: str, items: list) -> list:
    """``NAME = {key: value, ...}`` from ``[(key, value text, comment or "")]``."""
    body = [f"    {key!r}: {text},{f'  # {note}' if note else ''}" for key, text, note in items]
    return [f"{name} = {{", *body, "}"]


def _family_lines(fam: ExportFamily, rows: list) -> list:
    """One family's section: its autotune key, its configs per database key and distinct, its problems."""
    exported = [row for row in rows if row.configs]
    lines = ["", f"# ---------------------------------------------------------------- {fam.title}",
             f"# database key = {fam.key_form}", f"{fam.prefix}_KEY = {_py(list(fam.autotune_key))}"]
    for kernel in fam.kernels or (None,):
        per_key, distinct = _config_names(fam, kernel)
        texts = [(row.key, _config_text(row.configs[kernel]), _kernel_label(row, kernel)) for row in exported]
        lines += _dict_lines(per_key, texts)
        unique = list(dict.fromkeys(text for _, text, _ in texts))
        lines += ["", f"# the distinct configs, e.g. for @triton.autotune(configs={distinct}, ...)",
                  f"{distinct} = ["] + [f"    {text}," for text in unique] + ["]"]
    lines += _dict_lines(f"{fam.prefix}_PROBLEMS", [(row.key, _py(row.fields), "") for row in exported])
    if fam.name == DECODE:
        lines += _dict_lines("DECODE_NUM_SPLITS", [(r.key, str(r.entry["best"].get("num_splits", 0)), "")
                                                   for r in exported])
    if fam.kernels:
        lines += _dict_lines(f"{fam.prefix}_HEAD_SPLITS", [(r.key, str(r.entry["best"].get("head_splits", 0)), "")
                                                          for r in exported])
    return lines


def _header_lines(data: dict) -> list:
    fp, dev = _fingerprint(data), device_header(data)
    return [f"# rocmflash export: {data['gpu']} ({data.get('arch')}); device {fp.get('device')}, "
            f"triton {fp.get('triton')}, torch {fp.get('torch')}",
            f"# {dev['marketing_name'] or data['gpu']}; database fingerprint: rocmflash {fp.get('rocmflash')}, "
            f"runtime {fp.get('runtime')}; updated {data.get('updated')}",
            "# each config's comment (and MEASURED) says how it was chosen: measured (timed on the GPU), "
            f"{LABELS['static']!r} (ranked on compiler truth, nothing timed) or {LABELS['interpreter']!r}; a "
            "problem whose tune found no config is in NOT_EXPORTED, never a config",
            "#",
            "# Use with @triton.autotune: each family below has <FAMILY>_KEY, the problem fields its configs were",
            "# tuned for as a kernel's autotune key names them (rename them to your kernel's arguments; no dtype:",
            "# Triton's autotuner adds every tensor argument's dtype to its key), its configs per database key and",
            "# distinct, and <FAMILY>_PROBLEMS, each key's fields. prune_to_tuned keeps the one config tuned for a",
            "# call's problem (nearest sequence-length bucket, as rocmflash picks; measured ones only), so Triton",
            "# times nothing new; where none was tuned it keeps them all. For example:",
            "#",
            "#   @triton.autotune(configs=AUTOTUNE_CONFIGS, key=FORWARD_KEY, prune_configs_by={",
            "#       \"early_config_prune\": prune_to_tuned(CONFIGS, FORWARD_PROBLEMS, DTYPE=\"Q\", GQA_RATIO=1)})",
            "#   @triton.jit",
            "#   def attn_fwd(Q, K, V, Out, ..., HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr, N_CTX,",
            "#                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRE_LOAD_V: tl.constexpr): ...",
            "import triton"]


#: the helpers of the Python output (public Triton only: ``Config``'s kwargs, num_warps and num_stages, and
#: ``early_config_prune(configs, named_args, **kwargs)``)
HELPERS = '''
# ---------------------------------------------------------------- helpers
#: fields tuned per power-of-two bucket (a call's value is rounded up to one); every other field must be equal
BUCKETED = ("N_CTX", "MAX_SEQLEN", "N_CTX_K", "BATCH")
_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8e4m3fn", "float8_e4m3fnuz": "fp8e4m3fnuz",
           "float8_e5m2": "fp8e5m2", "float8_e5m2fnuz": "fp8e5m2fnuz"}


def _field_value(field, value):
    """A call's value of a problem field as the export writes it: a dtype by name (of a tensor: its dtype), a
    bucketed length as its bucket."""
    if field in ("DTYPE", "KV_DTYPE"):
        name = str(getattr(value, "dtype", value)).replace("torch.", "")
        return _DTYPES.get(name, name)
    if field in BUCKETED:
        return 1 << (max(1, int(value)) - 1).bit_length()
    return value


def tuned_config(tuned, problems, measured_only=True, **problem):
    """The config ``tuned`` (e.g. CONFIGS) holds for the tuned problem nearest ``problem``, or None.

    ``problems``: the family's fields per key (e.g. FORWARD_PROBLEMS); ``problem``: every one of those fields, as
    a call has them (N_CTX=3000, DTYPE=torch.bfloat16). Nearest as rocmflash picks: every field but the BUCKETED
    ones equal, then the fewest powers of two away (ties: the larger bucket). ``measured_only``: skip configs no
    GPU timed (MEASURED)."""
    names = {field for fields in problems.values() for field in fields}
    if names and set(problem) != names:
        raise TypeError(f"tuned_config: give exactly the fields {sorted(names)}, got {sorted(problem)}")
    asked = {field: _field_value(field, value) for field, value in problem.items()}
    best = None
    for key, config in tuned.items():
        fields = problems[key]
        if (measured_only and not MEASURED.get(key)) or any(
                fields[f] != v for f, v in asked.items() if f not in BUCKETED):
            continue
        far = [abs(fields[f].bit_length() - asked[f].bit_length()) for f in BUCKETED if f in asked]
        rank = (sum(far), far, [-fields[f] for f in BUCKETED if f in asked])
        if best is None or rank < best[0]:
            best = (rank, config)
    return None if best is None else best[1]


def prune_to_tuned(tuned, problems, measured_only=True, **arg_names):
    """``prune_configs_by={"early_config_prune": prune_to_tuned(CONFIGS, FORWARD_PROBLEMS, DTYPE="Q")}``: of the
    autotune configs, only the one :func:`tuned_config` picks for the call; all of them where it picks none or
    the one it picks is not among them.

    ``arg_names``: per field, the kernel argument holding it where the names differ (DTYPE="Q": a tensor, its
    dtype is read), or a value that is not a string for a field the kernel has no argument for (GQA_RATIO=1)."""
    names = sorted({field for fields in problems.values() for field in fields})

    def prune(configs, named_args, **kwargs):
        args, problem = {**named_args, **kwargs}, {}
        for field in names:
            source = arg_names.get(field, field)
            if not isinstance(source, str):
                problem[field] = source
            elif source in args:
                problem[field] = args[source]
            else:
                raise KeyError(f"prune_to_tuned: the kernel has no argument {source!r} for {field}; pass "
                               f"{field}=<its argument's name> or {field}=<a fixed value>")
        hit = tuned_config(tuned, problems, measured_only, **problem)
        same = [c for c in configs if hit is not None and (c.kwargs, c.num_warps, c.num_stages)
                == (hit.kwargs, hit.num_warps, hit.num_stages)]
        return same or list(configs)

    return prune
'''


def export_triton(data: dict, vendor: str, no_config: Optional[dict] = None) -> str:
    """``data``'s configs as Python for ``@triton.autotune`` (entries as :func:`rocmflash.db.read_database` gives
    them; ``no_config`` as :func:`export_json`): valid Python that imports ``triton`` and builds every
    ``triton.Config``, one section per family, then ``MEASURED``, ``NOT_EXPORTED`` and the helpers."""
    rows, skipped = sort_entries(data, vendor, no_config)
    lines = _header_lines(data)
    for fam in FAMILIES:
        lines += _family_lines(fam, rows[fam.name])
        skipped.update((row.key, row.note) for row in rows[fam.name] if not row.configs)
    measured = [(row.key, str(row.status == "measured"), "") for fam in FAMILIES for row in rows[fam.name]
                if row.configs]
    lines += ["", "# ---------------------------------------------------------------- every family",
              "#: whether a GPU timed each key's config (False: a static ranking or an interpreter run only)"]
    lines += _dict_lines("MEASURED", measured)
    lines += ["#: the database's problems with no config here, and why"]
    lines += _dict_lines("NOT_EXPORTED", [(key, _py(why), "") for key, why in skipped.items()])
    return "\n".join(lines) + "\n" + HELPERS


# ---------------------------------------------------------------------- the command
def _no_config_entries(path: str) -> dict:
    """``{key: stored entry}`` of a database's well-formed entries that hold no config (``best`` null, ``failed``),
    which :func:`rocmflash.db.read_database` leaves out (the export lists them as not exported)."""
    from rocmflash.db import ConfigDB
    from rocmflash.db.entries import check_entries

    entries = ConfigDB.read(path)["entries"]
    return {key: entries[key] for key in check_entries(path, entries, warn=False).no_config}


def _database_path(args: argparse.Namespace, gpu) -> str:
    """The file ``--db`` names, else the first of the GPU's databases that exists; ValueError (one line) if none."""
    from rocmflash.db import database_paths

    if args.db:
        if os.path.isdir(args.db):
            raise ValueError(f"--db {args.db} is a directory; --db takes a database file such as {gpu.name}.json")
        if not os.path.isfile(args.db):
            raise ValueError(f"--db {args.db}: no such file (a config database such as {gpu.name}.json)")
        return args.db
    candidates = database_paths(gpu.name)
    path = next((p for p in candidates if os.path.isfile(p)), None)
    if path is None:
        raise ValueError(f"no config database for {gpu.name} at {' or '.join(candidates)}; run "
                         f"`rocmflash tune --gpu {gpu.name} ...` first or pass --db")
    return path


def run_export(args: argparse.Namespace) -> int:
    """``rocmflash export``: its exit code (0; 2 with one ``error:`` line for bad input)."""
    from rocmflash.db import DBError, read_database
    from rocmflash.hw.gpus import get_gpu

    try:
        gpu = get_gpu(args.gpu)
        path = _database_path(args, gpu)
        data = read_database(path)
        if data.get("gpu") != gpu.name:
            raise ValueError(f"{path} holds configs for {data.get('gpu')!r}, not {gpu.name!r}")
        no_config = _no_config_entries(path)
    except OSError as err:  # unreadable (permissions, a file that vanished): the file and the reason, one line
        return _error(f"cannot read {err.filename or args.db}: {err.strerror or err}")
    except (UnknownGPUError, DBError, ValueError) as err:
        return _error(str(err))
    if args.format == "json":
        print(json.dumps(export_json(data, gpu.vendor, no_config), indent=1))
    else:
        sys.stdout.write(export_triton(data, gpu.vendor, no_config))
    return 0
