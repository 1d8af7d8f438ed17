"""Supported torch/Triton ranges, checked from installed metadata without importing either."""

import subprocess
import sys

import pytest

from rocmflash.hw import compat
from rocmflash.hw.compat import Installed, in_range, version_problems

TORCH_OK = Installed("torch", "torch", "2.13.0+cpu")
TRITON_OK = Installed("triton", "triton", "3.6.0")


@pytest.mark.parametrize("version,ok", [
    ("3.4.0", True), ("3.6.0", True), ("3.8.0", True), ("3.9.0", True),
    ("3.5.0+git7416ffcb", True),  # nightly / ROCm builds carry local labels
    ("3.7.0rc1", True), ("3.3.1", False), ("3.10.0", False), ("2.3.1", False), ("not-a-version", False), (None, False),
])
def test_triton_range(version, ok):
    assert in_range(version, compat.SUPPORTED_TRITON) is ok


@pytest.mark.parametrize("version,ok", [("2.8.0+rocm6.4", True), ("2.13.0+cpu", True), ("2.11.0", True),
                                        ("2.7.1+rocm6.3", False)])
def test_torch_range(version, ok):
    assert in_range(version, compat.SUPPORTED_TORCH) is ok


def test_problems_name_what_was_found_and_where_it_came_from():
    assert version_problems(TORCH_OK, TRITON_OK) == []
    old_rocm = Installed("triton", "pytorch-triton-rocm", "3.2.0+gitabc")
    (problem,) = version_problems(TORCH_OK, old_rocm)
    assert "triton 3.2.0+gitabc (from pytorch-triton-rocm)" in problem and ">=3.4,<3.10" in problem
    missing = version_problems(Installed("torch", None, None), Installed("triton", None, None))
    assert len(missing) == 2 and "torch is not installed" in missing[0] and "pip install triton" in missing[1]


def test_rocm_triton_distribution_is_found(monkeypatch):
    versions = {"pytorch-triton-rocm": "3.4.0+rocm7.0"}
    monkeypatch.setattr(compat, "_distribution_version", versions.get)
    assert compat.installed_triton() == Installed("triton", "pytorch-triton-rocm", "3.4.0+rocm7.0")


def test_unsupported_triton_fails_in_one_line_unless_skipped(monkeypatch):
    monkeypatch.setattr(compat, "_checked", lambda: ("triton 3.2.0 is outside the supported range triton>=3.4,<3.10",))
    monkeypatch.delenv(compat.SKIP_ENV, raising=False)
    with pytest.raises(compat.UnsupportedVersionError) as info:
        compat.require_supported_versions()
    assert "\n" not in str(info.value) and "rocmflash doctor" in str(info.value)
    assert isinstance(info.value, ImportError)
    monkeypatch.setenv(compat.SKIP_ENV, "1")
    with pytest.warns(RuntimeWarning, match="triton 3.2.0"):
        compat.require_supported_versions()


def _run_with_fake_triton_version(tmp_path, code):
    """A child Python whose ``triton`` distribution metadata says 3.2.0."""
    fake = tmp_path / "site"
    dist = fake / "triton-3.2.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: triton\nVersion: 3.2.0\n")
    env = {"PYTHONPATH": str(fake), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_unsupported_triton_cli_is_one_line_and_doctor_says_not_ready(tmp_path):
    tune = _run_with_fake_triton_version(
        tmp_path, "import sys; from rocmflash.cli import main; "
                  f"sys.exit(main(['vgpr-report', '--gpu', 'mi250', '--out', {str(tmp_path / 'report')!r}]))")
    assert tune.returncode == 2, tune.stderr
    assert tune.stderr.count("\n") == 1 and "triton 3.2.0" in tune.stderr and "Traceback" not in tune.stderr
    assert not (tmp_path / "report").exists()
    doctor = _run_with_fake_triton_version(
        tmp_path, "import sys; from rocmflash.cli import main; sys.exit(main(['doctor']))")
    assert doctor.returncode == 1, doctor.stderr
    assert "NOT SUPPORTED" in doctor.stdout and doctor.stdout.strip().splitlines()[-1].startswith("verdict: NOT READY")
