"""Streamed static phases of the backward and decode families (issue #29), as the forward's: each certain survivor
is timed as its compile result arrives, while the rest of the problem still compiles.

What must hold, per family: a timing worker gets the first survivor before the item's last compile result arrives;
the entries are those of the same tune without streaming (deterministic fake timings); a worker lost mid-stream
repeats only what it had in flight; the configs released early are exactly those the finished static phase times,
in whatever order the compiles arrive -- and for the backward, every dQ config of an item is handed out before any
of its dK/dV configs (each dQ launch writes delta, which the dK/dV configs read).
"""

import dataclasses
import json
import random
import threading

import pytest

from conftest import synthetic_task_result
from rocmflash import db as D
from rocmflash.hw.gpus import get_gpu
from rocmflash.kernels.backward import host as BH
from rocmflash.static.prune import PruneSettings
from rocmflash.tuning import backward as TB
from rocmflash.tuning.decode import DecodeProblem, decode_space
from rocmflash.tuning.items import open_context
from rocmflash.tuning.items_bwd import backward_items, to_time
from rocmflash.tuning.items_decode import DecodeItem
from rocmflash.tuning.pipeline import Pipeline
from rocmflash.tuning.pool import WorkerLost
from rocmflash.tuning.runners import ReplayRunner
from rocmflash.tuning.spec import TuneSpec
from rocmflash.tuning.stream import SurvivorStream

GPU = "mi300x"
BWD = dict(gpu=GPU, head_dim=64, dtype="bf16", seqlens=[1024, 2048], causal=True, heads=8, kv_heads=2, workers=2,
           strategy="race")
DECODE = DecodeProblem(head_dim=64, dtype="bf16", heads_q=8, heads_kv=2, batch=4, seqlen_k=1024).validate()
DECODE_CONFIGS = decode_space("gfx942")[:6]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("stream-bwd-static-cache"))


def small_bwd(arch, head_dim):
    """Three configs per backward kernel and each kernel's default (the full space takes minutes on 2 cores)."""
    from rocmflash.kernels.backward.host import default_bwd_config

    default = default_bwd_config(arch, head_dim)
    points = TB.bwd_space(arch, head_dim) if small_bwd.full is None else small_bwd.full(arch, head_dim)
    out = []
    for kernel in TB.KERNELS:
        own = [p for p in points if p["kernel"] == kernel][:3]
        dflt = BH.space_point(kernel, getattr(default, kernel))
        out += own + ([dflt] if dflt not in own else [])
    return out


small_bwd.full = None


@pytest.fixture
def small_bwd_space(monkeypatch):
    small_bwd.full = TB.bwd_space
    monkeypatch.setattr(TB, "bwd_space", small_bwd)
    yield
    small_bwd.full = None


def task_result(task):
    """Deterministic synthetic results: backward (dK/dV at two head splits) or decode (three split counts)."""
    return synthetic_task_result(task, backward="kernel" in task["config"])


class TaskRunner(ReplayRunner):
    """Runs worker tasks from :func:`task_result`; ``timed``: set at each call; ``lose_first``: the first call
    loses the worker; the incumbent's task fails (no SDPA here)."""

    def __init__(self, timed=None, lose_first=False):
        super().__init__(fn=lambda cfg, shape: {"status": "failed", "error": "no forward here"})
        self.timed, self.lose_first, self.tasks = timed, lose_first, []

    def call(self, fn, task, timeout_s):
        if "backends" in task:
            return {"status": "failed", "error": "no incumbent in a replay"}
        self.tasks.append(task)
        if self.timed is not None:
            self.timed.set()
        if self.lose_first and len(self.tasks) == 1:
            raise WorkerLost("timing worker killed")
        return task_result(task)


