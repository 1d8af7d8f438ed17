"""Strategies, resume, journal and database of `rocmflash tune` without a GPU.

The static phase is real (a small space cross-compiled on this CPU, cached per module);
the live phase is a replay runner serving synthetic timings, so every path of the tune
(pruned/exhaustive, failures never retried, Ctrl-C, resume, environments, locks) runs
in seconds.
"""

import json
import os

import pytest

from rocmflash import db as D
from rocmflash.config import KernelConfig
from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
from rocmflash.tuning import (NoLiveGPUError, ReplayRunner, TuneInterrupted, TuneSpec, choose, static_key,
                            static_phase, static_problem, tune)

SPACE = ConfigSpace({"online": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4, 8],
                                "num_stages": [2]}}, DEFAULT_RESTRICTIONS)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("static-cache"))


def fake_time(cfg, shape):
    """A synthetic GPU: bigger BLOCK_M and BLOCK_N are faster; 8 warps slightly faster."""
    ms = 1.0 + 0.3 * (cfg.BLOCK_M == 64) + 0.1 * (cfg.BLOCK_N == 32) - 0.02 * (cfg.num_warps == 8)
    return {"status": "ok", "median_ms": ms, "times_ms": [ms, ms * 1.01, ms * 0.99]}


def spec(tmp_path, cache_dir, **kw):
    base = dict(gpu="h100", head_dim=64, dtype="fp16", seqlens=[2048], space=SPACE, db_path=str(tmp_path / "h100.json") if tmp_path else None,
                cache_dir=cache_dir, workers=2, top_k=4, strategy="pruned")  # race: tests/test_tune_race.py
    base.update(kw)
    return TuneSpec(**base)


def journal(tmp_path, gpu="h100"):
    return D.Journal(str(tmp_path / f"{gpu}.journal.jsonl"), gpu).records


def test_static_key_orders_by_work_rows_per_warp_occupancy_registers():
    def obs(waves, vgprs):
        return {"kernels": [{"waves_per_simd": waves, "allocated_vgprs": vgprs}]}

    online = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8)
    ranked = sorted([
        (KernelConfig(BLOCK_M=128, BLOCK_N=64, variant="two_phase"), obs(4, 64)),  # 1.5x the work
        (KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=8), obs(4, 64)),  # 8 rows per warp
        (online, obs(2, 184)),
        (KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4), obs(2, 168)),  # same occupancy, fewer registers
        (online.replace(BLOCK_N=32), obs(3, 128)),  # better occupancy
        (online.replace(num_stages=3), obs(2, 184)),  # tie: more stages first
    ], key=lambda co: static_key(*co))
    assert [c for c, _ in ranked] == [online.replace(BLOCK_N=32), KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4),
                                      online.replace(num_stages=3), online,
                                      KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=8),
                                      KernelConfig(BLOCK_M=128, BLOCK_N=64, variant="two_phase")]


def test_static_problem_shares_sweeps_across_sequence_lengths():
    s = spec(None, None).validate()
    assert static_problem(s.shape(2048)) == static_problem(s.shape(8192))
    assert static_problem(s.shape(1000)) != static_problem(s.shape(2048))  # % 16 changes the specialisation


def test_strategies(cache_dir):
    from rocmflash.hw.gpus import get_gpu

    s = spec(None, cache_dir).validate()
    static = static_phase(get_gpu("h100"), static_problem(s.shape(2048)), SPACE, cache_dir, 2)
    assert len(static.candidates) == 8
    assert choose("exhaustive", static, 4) == static.candidates
    top = choose("pruned", static, 3)
    assert top == static.ranked[:3] and [c.static_rank for c in top] == [0, 1, 2]
    assert all(c.kept for c in top)


def test_pruned_tune_writes_a_measured_entry(tmp_path, cache_dir):
    runner = ReplayRunner.from_function(fake_time, device="replay-h100")
    result = tune(spec(tmp_path, cache_dir), runner=runner)
    assert len(runner.calls) == 4
    data = D.ConfigDB.read(str(tmp_path / "h100.json"))
    assert data["gpu"] == "h100" and data["fingerprint"]["device"] == "replay-h100"
    entry = data["entries"]["d64-fp16-full-gqa1-s2048"]
    assert entry["measured"] is True and entry["complete"] is True and entry["strategy"] == "pruned"
    best = KernelConfig.from_dict(entry["best"])
    assert best.BLOCK_M == 128 and best.BLOCK_N == 64 and best.num_warps == 8
    assert entry["counts"]["timed"] == 4 and entry["counts"]["space"] == 8
    assert entry["tflops"] > 0 and 0 < entry["efficiency"] < 1
    assert entry["roofline"]["bound"] == "compute"
    assert all(n["time_ms"] <= entry["time_ms"] * 1.03 for n in entry["near_best"])
    assert result.outcomes[0].timed_now == 4
    assert D.lookup("h100", 64, "fp16", False, 1, 1500, db_path=str(tmp_path / "h100.json")) == best


