"""What the tune pipeline (:mod:`rocmflash.tuning.pipeline`) decides besides the order of events: how many static
phases run at once and with how many compile processes, the order of a plan's items on several timing workers,
and which worker takes a job whose first run in a process costs more than the next ones.
"""

from __future__ import annotations

import os
from typing import Optional

#: cores per concurrent static phase: each runs a cross-compile pool of ``cores / slots`` processes and feeds the
#: runner's one pre-warm pool; the slots overlap what a single static phase leaves idle (a pool starting, the
#: serial pruning and ranking, the pre-warm's device launches)
CORES_PER_COMPILE_SLOT = 16
#: GiB of memory per concurrent static phase (its compile workers hold Triton and LLVM)
GIB_PER_COMPILE_SLOT = 24
MAX_COMPILE_SLOTS = 4


def _memory_gib() -> Optional[float]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (AttributeError, OSError, ValueError):  # pragma: no cover - not a POSIX system
        return None


def default_compile_slots(cpu_cores: Optional[int] = None, mem_gib: Optional[float] = None) -> int:
    """How many static phases a tune runs at once: one per :data:`CORES_PER_COMPILE_SLOT` cores and per
    :data:`GIB_PER_COMPILE_SLOT` GiB of memory, at least 1, at most :data:`MAX_COMPILE_SLOTS` (32 cores and
    256 GiB, the 2-GPU machine: 2; a 16-core machine: 1). Defaults: this machine's."""
    cores = cpu_cores if cpu_cores is not None else (os.cpu_count() or 1)
    mem = mem_gib if mem_gib is not None else _memory_gib()
    if type(cores) is not int or cores < 1:
        raise ValueError(f"cpu_cores={cpu_cores!r} is invalid; expected a positive int")
    slots = min(MAX_COMPILE_SLOTS, cores // CORES_PER_COMPILE_SLOT)
    if mem is not None:
        slots = min(slots, int(mem // GIB_PER_COMPILE_SLOT))
    return max(1, slots)


def compile_workers(slots: int, cpu_cores: Optional[int] = None) -> int:
    """Cross-compile processes per static phase when ``slots`` run at once: the cores split between them, so
    concurrent static phases do not oversubscribe the CPU."""
    cores = cpu_cores if cpu_cores is not None else (os.cpu_count() or 1)
    return max(1, cores // max(1, slots))


def largest_first(items: list) -> list:
    """``items`` ordered by estimated timing work (each item's ``work_s()``), largest first, ties in the given
    order: on several timing workers the longest work starts first and the many short jobs of the small items
    fill the end, so the workers finish together. If any item has no estimate the list comes back unchanged."""
    if not all(callable(getattr(item, "work_s", None)) for item in items):
        return list(items)
    work = [float(item.work_s()) for item in items]
    return [items[i] for i in sorted(range(len(items)), key=lambda i: (-work[i], i))]


#: what an incumbent job (the platform's SDPA backends timed beside a winner) pays the first time a process runs
#: one, on top of its own timing: cuDNN's and the other backends' first use. 2x H200, warm two-bucket plan of
#: 2026-11-27: a forward incumbent job took 3.7 s, then 1.6 s, on one worker; 5.4 and 4.8 s as the first job of
#: that kind on each of two workers (decode's: 0.1 s against 1.0 s)
SDPA_AFFINITY = "sdpa"


def leave_for_another(affinity: Optional[str], worker: int, ran_by: dict, alive) -> bool:
    """Whether free ``worker`` should leave a job of ``affinity`` to another worker and take another job: a worker
    still in the pool (``alive``) has run that kind before (``ran_by``: affinity -> workers) and ``worker`` has
    not, so only one process pays the kind's first use. The caller takes the job all the same when nothing else
    is ready: no worker idles for it."""
    if affinity is None:
        return False
    ran = ran_by.get(affinity, ())
    return worker not in ran and any(w in alive for w in ran)


__all__ = ["CORES_PER_COMPILE_SLOT", "GIB_PER_COMPILE_SLOT", "MAX_COMPILE_SLOTS", "SDPA_AFFINITY",
           "default_compile_slots", "compile_workers", "largest_first", "leave_for_another"]
