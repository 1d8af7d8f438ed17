"""What each Triton does with the AMD options (rocmflash/config.py's table), checked on the installed Triton's
real gfx942/gfx950 compiles; validation by arch and Triton version; the pruner's waves_per_eu excuse; the
gfx950 two-stage space."""

import warnings

import pytest

from rocmflash import db as D
from rocmflash.static.autotune import early_config_prune, kernel_config_from_triton
from rocmflash.static.compile import sweep
from rocmflash.config import (SCHEDULE_HINTS, KernelConfig, Problem, installed_triton_version, schedule_hint_semantics,
                              triton_minor, waves_per_eu_is_exact)
from rocmflash.hw.gpus import get_gpu
from rocmflash.static.prune import PruneSettings, judge, occupancy_was_asked_for, prune
from rocmflash.static.space import default_space

TRITON = installed_triton_version()
D128 = Problem(head_dim=128)
BASE = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4)
#: hints whose effect the table calls arch-dependent on that Triton (neither "ignored" nor "applied")
UNSETTLED = {(3, 4): {"memory-bound-attention", "local-prefetch"}}


def _gfx950_stage_pair():
    """A two-stage config of the mi355x D128 space and its one-stage twin."""
    gpu = get_gpu("mi355x")
    two = next(c for c in default_space(gpu).configs(D128, gpu)
               if c.num_stages == 2 and (c.BLOCK_M, c.BLOCK_N, c.num_warps, c.waves_per_eu) == (128, 64, 4, 2))
    return two, two.replace(num_stages=1)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """``{(gpu, label): observation}`` of real compiles with the installed Triton (two sweeps, one per target)."""
    cache = str(tmp_path_factory.mktemp("semantics-cache"))
    gfx942 = {"none": BASE, "wpe1": BASE.replace(waves_per_eu=1)}
    for hint in SCHEDULE_HINTS[1:]:
        cfg = BASE.replace(schedule_hint=hint)
        try:
            cfg.validate(arch="gfx942", triton_version=TRITON)
        except ValueError:
            continue  # this Triton cannot build it (3.4: local-prefetch at one stage); validate says so
        gfx942[hint] = cfg
    two, one = _gfx950_stage_pair()
    gfx950 = {"kpack1": BASE, "kpack2": BASE.replace(kpack=2), "stages2": two, "stages1": one}
    out = {"cache": cache}
    for name, configs in (("mi300x", gfx942), ("mi355x", gfx950)):
        observations, _ = sweep(list(configs.values()), D128, get_gpu(name), cache_dir=cache, workers=2)
        out.update({(name, label): obs for label, obs in zip(configs, observations)})
    return out


# ------------------------------------------------------------------ the table against the compiler
def test_schedule_hint_table_matches_the_installed_triton(compiled):
    none = compiled[("mi300x", "none")]["binary_sha256"]
    checked = 0
    for hint in SCHEDULE_HINTS[1:]:
        if ("mi300x", hint) not in compiled or hint in UNSETTLED.get(triton_minor(TRITON), ()):
            continue
        obs = compiled[("mi300x", hint)]
        assert obs["status"] == "ok", obs["error"]
        ignored = schedule_hint_semantics(hint).startswith("ignored")
        assert (obs["binary_sha256"] == none) == ignored, (TRITON, hint, schedule_hint_semantics(hint))
        checked += 1
    assert checked >= 2


def test_waves_per_eu_one_is_the_binary_of_zero_exactly_where_it_is_min_only(compiled):
    same = compiled[("mi300x", "wpe1")]["binary_sha256"] == compiled[("mi300x", "none")]["binary_sha256"]
    assert same == (not waves_per_eu_is_exact(TRITON)), TRITON
    assert waves_per_eu_is_exact("3.6.0") and waves_per_eu_is_exact("3.9.0")
    assert not waves_per_eu_is_exact("3.5.1") and not waves_per_eu_is_exact("3.4.0+rocm")


