"""The ``rocmflash`` command line.

Every user error (unknown GPU, unreadable code object, bad flag value, an output or cache
path that cannot be written, a flag the chosen mode would ignore) is one line on stderr and
exit code 2, never a traceback; it is found before the first compile. Argparse's own errors
(a number out of range: the line names the allowed range) keep its usage line and exit code 2.
A file-system failure in the middle of a run (disk full) is one line and exit code 1.
rocmflash's own warnings (a malformed database entry skipped, a database ignored) print as
one line each, without Python's file-and-source-line preamble.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from typing import Optional

from isa_tools.cli import add_isa_arguments
from isa_tools.cli import run as run_isa
from rocmflash.hw import compat
from rocmflash.hw.compat import UnsupportedVersionError
from rocmflash.hw.gpus import UnknownGPUError, get_gpu, known_gpu_names

#: the demo kernel: the seeds' VGPR case study tile (BLOCK_M=128, BLOCK_N=64, D=128, fp32 accumulator)
DEMO_CONSTEXPRS = {"BLOCK_M": 128, "BLOCK_N": 64, "HEAD_DIM": 128}


def build_parser() -> argparse.ArgumentParser:
    from rocmflash.cli.tune import add_tune_parsers, int_at_least
    from rocmflash.cli.tune_args import KV_DTYPE_HELP, KV_DTYPES

    parser = argparse.ArgumentParser(
        prog="rocmflash",
        description="Tune Triton FlashAttention kernels for AMD wave-64 GPUs from compiler truth.",
    )
    parser.add_argument("--version", action=VersionAction,
                        help="print rocmflash's version and the torch and Triton it finds, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    isa = sub.add_parser("isa", help="registers, spills, LDS and occupancy of AMD code objects",
                         description="Read .hsaco code objects and/or Triton cache directories.")
    add_isa_arguments(isa)
    isa.add_argument("--demo", metavar="GPU", nargs="?", const="mi250", default=None,
                     help="cross-compile a built-in FlashAttention-shaped kernel (BLOCK_M=128, BLOCK_N=64, "
                          "D=128) for GPU's arch (default mi250 = gfx90a) on this CPU and read it")

    report = sub.add_parser(
        "vgpr-report", help="cross-compile a GPU's config space on this CPU, prune it, and explain why",
        description="Compile every candidate attention config for the GPU's arch (no GPU needed), read the "
                    "code objects, compute occupancy and prune spills, LDS overflows, low occupancy, cliff "
                    "victims and duplicate binaries. Writes report.md, configs.csv and vgprs.png (not with --json "
                    "unless --out is given).")
    report.add_argument("--gpu", required=True, help="catalog name, e.g. mi250, mi300x, mi355x (see `rocmflash gpus`)")
    report.add_argument("--head-dim", type=int, default=128, metavar="D", help="head dimension (16..256, default 128)")
    report.add_argument("--dtype", default="fp16",
                        help="fp16, bf16 or fp8 (default fp16). fp8: Q/K/V in the arch's e4m3 format (gfx942: "
                             "float8_e4m3fnuz, gfx950 and sm_89+: float8_e4m3fn), bf16 output, the online kernel "
                             "only; prefill forward only; not on gfx90a or sm_80 (no fp8 matrix instructions)")
    report.add_argument("--causal", action="store_true", help="causal attention")
    report.add_argument("--variant", nargs="+", metavar="NAME", default=None,
                        help="limit to these variants: online split_kv two_phase split_d (default: all)")
    report.add_argument("--json", action="store_true",
                        help="print one JSON object per config to stdout; writes no file unless --out is given")
    report.add_argument("--out", metavar="DIR", default=None,
                        help="the folder report.md/configs.csv/vgprs.png go to (default: a folder named by the "
                             "options that select the report, e.g. vgpr-mi250-d128-fp16 or "
                             "vgpr-mi250-d128-fp16-online, under $ROCMFLASH_REPORTS_DIR or the user data dir, ~/.local/share/rocmflash/reports on "
                             "Linux; the path is printed at the end)")
    report.add_argument("--cache-dir", metavar="DIR", default=None,
                        help="compile cache (default $ROCMFLASH_CACHE_DIR or the user cache dir)")
    report.add_argument("--workers", type=int_at_least(1), default=None, metavar="N",
                        help="compile processes (default: CPUs)")
    report.add_argument("--occupancy-floor", type=int_at_least(1), default=None, metavar="W",
                        help="prune configs below W waves/SIMD (default 2 on AMD, 1 warp/scheduler on NVIDIA; at most "
                             "the arch's maximum, e.g. 8 on gfx90a/gfx942/gfx950)")
    report.add_argument("--cliff-margin", type=int_at_least(0), default=None, metavar="V",
                        help="a config at most V VGPRs past a cliff that costs it waves is a cliff victim (default 16)")
    report.add_argument("--reference", action="store_true",
                        help="also compile the AMD-published forward configs for the GPU's arch "
                             "(rocmflash/reference/amd_published.json) and show their registers, verdict and static "
                             "rank next to the static #1; adds a 'Reference configs' section to report.md "
                             "(with --json: prints {\"configs\": [...], \"reference\": [...]})")
    report.add_argument("--mode", choices=("prefill", "decode", "varlen"), default="prefill",
                        help="prefill: the attention forward space (default); decode: the KV-cache decode kernels "
                             "(split-KV + combine) of flash_attn_with_kvcache; varlen: the packed forward kernel "
                             "of flash_attn_varlen_func over the dense online space (--causal, --heads, --kv-heads)")
    report.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="fwd",
                        help="fwd: the forward space (default); bwd: the backward's dQ and dK/dV kernels "
                             "(--mode prefill; --mode varlen: the packed backward's, over the same space)")
    report.add_argument("--batch", type=int_at_least(1), default=None, metavar="B",
                        help="--mode decode: batch (default 32)")
    report.add_argument("--seqlen", type=int_at_least(1), default=None, metavar="S",
                        help="--mode decode: cached keys (default 4096)")
    report.add_argument("--heads", type=int_at_least(1), default=None, metavar="H",
                        help="query heads (--mode decode: default 32; --pass bwd: default 16; --mode varlen: "
                             "default 2048 // D)")
    report.add_argument("--kv-heads", type=int_at_least(1), default=None, metavar="H",
                        help="key/value heads (--mode decode: default 8; --pass bwd, --mode varlen: default --heads)")
    report.add_argument("--page-size", type=int_at_least(0), default=None, metavar="P",
                        help="--mode decode: paged cache with this page size (default 0: contiguous)")
    report.add_argument("--kv-dtype", choices=KV_DTYPES, default=None,
                        help=KV_DTYPE_HELP + "; not on gfx90a (no fp8)")
    report.add_argument("--reference-file", metavar="PATH", default=None,
                        help="a reference file of the same format to use instead of the packaged one "
                             "(implies --reference)")

    add_tune_parsers(sub)  # `tune` and `export`

    explain = sub.add_parser(
        "explain", help="which config run-time selection picks for a problem on a GPU, and why",
        description="Read the GPU's databases as run-time selection does (no GPU needed), show the entry it picks "
                    "and how far it is from the asked problem, and cross-compile the choice for the GPU's arch to "
                    "check it does not spill or fail there.")
    explain.add_argument("--gpu", required=True, help="catalog name (see `rocmflash gpus`)")
    explain.add_argument("--head-dim", type=int, required=True, metavar="D", help="head dimension (16..256)")
    explain.add_argument("--dtype", required=True, metavar="fp16|bf16", help="fp16 or bf16")
    explain.add_argument("--causal", action="store_true", help="causal attention")
    explain.add_argument("--seqlen", type=int, required=True, metavar="S", help="query sequence length")
    explain.add_argument("--seqlen-k", type=int, default=None, metavar="S", help="key length (default: --seqlen)")
    explain.add_argument("--gqa", type=int, default=1, metavar="R", help="query heads per key/value head (default 1)")
    explain.add_argument("--variant", default="online", help="kernel variant (default online)")
    explain.add_argument("--batch", type=int, default=1, metavar="B",
                         help="batch (a decode-shaped problem's decode entry is per batch bucket; with --heads, how "
                              "much work a dense call is against its host cost)")
    explain.add_argument("--heads", type=int, default=None, metavar="H",
                         help="query heads, for a dense call's work against its host cost (default 8 x --gqa)")
    explain.add_argument("--db", default=None, metavar="PATH", help="read this database only")
    explain.add_argument("--no-compile", action="store_true", help="skip the cross-compile check of the choice")
    explain.add_argument("--cache-dir", default=None, metavar="DIR", help="compile cache (default: the user cache)")
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON")

    from rocmflash.static.check_db import add_parser as add_check_db_parser

    add_check_db_parser(sub)  # `check-db`

    from rocmflash.cli.db import add_parser as add_db_parser

    add_db_parser(sub)
    gpus = sub.add_parser("gpus", help="list the GPU catalog")
    gpus.add_argument("--json", action="store_true")

    doctor = sub.add_parser("doctor", help="versions, visible GPUs, their targets and databases, and a verdict",
                            description="Run this first and paste its output into bug reports. Works on a "
                                        "CPU-only box; exit code 1 when rocmflash cannot run here.")
    doctor.add_argument("--json", action="store_true", help="the same report as JSON")
    return parser


def version_text() -> str:
    """``rocmflash X``, then torch's and Triton's versions (with the distribution that provides Triton where it is
    not ``triton``: ``pytorch-triton-rocm``). Each is imported, as a kernel build would: one that is installed but
    fails to import says so in one line, one that is missing says that; neither stops ``--version``."""
    import rocmflash

    lines = [f"rocmflash {rocmflash.__version__}"]
    for info in (compat.installed_torch(), compat.installed_triton()):
        lines.append(_version_line(info))
    return "\n".join(lines)


def _version_line(info) -> str:
    """``torch 2.13.0``, ``triton 3.5.0 (pytorch-triton-rocm)``, ``... not installed`` or ``... import fails: ...``
    for a :class:`rocmflash.hw.compat.Installed`."""
    import importlib

    if info.version is None:
        return f"{info.module} not installed"
    line = f"{info.module} {info.version}" + (f" ({info.distribution})"
                                              if info.distribution not in (None, info.module) else "")
    try:
        importlib.import_module(info.module)
    except Exception as err:  # noqa: BLE001 - a broken install is what --version must report, not raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        line += f": import fails ({type(err).__name__}: {first})"
    return line


class VersionAction(argparse.Action):
    """``--version``: like argparse's own, but the text is built only when the flag is given."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def main(argv: Optional[list[str]] = None) -> int:
    if os.environ.get("ROCMFLASH_PIPELINE_TRACE"):  # a traced tune: when the CLI got control (imports done)
        from rocmflash.tuning.output import trace_mark

        trace_mark("cli_main")
    parser = build_parser()
    args = parser.parse_args(argv)
    _one_line_warnings()
    try:
        if args.command == "isa":
            return _isa(args)
        if args.command == "db":
            from rocmflash.cli.db import run as run_db

            return run_db(args)
        if args.command == "gpus":
            return _gpus(args)
        if args.command == "doctor":
            from rocmflash.hw import doctor

            return doctor.main(as_json=args.json)
        if args.command in ("tune", "export"):
            from rocmflash.cli.tune import run_export, run_tune

            return run_tune(args) if args.command == "tune" else run_export(args)
        if args.command == "explain":
            return _explain(args)
        if args.command == "check-db":
            from rocmflash.static import check_db

            check_db.check_args(args)
            return check_db.main(args)
        if args.command == "vgpr-report":
            _check_report_args(args)
        if args.command == "vgpr-report" and args.pass_ == "bwd" and args.mode != "varlen":
            from rocmflash.static import bwd_report

            return bwd_report.main(args, "rocmflash " + " ".join(argv if argv is not None else sys.argv[1:]))
        if args.command == "vgpr-report" and args.mode == "decode":
            from rocmflash.static import decode_report

            return decode_report.main(args, "rocmflash " + " ".join(argv if argv is not None else sys.argv[1:]))
        if args.command == "vgpr-report" and args.mode == "varlen":
            from rocmflash.static import varlen_report

            return varlen_report.main(args, "rocmflash " + " ".join(argv if argv is not None else sys.argv[1:]))
        if args.command == "vgpr-report":
            from rocmflash.static import vgpr_report

            return vgpr_report.main(args, "rocmflash " + " ".join(argv if argv is not None else sys.argv[1:]))
    except (UnknownGPUError, ValueError, UnsupportedVersionError) as err:
        # unknown GPU, unsupported head dim / dtype / variant, unsupported torch/Triton: one line, exit 2
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        sys.stdout = open(os.devnull, "w")
        return 0
    except OSError as err:  # a path that passed the checks and still failed (disk full, removed meanwhile)
        where = f": {err.filename}" if err.filename else ""
        print(f"error: {err.strerror or err}{where}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command!r}")
    return 2