@pytest.fixture
def gated_sweep(monkeypatch):
    """A family sweep's compile results arrive one by one; before the last one, the sweep waits (20 s at most)
    until a worker has timed a config. ``state["early"]``: whether one had (None: gate the next sweep)."""
    import rocmflash.static.compile as C

    real, state = C.sweep_family, {"event": threading.Event(), "early": "off"}

    def sweep_family(family, configs, problem, gpu, cache_dir=None, workers=None, on_result=None, **kw):
        obs, stats = real(family, configs, problem, gpu, cache_dir, workers, **kw)
        for i, record in enumerate(obs):
            if i == len(obs) - 1 and state["early"] is None:
                state["early"] = state["event"].wait(20)
            if on_result is not None:
                on_result(record)
        return obs, stats

    monkeypatch.setattr(C, "sweep_family", sweep_family)
    return state


def _entries(path):
    entries = D.ConfigDB.read(str(path))["entries"]
    return {k: {f: v for f, v in e.items() if f != "when"} for k, e in entries.items()}


def _journal(path):
    return D.Journal(D.journal_path(str(path)), GPU).records


def _tune_bwd(path, cache_dir, runners, stream):
    spec = TuneSpec(db_path=str(path), cache_dir=cache_dir, **BWD).validate()
    ctx = open_context(get_gpu(GPU), str(path), "replay", True, runners=runners)
    events = []
    Pipeline(backward_items(ctx, spec), runners, stream=stream, on_event=events.append).run()
    return _entries(path), events


def _tune_decode(path, cache_dir, runners, stream):
    ctx = open_context(get_gpu(GPU), str(path), "replay", True, runners=runners)
    events = []
    Pipeline([DecodeItem(ctx, DECODE, cache_dir, 2, 60.0, configs=DECODE_CONFIGS)], runners, stream=stream,
             on_event=events.append).run()
    return _entries(path), events


def _first_job_before_static_done(events):
    first_job = min(e["t"] for e in events if e["event"] == "job_start")
    return first_job < min(e["t"] for e in events if e["event"] == "static_done")


def _dq_before_dkdv(tasks):
    """Per backward problem (task order of one worker): every dQ task before the first dK/dV task."""
    by_problem: dict = {}
    for t in tasks:
        by_problem.setdefault(t["shape"]["seqlen_q"], []).append(t["config"]["kernel"])
    return all(k == sorted(k, key=TB.KERNELS.index) and k[0] == "dq" for k in by_problem.values()) and by_problem


# ----------------------------------------------------------------------------- backward
def test_backward_streams_dq_then_dkdv_and_its_entries_equal_the_unstreamed_ones(tmp_path, cache_dir,
                                                                                small_bwd_space, gated_sweep):
    ref_runner = TaskRunner()
    ref, ref_events = _tune_bwd(tmp_path / "ref" / "mi300x.json", cache_dir, [ref_runner], stream=False)
    assert not _first_job_before_static_done(ref_events)
    gated_sweep["early"] = None
    runner = TaskRunner(gated_sweep["event"])
    got, events = _tune_bwd(tmp_path / "new" / "mi300x.json", cache_dir, [runner], stream=True)
    assert gated_sweep["early"] is True  # a survivor was timed before the last compile result arrived
    assert _first_job_before_static_done(events)
    assert got == ref and len(got) == 2 and all(e["measured"] for e in got.values())
    assert _dq_before_dkdv(runner.tasks) and _dq_before_dkdv(ref_runner.tasks)
    assert sorted(map(str, runner.tasks)) == sorted(map(str, ref_runner.tasks))  # each config timed once, as before
    assert len(_journal(tmp_path / "new" / "mi300x.json")) == len(_journal(tmp_path / "ref" / "mi300x.json"))


