"""The tune itself: static phase per problem, then the strategy on a runner, then the database."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Optional

from rocmflash.db import ConfigDB, Journal, default_db_path, env_id, environment, journal_path, tune_lock
from rocmflash.detect import identify_live_device
from rocmflash.gpus import GPU, get_gpu
from rocmflash.race import FINAL_PASSES, final_round_records, merge_final_passes
from rocmflash.roofline import Shape
from rocmflash.tuning.entries import measured_entry, shape_key, static_entry
from rocmflash.tuning.incumbents import time_incumbent
from rocmflash.tuning.output import _Output
from rocmflash.tuning.spec import NoLiveGPUError, TuneSpec, static_problem
from rocmflash.tuning.strategies import RACE_ROUNDS, Stopped, _LiveProblem, _race, _single_round, choose, race_field

@dataclasses.dataclass
class ProblemOutcome:
    key: str
    shape: Shape
    entry: dict
    timed_now: int = 0
    skipped: int = 0
    stale: int = 0
    seconds: float = 0.0
    static_seconds: float = 0.0


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


def tune(spec: TuneSpec, runner=None, console=None, progress: bool = True) -> TuneResult:
    """Run a tune; see the module docstring. ``runner`` overrides live detection (tests: ReplayRunner)."""
    from rocmflash.space import default_space

    spec.validate()
    start = time.perf_counter()
    if runner is not None and str(spec.gpu).strip().lower() != "auto":
        gpu, live = get_gpu(spec.gpu), None
    else:
        gpu, live = resolve_gpu(spec.gpu)
    own_runner = False
    why = None
    if runner is None:
        if live is not None and live.name == gpu.name:
            from rocmflash.live import LiveRunner

            own_runner = True
            runner = None  # created after the static phase (needs the cache dir)
        else:
            why = _no_live_reason(gpu)
    measuring = runner is not None or own_runner
    if spec.strategy == "exhaustive" and not measuring:
        raise NoLiveGPUError(f"--strategy exhaustive times every config and needs a live {gpu.name}: {why}")
    device_name = None
    if own_runner:
        import torch

        device_name = torch.cuda.get_device_properties(0).name
    elif runner is not None:
        device_name = getattr(runner, "device", "replay")
    env = environment(device_name)
    eid = env_id(env)
    db_path = spec.db_path or default_db_path(gpu.name)
    jpath = journal_path(db_path) if measuring else None
    space = spec.space or default_space(gpu, spec.variants)
    out = _Output(console, progress)
    if own_runner:
        match = identify_live_device()
        if match is not None and match.problem:  # e.g. an unnamed board that fits two targets
            out.note(f"live GPU: {match.describe()}")
    lock = tune_lock(db_path)
    outcomes: list[ProblemOutcome] = []
    interrupted = False
    try:
        db = ConfigDB.open(db_path, gpu.name, gpu.arch, env, gpu.compute_units)
        journal = Journal(jpath, gpu.name) if measuring else None
        if journal is not None and journal.torn_lines:
            out.note(f"journal: ignored {journal.torn_lines} torn line(s) from an interrupted write")
        if spec.resume:
            out.note(f"resuming from {jpath}: {len(journal.records)} recorded result(s)" if journal is not None
                     else "--resume: nothing to resume (nothing is measured without a live GPU)")
        statics: dict = {}
        if own_runner:
            from rocmflash.compile import triton_cache_dir

            triton_cache = triton_cache_dir(spec.cache_dir)  # the static phase's builds: not compiled again
            import torch

            # the device identify_live_device() resolved: the current one, pinned in the workers
            runner = LiveRunner(spec.live_settings, triton_cache_dir=triton_cache, prewarm_workers=spec.workers,
                                device_index=torch.cuda.current_device())
        inject = dict(spec.inject)
        problems = []
        for seqlen in spec.seqlens:  # the static phase of every problem first (all CPU cores each)
            shape = spec.shape(seqlen)
            t0 = time.perf_counter()
            sp = static_problem(shape)
            if sp not in statics:
                statics[sp] = out.static(gpu, sp, space, spec)
            problems.append((shape, statics[sp], time.perf_counter() - t0))
        if not measuring:
            for shape, static, static_s in problems:
                entry = static_entry(gpu, shape, static, why, env)
                db.put(shape_key(shape), entry)
                db.save()
                outcomes.append(ProblemOutcome(shape_key(shape), shape, entry, seconds=static_s,
                                               static_seconds=static_s))
        else:
            live = _LiveTune(spec, gpu, runner, journal, db, out, eid, env, inject)
            live.run(problems, outcomes)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if own_runner and runner is not None:
            runner.close()
        lock.release()
    result = TuneResult(gpu, db_path, jpath, measuring, why, outcomes, time.perf_counter() - start, interrupted)
    if interrupted:
        raise TuneInterrupted(result)
    return result


class _LiveTune:
    """The live phase of one tune: each problem's strategy on the runner; with a pool (several GPUs)
    the problems run in parallel threads, sharing its workers, the journal and the database."""

    def __init__(self, spec, gpu, runner, journal, db, out, eid, env, inject):
        self.spec, self.gpu, self.runner, self.journal, self.db = spec, gpu, runner, journal, db
        self.out, self.eid, self.env, self.inject = out, eid, env, inject
        self.stop = threading.Event()

    def run(self, problems: list, outcomes: list) -> None:
        """Fills ``outcomes`` (first with every problem, so an interrupted tune still reports them)."""
        outcomes += [ProblemOutcome(shape_key(shape), shape, {}, static_seconds=static_s,
                                   stale=self.journal.stale(shape_key(shape), shape.to_dict(), self.eid))
                     for shape, _, static_s in problems]
        outcomes = outcomes[-len(problems):] if problems else []
        parallelism = getattr(self.runner, "parallelism", None)
        if parallelism is None:
            for (shape, static, _), outcome in zip(problems, outcomes):
                self.problem(shape, static, outcome)
            return
        from concurrent.futures import ThreadPoolExecutor

        with self.out.shared(self.runner, len(problems)):
            threads = ThreadPoolExecutor(max_workers=max(1, min(parallelism, len(problems))))
            futures = [threads.submit(self.problem, shape, static, outcome)
                       for (shape, static, _), outcome in zip(problems, outcomes)]
            try:
                for future in futures:
                    future.result()
            except BaseException:  # Ctrl-C (or a bug): stop the others, keep what is journaled
                self.stop.set()
                for future in futures:
                    future.cancel()
                self.runner.close()
                threads.shutdown(wait=True)
                raise
            threads.shutdown(wait=True)

    def problem(self, shape, static, outcome) -> None:
        t0 = time.perf_counter()
        ctx = _LiveProblem(self.runner, self.journal, self.out, self.spec, outcome.key, shape, self.eid, self.inject,
                           outcome, self.stop)
        chosen = None if self.spec.strategy == "race" else choose(self.spec.strategy, static, self.spec.top_k)
        complete = False
        try:
            if chosen is None:
                _race(ctx, static)
            else:
                _single_round(ctx, chosen)
            complete = True
        except Stopped:
            pass
        finally:  # Ctrl-C included: the entry reflects exactly what the journal holds
            if chosen is None:
                last = len(RACE_ROUNDS) - 1
                by_round = [ctx.results(rnd) for rnd in range(last + FINAL_PASSES)]
                rounds = by_round[:last] + [merge_final_passes(by_round[last:])]
                records = final_round_records(dict(enumerate(rounds)))[1]
                to_time = len(race_field(static))
            else:
                records, rounds, to_time = ctx.recorded(chosen), None, len(chosen)
            outcome.entry = measured_entry(self.gpu, shape, records, static, self.spec.strategy, to_time, complete,
                                           self.env, rounds=rounds)
            if complete and self.spec.incumbent and outcome.entry.get("best"):
                self.out.note(f"{outcome.key}: timing the platform's SDPA backends beside the winner")
                field = time_incumbent(self.runner, shape, outcome.entry["best"],
                                       self.spec.live_settings.to_dict(), outcome.entry["time_ms"])
                if field is not None:
                    outcome.entry["incumbent"] = field
            self.db.put(outcome.key, outcome.entry)
            self.db.save(self.env)
            outcome.seconds = time.perf_counter() - t0 + outcome.static_seconds
            self.out.problem_done(outcome)


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C during a tune: the journal and database are consistent; ``result`` says what was kept."""

    def __init__(self, result: TuneResult):
        super().__init__("tune interrupted")
        self.result = result
