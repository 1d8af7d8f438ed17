"""Kernel families as pipeline items (issue #29), without a GPU.

The static phases are real (small spaces cross-compiled on this CPU, cached per module); the
timing workers are replays serving synthetic timings. What must hold: each family's item gives
the database entry its tune gave on the same results; the items of a plan interleave on two
workers (a decode job runs before the last forward round ends); every family's results are
journaled, so a re-run (``--resume``) times nothing twice.
"""

import json
import time

import pytest

from conftest import synthetic_task_result
from rocmflash.hw.gpus import get_gpu
from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
from rocmflash import db as D
from rocmflash.tuning import backward as TB
from rocmflash.tuning.decode import DecodeProblem, decode_space
from rocmflash.tuning.items import open_context
from rocmflash.tuning.items_bwd import backward_items
from rocmflash.tuning.items_decode import DecodeItem
from rocmflash.tuning.items_fwd import forward_items
from rocmflash.tuning.runners import ReplayRunner
from rocmflash.tuning.spec import TuneSpec

SPACE = ConfigSpace({"online": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4, 8],
                                "num_stages": [2, 3]}}, DEFAULT_RESTRICTIONS)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("items-static-cache"))


@pytest.fixture
def small_bwd_space(monkeypatch):
    """Four configs per backward kernel (the full space takes minutes to cross-compile on 2 cores)."""
    full = TB.bwd_space

    def small(arch, head_dim):
        points = full(arch, head_dim)
        return [p for p in points if p["kernel"] == "dq"][:4] + [p for p in points if p["kernel"] == "dkdv"][:4]

    monkeypatch.setattr(TB, "bwd_space", small)


def fwd_ms(cfg, shape):
    return (1.0 + 0.3 * (cfg.BLOCK_M == 64) + 0.1 * (cfg.BLOCK_N == 32) - 0.02 * (cfg.num_warps == 8)
            - 0.005 * cfg.num_stages) * shape.seqlen_q / 1024


def task_result(fn, task):
    """A synthetic worker-task result: backward (per kernel, dK/dV at several head splits) or decode."""
    return synthetic_task_result(task, backward=fn is TB.measure_bwd)


class Recorded(ReplayRunner):
    """A replay that also runs worker tasks (backward, decode, the incumbent) from synthetic results."""

    def __init__(self, name="replay", sleep=0.0, log=None):
        super().__init__(fn=lambda cfg, shape: self._fwd(cfg, shape))
        self.name, self.sleep, self.log = name, sleep, log
        self.tasks = []

    def _fwd(self, cfg, shape):
        if self.log is not None:
            self.log.append(("fwd", shape.dtype, time.perf_counter()))
        time.sleep(self.sleep)
        ms = fwd_ms(cfg, shape)
        return {"status": "ok", "median_ms": ms, "times_ms": [ms, ms]}

    def call(self, fn, task, timeout_s):
        self.tasks.append(task)
        if self.log is not None:
            self.log.append((fn.__name__, (task.get("problem") or task.get("shape"))["dtype"], time.perf_counter()))
        time.sleep(self.sleep)
        if fn is TB.measure_bwd or fn.__name__ == "measure_decode":
            return dict(task_result(fn, task), worker=self.name)
        return {"status": "failed", "error": "no incumbent in a replay"}


class Pool:
    """A stand-in for WorkerPool with the runner interface the old entry points take."""

    def __init__(self, runner):
        self.runners, self.device, self.parallelism = [runner], "replay", None
        from rocmflash.tuning.pool import WorkerStats

        self.stats = [WorkerStats("r0")]

    def call(self, fn, task, timeout_s):
        return self.runners[0].call(fn, task, timeout_s)

    def prewarm_tasks(self, tasks, fn, timeout_s):
        pass


def drive(items, runner):
    """The smallest scheduler: every static phase, then each item's batches in turn on one runner."""
    for item in items:
        item.static()
    for item in items:
        while True:
            batch = item.next_batch()
            if batch is None:
                break
            for job in batch:
                item.record(job, job.run(runner))
        item.finish(True)