_PYTHON_FORMAT = warnings.formatwarning


def _rocmflash_format(message, category, filename, lineno, line=None) -> str:
    """A ``rocmflash: ...`` warning as its own line (it names the file and entry it is about); others as Python
    formats them."""
    text = str(message)
    if text.startswith("rocmflash: "):
        return text + "\n"
    return _PYTHON_FORMAT(message, category, filename, lineno, line)


def _one_line_warnings() -> None:
    """Print rocmflash's warnings as one line each (only how a printed warning looks: filters and
    ``warnings.catch_warnings(record=True)`` are untouched)."""
    warnings.formatwarning = _rocmflash_format


#: vgpr-report flags read by some (--mode, --pass) pairs only: elsewhere they are refused, never silently ignored
REPORT_FLAG_SCOPE = {
    "--variant": ("variant", {("prefill", "fwd")}),
    "--reference": ("reference", {("prefill", "fwd")}),
    "--reference-file": ("reference_file", {("prefill", "fwd")}),
    "--occupancy-floor": ("occupancy_floor", {("prefill", "fwd")}),
    "--cliff-margin": ("cliff_margin", {("prefill", "fwd")}),
    "--causal": ("causal", {("prefill", "fwd"), ("prefill", "bwd"), ("varlen", "fwd"), ("varlen", "bwd")}),
    "--heads": ("heads", {("decode", "fwd"), ("prefill", "bwd"), ("varlen", "fwd"), ("varlen", "bwd")}),
    "--kv-heads": ("kv_heads", {("decode", "fwd"), ("prefill", "bwd"), ("varlen", "fwd"), ("varlen", "bwd")}),
    "--batch": ("batch", {("decode", "fwd")}),
    "--seqlen": ("seqlen", {("decode", "fwd")}),
    "--page-size": ("page_size", {("decode", "fwd")}),
    "--kv-dtype": ("kv_dtype", {("decode", "fwd")}),
}


