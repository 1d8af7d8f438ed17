"""Strategies: which candidates are timed, in what rounds (``race``, ``pruned``, ``exhaustive``).

Each strategy is a function over a problem's live context (runner, journal, output); every
measurement is appended to the journal as it arrives, and a re-run resumes from it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from rocmflash.db import Journal, now_iso
from rocmflash.dedupe import distinct
from rocmflash.race import DEFAULT_ROUNDS as RACE_ROUNDS
from rocmflash.race import FINAL_PASSES, advancing
from rocmflash.roofline import Shape
from rocmflash.tuning.static import StaticResult, default_top_k

if TYPE_CHECKING:
    from rocmflash.tuning.output import _Output
    from rocmflash.tuning.run import ProblemOutcome
    from rocmflash.tuning.spec import TuneSpec

def choose(strategy: str, static: StaticResult, top_k: Optional[int]) -> list:
    """The candidates a strategy times, in timing order."""
    if strategy == "exhaustive":  # every binary once: a duplicate is timed as its representative
        return distinct(static.candidates, static.candidates)
    k = top_k or default_top_k(len(static.candidates))
    top = static.ranked[:k]
    return top + [c for c in seeded(static) if c not in top]


def seeded(static: StaticResult) -> list:
    """The seed candidates that compiled (kept or not): every strategy times them (a seed with the
    binary of another candidate as that one, :func:`rocmflash.dedupe.distinct`)."""
    return distinct([c for c in static.candidates if c.seed and c.reason != "compile_failed"], static.candidates)


def race_field(static: StaticResult) -> list:
    """What a race's first round times: every survivor in static order, then the pruned seeds."""
    return static.ranked + [c for c in seeded(static) if not c.kept]


@dataclasses.dataclass
class _LiveProblem:
    """What timing one problem needs: runner, journal, output, and where its records go."""

    runner: object
    journal: Journal
    out: "_Output"
    spec: "TuneSpec"
    key: str
    shape: Shape
    eid: str
    inject: dict  #: test mode {mode: timed position}, consumed as positions are reached
    outcome: "ProblemOutcome"
    stop: Optional[object] = None  #: a threading.Event set when the tune is interrupted (pool runs)

    def results(self, rnd: Optional[int] = None) -> dict:
        """``{config json: latest record}`` of this problem: single-round strategies (``rnd`` None)
        or one race round."""
        return self.journal.results(self.key, self.shape.to_dict(), self.eid, rnd)

    def recorded(self, cands: list, rnd: Optional[int] = None) -> list:
        keys = {c.config.to_json() for c in cands}
        return [r for k, r in self.results(rnd).items() if k in keys]


class Stopped(Exception):
    """The tune was interrupted while other problems' threads were timing (see :func:`_measure`)."""


def _results_of(ctx: _LiveProblem, todo: list, budget: Optional[dict]):
    """``(candidate, injected mode, result)`` for each todo candidate: one at a time on a single runner,
    as results arrive on a pool (several GPUs). Injection positions follow submission order."""
    base = ctx.outcome.timed_now
    jobs = []
    for j, cand in enumerate(todo):
        mode = next((m for m, p in ctx.inject.items() if p == base + j), None)
        if mode:
            ctx.inject.pop(mode)
        jobs.append((cand, mode))
    kwargs = {"budget": budget} if budget else {}
    parallelism = getattr(ctx.runner, "parallelism", None)
    if parallelism is None:
        for cand, mode in jobs:
            yield cand, mode, ctx.runner.measure(cand.config, ctx.shape, inject=mode, **kwargs)
        return
    from concurrent.futures import ThreadPoolExecutor, as_completed

    with ThreadPoolExecutor(max_workers=max(1, parallelism)) as threads:
        futures = {}
        for cand, mode in jobs:
            futures[threads.submit(_measure_unless_stopped, ctx, cand, mode, kwargs)] = (cand, mode)
        try:
            for future in as_completed(futures):
                cand, mode = futures[future]
                yield cand, mode, future.result()
        finally:
            for future in futures:
                future.cancel()


