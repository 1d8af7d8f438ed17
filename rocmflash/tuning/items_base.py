"""What the items of one tune share (:mod:`rocmflash.tuning.items`): the :class:`TuneContext` (GPU,
database, journal, environment, console output, shared static phases, pre-warm), the journal records of
the worker-task families (backward, decode, varlen: the problem dict as the record's ``shape``) and
:class:`FamilyTiming`, the timed part of an item whose configs are timed once each as worker tasks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from typing import Callable, Optional

from rocmflash.db import ConfigDB, Journal, env_id, environment, journal_path, now_iso
from rocmflash.tuning.output import _Output


class SharedStatics:
    """Static phases shared between the items of one static problem (compile threads may ask at once)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._locks: dict = {}
        self._done: dict = {}

    def get(self, key, build: Callable[[], object]):
        """``build()``'s result for ``key``, built once (a second asker waits for the first)."""
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._done:
                self._done[key] = build()
            return self._done[key]


@dataclasses.dataclass
class TuneContext:
    """What the items of one tune share (see the module docstring)."""

    gpu: object
    db: ConfigDB
    env: dict
    eid: str
    journal: Optional[Journal]  #: None when nothing is measured
    out: _Output
    measuring: bool
    why: Optional[str] = None  #: why nothing is measured
    prewarmer: object = None  #: has ``prewarm`` / ``prewarm_tasks`` (a WorkerPool or a runner), or None
    runs_tasks: bool = True  #: the timing workers run worker tasks (the incumbent: not on a replay)
    interpret: bool = False  #: kernels run in Triton's CPU interpreter (entries say so)
    statics: SharedStatics = dataclasses.field(default_factory=SharedStatics)

    def store(self, key: str, entry: dict, cache_dir: Optional[str] = None) -> None:
        """Put ``entry`` and save the database atomically (a measured entry stamps this environment).

        The entry records what its verdicts rested on (:func:`rocmflash.static.db_record.record_entry`: each kept
        config's static profile and the compiler, read from the compile cache under ``cache_dir`` that the static
        phase filled; nothing is compiled for it).

        A measuring tune's entry with no best config (every config failed, crashed, timed out or was incorrect;
        or none survived the static phase) is a failed problem: it is stored as :func:`failed_entry` (never
        ``"measured": true`` without a best), told to the :func:`recording_failures` of this process (the CLI
        exits non-zero on it; ``entry`` is marked in place), and an earlier entry under ``key`` that run time can serve is kept, not replaced:
        a failed re-tune loses nothing that was measured before."""
        if self.measuring and not entry.get("best"):
            entry.update(failed_entry(entry))  # in place: the item's outcome and its summary row say it too
            earlier = self.db.entries.get(key)
            kept = isinstance(earlier, dict) and bool(earlier.get("best")) and bool(earlier.get("measured"))
            _record_failure(key, entry["failed"], kept)
            if kept:
                self.out.note(f"{key}: no config passed ({entry['failed']}); the earlier entry is kept")
                return
        self._record(key, entry, cache_dir)
        self.db.put(key, entry)
        self.db.save(self.env if self.measuring else None)

    def _record(self, key: str, entry: dict, cache_dir: Optional[str]) -> None:
        """Add the static record to ``entry`` in place; a record that cannot be read is noted, never fatal (the
        entry is stored without it, as a schema-1 entry was)."""
        from rocmflash.static.db_record import record_entry

        try:
            record_entry(self.gpu, key, entry, cache_dir)
        except Exception as err:  # noqa: BLE001 - evidence only: the tuned entry itself must be stored
            self.out.note(f"{key}: no static record in the entry ({type(err).__name__}: {err})")

    def can_prewarm(self, method: str = "prewarm") -> bool:
        """Whether :meth:`prewarm` (``method="prewarm"``) or :meth:`prewarm_tasks` (``"prewarm_tasks"``) would reach a
        pre-warmer. A streamed static phase pre-warms on helper threads only then; without one (a replay, the
        simulated clock of ``benchmarks/scale_sim.py``) its survivors are ready as released, in release order."""
        if method == "prewarm_tasks" and self.interpret:  # interpreted tasks build nothing
            return False
        return self.prewarmer is not None and hasattr(self.prewarmer, method)

    def prewarm(self, configs: list, shape) -> None:
        """Fill the timing workers' compile caches with the forward ``configs`` (errors show when timed)."""
        if configs and self.can_prewarm():
            try:
                self.prewarmer.prewarm(configs, shape)
            except Exception as err:  # a pre-warm is an optimisation: the timing meets any real error again
                self.out.note(f"pre-warm failed ({type(err).__name__}: {err}); configs compile when timed")

    def start_prewarm(self) -> None:
        """Start the pre-warm workers now (non-blocking), while the first static phase cross-compiles, instead of
        at its first pre-warm: on the runner(s) that will pre-warm (a pool whose runners share a Triton cache
        pre-warms on its first runner only)."""
        target = self.prewarmer
        if not self.measuring or self.interpret or target is None:  # interpreted: pre-warms start it if need be
            return
        if hasattr(target, "runners"):
            target = target.runners[:1] if getattr(target, "shared_cache", False) else target.runners
        for runner in target if isinstance(target, list) else [target]:
            start = getattr(runner, "start_prewarm", None)
            if callable(start):
                try:
                    start()
                except Exception:  # noqa: BLE001 - an optimisation: the first pre-warm starts them again
                    pass

    def release_prewarm(self) -> None:
        """Every static phase is done: the pre-warm workers are closed in the background (their device contexts'
        teardown overlaps the timing instead of the end of the tune). A later pre-warm starts them again."""
        target = self.prewarmer
        for runner in getattr(target, "runners", None) or ([target] if target is not None else []):
            release = getattr(runner, "release_prewarm", None)
            if callable(release):
                try:
                    release()
                except Exception:  # noqa: BLE001 - closing early is an optimisation: close() closes them anyway
                    pass

    def prewarm_tasks(self, tasks: list, fn: Callable, timeout_s: float) -> None:
        """The same for worker tasks (backward, decode)."""
        if not tasks or not self.can_prewarm("prewarm_tasks"):
            return
        try:
            self.prewarmer.prewarm_tasks(tasks, fn, timeout_s)
        except Exception as err:
            self.out.note(f"pre-warm failed ({type(err).__name__}: {err}); configs compile when timed")


