"""``vgpr-report``'s default folders (#46): every option that selects a report is in its folder's name, so a subset
never replaces the full sweep; the default spaces keep their names; nothing is written under the current folder.

Names only: nothing here compiles (``tests/test_cli_vgpr_report.py`` runs a sweep without ``--out``)."""

import itertools
import os

import pytest

from rocmflash.cli import _check_report_args, build_parser, default_folder_name
from rocmflash.static import report_dirs as R


@pytest.fixture(autouse=True)
def _root(tmp_path, monkeypatch):
    monkeypatch.setenv(R.REPORTS_ENV, str(tmp_path / "root"))
    monkeypatch.chdir(tmp_path)


def name(*argv) -> str:
    """The default folder name of ``rocmflash vgpr-report ARGV`` (after the CLI's checks, which fill defaults)."""
    args = build_parser().parse_args(["vgpr-report", *argv])
    _check_report_args(args)
    return default_folder_name(args)


#: the default spaces' names, as they were before #46 (the archived report archive/reports:reports/vgpr-mi250-d128-fp16/...)
DEFAULT_NAMES = [
    (["--gpu", "mi250"], "vgpr-mi250-d128-fp16"),
    (["--gpu", "mi300x", "--head-dim", "64", "--dtype", "bf16", "--causal"], "vgpr-mi300x-d64-bf16-causal"),
    (["--gpu", "mi300x", "--dtype", "fp8"], "vgpr-mi300x-d128-fp8"),
    (["--gpu", "mi300x", "--pass", "bwd", "--dtype", "bf16", "--causal"], "vgpr-bwd-mi300x-d128-bf16-causal"),
    (["--gpu", "mi300x", "--mode", "decode", "--dtype", "bf16"], "vgpr-decode-mi300x-d128-bf16"),
    (["--gpu", "mi300x", "--mode", "decode", "--dtype", "bf16", "--kv-dtype", "fp8"],
     "vgpr-decode-mi300x-d128-bf16-kvfp8e4m3fnuz"),
    (["--gpu", "mi300x", "--mode", "varlen", "--dtype", "bf16"], "vgpr-varlen-mi300x-d128-bf16"),
    (["--gpu", "mi300x", "--mode", "varlen", "--pass", "bwd", "--dtype", "bf16", "--causal"],
     "vgpr-varlen-bwd-mi300x-d128-bf16-causal"),
]


@pytest.mark.parametrize("argv, expected", DEFAULT_NAMES, ids=[e for _, e in DEFAULT_NAMES])
def test_default_spaces_keep_their_names(argv, expected):
    assert name(*argv) == expected


def test_naming_every_variant_is_the_full_sweep_and_order_does_not_matter():
    assert name("--gpu", "mi250", "--variant", "split_d", "two_phase", "split_kv", "online") == "vgpr-mi250-d128-fp16"
    # fp8's default sweep is the online kernel's
    assert name("--gpu", "mi300x", "--dtype", "fp8", "--variant", "online") == "vgpr-mi300x-d128-fp8"
    subset = "vgpr-mi250-d128-fp16-online-split_d"
    assert name("--gpu", "mi250", "--variant", "split_d", "online") == subset
    assert name("--gpu", "mi250", "--variant", "online", "split_d") == subset


