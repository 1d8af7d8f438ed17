"""Several timing workers at once (``--gpus``), without a GPU: replay runners stand in for the GPUs.

The static phase is real (a small space cross-compiled on this CPU); the pool's runners
serve synthetic timings. What must hold: no worker ever times two configs at once, the
problems and configs do spread over the workers, the journal and database come out as a
single-worker tune writes them, a lost worker costs at most a repeat of its in-flight
config, and a pool whose workers are all gone ends with results that say so, not a hang.
"""

import json
import threading
import time

import pytest

from rocmflash import db as D
from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
from rocmflash.tuning import ReplayRunner, TuneSpec, tune
from rocmflash.tuning.pool import NoWorkersLeft, WorkerLost, WorkerPool, node_gpu, parse_gpus

SPACE = ConfigSpace({"online": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4, 8],
                                "num_stages": [2, 3]}}, DEFAULT_RESTRICTIONS)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("pool-static-cache"))


def fake_ms(cfg, shape):
    """A deterministic synthetic GPU (distinct times: one winner per problem)."""
    return (1.0 + 0.3 * (cfg.BLOCK_M == 64) + 0.1 * (cfg.BLOCK_N == 32) - 0.02 * (cfg.num_warps == 8)
            - 0.005 * cfg.num_stages) * shape.seqlen_q / 1024


