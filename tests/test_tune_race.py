"""The ``race`` strategy (successive halving over every static survivor), without a GPU.

The static phase is real (a small space cross-compiled for the H100 on this CPU, cached
per module); timings come from replay runners that can see each round's budget, so the
tests can make the static ranking wrong and short measurements misleading.
"""

import pytest

from rocmflash import db as D
from rocmflash.config import KernelConfig
from rocmflash.tuning.race import (DEFAULT_ROUNDS, FINAL_PASSES, advancing, final_round_records, merge_final_passes,
                            planned_measurements)
from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
from rocmflash.tuning import ReplayRunner, TuneInterrupted, TuneSpec, tune

SPACE = ConfigSpace({"online": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4, 8],
                                "num_stages": [2, 3]}}, DEFAULT_RESTRICTIONS)
KEY = "d64-fp16-full-gqa1-s2048"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("race-static-cache"))


def spec(tmp_path, cache_dir, **kw):
    base = dict(gpu="h100", head_dim=64, dtype="fp16", seqlens=[2048], space=SPACE,
                db_path=str(tmp_path / "h100.json"), cache_dir=cache_dir, workers=2)
    base.update(kw)
    return TuneSpec(**base)


def entry(tmp_path):
    return D.ConfigDB.read(str(tmp_path / "h100.json"))["entries"][KEY]


# ----------------------------------------------------------------------------- pure selection
def test_advancing_keeps_the_fastest_fraction_near_ties_and_never_failures():
    results = [("a", 1.30), ("b", None), ("c", 1.00), ("d", 1.02), ("e", 1.50), ("f", 1.10), ("g", 2.0),
               ("h", 1.29), ("i", 1.8), ("j", 1.4), ("k", 1.6), ("l", 1.7)]
    # 11 ok: ceil(0.25 * 11) = 3 fastest (c, d, f), and nothing else within 3% of 1.00
    assert advancing(results, keep=0.25, margin_pct=3.0, min_keep=1) == ["c", "d", "f"]
    # a wider margin takes every config within it, beyond the fraction
    assert advancing(results, keep=0.25, margin_pct=30.0, min_keep=1) == ["c", "d", "f", "h", "a"]
    assert "b" not in advancing(results, keep=1.0, min_keep=1)
    assert advancing(results, keep=0.0, margin_pct=0.0, min_keep=4) == ["c", "d", "f", "h"]
    assert advancing([("x", None), ("y", None)], keep=0.5) == []
    assert advancing([("x", 1.0), ("y", 1.0), ("z", 1.0)], keep=0.0, margin_pct=0.0, min_keep=1) == ["x", "y", "z"]


def test_planned_measurements_and_final_round():
    assert planned_measurements(84) == [84, 21, 7]
    assert planned_measurements(5) == [5, 3, 3]
    by_round = {0: {"a": {"status": "ok"}}, 1: {"a": {"status": "ok"}}, 2: {"a": {"status": "failed"}}}
    assert final_round_records(by_round)[0] == 1  # the last round with a timing
    assert final_round_records({}) == (None, [])


def test_final_passes_merge_to_the_median_and_a_bad_pass_disqualifies():
    ok = lambda ms: {"status": "ok", "median_ms": ms}  # noqa: E731
    passes = [{"a": ok(1.10), "b": ok(1.00), "c": ok(1.0)},
              {"a": ok(0.95), "b": ok(1.08), "c": {"status": "incorrect"}},
              {"a": ok(1.00), "b": ok(1.07)}]
    merged = merge_final_passes(passes)
    assert merged["a"]["median_ms"] == 1.00 and merged["a"]["passes_ms"] == [0.95, 1.0, 1.1]
    assert merged["b"]["median_ms"] == 1.07  # one fast pass does not make b the winner
    assert merged["c"]["status"] == "incorrect"
    assert merge_final_passes([{"a": ok(1.0)}, {"a": ok(1.2)}])["a"]["median_ms"] == 1.2  # of two: the slower
    assert merge_final_passes([{}, {}]) == {} and merge_final_passes([]) == {}


# ----------------------------------------------------------------------------- the tune
@pytest.fixture(scope="module")
def ranked(cache_dir, tmp_path_factory):
    """The survivors in static-score order (the real static phase of this space)."""
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.tuning import static_phase, static_problem

    s = spec(tmp_path_factory.mktemp("ranked"), cache_dir).validate()
    return [c.config for c in static_phase(get_gpu("h100"), static_problem(s.shape(2048)), SPACE, cache_dir, 2).ranked]


def _truth(ranked, cfg):
    """True times: the static score's *last* survivor is the fastest, its second-to-last the runner-up."""
    if cfg == ranked[-1]:
        return 1.0
    if cfg == ranked[-2]:
        return 1.02
    return 1.05 + 0.001 * ranked.index(cfg) if cfg in ranked else 2.0


def _timings(ranked):
    def fn(cfg, shape, budget):
        """Short rounds mislead within the race's margin: the true best looks 2.5% slower and the
        runner-up 1% faster than they are, so the runner-up leads both short rounds."""
        ms = _truth(ranked, cfg)
        if budget is not None and budget["rep_ms"] < 100:
            ms *= 1.025 if cfg == ranked[-1] else 0.99 if cfg == ranked[-2] else 1.0
        return {"status": "ok", "median_ms": ms, "times_ms": [ms]}
    return fn


