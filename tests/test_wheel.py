"""The wheel: shipped databases travel in it and a non-editable install finds them.

Builds the wheel from this checkout (offline, with the setuptools the test extra
installs), installs it into a fresh virtual environment whose only other packages
are this environment's (torch, Triton, ... through a path entry, without the editable
install's finder), and runs ``rocmflash doctor`` and a database lookup from there.
"""

import glob
import json
import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd, **kw):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), ROOT])
    (path,) = glob.glob(str(out / "rocmflash-*.whl"))
    return path


def test_wheel_carries_the_shipped_databases(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "configs", "*.json")))
    assert shipped and sorted(n.split("/")[-1] for n in names if n.startswith("rocmflash/configs/")) == shipped
    assert not [n for n in names if n.endswith((".jsonl", ".lock"))]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    # never a torch or Triton requirement: pip must not replace the user's (ROCm builds ship pytorch-triton-rocm)
    assert not [r for r in requires if r.split()[1].lower().startswith(("torch", "triton", "numpy<"))], requires


def test_installed_wheel_finds_shipped_databases_and_runs_doctor(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = str(venv / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # this environment's packages as a plain path entry: its .pth files (the editable finder) are not run
    with open(os.path.join(site, "host-packages.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel])
    env = dict(os.environ, ROCMFLASH_CONFIG_DIR=str(tmp_path / "user"))
    env.pop("PYTHONPATH", None)
    probe = _run([python, "-c", (
        "import json, rocmflash, rocmflash.db as db\n"
        "cfg = db.lookup('h100', 128, 'bf16', False, 1, 4096, measured_only=True)\n"
        "print(json.dumps({'file': rocmflash.__file__, 'shipped': db.shipped_config_dir(), "
        "'paths': db.database_paths('h100'), 'cfg': cfg.to_dict() if cfg else None}))")],
        cwd=str(tmp_path), env=env)
    found = json.loads(probe.stdout)
    assert found["file"].startswith(site) and found["shipped"].startswith(site)
    assert found["paths"] == [str(tmp_path / "user" / "h100.json"), os.path.join(found["shipped"], "h100.json")]
    assert found["cfg"] is not None
    doctor = _run([str(venv / "bin" / "rocmflash"), "doctor"], cwd=str(tmp_path), env=env)
    assert doctor.stdout.strip().splitlines()[-1].startswith("verdict: READY")