def test_kpack2_on_gfx950_never_builds_kpack2(compiled):
    """Triton 3.4 refuses it; 3.5+ builds the kpack=1 binary: either way kpack=2 is not what it builds."""
    two, one = compiled[("mi355x", "kpack2")], compiled[("mi355x", "kpack1")]
    if triton_minor(TRITON) < (3, 5):
        assert two["status"] == "failed" and "kpack" in two["error"]
    else:
        assert two["binary_sha256"] == one["binary_sha256"]
    verdicts = prune([one, two])  # the pruner keeps one of them
    assert [v.kept for v in verdicts] == [True, False]


# ------------------------------------------------------------------ validation by arch and Triton version
def test_validate_rejects_kpack2_on_gfx950_in_one_line():
    cfg = KernelConfig(kpack=2)
    for arch in ("gfx950", "gfx950:sramecc+:xnack-"):
        with pytest.raises(ValueError, match=r"kpack=2 is invalid on gfx950; expected 1") as err:
            cfg.validate(arch=arch, triton_version=TRITON)
        assert "\n" not in str(err.value)
    assert cfg.validate(arch="gfx942") is cfg and cfg.validate() is cfg  # other archs, and no arch: as before
    with pytest.raises(TypeError, match="arch"):
        cfg.validate(arch=950)


def test_validate_knows_what_older_tritons_misread():
    combo = KernelConfig(schedule_hint="attention,memory-bound-attention")
    assert combo.validate(triton_version="3.6.0") is combo
    with pytest.raises(ValueError, match="schedule_hint.*Triton 3.5.1.*single value"):
        combo.validate(triton_version="3.5.1")
    prefetch = KernelConfig(schedule_hint="local-prefetch")
    with pytest.raises(ValueError, match="local-prefetch.*num_stages"):
        prefetch.validate(triton_version="3.4.0")
    assert prefetch.replace(num_stages=2).validate(triton_version="3.4.0").num_stages == 2
    assert prefetch.validate(triton_version="3.9.0") is prefetch  # ignored there, not an error
    with pytest.raises(ValueError, match="triton_version='three' is invalid"):
        prefetch.validate(triton_version="three")


def test_autotune_reads_triton_configs_for_the_arch(tmp_path):
    import torch
    import triton

    kp1 = triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=1)
    kp2 = triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "kpack": 2}, num_warps=4, num_stages=1)
    assert kernel_config_from_triton(kp2).kpack == 2  # no arch: as before
    with pytest.raises(ValueError, match="kpack=2 is invalid on gfx950"):
        kernel_config_from_triton(kp2, arch="gfx950", triton_version=TRITON)
    hook = early_config_prune(gpu="mi355x", cache_dir=str(tmp_path), workers=1)
    q = torch.empty(1, 16, 2048, 128, dtype=torch.float16)
    with pytest.warns(RuntimeWarning, match="dropped 1 config.*kpack=2 is invalid on gfx950"):
        kept = hook([kp1, kp2], {"Q": q, "K": q, "V": q})
    assert kept == [kp1]
    with pytest.raises(ValueError, match="no config can be built for gfx950"):
        hook([kp2], {"Q": q, "K": q, "V": q})


def test_db_entry_the_arch_cannot_build_is_skipped_with_a_warning(tmp_path):
    """A gfx950 database whose nearest entry holds kpack=2: the lookup warns and serves the next entry."""
    path = str(tmp_path / "mi355x.json")
    store = D.ConfigDB.open(path, "mi355x", "gfx950", D.environment("test device"))
    bad, good = KernelConfig(kpack=2), KernelConfig(BLOCK_M=64)
    for bucket, cfg in ((2048, bad), (4096, good)):
        store.put(D.problem_key(128, "fp16", False, 1, bucket), {"best": cfg.to_dict(), "measured": True})
    store.save()
    with pytest.warns(RuntimeWarning, match=r"skipping entry 'd128-fp16-full-gqa1-s2048' in .*kpack=2 is invalid on gfx950"):
        assert D.lookup("mi355x", 128, "fp16", False, 1, 2048, db_path=path) == good
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same entry is reported once
        assert D.lookup("mi355x", 128, "fp16", False, 1, 1024, db_path=path) == good
    other = str(tmp_path / "mi300x.json")  # kpack=2 is a gfx942 config like any other
    store = D.ConfigDB.open(other, "mi300x", "gfx942", D.environment("test device"))
    store.put(D.problem_key(128, "fp16", False, 1, 2048), {"best": bad.to_dict(), "measured": True})
    store.save()
    assert D.lookup("mi300x", 128, "fp16", False, 1, 2048, db_path=other) == bad