def _check_report_args(args: argparse.Namespace) -> None:
    """ValueError (one line) before any compile: a flag this mode/pass would ignore, an occupancy floor past the
    arch's maximum, an ``--out``/``--cache-dir`` that cannot be written. Fills ``--cliff-margin``'s default."""
    from rocmflash.cli.tune import check_cache_dir

    if args.mode == "decode" and args.pass_ == "bwd":
        raise ValueError("--pass bwd is for --mode prefill or varlen (decode has no backward)")
    for flag, (attr, scope) in REPORT_FLAG_SCOPE.items():
        if getattr(args, attr) not in (None, False) and (args.mode, args.pass_) not in scope:
            where = f"--mode {args.mode}" + (" --pass bwd" if args.pass_ == "bwd" else "")
            raise ValueError(f"{flag} does not go with {where} (it would be ignored there)")
    _check_report_dtype(args)
    if args.occupancy_floor is not None:
        most = _max_occupancy(get_gpu(args.gpu))
        if args.occupancy_floor > most:
            raise ValueError(f"--occupancy-floor {args.occupancy_floor} is invalid for {args.gpu}; expected 1..{most} "
                             "(a higher floor prunes every config)")
    if args.cliff_margin is None:
        from rocmflash.static.prune import PruneSettings

        args.cliff_margin = PruneSettings().cliff_margin
    _check_report_out(args)
    check_cache_dir(args.cache_dir)


