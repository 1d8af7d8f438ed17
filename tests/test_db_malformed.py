"""A malformed user database is one line (issue 46, item 3; issue 51, item 5's read side).

Every reader checks a file's entries once as it reads them (:mod:`rocmflash.db.entries`): a malformed entry is
skipped with one warning naming the file, the key and what is wrong; an entry that holds no config (``best``
null, ``failed``) is absent without one. Covered: the checks per family, the shipped databases (all valid), run
time (``rocmflash.attention`` forward and backward, ``flash_attn_with_kvcache``) in the interpreter, ``rocmflash
explain``, ``export``, ``doctor`` and ``tune``'s own writer, and a tune into a symlinked database."""

import copy
import glob
import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch

from rocmflash import db as D
from rocmflash.db import entries as E
from rocmflash.api import selection
from rocmflash.cli import main
from rocmflash.config import KernelConfig
from varlen_reference import attention_fp64, rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "configs", "*.json")))

GOOD = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)  #: one warp: no default picks it
OLD_GOOD = {k: v for k, v in GOOD.to_dict().items() if k != "PRE_LOAD_V"}  #: a best written before PRE_LOAD_V
BWD_BEST = {"dkdv": GOOD.to_dict(), "dq": GOOD.to_dict(), "head_splits": 0}
DECODE_BEST = {"BLOCK_N": 32, "num_warps": 2, "num_stages": 1, "waves_per_eu": 0, "num_splits": 0}
SDPA_FIELD = {"backend": "default", "time_ms": 0.01, "triton_ms": 0.03, "timing": "eager",
              "backends": {"default": {"status": "ok", "time_ms": 0.01}}}

FWD, BWD, DEC = "d128-bf16-full-gqa1-s2048", "bwd-d128-bf16-full-gqa1-s2048", "decode-d128-bf16-gqa4-kv4096-b8"
VARLEN, VARLEN_BWD = "varlen-d128-bf16-gqa1-s4096", "varlen-bwd-d128-bf16-gqa1-causal-s4096"


def _fwd(**changes):
    return dict({"measured": True, "best": GOOD.to_dict(), "tflops": 100.0, "time_ms": 0.5,
                 "best_per_variant": {"online": {"config": GOOD.to_dict(), "tflops": 100.0}}}, **changes)


