"""Configs that compile to one code object: one representative each, in the tune's live phase and in vgpr-report
(real gfx942 compiles with the installed Triton)."""

import pytest

from rocmflash.config import KernelConfig, Problem
from rocmflash.hw.gpus import get_gpu
from rocmflash.static.compile import sweep
from rocmflash.static.dedupe import binary_twins, distinct
from rocmflash.static.prune import Verdict, prune
from rocmflash.static.space import ConfigSpace

D128 = Problem(head_dim=128)
FITS = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8)
#: 8 waves per workgroup already force 2 waves/SIMD: LLVM ignores waves_per_eu=1 (tests/test_static_prune.py)
SPACE = ConfigSpace({"online": {"BLOCK_M": [128], "BLOCK_N": [64], "num_warps": [8], "waves_per_eu": [0, 1],
                                "schedule_hint": ["none", "local-prefetch"]},
                     "two_phase": {"BLOCK_M": [128], "BLOCK_N": [64], "num_warps": [8]}})
#: not in the space; same binary as FITS at D=128 (a power of two needs no padding)
SEED = ("ref-pad", FITS.replace(pad_head_dim=True))


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    from rocmflash.tuning.static import static_phase

    gpu = get_gpu("mi300x")
    return static_phase(gpu, D128, SPACE, cache_dir=str(tmp_path_factory.mktemp("dedupe-cache")), workers=2,
                        seeds=(SEED,))


def _sha(cand):
    return cand.observation.get("binary_sha256")


def test_the_space_holds_real_duplicates(static):
    shas = [_sha(c) for c in static.candidates if _sha(c)]
    assert len(shas) > len(set(shas)) >= 2  # some configs share a binary, and not every config does


def test_each_duplicate_points_at_its_representative(static):
    cands = static.candidates
    for i, c in enumerate(cands):
        if c.duplicate_of is None:
            assert all(_sha(o) != _sha(c) for o in cands[:i] if o.duplicate_of is None) or not _sha(c)
        else:
            rep = cands[c.duplicate_of]
            assert _sha(rep) == _sha(c) and rep.duplicate_of is None and not c.kept
            assert rep.kept or not any(o.kept for o in cands if _sha(o) == _sha(c))
            if c.reason == "duplicate_binary":
                assert f"#{c.duplicate_of}" in c.detail  # the pruner names the same kept config


def test_the_live_phase_never_times_one_binary_twice(static):
    from rocmflash.tuning.strategies import choose, race_field, seeded

    for name, timed in (("exhaustive", choose("exhaustive", static, None)), ("pruned", choose("pruned", static, 50)),
                        ("race", race_field(static))):
        shas = [_sha(c) for c in timed if _sha(c)]
        assert len(shas) == len(set(shas)), name
    every = {_sha(c) for c in static.candidates if _sha(c)}
    assert {_sha(c) for c in choose("exhaustive", static, None) if _sha(c)} == every  # yet every binary is timed
    # the seed compiled to a space config's binary: it is timed as that config, under its reference id
    (timed_seed,) = seeded(static)
    seed_cand = next(c for c in static.candidates if c.config == SEED[1])
    assert _sha(seed_cand) == _sha(timed_seed) and seed_cand.duplicate_of is not None
    assert timed_seed is static.candidates[seed_cand.duplicate_of] and timed_seed.seed == SEED[0]


def test_representative_is_the_first_kept_config():
    obs = [{"binary_sha256": "a"}, {"binary_sha256": "a"}, {"binary_sha256": "b"}, {"binary_sha256": None},
           {"binary_sha256": "a"}]
    assert binary_twins(obs) == [None, 0, None, None, 0]
    verdicts = [Verdict(False, "below_occupancy_floor", ""), Verdict(True, None, ""), Verdict(False, "spills", ""),
                Verdict(False, "compile_failed", ""), Verdict(False, "duplicate_binary", "")]
    assert binary_twins(obs, verdicts) == [1, None, None, None, 1]
    with pytest.raises(ValueError, match="one verdict per observation"):
        binary_twins(obs, verdicts[:2])
    cands = [type("C", (), {"duplicate_of": t})() for t in (None, 0, None)]
    assert distinct([cands[1], cands[2], cands[0]], cands) == [cands[0], cands[2]]


def test_vgpr_report_marks_duplicates_without_changing_verdicts(tmp_path):
    import csv

    from rocmflash.static.prune import PruneSettings
    from rocmflash.static.report import reason_counts, rows_from_sweep, write_csv
    from rocmflash.static.vgpr_report import markdown

    gpu = get_gpu("mi300x")
    configs = SPACE.configs(D128, gpu)
    observations, stats = sweep(configs, D128, gpu, cache_dir=str(tmp_path), workers=2)
    verdicts = prune(observations)
    rows = rows_from_sweep(configs, observations, verdicts)
    assert [r["verdict"] for r in rows] == [v.label for v in verdicts]  # the column adds, it never re-judges
    assert [r["reason"] for r in rows] == [v.reason for v in verdicts]
    assert [r["duplicate_of"] for r in rows] == binary_twins(observations, verdicts)
    dups = [r for r in rows if r["duplicate_of"] is not None]
    assert dups and all(rows[r["duplicate_of"]]["duplicate_of"] is None for r in dups)
    write_csv(rows, str(tmp_path / "configs.csv"))
    with open(tmp_path / "configs.csv", newline="", encoding="utf-8") as f:
        written = [r["duplicate_of"] for r in csv.DictReader(f) if r["duplicate_of"] != ""]
    assert [int(v) for v in written] == [r["duplicate_of"] for r in dups]  # int(): "12.0" would fail here
    text = markdown(rows, stats, [], gpu, D128, PruneSettings(), "test")
    assert f"{len(dups)} config(s) compiled to the same code object" in text
    assert reason_counts(rows)["kept"] == sum(v.kept for v in verdicts)
