"""The one tune pipeline's scheduler (rocmflash.tuning.pipeline): fake items and runners, on the simulated
clock (exact makespans, computed by hand in the comments) and on real threads."""

import functools
import random
import threading
import time

import pytest

from rocmflash.tuning.pipeline import Job, Pipeline
from rocmflash.tuning.pipeline_exec import SimulatedExecutor, ThreadExecutor, makespan
from rocmflash.tuning.pool import NoWorkersLeft, WorkerLost


class FakeItem:
    """An item whose batches are given rounds of ``(label, seconds)``; it logs what the pipeline does."""

    def __init__(self, key, rounds, compile_s=(), family="fwd", static_error=None):
        self.key, self.family, self.rounds = key, family, [list(r) for r in rounds]
        self.compile_s, self.static_error = list(compile_s), static_error
        self.static_calls, self.recorded, self.finished, self.issued = 0, [], [], []
        self.clock = None  # set by the test: when each batch became ready
        self.static_thread = None

    def static(self):
        self.static_calls += 1
        self.static_thread = threading.current_thread().name
        if self.static_error is not None:
            raise self.static_error

    def compile_seconds(self):
        return self.compile_s

    def next_batch(self):
        if not self.rounds:
            return None
        batch = [Job(self, functools.partial(_run, label=label, seconds=s), label, (self.key, label, None))
                 for label, s in self.rounds.pop(0)]
        now = self.clock() if self.clock else None
        self.issued += [(job.label, now) for job in batch]
        return batch

    def record(self, job, result):
        self.recorded.append((job.label, result))

    def finish(self, complete):
        self.finished.append(complete)


def _run(runner, label, seconds):
    return runner.time(label, seconds)


class FakeRunner:
    """A ReplayRunner-like runner: ``time`` returns ``wall_s`` = the job's seconds (and sleeps ``sleep`` times
    them); ``lose`` (labels) raise WorkerLost, ``die`` (label -> deaths) return a dead worker's result."""

    def __init__(self, name, sleep=0.0, lose=(), die=None, interrupt=()):
        self.name, self.sleep, self.lose, self.die, self.interrupt = name, sleep, set(lose), dict(die or {}), interrupt
        self.calls, self.threads = [], set()

    def time(self, label, seconds):
        self.calls.append(label)
        self.threads.add(threading.get_ident())
        if label in self.interrupt:
            raise KeyboardInterrupt
        if label in self.lose:
            raise WorkerLost(f"{self.name} gone")
        if self.sleep:
            time.sleep(seconds * self.sleep)
        if self.die.get(label, 0) > 0:
            self.die[label] -= 1
            return {"status": "crashed", "worker_died": True, "error": "worker died (exit code -11)",
                    "wall_s": seconds}
        return {"status": "ok", "median_ms": 1.0, "wall_s": seconds}


def _sim(items, runners, cpu_cores=32, compile_slots=1, on_event=None, priority=None):
    ex = SimulatedExecutor(cpu_cores=cpu_cores)
    for item in items:
        item.clock = ex.now
    events = []

    def log(e):
        events.append(e)
        if on_event:
            on_event(e)
    stats = Pipeline(items, runners, compile_slots=compile_slots, executor=ex, on_event=log, priority=priority).run()
    return stats, events


def _intervals(events):
    """Per worker: [(start, end, item, label)] from the job_start/job_done/job_retry events."""
    open_, out = {}, {}
    for e in events:
        if e["event"] == "job_start":
            assert e["worker"] not in open_, f"two jobs at once on worker {e['worker']}: {e}"
            open_[e["worker"]] = (e["t"], e["item"], e["label"])
        elif e["event"] in ("job_done", "job_retry"):
            start, item, label = open_.pop(e["worker"])
            assert (item, label) == (e["item"], e["label"])
            out.setdefault(e["worker"], []).append((start, e["t"], item, label))
    return out


