"""The static phase knows fp8 (#30 item 3, forward): ``vgpr-report --dtype fp8`` sweeps, compiles, reads and
prunes fp8 forward builds, and the roofline has fp8 peaks and bytes.

The register numbers are compiler truth: every fp8 row of a sweep is compared with what ``isa_tools`` reads
from a fresh compile of the same config in a process of its own (Triton 3.6 keeps one AMD generation's fp8
conversions per process, so each arch compiles in its own spawned process; the two sweeps of this module run
one after the other in this process, each in its own worker pool).
"""

import concurrent.futures
import contextlib
import dataclasses
import io
import json
import multiprocessing
import os
import subprocess
import sys

import pytest

from rocmflash.config import FP8, KernelConfig, Problem, default_config, normalize_dtype
from rocmflash.hw.gpus import GPUS, get_gpu

ARCH_GPUS = {"gfx942": "mi300x", "gfx950": "mi355x"}
#: a small corner of the online space (the CLI has no knob filter): both key blocks, with and without an
#: occupancy request, so that kept and pruned rows both appear
SMALL = {"BLOCK_M": [128], "BLOCK_N": [32, 64], "num_warps": [4], "PRE_LOAD_V": [False], "waves_per_eu": [0, 2],
         "matrix_instr_nonkdim": [16], "kpack": [1]}
CONFIG_FIELDS = {f.name for f in dataclasses.fields(KernelConfig)}


# ----------------------------------------------------------------------------- dtype, space, cache key
def test_problem_takes_fp8_but_selection_dtypes_do_not():
    assert Problem(dtype="fp8").dtype == FP8 == Problem(dtype="FLOAT8").dtype
    with pytest.raises(ValueError, match="expected float16, bfloat16 or fp8"):
        Problem(dtype="fp32")
    with pytest.raises(ValueError, match="expected float16 or bfloat16"):  # tuner/DB/selection keys: no fp8
        normalize_dtype("fp8")


def test_fp8_min_key_block_is_the_kernels():
    from rocmflash.kernels.fp8.forward import MIN_PIECE
    from rocmflash.static.space import FP8_MIN_BLOCK_N

    assert FP8_MIN_BLOCK_N == MIN_PIECE


@pytest.mark.parametrize("name", ["mi300x", "mi355x", "h100"])
def test_fp8_space_is_the_online_space_with_wide_key_blocks(name):
    from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace, default_space

    gpu = get_gpu(name)
    fp8 = default_space(gpu, None, "fp8").configs(Problem(dtype="fp8"), gpu)
    online = default_space(gpu, ["online"]).configs(Problem(dtype="bf16"), gpu)
    assert fp8 == [c for c in online if c.BLOCK_N >= 32] and len(fp8) >= 36
    assert default_space(gpu, ["online"], "fp8").configs(Problem(dtype="fp8"), gpu) == fp8
    # bf16/fp16 spaces are unchanged by the fp8 rules
    assert default_space(gpu).configs(Problem(dtype="bf16"), gpu) == default_space(gpu, None, "bf16").configs(
        Problem(dtype="bf16"), gpu)
    assert {c.variant for c in default_space(gpu).configs(Problem(dtype="bf16"), gpu)} > {"online"}
    # a space listing 16-wide key blocks or other variants keeps neither for fp8
    custom = ConfigSpace({"online": {"BLOCK_N": [16, 32]}, "split_kv": {"BLOCK_N": [32]}}, DEFAULT_RESTRICTIONS)
    assert [(c.variant, c.BLOCK_N) for c in custom.configs(Problem(dtype="fp8"), gpu)] == [("online", 32)]
    assert len(custom.configs(Problem(dtype="bf16"), gpu)) == 3


