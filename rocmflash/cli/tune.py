"""``rocmflash tune`` and ``rocmflash export``: argument parsers and entry points.

Wire into the main CLI with ``add_tune_parsers(subparsers)`` and dispatch
``tune`` to :func:`run_tune`, ``export`` to :func:`run_export` (each returns the exit
code). User errors (unknown GPU, bad head dim/dtype/flag, no live GPU for a tune that
must measure, a database of another schema or GPU, a tune already running on the same
database) are one line on stderr and exit code 2; Ctrl-C is exit code 130 with the
journal and database left consistent. A tune that ran but left a problem with no passing
config (every config failed, crashed, timed out or was incorrect) exits 1 after its
summary, with one line per such problem naming the cause.
"""

from __future__ import annotations

import argparse
import os
import sys

from rocmflash.cli.export import (  # noqa: F401  (re-exported: the code moved there)
    NOT_FORWARD_MODES,
    export_json,
    export_triton,
    run_export,
)
from rocmflash.cli.tune_args import (  # noqa: F401  (re-exported: the code moved there)
    SCOPED_TUNE_FLAGS,
    TUNE_DESCRIPTION,
    _error,
    _page_sizes,
    _preset_names,
    _unwritable_dir,
    _where,
    add_tune_parsers,
    check_cache_dir,
    check_db_path,
    check_tune_args,
    check_writable_dir,
    int_at_least,
    positive_seconds,
)
from rocmflash.hw.gpus import UnknownGPUError


def run_tune(args: argparse.Namespace) -> int:
    """``rocmflash tune``: its exit code (0; 1 when a problem had no passing config; 2 a user error; 130 Ctrl-C)."""
    from rocmflash.api.first_use import ENV as FIRST_USE_ENV
    from rocmflash.tuning.items_base import recording_failures

    # a tune times what it names: no run-time first-use decision in it or its workers (they inherit the switch)
    before = os.environ.get(FIRST_USE_ENV)
    os.environ[FIRST_USE_ENV] = "0"
    try:
        with recording_failures() as failures:
            code = _run_tune(args)
    finally:
        if before is None:
            os.environ.pop(FIRST_USE_ENV, None)
        else:
            os.environ[FIRST_USE_ENV] = before
    return failed_tune_exit(code, failures)


def failed_tune_exit(code: int, failures: list) -> int:
    """``code``, or 1 with one ``error:`` line per failed problem when the tune otherwise succeeded."""
    if code != 0 or not failures:
        return code
    print(f"error: {len(failures)} problem(s) had no passing config, so nothing of theirs was measured:",
          file=sys.stderr)
    for failure in failures:
        print(f"  {failure.line()}", file=sys.stderr)
    return 1


