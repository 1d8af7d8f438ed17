"""Strategies: which candidates are timed (``race``, ``pruned``, ``exhaustive``), and the journal line of a
forward measurement. :class:`rocmflash.tuning.items_fwd.ForwardItem` runs them as pipeline batches (a race
round each); every measurement is appended to the journal as it arrives, and a re-run resumes from it.
"""

from __future__ import annotations

from typing import Optional

from rocmflash.db import now_iso
from rocmflash.hw.roofline import Shape
from rocmflash.static.dedupe import distinct
from rocmflash.tuning.static import StaticResult, default_top_k


def choose(strategy: str, static: StaticResult, top_k: Optional[int]) -> list:
    """The candidates a strategy times, in timing order."""
    if strategy == "exhaustive":  # every binary once: a duplicate is timed as its representative
        return distinct(static.candidates, static.candidates)
    k = top_k or default_top_k(len(static.candidates))
    top = static.ranked[:k]
    return top + [c for c in seeded(static) if c not in top]


def seeded(static: StaticResult) -> list:
    """The seed candidates that compiled (kept or not): every strategy times them (a seed with the
    binary of another candidate as that one, :func:`rocmflash.static.dedupe.distinct`)."""
    return distinct([c for c in static.candidates if c.seed and c.reason != "compile_failed"], static.candidates)


def race_field(static: StaticResult) -> list:
    """What a race's first round times: every survivor in static order, then the pruned seeds."""
    return static.ranked + [c for c in seeded(static) if not c.kept]


def journal_record(key: str, shape: Shape, eid: str, strategy: str, cand, mode: Optional[str], rnd: Optional[int],
                   budget: Optional[dict], result: dict) -> dict:
    """The journal line of one forward measurement: the problem, the config's static verdict, the result."""
    record = {"key": key, "shape": shape.to_dict(), "env": eid, "config": cand.config.to_dict(),
              "strategy": strategy, "static_rank": cand.static_rank,
              "verdict": "kept" if cand.kept else "pruned", "reason": cand.reason,
              "when": now_iso(), "injected": mode, "seed": cand.seed}
    if rnd is not None:
        record.update(round=rnd, budget=budget)
    for field in ("status", "median_ms", "times_ms", "tflops", "rel_err", "error", "wall_s",
                  "worker_s", "gate_s", "device_env", "worker"):
        record[field] = result.get(field)
    if result.get("interpreted"):  # CPU interpreter timings (CI): never a GPU's
        record.update(interpreted=True, timed_shape=result.get("timed_shape"))
    return record
