"""``rocmflash tune`` and ``rocmflash export``: the argument parsers and the checks of their values
(one-line errors, exit code 2), before anything runs. :mod:`rocmflash.cli.tune` re-exports every name here.
"""

from __future__ import annotations

import argparse
import os
import sys

TUNE_DESCRIPTION = (
    "Static phase (cross-compile the config space on the CPU and prune it on compiler truth), then, only when "
    "the live GPU is the one named, gate every chosen config against an fp32 reference and time it in an "
    "isolated worker (L2 flushed, rotating inputs, median). Every result is appended to "
    "<db>.journal.jsonl as it arrives; a re-run or --resume skips what is already there. Winners go to the "
    "config database (default ~/.config/rocmflash/<gpu>.json, or $ROCMFLASH_CONFIG_DIR) keyed by head dim, dtype, causal, GQA ratio and "
    "sequence-length bucket (next power of two). Without a matching live GPU the static ranking is written "
    "with \"measured\": false and nothing is benchmarked.")


def add_tune_parsers(subparsers) -> None:
    """Add the ``tune`` and ``export`` subcommands to an argparse subparsers object."""
    tune = subparsers.add_parser("tune", help="tune attention configs (static phase + live timing) into the DB",
                                 description=TUNE_DESCRIPTION)
    tune.add_argument("--gpu", required=True, metavar="GPU|auto",
                      help="catalog name (see `rocmflash gpus`) or auto (the live device)")
    tune.add_argument("--model", default=None, metavar="PATH|NAME",
                      help="tune every attention problem of a model: a transformers config.json (or a folder "
                           "holding one; nothing is downloaded) or a preset (" + ", ".join(_preset_names()) + "): "
                           "causal prefill forward and backward and KV-cache decode, fp16 and bf16, seqlen buckets "
                           "1k..32k up to its context length")
    tune.add_argument("--dry-run", action="store_true", help="--model: print the plan (problems x configs, "
                                                            "estimated time) and stop")
    tune.add_argument("--gpus", default=None, metavar="all|0,1,...",
                      help="time on these GPUs of this node at once, one isolated worker per GPU (default: the "
                           "current device); all must be one GPU kind")
    tune.add_argument("--cluster", default=None, metavar="ray://HOST:PORT|auto|local",
                      help="time on every GPU of a Ray cluster, one actor per GPU (pip install 'rocmflash[ray]'); "
                           "this process compiles, keeps the journal and writes the database")
    tune.add_argument("--head-dim", type=int, default=None, metavar="D", help="head dimension (16..256)")
    tune.add_argument("--dtype", default=None, metavar="fp16|bf16|fp8",
                      help="fp16 or bf16 (--model: default both; a comma list is accepted); fp8 (prefill only: "
                           "the fp8 forward, q/k/v in the GPU's e4m3 format -- FNUZ on MI300X, OCP on MI355X and "
                           "H100 -- bf16 output; entries d<D>-fp8e4m3fnuz-... / d<D>-fp8e4m3fn-...; inference "
                           "only: --pass fwd; no SDPA incumbent, which has no fp8)")
    tune.add_argument("--causal", action="store_true", help="causal attention")
    tune.add_argument("--seqlen", type=int, action="append", default=None, metavar="S",
                      help="sequence length to tune (repeat for several); stored under the next power of two "
                           "(--model: default 1024..32768 in powers of two, up to the model's context length)")
    tune.add_argument("--batch", type=int, default=None, metavar="B", help="batch (default 16384 // S)")
    tune.add_argument("--heads", type=int_at_least(1), default=None, metavar="H", help="query heads (default 2048 // D)")
    tune.add_argument("--kv-heads", type=int_at_least(1), default=None, metavar="H",
                      help="key/value heads (default: --heads)")
    tune.add_argument("--strategy", choices=("race", "pruned", "exhaustive"), default=None,
                      help="race: every static survivor, short screen then longer rounds for the fastest "
                           "(default); pruned: only the top-K survivors by static score; exhaustive: every config")
    tune.add_argument("--db", default=None, metavar="PATH", help="config database (default: your tunes, ~/.config/rocmflash/<gpu>.json or $ROCMFLASH_CONFIG_DIR)")
    tune.add_argument("--resume", action="store_true",
                      help="continue an interrupted tune from its journal (a plain re-run also skips "
                           "what is recorded)")
    tune.add_argument("--top-k", type=int, default=None, metavar="K",
                      help="configs the pruned strategy times (default 15%% of the space, at least 4)")
    tune.add_argument("--no-seeds", action="store_true",
                      help="do not add the AMD-published configs of the GPU's arch to the configs timed")
    tune.add_argument("--no-incumbent", action="store_true",
                      help="do not time the platform's own attention (SDPA's backends) beside each forward (or, with "
                           "--mode decode, dense 16-bit decode) winner; without it, an entry where SDPA was faster "
                           "makes run-time calls use SDPA (--mode varlen: torch's varlen_attn, recorded in the entry)")
    tune.add_argument("--variant", nargs="+", default=None, metavar="NAME",
                      help="limit the space to these variants: online split_kv two_phase split_d")
    tune.add_argument("--timeout", type=positive_seconds, default=120.0, metavar="SEC",
                      help="per-candidate limit in the live worker (default 120)")
    tune.add_argument("--cache-dir", default=None, metavar="DIR",
                      help="compile cache (default $ROCMFLASH_CACHE_DIR or the user cache dir)")
    tune.add_argument("--workers", type=int_at_least(1), default=None, metavar="N",
                      help="compile processes (default: CPUs)")
    tune.add_argument("--mode", choices=("prefill", "decode", "varlen"), default=None,
                      help="prefill: the attention forward (default; --model: prefill and decode); decode: flash_attn_with_kvcache's split-KV "
                           "kernels at --seqlen cached keys, --batch sequences (default 32), --heads/--kv-heads "
                           "(default 32/8): BLOCK_N, warps, stages (AMD waves_per_eu) and num_splits, every "
                           "static survivor timed; varlen: flash_attn_varlen_func's packed forward over --batch N "
                           "sequences (default max(2, 32768 // S)) whose lengths are spread evenly from S/8 to "
                           "S = --seqlen (N=8, S=4096: 512, 1024, ..., 4096; or --lengths), queries = keys, "
                           "--heads/--kv-heads as prefill: the forward's online knobs, every static survivor "
                           "and the config served before timed; entries varlen-d{D}-{dtype}-gqa{G}[-causal]-s{bucket} "
                           "(--pass bwd|both: also the backward's dQ and dK/dV kernels over the dense backward's "
                           "space, entries varlen-bwd-...)")
    tune.add_argument("--lengths", default=None, metavar="L1,L2,...",
                      help="--mode varlen: the packed batch's sequence lengths, one by one, instead of --batch and "
                           "--seqlen's spread (stored under the longest one's bucket)")
    tune.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "both"), default=None,
                      help="--mode prefill: which kernels to tune: the forward, the backward's dQ and dK/dV "
                           "kernels (entries bwd-<key>, used by the autograd backward), or both (default); "
                           "--mode varlen: the packed forward (default), the packed backward's dQ and dK/dV "
                           "kernels (entries varlen-bwd-<key>), or both")
    tune.add_argument("--seqlen-q", type=int_at_least(1), default=None, metavar="N",
                      help="--mode decode: new tokens per step (default 1)")
    tune.add_argument("--kv-dtype", choices=KV_DTYPES, default=None,
                      help=KV_DTYPE_HELP + "; entries decode-...-kv<format>")
    tune.add_argument("--page-size", type=_page_sizes, default=None, metavar="P[,P...]",
                      help="--mode decode: tune for a paged cache with this page size (default 0: contiguous); "
                           "a comma list (e.g. 16,64,256) tunes each and compares them: which page size to give "
                           "your cache")
    tune.add_argument("--replay", default=None, help=argparse.SUPPRESS)  # test mode: a recorded journal as the GPU

    export = subparsers.add_parser("export", help="print a GPU's tuned configs as triton.Config lists or JSON",
                                   description="Print the winners of a config database for other Triton "
                                               "attention code, every family in its own section (forward: the "
                                               "best online config per problem; decode; varlen; the backward's "
                                               "and the varlen backward's dQ and dK/dV kernels), each config with "
                                               "the problem fields it was tuned for and whether a GPU timed it "
                                               "(measured) or not (a static ranking, an interpreter run); "
                                               "problems whose tune found no config are listed, never exported "
                                               "as configs. The header names the GPU, its arch and the database's "
                                               "fingerprint (rocmflash, Triton, torch).")
    export.add_argument("--gpu", required=True, help="catalog name (see `rocmflash gpus`)")
    export.add_argument("--format", choices=("triton", "json"), default="triton",
                        help="triton (default): Python for @triton.autotune (per family: <FAMILY>_KEY for key=[...], "
                             "the configs per database key and distinct, <FAMILY>_PROBLEMS, and a prune_to_tuned "
                             "helper for prune_configs_by); json: the same as data")
    export.add_argument("--db", default=None, metavar="PATH", help="config database (default: your tunes if any, else the shipped <gpu>.json)")


