"""KernelConfig / Problem records: validation, backend options, JSON round-trip, defaults."""

import json

import pytest

from rocmflash.config import KernelConfig, Problem, default_config


def test_json_round_trip_keeps_field_names():
    cfg = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2, PRE_LOAD_V=True, variant="split_kv",
                       num_splits=4, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2,
                       schedule_hint="attention")
    d = json.loads(cfg.to_json())
    for key in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "waves_per_eu"):
        assert key in d
    assert KernelConfig.from_json(cfg.to_json()) == cfg
    assert KernelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("field,value", [
    ("BLOCK_M", 48), ("BLOCK_N", 0), ("num_warps", 3), ("num_stages", 0), ("variant", "fast"),
    ("num_splits", -1), ("d_chunks", 3), ("waves_per_eu", 11), ("matrix_instr_nonkdim", 8), ("kpack", 4),
    ("schedule_hint", "atention"), ("schedule_hint", "none,attention"), ("PRE_LOAD_V", 1),
])
def test_validate_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        KernelConfig(**{field: value}).validate()


def test_unknown_json_key_is_an_error_not_dropped():
    with pytest.raises(ValueError, match="waves_per_cu"):
        KernelConfig.from_dict({"BLOCK_M": 64, "waves_per_cu": 2})


def test_compile_options_per_backend():
    cfg = KernelConfig(waves_per_eu=2, kpack=2, schedule_hint="memory-bound-attention")
    hip = cfg.compile_options("hip")
    assert hip == dict(num_warps=4, num_stages=1, enable_fp_fusion=True, waves_per_eu=2, matrix_instr_nonkdim=0,
                       kpack=2, schedule_hint="memory-bound-attention")
    assert cfg.compile_options("cuda") == dict(num_warps=4, num_stages=1, enable_fp_fusion=True)
    with pytest.raises(ValueError, match="backend"):
        cfg.compile_options("metal")


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950", "sm_90", "sm_80", None])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_default_configs_are_valid(arch, D):
    cfg = default_config(arch, D, "two_phase")
    assert cfg.validate().variant == "two_phase"


def test_problem_validation():
    assert Problem(head_dim=80, dtype="bfloat16").dtype == "bf16"
    assert Problem(heads_q=32, heads_kv=4).gqa_ratio == 8
    with pytest.raises(ValueError, match="head_dim"):
        Problem(head_dim=512)
    with pytest.raises(ValueError, match="heads_q"):
        Problem(heads_q=6, heads_kv=4)
    with pytest.raises(ValueError, match="dtype"):
        Problem(dtype="fp32")
