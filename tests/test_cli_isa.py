"""End-to-end: the ``rocmflash isa`` command on real Triton cache directories."""

import json
import os
import subprocess
import sys

from compile_helpers import compile_many

REQUIRED_KEYS = {"path", "name", "arch", "wavefront_size", "vgpr_count", "agpr_count", "sgpr_count",
                 "vgpr_spill_count", "sgpr_spill_count", "scratch_bytes", "lds_bytes", "allocated_vgprs",
                 "allocated_sgprs", "accum_offset", "waves_per_simd_static", "waves_per_simd", "limiter",
                 "vgprs_past_cliff", "vgpr_headroom"}


def _rocmflash(*args, env=None):
    return subprocess.run([sys.executable, "-m", "rocmflash.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_isa_reads_a_triton_cache_directory(tmp_path):
    cache = tmp_path / "cache"
    specs = [{"kernel": "fa_like_kernel", "arch": arch, "constexprs": {"BLOCK_M": 128, "BLOCK_N": 64, "HEAD_DIM": 64},
              "options": {"num_warps": warps, "num_stages": 1}}
             for arch in ("gfx90a", "gfx942") for warps in (4, 8)]
    compiled = compile_many(specs, str(cache), workers=1)
    result = _rocmflash("isa", str(cache), "--json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert len(records) == len(specs)
    for record in records:
        assert REQUIRED_KEYS <= set(record)
        assert os.path.exists(record["path"]) and record["path"].startswith(str(cache))
    # Triton's json beside each object supplies dynamic LDS and num_warps.
    assert sorted((r["arch"], r["num_warps"], r["dynamic_lds_bytes"]) for r in records) == sorted(
        (c["spec"]["arch"], c["num_warps"], c["shared"]) for c in compiled)
    # Flags override the metadata.
    result = _rocmflash("isa", str(cache), "--json", "--dynamic-lds", "65536", "--num-warps", "4")
    overridden = json.loads(result.stdout)
    assert all(r["dynamic_lds_bytes"] == 65536 and r["waves_per_simd"] == 1 for r in overridden)
    table = _rocmflash("isa", str(cache))
    assert table.returncode == 0 and "fa_like_kernel" in table.stdout and "gfx942" in table.stdout


def test_isa_demo_compiles_for_gfx90a_on_cpu():
    result = _rocmflash("isa", "--demo", "--json")
    assert result.returncode == 0, result.stderr
    (record,) = json.loads(result.stdout)
    assert record["arch"] == "gfx90a" and record["name"] == "fa_like_kernel"
    assert record["allocated_vgprs"] >= record["vgpr_count"] > 0


def test_isa_demo_rejects_unknown_and_nvidia_gpus():
    bad = _rocmflash("isa", "--demo", "mi999")
    assert bad.returncode == 2 and "known GPUs" in bad.stderr and "Traceback" not in bad.stderr
    nv = _rocmflash("isa", "--demo", "h100")
    assert nv.returncode == 2 and "AMD" in nv.stderr


def test_isa_without_paths_is_a_usage_error():
    result = _rocmflash("isa")
    assert result.returncode == 2 and "give at least one" in result.stderr


def test_isa_tools_does_not_import_torch():
    code = "import sys, isa_tools, isa_tools.cli; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
