"""Streamed static phases in the one tune pipeline (issue #29): a race's first-round survivors are timed as their
compiles arrive, while the rest of the problem still compiles.

What must hold: a timing worker gets an item's first survivor before the item's last config is compiled; the
round still closes only after every survivor is in; a worker lost mid-stream repeats only what it had in flight;
the entries are those of the same tune without streaming (deterministic fake timings); the survivors released
early are exactly the static phase's, in whatever order the compiles arrive.
"""

import functools
import random
import threading

import pytest

from rocmflash import db as D
from rocmflash.hw.gpus import get_gpu
from rocmflash.static.prune import judge, prune
from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
from rocmflash.tuning.items import open_context
from rocmflash.tuning.items_fwd import forward_items
from rocmflash.tuning.pipeline import Job, Pipeline
from rocmflash.tuning.pipeline_exec import SimulatedExecutor, fifo_finish_times
from rocmflash.tuning.pool import WorkerLost
from rocmflash.tuning.runners import ReplayRunner
from rocmflash.tuning.spec import TuneSpec
from rocmflash.tuning.stream import ReadyQueue, SurvivorStream

SPACE = ConfigSpace({"online": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4, 8],
                                "num_stages": [2, 3]}}, DEFAULT_RESTRICTIONS)


# ----------------------------------------------------------------------------- scheduler, fake items
class StreamItem:
    """A streaming item: ``n`` configs "compile" one after another (``compile_s`` each, simulated clock); config
    ``i`` is ready when compiled; round 1 times all, round 2 the first two. On threads, its static phase waits
    (``gate``) after the first config until a worker has timed something, and records whether one had."""

    family = "fwd"

    def __init__(self, key, n=4, compile_s=1.0, job_s=0.5, gate=None):
        self.key, self.n, self.compile_s, self.job_s, self.gate = key, n, compile_s, job_s, gate
        self.ready, self.given, self.rounds_left = [], 0, 2
        self.recorded, self.finished, self.static_over = [], [], False
        self.timed_before_last_compile = None
        self.asked_after_static = []

    def static(self):
        self.static_stream(lambda: None)

    def static_stream(self, notify):
        for i in range(self.n):
            self.ready.append(f"c{i}")
            notify()
            if i == 0 and self.gate is not None:
                self.timed_before_last_compile = self.gate.wait(20)
        self.static_over = True

    def compile_seconds(self):
        return [self.compile_s] * self.n

    def compile_order_seconds(self):
        return [self.compile_s] * self.n

    def stream_prefixes(self):
        return list(range(1, self.n + 1))

    def early_jobs(self, upto=None):
        end = len(self.ready) if upto is None else min(upto, len(self.ready))
        jobs = [self._job(c, 1) for c in self.ready[self.given:end]]
        self.given = max(self.given, end)
        return jobs

    def _job(self, label, rnd):
        return Job(self, functools.partial(_time, label=f"{label}/r{rnd}", seconds=self.job_s), f"{label}/r{rnd}",
                   (self.key, label, rnd))

    def next_batch(self):
        self.asked_after_static.append(self.static_over)
        if self.rounds_left == 2:
            self.rounds_left = 1
            return self.early_jobs()  # the rest of round 1 (may be empty: its jobs are in flight)
        if self.rounds_left == 1:
            self.rounds_left = 0
            assert sorted(label for label, _ in self.recorded) == [f"c{i}/r1" for i in range(self.n)]
            return [self._job(c, 2) for c in self.ready[:2]]
        return None

    def record(self, job, result):
        self.recorded.append((job.label, result))

    def finish(self, complete):
        self.finished.append(complete)


def _time(runner, label, seconds):
    return runner.time(label, seconds)


class TimeRunner:
    def __init__(self, timed=None):
        self.calls, self.timed = [], timed

    def time(self, label, seconds):
        self.calls.append(label)
        if self.timed is not None:
            self.timed.set()
        return {"status": "ok", "median_ms": 1.0, "wall_s": seconds}


def test_threads_a_worker_times_the_first_survivor_before_the_last_config_compiles():
    timed = threading.Event()
    item = StreamItem("a", n=4, gate=timed)
    events = []
    Pipeline([item], [TimeRunner(timed)], on_event=events.append).run()
    assert item.timed_before_last_compile is True
    first_job = next(e["t"] for e in events if e["event"] == "job_start")
    static_done = next(e["t"] for e in events if e["event"] == "static_done")
    assert first_job < static_done
    assert [label for label, _ in item.recorded] == ["c0/r1", "c1/r1", "c2/r1", "c3/r1", "c0/r2", "c1/r2"]
    assert item.finished == [True] and all(item.asked_after_static)  # the round closed after the static phase