# ---------------------------------------------------------------------- what a valid entry is, per family
MALFORMED = [
    (FWD, "an entry", "the entry is a string ('an entry'), expected an object"),
    (FWD, _fwd(best=[1, 2]), "'best' is a list, expected an object"),
    (FWD, {k: v for k, v in _fwd().items() if k != "best"}, "it has no 'best'"),
    (FWD, _fwd(best=dict(GOOD.to_dict(), BLOCK_M=24)), "'best' is not a valid config: KernelConfig.BLOCK_M=24"),
    (FWD, _fwd(best=dict(GOOD.to_dict(), tile=3)), "unknown KernelConfig key(s) ['tile']"),
    (FWD, _fwd(best={"BLOCK_M": 64, "num_warps": 4, "num_stages": 1}), "'best' names no BLOCK_N"),
    (FWD, _fwd(incumbent="sdpa"), "'incumbent' is a string ('sdpa'), expected an object"),
    (FWD, _fwd(incumbent=dict(SDPA_FIELD, time_ms="fast")), "'incumbent.time_ms' is a string ('fast')"),
    (FWD, _fwd(incumbent=dict(SDPA_FIELD, train=[0.1])), "'incumbent.train' is a list, expected an object"),
    (FWD, _fwd(incumbent=dict(SDPA_FIELD, backends={"flash": 3})), "'incumbent.backends.flash' is 3"),
    (FWD, _fwd(tflops=float("nan")), "'tflops' is nan, expected a finite number >= 0"),
    (FWD, _fwd(time_ms=-1.0), "'time_ms' is -1.0, expected a finite number >= 0"),
    (FWD, _fwd(measured="yes"), "'measured' is a string ('yes'), expected true or false"),
    (FWD, _fwd(shape=[1, 2]), "'shape' is a list, expected an object"),
    (FWD, _fwd(shape={"batch": "two"}), "'shape.batch' is a string ('two')"),
    (FWD, _fwd(best_per_variant=[1]), "'best_per_variant' is a list, expected an object"),
    (FWD, _fwd(best_per_variant={"split_kv": {"config": {"BLOCK_M": 64}}}), "'best_per_variant.split_kv.config' names no"),
    ("d128-fp8e4m3fn-full-gqa1-s2048", _fwd(best=dict(GOOD.to_dict(), variant="fast")), "KernelConfig.variant='fast'"),
    (BWD, {"measured": True, "best": {"dkdv": GOOD.to_dict()}}, "'best' has no 'dq' config"),
    (BWD, {"measured": True, "best": dict(BWD_BEST, dkdv=[1])}, "'best.dkdv' is a list, expected an object"),
    (BWD, {"measured": True, "best": dict(BWD_BEST, head_splits=-1)}, "'best.head_splits' is -1"),
    (BWD, {"measured": True, "best": BWD_BEST, "time_ms": {"total": float("inf")}}, "'time_ms.total' is inf"),
    (VARLEN_BWD, {"measured": True, "best": dict(BWD_BEST, dq={"BLOCK_M": 16})}, "'best.dq' names no BLOCK_N"),
    (VARLEN, {"measured": True, "best": dict(GOOD.to_dict(), num_stages=9)}, "KernelConfig.num_stages=9"),
    (VARLEN, {"measured": True, "best": GOOD.to_dict(), "incumbent": 0.5}, "'incumbent' is 0.5, expected an object"),
    (DEC, {"measured": True, "best": dict(DECODE_BEST, BLOCK_N=512)}, "'best.BLOCK_N' is 512, expected one of"),
    (DEC, {"measured": True, "best": dict(DECODE_BEST, num_warps=3)}, "KernelConfig.num_warps=3"),
    (DEC, {"measured": True, "best": {"BLOCK_N": 32, "num_warps": 2}}, "'best' names no num_stages"),
    (DEC, {"measured": True, "best": "n32"}, "'best' is a string ('n32'), expected an object"),
]


@pytest.mark.parametrize("key, entry, why", MALFORMED, ids=[f"{k.split('-')[0]}:{w[:40]}" for k, _, w in MALFORMED])
def test_each_malformed_entry_is_named_with_what_is_wrong(key, entry, why):
    with pytest.raises(E.Malformed) as err:
        E.check_entry(key, copy.deepcopy(entry))
    assert why in str(err.value), str(err.value)


@pytest.mark.parametrize("key, entry", [(FWD, _fwd()), (BWD, {"measured": True, "best": BWD_BEST}),
                                        (VARLEN_BWD, {"measured": True, "best": BWD_BEST}),
                                        (VARLEN, {"measured": True, "best": GOOD.to_dict()}),
                                        (DEC, {"measured": True, "best": DECODE_BEST}),
                                        ("d128-fp8e4m3fnuz-causal-gqa1-s2048", _fwd()),
                                        ("someday-a-new-family", {"anything": [1]})])
def test_valid_entries_pass_unchanged_but_completed(key, entry):
    assert E.check_entry(key, copy.deepcopy(entry)) == entry


def test_a_config_missing_an_optional_key_gets_the_records_default():
    """A ``best`` (and a per-variant config) without ``PRE_LOAD_V`` serves as the record's default, False."""
    entry = _fwd(best=dict(OLD_GOOD), best_per_variant={"online": {"config": dict(OLD_GOOD), "tflops": 1.0}})
    checked = E.check_entry(FWD, entry)
    assert checked["best"] == GOOD.to_dict() and checked["best_per_variant"]["online"]["config"] == GOOD.to_dict()
    assert "PRE_LOAD_V" not in entry["best"]  # the stored entry is not touched (a tune saves what it read)
    bwd = E.check_entry(BWD, {"measured": True, "best": {"dkdv": dict(OLD_GOOD), "dq": dict(OLD_GOOD)}})
    assert bwd["best"]["dkdv"] == GOOD.to_dict() == bwd["best"]["dq"]