def _measure_unless_stopped(ctx: _LiveProblem, cand, mode, kwargs) -> dict:
    if ctx.stop is not None and ctx.stop.is_set():
        raise Stopped()
    return ctx.runner.measure(cand.config, ctx.shape, inject=mode, **kwargs)


def _measure(ctx: _LiveProblem, cands: list, rnd: Optional[int], budget: Optional[dict], label: str) -> None:
    """Time the candidates that have no record yet (for this round), appending each result to the journal."""
    done = ctx.results(rnd)
    todo = [c for c in cands if c.config.to_json() not in done]
    skipped = len(cands) - len(todo)
    ctx.outcome.skipped += skipped
    if skipped:
        ctx.out.note(f"{label}: {skipped} of {len(cands)} config(s) already in the journal, skipped")
    best = max((done[c.config.to_json()]["tflops"] for c in cands
                if done.get(c.config.to_json(), {}).get("status") == "ok"), default=None)
    with ctx.out.bar(label, len(cands), skipped, best) as bar:
        for cand, mode, result in _results_of(ctx, todo, budget):
            if ctx.stop is not None and ctx.stop.is_set():  # interrupted: a late result is not journaled
                raise Stopped()
            record = {"key": ctx.key, "shape": ctx.shape.to_dict(), "env": ctx.eid, "config": cand.config.to_dict(),
                      "strategy": ctx.spec.strategy, "static_rank": cand.static_rank,
                      "verdict": "kept" if cand.kept else "pruned", "reason": cand.reason,
                      "when": now_iso(), "injected": mode, "seed": cand.seed}
            if rnd is not None:
                record.update(round=rnd, budget=budget)
            for field in ("status", "median_ms", "times_ms", "tflops", "rel_err", "error", "wall_s",
                          "worker_s", "gate_s", "device_env", "worker"):
                record[field] = result.get(field)
            if result.get("interpreted"):  # CPU interpreter timings (CI): never a GPU's
                record.update(interpreted=True, timed_shape=result.get("timed_shape"))
            ctx.journal.append(record)
            ctx.outcome.timed_now += 1
            if record["status"] == "ok" and (best is None or record["tflops"] > best):
                best = record["tflops"]
            bar.advance(best, record)


def _prewarm(ctx: _LiveProblem, cands: list) -> None:
    if ctx.spec.prewarm and cands and hasattr(ctx.runner, "prewarm"):
        with ctx.out.spinner(f"{ctx.key}: compiling {len(cands)} config(s) in parallel"):
            ctx.runner.prewarm([c.config for c in cands], ctx.shape)


def _single_round(ctx: _LiveProblem, chosen: list) -> None:
    """``pruned`` / ``exhaustive``: time the chosen configs once, with the full live settings."""
    done = ctx.results()
    _prewarm(ctx, [c for c in chosen if c.config.to_json() not in done])
    _measure(ctx, chosen, None, None, ctx.key)


def _race(ctx: _LiveProblem, static: "StaticResult") -> None:
    """``race``: every static survivor, successive rounds (:mod:`rocmflash.race`); resumable per round."""
    field = race_field(static)
    done = ctx.results(0)
    _prewarm(ctx, [c for c in field if c.config.to_json() not in done])
    last = len(RACE_ROUNDS) - 1
    for rnd, spec_round in enumerate(RACE_ROUNDS):
        if not field:
            return
        budget = None if rnd == last else spec_round.budget()  # the last round: the full live settings
        _measure(ctx, field, rnd, budget, f"{ctx.key} round {rnd + 1}/{len(RACE_ROUNDS)}")
        if rnd == last:
            if len(field) > 1:  # alternating passes: a finalist's figure is its median pass
                for extra in range(1, FINAL_PASSES):
                    _measure(ctx, field, rnd + extra, None,
                             f"{ctx.key} round {rnd + 1}/{len(RACE_ROUNDS)}, pass {extra + 1}/{FINAL_PASSES}")
            return
        results = ctx.results(rnd)
        timings = []
        for c in field:
            r = results.get(c.config.to_json()) or {}
            timings.append((c.config.to_json(), r.get("median_ms") if r.get("status") == "ok" else None))
        keep = set(advancing(timings, spec_round.keep))
        field = [c for c in field if c.config.to_json() in keep]  # static order: deterministic on resume