#: one report per option that selects it, all of one GPU
SELECTORS = [
    ["--gpu", "mi250"],
    ["--gpu", "mi250", "--variant", "online"],  # the issue: a 336-config subset replaced the 408-config sweep
    ["--gpu", "mi250", "--variant", "split_kv"],
    ["--gpu", "mi250", "--variant", "online", "split_kv"],
    ["--gpu", "mi250", "--causal"],
    ["--gpu", "mi250", "--causal", "--variant", "online"],
    ["--gpu", "mi250", "--dtype", "bf16"],
    ["--gpu", "mi250", "--head-dim", "64"],
    ["--gpu", "mi250", "--occupancy-floor", "1"],
    ["--gpu", "mi250", "--occupancy-floor", "2"],  # an explicit floor prunes as the default does not (prune.py)
    ["--gpu", "mi250", "--cliff-margin", "8"],
    ["--gpu", "mi250", "--reference"],
    ["--gpu", "mi250", "--reference-file", "a/amd.json"],
    ["--gpu", "mi250", "--reference-file", "b/amd.json"],
    ["--gpu", "mi250", "--pass", "bwd"],
    ["--gpu", "mi250", "--pass", "bwd", "--causal"],
    ["--gpu", "mi250", "--pass", "bwd", "--heads", "32"],
    ["--gpu", "mi250", "--pass", "bwd", "--kv-heads", "4"],
    ["--gpu", "mi250", "--mode", "decode"],
    ["--gpu", "mi250", "--mode", "decode", "--heads", "16"],
    ["--gpu", "mi250", "--mode", "decode", "--kv-heads", "4"],
    ["--gpu", "mi250", "--mode", "decode", "--batch", "8"],
    ["--gpu", "mi250", "--mode", "decode", "--seqlen", "8192"],
    ["--gpu", "mi250", "--mode", "decode", "--page-size", "16"],
    ["--gpu", "mi250", "--mode", "varlen"],
    ["--gpu", "mi250", "--mode", "varlen", "--causal"],  # was the non-causal report's folder
    ["--gpu", "mi250", "--mode", "varlen", "--heads", "8"],
    ["--gpu", "mi250", "--mode", "varlen", "--kv-heads", "4"],
    ["--gpu", "mi250", "--mode", "varlen", "--pass", "bwd"],
    ["--gpu", "mi250", "--mode", "varlen", "--pass", "bwd", "--causal"],
    ["--gpu", "mi300x"],
    ["--gpu", "mi300x", "--mode", "decode", "--kv-dtype", "fp8"],
]


def test_two_different_selections_never_share_a_folder():
    names = {" ".join(argv): name(*argv) for argv in SELECTORS}
    clashes = [(a, b) for a, b in itertools.combinations(names, 2) if names[a] == names[b]]
    assert clashes == [], clashes
    assert names["--gpu mi250 --variant online"] == "vgpr-mi250-d128-fp16-online"
    assert names["--gpu mi250 --mode decode --batch 8"] == "vgpr-decode-mi250-d128-fp16-b8"
    assert names["--gpu mi250 --mode varlen --causal"] == "vgpr-varlen-mi250-d128-fp16-causal"


def test_out_dir_json_out_and_the_root(tmp_path, monkeypatch):
    args = build_parser().parse_args(["vgpr-report", "--gpu", "mi250", "--json"])
    assert R.out_dir(args, "vgpr-x") is None  # --json alone: no file
    args.out = "mine"
    assert R.out_dir(args, "vgpr-x") == "mine"  # --out: that folder itself, with or without --json
    args.json, args.out = False, None
    assert R.out_dir(args, "vgpr-x") == os.path.join(str(tmp_path / "root"), "vgpr-x") and R.root_flag() == \
        f"${R.REPORTS_ENV}"
    monkeypatch.delenv(R.REPORTS_ENV)
    import platformdirs

    assert R.reports_root() == os.path.join(platformdirs.user_data_dir("rocmflash"), "reports")
    assert not os.path.abspath(R.reports_root()).startswith(os.getcwd()) and R.root_flag() == "--out (default)"


def test_family_reports_with_json_and_no_out_write_nothing(tmp_path, capsys):
    """decode/varlen/--pass bwd publish through family_report: no folder with --json alone, report.md with one."""
    import json

    from rocmflash.static.family_report import publish

    rows = [{"config": {"BLOCK_N": 64}, "kept": True}]
    args = ("t", ["h"], ("config",), rows, lambda r: [r["config"]["BLOCK_N"]], "rocmflash vgpr-report", True, "f")
    publish(None, *args)
    assert json.loads(capsys.readouterr().out) == rows and os.listdir(tmp_path) == []
    publish(str(tmp_path / "mine"), *args)
    assert os.listdir(tmp_path) == ["mine"] and "| 64 |" in (tmp_path / "mine" / "report.md").read_text()
