"""``rocmflash doctor`` on this CPU-only box: versions, range check, no GPU, a verdict; JSON form."""

import json
import subprocess
import sys


def _doctor(*args):
    return subprocess.run([sys.executable, "-m", "rocmflash.cli", "doctor", *args], capture_output=True, text=True,
                          timeout=120)


def test_doctor_on_a_cpu_box_is_ready_for_static_work():
    import torch
    import triton

    result = _doctor()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("rocmflash ")
    assert any(line.startswith(f"torch   {torch.__version__}: supported") for line in lines), result.stdout
    assert any(line.startswith(f"triton  {triton.__version__}") and "supported" in line for line in lines)
    assert "GPUs    none visible" in lines
    assert lines[-1].startswith("verdict: READY for static work")


def test_doctor_json_has_the_report_fields():
    result = _doctor("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["version_problems"] == [] and report["gpus"] == []
    assert report["supported"] == {"torch": ">=2.8", "triton": ">=3.4,<3.10"}
    assert report["verdict"].startswith("READY")