def _check_report_out(args: argparse.Namespace) -> None:
    """``--out``, else the report's default folder (:func:`default_folder_name`: named by the options that select
    the report, under the reports root of :mod:`rocmflash.static.report_dirs`), must be a directory that can be
    written; ``--json`` without ``--out`` writes nothing, so there is nothing to check."""
    from rocmflash.cli.tune import check_writable_dir
    from rocmflash.static import report_dirs

    if args.out:
        check_writable_dir("--out", args.out)
    elif not args.json:
        try:
            name = default_folder_name(args)
        except ValueError:  # a bad head dim, dtype, ...: the mode's own check says it, in its words, next
            return
        check_writable_dir(report_dirs.root_flag(), os.path.join(report_dirs.reports_root(), name))


def default_folder_name(args) -> str:
    """The folder name the ``vgpr-report`` flags ``args`` select (what :func:`rocmflash.static.report_dirs.out_dir`
    puts under the reports root without ``--out``): the report module's ``default_name`` of the problem its flags
    make -- the module :func:`main` runs for them. Raises the one-line ValueError the report itself would raise for
    a bad value (unknown GPU, dtype, decode geometry)."""
    gpu = get_gpu(args.gpu)
    if args.mode == "varlen":
        from rocmflash.static import varlen_report

        prefix = "vgpr-varlen-bwd" if args.pass_ == "bwd" else "vgpr-varlen"
        return varlen_report.default_name(gpu, varlen_report.problem_of(args), prefix)
    if args.pass_ == "bwd":
        from rocmflash.static import bwd_report

        return bwd_report.default_name(gpu, bwd_report.problem_of(args))
    if args.mode == "decode":
        from rocmflash.static import decode_report

        return decode_report.default_name(gpu, decode_report.problem_of(args, gpu))
    from rocmflash.static import vgpr_report

    return vgpr_report.default_name_of(args, gpu)


