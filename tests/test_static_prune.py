"""Every pruning rule on real compiles (gfx942/gfx950 code objects), and the triton.autotune hook."""

import pytest

from rocmflash.config import KernelConfig, Problem
from rocmflash.hw.gpus import get_gpu
from rocmflash.static.autotune import early_config_prune, kernel_config_from_triton
from rocmflash.static.compile import sweep
from rocmflash.static.prune import KEPT_ANYWAY, PruneSettings, judge, prune

D128 = Problem(head_dim=128)
D256 = Problem(head_dim=256)

# Each case: (label, config, problem) chosen so that the compiler's output triggers one rule.
CASES = {
    "fits": (KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8), D128),
    "fits_again_wpe1": (KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, waves_per_eu=1), D128),
    "fits_again_pad": (KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, pad_head_dim=True), D128),
    "spills": (KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4, waves_per_eu=4), D128),
    # one wave, no spill, not asked for, with Triton 3.6 (404 VGPRs) and 3.9 (360); 128x64 w4, used before,
    # fits two waves with 3.9 since the static phase compiles buffer loads as a launch does
    "one_wave": (KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4), D128),
    # 68 KiB on gfx942 and no spill with Triton 3.6 and 3.9; gfx950 takes 68 KiB (3.6) to 104 KiB (3.9),
    # inside its 160 KiB (3.9 grew the 3-stage 64x64 tile used before to 207 KiB there)
    "big_lds": (KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3), D256),
}


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("static-cache"))
    out = {}
    for arch_gpu in ("mi300x", "mi355x"):
        gpu = get_gpu(arch_gpu)
        for label, (cfg, problem) in CASES.items():
            (obs,), _ = sweep([cfg], problem, gpu, cache_dir=cache, workers=1)
            assert obs["status"] == "ok", obs["error"]
            out[(arch_gpu, label)] = obs
    return out


def test_kept_config_is_kept(observed):
    verdict = judge(observed[("mi300x", "fits")])
    assert verdict.kept and verdict.reason is None


def test_spills_rule(observed):
    obs = observed[("mi300x", "spills")]
    assert obs["kernels"][0]["vgpr_spill_count"] > 0  # the compiler really spilled
    assert obs["kernels"][0]["scratch_loop_loads"] > 0  # the assembly reloads spilled values inside the KV loop
    verdict = judge(obs)
    assert (verdict.kept, verdict.reason) == (False, "spills") and "inside the loop" in verdict.detail
    assert judge(obs, PruneSettings(allow_spills=True)).reason != "spills"


def test_below_occupancy_floor_rule(observed):
    obs = observed[("mi300x", "one_wave")]
    assert obs["kernels"][0]["waves_per_simd"] == 1
    assert judge(obs).reason == "below_occupancy_floor"
    assert judge(obs, PruneSettings(occupancy_floor=1)).kept


def test_one_wave_asked_for_is_kept(tmp_path):
    """AMD's autotune lists (ROCm/triton perf-kernels, flash-attention, vLLM) carry 128x64, 4 warps, waves_per_eu=1.

    It runs at one wave by request and is kept; a floor the user sets prunes it. The same tile
    without the request is judged by the floor as before: with Triton 3.6 it lands at one wave
    too (the same registers) and is pruned; Triton 3.9 fits it in two waves, and it is kept.
    """
    problem = Problem(head_dim=128, dtype="bf16")
    for name in ("mi300x", "mi355x"):
        asked, unasked = (KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, waves_per_eu=w) for w in (1, 0))
        (obs_asked, obs_unasked), _ = sweep([asked, unasked], problem, get_gpu(name), cache_dir=str(tmp_path),
                                            workers=1)
        assert obs_asked["kernels"][0]["waves_per_simd"] == 1
        verdict = judge(obs_asked)
        assert verdict.kept and "as its waves_per_eu=1 asks" in verdict.detail, verdict
        assert judge(obs_asked, PruneSettings(occupancy_floor=2)).reason == "below_occupancy_floor"
        unasked_waves = obs_unasked["kernels"][0]["waves_per_simd"]
        assert (judge(obs_unasked).reason == "below_occupancy_floor") == (unasked_waves < 2), unasked_waves


@pytest.fixture(scope="module")
def online_sweep(tmp_path_factory):
    """A slice of the real gfx942 online space: wherever the cliffs fall today, some config lands near one."""
    from rocmflash.static.space import default_space

    gpu = get_gpu("mi300x")
    problem = Problem(head_dim=128, dtype="bf16")
    configs = [c for c in default_space(gpu, ["online"]).configs(problem, gpu) if c.kpack == 1 and not c.PRE_LOAD_V]
    observations, _ = sweep(configs, problem, gpu, cache_dir=str(tmp_path_factory.mktemp("cliff-cache")))
    return observations