def without_when(entry):
    return {k: v for k, v in entry.items() if k != "when"}


def fwd_spec(path, cache_dir, **kw):
    base = dict(gpu="h100", head_dim=64, dtype="fp16", seqlens=[1024, 2048], space=SPACE, db_path=str(path),
                cache_dir=cache_dir, workers=2, strategy="race", incumbent=False)
    base.update(kw)
    return TuneSpec(**base).validate()


def context(path, runner, gpu="h100"):
    return open_context(get_gpu(gpu), str(path), "replay", True, runners=[runner])


# ----------------------------------------------------------------------------- one item = today's tune
@pytest.mark.parametrize("strategy", ["race", "pruned", "exhaustive"])
def test_forward_item_gives_the_entry_of_the_forward_tune(tmp_path, cache_dir, strategy):
    from rocmflash.tuning.run import tune

    old = tune(fwd_spec(tmp_path / "old" / "h100.json", cache_dir, strategy=strategy), runner=Recorded())
    ctx = context(tmp_path / "new" / "h100.json", Recorded())
    items = forward_items(ctx, fwd_spec(tmp_path / "new" / "h100.json", cache_dir, strategy=strategy), SPACE)
    drive(items, Recorded())
    assert [i.key for i in items] == [o.key for o in old.outcomes]
    for item, outcome in zip(items, old.outcomes):
        assert without_when(item.outcome.entry) == without_when(outcome.entry)
        assert item.outcome.timed_now == outcome.timed_now > 0
    new = D.ConfigDB.read(str(tmp_path / "new" / "h100.json"))["entries"]
    assert {k: without_when(e) for k, e in new.items()} == {o.key: without_when(o.entry) for o in old.outcomes}


def test_backward_item_gives_the_entry_of_the_backward_tune(tmp_path, cache_dir, small_bwd_space):
    from rocmflash.tuning.backward_run import tune_backward

    spec = dict(gpu="mi300x", head_dim=64, dtype="bf16", seqlens=[1024, 2048], causal=True, heads=8, kv_heads=2,
                cache_dir=cache_dir, workers=2)
    old_runner = Recorded()
    old = tune_backward(TuneSpec(db_path=str(tmp_path / "old" / "mi300x.json"), **spec).validate(),
                        pool=Pool(old_runner))
    runner = Recorded()
    ctx = context(tmp_path / "new" / "mi300x.json", runner, "mi300x")
    items = backward_items(ctx, TuneSpec(db_path=str(tmp_path / "new" / "mi300x.json"), **spec).validate())
    drive(items, runner)
    assert [i.key for i in items] == [o.key for o in old.outcomes] == ["bwd-d64-bf16-causal-gqa4-s1024",
                                                                       "bwd-d64-bf16-causal-gqa4-s2048"]
    for item, outcome in zip(items, old.outcomes):
        assert outcome.entry["measured"] and without_when(item.entry) == without_when(outcome.entry)
        assert [r["config"] for r in item.outcome().results] == [r["config"] for r in outcome.results]
    # every dQ job ran before the first dK/dV job of its problem (dQ writes delta)
    kernels = [t["config"]["kernel"] for t in runner.tasks]
    half = len(kernels) // 2
    for part in (kernels[:half], kernels[half:]):
        assert part == sorted(part, key=TB.KERNELS.index) and part[0] == "dq"
    assert kernels == [t["config"]["kernel"] for t in old_runner.tasks]


class Prewarming(Recorded):
    """A replay runner that also pre-warms worker tasks (records them), as a live runner does."""

    def __init__(self):
        super().__init__()
        self.prewarmed = []

    def prewarm_tasks(self, tasks, fn, timeout_s):
        self.prewarmed.append([t["config"].get("kernel") for t in tasks])


