"""Run-time config selection: database entry for the live GPU (nearest bucket), else the per-arch
default; cached; never tunes. The live GPU is faked (monkeypatched identity) so this runs on CPU."""

import sys
import time

import pytest

from rocmflash.api import selection
from rocmflash.config import KernelConfig, default_config


pytestmark = pytest.mark.usefixtures("fresh_selection")


class _Dev:
    type = "cuda"
    index = 0


def _fake_gpu(monkeypatch, name="h100", arch="sm_90"):
    monkeypatch.setattr(selection, "device_identity", lambda device: (name, arch))


def _write_db(tmp_path, monkeypatch, entries):
    db = pytest.importorskip("rocmflash.db")
    monkeypatch.setenv(db.CONFIG_DIR_ENV, str(tmp_path))
    # only this test's database: the shipped ones would answer the "no entry" cases
    monkeypatch.setattr(db, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    d = db.ConfigDB.open(str(tmp_path / "h100.json"), "h100", "sm_90", {"test": True})
    for (D, dtype, causal, gqa, bucket), (cfg, measured) in entries.items():
        d.put(db.problem_key(D, dtype, causal, gqa, bucket), {"best": cfg.to_dict(), "measured": measured})
    d.save()
    return db


def test_db_entry_wins_nearest_bucket(tmp_path, monkeypatch):
    tuned_2k = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    tuned_8k = KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
    _write_db(tmp_path, monkeypatch, {(128, "bf16", True, 4, 2048): (tuned_2k, True),
                                      (128, "bf16", True, 4, 8192): (tuned_8k, True)})
    _fake_gpu(monkeypatch)
    import torch

    pick = lambda s: selection.select_config(_Dev(), 128, torch.bfloat16, True, 4, s, s)  # noqa: E731
    assert pick(2048) == tuned_2k
    assert pick(1500) == tuned_2k      # bucket 2048
    assert pick(7000) == tuned_8k      # bucket 8192
    assert pick(64000) == tuned_8k     # nearest available bucket
    assert selection.selection_source(_Dev(), 128, torch.bfloat16, True, 4, 2048) == "db"
    # a different head dim / GQA ratio / dtype has no entry: the per-arch default
    assert selection.select_config(_Dev(), 64, torch.bfloat16, True, 4, 2048, 2048) == default_config("sm_90", 64)
    assert selection.select_config(_Dev(), 128, torch.float16, True, 4, 2048, 2048) == default_config("sm_90", 128)
    assert selection.select_config(_Dev(), 128, torch.bfloat16, True, 1, 2048, 2048) == default_config("sm_90", 128)


def test_unmeasured_entries_and_other_variants_are_not_used(tmp_path, monkeypatch):
    static_only = KernelConfig(BLOCK_M=32, BLOCK_N=32)
    _write_db(tmp_path, monkeypatch, {(64, "fp16", False, 1, 4096): (static_only, False)})
    _fake_gpu(monkeypatch)
    import torch

    assert selection.select_config(_Dev(), 64, torch.float16, False, 1, 4096, 4096) == default_config("sm_90", 64)
    assert selection.select_config(_Dev(), 64, torch.float16, False, 1, 4096, 4096, "split_d") == \
        default_config("sm_90", 64, "split_d")


def test_no_db_env_and_missing_db_module(tmp_path, monkeypatch):
    tuned = KernelConfig(BLOCK_M=64, BLOCK_N=32)
    _write_db(tmp_path, monkeypatch, {(128, "bf16", False, 1, 1024): (tuned, True)})
    _fake_gpu(monkeypatch)
    import torch

    monkeypatch.setenv(selection.NO_DB_ENV, "1")
    assert selection.select_config(_Dev(), 128, torch.bfloat16, False, 1, 1024, 1024) == default_config("sm_90", 128)
    monkeypatch.delenv(selection.NO_DB_ENV)
    selection.clear_cache()
    import rocmflash

    monkeypatch.setitem(sys.modules, "rocmflash.db", None)  # import fails -> default
    monkeypatch.delattr(rocmflash, "db", raising=False)
    assert selection.select_config(_Dev(), 128, torch.bfloat16, False, 1, 1024, 1024) == default_config("sm_90", 128)


def test_cpu_interpreter_gets_the_generic_default(monkeypatch):
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = selection.select_config(torch.device("cpu"), 64, torch.float16, True, 1, 100, 100)
    assert cfg == default_config(None, 64)


def test_repeat_lookup_costs_microseconds(tmp_path, monkeypatch):
    _write_db(tmp_path, monkeypatch, {(128, "bf16", True, 1, 4096): (KernelConfig(BLOCK_M=64), True)})
    _fake_gpu(monkeypatch)
    import torch

    dev = _Dev()
    selection.select_config(dev, 128, torch.bfloat16, True, 1, 4096, 4096)
    n = 20000
    t0 = time.perf_counter()
    for i in range(n):
        selection.select_config(dev, 128, torch.bfloat16, True, 1, 4000 + (i & 63), 4000 + (i & 63))
    per_call_us = (time.perf_counter() - t0) / n * 1e6
    assert per_call_us < 20, f"{per_call_us:.2f} us per cached selection"


def test_selection_never_tunes(monkeypatch):
    """No tuner/benchmark module is imported by a selection."""
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for mod in ("rocmflash.tune", "rocmflash.tuning.live"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    selection.select_config(torch.device("cpu"), 128, torch.bfloat16, False, 1, 512, 512)
    assert "rocmflash.tune" not in sys.modules and "rocmflash.tuning.live" not in sys.modules


def test_selection_says_which_entry_it_used_and_how_far_it_is(tmp_path, monkeypatch, caplog):
    import logging

    import torch

    tuned = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    db = _write_db(tmp_path, monkeypatch, {(128, "bf16", True, 4, 2048): (tuned, True)})
    _fake_gpu(monkeypatch)
    with caplog.at_level(logging.INFO, logger="rocmflash.api.selection"):
        assert selection.select_config(_Dev(), 128, torch.bfloat16, True, 4, 7000, 7000) == tuned
        selection.select_config(_Dev(), 128, torch.bfloat16, True, 4, 7000, 7000)  # cached: logged once
    d = selection.selection_details(_Dev(), 128, torch.bfloat16, True, 4, 7000)
    assert d["source"] == "db" and d["entry"] == "d128-bf16-causal-gqa4-s2048" and d["bucket_distance"] == 2
    assert d["asked"] == "d128-bf16-causal-gqa4-s8192" and d["path"] == str(tmp_path / "h100.json")
    assert "2 bucket(s) (4x in length) from s8192" in d["text"]
    assert [r.getMessage() for r in caplog.records].count("rocmflash: " + d["text"]) == 1
    selection.select_config(_Dev(), 64, torch.bfloat16, True, 4, 2048, 2048)
    d = selection.selection_details(_Dev(), 64, torch.bfloat16, True, 4, 2048)
    assert d["source"] == "default" and "no measured h100 entry for d64/" in d["text"]
    assert db.lookup_match("h100", 128, "bf16", True, 4, 2048).bucket_distance == 0