@pytest.mark.parametrize("name, arch", [("mi250", "gfx90a"), ("mi210", "gfx90a"), ("a100", "sm_80")])
def test_fp8_space_refused_where_there_is_no_fp8_mma(name, arch):
    from rocmflash.static.space import default_space

    with pytest.raises(ValueError, match=f"{name} \\({arch}\\) has no fp8 matrix instructions") as err:
        default_space(get_gpu(name), None, "fp8")
    assert "\n" not in str(err.value)


def test_fp8_space_refuses_other_variants():
    from rocmflash.static.space import default_space

    with pytest.raises(ValueError, match=r"\['split_d'\] have no fp8 build"):
        default_space(get_gpu("mi300x"), ["online", "split_d"], "fp8")


def test_fp8_formats_per_arch():
    from rocmflash.static.space import fp8_format

    assert {n: fp8_format(get_gpu(n)) for n in ("mi300a", "mi300x", "mi325x", "mi350x", "mi355x", "h100",
                                                 "mi300x-cpx")} == {
        "mi300a": "float8_e4m3fnuz", "mi300x": "float8_e4m3fnuz", "mi325x": "float8_e4m3fnuz",
        "mi350x": "float8_e4m3fn", "mi355x": "float8_e4m3fn", "h100": "float8_e4m3fn", "mi300x-cpx": "float8_e4m3fnuz"}


def test_cache_key_holds_the_fp8_format_and_the_fp8_sources(monkeypatch):
    import rocmflash.static.space as space
    from rocmflash.static.compile import FORWARD_SOURCES, fingerprint

    assert {"kernels/fp8/forward.py", "hw/fp8.py"} <= set(FORWARD_SOURCES)  # the formats per arch moved to hw/fp8.py
    gpu, cfg = get_gpu("mi300x"), KernelConfig()
    key = fingerprint(cfg, Problem(dtype="fp8"), gpu)
    assert key != fingerprint(cfg, Problem(dtype="bf16"), gpu)
    bf16 = fingerprint(cfg, Problem(dtype="bf16"), gpu)
    monkeypatch.setattr(space, "fp8_format", lambda g: "float8_e4m3fn")  # same arch, other bytes: other key
    assert fingerprint(cfg, Problem(dtype="fp8"), gpu) != key
    assert fingerprint(cfg, Problem(dtype="bf16"), gpu) == bf16  # a bf16 key does not read the fp8 format


# ----------------------------------------------------------------------------- roofline
def test_fp8_peaks_are_dense_and_present_exactly_where_fp8_mma_is():
    from rocmflash.hw.fp8 import fp8_family

    for gpu in GPUS.values():
        if fp8_family(gpu.arch) is None:
            assert gpu.peak_fp8_tflops is None, gpu.name
        else:  # dense fp8 is twice dense fp16 on CDNA3/CDNA4/Hopper; a "with sparsity" figure would be 4x
            assert gpu.peak_fp8_tflops == pytest.approx(2 * gpu.peak_fp16_tflops, rel=1e-3), gpu.name
    whole, cpx = get_gpu("mi300x"), get_gpu("mi300x-cpx")
    assert cpx.peak_fp8_tflops == pytest.approx(whole.peak_fp8_tflops / 8, rel=1e-3)