class Gauge:
    """Counts measurements in flight, overall and per runner."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.per_runner_peak = {}

    def enter(self, who):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            busy = self.per_runner_peak.setdefault(who, [0, 0])
            busy[0] += 1
            busy[1] = max(busy[1], busy[0])

    def leave(self, who):
        with self.lock:
            self.now -= 1
            self.per_runner_peak[who][0] -= 1


def runner(name, gauge=None, lose_after=None, sleep=0.01):
    calls = {"n": 0}

    def fn(cfg, shape, budget):
        calls["n"] += 1
        if lose_after is not None and calls["n"] > lose_after:
            raise WorkerLost(f"{name} left")
        if gauge:
            gauge.enter(name)
        time.sleep(sleep)
        if gauge:
            gauge.leave(name)
        ms = fake_ms(cfg, shape)
        return {"status": "ok", "median_ms": ms, "times_ms": [ms, ms]}

    r = ReplayRunner.from_function(fn, device="replay")
    r.name = name
    return r


def spec(tmp_path, cache_dir, **kw):
    base = dict(gpu="h100", head_dim=64, dtype="fp16", seqlens=[1024, 2048, 4096], space=SPACE,
                db_path=str(tmp_path / "h100.json"), cache_dir=cache_dir, workers=2, strategy="race")
    base.update(kw)
    return TuneSpec(**base)


def winners(path):
    data = D.ConfigDB.read(path)
    return {k: (e["best"], e["measured"], e["complete"]) for k, e in data["entries"].items()}


def test_pool_spreads_configs_and_problems_over_workers_one_measurement_each(tmp_path, cache_dir):
    gauge = Gauge()
    pool = WorkerPool([runner(f"gpu{i}", gauge) for i in range(3)], labels=["gpu0", "gpu1", "gpu2"])
    result = tune(spec(tmp_path / "pool", cache_dir), runner=pool, progress=False)
    assert gauge.peak == 3  # all three busy at once ...
    assert all(peak == 1 for _, peak in gauge.per_runner_peak.values())  # ... never two on one worker
    assert sum(s.done for s in pool.stats) == sum(o.timed_now for o in result.outcomes)
    assert all(s.done > 0 for s in pool.stats)
    records = D.Journal(str(tmp_path / "pool" / "h100.journal.jsonl"), "h100").records
    assert {r["worker"] for r in records} == {"gpu0", "gpu1", "gpu2"}

    serial = tune(spec(tmp_path / "serial", cache_dir), runner=runner("one"), progress=False)
    assert winners(str(tmp_path / "pool" / "h100.json")) == winners(str(tmp_path / "serial" / "h100.json"))
    assert [o.timed_now for o in result.outcomes] == [o.timed_now for o in serial.outcomes]
    assert all(o.entry["measured"] and o.entry["complete"] for o in result.outcomes)


def test_a_lost_worker_costs_only_a_repeat_of_its_in_flight_config(tmp_path, cache_dir):
    pool = WorkerPool([runner("gpu0", lose_after=5), runner("gpu1")], labels=["gpu0", "gpu1"])
    result = tune(spec(tmp_path, cache_dir, seqlens=[2048]), runner=pool, progress=False)
    assert pool.stats[0].lost and not pool.stats[1].lost and pool.parallelism == 1
    records = D.Journal(str(tmp_path / "h100.journal.jsonl"), "h100").records
    assert records and all(r["status"] == "ok" for r in records)  # the lost config ran again on gpu1
    assert sum(r["worker"] == "gpu0" for r in records) == 5
    serial = tune(spec(tmp_path / "serial", cache_dir, seqlens=[2048]), runner=runner("one"), progress=False)
    assert winners(str(tmp_path / "h100.json")) == winners(str(tmp_path / "serial" / "h100.json"))
    assert result.outcomes[0].entry["complete"]


def test_a_pool_with_every_worker_gone_stops_the_tune_keeping_what_was_measured(tmp_path, cache_dir):
    pool = WorkerPool([runner("gpu0", lose_after=2), runner("gpu1", lose_after=2)], labels=["gpu0", "gpu1"])
    start = time.perf_counter()
    with pytest.raises(NoWorkersLeft):
        tune(spec(tmp_path, cache_dir, seqlens=[2048]), runner=pool, progress=False)
    assert time.perf_counter() - start < 60
    records = D.Journal(str(tmp_path / "h100.journal.jsonl"), "h100").records
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)  # nothing recorded for the lost
    entry = D.ConfigDB.read(str(tmp_path / "h100.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    assert entry["complete"] is False
    # a re-run on a healthy worker resumes: the 4 recorded configs are not timed again
    again = tune(spec(tmp_path, cache_dir, seqlens=[2048]), runner=runner("gpu2"), progress=False)
    assert again.outcomes[0].skipped == 4 and again.outcomes[0].entry["complete"]


def test_pool_call_runs_isolated_tasks_on_every_worker_in_task_order():
    from rocmflash.tuning.isolated import measure_isolated

    gauge = Gauge()

    class Caller:
        def __init__(self, name):
            self.name = name

        def call(self, fn, task, timeout_s):
            gauge.enter(self.name)
            time.sleep(0.02)
            gauge.leave(self.name)
            return {"config": task["config"], "status": "ok", "value": fn(task)}

    pool = WorkerPool([Caller("a"), Caller("b")], labels=["a", "b"])
    seen = []
    tasks = [{"config": {"i": i}} for i in range(8)]
    results = measure_isolated(tasks, json.dumps, 5.0, False, on_result=seen.append, pool=pool)
    assert [r["config"]["i"] for r in results] == list(range(8))
    assert [r["value"] for r in results] == [json.dumps(t) for t in tasks]
    assert len(seen) == 8 and gauge.peak == 2 and {r["worker"] for r in results} == {"a", "b"}


def test_parse_gpus_and_mixed_kinds_are_one_line_errors():
    assert parse_gpus("all", 4) == [0, 1, 2, 3]
    assert parse_gpus(" 2,0 ", 4) == [2, 0]
    for text, count, words in (("0,0", 2, "named twice"), ("5", 2, "does not exist"), ("a,b", 2, "invalid"),
                               ("all", 0, "no GPU is visible")):
        with pytest.raises(ValueError, match=words):
            parse_gpus(text, count)

    from rocmflash.hw.detect import identify_device

    names = {0: "AMD Instinct MI300X", 1: "AMD Instinct MI300X", 2: "AMD Instinct MI250X / MI250"}
    archs = {0: "gfx942", 1: "gfx942", 2: "gfx90a"}
    units = {0: 304, 1: 304, 2: 104}

    def identify(i):
        return identify_device(names[i], archs[i], units[i])

    assert node_gpu([0, 1], identify).name == "mi300x"
    with pytest.raises(ValueError, match=r"mixes GPU kinds \(mi300x on 0, 1; mi250 on 2\)"):
        node_gpu([0, 1, 2], identify)
