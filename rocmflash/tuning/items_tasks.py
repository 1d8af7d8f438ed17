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

from rocmflash.tuning.items_base import FamilyTiming, cached_compile_seconds


class TaskItem:
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
    def static(self) -> None:
        """The static phase; when measuring, what is timed, pre-warmed on the timing workers' cache."""
        self._start = time.perf_counter()
        self.static_result = self.build_static()
        if not self.ctx.measuring:
            return
        self.timing.tasks = [{"config": c, "problem": self.problem_dict} for c in self.to_time()]
        if not self.ctx.interpret:
            self.ctx.prewarm_tasks([self.warm_task(t) for t in self.timing.todo()], self.prewarm_fn, self.timeout_s)

    def compile_seconds(self) -> list:
        if self.static_result is None:
            return []
        return cached_compile_seconds(self.compile_family, [r["config"] for r in self.static_result.rows],
                                      self.compile_problem(), self.ctx.gpu, getattr(self, "cache_dir", None))

    def compile_problem(self) -> dict:
        """The problem dict the static phase compiled for (the compile cache's key)."""
        return self.problem_dict

    def next_batch(self) -> Optional[list]:
        return self.timing.batch()

    def record(self, job, result: dict) -> None:
        self.timing.record(job, result)

    def finish(self, complete: bool) -> None:
        """The entry from every journaled result of this problem (the static #1 when nothing is measured)."""
        if self.static_result is None:
            return
        self.entry = self.measured_entry(self.timing.results()) if self.ctx.measuring else self.static_entry()
        self.ctx.store(self.key, self.entry)
        self.stored()
        self.seconds = time.perf_counter() - (self._start or time.perf_counter())

    def result(self, db_path: str):
        """Today's :class:`~rocmflash.static.families.FamilyTuneResult` of this problem."""
        from rocmflash.static.families import FamilyTuneResult

        return FamilyTuneResult(self.ctx.gpu, self.problem, self.static_result, self.key, self.entry, db_path,
                                self.ctx.measuring, self.ctx.why, self.timing.results(), self.seconds)


__all__ = ["TaskItem"]
