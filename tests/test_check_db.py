"""``rocmflash check-db`` and the static record of database entries (issue 48, items 1, 3 and 4).

Pure tests of the comparison (:func:`rocmflash.static.profile.compare_profiles`) and of what builds an entry of
each family names (:func:`rocmflash.static.db_record.entry_builds`), then real cross-compiles for gfx942 (three
small builds, compiled once per module into a shared compile cache): a database whose record disagrees with the
real compile is flagged (exit code 1) and ``--fix`` rewrites that entry only, a schema-1 database reads and
checks, ``--json``, the tune-time record, and bad input as one line.
"""

from __future__ import annotations

import copy
import json

import pytest

from rocmflash.config import KernelConfig
from rocmflash.static.profile import compare_profiles, profile_from_ranked_row, static_profile

GPU = "mi300x"  # gfx942
SHAPE = {"batch": 1, "heads_q": 16, "heads_kv": 16, "seqlen_q": 4096, "seqlen_k": 4096, "head_dim": 64,
         "dtype": "fp16", "causal": False}
#: two small forward tiles that build without spilling on gfx942 (64x32: 4 waves/SIMD, 64x64: 3 with Triton 3.6)
SMALL = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1).to_dict()
WIDER = KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1).to_dict()
DECODE_PROBLEM = {"head_dim": 64, "dtype": "fp16", "heads_q": 8, "heads_kv": 8, "batch": 1, "seqlen_k": 4096,
                  "seqlen_q": 1, "page_size": 0}
DECODE_BEST = {"BLOCK_N": 16, "num_warps": 1, "num_stages": 1, "waves_per_eu": 0, "num_splits": 0}
FWD_KEY, OTHER_KEY = "d64-fp16-full-gqa1-s4096", "d64-fp16-full-gqa1-s2048"
DECODE_KEY = "decode-d64-fp16-gqa1-kv4096-b1"


def _profile(**fields) -> dict:
    base = {"status": "ok", "kernel": "_fwd_online", "vgprs": 128, "agprs": 0, "sgprs": 48, "vgpr_spills": 0,
            "sgpr_spills": 0, "scratch_bytes": 0, "spills_in_loop": False, "scratch_loop_ops": 0, "lds_bytes": 8192,
            "waves_per_simd": 4, "limiter": "vgpr"}
    return dict(base, **fields)


# ---------------------------------------------------------------------- the comparison (pure)
def test_an_unchanged_profile_holds_and_register_moves_are_changes_only():
    assert compare_profiles(_profile(), _profile()) == ([], [])
    regressions, changes = compare_profiles(_profile(), _profile(vgprs=120, lds_bytes=16384))
    assert regressions == [] and changes == ["VGPRs 128 -> 120", "LDS 8192 -> 16384"]


def test_fewer_waves_than_recorded_is_a_regression_more_is_not():
    regressions, _ = compare_profiles(_profile(waves_per_simd=4), _profile(waves_per_simd=3, vgprs=168))
    assert regressions == ["waves/SIMD 4 -> 3 (vgpr-limited)"]
    regressions, changes = compare_profiles(_profile(waves_per_simd=3), _profile(waves_per_simd=4))
    assert regressions == [] and "waves/SIMD 3 -> 4" in changes


def test_a_new_in_loop_spill_is_a_regression_at_the_same_occupancy():
    now = _profile(vgpr_spills=7, scratch_bytes=32, spills_in_loop=True, scratch_loop_ops=1)
    regressions, _ = compare_profiles(_profile(), now)
    assert regressions == ["spills in the loop (1 scratch ops, 32 B/lane)"]
    # a schema-1 ranked row records no spills: an in-loop spill now is still new
    then = profile_from_ranked_row({"config": SMALL, "waves_per_simd": 4, "allocated_vgprs": 128, "lds_bytes": 8192})
    assert compare_profiles(then, now)[0] == ["spills in the loop (1 scratch ops, 32 B/lane)"]


def test_scratch_past_the_harmless_budget_is_a_regression_a_small_outside_spill_a_change():
    regressions, _ = compare_profiles(_profile(), _profile(scratch_bytes=96, vgpr_spills=20))
    assert regressions == ["scratch 0 -> 96 B/lane"]
    regressions, changes = compare_profiles(_profile(), _profile(scratch_bytes=28, vgpr_spills=6))
    assert regressions == [] and changes == ["scratch 0 -> 28 B"]


