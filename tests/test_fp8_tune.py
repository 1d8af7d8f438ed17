"""``rocmflash tune --dtype fp8`` (the fp8 forward) on the CPU: keys per fp8 family, the live worker's fp8 gate and
timing (Triton's interpreter), a whole tune on a (fake) MI300X, run-time selection of the fp8 entry, bad input.

The end-to-end tune cross-compiles real gfx942 fp8 builds in its static phase and gates and times them in
spawned interpreter workers; the gate compares with fp32 attention of the *dequantised* inputs and holds the
relative L2 error to V's unit roundoff (2**-4 for e4m3, :mod:`rocmflash.tuning.live_fp8`).
"""

import pytest
import torch

from rocmflash import db as D
from rocmflash.config import KernelConfig
from rocmflash.hw.roofline import Shape
from rocmflash.measure import TOLERANCE
from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
from rocmflash.tuning import live_fp8, live_gate

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MI300X = {"name": "AMD Instinct MI300X", "gcn_arch_name": "gfx942:sramecc+:xnack-", "multi_processor_count": 304,
          "total_memory": 192 * 1024**3}
SHAPE8 = Shape(batch=1, heads_q=4, heads_kv=2, seqlen_q=48, seqlen_k=80, head_dim=32, dtype="fp8", causal=True)
CFG = KernelConfig(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)
U_E4M3 = 2.0 ** -4


def _tiny_fp8_space(gpu, variants=None, dtype=None):
    """Two online configs (the tests' stand-in for ``default_space(gpu, variants, "fp8")``)."""
    assert dtype == "fp8", dtype  # the tune asks for the fp8 space
    return ConfigSpace({"online": {"BLOCK_M": [64], "BLOCK_N": [32, 64], "num_warps": [4], "num_stages": [1],
                                   "waves_per_eu": [2]}}, DEFAULT_RESTRICTIONS)


def _cli(argv):
    from rocmflash.cli import main

    return main(argv)


# ====================================================================== keys
def test_keys_name_the_fp8_format_of_the_arch():
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.tuning.entries import shape_key

    shape = Shape(batch=4, heads_q=16, heads_kv=16, seqlen_q=3000, seqlen_k=3000, head_dim=128, dtype="fp8",
                  causal=True)
    assert shape_key(shape, get_gpu("mi300x")) == "d128-fp8e4m3fnuz-causal-gqa1-s4096"
    assert shape_key(shape, get_gpu("mi355x")) == "d128-fp8e4m3fn-causal-gqa1-s4096"
    assert shape_key(shape, get_gpu("h100")) == "d128-fp8e4m3fn-causal-gqa1-s4096"
    with pytest.raises(ValueError, match="gfx90a"):
        shape_key(shape, get_gpu("mi250"))
    with pytest.raises(ValueError, match="needs the GPU"):
        shape_key(shape)
    # the run-time side: torch's dtype of the inputs gives the same name; a bare "fp8" names no format
    assert D.problem_key(128, torch.float8_e4m3fnuz, True, 1, 4096) == "d128-fp8e4m3fnuz-causal-gqa1-s4096"
    assert D.parse_key("d128-fp8e4m3fn-full-gqa4-s2048")["dtype"] == "fp8e4m3fn"
    with pytest.raises(ValueError, match="names no fp8 format"):
        D.problem_key(128, "fp8", True, 1, 4096)


# ====================================================================== the gate
class Fp8Standin:
    """A stand-in fp8 forward: attention of the dequantised inputs, or one deliberate fault."""

    def __init__(self, fault=None):
        self.fault = fault

    def launch(self, q, k, v, cfg, causal, scale, out, descales):
        qd, kd, vd = descales
        if self.fault == "raw_v":  # a kernel that forgets V's descale: every output off by that factor
            vd = torch.ones_like(vd)
        ref = live_gate.reference(live_fp8.dequantised(q, qd), live_fp8.dequantised(k, kd),
                                  live_fp8.dequantised(v, vd), causal, scale)
        out.copy_(ref.to(out.dtype))


@pytest.fixture
def gate_on_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    live_gate._GATE.clear()
    yield
    live_gate._GATE.clear()


