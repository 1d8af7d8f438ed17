"""GPU tests of ``rocmflash tune --gpus`` and ``--cluster local`` (skipped without a catalog GPU).

On a one-GPU machine the pool has one worker: these tests check that the pool path times on
the GPU, pins its worker, survives an injected crash, hang and illegal access at the cost of
those configs only, and (with Ray installed) that a local Ray actor times on the GPU Ray
gives it and reaches the same entry as a plain tune.
"""

import os
import subprocess
import sys

import pytest
import torch
from conftest import small_online_space

from rocmflash.db import ConfigDB, Journal, journal_path
from rocmflash.tuning import TuneSpec, tune
from rocmflash.tuning.live_worker import LiveSettings
from rocmflash.tuning.pool import node_gpu, node_pool

pytestmark = [pytest.mark.gpu]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_node_pool_times_on_every_gpu_and_isolates_failures(live, tmp_path):
    indices = list(range(torch.cuda.device_count()))
    assert node_gpu(indices).name == live.name
    settings = LiveSettings(timeout_s=30, warmup_ms=5, rep_ms=20)
    pool = node_pool(indices, settings, str(tmp_path / "triton"))
    db = str(tmp_path / f"{live.name}.json")
    spec = TuneSpec(gpu=live.name, head_dim=64, dtype="fp16", seqlens=[1024, 2048], causal=True, space=small_online_space(live),
                    db_path=db, cache_dir=str(tmp_path / "cache"), strategy="pruned", top_k=6,
                    live_settings=settings, inject={"crash": 0, "hang": 1, "illegal": 2})
    try:
        result = tune(spec, runner=pool, progress=False)
    finally:
        pool.close()
    records = Journal(journal_path(db), live.name).records
    injected = {r["injected"]: r["status"] for r in records if r.get("injected")}
    assert injected == {"crash": "crashed", "hang": "timeout", "illegal": "crashed"}
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) >= len(records) - 3 - 2 and ok  # only the injected configs are lost
    assert {r["worker"] for r in records} == {f"gpu{i}" for i in indices}
    for r in ok:  # each worker is pinned to its device
        assert any(v in ("0", str(i)) for i in indices for v in r["device_env"].values()), r["device_env"]
    entries = ConfigDB.read(db)["entries"]
    assert all(entries[o.key]["measured"] for o in result.outcomes)


def test_cli_gpus_all_and_cluster_local_reach_the_same_entry(live, tmp_path):
    pytest.importorskip("ray")
    env = dict(os.environ, ROCMFLASH_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="160")
    common = ["--gpu", "auto", "--head-dim", "64", "--dtype", "bf16", "--seqlen", "2048", "--causal",
              "--pass", "fwd", "--strategy", "pruned", "--top-k", "6"]
    dbs = {}
    for name, extra in (("node", ["--gpus", "all"]), ("cluster", ["--cluster", "local"])):
        dbs[name] = str(tmp_path / name / f"{live.name}.json")
        proc = subprocess.run([sys.executable, "-m", "rocmflash.cli", "tune", *common, *extra, "--db", dbs[name]],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    key = "d64-bf16-causal-gqa1-s2048"
    node, cluster = (ConfigDB.read(dbs[n])["entries"][key] for n in ("node", "cluster"))
    assert node["measured"] and cluster["measured"]
    assert node["counts"]["timed"] == cluster["counts"]["timed"]
    records = Journal(journal_path(dbs["cluster"]), live.name).records
    assert records and all(r["status"] == "ok" for r in records)
    assert all(r["worker"] != "gpu0" for r in records)  # timed by the Ray actor, not a local worker
    # the winners agree up to measurement noise
    ratio = node["time_ms"] / cluster["time_ms"]
    assert 0.9 < ratio < 1.1, (node["best"], cluster["best"], ratio)