def test_backward_item_prewarms_its_inputs_forward_first(tmp_path, cache_dir, small_bwd_space):
    """Each backward problem pre-warms what its measurements' inputs are made with (the forward and delta: a
    worker's first backward job compiled them) once, beside its static phase, before any config's pre-warm."""
    spec = dict(gpu="mi300x", head_dim=64, dtype="bf16", seqlens=[1024, 2048], causal=True, heads=8, kv_heads=2,
                cache_dir=cache_dir, workers=2)
    runner = Prewarming()
    ctx = open_context(get_gpu("mi300x"), str(tmp_path / "mi300x.json"), "replay", True, prewarmer=runner,
                       runners=[runner], interpret=False)
    items = backward_items(ctx, TuneSpec(db_path=str(tmp_path / "mi300x.json"), **spec).validate())
    for item in items:
        before = len(runner.prewarmed)
        item.static()
        calls = runner.prewarmed[before:]
        assert calls[0] == [TB.INPUTS], calls
        assert sum(batch.count(TB.INPUTS) for batch in calls) == 1
        assert any(set(batch) <= {"dq", "dkdv"} and batch for batch in calls[1:]), calls
    spec_off = TuneSpec(db_path=str(tmp_path / "off.json"), prewarm=False, **spec).validate()
    runner_off = Prewarming()
    ctx_off = open_context(get_gpu("mi300x"), str(tmp_path / "off.json"), "replay", True, prewarmer=runner_off,
                           runners=[runner_off], interpret=False)
    for item in backward_items(ctx_off, spec_off):
        item.static()
    assert all(TB.INPUTS not in batch for batch in runner_off.prewarmed)


def test_decode_item_gives_the_entry_of_the_decode_tune(tmp_path, cache_dir):
    from rocmflash.tuning.decode_run import tune_decode

    configs = decode_space("gfx942")[:6]
    problem = DecodeProblem(head_dim=64, dtype="bf16", heads_q=8, heads_kv=2, batch=4, seqlen_k=1024).validate()
    old = tune_decode("mi300x", problem, str(tmp_path / "old" / "mi300x.json"), cache_dir, 2, 60.0, configs=configs,
                      pool=Pool(Recorded()))
    runner = Recorded()
    ctx = context(tmp_path / "new" / "mi300x.json", runner, "mi300x")
    item = DecodeItem(ctx, problem, cache_dir, 2, 60.0, configs=configs)
    drive([item], runner)
    assert old.entry["measured"] and without_when(item.entry) == without_when(old.entry)
    result = item.result(str(tmp_path / "new" / "mi300x.json"))
    assert result.key == old.key and [r["config"] for r in result.results] == [r["config"] for r in old.results]
    new = D.ConfigDB.read(str(tmp_path / "new" / "mi300x.json"))["entries"]
    assert without_when(new[old.key]) == without_when(old.entry)


# ----------------------------------------------------------------------------- a whole plan, one pipeline
@pytest.fixture
def small_spaces(monkeypatch, small_bwd_space):
    """The plan's spaces cut down to a few configs each (cross-compiled for real, on this CPU)."""
    import rocmflash.static.space
    from rocmflash.tuning import decode as TD

    monkeypatch.setattr(rocmflash.static.space, "default_space", lambda gpu, variants=None: SPACE)
    full = TD.decode_space
    monkeypatch.setattr(TD, "decode_space", lambda arch: full(arch)[:4])


def small_plan(dtypes=("fp16", "bf16"), seqlens=(1024, 2048)):
    from rocmflash.tuning.models import ModelAttention
    from rocmflash.tuning.plan import make_plan

    model = ModelAttention("tiny", head_dim=64, heads_q=8, heads_kv=2)
    return make_plan(model, get_gpu("h100"), list(dtypes), list(seqlens), decode_batch=4)