def test_gate_takes_a_right_fp8_answer_and_rejects_a_wrong_one(gate_on_cpu):
    ok, err, why = live_gate.gate(Fp8Standin(), CFG, SHAPE8)
    assert ok and err < 1e-2 and why == ""
    q, k, v, _ = live_gate.gate_inputs(SHAPE8)
    assert q.dtype == k.dtype == v.dtype == torch.float8_e4m3fn  # no live arch: the OCP format
    assert live_gate._GATE["out"].dtype == torch.bfloat16
    ok, err, why = live_gate.gate(Fp8Standin("raw_v"), CFG, SHAPE8)
    assert not ok and err > U_E4M3 and "dequantised fp8 inputs" in why


def test_gate_passes_the_fp8_kernel_within_the_fp8_bound(gate_on_cpu):
    """The real kernel (interpreted): its error is fp8's (P rounded to e4m3), above bf16's gate, within u."""
    ok, err, why = live_gate.gate(live_fp8.Fp8Forward(None), CFG, SHAPE8)
    assert ok, why
    assert 1e-3 < err <= U_E4M3 == TOLERANCE["fp8"]


def test_worker_measures_an_fp8_config_in_the_interpreter(gate_on_cpu):
    from rocmflash.tuning.live_worker import LiveSettings, measure

    result = measure({"config": CFG.to_dict(), "shape": SHAPE8.to_dict(), "settings": LiveSettings().to_dict()})
    assert result["status"] == "ok", result
    assert result["interpreted"] and 1e-3 < result["rel_err"] <= U_E4M3
    assert len(result["times_ms"]) == 3 and result["tflops"] > 0
    bad = measure({"config": CFG.replace(variant="split_kv").to_dict(), "shape": SHAPE8.to_dict(),
                   "settings": LiveSettings().to_dict()})
    assert bad["status"] == "failed" and "online kernel only" in bad["error"]


def test_each_timed_gfx942_launch_copies_v_k_major_as_an_api_call_does(gate_on_cpu, monkeypatch):
    """gfx942 reads V K-major and an API call copies V into that layout every call (fp8_plans.execute ->
    fp8_forward.launch_kept -> as_kmajor_v). The timed launches must make that copy too, each one: inputs with V
    copied once beforehand timed a cheaper call than the one served (#46). The launches stay right: relative L2
    error against the dequantised reference within e4m3's unit roundoff, as the gate asks."""
    import math

    from rocmflash.kernels.fp8 import forward as fp8_forward
    from rocmflash.tuning.live_worker import input_set, launch_set

    copies, real = [], fp8_forward.kmajor_copy
    monkeypatch.setattr(fp8_forward, "kmajor_copy", lambda v, keys=None: copies.append(v.data_ptr()) or real(v, keys))
    mod, scale = live_fp8.Fp8Forward("gfx942"), 1.0 / math.sqrt(SHAPE8.head_dim)
    assert fp8_forward.kmajor_v(mod.arch)
    s = input_set(SHAPE8, torch.device("cpu"), mod.arch)
    q, k, v, out, descales = s
    assert v.dtype == torch.float8_e4m3fnuz and v.stride(2) != 1  # V as a caller passes it: row-major
    assert copies == []  # and not copied while the inputs were made
    ref = live_gate.reference(*(live_fp8.dequantised(x, d) for x, d in zip((q, k, v), descales)), SHAPE8.causal,
                              scale)
    for launches in (1, 2, 3):
        out.fill_(float("nan"))
        launch_set(mod, CFG, SHAPE8.causal, scale, s)
        assert copies == [v.data_ptr()] * launches  # one copy of this V inside every timed launch
        assert ((out.double() - ref).norm() / ref.norm()).item() <= U_E4M3