def _check_report_dtype(args: argparse.Namespace) -> None:
    """``--dtype fp8``: the prefill forward of a GPU with fp8 matrix instructions, without --reference
    (ValueError otherwise). Other dtypes are checked where each mode reads them."""
    from rocmflash.config import FP8, normalize_problem_dtype

    try:
        fp8 = normalize_problem_dtype(args.dtype) == FP8
    except ValueError:
        return  # each mode names the dtypes it takes
    if not fp8:
        return
    if (args.mode, args.pass_) != ("prefill", "fwd"):
        where = f"--mode {args.mode}" + (" --pass bwd" if args.pass_ == "bwd" else "")
        raise ValueError(f"--dtype fp8 does not go with {where}: the static phase has an fp8 build of the prefill "
                         "forward only")
    if args.reference or args.reference_file:
        raise ValueError("--reference does not go with --dtype fp8: the AMD-published configs are fp16/bf16 ones")
    from rocmflash.static.space import fp8_format

    fp8_format(get_gpu(args.gpu))  # gfx90a/sm_80: no fp8 matrix instructions


def _max_occupancy(gpu) -> int:
    """The most waves per SIMD (AMD) or warps per scheduler (NVIDIA, 4 per SM) the GPU's arch can hold."""
    from isa_tools.archs import amd_arch, nvidia_arch

    if gpu.vendor == "amd":
        return amd_arch(gpu.arch).max_waves_per_simd
    return nvidia_arch(gpu.arch).max_warps_per_sm // 4


