"""Backward tuning (`rocmflash tune --pass bwd`): keys, space, the static phase on real gfx942 compiles, the
worker's gate and timing in Triton's interpreter, database entries, their run-time lookup and selection, and
the CLI (`vgpr-report --pass bwd`, `tune --pass bwd` without a GPU and under a fake ROCm)."""

import json
import math

import pytest
import torch

from rocmflash import db as D
from rocmflash.config import KernelConfig as K
from rocmflash.db.lookups import backward as LB
from rocmflash.hw.roofline import Shape
from rocmflash.kernels.backward import host as BH
from rocmflash.tuning import backward as TB
from rocmflash.tuning import items_bwd as IB


# ----------------------------------------------------------------------------- keys and space
def test_keys_round_trip_and_are_invisible_to_forward_lookups(tmp_path, monkeypatch):
    key = LB.bwd_key(96, torch.bfloat16, True, 4, 3000)
    assert key == "bwd-d96-bf16-causal-gqa4-s4096"
    assert LB.parse_bwd_key(key) == {"head_dim": 96, "dtype": "bf16", "causal": True, "gqa_ratio": 4,
                                     "seqlen_bucket": 4096}
    assert LB.parse_bwd_key("d96-bf16-causal-gqa4-s4096") is None
    assert LB.parse_bwd_key("bwd-nonsense") is None
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    data = D.ConfigDB.new_data("h100", "sm_90", {})
    data["entries"] = {key: _entry()}
    D.atomic_write_json(str(tmp_path / "h100.json"), data)
    D.clear_cache()
    assert D.lookup("h100", 96, "bf16", True, 4, 4096) is None  # forward lookups never read bwd- entries
    D.clear_cache()


@pytest.mark.parametrize("arch, head_dim, per_kernel", [("sm_90", 128, 45), ("gfx942", 128, 45), ("gfx90a", 256, 36)])
def test_space_shape(arch, head_dim, per_kernel):
    space = TB.bwd_space(arch, head_dim)
    for kernel in TB.KERNELS:
        points = [c for c in space if c["kernel"] == kernel]
        assert len(points) == per_kernel and len({json.dumps(c, sort_keys=True) for c in points}) == per_kernel
        for c in points:
            own, loop = TB.owned_and_looped(c)
            assert own in ((32, 64, 128) if head_dim <= 128 else (16, 32, 64)) and loop in (16, 32, 64)
            assert c["num_warps"] == 4 or own >= 64  # 8 warps only on owned blocks of >= 64 rows
            TB.kernel_config(c)  # every point is a valid KernelConfig
    amd = arch.startswith("gfx")
    assert {c["num_stages"] for c in space} == ({1} if amd else {1, 2, 3})
    assert {c["waves_per_eu"] for c in space} == ({0, 1, 2} if amd else {0})


def test_default_configs_are_points_of_the_space():
    from rocmflash.kernels.backward.host import default_bwd_config

    for arch in ("sm_90", "gfx90a", "gfx942"):
        for d in (64, 128, 256):
            cfg = default_bwd_config(arch, d)
            space = TB.bwd_space(arch, d)
            assert BH.space_point("dkdv", cfg.dkdv) in space, (arch, d)
            assert BH.space_point("dq", cfg.dq) in space, (arch, d)


# ----------------------------------------------------------------------------- static phase (real compiles)
@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("bwd-cache"))


