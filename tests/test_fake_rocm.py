"""The ROCm path, exercised on the CPU through the fake ROCm layer (tests/fake_rocm.py).

Under the ``fake_rocm`` fixture torch reports an MI250 GCD (gfx90a, ROCm 6.4), Triton's
active target is ``hip/gfx90a``, kernels run in Triton's interpreter, and every child
Python (the tuner's spawned workers) installs the same fake. Checked here:

* the fake itself, in this process and in a child Python, and that it is undone;
* worker pinning: the pure environment rule (a table of cases) and a live worker that
  really runs with ``HIP_VISIBLE_DEVICES`` narrowed (``CUDA_VISIBLE_DEVICES`` untouched);
* SDPA backends: ROCm compares flash and efficient, never cuDNN (also in the benchmarks);
* launches: AMD options reach the launch on ROCm only;
* ``rocmflash tune --gpu mi250`` through the CLI: it decides to measure, gates and times
  in the interpreter, and the live runner builds gfx90a code objects with the AMD options;
* run-time selection reads a measured ``mi250.json`` and the op launches its config.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from rocmflash import db as D
from rocmflash.api import selection
from rocmflash.config import AMD_ONLY_OPTIONS, KernelConfig
from rocmflash.kernels.common import observe_launches, torch_backend
from conftest import spy_on_incumbent
from rocmflash.hw.platform import (SDPA_BACKENDS, is_rocm, missing_sdpa_backend, sdpa_backends,
                                visible_devices_env)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MI300X = {"name": "AMD Instinct MI300X", "gcn_arch_name": "gfx942:sramecc+:xnack-", "multi_processor_count": 304,
          "total_memory": 192 * 1024**3}


def _bench(name):
    """Import bench/<name>.py (not a package) as a module."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ====================================================================== the fake itself
CHILD_REPORT = """
import json, torch, triton
p = torch.cuda.get_device_properties(0)
t = triton.runtime.driver.active.get_current_target()
print(json.dumps({"hip": torch.version.hip, "available": torch.cuda.is_available(), "count": torch.cuda.device_count(),
                  "name": p.name, "arch": p.gcnArchName, "cus": p.multi_processor_count,
                  "capability": list(torch.cuda.get_device_capability()), "target": [t.backend, t.arch, t.warp_size],
                  "interpret": __import__("os").environ.get("TRITON_INTERPRET")}))
"""


