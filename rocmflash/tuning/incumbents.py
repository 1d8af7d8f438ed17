"""The incumbent in a tune: time the platform's SDPA backends beside a problem's Triton winner.

:func:`time_incumbent` runs :func:`rocmflash.tuning.incumbent_worker.measure` in the tune's own timing worker (same
device, inputs, flush and repetitions as the Triton configs) and returns the entry's ``incumbent``
field. :func:`refresh` does it for every measured forward entry of a database: the stored winner is
timed again in the same worker, so both sides of the comparison come from one run on one GPU
(``rocmflash tune --refresh-incumbents``).
"""

from __future__ import annotations

from typing import Callable, Optional

from rocmflash.hw.roofline import Shape

#: seconds the worker may take for one problem's backends (gate + forward + training steps of each)
TIMEOUT_S = 600.0


def time_incumbent(runner, shape: Shape, config: dict, settings: dict, triton_ms: Optional[float]) -> Optional[dict]:
    """The ``incumbent`` field for ``shape`` (None where SDPA computes another function or the runner
    cannot run worker tasks, e.g. a replay)."""
    from rocmflash.api import incumbent
    from rocmflash.tuning.incumbent_worker import measure

    if not incumbent.applies(shape.causal, shape.seqlen_q, shape.seqlen_k) or not _runs_tasks(runner):
        return None
    result = runner.call(measure, incumbent_task(shape, config, settings), TIMEOUT_S)
    return incumbent_result_field(result, triton_ms)


def incumbent_task(shape: Shape, config: dict, settings: dict) -> dict:
    """The worker task that times the platform's backends beside ``config`` on ``shape``
    (:func:`rocmflash.tuning.incumbent_worker.measure`; a tune pipeline's incumbent job runs it on a timing worker)."""
    from rocmflash.api import incumbent

    return {"shape": shape.to_dict(), "settings": settings, "config": config, "backends": incumbent.candidates()}


def incumbent_result_field(result: dict, triton_ms: Optional[float]) -> Optional[dict]:
    """The entry's ``incumbent`` field from the worker's result (a failed run says why)."""
    from rocmflash.api import incumbent

    if result.get("status") != "ok":
        return {"backend": None, "time_ms": None, "triton_ms": triton_ms,
                "error": f"{result.get('status')}: {result.get('error')}"}
    return incumbent.incumbent_field(result, triton_ms)


def _runs_tasks(runner) -> bool:
    """Whether ``runner`` (or every runner of a pool) runs worker tasks: a live runner does, a replay does not."""
    return all(hasattr(r, "call") for r in getattr(runner, "runners", [runner]))


def refresh(db, runner, settings: dict, note: Callable[[str], None] = print, keys: Optional[set] = None) -> int:
    """Re-time every measured forward entry's winner (``keys``: only these) and its incumbents in ``runner``'s
    worker; store the ``incumbent`` fields (``db`` saved after each). Returns the number of entries refreshed."""
    from rocmflash.config import KernelConfig

    done = 0
    for key, entry in sorted(db.data.get("entries", {}).items()):
        if not _refreshable(key, entry) or (keys is not None and key not in keys):
            continue
        shape = Shape.from_dict(entry["shape"])
        mine = runner.measure(KernelConfig.from_dict(entry["best"]), shape)
        if mine.get("status") != "ok":
            note(f"{key}: the stored winner did not run now ({mine.get('status')}: {mine.get('error')}); skipped")
            continue
        field = time_incumbent(runner, shape, entry["best"], settings, round(mine["median_ms"], 5))
        if field is None:
            continue
        db.put(key, dict(entry, incumbent=field))
        db.save()
        done += 1
        note(_line(key, field))
    return done


def _refreshable(key: str, entry: dict) -> bool:
    """A measured dense forward entry with a winner (``d128-...``; not ``bwd-``, ``varlen-`` or ``decode-``)."""
    return (key[:1] == "d" and key[1:2].isdigit() and isinstance(entry, dict) and bool(entry.get("measured"))
            and bool(entry.get("best")) and "shape" in entry and entry.get("timing") != "interpreter")


def _line(key: str, field: dict) -> str:
    fwd = f"forward: {field.get('backend')} {field.get('time_ms')} ms vs rocmflash {field.get('triton_ms')} ms"
    train = field.get("train")
    if train:
        fwd += f"; forward+backward: {train['backend']} {train['time_ms']} ms vs rocmflash {train['triton_ms']} ms"
    return f"{key}: {fwd}"


__all__ = ["time_incumbent", "incumbent_task", "incumbent_result_field", "refresh", "TIMEOUT_S"]