def test_a_build_that_fails_now_is_a_regression_and_unknown_fields_are_not_compared():
    regressions, _ = compare_profiles(_profile(), {"status": "failed", "error": "LLVM ERROR: out of registers"})
    assert regressions == ["fails to build (LLVM ERROR: out of registers)"]
    assert compare_profiles(None, _profile(waves_per_simd=1)) == ([], [])  # no record: nothing to fall below
    assert profile_from_ranked_row({"config": SMALL}) is None


def test_static_profile_reads_the_main_kernel_and_every_kernels_spills():
    main = {"name": "_decode_split", "allocated_vgprs": 88, "agpr_count": 16, "allocated_sgprs": 56,
            "vgpr_spill_count": 0, "sgpr_spill_count": 0, "scratch_bytes": 0, "lds_bytes": 2048,
            "dynamic_lds_bytes": 0, "waves_per_simd": 5, "limiter": "vgpr", "scratch_asm_known": True,
            "scratch_loop_loads": 0, "scratch_loop_stores": 0, "scratch_loop_lane_ops": 0}
    combine = dict(main, name="_decode_combine", vgpr_spill_count=3, scratch_bytes=12, scratch_loop_stores=2)
    profile = static_profile({"status": "ok", "kernels": [main, combine]})
    assert (profile["kernel"], profile["vgprs"], profile["waves_per_simd"]) == ("_decode_split", 88, 5)
    assert (profile["vgpr_spills"], profile["scratch_bytes"], profile["spills_in_loop"]) == (3, 12, True)
    nvidia = dict(main, scratch_asm_known=False, scratch_bytes=16, vgpr_spill_count=4)  # SASS not read
    assert static_profile({"status": "ok", "kernels": [nvidia]})["spills_in_loop"] is None
    assert static_profile({"status": "failed", "error": "boom\nmore"}) == {"status": "failed", "error": "boom"}


# ---------------------------------------------------------------------- what an entry of each family builds (pure)
def test_entry_builds_of_every_family_name_the_static_phase_problem_and_where_the_record_goes():
    from rocmflash.db.entries import check_entry
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.static.db_record import CannotCheck, entry_builds

    gpu = get_gpu(GPU)
    fwd = check_entry(FWD_KEY, {"shape": SHAPE, "best": SMALL, "near_best": [{"config": WIDER, "time_ms": 1.0}],
                                "ranked": [{"config": SMALL}, {"config": WIDER}]})
    builds = entry_builds(gpu, FWD_KEY, fwd)
    assert [b.label for b in builds] == ["best", "near_best[0]", "ranked[0]", "ranked[1]"]
    assert builds[0].compile_family is None and builds[0].problem["batch"] == 1  # the tune's static problem
    assert builds[1].path == ("near_best", 0, "static_profile")
    bwd_best = {"dq": SMALL, "dkdv": WIDER, "head_splits": 1}
    bwd = check_entry("bwd-d64-fp16-full-gqa1-s4096", {"mode": "bwd", "problem": SHAPE, "best": bwd_best,
                                                       "near_best": {"dq": [dict(WIDER, head_splits=1, time_ms=2.0)],
                                                                     "dkdv": []}})
    builds = entry_builds(gpu, "bwd-d64-fp16-full-gqa1-s4096", bwd)
    assert [b.label for b in builds] == ["best.dq", "near_best[0].dq", "best.dkdv"]
    assert builds[0].compile_family == "backward" and builds[0].compile_config["kernel"] == "dq"
    assert builds[2].path == ("static_profile", "dkdv")
    decode = check_entry(DECODE_KEY, {"mode": "decode", "problem": DECODE_PROBLEM, "best": dict(DECODE_BEST,
                                                                                              num_splits=4)})
    (build,) = entry_builds(gpu, DECODE_KEY, decode)
    assert build.compile_family == "decode" and build.compile_config["num_splits"] == 0  # a launch argument
    lengths = [128, 256]
    varlen = {"mode": "varlen", "problem": {"head_dim": 64, "dtype": "fp16", "heads_q": 8, "heads_kv": 8,
                                            "causal": True, "lengths": lengths}, "best": SMALL}
    (build,) = entry_builds(gpu, "varlen-d64-fp16-gqa1-causal-s256", check_entry("varlen-d64-fp16-gqa1-causal-s256",
                                                                                  varlen))
    assert build.compile_family == "varlen" and "lengths" not in build.problem
    vbwd = dict(varlen, best=bwd_best, **{"pass": "bwd"})
    builds = entry_builds(gpu, "varlen-bwd-d64-fp16-gqa1-causal-s256",
                          check_entry("varlen-bwd-d64-fp16-gqa1-causal-s256", vbwd))
    assert {b.compile_family for b in builds} == {"varlen_bwd"}
    with pytest.raises(CannotCheck, match="cannot be read"):
        entry_builds(gpu, DECODE_KEY, dict(decode, problem={"head_dim": 64, "bogus": 1}))