def test_fake_reports_an_mi250_here_and_in_child_pythons(fake_rocm):
    props = torch.cuda.get_device_properties(0)
    target = __import__("triton").runtime.driver.active.get_current_target()
    here = {"hip": torch.version.hip, "available": torch.cuda.is_available(), "count": torch.cuda.device_count(),
            "name": props.name, "arch": props.gcnArchName, "cus": props.multi_processor_count,
            "capability": list(torch.cuda.get_device_capability()),
            "target": [target.backend, target.arch, target.warp_size], "interpret": os.environ["TRITON_INTERPRET"]}
    assert here == {"hip": "6.4.43482", "available": True, "count": 1, "name": "AMD Instinct MI250X / MI250",
                    "arch": "gfx90a:sramecc+:xnack-", "cus": 104, "capability": [9, 0],
                    "target": ["hip", "gfx90a", 64], "interpret": "1"}
    assert is_rocm() and torch_backend() == "hip" and torch.version.cuda is None
    assert torch.cuda.get_device_name("cuda:0") == torch.cuda.get_device_properties(torch.device("cuda", 0)).name
    with pytest.raises(RuntimeError, match="invalid device ordinal 1"):
        torch.cuda.get_device_properties(1)
    child = subprocess.run([sys.executable, "-c", CHILD_REPORT], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == here


def test_tune_resolves_the_fake_device(fake_rocm):
    from rocmflash.tuning import resolve_gpu

    assert [g.name for g in resolve_gpu("mi250")] == ["mi250", "mi250"]  # named = live: measure
    assert [g.name for g in resolve_gpu("auto")] == ["mi250", "mi250"]
    assert [g.name for g in resolve_gpu("mi300x")] == ["mi300x", "mi250"]  # another GPU: static ranking only


@pytest.mark.parametrize("fake_rocm", [MI300X], indirect=True)
def test_fake_takes_other_devices(fake_rocm):
    assert torch.cuda.get_device_capability(0) == (9, 4)
    assert __import__("triton").runtime.driver.active.get_current_target().arch == "gfx942"
    assert selection.device_identity(torch.device("cpu"))[1] == "gfx942"


def test_fake_is_undone():
    from fake_rocm import FakeROCm, install

    from triton.runtime import driver

    before = (torch.version.hip, torch.cuda.is_available, driver._active, driver._default)
    patches = install(FakeROCm())
    assert torch.version.hip and torch.cuda.is_available()
    patches.undo()
    assert (torch.version.hip, torch.cuda.is_available, driver._active, driver._default) == before
    assert not is_rocm()


# ====================================================================== worker pinning
@pytest.mark.parametrize("index, environ, rocm, expected", [
    (0, {}, True, {"HIP_VISIBLE_DEVICES": "0"}),
    (3, {}, True, {"HIP_VISIBLE_DEVICES": "3"}),
    (1, {"HIP_VISIBLE_DEVICES": "4,6"}, True, {"HIP_VISIBLE_DEVICES": "6"}),
    (0, {"HIP_VISIBLE_DEVICES": " 5 , 7"}, True, {"HIP_VISIBLE_DEVICES": "5"}),
    # HIP honours CUDA_VISIBLE_DEVICES when its own variable is unset; only HIP's is narrowed
    (1, {"CUDA_VISIBLE_DEVICES": "2,3"}, True, {"HIP_VISIBLE_DEVICES": "3"}),
    (0, {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "2,3"}, True, {"HIP_VISIBLE_DEVICES": "1"}),
    # ROCr narrows first and HIP indexes into what it leaves: a relative index, never ROCr's physical id
    (1, {"ROCR_VISIBLE_DEVICES": "4,5"}, True, {"HIP_VISIBLE_DEVICES": "1"}),
    (0, {"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "1,0"}, True, {"HIP_VISIBLE_DEVICES": "1"}),
    (1, {"HIP_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, True, {"HIP_VISIBLE_DEVICES": "GPU-bb"}),
    (0, {}, False, {"CUDA_VISIBLE_DEVICES": "0"}),
    (1, {"CUDA_VISIBLE_DEVICES": "2,3"}, False, {"CUDA_VISIBLE_DEVICES": "3"}),
    (0, {"HIP_VISIBLE_DEVICES": "5"}, False, {"CUDA_VISIBLE_DEVICES": "0"}),  # CUDA ignores HIP's variable
])
def test_visible_devices_env(index, environ, rocm, expected):
    assert visible_devices_env(index, environ, rocm) == expected


@pytest.mark.parametrize("index, environ, rocm, message", [
    (2, {"HIP_VISIBLE_DEVICES": "0,1"}, True, "HIP_VISIBLE_DEVICES='0,1' leaves 2 device(s)"),
    (2, {"ROCR_VISIBLE_DEVICES": "4,5"}, True, "ROCR_VISIBLE_DEVICES='4,5' leaves 2"),
    (0, {"CUDA_VISIBLE_DEVICES": ""}, False, "leaves 0 device(s)"),
    (-1, {}, True, "expected an int >= 0"),
])
def test_visible_devices_env_errors(index, environ, rocm, message):
    with pytest.raises(ValueError, match="device index") as err:
        visible_devices_env(index, environ, rocm)
    assert message in str(err.value)


@pytest.mark.parametrize("fake_rocm", [{"device_count": 4}], indirect=True)
def test_live_worker_is_pinned_and_measures_in_the_interpreter(fake_rocm, monkeypatch, tmp_path):
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings
    from rocmflash.hw.roofline import Shape

    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "2,3")  # HIP's list wins over CUDA's on ROCm
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    shape = Shape(batch=2, heads_q=2, heads_kv=1, seqlen_q=48, seqlen_k=48, head_dim=32, dtype="fp16", causal=True)
    cfg = KernelConfig(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=2)
    with LiveRunner(LiveSettings(timeout_s=60), triton_cache_dir=str(tmp_path / "triton"), device_index=1) as runner:
        result = runner.measure(cfg, shape)
        screen = runner.measure(cfg, shape, budget={"rep_ms": 10.0, "warmup_ms": 5.0, "min_reps": 3, "gate": False})
    # a race's screening round: timed, not gated
    assert screen["status"] == "ok" and screen["rel_err"] is None and screen["median_ms"] > 0, screen
    assert runner.device == "AMD Instinct MI250X / MI250"
    assert result["status"] == "ok", result
    # the worker sees the 2nd visible device through HIP's variable; CUDA's is left as the user set it
    assert result["device_env"] == {"HIP_VISIBLE_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert result["interpreted"] and result["rel_err"] < 1e-2
    assert len(result["times_ms"]) == 3 and result["median_ms"] > 0 and result["tflops"] > 0


# ====================================================================== SDPA backends
def test_sdpa_backends_per_platform():
    assert sdpa_backends(rocm=True) == ["flash", "efficient"]
    assert sdpa_backends(rocm=False) == ["flash", "cudnn", "efficient"]
    assert "NVIDIA-only" in missing_sdpa_backend("cudnn", rocm=True)
    assert sdpa_backends() == ["flash", "cudnn", "efficient"]  # this CPU build of torch is not ROCm


def test_benchmarks_never_pick_cudnn_on_rocm(fake_rocm, monkeypatch):
    assert sdpa_backends() == ["flash", "efficient"]
    q = torch.randn(1, 2, 32, 32)
    attention = _bench("attention")
    runs = attention.sdpa_runs(q, q, q, False)
    assert list(runs) == [f"sdpa_{b}" for b in SDPA_BACKENDS]
    assert isinstance(runs["sdpa_cudnn"], str) and runs["sdpa_cudnn"].startswith("skipped: cuDNN")
    assert callable(runs["sdpa_flash"]) and callable(runs["sdpa_efficient"])
    torch.testing.assert_close(runs["sdpa_flash"](), torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert attention.timed("sdpa_cudnn", runs["sdpa_cudnn"], q, q, q, False, torch.float32,
                           (1, 2, 32, 32)) == (None, runs["sdpa_cudnn"])
    # e2e: one SDPA backward row per backend; cuDNN's is skipped, never run
    monkeypatch.setattr("triton.testing.do_bench", lambda fn, **kw: (fn(), 1.0)[1])
    qs = torch.randn(1, 2, 32, 32, dtype=torch.bfloat16)
    rows = {r["impl"].split()[1]: r for r in _bench("e2e").sdpa_backward_rows(qs, qs, qs, qs, 1e9)}
    assert list(rows) == list(SDPA_BACKENDS)
    assert rows["cudnn"]["error"].startswith("skipped: cuDNN") and rows["cudnn"]["ms"] is None
    assert rows["flash"]["ms"] == 1.0  # CPU torch has a flash kernel


# ====================================================================== launches
def _launch_small(config):
    import rocmflash

    q = torch.randn(1, 2, 32, 64, dtype=torch.float16)
    with observe_launches() as launches:
        out = rocmflash.attention(q, q, q, config=config)
    assert torch.isfinite(out).all()
    return launches


def test_amd_options_reach_the_launch_on_rocm(fake_rocm):
    cfg = KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16,
                       kpack=2)
    (launch,) = _launch_small(cfg)
    assert launch["backend"] == "hip" and launch["interpreted"]
    assert launch["options"]["waves_per_eu"] == 2 and launch["options"]["matrix_instr_nonkdim"] == 16
    assert launch["options"]["kpack"] == 2 and launch["options"]["num_warps"] == 4


def test_no_amd_options_on_cuda(interpret):
    cfg = KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2)
    (launch,) = _launch_small(cfg)
    assert launch["backend"] == "cuda"
    assert not set(AMD_ONLY_OPTIONS) & set(launch["options"]) and launch["options"]["num_warps"] == 4


# ====================================================================== the tune, through the CLI
def _tiny_space(gpu, variants=None, dtype=None):
    """4 online configs (the default AMD space has hundreds: minutes of compiling on 2 cores).

    For D=64 on gfx90a (Triton 3.6) the two 64x64 configs survive the pruner and the two
    64x32 ones are cliff victims (8 VGPRs past the 96 cliff).
    """
    from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace

    return ConfigSpace({"online": {"BLOCK_M": [64], "BLOCK_N": [32, 64], "num_warps": [4], "num_stages": [1],
                                   "waves_per_eu": [4], "matrix_instr_nonkdim": [16], "kpack": [1, 2]}},
                       DEFAULT_RESTRICTIONS)


def _amd_options(d: dict) -> tuple:
    return d["waves_per_eu"], d["matrix_instr_nonkdim"], d["kpack"]


def test_cli_tune_mi250_measures_and_builds_gfx90a(fake_rocm, tmp_path, monkeypatch, capsys):
    from isa_tools import iter_kernels

    from rocmflash.cli import main
    from rocmflash.static.compile import triton_cache_dir

    monkeypatch.setattr("rocmflash.static.space.default_space", _tiny_space)
    db_path, cache = tmp_path / "mi250.json", tmp_path / "cache"
    code = main(["tune", "--gpu", "mi250", "--head-dim", "64", "--dtype", "fp16", "--seqlen", "128", "--heads", "2",
                 "--batch", "1", "--strategy", "pruned", "--top-k", "2", "--no-seeds", "--pass", "fwd", "--db", str(db_path), "--cache-dir", str(cache), "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "timed 2 config(s)" in out and "Nothing was benchmarked" not in out, out
    entry = D.ConfigDB.read(str(db_path))["entries"]["d64-fp16-full-gqa1-s128"]
    assert entry["measured"] is True and entry["complete"], entry
    # interpreter timings are recorded as such and never served at run time
    assert entry["timing"] == "interpreter" and "interpreter" in entry["note"]
    assert D.lookup("mi250", 64, "fp16", False, 1, 128, measured_only=True, db_path=str(db_path)) is None
    assert entry["counts"]["space"] == 4 and entry["counts"]["timed"] == entry["counts"]["ok"] == 2, entry["counts"]
    journal = D.Journal(D.journal_path(str(db_path)), "mi250").records
    assert [r["status"] for r in journal] == ["ok", "ok"] and all(r["rel_err"] < 1e-2 for r in journal), journal
    timed = sorted(_amd_options(r["config"]) for r in journal)
    assert timed == [(4, 16, 1), (4, 16, 2)] and _amd_options(entry["best"]) in timed
    # the runner's Triton cache is the static phase's: the 4 configs it compiled for gfx90a, each once (the
    # pre-warm of the timed ones, a cross-compile for the active target here, found their builds there)
    built = list(iter_kernels([triton_cache_dir(str(cache))]))
    for kernel, meta in built:
        assert kernel.arch == "gfx90a" and kernel.wavefront_size == 64 and meta.extra["arch"] == "gfx90a"
        assert meta.num_warps == 4 and meta.extra["num_stages"] == 1
    options = sorted(_amd_options(meta.extra) for _, meta in built)  # 2 BLOCK_N per option set
    assert len(built) == entry["counts"]["space"] == 4 and options == [(4, 16, 1)] * 2 + [(4, 16, 2)] * 2, options
    assert set(timed) <= set(options)


# ====================================================================== run-time selection
def test_selection_reads_measured_mi250_db(fake_rocm, tmp_path, monkeypatch):
    tuned = KernelConfig(BLOCK_M=32, BLOCK_N=16, num_warps=2, num_stages=1, waves_per_eu=3, kpack=2)
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    store = D.ConfigDB.open(str(tmp_path / "mi250.json"), "mi250", "gfx90a", D.environment("AMD Instinct MI250X / MI250"))
    store.put(D.problem_key(64, "fp16", False, 1, 128), {"best": tuned.to_dict(), "measured": True, "tflops": 1.0})
    store.save()
    D.clear_cache()
    cpu = torch.device("cpu")
    assert selection.device_identity(cpu) == ("mi250", "gfx90a")
    assert selection.select_config(cpu, 64, torch.float16, False, 1, 100, 100) == tuned
    assert selection.selection_source(cpu, 64, torch.float16, False, 1, 100) == "db"
    # the op selects the same entry at run time and launches it with its AMD options
    (launch,) = _launch_small(None)
    assert launch["backend"] == "hip" and launch["options"]["num_warps"] == 2
    assert launch["options"]["waves_per_eu"] == 3 and launch["options"]["kpack"] == 2


# ====================================================================== doctor on a (simulated) ROCm box
def test_doctor_reports_the_rocm_device_target_and_databases(fake_rocm, tmp_path, monkeypatch):
    from rocmflash.hw import doctor

    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(tmp_path))
    report = doctor.gather()
    assert report["runtime"] == f"ROCm/HIP {fake_rocm.hip_version}"
    (gpu,) = report["gpus"]
    assert (gpu["target"], gpu["arch"], gpu["compute_units"], gpu["warp_size"]) == ("mi250", "gfx90a", 104, 64)
    user, shipped = gpu["databases"]
    assert user["path"] == str(tmp_path / "mi250.json") and not user["exists"]
    assert shipped["exists"] and shipped["entries"] > 0 and shipped["measured"] == 0  # static rankings only
    assert report["verdict"].startswith("READY: 1 GPU(s) as mi250") and "no measured entries" in report["verdict"]
    text = doctor.render(report)
    assert "GPU 0   AMD Instinct MI250X / MI250: gfx90a, wave64, 104 CUs -> mi250" in text


@pytest.mark.parametrize("fake_rocm", [dict(MI300X, multi_processor_count=38, device_count=8)], indirect=True)
def test_doctor_shows_cpx_partitions_as_their_own_target(fake_rocm):
    from rocmflash.hw import doctor

    report = doctor.gather()
    assert len(report["gpus"]) == 8
    assert {(g["target"], g["partition"]) for g in report["gpus"]} == {("mi300x-cpx", "cpx")}
    assert report["gpus"][0]["databases"][-1]["path"].endswith("mi300x-cpx.json")
    assert "partition CPX" in doctor.render(report)


@pytest.mark.parametrize("fake_rocm", [{"name": "Radeon RX 7900 XTX", "gcn_arch_name": "gfx1100",
                                        "multi_processor_count": 48, "warp_size": 32}], indirect=True)
def test_doctor_names_an_rdna_card_and_says_why(fake_rocm):
    from rocmflash.hw import doctor

    report = doctor.gather()
    assert report["gpus"][0]["target"] is None
    assert report["verdict"].startswith("PARTLY READY") and "RDNA (wave32)" in report["verdict"]
    from rocmflash.tuning import NoLiveGPUError, resolve_gpu

    with pytest.raises(NoLiveGPUError, match="Radeon RX 7900 XTX .gfx1100, wave32"):
        resolve_gpu("auto")


# ====================================================================== the incumbent on ROCm
@pytest.mark.parametrize("shape", ["forward", "decode"])
@pytest.mark.parametrize("winner", ["flash", None])
def test_dispatch_chooses_between_the_rocm_backends_and_rocmflash(fake_rocm, tmp_path, monkeypatch, shape, winner):
    """On ROCm the candidates are SDPA's default, flash and efficient (no cuDNN); the worker gates exactly those,
    and a measured mi250.json entry whose fastest ROCm backend beat rocmflash's kernel makes the call run that
    backend -- a forward entry for a forward call, a decode- entry (eager times) for a one-token call; otherwise
    rocmflash's kernel launches for HIP."""
    import math

    import rocmflash
    from rocmflash.api import decode, incumbent
    from rocmflash.tuning.decode import decode_key
    from rocmflash.tuning.incumbent_worker import measure_decode

    assert incumbent.candidates() == ["default", "flash", "efficient"]
    B, Hq, Hkv, Sq, Sk, Dh = 2, 8, 2, (1 if shape == "decode" else 64), (512 if shape == "decode" else 64), 32
    if shape == "decode":
        gated = measure_decode({"head_dim": Dh, "dtype": "fp16", "heads_q": Hq, "heads_kv": Hkv, "batch": B,
                                "seqlen_k": Sk})["backends"]
        assert list(gated) == ["default", "flash", "efficient"] and gated["flash"]["rel_err"] < 1e-2
    times = {"default": 0.03, "flash": 0.01 if winner else 0.05, "efficient": 0.04}
    backends = {name: {"status": "ok", "time_ms": t} for name, t in times.items()}
    if shape == "decode":
        field = incumbent.decode_field({"status": "ok", "triton_ms": 0.02, "backends": backends})
        key, best = decode_key(Dh, "fp16", Hq // Hkv, Sk, B), {"BLOCK_N": 32, "num_warps": 4, "num_stages": 1,
                                                                "waves_per_eu": 2, "num_splits": 0}
    else:
        field = incumbent.incumbent_field({"backends": backends}, 0.02)
        key = D.problem_key(Dh, "fp16", False, Hq // Hkv, 64)
        best = KernelConfig(BLOCK_M=32, BLOCK_N=16, num_warps=2, num_stages=1, waves_per_eu=3).to_dict()
    assert incumbent.winner(field, False) == winner
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    store = D.ConfigDB.open(str(tmp_path / "mi250.json"), "mi250", "gfx90a", D.environment("AMD Instinct MI250X / MI250"))
    store.put(key, {"best": best, "measured": True, "incumbent": field})
    store.save()
    D.clear_cache()
    selection.clear_cache()
    decode.clear_cache()
    calls = spy_on_incumbent(monkeypatch)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, Hq, Sq, Dh, generator=g).half()
    k, v = (torch.randn(B, Hkv, Sk, Dh, generator=g).half() for _ in range(2))
    with observe_launches() as launches:
        out = rocmflash.attention(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(Hq // Hkv, 1),
                                                           v.float().repeat_interleave(Hq // Hkv, 1))
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2 and math.isfinite(out.float().sum().item())
    if winner:
        assert calls == ["flash"] and launches == []
    else:
        assert calls == [] and launches and {r["backend"] for r in launches} == {"hip"}
        assert any("decode" in r["kernel"] for r in launches) == (shape == "decode")


# ====================================================================== the served backend always exists
CUDA_RECORD = {"platform": "cuda", "torch": "2.11.0+cu130", "cuda": "13.0", "hip": None, "cudnn": 91002}


def _served_db(tmp_path, monkeypatch, runtime: str, record, backend: str = "cudnn", Sk: int = 64) -> dict:
    """A measured ``mi250.json`` last saved under ``runtime`` (the fingerprint's ``"cuda 13.0"`` or ``"hip ..."``)
    whose forward (d32 fp16 GQA 4 s64) and decode (B2, 512 keys) entries say SDPA ``backend`` beat rocmflash,
    each field timed on ``record`` (None: a field written before incumbents recorded it). Returns the fields."""
    from rocmflash.api import decode, incumbent
    from rocmflash.tuning.decode import decode_key

    backends = {"default": {"status": "ok", "time_ms": 0.05, "train_ms": 0.5},
                backend: {"status": "ok", "time_ms": 0.01, "train_ms": 0.1}}
    fwd = {"backend": backend, "time_ms": 0.01, "triton_ms": 0.02, "backends": backends,
           "train": {"backend": backend, "time_ms": 0.1, "triton_ms": 0.2}}
    dec = {"backend": backend, "time_ms": 0.01, "triton_ms": 0.02, "backends": backends,
           "timing": incumbent.DECODE_TIMING}
    for field in (fwd, dec):
        if record is not None:
            field["timed_on"] = dict(record)
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    monkeypatch.delenv(selection.NO_INCUMBENT_ENV, raising=False)
    store = D.ConfigDB.open(str(tmp_path / "mi250.json"), "mi250", "gfx90a",
                            dict(D.environment("AMD Instinct MI250X / MI250"), runtime=runtime))
    store.put(D.problem_key(32, "fp16", False, 4, Sk),
              {"best": KernelConfig(BLOCK_M=32, BLOCK_N=16, num_warps=2, num_stages=1, waves_per_eu=3).to_dict(),
               "measured": True, "incumbent": fwd})
    store.put(decode_key(32, "fp16", 4, 512, 2), {"best": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 1,
                                                          "waves_per_eu": 2, "num_splits": 0},
                                                 "measured": True, "incumbent": dec})
    store.save()
    D.clear_cache()
    selection.clear_cache()
    decode.clear_cache()
    return {"forward": fwd, "decode": dec}


def _fresh_qkv(B, Hq, Hkv, Sq, Sk, D, seed, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).half()
    k, v = (torch.randn(B, Hkv, Sk, D, generator=g).half() for _ in range(2))
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _rel_err_to_fp64(out, q, k, v):
    group = q.shape[1] // k.shape[1]
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(group, 1),
                                                           v.double().repeat_interleave(group, 1))
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("case, runtime, record, says", [
    # the field's record says where it was timed (the fingerprint of a database re-saved on ROCm does not matter)
    ("cuda record", "hip 6.4.43482", CUDA_RECORD, "timed on CUDA (its record)"),
    # a field written before the record: the database's fingerprint says it was tuned under CUDA
    ("cuda fingerprint", "cuda 13.0", None, "timed on CUDA (its database's fingerprint)"),
    # nothing says CUDA, but ROCm has no cuDNN
    ("no record", "hip 6.4.43482", None, "names cudnn, which this platform (ROCm) does not offer"),
])
def test_a_cuda_tuned_entry_naming_cudnn_runs_rocmflash_on_rocm(fake_rocm, tmp_path, monkeypatch, case, runtime,
                                                                record, says):
    """A database tuned on CUDA names cuDNN (which ROCm has not): every call runs rocmflash's kernel -- forward,
    training step, decode -- none raises, and ``explain`` says why."""
    import warnings

    import rocmflash
    from rocmflash.cli.explain import explain
    from rocmflash.kernels.launch import observe_launches

    _served_db(tmp_path, monkeypatch, runtime, record)
    calls = spy_on_incumbent(monkeypatch)
    for Sq, Sk, grad, seed in ((64, 64, False, 1), (64, 64, True, 2), (1, 512, False, 3)):
        q, k, v = _fresh_qkv(2, 8, 2, Sq, Sk, 32, seed, grad)
        with warnings.catch_warnings(record=True) as warned, observe_launches() as launches:
            warnings.simplefilter("always")
            out = rocmflash.attention(q, k, v)
            if grad:
                out.float().sum().backward()
        assert not [str(w.message) for w in warned if "rocmflash" in str(w.message)]  # nothing was tried
        assert launches and {r["backend"] for r in launches} == {"hip"}, (Sq, grad)
        assert any("decode" in r["kernel"] for r in launches) == (Sq == 1)
        assert _rel_err_to_fp64(out.detach(), q.detach(), k, v) < 1e-2
        assert not grad or torch.isfinite(q.grad).all()
    assert calls == []  # SDPA never ran
    forward = explain("mi250", 32, "fp16", False, 64, gqa_ratio=4, check=False)["runs"]
    assert [forward[s]["runs"] for s in ("forward", "forward+backward")] == ["rocmflash", "rocmflash"]
    assert says in forward["forward"]["why"] and says in forward["forward+backward"]["why"], forward
    assert forward["forward"]["sdpa_backend"] == "cudnn"  # the times are still shown
    dec = explain("mi250", 32, "fp16", False, 1, seqlen_k=512, gqa_ratio=4, batch=2, check=False)["runs"]
    assert dec["forward"]["runs"].startswith("rocmflash") and says in dec["forward"]["why"], dec["forward"]
    from rich.console import Console

    from rocmflash.cli.explain import print_explanation

    console = Console(record=True, width=400)
    print_explanation(explain("mi250", 32, "fp16", False, 64, gqa_ratio=4, check=False), console)
    text = console.export_text()
    assert "forward runs: rocmflash (entry's times: SDPA cudnn 0.01 ms vs rocmflash 0.02 ms): " in text and says in text, text
    note = forward["timed_on"]["note"]
    assert ("timed on torch 2.11.0+cu130 (CUDA 13.0, cuDNN 91002)" in note) == (record is not None), note
    assert forward["timed_on"]["this_torch"]["platform"] == "hip"


def test_the_record_of_a_rocm_entry_serves_and_keeps_another_torch_version(fake_rocm, tmp_path, monkeypatch):
    """The same entries timed on ROCm (an older torch) serve ROCm's flash backend: a torch upgrade keeps them, and
    ``explain`` says both versions."""
    import rocmflash
    from rocmflash.cli.explain import explain

    record = {"platform": "hip", "torch": "2.9.0+rocm6.4", "cuda": None, "hip": "6.4.1", "rocm_fa_library": "AOTriton"}
    _served_db(tmp_path, monkeypatch, "hip 6.4.1", record, backend="flash")
    calls = spy_on_incumbent(monkeypatch)
    q, k, v = _fresh_qkv(2, 8, 2, 64, 64, 32, 5)
    out = rocmflash.attention(q, k, v)
    assert calls == ["flash"] and _rel_err_to_fp64(out, q, k, v) < 1e-2
    runs = explain("mi250", 32, "fp16", False, 64, gqa_ratio=4, check=False)["runs"]
    assert runs["forward"]["runs"] == "SDPA (flash)", runs["forward"]
    assert "another torch version of the same platform, its times are kept" in runs["timed_on"]["note"]
    assert "torch 2.9.0+rocm6.4 (ROCm 6.4.1, flash library AOTriton)" in runs["timed_on"]["note"]


class RefusingSdpa:
    """torch's SDPA where this torch refuses the backend for every input (as ``No available kernel`` reads)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        raise RuntimeError("No available kernel. Aborting execution.")


@pytest.mark.parametrize("entry_point", ["attention", "flash_attn_func", "patch_sdpa"])
def test_a_backend_that_refuses_its_first_call_falls_back_once(fake_rocm, tmp_path, monkeypatch, entry_point):
    """SDPA's flash backend is offered (ROCm has it) but refuses the problem: the first call is served by
    rocmflash's kernel with one warning; later calls of the problem -- the same shapes, another length of the same
    bucket, and after the plans are forgotten -- go straight to rocmflash's kernel, never trying SDPA again."""
    import warnings

    import rocmflash
    from rocmflash.api import incumbent, sdpa
    from rocmflash.kernels.launch import observe_launches

    record = {"platform": "hip", "torch": torch.__version__, "cuda": None, "hip": fake_rocm.hip_version}
    _served_db(tmp_path, monkeypatch, "hip 6.4.43482", record, backend="flash")
    monkeypatch.setattr(incumbent, "_FELL_BACK", {})
    monkeypatch.setattr(incumbent, "_WARNED", set())
    refusing = RefusingSdpa()
    monkeypatch.setattr(incumbent, "_SDPA", [refusing])

    def call(q, k, v):
        if entry_point == "attention":
            return rocmflash.attention(q, k, v)
        if entry_point == "flash_attn_func":
            return rocmflash.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        with sdpa.patch_sdpa():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    for i, S in enumerate((64, 64, 48, 64)):  # 48: another length of the s64 bucket
        if i == 3:
            selection.clear_cache()  # the plans forgotten: the refusal is not
        q, k, v = _fresh_qkv(2, 8, 2, S, S, 32, 10 + i)
        with warnings.catch_warnings(record=True) as warned, observe_launches() as launches:
            warnings.simplefilter("always")
            out = call(q, k, v)
        fell = [w for w in warned if "raised on the first call" in str(w.message)]
        assert len(fell) == (1 if i == 0 else 0), [str(w.message) for w in warned]
        assert launches and {r["backend"] for r in launches} == {"hip"}  # rocmflash's kernel, every time
        assert _rel_err_to_fp64(out, q, k, v) < 1e-2, i
    assert refusing.calls == 1  # tried once: the first call
    (error,) = incumbent.sdpa_fallbacks().values()
    assert error == "RuntimeError: No available kernel. Aborting execution."
