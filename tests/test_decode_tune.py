"""Decode tuning: keys, split choices, the static phase for gfx942, the live phase (fake ROCm, interpreter),
database entries and their run-time lookup, and the CLI (`vgpr-report --mode decode`, `tune --mode decode`)."""

import dataclasses
import json
import os

import pytest

from rocmflash import db as D
from rocmflash.db.lookups import decode as LD
from rocmflash.kernels.decode import host as KD
from rocmflash.tuning import decode as TD


def test_keys_round_trip_and_forward_keys_are_not_decode():
    key = TD.decode_key(128, "bfloat16", 8, 3000, 24, 256)
    assert key == "decode-d128-bf16-gqa8-kv4096-b32-p256"
    assert LD.parse_decode_key(key) == {"head_dim": 128, "dtype": "bf16", "group": 8, "kv_bucket": 4096,
                                        "batch_bucket": 32, "page_size": 256}
    assert LD.parse_decode_key(TD.decode_key(64, "fp16", 1, 2048, 1)) ["page_size"] == 0
    assert LD.parse_decode_key("d128-bf16-causal-gqa1-s2048") is None


def test_split_choices_respect_blocks_and_include_the_heuristic():
    p = TD.DecodeProblem(batch=1, heads_q=32, heads_kv=8, seqlen_k=32768)
    one_stage = KD.DecodeConfig(BLOCK_N=64, num_stages=1)
    choices = TD.split_choices(p, one_stage, 132)
    assert choices[0] == 1 and choices[-1] == 64 and choices == sorted(set(choices))
    short = TD.DecodeProblem(batch=64, seqlen_k=100)
    assert TD.split_choices(short, one_stage, 132) == [1, 2]  # 2 key blocks at most


def _entry(cfg, measured=True, timing="gpu"):
    return {"mode": "decode", "measured": measured, "timing": timing, "best": cfg}


def test_lookup_serves_nearest_measured_entry_only(tmp_path, monkeypatch):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    # the rule alone: the shipped h100.json's own decode entries would be nearer for some asks
    monkeypatch.setattr(D, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    data = D.ConfigDB.new_data("h100", "sm_90", {})
    near = dict(BLOCK_N=32, num_warps=4, num_stages=2, waves_per_eu=0, num_splits=8)
    far = dict(BLOCK_N=128, num_warps=8, num_stages=3, waves_per_eu=0, num_splits=1)
    data["entries"] = {
        TD.decode_key(128, "bf16", 8, 8192, 8): _entry(near),
        TD.decode_key(128, "bf16", 8, 65536, 8): _entry(far),
        TD.decode_key(128, "bf16", 8, 4096, 8): _entry(far, measured=False),  # static: never served
        TD.decode_key(128, "bf16", 8, 16384, 8): _entry(far, timing="interpreter"),  # interpreter: never served
        "d128-bf16-causal-gqa8-s4096": {"measured": True, "best": {"variant": "online", "BLOCK_M": 64, "BLOCK_N": 64,
                                                                    "num_warps": 4, "num_stages": 2}},
    }
    D.atomic_write_json(str(tmp_path / "h100.json"), data)
    D.clear_cache()
    LD.clear_cache()
    got = LD.lookup_decode("h100", 128, "bf16", 8, 5000, 8)
    assert got is not None and got.BLOCK_N == 32 and got.num_splits == 8
    assert LD.lookup_decode("h100", 128, "bf16", 8, 60000, 8).BLOCK_N == 128
    # another batch bucket: the tiles carry over, the split count is chosen per call
    other = LD.lookup_decode("h100", 128, "bf16", 8, 8192, 1)
    assert other.BLOCK_N == 32 and other.num_splits == 0
    assert LD.lookup_decode("h100", 64, "bf16", 8, 5000, 8) is None  # other head dim: nothing
    # the forward lookup reads the same file and ignores the decode entries
    assert D.lookup("h100", 128, "bf16", True, 8, 4096).BLOCK_M == 64
    LD.clear_cache()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("decode-cache"))