def _run_tune(args: argparse.Namespace) -> int:
    from rocmflash.db import DBError
    from rocmflash.static.report import make_console
    from rocmflash.tuning import (
        INJECT_ENV,
        ReplayRunner,
        TuneInterrupted,
        TuneSpec,
        parse_inject,
        print_summary,
        tune,
    )
    from rocmflash.tuning.live_worker import LiveSettings

    try:
        check_tune_args(args)
    except ValueError as err:
        return _error(str(err))
    console = make_console()
    passes = getattr(args, "pass_", None)
    if getattr(args, "mode", None) == "varlen":
        return _run_varlen_tune(args, console)
    if getattr(args, "lengths", None) is not None:
        return _error("--lengths is for --mode varlen")
    if getattr(args, "model", None):
        from rocmflash.cli.model import run_model_tune

        return run_model_tune(args, console)
    missing = [flag for flag, value in (("--head-dim", args.head_dim), ("--dtype", args.dtype),
                                        ("--seqlen", args.seqlen)) if value is None]
    if missing:
        return _error(f"rocmflash tune needs {', '.join(missing)} (or --model PATH|NAME to tune a whole model)")
    if args.dry_run:
        return _error("--dry-run prints a --model plan; give --model")
    if getattr(args, "mode", None) == "decode":
        if args.gpus or args.cluster:
            return _error("--gpus/--cluster with --mode decode: use --model, or tune decode on one GPU")
        if passes is not None:
            return _error(f"--pass {passes} is for --mode prefill or varlen (decode has no backward)")
        return _run_decode_tune(args, console)
    passes = passes or ("fwd" if args.replay else "both")  # a replayed journal holds forward results only
    try:
        if args.timeout is not None and not args.timeout > 0:
            raise ValueError(f"--timeout {args.timeout} is invalid; expected seconds > 0")
        spec = TuneSpec(gpu=args.gpu, head_dim=args.head_dim, dtype=args.dtype, seqlens=list(args.seqlen),
                        causal=args.causal, batch=args.batch, heads=args.heads, kv_heads=args.kv_heads,
                        strategy=args.strategy, top_k=args.top_k, db_path=args.db, resume=args.resume,
                        cache_dir=args.cache_dir, workers=args.workers, variants=args.variant,
                        live_settings=LiveSettings(timeout_s=args.timeout), seeds=not args.no_seeds,
                        incumbent=not args.no_incumbent, inject=parse_inject(os.environ.get(INJECT_ENV)))
        runner = pool = None
        if args.replay:
            if not os.path.isfile(args.replay):
                raise ValueError(f"--replay {args.replay}: no such file"
                                 + (" (it is a directory)" if os.path.isdir(args.replay) else ""))
            runner = ReplayRunner.from_journal(args.replay)
        elif args.gpus or args.cluster:
            from rocmflash.cli.model import make_pool

            pool, gpu = make_pool(args, args.gpu)
            spec.gpu = gpu.name
            runner = pool
        try:
            from rocmflash.tuning.backward_run import BwdTuneResult, print_backward_summary, tune_backward

            if passes != "fwd" and runner is not None and pool is None:
                raise ValueError("--replay replays forward journals only; use --pass fwd")
            if passes == "bwd":
                print_backward_summary(tune_backward(spec, console=console, pool=pool), console)
            else:  # --pass both: the forward and backward problems in ONE pipeline (no barrier between them)
                result = tune(spec, runner=runner, console=console, progress=True, backward=passes == "both")
                print_summary(result, console)
                if result.backward_outcomes is not None:
                    print_backward_summary(BwdTuneResult(result.gpu, result.db_path, result.measured,
                                                         result.why_unmeasured, result.backward_outcomes,
                                                         sum(o.seconds for o in result.backward_outcomes)), console)
        finally:
            if pool is not None:
                from rocmflash.cli.model import close_pool

                close_pool(pool, args)
    except TuneInterrupted as stop:
        r = stop.result
        kept = sum(o.timed_now for o in r.outcomes)
        print(f"interrupted: {kept} result(s) of this run are in {r.journal_path or r.db_path}; "
              f"{r.db_path} is consistent. Re-run with --resume to continue.", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except RuntimeError as err:  # NoWorkersLeft: every --gpus/--cluster worker is gone
        from rocmflash.tuning.pool import NoWorkersLeft

        if not isinstance(err, NoWorkersLeft):
            raise
        return _error(f"{err}: what was measured is in the journal and database; re-run to continue")
    except (UnknownGPUError, DBError, ValueError) as err:
        return _error(str(err))
    return 0


def _one_gpu_tune(args: argparse.Namespace, run) -> int:
    """Run a one-GPU tune (``--mode decode`` / ``varlen``): ``run()`` does the work; Ctrl-C is exit 130,
    a bad argument, unknown GPU, database or no-live-GPU problem is one line and exit 2."""
    from rocmflash.db import DBError
    from rocmflash.tuning.spec import NoLiveGPUError

    try:
        if args.timeout is not None and not args.timeout > 0:
            raise ValueError(f"--timeout {args.timeout} is invalid; expected seconds > 0")
        run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (UnknownGPUError, DBError, NoLiveGPUError, ValueError) as err:
        return _error(str(err))
    return 0


def _run_decode_tune(args: argparse.Namespace, console) -> int:
    from rocmflash.tuning.decode import DecodeProblem
    from rocmflash.tuning.decode_run import (
        print_decode_summary,
        print_page_size_comparison,
        tune_decode,
    )

    def run():
        for seqlen in args.seqlen:
            results = []
            for page_size in args.page_size:
                problem = DecodeProblem(head_dim=args.head_dim, dtype=args.dtype, heads_q=args.heads or 32,
                                        heads_kv=args.kv_heads or 8, batch=args.batch or 32, seqlen_k=seqlen,
                                        seqlen_q=args.seqlen_q, page_size=page_size,
                                        kv_dtype=args.kv_dtype or "").validate()
                results.append(tune_decode(args.gpu, problem, args.db, args.cache_dir, args.workers, args.timeout,
                                           incumbent=not args.no_incumbent))
                print_decode_summary(results[-1], console)
            if len(results) > 1:
                print_page_size_comparison(results, console)

    return _one_gpu_tune(args, run)


def parse_lengths(text: str) -> list:
    """``"256,1024,4096"`` -> ``[256, 1024, 4096]`` (ValueError, one line, on anything else)."""
    try:
        lengths = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--lengths {text!r} is invalid; expected comma-separated integers >= 1") from None
    if any(n < 1 for n in lengths):
        raise ValueError(f"--lengths {text!r} is invalid; expected comma-separated integers >= 1")
    return lengths


def _varlen_problems(args: argparse.Namespace) -> list:
    """The packed problems of ``--mode varlen``: one per --seqlen (spread), or the one of --lengths."""
    from rocmflash.tuning.varlen import VarlenProblem

    for flag, value in (("--model", args.model), ("--gpus", args.gpus), ("--cluster", args.cluster),
                        ("--replay", args.replay), ("--variant", args.variant), ("--dry-run", args.dry_run or None)):
        if value is not None:
            raise ValueError(f"{flag} does not go with --mode varlen (it tunes one packed batch on one GPU)")
    missing = [flag for flag, value in (("--head-dim", args.head_dim), ("--dtype", args.dtype)) if value is None]
    if args.seqlen is None and args.lengths is None:
        missing.append("--seqlen (or --lengths)")
    if missing:
        raise ValueError(f"rocmflash tune --mode varlen needs {', '.join(missing)}")
    if args.lengths is not None and (args.seqlen is not None or args.batch is not None):
        raise ValueError("--lengths gives the packed batch itself: drop --seqlen/--batch")
    heads = args.heads if args.heads is not None else max(1, 2048 // max(args.head_dim, 1))  # as prefill
    fields = dict(head_dim=args.head_dim, dtype=args.dtype, heads_q=heads,
                  heads_kv=args.kv_heads if args.kv_heads is not None else heads, causal=args.causal)
    if args.lengths is not None:
        return [VarlenProblem(lengths=tuple(parse_lengths(args.lengths)), **fields).validate()]
    return [VarlenProblem.spread(args.batch if args.batch is not None else max(2, 32768 // max(s, 1)), s, **fields)
            for s in args.seqlen]


#: ``--pass`` of ``--mode varlen`` when none is given: the forward alone, as before the backward could be tuned
#: (a backward tune roughly doubles the time of a varlen tune, and packed prefill for inference never runs it)
VARLEN_DEFAULT_PASS = "fwd"


def _run_varlen_tune(args: argparse.Namespace, console) -> int:
    from rocmflash.tuning.varlen_run import (
        print_varlen_bwd_summary,
        print_varlen_summary,
        tune_varlen,
        tune_varlen_backward,
    )

    passes = args.pass_ or VARLEN_DEFAULT_PASS

    def run():
        problems = _varlen_problems(args)  # every problem checked before the first compile
        for problem in problems:
            if passes != "bwd":
                print_varlen_summary(tune_varlen(args.gpu, problem, args.db, args.cache_dir, args.workers,
                                                 args.timeout, incumbent=not args.no_incumbent), console)
            if passes != "fwd":
                print_varlen_bwd_summary(tune_varlen_backward(args.gpu, problem, args.db, args.cache_dir,
                                                              args.workers, args.timeout), console)
        if args.pass_ is None:
            console.print("(forward only: --pass bwd or --pass both also tunes the varlen backward for training)")

    return _one_gpu_tune(args, run)


def main(argv=None) -> int:
    """Stand-alone entry (``python -m rocmflash.cli.tune tune ...``) until cli.py wires the subcommands."""
    parser = argparse.ArgumentParser(prog="rocmflash")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_tune_parsers(sub)
    args = parser.parse_args(argv)
    try:
        return run_tune(args) if args.command == "tune" else run_export(args)
    except BrokenPipeError:
        sys.stdout = open(os.devnull, "w")
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