def test_race_finds_the_winner_the_static_score_ranks_last(tmp_path, cache_dir, ranked):
    assert len(ranked) >= 8
    runner = ReplayRunner.from_function(_timings(ranked))
    tune(spec(tmp_path, cache_dir), runner=runner)
    e = entry(tmp_path)
    assert KernelConfig.from_dict(e["best"]) == ranked[-1]
    assert e["strategy"] == "race" and e["complete"] is True
    assert e["time_ms"] == pytest.approx(1.0)  # the full-budget figure, not a short round's
    survivors = e["counts"]["survivors"]
    assert e["counts"]["timed"] == survivors and e["counts"]["rounds"][0] == survivors
    assert e["counts"]["rounds"][1] < survivors and e["counts"]["rounds"][2] <= e["counts"]["rounds"][1]
    # budgets: ungated short screen, gated middle round, the full live settings last
    n0, n1, n2 = e["counts"]["rounds"]
    assert all(b == DEFAULT_ROUNDS[0].budget() and b["gate"] is False for b in runner.budgets[:n0])
    assert all(b == DEFAULT_ROUNDS[1].budget() and b["gate"] is True for b in runner.budgets[n0:n0 + n1])
    assert runner.budgets[n0 + n1:] == [None] * (n2 * FINAL_PASSES)  # the last round's alternating passes
    assert e["passes_ms"] == [pytest.approx(1.0)] * FINAL_PASSES

    # the pruned strategy, given as many full measurements as the race's last round, misses it
    pruned_dir = tmp_path / "pruned"
    pruned_dir.mkdir()
    tune(spec(pruned_dir, cache_dir, strategy="pruned", top_k=n2),
         runner=ReplayRunner.from_function(lambda c, s: _timings(ranked)(c, s, None)))
    assert entry(pruned_dir)["time_ms"] > 1.04


def test_one_slow_pass_does_not_lose_the_winner(tmp_path, cache_dir, ranked):
    """The true best is measured 6% slow in the first full pass (a drift between two measurements a
    second apart): a single pass would crown the runner-up; the median of the passes does not."""
    fn = _timings(ranked)
    full_calls = {"n": 0}

    def drifting(cfg, shape, budget):
        result = fn(cfg, shape, budget)
        if budget is None and cfg == ranked[-1]:
            full_calls["n"] += 1
            if full_calls["n"] == 1:
                result = dict(result, median_ms=result["median_ms"] * 1.06)
        return result

    tune(spec(tmp_path, cache_dir), runner=ReplayRunner.from_function(drifting))
    e = entry(tmp_path)
    assert full_calls["n"] == FINAL_PASSES
    assert KernelConfig.from_dict(e["best"]) == ranked[-1] and e["time_ms"] == pytest.approx(1.0)


def test_failures_never_advance_and_an_all_failed_race_says_so(tmp_path, cache_dir, ranked):
    def broken(cfg, shape, budget):
        if cfg.num_stages == 3:
            return {"status": "failed", "error": "out of resources"}
        return _timings(ranked)(cfg, shape, budget)

    runner = ReplayRunner.from_function(broken)
    tune(spec(tmp_path, cache_dir), runner=runner)
    later = [cfg for cfg, b in zip((c for c, _ in runner.calls), runner.budgets) if b != DEFAULT_ROUNDS[0].budget()]
    assert later and all(cfg.num_stages == 2 for cfg in later)
    assert entry(tmp_path)["counts"]["failed"] >= 1

    none_dir = tmp_path / "none"
    none_dir.mkdir()
    tune(spec(none_dir, cache_dir), runner=ReplayRunner.from_function(lambda c, s: {"status": "failed", "error": "x"}))
    e = entry(none_dir)
    assert e["best"] is None and "no timed config passed" in e["note"] and e["counts"]["rounds"][1:] == [0, 0]


class _InterruptAt(ReplayRunner):
    def __init__(self, n, fn):
        super().__init__(fn=fn)
        self.n = n

    def measure(self, cfg, shape, inject=None, budget=None):
        if len(self.calls) == self.n:
            raise KeyboardInterrupt
        return super().measure(cfg, shape, inject, budget)


def test_race_resumes_in_the_round_it_was_stopped_without_re_measuring(tmp_path, cache_dir, ranked):
    fn = _timings(ranked)
    (tmp_path / "a").mkdir()
    full = ReplayRunner.from_function(fn)
    tune(spec(tmp_path / "a", cache_dir), runner=full)
    total = len(full.calls)
    n0 = entry(tmp_path / "a")["counts"]["rounds"][0]

    stop_at = n0 + 2  # inside round 2
    with pytest.raises(TuneInterrupted):
        tune(spec(tmp_path, cache_dir), runner=_InterruptAt(stop_at, fn))
    assert entry(tmp_path)["complete"] is False
    D.tune_lock(str(tmp_path / "h100.json")).release()
    rest = ReplayRunner.from_function(fn)
    res = tune(spec(tmp_path, cache_dir, resume=True), runner=rest)
    assert len(rest.calls) == total - stop_at and res.outcomes[0].skipped == stop_at
    e = entry(tmp_path)
    assert e["complete"] is True and e["best"] == entry(tmp_path / "a")["best"]
