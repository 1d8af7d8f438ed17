"""Which side serves a dense call: the entry's kernel times, scaled to the call, against the eager host floors.

A tuned entry's incumbent (:mod:`rocmflash.api.incumbent`) holds *kernel* times measured at the entry's shape (e.g.
B8 H32 S2048): rocmflash's Triton kernel against the platform's SDPA, forward and forward+backward. A call of the
same bucket but far less work (B1, a few heads) may be host-bound: its eager time is what Python, the dispatcher
and the launches cost on the host, not the kernel's, and there SDPA's C++ path is cheaper (on an H100 an eager
training step of a short problem costs rocmflash 0.24-0.51 ms, SDPA 0.14-0.22 ms: ``rocmflash db refresh-incumbents
--small``). So for each call the expected eager time of each side is::

    max(host floor of the side, kernel time at the entry's shape * FLOPs(call) / FLOPs(entry shape))

back-to-back calls overlap host and GPU, so the slower of the two sets the pace. The host floors are the eager
times of the nearest short entry of the same head dim, dtype and mask (timed with ``timing`` =
:data:`rocmflash.api.incumbent.EAGER_TIMING`, GQA ratio as asked, else 4, else 1). Without floors (a database
that has no short entries) or without the entry's shape the entry's own verdict stands
(:func:`rocmflash.api.selection.entry_incumbent`). An eager-timed entry decides by its own times.
"""

from __future__ import annotations

from typing import Optional

from rocmflash.api import selection as S  # read through the module: tests (and users) may swap its functions
from rocmflash.api.incumbent import (EAGER_TIMING, database_platform, offered, platform_refusal, preferred_backend,
                                     winner)

_FIELDS: dict = {}  #: (device, problem, bucket) -> (the entry's incumbent field, its shape, the host floors field)
S.register_clear(_FIELDS.clear)


def call_incumbents(device, head_dim: int, dtype, causal: bool, gqa_ratio: int, batch: int, heads_q: int,
                    seqlen_q: int, seqlen_k: int) -> tuple:
    """``(forward backend or None, forward+backward backend or None)`` for a dense call of this shape: SDPA's
    backend where its expected eager time (see the module docstring) is lower than rocmflash's, else None."""
    field, shape, floors = _fields(device, int(head_dim), dtype, bool(causal), int(gqa_ratio), int(seqlen_k))
    return tuple(side_winner(field, shape, floors, train, batch, heads_q, seqlen_q, seqlen_k, causal)
                 for train in (False, True))


def timed_sides(device, head_dim: int, dtype, causal: bool, gqa_ratio: int, seqlen_k: int) -> tuple:
    """``(forward, forward+backward)``: whether a measured entry's timing decides that side of a dense problem
    (an entry within the incumbent rule's bucket distance, timed on this platform, with both sides' times). A side
    that none decides is timed at its first use (:mod:`rocmflash.api.first_use`)."""
    field = _fields(device, int(head_dim), dtype, bool(causal), int(gqa_ratio), int(seqlen_k))[0]
    if field is None:
        return False, False
    return has_times(field), has_times(field.get("train"))


def has_times(side) -> bool:
    """Whether one side of an incumbent field holds both times (SDPA's ``time_ms``, rocmflash's ``triton_ms``)."""
    return isinstance(side, dict) and side.get("time_ms") is not None and side.get("triton_ms") is not None


def side_winner(field, shape, floors, train: bool, batch: int, heads_q: int, seqlen_q: int, seqlen_k: int,
                causal: bool, check: bool = True) -> Optional[str]:
    """The backend that serves one side (forward, or forward+backward with ``train``) of a call, from the entry's
    incumbent ``field``, its ``shape`` and the host ``floors`` (:func:`fields_for`); None: rocmflash. Only a backend
    that may serve here (:func:`rocmflash.api.incumbent.serving_refusal`; ``check=False``: the times' verdict alone,
    for ``rocmflash explain`` to say why it does not serve)."""
    backend = _side_verdict(field, shape, floors, train, batch, heads_q, seqlen_q, seqlen_k, causal)
    return offered(backend, field) if check else backend


def _side_verdict(field, shape, floors, train: bool, batch: int, heads_q: int, seqlen_q: int, seqlen_k: int,
                  causal: bool) -> Optional[str]:
    if field is None:
        return None
    if field.get("timing") == EAGER_TIMING or shape is None or floors is None:
        return winner(field, train, check=False)
    side, floor = (field.get("train"), floors.get("train")) if train else (field, floors)
    backend = expected_winner(side, floor, work_scale(shape, batch, heads_q, seqlen_q, seqlen_k, causal))
    if backend != (side or {}).get("backend"):
        return backend
    return preferred_backend(field, backend, train, side.get("triton_ms"))


def work_scale(shape: dict, batch: int, heads_q: int, seqlen_q: int, seqlen_k: int, causal: bool) -> float:
    """The call's attention work over the entry shape's (``shape``: the entry's ``batch``, ``heads_q``, lengths)."""
    entry = _flops(shape.get("batch", 0), shape.get("heads_q", 0), shape.get("seqlen_q", 0), shape.get("seqlen_k", 0),
                   causal)
    return _flops(batch, heads_q, seqlen_q, seqlen_k, causal) / max(entry, 1.0)