# ---------------------------------------------------------------------- real compiles for gfx942
@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The real profiles of SMALL, WIDER and the decode config on gfx942, compiled once into a shared cache."""
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.static.db_record import Build, observe_builds
    from rocmflash.tuning.decode import DecodeProblem
    from rocmflash.hw.roofline import Shape
    from rocmflash.tuning.spec import static_problem

    cache = str(tmp_path_factory.mktemp("check-db-cache"))
    problem = static_problem(Shape.from_dict(SHAPE)).to_dict()
    decode_problem = DecodeProblem(**DECODE_PROBLEM).static_problem().to_dict()
    builds = [Build("best", None, 0, cfg, None, cfg, problem, None) for cfg in (SMALL, WIDER)]
    builds.append(Build("best", None, 0, DECODE_BEST, "decode", DECODE_BEST, decode_problem, None))
    observations, stats = observe_builds(get_gpu(GPU), builds, cache, workers=2)
    assert stats["compiled"] == 3 and all(o["status"] == "ok" for o in observations)
    small, wider, decode = (static_profile(o) for o in observations)
    assert small["waves_per_simd"] > wider["waves_per_simd"] >= 2, "the tiles no longer differ in occupancy"
    return {"cache": cache, "small": small, "wider": wider, "decode": decode, "observations": observations}


def _fwd_entry(best: dict, record: dict, ranked: list) -> dict:
    return {"problem": {"head_dim": 64, "dtype": "fp16", "causal": False, "gqa_ratio": 1, "seqlen_bucket": 4096},
            "shape": SHAPE, "measured": False, "strategy": "static", "best": best, "tflops": None, "time_ms": None,
            "near_best": [], "best_per_variant": {"online": {"config": best, "tflops": None}},
            "ranked": [dict(row, static_rank=i) for i, row in enumerate(ranked)],
            "static_profile": record, "compiler": {"triton": "3.6.0", "backend": "hip"}}


def _database(path, entries: dict, schema: int = 2) -> str:
    data = {"format": "rocmflash-config-db", "schema_version": schema, "gpu": GPU, "arch": "gfx942",
            "compute_units": 304, "fingerprint": {"triton": "3.6.0"}, "updated": "2026-11-26T06:11:03+00:00",
            "entries": entries}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    return str(path)


def _check(path, cache, *flags, capsys=None) -> tuple:
    from rocmflash.cli import main

    rc = main(["check-db", "--gpu", GPU, "--db", str(path), "--cache-dir", cache, "--workers", "2", "--json", *flags])
    out = capsys.readouterr().out if capsys is not None else ""
    return rc, json.loads(out) if out else None


def _entry_text(path: str, key: str) -> str:
    """An entry's bytes as the file holds them (from its key's line to the next top-level entry)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.index(f'\n  "{key}": {{')
    end = text.find('\n  "', start + 1)
    return text[start:end if end > 0 else len(text)]


