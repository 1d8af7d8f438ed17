"""The ``race`` tuning strategy: successive halving over every static survivor.

The static score (compiler truth: registers, occupancy, LDS) is good at *pruning* --
spills, LDS overflow and occupancy cliffs are facts -- but a ranking fitted on one GPU's
timings cannot be trusted to decide alone, on another GPU or shape, which survivors are
never timed. The race therefore times *every* survivor, cheaply first:

1. round 1: every survivor, a short measurement (:data:`DEFAULT_ROUNDS`: ~10 ms of
   repetitions, no correctness gate -- the gate runs before a config can win);
2. the fastest fraction (``keep``) advances, plus every config within ``margin_pct`` of
   the round's best (a short measurement's noise must not eliminate a near-tie), and at
   least ``min_keep``;
3. the next round measures the advancing configs longer, with the gate; the last round
   uses the full live settings (the figure stored in the database), in
   :data:`FINAL_PASSES` alternating passes over its field: a config's figure is its
   median pass. One full measurement per finalist let a drift of a few percent between
   two configs measured a second apart decide the winner
   (``docs/evidence/race-heldout-2026-11-23-h100.md``, run E).

Its guarantee: a config is eliminated only by being slower than ``keep`` of its round's
field *and* more than ``margin_pct`` slower than the round's best, as measured. The
static score only orders the work (and ties).

Pure functions here; :mod:`rocmflash.tuning.strategies` runs the rounds (journal, resume,
progress) with them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional


@dataclasses.dataclass(frozen=True)
class RaceRound:
    """How one round measures: timing budget, warm-up, minimum repetitions, gate, and the
    fraction of its field that advances (unused in the last round)."""

    rep_ms: float
    warmup_ms: float
    min_reps: int
    gate: bool
    keep: float

    def budget(self) -> dict:
        """What a runner's ``measure(..., budget=)`` takes."""
        return {"rep_ms": self.rep_ms, "warmup_ms": self.warmup_ms, "min_reps": self.min_reps, "gate": self.gate}


#: short screen of everything, a gated middle round, then the full measurement
DEFAULT_ROUNDS = (RaceRound(rep_ms=10.0, warmup_ms=5.0, min_reps=3, gate=False, keep=0.25),
                  RaceRound(rep_ms=30.0, warmup_ms=10.0, min_reps=5, gate=True, keep=1 / 3),
                  RaceRound(rep_ms=100.0, warmup_ms=25.0, min_reps=10, gate=True, keep=0.0))
MARGIN_PCT = 3.0
MIN_KEEP = 3
#: passes of the last round over its field (journal rounds ``last .. last + FINAL_PASSES - 1``)
FINAL_PASSES = 3


def advancing(results: list, keep: float, margin_pct: float = MARGIN_PCT, min_keep: int = MIN_KEEP) -> list:
    """Keys that go on to the next round, fastest first.

    ``results`` is ``[(key, median_ms or None), ...]`` in static order (None: the config
    failed, crashed, timed out or was incorrect -- it never advances). The fastest
    ``ceil(keep * n_ok)`` (at least ``min_keep``) advance, and every config within
    ``margin_pct`` of the fastest; equal times keep static order.
    """
    ok = sorted((ms, i, key) for i, (key, ms) in enumerate(results) if ms is not None and ms > 0)
    if not ok:
        return []
    count = max(min_keep, math.ceil(keep * len(ok)))
    limit = ok[0][0] * (1 + margin_pct / 100.0)
    return [key for rank, (ms, _, key) in enumerate(ok) if rank < count or ms <= limit]


def planned_measurements(n: int, rounds=DEFAULT_ROUNDS, min_keep: int = MIN_KEEP) -> list:
    """Field size per round when nothing ties or fails (for progress display and plans)."""
    sizes = []
    for r in rounds:
        sizes.append(n)
        n = min(n, max(min_keep, math.ceil(r.keep * n)))
    return sizes


def final_round_records(records_by_round: dict) -> tuple[Optional[int], list]:
    """``(round, records)`` of the last round that produced a timing: where the winner is read from."""
    for rnd in sorted(records_by_round, reverse=True):
        recs = list(records_by_round[rnd].values())
        if any(r.get("status") == "ok" for r in recs):
            return rnd, recs
    return None, []


def merge_final_passes(passes: list) -> dict:
    """``{config json: record}`` of the last round from its passes (each ``{config json: record}``).

    Per config of the first pass: the pass with the median time (of two: the slower), every
    pass's time in ``passes_ms``; a config that is not ``ok`` in some pass keeps that record
    (it cannot win).
    """
    passes = [p for p in passes if p]
    merged = {}
    for key in (passes[0] if passes else {}):
        recs = [p[key] for p in passes if key in p]
        bad = [r for r in recs if r.get("status") != "ok"]
        if bad:
            merged[key] = bad[0]
            continue
        recs.sort(key=lambda r: r["median_ms"])
        merged[key] = dict(recs[len(recs) // 2], passes_ms=[round(r["median_ms"], 5) for r in recs])
    return merged


__all__ = ["RaceRound", "DEFAULT_ROUNDS", "MARGIN_PCT", "MIN_KEEP", "FINAL_PASSES", "advancing",
           "planned_measurements", "final_round_records", "merge_final_passes"]
