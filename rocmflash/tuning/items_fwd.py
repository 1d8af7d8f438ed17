"""The forward family as a pipeline item: one problem's race (or pruned / exhaustive round).

:class:`ForwardItem` keeps the strategies' semantics (:mod:`rocmflash.tuning.strategies`):
a race's first round times every static survivor and the pruned seeds with a short budget,
each next round the configs :func:`rocmflash.tuning.race.advancing` keeps from the previous round's
journaled results, the last round in :data:`~rocmflash.tuning.race.FINAL_PASSES` passes with the full
live settings; ``pruned`` / ``exhaustive`` time their chosen configs once. Each round is one
batch of jobs; each result is journaled as it arrives, and configs the journal already holds
(for that round, in this environment) are skipped. After a complete tune, the platform's SDPA
backends are timed beside the winner (one more job, on a timing worker).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from rocmflash.tuning.race import DEFAULT_ROUNDS as RACE_ROUNDS
from rocmflash.tuning.race import FINAL_PASSES, advancing, final_round_records, merge_final_passes
from rocmflash.tuning.entries import measured_entry, shape_key, static_entry
from rocmflash.tuning.strategies import choose, journal_record, race_field
from rocmflash.tuning.spec import static_problem

#: the payload tag of the incumbent's job
INCUMBENT = "incumbent"
#: estimated timing-worker seconds of one forward item (:meth:`ForwardItem.work_s`): the 2-GPU H200 run of
#: 2026-11-26 (llama-3-8b bf16, reports/raw/scale-gpus-2026-11-26-h200x2) timed a race of 100 configs in 5-9 s
#: (round budgets are in milliseconds, so hardly with the size) and the incumbent in ~6 s
FORWARD_WORK_S = 12.0


@dataclasses.dataclass
class ProblemOutcome:
    """What a tune did for one forward problem: its entry, configs timed now / skipped (journaled) / stale."""

    key: str
    shape: object
    entry: dict
    timed_now: int = 0
    skipped: int = 0
    stale: int = 0
    seconds: float = 0.0
    static_seconds: float = 0.0


class ForwardItem:
    """One forward problem of a tune (see the module docstring)."""

    family = "fwd"

    def __init__(self, ctx, spec, shape, space, inject: Optional[dict] = None):
        self.ctx, self.spec, self.shape, self.space = ctx, spec, shape, space
        self.inject = inject if inject is not None else {}  #: shared by the items of one spec, consumed
        self.key = shape_key(shape, ctx.gpu)  # an fp8 key names the GPU's format
        #: the items of one static problem share one static phase (the pipeline runs it once at a time)
        self.static_group = ("fwd", static_problem(shape), id(space), spec.seeds, tuple(spec.variants or ()))
        stale = ctx.journal.stale(self.key, shape.to_dict(), ctx.eid) if ctx.journal is not None else 0
        self.outcome = ProblemOutcome(self.key, shape, {}, stale=stale)
        self.static_result = None
        self.chosen = None  #: pruned / exhaustive: the configs timed (race: None)
        self._steps = None
        self._bar = None
        self._pending = 0
        self._best = None
        self._timed = False  #: every round is timed (the incumbent may follow)
        self._incumbent = None
        self._start = None

    # ------------------------------------------------------------------ static
    def static(self) -> None:
        """Compile and prune (shared per static problem), choose what is timed, pre-warm it."""
        self._start = time.perf_counter()
        sp = static_problem(self.shape)
        self.static_result = self.ctx.statics.get(self.static_group,
                                                  lambda: self.ctx.out.static(self.ctx.gpu, sp, self.space, self.spec))
        self.outcome.static_seconds = time.perf_counter() - self._start
        if not self.ctx.measuring:
            return
        if self.spec.strategy == "race":
            cands, done = race_field(self.static_result), self._results(0)
        else:
            self.chosen = choose(self.spec.strategy, self.static_result, self.spec.top_k)
            cands, done = self.chosen, self._results(None)
        todo = [c for c in cands if c.config.to_json() not in done]
        if self.spec.prewarm and todo:
            with self.ctx.out.spinner(f"{self.key}: compiling {len(todo)} config(s) in parallel"):
                self.ctx.prewarm([c.config for c in todo], self.shape)

    def work_s(self) -> float:
        """Estimated timing-worker seconds (:data:`FORWARD_WORK_S`), for the order of a plan on several workers."""
        return FORWARD_WORK_S

    def compile_seconds(self) -> list:
        """Per-config compile seconds of the static phase (the compile cache's records)."""
        cands = self.static_result.candidates if self.static_result is not None else []
        return [c.observation["compile_seconds"] for c in cands if c.observation.get("compile_seconds")]

    # ------------------------------------------------------------------ timing
    def _results(self, rnd: Optional[int]) -> dict:
        return self.ctx.journal.results(self.key, self.shape.to_dict(), self.ctx.eid, rnd)

    def _step_source(self):
        """``(candidates, round, budget, label)`` per batch; a race reads the previous round's results
        from the journal to pick the next field (static order: deterministic on resume)."""
        if self.chosen is not None:
            yield self.chosen, None, None, self.key
            return
        field = race_field(self.static_result)
        last = len(RACE_ROUNDS) - 1
        for rnd, spec_round in enumerate(RACE_ROUNDS):
            if not field:
                return
            budget = None if rnd == last else spec_round.budget()  # the last round: the full live settings
            yield field, rnd, budget, f"{self.key} round {rnd + 1}/{len(RACE_ROUNDS)}"
            if rnd == last:
                if len(field) > 1:  # alternating passes: a finalist's figure is its median pass
                    for extra in range(1, FINAL_PASSES):
                        yield (field, rnd + extra, None,
                               f"{self.key} round {rnd + 1}/{len(RACE_ROUNDS)}, pass {extra + 1}/{FINAL_PASSES}")
                return
            results = self._results(rnd)
            timings = []
            for c in field:
                r = results.get(c.config.to_json()) or {}
                timings.append((c.config.to_json(), r.get("median_ms") if r.get("status") == "ok" else None))
            keep = set(advancing(timings, spec_round.keep))
            field = [c for c in field if c.config.to_json() in keep]

    def next_batch(self) -> Optional[list]:
        """The next round's configs not yet journaled (rounds with nothing left are passed over), then the
        incumbent job after a complete tune, then None."""
        if not self.ctx.measuring or self._timed:
            return None
        if self._steps is None:
            self._steps = self._step_source()
        for cands, rnd, budget, label in self._steps:
            jobs = self._batch(cands, rnd, budget, label)
            if jobs:
                return jobs
        self._timed = True
        job = self._incumbent_job()
        return [job] if job is not None else None

    def _batch(self, cands: list, rnd: Optional[int], budget: Optional[dict], label: str) -> list:
        from rocmflash.tuning.pipeline import Job

        done = self._results(rnd)
        todo = [c for c in cands if c.config.to_json() not in done]
        skipped = len(cands) - len(todo)
        self.outcome.skipped += skipped
        if skipped:
            self.ctx.out.note(f"{label}: {skipped} of {len(cands)} config(s) already in the journal, skipped")
        self._best = max((done[c.config.to_json()]["tflops"] for c in cands
                          if done.get(c.config.to_json(), {}).get("status") == "ok"), default=None)
        if not todo:
            return []
        self._bar = self.ctx.out.bar(label, len(cands), skipped, self._best)
        self._bar.__enter__()
        self._pending = len(todo)
        kwargs = {"budget": budget} if budget else {}  # runners without a budget argument still work
        jobs = []
        base = self.outcome.timed_now
        for j, cand in enumerate(todo):  # injection positions follow submission order
            mode = next((m for m, p in self.inject.items() if p == base + j), None)
            if mode:
                self.inject.pop(mode)
            jobs.append(Job(self, _measure_fn(cand.config, self.shape, mode, kwargs), _label(cand.config),
                            (self.key, cand.config.to_json(), rnd), payload=(cand, mode, rnd, budget)))
        return jobs

    def _incumbent_job(self):
        """The platform's SDPA backends timed beside the winner, on a timing worker (None where that does
        not apply: no winner, SDPA computes another function, or the workers run no tasks)."""
        from rocmflash.api import incumbent
        from rocmflash.tuning.incumbent_worker import measure
        from rocmflash.tuning.incumbents import incumbent_task
        from rocmflash.tuning.pipeline import Job

        if not (self.spec.incumbent and self.ctx.runs_tasks):
            return None
        entry = self._entry(True)
        if not entry.get("best") or not incumbent.applies(self.shape.causal, self.shape.seqlen_q, self.shape.seqlen_k):
            return None
        self.ctx.out.note(f"{self.key}: timing the platform's SDPA backends beside the winner")
        task = incumbent_task(self.shape, entry["best"], self.spec.live_settings.to_dict())
        from rocmflash.tuning.incumbents import TIMEOUT_S

        def run(runner, task=task):
            if not hasattr(runner, "call"):
                return {"status": "skipped", "error": "this timing worker runs no worker tasks"}
            return runner.call(measure, task, TIMEOUT_S)

        return Job(self, run, "incumbent", (self.key, INCUMBENT, None), payload=(INCUMBENT, entry["time_ms"]))

    def record(self, job, result: dict) -> None:
        """Journal one result (the incumbent's goes to the entry only)."""
        if job.payload[0] == INCUMBENT:
            from rocmflash.tuning.incumbents import incumbent_result_field

            if result.get("status") != "skipped":
                self._incumbent = incumbent_result_field(result, job.payload[1])
            return
        cand, mode, rnd, budget = job.payload
        record = journal_record(self.key, self.shape, self.ctx.eid, self.spec.strategy, cand, mode, rnd, budget,
                                result)
        self.ctx.journal.append(record)
        self.outcome.timed_now += 1
        if record["status"] == "ok" and (self._best is None or record["tflops"] > self._best):
            self._best = record["tflops"]
        if self._bar is not None:
            self._bar.advance(self._best, record)
        self._pending -= 1
        if self._pending <= 0:
            self._close_bar()

    def _close_bar(self) -> None:
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.__exit__(None, None, None)

    # ------------------------------------------------------------------ entry
    def _entry(self, complete: bool) -> dict:
        ctx, static = self.ctx, self.static_result
        if self.chosen is None:
            last = len(RACE_ROUNDS) - 1
            by_round = [self._results(rnd) for rnd in range(last + FINAL_PASSES)]
            rounds = by_round[:last] + [merge_final_passes(by_round[last:])]
            records = final_round_records(dict(enumerate(rounds)))[1]
            to_time = len(race_field(static))
        else:
            keys = {c.config.to_json() for c in self.chosen}
            records = [r for k, r in self._results(None).items() if k in keys]
            rounds, to_time = None, len(self.chosen)
        return measured_entry(ctx.gpu, self.shape, records, static, self.spec.strategy, to_time, complete, ctx.env,
                              rounds=rounds)

    def finish(self, complete: bool) -> None:
        """Write the entry: what the journal holds (complete when every round was timed)."""
        self._close_bar()
        ctx = self.ctx
        if self.static_result is None:  # stopped before its static phase: nothing to write
            return
        if not ctx.measuring:
            entry = static_entry(ctx.gpu, self.shape, self.static_result, ctx.why, ctx.env)
        else:
            entry = self._entry(complete or self._timed)
            if (complete or self._timed) and self._incumbent is not None:
                entry["incumbent"] = self._incumbent
        self.outcome.entry = entry
        ctx.store(self.key, entry)
        self.outcome.seconds = time.perf_counter() - (self._start or time.perf_counter())
        if not ctx.measuring:
            self.outcome.seconds = self.outcome.static_seconds
        ctx.out.problem_done(self.outcome)


def _measure_fn(cfg, shape, mode, kwargs):
    def run(runner):
        return runner.measure(cfg, shape, inject=mode, **kwargs)
    return run


def _label(cfg) -> str:
    from rocmflash.tuning.output import _label as label

    return label(cfg.to_dict())


def forward_items(ctx, spec, space) -> list:
    """One :class:`ForwardItem` per sequence length of ``spec`` (a validated TuneSpec), sharing its inject
    positions (consumed as the tune reaches them)."""
    inject = dict(spec.inject)
    return [ForwardItem(ctx, spec, spec.shape(s), space, inject) for s in spec.seqlens]


__all__ = ["ForwardItem", "ProblemOutcome", "forward_items"]
