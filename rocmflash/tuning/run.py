"""The forward tune: its problems as pipeline items (:mod:`rocmflash.tuning.items_fwd`), the runner(s), the result."""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from rocmflash.config import FP8
from rocmflash.db import default_db_path, journal_path, tune_lock
from rocmflash.hw.detect import identify_live_device
from rocmflash.hw.gpus import GPU, get_gpu
from rocmflash.tuning.items import backward_items, forward_items, open_context, run_items, timing_workers
from rocmflash.tuning.spec import NoLiveGPUError, TuneSpec


@dataclasses.dataclass
class TuneResult:
    gpu: GPU
    db_path: str
    journal_path: Optional[str]
    measured: bool
    why_unmeasured: Optional[str]
    outcomes: list
    seconds: float
    interrupted: bool = False
    #: the backward's BwdOutcome per problem when it was tuned in the same pipeline (``--pass both``), else None
    backward_outcomes: Optional[list] = None


def resolve_gpu(name: str) -> tuple[GPU, Optional[GPU]]:
    """``(gpu to tune, live gpu or None)``; ``auto`` needs a live GPU in the catalog.

    The live GPU counts as the one named when the live device resolves to it, or when the
    device's report fits it equally well (an unnamed 104-CU gfx90a is an MI250 GCD or an MI210).
    """
    match = identify_live_device()
    live = match.gpu if match is not None else None
    if str(name).strip().lower() == "auto":
        if live is None:
            raise NoLiveGPUError(_no_live_reason(None) + "; --gpu auto needs one (or name a GPU: "
                                 "rocmflash gpus lists them)")
        return live, live
    gpu = get_gpu(name)
    if match is not None and gpu.name in match.alternatives:
        return gpu, gpu
    return gpu, live


def _no_live_reason(gpu: Optional[GPU]) -> str:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return "no live GPU (torch is not importable)"
    if not torch.cuda.is_available():
        return "no live GPU on this machine (torch.cuda.is_available() is False)"
    match = identify_live_device()
    if match.gpu is None:
        return f"the live GPU is not in the catalog: {match.describe()}"
    if gpu is not None:
        return f"the live GPU is {match.gpu.name} ({match.describe()}), not {gpu.name}"
    return f"the live GPU is {match.gpu.name}"


def tune(spec: TuneSpec, runner=None, console=None, progress: bool = True, backward: bool = False) -> TuneResult:
    """Run a tune: one :class:`~rocmflash.tuning.items_fwd.ForwardItem` per sequence length, through the
    tune pipeline (:func:`rocmflash.tuning.items.run_items`). ``runner`` overrides live detection (tests:
    ReplayRunner; several GPUs: a :class:`~rocmflash.tuning.pool.WorkerPool`, whose runners become the
    pipeline's timing workers). ``backward=True`` (``--pass both``) puts the backward's problems in the same
    pipeline, with no barrier between the passes (their outcomes: ``result.backward_outcomes``).

    ``spec.dtype == "fp8"``: the fp8 forward in the GPU's e4m3 format (its space: ``default_space(gpu,
    variants, "fp8")``), entries keyed by that format (``d128-fp8e4m3fnuz-...`` on gfx942); a GPU without
    fp8 matrix instructions is a one-line ``ValueError`` naming its arch."""
    from rocmflash.static.space import default_space

    spec.validate()
    start = time.perf_counter()
    if runner is not None and str(spec.gpu).strip().lower() != "auto":
        gpu, live = get_gpu(spec.gpu), None
    else:
        gpu, live = resolve_gpu(spec.gpu)
    own_runner = runner is None and live is not None and live.name == gpu.name
    why = None if runner is not None or own_runner else _no_live_reason(gpu)
    measuring = runner is not None or own_runner
    if spec.strategy == "exhaustive" and not measuring:
        raise NoLiveGPUError(f"--strategy exhaustive times every config and needs a live {gpu.name}: {why}")
    device_name = None
    if own_runner:
        import torch

        device_name = torch.cuda.get_device_properties(0).name
    elif runner is not None:
        device_name = getattr(runner, "device", "replay")
    db_path = spec.db_path or default_db_path(gpu.name)
    jpath = journal_path(db_path) if measuring else None
    if spec.dtype == FP8:  # no fp8 matrix instructions (gfx90a, sm_80): one line naming the arch, before anything
        from rocmflash.static.space import fp8_format

        fp8_format(gpu)
    space = spec.space or default_space(gpu, spec.variants, spec.dtype)
    if own_runner:
        match = identify_live_device()
        if match is not None and match.problem and console is not None:  # e.g. an unnamed board that fits two
            console.print(f"live GPU: {match.describe()}", highlight=False)
    lock = tune_lock(db_path)
    items: list = []
    bwd_items: list = []
    interrupted = False
    try:
        if own_runner:
            runner = _own_runner(spec)
        runners = list(getattr(runner, "runners", None) or ([runner] if runner is not None else []))
        ctx = open_context(gpu, db_path, device_name, measuring, why, console, progress, prewarmer=runner,
                           runners=runners)
        if spec.resume:
            ctx.out.note(f"resuming from {jpath}: {len(ctx.journal.records)} recorded result(s)" if measuring
                         else "--resume: nothing to resume (nothing is measured without a live GPU)")
        slots, item_spec = _compile_slots(spec, backward)
        items = forward_items(ctx, item_spec, space)
        bwd_items = backward_items(ctx, item_spec) if backward else []
        # static only: the pipeline runs the static phases and writes the entries; no job reaches a worker
        run_items(items + bwd_items, timing_workers(runner), ctx, compile_slots=slots)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if own_runner and runner is not None:
            runner.close()
        lock.release()
        if backward:
            _clear_backward_lookups()
    result = TuneResult(gpu, db_path, jpath, measuring, why, [i.outcome for i in items], time.perf_counter() - start,
                        interrupted)
    if backward:
        result.backward_outcomes = [i.outcome() for i in bwd_items]
    if interrupted:
        raise TuneInterrupted(result)
    return result


def _compile_slots(spec: TuneSpec, backward: bool) -> tuple:
    """``(compile slots, spec of the items)``: with the backward, the two passes' static phases run at once,
    each compiling on its share of the cores (unless ``--workers`` says how many)."""
    from rocmflash.tuning.pipeline import compile_workers, default_compile_slots

    slots = default_compile_slots() if backward else 1
    if slots > 1 and spec.workers is None:
        return slots, dataclasses.replace(spec, workers=compile_workers(slots))
    return slots, spec


def _clear_backward_lookups() -> None:
    """Run-time lookups read the new backward entries."""
    from rocmflash.api import selection
    from rocmflash.db.lookups.backward import clear_cache

    clear_cache()
    selection.clear_cache()


def _own_runner(spec: TuneSpec):
    """A :class:`~rocmflash.tuning.live.LiveRunner` on the current device, reading the static phase's builds."""
    import torch

    from rocmflash.static.compile import triton_cache_dir
    from rocmflash.tuning.live import LiveRunner

    # the device identify_live_device() resolved: the current one, pinned in the workers
    return LiveRunner(spec.live_settings, triton_cache_dir=triton_cache_dir(spec.cache_dir),
                      prewarm_workers=spec.workers, device_index=torch.cuda.current_device())


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C during a tune: the journal and database are consistent; ``result`` says what was kept."""

    def __init__(self, result: TuneResult):
        super().__init__("tune interrupted")
        self.result = result