@pytest.mark.parametrize("entry", [{"measured": True, "best": None, "note": "no timed config passed"},
                                   {"measured": True, "best": None, "failed": "every config crashed"},
                                   {"measured": True, "failed": "the worker died"}])
def test_an_entry_without_a_config_is_absent_without_a_warning(entry, tmp_path):
    path = str(tmp_path / "h100.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checked = E.check_entries(path, {FWD: entry, BWD: entry, DEC: entry})
    assert checked.usable == {} and checked.malformed == {} and sorted(checked.no_config) == sorted([FWD, BWD, DEC])


@pytest.mark.parametrize("best", [DECODE_BEST, dict(DECODE_BEST, BLOCK_N=256, num_splits=128),
                                  {"BLOCK_N": 16, "num_warps": 4, "num_stages": 3, "extra": 1},
                                  dict(DECODE_BEST, BLOCK_N=8), dict(DECODE_BEST, BLOCK_N=48),
                                  dict(DECODE_BEST, num_splits=129), dict(DECODE_BEST, num_stages=0),
                                  dict(DECODE_BEST, waves_per_eu=11), dict(DECODE_BEST, num_warps=32)])
def test_the_decode_check_agrees_with_decodeconfig(best):
    """The check copies DecodeConfig's rules (DecodeConfig's module imports Triton, the check must not)."""
    from rocmflash.kernels.decode.host import DecodeConfig

    try:
        DecodeConfig.from_dict(best)
        builds = True
    except (TypeError, ValueError):
        builds = False
    try:
        E.check_entry(DEC, {"measured": True, "best": best})
        passes = True
    except E.Malformed:
        passes = False
    assert passes == builds


@pytest.mark.parametrize("best", [BWD_BEST, dict(BWD_BEST, head_splits=4), dict(BWD_BEST, head_splits=-2),
                                  dict(BWD_BEST, dq=dict(GOOD.to_dict(), BLOCK_N=7)), {"dkdv": GOOD.to_dict()}])
def test_the_backward_check_agrees_with_the_lookups_reader(best):
    """(The check is stricter in one place: a fractional ``head_splits``, which the reader truncates, is malformed.)"""
    from rocmflash.db.lookups.backward import entry_config

    try:
        entry_config({"best": best})
        builds = True
    except (KeyError, TypeError, ValueError):
        builds = False
    try:
        E.check_entry(BWD, {"measured": True, "best": best})
        passes = True
    except E.Malformed:
        passes = False
    assert passes == builds


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_the_shipped_databases_are_all_valid(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = D.ConfigDB.read(path)
        checked = E.check_entries(path, data["entries"])
    assert checked.malformed == {} and checked.no_config == []
    assert len(checked.usable) == len(data["entries"]) > 0


def test_one_warning_per_file_and_key_in_a_process(tmp_path):
    path = _write(tmp_path, {FWD: _fwd(best=[1]), BWD: "x"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            D.read_database(path)
            D.clear_cache()  # a save in this process: the file is read again, not reported again
            D.database_summary(path)  # doctor reports it itself
    assert sorted(str(w.message) for w in seen) == [
        f"rocmflash: skipping entry {BWD!r} in {path}: the entry is a string ('x'), expected an object",
        f"rocmflash: skipping entry {FWD!r} in {path}: 'best' is a list, expected an object"]


# ---------------------------------------------------------------------- run time
def _write(tmp_path, entries: dict, gpu="h100", arch="sm_90") -> str:
    """A user database of ``entries`` as they are (no check on the way in: a hand-edited file)."""
    data = D.ConfigDB.new_data(gpu, arch, {})
    data["entries"] = entries
    path = str(tmp_path / f"{gpu}.json")
    D.atomic_write_json(path, data)
    return path


@pytest.fixture
def user_h100(tmp_path, monkeypatch):
    """``write(entries)``: the h100 user database (the shipped one hidden) the faked live GPU reads."""
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    monkeypatch.setattr(D, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    selection.clear_cache()

    def write(entries):
        path = _write(tmp_path, entries)
        selection.clear_cache()
        return path

    yield write
    selection.clear_cache()


def _skipped(seen) -> list:
    return sorted(str(w.message).split("'")[1] for w in seen if "skipping entry" in str(w.message))


def test_attention_serves_past_malformed_entries_with_one_warning_each(interpret, user_h100):
    """Forward and backward at run time: the malformed entries of the asked bucket are skipped (one warning
    each, also on a second call), the valid entry two buckets away serves (a best without PRE_LOAD_V), and
    the result matches fp64."""
    import rocmflash
    from rocmflash.kernels.launch import observe_launches
    from rocmflash.db.lookups.backward import bwd_key

    S, H, Dh = 64, 2, 32
    near, far = D.problem_key(Dh, "fp16", False, 1, 64), D.problem_key(Dh, "fp16", False, 1, 128)
    ok = D.problem_key(Dh, "fp16", False, 1, 256)
    user_h100({near: _fwd(best=[16, 16]), far: _fwd(best=OLD_GOOD, incumbent="sdpa"),
               ok: {"measured": True, "best": dict(OLD_GOOD), "timing": "gpu"},
               bwd_key(Dh, "fp16", False, 1, S): ["dkdv", "dq"]})
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, H, S, Dh, generator=gen).half().requires_grad_() for _ in range(3))
    with warnings.catch_warnings(record=True) as seen, observe_launches() as launches:
        warnings.simplefilter("always")
        out = rocmflash.attention(q, k, v)
        out.float().pow(2).sum().backward()
        again = rocmflash.attention(q.detach(), k.detach(), v.detach())
    assert _skipped(seen) == sorted([near, far, bwd_key(Dh, "fp16", False, 1, S)])
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning) and "skipping" not in str(w.message)]
    forward = [r for r in launches if r["kernel"].startswith("_fwd")]
    assert forward and all(r["options"]["num_warps"] == 1 for r in forward), launches  # the entry's config ran
    match = D.lookup_match("h100", Dh, torch.float16, False, 1, S, measured_only=True)
    assert match.key == ok and match.config == GOOD
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.softmax(qd @ kd.transpose(-1, -2) / math.sqrt(Dh), -1) @ vd
    ref.pow(2).sum().backward()
    assert rel_err(out, ref) < 1e-2 and rel_err(again, ref) < 1e-2
    for got, want in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert rel_err(got, want) < 2e-2


def test_kvcache_serves_past_malformed_decode_entries(interpret, user_h100):
    """``flash_attn_with_kvcache`` and a decode-shaped ``rocmflash.attention``: a decode entry whose ``best`` is a
    list and one whose ``incumbent`` is a string are skipped with one warning each; the valid one serves."""
    import rocmflash
    from rocmflash.api import decode
    from rocmflash.kernels.launch import observe_launches
    from rocmflash.tuning.decode import decode_key

    B, HQ, HKV, SK, Dh = 2, 4, 2, 64, 32
    bad_best, bad_field = decode_key(Dh, "fp16", 2, SK, B), decode_key(Dh, "fp16", 2, SK, 2 * B)
    ok = decode_key(Dh, "fp16", 2, 4 * SK, B)
    user_h100({bad_best: {"mode": "decode", "measured": True, "best": [32, 2]},
               bad_field: {"mode": "decode", "measured": True, "best": DECODE_BEST, "incumbent": "sdpa"},
               ok: {"mode": "decode", "measured": True, "best": dict(DECODE_BEST, num_warps=1)}})
    decode.clear_cache()
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(B, 1, HQ, Dh, generator=gen).half()
    kc, vc = (torch.randn(B, SK, HKV, Dh, generator=gen).half() for _ in range(2))
    lens = torch.tensor([40, SK], dtype=torch.int32)
    with warnings.catch_warnings(record=True) as seen, observe_launches() as launches:
        warnings.simplefilter("always")
        out = rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
        dense = rocmflash.attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2))
    decode.clear_cache()
    assert _skipped(seen) == sorted([bad_best, bad_field])
    split = [r for r in launches if r["kernel"] == "_decode_split"]
    assert split and all(r["options"]["num_warps"] == 1 for r in split), launches
    for b, n in enumerate((40, SK)):
        ref, _ = attention_fp64(q[b], kc[b, :n], vc[b, :n], 1 / math.sqrt(Dh))
        assert rel_err(out[b], ref) < 1e-2
        full, _ = attention_fp64(q[b], kc[b], vc[b], 1 / math.sqrt(Dh))
        assert rel_err(dense[b].transpose(0, 1), full) < 1e-2