def test_without_streaming_nothing_is_timed_before_the_static_phase_ends():
    timed = threading.Event()
    item = StreamItem("a", n=3, gate=_ShortWait(timed))
    Pipeline([item], [TimeRunner(timed)], stream=False).run()
    assert item.timed_before_last_compile is False
    assert len(item.recorded) == 3 + 2


class _StopAt(TimeRunner):
    """Ctrl-C at the ``n``-th job (the journal holds the ones before it); ``stopped`` is set then."""

    def __init__(self, n):
        super().__init__()
        self.n, self.stopped = n, threading.Event()

    def time(self, label, seconds):
        if len(self.calls) + 1 == self.n:
            self.stopped.set()
            raise KeyboardInterrupt
        return super().time(label, seconds)


class _SlowToEnd(StreamItem):
    """Every config ready at once; the static phase then runs ``static_s`` past the Ctrl-C."""

    def __init__(self, key, stopped, static_s):
        super().__init__(key, n=4)
        self.stopped, self.static_s = stopped, static_s

    def static_stream(self, notify):
        self.ready.extend(f"c{i}" for i in range(self.n))
        notify()
        self.stopped.wait(20)
        threading.Event().wait(self.static_s)
        self.static_over = True


@pytest.mark.parametrize("static_s,finished", [(0.3, [False]), (8.0, [])])
def test_ctrl_c_mid_stream_waits_briefly_for_the_static_phase_then_writes_what_is_recorded(static_s, finished):
    """Stopped while a streaming item's static phase still runs, with results recorded: a static phase that ends
    within the settle time (ABANDON_STATIC_WAIT_S, 5 s) gets the item's entry (finish(False)); one that does not
    is left, its results in the journal (the wait is bounded)."""
    runner = _StopAt(2)
    item = _SlowToEnd("a", runner.stopped, static_s)
    with pytest.raises(KeyboardInterrupt):
        Pipeline([item], [runner]).run()
    assert [label for label, _ in item.recorded] == ["c0/r1"]
    assert item.finished == finished


class _ShortWait:
    """The gate, waiting 0.5 s only (nothing can be timed before the static phase ends)."""

    def __init__(self, event):
        self.event = event

    def wait(self, timeout):
        return self.event.wait(0.5)


def test_simulated_clock_releases_configs_as_they_compile_and_round_two_waits_for_the_static_phase():
    # 4 configs of 1 s on 1 core: config i is ready at i + 1; the static phase ends at 4; jobs of 0.5 s on one worker
    item = StreamItem("a", n=4, compile_s=1.0, job_s=0.5)
    events = []
    Pipeline([item], [TimeRunner()], executor=SimulatedExecutor(cpu_cores=1), on_event=events.append).run()
    starts = [(e["label"], e["t"]) for e in events if e["event"] == "job_start"]
    assert starts == [("c0/r1", 1.0), ("c1/r1", 2.0), ("c2/r1", 3.0), ("c3/r1", 4.0), ("c0/r2", 4.5),
                      ("c1/r2", 5.0)]
    assert fifo_finish_times([1.0, 1.0, 3.0, 1.0], 2) == [1.0, 1.0, 4.0, 2.0]


def test_simulated_clock_without_streaming_starts_after_the_static_phase():
    item = StreamItem("a", n=4, compile_s=1.0, job_s=0.5)
    events = []
    Pipeline([item], [TimeRunner()], executor=SimulatedExecutor(cpu_cores=1), on_event=events.append,
             stream=False).run()
    assert min(e["t"] for e in events if e["event"] == "job_start") == 4.0


def test_ready_queue_prewarms_in_batches_and_gives_each_entry_once():
    warmed, notes = [], []
    q = ReadyQueue(lambda batch: warmed.append(list(batch)), lambda: notes.append(1), threads=1)
    q.put([1, 2])
    q.put([3])
    q.close()
    assert sorted(x for b in warmed for x in b) == [1, 2, 3] and notes
    assert q.take(2) == [1, 2] and q.take() == [3] and q.take() == []


