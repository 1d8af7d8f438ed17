"""Varlen tuning (`rocmflash tune --mode varlen`): the packed problem and its keys, the static phase on real
gfx942 compiles (`vgpr-report --mode varlen`, `tune --mode varlen` without a GPU), bad input, the live phase
under a fake ROCm (interpreter), and run-time selection in `flash_attn_varlen_func`.

The CLI tests replace the 336-config gfx942 space by six configs (three spill at D=128), so a run
compiles six kernels once, shared through a module-scoped cache."""

import dataclasses
import json
import math

import pytest
import torch

from rocmflash import db as D
from rocmflash.api import selection
from rocmflash.config import KernelConfig as K
from rocmflash.db.lookups import varlen as LV
from rocmflash.tuning import varlen as TV

#: six gfx942 configs at D=128 bf16: 128x64 wpe2, 128x32 m32 and 64x32 compile clean; 128x128 pv, 256x128 w8
#: and 128x64 wpe3 spill (cross-compiled with Triton 3.6)
SMALL_SPACE = [K(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2),
               K(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=1, waves_per_eu=2, PRE_LOAD_V=True),
               K(BLOCK_M=256, BLOCK_N=128, num_warps=8, num_stages=1),
               K(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1),
               K(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=3),
               K(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=32)]


# ----------------------------------------------------------------------------- problem, keys, space
def test_spread_is_deterministic_and_documented():
    assert TV.spread_lengths(8, 4096) == (512, 1024, 1536, 2048, 2560, 3072, 3584, 4096)
    assert TV.spread_lengths(1, 3000) == (3000,)
    assert TV.spread_lengths(3, 5) == (1, 3, 5)  # never below one token
    p = TV.VarlenProblem.spread(8, 4096, head_dim=128, dtype="bfloat16", heads_q=16, heads_kv=4, causal=True)
    assert p.dtype == "bf16" and p.group == 4 and p.max_seqlen == 4096
    assert TV.VarlenProblem.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    # causal pairs: n(n+1)/2 per sequence
    assert p.flops() == 4 * 128 * 16 * sum(n * (n + 1) // 2 for n in p.lengths)


def test_keys_round_trip_and_other_lookups_skip_them(tmp_path, monkeypatch):
    from rocmflash.db.lookups import backward as LB
    from rocmflash.db.lookups import decode as LD

    causal = TV.varlen_key(128, torch.bfloat16, 4, True, 3000)
    full = TV.varlen_key(64, "fp16", 1, False, 4096)
    assert (causal, full) == ("varlen-d128-bf16-gqa4-causal-s4096", "varlen-d64-fp16-gqa1-s4096")
    assert LV.parse_varlen_key(causal) == {"head_dim": 128, "dtype": "bf16", "group": 4, "causal": True,
                                           "bucket": 4096}
    assert LV.parse_varlen_key(full)["causal"] is False
    for other in ("d128-bf16-causal-gqa4-s4096", "bwd-d128-bf16-causal-gqa4-s4096", "decode-d128-bf16-gqa4-kv4096-b8",
                  "varlen-d128-bf16-gqa4-full-s4096"):
        assert LV.parse_varlen_key(other) is None, other
    # a database holding only varlen entries gives the dense, backward and decode lookups nothing (GQA 2: the
    # shipped h100.json, also read, has no entry of that ratio)
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    data = D.ConfigDB.new_data("h100", "sm_90", {})
    best = K(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2).to_dict()
    entry = {"mode": "varlen", "measured": True, "timing": "gpu", "best": best}
    data["entries"] = {TV.varlen_key(128, "bf16", 2, True, 4096): entry,
                       TV.varlen_key(128, "bf16", 2, False, 4096): entry}
    D.atomic_write_json(str(tmp_path / "h100.json"), data)
    D.clear_cache()
    selection.clear_cache()
    assert D.lookup("h100", 128, "bf16", True, 2, 4096) is None
    assert D.lookup("h100", 128, "bf16", False, 2, 4096) is None
    assert LB.lookup_bwd("h100", 128, "bf16", True, 2, 4096) is None
    assert LD.lookup_decode("h100", 128, "bf16", 2, 4096, 8) is None
    assert LV.lookup_varlen("h100", 128, "bf16", 2, True, 4096).config == K.from_dict(best)
    assert LV.lookup_varlen("h100", 128, "bf16", 2, True, 512).bucket_distance == 3  # nearest bucket serves
    selection.clear_cache()


def test_space_is_the_dense_online_space():
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.static.space import default_space

    p = TV.VarlenProblem()
    for name in ("mi300x", "h100"):
        gpu = get_gpu(name)
        space = TV.varlen_space(gpu, p)
        dense = default_space(gpu, ["online"]).configs(p.dense_problem(), gpu)
        assert [K.from_dict(c) for c in space] == dense and {c["variant"] for c in space} == {"online"}
    assert len(TV.varlen_space(get_gpu("mi300x"), p)) == 336  # the knobs listed in rocmflash/space.py


# ----------------------------------------------------------------------------- static phase and the CLI
@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("varlen-cache"))


