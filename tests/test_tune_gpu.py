"""GPU tests of `rocmflash tune` (skipped without a CUDA/ROCm GPU in the catalog).

* isolation: a test mode injects a crashing (segfault), a hanging and an illegal-memory-access
  candidate; each costs its own config only (crashed / timeout / crashed), the worker is
  replaced, the rest of the tune is timed and a winner is written.
* kill and resume: a CLI tune is SIGKILLed mid-run (and, separately, Ctrl-C'd); the
  journal keeps every finished result, the database stays valid JSON, and a `--resume`
  run times only what is missing -- no config is measured twice, nothing is lost.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import small_online_space

from rocmflash.db import ConfigDB, Journal
from rocmflash.tuning import TuneSpec, tune
from rocmflash.tuning.live_worker import LiveSettings

pytestmark = [pytest.mark.gpu]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_isolation_crash_hang_illegal(live, tmp_path):
    db = str(tmp_path / f"{live.name}.json")
    spec = TuneSpec(gpu="auto", head_dim=64, dtype="fp16", seqlens=[1024], causal=True, space=small_online_space(live),
                    top_k=8, db_path=db, cache_dir=str(tmp_path / "cache"),
                    live_settings=LiveSettings(timeout_s=20, warmup_ms=5, rep_ms=20),
                    inject={"crash": 0, "hang": 1, "illegal": 2})
    t0 = time.time()
    result = tune(spec)
    wall = time.time() - t0
    journal = Journal(db[:-5] + ".journal.jsonl", live.name)
    by_inject = {r["injected"]: r for r in journal.records if r.get("injected")}
    assert by_inject["crash"]["status"] == "crashed", by_inject["crash"]
    assert by_inject["hang"]["status"] == "timeout", by_inject["hang"]
    assert by_inject["illegal"]["status"] == "crashed", by_inject["illegal"]
    others = [r for r in journal.records if not r.get("injected")]
    assert len(others) == len(journal.records) - 3 and others
    assert sum(r["status"] == "ok" for r in others) >= 1, [r["error"] for r in others]
    entry = result.outcomes[0].entry
    assert entry["measured"] and entry["best"] and entry["complete"]
    assert entry["counts"]["crashed"] == 2 and entry["counts"]["timeout"] == 1
    print(f"isolation: {len(journal.records)} results, injected statuses "
          f"{ {k: v['status'] for k, v in by_inject.items()} }, {wall:.1f} s; "
          f"errors: {[v['error'] for v in by_inject.values()]}")


def _cli(db, cache, *extra):
    return [sys.executable, "-m", "rocmflash.cli.tune", "tune", "--gpu", "auto", "--head-dim", "64", "--dtype", "bf16",
            "--seqlen", "2048", "--variant", "online", "--strategy", "pruned", "--top-k", "10", "--pass", "fwd",
            "--db", db, "--cache-dir", cache, *extra]


def _wait_for_records(path, n, proc, limit=240):
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            raise AssertionError(f"tune exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if os.path.exists(path):
            with open(path) as f:
                if sum(1 for _ in f) - 1 >= n:
                    return
        time.sleep(0.2)
    raise AssertionError("no results appeared")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_kill_and_resume_loses_nothing(live, tmp_path, sig):
    db = str(tmp_path / f"{live.name}.json")
    jpath = db[:-5] + ".journal.jsonl"
    cache = str(tmp_path / "cache")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(_cli(db, cache), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    _wait_for_records(jpath, 3, proc)
    os.killpg(proc.pid, sig)  # the whole group, as a terminal's Ctrl-C (or an OOM kill of everything) would
    proc.wait(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, proc.stderr.read()[-2000:]
    before = Journal(jpath, live.name).records
    assert len(before) >= 3
    if os.path.exists(db):
        ConfigDB.read(db)  # never a torn database
    done = subprocess.run(_cli(db, cache, "--resume"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    after = Journal(jpath, live.name).records
    configs = [json.dumps(r["config"], sort_keys=True) for r in after]
    assert len(configs) == len(set(configs)), "a config was measured twice"
    assert after[:len(before)] == before, "resume rewrote earlier results"
    assert len(after) == 10
    entry = next(iter(ConfigDB.read(db)["entries"].values()))
    assert entry["complete"] and entry["counts"]["timed"] == 10 and entry["measured"]
    print(f"{sig.name}: {len(before)} results survived the kill, resume timed {len(after) - len(before)} more; "
          f"resume output: {done.stdout.strip().splitlines()[:3]}")
