"""Config database, journal, lock and run-time lookup (no GPU, no compiles)."""

import json
import os
import subprocess
import sys
import time

import pytest

from rocmflash.config import KernelConfig
from rocmflash import db as D


def test_seqlen_bucket_is_next_power_of_two():
    assert [D.seqlen_bucket(s) for s in (1, 2, 3, 1000, 1024, 1025, 2048, 3000, 8192)] == \
        [1, 2, 4, 1024, 1024, 2048, 2048, 4096, 8192]
    with pytest.raises(ValueError):
        D.seqlen_bucket(0)


def test_problem_key_round_trip():
    key = D.problem_key(128, "bfloat16", True, 4, 2048)
    assert key == "d128-bf16-causal-gqa4-s2048"
    assert D.parse_key(key) == {"head_dim": 128, "dtype": "bf16", "causal": True, "gqa_ratio": 4, "seqlen_bucket": 2048}
    assert D.problem_key(64, "fp16", False, 1, 1024) == "d64-fp16-full-gqa1-s1024"


def _entry(cfg, measured=True, tflops=400.0, per_variant=None):
    return {"best": cfg.to_dict(), "measured": measured, "tflops": tflops if measured else None,
            "best_per_variant": per_variant or {cfg.variant: {"config": cfg.to_dict(), "tflops": tflops}}}


def _db(tmp_path, entries, gpu="h100"):
    path = str(tmp_path / f"{gpu}.json")
    store = D.ConfigDB.open(path, gpu, "sm_90", D.environment("test device"))
    for k, e in entries.items():
        store.put(k, e)
    store.save()
    return path


def test_save_is_atomic_and_reloads(tmp_path):
    cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    path = _db(tmp_path, {"d128-bf16-full-gqa1-s2048": _entry(cfg)})
    assert sorted(os.listdir(tmp_path)) == ["h100.json"]  # no temporary file left behind
    data = D.ConfigDB.read(path)
    assert data["schema_version"] == D.SCHEMA_VERSION and data["format"] == D.DB_FORMAT
    assert set(data["fingerprint"]) == {"rocmflash", "triton", "torch", "runtime", "device"}
    assert KernelConfig.from_dict(data["entries"]["d128-bf16-full-gqa1-s2048"]["best"]) == cfg


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema_version=99), "schema version 99"),
    (lambda d: d.update(format="other"), "not a rocmflash config database"),
    (lambda d: d.pop("entries"), "'entries'"),
])
def test_header_must_match(tmp_path, mutate, message):
    path = _db(tmp_path, {})
    data = json.load(open(path))
    mutate(data)
    json.dump(data, open(path, "w"))
    with pytest.raises(D.DBError, match=message):
        D.ConfigDB.read(path)


def test_other_gpu_and_garbage_are_errors(tmp_path):
    path = _db(tmp_path, {})
    with pytest.raises(D.DBError, match="holds configs for 'h100', not 'h200'"):
        D.ConfigDB.open(path, "h200", "sm_90", {})
    open(path, "w").write("{not json")
    with pytest.raises(D.DBError, match="not valid JSON"):
        D.ConfigDB.read(path)


def test_journal_appends_and_survives_a_torn_line(tmp_path):
    path = str(tmp_path / "h100.journal.jsonl")
    j = D.Journal(path, "h100")
    cfg = KernelConfig()
    rec = {"key": "k", "shape": {"s": 1}, "env": "e", "config": cfg.to_dict(), "status": "ok"}
    j.append(rec)
    with open(path, "a") as f:
        f.write('{"key": "k", "shape": {"s": 1}, "config": {"BLOCK_')  # killed mid-write
    j2 = D.Journal(path, "h100")
    assert j2.torn_lines == 1 and len(j2.records) == 1
    j2.append(dict(rec, config=cfg.replace(BLOCK_N=32).to_dict()))
    j3 = D.Journal(path, "h100")
    assert len(j3.records) == 2 and j3.torn_lines == 1
    assert set(j3.results("k", {"s": 1}, "e")) == {cfg.to_json(), cfg.replace(BLOCK_N=32).to_json()}
    assert j3.results("k", {"s": 1}, "other-env") == {} and j3.stale("k", {"s": 1}, "other-env") == 2
    with pytest.raises(D.DBError, match="journal for 'h100', not 'mi300x'"):
        D.Journal(path, "mi300x")


def test_lock_refuses_a_second_tune(tmp_path):
    path = str(tmp_path / "h100.json")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from rocmflash.db import tune_lock; lock = tune_lock(sys.argv[1]); print('held', flush=True); "
        "time.sleep(30)"), path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(D.DBLockedError, match="another rocmflash tune is writing"):
            D.tune_lock(path)
    finally:
        holder.kill()
        holder.wait()
    D.tune_lock(path).release()  # the OS dropped the dead holder's lock