def test_a_model_plan_runs_in_one_pipeline_and_its_families_interleave(tmp_path, cache_dir, small_spaces):
    from rocmflash.tuning.model_run import tune_model
    from rocmflash.tuning.pool import WorkerPool

    plan = small_plan()
    # no GPU here: the static phases only (which fills the compile cache), every entry unmeasured
    static = tune_model(plan, None, str(tmp_path / "static.json"), cache_dir=cache_dir, workers=2, seeds=False,
                        progress=False)
    assert not static.measured and "no live GPU" in static.why_unmeasured and static.workers == []
    unmeasured = D.ConfigDB.read(str(tmp_path / "static.json"))["entries"]
    assert set(unmeasured) == {p.key for p in plan.problems} and not any(e["measured"] for e in unmeasured.values())

    log = []
    pool = WorkerPool([Recorded("gpu0", 0.05, log), Recorded("gpu1", 0.05, log)], labels=["gpu0", "gpu1"])
    db = str(tmp_path / "h100.json")
    result = tune_model(plan, pool, db, cache_dir=cache_dir, workers=2, seeds=False, progress=False)
    entries = D.ConfigDB.read(db)["entries"]
    assert set(entries) == {p.key for p in plan.problems} and len(entries) == 12
    assert all(e["measured"] for e in entries.values())
    assert result.measured and [len(r.outcomes) for r in result.forward] == [2, 2]
    assert [len(r.outcomes) for r in result.backward] == [2, 2] and len(result.decode) == 4
    assert [r.entry for r in result.decode] == [entries[r.key] for r in result.decode]
    assert {s.label for s in result.workers} == {"gpu0", "gpu1"} and all(s.done > 0 for s in result.workers)
    records = D.Journal(str(tmp_path / "h100.journal.jsonl"), "h100").records
    assert {r.get("family", "fwd") for r in records} == {"fwd", "bwd", "decode"}
    # each forward and decode winner's incumbent timing ran as one more job on a timing worker (not journaled)
    assert sum(s.done for s in result.workers) == len(records) + 4 + 4
    assert all(entries[o.key]["incumbent"]["error"] == "failed: no incumbent in a replay"
               for r in result.forward for o in r.outcomes)
    # no barrier between passes: within a dtype, backward jobs ran before its forward ended
    for dtype in ("fp16", "bf16"):
        fwd_end = max(t for what, d, t in log if what == "fwd" and d == dtype)
        assert min(t for what, d, t in log if what == "measure_bwd" and d == dtype) < fwd_end
    # every family is journaled: a re-run times nothing and writes the same entries
    again = WorkerPool([Recorded("gpu0"), Recorded("gpu1")], labels=["gpu0", "gpu1"])
    tune_model(plan, again, db, cache_dir=cache_dir, workers=2, seeds=False, progress=False)
    assert not any(r.calls for r in again.runners)  # no forward config ...
    assert all("backends" in t for r in again.runners for t in r.tasks)  # ... nor backward/decode: incumbents only
    assert {k: without_when(e) for k, e in D.ConfigDB.read(db)["entries"].items()} == \
        {k: without_when(e) for k, e in entries.items()}


def test_a_decode_job_runs_before_the_last_forward_round_ends(tmp_path, cache_dir, small_spaces):
    """Forward and decode of one problem on two workers: each race round ends with one config in flight, and
    the idle worker takes a decode config meanwhile (a barrier between passes would leave it idle)."""
    from rocmflash.tuning.model_run import tune_model
    from rocmflash.tuning.models import ModelAttention
    from rocmflash.tuning.plan import make_plan

    plan = make_plan(ModelAttention("tiny", head_dim=64, heads_q=8, heads_kv=2), get_gpu("h100"), ["fp16"], [1024],
                     passes=("fwd",), decode_batch=4)
    tune_model(plan, None, str(tmp_path / "static.json"), cache_dir=cache_dir, workers=2, seeds=False,
               progress=False)  # the static phases into the compile cache (no GPU here)
    log = []
    runners = [Recorded("gpu0", 0.1, log), Recorded("gpu1", 0.1, log)]
    from rocmflash.tuning.pool import WorkerPool

    result = tune_model(plan, WorkerPool(runners, labels=["gpu0", "gpu1"]), str(tmp_path / "h100.json"),
                        cache_dir=cache_dir, workers=2, seeds=False, progress=False)
    assert [len(r.outcomes) for r in result.forward] == [1] and len(result.decode) == 1
    fwd_end = max(t for what, _, t in log if what == "fwd")
    assert min(t for what, _, t in log if what == "measure_decode") < fwd_end
    assert result.forward[0].outcomes[0].entry["complete"] and result.decode[0].entry["measured"]


