"""The scaling model of the one tune pipeline: a model's whole plan on N simulated GPUs, in seconds.

    python benchmarks/scale_sim.py --model llama-3-8b --workers 1,2,4 --json [--cpu-cores 32] [--gpu h100]
                              [--journal PATH ...] [--cache-dir DIR] [--breakdown]
                              [--scheduler new|old] [--cache cold|warm] [--compile-slots N] [--no-stream]

The REAL scheduler (:class:`rocmflash.tuning.pipeline.Pipeline`) runs the plan's real items
(:func:`rocmflash.tuning.items.items_for_plan`: static phases, race rounds, journal, entries in a
throw-away database) on a simulated clock (:class:`~rocmflash.tuning.pipeline_exec.SimulatedExecutor`):

* a timed config lasts what the recorded journals say (``wall_s`` of the same problem key, config
  and race round; default: every ``reports/raw/*/*.jsonl[.gz]``), less a timing worker's start-up
  where a recording holds one (``wall_s`` more than 1 s over the worker's own ``worker_s``: that
  start-up is modelled on its own, below). A config without a recording lasts the median recorded
  duration of its family and round; with none of those, the median of its family; with none at all,
  the plan's per-config estimate (:data:`rocmflash.tuning.plan.SECONDS_PER_CONFIG`); under
  ``--scheduler new|old --cache warm`` times :data:`WARM_TIMING_FACTOR` (a cold run times beside the
  compiles, and the recordings are a cold run's); the incumbent
  (the platform's SDPA, timed once per forward problem, not journaled) :data:`INCUMBENT_S`. The JSON
  line says how many jobs each rule filled (``filled``; ``recorded`` and ``fallback`` sum them up).
* a static phase lasts, ``--cache cold``: :data:`COMPILE_START_S` plus the makespan of its configs'
  compile seconds (the compile cache's records; the static phase runs for real, so a cold cache
  compiles first) on ``--cpu-cores / compile slots`` cores, once per static phase (problems that
  share one pay it once, as in a real tune); ``--cache warm``: nothing. Then its pre-warm: the
  configs it will time, in waves over the pre-warm pool's processes, :data:`PREWARM_BUILD_S` each
  for the first problem of a family (``--scheduler new``: of the forward's, only the ``split_kv`` configs, whose
  launch pins a split count the cross-compile lacks; the others find its build) and :data:`PREWARM_HIT_S` for
  the rest (warm: all), after the
  pool has started (:data:`PREWARM_POOL_START_S`; the new scheduler starts it with the run).
* a timing worker's process starts in :data:`WORKER_START_S` (on several simulated GPUs, a ``--gpus`` run,
  :data:`EARLY_START_S` of it, and of the pre-warm pool's start, pass before the tune begins).
* results steer the races: a recorded config returns its recorded result, any other a fixed
  pseudo-random time (from a hash of config and shape), so the rounds have their real sizes.

``--scheduler new`` is the pipeline as it is: a forward race's first round, a backward problem's configs (every
dQ config before any dK/dV config) and a decode problem's stream (its survivors are timed as their compiles
arrive and their own pre-warm ends: compile-order prefixes on the FIFO compile pool, then up to 16 pre-warms at
once; ``--no-stream``: as before streaming, each item's first job after its whole static phase), :func:`~rocmflash.tuning.pipeline.default_compile_slots`
static phases at once (never two of one static problem), every timing worker started with the run,
the jobs of the largest items first on several workers, one pre-warm pool of up to
:data:`~rocmflash.tuning.isolated.MAX_PREWARM_WORKERS` (16) processes kept for the tune and started with it.
``--scheduler old`` is the code the 2-GPU run of 2026-11-26 measured: one static phase at a time,
items in plan order, a timing worker started by its first job (but the first, which the forward's
pre-warm started), the forward's pre-warm pool kept, a fresh pool of 8 for each other problem.

The constants are calibrated on that run's all-cold journal (``archive/reports:reports/raw/scale-gpus-2026-11-26-h200x2``:
the gaps between problems are its static phases); ``--scheduler old`` then reproduces its cold
2-GPU timeline by construction, and its one-GPU and warm figures test the model.

Prints one JSON line per worker count: ``{"workers", "wall_s", "speedup", ...}`` (speedup against
the first count given, normally 1). ``--breakdown`` prints every item's static and timing seconds
(stderr) to show where the wall time goes.
"""

