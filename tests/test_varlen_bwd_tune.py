"""Varlen backward tuning (`rocmflash tune --mode varlen --pass bwd|both`): keys and the lookups that must skip
them, the static phase on real gfx942 compiles (`vgpr-report --mode varlen --pass bwd`, a CPU-only tune), the
CLI's `--pass` rules, the live phase under a fake ROCm (interpreter), and the varlen backward's run-time
selection: measured `varlen-bwd-` entry, else the dense `bwd-` entry, else the per-arch default, each kernel
checked to build as the varlen kernel.

The CLI tests replace the 90-config gfx942 backward space by six configs (one of each kernel spills at
D=128 GQA 4), compiled once into a module-scoped cache."""

import dataclasses
import json
import math

import pytest
import torch

from rocmflash import db as D
from rocmflash.api import selection
from rocmflash.api import build_check as BC
from rocmflash.config import KernelConfig as K
from rocmflash.db.lookups import backward as LB
from rocmflash.db.lookups import varlen as LV
from rocmflash.db.lookups import varlen_bwd as LVB
from rocmflash.kernels.backward import host as BH
from rocmflash.kernels.backward.host import BwdConfig, default_bwd_config
from rocmflash.tuning import backward as TB
from rocmflash.tuning import varlen as TV
from rocmflash.tuning import varlen_bwd as VB


def point(kernel, m, n, warps=4, wpe=2):
    return BH.space_point(kernel, K(BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=1, waves_per_eu=wpe))


#: six gfx942 points at D=128 bf16 GQA 4 causal, cross-compiled as the varlen kernels with Triton 3.6: dQ 64x32
#: and 128x16 w8 and dK/dV 16x64 and 16x128 w8 (BLOCK_M x BLOCK_N) compile clean; dQ 64x64 and dK/dV 32x64 spill
SMALL_SPACE = [point("dq", 64, 32), point("dq", 64, 64), point("dq", 128, 16, warps=8),
               point("dkdv", 16, 64), point("dkdv", 32, 64), point("dkdv", 16, 128, warps=8)]
ARGS = ["--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--causal", "--heads", "16", "--kv-heads", "4"]


# ----------------------------------------------------------------------------- keys and the other lookups
def test_keys_round_trip_and_only_the_varlen_backward_lookup_reads_them(tmp_path, monkeypatch):
    from rocmflash.db.lookups import decode as LD

    key = VB.varlen_bwd_key(128, torch.bfloat16, 4, True, 3000)
    assert (key, VB.varlen_bwd_key(64, "fp16", 1, False, 4096)) == ("varlen-bwd-d128-bf16-gqa4-causal-s4096",
                                                                    "varlen-bwd-d64-fp16-gqa1-s4096")
    assert LVB.parse_varlen_bwd_key(key) == {"head_dim": 128, "dtype": "bf16", "group": 4, "causal": True,
                                            "bucket": 4096}
    for other in ("varlen-d128-bf16-gqa4-causal-s4096", "bwd-d128-bf16-causal-gqa4-s4096",
                  "d128-bf16-causal-gqa4-s4096", "varlen-bwd-d128-bf16-gqa4-full-s4096",
                  "varlen-bwd-x128-bf16-gqa4-s4096"):
        assert LVB.parse_varlen_bwd_key(other) is None, other
    assert LV.parse_varlen_key(key) is None and LV.parse_varlen_key("varlen-bwd-d128-bf16-gqa4-s4096") is None
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))  # h200: no shipped database
    best = BwdConfig(K(BLOCK_M=16, BLOCK_N=64), K(BLOCK_M=64, BLOCK_N=16))
    entry = {"mode": "varlen", "pass": "bwd", "measured": True, "timing": "gpu",
             "best": {"dkdv": best.dkdv.to_dict(), "dq": best.dq.to_dict(), "head_splits": 0}}
    data = D.ConfigDB.new_data("h200", "sm_90", {})
    data["entries"] = {key: entry, VB.varlen_bwd_key(128, "bf16", 4, False, 4096): entry}
    D.atomic_write_json(str(tmp_path / "h200.json"), data)
    selection.clear_cache()
    for causal in (True, False):
        assert D.lookup("h200", 128, "bf16", causal, 4, 4096) is None
        assert LB.lookup_bwd("h200", 128, "bf16", causal, 4, 4096) is None
        assert LV.lookup_varlen("h200", 128, "bf16", 4, causal, 4096) is None
    assert LD.lookup_decode("h200", 128, "bf16", 4, 4096, 8) is None
    match = LVB.lookup_varlen_bwd("h200", 128, "bf16", 4, True, 4000)
    assert match.config == best and match.key == key and match.bucket_distance == 0
    from rocmflash.cli.tune import export_json

    exported = export_json(data, "nvidia")
    assert exported["entries"] == {}  # the forward's (none here); the packed backward's have a section of their own
    assert sorted(exported["families"]["varlen-bwd"]["entries"]) == sorted(data["entries"])
    selection.clear_cache()