def test_a_record_that_disagrees_with_the_compile_is_flagged_and_fix_rewrites_that_entry_only(real, tmp_path,
                                                                                               capsys):
    small, wider = real["small"], real["wider"]
    claimed = dict(small, waves_per_simd=small["waves_per_simd"] + 1)  # the record says more occupancy than real
    entries = {
        FWD_KEY: _fwd_entry(SMALL, claimed, [{"config": SMALL, "static_profile": claimed},
                                             {"config": WIDER, "static_profile": wider}]),
        # another bucket of the same static problem (S 2048 compiles as 4096): the same builds, from the cache
        OTHER_KEY: dict(_fwd_entry(WIDER, wider, [{"config": WIDER, "static_profile": wider}]),
                        shape=dict(SHAPE, seqlen_q=2048, seqlen_k=2048), problem={"head_dim": 64, "dtype": "fp16",
                                                                                  "causal": False, "gqa_ratio": 1,
                                                                                  "seqlen_bucket": 2048}),
    }
    path = _database(tmp_path / "mi300x.json", entries)
    other_before = _entry_text(path, OTHER_KEY)
    with open(path, "rb") as f:
        before = f.read()
    rc, report = _check(path, real["cache"], capsys=capsys)
    assert rc == 1 and report["failing"] == [[path, FWD_KEY]]
    assert report["stats"]["compiled"] == 0  # the shared cache: a warm check compiles nothing
    served = {r["key"]: r for r in report["rows"] if r["served"]}
    want = f"drifted: waves/SIMD {claimed['waves_per_simd']} -> {small['waves_per_simd']}"
    assert served[FWD_KEY]["verdict"].startswith(want) and served[FWD_KEY]["holds"] is False
    assert served[OTHER_KEY]["verdict"] == "holds"
    with open(path, "rb") as f:
        assert f.read() == before  # checking writes nothing

    rc, report = _check(path, real["cache"], "--fix", capsys=capsys)
    assert rc == 0 and report["fixed"] == {path: {FWD_KEY: {"best": "ranked[1]"}}}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    fixed = data["entries"][FWD_KEY]
    assert fixed["best"] == WIDER and fixed["best_per_variant"]["online"]["config"] == WIDER
    assert fixed["winner_changed_by"] == "check-db" and fixed["best_timed"] is False
    assert fixed["winner_replaced"]["best"] == SMALL and fixed["winner_replaced"]["by"] == {"best": "ranked[1]"}
    assert fixed["static_profile"] == wider and fixed["compiler"]["triton"] == report["compiler"]["triton"]
    assert fixed["ranked"][0]["static_profile"] == small  # the record is now the real compile's
    assert (fixed["measured"], fixed["time_ms"], fixed["strategy"]) == (False, None, "static")  # timings kept
    assert _entry_text(path, OTHER_KEY) == other_before  # the entry that holds keeps its bytes
    assert data["schema_version"] == 2 and data["updated"] != "2026-11-26T06:11:03+00:00"
    rc, report = _check(path, real["cache"], capsys=capsys)
    assert rc == 0 and all(r["holds"] for r in report["rows"] if r["served"])


def test_fix_never_serves_an_alternative_that_does_not_hold(real, tmp_path, capsys):
    """The next config whose record also disagrees is passed over; with none left the arch default is tried."""
    small, wider = real["small"], real["wider"]
    claimed = dict(small, waves_per_simd=small["waves_per_simd"] + 1)
    wider_claimed = dict(wider, waves_per_simd=wider["waves_per_simd"] + 1)
    entry = _fwd_entry(SMALL, claimed, [{"config": WIDER, "static_profile": wider_claimed}])
    path = _database(tmp_path / "mi300x.json", {FWD_KEY: entry})
    rc, report = _check(path, real["cache"], "--fix", capsys=capsys)
    replaced = report["fixed"].get(path, {}).get(FWD_KEY)
    with open(path, encoding="utf-8") as f:
        best = json.load(f)["entries"][FWD_KEY]["best"]
    assert best != WIDER  # ranked[0] drifted too: never served
    if replaced is not None:  # the arch default held (its compile is real: it is the one left)
        from rocmflash.config import default_config

        assert replaced == {"best": "default"} and best == default_config("gfx942", 64).to_dict() and rc == 0
    else:
        assert rc == 1 and report["unfixable"] == [[path, FWD_KEY]] and best == SMALL