def test_fp8_roofline_uses_fp8_peak_and_one_byte_inputs():
    from rocmflash.hw.roofline import Shape, flops, min_bytes, roofline

    gpu = get_gpu("mi355x")
    bf16 = Shape(2, 16, 4, 1024, 2048, 128, "bf16")
    fp8 = dataclasses.replace(bf16, dtype="fp8")
    q = 2 * 16 * 1024 * 128  # elements of Q (and of O)
    kv = 2 * 4 * 2048 * 128  # elements of K (and of V)
    assert min_bytes(bf16) == 2.0 * (2 * q + 2 * kv)
    assert min_bytes(fp8) == 1.0 * (q + 2 * kv) + 2.0 * q  # 1-byte Q/K/V, 2-byte output
    assert flops(fp8) == flops(bf16)
    r8, r16 = roofline(gpu, fp8), roofline(gpu, bf16)
    assert r8.compute_ms == flops(fp8) / (gpu.peak_fp8_tflops * 1e12) * 1e3
    assert r8.memory_ms == min_bytes(fp8) / (gpu.hbm_tbs * 1e12) * 1e3
    # bf16 is what it was: the fp16 peak, two bytes everywhere
    assert r16.compute_ms == flops(bf16) / (gpu.peak_fp16_tflops * 1e12) * 1e3
    assert r16.memory_ms == min_bytes(bf16) / (gpu.hbm_tbs * 1e12) * 1e3
    with pytest.raises(ValueError, match=r"mi250 \(gfx90a\) has no fp8 matrix peak") as err:
        roofline(get_gpu("mi250"), fp8)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the CLI, compiled for real
def _truth(arch: str, configs: list, cache_dir: str) -> list:
    """In a fresh process: isa_tools' reading of each fp8 config compiled for ``arch`` in its e4m3 format."""
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    import torch

    from isa_tools import kernel_summary, read_code_object
    from rocmflash.kernels.fp8 import forward as fp8_forward

    dtype = torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn
    out = []
    for cfg in configs:
        (k,) = fp8_forward.compile_for(arch, KernelConfig.from_dict(cfg), Problem(head_dim=128, dtype="bf16"), dtype)
        (kernel,) = read_code_object(k.asm["hsaco"])
        out.append(kernel_summary(kernel, k.metadata.shared, k.metadata.num_warps, k.asm["amdgcn"]))
    return out


def _small_knobs(original):
    def knobs(arch=""):
        spaces = original(arch)
        spaces["online"] = dict(spaces["online"], **SMALL)
        return spaces

    return knobs


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """``vgpr-report --gpu mi300x --dtype fp8 --json``, then the same for mi355x, in this process (the sweeps
    compile in their own worker pools), then a warm text run of each."""
    import rocmflash.static.space as space
    from rocmflash.cli import main

    root = tmp_path_factory.mktemp("fp8-report")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(space, "_amd_knobs", _small_knobs(space._amd_knobs))
        for arch, name in ARCH_GPUS.items():
            args = ["vgpr-report", "--gpu", name, "--dtype", "fp8", "--variant", "online", "--cache-dir",
                    str(root / "cache"), "--out", str(root / name), "--workers", "2"]
            buffer, text = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(buffer):
                rc_json = main(args + ["--json"])
            with contextlib.redirect_stdout(text):
                rc_text = main(args)
            out[arch] = {"rc": (rc_json, rc_text), "rows": json.loads(buffer.getvalue()), "text": text.getvalue(),
                         "report": (root / name / "report.md").read_text(), "dir": root / name}
    return out


@pytest.mark.parametrize("arch", list(ARCH_GPUS))
def test_vgpr_report_fp8_prints_the_report(reports, arch):
    r = reports[arch]
    assert r["rc"] == (0, 0)
    rows = r["rows"]
    assert len(rows) == (8 if arch == "gfx950" else 4)  # gfx950's online space adds num_stages=2
    assert {row["variant"] for row in rows} == {"online"} and {row["arch"] for row in rows} == {arch}
    assert all(row["vgpr_count"] and row["allocated_vgprs"] and row["waves_per_simd"] for row in rows)
    assert {row["verdict"] for row in rows} == {"kept", "pruned"}  # wpe=0 128x64 falls to one wave
    assert all(row["reason"] != "compile_failed" for row in rows)
    fmt = "float8_e4m3fnuz" if arch == "gfx942" else "float8_e4m3fn"
    assert f"dtype=fp8 ({fmt} Q/K/V, bf16 output)" in r["report"]
    assert "below_occupancy_floor" in r["report"] and "Kept configs" in r["report"]
    for name in ("configs.csv", "vgprs.png"):
        assert (r["dir"] / name).stat().st_size > 0
    text = r["text"]
    assert f"{ARCH_GPUS[arch]} ({arch}) D=128 fp8" in text and "0 compiled" in text and "warm run" in text
    assert "verdicts: " in text and "below_occupancy_floor" in text


