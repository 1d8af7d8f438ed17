"""``rocmflash tune --model`` and the ``--gpus`` / ``--cluster`` worker pools of ``rocmflash tune``.

Errors are one line and exit code 2, as for every ``tune`` error (see :mod:`rocmflash.cli.tune`).
"""

from __future__ import annotations

import argparse
import os
import sys


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _triton_cache(args) -> str:
    from rocmflash.static.compile import triton_cache_dir

    return triton_cache_dir(args.cache_dir)


def make_pool(args: argparse.Namespace, gpu_name: str, speculate: bool = False):
    """``(pool, catalog GPU)`` for ``--gpus`` or ``--cluster``; a named ``--gpu`` must be what they are.

    ``speculate``: where the driver's files name the node's GPU kind (:func:`~rocmflash.hw.node_probe.guess_node_gpu`),
    return at once with that kind while torch imports in a thread; the pool's ``confirm`` (a pipeline's ``gate``)
    waits for torch and raises :class:`~rocmflash.tuning.pool.DiscardPlan` when it disagrees."""
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.tuning.live_worker import LiveSettings

    settings = LiveSettings(timeout_s=args.timeout)
    if args.gpus and args.cluster:
        raise ValueError("give --gpus or --cluster, not both (a cluster's actors take every GPU of its nodes)")
    if args.cluster:
        from rocmflash.tuning.cluster import cluster_gpu, cluster_pool

        pool = cluster_pool(args.cluster, settings.to_dict(), args.cache_dir)
        gpu = cluster_gpu(pool)
        where = f"the cluster's {len(pool.runners)} GPU(s)"
    else:
        pool, gpu, indices = _node_pool(args, settings, speculate, gpu_name)
        where = f"GPU(s) {', '.join(map(str, indices))}"
    if str(gpu_name).strip().lower() != "auto" and get_gpu(gpu_name).name != gpu.name:
        pool.close()
        raise ValueError(f"--gpu {gpu_name}: {where} are {gpu.name}; name that (or --gpu auto)")
    return pool, gpu


def _node_pool(args, settings, speculate: bool = False, gpu_name: str = "auto") -> tuple:
    """``(pool, catalog GPU, device indices)`` of ``--gpus``: the timing workers start before this process imports
    torch where the devices can be told without it (:func:`~rocmflash.tuning.pool.early_node_pool`), and are
    kept when torch agrees. ``speculate``: where the driver's files also name the GPU kind, this returns at once
    with it, and torch confirms it in a thread (the pool's ``confirm``, run before the first job or entry)."""
    from rocmflash.tuning.output import trace_mark
    from rocmflash.tuning.pool import early_node_pool, early_pool_matches, node_gpu, node_pool, parse_gpus

    early = early_node_pool(args.gpus, settings, _triton_cache(args), args.workers)
    trace_mark("early_pool_started" if early is not None else "no_early_pool")
    guess, name = _guessed_gpu(early, gpu_name) if speculate else (None, None)
    if guess is not None:
        from rocmflash.tuning.pool_confirm import TorchConfirmation

        early.device = name  # the timing device's name in the tune's environment; torch confirms it
        for runner in early.runners:  # so that no pre-warm opens a device here to ask its name
            runner.device = name
        early.confirm = TorchConfirmation(args.gpus, early, guess, device_name=name)
        trace_mark("gpu_guessed")
        return early, guess, list(early.early[0])
    try:
        import torch

        trace_mark("torch_imported")

        from rocmflash.hw.platform import is_rocm

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        indices = parse_gpus(args.gpus, count)
        gpu = node_gpu(indices)
    except BaseException:
        if early is not None:
            early.close()
        raise
    if early_pool_matches(early, indices, is_rocm()):
        return early, gpu, indices
    if early is not None:
        early.close()
    return node_pool(indices, settings, _triton_cache(args), args.workers), gpu, indices


def _guessed_gpu(early, gpu_name: str) -> tuple:
    """``(catalog GPU, device name)`` the driver's files give for an early pool's node, when it is the ``--gpu``
    named; ``(None, None)`` otherwise, and on AMD (KFD names no device: the tune's environment needs torch's)."""
    if early is None or early.early[1]:
        return None, None
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.hw import node_probe

    reports = node_probe.nvidia_reports()  # read once: nvidia-smi, where it answers, takes a fraction of a second
    guess = node_probe.guess_node_gpu(False, nvidia=lambda: reports)
    name = node_probe.nvidia_device_name(lambda: reports)
    if guess is None or name is None or (str(gpu_name).strip().lower() != "auto"
                                         and get_gpu(gpu_name).name != guess.name):
        return None, None
    return guess, name


def close_pool(pool, args) -> None:
    pool.close()
    if args.cluster:
        from rocmflash.tuning.cluster import shutdown

        shutdown()


def _dtypes(text) -> list:
    if text is None:
        return ["fp16", "bf16"]
    from rocmflash.config import normalize_dtype

    dtypes = [normalize_dtype(part.strip()) for part in str(text).split(",") if part.strip()]
    if not dtypes:  # "," or "": an empty plan would be printed as if it were a tune
        raise ValueError(f"--dtype {text!r} names no dtype; expected fp16, bf16 or fp16,bf16")
    return list(dict.fromkeys(dtypes))


