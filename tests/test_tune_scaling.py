"""What keeps every GPU of a multi-GPU tune busy (issue #29, the 2-GPU runs of 2026-11-26), without a GPU:
one pre-warm pool per runner for every family, started with the tune and safe to share between static phases
running at once; timing workers started with the tune; ``tune --pass both`` as one pipeline; the scaling
model's calibrated static phases and durations (benchmarks/scale_sim.py)."""

import math
import os
import sys
import threading
import time
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def _pid(task):
    import os

    return os.getpid()


# ----------------------------------------------------------------------------- the runner's pre-warm pool
def test_forward_and_task_prewarms_share_one_pool_started_with_the_tune(monkeypatch):
    """The forward's pre-warm had its own pool beside the backward/decode one (two pools importing torch, the
    tasks' capped at 8 processes); now every family's pre-warm runs on the one kept pool, which the tune starts
    while its first static phase compiles."""
    from rocmflash.config import KernelConfig
    from rocmflash.hw.roofline import Shape
    from rocmflash.tuning import live
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    monkeypatch.setattr(live, "prewarm_one", _pid)  # what a forward pre-warm runs: here, which process ran it
    runner = LiveRunner(LiveSettings(timeout_s=120), prewarm_workers=1)
    monkeypatch.setattr(runner, "_get_pool", lambda: types.SimpleNamespace(schedule=lambda fn, *a, **k: None))
    try:
        runner.start_prewarm()
        pool = runner._task_prewarm
        assert pool is not None and pool._pool is not None  # started before any pre-warm
        shape = Shape(batch=1, heads_q=1, heads_kv=1, seqlen_q=16, seqlen_k=16, head_dim=16, dtype="fp16")
        forward = runner.prewarm([KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)], shape)
        runner.prewarm_tasks([{"config": None}], _pid, 120)
        tasks = pool.run([{"config": None}], _pid, 120)
        assert runner._task_prewarm is pool and not hasattr(runner, "_prewarm_pool")
        assert set(forward.values()) == set(tasks) and len(set(tasks)) == 1  # one process served both families
    finally:
        runner.close()
    assert pool._pool is None


