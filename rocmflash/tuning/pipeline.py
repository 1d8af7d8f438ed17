"""One tune pipeline for a whole plan (issue #29): a CPU compile pool ahead of the timing, and
timing workers (one per runner) that stay up across items and families.

An :class:`Item` is one (family, problem) of a plan. Its ``static()`` phase (config space,
cross-compile, prune, pre-warm) runs on a compile-pool thread, in ``priority`` order, ahead of the
timing; ``compile_slots`` of them at once (:func:`default_compile_slots`), never two of one
``static_group`` (items sharing a static phase: the second would only wait for the first's
compile, holding a slot). Then it hands out batches of :class:`Job` (a race round, or the single
round of a pruned/exhaustive tune); every free timing worker takes the next job of ANY item (by
``priority``, default plan order, then batch order), with no barrier between families, passes or
dtypes. An item with ``static_stream`` / ``early_jobs`` streams: the configs of its first batch (a race's round
1) are timed as they become ready (compiled, read, pruned, pre-warmed) while the rest of the item still
compiles; the round still closes only when all of them are in and recorded. Every timing worker is started
when the run starts, beside the first static phase (``start_worker()`` of a runner that has one).
:func:`largest_first` gives the priority of several workers: the items by estimated timing work (``work_s()``),
largest first: the longest work starts first, the short jobs of small items end the run, and a group's largest
item compiles its builds (the rest find them cached), so the jobs a busy compile pool releases are the longest.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Optional, Protocol

from rocmflash.tuning.pipeline_policy import (  # noqa: F401  (re-exported: the settings moved there)
    CORES_PER_COMPILE_SLOT,
    GIB_PER_COMPILE_SLOT,
    MAX_COMPILE_SLOTS,
    compile_workers,
    default_compile_slots,
    largest_first,
    leave_for_another,
)
from rocmflash.tuning.pool import DiscardPlan, NoWorkersLeft, WorkerLost, WorkerStats


@dataclasses.dataclass(eq=False)
class Job:
    """One timed measurement of one item: runs on a timing worker's runner."""

    item: "Item"
    run: Callable[[object], dict]      # run(runner) -> result dict (always has "status"); called on a
                                       # timing-worker thread with that worker's runner (LiveRunner/ReplayRunner)
    label: str                         # short config label for progress rows
    sim_key: tuple                     # (item.key, config json, round or None): recorded-duration lookup
    payload: object = None             # whatever the item wants back in record() (e.g. the Candidate)
    affinity: Optional[str] = None     # a kind of job dearer the first time a process runs one (SDPA_AFFINITY):
                                       # left to a worker that ran one before (pipeline_policy.leave_for_another)


class Item(Protocol):
    """One (family, problem) of a plan: a kernel family's plug-in instance."""

    family: str            # "fwd" | "bwd" | "decode" | "varlen_fwd" | "varlen_bwd"
    key: str               # database entry key (unique within a plan)

    def static(self) -> None:
        """CPU only: config space, cross-compile (cached), prune, rank, and the runner-side pre-warm of
        what will be timed. Runs on a compile-pool thread of the pipeline, ahead of timing."""

    def compile_seconds(self) -> list:
        """Per-config compile seconds from the compile cache's records (``compile_seconds``), for the
        simulated clock; valid after static(). Uncached/unknown configs are left out."""

    def next_batch(self) -> Optional[list]:
        """list[Job] to time next (a race round), or None when the item needs no more timing. Called
        after static(), then each time every job of the previous batch has been recorded. An empty
        list means "nothing to time in this batch, ask again"."""

    def record(self, job: Job, result: dict) -> None:
        """Each result as it arrives (journal append, progress); scheduler thread."""

    def finish(self, complete: bool) -> None:
        """Build the entry from what is recorded and store it (atomic DB write); scheduler thread.
        complete=False after Ctrl-C/stop: the entry reflects exactly what the journal holds."""

    # optional: ``static_group`` (hashable; items sharing one static phase) and ``work_s()`` (estimated
    # timing-worker seconds, for :func:`largest_first`); streaming (see :class:`Pipeline`):
    # ``static_stream(notify)`` (static() that calls ``notify()``, from any thread, whenever more of its first
    # batch is ready to time) and ``early_jobs(upto=None)`` (scheduler thread, during the static phase: the jobs
    # of the ready configs not handed out yet, up to the first ``upto`` ready; they belong to the first batch,
    # which next_batch() completes after static(): the batch closes when its every job is recorded)


