"""Seeds: the AMD-published configs of the tuned GPU's arch are always compiled and timed."""

import pytest

from rocmflash.config import KernelConfig, Problem
from rocmflash.hw.gpus import get_gpu
from rocmflash.static.seeds import reference_seeds
from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
from rocmflash import db as D
from rocmflash.tuning import ReplayRunner, TuneSpec, tune

SPACE = ConfigSpace({"online": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4],
                                "num_stages": [1], "waves_per_eu": [2]}}, DEFAULT_RESTRICTIONS)


def test_reference_seeds_are_the_archs_published_forward_configs():
    seeds = reference_seeds(get_gpu("mi300x"), Problem(head_dim=128))
    ids = [i for i, _ in seeds]
    assert seeds and all(i.startswith(("aiter-gfx942", "rocm-triton", "flash-attention", "vllm")) for i in ids)
    assert "aiter-gfx942-mha-fwd-default" in ids
    assert len({c for _, c in seeds}) == len(seeds)  # one per distinct config
    assert all(isinstance(c, KernelConfig) for _, c in seeds)
    assert reference_seeds(get_gpu("h100"), Problem(head_dim=128)) == []  # none published for NVIDIA
    assert all(c.variant == "online" for _, c in reference_seeds(get_gpu("mi355x"), Problem(head_dim=64),
                                                                   variants=["online"]))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("seed-cache"))


@pytest.fixture
def three_seeds(monkeypatch):
    """Three real MI300X seeds (to keep the compile short): one the space holds, two it lacks."""
    real = reference_seeds(get_gpu("mi300x"), Problem(head_dim=64))
    in_space = set(SPACE.configs(Problem(head_dim=64, dtype="fp16"), get_gpu("mi300x")))
    inside = [s for s in real if s[1] in in_space][:1]
    outside = [s for s in real if s[1] not in in_space][:2]
    assert inside and len(outside) == 2
    picked = inside + outside
    monkeypatch.setattr("rocmflash.tuning.output.reference_seeds", lambda gpu, problem, variants=None: picked)
    return picked


def spec(tmp_path, cache_dir, **kw):
    base = dict(gpu="mi300x", head_dim=64, dtype="fp16", seqlens=[2048], space=SPACE,
                db_path=str(tmp_path / "mi300x.json"), cache_dir=cache_dir, workers=2)
    base.update(kw)
    return TuneSpec(**base)


def test_a_live_tune_times_every_seed_and_says_which(tmp_path, cache_dir, three_seeds):
    fastest = three_seeds[2][1]  # a seed the space lacks is the fastest config

    def timing(cfg, shape, budget=None):
        ms = 0.5 if cfg == fastest else 1.0 + 0.01 * cfg.BLOCK_N / 32
        return {"status": "ok", "median_ms": ms, "times_ms": [ms]}

    runner = ReplayRunner.from_function(timing)
    tune(spec(tmp_path, cache_dir), runner=runner)
    timed = {c for c, _ in runner.calls}
    assert all(cfg in timed for _, cfg in three_seeds)
    entry = D.ConfigDB.read(str(tmp_path / "mi300x.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    assert KernelConfig.from_dict(entry["best"]) == fastest
    assert sorted(s["id"] for s in entry["seeds"]) == sorted(i for i, _ in three_seeds)
    assert all(s["status"] == "ok" for s in entry["seeds"])
    records = D.Journal(str(tmp_path / "mi300x.journal.jsonl"), "mi300x").records
    assert {r["seed"] for r in records if r.get("seed")} == {i for i, _ in three_seeds}

    # --no-seeds: only the space
    other = tmp_path / "noseeds"
    other.mkdir()
    runner = ReplayRunner.from_function(timing)
    tune(spec(other, cache_dir, seeds=False), runner=runner)
    assert fastest not in {c for c, _ in runner.calls}


def test_pruned_strategy_and_static_entries_carry_the_seeds(tmp_path, cache_dir, three_seeds):
    runner = ReplayRunner.from_function(lambda cfg, shape: {"status": "ok", "median_ms": 1.0, "times_ms": [1.0]})
    tune(spec(tmp_path, cache_dir, strategy="pruned", top_k=1), runner=runner)
    assert all(cfg in {c for c, _ in runner.calls} for _, cfg in three_seeds)
    static_dir = tmp_path / "static"
    static_dir.mkdir()
    tune(spec(static_dir, cache_dir))  # no live MI300X here: static ranking, with the seeds' verdicts
    entry = D.ConfigDB.read(str(static_dir / "mi300x.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    assert entry["measured"] is False
    assert sorted(s["id"] for s in entry["seeds"]) == sorted(i for i, _ in three_seeds)
    assert all("kept" in s and "reason" in s for s in entry["seeds"])


def test_race_times_and_counts_a_seed_the_pruner_rejects(tmp_path, cache_dir, three_seeds, monkeypatch):
    """A seed the pruner rejects is still timed in the race's first round, and counted in ``to_time``."""
    from rocmflash.static.prune import Verdict
    from rocmflash.tuning import static as static_mod

    real_prune = static_mod.prune

    def prune_last_seed(observations, settings):  # seeds the space lacks are appended last
        verdicts = real_prune(observations, settings)
        return verdicts[:-1] + [Verdict(False, "spills", "test: a pruned seed")]

    monkeypatch.setattr(static_mod, "prune", prune_last_seed)
    runner = ReplayRunner.from_function(lambda cfg, shape: {"status": "ok", "median_ms": 1.0, "times_ms": [1.0]})
    tune(spec(tmp_path, cache_dir), runner=runner)
    assert three_seeds[-1][1] in {c for c, _ in runner.calls}
    entry = D.ConfigDB.read(str(tmp_path / "mi300x.json"))["entries"]["d64-fp16-full-gqa1-s2048"]
    counts = entry["counts"]
    assert counts["to_time"] == counts["rounds"][0] > counts["survivors"]  # survivors plus the pruned seeds