def test_backward_worker_lost_mid_stream_repeats_only_its_config(tmp_path, cache_dir, small_bwd_space,
                                                                 gated_sweep):
    ref, _ = _tune_bwd(tmp_path / "ref" / "mi300x.json", cache_dir, [TaskRunner()], stream=False)
    gated_sweep["early"] = None
    lost, other = TaskRunner(gated_sweep["event"], lose_first=True), TaskRunner(gated_sweep["event"])
    got, _ = _tune_bwd(tmp_path / "new" / "mi300x.json", cache_dir, [lost, other], stream=True)
    assert gated_sweep["early"] is True
    assert len(lost.tasks) == 1 and lost.tasks[0] in other.tasks  # only what was in flight is repeated
    journal = _journal(tmp_path / "new" / "mi300x.json")
    assert len(other.tasks) == len(journal) == len(_journal(tmp_path / "ref" / "mi300x.json"))
    assert got == ref


def _bwd_observations(cache_dir, settings=None):
    from rocmflash.kernels.backward.host import default_bwd_config
    from rocmflash.static.compile import sweep_family

    from rocmflash.tuning.spec import static_problem

    gpu = get_gpu(GPU)
    spec = TuneSpec(db_path="x.json", cache_dir=cache_dir, **BWD).validate()
    problem = dataclasses.replace(static_problem(spec.shape(1024)), batch=1)  # as BackwardItem's static phase
    configs = small_bwd("gfx942", 64)
    obs, _ = sweep_family("backward", configs, problem.to_dict(), gpu, cache_dir, 2)
    default = default_bwd_config("gfx942", 64)
    defaults = {k: BH.space_point(k, getattr(default, k)) for k in TB.KERNELS}
    return gpu, problem, configs, obs, defaults


@pytest.mark.parametrize("settings", [PruneSettings(), PruneSettings(occupancy_floor=99)],
                         ids=["default", "everything-pruned"])
def test_backward_stream_releases_exactly_the_configs_timed_in_any_arrival_order(cache_dir, settings):
    """The released configs are the finished static phase's race field (every survivor per kernel, a "kept
    anyway" config where a kernel's were all pruned, each kernel's default), dQ before dK/dV, whatever the
    order the compiles arrive in -- also where every binary is the same (one survivor per kernel)."""
    gpu, problem, configs, obs, defaults = _bwd_observations(cache_dir)
    for same_binary in (False, True):
        if same_binary:
            obs = [dict(o, binary_sha256="same") for o in obs]
        static = TB.BwdStatic(problem, TB.rank_each_kernel(gpu, configs, obs, settings), None)
        field = to_time(static, "race", None, defaults)
        for seed in range(5):
            order = list(range(len(configs)))
            random.Random(seed).shuffle(order)
            released = []
            stream = SurvivorStream(configs, settings, lambda rel: released.extend(i for i, _, _ in rel),
                                    group=lambda c: c["kernel"], stages=TB.KERNELS, settle=True,
                                    always=tuple(defaults.values()))
            for i in order:
                stream.add(obs[i])
            got = [configs[i] for i in released]
            assert sorted(map(str, got)) == sorted(map(str, field)) and len(got) == len(field)
            kernels = [c["kernel"] for c in got]
            assert kernels == sorted(kernels, key=TB.KERNELS.index)
            assert all(stream.needs(i) >= i + 1 for i in released)


def test_a_default_outside_the_compiled_configs_holds_the_later_kernels_back(cache_dir):
    """A default with no observation (not in the space compiled) is timed after the static phase: no dK/dV config
    may be released before it, or a dK/dV job would run before a dQ job."""
    gpu, problem, configs, obs, defaults = _bwd_observations(cache_dir)
    dq_default = dict(defaults["dq"], BLOCK_M=defaults["dq"]["BLOCK_M"] * 1000)  # in no space
    released = []
    stream = SurvivorStream(configs, PruneSettings(), lambda rel: released.extend(i for i, _, _ in rel),
                            group=lambda c: c["kernel"], stages=TB.KERNELS, settle=True,
                            always=(dq_default, defaults["dkdv"]))
    for o in obs:
        stream.add(o)
    assert released and {configs[i]["kernel"] for i in released} == {"dq"}