# ------------------------------------------------------------------------------------------- statistics
@dataclasses.dataclass
class ItemStats:
    """What the pipeline did for one item, on the executor's clock (seconds since the run began)."""

    key: str
    family: str
    static_s: float = 0.0  #: duration of its static phase
    static_done_at_s: Optional[float] = None
    timing_s: float = 0.0  #: timing-worker seconds spent on its jobs (retries included)
    jobs: int = 0  #: results recorded
    finished_at_s: Optional[float] = None  #: when finish() returned (None: never finished)


@dataclasses.dataclass
class PipelineStats:
    """A pipeline run: wall seconds, each timing worker (:class:`~rocmflash.tuning.pool.WorkerStats`) and
    each item (:class:`ItemStats`), in plan order."""

    wall_s: float
    workers: list
    items: list

    def item(self, key: str) -> ItemStats:
        """The stats of the item with database key ``key``."""
        for s in self.items:
            if s.key == key:
                return s
        raise KeyError(f"no item {key!r} in this pipeline run")


# ------------------------------------------------------------------------------------------- scheduler
class _State:
    """The scheduler's book-keeping of one item."""

    def __init__(self, item, index: int):
        self.item, self.index = item, index
        self.phase = "waiting"  # waiting -> static -> timing -> done
        self.queue: "collections.deque" = collections.deque()  # jobs of the current batch not yet started
        self.outstanding = 0  # jobs of the current batch not yet recorded
        self.stats = ItemStats(str(item.key), str(item.family))
        self.group = getattr(item, "static_group", None)  # items of one group never run their statics at once


