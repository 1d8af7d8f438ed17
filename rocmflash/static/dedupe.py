"""Configs that compile to the same code object: one representative each, so none is timed twice.

Two configs can build byte-identical binaries: a knob the compiler ignores (``schedule_hint``
values a Triton drops, ``waves_per_eu=1`` where it is a minimum only, ``kpack=2`` on gfx950,
``waves_per_eu`` below what the workgroup size forces; see :mod:`rocmflash.config`), or two
knob values that happen to land on the same code. The sweep hashes every config's code objects
(``binary_sha256`` of its observation); configs with the same hash are one kernel.

The representative of a binary is its first config that the pruner kept (the pruner itself
rejects the later kept ones as ``duplicate_binary``, naming the kept one), else its first
compiled config. Everything here is pure: indexes in, indexes out.
"""

from __future__ import annotations

from typing import Optional, Sequence


def binary_twins(observations: Sequence[dict], verdicts: Optional[Sequence] = None) -> list[Optional[int]]:
    """For each observation, the index of the representative of its binary, or None where it is one.

    ``verdicts`` (:func:`rocmflash.static.prune.prune`'s, same order): a binary's representative is its
    first kept config when it has one. Observations without a binary (failed compiles) are never
    twins.
    """
    if verdicts is not None and len(verdicts) != len(observations):
        raise ValueError(f"binary_twins: {len(verdicts)} verdicts for {len(observations)} observations; "
                         "expected one verdict per observation")
    first: dict = {}
    kept_first: dict = {}
    for i, obs in enumerate(observations):
        sha = obs.get("binary_sha256")
        if not sha:
            continue
        first.setdefault(sha, i)
        if verdicts is not None and verdicts[i].kept:
            kept_first.setdefault(sha, i)
    out: list[Optional[int]] = []
    for i, obs in enumerate(observations):
        sha = obs.get("binary_sha256")
        rep = kept_first.get(sha, first.get(sha)) if sha else None
        out.append(None if rep is None or rep == i else rep)
    return out


def mark_candidates(candidates: list) -> None:
    """The static phase of a tune: set ``duplicate_of`` on each candidate another one represents.

    ``candidates`` are :class:`rocmflash.tuning.static.Candidate` (config, observation, kept):
    their ``duplicate_of`` becomes the index of the representative (None: it is one). A seed
    config (``seed``: an AMD-published reference id, always timed) that is a duplicate lends its
    id to a representative that has none, so the representative's timing is recorded as the seed's.
    """
    twins = binary_twins([c.observation for c in candidates], candidates)
    for cand, twin in zip(candidates, twins):
        cand.duplicate_of = twin
        if twin is not None and getattr(cand, "seed", None) and not candidates[twin].seed:
            candidates[twin].seed = cand.seed


def distinct(chosen: Sequence, candidates: Sequence) -> list:
    """``chosen`` with each candidate replaced by its binary's representative, each binary once (order kept).

    What a live phase times: a duplicate picked for its own sake (an exhaustive run, a seed
    config that compiles to a space config's binary) is timed as its representative, once.
    """
    out, seen = [], set()
    for cand in chosen:
        twin = getattr(cand, "duplicate_of", None)
        rep = candidates[twin] if twin is not None else cand
        if id(rep) not in seen:
            seen.add(id(rep))
            out.append(rep)
    return out