# ---------------------------------------------------------------------- failed problems
@dataclasses.dataclass(frozen=True)
class TuneFailure:
    """A problem of a tune that no config passed: its database key, the cause, and whether an earlier
    servable entry under that key was kept."""

    key: str
    cause: str
    kept_earlier: bool

    def line(self) -> str:
        kept = "; the earlier entry is kept" if self.kept_earlier else "; stored as failed (run time ignores it)"
        return f"{self.key}: {self.cause}{kept}"


_FAILURE_LOCK = threading.Lock()
_FAILURE_RECORDERS: list = []  #: the lists of the open :func:`recording_failures` blocks (the store runs on any thread)


@contextlib.contextmanager
def recording_failures():
    """``with recording_failures() as failures:`` -- every :class:`TuneFailure` stored by a tune of this process
    while the block runs is appended to ``failures`` (the pipeline stores entries on its own threads)."""
    failures: list = []
    with _FAILURE_LOCK:
        _FAILURE_RECORDERS.append(failures)
    try:
        yield failures
    finally:
        with _FAILURE_LOCK:
            _FAILURE_RECORDERS.remove(failures)


def _record_failure(key: str, cause: str, kept_earlier: bool) -> None:
    failure = TuneFailure(key, cause, kept_earlier)
    with _FAILURE_LOCK:
        for failures in _FAILURE_RECORDERS:
            failures.append(failure)


def failure_cause(entry: dict) -> str:
    """Why a measured problem has no best config, from its entry: the family's own reason and the timed
    configs' outcomes (``counts``)."""
    why = entry.get("why_unmeasured") or entry.get("note") or "no config passed"
    counts = entry.get("counts") if isinstance(entry.get("counts"), dict) else {}
    outcomes = [f"{counts[s]} {s}" for s in ("incorrect", "failed", "timeout", "crashed") if counts.get(s)]
    timed = counts.get("timed")
    if timed == 0 and not outcomes:
        outcomes = ["nothing was timed"]
    if outcomes:
        why += f" ({f'{timed} timed: ' if timed else ''}{', '.join(outcomes)}; the journal has each error)"
    return why


def failed_entry(entry: dict) -> dict:
    """``entry`` marked as a failed problem: ``"failed"`` holds the cause, ``"measured": false`` and no best, so
    run time, ``explain`` and ``export`` treat it as absent."""
    return dict(entry, measured=False, best=None, failed=failure_cause(entry))


