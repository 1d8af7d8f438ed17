"""``rocmflash --version`` and where ``explain`` lives (the CLI, not api/)."""

import pathlib
import subprocess
import sys

import rocmflash

ROOT = pathlib.Path(rocmflash.__file__).parent


def test_version_prints_rocmflash_torch_and_triton():
    result = subprocess.run([sys.executable, "-m", "rocmflash.cli", "--version"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"rocmflash {rocmflash.__version__}"
    import torch
    import triton

    assert lines[1].startswith(f"torch {torch.__version__}") and lines[2].startswith(f"triton {triton.__version__}")
    assert "import fails" not in result.stdout and "Traceback" not in result.stderr


def test_a_torch_that_fails_to_import_is_one_line(monkeypatch):
    from rocmflash.cli import _version_line
    from rocmflash.hw.compat import Installed

    missing = _version_line(Installed("torch", None, None))
    assert missing == "torch not installed"
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert _version_line(Installed("torch", "torch", "2.13.0")).startswith("torch 2.13.0: import fails (")


def test_explain_is_cli_and_api_imports_no_tuner():
    assert not (ROOT / "api" / "explain.py").exists() and (ROOT / "cli" / "explain.py").exists()
    offenders = [p.name for p in (ROOT / "api").rglob("*.py") if "api.explain" in p.read_text()]
    assert offenders == []


def test_the_version_is_pyproject_s():
    import re

    text = (pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', text, re.M).group(1) == rocmflash.__version__