def test_exhaustive_times_everything_and_records_static_verdicts(tmp_path, cache_dir):
    runner = ReplayRunner.from_function(fake_time)
    tune(spec(tmp_path, cache_dir, strategy="exhaustive", seqlens=[2048, 8192]), runner=runner)
    assert len(runner.calls) == 16
    recs = journal(tmp_path)
    assert len(recs) == 16 and {r["verdict"] for r in recs} <= {"kept", "pruned"}
    assert all(r["strategy"] == "exhaustive" and r["env"] for r in recs)
    data = D.ConfigDB.read(str(tmp_path / "h100.json"))
    assert set(data["entries"]) == {"d64-fp16-full-gqa1-s2048", "d64-fp16-full-gqa1-s8192"}


def test_failures_are_journaled_and_never_retried(tmp_path, cache_dir):
    def flaky(cfg, shape):
        if cfg.BLOCK_N == 32:
            return {"status": "incorrect", "rel_err": 0.5, "error": "relative error 5e-01 > 0.01"}
        if cfg.num_warps == 4:
            return {"status": "failed", "error": "OutOfResources: shared memory"}
        return fake_time(cfg, shape)

    first = ReplayRunner.from_function(flaky)
    tune(spec(tmp_path, cache_dir, strategy="exhaustive"), runner=first, console=None)
    statuses = sorted(r["status"] for r in journal(tmp_path))
    assert statuses.count("incorrect") == 4 and statuses.count("failed") == 2 and statuses.count("ok") == 2
    again = ReplayRunner.from_function(fake_time)  # would now pass: must not be asked
    res = tune(spec(tmp_path, cache_dir, strategy="exhaustive"), runner=again)
    assert again.calls == [] and res.outcomes[0].skipped == 8
    entry = D.ConfigDB.read(str(tmp_path / "h100.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    assert entry["counts"]["incorrect"] == 4 and KernelConfig.from_dict(entry["best"]).BLOCK_N == 64


class InterruptAfter(ReplayRunner):
    def __init__(self, n):
        super().__init__(fn=fake_time)
        self.n = n

    def measure(self, cfg, shape, inject=None):
        if len(self.calls) == self.n:
            raise KeyboardInterrupt
        return super().measure(cfg, shape, inject)


def test_ctrl_c_leaves_a_consistent_db_and_resume_loses_nothing(tmp_path, cache_dir):
    with pytest.raises(TuneInterrupted) as stop:
        tune(spec(tmp_path, cache_dir, strategy="exhaustive"), runner=InterruptAfter(3))
    assert stop.value.result.interrupted and stop.value.result.outcomes[0].timed_now == 3
    entry = D.ConfigDB.read(str(tmp_path / "h100.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    assert entry["complete"] is False and entry["counts"]["timed"] == 3
    D.tune_lock(str(tmp_path / "h100.json")).release()  # the lock was released on the way out
    rest = ReplayRunner.from_function(fake_time)
    res = tune(spec(tmp_path, cache_dir, strategy="exhaustive", resume=True), runner=rest)
    assert len(rest.calls) == 5 and res.outcomes[0].skipped == 3
    recs = journal(tmp_path)
    assert len({json.dumps(r["config"], sort_keys=True) for r in recs}) == len(recs) == 8
    entry = D.ConfigDB.read(str(tmp_path / "h100.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    assert entry["complete"] is True and entry["counts"]["timed"] == 8


def test_results_from_another_environment_are_not_reused(tmp_path, cache_dir):
    tune(spec(tmp_path, cache_dir), runner=ReplayRunner.from_function(fake_time, device="gpu A"))
    other = ReplayRunner.from_function(fake_time, device="gpu B")
    res = tune(spec(tmp_path, cache_dir), runner=other)
    assert len(other.calls) == 4 and res.outcomes[0].stale == 4


def test_replay_from_a_recorded_journal(tmp_path, cache_dir):
    tune(spec(tmp_path / "a", cache_dir, strategy="exhaustive"), runner=ReplayRunner.from_function(fake_time))
    replay = ReplayRunner.from_journal(str(tmp_path / "a" / "h100.journal.jsonl"))
    tune(spec(tmp_path / "b", cache_dir), runner=replay)
    a = D.ConfigDB.read(str(tmp_path / "a" / "h100.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    b = D.ConfigDB.read(str(tmp_path / "b" / "h100.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    assert a["best"] == b["best"] and a["tflops"] == b["tflops"]


def test_no_live_gpu_writes_the_static_ranking_unmeasured(tmp_path, cache_dir):
    res = tune(spec(tmp_path, cache_dir, gpu="mi300x", db_path=str(tmp_path / "mi300x.json"), seqlens=[2048, 8192]))
    assert not res.measured and "no live GPU" in res.why_unmeasured
    data = D.ConfigDB.read(str(tmp_path / "mi300x.json"))
    assert not os.path.exists(str(tmp_path / "mi300x.journal.jsonl"))
    for entry in data["entries"].values():
        assert entry["measured"] is False and entry["tflops"] is None and entry["strategy"] == "static"
        assert entry["note"].startswith("UNMEASURED") and "static score" in entry["note"]
        assert entry["ranked"][0]["config"] == entry["best"] and entry["ranked"][0]["static_rank"] == 0
    assert D.lookup("mi300x", 64, "fp16", False, 1, 4096, db_path=str(tmp_path / "mi300x.json")) is not None
    with pytest.raises(NoLiveGPUError, match="exhaustive"):
        tune(spec(tmp_path, cache_dir, gpu="mi300x", strategy="exhaustive", db_path=str(tmp_path / "mi300x.json")))


def test_a_second_tune_on_the_same_db_is_refused(tmp_path, cache_dir):
    lock = D.tune_lock(str(tmp_path / "h100.json"))
    try:
        with pytest.raises(D.DBLockedError):
            tune(spec(tmp_path, cache_dir), runner=ReplayRunner.from_function(fake_time))
    finally:
        lock.release()


def test_injected_failures_in_replay(tmp_path, cache_dir):
    runner = ReplayRunner.from_function(fake_time)
    tune(spec(tmp_path, cache_dir, inject={"crash": 0, "hang": 2}), runner=runner)
    recs = journal(tmp_path)
    assert [r["status"] for r in recs] == ["crashed", "ok", "timeout", "ok"]
    assert [r["injected"] for r in recs] == ["crash", None, "hang", None]


def test_static_key_on_amd_prefers_the_larger_tile_at_two_waves():
    """AMD: among tiles that keep 2 waves/SIMD, larger BLOCK_M then BLOCK_N first (AMD's published defaults
    choose 128x64 at 2 waves over a third wave); a tile below 2 waves still sorts after every one at 2."""
    def obs(waves, vgprs, arch="gfx942"):
        return {"kernels": [{"waves_per_simd": waves, "allocated_vgprs": vgprs, "arch": arch}]}

    aiter_default = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2)
    third_wave = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=3)
    one_wave = KernelConfig(BLOCK_M=256, BLOCK_N=64, num_warps=8, num_stages=1, waves_per_eu=1)
    ranked = sorted([(third_wave, obs(3, 168)), (one_wave, obs(1, 400)), (aiter_default, obs(2, 256))],
                    key=lambda co: static_key(*co))
    assert [c for c, _ in ranked] == [aiter_default, third_wave, one_wave]
    # the same observations on NVIDIA (no gfx arch): occupancy first, as fitted on the H100
    nv = sorted([(third_wave, obs(3, 168, "sm_90")), (aiter_default, obs(2, 256, "sm_90"))],
                key=lambda co: static_key(*co))
    assert [c for c, _ in nv] == [third_wave, aiter_default]


def test_a_problem_no_config_passes_is_stored_as_failed(tmp_path, cache_dir):
    """Every config crashed: the entry says why, has no best and is not measured; the failure is recorded."""
    from rocmflash.tuning.items_base import recording_failures

    def crash(cfg, shape):
        return {"status": "crashed", "error": "worker died at start"}

    with recording_failures() as failures:
        tune(spec(tmp_path, cache_dir), runner=ReplayRunner.from_function(crash))
    entry = D.ConfigDB.read(str(tmp_path / "h100.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    assert entry["measured"] is False and entry["best"] is None
    assert entry["failed"].startswith("no timed config passed") and "4 crashed" in entry["failed"]
    assert [(f.key, f.kept_earlier) for f in failures] == [("d64-fp16-full-gqa1-s2048", False)]
    assert D.lookup("h100", 64, "fp16", False, 1, 2048, db_path=str(tmp_path / "h100.json")) is None