def test_a_schema_1_database_reads_and_checks_and_record_writes_only_what_it_lacks(real, tmp_path, capsys):
    small = real["small"]
    v1 = _fwd_entry(SMALL, None, [{"config": SMALL, "waves_per_simd": small["waves_per_simd"],
                                   "allocated_vgprs": small["vgprs"], "lds_bytes": small["lds_bytes"]}])
    del v1["static_profile"], v1["compiler"]
    decode = {"mode": "decode", "problem": DECODE_PROBLEM, "measured": False, "strategy": "static",
              "best": DECODE_BEST, "time_ms": None}
    path = _database(tmp_path / "mi300x.json", {FWD_KEY: v1, DECODE_KEY: decode}, schema=1)
    from rocmflash.db import read_database

    assert set(read_database(path)["entries"]) == {FWD_KEY, DECODE_KEY}  # a v1 file reads unchanged
    rc, report = _check(path, real["cache"], capsys=capsys)
    rows = {(r["key"], r["build"]): r for r in report["rows"]}
    assert rc == 0
    assert rows[(FWD_KEY, "best")]["then_source"] == "ranked row" and rows[(FWD_KEY, "best")]["verdict"] == "holds"
    assert rows[(DECODE_KEY, "best")]["verdict"] == "unrecorded, holds now"
    assert rows[(DECODE_KEY, "best")]["now"] == real["decode"]

    rc, report = _check(path, real["cache"], "--record", capsys=capsys)
    assert rc == 0 and sorted(report["recorded"][path]) == sorted([FWD_KEY, DECODE_KEY])
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    assert data["schema_version"] == 2 and data["updated"] == "2026-11-26T06:11:03+00:00"  # nothing served changed
    assert data["entries"][DECODE_KEY]["static_profile"] == real["decode"]
    assert data["entries"][FWD_KEY]["ranked"][0]["static_profile"] == small
    for key, stored in ((FWD_KEY, v1), (DECODE_KEY, decode)):  # every key kept, only the record added
        added = {k: v for k, v in data["entries"][key].items() if k not in stored}
        assert {k: v for k, v in data["entries"][key].items() if k in stored and k != "ranked"} == \
               {k: v for k, v in stored.items() if k != "ranked"}
        assert set(added) == {"static_profile", "compiler"}


def test_cannot_check_rows_for_malformed_and_unbuildable_entries(real, tmp_path, capsys):
    bad_problem = {"mode": "decode", "problem": {"head_dim": 64, "bogus": True}, "best": DECODE_BEST,
                   "measured": False}
    entries = {DECODE_KEY: bad_problem, OTHER_KEY: {"best": [1, 2]}}
    path = _database(tmp_path / "mi300x.json", entries)
    rc, report = _check(path, real["cache"], capsys=capsys)
    verdicts = {r["key"]: r["verdict"] for r in report["rows"]}
    assert rc == 0 and verdicts[OTHER_KEY] == "cannot check: 'best' is a list, expected an object"
    assert verdicts[DECODE_KEY].startswith("cannot check: its problem or configs cannot be read")


def test_the_table_fits_80_columns(real, tmp_path, capsys, monkeypatch):
    from rocmflash.cli import main

    entry = _fwd_entry(SMALL, real["small"], [{"config": SMALL, "static_profile": real["small"]}])
    path = _database(tmp_path / "mi300x.json", {FWD_KEY: entry})
    monkeypatch.setenv("COLUMNS", "80")
    rc = main(["check-db", "--gpu", GPU, "--db", path, "--cache-dir", real["cache"]])
    out = capsys.readouterr().out
    assert rc == 0 and "holds" in out and FWD_KEY[:12] in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_the_tune_time_record_reads_the_compile_cache_and_compiles_nothing(real):
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.static.db_record import record_entry

    other = KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=2, num_stages=1).to_dict()  # never compiled here
    entry = _fwd_entry(SMALL, None, [{"config": SMALL}, {"config": other}])
    del entry["static_profile"], entry["compiler"]
    assert record_entry(get_gpu(GPU), FWD_KEY, entry, real["cache"]) is True
    assert entry["static_profile"] == real["small"] and entry["ranked"][0]["static_profile"] == real["small"]
    assert "static_profile" not in entry["ranked"][1]  # not in the cache: no profile, and no compile for it
    assert entry["compiler"]["backend"] == "hip" and entry["compiler"]["triton"]
    cold = _fwd_entry(other, None, [])
    del cold["static_profile"], cold["compiler"]
    assert record_entry(get_gpu(GPU), FWD_KEY, cold, real["cache"]) is False and "compiler" not in cold