# ====================================================================== a whole tune
@pytest.mark.parametrize("fake_rocm", [MI300X], indirect=True)
def test_cli_fp8_tune_on_a_fake_mi300x_end_to_end(fake_rocm, tmp_path, monkeypatch, capsys):
    from isa_tools import iter_kernels

    from rocmflash.static.compile import triton_cache_dir

    monkeypatch.setattr("rocmflash.static.space.default_space", _tiny_fp8_space)
    db_path, cache = tmp_path / "mi300x.json", tmp_path / "cache"
    code = _cli(["tune", "--gpu", "mi300x", "--dtype", "fp8", "--head-dim", "64", "--seqlen", "128", "--heads", "2",
                 "--batch", "1", "--causal", "--strategy", "pruned", "--top-k", "2", "--db", str(db_path),
                 "--cache-dir", str(cache), "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    entries = D.ConfigDB.read(str(db_path))["entries"]
    assert list(entries) == ["d64-fp8e4m3fnuz-causal-gqa1-s128"], list(entries)  # --pass fwd: no backward entry
    entry = entries["d64-fp8e4m3fnuz-causal-gqa1-s128"]
    assert entry["measured"] and entry["complete"] and entry["timing"] == "interpreter"
    assert entry["problem"]["dtype"] == "fp8e4m3fnuz" and entry["problem"]["fp8_format"] == "float8_e4m3fnuz"
    assert "incumbent" not in entry and "SDPA has no fp8" in entry["incumbent_note"]
    assert entry["counts"]["ok"] == entry["counts"]["timed"] == 2 and entry["best"]["BLOCK_N"] in (32, 64)
    journal = D.Journal(D.journal_path(str(db_path)), "mi300x").records
    assert [r["status"] for r in journal] == ["ok", "ok"]
    assert all(1e-3 < r["rel_err"] <= U_E4M3 for r in journal), [r["rel_err"] for r in journal]
    # the static phase built the fp8 kernel for gfx942 (FNUZ), once per config
    built = list(iter_kernels([triton_cache_dir(str(cache))]))
    assert len(built) == 2 and all(k.arch == "gfx942" and "fp8" in k.name for k, _ in built), built
    # an interpreter-timed entry is never served
    assert D.lookup("mi300x", 64, torch.float8_e4m3fnuz, True, 1, 128, measured_only=True,
                    db_path=str(db_path)) is None


def test_static_fp8_tune_without_a_gpu_writes_an_unmeasured_ocp_entry(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("rocmflash.static.space.default_space", _tiny_fp8_space)
    db_path = tmp_path / "mi355x.json"
    code = _cli(["tune", "--gpu", "mi355x", "--dtype", "fp8", "--head-dim", "64", "--seqlen", "4096",
                 "--db", str(db_path), "--cache-dir", str(tmp_path / "cache"), "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    entry = D.ConfigDB.read(str(db_path))["entries"]["d64-fp8e4m3fn-full-gqa1-s4096"]
    assert entry["measured"] is False and entry["note"].startswith("UNMEASURED")
    assert entry["problem"]["fp8_format"] == "float8_e4m3fn" and entry["best"]["variant"] == "online"
    assert entry["seeds"] == [] and entry["counts"]["space"] == 2


# ====================================================================== run-time selection
@pytest.mark.parametrize("fake_rocm", [MI300X], indirect=True)
def test_attention_serves_the_fp8_entry_to_fp8_inputs_only(fake_rocm, tmp_path, monkeypatch):
    import rocmflash
    from rocmflash.api import selection
    from rocmflash.api.selection_fp8 import fp8_selection_details
    from rocmflash.kernels.launch import observe_launches

    fp8_cfg = KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=2, num_stages=1, waves_per_eu=3)
    bf16_cfg = KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=1)
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    store = D.ConfigDB.open(str(tmp_path / "mi300x.json"), "mi300x", "gfx942", D.environment("AMD Instinct MI300X"))
    store.put("d64-fp8e4m3fnuz-full-gqa1-s64", {"best": fp8_cfg.to_dict(), "measured": True, "tflops": 1.0})
    store.put("d64-bf16-full-gqa1-s64", {"best": bf16_cfg.to_dict(), "measured": True, "tflops": 1.0})
    store.save()
    selection.clear_cache()
    assert D.lookup("mi300x", 64, torch.float8_e4m3fnuz, False, 1, 64, measured_only=True) == fp8_cfg
    assert D.lookup("mi300x", 64, torch.bfloat16, False, 1, 64, measured_only=True) == bf16_cfg
    assert D.lookup("mi300x", 64, torch.float8_e4m3fn, False, 1, 64) is None  # the other family: never

    gen = torch.Generator().manual_seed(0)
    q8, k8, v8 = (live_fp8.fill(torch.empty(1, 2, 64, 64, dtype=torch.float8_e4m3fnuz), gen) for _ in range(3))
    descales = dict(zip(("q_descale", "k_descale", "v_descale"),
                        live_fp8.descales(1, 2, torch.float8_e4m3fnuz, "cpu", gen)))
    with observe_launches() as launches:
        out = rocmflash.attention(q8, k8, v8, **descales)
    assert torch.isfinite(out).all() and out.dtype == torch.bfloat16
    assert [r["kernel"] for r in launches][:1] == ["_kmajor_bytes"]  # gfx942 reads V K-major: its copy first
    (launch,) = launches[1:]
    assert "fp8" in launch["kernel"] and launch["options"]["waves_per_eu"] == 3 and launch["options"]["num_warps"] == 2
    from rocmflash.api import fp8_plans

    for _ in range(2):  # the signature's third call runs its kept plan: the same copy, entry config and answer
        with observe_launches() as again:
            planned = rocmflash.attention(q8, k8, v8, **descales)
    (plan,) = fp8_plans._PLANS.values()
    assert plan.kmajor and plan.cfg == fp8_cfg and torch.equal(planned, out)
    assert [(r["kernel"], r["backend"], r["options"]) for r in again] == \
        [(r["kernel"], r["backend"], r["options"]) for r in launches]
    assert fp8_selection_details(torch.device("cpu"), 64, torch.float8_e4m3fnuz, False, 1, 64)["source"] == "db"
    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    with observe_launches() as launches:
        rocmflash.attention(q, q, q)
    assert launches[0]["options"]["waves_per_eu"] == 1 and launches[0]["options"]["num_warps"] == 4


# ====================================================================== bad input
@pytest.mark.parametrize("argv, said", [
    (["--gpu", "mi250", "--dtype", "fp8"], "gfx90a"),
    (["--gpu", "mi300x", "--dtype", "fp8", "--variant", "split_kv"], "online kernel only"),
    (["--gpu", "mi300x", "--dtype", "fp8", "--pass", "both"], "inference-only"),
    (["--gpu", "mi300x", "--dtype", "fp8", "--mode", "decode"], "--kv-dtype fp8"),
    (["--gpu", "mi300x", "--dtype", "fp8", "--mode", "varlen"], "prefill forward"),
    (["--gpu", "mi300x", "--dtype", "bf16", "--kv-dtype", "fp8"], "--kv-dtype does not go with --mode prefill"),
    (["--gpu", "mi250", "--dtype", "bf16", "--mode", "decode", "--kv-dtype", "fp8"], "gfx90a"),
])
def test_bad_fp8_tune_input_is_one_line(tmp_path, monkeypatch, capsys, argv, said):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path / "configs"))
    monkeypatch.setenv("ROCMFLASH_CACHE_DIR", str(tmp_path / "cache"))
    code = _cli(["tune", *argv, "--head-dim", "128", "--seqlen", "2048"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert said in err and "Traceback" not in err, err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.json"))  # nothing compiled


def test_selection_details_for_cuda_find_what_a_call_on_cuda0_chose(monkeypatch):
    """The H100 run's failure: a call on ``cuda:0`` (a tensor's ``.device``) chose, ``fp8_selection_details``
    asked with ``torch.device("cuda")`` found nothing. Both name the current GPU: one key."""
    from rocmflash.api import selection_fp8 as SF

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    args = (128, torch.float8_e4m3fn, True, 1, 4096)
    assert SF._key(torch.device("cuda"), *args) == SF._key(torch.device("cuda", 0), *args)
    assert SF._key(torch.device("cuda", 1), *args) != SF._key(torch.device("cuda", 0), *args)
    SF._LAST_SOURCE[SF._key(torch.device("cuda", 0), *args)] = {"source": "db", "entry": "k"}
    try:
        assert SF.fp8_selection_details(torch.device("cuda"), *args) == {"source": "db", "entry": "k"}
    finally:
        SF._LAST_SOURCE.pop(SF._key(torch.device("cuda", 0), *args))