# ---------------------------------------------------------------------- the CLI
def _cli(config_dir, *argv):
    """``rocmflash ARGV`` in a child process (warnings print as they would for a user)."""
    env = dict(os.environ, ROCMFLASH_CONFIG_DIR=str(config_dir))
    env.pop("ROCMFLASH_NO_DB", None)
    return subprocess.run([sys.executable, "-m", "rocmflash.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def _broken_h100(tmp_path) -> tuple:
    """A user h100 database from the shipped one with one malformed entry per case of the issue, and the
    keys the readers skip."""
    data = D.ConfigDB.read(os.path.join(ROOT, "configs", "h100.json"))
    entries = data["entries"]
    skipped = {"d128-bf16-full-gqa1-s2048": dict(entries["d128-bf16-full-gqa1-s2048"], best=[128, 64]),
               "d128-bf16-full-gqa1-s8192": dict(entries["d128-bf16-full-gqa1-s8192"], incumbent="sdpa"),
               "d64-bf16-full-gqa1-s1024": "not an entry"}
    kept = {"d128-bf16-causal-gqa1-s2048": dict(entries["d128-bf16-causal-gqa1-s2048"]),  # served, exported
            "d64-bf16-full-gqa1-s2048": {"measured": True, "best": None, "note": "no timed config passed"}}
    kept["d128-bf16-causal-gqa1-s2048"]["best"] = {k: v for k, v in kept["d128-bf16-causal-gqa1-s2048"]["best"].items()
                                                   if k != "PRE_LOAD_V"}
    folder = tmp_path / "user"
    folder.mkdir()
    data["entries"] = {**skipped, **kept}
    D.atomic_write_json(str(folder / "h100.json"), data)
    return folder, sorted(skipped)


def _one_line_each(stderr: str, skipped: list, path: str) -> None:
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert sorted(line.split("'")[1] for line in lines) == skipped, stderr
    assert all(line.startswith("rocmflash: skipping entry '") and f" in {path}: " in line for line in lines), stderr


@pytest.mark.parametrize("head_dim, seqlen, causal", [(128, 2048, False), (128, 8192, False), (64, 1024, False),
                                                      (64, 2048, False), (128, 2048, True)])
def test_cli_explain_skips_each_malformed_entry_in_one_line(tmp_path, head_dim, seqlen, causal):
    """The malformed entries of the asked buckets give way to the shipped ones; a best-null entry (a failed tune,
    issue 51) is absent, not an AttributeError; a best without PRE_LOAD_V serves from the user's file."""
    folder, skipped = _broken_h100(tmp_path)
    done = _cli(folder, "explain", "--gpu", "h100", "--head-dim", str(head_dim), "--dtype", "bf16", "--seqlen",
                str(seqlen), "--no-compile", "--json", *(["--causal"] if causal else []))
    assert done.returncode == 0, done.stderr
    user = str(folder / "h100.json")
    _one_line_each(done.stderr, skipped, user)
    result = json.loads(done.stdout)
    assert result["choice"]["source"] == "db"
    if causal:  # the user's entry of the asked bucket, its config completed with the record's default
        assert result["choice"]["path"] == user and result["choice"]["config"]["PRE_LOAD_V"] is False
    else:  # nothing of the user's serves: the shipped file answers
        assert result["choice"]["path"].endswith(os.path.join("configs", "h100.json"))
        assert all(c["path"] != user for c in result["candidates"])


def test_cli_explain_with_db_of_malformed_entries(tmp_path):
    folder, skipped = _broken_h100(tmp_path)
    path = str(folder / "h100.json")
    done = _cli(tmp_path / "other", "explain", "--gpu", "h100", "--head-dim", "128", "--dtype", "bf16", "--seqlen",
                "2048", "--no-compile", "--db", path, "--json")
    assert done.returncode == 0, done.stderr
    _one_line_each(done.stderr, skipped, path)
    assert json.loads(done.stdout)["choice"]["source"] == "default"


@pytest.mark.parametrize("fmt", ["json", "triton"])
def test_cli_export_skips_each_malformed_entry_in_one_line(tmp_path, fmt):
    """A best without PRE_LOAD_V (served at run time) exports with the record's default, not a KeyError."""
    folder, skipped = _broken_h100(tmp_path)
    done = _cli(folder, "export", "--gpu", "h100", "--format", fmt)
    assert done.returncode == 0, done.stderr
    _one_line_each(done.stderr, skipped, str(folder / "h100.json"))
    if fmt == "json":
        out = json.loads(done.stdout)["entries"]
        assert sorted(out) == ["d128-bf16-causal-gqa1-s2048"]
        assert out["d128-bf16-causal-gqa1-s2048"]["best"]["PRE_LOAD_V"] is False
        assert out["d128-bf16-causal-gqa1-s2048"]["triton_config"]["kwargs"]["PRE_LOAD_V"] is False
    else:
        assert "'d128-bf16-causal-gqa1-s2048': triton.Config(" in done.stdout
        assert done.stdout.count("triton.Config(") == 2  # the entry and its line in AUTOTUNE_CONFIGS


def test_cli_whole_file_problems_are_one_line(tmp_path):
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "h100.json").write_text("{not json")
    done = _cli(folder, "explain", "--gpu", "h100", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "2048",
                "--no-compile", "--json")
    assert done.returncode == 0 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("rocmflash: ignoring config database: ") and "not valid JSON" in done.stderr
    done = _cli(folder, "export", "--gpu", "h100")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr


def test_cli_doctor_names_malformed_entries_and_a_config_dir_that_is_a_file(tmp_path):
    folder, skipped = _broken_h100(tmp_path)
    done = _cli(folder, "doctor")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert f"config  {folder} ($ROCMFLASH_CONFIG_DIR): writable (rocmflash tune saves here)" in lines
    db_line = next(line for line in lines if line.strip().startswith(f"db {folder / 'h100.json'} "))
    assert "5 entries, 1 measured, 1 without a config (a tune found none), 3 malformed" in db_line, db_line
    assert sorted(line.split("'")[1] for line in lines if line.strip().startswith("skipped '")) == skipped
    assert lines[-1].startswith("verdict: READY")
    for config_dir, problem in ((folder / "h100.json", "is a file, not a directory"),
                                (folder / "h100.json" / "sub", "is a file, so no directory can be made under it")):
        done = _cli(config_dir, "doctor", "--json")
        assert done.returncode == 0, done.stderr  # PARTLY READY: exit 0, as an off-catalog GPU
        report = json.loads(done.stdout)
        assert problem in report["config_dir"]["problem"] and report["config_dir"]["source"] == "$ROCMFLASH_CONFIG_DIR"
        assert report["verdict"].startswith("PARTLY READY: rocmflash tune cannot save to the config directory")
        assert sorted(os.listdir(folder)) == ["h100.json"]  # the write check leaves nothing behind


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_doctor_names_an_unwritable_config_dir(tmp_path, monkeypatch):
    from rocmflash.hw import doctor

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(locked))
    try:
        report = doctor.gather()
    finally:
        locked.chmod(0o700)
    assert "cannot write there" in report["config_dir"]["problem"] and report["verdict"].startswith("PARTLY READY")