def expected_ms(side: dict, floor: dict, scale: float) -> tuple:
    """``(SDPA's, rocmflash's)`` expected eager ms per call: each side's host floor or its scaled kernel time,
    whichever is longer."""
    return max(floor["time_ms"], side["time_ms"] * scale), max(floor["triton_ms"], side["triton_ms"] * scale)


def expected_winner(side: Optional[dict], floor: Optional[dict], scale: float) -> Optional[str]:
    """SDPA's backend if its :func:`expected_ms` is below rocmflash's, else None. ``side``: the entry's kernel times
    (``backend``, ``time_ms`` SDPA, ``triton_ms``); ``floor``: the eager times of a short problem (same keys);
    ``scale``: the call's work over the entry shape's. Missing floor times: the entry's own verdict."""
    if not side or side.get("time_ms") is None or side.get("triton_ms") is None or not side.get("backend"):
        return None
    if not floor or floor.get("time_ms") is None or floor.get("triton_ms") is None or not floor.get("backend"):
        return side["backend"] if side["time_ms"] < side["triton_ms"] else None
    sdpa, triton = expected_ms(side, floor, scale)
    if sdpa >= triton:
        return None
    return floor["backend"] if floor["time_ms"] > side["time_ms"] * scale else side["backend"]  # host-bound: the floor's


def _flops(batch, heads_q, seqlen_q, seqlen_k, causal: bool) -> float:
    """Attention's matmul work up to a constant (``D`` is the entry's own): causal keeps about half the scores."""
    work = float(batch) * heads_q * seqlen_q * seqlen_k
    return work * 0.5 if causal and seqlen_q == seqlen_k else work


def _fields(device, head_dim: int, dtype, causal: bool, gqa_ratio: int, seqlen_k: int) -> tuple:
    key = (getattr(device, "type", str(device)), getattr(device, "index", None), S._interpreting(), head_dim,
           str(dtype), causal, gqa_ratio, S._bucket(seqlen_k))
    hit = _FIELDS.get(key)
    if hit is None:
        hit = _FIELDS[key] = _read_fields(device, head_dim, dtype, causal, gqa_ratio, seqlen_k)
    return hit


def _read_fields(device, head_dim: int, dtype, causal: bool, gqa_ratio: int, seqlen_k: int) -> tuple:
    gpu_name, _ = S.device_identity(device)
    return fields_for(gpu_name, head_dim, dtype, causal, gqa_ratio, seqlen_k)


def fields_for(gpu_name, head_dim: int, dtype, causal: bool, gqa_ratio: int, seqlen_k: int) -> tuple:
    """``(the served entry's incumbent field, the entry's shape, the host floors)`` for a dense problem on
    ``gpu_name`` (each None where missing; all None when the entry's timing does not decide:
    :func:`rocmflash.api.selection.incumbent_timing`'s reasons before the switch)."""
    match = S._db_lookup(gpu_name, head_dim, dtype, causal, gqa_ratio, max(seqlen_k, 1), "online")
    field, why_not = S._entry_timing(gpu_name, head_dim, dtype, causal, gqa_ratio, match)
    if why_not or field is None:
        return None, None, None
    return (field, *shape_and_floors(gpu_name, head_dim, dtype, causal, gqa_ratio, match))


def shape_and_floors(gpu_name, head_dim: int, dtype, causal: bool, gqa_ratio: int, match,
                     db_path: Optional[str] = None) -> tuple:
    """``(the shape of the entry ``match`` names, the host floors)`` that scale a kernel-timed entry to a call, or
    ``(None, None)`` when either is missing (the entry's own verdict then decides)."""
    entry = S.match_entry(gpu_name, head_dim, dtype, causal, gqa_ratio, match)
    shape = entry.get("shape") if isinstance(entry.get("shape"), dict) else None
    floors = host_floors(gpu_name, head_dim, dtype, causal, gqa_ratio, db_path) if shape else None
    return (shape, floors) if floors else (None, None)


def host_floors(gpu_name, head_dim: int, dtype, causal: bool, gqa_ratio: int,
                db_path: Optional[str] = None) -> Optional[dict]:
    """The eager-timed incumbent field of the shortest short entry (:data:`EAGER_TIMING`) of this head dim, dtype
    and mask -- GQA ratio ``gqa_ratio``, else 4, else 1 -- timed on this platform
    (:func:`rocmflash.api.incumbent.platform_refusal`), in ``db_path`` or the GPU's databases, or None."""
    if gpu_name is None:
        return None
    from rocmflash import db

    for ratio in dict.fromkeys((gqa_ratio, 4, 1)):
        timed = sorted(((b, e["incumbent"]) for p, b, e in db.entries_for(gpu_name, head_dim, dtype, causal, ratio, db_path)
                        if isinstance(e, dict) and db.servable(e) and isinstance(e.get("incumbent"), dict)
                        and e["incumbent"].get("timing") == EAGER_TIMING and e["incumbent"].get("backend")
                        and platform_refusal(e["incumbent"], database_platform(p)) is None),
                       key=lambda item: item[0])
        if timed:
            return timed[0][1]
    return None


__all__ = ["call_incumbents", "timed_sides", "has_times", "side_winner", "work_scale", "expected_ms",
           "expected_winner", "fields_for", "shape_and_floors", "host_floors"]