def test_space_is_the_dense_backward_space_and_a_family_of_its_own():
    from rocmflash.static.families import get_family

    for arch in ("gfx942", "sm_90"):
        assert VB.varlen_bwd_space(arch, 128) == TB.bwd_space(arch, 128)
    family = get_family("varlen_bwd")
    assert "kernels/varlen/host.py" in family.sources and family.module == "rocmflash.tuning.varlen_bwd"


# ----------------------------------------------------------------------------- static phase and the CLI
@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("varlen-bwd-cache"))


@pytest.fixture
def small_space(monkeypatch):
    monkeypatch.setattr(VB, "varlen_bwd_space", lambda arch, head_dim: [dict(c) for c in SMALL_SPACE])


def test_cli_vgpr_report_varlen_bwd_mi300x(small_space, cache_dir, tmp_path, capsys):
    """The varlen dQ and dK/dV kernels cross-compiled for gfx942: one row per config, pruned per kernel."""
    from rocmflash.cli import main

    out = tmp_path / "rep"
    assert main(["vgpr-report", "--mode", "varlen", "--pass", "bwd", *ARGS, "--out", str(out), "--cache-dir",
                 cache_dir, "--workers", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["config"] for r in rows if r["config"]["kernel"] == "dq"][0] == SMALL_SPACE[2]  # rank 0 first
    assert len(rows) == len(SMALL_SPACE) and all(r["kernel"]["arch"] == "gfx942" for r in rows)
    for kernel, name in (("dq", "_varlen_bwd_dq"), ("dkdv", "_varlen_bwd_dkdv")):
        mine = [r for r in rows if r["config"]["kernel"] == kernel]
        assert all(r["kernel"]["name"] == name for r in mine)  # the varlen kernels, not the dense ones
        kept = [r for r in mine if r["kept"]]
        assert len(kept) == 2 and sorted(r["static_rank"] for r in kept) == [0, 1]
        assert all(r["kernel"]["vgpr_spill_count"] == 0 for r in kept)
        (pruned,) = [r for r in mine if not r["kept"]]
        assert pruned["reason"] == "spills" and pruned["kernel"]["vgpr_spill_count"] > 0
    assert "varlen backward kernels on mi300x (gfx942)" in (out / "report.md").read_text()


def test_cli_tune_varlen_bwd_static_only_on_cpu(small_space, cache_dir, tmp_path, capsys, monkeypatch):
    """No live MI300X: the static #1 of each kernel is written "measured": false under varlen-bwd-, never served."""
    from rocmflash.cli import main

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    assert main(["tune", "--mode", "varlen", "--pass", "bwd", *ARGS, "--batch", "8", "--seqlen", "3000",
                 "--cache-dir", cache_dir, "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "not measured" in out and "2 dQ and 2 dK/dV survive" in out and "forward only" not in out
    data = D.ConfigDB.read(str(tmp_path / "mi300x.json"))
    assert list(data["entries"]) == ["varlen-bwd-d128-bf16-gqa4-causal-s4096"]  # --pass bwd: no forward entry
    entry = data["entries"]["varlen-bwd-d128-bf16-gqa4-causal-s4096"]
    assert entry["mode"] == "varlen" and entry["pass"] == "bwd" and entry["measured"] is False
    assert entry["counts"] == {"space": 6, "survivors": 4, "timed": 0}
    assert entry["problem"]["lengths"] == list(TV.spread_lengths(8, 3000))
    cfg = LB.entry_config(entry)  # the AMD static key: 2 waves, then the largest owned block
    assert cfg.dq == TB.kernel_config(SMALL_SPACE[2]) and cfg.dkdv == TB.kernel_config(SMALL_SPACE[5])
    LVB.clear_cache()
    assert LVB.lookup_varlen_bwd("mi300x", 128, "bf16", 4, True, 4096) is None  # static entries are never served
    assert main(["export", "--gpu", "mi300x", "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["entries"] == {}  # the forward's; the packed backward's is in its own section, unmeasured
    item = exported["families"]["varlen-bwd"]["entries"]["varlen-bwd-d128-bf16-gqa4-causal-s4096"]
    assert item["measured"] is False and item["status"] == "static" and item["label"] == "UNMEASURED: static ranking"


def test_cli_tune_varlen_pass_both_writes_both_entries(small_space, cache_dir, tmp_path, capsys, monkeypatch):
    from rocmflash.cli import main

    fwd = [K(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2).to_dict()]
    monkeypatch.setattr(TV, "varlen_space", lambda gpu, problem: fwd)
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    assert main(["tune", "--mode", "varlen", "--pass", "both", *ARGS, "--lengths", "100,700,3000", "--cache-dir",
                 cache_dir, "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "varlen tune mi300x" in out and "varlen backward tune mi300x" in out
    entries = D.ConfigDB.read(str(tmp_path / "mi300x.json"))["entries"]
    assert sorted(entries) == ["varlen-bwd-d128-bf16-gqa4-causal-s4096", "varlen-d128-bf16-gqa4-causal-s4096"]
    assert "pass" not in entries["varlen-d128-bf16-gqa4-causal-s4096"]  # the forward entry is unchanged


@pytest.mark.parametrize("argv, words", [
    (["tune", "--mode", "decode", "--pass", "bwd", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16",
      "--seqlen", "4096"], "--pass bwd is for --mode prefill or varlen (decode has no backward)"),
    (["vgpr-report", "--mode", "decode", "--pass", "bwd", "--gpu", "mi300x"], "--pass bwd is for --mode prefill"),
    (["tune", "--mode", "varlen", "--pass", "bwd", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16"],
     "needs --seqlen (or --lengths)"),
    (["tune", "--mode", "varlen", "--pass", "both", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16",
      "--seqlen", "4096", "--gpus", "all"], "--gpus does not go with --mode varlen"),
    (["tune", "--mode", "varlen", "--pass", "bwd", "--gpu", "mi300x", "--head-dim", "512", "--dtype", "bf16",
      "--seqlen", "4096"], "--head-dim 512 is invalid"),
    (["vgpr-report", "--mode", "varlen", "--pass", "bwd", "--gpu", "mi300x", "--head-dim", "300"],
     "--head-dim 300 is invalid"),
])
def test_cli_pass_errors_are_one_line(argv, words, capsys):
    """Bad --pass uses and bad input are caught before any compile: one line on stderr, exit code 2."""
    from rocmflash.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1, err


# ----------------------------------------------------------------------------- live phase (fake ROCm, interpreter)
PROBLEM = TV.VarlenProblem(head_dim=32, dtype="fp16", heads_q=4, heads_kv=2, causal=True, lengths=(5, 40, 19))


def test_tune_varlen_backward_live_phase_under_fake_rocm(fake_rocm, tmp_path, monkeypatch):
    """On a (fake) live MI250 every survivor of each kernel and the backward served before are gated on the
    packed batch and timed in the isolated worker (interpreter); the entry records it and is never served."""
    from rocmflash.tuning.items_varlen import backward_baseline
    from rocmflash.tuning.varlen_run import tune_varlen_backward

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    configs = [point("dq", 32, 16), point("dkdv", 16, 32)]
    db_path = str(tmp_path / "mi250.json")
    result = tune_varlen_backward("mi250", PROBLEM, db_path, str(tmp_path / "cache"), 2, 300.0, configs=configs)
    assert result.measured and result.key == "varlen-bwd-d32-fp16-gqa2-causal-s64"
    baseline = backward_baseline(result.gpu, PROBLEM)
    default = default_bwd_config("gfx90a", 32)
    assert baseline["source"] == "per-arch default (gfx90a)"
    assert baseline["config"] == {"dq": BH.space_point("dq", default.dq), "dkdv": BH.space_point("dkdv", default.dkdv)}
    timed = [r["config"] for r in result.results]
    assert sorted(map(json.dumps, timed)) == sorted(map(json.dumps, configs + list(baseline["config"].values())))
    assert [r["status"] for r in result.results] == ["ok"] * 4, result.results
    assert all(r["rel_err"] < 1e-2 and r["times_ms"]["1"] > 0 for r in result.results)
    entry = D.ConfigDB.read(db_path)["entries"][result.key]
    assert entry["measured"] and entry["mode"] == "varlen" and entry["pass"] == "bwd"
    assert entry["timing"] == "interpreter" and entry["strategy"] == "all-survivors"
    assert entry["counts"]["timed"] == 4 and entry["counts"]["ok"] == 4
    assert entry["time_ms"]["total"] == pytest.approx(entry["time_ms"]["dq"] + entry["time_ms"]["dkdv"], abs=1e-4)
    assert entry["baseline"]["source"] == baseline["source"] and entry["baseline"]["time_ms"]["total"] > 0
    assert entry["speedup_vs_baseline"] > 0
    LB.entry_config(entry)  # what is stored reads back as a BwdConfig
    LVB.clear_cache()
    assert LVB.lookup_varlen_bwd("mi250", 32, "fp16", 2, True, 40) is None  # interpreter times are never served


@pytest.fixture
def worker(interpret):
    from rocmflash.tuning import varlen_bwd_worker as W

    W._INPUTS.clear()
    yield W
    W._INPUTS.clear()


def test_gate_catches_wrong_and_unwritten_gradients(worker, monkeypatch):
    from rocmflash.kernels.varlen import host as VK

    tasks = {k: {"config": point(k, m, n, wpe=0), "problem": PROBLEM.to_dict()} for k, m, n in
             (("dq", 32, 16), ("dkdv", 16, 32))}
    for task in tasks.values():
        good = worker.measure_varlen_bwd(task)
        assert good["status"] == "ok" and good["rel_err"] < 1e-2 and good["times_ms"]["1"] > 0, good
        assert sorted(good["rel_errs"]) == (["delta", "dq"] if task["config"]["kernel"] == "dq" else ["dk", "dv"])
    real_dq, real_dkdv = VK.launch_dq, VK.launch_dkdv

    def wrong_delta(*a):  # dQ right, the delta it writes for the dK/dV kernel off by one
        real_dq(*a)
        a[8].add_(1.0)

    monkeypatch.setattr(VK, "launch_dq", wrong_delta)
    bad = worker.measure_varlen_bwd(tasks["dq"])
    assert bad["status"] == "incorrect" and "relative error" in bad["error"] and not bad["times_ms"], bad
    assert bad["rel_errs"]["dq"] < 1e-2 < bad["rel_errs"]["delta"]  # caught by the delta it wrote
    monkeypatch.setattr(VK, "launch_dkdv", lambda *a: None)  # leaves the NaN poison in place
    bad = worker.measure_varlen_bwd(tasks["dkdv"])
    assert bad["status"] == "incorrect" and "unwritten" in bad["error"], bad
    monkeypatch.setattr(VK, "launch_dkdv", lambda call, *a: real_dkdv(
        dataclasses.replace(call, sm_scale=call.sm_scale * 1.1), *a))
    bad = worker.measure_varlen_bwd(tasks["dkdv"])
    assert bad["status"] == "incorrect" and "relative error" in bad["error"], bad


# ----------------------------------------------------------------------------- run-time selection
def _bwd_entry(dq, dkdv, measured=True, timing="gpu", mode="varlen"):
    return {"mode": mode, "measured": measured, "timing": timing,
            "best": {"dq": K(**dq).to_dict(), "dkdv": K(**dkdv).to_dict(), "head_splits": 0}}


def _write_db(tmp_path, gpu, arch, entries: dict) -> None:
    data = D.ConfigDB.new_data(gpu, arch, {})
    data["entries"] = entries
    D.atomic_write_json(str(tmp_path / f"{gpu}.json"), data)
    selection.clear_cache()


TUNED = dict(dq=dict(BLOCK_M=16, BLOCK_N=32, num_warps=2), dkdv=dict(BLOCK_M=32, BLOCK_N=16, num_warps=2))
DENSE = dict(dq=dict(BLOCK_M=32, BLOCK_N=32, num_warps=4), dkdv=dict(BLOCK_M=16, BLOCK_N=16, num_warps=4))


def _select(gqa=2, max_seqlen=40, **flags):
    cfg = selection.select_varlen_bwd_config(torch.device("cpu"), 32, torch.float16, True, gqa, max_seqlen, **flags)
    return cfg, selection.varlen_bwd_selection_details(torch.device("cpu"), 32, torch.float16, True, gqa, max_seqlen,
                                                       **flags)


def test_selection_order_varlen_entry_then_dense_entry_then_default(fake_rocm, tmp_path, monkeypatch):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("ROCMFLASH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    tuned = BwdConfig(K(**TUNED["dkdv"]), K(**TUNED["dq"]))
    dense_key = LB.bwd_key(32, "fp16", True, 2, 64)
    entries = {VB.varlen_bwd_key(32, "fp16", 2, True, 64): _bwd_entry(**TUNED),
               VB.varlen_bwd_key(32, "fp16", 2, True, 1024): _bwd_entry(**DENSE, measured=False),
               VB.varlen_bwd_key(32, "fp16", 2, True, 4096): _bwd_entry(**DENSE, timing="interpreter"),
               dense_key: _bwd_entry(**DENSE, mode="bwd")}
    _write_db(tmp_path, "mi250", "gfx90a", entries)
    # 1. the measured varlen-bwd entry beats the dense entry; the unmeasured and interpreter-timed ones are skipped
    for max_seqlen, distance in ((40, 0), (1000, 4), (4000, 6)):
        cfg, details = _select(max_seqlen=max_seqlen)
        assert cfg == tuned and details["source"] == "varlen-db", details
        assert details["entry"] == "varlen-bwd-d32-fp16-gqa2-causal-s64" and details["bucket_distance"] == distance
        assert details["replaced"] == {}
    # 2. no varlen-bwd entry: the dense bwd- entry, checked to build as the varlen kernels on gfx90a (it does)
    del entries[VB.varlen_bwd_key(32, "fp16", 2, True, 64)]
    _write_db(tmp_path, "mi250", "gfx90a", entries)
    cfg, details = _select()
    assert (cfg.dq, cfg.dkdv) == (K(**DENSE["dq"]), K(**DENSE["dkdv"])) and details["source"] == "dense-db"
    assert details["entry"] == dense_key and details["replaced"] == {} and "dense choice" in details["text"]
    # 3. nothing measured for this problem: the per-arch default
    cfg, details = _select(gqa=1)
    assert cfg == default_bwd_config("gfx90a", 32) and details["source"] == "default"
    # ROCMFLASH_NO_DB: the default too
    monkeypatch.setenv(selection.NO_DB_ENV, "1")
    selection.clear_cache()
    assert _select()[0] == default_bwd_config("gfx90a", 32)
    monkeypatch.delenv(selection.NO_DB_ENV)
    selection.clear_cache()


def test_nearest_bucket_and_ties(fake_rocm, tmp_path, monkeypatch):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    near, far = dict(TUNED), dict(DENSE)
    _write_db(tmp_path, "mi250", "gfx90a", {VB.varlen_bwd_key(32, "fp16", 2, True, 256): _bwd_entry(**near),
                                            VB.varlen_bwd_key(32, "fp16", 2, True, 1024): _bwd_entry(**far)})
    assert _select(max_seqlen=200)[0].dq == K(**near["dq"])
    assert _select(max_seqlen=2000)[0].dq == K(**far["dq"])
    cfg, details = _select(max_seqlen=500)  # s512: one bucket from both -> the larger
    assert cfg.dq == K(**far["dq"]) and details["bucket_distance"] == 1
    selection.clear_cache()


@pytest.mark.parametrize("fake_rocm", [{"name": "AMD Instinct MI300X", "gcn_arch_name": "gfx942:sramecc+:xnack-",
                                        "multi_processor_count": 304, "total_memory": 192 * 1024**3}], indirect=True)
def test_dense_entry_that_spills_as_the_varlen_kernel_is_replaced(fake_rocm, tmp_path, monkeypatch):
    """A dense bwd- entry's dK/dV tile kept for the dense kernel on gfx942 (D=128, GQA 4) spills in the varlen
    dK/dV kernel's loop: that kernel gets the per-arch default, the clean dQ tile stays (real compiles)."""
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("ROCMFLASH_CACHE_DIR", str(tmp_path / "cache"))
    dq, dkdv = dict(BLOCK_M=64, BLOCK_N=32, waves_per_eu=2), dict(BLOCK_M=64, BLOCK_N=32, waves_per_eu=1)
    _write_db(tmp_path, "mi300x", "gfx942", {LB.bwd_key(128, "bf16", True, 4, 64): _bwd_entry(dq, dkdv, mode="bwd")})
    cfg = selection.select_varlen_bwd_config(torch.device("cpu"), 128, torch.bfloat16, True, 4, 40)
    details = selection.varlen_bwd_selection_details(torch.device("cpu"), 128, torch.bfloat16, True, 4, 40)
    assert details["source"] == "dense-db" and list(details["replaced"]) == ["dkdv"], details
    assert details["replaced"]["dkdv"].startswith("spills: _varlen_bwd_dkdv")
    assert cfg.dq == K(**dq) and cfg.dkdv == default_bwd_config("gfx942", 128).dkdv
    assert "does not build as the varlen kernel" in details["text"]
    # the tune's baseline is what this selection serves, replaced kernel included
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.tuning.items_varlen import backward_baseline

    base = backward_baseline(get_gpu("mi300x"), TV.VarlenProblem(head_dim=128, dtype="bf16", heads_q=32, heads_kv=8,
                                                                 lengths=(10, 40)))
    assert base["config"] == {"dq": BH.space_point("dq", cfg.dq), "dkdv": BH.space_point("dkdv", cfg.dkdv)}
    assert base["source"].startswith("dense entry bwd-d128-bf16-causal-gqa4-s64 (dkdv: per-arch default, spills")
    selection.clear_cache()


def test_build_check_on_sm_90(tmp_path):
    """The check cross-compiles for NVIDIA too: at D=128 GQA 4 a 128-key dK/dV block spills kilobytes per thread
    as the varlen kernel on sm_90 and is replaced; the dQ tile builds clean and stays (real ptxas builds)."""
    cfg = BwdConfig(K(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2), K(BLOCK_M=64, BLOCK_N=64, num_warps=4,
                                                                              num_stages=3))
    default = default_bwd_config("sm_90", 128)
    served, replaced = BC.usable_config("h100", cfg, default, BC.build_problem(128, "bf16", 4, True), str(tmp_path))
    assert list(replaced) == ["dkdv"] and "local memory per thread" in replaced["dkdv"], replaced
    assert served == BwdConfig(default.dkdv, cfg.dq)


@pytest.mark.parametrize("softcap, window", [(0.0, (-1, -1)), (20.0, (16, -1))], ids=["causal", "softcap-window"])
def test_flash_attn_varlen_func_backward_runs_the_selected_entry(fake_rocm, tmp_path, monkeypatch, softcap, window):
    """The measured varlen-bwd entry's non-default tiles are what the backward launches (looked up when the
    backward runs, once per problem), with gradients matching an fp64 reference in the interpreter. With a cap
    and a left window the entry is first checked to build as those varlen kernels for gfx90a."""
    import rocmflash
    from rocmflash.kernels.varlen import host as VK
    from varlen_reference import rel_err, varlen_fp64

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("ROCMFLASH_CACHE_DIR", str(tmp_path / "cache"))
    _write_db(tmp_path, "mi250", "gfx90a", {VB.varlen_bwd_key(32, "fp16", 2, True, 64): _bwd_entry(**TUNED)})
    launched = []
    for name in ("launch_dq", "launch_dkdv"):
        real = getattr(VK, name)
        monkeypatch.setattr(VK, name, lambda *a, real=real, name=name: launched.append((name, a[-1])) or real(*a))
    gen = torch.Generator().manual_seed(5)
    lens = [7, 40, 0, 23]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lens), 4, 32, generator=gen).half().requires_grad_()
    k, v = (torch.randn(sum(lens), 2, 32, generator=gen).half().requires_grad_() for _ in range(2))
    out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=True, window_size=window, softcap=softcap)
    assert launched == []  # the forward chooses no backward config
    dout = torch.randn(out.shape, generator=gen).half()
    out.backward(dout)
    assert launched == [("launch_dq", K(**TUNED["dq"])), ("launch_dkdv", K(**TUNED["dkdv"]))]
    flags = dict(softcap=softcap > 0, window=window[0] >= 0)
    details = selection.varlen_bwd_selection_details(q.device, 32, q.dtype, True, 2, 40, **flags)
    assert details["source"] == "varlen-db" and details["replaced"] == {}, details
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = varlen_fp64(qd, kd, vd, cu, cu, 1 / math.sqrt(32), True, window, softcap)
    (ref * dout.double()).sum().backward()
    for got, want in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert torch.isfinite(got).all() and rel_err(got, want) < 2e-2, rel_err(got, want)
    selection.clear_cache()