def _assert_never_idle_while_ready(items, events, workers):
    """No worker is idle while a job is ready: every job that waited (ready at r, started at s > r) found
    every worker busy over all of [r, s)."""
    busy = _intervals(events)
    starts = {(e["item"], e["label"]): e["t"] for e in events if e["event"] == "job_start"}
    for item in items:
        for label, ready in item.issued:
            start = starts[(item.key, label)]
            if start <= ready:
                continue
            for w in workers:
                covered = ready
                for s, e, _, _ in sorted(busy.get(w, [])):
                    if s <= covered < e:
                        covered = e
                assert covered >= start, f"worker {w} idle at {covered} while {item.key}/{label} was ready"


def test_two_items_two_rounds_on_two_workers_interleave_with_no_idle_worker():
    a = FakeItem("A", [[("a1", 3), ("a2", 1)], [("a3", 2)]])
    b = FakeItem("B", [[("b1", 2), ("b2", 2)], [("b3", 1)]])
    stats, events = _sim([a, b], [FakeRunner("r0"), FakeRunner("r1")])
    # by hand (statics take 0 s): t0 w0 a1 (->3), w1 a2 (->1); t1 w1 b1 (->3); t3 a1 done: A's round 2 is
    # ready, w0 a3 (->5) (A first: plan order); b1 done: w1 b2 (->5); t5 a3 done: A finished;
    # b2 done: w0 b3 (->6). Wall 6 s (11 worker-seconds on 2 workers: 5.5 at best); a barrier between
    # items would give A 3+2, then B 2+1 = 8 s.
    assert stats.wall_s == 6
    assert stats.item("A").finished_at_s == 5 and stats.item("B").finished_at_s == 6
    assert [w.busy_s for w in stats.workers] == [6, 5] and [w.done for w in stats.workers] == [3, 3]
    assert sorted(lbl for lbl, _ in a.recorded) == ["a1", "a2", "a3"] and a.finished == [True]
    assert sorted(lbl for lbl, _ in b.recorded) == ["b1", "b2", "b3"] and b.finished == [True]
    assert a.static_calls == b.static_calls == 1
    assert {r["worker"] for _, r in a.recorded + b.recorded} == {"0", "1"}
    _assert_never_idle_while_ready([a, b], events, ["0", "1"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_plans_run_every_job_once_and_keep_workers_busy(seed):
    rng = random.Random(seed)
    items = [FakeItem(f"i{k}", [[(f"i{k}r{r}c{c}", rng.choice([0.5, 1, 2, 3])) for c in range(rng.randint(1, 5))]
                                for r in range(rng.randint(1, 3))], compile_s=[rng.uniform(0, 4)] * 3)
             for k in range(6)]
    expected = {it.key: sorted(lbl for rnd in it.rounds for lbl, _ in rnd) for it in items}
    runners = [FakeRunner(f"r{i}") for i in range(3)]
    _, events = _sim(items, runners, cpu_cores=2)
    for it in items:
        assert sorted(lbl for lbl, _ in it.recorded) == expected[it.key] and it.finished == [True]
    assert sum(len(r.calls) for r in runners) == sum(len(v) for v in expected.values())
    _assert_never_idle_while_ready(items, events, ["0", "1", "2"])


def test_compile_of_the_next_item_overlaps_the_timing_of_the_first():
    # static of each item: compile seconds [4, 4, 2] on 4 cores (cpu_cores 4, one compile slot) -> 4 s
    a = FakeItem("A", [[("a1", 5), ("a2", 5)]], compile_s=[4, 4, 2])
    b = FakeItem("B", [[("b1", 1)]], compile_s=[4, 4, 2])
    stats, _ = _sim([a, b], [FakeRunner("r0")], cpu_cores=4)
    # A static 0-4, A timing 4-14 on one worker; B's static runs 4-8, beside A's timing; b1 14-15
    assert stats.item("A").static_s == 4 and stats.item("B").static_done_at_s == 8
    assert stats.item("B").static_done_at_s < stats.item("A").finished_at_s == 14
    assert stats.wall_s == 15 and stats.item("A").timing_s == 10


def test_static_makespan_is_greedy_longest_first():
    assert makespan([5, 4, 3, 3, 2, 1], 2) == 9  # [5,3,1] and [4,3,2]
    assert makespan([3, 3, 2, 2, 2], 2) == 7  # greedy: [3,2,2] [3,2]; the optimum 6 is not searched
    assert makespan([], 32) == 0 and makespan([1.5], 32) == 1.5
    with pytest.raises(ValueError, match="positive int"):
        makespan([1], 0)


def test_two_compile_slots_split_the_cores():
    items = [FakeItem(k, [[(k + "1", 1)]], compile_s=[4, 4]) for k in ("A", "B")]
    stats, _ = _sim(items, [FakeRunner("r0")], cpu_cores=2, compile_slots=2)
    # 2 slots on 2 cores: each static has one core: 4+4 = 8 s, both at once
    assert [s.static_done_at_s for s in stats.items] == [8, 8] and stats.wall_s == 10


def test_lost_runner_its_job_reruns_once_elsewhere_and_every_item_finishes():
    a = FakeItem("A", [[("a1", 1), ("a2", 1)], [("a3", 1)]])
    b = FakeItem("B", [[("b1", 1), ("b2", 1)]])
    r0, r1 = FakeRunner("r0", lose={"a1"}), FakeRunner("r1")
    stats, events = _sim([a, b], [r0, r1])
    assert r0.calls == ["a1"] and sorted(r1.calls) == ["a1", "a2", "a3", "b1", "b2"]
    assert stats.workers[0].lost and not stats.workers[1].lost
    recorded = {lbl: r for lbl, r in a.recorded + b.recorded}
    assert len(a.recorded + b.recorded) == 5 and all(r["status"] == "ok" for r in recorded.values())
    assert recorded["a1"]["retried_after"] == "0: r0 gone" and "retried_after" not in recorded["a2"]
    assert a.finished == b.finished == [True]
    assert any(e["event"] == "worker_lost" and e["worker"] == "0" for e in events)


def test_a_job_lost_on_two_workers_is_recorded_as_crashed():
    a = FakeItem("A", [[("a2", 5), ("a1", 1)]])
    runners = [FakeRunner("r0"), FakeRunner("r1", lose={"a1"}), FakeRunner("r2", lose={"a1"})]
    stats, _ = _sim([a], runners)  # r0 is busy with a2 while a1 goes to r1, then r2
    result = dict(a.recorded)["a1"]
    assert result["status"] == "crashed" and result["error"] == "timing worker lost twice: 1: r1 gone; 2: r2 gone"
    assert runners[0].calls == ["a2"] and a.finished == [True] and stats.wall_s == 5


def test_no_runner_left_stops_and_finishes_started_items_incomplete():
    a = FakeItem("A", [[("a1", 1)]])
    with pytest.raises(NoWorkersLeft):
        _sim([a], [FakeRunner("r0", lose={"a1"})])
    assert a.finished == [False] and a.recorded == []


def test_dead_worker_is_retried_once_then_recorded_as_crashed():
    a = FakeItem("A", [[("a1", 1), ("a2", 1), ("a3", 1)]])
    runners = [FakeRunner("r0", die={"a1": 1, "a2": 5}), FakeRunner("r1", die={"a1": 1, "a2": 5})]
    stats, _ = _sim([a], runners)
    calls = runners[0].calls + runners[1].calls
    assert sorted(calls) == ["a1", "a1", "a2", "a2", "a3"]  # only what was in flight repeats, once
    recorded = dict(a.recorded)
    assert len(a.recorded) == 3 and recorded["a1"]["status"] == "ok" and "retried_after" in recorded["a1"]
    assert recorded["a2"]["status"] == "crashed" and recorded["a2"]["worker_died"] is True
    assert stats.workers[0].done + stats.workers[1].done == 3 and a.finished == [True]


@pytest.mark.parametrize("executor", ["sim", "threads"])
def test_interrupt_from_a_job_finishes_started_items_incomplete_and_propagates(executor):
    a = FakeItem("A", [[("a1", 1), ("a2", 1)], [("a3", 1)]])
    b = FakeItem("B", [[("b1", 1)]])
    c = FakeItem("C", [[("c1", 1)]], compile_s=[100])
    done = FakeItem("D", [[]] * 0)  # nothing to time: finished (complete) at once
    runner = FakeRunner("r0", interrupt={"a2"}, sleep=0.05 if executor == "threads" else 0)
    ex = SimulatedExecutor() if executor == "sim" else ThreadExecutor()
    if executor == "threads":  # C's static must still run when a2 is interrupted
        c.static = lambda: time.sleep(2.0)
    with pytest.raises(KeyboardInterrupt):
        Pipeline([done, a, b, c], [runner], executor=ex).run()
    assert done.finished == [True] and a.finished == [False] and b.finished == [False] and c.finished == []
    assert [lbl for lbl, _ in a.recorded] == ["a1"] and runner.calls == ["a1", "a2"]


def test_static_error_propagates_after_finishing_started_items():
    a = FakeItem("A", [[("a1", 1)]], compile_s=[0])
    b = FakeItem("B", [[("b1", 1)]], static_error=ValueError("bad space"))
    with pytest.raises(ValueError, match="bad space"):
        _sim([a, b], [FakeRunner("r0")])
    assert a.finished == [False]


def test_threads_two_runners_twice_as_fast_as_one():
    def plan():
        return [FakeItem(k, [[(f"{k}{r}{c}", 0.05) for c in range(4)] for r in range(2)]) for k in "AB"]

    walls = {}
    for n in (1, 2):
        runners = [FakeRunner(f"r{i}", sleep=1.0) for i in range(n)]
        items = plan()
        start = time.perf_counter()
        stats = Pipeline(items, runners).run()
        walls[n] = time.perf_counter() - start
        assert all(it.finished == [True] and len(it.recorded) == 8 for it in items)
        # one timing thread per runner, kept across items and rounds; statics on the compile thread
        assert all(len(r.threads) == 1 for r in runners) and len({t for r in runners for t in r.threads}) == n
        assert {it.static_thread for it in items} == {"rocmflash-compile-0"}
        assert stats.wall_s == pytest.approx(walls[n], abs=0.05)
    # 16 jobs x 50 ms: 0.8 s on one runner, 0.4 s on two
    assert walls[1] >= 0.8 and walls[1] / walls[2] >= 1.7, walls


def test_bad_input_is_a_clear_error():
    a = FakeItem("A", [])
    with pytest.raises(ValueError, match="non-empty list of runners"):
        Pipeline([a], [])
    with pytest.raises(ValueError, match="compile_slots"):
        Pipeline([a], [FakeRunner("r")], compile_slots=0)
    with pytest.raises(ValueError, match="key 'A'"):
        Pipeline([a, FakeItem("A", [])], [FakeRunner("r")])
    with pytest.raises(TypeError, match="lacks"):
        Pipeline([object()], [FakeRunner("r")])
    with pytest.raises(ValueError, match="labels"):
        Pipeline([a], [FakeRunner("r")], labels=["x", "y"])
    with pytest.raises(ValueError, match="cpu_cores"):
        SimulatedExecutor(cpu_cores=0)
    bad = FakeItem("B", [])
    bad.next_batch = lambda: ("not", "a list")
    with pytest.raises(TypeError, match="list of Job"):
        _sim([bad], [FakeRunner("r")])
    assert bad.finished == [False]


def test_a_worker_pool_gives_its_runners_and_labels():
    from rocmflash.tuning.pool import WorkerPool

    pool = WorkerPool([FakeRunner("r0"), FakeRunner("r1")], labels=["gpu0", "gpu1"])
    a = FakeItem("A", [[("a1", 1), ("a2", 1)]])
    stats = Pipeline([a], pool, executor=SimulatedExecutor()).run()
    assert [w.label for w in stats.workers] == ["gpu0", "gpu1"]
    assert {r["worker"] for _, r in a.recorded} == {"gpu0", "gpu1"}


def _die(task):
    import os

    os._exit(7)


def test_live_runner_marks_a_dead_worker_process():
    from rocmflash.config import KernelConfig
    from rocmflash.hw.roofline import Shape
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    shape = Shape(batch=1, heads_q=1, heads_kv=1, seqlen_q=16, seqlen_k=16, head_dim=16, dtype="fp16", causal=False)
    with LiveRunner(LiveSettings(timeout_s=120)) as runner:
        died = runner.call(_die, {"config": None}, timeout_s=120)
        crashed = runner.measure(KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1), shape,
                                 inject="crash")
    assert died["status"] == "crashed" and died["worker_died"] is True and "exit code 7" in died["error"]
    assert crashed["status"] == "crashed" and crashed["worker_died"] is True, crashed


def test_live_runner_marks_a_broken_pool_as_a_dead_worker(monkeypatch):
    """A SIGKILLed timing worker can reach the runner as pebble's BrokenProcessPool ("All workers expired",
    seen on the 2-GPU kill run of 2026-11-26) rather than ProcessExpired: still a dead worker, retried once."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from rocmflash.config import KernelConfig
    from rocmflash.hw.roofline import Shape
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    class BrokenPool:
        def schedule(self, fn, args=(), timeout=None):
            future = Future()
            future.set_exception(BrokenProcessPool("All workers expired"))
            return future

    runner = LiveRunner(LiveSettings(timeout_s=120))
    restarts = []
    monkeypatch.setattr(runner, "_get_pool", lambda: BrokenPool())
    monkeypatch.setattr(runner, "_restart", lambda: restarts.append(1))
    shape = Shape(batch=1, heads_q=1, heads_kv=1, seqlen_q=16, seqlen_k=16, head_dim=16, dtype="fp16", causal=False)
    measured = runner.measure(KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1), shape)
    called = runner.call(_die, {"config": None}, timeout_s=120)
    assert measured["status"] == "crashed" and measured["worker_died"] is True, measured
    assert called["status"] == "crashed" and called["worker_died"] is True, called
    assert len(restarts) == 2  # each replaced its pool


def _pid(task):
    import os

    return os.getpid()


def test_task_prewarms_reuse_one_pool_of_workers_for_the_whole_tune():
    """Each problem's pre-warm (backward, decode, varlen) used to spawn a fresh pool (torch imported again per
    problem: the 15-23 s idle gaps between problems of the 2-GPU cold run); the runner now keeps one."""
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    runner = LiveRunner(LiveSettings(timeout_s=120), prewarm_workers=1)
    try:
        runner.prewarm_tasks([{"config": None}], _pid, 120)
        pool = runner._task_prewarm
        first = pool.run([{"config": None}], _pid, 120)
        runner.prewarm_tasks([{"config": None}], _pid, 120)
        second = pool.run([{"config": None}, {"config": None}], _pid, 120)
        assert runner._task_prewarm is pool and pool.max_workers == 1
        assert set(second) == set(first) and len(first) == 1  # the same process served every call
    finally:
        runner.close()
    assert runner._task_prewarm._pool is None


# ----------------------------------------------------------------------------- scaling (issue #29, 2-GPU runs)
def _grouped(key, rounds, compile_s=(), group=None, work=None):
    item = FakeItem(key, rounds, compile_s)
    item.static_group = group
    if work is not None:
        item.work_s = lambda: work
    return item


def test_two_compile_slots_never_run_two_statics_of_one_group_at_once():
    # A1, A2 share a static phase (group g); B has its own. 2 slots, 2 cores (1 core per slot): A1 4 s, then A2
    # (its compile is the shared one: charged 0 here) only after A1; B beside A1: both statics end at 4; a1 and
    # b1 run 4-5, a2 5-6.
    a1 = _grouped("A1", [[("a1", 1)]], compile_s=[4], group="g")
    a2 = _grouped("A2", [[("a2", 1)]], compile_s=[], group="g")
    b = _grouped("B", [[("b1", 1)]], compile_s=[4], group="h")
    stats, events = _sim([a1, a2, b], [FakeRunner("r0"), FakeRunner("r1")], cpu_cores=2, compile_slots=2)
    starts = {e["item"]: e["t"] for e in events if e["event"] == "static_start"}
    assert starts == {"A1": 0, "B": 0, "A2": 4}  # A2 waited for A1 although a slot was free; B did not
    assert stats.item("B").static_done_at_s == 4 and stats.item("A2").static_done_at_s == 4
    assert stats.wall_s == 6 and all(it.finished == [True] for it in (a1, a2, b))
    _assert_never_idle_while_ready([a1, a2, b], events, ["0", "1"])


def test_workers_start_beside_the_first_static_phase_not_at_their_first_job():
    # worker start-up 3 s, static 4 s: started with the run, both workers are up when the first job is ready
    def run(start_workers):
        items = [FakeItem("A", [[("a1", 2), ("a2", 2)]], compile_s=[4])]
        ex = SimulatedExecutor(cpu_cores=1, worker_start_s=3)
        stats = Pipeline(items, [FakeRunner("r0"), FakeRunner("r1")], executor=ex, start_workers=start_workers).run()
        return stats

    eager, lazy = run(True), run(False)
    assert eager.wall_s == 6 and [w.busy_s for w in eager.workers] == [2, 2]
    assert lazy.wall_s == 9 and [w.busy_s for w in lazy.workers] == [5, 5]  # each first job paid the start-up


def test_a_started_worker_waits_for_its_process_idle_not_busy():
    ex = SimulatedExecutor(cpu_cores=1, worker_start_s=5)
    stats = Pipeline([FakeItem("A", [[("a1", 1)]])], [FakeRunner("r0")], executor=ex).run()
    assert stats.wall_s == 6 and stats.workers[0].busy_s == 1  # ready at 0, its process at 5


def test_thread_executor_starts_every_runner_before_its_first_job():
    class Starting(FakeRunner):
        def __init__(self, name, log):
            super().__init__(name)
            self.log = log

        def start_worker(self):
            self.log.append(("start", self.name, threading.current_thread().name))

        def time(self, label, seconds):
            self.log.append(("job", self.name, threading.current_thread().name))
            return super().time(label, seconds)

    log = []
    runners = [Starting("r0", log), Starting("r1", log)]
    item = FakeItem("A", [[("a1", 0)]])
    item.static = lambda: time.sleep(0.3)  # nothing is timed for 0.3 s: both workers start meanwhile
    Pipeline([item], runners).run()
    starts = [(n, t) for what, n, t in log if what == "start"]
    assert sorted(n for n, _ in starts) == ["r0", "r1"]  # r1 never times a job, yet started
    assert all(t.startswith("rocmflash-timing-") for _, t in starts)
    job = next(i for i, e in enumerate(log) if e[0] == "job")
    assert all(log.index(("start", n, t)) < job for n, t in starts)
    # a runner without start_worker, or one whose start fails, is simply started by its first job
    broken = Starting("r2", [])
    broken.start_worker = lambda: 1 / 0
    stats = Pipeline([FakeItem("B", [[("b1", 0)]])], [broken, FakeRunner("r3")]).run()
    assert sum(w.done for w in stats.workers) == 1


def test_largest_first_orders_by_estimated_work_and_keeps_ties_and_unknowns():
    from rocmflash.tuning.pipeline import largest_first

    a, b, c, d = (_grouped(k, [], work=w) for k, w in (("A", 1.0), ("B", 5.0), ("C", 1.0), ("D", 3.0)))
    assert [i.key for i in largest_first([a, b, c, d])] == ["B", "D", "A", "C"]
    plain = FakeItem("E", [])
    assert [i.key for i in largest_first([a, b, plain])] == ["A", "B", "E"]  # an item without an estimate


def test_largest_first_shortens_the_tail_on_two_workers():
    # every static 1 s (3 slots, 1 core each). Plan order: the first two jobs come from s1 (its static started,
    # so ended, first), then at t=3 both workers are free with s2's two 2 s jobs and L's 8 s job ready: s2a, s2b
    # 3-5, then L 5-13. Largest first (the statics start in that order too): L 1-9 on one worker, s1a, s1b, s2a,
    # s2b 1-9 on the other.
    def plan():
        return [_grouped("s1", [[("s1a", 2), ("s1b", 2)]], [1], work=4),
                _grouped("s2", [[("s2a", 2), ("s2b", 2)]], [1], work=4), _grouped("L", [[("L1", 8)]], [1], work=8)]

    from rocmflash.tuning.pipeline import largest_first

    in_order, _ = _sim(plan(), [FakeRunner("r0"), FakeRunner("r1")], cpu_cores=3, compile_slots=3)
    items = plan()
    largest, _ = _sim(items, [FakeRunner("r0"), FakeRunner("r1")], cpu_cores=3, compile_slots=3,
                      priority=largest_first(items))
    assert in_order.wall_s == 13 and largest.wall_s == 9
    assert sorted(w.busy_s for w in largest.workers) == [8, 8]
    assert [s.key for s in largest.items] == ["s1", "s2", "L"]  # the stats keep the plan's order
    with pytest.raises(ValueError, match="priority must list every item"):
        Pipeline(items, [FakeRunner("r0")], priority=items[:2])


def test_a_groups_largest_item_compiles_first_on_several_workers():
    # S and L share a static phase (group g; the first to run it compiles, 4 s, the other finds it cached). With
    # the largest-first priority L compiles, so the first jobs the compile releases are L's long ones: L1 4-12 and
    # s1, s2 after S's cached static, 4-6 on the other worker. In plan order S compiled: the same wall here, but
    # its short jobs came first while L waited for the shared compile.
    from rocmflash.tuning.pipeline import largest_first

    small = _grouped("S", [[("s1", 1), ("s2", 1)]], compile_s=[], group="g", work=2)
    large = _grouped("L", [[("L1", 8)]], compile_s=[4], group="g", work=8)
    stats, events = _sim([small, large], [FakeRunner("r0"), FakeRunner("r1")], cpu_cores=2, compile_slots=2,
                         priority=largest_first([small, large]))
    starts = [(e["item"], e["t"]) for e in events if e["event"] == "static_start"]
    assert starts == [("L", 0), ("S", 4)]
    first = next(e for e in events if e["event"] == "job_start")
    assert (first["label"], first["t"]) == ("L1", 4) and stats.wall_s == 12
    _, alone = _sim([_grouped("S", [[("s1", 1)]], group="g"), _grouped("L", [[("L1", 8)]], [4], group="g")],
                    [FakeRunner("r0")])  # no priority (one worker): the plan's order
    assert [e["item"] for e in alone if e["event"] == "static_start"] == ["S", "L"]


def test_no_worker_idles_while_a_built_items_jobs_remain_with_slow_statics():
    """2 workers, 2 compile slots, worker start-up, statics of several seconds: whenever an item's static is
    done, its jobs keep every started worker busy until they run out (the statics overlap the timing)."""
    rng = random.Random(7)
    items = [_grouped(f"i{k}", [[(f"i{k}r{r}c{c}", rng.choice([0.5, 1, 2])) for c in range(rng.randint(2, 6))]
                                for r in range(rng.randint(1, 3))], compile_s=[rng.uniform(2, 8)] * 4,
                      group=f"g{k // 2}", work=rng.uniform(1, 10)) for k in range(8)]
    from rocmflash.tuning.pipeline import largest_first

    ex = SimulatedExecutor(cpu_cores=8, worker_start_s=1.5)
    for item in items:
        item.clock = ex.now
    events = []
    stats = Pipeline(items, [FakeRunner("r0"), FakeRunner("r1")], compile_slots=2, executor=ex,
                     on_event=events.append, priority=largest_first(items)).run()
    assert all(it.finished == [True] for it in items) and sum(w.done for w in stats.workers) == sum(
        len(it.recorded) for it in items)
    for item in items:  # jobs ready before the workers were up could only wait for them
        item.issued = [(label, max(t, 1.5)) for label, t in item.issued]
    _assert_never_idle_while_ready(items, events, ["0", "1"])
    statics = [(e["t"], e["event"], e["item"]) for e in events if e["event"].startswith("static")]
    in_flight = 0
    for _, what, _ in sorted(statics, key=lambda x: (x[0], x[1] == "static_start")):
        in_flight += 1 if what == "static_start" else -1
        assert in_flight <= 2
    assert any(t > 0 and what == "static_start" for t, what, _ in statics)  # statics ran beside the timing


def test_default_compile_slots_from_cores_and_memory():
    from rocmflash.tuning.pipeline import compile_workers, default_compile_slots

    assert default_compile_slots(32, 256) == 2  # the 2-GPU machine of the 2026-11-26 run
    assert default_compile_slots(16, 128) == 1 and default_compile_slots(2, 23) == 1
    assert default_compile_slots(128, 560) == 4 and default_compile_slots(64, 30) == 1  # memory bounds it
    assert compile_workers(2, 32) == 16 and compile_workers(3, 2) == 1
    with pytest.raises(ValueError, match="cpu_cores"):
        default_compile_slots(0, 10)