class StopAfter(Recorded):
    """Ctrl-C while the task after the first ``n`` is timed."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def call(self, fn, task, timeout_s):
        if len(self.tasks) == self.n:
            raise KeyboardInterrupt
        return super().call(fn, task, timeout_s)


def _same_tasks(a: list, b: list) -> bool:
    """The same tasks, each as often, in any order."""
    return sorted(json.dumps(t, sort_keys=True) for t in a) == sorted(json.dumps(t, sort_keys=True) for t in b)


def test_backward_and_decode_resume_from_the_journal_timing_nothing_twice(tmp_path, cache_dir, small_bwd_space):
    from rocmflash.tuning.backward_run import tune_backward
    from rocmflash.tuning.decode_run import tune_decode

    def bwd_spec(where, **kw):
        return TuneSpec(gpu="mi300x", head_dim=64, dtype="bf16", seqlens=[1024], causal=True, heads=8, kv_heads=2,
                        cache_dir=cache_dir, workers=2, db_path=str(tmp_path / where / "mi300x.json"), **kw)

    whole = Recorded()
    ref = tune_backward(bwd_spec("ref"), pool=Pool(whole))
    stopped = StopAfter(3)
    with pytest.raises(KeyboardInterrupt):
        tune_backward(bwd_spec("cut"), pool=Pool(stopped))
    cut = D.ConfigDB.read(str(tmp_path / "cut" / "mi300x.json"))["entries"][ref.outcomes[0].key]
    assert cut["measured"] is False and cut["counts"]["timed"] == 3  # what the journal held, no more
    assert cut["complete"] is False and ref.outcomes[0].entry["complete"] is True
    rest = Recorded()
    res = tune_backward(bwd_spec("cut", resume=True), pool=Pool(rest))
    # the resumed run times exactly what the cut one had not (streamed survivors become ready in the order their
    # pre-warms end, so the order of the jobs is not fixed; the set of them is)
    assert len(rest.tasks) == len(whole.tasks) - 3 and _same_tasks(stopped.tasks + rest.tasks, whole.tasks)
    assert without_when(res.outcomes[0].entry) == without_when(ref.outcomes[0].entry)

    configs = decode_space("gfx942")[:5]
    problem = DecodeProblem(head_dim=64, dtype="bf16", heads_q=8, heads_kv=2, batch=4, seqlen_k=2048).validate()
    whole = Recorded()
    ref = tune_decode("mi300x", problem, str(tmp_path / "ref" / "mi300x.json"), cache_dir, 2, configs=configs,
                      pool=Pool(whole))
    db = str(tmp_path / "cut" / "mi300x.json")
    stopped = StopAfter(2)
    with pytest.raises(KeyboardInterrupt):
        tune_decode("mi300x", problem, db, cache_dir, 2, configs=configs, pool=Pool(stopped))
    cut = D.ConfigDB.read(db)["entries"][ref.key]
    # the best of what was timed is served (as the forward's), and the entry says a re-run has more to time
    assert cut["counts"]["timed"] == 2 and cut["measured"] is True and cut["complete"] is False
    assert ref.entry["complete"] is True
    rest = Recorded()
    res = tune_decode("mi300x", problem, db, cache_dir, 2, configs=configs, pool=Pool(rest))
    assert len(rest.tasks) == len(whole.tasks) - 2 and len(whole.tasks) > 2
    assert _same_tasks(stopped.tasks + rest.tasks, whole.tasks)
    assert without_when(res.entry) == without_when(ref.entry)
    # a journal of every family still replays its forward results (backward/decode records are skipped)
    assert ReplayRunner.from_journal(str(tmp_path / "cut" / "mi300x.journal.jsonl")).results == {}


def test_varlen_item_times_survivors_and_the_baseline_and_resumes(tmp_path, cache_dir, monkeypatch):
    """The varlen forward as an item: every survivor and the config served before, one worker task each,
    journaled; the fastest wins, and a re-run times nothing."""
    from rocmflash.config import KernelConfig as K
    from rocmflash.tuning import varlen as TV
    from rocmflash.tuning.items_varlen import VarlenItem
    from rocmflash.tuning.varlen_worker import measure_varlen

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))  # no dense entry: the baseline is the per-arch default
    configs = [K(BLOCK_M=m, BLOCK_N=n, num_warps=4, num_stages=1, waves_per_eu=2).to_dict()
               for m, n in ((32, 16), (64, 32), (64, 16))]
    problem = TV.VarlenProblem(head_dim=32, dtype="fp16", heads_q=4, heads_kv=2, causal=True, lengths=(5, 40, 19))

    def ms(c):
        return 0.5 + 0.001 * c["BLOCK_M"] - 0.002 * c["BLOCK_N"]

    class Varlen(Recorded):
        def call(self, fn, task, timeout_s):
            assert fn is measure_varlen
            self.tasks.append(task)
            return {"config": task["config"], "status": "ok", "time_ms": ms(task["config"]), "tflops": 1.0,
                    "rel_err": 1e-3}

    db = tmp_path / "mi250.json"
    first = Varlen()
    # the configs alone (the incumbent's job after them: tests/test_varlen_tune_incumbent.py)
    item = VarlenItem(context(db, first, "mi250"), problem, cache_dir, 2, 60.0, configs, incumbent=False)
    drive([item], first)
    timed = [t["config"] for t in first.tasks]
    assert timed == [r["config"] for r in item.static_result.ranked] + [item.baseline["config"]]
    assert item.baseline["config"] not in configs and item.entry["measured"]
    assert item.entry["best"] == min(timed, key=ms) and item.entry["counts"]["timed"] == len(timed)
    assert item.entry["baseline"]["time_ms"] == round(ms(item.baseline["config"]), 5)
    again = Varlen()
    second = VarlenItem(context(db, again, "mi250"), problem, cache_dir, 2, 60.0, configs, incumbent=False)
    drive([second], again)
    assert again.tasks == [] and without_when(second.entry) == without_when(item.entry)
    assert D.ConfigDB.read(str(db))["entries"][problem.key()]["best"] == item.entry["best"]


class InterruptAfter(Recorded):
    """Ctrl-C while the forward measurement after the first ``n`` runs."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def _fwd(self, cfg, shape):
        if len(self.calls) > self.n:
            raise KeyboardInterrupt
        return super()._fwd(cfg, shape)


