"""`rocmflash tune` / `rocmflash export` entry points (via a tiny argparse; cli.py wires them later)."""

import argparse
import json

import pytest

from rocmflash import db as D
from rocmflash.cli.tune import add_tune_parsers, run_export, run_tune


def cli(argv):
    parser = argparse.ArgumentParser(prog="rocmflash")
    sub = parser.add_subparsers(dest="command")
    add_tune_parsers(sub)
    args = parser.parse_args(argv)
    return run_tune(args) if args.command == "tune" else run_export(args)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMFLASH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path / "configs"))
    return tmp_path


@pytest.mark.parametrize("argv, message", [
    (["--gpu", "mi999"], "unknown GPU 'mi999'; known GPUs: mi210, mi250"),
    (["--gpu", "mi300x", "--head-dim", "512"], "head dim 512 is unsupported"),
    (["--gpu", "mi300x", "--dtype", "fp4"], "dtype='fp4' is unsupported"),
    (["--gpu", "auto"], "no live GPU"),
    (["--gpu", "mi300x", "--strategy", "exhaustive"], "needs a live mi300x"),
    (["--gpu", "mi300x", "--heads", "6", "--kv-heads", "4"], "not a multiple"),
    (["--gpu", "mi300x", "--top-k", "0"], "--top-k 0 is invalid"),
])
def test_user_errors_are_one_line_exit_2(env, capsys, argv, message):
    base = {"--head-dim": "128", "--dtype": "fp16", "--seqlen": "2048"}
    for i in range(0, len(argv), 2):
        base.pop(argv[i], None)
    code = cli(["tune", *argv, *[x for kv in base.items() for x in kv]])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert "Traceback" not in err