def test_a_slow_prewarm_holds_back_only_its_own_entries():
    """A build the static phase did not make (seconds of compile) must not keep the cache hits released with it
    from the timing workers: each entry is ready when its own pre-warm ends."""
    import threading

    slow_started, release_slow = threading.Event(), threading.Event()

    def prewarm(batch):
        if "slow" in batch:
            slow_started.set()
            assert release_slow.wait(10)

    q = ReadyQueue(prewarm, lambda: None, threads=4)
    q.put(["slow", "a", "b"])
    assert slow_started.wait(10)
    q.put(["c"])  # released while the slow one still builds: starts at once
    deadline = threading.Event()
    for _ in range(200):
        if sorted(q.ready) == ["a", "b", "c"]:
            break
        deadline.wait(0.01)
    assert sorted(q.take()) == ["a", "b", "c"]
    release_slow.set()
    q.close()
    assert q.take() == ["slow"] and q.take() == []


# ----------------------------------------------------------------------------- forward items, real static phases
@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("stream-static-cache"))


def fwd_ms(cfg, shape):
    return (1.0 + 0.3 * (cfg.BLOCK_M == 64) + 0.1 * (cfg.BLOCK_N == 32) - 0.02 * (cfg.num_warps == 8)
            - 0.005 * cfg.num_stages) * shape.seqlen_q / 1024


def early_fast(cfg, shape):
    """Timings whose fastest configs come first in the space's order."""
    return 2.0 - fwd_ms(cfg, shape) * 1024 / shape.seqlen_q


class Runner(ReplayRunner):
    """Deterministic timings from the config; ``lose_first``: the first measurement loses the worker."""

    def __init__(self, timed=None, lose_first=False, gated_fail=False, ms=fwd_ms):
        super().__init__(fn=self._fwd)
        self.ms = ms
        self.timings, self.timed, self.lose_first, self.gated_fail = [], timed, lose_first, gated_fail

    def _fwd(self, cfg, shape, budget=None):
        self.timings.append(cfg.to_json())
        if self.gated_fail and (budget is None or budget.get("gate")):  # rounds 2 and 3 fail: round 1 decides
            return {"status": "incorrect", "error": "gate failed (test)"}
        if self.timed is not None:
            self.timed.set()
        if self.lose_first and len(self.timings) == 1:
            raise WorkerLost("timing worker killed")
        ms = self.ms(cfg, shape)
        return {"status": "ok", "median_ms": ms, "times_ms": [ms, ms]}


@pytest.fixture
def gated_sweep(monkeypatch):
    """The static phase's compile results arrive in two halves: the second only once a worker has timed a config
    (or after 20 s). ``state["early"]``: whether one had."""
    import rocmflash.static.compile as C

    real, state = C.sweep, {"event": threading.Event(), "early": "off"}  # None: gate the next sweep

    def sweep(configs, problem, gpu, cache_dir=None, workers=None, on_result=None, **kw):
        obs, stats = real(configs, problem, gpu, cache_dir=cache_dir, workers=workers, **kw)
        for i, record in enumerate(obs):
            if on_result is not None:
                on_result(record)
            if i == len(obs) // 2 and state["early"] is None:
                state["early"] = state["event"].wait(20)
        return obs, stats

    monkeypatch.setattr(C, "sweep", sweep)
    return state


def _tune(path, cache_dir, runners, stream, check_first_job=True):
    spec = TuneSpec(gpu="h100", head_dim=64, dtype="fp16", seqlens=[1024, 2048], space=SPACE, db_path=str(path),
                    cache_dir=cache_dir, workers=2, strategy="race", incumbent=False).validate()
    ctx = open_context(get_gpu("h100"), str(path), "replay", True, runners=runners)
    items = forward_items(ctx, spec, SPACE)
    events = []
    Pipeline(items, runners, stream=stream, on_event=events.append).run()
    first_job = min(e["t"] for e in events if e["event"] == "job_start")
    if check_first_job:
        assert (first_job < min(e["t"] for e in events if e["event"] == "static_done")) is stream
    entries = D.ConfigDB.read(str(path))["entries"]
    journal = D.Journal(D.journal_path(str(path)), "h100").records
    return {k: {f: v for f, v in e.items() if f != "when"} for k, e in entries.items()}, journal