def test_static_phases_at_once_start_one_prewarm_pool(monkeypatch):
    """Two compile slots pre-warm at once: the runner's pool and its processes are created once."""
    import pebble

    from rocmflash.tuning import isolated
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    made, real_init = [], isolated.TaskPrewarmPool.__init__

    def slow_init(self, *a, **k):
        made.append(self)
        time.sleep(0.2)  # a wide window for a second thread
        real_init(self, *a, **k)

    monkeypatch.setattr(isolated.TaskPrewarmPool, "__init__", slow_init)
    runner = LiveRunner(LiveSettings(timeout_s=120), prewarm_workers=1)
    threads = [threading.Thread(target=runner.prewarm_tasks, args=([], _pid, 1)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1

    pools = []

    class SlowPool:
        def __init__(self, **kw):
            pools.append(self)
            time.sleep(0.2)

        def schedule(self, fn, args=(), timeout=None):
            return None

    monkeypatch.setattr(pebble, "ProcessPool", SlowPool)
    pool = isolated.TaskPrewarmPool(None, {}, 2)
    threads = [threading.Thread(target=pool.schedule, args=(_pid, {}, 1)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(pools) == 1
    pool._pool = None


def test_start_worker_schedules_the_warm_up_in_the_timing_worker(monkeypatch):
    from rocmflash.tuning import isolated
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    scheduled = []
    runner = LiveRunner(LiveSettings(timeout_s=120))
    monkeypatch.setattr(runner, "_get_pool", lambda: types.SimpleNamespace(schedule=lambda fn, *a, **k:
                                                                            scheduled.append(fn)))
    runner.start_worker()
    assert scheduled == [isolated.warm_up]
    assert isolated.warm_up() is True and all(m in sys.modules for m in isolated.WARM_MODULES)


class _Starting:
    def __init__(self, log, name, fail=False):
        self.log, self.name, self.fail = log, name, fail

    def start_prewarm(self):
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError("no pool")


def test_the_tune_starts_the_prewarm_workers_of_the_runner_that_prewarms(tmp_path):
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.tuning.items import open_context, run_items
    from rocmflash.tuning.pool import WorkerPool

    def ctx(prewarmer, measuring=True):
        return open_context(get_gpu("h100"), str(tmp_path / "h100.json"), "replay", measuring, prewarmer=prewarmer)

    log = []
    shared = WorkerPool([_Starting(log, "r0"), _Starting(log, "r1")], shared_cache=True)
    run_items([], shared, ctx(shared))  # a pipeline run starts them (a shared Triton cache: the first runner)
    assert log == ["r0"]
    log.clear()
    ctx(WorkerPool([_Starting(log, "r0", fail=True), _Starting(log, "r1")], shared_cache=False)).start_prewarm()
    assert log == ["r0", "r1"]  # each runner pre-warms its own cache; a failure is only a later start
    log.clear()
    ctx(_Starting(log, "one")).start_prewarm()
    ctx(_Starting(log, "static"), measuring=False).start_prewarm()
    assert log == ["one"]


# ----------------------------------------------------------------------------- tune --pass both
def test_cli_pass_both_hands_both_passes_to_one_tune(tmp_path, monkeypatch):
    """``tune --pass both`` ran the forward tune, then the backward tune (two pipelines, a barrier between);
    now one tune call with backward=True (one pipeline), whose result carries the backward's."""
    import argparse

    import rocmflash.tuning
    from rocmflash.cli.tune import add_tune_parsers, run_tune
    from rocmflash.tuning import backward_run

    calls = []
    outcome = types.SimpleNamespace(seconds=1.5)
    monkeypatch.setattr(rocmflash.tuning, "tune", lambda spec, **kw: calls.append(("tune", kw.get("backward"))) or
                        types.SimpleNamespace(gpu="h100", db_path="db", measured=True, why_unmeasured=None,
                                              backward_outcomes=[outcome] if kw.get("backward") else None))
    monkeypatch.setattr(rocmflash.tuning, "print_summary", lambda result, console: calls.append(("fwd summary",)))
    monkeypatch.setattr(backward_run, "tune_backward", lambda spec, **kw: calls.append(("tune_backward",)) or "B")
    monkeypatch.setattr(backward_run, "print_backward_summary", lambda r, console: calls.append(
        ("bwd summary", r if r == "B" else (r.outcomes, r.seconds))))
    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(tmp_path))

    def cli(*extra):
        parser = argparse.ArgumentParser(prog="rocmflash")
        add_tune_parsers(parser.add_subparsers(dest="command"))
        calls.clear()
        code = run_tune(parser.parse_args(["tune", "--gpu", "h100", "--head-dim", "64", "--dtype", "bf16",
                                           "--seqlen", "2048", *extra]))
        return code, list(calls)

    both = [("tune", True), ("fwd summary",), ("bwd summary", ([outcome], 1.5))]
    assert cli() == (0, both)  # both: the default
    assert cli("--pass", "both") == (0, both)
    assert cli("--pass", "fwd") == (0, [("tune", False), ("fwd summary",)])
    assert cli("--pass", "bwd") == (0, [("tune_backward",), ("bwd summary", "B")])


# ----------------------------------------------------------------------------- the scaling model
class _SimItem:
    def __init__(self, family, compile_s=(), tasks=0):
        self.family, self.compile_s = family, list(compile_s)
        self.timing = types.SimpleNamespace(tasks=[{}] * tasks)

    def compile_seconds(self):
        return self.compile_s


def test_scale_model_static_phases_old_and_new():
    import scale_sim as S

    clock = [0.0]
    # old, cold: a backward problem compiles (start + makespan on 8 cores), starts a fresh pool of 8 and builds
    old = S.StaticModel("old", "cold", 32, 1, lambda: clock[0])
    first = old(_SimItem("bwd", [2.0] * 8, tasks=16), 8)
    assert first == pytest.approx(S.COMPILE_START_S + 2.0 + S.PREWARM_POOL_START_S + 2 * S.PREWARM_BUILD_S["bwd"])
    again = old(_SimItem("bwd", [], tasks=16), 8)  # the family's second problem: a fresh pool again, hits
    assert again == pytest.approx(S.PREWARM_POOL_START_S + 2 * S.PREWARM_HIT_S)
    # new: one kept pool of min(MAX_PREWARM_WORKERS, 31) processes shared by 2 slots, started with the run (ready at
    # the start-up time)
    procs = min(S.MAX_PREWARM_WORKERS, 31) // 2
    new = S.StaticModel("new", "cold", 32, 2, lambda: clock[0])
    assert new(_SimItem("decode", [], tasks=30), 16) == pytest.approx(
        S.PREWARM_POOL_START_S + math.ceil(30 / procs) * S.PREWARM_BUILD_S["decode"])
    clock[0] = 100.0  # later: the pool is up, the family's binaries are built
    assert new(_SimItem("decode", [1.0], tasks=procs), 16) == pytest.approx(
        S.COMPILE_START_S + 1.0 + S.PREWARM_HIT_S)
    warm = S.StaticModel("new", "warm", 32, 2, lambda: clock[0])
    assert warm(_SimItem("bwd", [5.0] * 4, tasks=procs), 16) == pytest.approx(S.PREWARM_HIT_S)  # nothing compiles


def test_scale_model_builds_only_the_split_kv_prewarms_of_a_forward_problem():
    """Scheduler "new": a forward launch finds the static phase's build in Triton's cache except split_kv's (its
    launch pins a split count the cross-compile does not), so only those pre-warms cost a build; each streamed
    config is ready when its own pre-warm ends."""
    import scale_sim as S

    from rocmflash.config import KernelConfig

    online = KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    split = online.replace(variant="split_kv")
    cand = types.SimpleNamespace
    item = types.SimpleNamespace(family="fwd", chosen=None,
                                 _ready=types.SimpleNamespace(ready=[(0, cand(config=online)),
                                                                     (1, cand(config=split))]))
    model = S.StaticModel("new", "cold", 32, 2, lambda: 0.0)
    assert model._fwd_costs(item, S.PREWARM_BUILD_S["fwd"]) == [S.PREWARM_HIT_S, S.PREWARM_BUILD_S["fwd"]]
    assert model._fwd_costs(item, S.PREWARM_HIT_S) == []  # a family already built: every pre-warm hits
    assert S.StaticModel("old", "cold", 32, 1, lambda: 0.0)._fwd_costs(item, S.PREWARM_BUILD_S["fwd"]) == []
    # two configs arriving at once on two free slots: each ready after its own pre-warm, not the slower one's
    assert S._prewarm_batches([1.0, 1.0], 0.0, 8, [0.5, 3.0]) == [1.5, 4.0]
    assert S._prewarm_batches([1.0, 1.0, 1.0], 0.0, 2, 1.0) == [2.0, 2.0, 3.0]  # two at a time


def test_scale_model_durations_strip_worker_start_up_and_fill_the_incumbent():
    import scale_sim as S

    records = [{"key": "k", "config": {"kernel": "dq"}, "family": "bwd", "round": None, "wall_s": 7.6,
                "worker_s": 1.1},
               {"key": "k", "config": {"kernel": "dkdv"}, "family": "bwd", "round": None, "wall_s": 0.5,
                "worker_s": 0.49}]
    d = S.Durations(records)
    assert d.stripped == 1
    assert d.lookup("bwd", ("k", '{"kernel": "dq"}', None)) == (1.1, "recorded")  # its start-up is simulated apart
    assert d.lookup("bwd", ("k", '{"kernel": "dkdv"}', None)) == (0.5, "recorded")
    assert d.lookup("fwd", ("d64", S.INCUMBENT, None)) == (S.INCUMBENT_S, "incumbent_estimate")


def test_scale_gpus_timeline_finds_start_up_gaps_and_tail(tmp_path):
    import json

    import scale_gpus

    events = [("static_start", "A", None, 0.0), ("static_done", "A", None, 5.0), ("static_start", "B", None, 5.0),
              ("job_start", "A", "gpu0", 6.0), ("job_done", "A", "gpu0", 7.0), ("job_start", "A", "gpu1", 7.5),
              ("job_done", "A", "gpu1", 8.0), ("static_done", "B", None, 12.0), ("job_start", "B", "gpu0", 12.0),
              ("job_done", "B", "gpu0", 14.0), ("job_start", "B", "gpu0", 14.2), ("job_done", "B", "gpu0", 15.0),
              ("item_done", "B", None, 15.0)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"event": e, "item": i, "worker": w, "t": t}) + "\n" for e, i, w, t in events))
    got = scale_gpus.timeline(str(trace))
    assert got["pipeline_s"] == 15.0 and got["statics"] == {"A": [0.0, 5.0], "B": [5.0, 12.0]}
    gpu0, gpu1 = got["workers"]["gpu0"], got["workers"]["gpu1"]
    assert gpu0["first_job_s"] == 6.0 and gpu0["gaps_s"] == 5.0 and gpu0["gaps"] == [[7.0, 5.0, ["B"]]]
    assert gpu0["tail_s"] == 0.0 and gpu0["busy_s"] == 3.8  # the 0.2 s between its last two jobs is no gap
    assert gpu1["first_job_s"] == 7.5 and gpu1["gaps_s"] == 0 and gpu1["tail_s"] == 7.0
    assert scale_gpus.timeline(str(tmp_path / "none.jsonl")) == {}