def test_static_tune_without_gpu_then_export(env, capsys):
    code = cli(["tune", "--gpu", "mi300x", "--head-dim", "64", "--dtype", "bf16", "--causal", "--seqlen", "3000",
                "--variant", "split_d", "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Nothing was benchmarked" in out and "no live GPU" in out and '"measured": false' in out
    data = D.ConfigDB.read(str(env / "configs" / "mi300x.json"))
    entry = data["entries"]["d64-bf16-causal-gqa1-s4096"]
    # --pass both (the default) wrote the backward's static entry too: export lists it in its own section
    assert data["entries"]["bwd-d64-bf16-causal-gqa1-s4096"]["measured"] is False
    assert entry["measured"] is False and entry["best"]["variant"] == "split_d"
    assert cli(["export", "--gpu", "mi300x", "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["measured"] is False and list(exported["entries"]) == ["d64-bf16-causal-gqa1-s4096"]
    assert list(exported["families"]["bwd"]["entries"]) == ["bwd-d64-bf16-causal-gqa1-s4096"]
    assert exported["families"]["bwd"]["entries"]["bwd-d64-bf16-causal-gqa1-s4096"]["status"] == "static"
    assert cli(["export", "--gpu", "mi300x"]) == 0  # no online config in this DB: an empty list, still valid
    text = capsys.readouterr().out
    assert "import triton" in text and "AUTOTUNE_CONFIGS" in text


def _measured_db(path):
    from rocmflash.config import KernelConfig

    cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, PRE_LOAD_V=True)
    store = D.ConfigDB.open(path, "h100", "sm_90", D.environment("NVIDIA H100 80GB HBM3"))
    store.put("d128-bf16-full-gqa1-s2048", {"best": cfg.to_dict(), "measured": True, "tflops": 471.25,
                                            "best_per_variant": {"online": {"config": cfg.to_dict(), "tflops": 471.25}}})
    store.save()


def test_export_triton_and_json(env, capsys):
    path = str(env / "h100.json")
    _measured_db(path)
    assert cli(["export", "--gpu", "h100", "--db", path]) == 0
    text = capsys.readouterr().out
    namespace = {}
    triton = pytest.importorskip("triton")
    exec(text, namespace)  # the printed text is valid Python building triton.Config objects
    (cfg,) = namespace["AUTOTUNE_CONFIGS"]
    assert isinstance(cfg, triton.Config) and cfg.kwargs == {"BLOCK_M": 128, "BLOCK_N": 64, "PRE_LOAD_V": True}
    assert cfg.num_warps == 8 and cfg.num_stages == 3
    assert "471.2 TFLOP/s" in text or "471.3 TFLOP/s" in text
    assert cli(["export", "--gpu", "h100", "--db", path, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    item = data["entries"]["d128-bf16-full-gqa1-s2048"]
    assert item["triton_config"] == {"kwargs": {"BLOCK_M": 128, "BLOCK_N": 64, "PRE_LOAD_V": True},
                                     "num_warps": 8, "num_stages": 3}
    assert data["measured"] is True


def test_export_errors(env, capsys):
    assert cli(["export", "--gpu", "h200"]) == 2
    assert "no config database for h200" in capsys.readouterr().err
    assert cli(["export", "--gpu", "nope"]) == 2
    assert "unknown GPU" in capsys.readouterr().err


def test_replay_flag_runs_the_measured_path(env, capsys, tmp_path):
    from rocmflash.config import KernelConfig

    from rocmflash.hw.roofline import Shape

    shape = Shape(batch=8, heads_q=16, heads_kv=16, seqlen_q=2048, seqlen_k=2048, head_dim=128, dtype="bf16")
    recorded = tmp_path / "rec.jsonl"
    with open(recorded, "w") as f:
        for bn, ms in ((32, 0.7), (64, 0.6)):
            cfg = KernelConfig(BLOCK_M=128, BLOCK_N=bn, num_warps=8, num_stages=3)
            f.write(json.dumps({"config": cfg.to_dict(), "shape": shape.to_dict(), "status": "ok", "median_ms": ms})
                    + "\n")
    code = cli(["tune", "--gpu", "h100", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "2048", "--variant",
                "online", "--strategy", "pruned", "--top-k", "4", "--replay", str(recorded), "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "timed 4 config(s)" in out
    entry = D.ConfigDB.read(str(env / "configs" / "h100.json"))["entries"]["d128-bf16-full-gqa1-s2048"]
    assert entry["measured"] is True and entry["counts"]["failed"] >= 2


def _replay_journal(path, statuses):
    """A recorded journal of the two online configs the replay test times: ``statuses`` per BLOCK_N."""
    from rocmflash.config import KernelConfig
    from rocmflash.hw.roofline import Shape

    shape = Shape(batch=8, heads_q=16, heads_kv=16, seqlen_q=2048, seqlen_k=2048, head_dim=128, dtype="bf16")
    with open(path, "w") as f:
        for bn, status in statuses.items():
            cfg = KernelConfig(BLOCK_M=128, BLOCK_N=bn, num_warps=8, num_stages=3)
            record = {"config": cfg.to_dict(), "shape": shape.to_dict(), "status": status}
            record.update({"median_ms": 0.6} if status == "ok" else {"error": "CUDA error: an illegal memory access"})
            f.write(json.dumps(record) + "\n")
    return path


REPLAY_ARGS = ["tune", "--gpu", "h100", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "2048", "--variant",
               "online", "--strategy", "pruned", "--top-k", "4", "--workers", "2", "--replay"]


def test_a_tune_where_no_config_passes_fails_and_keeps_an_earlier_entry(env, capsys, tmp_path):
    """Issue 51: a problem whose every config failed is never `"measured": true` without a best, and the tune
    exits non-zero naming the cause; a failed re-tune keeps the earlier measured entry."""
    failing = _replay_journal(tmp_path / "bad.jsonl", {32: "crashed", 64: "failed"})
    key = "d128-bf16-full-gqa1-s2048"
    fresh = str(tmp_path / "fresh" / "h100.json")
    assert cli(REPLAY_ARGS + [str(failing), "--db", fresh]) == 1
    captured = capsys.readouterr()
    assert "1 problem(s) had no passing config" in captured.err and key in captured.err
    assert "no timed config passed" in captured.err and "1 crashed" in captured.err
    assert "FAILED" in captured.out
    entry = D.ConfigDB.read(fresh)["entries"][key]
    assert entry["measured"] is False and entry["best"] is None and "crashed" in entry["failed"]
    assert D.lookup("h100", 128, "bf16", False, 1, 2048, db_path=fresh, measured_only=True) is None

    good_db = str(tmp_path / "good" / "h100.json")
    assert cli(REPLAY_ARGS + [str(_replay_journal(tmp_path / "good.jsonl", {32: "ok", 64: "ok"})), "--db", good_db]) == 0
    good = D.ConfigDB.read(good_db)
    earlier = good["entries"][key]
    assert earlier["best"] is not None and earlier["measured"] is True
    retuned = str(tmp_path / "retuned" / "h100.json")  # a database holding that entry, and no journal of it
    db = D.ConfigDB.open(retuned, "h100", "sm_90", good["fingerprint"])
    db.put(key, earlier)
    db.save(good["fingerprint"])
    capsys.readouterr()
    assert cli(REPLAY_ARGS + [str(failing), "--db", retuned]) == 1
    assert "the earlier entry is kept" in capsys.readouterr().err
    assert D.ConfigDB.read(retuned)["entries"][key] == earlier