from __future__ import annotations

import argparse
import glob
import math
import json
import os
import sys
import tempfile
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rocmflash.tuning.isolated import MAX_PREWARM_WORKERS  # noqa: E402
from scale_sim_journal import (FILL_RULES, INCUMBENT, INCUMBENT_S, STARTUP_IN_JOB_S, Durations,  # noqa: E402,F401
                               SimRunner, read_journals)

#: the journals read by default: every recorded tune of the project
DEFAULT_JOURNALS = ("reports/raw/*/*.jsonl", "reports/raw/*/*.jsonl.gz")

# Calibration: the 2-GPU H200 run of 2026-11-26 (docs/evidence/scale-gpus-2026-11-26-h200x2.md; all-cold journal).
#: a timing worker's process start (spawn, import torch, open the device): gpu1's first job lasted 7.63 s, 1.08 s
#: of it in the worker
WORKER_START_S = 6.5
#: a pre-warm pool's start: its processes start as a timing worker's does
PREWARM_POOL_START_S = 6.5
#: with ``--gpus`` the timing workers and the pre-warm pool start before the tune process imports torch and plans
#: (rocmflash.tuning.pool.early_node_pool): a head start of that much, before the simulated tune begins. CPU proxy
#: (2-core box): 3.2-3.4 s of torch import in a 3.6-4.1 s run-up to the pipeline; to calibrate on the GPU machine
EARLY_START_S = 3.0
#: a cross-compile sweep's fixed cost (its pool starting, Triton imported in each worker): the forward's static phase
#: compiled 84 configs in 11.5 s on 32 cores, where the makespan of the recorded compile seconds is 3.5 s
COMPILE_START_S = 8.0
#: seconds per pre-warmed config of the first problem of a family (its binaries built at the launch
#: specialisation), fitted on the static phases between the records of the all-cold journal (old settings:
#: forward 25.5 s, backward 2k 32 s, decode 2k 44 s, each = COMPILE_START_S + compile makespan + pool start
#: + waves of pre-warms); later problems of the family find the binaries (:data:`PREWARM_HIT_S`, fitted on the
#: backward 8k's 10 s: a pool start and 8 waves)
PREWARM_BUILD_S = {"fwd": 2.5, "bwd": 0.66, "decode": 2.9}
PREWARM_HIT_S = 0.44
#: a warm run's timings against the cold run's (journal) recordings: the workers' busy seconds of the warm runs over
#: the cold runs', on 2 GPUs (53+53)/(59+58) = 0.906 and on one (87% of 108 s)/(72% of 144 s) = 0.904: a cold run
#: times beside the cross-compiles
WARM_TIMING_FACTOR = 0.905
#: the old code's pre-warm processes per backward/decode problem (a fresh pool each)
OLD_TASK_PREWARM_PROCS = 8
SCHEDULERS = ("new", "old")


# ---------------------------------------------------------------------- the simulation
def _charge_shared_statics_once(items: list) -> None:
    """Items sharing one static phase (the sequence lengths of a pass: one ``static_group``, or one shared static
    result) report its compile seconds each; a real tune compiles once (the others read the shared result, or
    find every observation in the compile cache), so only the first to finish it is charged."""
    charged: list = []
    groups: set = set()

    for item in items:
        own = item.compile_seconds

        def once(item=item, own=own):
            group = getattr(item, "static_group", None)
            if group is not None:
                if group in groups:
                    return []
                groups.add(group)
            shared = getattr(item, "static_result", None)
            if shared is not None:
                if any(shared is s for s in charged):
                    return []
                charged.append(shared)
            return own()

        item.compile_seconds = once