def open_context(gpu, db_path: str, device: Optional[str], measuring: bool, why: Optional[str] = None,
                 console=None, progress: bool = False, prewarmer=None, runners: Optional[list] = None,
                 interpret: Optional[bool] = None) -> TuneContext:
    """A :class:`TuneContext` for a tune of ``gpu`` into ``db_path``; ``device``: the timing device's name
    (the environment fingerprint). The caller holds the database's tune lock."""
    from rocmflash.kernels.common import interpreting

    env = environment(device)
    out = _Output(console, progress)
    db = ConfigDB.open(db_path, gpu.name, gpu.arch, env, gpu.compute_units)
    journal = Journal(journal_path(db_path), gpu.name) if measuring else None
    if journal is not None and journal.torn_lines:
        out.note(f"journal: ignored {journal.torn_lines} torn line(s) from an interrupted write")
    runs_tasks = all(hasattr(r, "call") for r in runners) if runners else True
    return TuneContext(gpu, db, env, env_id(env), journal, out, measuring, why, prewarmer, runs_tasks,
                       interpreting() if interpret is None else interpret)


# ---------------------------------------------------------------------- family journal records
def config_json(config: dict) -> str:
    """A config dict's canonical JSON (the journal's and the simulated clock's config key)."""
    return json.dumps(config, sort_keys=True)


def family_results(ctx: TuneContext, family: str, key: str, problem: dict) -> dict:
    """``{config json: latest record}`` of one backward/decode problem in this environment."""
    out = {}
    wanted = config_json(problem)  # as JSON: a tuple in the problem and a list read back are the same
    for r in ctx.journal.records if ctx.journal is not None else ():
        if (r.get("family") == family and r["key"] == key and r.get("env") == ctx.eid and r.get("round") is None
                and config_json(r.get("shape")) == wanted):
            out[config_json(r["config"])] = r
    return out


def journal_family_result(ctx: TuneContext, family: str, key: str, problem: dict, strategy: str,
                          result: dict) -> dict:
    """Append one backward/decode result to the journal (the problem dict as its ``shape``); the record."""
    record = dict(result)
    record.update(key=key, family=family, shape=problem, env=ctx.eid, strategy=strategy, when=now_iso(),
                  round=None)
    ctx.journal.append(record)
    return record


class StreamedTiming:
    """What the pipeline asks of an item whose ``self.timing`` (:class:`FamilyTiming`) streams its static phase:
    the jobs ready while that phase runs, and what the simulated clock reads of its compile order."""

    def early_jobs(self, upto=None) -> list:
        """Jobs of the configs ready while the static phase runs (pipeline scheduler thread)."""
        return self.timing.early_batch(upto)

    def stream_prefixes(self) -> list:
        return self.timing.stream_prefixes()

    def compile_order_seconds(self) -> list:
        return self.timing.compile_order_seconds()