def test_tune_into_a_config_dir_that_is_a_file_is_one_error_line(tmp_path, monkeypatch, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(afile))
    code = main(["tune", "--gpu", "mi300x", "--head-dim", "64", "--dtype", "bf16", "--seqlen", "1024",
                 "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: $ROCMFLASH_CONFIG_DIR "), err
    assert "is a file, not a directory" in err


# ---------------------------------------------------------------------- tune's writer
class _GPU:
    name, arch, compute_units = "h100", "sm_90", 132


def test_tune_keeps_malformed_entries_it_does_not_tune_and_warns_once(tmp_path):
    """``ConfigDB.open`` (every tune) warns once per malformed entry and its save keeps them as stored:
    nothing of a user's file is lost, and nothing malformed is served."""
    path = _write(tmp_path, {FWD: _fwd(best=[1]), DEC: "x"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        D.store_entry(path, _GPU, D.environment("test"), "d64-fp16-full-gqa1-s1024", _fwd(), measured=True)
        D.store_entry(path, _GPU, D.environment("test"), "d64-fp16-full-gqa1-s2048", _fwd(), measured=True)
    assert _skipped(seen) == sorted([FWD, DEC])
    stored = D.ConfigDB.read(path)["entries"]
    assert stored[FWD]["best"] == [1] and stored[DEC] == "x" and len(stored) == 4


def test_tune_writes_through_a_symlinked_database(tmp_path):
    """The link stays a link; its target gets the new entry beside its old ones, atomically (no temporary file
    left); the lock and the journal are beside the target, so every path to it shares them."""
    shared = tmp_path / "shared"
    shared.mkdir()
    target = _write(shared, {FWD: _fwd()})
    user = tmp_path / "user"
    user.mkdir()
    link = user / "h100.json"
    link.symlink_to(target)
    D.store_entry(str(link), _GPU, D.environment("test"), "d64-fp16-full-gqa1-s1024", _fwd(), measured=True)
    assert link.is_symlink() and os.readlink(link) == target
    assert sorted(D.ConfigDB.read(target)["entries"]) == sorted([FWD, "d64-fp16-full-gqa1-s1024"])
    assert sorted(os.listdir(shared)) == ["h100.json", "h100.json.lock"] and os.listdir(user) == ["h100.json"]
    assert D.journal_path(str(link)) == str(shared / "h100.journal.jsonl")
    lock = D.tune_lock(target)
    try:
        with pytest.raises(D.DBLockedError):  # the link's path names the same lock
            D.tune_lock(str(link))
    finally:
        lock.release()
    dangling = user / "mi300x.json"
    dangling.symlink_to(shared / "mi300x.json")  # a link made before its first tune
    D.store_entry(str(dangling), type("G", (), {"name": "mi300x", "arch": "gfx942", "compute_units": 304}),
                  D.environment("test"), FWD, _fwd(), measured=True)
    assert dangling.is_symlink() and FWD in D.ConfigDB.read(str(shared / "mi300x.json"))["entries"]


def test_tune_checks_the_folder_a_symlinked_db_writes_into(tmp_path):
    from rocmflash.cli.tune_args import check_db_path

    afile = tmp_path / "afile"
    afile.write_text("")
    link = tmp_path / "h100.json"
    link.symlink_to(afile / "configs" / "h100.json")
    with pytest.raises(ValueError, match=f"--db {link}: {afile} is a file, so no directory can be made under it"):
        check_db_path(str(link))
