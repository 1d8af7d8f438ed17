"""End-to-end: ``rocmflash vgpr-report`` on a small real sweep."""

import csv
import json
import os
import subprocess
import sys

CONTRACT = {"variant", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "waves_per_eu", "vgpr_count", "agpr_count",
            "allocated_vgprs", "vgpr_spill_count", "lds_bytes", "waves_per_simd", "limiter", "vgprs_past_cliff",
            "verdict", "reason"}


def _rocmflash(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "rocmflash.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def _read_csv(path) -> list:
    """The CSV's rows as dicts (the stdlib reader: the report writes plain CSV)."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _files_under(root) -> list:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)


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
    frame = _read_csv(out / "configs.csv")
    assert len(frame) == len(rows) and CONTRACT <= set(frame[0])
    warm = _rocmflash(*args)
    assert warm.returncode == 0 and "0 compiled" in warm.stdout and "warm run" in warm.stdout
    assert "split_d" in warm.stdout
    _default_folders_warm(tmp_path, args[:-2], rows)


def _default_folders_warm(tmp_path, args, rows):
    """Without --out (warm cache, run from an empty folder): --json writes no file anywhere; a plain run writes
    under the user data dir (never the current folder), in a folder named by the variant subset, and says where."""
    cwd, data = tmp_path / "cwd", tmp_path / "data"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ROCMFLASH_REPORTS_DIR"}
    env["XDG_DATA_HOME"] = str(data)  # platformdirs' user data dir on Linux
    quiet = _rocmflash(*args, "--json", cwd=cwd, env=env)
    assert quiet.returncode == 0, quiet.stderr
    contract = [{k: r[k] for k in CONTRACT} for r in rows]
    assert [{k: r[k] for k in CONTRACT} for r in json.loads(quiet.stdout)] == contract
    assert _files_under(tmp_path / "cwd") == [] and not data.exists()  # --json alone wrote nothing
    plain = _rocmflash(*args, cwd=cwd, env=env)
    assert plain.returncode == 0, plain.stderr
    folder = data / "rocmflash" / "reports" / "vgpr-mi250-d128-fp16-two_phase-split_d"  # the subset's own name
    assert _files_under(data) == [os.path.relpath(folder / n, data) for n in ("configs.csv", "report.md", "vgprs.png")]
    assert f"wrote {folder / 'report.md'}" in plain.stdout.replace("\n", "")
    assert len(_read_csv(folder / "configs.csv")) == len(rows) and _files_under(cwd) == []


def test_vgpr_report_bad_input_exit_2(tmp_path):
    for bad, expected in [(["--gpu", "mi999"], "known GPUs"), (["--gpu", "mi250", "--head-dim", "300"], "head_dim"),
                          (["--gpu", "mi250", "--dtype", "fp32"], "dtype"),
                          (["--gpu", "mi250", "--variant", "nope"], "variant")]:
        result = _rocmflash("vgpr-report", *bad, "--out", str(tmp_path / "never"))
        assert result.returncode == 2, (bad, result.stderr)
        assert expected in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "never")