# ------------------------------------------------------------------ the pruner's waves_per_eu excuse
def test_min_only_waves_per_eu_earns_no_occupancy_excuse(tmp_path):
    """AMD's 128x64, 4 warps, waves_per_eu=1 tile runs at one wave; kept as asked only where the request is exact."""
    asked = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, waves_per_eu=1)
    (obs,), _ = sweep([asked], Problem(head_dim=128, dtype="bf16"), get_gpu("mi300x"), cache_dir=str(tmp_path),
                      workers=1)
    assert obs["kernels"][0]["waves_per_simd"] == 1
    assert not occupancy_was_asked_for(obs, "3.5.1") and not occupancy_was_asked_for(obs, "3.4.0")
    assert judge(obs, PruneSettings(triton_version="3.5.1")).reason == "below_occupancy_floor"
    assert occupancy_was_asked_for(obs, "3.6.0") and occupancy_was_asked_for(obs, "3.9.0")
    if waves_per_eu_is_exact(TRITON):  # the installed Triton compiled it: its own verdict follows its semantics
        verdict = judge(obs)
        assert verdict.kept and "as its waves_per_eu=1 asks" in verdict.detail


# ------------------------------------------------------------------ gfx950: two stages behind the static checks
def test_gfx950_space_tries_two_stages_and_the_others_keep_one():
    gfx950 = get_gpu("mi355x")
    configs = default_space(gfx950).configs(D128, gfx950)
    assert {c.num_stages for c in configs if c.variant == "online"} == {1, 2}
    assert sum(c.num_stages == 2 for c in configs) == sum(c.num_stages == 1 and c.variant == "online" for c in configs)
    for name in ("mi250", "mi300x"):
        gpu = get_gpu(name)
        space = default_space(gpu).configs(D128, gpu)
        assert {c.num_stages for c in space} == {1}
    mi250 = get_gpu("mi250")
    assert len(default_space(mi250).configs(D128, mi250)) == 408  # README's first command compiles 408


def test_gfx950_two_stage_config_compiles_and_is_judged(compiled):
    """A real gfx950 compile of a two-stage space config, judged by the tune's static phase like any other."""
    from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace
    from rocmflash.tuning.static import static_phase

    two, one = compiled[("mi355x", "stages2")], compiled[("mi355x", "stages1")]
    assert two["status"] == "ok", two["error"]
    main2, main1 = two["kernels"][0], one["kernels"][0]
    # the second stage is a second K/V buffer in LDS: more LDS than the one-stage build of the same tile
    assert main2["lds_bytes"] + main2["dynamic_lds_bytes"] > main1["lds_bytes"] + main1["dynamic_lds_bytes"]
    cfg = KernelConfig.from_dict(two["config"])
    knobs = {k: [getattr(cfg, k)] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "waves_per_eu", "matrix_instr_nonkdim")}
    space = ConfigSpace({"online": dict(knobs, num_stages=[1, 2])}, DEFAULT_RESTRICTIONS)
    gpu = get_gpu("mi355x")
    static = static_phase(gpu, D128, space, cache_dir=compiled["cache"], workers=1)
    assert static.stats.compiled == 0  # the same builds as above (cached): the static phase reads them
    cand = next(c for c in static.candidates if c.config.num_stages == 2)
    assert cand.observation["binary_sha256"] == two["binary_sha256"]
    assert cand.reason == judge(two).reason and cand.detail  # a verdict with its reason
    assert (cand.static_rank is not None) == cand.kept
