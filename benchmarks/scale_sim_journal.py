"""The recorded side of :mod:`scale_sim` (benchmarks/scale_sim.py): the journals read, each simulated job's duration
(:class:`Durations`: a recording, else the stated fallbacks) and the runner that replays their results
(:class:`SimRunner`)."""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rocmflash.tuning.items_fwd import INCUMBENT  # noqa: E402 (after the path set-up)
from rocmflash.tuning.runners import ReplayRunner  # noqa: E402

FILL_RULES = ("recorded", "family_round_median", "family_median", "plan_estimate", "incumbent_estimate")
#: one incumbent job (the platform's SDPA backends beside a forward winner; not journaled): each worker's busy
#: seconds less its journaled seconds, 5.8 and 6.0 s, one incumbent each
INCUMBENT_S = 6.0
#: a recorded job more than this over its worker's own seconds held the worker's start-up
STARTUP_IN_JOB_S = 1.0

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
        self.stripped = 0  #: recordings whose worker start-up was taken out
        for r in records:
            wall = r.get("wall_s")
            if not isinstance(wall, (int, float)) or wall < 0:
                continue
            inside = r.get("worker_s")
            if isinstance(inside, (int, float)) and 0 <= inside < wall - STARTUP_IN_JOB_S:
                wall, self.stripped = inside, self.stripped + 1  # the start-up is simulated on its own
            family = _family(r)
            self.exact[(r["key"], _config_key(family, r["config"]), r.get("round"))].append(wall)
            self.by_round[(family, r.get("round"))].append(wall)
            self.by_family[family].append(wall)
        self.filled: collections.Counter = collections.Counter()
        self.factor = 1.0  #: applied to every duration (a warm run: :data:`WARM_TIMING_FACTOR`)

    def __call__(self, job, result: dict) -> float:
        seconds, rule = self.lookup(job.item.family, job.sim_key)
        self.filled[rule] += 1
        return seconds * self.factor

    def lookup(self, family: str, sim_key: tuple) -> tuple:
        """``(seconds, rule)`` of one job: its recorded duration, else the stated fallbacks in order."""
        key, config, rnd = sim_key
        if config == INCUMBENT:
            return INCUMBENT_S, "incumbent_estimate"
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

__all__ = ["FILL_RULES", "INCUMBENT_S", "STARTUP_IN_JOB_S", "read_journals", "Durations", "SimRunner"]