def test_ctrl_c_in_a_model_tune_keeps_the_journal_and_a_rerun_finishes_it(tmp_path, cache_dir, small_spaces):
    from rocmflash.tuning.model_run import tune_model

    plan = small_plan(dtypes=("fp16",), seqlens=(1024,))
    ref_db, db = str(tmp_path / "ref" / "h100.json"), str(tmp_path / "cut" / "h100.json")
    whole = Recorded()
    tune_model(plan, Pool(whole), ref_db, cache_dir=cache_dir, workers=2, seeds=False, progress=False)
    with pytest.raises(KeyboardInterrupt):
        tune_model(plan, Pool(InterruptAfter(5)), db, cache_dir=cache_dir, workers=2, seeds=False, progress=False)
    D.tune_lock(db).release()  # released on the way out
    key = plan.problems[0].key
    cut = D.ConfigDB.read(db)["entries"][key]
    assert cut["complete"] is False and cut["counts"]["timed"] == 5  # exactly what the journal holds
    rest = Recorded()
    tune_model(plan, Pool(rest), db, cache_dir=cache_dir, workers=2, seeds=False, progress=False, resume=True)
    assert len(rest.calls) == len(whole.calls) - 5 and len(rest.tasks) == len(whole.tasks)
    ref = D.ConfigDB.read(ref_db)["entries"]
    got = D.ConfigDB.read(db)["entries"]
    assert got[key]["complete"] is True
    assert {k: without_when(e) for k, e in got.items()} == {k: without_when(e) for k, e in ref.items()}