def test_cli_vgpr_report_decode_mi300x(cache_dir, tmp_path, capsys):
    """The decode kernels cross-compiled for gfx942: registers read from the code objects, a verdict per config."""
    from rocmflash.cli import main

    out = tmp_path / "rep"
    code = main(["vgpr-report", "--mode", "decode", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16",
                 "--out", str(out), "--cache-dir", cache_dir, "--workers", "2", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(TD.decode_space("gfx942"))
    kept = [r for r in rows if r["kept"]]
    assert kept and all(r["kernel"]["arch"] == "gfx942" for r in kept)
    # a kept config spills nothing, or only where the ISA shows it harmless (outside loops), and says so
    assert all(r["kernel"]["vgpr_spill_count"] == 0 or r["reason"] == "harmless_spill" for r in kept)
    assert any(r["reason"] == "spills" for r in rows)  # the pruner sees real spills in this space
    assert [r["static_rank"] for r in kept] == list(range(len(kept)))
    text = (out / "report.md").read_text()
    assert "gfx942" in text and "| BN" in text


def test_cli_tune_decode_static_only_on_cpu(cache_dir, tmp_path, capsys, monkeypatch):
    """No live MI300X: the static #1 is written with "measured": false and num_splits 0, and never served."""
    from rocmflash.cli import main

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    code = main(["tune", "--mode", "decode", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16",
                 "--seqlen", "8192", "--batch", "16", "--cache-dir", cache_dir, "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "not measured" in out
    entries = D.ConfigDB.read(str(tmp_path / "mi300x.json"))["entries"]
    entry = entries["decode-d128-bf16-gqa4-kv8192-b16"]
    assert entry["measured"] is False and entry["best"]["num_splits"] == 0 and entry["mode"] == "decode"
    LD.clear_cache()
    assert LD.lookup_decode("mi300x", 128, "bf16", 4, 8192, 16) is None
    assert main(["export", "--gpu", "mi300x", "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["entries"] == {}  # the forward's; decode's is in its own section, unmeasured
    item = exported["families"]["decode"]["entries"]["decode-d128-bf16-gqa4-kv8192-b16"]
    assert item["measured"] is False and item["status"] == "static" and item["num_splits"] == 0


def test_tune_decode_live_phase_under_fake_rocm(fake_rocm, tmp_path):
    """On a (fake) live MI250 the survivors are gated and timed at every split count in the worker (interpreter)."""
    from rocmflash.tuning.decode_run import tune_decode

    configs = [dict(BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=2, num_splits=0),
               dict(BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2, num_splits=0)]
    problem = TD.DecodeProblem(head_dim=32, dtype="fp16", heads_q=4, heads_kv=2, batch=2, seqlen_k=64)
    db_path = str(tmp_path / "mi250.json")
    result = tune_decode("mi250", problem, db_path, str(tmp_path / "cache"), 2, 120.0, configs=configs)
    assert result.measured and [r["status"] for r in result.results] == ["ok"] * len(result.static.ranked)
    entry = D.ConfigDB.read(db_path)["entries"][problem.key()]
    assert entry["measured"] and entry["timing"] == "interpreter" and entry["best"]["num_splits"] >= 1
    assert all(set(r["times_ms"]) == {str(n) for n in TD.split_choices(problem, KD.DecodeConfig.from_dict(r["config"]),
                                                                          132)}
               for r in result.results)
    assert entry["counts"]["ok"] == len(result.results)
    assert os.path.exists(db_path)


@pytest.mark.parametrize("value, said", [("16,x", "not a page size"), ("16,-4", "page size -4 is invalid")])
def test_cli_tune_decode_bad_page_size_is_one_line(value, said, capsys):
    from rocmflash.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--mode", "decode", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16",
              "--seqlen", "4096", "--page-size", value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and "Traceback" not in err


def test_page_sizes_compared_under_fake_rocm(fake_rocm, tmp_path):
    """Two page sizes of one problem, each tuned live (interpreter): one entry per page size, rows fastest first."""
    from rich.console import Console

    from rocmflash.tuning.decode_run import page_size_rows, print_page_size_comparison, tune_decode

    configs = [dict(BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=2, num_splits=0)]
    db_path = str(tmp_path / "mi250.json")
    results = []
    for page in (16, 32):
        problem = TD.DecodeProblem(head_dim=32, dtype="fp16", heads_q=4, heads_kv=2, batch=2, seqlen_k=64,
                                   page_size=page)
        results.append(tune_decode("mi250", problem, db_path, str(tmp_path / "cache"), 2, 120.0, configs=configs))
    entries = D.ConfigDB.read(db_path)["entries"]
    assert {"decode-d32-fp16-gqa2-kv64-b2-p16", "decode-d32-fp16-gqa2-kv64-b2-p32"} <= set(entries)
    rows = page_size_rows(results)
    assert sorted(row[0] for row in rows) == [16, 32]
    assert [row[2] for row in rows] == sorted(row[2] for row in rows) and rows[0][4] == 1.0
    for page, best, us, _, _ in rows:
        assert us == pytest.approx(entries[f"decode-d32-fp16-gqa2-kv64-b2-p{page}"]["time_ms"] * 1e3)
    console = Console(record=True, width=120)
    print_page_size_comparison(results, console)
    text = console.export_text()
    assert "page sizes" in text and "vs fastest" in text and "1.00x" in text
    # without a live GPU there is nothing to compare, and the output says so
    unmeasured = [dataclasses.replace(r, measured=False) for r in results]
    assert page_size_rows(unmeasured) == []


def test_shipped_decode_entries_are_served_at_their_own_buckets(tmp_path, monkeypatch):
    """Every decode entry shipped in configs/ parses, is servable, and a lookup at its own buckets (an
    empty user database) returns its config with its split count."""
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    D.clear_cache()
    LD.clear_cache()
    seen = 0
    for name in sorted(os.listdir(D.shipped_config_dir())):
        if not name.endswith(".json"):
            continue
        gpu = name[:-len(".json")]
        for key, entry in D.ConfigDB.read(os.path.join(D.shipped_config_dir(), name))["entries"].items():
            p = LD.parse_decode_key(key)
            if p is None or not D.servable(entry):
                continue
            problem = entry["problem"]
            assert TD.decode_key(problem["head_dim"], problem["dtype"], problem["heads_q"] // problem["heads_kv"],
                                 problem["seqlen_k"], problem["batch"], problem["page_size"],
                                 problem.get("kv_dtype", "")) == key
            got = LD.lookup_decode(gpu, p["head_dim"], p["dtype"], p["group"], problem["seqlen_k"],
                                   problem["batch"], p["page_size"], p.get("kv_dtype", ""))
            assert got == KD.DecodeConfig.from_dict(entry["best"]), key
            seen += 1
    assert seen >= 12  # the H100's decode grid (docs/evidence/decode-entries-2026-11-25-h100.md)
    LD.clear_cache()
