"""A decode tune times the platform's SDPA beside its winner (issue #28): one more job on the timing worker runs
``measure_decode(problem, winner)`` and the entry carries ``incumbent`` -- not with ``incumbent=False``
(``--no-incumbent``), not for a paged cache, and a failed measurement still writes the entry. The timing worker
is a fake runner in this process (the configs' and the incumbent's measurements are canned results); the static
phase is the real cross-compile for gfx90a."""

import pytest

from rocmflash import db as D
from rocmflash.api.incumbent import DECODE_TIMING, candidates
from rocmflash.tuning import decode as TD
from rocmflash.tuning import items_decode as ID

CONFIGS = [dict(BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=2, num_splits=0),
           dict(BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2, num_splits=0)]
SDPA_OK = {"status": "ok", "error": None, "triton_ms": 0.05, "timing": DECODE_TIMING,
           "backends": {"math": {"status": "ok", "time_ms": 0.04, "rel_err": 0.001, "error": None}}}


class FakeRunner:
    """A timing worker that runs worker tasks (``call``): BLOCK_N 32 is the faster config; the incumbent's task
    gets ``incumbent`` (a result, or an exception raised as a worker's would be)."""

    device = "fake"

    def __init__(self, incumbent=SDPA_OK):
        self.incumbent, self.calls = incumbent, []

    def call(self, fn, task, timeout_s):
        self.calls.append((fn, task))
        if fn is ID.measure_incumbent:
            if isinstance(self.incumbent, Exception):
                raise self.incumbent
            return dict(self.incumbent)
        ms = 0.1 if task["config"]["BLOCK_N"] == 32 else 0.2
        return {"status": "ok", "config": task["config"], "times_ms": {"1": ms, "2": ms * 1.5}}

    def prewarm_tasks(self, tasks, fn, timeout_s):
        pass

    def incumbent_tasks(self):
        return [task for fn, task in self.calls if fn is ID.measure_incumbent]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("decode-incumbent-cache"))


def _tune(tmp_path, cache_dir, runner, page_size=0, **kwargs):
    from rocmflash.tuning.decode_run import tune_decode

    problem = TD.DecodeProblem(head_dim=32, dtype="fp16", heads_q=4, heads_kv=2, batch=2, seqlen_k=64,
                               page_size=page_size)
    db_path = str(tmp_path / "mi250.json")
    tune_decode("mi250", problem, db_path, cache_dir, 2, 120.0, configs=CONFIGS, pool=runner, **kwargs)
    return problem, D.ConfigDB.read(db_path)["entries"][problem.key()]


def test_decode_tune_stores_the_incumbent_timed_beside_the_winner(tmp_path, cache_dir):
    runner = FakeRunner()
    problem, entry = _tune(tmp_path, cache_dir, runner)
    assert entry["measured"] and entry["best"]["BLOCK_N"] == 32 and entry["best"]["num_splits"] == 1
    # one incumbent task, after the configs', with the winner as the config served
    [task] = runner.incumbent_tasks()
    assert runner.calls[-1][0] is ID.measure_incumbent
    assert task == {"problem": problem.to_dict(), "config": entry["best"], "backends": candidates()}
    inc = entry["incumbent"]
    assert inc["backend"] == "math" and inc["time_ms"] == 0.04 and inc["triton_ms"] == 0.05
    assert inc["timing"] == DECODE_TIMING


def test_no_incumbent_times_and_stores_none(tmp_path, cache_dir):
    runner = FakeRunner()
    _, entry = _tune(tmp_path, cache_dir, runner, incumbent=False)
    assert entry["measured"] and entry["best"] and "incumbent" not in entry
    assert runner.incumbent_tasks() == [] and len(runner.calls) == len(CONFIGS)


def test_paged_problem_does_not_ask_for_the_incumbent(tmp_path, cache_dir):
    runner = FakeRunner()
    _, entry = _tune(tmp_path, cache_dir, runner, page_size=16)
    assert entry["measured"] and entry["best"] and "incumbent" not in entry
    assert runner.incumbent_tasks() == []


@pytest.mark.parametrize("failure", [{"status": "timeout", "error": "no result after 600 s"},
                                     RuntimeError("worker pool failed")])
def test_failed_incumbent_still_writes_the_entry_and_says_why(tmp_path, cache_dir, caplog, failure):
    caplog.set_level("WARNING", logger="rocmflash.tuning.items_decode")
    runner = FakeRunner(incumbent=failure)
    _, entry = _tune(tmp_path, cache_dir, runner)
    assert len(runner.incumbent_tasks()) == 1
    assert entry["measured"] and entry["best"]["BLOCK_N"] == 32 and "incumbent" not in entry
    [why] = [r.getMessage() for r in caplog.records if "no incumbent in the entry" in r.getMessage()]
    assert ("timeout: no result after 600 s" if isinstance(failure, dict) else "worker pool failed") in why


@pytest.mark.parametrize("flag, expected", [([], True), (["--no-incumbent"], False)])
def test_cli_decode_tune_passes_no_incumbent(flag, expected, tmp_path, monkeypatch):
    """``rocmflash tune --mode decode --no-incumbent`` reaches the decode tune (it was refused before: the flag
    was a prefill flag only)."""
    from rocmflash.cli import main
    from rocmflash.tuning import decode_run

    seen = []

    def fake_tune_decode(*args, incumbent=True, **kwargs):
        seen.append(incumbent)
        raise SystemExit(0)  # what the tune does is not this test's: only what it was asked

    monkeypatch.setattr(decode_run, "tune_decode", fake_tune_decode)
    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(tmp_path))
    with pytest.raises(SystemExit):
        main(["tune", "--mode", "decode", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "8192",
              "--batch", "16", *flag])
    assert seen == [expected]