@pytest.fixture
def small_space(monkeypatch):
    monkeypatch.setattr(TV, "varlen_space", lambda gpu, problem: [c.to_dict() for c in SMALL_SPACE])


def test_cli_vgpr_report_varlen_mi300x(small_space, cache_dir, tmp_path, capsys):
    """The varlen forward cross-compiled for gfx942: registers from the code objects, a verdict per config."""
    from rocmflash.cli import main

    out = tmp_path / "rep"
    code = main(["vgpr-report", "--mode", "varlen", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16",
                 "--causal", "--heads", "16", "--kv-heads", "4", "--out", str(out), "--cache-dir", cache_dir,
                 "--workers", "2", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(SMALL_SPACE)
    kept = [r for r in rows if r["kept"]]
    assert kept and all(r["kernel"]["arch"] == "gfx942" for r in rows)
    assert all(r["kernel"]["vgpr_spill_count"] == 0 or r["reason"] == "harmless_spill" for r in kept)
    pruned = [r for r in rows if not r["kept"]]
    assert pruned and all(r["reason"] == "spills" and r["kernel"]["vgpr_spill_count"] > 0 for r in pruned)
    assert [r["static_rank"] for r in kept] == list(range(len(kept)))
    text = (out / "report.md").read_text()
    assert "varlen forward kernel on mi300x (gfx942)" in text and "| 128x64 w4 s1 wpe2" in text
    # the table (not JSON) prints the rows too
    assert main(["vgpr-report", "--mode", "varlen", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16",
                 "--causal", "--heads", "16", "--kv-heads", "4", "--out", str(out), "--cache-dir", cache_dir]) == 0
    table = capsys.readouterr().out
    assert "128x64 w4 s1 wpe2" in table and "spills" in table and "varlen configs kept" in table


def test_cli_tune_varlen_static_only_on_cpu(small_space, cache_dir, tmp_path, capsys, monkeypatch):
    """No live MI300X: the static #1 is written with "measured": false under the varlen key, and never served."""
    from rocmflash.cli import main

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    code = main(["tune", "--mode", "varlen", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--causal",
                 "--heads", "16", "--kv-heads", "4", "--batch", "8", "--seqlen", "3000", "--cache-dir", cache_dir,
                 "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "not measured" in out and "3 survive the static phase" in out
    assert "forward only: --pass bwd or --pass both also tunes the varlen backward" in out  # no --pass: forward
    data = D.ConfigDB.read(str(tmp_path / "mi300x.json"))
    assert list(data["entries"]) == ["varlen-d128-bf16-gqa4-causal-s4096"]
    entry = data["entries"]["varlen-d128-bf16-gqa4-causal-s4096"]
    assert entry["mode"] == "varlen" and entry["measured"] is False and entry["strategy"] == "static"
    assert entry["problem"]["lengths"] == list(TV.spread_lengths(8, 3000)) and entry["problem"]["heads_q"] == 16
    assert entry["counts"] == {"space": 6, "survivors": 3, "timed": 0}
    # the static #1: the dense forward's AMD static key prefers the 128-row, 64-wide tile at 2 waves
    assert K.from_dict(entry["best"]) == SMALL_SPACE[0]
    assert "no live GPU" in entry["why_unmeasured"]
    LV.clear_cache()
    assert LV.lookup_varlen("mi300x", 128, "bf16", 4, True, 4096) is None  # static entries are never served
    assert main(["export", "--gpu", "mi300x", "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["entries"] == {}  # the forward's; the packed forward's is in its own section, unmeasured
    item = exported["families"]["varlen"]["entries"]["varlen-d128-bf16-gqa4-causal-s4096"]
    assert item["measured"] is False and item["status"] == "static" and item["label"] == "UNMEASURED: static ranking"


@pytest.mark.parametrize("args, words", [
    (["--seqlen", "0"], "--seqlen 0 is invalid"),
    (["--seqlen", "4096", "--batch", "0"], "--batch 0 is invalid"),
    (["--seqlen", "4096", "--heads", "12", "--kv-heads", "5"],
     "--heads 12 must be a positive multiple of --kv-heads 5"),
    (["--seqlen", "4096", "--head-dim", "512"], "--head-dim 512 is invalid"),
    (["--seqlen", "4096", "--dtype", "fp32"], "dtype='fp32' is unsupported"),
    (["--lengths", "256,x"], "--lengths '256,x' is invalid"),
    (["--lengths", "256,0"], "--lengths '256,0' is invalid"),
    (["--lengths", "256", "--seqlen", "256"], "--lengths gives the packed batch itself"),
    ([], "needs --seqlen (or --lengths)"),
    (["--seqlen", "4096", "--replay", "journal.jsonl"], "--replay does not go with --mode varlen"),
    (["--seqlen", "4096", "--gpus", "all"], "--gpus does not go with --mode varlen"),
    (["--seqlen", "4096", "--gpu", "mi999"], "mi999"),
])
def test_cli_tune_varlen_bad_input_is_one_line(args, words, capsys):
    """Bad input is caught before any compile: one line on stderr, exit code 2, no traceback."""
    from rocmflash.cli import main

    base = {"--gpu": "mi300x", "--head-dim": "128", "--dtype": "bf16"}
    for flag, value in zip(args[::2], args[1::2]):
        base.pop(flag, None)
    argv = ["tune", "--mode", "varlen", *[x for kv in base.items() for x in kv], *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1 and "Traceback" not in err
    assert main(["tune", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--lengths", "8,16"]) == 2
    assert "--lengths is for --mode varlen" in capsys.readouterr().err


# ----------------------------------------------------------------------------- live phase (fake ROCm, interpreter)
def test_tune_varlen_live_phase_under_fake_rocm(fake_rocm, tmp_path, monkeypatch):
    """On a (fake) live MI250 every survivor and the config served before are gated on a packed batch and
    timed in the isolated worker (interpreter); the entry records it and is never served (interpreter time)."""
    from rocmflash.tuning.items_varlen import dense_choice
    from rocmflash.tuning.varlen_run import tune_varlen

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    configs = [K(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=2).to_dict(),
               K(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2).to_dict()]
    problem = TV.VarlenProblem(head_dim=32, dtype="fp16", heads_q=4, heads_kv=2, causal=True, lengths=(5, 40, 19))
    db_path = str(tmp_path / "mi250.json")
    result = tune_varlen("mi250", problem, db_path, str(tmp_path / "cache"), 2, 300.0, configs=configs)
    assert result.measured
    baseline = dense_choice(result.gpu, problem)
    assert baseline["source"] == "per-arch default (gfx90a)" and baseline["config"] not in configs
    timed = [r["config"] for r in result.results]
    assert timed == [r["config"] for r in result.static.ranked] + [baseline["config"]]
    assert [r["status"] for r in result.results] == ["ok"] * len(timed), result.results
    assert all(r["rel_err"] < 1e-2 and r["time_ms"] > 0 for r in result.results)
    entry = D.ConfigDB.read(db_path)["entries"]["varlen-d32-fp16-gqa2-causal-s64"]
    assert entry["measured"] and entry["mode"] == "varlen" and entry["timing"] == "interpreter"
    assert entry["best"] in timed and entry["counts"]["ok"] == len(timed)
    assert entry["baseline"]["config"] == baseline["config"] and entry["baseline"]["status"] == "ok"
    assert entry["speedup_vs_baseline"] > 0
    LV.clear_cache()
    assert LV.lookup_varlen("mi250", 32, "fp16", 2, True, 40) is None  # interpreter times are never served


def test_gate_catches_a_wrong_kernel(interpret, monkeypatch):
    """The worker's gate fails a config whose output is wrong (here: the kernel is told the wrong scale)."""
    from rocmflash.tuning import varlen_worker as W

    problem = TV.VarlenProblem(head_dim=32, dtype="fp16", heads_q=2, heads_kv=1, causal=False, lengths=(9, 33))
    task = {"config": K(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1).to_dict(), "problem": problem.to_dict()}
    W._INPUTS.clear()
    good = W.measure_varlen(task)
    assert good["status"] == "ok" and good["rel_err"] < 1e-2 and good["timing"] == "interpreter"
    real = W.varlen_call
    monkeypatch.setattr(W, "varlen_call", lambda p: dataclasses.replace(real(p), sm_scale=0.5))
    bad = W.measure_varlen(task)
    assert bad["status"] == "incorrect" and "relative error" in bad["error"], bad
    W._INPUTS.clear()


# ----------------------------------------------------------------------------- run-time selection
def _write_db(tmp_path, entries: dict) -> None:
    from varlen_reference import write_mi250_db

    write_mi250_db(tmp_path, entries)


def test_flash_attn_varlen_func_serves_measured_varlen_entries_only(fake_rocm, tmp_path, monkeypatch):
    """A measured varlen entry (nearest bucket) is what the forward launches, with correct results; measured:false
    and interpreter-timed entries are skipped; the choice is looked up once per problem and bucket."""
    import rocmflash
    from rocmflash.kernels.varlen import host as VK
    from varlen_reference import rel_err, varlen_fp64

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    tuned = K(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1, waves_per_eu=1)
    static_only = K(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
    gpu_entry = {"mode": "varlen", "measured": True, "timing": "gpu (L2 flushed, median)", "best": tuned.to_dict()}
    _write_db(tmp_path, {
        TV.varlen_key(32, "fp16", 2, True, 64): gpu_entry,
        TV.varlen_key(32, "fp16", 2, True, 1024): {"mode": "varlen", "measured": False, "best": static_only.to_dict()},
        TV.varlen_key(32, "fp16", 2, False, 64): dict(gpu_entry, timing="interpreter"),
    })
    launched = []
    real_launch = VK.launch_forward
    monkeypatch.setattr(VK, "launch_forward", lambda *a: launched.append(a[6]) or real_launch(*a))
    reads = []
    real_iter = D.iter_database_entries
    monkeypatch.setattr(D, "iter_database_entries", lambda name: reads.append(name) or real_iter(name))

    gen = torch.Generator().manual_seed(3)
    lens = [7, 40, 23]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lens), 4, 32, generator=gen).half()
    k, v = (torch.randn(sum(lens), 2, 32, generator=gen).half() for _ in range(2))
    out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=True)
    assert launched == [tuned]
    details = selection.varlen_selection_details(q.device, 32, q.dtype, True, 2, 40)
    assert details["source"] == "varlen-db" and details["entry"] == "varlen-d32-fp16-gqa2-causal-s64"
    ref, _ = varlen_fp64(q, k, v, cu, cu, 1 / math.sqrt(32), causal=True)
    assert rel_err(out, ref) < 1e-2
    # memoised: a second call of the same bucket reads no database (the first read it for the config and for the
    # entry's incumbent verdict, rocmflash.api.varlen_incumbent.serving)
    first = len(reads)
    rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=True)
    assert launched == [tuned, tuned] and len(reads) == first <= 2
    # at a 1000-token bucket the measured:false entry is skipped: the measured one, 4 buckets away, serves
    far = selection.select_varlen_config(q.device, 32, q.dtype, True, 2, 1000)
    assert far == tuned
    assert selection.varlen_selection_details(q.device, 32, q.dtype, True, 2, 1000)["bucket_distance"] == 4
    # full attention: only an interpreter-timed entry exists -> the dense problem's choice (the per-arch default)
    dense = selection.select_config(q.device, 32, q.dtype, False, 2, 40, 40, "online")
    assert selection.select_varlen_config(q.device, 32, q.dtype, False, 2, 40) == dense != tuned
    assert selection.varlen_selection_details(q.device, 32, q.dtype, False, 2, 40)["source"] == "dense"
    # a new database takes effect after clear_cache (what a tune in this process calls)
    _write_db(tmp_path, {})
    dense_causal = selection.select_config(q.device, 32, q.dtype, True, 2, 40, 40, "online")
    assert selection.select_varlen_config(q.device, 32, q.dtype, True, 2, 40) == dense_causal != tuned
    selection.clear_cache()


def test_rocmflash_no_db_skips_varlen_entries(fake_rocm, tmp_path, monkeypatch):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    tuned = K(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1)
    _write_db(tmp_path, {TV.varlen_key(32, "fp16", 2, True, 64): {"mode": "varlen", "measured": True,
                                                                  "timing": "gpu", "best": tuned.to_dict()}})
    monkeypatch.setenv(selection.NO_DB_ENV, "1")
    assert selection.select_varlen_config(torch.device("cpu"), 32, torch.float16, True, 2, 64) != tuned
    monkeypatch.delenv(selection.NO_DB_ENV)
    selection.clear_cache()
    assert selection.select_varlen_config(torch.device("cpu"), 32, torch.float16, True, 2, 64) == tuned
    selection.clear_cache()
