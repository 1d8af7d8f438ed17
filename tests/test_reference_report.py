"""``vgpr-report --reference``: reference configs placed with the pruner and the tuner's static score."""

import json
import subprocess
import sys

import pytest

from rocmflash.config import KernelConfig, Problem
from rocmflash.hw.gpus import get_gpu
from rocmflash.static import reference_report
from rocmflash.static.compile import SweepStats
from rocmflash.static.reference import parse
from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace

COMMIT = "0" * 40


def _entry(id_, **cfg):
    rocm = dict({"variant": "online", "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves_per_eu": 2,
                 "matrix_instr_nonkdim": 0}, **cfg)
    return {"id": id_, "source": {"repo": "example/repo", "path": "configs.json", "commit": COMMIT, "key": id_},
            "gpu": "mi300x", "arch": "gfx942", "pass": "fwd", "role": "default", "kernel": "FA2 forward",
            "problem": {"head_dim": None, "head_dim_range": None, "causal": None, "dtypes": None, "when": None},
            "config": dict(rocm), "rocmflash_config": rocm, "notes": "test entry"}


def _doc(entries):
    return {"format": "rocmflash-amd-reference", "schema_version": 1, "entries": entries}


def _observation(cfg: KernelConfig) -> dict:
    """A made-up code object: BLOCK_M=64 reaches 3 waves, 128x64 with mfma32 spills, mfma0 compiles like mfma32,
    and 64x64 compiles to one binary whatever the MFMA shape."""
    waves = 3 if cfg.BLOCK_M == 64 else 2
    nonk = cfg.matrix_instr_nonkdim or 32
    spills = 4 if (cfg.BLOCK_M, cfg.BLOCK_N, nonk) == (128, 64, 32) else 0
    sha = f"{cfg.BLOCK_M}x{cfg.BLOCK_N}-s{cfg.num_stages}-" + ("any" if cfg.BLOCK_M == cfg.BLOCK_N == 64 else str(nonk))
    kernel = {"name": "_fwd_online", "arch": "gfx942", "vgpr_count": 150, "agpr_count": 0,
              "allocated_vgprs": 160 if waves == 3 else 240, "sgpr_count": 40, "vgpr_spill_count": spills,
              "sgpr_spill_count": 0, "scratch_bytes": 4 * spills, "lds_bytes": 0, "dynamic_lds_bytes": 16384,
              "num_warps": cfg.num_warps, "waves_per_simd": waves, "limiter": "vgpr", "vgprs_past_cliff": None}
    return {"status": "ok", "kernels": [kernel], "binary_sha256": sha, "arch": "gfx942"}


@pytest.fixture
def fake_sweep(monkeypatch):
    def sweep(configs, problem, gpu, cache_dir=None, workers=None, on_result=None, **_):
        return [_observation(c) for c in configs], SweepStats(configs=len(configs))

    monkeypatch.setattr("rocmflash.static.compile.sweep", sweep)