def test_cliff_victim_rule(online_sweep):
    victims = [o for o in online_sweep if judge(o).reason == "cliff_victim"]
    assert victims, "no config of the slice is a cliff victim"
    obs = victims[0]
    main = obs["kernels"][0]
    assert 0 < main["vgprs_past_cliff"] <= 16, main
    assert obs["config"]["waves_per_eu"] != main["waves_per_simd"]  # the compiler fell there, nobody asked
    verdict = judge(obs)
    assert verdict.reason == "cliff_victim" and "past the" in verdict.detail
    assert judge(obs, PruneSettings(cliff_margin=main["vgprs_past_cliff"] - 1)).kept


def test_registers_past_a_cliff_that_were_asked_for_are_kept(online_sweep):
    """waves_per_eu=N lets LLVM use the registers of N waves: sitting past the N+1 cliff is the request, not a slip."""
    asked = [o for o in online_sweep
             if 0 < (o["kernels"][0]["vgprs_past_cliff"] or 0) <= 16 and o["status"] == "ok"
             and o["config"]["waves_per_eu"] == o["kernels"][0]["waves_per_simd"] and not o["kernels"][0]["scratch_bytes"]]
    assert asked, "no config of the slice sits past a cliff at the occupancy it asked for"
    for obs in asked:
        verdict = judge(obs)
        assert verdict.kept and "asks" in verdict.detail, verdict


def test_cliff_rule_ignores_cliffs_that_cost_nothing(observed):
    # With 8-wave workgroups the register cliff is hidden behind workgroup quantisation.
    for (gpu, label), obs in observed.items():
        main = obs["kernels"][0]
        if main["num_warps"] == 8 and main["vgprs_past_cliff"] and judge(obs).kept:
            return
    pytest.skip("no 8-warp config past a cliff in this matrix")


def test_lds_over_budget_depends_on_the_arch(observed):
    gfx942 = observed[("mi300x", "big_lds")]
    gfx950 = observed[("mi355x", "big_lds")]
    lds = gfx942["kernels"][0]["dynamic_lds_bytes"]
    assert 64 * 1024 < lds <= 160 * 1024
    assert judge(gfx942).reason == "lds_over_budget"
    assert judge(gfx950).reason != "lds_over_budget"  # gfx950 has 160 KiB of LDS
    assert judge(observed[("mi300x", "fits")], PruneSettings(lds_budget=1024)).reason == "lds_over_budget"


def test_duplicate_binary_rule(observed):
    group = [observed[("mi300x", k)] for k in ("fits", "fits_again_wpe1", "fits_again_pad")]
    assert len({o["binary_sha256"] for o in group}) == 1  # the compiler made one binary of three configs
    verdicts = prune(group)
    assert [v.reason for v in verdicts] == [None, "duplicate_binary", "duplicate_binary"]


def test_compile_failed_rule_from_a_real_timeout(tmp_path):
    (obs,), stats = sweep([KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4)], D128, get_gpu("mi250"),
                          cache_dir=str(tmp_path), workers=1, timeout_s=0.01)
    assert obs["status"] == "failed" and "timed out" in obs["error"]
    assert judge(obs).reason == "compile_failed"
    # a timeout is transient: it is not cached, the next sweep compiles again
    (again,), stats = sweep([KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4)], D128, get_gpu("mi250"),
                            cache_dir=str(tmp_path), workers=1)
    assert again["status"] == "ok" and stats.compiled == 1


def test_never_returns_empty(observed):
    doomed = [observed[("mi300x", k)] for k in ("spills", "one_wave", "big_lds")]
    verdicts = prune(doomed)
    kept = [v for v in verdicts if v.kept]
    assert len(kept) == 1 and kept[0].reason == KEPT_ANYWAY
    best = max(o["kernels"][0]["waves_per_simd"] for o in doomed)
    assert doomed[verdicts.index(kept[0])]["kernels"][0]["waves_per_simd"] == best
    assert "every config was pruned" in kept[0].detail


def test_early_config_prune_hook_for_triton_autotune(tmp_path):
    import torch
    import triton

    configs = [triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=1),
               triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "waves_per_eu": 4}, num_warps=4, num_stages=1),
               triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "waves_per_eu": 1}, num_warps=8, num_stages=1)]
    assert kernel_config_from_triton(configs[1]).waves_per_eu == 4
    hook = early_config_prune(gpu="mi300x", cache_dir=str(tmp_path), workers=1)
    q = torch.empty(1, 16, 2048, 128, dtype=torch.float16)
    kept = hook(configs, {"Q": q, "K": q, "V": q})
    assert kept == [configs[0]]  # spills and duplicate binary pruned
