"""Warm re-tunes skip the pre-warms their cache already holds, and the pre-warm workers go once the static
phases are done (issue #29: 5-8 s at a warm tune's start, ~2.5 s of device-context teardown at its end)."""

import os
import types

from rocmflash.config import KernelConfig
from rocmflash.hw.roofline import Shape
from rocmflash.tuning import live, prewarm_record
from rocmflash.tuning.live import LiveRunner
from rocmflash.tuning.live_worker import LiveSettings

SHAPE = Shape(batch=1, heads_q=1, heads_kv=1, seqlen_q=16, seqlen_k=16, head_dim=16, dtype="fp16")
CONFIGS = [KernelConfig(BLOCK_M=16, BLOCK_N=n, num_warps=1, num_stages=1) for n in (16, 32)]


def test_markers_name_what_decides_the_binary(tmp_path):
    assert not prewarm_record.has_markers(str(tmp_path))
    assert prewarm_record.open_record(str(tmp_path), None) is None  # no live device: nothing to record
    rec = prewarm_record.open_record(str(tmp_path), "NVIDIA H100 80GB HBM3")
    d = rec.digest("fwd", [CONFIGS[0].to_dict(), SHAPE.to_dict()])
    assert d == rec.digest("fwd", [CONFIGS[0].to_dict(), SHAPE.to_dict()])
    others = {rec.digest("fwd", [CONFIGS[1].to_dict(), SHAPE.to_dict()]),
              rec.digest("bwd", [CONFIGS[0].to_dict(), SHAPE.to_dict()]),
              prewarm_record.open_record(str(tmp_path), "NVIDIA H200").digest("fwd", [CONFIGS[0].to_dict(),
                                                                                      SHAPE.to_dict()])}
    assert d not in others and len(others) == 3
    assert not rec.has(d)
    rec.add([d])
    assert rec.has(d) and prewarm_record.has_markers(str(tmp_path))
    assert os.listdir(tmp_path / prewarm_record.MARKERS) == [d]


def test_cache_root_follows_the_runner_then_the_environment(tmp_path, monkeypatch):
    assert prewarm_record.triton_cache_root(str(tmp_path)) == str(tmp_path)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "env"))
    assert prewarm_record.triton_cache_root(None) == str(tmp_path / "env")
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "home"))
    assert prewarm_record.triton_cache_root(None) == str(tmp_path / "home" / ".triton" / "cache")


def test_a_marked_build_is_not_prewarmed_again(tmp_path, monkeypatch):
    """The first pre-warm builds and marks each config; a second runner on the same cache (a re-tune) builds only
    what failed before, and starts no pre-warm process for a batch that is all marked."""
    built = []

    def prewarm_one(task):
        built.append(task["config"]["BLOCK_N"])
        return None if task["config"]["BLOCK_N"] == 16 else "out of resources"

    monkeypatch.setattr(live, "prewarm_one", prewarm_one)

    class InlinePool:  # pre-warm workers that run the build here
        def schedule(self, fn, task, timeout_s):
            return types.SimpleNamespace(result=lambda: fn(task))

        def close(self):
            pass

    def runner():
        r = LiveRunner(LiveSettings(timeout_s=60), triton_cache_dir=str(tmp_path))
        r._device = "NVIDIA H100 80GB HBM3"
        r.interpret = False
        r._task_prewarm = InlinePool()
        monkeypatch.setattr(r, "_get_pool", lambda: types.SimpleNamespace(schedule=lambda *a, **k: None))
        return r

    first = runner().prewarm(CONFIGS, SHAPE)
    assert built == [16, 32] and first[CONFIGS[0].to_json()] is None and first[CONFIGS[1].to_json()]
    again = runner()
    second = again.prewarm(CONFIGS, SHAPE)
    assert built == [16, 32, 32] and second[CONFIGS[0].to_json()] is None  # only the failed one again
    again._task_prewarm = None
    started = []
    monkeypatch.setattr(again, "_prewarm_workers", lambda: started.append(1))
    assert again.prewarm(CONFIGS[:1], SHAPE) == {CONFIGS[0].to_json(): None} and started == []

    tasks = [{"config": {"BLOCK_N": 16}}, {"config": {"BLOCK_N": 64}}]
    ran = []

    class TaskPool:
        def run(self, todo, fn, timeout_s):
            ran.append([t["config"]["BLOCK_N"] for t in todo])
            return [None for _ in todo]

    monkeypatch.setattr(again, "_prewarm_workers", lambda: TaskPool())
    again.prewarm_tasks(tasks, prewarm_one, 60)
    again.prewarm_tasks(tasks, prewarm_one, 60)
    assert ran == [[16, 64]]  # the second call finds both marked


def test_a_pre_warmed_cache_starts_its_prewarm_workers_lazily(tmp_path, monkeypatch):
    started = []
    r = LiveRunner(LiveSettings(timeout_s=60), triton_cache_dir=str(tmp_path))
    r.interpret = False
    monkeypatch.setattr(r, "_prewarm_workers", lambda: types.SimpleNamespace(start=lambda: started.append(1)))
    r.start_prewarm()
    assert started == [1]  # a cold cache: with the tune
    prewarm_record.open_record(str(tmp_path), "gpu").add(["x"])
    r.start_prewarm()
    assert started == [1]  # pre-warmed before: at the first build that needs it


def test_release_closes_the_prewarm_pool_in_the_background_and_close_waits_for_it():
    closed = []
    r = LiveRunner(LiveSettings(timeout_s=60))
    r._task_prewarm = types.SimpleNamespace(close=lambda: closed.append("pool"))
    r.release_prewarm()
    assert r._task_prewarm is None
    r.release_prewarm()  # nothing left to release
    r.close()
    assert closed == ["pool"] and r._closing == []


def test_the_pipeline_releases_the_prewarm_once_after_the_last_static_phase():
    from rocmflash.tuning.pipeline import Pipeline
    from test_pipeline import FakeItem, FakeRunner

    released, events = [], []
    items = [FakeItem("a", [[("a1", 1.0), ("a2", 2.0)]]), FakeItem("b", [[("b1", 1.0)]])]
    pipe = Pipeline(items, [FakeRunner("r")], compile_slots=1, on_event=events.append,
                    on_statics_done=lambda: released.append(len([e for e in events if e["event"] == "static_done"])))
    pipe.run()
    assert released == [2]  # once, when both static phases were done
    assert [e["event"] for e in events].count("statics_done") == 1
