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
#: 2026-11-26 (llama-3-8b bf16, docs/evidence/scale-gpus-2026-11-26-h200x2.md) timed a race of 100 configs in 5-9 s
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
        self._ready = None  #: streamed static phase: a ReadyQueue of (index, candidate) ready to time in round 1
        self._early: set = set()  #: config keys of round 1 handed out while the static phase ran
        self._early_jobs: set = set()  #: ids of those jobs not recorded yet
        self._handed = 0  #: jobs created (inject positions follow it)
        self._by_key = None  #: {config key: final candidate} once the static phase ended

    # ------------------------------------------------------------------ static
    def static(self) -> None:
        """Compile and prune (shared per static problem), choose what is timed, pre-warm it."""
        self._static(None)

    def static_stream(self, notify) -> None:
        """:meth:`static`, but (a race this item compiles) each certain survivor is pre-warmed and made ready for
        round 1 as its compile results arrive (:mod:`rocmflash.tuning.stream`); ``notify()`` after each batch."""
        self._static(notify)

    def _static(self, notify) -> None:
        self._start = time.perf_counter()
        sp = static_problem(self.shape)
        hooks = self._open_stream(notify) if notify is not None else {}
        try:
            self.static_result = self.ctx.statics.get(
                self.static_group, lambda: self.ctx.out.static(self.ctx.gpu, sp, self.space, self.spec, **hooks))
        finally:
            if self._ready is not None:
                self._ready.close()
        self.outcome.static_seconds = time.perf_counter() - self._start
        if not self.ctx.measuring:
            return
        if self.spec.strategy == "race":
            cands, done = race_field(self.static_result), self._results(0)
        else:
            self.chosen = choose(self.spec.strategy, self.static_result, self.spec.top_k)
            cands, done = self.chosen, self._results(None)
        warmed = self._check_streamed(cands)
        todo = [c for c in cands if c.config.to_json() not in done and c.config.to_json() not in warmed]
        if self.spec.prewarm and todo:
            with self.ctx.out.spinner(f"{self.key}: compiling {len(todo)} config(s) in parallel"):
                self.ctx.prewarm([c.config for c in todo], self.shape)

    def _open_stream(self, notify) -> dict:
        """The hooks of a streamed static phase (a measured race): survivors, as certain, go pre-warmed into
        :attr:`_ready` (those the journal already holds for round 1 are not timed again)."""
        from rocmflash.tuning.static import Candidate
        from rocmflash.tuning.stream import ReadyQueue, SurvivorStream

        if not (self.ctx.measuring and self.spec.strategy == "race"):
            return {}
        done = self._results(0)
        prewarm = None
        if self.spec.prewarm and self.ctx.can_prewarm():
            def prewarm(entries):
                self.ctx.prewarm([c.config for _, c in entries], self.shape)
        self._ready = ReadyQueue(prewarm, notify)
        state: dict = {}

        def on_release(released):
            configs, seed_of = state["configs"], state["seed_of"]
            cands = [(i, Candidate(configs[i], obs, True, v.reason, v.detail, seed=seed_of.get(i)))
                     for i, obs, v in released]
            self._ready.put([(i, c) for i, c in cands if c.config.to_json() not in done])

        def on_configs(configs, seed_of):
            state.update(configs=configs, seed_of=seed_of,
                         stream=SurvivorStream(configs, self.spec.prune_settings, on_release))

        return {"on_configs": on_configs, "on_result": lambda obs: state["stream"].add(obs)}

    def _check_streamed(self, cands: list) -> set:
        """Config keys pre-warmed while streaming; each handed out early must be in the final field (else a bug
        of the stream's rule: its timing would be of a config the static phase pruned)."""
        if self._ready is None:
            return set()
        field = {c.config.to_json() for c in cands}
        wrong = sorted(self._early - field)
        if wrong:
            raise RuntimeError(f"{self.key}: streamed config(s) not in the static phase's field: {wrong[:3]}")
        return {c.config.to_json() for _, c in self._ready.ready}

    def early_jobs(self, upto=None) -> list:
        """Round-1 jobs of the survivors ready while the static phase runs (pipeline scheduler thread)."""
        if self._ready is None:
            return []
        budget = RACE_ROUNDS[0].budget() if len(RACE_ROUNDS) > 1 else None
        jobs = [self._job(c, 0, budget) for _, c in self._ready.take(upto)]
        self._early.update(j.sim_key[1] for j in jobs)
        self._early_jobs.update(id(j) for j in jobs)
        return jobs

    def stream_prefixes(self) -> list:
        """Per ready config (ready order): how many configs of the compile order it waited for (simulated clock)."""
        return [i + 1 for i, _ in self._ready.ready] if self._ready is not None else []

    def compile_order_seconds(self) -> list:
        """Compile seconds per config in compile order (0: unknown), for the simulated clock's release times."""
        cands = self.static_result.candidates if self.static_result is not None else []
        return [c.observation.get("compile_seconds") or 0.0 for c in cands]

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
            if jobs or (rnd == 0 and self._early_jobs):  # round 1's streamed jobs in flight: it is not closed
                return jobs
        self._timed = True
        job = self._incumbent_job()
        return [job] if job is not None else None

    def _batch(self, cands: list, rnd: Optional[int], budget: Optional[dict], label: str) -> list:
        done = self._results(rnd)
        early = self._early if rnd == 0 else set()  # timed (or in flight) while the static phase ran
        todo = [c for c in cands if c.config.to_json() not in done and c.config.to_json() not in early]
        skipped = sum(1 for c in cands if c.config.to_json() in done and c.config.to_json() not in early)
        self.outcome.skipped += skipped
        if skipped:
            self.ctx.out.note(f"{label}: {skipped} of {len(cands)} config(s) already in the journal, skipped")
        self._best = max((done[c.config.to_json()]["tflops"] for c in cands
                          if done.get(c.config.to_json(), {}).get("status") == "ok"), default=None)
        if not todo:
            return []
        in_flight = len(self._early_jobs) if rnd == 0 else 0
        self._bar = self.ctx.out.bar(label, len(cands), len(cands) - len(todo) - in_flight, self._best)
        self._bar.__enter__()
        self._pending = len(todo) + in_flight
        return [self._job(cand, rnd, budget) for cand in todo]

    def _job(self, cand, rnd: Optional[int], budget: Optional[dict]):
        """One measurement's job; injection positions follow submission order."""
        from rocmflash.tuning.pipeline import Job

        mode = next((m for m, p in self.inject.items() if p == self._handed), None)
        if mode:
            self.inject.pop(mode)
        self._handed += 1
        kwargs = {"budget": budget} if budget else {}  # runners without a budget argument still work
        return Job(self, _measure_fn(cand.config, self.shape, mode, kwargs), _label(cand.config),
                   (self.key, cand.config.to_json(), rnd), payload=(cand, mode, rnd, budget))

    def _incumbent_job(self):
        """The platform's SDPA backends timed beside the winner, on a timing worker (None where that does
        not apply: no winner, SDPA computes another function, or the workers run no tasks)."""
        from rocmflash.api import incumbent
        from rocmflash.tuning.incumbent_worker import measure
        from rocmflash.tuning.incumbents import incumbent_task
        from rocmflash.tuning.pipeline import Job
        from rocmflash.tuning.pipeline_policy import SDPA_AFFINITY

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

        return Job(self, run, "incumbent", (self.key, INCUMBENT, None), payload=(INCUMBENT, entry["time_ms"]),
                   affinity=SDPA_AFFINITY)

    def record(self, job, result: dict) -> None:
        """Journal one result (the incumbent's goes to the entry only)."""
        if job.payload[0] == INCUMBENT:
            from rocmflash.tuning.incumbents import incumbent_result_field

            if result.get("status") != "skipped":
                self._incumbent = incumbent_result_field(result, job.payload[1])
            return
        cand, mode, rnd, budget = job.payload
        self._early_jobs.discard(id(job))
        cand = self._final(cand)
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
    def _final(self, cand):
        """A streamed candidate's final self (its static rank and seed id are known once the static phase ends)."""
        if self.static_result is None or cand.static_rank is not None:
            return cand
        return self._by_config().get(cand.config.to_json(), cand)

    def _by_config(self) -> dict:
        if self._by_key is None:
            self._by_key = {c.config.to_json(): c for c in self.static_result.candidates}
        return self._by_key

    def _with_static(self, results: dict) -> dict:
        """Journal records of round 1 timed while streaming (no static rank then) with their final rank and
        seed id, so the entry does not depend on which configs were timed before the static phase ended."""
        out = {}
        for k, r in results.items():
            if r.get("static_rank") is None and r.get("verdict") == "kept" and self.static_result is not None:
                c = self._by_config().get(k)
                if c is not None and c.static_rank is not None:
                    r = dict(r, static_rank=c.static_rank, seed=c.seed)
            out[k] = r
        return out

    def _entry(self, complete: bool) -> dict:
        ctx, static = self.ctx, self.static_result
        if self.chosen is None:
            last = len(RACE_ROUNDS) - 1
            by_round = [self._with_static(self._results(rnd)) for rnd in range(last + FINAL_PASSES)]
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
        ctx.store(self.key, entry, self.spec.cache_dir)
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
