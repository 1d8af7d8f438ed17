"""Bad CLI input is one line on stderr and a non-zero exit, found before any compile; never a traceback.

Every test here makes the compile step fail loudly (``_no_compile``): a bad input must be reported
before a sweep starts, so none of these tests compiles anything.
"""

import os
import subprocess
import sys

import pytest

from rocmflash.cli import main
from rocmflash.cli.tune import _unwritable_dir
from rocmflash.static import compile as C
from rocmflash.static.report_dirs import REPORTS_ENV
from rocmflash import db as D


class CompileStarted(Exception):
    """Raised by the patched compile step: the CLI got past its checks."""


@pytest.fixture(autouse=True)
def _no_compile(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise CompileStarted()

    monkeypatch.setattr(C, "_observe_all", refuse)
    monkeypatch.setenv(C.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path / "configs"))
    monkeypatch.setenv(REPORTS_ENV, str(tmp_path / "reports-root"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine\n")
    return path


def _one_line_error(capsys, argv, code=2) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _argparse_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


# ----------------------------------------------------------------------------- paths that cannot be written
REPORTS = [[], ["--mode", "decode"], ["--mode", "varlen"], ["--pass", "bwd"]]


@pytest.mark.parametrize("mode", REPORTS, ids=["prefill", "decode", "varlen", "bwd"])
@pytest.mark.parametrize("flag, sub, said", [("--out", "", "is a file, not a directory"),
                                             ("--out", "sub", "is a file, so no directory can be made under it"),
                                             ("--cache-dir", "", "is a file, not a directory"),
                                             ("--cache-dir", "sub/deeper", "so no directory can be made")])
def test_report_paths_that_cannot_be_written(mode, flag, sub, said, user_file, capsys):
    path = os.path.join(str(user_file), sub) if sub else str(user_file)
    err = _one_line_error(capsys, ["vgpr-report", "--gpu", "mi250", *mode, flag, path])
    assert f"{flag} {path}" in err and said in err
    assert user_file.read_text() == "mine\n"  # the user's file is neither removed nor overwritten


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_report_out_on_proc_is_one_line(capsys):
    err = _one_line_error(capsys, ["vgpr-report", "--gpu", "mi250", "--out", "/proc/self/rocmflash-report"])
    assert "cannot write there" in err


@pytest.mark.parametrize("mode", REPORTS, ids=["prefill", "decode", "varlen", "bwd"])
def test_report_default_out_in_an_unwritable_place(tmp_path, monkeypatch, capsys, mode):
    """The default folder is under $ROCMFLASH_REPORTS_DIR, else the user data dir's reports (never ./reports):
    a file where it goes is one line naming where the default came from, before any compile."""
    root = tmp_path / "reports-root"
    root.write_text("a file where the default reports root goes\n")
    err = _one_line_error(capsys, ["vgpr-report", "--gpu", "mi250", *mode])
    assert err.startswith(f"error: ${REPORTS_ENV} {root}/vgpr-") and f"{root} is a file, so no directory" in err
    monkeypatch.delenv(REPORTS_ENV)
    import platformdirs

    monkeypatch.setattr(platformdirs, "user_data_dir", lambda app: str(tmp_path / "data" / app))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rocmflash").write_text("a file where the user data dir goes\n")
    err = _one_line_error(capsys, ["vgpr-report", "--gpu", "mi250", *mode])
    assert err.startswith(f"error: --out (default) {tmp_path}/data/rocmflash/reports/vgpr-") and "is a file" in err
    assert root.read_text().startswith("a file") and not (tmp_path / "reports").exists()


@pytest.mark.parametrize("mode", REPORTS, ids=["prefill", "decode", "varlen", "bwd"])
def test_report_json_without_out_checks_and_makes_no_folder(tmp_path, mode):
    """--json without --out writes nothing, so an unwritable reports root is no error and nothing is made."""
    (tmp_path / "reports-root").write_text("a file where the default reports root goes\n")
    with pytest.raises(CompileStarted):
        main(["vgpr-report", "--gpu", "mi250", *mode, "--json"])
    assert os.listdir(tmp_path) == ["reports-root"]  # no report folder made, here or under the root


def test_cache_env_naming_a_file(user_file, monkeypatch, capsys):
    monkeypatch.setenv(C.CACHE_ENV, str(user_file))
    err = _one_line_error(capsys, ["vgpr-report", "--gpu", "mi250"])
    assert f"${C.CACHE_ENV} {user_file}" in err


def test_good_paths_pass_and_the_check_leaves_nothing_behind(tmp_path):
    fresh = tmp_path / "a" / "b" / "c"
    assert _unwritable_dir(str(fresh)) is None
    assert not (tmp_path / "a").exists()  # made for the check, removed again
    (tmp_path / "kept").mkdir()
    assert _unwritable_dir(str(tmp_path / "kept")) is None and os.listdir(tmp_path / "kept") == []
    with pytest.raises(CompileStarted):  # good paths: the CLI goes on to compile
        main(["vgpr-report", "--gpu", "mi250", "--variant", "split_d", "--out", str(fresh),
              "--cache-dir", str(tmp_path / "c2")])


def test_report_out_naming_a_file_in_a_fresh_process(user_file):
    result = subprocess.run([sys.executable, "-m", "rocmflash.cli", "vgpr-report", "--gpu", "mi250", "--out",
                             str(user_file)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"error: --out {user_file}: {user_file} is a file, not a directory"]
    assert user_file.read_text() == "mine\n"


def test_an_os_error_during_the_run_is_one_line(monkeypatch, capsys):
    import rocmflash.static.vgpr_report as V

    def fail(args, command):
        raise PermissionError(13, "Permission denied", "reports/vgpr-mi250/report.md")

    monkeypatch.setattr(V, "main", fail)
    err = _one_line_error(capsys, ["vgpr-report", "--gpu", "mi250"], code=1)
    assert err == "error: Permission denied: reports/vgpr-mi250/report.md\n"


@pytest.mark.parametrize("extra, said", [
    (["--db", "{file}/x.json"], "is a file, not a directory"),
    (["--db", "{tmp}"], "is a directory; --db takes a database file"),
    (["--cache-dir", "{file}"], "is a file, not a directory"),
    (["--replay", "{tmp}"], "(it is a directory)"),
])
def test_tune_paths(extra, said, user_file, tmp_path, capsys):
    extra = [x.format(file=user_file, tmp=tmp_path) for x in extra]
    argv = ["tune", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "1024", *extra]
    assert said in _one_line_error(capsys, argv)
    assert user_file.read_text() == "mine\n"


def test_tune_config_dir_env_naming_a_file(user_file, monkeypatch, capsys):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(user_file))
    argv = ["tune", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "1024"]
    assert f"${D.CONFIG_DIR_ENV} {user_file}: {user_file} is a file" in _one_line_error(capsys, argv)


def test_explain_and_export_paths(user_file, tmp_path, monkeypatch, capsys):
    base = ["explain", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "1024"]
    assert "--cache-dir" in _one_line_error(capsys, [*base, "--cache-dir", str(user_file)])
    monkeypatch.setenv(C.CACHE_ENV, str(user_file))
    assert f"${C.CACHE_ENV} {user_file}" in _one_line_error(capsys, base)
    assert "is a directory" in _one_line_error(capsys, ["export", "--gpu", "mi300x", "--db", str(tmp_path)])


# ----------------------------------------------------------------------------- numbers argparse refuses
@pytest.mark.parametrize("command, flag, value, said", [
    ("vgpr-report", "--workers", "0", "0 is invalid; expected an integer >= 1"),
    ("vgpr-report", "--workers", "-3", "-3 is invalid; expected an integer >= 1"),
    ("vgpr-report", "--workers", "two", "'two' is not an integer; expected an integer >= 1"),
    ("vgpr-report", "--occupancy-floor", "-1", "-1 is invalid; expected an integer >= 1"),
    ("vgpr-report", "--occupancy-floor", "0", "0 is invalid; expected an integer >= 1"),
    ("vgpr-report", "--cliff-margin", "-1", "-1 is invalid; expected an integer >= 0"),
    ("vgpr-report", "--batch", "0", "0 is invalid; expected an integer >= 1"),
    ("vgpr-report", "--seqlen", "0", "0 is invalid; expected an integer >= 1"),
    ("vgpr-report", "--heads", "0", "0 is invalid; expected an integer >= 1"),
    ("vgpr-report", "--kv-heads", "-2", "-2 is invalid; expected an integer >= 1"),
    ("vgpr-report", "--page-size", "-1", "-1 is invalid; expected an integer >= 0"),
    ("tune", "--workers", "0", "0 is invalid; expected an integer >= 1"),
    ("tune", "--heads", "0", "0 is invalid; expected an integer >= 1"),
    ("tune", "--kv-heads", "0", "0 is invalid; expected an integer >= 1"),
    ("tune", "--seqlen-q", "0", "0 is invalid; expected an integer >= 1"),
    ("tune", "--timeout", "0", "0 is invalid; expected a finite number of seconds > 0"),
    ("tune", "--timeout", "-5", "-5 is invalid; expected a finite number of seconds > 0"),
    ("tune", "--timeout", "inf", "inf is invalid; expected a finite number of seconds > 0"),
    ("tune", "--timeout", "nan", "nan is invalid; expected a finite number of seconds > 0"),
    ("tune", "--timeout", "soon", "'soon' is not a number; expected seconds > 0"),
])
def test_numbers_out_of_range_are_argparse_errors(command, flag, value, said, capsys):
    line = _argparse_error(capsys, [command, "--gpu", "mi300x", flag, value])
    assert line == f"rocmflash {command}: error: argument {flag}: {said}"


@pytest.mark.parametrize("gpu, floor, most", [("mi250", 9, 8), ("mi300x", 9, 8), ("h100", 17, 16)])
def test_occupancy_floor_past_the_arch_maximum(gpu, floor, most, capsys):
    err = _one_line_error(capsys, ["vgpr-report", "--gpu", gpu, "--occupancy-floor", str(floor)])
    assert f"--occupancy-floor {floor} is invalid for {gpu}; expected 1..{most}" in err
    with pytest.raises(CompileStarted):  # the maximum itself is a valid floor
        main(["vgpr-report", "--gpu", gpu, "--occupancy-floor", str(most), "--variant", "split_d"])


# ----------------------------------------------------------------------------- flags a mode would ignore
@pytest.mark.parametrize("argv, said", [
    (["--mode", "decode", "--occupancy-floor", "2"], "--occupancy-floor does not go with --mode decode"),
    (["--mode", "decode", "--cliff-margin", "8"], "--cliff-margin does not go with --mode decode"),
    (["--mode", "decode", "--causal"], "--causal does not go with --mode decode"),
    (["--mode", "decode", "--variant", "online"], "--variant does not go with --mode decode"),
    (["--mode", "varlen", "--seqlen", "8192"], "--seqlen does not go with --mode varlen"),
    (["--mode", "varlen", "--page-size", "16"], "--page-size does not go with --mode varlen"),
    (["--pass", "bwd", "--reference"], "--reference does not go with --mode prefill --pass bwd"),
    (["--pass", "bwd", "--batch", "4"], "--batch does not go with --mode prefill --pass bwd"),
    (["--heads", "8"], "--heads does not go with --mode prefill"),
])
def test_report_flags_the_mode_ignores_are_refused(argv, said, capsys):
    assert said in _one_line_error(capsys, ["vgpr-report", "--gpu", "mi300x", *argv])


@pytest.mark.parametrize("argv, said", [
    (["--mode", "decode", "--batch", "0"], "--batch 0 is invalid"),  # was silently batch 32
    (["--mode", "decode", "--strategy", "pruned"], "--strategy does not go with --mode decode"),
    (["--mode", "decode", "--top-k", "4"], "--top-k does not go with --mode decode"),
    (["--mode", "decode", "--no-seeds"], "--no-seeds does not go with --mode decode"),
    (["--mode", "decode", "--causal"], "--causal does not go with --mode decode"),
    (["--mode", "varlen", "--strategy", "exhaustive"], "--strategy does not go with --mode varlen"),
    (["--seqlen-q", "4"], "--seqlen-q does not go with --mode prefill"),
    (["--page-size", "16"], "--page-size does not go with --mode prefill"),
])
def test_tune_flags_the_mode_ignores_are_refused(argv, said, capsys):
    base = ["tune", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "4096"]
    assert said in _one_line_error(capsys, [*base, *argv])


@pytest.mark.parametrize("argv, said", [
    (["--batch", "0"], "--batch 0 is invalid"),  # was silently the default decode batch
    (["--dtype", ","], "--dtype ',' names no dtype"),  # was an empty plan
    (["--page-size", "16"], "--page-size does not go with --model"),
])
def test_model_tune_bad_input(argv, said, capsys):
    assert said in _one_line_error(capsys, ["tune", "--gpu", "mi300x", "--model", "llama-3-8b", "--dry-run", *argv])


# ----------------------------------------------------------------------------- explain
def test_explain_bad_seqlen_k_and_databases(tmp_path, capsys):
    base = ["explain", "--gpu", "h100", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "1024", "--no-compile"]
    assert "--seqlen-k 0 is invalid; expected a positive int" in _one_line_error(capsys, [*base, "--seqlen-k", "0"])
    truncated = tmp_path / "h100.json"
    truncated.write_text('{"format": "rocmflash-config-db", "entr')
    assert "not valid JSON" in _one_line_error(capsys, [*base, "--db", str(truncated)])  # was a warning, exit 0
    other = os.path.join(D.shipped_config_dir(), "mi300x.json")
    err = _one_line_error(capsys, [*base, "--db", other])  # was read as if it were h100's
    assert "holds configs for 'mi300x', not 'h100'" in err