class StaticModel:
    """How long a static phase lasts on the simulated clock under ``scheduler`` "new" or "old" and ``cache``
    "cold" or "warm" (see the module docstring); ``clock()`` is the simulated time."""

    def __init__(self, scheduler: str, cache: str, cpu_cores: int, compile_slots: int, clock):
        self.old, self.warm, self.clock = scheduler == "old", cache == "warm", clock
        # new: one kept pool (rocmflash.tuning.isolated.MAX_PREWARM_WORKERS processes), shared by the static phases
        self.pool_procs = max(1, min(MAX_PREWARM_WORKERS, cpu_cores - 1) // max(1, compile_slots))
        self.fwd_pool_procs = max(1, cpu_cores - 1)  # old: the forward's own pool
        self.task_procs = max(1, min(OLD_TASK_PREWARM_PROCS, cpu_cores - 1))
        # the kept pool (old: the forward's, started by its first pre-warm; new: started with the run)
        self.pool_ready_at: Optional[float] = None if self.old else PREWARM_POOL_START_S
        self.built: set = set()  # families whose first pre-warm built their binaries
        self.released: dict = {}  # id(item) -> release times of its streamed configs (new scheduler)

    def __call__(self, item, cores: int) -> float:
        from rocmflash.tuning.pipeline_exec import fifo_finish_times, makespan

        now = t = self.clock()
        compiled = [] if self.warm else list(item.compile_seconds() or [])
        streamed = self._streamed(item)
        if compiled:
            t += COMPILE_START_S + makespan(compiled, cores)
        n = _prewarmed(item)
        if not n:
            return t - now
        if self.old and item.family != "fwd":  # a fresh pool of 8 for this problem
            ready, procs = t + PREWARM_POOL_START_S, self.task_procs
        else:  # the kept pool: started by the first pre-warm, waited for by any other before it is up
            if self.pool_ready_at is None:
                self.pool_ready_at = (now if streamed else t) + PREWARM_POOL_START_S
            ready = self.pool_ready_at
            procs = self.fwd_pool_procs if self.old else self.pool_procs
        per = PREWARM_HIT_S if self.warm or item.family in self.built else PREWARM_BUILD_S.get(item.family, 1.0)
        self.built.add(item.family)
        costs = self._fwd_costs(item, per)
        if streamed:  # survivors pre-warm in batches as their compiles arrive, beside the rest of the compile
            seconds = [0.0] * len(item.compile_order_seconds()) if self.warm or not compiled else \
                item.compile_order_seconds()
            done, prefix_done, last = fifo_finish_times(seconds, cores), [0.0], 0.0
            for d in done:
                last = max(last, d)
                prefix_done.append(last)
            start = 0.0 if self.warm or not compiled else COMPILE_START_S
            arrive = [now + start + prefix_done[min(p, len(prefix_done) - 1)] for p in streamed]
            release = _prewarm_batches(arrive, ready, procs, costs[:len(arrive)] if costs else per)
            self.released[id(item)] = [r - now for r in release]
            n -= len(streamed)
            t = max(t, release[-1])
            if not n:
                return t - now
        t = max(t, ready)
        rest = costs[len(streamed):] if costs else []
        return t + math.ceil(n / procs) * (sum(rest) / len(rest) if rest else per) - now

    def _fwd_costs(self, item, per: float) -> list:
        """Scheduler "new", a forward problem whose pre-warms build: per pre-warmed config (streamed ones first), a
        build only for ``split_kv`` (its launch pins a split count the static phase's build does not have); every
        other variant's launch finds the static phase's build in Triton's cache (checked with a stub driver: the
        JIT's cache key of the online, two-phase and split-d builds equals the cross-compile's). [] otherwise."""
        if self.old or item.family != "fwd" or per == PREWARM_HIT_S:
            return []
        ready = getattr(getattr(item, "_ready", None), "ready", None) or []
        streamed = [c.config for _, c in ready]
        seen = {c.to_json() for c in streamed}
        chosen = [getattr(c, "config", c) for c in (item.chosen or [])]  # pruned / exhaustive: candidates
        rest = [c for c in chosen if c.to_json() not in seen]
        return [per if c.variant == "split_kv" else PREWARM_HIT_S for c in streamed + rest]

    def _streamed(self, item) -> list:
        """The compile-order prefix each streamed config waited for (scheduler "new": a forward race streams its round
        1, a backward or decode item every config it times)."""
        prefixes = getattr(item, "stream_prefixes", None)
        return list(prefixes()) if callable(prefixes) and not self.old else []

    def release_times(self, item, cores: int) -> list:
        """When (seconds after its static phase began) each streamed config of ``item`` is ready to time."""
        return self.released.pop(id(item), [])


def _prewarm_batches(arrive: list, ready: float, procs: int, per) -> list:
    """When each config (arrival times, nondecreasing; ``per``: seconds of each pre-warm, one or a list) is
    pre-warmed: the stream's pre-warm threads
    (:data:`~rocmflash.tuning.stream.PREWARM_THREADS`, at most ``procs`` builds at once) each take a config as it
    arrives, from ``ready`` (the pool up); a config is ready when its own pre-warm ends."""
    import heapq

    from rocmflash.tuning.stream import PREWARM_THREADS

    free = [ready] * max(1, min(PREWARM_THREADS, procs))
    out = []
    for i, t in enumerate(arrive):
        start = max(t, heapq.heappop(free))
        end = start + (per[i] if isinstance(per, list) else per)
        out.append(end)
        heapq.heappush(free, end)
    return out


def _prewarmed(item) -> int:
    """How many configs an item's static phase pre-warmed (after ``static()``)."""
    if item.family == "fwd":
        from rocmflash.tuning.strategies import race_field

        if item.static_result is None:
            return 0
        return len(item.chosen) if item.chosen is not None else len(race_field(item.static_result))
    timing = getattr(item, "timing", None)
    return len(timing.tasks) if timing is not None else 0


def simulate_once(plan, n_workers: int, records: list, cache_dir: Optional[str] = None, cpu_cores: int = 32,
                  compile_slots: Optional[int] = None, strategy: str = "race", workers: Optional[int] = None,
                  scheduler: str = "ideal", cache: str = "cold", stream: bool = True):
    """One run of ``plan`` on ``n_workers`` simulated GPUs: ``(PipelineStats, Durations, items)``.

    ``scheduler``: "ideal" (the issue's model: static phases last their compile makespan, nothing starts up),
    or "new" / "old" with the calibrated start-ups and pre-warms (module docstring); ``cache``: "cold" or
    "warm" (then nothing compiles). ``compile_slots``: default the scheduler's (old: 1)."""
    from rocmflash.tuning.items import items_for_plan
    from rocmflash.tuning.pipeline import Pipeline, default_compile_slots, largest_first
    from rocmflash.tuning.pipeline_exec import SimulatedExecutor

    if scheduler not in ("ideal",) + SCHEDULERS or cache not in ("cold", "warm"):
        raise ValueError(f"scheduler={scheduler!r}, cache={cache!r}: expected ideal, new or old, and cold or warm")
    if compile_slots is None:
        compile_slots = 1 if scheduler == "old" else default_compile_slots(cpu_cores, mem_gib=1e6)
    durations = Durations(records)
    if scheduler != "ideal" and cache == "warm":
        durations.factor = WARM_TIMING_FACTOR
    runner = SimRunner(records)
    with tempfile.TemporaryDirectory(prefix="rocmflash-scale-sim-") as tmp:
        items = items_for_plan(plan, db_path=os.path.join(tmp, f"{plan.gpu.name}.json"), strategy=strategy,
                               cache_dir=cache_dir, workers=workers, device="simulated", runners=[runner])
        _charge_shared_statics_once(items)
        if scheduler == "ideal":
            executor = SimulatedExecutor(duration=durations, cpu_cores=cpu_cores,
                                         static_duration=_cold_or_warm(cache))
        else:
            # several GPUs are a --gpus run: its workers and pre-warm pool start before the tune (EARLY_START_S)
            head = EARLY_START_S if scheduler == "new" and n_workers > 1 else 0.0
            executor = SimulatedExecutor(duration=durations, cpu_cores=cpu_cores,
                                         worker_start_s=max(0.0, WORKER_START_S - head),
                                         prestarted=(0,) if scheduler == "old" else ())
            executor.static_duration = StaticModel(scheduler, cache, cpu_cores, compile_slots, executor.now)
            executor.static_duration.pool_ready_at = max(0.0, PREWARM_POOL_START_S - head) if head else \
                executor.static_duration.pool_ready_at
            executor.release_times = executor.static_duration.release_times
        priority = None if scheduler == "old" or n_workers == 1 else largest_first(items)
        stats = Pipeline(items, [runner] * n_workers, compile_slots=compile_slots, executor=executor,
                         labels=[f"sim{i}" for i in range(n_workers)], start_workers=scheduler != "old",
                         priority=priority, stream=stream and scheduler != "old").run()
    return stats, durations, items


def _cold_or_warm(cache: str):
    from rocmflash.tuning.pipeline_exec import makespan

    if cache == "warm":
        return lambda item, cores: 0.0
    return lambda item, cores: makespan(list(item.compile_seconds() or []), cores)


def simulate(plan, workers=(1, 2, 4), journals: Optional[list] = None, cache_dir: Optional[str] = None,
             cpu_cores: int = 32, compile_slots: Optional[int] = None, strategy: str = "race", breakdown=None,
             scheduler: str = "ideal", cache: str = "cold", stream: bool = True) -> list:
    """One dict per worker count: ``workers``, ``wall_s``, ``speedup`` (against the first count), ``jobs``,
    ``filled`` (jobs per duration rule), ``recorded`` / ``fallback`` (jobs with a recorded duration / filled by
    a fallback rule), ``static_s`` (all static phases), ``busy_s`` (per worker), ``compile_slots``,
    ``scheduler``, ``cache``. ``breakdown``: a file to print each item's figures to."""
    counts = _worker_counts(workers)
    records = read_journals(journals if journals is not None else default_journals())
    lines, base = [], None
    for n in counts:
        stats, durations, _ = simulate_once(plan, n, records, cache_dir, cpu_cores, compile_slots, strategy,
                                            scheduler=scheduler, cache=cache, stream=stream)
        base = stats.wall_s if base is None else base
        lines.append({"workers": n, "wall_s": round(stats.wall_s, 2),
                      "speedup": round(base / stats.wall_s, 3) if stats.wall_s > 0 else 1.0,
                      "jobs": sum(durations.filled.values()), "filled": {r: durations.filled[r] for r in FILL_RULES},
                      "recorded": durations.filled["recorded"],
                      "fallback": sum(durations.filled.values()) - durations.filled["recorded"],
                      "startup_stripped": durations.stripped,
                      "static_s": round(sum(s.static_s for s in stats.items), 2),
                      "busy_s": [round(w.busy_s, 2) for w in stats.workers], "cpu_cores": cpu_cores,
                      "compile_slots": _slots_used(compile_slots, scheduler, cpu_cores), "scheduler": scheduler,
                      "cache": cache, "stream": stream and scheduler != "old"})
        if breakdown is not None:
            print_breakdown(stats, n, breakdown)
    return lines


def _slots_used(compile_slots: Optional[int], scheduler: str, cpu_cores: int) -> int:
    from rocmflash.tuning.pipeline import default_compile_slots

    if compile_slots is not None:
        return compile_slots
    return 1 if scheduler == "old" else default_compile_slots(cpu_cores, mem_gib=1e6)


def print_breakdown(stats, n: int, file) -> None:
    """Every item's static and timing seconds on ``n`` workers, and the totals that bound the wall time."""
    print(f"--- {n} worker(s): wall {stats.wall_s:.1f} s", file=file)
    print(f"{'item':44s} {'static_s':>9s} {'static@':>8s} {'jobs':>5s} {'timing_s':>9s} {'done@':>8s}", file=file)
    for s in stats.items:
        print(f"{s.key:44s} {s.static_s:9.1f} {s.static_done_at_s or 0:8.1f} {s.jobs:5d} {s.timing_s:9.1f} "
              f"{s.finished_at_s or 0:8.1f}", file=file)
    static = sum(s.static_s for s in stats.items)
    timing = sum(s.timing_s for s in stats.items)
    print(f"static phases in all {static:.1f} s; timing {timing:.1f} worker-s, {timing / n:.1f} s per worker; "
          f"workers busy {', '.join(f'{w.busy_s:.1f}' for w in stats.workers)} s", file=file)


def default_journals() -> list:
    paths = []
    for pattern in DEFAULT_JOURNALS:
        paths += glob.glob(os.path.join(ROOT, pattern))
    return sorted(paths)


def _worker_counts(workers) -> list:
    if isinstance(workers, str):
        try:
            workers = [int(w) for w in workers.split(",") if w.strip()]
        except ValueError:
            raise ValueError(f"--workers {workers!r} is invalid; expected counts like 1,2,4") from None
    counts = list(workers)
    if not counts or any(type(n) is not int or n < 1 for n in counts):
        raise ValueError(f"--workers {workers!r} is invalid; expected positive counts like 1,2,4")
    return counts


def build_plan(model: str, gpu: str = "h100", dtypes: Optional[list] = None, seqlens: Optional[list] = None,
               passes: tuple = ("fwd", "bwd"), decode: bool = True):
    """The plan ``rocmflash tune --model`` would run (preset name or config.json; default all buckets, fp16+bf16)."""
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.tuning.models import load_model
    from rocmflash.tuning.plan import make_plan

    return make_plan(load_model(model), get_gpu(gpu), dtypes, seqlens, passes, decode)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a preset name or a transformers config.json")
    p.add_argument("--workers", default="1,2,4", help="simulated GPU counts, e.g. 1,2,4")
    p.add_argument("--json", action="store_true", help="one JSON line per worker count")
    p.add_argument("--cpu-cores", type=int, default=32, help="CPU cores of the compile pool (default 32)")
    p.add_argument("--compile-slots", type=int, default=None,
                   help="static phases at once (default: the scheduler's; old: 1)")
    p.add_argument("--scheduler", default="ideal", choices=("ideal",) + SCHEDULERS,
                   help="ideal: compile makespans only, nothing starts up (default); new / old: the pipeline as it "
                        "is / as measured on 2026-11-26, with the calibrated start-ups and pre-warms")
    p.add_argument("--cache", default="cold", choices=("cold", "warm"),
                   help="cold: the static phases compile (default); warm: everything is cached")
    p.add_argument("--gpu", default="h100", help="the catalog GPU tuned (default h100: the recorded journals')")
    p.add_argument("--dtype", action="append", help="fp16 / bf16 (repeat; default both)")
    p.add_argument("--seqlen", type=int, action="append", help="sequence buckets (repeat; default all)")
    p.add_argument("--pass", dest="passes", default="both", choices=("fwd", "bwd", "both", "none"))
    p.add_argument("--no-decode", action="store_true", help="leave the decode problems out")
    p.add_argument("--strategy", default="race", choices=("race", "pruned", "exhaustive"))
    p.add_argument("--journal", action="append", help="recorded journal(s) (default: reports/raw/*/*.jsonl[.gz]; the recorded ones are archived: git archive archive/reports reports/raw | tar -x)")
    p.add_argument("--cache-dir", help="the compile cache (default: rocmflash's)")
    p.add_argument("--breakdown", action="store_true", help="every item's static and timing seconds, on stderr")
    p.add_argument("--no-stream", action="store_true",
                   help="no item times its first round before its static phase ends (the pipeline before streaming)")
    args = p.parse_args(argv)
    passes = {"fwd": ("fwd",), "bwd": ("bwd",), "both": ("fwd", "bwd"), "none": ()}[args.passes]
    try:
        plan = build_plan(args.model, args.gpu, args.dtype, args.seqlen, passes, not args.no_decode)
        if args.compile_slots is not None and args.compile_slots < 1:
            raise ValueError(f"--compile-slots {args.compile_slots} is invalid; expected a positive count")
        lines = simulate(plan, _worker_counts(args.workers), args.journal, args.cache_dir, args.cpu_cores,
                         args.compile_slots, args.strategy, sys.stderr if args.breakdown else None,
                         scheduler=args.scheduler, cache=args.cache, stream=not args.no_stream)
    except ValueError as err:
        print(f"scale_sim: {err}", file=sys.stderr)
        return 2
    for line in lines:
        print(json.dumps(line) if args.json else
              f"{line['workers']} worker(s): {line['wall_s']:.1f} s, {line['speedup']:.2f}x "
              f"({line['jobs']} jobs; durations {line['filled']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
