"""The cluster path (``--cluster``) on a local Ray instance, without a GPU: two actors replay recorded timings.

Ray is the engine: the actors are real Ray actors in their own processes, called through
Ray; only the timings are replayed (from a journal a first, single-worker tune wrote). The
driver keeps the journal and the database. A node leaving is an actor process that exits
midway: its in-flight config goes to the other actor and nothing else is lost.
"""

import pytest

from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
from rocmflash import db as D
from rocmflash.tuning import ReplayRunner, TuneSpec, tune

ray = pytest.importorskip("ray")

SPACE = ConfigSpace({"online": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4, 8],
                                "num_stages": [2, 3]}}, DEFAULT_RESTRICTIONS)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cluster-static-cache"))


@pytest.fixture(scope="module")
def local_ray():
    from rocmflash.tuning.cluster import connect, shutdown

    connect("local", num_cpus=2)
    yield
    shutdown()


def spec(path, cache_dir, **kw):
    base = dict(gpu="h100", head_dim=64, dtype="fp16", seqlens=[1024, 4096], space=SPACE, db_path=str(path),
                cache_dir=cache_dir, workers=2, strategy="race")
    base.update(kw)
    return TuneSpec(**base)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, cache_dir):
    """A journal of synthetic timings, written by a single-worker tune (what the actors replay)."""
    def fn(cfg, shape):
        ms = (1.0 + 0.3 * (cfg.BLOCK_M == 64) + 0.1 * (cfg.BLOCK_N == 32) - 0.02 * (cfg.num_warps == 8)
              - 0.005 * cfg.num_stages) * shape.seqlen_q / 1024
        return {"status": "ok", "median_ms": ms, "times_ms": [ms, ms]}

    path = tmp_path_factory.mktemp("recorded") / "h100.json"
    tune(spec(path, cache_dir), runner=ReplayRunner.from_function(fn), progress=False)
    return D.journal_path(str(path))


def entries(path):
    return {k: (e["best"], e["tflops"], e["complete"]) for k, e in D.ConfigDB.read(str(path))["entries"].items()}


def test_two_ray_actors_tune_like_one_worker_and_the_driver_writes_alone(tmp_path, cache_dir, local_ray, recorded):
    from rocmflash.tuning.cluster import cluster_pool

    pool = cluster_pool("local", replay=recorded, actors=2)
    try:
        infos = [r.info for r in pool.runners]
        assert len({i["pid"] for i in infos}) == 2  # two actor processes
        result = tune(spec(tmp_path / "cluster.json", cache_dir), runner=pool, progress=False)
    finally:
        pool.close()
    serial = tune(spec(tmp_path / "serial.json", cache_dir), runner=ReplayRunner.from_journal(recorded),
                  progress=False)
    assert entries(tmp_path / "cluster.json") == entries(tmp_path / "serial.json")
    assert [o.timed_now for o in result.outcomes] == [o.timed_now for o in serial.outcomes]
    records = D.Journal(D.journal_path(str(tmp_path / "cluster.json")), "h100").records
    assert {r["worker"] for r in records} == {"actor0", "actor1"}
    assert all(s.done > 0 for s in pool.stats)


def test_a_node_that_leaves_costs_only_its_in_flight_config(tmp_path, cache_dir, local_ray, recorded):
    from rocmflash.tuning.cluster import cluster_pool

    pool = cluster_pool("local", replay=recorded, actors=2, fail_after={0: 3})
    try:
        tune(spec(tmp_path / "cluster.json", cache_dir), runner=pool, progress=False)
    finally:
        pool.close()
    assert pool.stats[0].lost and not pool.stats[1].lost
    records = D.Journal(D.journal_path(str(tmp_path / "cluster.json")), "h100").records
    assert all(r["status"] == "ok" for r in records)
    assert sum(r["worker"] == "actor0" for r in records) == 3
    serial = tune(spec(tmp_path / "serial.json", cache_dir), runner=ReplayRunner.from_journal(recorded),
                  progress=False)
    assert entries(tmp_path / "cluster.json") == entries(tmp_path / "serial.json")
    assert sum(o.timed_now for o in serial.outcomes) == len(records)


def test_cluster_errors_are_one_line(local_ray):
    from rocmflash.tuning.cluster import ClusterError, cluster_pool, connect

    with pytest.raises(ClusterError, match="has no GPUs"):
        cluster_pool("local")  # this instance has CPUs only
    with pytest.raises(ClusterError, match="invalid"):
        from rocmflash.tuning import cluster

        ray.shutdown()
        try:
            connect("nonsense")
        finally:
            connect("local", num_cpus=2)
    assert cluster.ClusterError is ClusterError
