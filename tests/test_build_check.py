"""Run time's first-use build check of served configs (issue 48, item 2; :mod:`rocmflash.api.build_check`).

On the CPU, through Triton's interpreter: the live GPU is faked (an H100 identity, and the check told its launches
are a live GPU's), and a stand-in compiler answers for the one function that reads a compiled kernel's profile
(:func:`rocmflash.api.build_check.kernel_profile`): its profile of the served config spills inside the loop, so the
entry's next near-best config must serve, with exactly one warning, the check must not run again, results must stay
right (fp32 reference), and ``rocmflash explain`` must say the same. A record-less entry is not compared, a failed
build is replaced at once, and ``ROCMFLASH_NO_BUILD_CHECK=1`` turns it all off.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rocmflash.api import build_check, selection
from rocmflash.config import KernelConfig, default_config

pytestmark = pytest.mark.usefixtures("fresh_selection", "interpret")
_REAL_LIVE = build_check.live  #: the gate itself, before a test fakes a live GPU

D, S, H = 32, 16, 2  # tiny: the interpreter runs every launch
KEY = f"d{D}-fp16-full-gqa1-s{S}"
BEST = KernelConfig(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
NEAR = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
RANKED = KernelConfig(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)
COMPILER = {"triton": "3.6.0", "backend": "cuda", "llvm": None, "llvm_hash": None, "producer": "ptxas stub"}


def _profile(**fields) -> dict:
    base = {"status": "ok", "kernel": "_fwd_online", "vgprs": 128, "agprs": 0, "sgprs": None, "vgpr_spills": 0,
            "sgpr_spills": 0, "scratch_bytes": 0, "spills_in_loop": False, "scratch_loop_ops": 0, "lds_bytes": 8192,
            "waves_per_simd": 4, "limiter": "vgpr"}
    return dict(base, **fields)


SPILLS = _profile(vgprs=255, vgpr_spills=40, scratch_bytes=160, spills_in_loop=True, scratch_loop_ops=12)


def _entry(recorded: bool = True) -> dict:
    rec = (lambda p: {"static_profile": p}) if recorded else (lambda p: {})
    entry = {"best": BEST.to_dict(), "measured": True, "tflops": 1.0,
             "near_best": [dict({"config": NEAR.to_dict(), "time_ms": 1.1}, **rec(_profile(vgprs=96)))],
             "ranked": [dict({"config": RANKED.to_dict()}, **rec(_profile(vgprs=100)))]}
    if recorded:
        entry.update(static_profile=_profile(), compiler=COMPILER)
    return entry


@pytest.fixture
def gpu_db(tmp_path, monkeypatch):
    """An H100 database holding one entry (``write(entry)``) and a faked live H100 whose launches the check treats
    as compiled ones; the process's warned-of entries start empty."""
    db = pytest.importorskip("rocmflash.db")
    monkeypatch.setenv(db.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(db, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    monkeypatch.setattr(build_check, "live", lambda device: True)
    monkeypatch.setattr(build_check, "_WARNED", set())
    monkeypatch.delenv(build_check.NO_BUILD_CHECK_ENV, raising=False)
    path = str(tmp_path / "h100.json")

    def write(entry: dict) -> str:
        d = db.ConfigDB.open(path, "h100", "sm_90", {"test": True})
        d.put(KEY, entry)
        d.save()
        selection.clear_cache()
        return path

    return write


@pytest.fixture
def stand_in(monkeypatch):
    """A stand-in compiler: ``profiles`` maps a config to the profile its compiled kernel shows (default: the
    record's numbers), ``reads`` lists every config whose compiled kernel was read."""
    profiles, reads = {}, []

    def kernel_profile(launch, backend):
        reads.append(launch.cfg)
        return profiles.get(launch.cfg, _profile())

    monkeypatch.setattr(build_check, "kernel_profile", kernel_profile)
    return profiles, reads


def _qkv(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, S, D, generator=g).to(torch.float16) for _ in range(3)]


def _check_result(out, q, k, v):
    """``out`` against an fp32 reference by relative error (fresh random inputs)."""
    qf, kf, vf = (t.float() for t in (q, k, v))
    ref = torch.softmax(qf @ kf.transpose(-1, -2) / math.sqrt(D), dim=-1) @ vf
    err = (out.float() - ref).norm() / ref.norm()
    assert err < 2e-2, err


def _launched_configs(monkeypatch) -> list:
    """The configs the online kernel is launched with from now on (a spy on the variant's launch)."""
    from rocmflash.kernels import get_variant

    variant = get_variant("online")
    seen, real = [], variant.launch

    def spy(q, k, v, cfg, *args, **kwargs):
        seen.append(cfg)
        return real(q, k, v, cfg, *args, **kwargs)

    monkeypatch.setattr(variant, "launch", spy)
    return seen


def _attention(seed: int):
    import rocmflash

    q, k, v = _qkv(seed)
    out = rocmflash.attention(q, k, v)
    _check_result(out, q, k, v)
    return out


def test_a_served_config_that_spills_now_is_replaced_by_the_next_near_best_once(gpu_db, stand_in, monkeypatch):
    path = gpu_db(_entry())
    profiles, reads = stand_in
    profiles[BEST] = SPILLS
    launched = _launched_configs(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(4):
            _attention(seed)
    # the first call ran the entry's winner (compiled anyway) and read it; the second ran the near-best one
    assert launched == [BEST, NEAR, NEAR, NEAR]
    assert reads == [BEST, NEAR]  # each build read once: the check does not run again
    ours = [w for w in caught if "build check" in str(w.message) or "first use" in str(w.message)]
    assert len(ours) == 1 and ours[0].category is RuntimeWarning
    text = str(ours[0].message)
    for part in (KEY, path, "Triton 3.6.0", "near_best[0]", "spills in the loop (12 scratch ops, 160 B/lane)",
                 "255v 4w spill-loop", "128v 4w", "16x16 w4 s1", "32x16 w4 s1"):
        assert part in text, (part, text)
    # the selection itself serves the decision (what the plans keep), and says why
    assert selection.select_config(q_dev(), D, torch.float16, False, 1, S, S) == NEAR
    details = selection.selection_details(q_dev(), D, torch.float16, False, 1, S)
    assert details["build_check"].startswith("served 16x16 w4 s1 (near_best[0]) instead of 32x16 w4 s1 (best)")
    # the same problem through flash_attn_func ((B, S, H, D)) is served the decided config without a new check
    from rocmflash import flash_attn_func

    q, k, v = _qkv(9)
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    _check_result(out.transpose(1, 2), q, k, v)
    assert launched[-1] == NEAR and reads == [BEST, NEAR]


def q_dev():
    return torch.device("cpu")


def test_explain_shows_the_same_decision(gpu_db, stand_in, monkeypatch):
    path = gpu_db(_entry())
    profiles, _ = stand_in
    profiles[BEST] = SPILLS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _attention(0)
        _attention(1)
    runtime = selection.selection_details(q_dev(), D, torch.float16, False, 1, S)["build_check"]

    from rocmflash.cli import explain as E

    verdict = {"kept": True, "reason": None, "detail": None, "vgprs": 128, "agprs": 0, "spills": 0,
               "sgpr_spills": 0, "scratch_bytes": 0, "waves_per_simd": 4}
    monkeypatch.setattr(E, "_verdict", lambda gpu, problem, cfg, cache_dir: verdict)  # the pruner's: not under test
    compiled = []
    monkeypatch.setattr("rocmflash.static.compile.compile_forward",
                        lambda target, cfg, problem, gpu: compiled.append(cfg) or (_Kernel(),))
    result = E.explain("h100", D, "fp16", False, S, db_path=path)
    bc = result["build_check"]
    assert bc["checked"] and bc["replaced"] and bc["label"] == "near_best[0]"
    assert KernelConfig.from_dict(bc["served"]) == NEAR
    assert bc["text"] == runtime
    assert compiled == [BEST, NEAR]  # cross-compiled the winner, then the near-best one
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=400)
    E.print_explanation(result, console)
    assert f"first-use build check (run time, on h100): {runtime}" in console.file.getvalue()


class _Kernel:
    name = "_fwd_online"


def test_a_config_that_holds_is_kept_and_read_once(gpu_db, stand_in, monkeypatch):
    gpu_db(_entry())
    _, reads = stand_in
    launched = _launched_configs(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _attention(0)
        _attention(1)
    assert launched == [BEST, BEST] and reads == [BEST]
    assert not [w for w in caught if "first use" in str(w.message)]
    assert selection.selection_details(q_dev(), D, torch.float16, False, 1, S)["build_check"] == \
        "the served config holds under the installed compiler"


def test_fewer_waves_than_recorded_falls_through_to_ranked_then_the_default(gpu_db, stand_in, monkeypatch):
    gpu_db(_entry())
    profiles, reads = stand_in
    profiles[BEST] = _profile(waves_per_simd=2, vgprs=200)
    profiles[NEAR] = _profile(waves_per_simd=3, vgprs=160)  # recorded 4 waves too
    profiles[RANKED] = SPILLS
    launched = _launched_configs(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(5):
            _attention(seed)
    fallback = default_config("sm_90", D)
    assert launched == [BEST, NEAR, RANKED, fallback, fallback]
    assert reads == [BEST, NEAR, RANKED, fallback]  # the arch default is checked too (it builds without a spill)
    (warning,) = [w for w in caught if "first use" in str(w.message)]
    assert "waves/SIMD 4 -> 2 (vgpr-limited)" in str(warning.message)
    assert "(default) instead of" in str(warning.message)


def test_a_failed_build_is_replaced_in_the_same_call_and_an_unrecorded_entry_is_not_compared(gpu_db, stand_in,
                                                                                            monkeypatch):
    gpu_db(_entry(recorded=False))
    profiles, reads = stand_in
    profiles[BEST] = SPILLS  # would be a regression, but there is no record to compare with
    launched = _launched_configs(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _attention(0)
        _attention(1)
    assert launched == [BEST, BEST] and reads == []  # not compared: no profile read at all
    assert not [w for w in caught if "first use" in str(w.message)]

    # the same entry's winner fails to build now: the near-best one serves this very call
    selection.clear_cache()
    from rocmflash.kernels import get_variant
    from triton.compiler.errors import CompilationError

    variant = get_variant("online")
    spy = variant.launch

    def failing(q, k, v, cfg, *args, **kwargs):
        if cfg == BEST:
            launched.append(cfg)
            raise CompilationError("stub", None, "out of registers")
        return spy(q, k, v, cfg, *args, **kwargs)

    monkeypatch.setattr(variant, "launch", failing)
    del launched[:]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _attention(2)
        _attention(3)
    assert launched == [BEST, NEAR, NEAR]
    (warning,) = [w for w in caught if "first use" in str(w.message)]
    assert "fails to build (CompilationError" in str(warning.message)


def test_the_env_switch_turns_the_check_off(gpu_db, stand_in, monkeypatch):
    gpu_db(_entry())
    profiles, reads = stand_in
    profiles[BEST] = SPILLS
    monkeypatch.setenv(build_check.NO_BUILD_CHECK_ENV, "1")
    launched = _launched_configs(monkeypatch)
    _attention(0)
    _attention(1)
    assert launched == [BEST, BEST] and reads == []
    assert "build_check" not in selection.selection_details(q_dev(), D, torch.float16, False, 1, S)


def test_no_check_without_a_live_gpu(gpu_db, stand_in, monkeypatch):
    """The check's own gate: CPU tensors under the interpreter are never checked (here not faked live)."""
    gpu_db(_entry())
    profiles, reads = stand_in
    profiles[BEST] = SPILLS
    monkeypatch.setattr(build_check, "live", _REAL_LIVE)
    launched = _launched_configs(monkeypatch)
    _attention(0)
    assert launched == [BEST] and reads == []


def test_the_comparison_hook():
    """:func:`holds` itself: a failed build never holds, no record holds on building, regressions name why."""
    assert build_check.holds(_profile(), _profile()) == (True, [])
    assert build_check.holds(None, SPILLS) == (True, [])
    assert build_check.holds(None, {"status": "failed", "error": "x"})[0] is False
    ok, why = build_check.holds(_profile(), _profile(waves_per_simd=3))
    assert not ok and why == ["waves/SIMD 4 -> 3 (vgpr-limited)"]
    assert build_check.holds(build_check.DEFAULT_RECORD, SPILLS)[0] is False


@pytest.mark.parametrize("gpu_name", ["mi300x", "h100"])
def test_the_real_reader_reads_what_the_tune_recorded(gpu_name, tmp_path):
    """:func:`kernel_profile` on a real cross-compiled kernel (an AMD code object; a CUDA cubin, and the same kernel
    as if loaded on a device: its ``n_regs`` / ``n_spills``) gives the profile the tune's static phase records for
    it, so run time compares like with like. Compile-only (no interpreter needed)."""
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.config import Problem
    from rocmflash.kernels.launch import CompiledLaunch
    from rocmflash.static.compile import compile_forward, sweep
    from rocmflash.static.profile import static_profile

    gpu = get_gpu(gpu_name)
    problem = Problem(head_dim=64, dtype="fp16", causal=False, heads_q=8, heads_kv=8, seqlen_q=256, seqlen_k=256)
    cfg = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1)
    (obs,), _ = sweep([cfg], problem, gpu, cache_dir=str(tmp_path), workers=1)
    recorded = static_profile(obs)
    (kernel,) = compile_forward(gpu.triton_target(), cfg, problem, gpu)
    backend = gpu.triton_target().backend
    now = build_check.kernel_profile(CompiledLaunch(kernel.name, cfg, kernel), backend)
    assert recorded["status"] == "ok" and now == recorded
    if backend == "cuda":  # as a launch leaves it: Triton's counts from the loaded module
        kernel.n_regs, kernel.n_spills = recorded["vgprs"], 0
        loaded = build_check.kernel_profile(CompiledLaunch(kernel.name, cfg, kernel), backend)
        assert {k: loaded[k] for k in ("vgprs", "waves_per_simd", "scratch_bytes", "status")} == \
            {k: recorded[k] for k in ("vgprs", "waves_per_simd", "scratch_bytes", "status")}
        assert build_check.holds(recorded, loaded) == (True, [])