# ----------------------------------------------------------------------------- decode
def test_decode_streams_and_its_entry_equals_the_unstreamed_one(tmp_path, cache_dir, gated_sweep):
    ref_runner = TaskRunner()
    ref, ref_events = _tune_decode(tmp_path / "ref" / "mi300x.json", cache_dir, [ref_runner], stream=False)
    assert not _first_job_before_static_done(ref_events)
    gated_sweep["early"] = None
    runner = TaskRunner(gated_sweep["event"])
    got, events = _tune_decode(tmp_path / "new" / "mi300x.json", cache_dir, [runner], stream=True)
    assert gated_sweep["early"] is True
    assert _first_job_before_static_done(events)
    assert got == ref and len(got) == 1 and all(e["measured"] for e in got.values())
    assert sorted(map(str, runner.tasks)) == sorted(map(str, ref_runner.tasks))
    assert len(_journal(tmp_path / "new" / "mi300x.json")) == len(_journal(tmp_path / "ref" / "mi300x.json"))


def test_decode_worker_lost_mid_stream_repeats_only_its_config(tmp_path, cache_dir, gated_sweep):
    ref, _ = _tune_decode(tmp_path / "ref" / "mi300x.json", cache_dir, [TaskRunner()], stream=False)
    gated_sweep["early"] = None
    lost, other = TaskRunner(gated_sweep["event"], lose_first=True), TaskRunner(gated_sweep["event"])
    got, _ = _tune_decode(tmp_path / "new" / "mi300x.json", cache_dir, [lost, other], stream=True)
    assert gated_sweep["early"] is True
    assert len(lost.tasks) == 1 and lost.tasks[0] in other.tasks
    assert len(other.tasks) == len(_journal(tmp_path / "new" / "mi300x.json"))
    assert got == ref


@pytest.mark.parametrize("settings", [PruneSettings(), PruneSettings(occupancy_floor=99)],
                         ids=["default", "everything-pruned"])
def test_decode_stream_releases_exactly_the_survivors_in_any_arrival_order(cache_dir, settings):
    from rocmflash.static.compile import sweep_family
    from rocmflash.static.families import family_rows
    from rocmflash.static.prune import prune

    gpu = get_gpu(GPU)
    obs, _ = sweep_family("decode", DECODE_CONFIGS, DECODE.to_dict(), gpu, cache_dir, 2)
    rows = family_rows(DECODE_CONFIGS, obs, prune(obs, settings), lambda c, o, i: i)
    survivors = [r["config"] for r in rows if r["kept"]]
    assert survivors
    for seed in range(5):
        order = list(range(len(DECODE_CONFIGS)))
        random.Random(seed).shuffle(order)
        released = []
        stream = SurvivorStream(DECODE_CONFIGS, settings, lambda rel: released.extend(i for i, _, _ in rel),
                                settle=True)
        for i in order:
            stream.add(obs[i])
        assert [DECODE_CONFIGS[i] for i in released] == survivors  # compile order: one group, no stage waits


def test_a_resumed_decode_tune_times_only_what_the_journal_lacks(tmp_path, cache_dir, gated_sweep):
    """--resume: configs journaled by an interrupted run are not timed again, streamed or not; the entry is the
    same."""
    ref, _ = _tune_decode(tmp_path / "ref" / "mi300x.json", cache_dir, [TaskRunner()], stream=False)
    path = tmp_path / "new" / "mi300x.json"
    _tune_decode(path, cache_dir, [TaskRunner()], stream=True)
    journal = _journal(path)
    keep = [r for r in journal if r.get("family") == "decode"][:2]
    with open(D.journal_path(str(path))) as f:
        header = f.readline()
    with open(D.journal_path(str(path)), "w") as f:  # as if the run stopped after two results
        f.write(header)
        f.writelines(json.dumps(r) + "\n" for r in keep)
    again = TaskRunner()
    got, _ = _tune_decode(path, cache_dir, [again], stream=True)
    assert len(again.tasks) == len(journal) - 2
    assert {str(t["config"]) for t in again.tasks}.isdisjoint({str(r["config"]) for r in keep})
    assert got == ref