class Pipeline:
    """Runs the items of a plan: their static phases on a compile pool, ahead of the timing, and their jobs on
    one timing worker per runner, each worker taking the next job of any item as soon as it is free.

    ``runners``: a list of runners (one per GPU or cluster actor), or a
    :class:`~rocmflash.tuning.pool.WorkerPool` (its runners and labels). ``executor``: None for real threads
    (:class:`~rocmflash.tuning.pipeline_exec.ThreadExecutor`), or a
    :class:`~rocmflash.tuning.pipeline_exec.SimulatedExecutor`. ``on_event(dict)`` sees every step
    (``event``: static_start, static_done, job_start, job_done, job_retry, worker_lost, item_done;
    ``t``: executor seconds; ``item``, ``worker``, ``label``, ``status`` where they apply).
    ``compile_slots``: static phases at once; ``stream``: let streaming items time their first batch while
    their static phase runs (False: every item's static phase ends before its first job); ``start_workers``:
    start every timing worker when the run starts (False: each at its first job); ``priority``: the items in the
    order workers take their jobs and the static phases start (default: ``items``' order).

    The pipeline neither opens nor closes the runners: the caller does (closing them also ends the work
    in flight after a Ctrl-C).
    """

    def __init__(self, items: list, runners, compile_slots: int = 1, executor=None,
                 labels: Optional[list] = None, on_event: Optional[Callable[[dict], None]] = None,
                 start_workers: bool = True, priority: Optional[list] = None, stream: bool = True,
                 on_statics_done: Optional[Callable[[], None]] = None, gate: Optional[Callable[[], None]] = None):
        self.items = _check_items(items)
        self.priority = _check_priority(priority, self.items)
        self.runners, labels = _unwrap_runners(runners, labels)
        if type(compile_slots) is not int or compile_slots < 1:
            raise ValueError(f"compile_slots={compile_slots!r} is invalid; expected a positive int")
        self.compile_slots = compile_slots
        if executor is None:
            from rocmflash.tuning.pipeline_exec import ThreadExecutor

            executor = ThreadExecutor()
        self.executor = executor
        self.on_event = on_event
        self.stream = bool(stream)  #: streaming items time their first batch while their static phase runs
        self.start_workers = start_workers  #: start every timing worker at once (False: at its first job)
        self.workers = [WorkerStats(str(label)) for label in labels]
        #: called once, when the last static phase is done (the pre-warm workers can go while the timing goes on)
        self.on_statics_done = on_statics_done
        #: called once, before the first job is handed out or the first item writes its entry: a plan made on a
        #: guess (the GPU kind read without torch) is confirmed there, and :class:`DiscardPlan` ends the run with
        #: nothing written
        self.gate = gate

    # ------------------------------------------------------------------ main loop
    def run(self) -> PipelineStats:
        """Run every item to its end; returns :class:`PipelineStats`. On Ctrl-C, or any error (a bug of an
        item, :class:`~rocmflash.tuning.pool.NoWorkersLeft`), no more jobs are handed out, nothing in flight
        is waited for, every started item that did not finish gets ``finish(complete=False)``, and the
        exception is re-raised."""
        self._states = [_State(item, i) for i, item in enumerate(self.items)]
        self._by_item = {id(s.item): s for s in self._states}
        self._by_priority = [self._by_item[id(item)] for item in self.priority]
        self._busy: dict = {}  # worker index -> job in flight
        self._ran_by: dict = {}  # job affinity -> workers that ran a job of it
        self._statics = 0  # static phases in flight
        self._groups: collections.Counter = collections.Counter()  # static groups in flight
        self._lost: dict = {}  # job -> ["worker: error", ...]
        self._died: dict = {}  # job -> error of its first worker death
        ex = self.executor
        ex.start(self.runners, self.compile_slots)
        try:
            if self.start_workers and hasattr(ex, "start_workers"):
                ex.start_workers()  # worker processes start (import torch, open a device) beside the first static
            while any(s.phase != "done" for s in self._states):
                self._dispatch()
                if not self._busy and not self._statics:
                    raise RuntimeError("pipeline stalled: nothing in flight and items not done (scheduler bug)")
                self._handle(ex.next_event())
        except DiscardPlan:
            raise  # nothing was timed or written: no entry to finish
        except BaseException:
            self._abandon()
            raise
        finally:
            ex.shutdown()
        return PipelineStats(ex.now(), self.workers, [s.stats for s in self._states])

    def _emit(self, event: str, **info) -> None:
        if self.on_event is not None:
            self.on_event(dict(event=event, t=self.executor.now(), **info))

    def _abandon(self) -> None:
        """Ctrl-C or an error: the started items' entries reflect exactly what is recorded."""
        self._settle_streaming_statics()
        for s in self._states:
            if s.phase == "timing":
                s.phase = "done"
                try:
                    s.item.finish(False)
                except Exception:  # pragma: no cover - one item's store error must not hide the others'
                    import traceback

                    traceback.print_exc()

    def _settle_streaming_statics(self) -> None:
        """A streaming item stopped while its static phase runs has results recorded but no static result to
        write an entry from; its static phase may be all but done (its compiles were what released the jobs).
        Wait up to :data:`ABANDON_STATIC_WAIT_S` for those static phases to end: each that ends without an error
        gets its entry like an item in its timing phase; the others' results stay in the journal (``--resume``
        times nothing twice). Executors without ``poll_event`` (the simulated clock) do not wait."""
        import time

        from rocmflash.tuning.pipeline_exec import StaticDone

        waiting = {id(s.item): s for s in self._states if s.phase == "static" and s.stats.jobs}
        poll = getattr(self.executor, "poll_event", None)
        deadline = time.monotonic() + ABANDON_STATIC_WAIT_S
        while waiting and poll is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            event = poll(left)
            if isinstance(event, StaticDone) and id(event.item) in waiting and event.error is None:
                waiting.pop(id(event.item)).phase = "timing"

    # ------------------------------------------------------------------ what runs next
    def _dispatch(self) -> None:
        """Start static phases (priority order) on free compile slots, and jobs on free timing workers."""
        for s in self._by_priority:
            if self._statics >= self.compile_slots:
                break
            if s.phase == "waiting" and not self._groups[s.group]:
                s.phase = "static"
                self._statics += 1
                if s.group is not None:
                    self._groups[s.group] += 1
                self._emit("static_start", item=s.stats.key)
                self.executor.submit_static(s.item, self.stream and _streams(s.item))
        for w, stats in enumerate(self.workers):
            if stats.lost or w in self._busy:
                continue
            job = self._next_job(w)
            if job is None:
                break
            self._pass_gate()
            self._busy[w] = job
            if job.affinity is not None:
                self._ran_by.setdefault(job.affinity, set()).add(w)
            stats.current = job.label
            self._emit("job_start", item=job.item.key, worker=stats.label, label=job.label)
            self.executor.submit_job(w, job)

    def _pass_gate(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            gate()

    def _next_job(self, worker: int):
        """The next job by priority: the items' priority (default plan order), then batch order (retries first),
        passing over a job another worker should take (:func:`leave_for_another`) while others are ready."""
        alive = [w for w, stats in enumerate(self.workers) if not stats.lost]
        passed = None
        for s in self._by_priority:
            if s.phase in ("static", "timing") and s.queue:  # static: a streaming item's ready jobs
                if not leave_for_another(s.queue[0].affinity, worker, self._ran_by, alive):
                    return s.queue.popleft()
                passed = passed or s
        return passed.queue.popleft() if passed is not None else None

    # ------------------------------------------------------------------ events
    def _handle(self, event) -> None:
        from rocmflash.tuning.pipeline_exec import StaticDone, StaticProgress

        if isinstance(event, StaticDone):
            self._static_done(event)
        elif isinstance(event, StaticProgress):
            self._static_progress(event)
        else:
            self._job_done(event)

    def _state(self, item) -> _State:
        return self._by_item[id(item)]

    def _static_done(self, event) -> None:
        self._statics -= 1
        s = self._state(event.item)
        if s.group is not None:
            self._groups[s.group] -= 1
        if event.error is not None:
            raise event.error
        s.stats.static_s = event.end - event.start
        s.stats.static_done_at_s = event.end
        s.phase = "timing"
        self._emit("static_done", item=s.stats.key, seconds=s.stats.static_s)
        if self.on_statics_done is not None and not self._statics \
                and not any(st.phase == "waiting" for st in self._states):
            done, self.on_statics_done = self.on_statics_done, None
            self._emit("statics_done")
            done()
        self._advance(s)

    def _static_progress(self, event) -> None:
        """A streaming item has more of its first batch ready: queue those jobs (ignored once its static is done:
        next_batch() hands out the rest)."""
        s = self._state(event.item)
        if s.phase != "static":
            return
        jobs = s.item.early_jobs(event.upto)
        self._check_batch(s, jobs)
        if jobs:
            s.queue.extend(jobs)
            s.outstanding += len(jobs)
            self._emit("static_progress", item=s.stats.key, jobs=len(jobs))

    def _check_batch(self, s: _State, batch) -> None:
        if not isinstance(batch, list) or not all(isinstance(j, Job) and j.item is s.item for j in batch):
            raise TypeError(f"{s.stats.key}: next_batch()/early_jobs() must return a list of Job of this item, "
                            f"got {batch!r}")

    def _advance(self, s: _State) -> None:
        """Ask the item for its next batch (every job of the previous one is recorded, or after its static phase:
        the rest of a first batch whose streamed jobs are still outstanding)."""
        for _ in range(10000):
            batch = s.item.next_batch()
            if batch is None:
                if s.outstanding or s.queue:
                    raise RuntimeError(f"{s.stats.key}: next_batch() returned None with {s.outstanding} streamed "
                                       "job(s) of its first batch not recorded (item bug)")
                self._pass_gate()
                s.phase = "done"
                s.item.finish(True)
                s.stats.finished_at_s = self.executor.now()
                self._emit("item_done", item=s.stats.key)
                return
            self._check_batch(s, batch)
            if batch or s.outstanding:  # outstanding: streamed jobs of this (first) batch, still in flight
                s.queue.extend(batch)
                s.outstanding += len(batch)
                return
        raise RuntimeError(f"{s.stats.key}: next_batch() returned an empty batch 10000 times in a row")

    def _job_done(self, event) -> None:
        w, job = event.worker, event.job
        stats = self.workers[w]
        del self._busy[w]
        stats.current = ""
        if event.error is not None and not isinstance(event.error, Exception):
            raise event.error  # KeyboardInterrupt, SystemExit: stop
        if isinstance(event.error, WorkerLost):
            self._worker_lost(w, job, event.error)
            return
        seconds = event.end - event.start
        stats.busy_s += seconds
        s = self._state(job.item)
        s.stats.timing_s += seconds
        result = _as_result(event.result, event.error)
        if result.get("status") == "crashed" and result.get("worker_died") and job not in self._died:
            self._died[job] = f"{stats.label}: {result.get('error')}"  # the process died: once more, anywhere
            s.queue.appendleft(job)
            self._emit("job_retry", item=s.stats.key, worker=stats.label, label=job.label, status="crashed")
            return
        self._record(s, w, job, result)

    def _worker_lost(self, w: int, job, error: Exception) -> None:
        stats = self.workers[w]
        stats.lost = True
        self._emit("worker_lost", worker=stats.label, label=job.label, error=str(error))
        lost = self._lost.setdefault(job, [])
        lost.append(f"{stats.label}: {error}")
        s = self._state(job.item)
        if len(lost) > 1:  # two workers gone under one config: it is the config's doing
            self._record(s, w, job, {"status": "crashed", "error": "timing worker lost twice: " + "; ".join(lost)})
        else:  # at the end of its item's queue: fresh work first, as a pool of workers did
            s.queue.append(job)
        if all(st.lost for st in self.workers):
            raise NoWorkersLeft("every timing worker of the pipeline is gone")

    def _record(self, s: _State, w: int, job, result: dict) -> None:
        stats = self.workers[w]
        result = dict(result)
        result["worker"] = stats.label
        retried = (self._lost.get(job) or [None])[0] or self._died.get(job)
        if retried:
            result["retried_after"] = retried
        stats.done += 1
        stats.failed += result.get("status") != "ok"
        s.stats.jobs += 1
        s.item.record(job, result)
        self._emit("job_done", item=s.stats.key, worker=stats.label, label=job.label, status=result.get("status"))
        s.outstanding -= 1
        if s.outstanding == 0 and not s.queue and s.phase == "timing":  # static: its first batch is still growing
            self._advance(s)


# ------------------------------------------------------------------------------------------- settings
#: how long a stopped pipeline waits for the static phases of streaming items that have results recorded
ABANDON_STATIC_WAIT_S = 5.0

def _streams(item) -> bool:
    """Whether ``item`` can time its first batch while its static phase runs."""
    return callable(getattr(item, "static_stream", None)) and callable(getattr(item, "early_jobs", None))


def _as_result(result, error: Optional[Exception]) -> dict:
    """A job's result dict; a runner bug (an exception, a non-dict) costs that config only, as in WorkerPool."""
    if error is not None:
        return {"status": "crashed", "error": f"{type(error).__name__}: {error}"}
    if not isinstance(result, dict) or "status" not in result:
        return {"status": "crashed", "error": f"runner returned {type(result).__name__}, not a result dict"}
    return result


def _check_items(items) -> list:
    items = list(items) if isinstance(items, (list, tuple)) else None
    if items is None:
        raise TypeError("items must be a list of pipeline Items")
    keys = set()
    for item in items:
        missing = [m for m in ("family", "key", "static", "compile_seconds", "next_batch", "record", "finish")
                   if not hasattr(item, m)]
        if missing:
            raise TypeError(f"{item!r} is not a pipeline Item: it lacks {', '.join(missing)}")
        if item.key in keys:
            raise ValueError(f"two items of the plan have the key {item.key!r}; keys must be unique")
        keys.add(item.key)
    return items


def _check_priority(priority: Optional[list], items: list) -> list:
    if priority is None:
        return list(items)
    if sorted(map(id, priority)) != sorted(map(id, items)):
        raise ValueError("priority must list every item of the pipeline once (the order its jobs are taken in)")
    return list(priority)


def _unwrap_runners(runners, labels: Optional[list]) -> tuple:
    if hasattr(runners, "runners") and hasattr(runners, "stats"):  # a WorkerPool: its runners and labels
        labels = labels or [s.label for s in runners.stats]
        runners = runners.runners
    if not isinstance(runners, (list, tuple)) or not runners:
        raise ValueError("a pipeline needs a non-empty list of runners (one per GPU or actor)")
    labels = list(labels) if labels is not None else [str(i) for i in range(len(runners))]
    if len(labels) != len(runners):
        raise ValueError(f"{len(labels)} labels for {len(runners)} runners; expected one label per runner")
    return list(runners), labels


__all__ = ["Job", "Item", "ItemStats", "PipelineStats", "Pipeline", "default_compile_slots", "compile_workers",
           "largest_first"]