def test_streamed_entries_equal_the_unstreamed_ones_and_timing_began_mid_compile(tmp_path, cache_dir, gated_sweep,
                                                                                monkeypatch):
    from rocmflash.tuning.items_fwd import ForwardItem

    ref, ref_journal = _tune(tmp_path / "ref" / "h100.json", cache_dir, [Runner()], stream=False)
    record = ForwardItem.record

    def journaled(self, job, result):  # the compiles go on once a result is journaled (its static rank unknown)
        record(self, job, result)
        gated_sweep["event"].set()

    monkeypatch.setattr(ForwardItem, "record", journaled)
    gated_sweep["early"] = None
    got, journal = _tune(tmp_path / "new" / "h100.json", cache_dir, [Runner()], stream=True)
    assert gated_sweep["early"] is True  # a survivor was journaled before the second half of the compiles arrived
    assert any(r.get("round") == 0 and r.get("static_rank") is None for r in journal)  # its record: no rank yet
    assert got == ref and len(got) == 2
    assert len(journal) == len(ref_journal)


def test_an_entry_read_from_streamed_round_one_records_has_their_static_ranks(tmp_path, cache_dir, gated_sweep,
                                                                               monkeypatch):
    """Every gated measurement fails, so the entry's best comes from round 1, journaled before the ranks were
    known (the fastest configs come first in compile order): the entry still names the winner's static rank,
    as without streaming."""
    from rocmflash.tuning.items_fwd import ForwardItem

    ref, _ = _tune(tmp_path / "ref" / "h100.json", cache_dir, [Runner(gated_fail=True, ms=early_fast)], stream=False)
    record = ForwardItem.record

    def journaled(self, job, result):
        record(self, job, result)
        gated_sweep["event"].set()

    monkeypatch.setattr(ForwardItem, "record", journaled)
    gated_sweep["early"] = None
    got, journal = _tune(tmp_path / "new" / "h100.json", cache_dir, [Runner(gated_fail=True, ms=early_fast)],
                         stream=True, check_first_job=False)
    assert gated_sweep["early"] is True
    assert any(r.get("round") == 0 and r.get("static_rank") is None for r in journal)
    assert all(e.get("best_static_rank") is not None for e in ref.values())
    assert got == ref and len(got) == 2


def test_a_worker_lost_mid_stream_repeats_only_its_config(tmp_path, cache_dir, gated_sweep):
    ref, _ = _tune(tmp_path / "ref" / "h100.json", cache_dir, [Runner()], stream=False)
    ref_calls = sum(1 for r in D.Journal(D.journal_path(str(tmp_path / "ref" / "h100.json")), "h100").records)
    gated_sweep["early"] = None
    lost, other = Runner(gated_sweep["event"], lose_first=True), Runner(gated_sweep["event"])
    got, journal = _tune(tmp_path / "new" / "h100.json", cache_dir, [lost, other], stream=True)
    assert gated_sweep["early"] is True
    assert len(lost.timings) == 1 and lost.timings[0] in other.timings  # only what was in flight is repeated
    assert len(lost.timings) + len(other.timings) == ref_calls + 1 == len(journal) + 1
    assert _without_workers(got) == _without_workers(ref) and len(got) == 2


def _without_workers(entries):
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in ("worker", "retried_after")}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x
    return clean(entries)


def test_survivor_stream_releases_exactly_the_pruners_survivors_in_any_arrival_order(tmp_path, cache_dir):
    from rocmflash.static.compile import sweep
    from rocmflash.static.prune import PruneSettings
    from rocmflash.tuning.spec import static_problem

    spec = TuneSpec(gpu="h100", head_dim=64, dtype="fp16", seqlens=[1024], space=SPACE, cache_dir=cache_dir,
                    workers=2, db_path=str(tmp_path / "x.json")).validate()
    gpu, problem = get_gpu("h100"), static_problem(spec.shape(1024))
    configs = SPACE.configs(problem, gpu)
    obs, _ = sweep(configs, problem, gpu, cache_dir=cache_dir, workers=2)
    verdicts = prune(obs, PruneSettings())
    kept = [i for i, v in enumerate(verdicts) if v.kept]
    assert kept
    for seed in range(5):
        order = list(range(len(configs)))
        random.Random(seed).shuffle(order)
        released = []
        stream = SurvivorStream(configs, PruneSettings(), lambda rel: released.extend(i for i, _, _ in rel))
        for i in order:
            stream.add(obs[i])
        assert released == kept  # compile order, whatever the arrival order
        assert [judge(obs[i]).reason for i in released] == [verdicts[i].reason for i in kept]