#: ``--kv-dtype`` of ``tune --mode decode`` (vLLM's ``kv_cache_dtype`` names; :func:`rocmflash.tuning.decode.kv_format`)
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
#: what ``--kv-dtype`` means, for ``tune`` and ``vgpr-report`` alike (each adds its own tail)
KV_DTYPE_HELP = ("--mode decode: the KV cache's dtype: auto (default: --dtype), fp8 or fp8_e4m3 (the GPU's e4m3: "
                 "FNUZ on MI300X, OCP on MI355X and H100), fp8_e5m2 (its e5m2), with fp32 k_descale/v_descale "
                 "(vLLM's kv_cache_dtype names)")


def _page_sizes(text: str) -> tuple:
    """``--page-size``: one page size or a comma list of them, each >= 0 (0: contiguous cache)."""
    try:
        sizes = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a page size or a comma list of them (e.g. 16,64,256)")
    bad = [size for size in sizes if size < 0]
    if bad:
        raise argparse.ArgumentTypeError(f"page size {bad[0]} is invalid; expected >= 0 (0 = contiguous)")
    return tuple(dict.fromkeys(sizes))


def int_at_least(low: int):
    """An argparse ``type=``: an integer >= ``low``; anything else is argparse's one-line error naming the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected an integer >= {low}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is invalid; expected an integer >= {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def positive_seconds(text: str) -> float:
    """An argparse ``type=``: a finite number of seconds > 0 (``inf`` or ``nan`` would disable or break a limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected seconds > 0") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text} is invalid; expected a finite number of seconds > 0")
    return value


