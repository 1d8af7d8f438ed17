"""``rocmflash explain``: the run-time choice for a problem on a named GPU, and the evidence."""

import json

import pytest

from rocmflash.cli import main
from rocmflash.config import KernelConfig
from rocmflash import db as D


@pytest.fixture
def user_db(tmp_path, monkeypatch):
    """An empty user config dir, so only the shipped databases (and what a test writes) answer."""
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path / "user"))
    monkeypatch.delenv("ROCMFLASH_NO_DB", raising=False)
    D.clear_cache()
    yield tmp_path / "user"
    D.clear_cache()


def _json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_explain_names_the_shipped_entry_and_its_distance(user_db, capsys):
    r = _json(capsys, ["explain", "--gpu", "h100", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "3000",
                       "--no-compile"])
    assert r["asked"] == "d128-bf16-full-gqa1-s4096"
    assert r["choice"]["source"] == "db" and r["choice"]["bucket_distance"] == 1
    assert r["choice"]["entry"] == "d128-bf16-full-gqa1-s8192"  # equidistant 2048 / 8192: the larger wins
    chosen = [c for c in r["candidates"] if c.get("chosen")]
    assert len(chosen) == 1 and chosen[0]["bucket"] == 8192 and chosen[0]["served"]
    assert r["choice"]["config"] == D.lookup("h100", 128, "bf16", False, 1, 3000, measured_only=True).to_dict()
    assert any(o["head_dim"] == 64 for o in r["other_groups"]) and "verdict" not in r


def test_explain_on_a_gpu_with_only_static_rankings_uses_the_default_and_checks_it(user_db, capsys, tmp_path):
    r = _json(capsys, ["explain", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--causal",
                       "--seqlen", "4096", "--cache-dir", str(tmp_path / "cache")])
    assert r["choice"]["source"] == "default" and "no measured mi300x entry" in r["choice"]["why"]
    assert r["candidates"] and all(not c["served"] and "unmeasured" in c["why_not"] for c in r["candidates"])
    v = r["verdict"]  # the default, cross-compiled for gfx942 at this problem
    assert r["arch"] == "gfx942" and v["kept"] and (v["spills"] or 0) == 0 and v["waves_per_simd"] >= 2


def test_explain_flags_a_choice_that_spills_and_names_a_clean_one(user_db, capsys, tmp_path):
    # a "measured" user entry whose config spills on gfx90a (big tiles, 8 waves, D=256): never silently fine
    bad = KernelConfig(BLOCK_M=256, BLOCK_N=128, num_warps=4, num_stages=1)
    d = D.ConfigDB.open(str(user_db / "mi250.json"), "mi250", "gfx90a", {"test": True})
    d.put(D.problem_key(256, "fp16", False, 1, 4096), {"best": bad.to_dict(), "measured": True})
    d.save()
    r = _json(capsys, ["explain", "--gpu", "mi250", "--head-dim", "256", "--dtype", "fp16", "--seqlen", "4096",
                       "--cache-dir", str(tmp_path / "cache")])
    assert r["choice"]["source"] == "db" and r["choice"]["bucket_distance"] == 0
    assert not r["verdict"]["kept"] and r["verdict"]["reason"] in ("spills", "lds_over_budget", "compile_failed")
    assert r["fallback"] is None or r["fallback"]["verdict"]["kept"]
    assert main(["explain", "--gpu", "mi250", "--head-dim", "256", "--dtype", "fp16", "--seqlen", "4096",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "REJECTED" in out and "first candidate that compiles clean" in out


@pytest.mark.parametrize("argv, message", [
    (["--gpu", "mi9000"], "unknown GPU"),
    (["--gpu", "h100", "--head-dim", "300"], "head_dim"),
    (["--gpu", "h100", "--seqlen", "0"], "--seqlen 0 is invalid"),
    (["--gpu", "h100", "--gqa", "0"], "--gqa 0 is invalid"),
    (["--gpu", "h100", "--variant", "fast"], "--variant 'fast' is unknown"),
    (["--gpu", "h100", "--db", "."], "(it is a directory)"),
])
def test_explain_bad_input_is_one_line(argv, message, user_db, capsys):
    base = {"--head-dim": "128", "--dtype": "bf16", "--seqlen": "1024"}
    for i in range(0, len(argv), 2):
        base.pop(argv[i], None)
    args = ["explain"] + argv + [x for kv in base.items() for x in kv] + ["--no-compile"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and err.count("\n") == 1
