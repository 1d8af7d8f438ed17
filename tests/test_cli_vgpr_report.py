"""End-to-end: ``rocmflash vgpr-report`` on a small real sweep."""

import json
import os
import subprocess
import sys

CONTRACT = {"variant", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "waves_per_eu", "vgpr_count", "agpr_count",
            "allocated_vgprs", "vgpr_spill_count", "lds_bytes", "waves_per_simd", "limiter", "vgprs_past_cliff",
            "verdict", "reason"}


def _rocmflash(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rocmflash.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def test_vgpr_report_json_files_and_warm_rerun(tmp_path):
    out, cache = tmp_path / "report", tmp_path / "cache"
    args = ["vgpr-report", "--gpu", "mi250", "--variant", "split_d", "two_phase", "--cache-dir", str(cache),
            "--out", str(out)]
    result = _rocmflash(*args, "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) >= 20 and {r["variant"] for r in rows} == {"split_d", "two_phase"}
    for row in rows:
        assert CONTRACT <= set(row)
        assert row["verdict"] in ("kept", "pruned")
        assert (row["reason"] is None) == (row["verdict"] == "kept") or row["reason"] in ("kept_best_of_pruned",
                                                                                          "harmless_spill")
    for name in ("report.md", "configs.csv", "vgprs.png"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "seed" in report and "gfx90a" in report and "per SIMD" in report
    import pandas as pd

    frame = pd.read_csv(out / "configs.csv")
    assert len(frame) == len(rows) and CONTRACT <= set(frame.columns)
    warm = _rocmflash(*args)
    assert warm.returncode == 0 and "0 compiled" in warm.stdout and "warm run" in warm.stdout
    assert "split_d" in warm.stdout


def test_vgpr_report_bad_input_exit_2(tmp_path):
    for bad, expected in [(["--gpu", "mi999"], "known GPUs"), (["--gpu", "mi250", "--head-dim", "300"], "head_dim"),
                          (["--gpu", "mi250", "--dtype", "fp32"], "dtype"),
                          (["--gpu", "mi250", "--variant", "nope"], "variant")]:
        result = _rocmflash("vgpr-report", *bad, "--out", str(tmp_path / "never"))
        assert result.returncode == 2, (bad, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "never")