def check_writable_dir(flag: str, path: str) -> None:
    """ValueError (one line) unless ``path`` is a directory this process can write, or can be made one.

    Checked before any compile, so a bad ``--out``/``--cache-dir`` fails in a second, not after a sweep.
    """
    reason = _unwritable_dir(path)
    if reason:
        raise ValueError(f"{flag} {path}: {reason}")


def check_db_path(path: str) -> None:
    """ValueError (one line) when ``--db`` names a directory or a file whose folder cannot be written."""
    if os.path.isdir(path):
        raise ValueError(f"--db {path} is a directory; --db takes a database file such as mi300x.json")
    # a symlinked database is written where its target is (rocmflash.db.files.real_path): check that folder
    reason = _unwritable_dir(os.path.dirname(os.path.realpath(path)))
    if reason:
        raise ValueError(f"--db {path}: {reason}")


def _unwritable_dir(path: str):
    """Why ``path`` cannot be used as a directory to write in, or None when it can.

    Nothing is left behind: the directories made for the check and its probe file are removed
    again (the real run makes them), and an existing file named by ``path`` is never touched.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} is a file, not a directory"
    missing, parent = [], os.path.abspath(path)
    while not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is a file, so no directory can be made under it"
    created = []
    try:
        for folder in reversed(missing):  # outermost first, as os.makedirs would
            os.mkdir(folder)
            created.append(folder)
        import tempfile

        fd, probe = tempfile.mkstemp(prefix=".rocmflash-write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return f"cannot write there ({err.strerror or err})"
    finally:
        for folder in reversed(created):
            try:
                os.rmdir(folder)
            except OSError:
                pass  # something else wrote into it meanwhile: leave it
    return None


def _preset_names() -> list:
    from rocmflash.tuning.models import PRESETS

    return sorted(PRESETS)


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


#: tune flags that only some kinds of tune read (flag, attribute, kinds): elsewhere they are refused, not ignored
SCOPED_TUNE_FLAGS = (("--strategy", "strategy", ("prefill", "model")), ("--top-k", "top_k", ("prefill",)),
                     ("--no-seeds", "no_seeds", ("prefill", "model")),
                     ("--no-incumbent", "no_incumbent", ("prefill", "decode", "varlen")),
                     ("--seqlen-q", "seqlen_q", ("decode",)), ("--kv-dtype", "kv_dtype", ("decode",)),
                     ("--page-size", "page_size", ("decode",)), ("--causal", "causal", ("prefill", "varlen", "model")))


def check_tune_args(args: argparse.Namespace) -> None:
    """ValueError (one line) for what argparse cannot see: counts that must be positive, flags that the chosen
    kind of tune would ignore, and paths it could not write (all before the first compile).

    Fills the defaults that depend on the kind of tune (``--strategy race``, ``--seqlen-q 1``, ``--page-size 0``).
    """
    kind = "model" if getattr(args, "model", None) else (getattr(args, "mode", None) or "prefill")
    where = _where(kind)
    for flag, attr, kinds in SCOPED_TUNE_FLAGS:
        if getattr(args, attr, None) not in (None, False) and kind not in kinds:
            readers = [_where(k) for k in kinds]
            readers = " and ".join([", ".join(readers[:-1]), readers[-1]] if len(readers) > 1 else readers)
            raise ValueError(f"{flag} does not go with {where} (it is read by {readers} only)")
    _check_fp8(args, kind)
    for s in args.seqlen or ():
        if s < 1:
            raise ValueError(f"--seqlen {s} is invalid; expected a positive int")
    for flag, value in (("--batch", args.batch), ("--top-k", getattr(args, "top_k", None))):
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value} is invalid; expected a positive int")
    if not args.dry_run:
        check_cache_dir(args.cache_dir)
        from rocmflash.db import CONFIG_DIR_ENV

        if args.db:
            check_db_path(args.db)
        elif os.environ.get(CONFIG_DIR_ENV):
            check_writable_dir(f"${CONFIG_DIR_ENV}", os.environ[CONFIG_DIR_ENV])
    args.strategy = args.strategy or "race"
    if getattr(args, "seqlen_q", None) is None:
        args.seqlen_q = 1
    if getattr(args, "page_size", None) is None:
        args.page_size = (0,)


def _is_fp8(dtype) -> bool:
    return str(dtype or "").strip().lower() in ("fp8", "float8")


def _check_fp8(args: argparse.Namespace, kind: str) -> None:
    """``--dtype fp8`` is the fp8 forward: prefill only, forward only (``--pass fwd``, filled in when not given)."""
    dtypes = str(getattr(args, "dtype", None) or "").split(",")
    if not any(_is_fp8(d) for d in dtypes):
        return
    if kind == "decode":
        raise ValueError("--dtype fp8 does not go with --mode decode: --dtype is the queries' dtype (fp16 or bf16); "
                         "an fp8 KV cache is --kv-dtype fp8")
    if kind != "prefill":
        raise ValueError(f"--dtype fp8 does not go with {_where(kind)}: rocmflash's fp8 attention is the prefill "
                         "forward (tune it with --mode prefill --dtype fp8)")
    if getattr(args, "pass_", None) in ("bwd", "both"):
        raise ValueError(f"--pass {args.pass_} with --dtype fp8: fp8 attention is inference-only (no backward "
                         "kernel to tune); use --pass fwd")
    args.pass_ = "fwd"


def _where(kind: str) -> str:
    return "--model" if kind == "model" else f"--mode {kind}"


def check_cache_dir(cache_dir) -> None:
    """``--cache-dir`` (or ``$ROCMFLASH_CACHE_DIR`` standing in for it) must be a directory that can be written."""
    from rocmflash.static.compile import CACHE_ENV

    if cache_dir:
        check_writable_dir("--cache-dir", cache_dir)
    elif os.environ.get(CACHE_ENV):
        check_writable_dir(f"${CACHE_ENV}", os.environ[CACHE_ENV])
