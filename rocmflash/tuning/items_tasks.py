"""Families whose chosen configs are each timed once as a worker task: decode, varlen forward, varlen backward.

:class:`TaskItem` is what those families share as pipeline items: the static phase (and the
pre-warm of what will be timed) on the compile pool, the chosen configs as one batch of worker
tasks (``runner.call(measure, task, timeout_s)``: a crash or a hang costs that task only), each
result journaled as it arrives (a re-run skips what the journal holds), and the entry written
when the item finishes. A family subclass says only what differs: its static phase, what is
timed, its worker functions and its entries. (:func:`rocmflash.tuning.decode_run.tune_one` runs one such
item through the pipeline: the entry points ``tune --mode decode`` and ``--mode varlen``.)
"""

from __future__ import annotations

import time
from typing import Optional

from rocmflash.tuning.items_base import FamilyTiming, StreamedTiming, cached_compile_seconds


class TaskItem(StreamedTiming):
    """One problem of a worker-task family (see the module docstring); subclasses fill in the hooks."""

    family = ""
    compile_family = ""  #: the compile cache's family name (:mod:`rocmflash.static.families`)
    strategy = "all-survivors"

    def __init__(self, ctx, key: str, problem, timeout_s: float = 120.0, on_result=None):
        self.ctx, self.key, self.problem, self.timeout_s = ctx, key, problem, timeout_s
        self.problem_dict = problem.to_dict()
        measure, self.prewarm_fn = self.worker_functions()
        self.timing = FamilyTiming(self, self.family, measure, timeout_s, self.strategy, on_result)
        self.static_result = None
        self._incumbent_asked = False
        self.entry: dict = {}
        self.seconds = 0.0
        self._start = None

    # ------------------------------------------------------------------ hooks
    def worker_functions(self) -> tuple:
        """``(measure, prewarm)``: module-level functions a timing worker runs on a task."""
        raise NotImplementedError

    def build_static(self):
        raise NotImplementedError

    def to_time(self) -> list:
        """The configs timed (after the static phase, when measuring)."""
        raise NotImplementedError

    def warm_task(self, task: dict) -> dict:
        return task

    def measured_entry(self, results: list) -> dict:
        raise NotImplementedError

    def static_entry(self) -> dict:
        raise NotImplementedError

    def stored(self) -> None:
        """After the entry is written: forget this process's run-time lookups of the family."""
        from rocmflash.api import selection

        selection.clear_cache()

    # ------------------------------------------------------------------ the item
    def stream_rules(self) -> Optional[dict]:
        """A family whose static phase streams (``build_static`` takes ``on_configs`` / ``on_result``): the
        :class:`~rocmflash.tuning.stream.SurvivorStream` arguments (``settings``, ...) that release exactly what
        :meth:`to_time` will name; None: it does not stream."""
        return None

    def static(self) -> None:
        """The static phase; when measuring, what is timed, pre-warmed on the timing workers' cache."""
        self._static(None)

    def static_stream(self, notify) -> None:
        """:meth:`static`, but (a family with :meth:`stream_rules`) each certain survivor is pre-warmed and made
        ready to time as its compile results arrive (:mod:`rocmflash.tuning.stream`); ``notify()`` after each
        batch."""
        self._static(notify)

    def _static(self, notify) -> None:
        from rocmflash.tuning.items_base import config_json

        self._start = time.perf_counter()
        hooks = self._open_stream(notify) if notify is not None else {}
        try:
            self.static_result = self.build_static(**hooks)
        finally:
            self.timing.close_stream()
        if not self.ctx.measuring:
            return
        self.timing.tasks = [{"config": c, "problem": self.problem_dict} for c in self.to_time()]
        warmed = self.timing.check_streamed()
        if not self.ctx.interpret:
            self.ctx.prewarm_tasks([self.warm_task(t) for t in self.timing.todo()
                                    if config_json(t["config"]) not in warmed], self.prewarm_fn, self.timeout_s)

    def _open_stream(self, notify) -> dict:
        rules = self.stream_rules()
        if rules is None or not self.ctx.measuring:
            return {}
        ctx = self.ctx
        prewarm = None if not ctx.can_prewarm("prewarm_tasks") else (
            lambda tasks: ctx.prewarm_tasks([self.warm_task(t) for t in tasks], self.prewarm_fn, self.timeout_s))
        rules = dict(rules)
        return self.timing.open_stream(notify, rules.pop("settings", None),
                                       lambda c: {"config": c, "problem": self.problem_dict}, prewarm, **rules)

    def compile_seconds(self) -> list:
        if self.static_result is None:
            return []
        return cached_compile_seconds(self.compile_family, [r["config"] for r in self.static_result.rows],
                                      self.compile_problem(), self.ctx.gpu, getattr(self, "cache_dir", None))

    def compile_problem(self) -> dict:
        """The problem dict the static phase compiled for (the compile cache's key)."""
        return self.problem_dict

    def next_batch(self) -> Optional[list]:
        """The chosen configs' tasks; once they are all timed, the :meth:`incumbent_job` (where there is one); then
        None."""
        jobs = self.timing.batch()
        if jobs is not None or self._incumbent_asked:
            return jobs
        self._incumbent_asked = True
        job = self.incumbent_job()
        return [job] if job is not None else None

    def incumbent_job(self):
        """A family that times the platform's attention beside its winner: that one job (on a timing worker), asked
        once every config is timed (:meth:`worker_task_job`); None (the default): nothing more."""
        return None

    def worker_task_job(self, measure, task: dict, timeout_s: float, payload):
        """The incumbent's job: ``runner.call(measure, task, timeout_s)`` on a timing worker (a worker that runs
        no tasks answers ``"skipped"``), labelled ``incumbent`` and kept on the worker that ran SDPA before
        (``SDPA_AFFINITY``); ``payload`` is what :meth:`record` knows it by."""
        from rocmflash.tuning.pipeline import Job
        from rocmflash.tuning.pipeline_policy import SDPA_AFFINITY

        def run(runner):
            if not hasattr(runner, "call"):
                return {"status": "skipped", "error": "this timing worker runs no worker tasks"}
            return runner.call(measure, task, timeout_s)

        return Job(self, run, "incumbent", (self.key, "incumbent", None), payload=payload, affinity=SDPA_AFFINITY)

    def record(self, job, result: dict) -> None:
        self.timing.record(job, result)

    def finish(self, complete: bool) -> None:
        """The entry from every journaled result of this problem (the static #1 when nothing is measured);
        ``"complete"`` says whether every chosen config was timed (false after Ctrl-C or a stop: ``--resume``
        times the rest)."""
        if self.static_result is None:
            return
        if self.ctx.measuring:
            self.entry = dict(self.measured_entry(self.timing.results()), complete=complete or not self.timing.todo())
        else:
            self.entry = self.static_entry()
        self.ctx.store(self.key, self.entry, getattr(self, "cache_dir", None))
        self.stored()
        self.seconds = time.perf_counter() - (self._start or time.perf_counter())

    def result(self, db_path: str):
        """Today's :class:`~rocmflash.static.families.FamilyTuneResult` of this problem."""
        from rocmflash.static.families import FamilyTuneResult

        return FamilyTuneResult(self.ctx.gpu, self.problem, self.static_result, self.key, self.entry, db_path,
                                self.ctx.measuring, self.ctx.why, self.timing.results(), self.seconds)


__all__ = ["TaskItem"]