def test_static_tunes_store_the_record_from_their_own_static_phase(real, tmp_path):
    """A forward and a decode tune without a GPU (static ranking only) write the record beside each kept config,
    from the observations their static phase put in the cache (the module's: nothing is compiled)."""
    from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
    from rocmflash.tuning.decode import DecodeProblem
    from rocmflash.tuning.decode_run import tune_decode
    from rocmflash.tuning.run import tune
    from rocmflash.tuning.spec import TuneSpec

    db = str(tmp_path / "mi300x.json")
    space = ConfigSpace({"online": {"BLOCK_M": [64], "BLOCK_N": [32, 64], "num_warps": [4], "num_stages": [1]}},
                        DEFAULT_RESTRICTIONS)
    tune(TuneSpec(gpu=GPU, head_dim=64, dtype="fp16", seqlens=[4096], causal=False, space=space, db_path=db,
                  cache_dir=real["cache"], workers=1, seeds=False), progress=False)
    tune_decode(GPU, DecodeProblem(**DECODE_PROBLEM).validate(), db_path=db, cache_dir=real["cache"], workers=1,
                configs=[DECODE_BEST])
    with open(db, encoding="utf-8") as f:
        data = json.load(f)
    assert data["schema_version"] == 2
    fwd, decode = data["entries"][FWD_KEY], data["entries"][DECODE_KEY]
    by_config = {json.dumps(SMALL, sort_keys=True): real["small"], json.dumps(WIDER, sort_keys=True): real["wider"]}
    assert fwd["static_profile"] == by_config[json.dumps(fwd["best"], sort_keys=True)]
    assert [r["static_profile"] for r in fwd["ranked"]] == [by_config[json.dumps(r["config"], sort_keys=True)]
                                                            for r in fwd["ranked"]]
    assert decode["static_profile"] == real["decode"]
    assert fwd["compiler"]["llvm_hash"] and fwd["compiler"] == decode["compiler"]