def _isa(args: argparse.Namespace) -> int:
    if args.demo is None:
        return run_isa(args)
    gpu = get_gpu(args.demo)
    if gpu.vendor != "amd":
        print(f"error: --demo needs an AMD GPU; {gpu.name} is {gpu.vendor}. AMD GPUs: "
              + ", ".join(n for n in known_gpu_names() if get_gpu(n).vendor == "amd"), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rocmflash-demo-") as cache_dir:
        compile_demo_kernel(gpu, cache_dir)
        args.paths = [cache_dir, *args.paths]
        return run_isa(args)


def compile_demo_kernel(gpu, cache_dir: str, num_warps: int = 4) -> None:
    """Cross-compile the demo FA-shaped kernel for ``gpu`` into a Triton cache directory."""
    os.environ["TRITON_CACHE_DIR"] = cache_dir  # Triton reads it at compile time
    import triton
    from triton.compiler import ASTSource

    from rocmflash.kernels.demo import FA_LIKE_SIGNATURE, fa_like_kernel

    src = ASTSource(fn=fa_like_kernel, signature=FA_LIKE_SIGNATURE, constexprs=dict(DEMO_CONSTEXPRS))
    triton.compile(src, target=gpu.triton_target(), options={"num_warps": num_warps, "num_stages": 1})


def _explain(args: argparse.Namespace) -> int:
    from rocmflash.cli.explain import explain, print_explanation

    if args.variant not in ("online", "split_kv", "two_phase", "split_d"):
        raise ValueError(f"--variant {args.variant!r} is unknown; expected online, split_kv, two_phase or split_d")
    if args.db is not None:
        _check_explain_db(args.db, args.gpu)
    if not args.no_compile:
        from rocmflash.cli.tune import check_cache_dir

        check_cache_dir(args.cache_dir)
    result = explain(args.gpu, args.head_dim, args.dtype, args.causal, args.seqlen, args.seqlen_k, args.gqa,
                     args.variant, args.db, check=not args.no_compile, cache_dir=args.cache_dir, batch=args.batch,
                     heads=args.heads)
    if args.json:
        import json

        print(json.dumps(result, indent=1, default=str))
        return 0
    from rich.console import Console

    print_explanation(result, Console())
    return 0


def _check_explain_db(path: str, gpu_name: str) -> None:
    """``--db``: a readable database of this GPU; run-time selection would skip a corrupt one with a warning,
    but a file named on purpose that cannot be used is an error, not an empty answer."""
    from rocmflash.db import ConfigDB

    if not os.path.isfile(path):
        raise ValueError(f"--db {path}: no such file" + (" (it is a directory)" if os.path.isdir(path) else ""))
    data = ConfigDB.read(path)  # DBError (a ValueError) names what is wrong with it
    gpu = get_gpu(gpu_name)
    if data.get("gpu") != gpu.name:
        raise ValueError(f"--db {path} holds configs for {data.get('gpu')!r}, not {gpu.name!r}")


def _gpus(args: argparse.Namespace) -> int:
    from rocmflash.hw.gpus import GPUS

    rows = [
        {"name": g.name, "marketing_name": g.marketing_name, "arch": g.arch, "compute_units": g.compute_units,
         "peak_fp16_tflops": g.peak_fp16_tflops, "peak_fp8_tflops": g.peak_fp8_tflops, "hbm_tbs": g.hbm_tbs,
         "lds_per_cu_kib": g.lds_per_cu_bytes // 1024,
         "l2_mib": g.l2_bytes // (1024 * 1024), "memory_gib": g.memory_gib,
         "partitions": ", ".join(f"{p.name} ({p.compute_units} CUs)" for p in g.partitions()[1:])}
        for g in GPUS.values()
    ]
    if args.json:
        import json

        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="GPU catalog (per device one process sees; partitions: <name>-<mode>)")
    columns = {"name": "name", "arch": "arch", "compute_units": "CUs", "peak_fp16_tflops": "fp16 TFLOP/s",
               "peak_fp8_tflops": "fp8 TFLOP/s", "hbm_tbs": "HBM TB/s", "lds_per_cu_kib": "LDS KiB", "l2_mib": "L2 MiB",
               "memory_gib": "GiB",
               "partitions": "partitions (CUs)"}
    for title in columns.values():
        table.add_column(title)
    for row, gpu in zip(rows, GPUS.values()):
        row = dict(row, partitions=" ".join(f"{p.partition}:{p.compute_units}" for p in gpu.partitions()[1:]))
        table.add_row(*("-" if row[key] is None else str(row[key]) for key in columns))
    Console().print(table)
    return 0