def test_pass_both_is_one_pipeline_whose_backward_entries_match_the_backward_tune(tmp_path, cache_dir,
                                                                                   small_bwd_space, monkeypatch):
    """``tune --pass both``: the forward and backward problems in ONE pipeline on two workers (a backward job runs
    before the forward's last), each backward entry what the backward tune alone writes on the same results."""
    from rocmflash.tuning import run as R
    from rocmflash.tuning.backward_run import tune_backward
    from rocmflash.tuning.pool import WorkerPool

    pipelines = []
    real = R.run_items

    def spy(items, *args, **kwargs):
        pipelines.append(sorted({i.family for i in items}))
        return real(items, *args, **kwargs)

    monkeypatch.setattr(R, "run_items", spy)
    from rocmflash.tuning.items import TRACE_ENV

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(trace))  # the pipeline's events, as a device run records them
    pool = WorkerPool([Recorded("gpu0", 0.02), Recorded("gpu1", 0.02)], labels=["gpu0", "gpu1"])
    result = R.tune(fwd_spec(tmp_path / "both" / "h100.json", cache_dir, causal=True, seqlens=[1024]), runner=pool,
                    progress=False, backward=True)
    assert pipelines == [["bwd", "fwd"]]  # one pipeline for both passes
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    bwd_start = next(e["t"] for e in events if e["event"] == "static_start" and e["item"].startswith("bwd-"))
    fwd_end = max(e["t"] for e in events if e["event"] == "job_done" and not e["item"].startswith("bwd-"))
    assert bwd_start < fwd_end  # the backward's static phase ran beside the forward's timing: no barrier
    assert {e["worker"] for e in events if e["event"] == "job_done"} == {"gpu0", "gpu1"}
    assert [o.entry["measured"] for o in result.outcomes] == [True]
    (bwd,) = result.backward_outcomes
    alone = tune_backward(fwd_spec(tmp_path / "alone" / "h100.json", cache_dir, causal=True, seqlens=[1024]),
                          pool=Pool(Recorded()))
    assert bwd.entry["measured"] and without_when(bwd.entry) == without_when(alone.outcomes[0].entry)
    entries = D.ConfigDB.read(str(tmp_path / "both" / "h100.json"))["entries"]
    assert set(entries) == {result.outcomes[0].key, bwd.key}


def test_work_estimates_order_a_plan_largest_first(tmp_path, cache_dir):
    """The priority of a plan on several workers (pipeline.largest_first): the backward by the work of one call
    (never below its reference size, where fixed costs dominate), above the forward race and the decode."""
    from rocmflash.tuning.items_bwd import BACKWARD_WORK_S
    from rocmflash.tuning.pipeline import largest_first

    ctx = context(tmp_path / "h100.json", Recorded())
    spec = fwd_spec(tmp_path / "h100.json", cache_dir, head_dim=128, dtype="bf16", heads=32, kv_heads=8,
                    causal=True, seqlens=[1024, 2048, 8192])
    fwd, bwd = forward_items(ctx, spec, SPACE), backward_items(ctx, spec)
    problem = DecodeProblem(head_dim=128, dtype="bf16", heads_q=32, heads_kv=8, batch=32, seqlen_k=2048).validate()
    dec = DecodeItem(ctx, problem)
    assert [round(i.work_s(), 1) for i in bwd] == [BACKWARD_WORK_S, BACKWARD_WORK_S, 48.9]  # 2.8x at 4x the work
    order = largest_first(fwd + [dec] + bwd)
    assert [i.key for i in order] == [bwd[2].key, bwd[0].key, bwd[1].key] + [i.key for i in fwd] + [dec.key]
    assert {i.static_group for i in fwd} == {fwd[0].static_group} and len({i.static_group for i in bwd}) == 1
