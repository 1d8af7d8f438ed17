"""The two executors of :class:`rocmflash.tuning.pipeline.Pipeline`: threads on the wall clock, and a
simulated clock that replays recorded durations.

Both give the scheduler the same four calls: ``start(runners, compile_slots)``,
``submit_static(item, stream)``, ``submit_job(worker, job)`` and ``next_event()`` (blocking), plus
``now()`` (seconds since start), ``start_workers()`` (start every timing worker now, not at its
first job) and ``shutdown()``. The scheduler alone decides what runs
next; an executor only runs it and reports when it ended, so the simulated clock exercises
exactly the scheduling code a real tune uses.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import queue
import threading
import time
from typing import Callable, Optional

#: an inbox message of a timing thread: start the runner's worker process now (``runner.start_worker()``)
_START = object()


@dataclasses.dataclass
class StaticDone:
    """An item's static phase ended (``error``: what it raised, else None)."""

    item: object
    error: Optional[BaseException]
    start: float
    end: float


@dataclasses.dataclass
class StaticProgress:
    """A streaming item's static phase has more configs ready to time (:meth:`early_jobs`): ``upto`` is how many
    of its ready configs the clock has reached (None: all it has, on the wall clock)."""

    item: object
    upto: Optional[int] = None


@dataclasses.dataclass
class JobDone:
    """A job ended on timing worker ``worker``: its result, or what ``job.run`` raised."""

    worker: int
    job: object
    result: Optional[dict]
    error: Optional[BaseException]
    start: float
    end: float


def makespan(seconds: list, cores: int) -> float:
    """Wall seconds of independent tasks on ``cores`` cores, greedy longest-first (each task to the core
    that frees first): the compile pool's schedule of a static phase."""
    if type(cores) is not int or cores < 1:
        raise ValueError(f"cores={cores!r} is invalid; expected a positive int")
    loads = [0.0] * min(cores, max(1, len(seconds)))
    for s in sorted((float(s) for s in seconds), reverse=True):
        least = heapq.heappop(loads)
        heapq.heappush(loads, least + s)
    return max(loads)


