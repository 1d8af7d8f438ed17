"""The scaling model of the one tune pipeline: a model's whole plan on N simulated GPUs, in seconds.

    python bench/scale_sim.py --model llama-3-8b --workers 1,2,4 --json [--cpu-cores 32] [--gpu h100]
                              [--journal PATH ...] [--cache-dir DIR] [--breakdown]

The REAL scheduler (:class:`rocmflash.tuning.pipeline.Pipeline`) runs the plan's real items
(:func:`rocmflash.tuning.items.items_for_plan`: static phases, race rounds, journal, entries in a
throw-away database) on a simulated clock (:class:`~rocmflash.tuning.pipeline_exec.SimulatedExecutor`):

* a timed config lasts what the recorded journals say (``wall_s`` of the same problem key, config
  and race round; default: every ``reports/raw/*/*.jsonl[.gz]``). A config without a recording
  lasts the median recorded duration of its family and round; with none of those, the median of
  its family; with none at all, the plan's per-config estimate (:data:`rocmflash.tuning.plan.
  SECONDS_PER_CONFIG`). The JSON line says how many jobs each rule filled (``filled``).
* a static phase lasts the makespan of its configs' compile seconds (the compile cache's records;
  the static phase runs for real, so a cold cache compiles first) on ``--cpu-cores`` cores, once
  per static phase: problems that share one (the sequence lengths of a forward or backward pass)
  pay it once, as in a real tune.
* results steer the races: a recorded config returns its recorded result, any other a fixed
  pseudo-random time (from a hash of config and shape), so the rounds have their real sizes.

Prints one JSON line per worker count: ``{"workers", "wall_s", "speedup", ...}`` (speedup against
the first count given, normally 1). ``--breakdown`` prints every item's static and timing seconds
(stderr) to show where the wall time goes.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import hashlib
import json
import os
import statistics
import sys
import tempfile
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rocmflash.tuning.runners import ReplayRunner  # noqa: E402 (after the path set-up)

#: the journals read by default: every recorded tune of the project
DEFAULT_JOURNALS = ("reports/raw/*/*.jsonl", "reports/raw/*/*.jsonl.gz")
FILL_RULES = ("recorded", "family_round_median", "family_median", "plan_estimate")


# ---------------------------------------------------------------------- recorded journals
def _family(record: dict) -> str:
    if record.get("family"):
        return str(record["family"])
    key = str(record.get("key", ""))
    return "bwd" if key.startswith("bwd-") else "decode" if key.startswith("decode-") else "fwd"


def _config_key(family: str, config: dict) -> str:
    """The config's JSON as the items' sim keys spell it (forward: KernelConfig's canonical JSON)."""
    if family == "fwd":
        from rocmflash.config import KernelConfig

        return KernelConfig.from_dict(config).to_json()
    return json.dumps(config, sort_keys=True)


def read_journals(paths: list) -> list:
    """Every result record (``key``, ``config``, ``shape``) of the journals at ``paths`` (.jsonl or .jsonl.gz)."""
    records = []
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                lines = f.readlines()
        except OSError as err:
            raise ValueError(f"--journal {path}: cannot read it ({err})") from None
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a torn line
            if isinstance(r, dict) and r.get("key") and isinstance(r.get("config"), dict) and "shape" in r:
                records.append(r)
    return records


class Durations:
    """How long each job of the simulated pipeline lasts (see the module docstring); counts the rules used."""

    def __init__(self, records: list):
        from rocmflash.tuning.plan import SECONDS_PER_CONFIG

        self.estimate = dict(SECONDS_PER_CONFIG)
        self.exact: dict = collections.defaultdict(list)
        self.by_round: dict = collections.defaultdict(list)
        self.by_family: dict = collections.defaultdict(list)
        for r in records:
            wall = r.get("wall_s")
            if not isinstance(wall, (int, float)) or wall < 0:
                continue
            family = _family(r)
            self.exact[(r["key"], _config_key(family, r["config"]), r.get("round"))].append(wall)
            self.by_round[(family, r.get("round"))].append(wall)
            self.by_family[family].append(wall)
        self.filled: collections.Counter = collections.Counter()

    def __call__(self, job, result: dict) -> float:
        seconds, rule = self.lookup(job.item.family, job.sim_key)
        self.filled[rule] += 1
        return seconds

    def lookup(self, family: str, sim_key: tuple) -> tuple:
        """``(seconds, rule)`` of one job: its recorded duration, else the stated fallbacks in order."""
        key, config, rnd = sim_key
        for values, rule in ((self.exact.get((key, config, rnd)), "recorded"),
                             (self.by_round.get((family, rnd)), "family_round_median"),
                             (self.by_family.get(family), "family_median")):
            if values:
                return statistics.median(values), rule
        return self.estimate.get(family, max(self.estimate.values())), "plan_estimate"


def _pseudo_ms(*parts) -> float:
    """A fixed time in [1, 2) ms for an unrecorded config (deterministic, so runs repeat exactly)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()
    return 1.0 + int(digest[:8], 16) / 2 ** 32


class SimRunner(ReplayRunner):
    """A runner for the simulated clock: recorded forward results where the journals hold them, else a
    pseudo-random ok; worker tasks (backward, decode) get a pseudo-random ok; the incumbent is skipped."""

    def __init__(self, records: list):
        results = {}
        for r in records:
            if _family(r) == "fwd" and r.get("status"):
                from rocmflash.config import KernelConfig
                from rocmflash.hw.roofline import Shape

                try:
                    shape, cfg = Shape.from_dict(r["shape"]), KernelConfig.from_dict(r["config"])
                except (TypeError, ValueError, KeyError):
                    continue
                results[self._key(shape, cfg)] = {k: r.get(k) for k in ("status", "median_ms", "times_ms", "tflops",
                                                                         "rel_err", "error")}
        self.recorded = results
        super().__init__(fn=self._measure, device="simulated")

    def _measure(self, cfg, shape, budget=None) -> dict:
        recorded = self.recorded.get(self._key(shape, cfg))
        if recorded is not None:
            return dict(recorded)
        ms = _pseudo_ms(cfg.to_json(), shape.to_dict())
        return {"status": "ok", "median_ms": ms, "times_ms": [ms] * 3, "rel_err": None, "error": None}

    def call(self, fn, task: dict, timeout_s: float) -> dict:
        if "backends" in task:  # the incumbent: its job is simulated, its figures are not made up
            return {"status": "skipped", "error": "simulated: the platform's backends are not timed"}
        config = task.get("config")
        ms = _pseudo_ms(json.dumps(config, sort_keys=True), task.get("shape") or task.get("problem"))
        return {"config": config, "status": "ok", "error": None, "times_ms": {"1": ms}}


# ---------------------------------------------------------------------- the simulation
def _charge_shared_statics_once(items: list) -> None:
    """Items sharing one static phase (the sequence lengths of a pass) report its compile seconds each; a real
    tune compiles once (the others read the shared result), so only the first to finish it is charged."""
    charged: list = []

    for item in items:
        own = item.compile_seconds

        def once(item=item, own=own):
            shared = getattr(item, "static_result", None)
            if shared is not None:
                if any(shared is s for s in charged):
                    return []
                charged.append(shared)
            return own()

        item.compile_seconds = once


def simulate_once(plan, n_workers: int, records: list, cache_dir: Optional[str] = None, cpu_cores: int = 32,
                  compile_slots: int = 1, strategy: str = "race", workers: Optional[int] = None):
    """One run of ``plan`` on ``n_workers`` simulated GPUs: ``(PipelineStats, Durations, items)``."""
    from rocmflash.tuning.items import items_for_plan
    from rocmflash.tuning.pipeline import Pipeline
    from rocmflash.tuning.pipeline_exec import SimulatedExecutor

    durations = Durations(records)
    runner = SimRunner(records)
    with tempfile.TemporaryDirectory(prefix="rocmflash-scale-sim-") as tmp:
        items = items_for_plan(plan, db_path=os.path.join(tmp, f"{plan.gpu.name}.json"), strategy=strategy,
                               cache_dir=cache_dir, workers=workers, device="simulated", runners=[runner])
        _charge_shared_statics_once(items)
        executor = SimulatedExecutor(duration=durations, cpu_cores=cpu_cores)
        stats = Pipeline(items, [runner] * n_workers, compile_slots=compile_slots, executor=executor,
                         labels=[f"sim{i}" for i in range(n_workers)]).run()
    return stats, durations, items


def simulate(plan, workers=(1, 2, 4), journals: Optional[list] = None, cache_dir: Optional[str] = None,
             cpu_cores: int = 32, compile_slots: int = 1, strategy: str = "race", breakdown=None) -> list:
    """One dict per worker count: ``workers``, ``wall_s``, ``speedup`` (against the first count), ``jobs``,
    ``filled`` (jobs per duration rule), ``static_s`` (all static phases), ``busy_s`` (per worker).
    ``breakdown``: a file to print each item's figures to."""
    counts = _worker_counts(workers)
    records = read_journals(journals if journals is not None else default_journals())
    lines, base = [], None
    for n in counts:
        stats, durations, _ = simulate_once(plan, n, records, cache_dir, cpu_cores, compile_slots, strategy)
        base = stats.wall_s if base is None else base
        lines.append({"workers": n, "wall_s": round(stats.wall_s, 2),
                      "speedup": round(base / stats.wall_s, 3) if stats.wall_s > 0 else 1.0,
                      "jobs": sum(durations.filled.values()), "filled": {r: durations.filled[r] for r in FILL_RULES},
                      "static_s": round(sum(s.static_s for s in stats.items), 2),
                      "busy_s": [round(w.busy_s, 2) for w in stats.workers], "cpu_cores": cpu_cores})
        if breakdown is not None:
            print_breakdown(stats, n, breakdown)
    return lines


def print_breakdown(stats, n: int, file) -> None:
    """Every item's static and timing seconds on ``n`` workers, and the totals that bound the wall time."""
    print(f"--- {n} worker(s): wall {stats.wall_s:.1f} s", file=file)
    print(f"{'item':44s} {'static_s':>9s} {'static@':>8s} {'jobs':>5s} {'timing_s':>9s} {'done@':>8s}", file=file)
    for s in stats.items:
        print(f"{s.key:44s} {s.static_s:9.1f} {s.static_done_at_s or 0:8.1f} {s.jobs:5d} {s.timing_s:9.1f} "
              f"{s.finished_at_s or 0:8.1f}", file=file)
    static = sum(s.static_s for s in stats.items)
    timing = sum(s.timing_s for s in stats.items)
    print(f"static phases in all {static:.1f} s (one compile slot: a serial chain); timing {timing:.1f} "
          f"worker-s, {timing / n:.1f} s per worker; workers busy "
          f"{', '.join(f'{w.busy_s:.1f}' for w in stats.workers)} s", file=file)


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
    p.add_argument("--compile-slots", type=int, default=1, help="static phases at once (default 1)")
    p.add_argument("--gpu", default="h100", help="the catalog GPU tuned (default h100: the recorded journals')")
    p.add_argument("--dtype", action="append", help="fp16 / bf16 (repeat; default both)")
    p.add_argument("--seqlen", type=int, action="append", help="sequence buckets (repeat; default all)")
    p.add_argument("--pass", dest="passes", default="both", choices=("fwd", "bwd", "both", "none"))
    p.add_argument("--no-decode", action="store_true", help="leave the decode problems out")
    p.add_argument("--strategy", default="race", choices=("race", "pruned", "exhaustive"))
    p.add_argument("--journal", action="append", help="recorded journal(s) (default: reports/raw/*/*.jsonl[.gz])")
    p.add_argument("--cache-dir", help="the compile cache (default: rocmflash's)")
    p.add_argument("--breakdown", action="store_true", help="every item's static and timing seconds, on stderr")
    args = p.parse_args(argv)
    passes = {"fwd": ("fwd",), "bwd": ("bwd",), "both": ("fwd", "bwd"), "none": ()}[args.passes]
    try:
        plan = build_plan(args.model, args.gpu, args.dtype, args.seqlen, passes, not args.no_decode)
        lines = simulate(plan, _worker_counts(args.workers), args.journal, args.cache_dir, args.cpu_cores,
                         args.compile_slots, args.strategy, sys.stderr if args.breakdown else None)
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