def test_lookup_nearest_bucket_variant_and_cache(tmp_path):
    a = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    b = KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
    s = KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, variant="split_kv")
    path = _db(tmp_path, {
        "d128-bf16-full-gqa1-s1024": _entry(a),
        "d128-bf16-full-gqa1-s4096": _entry(s, per_variant={"split_kv": {"config": s.to_dict(), "tflops": 1},
                                                               "online": {"config": b.to_dict(), "tflops": 1}}),
        "d64-fp16-causal-gqa1-s2048": _entry(a, measured=False),
    })
    look = lambda *args, **kw: D.lookup("h100", *args, db_path=path, **kw)  # noqa: E731
    assert look(128, "bf16", False, 1, 1000) == a  # bucket 1024
    assert look(128, "bf16", False, 1, 2048) == s  # 1024 and 4096 are equally near: the larger wins
    assert look(128, "bf16", False, 1, 100000) == s
    assert look(128, "bf16", False, 1, 4096, variant="online") == b
    assert look(128, "bf16", False, 1, 4096, variant="two_phase") is None
    assert look(128, "bf16", False, 2, 4096) is None  # GQA ratio must match
    assert look(128, "fp16", False, 1, 4096) is None
    assert look(64, "fp16", True, 1, 2048) == a
    assert look(64, "fp16", True, 1, 2048, measured_only=True) is None
    assert D.lookup("h100", 128, "bf16", False, 1, 1, db_path=str(tmp_path / "missing.json")) is None
    import torch

    assert look(128, torch.bfloat16, False, 1, 1000) == a
    t0 = time.perf_counter()
    for _ in range(10000):
        look(128, "bf16", False, 1, 1000)
    per_call = (time.perf_counter() - t0) / 10000
    assert per_call < 20e-6, f"{per_call * 1e6:.1f} us per cached lookup"
    # a save in this process invalidates the cache
    store = D.ConfigDB.open(path, "h100", "sm_90", {})
    store.put("d128-bf16-full-gqa1-s1024", _entry(b))
    store.save()
    assert look(128, "bf16", False, 1, 1000) == b


def test_unreadable_db_is_a_warning_not_an_error(tmp_path):
    path = str(tmp_path / "h100.json")
    open(path, "w").write("{")
    D.clear_cache()
    with pytest.warns(RuntimeWarning, match="ignoring config database"):
        assert D.lookup("h100", 128, "bf16", False, 1, 1024, db_path=path) is None


def test_default_config_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    assert D.default_db_path("mi300x") == os.path.join(str(tmp_path), "mi300x.json")
    monkeypatch.delenv(D.CONFIG_DIR_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    # a user's tunes never go into the shipped databases, editable install or not
    assert D.default_db_path("mi300x") == os.path.join(str(tmp_path), "xdg", "rocmflash", "mi300x.json")
    assert D.database_paths("mi300x") == [D.default_db_path("mi300x"), D.shipped_db_path("mi300x")]


def test_shipped_databases_are_found_from_the_package():
    shipped = D.shipped_config_dir()
    assert os.path.dirname(shipped) == os.path.dirname(os.path.dirname(os.path.abspath(D.__file__)))  # rocmflash/configs
    summary = D.database_summary(D.shipped_db_path("h100"))
    assert summary["exists"] and summary["error"] is None
    assert summary["measured"] == summary["entries"] > 0
    mi250 = D.database_summary(D.shipped_db_path("mi250"))
    assert mi250["entries"] > 0 and mi250["measured"] == 0  # static rankings only


def test_user_database_takes_precedence_over_shipped(monkeypatch, tmp_path):
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    mine = KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=2, num_stages=1)
    theirs = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)
    far = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3)
    _db(shipped, {"d128-bf16-full-gqa1-s4096": _entry(theirs), "d128-bf16-full-gqa1-s16384": _entry(theirs)})
    _db(user, {"d128-bf16-full-gqa1-s4096": _entry(mine), "d128-bf16-full-gqa1-s1024": _entry(far)})
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(user))
    monkeypatch.setattr(D, "shipped_config_dir", lambda: str(shipped))
    D.clear_cache()
    look = lambda s: D.lookup("h100", 128, "bf16", False, 1, s)  # noqa: E731
    assert look(4096) == mine  # same bucket in both files: the user's wins
    assert look(16384) == theirs  # only the shipped file has the nearest bucket
    assert look(1024) == far
    assert D.lookup("h100", 128, "bf16", False, 1, 4096, db_path=str(shipped / "h100.json")) == theirs
    D.clear_cache()


def test_partition_database_records_compute_units(tmp_path):
    path = str(tmp_path / "mi300x-cpx.json")
    store = D.ConfigDB.open(path, "mi300x-cpx", "gfx942", {}, compute_units=38)
    store.save()
    assert json.load(open(path))["compute_units"] == 38
    with pytest.raises(D.DBError, match="tuned on 38 CUs"):
        D.ConfigDB.open(path, "mi300x-cpx", "gfx942", {}, compute_units=304)
    with pytest.raises(D.DBError, match="is a directory"):
        D.ConfigDB.open(str(tmp_path), "mi300x-cpx", "gfx942", {}, compute_units=38)