# ---------------------------------------------------------------------- bad input
def test_bad_input_is_one_line(tmp_path, capsys):
    from rocmflash.cli import main

    cases = [(["--gpu", "mi301x"], "unknown GPU 'mi301x'; known GPUs: "),
             (["--gpu", GPU, "--db", str(tmp_path)], "is a directory"),
             (["--gpu", GPU, "--db", str(tmp_path / "none.json")], "no such file")]
    malformed = tmp_path / "bad.json"
    malformed.write_text("{not json")
    cases.append((["--gpu", GPU, "--db", str(malformed)], "not valid JSON"))
    other = _database(tmp_path / "h100.json", {})
    cases.append((["--gpu", "h100", "--db", other], "holds configs for 'mi300x', not 'h100'"))
    future = tmp_path / "future.json"
    future.write_text(json.dumps({"format": "rocmflash-config-db", "schema_version": 3, "gpu": GPU, "entries": {}}))
    cases.append((["--gpu", GPU, "--db", str(future)], "schema version 3, this rocmflash reads 1 and 2"))
    for args, message in cases:
        assert main(["check-db", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err


def test_the_journal_keeps_its_schema_and_a_saved_v1_database_becomes_v2(tmp_path):
    from rocmflash.db.files import JOURNAL_SCHEMA_VERSION, SCHEMA_VERSION, ConfigDB, Journal

    path = _database(tmp_path / "mi300x.json", {}, schema=1)
    db = ConfigDB.open(path, GPU, "gfx942", {"triton": "3.6.0"})
    db.put(FWD_KEY, _fwd_entry(SMALL, None, []))
    db.save()
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["schema_version"] == SCHEMA_VERSION == 2
    journal = Journal(str(tmp_path / "mi300x.journal.jsonl"), GPU)
    with open(journal.path, encoding="utf-8") as f:
        assert json.loads(f.readline())["schema_version"] == JOURNAL_SCHEMA_VERSION == 1


def test_a_record_that_is_not_an_object_makes_the_entry_malformed():
    from rocmflash.db.entries import Malformed, check_entry

    entry = _fwd_entry(SMALL, None, [])
    assert check_entry(FWD_KEY, entry)["best"] == SMALL  # a null record: as a schema-1 entry
    for name in ("static_profile", "compiler"):
        with pytest.raises(Malformed, match=f"'{name}' is a list, expected an object"):
            check_entry(FWD_KEY, dict(entry, **{name: [1]}))


def test_judge_build_unrecorded_measured_and_recorded_in_loop_spills(real):
    from rocmflash.static.check_db import judge_build

    obs = copy.deepcopy(real["observations"][0])
    kernel = obs["kernels"][0]
    assert judge_build(static_profile(obs), obs) == ("holds", True, [])
    kernel.update(vgpr_spill_count=20, scratch_bytes=96, scratch_asm_known=False)  # a spill of unknown place
    verdict, holds, _ = judge_build(None, obs)
    assert holds is False and verdict.startswith("unrecorded, fails now: spills")
    # a winner timed on a GPU with that spill (the H100 backward's default) is not failed for it
    assert judge_build(None, obs, measured=True) == ("unrecorded, holds now", True, [])
    kernel.update(scratch_bytes=32, scratch_asm_known=True, scratch_loads=1, scratch_stores=1, scratch_loop_loads=1,
                  scratch_loop_stores=0, scratch_loop_bytes=4)
    assert judge_build(None, obs, measured=True)[1] is False  # in the loop: no measurement excuses it
    verdict, holds, _ = judge_build(static_profile(obs), obs)  # recorded as it is: still never served
    assert holds is False and verdict.startswith("fails now as recorded: spills: 1 scratch ops in the loop")
    transient = {"status": "failed", "error": "compile timed out after 180 s (worker killed)", "transient": True,
                 "kernels": []}
    assert judge_build(None, transient)[:2] == ("cannot check: compile timed out after 180 s (worker killed)", None)


def test_an_explained_drift_is_reported_but_does_not_fail_and_a_stale_one_is_named(real, tmp_path, capsys):
    """``--explained``: a failing served config listed for this GPU and Triton is reported with its why and exit 0;
    one listed for another Triton still fails; a listed entry that holds is named stale; a bad file is one line."""
    import triton

    from rocmflash.cli import main
    from rocmflash.static.check_db import explanation

    small, wider = real["small"], real["wider"]
    claimed = dict(small, waves_per_simd=small["waves_per_simd"] + 1)
    entries = {FWD_KEY: _fwd_entry(SMALL, claimed, [{"config": SMALL, "static_profile": claimed}]),
               OTHER_KEY: dict(_fwd_entry(WIDER, wider, [{"config": WIDER, "static_profile": wider}]),
                               problem={"head_dim": 64, "dtype": "fp16", "causal": False, "gqa_ratio": 1,
                                        "seqlen_bucket": 2048})}
    path = _database(tmp_path / "mi300x.json", entries)
    minor = ".".join(triton.__version__.split(".")[:2])

    def explained(version, keys):
        file = tmp_path / f"explained-{version}.json"
        file.write_text(json.dumps({"explained": [{"triton": version, "gpu": GPU, "key": k, "why": f"why {k}"}
                                                  for k in keys]}))
        return str(file)

    rc, report = _check(path, real["cache"], "--explained", explained(minor, [FWD_KEY, OTHER_KEY]), capsys=capsys)
    assert rc == 0 and report["failing"] == [] and report["explained"] == [[path, FWD_KEY, f"why {FWD_KEY}"]]
    assert [item["key"] for item in report["stale"]] == [OTHER_KEY]
    rc, report = _check(path, real["cache"], "--explained", explained("2.9", [FWD_KEY]), capsys=capsys)
    assert rc == 1 and report["failing"] == [[path, FWD_KEY]] and report["explained"] == []
    assert explanation([{"triton": "3.9", "gpu": GPU, "key": "k", "why": "w"}], "3.9.0", GPU, "k") == "w"
    assert explanation([{"triton": "3.9", "gpu": GPU, "key": "k", "why": "w"}], "3.10.0", GPU, "k") is None
    bad = tmp_path / "bad.json"
    bad.write_text('{"explained": [{"triton": "3.9"}]}')
    assert main(["check-db", "--gpu", GPU, "--db", path, "--explained", str(bad)]) != 0
    err = capsys.readouterr().err
    assert "item 0 needs non-empty strings triton, gpu, key and why" in err and len(err.strip().splitlines()) == 1