class ThreadExecutor:
    """Real execution: ``compile_slots`` compile threads run ``item.static()``; one timing thread per
    runner, started once and kept for the whole run, runs ``job.run(runner)``.

    Threads are daemons: after Ctrl-C the scheduler waits for nothing; the caller closes the runners
    (which ends their in-flight worker processes)."""

    def start(self, runners: list, compile_slots: int) -> None:
        self._t0 = time.perf_counter()
        self._events: "queue.Queue" = queue.Queue()
        self._statics: "queue.Queue" = queue.Queue()
        self._inboxes = [queue.Queue() for _ in runners]
        self._threads = [threading.Thread(target=self._compile_loop, daemon=True, name=f"rocmflash-compile-{i}")
                         for i in range(compile_slots)]
        self._threads += [threading.Thread(target=self._timing_loop, args=(i, runner, inbox), daemon=True,
                                           name=f"rocmflash-timing-{i}")
                          for i, (runner, inbox) in enumerate(zip(runners, self._inboxes))]
        for t in self._threads:
            t.start()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def _compile_loop(self) -> None:
        while True:
            task = self._statics.get()
            if task is None:
                return
            item, stream = task
            start, error = self.now(), None
            try:
                if stream:  # its configs are timed as they become ready, beside the rest of its compile
                    item.static_stream(lambda item=item: self._events.put(StaticProgress(item)))
                else:
                    item.static()
            except BaseException as err:  # reported to the scheduler thread, which decides
                error = err
            self._events.put(StaticDone(item, error, start, self.now()))

    def _timing_loop(self, index: int, runner, inbox: "queue.Queue") -> None:
        while True:
            job = inbox.get()
            if job is None:
                return
            if job is _START:
                _start_worker(runner)
                continue
            start, result, error = self.now(), None, None
            try:
                result = job.run(runner)
            except BaseException as err:  # WorkerLost, a runner bug, an interrupt: the scheduler's call
                error = err
            self._events.put(JobDone(index, job, result, error, start, self.now()))

    def start_workers(self) -> None:
        """Each timing thread starts its runner's worker process (non-blocking: the process starts on its own)."""
        for inbox in self._inboxes:
            inbox.put(_START)

    def submit_static(self, item, stream: bool = False) -> None:
        self._statics.put((item, stream))

    def submit_job(self, worker: int, job) -> None:
        self._inboxes[worker].put(job)

    def next_event(self):
        while True:  # a short timeout keeps the scheduler thread responsive to Ctrl-C
            try:
                return self._events.get(timeout=0.2)
            except queue.Empty:
                continue

    def poll_event(self, timeout: float):
        """The next event within ``timeout`` seconds, or None (a stopped pipeline settling, :class:`Pipeline
        <rocmflash.tuning.pipeline.Pipeline>`)."""
        try:
            return self._events.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def shutdown(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        for t in self._threads:
            if t.name.startswith("rocmflash-compile"):
                self._statics.put(None)


def _start_worker(runner) -> None:
    """``runner.start_worker()`` where a runner has one; a failure shows again at the runner's first job."""
    start = getattr(runner, "start_worker", None)
    if callable(start):
        try:
            start()
        except Exception:  # noqa: BLE001 - an optimisation: the first job meets any real error again
            pass


def fifo_finish_times(seconds: list, cores: int) -> list:
    """When each of ``seconds`` (tasks in submission order) ends on ``cores`` cores taking them first come, first
    served: a cross-compile pool's schedule as results arrive."""
    loads = [0.0] * max(1, min(cores, len(seconds)))
    out = []
    for s in seconds:
        start = heapq.heappop(loads)
        out.append(start + float(s))
        heapq.heappush(loads, start + float(s))
    return out


def fifo_release_times(item, cores: int) -> list:
    """Default release times of a streaming item's ready configs: config k of its ready list is timeable when
    the first ``item.stream_prefixes()[k]`` configs of its compile order (``item.compile_order_seconds()``)
    have compiled, on ``cores`` cores first come, first served."""
    done = fifo_finish_times(list(item.compile_order_seconds() or []), cores)
    prefix_done, t = [0.0], 0.0
    for d in done:
        t = max(t, d)
        prefix_done.append(t)
    return [prefix_done[min(p, len(prefix_done) - 1)] for p in item.stream_prefixes()]


def _release_steps(times: list) -> list:
    """``[(upto, at), ...]``: the ready configs ``[:upto]`` are timeable from ``at`` (nondecreasing times)."""
    steps, t = [], 0.0
    for k, at in enumerate(times):
        t = max(t, at)
        if steps and steps[-1][1] == t:
            steps[-1] = (k + 1, t)
        else:
            steps.append((k + 1, t))
    return steps


def result_wall_s(job, result: dict) -> float:
    """The default duration of a simulated job: the result's ``wall_s`` (what a replayed journal recorded)."""
    return float(result.get("wall_s") or 0.0)


class SimulatedExecutor:
    """The scheduler on a simulated clock: a job's duration is ``duration(job, result)`` (default: the
    result's ``wall_s``), a static phase lasts ``static_duration(item, cores)`` (default: the makespan of
    ``item.compile_seconds()``) on ``cores = cpu_cores / compile_slots``, and the clock jumps from event
    to event.

    A timing worker's process takes ``worker_start_s`` to start: from the run's start when the scheduler
    starts every worker at once (``start_workers()``), or the workers in ``prestarted`` (the old code's
    first pre-warm started worker 0), else inside its first job (as a real first measurement includes it).

    A streaming static phase (``stream``) makes its ready configs timeable at ``release_times(item, cores)``
    (seconds after its start, one per ready config; default :func:`fifo_release_times`), each capped at the
    phase's own duration.

    ``item.static()`` and ``job.run(runner)`` really run (inline, when submitted), so the items decide
    what to time from real results; only the clock is simulated."""

    def __init__(self, duration: Optional[Callable] = None, cpu_cores: int = 32, worker_start_s: float = 0.0,
                 static_duration: Optional[Callable] = None, prestarted: tuple = (),
                 release_times: Optional[Callable] = None):
        if type(cpu_cores) is not int or cpu_cores < 1:
            raise ValueError(f"cpu_cores={cpu_cores!r} is invalid; expected a positive int")
        if not (isinstance(worker_start_s, (int, float)) and worker_start_s >= 0):
            raise ValueError(f"worker_start_s={worker_start_s!r} is invalid; expected seconds >= 0")
        self.duration = duration or result_wall_s
        self.cpu_cores = cpu_cores
        self.worker_start_s = float(worker_start_s)
        self.static_duration = static_duration or (lambda item, cores: makespan(list(item.compile_seconds() or []),
                                                                                cores))
        self.prestarted = tuple(prestarted)
        self.release_times = release_times or fifo_release_times

    def start(self, runners: list, compile_slots: int) -> None:
        self._now = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self._runners = list(runners)
        self._cores = max(1, self.cpu_cores // compile_slots)
        self._ready_at: list = [None] * len(self._runners)  # when each worker's process is up (None: not started)
        for i in self.prestarted:
            if 0 <= i < len(self._runners):
                self._ready_at[i] = self.worker_start_s

    def start_workers(self) -> None:
        for i, ready in enumerate(self._ready_at):
            if ready is None:
                self._ready_at[i] = self._now + self.worker_start_s

    def now(self) -> float:
        return self._now

    def _push(self, at: float, event) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), event))

    def submit_static(self, item, stream: bool = False) -> None:
        error, seconds, ready = None, 0.0, []
        try:
            if stream:  # runs whole (inline); its configs become ready at the times release_times says
                item.static_stream(lambda: None)
            else:
                item.static()
            seconds = float(self.static_duration(item, self._cores))
            if stream:
                ready = [min(float(t), seconds) for t in self.release_times(item, self._cores)]
        except BaseException as err:
            error = err
        for upto, at in _release_steps(ready):  # before its StaticDone at the same time (heap order)
            self._push(self._now + at, StaticProgress(item, upto))
        self._push(self._now + seconds, StaticDone(item, error, self._now, self._now + seconds))

    def submit_job(self, worker: int, job) -> None:
        result, error, seconds = None, None, 0.0
        try:
            result = job.run(self._runners[worker])
        except BaseException as err:  # the scheduler's call, as on a timing thread
            error = err
        if isinstance(result, dict):  # a bad duration function is a bug of the caller: raised here
            seconds = float(self.duration(job, result))
            if not seconds >= 0:
                raise ValueError(f"duration of job {job.label!r} is {seconds!r}; expected seconds >= 0")
        begin = self._now
        if self._ready_at[worker] is None:  # started by its first job: the job lasts the start-up longer
            self._ready_at[worker] = self._now
            seconds += self.worker_start_s
        else:  # started earlier: the job waits for the process (idle, not busy)
            begin = max(self._now, self._ready_at[worker])
        self._push(begin + seconds, JobDone(worker, job, result, error, begin, begin + seconds))

    def next_event(self):
        if not self._heap:
            raise RuntimeError("simulated pipeline: nothing in flight (scheduler bug)")
        at, _, event = heapq.heappop(self._heap)
        self._now = at
        return event

    def shutdown(self) -> None:
        self._heap = []


__all__ = ["ThreadExecutor", "SimulatedExecutor", "StaticDone", "StaticProgress", "JobDone", "makespan",
           "fifo_finish_times", "fifo_release_times", "result_wall_s"]