def run_model_tune(args: argparse.Namespace, console) -> int:
    """Plan a model's tune, print the plan, and (unless ``--dry-run``) run it."""
    for flag, value in (("--head-dim", args.head_dim), ("--heads", args.heads), ("--kv-heads", args.kv_heads),
                        ("--replay", args.replay), ("--variant", args.variant), ("--top-k", args.top_k)):
        if value is not None:
            return _error(f"{flag} does not go with --model (the model's config gives the geometry)")
    passes = {"fwd": ("fwd",), "bwd": ("bwd",), "both": ("fwd", "bwd"), None: ("fwd", "bwd")}[args.pass_]
    mode = args.mode
    if mode == "decode" and args.pass_ is not None:
        return _error(f"--pass {args.pass_} is for prefill (decode has no backward)")
    from rocmflash.tuning.pool import DiscardPlan

    for speculate in (True, False):
        try:
            return _plan_and_tune(args, console, passes, mode, speculate)
        except DiscardPlan as why:  # planned for the GPU kind the driver's files named; torch disagreed
            console.print(f"note: {why}; planning again for the GPUs torch reports", highlight=False)
    return _error("the GPUs could not be told")  # pragma: no cover - the second pass never raises DiscardPlan


def _plan_and_tune(args, console, passes: tuple, mode: str, speculate: bool) -> int:
    """One plan and its tune; ``speculate``: a ``--gpus`` plan may start on the GPU kind read without torch
    (:func:`make_pool`), and :class:`~rocmflash.tuning.pool.DiscardPlan` leaves here when torch disagrees."""
    from rocmflash.db import DBError
    from rocmflash.hw.gpus import UnknownGPUError
    from rocmflash.tuning.output import trace_mark
    from rocmflash.tuning.model_run import print_model_summary, tune_model
    from rocmflash.tuning.models import load_model
    from rocmflash.tuning.plan import make_plan, plan_table
    from rocmflash.tuning.pool import NoWorkersLeft
    from rocmflash.tuning.run import resolve_gpu
    from rocmflash.tuning.spec import NoLiveGPUError

    pool = None
    trace_mark("model_tune_start")
    try:
        model = load_model(args.model)
        if args.gpus or args.cluster:
            if args.dry_run:  # a plan needs no workers: count the GPUs only
                gpu, n_gpus, where, measuring = _dry_run_workers(args)
            else:
                pool, gpu = make_pool(args, args.gpu, speculate=speculate)
                trace_mark("pool_ready")
                n_gpus, measuring = pool.parallelism, True
                where = f"{n_gpus} worker(s): " + ", ".join(s.label for s in pool.stats)
        else:
            gpu, live = resolve_gpu(args.gpu)
            measuring = live is not None and live.name == gpu.name
            n_gpus = 1
            where = "the current GPU" if measuring else f"no live {gpu.name}"
        plan = make_plan(model, gpu, _dtypes(args.dtype), args.seqlen, () if mode == "decode" else passes,
                         decode=mode != "prefill", decode_batch=args.batch)
        cores = args.workers or os.cpu_count() or 1
        console.print(plan_table(plan, n_gpus, cores, measuring, where))
        if args.dry_run:
            return 0
        trace_mark("tune_start")
        result = tune_model(plan, pool, args.db, args.strategy, args.cache_dir, args.workers, args.timeout,
                            seeds=not args.no_seeds, resume=args.resume, console=console)
        trace_mark("tune_done")
        print_model_summary(result, console, n_gpus, cores)
        trace_mark("summary_printed")
    except KeyboardInterrupt:
        print("interrupted: what was timed is in the journal and database; re-run to continue", file=sys.stderr)
        return 130
    except (UnknownGPUError, DBError, NoLiveGPUError, ValueError) as err:
        return _error(str(err))
    except NoWorkersLeft as err:
        return _error(f"{err}: what was measured is in the journal and database; re-run to continue")
    finally:
        if pool is not None:
            trace_mark("pool_close_start")
            close_pool(pool, args)
        trace_mark("model_tune_end")
    return 0


def _dry_run_workers(args):
    """``(gpu, workers, where, measuring)`` for a dry run's estimate, without starting any worker."""
    from rocmflash.hw.gpus import get_gpu

    if args.cluster:
        from rocmflash.tuning.cluster import _ray, connect, shutdown

        connect(args.cluster)
        count = int(_ray().cluster_resources().get("GPU", 0))
        shutdown()
        gpu = get_gpu(args.gpu) if str(args.gpu).lower() != "auto" else None
        if gpu is None:
            raise ValueError("--dry-run with --cluster needs --gpu NAME (no actor is started to ask)")
        return gpu, max(1, count), f"the cluster's {count} GPU(s)", count > 0
    import torch

    from rocmflash.tuning.pool import node_gpu, parse_gpus

    indices = parse_gpus(args.gpus, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    gpu = node_gpu(indices)
    if str(args.gpu).strip().lower() != "auto" and get_gpu(args.gpu).name != gpu.name:
        raise ValueError(f"--gpu {args.gpu}: GPU(s) {', '.join(map(str, indices))} are {gpu.name}")
    return gpu, len(indices), f"GPU(s) {', '.join(map(str, indices))}", True


__all__ = ["make_pool", "close_pool", "run_model_tune"]