def test_fp8_rows_are_compiler_truth(reports, tmp_path):
    """Each row's registers and occupancy equal isa_tools' reading of a fresh compile of its config."""
    jobs = {arch: [{k: v for k, v in row.items() if k in CONFIG_FIELDS} for row in reports[arch]["rows"]]
            for arch in ARCH_GPUS}
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=ctx, max_tasks_per_child=1) as pool:
        futures = {arch: pool.submit(_truth, arch, cfgs, str(tmp_path / arch)) for arch, cfgs in jobs.items()}
        truth = {arch: f.result(timeout=900) for arch, f in futures.items()}
    keys = ("vgpr_count", "agpr_count", "allocated_vgprs", "vgpr_spill_count", "waves_per_simd", "limiter",
            "sgpr_count")
    for arch in ARCH_GPUS:
        for row, fresh in zip(reports[arch]["rows"], truth[arch]):
            assert {k: row[k] for k in keys} == {k: fresh[k] for k in keys}, (arch, row)
            assert row["lds_bytes"] == fresh["lds_bytes"] + fresh["dynamic_lds_bytes"]


def test_fp8_default_tile_uses_fewer_vgprs_than_bf16_on_gfx942(tmp_path):
    """The fp8 tiles hold Q, K, V and P in half the registers: the default D=128 tile, compiled both ways."""
    from rocmflash.static.compile import sweep

    gpu = get_gpu("mi300x")
    cfg = default_config(gpu.arch, 128)
    assert cfg.BLOCK_N >= 32  # the fp8 default tile is the bf16 one (fp8.attention_fp8's default)
    seen = {}
    for dtype in ("bf16", "fp8"):
        (obs,), stats = sweep([cfg], Problem(head_dim=128, dtype=dtype), gpu, cache_dir=str(tmp_path), workers=1)
        assert obs["status"] == "ok" and stats.compiled == 1, obs.get("error")
        seen[dtype] = obs["kernels"][0]
    assert seen["fp8"]["name"] == "_fwd_fp8" and seen["bf16"]["name"] != "_fwd_fp8"
    assert seen["fp8"]["vgpr_count"] < seen["bf16"]["vgpr_count"], seen
    assert seen["fp8"]["allocated_vgprs"] <= seen["bf16"]["allocated_vgprs"]


# ----------------------------------------------------------------------------- bad input
def _rocmflash(*args):
    return subprocess.run([sys.executable, "-m", "rocmflash.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("extra, expected", [
    (["--gpu", "mi250"], "mi250 (gfx90a) has no fp8 matrix instructions"),
    (["--gpu", "a100"], "a100 (sm_80) has no fp8 matrix instructions"),
    (["--gpu", "mi300x", "--mode", "decode"], "--dtype fp8 does not go with --mode decode"),
    (["--gpu", "mi300x", "--pass", "bwd"], "--dtype fp8 does not go with --mode prefill --pass bwd"),
    (["--gpu", "mi300x", "--mode", "varlen"], "--dtype fp8 does not go with --mode varlen"),
    (["--gpu", "mi300x", "--reference"], "--reference does not go with --dtype fp8"),
    (["--gpu", "mi355x", "--variant", "online", "two_phase"], "['two_phase'] have no fp8 build"),
])
def test_vgpr_report_fp8_refusals_exit_2_before_compiling(tmp_path, extra, expected):
    cache = tmp_path / "cache"
    result = _rocmflash("vgpr-report", "--dtype", "fp8", *extra, "--out", str(tmp_path / "never"),
                        "--cache-dir", str(cache))
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "never").exists() and not (cache / "triton").exists()