class FamilyTiming:
    """The timed part of a backward or decode item: its tasks in one batch (nothing to resume in rounds),
    each result journaled as it arrives; :meth:`results` is every task's latest result, task order."""

    def __init__(self, item, family: str, fn: Callable, timeout_s: float, strategy: str, on_result=None):
        self.item, self.family, self.fn, self.timeout_s = item, family, fn, timeout_s
        self.strategy, self.on_result = strategy, on_result
        self.tasks: list = []
        self.handed_out = False
        self.timed_now = 0
        self.skipped = 0
        self.ready = None  #: streamed static phase: a ReadyQueue of (index, task) ready to time
        self.stream = None  #: its SurvivorStream (once the static phase named its configs)
        self.early: set = set()  #: config keys handed out while the static phase ran
        self.early_jobs: set = set()  #: ids of those jobs not recorded yet

    def done(self) -> dict:
        return family_results(self.item.ctx, self.family, self.item.key, self.item.problem_dict)

    def todo(self) -> list:
        done = self.done()
        return [t for t in self.tasks if config_json(t["config"]) not in done]

    def batch(self) -> Optional[list]:
        """The not yet journaled tasks as jobs, once; then None (a streamed static phase: those not handed out
        early; an empty batch while early jobs are in flight, so the batch closes when they are recorded)."""
        if self.handed_out or not self.item.ctx.measuring:
            return None
        self.handed_out = True
        done = self.done()
        todo = [t for t in self.tasks if config_json(t["config"]) not in done and config_json(t["config"]) not in
                self.early]
        self.skipped = sum(1 for t in self.tasks if config_json(t["config"]) in done and
                           config_json(t["config"]) not in self.early)
        if self.skipped:
            self.item.ctx.out.note(f"{self.item.key}: {self.skipped} of {len(self.tasks)} config(s) already in the "
                                   "journal, skipped")
        jobs = [self.job(task) for task in todo]
        return jobs if jobs or self.early_jobs else None

    def job(self, task: dict):
        """The worker-task job of one task (a crash or a hang costs that task only)."""
        from rocmflash.tuning.pipeline import Job

        fn, timeout_s = self.fn, self.timeout_s
        return Job(self.item, (lambda runner, task=task: runner.call(fn, task, timeout_s)), _task_label(task),
                   (self.item.key, config_json(task["config"]), None), payload=task)

    # ------------------------------------------------------------------ a streamed static phase
    def open_stream(self, notify, settings, task_of: Callable, prewarm: Optional[Callable], **rules) -> dict:
        """The hooks (``on_configs(configs)``, ``on_result(observation)``) of a streamed static phase: each certain
        survivor (:class:`~rocmflash.tuning.stream.SurvivorStream` with ``settings`` and ``rules``) becomes the
        task ``task_of(config)``, pre-warmed (``prewarm(tasks)``; None: not) and ready to time; ``notify()`` after
        each batch. Tasks the journal already holds are not timed again."""
        from rocmflash.tuning.stream import ReadyQueue, SurvivorStream

        done = self.done()
        warm = None if prewarm is None else (lambda entries: prewarm([t for _, t in entries]))
        self.ready = ReadyQueue(warm, notify)

        def on_release(released):
            tasks = [(i, task_of(self.stream.configs[i])) for i, _, _ in released]
            self.ready.put([(i, t) for i, t in tasks if config_json(t["config"]) not in done])

        def on_configs(configs):
            self.stream = SurvivorStream(configs, settings, on_release, **rules)

        def on_result(observation):
            if self.stream is not None:
                self.stream.add(observation)

        return {"on_configs": on_configs, "on_result": on_result}

    def close_stream(self) -> None:
        """Wait until every released task is pre-warmed (the static phase's end)."""
        if self.ready is not None:
            self.ready.close()

    def check_streamed(self) -> set:
        """Config keys pre-warmed while streaming; each handed out early must be one of :attr:`tasks` (else a bug
        of the stream's rule: its timing would be of a config the static phase pruned)."""
        if self.ready is None:
            return set()
        wrong = sorted(self.early - {config_json(t["config"]) for t in self.tasks})
        if wrong:
            raise RuntimeError(f"{self.item.key}: streamed config(s) not among those to time: {wrong[:3]}")
        return {config_json(t["config"]) for _, t in self.ready.ready}

    def early_batch(self, upto=None) -> list:
        """Jobs of the tasks ready while the static phase runs (pipeline scheduler thread)."""
        if self.ready is None:
            return []
        jobs = [self.job(t) for _, t in self.ready.take(upto)]
        self.early.update(j.sim_key[1] for j in jobs)
        self.early_jobs.update(id(j) for j in jobs)
        return jobs

    def stream_prefixes(self) -> list:
        """Per ready task (ready order): how many configs of the compile order it waited for (simulated clock)."""
        if self.ready is None or self.stream is None:
            return []
        return [self.stream.needs(i) for i, _ in self.ready.ready]

    def compile_order_seconds(self) -> list:
        """Compile seconds per config in compile order (0: unknown), for the simulated clock's release times."""
        return self.stream.compile_seconds() if self.stream is not None else []

    def record(self, job, result: dict) -> None:
        self.early_jobs.discard(id(job))
        result = dict(result)
        result.setdefault("config", job.payload["config"])
        journal_family_result(self.item.ctx, self.family, self.item.key, self.item.problem_dict, self.strategy, result)
        self.timed_now += 1
        if self.on_result is not None:
            self.on_result(result)

    def results(self) -> list:
        done = self.done()
        return [done[k] for k in (config_json(t["config"]) for t in self.tasks) if k in done]


def cached_compile_seconds(family_name: str, configs: list, problem: dict, gpu, cache_dir: Optional[str]) -> list:
    """Compile seconds of a family's configs from the compile cache's records (uncached: left out)."""
    from rocmflash.static.compile import ObservationCache, default_cache_dir, family_fingerprint
    from rocmflash.static.families import get_family

    family = get_family(family_name)
    cache = ObservationCache(cache_dir or default_cache_dir())
    seconds = []
    for cfg in configs:
        record = cache.get(family_fingerprint(family, cfg, problem, gpu)) or {}
        if record.get("compile_seconds"):
            seconds.append(record["compile_seconds"])
    return seconds


def _task_label(task: dict) -> str:
    from rocmflash.tuning.pool import _short

    return _short(task.get("config"))


def current_device_runner(settings):
    """A :class:`~rocmflash.tuning.live.LiveRunner` on the current device with Triton's own cache: the isolated
    worker the backward, decode and varlen tunes time their tasks in (a crash or hang costs that task only)."""
    import torch

    from rocmflash.tuning.live import LiveRunner

    return LiveRunner(settings, device_index=torch.cuda.current_device())


__all__ = ["TuneContext", "SharedStatics", "TuneFailure", "recording_failures", "failed_entry", "failure_cause",
           "open_context", "family_results", "journal_family_result",
           "config_json", "FamilyTiming", "cached_compile_seconds", "current_device_runner"]