def test_ranks_twins_and_would_be_places(fake_sweep):
    gpu = get_gpu("mi300x")
    space = ConfigSpace({"online": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4], "num_stages": [1],
                                    "waves_per_eu": [2], "matrix_instr_nonkdim": [16, 32]}}, DEFAULT_RESTRICTIONS)
    refs = parse(_doc([
        _entry("in-space", BLOCK_M=64, BLOCK_N=32, matrix_instr_nonkdim=16),
        _entry("in-space-duplicate", BLOCK_M=64, BLOCK_N=64, matrix_instr_nonkdim=32),
        _entry("amd-default", BLOCK_M=128, BLOCK_N=64),
        _entry("amd-default-copy", BLOCK_M=128, BLOCK_N=64),
        _entry("twin-kept", BLOCK_M=128, BLOCK_N=32),
        _entry("three-stages", BLOCK_M=128, BLOCK_N=32, num_stages=3, matrix_instr_nonkdim=16),
    ]))
    result = reference_report.compare(gpu, Problem(head_dim=128, dtype="bf16"), refs=refs, space=space)
    assert (result.space_size, result.survivors, result.compiled_outside_space) == (8, 6, 3)
    rows = {("top" if r.is_top else r.refs[0].id): r for r in result.rows}
    assert len(result.rows) == 6  # the two copies of the AMD default share one row
    assert [ref.id for ref in rows["amd-default"].refs] == ["amd-default", "amd-default-copy"]
    # the AMD static key: tiles keeping 2 waves, then larger BLOCK_M, BLOCK_N (128-row tiles first here)
    top = rows["top"]
    assert top.rank == 1 and (top.config.BLOCK_M, top.config.BLOCK_N, top.config.matrix_instr_nonkdim) == (128, 64, 16)
    assert result.rows[0] is top
    assert rows["in-space"].rank == 5 and rows["in-space"].in_space
    dup = rows["in-space-duplicate"]
    assert dup.verdict.reason == "duplicate_binary" and dup.rank == 4 and dup.twin.matrix_instr_nonkdim == 16
    default = rows["amd-default"]
    assert not default.in_space and default.verdict.reason == "spills" and default.rank is None
    assert default.twin.matrix_instr_nonkdim == 32 and default.siblings == [("16/1", "#1"), ("32/1", "spills")]
    assert reference_report.rank_text(default, 6) == "not in space; pruned (same code object as mfma32)"
    assert rows["twin-kept"].rank == 3 and rows["twin-kept"].siblings == [("16/1", "#2"), ("32/1", "#3")]
    assert reference_report.rank_text(rows["twin-kept"], 6) == "not in space; = #3 of 6 (same code object as mfma32)"
    stages = rows["three-stages"]  # more stages sort first among equal tiles
    assert stages.twin is None and stages.would_rank == 2 and stages.siblings == []
    assert reference_report.rank_text(stages, 6) == "not in space; would be #2 of 6 + 1"
    records = reference_report.to_records(result)
    assert json.loads(json.dumps(records)) == records and records[0]["static_top"]
    md = reference_report.markdown(result)
    assert "## Reference configs" in md and "**#1 of 6**" in md and "example/repo" in md


def _rocmflash(*args):
    return subprocess.run([sys.executable, "-m", "rocmflash.cli", *args], capture_output=True, text=True, timeout=600)


def test_cli_reference_end_to_end(tmp_path):
    """A real cross-compile: a 24-config two_phase space for gfx942 at D=32 and three reference configs."""
    ref_file = tmp_path / "refs.json"
    in_space = {"variant": "two_phase", "BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1,
                "waves_per_eu": 2, "matrix_instr_nonkdim": 16}
    ref_file.write_text(json.dumps(_doc([
        dict(_entry("two-phase-in-space"), rocmflash_config=in_space),
        dict(_entry("two-phase-mfma0"), rocmflash_config=dict(in_space, matrix_instr_nonkdim=0)),
        _entry("online-default", BLOCK_M=128, BLOCK_N=64),
    ])))
    out, cache = tmp_path / "report", tmp_path / "cache"
    args = ["vgpr-report", "--gpu", "mi300x", "--head-dim", "32", "--dtype", "bf16", "--variant", "two_phase",
            "--reference-file", str(ref_file), "--cache-dir", str(cache), "--out", str(out)]
    result = _rocmflash(*args, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["configs"]) == 24
    rows = {(r["references"] or ["top"])[0]: r for r in doc["reference"]}
    assert rows["top"]["static_top"] and rows["top"]["static_rank"] == 1
    assert rows["two-phase-in-space"]["in_space"] and rows["two-phase-in-space"]["verdict"] in ("kept", "pruned")
    assert not rows["online-default"]["in_space"] and rows["online-default"]["vgpr_count"] > 0
    mfma0 = rows["two-phase-mfma0"]
    assert not mfma0["in_space"] and {s["mfma_kpack"] for s in mfma0["siblings"]} == {"16/1", "32/1"}
    report = (out / "report.md").read_text()
    assert "## Reference configs (AMD-published)" in report and "two-phase-in-space" in report
    warm = _rocmflash(*args)  # everything cached now: the rich table, no compile
    assert warm.returncode == 0, warm.stderr
    assert "0 compiled" in warm.stdout and "static #1" in warm.stdout and "not in space" in warm.stdout


def test_cli_reference_bad_file_and_nvidia_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc([dict(_entry("x"), arch="gfx1100")])))
    for args, expected in [(["--gpu", "mi300x", "--reference-file", str(bad)], "arch 'gfx1100'"),
                           (["--gpu", "h100", "--reference"], "AMD-published")]:
        result = _rocmflash("vgpr-report", *args, "--out", str(tmp_path / "never"))
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
