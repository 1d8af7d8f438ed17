"""``rocmflash db refresh-incumbents`` (was the script ``refresh_incumbents.py`` of ``bench/``) on the CPU: its
help, and every bad argument is one line and exit code 2 before anything is timed or written. What it computes
(the decode grid, the short dense entries) is tested through the same module in test_decode_incumbent_interp.py
and test_small_incumbent_interp.py; the GPU run itself is the lead's."""

import json
import os
import shutil

import pytest
import torch

from rocmflash.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ("--db", "--out-db", "--out", "--keys", "--decode", "--small", "--rounds", "--iters")


@pytest.fixture
def shipped(tmp_path):
    """A copy of a shipped database (the command only reads --db; the copy keeps the checkout's untouched)."""
    path = tmp_path / "h100.json"
    shutil.copyfile(os.path.join(ROOT, "configs", "h100.json"), path)
    return path


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _argparse_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_help_names_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["db", "refresh-incumbents", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert all(flag in out for flag in FLAGS), out
    with pytest.raises(SystemExit):
        main(["db", "--help"])
    assert "refresh-incumbents" in capsys.readouterr().out


def test_db_needs_a_command(capsys):
    assert "required" in _argparse_error(capsys, ["db"])


@pytest.mark.parametrize("argv, words", [
    (["--out-db", "x.json"], "--db"),                                    # --db is required
    (["--db", "d.json"], "--out-db"),                                    # so is --out-db
    (["--db", "d.json", "--out-db", "x.json", "--decode", "--small"], "not allowed with"),
    (["--db", "d.json", "--out-db", "x.json", "--rounds", "0"], ">= 1"),
    (["--db", "d.json", "--out-db", "x.json", "--iters", "many"], "not an integer"),
])
def test_argparse_errors(capsys, argv, words):
    assert words in _argparse_error(capsys, ["db", "refresh-incumbents", *argv])


def test_bad_paths_are_one_line(capsys, tmp_path, shipped):
    out_db = str(tmp_path / "out.json")
    err = _one_line_error(capsys, ["db", "refresh-incumbents", "--db", str(tmp_path / "none.json"), "--out-db", out_db])
    assert err == f"error: --db {tmp_path / 'none.json'}: no such file"
    err = _one_line_error(capsys, ["db", "refresh-incumbents", "--db", str(tmp_path), "--out-db", out_db])
    assert err.endswith("is a directory")
    broken = tmp_path / "broken.json"
    broken.write_text('{"gpu": "h100", ')
    assert "not valid JSON" in _one_line_error(capsys, ["db", "refresh-incumbents", "--db", str(broken),
                                                        "--out-db", out_db])
    err = _one_line_error(capsys, ["db", "refresh-incumbents", "--db", str(shipped), "--out-db", str(tmp_path)])
    assert err.startswith(f"error: --out-db {tmp_path} is a directory")
    err = _one_line_error(capsys, ["db", "refresh-incumbents", "--db", str(shipped),
                                   "--out-db", str(tmp_path / "no" / "such" / "out.json")])
    assert "does not exist" in err
    err = _one_line_error(capsys, ["db", "refresh-incumbents", "--db", str(shipped), "--out-db", out_db,
                                   "--out", str(shipped)])
    assert err == f"error: --out {shipped} is a file; it takes the folder the table goes to"
    assert sorted(os.listdir(tmp_path)) == ["broken.json", "h100.json"]  # nothing written


def test_without_a_gpu_it_says_so_and_writes_nothing(capsys, tmp_path, shipped, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU box, even where the suite runs on a GPU
    before = shipped.read_bytes()
    for mode in ([], ["--decode"], ["--small"]):
        err = _one_line_error(capsys, ["db", "refresh-incumbents", "--db", str(shipped),
                                       "--out-db", str(tmp_path / "out.json"), "--out", str(tmp_path / "t"), *mode])
        assert err == "error: rocmflash db refresh-incumbents needs a GPU"
    assert shipped.read_bytes() == before and json.loads(before)["gpu"] == "h100"
    assert sorted(os.listdir(tmp_path)) == ["h100.json"]