def test_cli_vgpr_report_bwd_mi300x(cache_dir, tmp_path, capsys):
    """Both backward kernels cross-compiled for gfx942: registers from the code objects, a verdict per config."""
    from rocmflash.cli import main

    out = tmp_path / "rep"
    code = main(["vgpr-report", "--pass", "bwd", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16",
                 "--causal", "--out", str(out), "--cache-dir", cache_dir, "--workers", "2", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(TB.bwd_space("gfx942", 128))
    for kernel in TB.KERNELS:
        mine = [r for r in rows if r["config"]["kernel"] == kernel]
        kept = [r for r in mine if r["kept"]]
        assert kept and all(r["kernel"]["arch"] == "gfx942" for r in kept)
        # kept configs reach the 2-wave floor (or sit at the occupancy their waves_per_eu asks for) and spill
        # nothing, or only where the ISA shows it harmless
        assert all(r["kernel"]["waves_per_simd"] >= 2 or r["kernel"]["waves_per_simd"] == r["config"]["waves_per_eu"]
                   for r in kept)
        assert any(r["kernel"]["waves_per_simd"] >= 2 for r in kept)
        assert all(r["kernel"]["vgpr_spill_count"] == 0 or r["reason"] == "harmless_spill" for r in kept)
        # the pruner found real spills and low occupancy in this space, and said so
        reasons = {r["reason"] for r in mine if not r["kept"]}
        assert {"spills", "below_occupancy_floor"} <= reasons, reasons
        assert sorted(r["static_rank"] for r in kept) == list(range(len(kept)))
    assert "backward kernels on mi300x (gfx942)" in (out / "report.md").read_text()


def test_cli_tune_bwd_static_mi300x(cache_dir, tmp_path, capsys, monkeypatch):
    """Without a live MI300X the static #1 of each kernel is written "measured": false and never served."""
    from rocmflash.cli import main

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    code = main(["tune", "--gpu", "mi300x", "--pass", "bwd", "--head-dim", "128", "--dtype", "bf16", "--causal",
                 "--seqlen", "4096", "--cache-dir", cache_dir, "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "not measured" in out and "survive the static phase" in out
    data = D.ConfigDB.read(str(tmp_path / "mi300x.json"))
    assert list(data["entries"]) == ["bwd-d128-bf16-causal-gqa1-s4096"]  # --pass bwd: no forward entry
    entry = data["entries"]["bwd-d128-bf16-causal-gqa1-s4096"]
    assert entry["measured"] is False and entry["mode"] == "bwd" and entry["counts"]["space"] == 90
    cfg = LB.entry_config(entry)
    assert cfg.dkdv.BLOCK_N in (32, 64, 128) and cfg.head_splits == 0
    LB.clear_cache()
    assert LB.lookup_bwd("mi300x", 128, "bf16", True, 1, 4096) is None  # static entries are never served


def test_pass_is_for_prefill_only(capsys):
    from rocmflash.cli import main

    assert main(["tune", "--gpu", "mi300x", "--mode", "decode", "--pass", "bwd", "--head-dim", "128", "--dtype",
                 "bf16", "--seqlen", "4096"]) == 2
    assert "--pass bwd is for --mode prefill" in capsys.readouterr().err
    assert main(["vgpr-report", "--gpu", "mi300x", "--mode", "decode", "--pass", "bwd"]) == 2
    assert "--pass bwd is for --mode prefill" in capsys.readouterr().err
    assert main(["vgpr-report", "--gpu", "mi300x", "--pass", "bwd", "--head-dim", "300"]) == 2
    assert "head dim 300 is unsupported" in capsys.readouterr().err


# ----------------------------------------------------------------------------- worker: gate and timing
@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    TB._INPUTS.clear()
    yield
    TB._INPUTS.clear()


SHAPE = Shape(batch=2, heads_q=4, heads_kv=2, seqlen_q=100, seqlen_k=100, head_dim=32, dtype="fp16", causal=True)


def test_reference_grads_match_autograd():
    """The worker's fp32 reference equals autograd through plain attention (first batch, first GQA group)."""
    gen = torch.Generator().manual_seed(5)
    q, do = (torch.randn(2, 4, 37, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(2, 2, 41, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    scale = 0.3
    dq, dk, dv = TB.reference_grads(q, k, v, do, True, scale)
    qg, kg, vg = (t[:1, :2].clone().requires_grad_() if t is q else t[:1, :1].clone().requires_grad_() for t in (q, k, v))
    s = (qg @ kg.transpose(-1, -2)) * scale
    mask = torch.arange(41)[None, :] > torch.arange(37)[:, None] + 4
    out = torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ vg
    out.backward(do[:1, :2])
    assert torch.allclose(dq, qg.grad[0].float(), atol=1e-5)
    assert torch.allclose(dk, kg.grad[0, 0].float(), atol=1e-5) and torch.allclose(dv, vg.grad[0, 0].float(), atol=1e-5)


def test_measure_gates_and_times_both_kernels(interpret):
    for cfg in (BH.space_point("dq", K(BLOCK_M=32, BLOCK_N=16)), BH.space_point("dkdv", K(BLOCK_M=16, BLOCK_N=32))):
        r = TB.measure_bwd({"config": cfg, "shape": SHAPE.to_dict()})
        assert r["status"] == "ok", r
        assert 0 < r["rel_err"] < 1e-2
        # dK/dV is timed at every head split dividing the GQA group (2), dQ once
        assert sorted(r["times_ms"]) == (["1", "2"] if cfg["kernel"] == "dkdv" else ["1"])
        assert all(t > 0 for t in r["times_ms"].values())


def test_measure_rejects_wrong_gradients(interpret, monkeypatch):
    from rocmflash.kernels.backward import host as bw

    real = bw.launch_dkdv

    def off_by_scale(q, k, v, do, lse, delta, dk, dv, causal, scale, cfg, splits, backend):
        real(q, k, v, do, lse, delta, dk, dv, causal, scale * 1.1, cfg, splits, backend)

    monkeypatch.setattr(bw, "launch_dkdv", off_by_scale)
    r = TB.measure_bwd({"config": BH.space_point("dkdv", K(BLOCK_M=16, BLOCK_N=32)), "shape": SHAPE.to_dict()})
    assert r["status"] == "incorrect" and "against the fp32 reference" in r["error"] and not r["times_ms"]

    def unwritten(q, k, v, do, lse, delta, dk, dv, causal, scale, cfg, splits, backend):
        pass  # leaves the NaN poison in place

    monkeypatch.setattr(bw, "launch_dkdv", unwritten)
    r = TB.measure_bwd({"config": BH.space_point("dkdv", K(BLOCK_M=16, BLOCK_N=32)), "shape": SHAPE.to_dict()})
    assert r["status"] == "incorrect" and "unwritten" in r["error"]


# ----------------------------------------------------------------------------- entries (pure)
def _result(kernel, times, status="ok", **tiles):
    return {"config": BH.space_point(kernel, K(**tiles)), "status": status, "times_ms": times, "error": None}


def test_measured_entry_picks_each_kernels_best_and_reports_the_default():
    default = {"dkdv": BH.space_point("dkdv", K(BLOCK_M=32, BLOCK_N=64)),
               "dq": BH.space_point("dq", K(BLOCK_M=64, BLOCK_N=32))}
    results = [
        _result("dq", {"1": 2.0}, BLOCK_M=64, BLOCK_N=32),  # the default dQ
        _result("dq", {"1": 1.5}, BLOCK_M=128, BLOCK_N=64, num_warps=8),
        _result("dq", {"1": 1.0}, "incorrect", BLOCK_M=128, BLOCK_N=32),  # fastest but wrong: never chosen
        _result("dkdv", {"1": 3.0, "2": 2.5, "4": 2.8}, BLOCK_M=32, BLOCK_N=64),  # the default dK/dV
        _result("dkdv", {"1": 2.2, "2": 2.1, "4": 2.15}, BLOCK_M=64, BLOCK_N=64),
    ]
    static = TB.BwdStatic(None, [], None)
    entry = IB.measured_entry(SHAPE, static, results, default, "race", {}, False, auto_splits=4)
    assert entry["measured"] and entry["mode"] == "bwd"
    assert entry["best"]["dq"]["BLOCK_M"] == 128 and entry["best"]["dkdv"]["BLOCK_M"] == 64
    assert entry["best"]["head_splits"] == 2
    assert entry["time_ms"] == {"dq": 1.5, "dkdv": 2.1, "total": 3.6}
    # the default as run-time selection runs it: dK/dV at the automatic split count (4), not its best (2)
    assert entry["default_time_ms"] == {"dq": 2.0, "dkdv": 2.8, "total": 4.8}
    assert entry["speedup_vs_default"] == round(4.8 / 3.6, 3)
    assert [n["head_splits"] for n in entry["near_best"]["dkdv"]] == [4]  # 2.15 is within 3% of 2.1
    assert entry["counts"]["ok"] == 4 and entry["counts"]["incorrect"] == 1
    LB.entry_config(entry)  # what is stored reads back
    # a kernel with no correct result: nothing is measured, and the entry says which
    bad = IB.measured_entry(SHAPE, static, results[:3], default, "race", {}, False)
    assert bad["measured"] is False and "dkdv" in bad["why_unmeasured"] and bad["best"] is None


def test_to_time_covers_survivors_defaults_and_strategies():
    rows = []
    for kernel in TB.KERNELS:
        for i, bn in enumerate((16, 32, 64)):
            rows.append({"config": BH.space_point(kernel, K(BLOCK_M=bn, BLOCK_N=bn)), "kept": bn != 64,
                         "static_rank": i if bn != 64 else None, "kernel": {"arch": "gfx942"}})
    static = TB.BwdStatic(None, rows, None)
    default = {k: BH.space_point(k, K(BLOCK_M=64, BLOCK_N=64)) for k in TB.KERNELS}  # pruned, timed anyway
    race = IB.to_time(static, "race", None, default)
    assert len(race) == 6 and all(d in race for d in default.values())
    assert len(IB.to_time(static, "pruned", 1, default)) == 4
    assert len(IB.to_time(static, "exhaustive", None, default)) == 6


# ----------------------------------------------------------------------------- run-time lookup and selection
def _entry(measured=True, timing="gpu", dkdv=(32, 64), dq=(64, 32), splits=2):
    return {"mode": "bwd", "measured": measured, "timing": timing,
            "best": {"dkdv": K(BLOCK_M=dkdv[0], BLOCK_N=dkdv[1]).to_dict(),
                     "dq": K(BLOCK_M=dq[0], BLOCK_N=dq[1]).to_dict(), "head_splits": splits}}


def test_lookup_serves_nearest_measured_entry_only(tmp_path, monkeypatch):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))  # h200: no shipped database
    data = D.ConfigDB.new_data("h200", "sm_90", {})
    data["entries"] = {
        LB.bwd_key(128, "bf16", True, 4, 2048): _entry(dkdv=(16, 32)),
        LB.bwd_key(128, "bf16", True, 4, 16384): _entry(dkdv=(64, 128)),
        LB.bwd_key(128, "bf16", True, 4, 4096): _entry(measured=False, dkdv=(32, 32)),  # static: never served
        LB.bwd_key(128, "bf16", True, 4, 8192): _entry(timing="interpreter", dkdv=(32, 32)),  # never served
    }
    D.atomic_write_json(str(tmp_path / "h200.json"), data)
    LB.clear_cache()
    m = LB.lookup_bwd("h200", 128, "bf16", True, 4, 2000)
    assert m.config.dkdv.BLOCK_N == 32 and m.config.head_splits == 2 and m.bucket_distance == 0
    far = LB.lookup_bwd("h200", 128, "bf16", True, 4, 5000)  # 8192 bucket: 16384 is 1 away, 2048 is 2 away
    assert far.config.dkdv.BLOCK_N == 128 and far.bucket_distance == 1
    assert far.config.head_splits == 0  # a split count is kept only in its own bucket
    assert LB.lookup_bwd("h200", 128, "bf16", False, 4, 2048) is None  # other causal flag
    assert LB.lookup_bwd("h200", 128, "bf16", True, 1, 2048) is None  # other GQA ratio
    assert LB.lookup_bwd("h200", 64, "bf16", True, 4, 2048) is None  # other head dim
    LB.clear_cache()


def test_selection_and_autograd_use_a_measured_entry(fake_rocm, tmp_path, monkeypatch):
    """Under a fake ROCm MI250 the autograd backward asks for the problem's entry and runs it correctly."""
    import rocmflash
    from rocmflash.api import selection
    from rocmflash.kernels.backward import host as bw

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    store = D.ConfigDB.open(str(tmp_path / "mi250.json"), "mi250", "gfx90a", D.environment("AMD Instinct MI250X / MI250"))
    store.put(LB.bwd_key(32, "fp16", True, 2, 40), _entry(dkdv=(16, 16), dq=(16, 16), splits=2))
    store.save()
    seen = []
    real = bw.backward
    monkeypatch.setattr("rocmflash.api.ops.backward", lambda *a, config=None, **kw: seen.append(config) or real(
        *a, config=config, **kw))
    selection.clear_cache()
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 40, 32, generator=gen).half().requires_grad_()
    k, v = (torch.randn(1, 2, 40, 32, generator=gen).half().requires_grad_() for _ in range(2))
    out = rocmflash.attention(q, k, v, causal=True)
    do = torch.randn(out.shape, generator=gen).half()
    out.backward(do)
    details = selection.bwd_selection_details(q.device, 32, q.dtype, True, 2, 40)
    selection.clear_cache()
    assert details["source"] == "db" and details["entry"] == "bwd-d32-fp16-causal-gqa2-s64"
    assert seen and seen[0].dkdv.BLOCK_N == 16 and seen[0].head_splits == 2
    ref = TB.reference_grads(q.detach().double(), k.detach().double(), v.detach().double(), do.double(), True,
                             1 / math.sqrt(32))
    for got, want in zip((q.grad[0, :2], k.grad[0, 0], v.grad[0, 0]), ref):
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-2


def test_cli_tune_bwd_under_fake_rocm_measures_in_the_interpreter(fake_rocm, tmp_path, monkeypatch, capsys):
    """`tune --gpu mi250 --pass bwd` on a (fake) MI250: gates and times every survivor and the defaults in
    isolated interpreter workers; the entry is recorded as interpreter-timed and never served."""
    from rocmflash.cli import main
    from rocmflash.kernels.backward.host import default_bwd_config

    small = [BH.space_point("dq", K(BLOCK_M=32, BLOCK_N=16, num_stages=1)),
             BH.space_point("dkdv", K(BLOCK_M=16, BLOCK_N=32, num_stages=1))]
    monkeypatch.setattr(TB, "bwd_space", lambda arch, head_dim: small)
    db_path = tmp_path / "mi250.json"
    code = main(["tune", "--gpu", "mi250", "--pass", "bwd", "--head-dim", "32", "--dtype", "fp16", "--seqlen",
                 "64", "--heads", "4", "--kv-heads", "2", "--batch", "1", "--db", str(db_path),
                 "--cache-dir", str(tmp_path / "cache"), "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    entry = D.ConfigDB.read(str(db_path))["entries"]["bwd-d32-fp16-full-gqa2-s64"]
    default = default_bwd_config("gfx90a", 32)
    assert entry["measured"] is True and entry["timing"] == "interpreter"
    assert entry["counts"]["timed"] == 4 and entry["counts"]["ok"] == 4, entry["counts"]  # 2 survivors + 2 defaults
    assert (entry["best"]["dq"]["BLOCK_M"], entry["best"]["dq"]["BLOCK_N"]) in ((32, 16), (default.dq.BLOCK_M,
                                                                                          default.dq.BLOCK_N))
    assert entry["default_time_ms"]["total"] > 0
    assert "interpreter" in out and "never served" in out
    LB.clear_cache()
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    assert LB.lookup_bwd("mi250", 32, "fp16", False, 2, 64) is None  # interpreter timings are never served
