"""Compile-only builds: every variant for gfx90a, gfx942, gfx950 and sm_90 on a CPU-only box."""

import re

import pytest

from rocmflash.config import KernelConfig, Problem, default_config
from rocmflash.kernels import get_variant, registry
from rocmflash.kernels.common import head_dim_pieces

TARGETS = ["gfx90a", "gfx942", "gfx950", "sm_90"]
VARIANTS = ["online", "split_kv", "two_phase", "split_d"]


def _amd_regs(kernel):
    asm = kernel.asm["amdgcn"]
    vals = dict(re.findall(r"\.(vgpr_count|agpr_count|vgpr_spill_count|private_segment_fixed_size):\s+(\d+)", asm))
    return {k: int(v) for k, v in vals.items()}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_compiles_for_target(variant, target):
    cfg = default_config(target, 128, variant)
    kernels = get_variant(variant).compile_for(target, cfg, Problem(head_dim=128, causal=True, dtype="bf16"))
    assert len(kernels) == (2 if variant == "split_kv" else 1)
    assert [k.name for k in kernels] == ["_" + n.lstrip("_") for n in get_variant(variant).KERNELS]
    for k in kernels:
        if target.startswith("gfx"):
            assert k.metadata.target.arch == target
            regs = _amd_regs(k)
            assert regs["vgpr_count"] > 0
            # the triple's spelling changed with LLVM (amdgcn-amd-amdhsa--gfx90a -> amdgpu9.0a-...-unknown-gfx90a)
            assert re.search(rf'\.amdgcn_target "[^"]*-{target}(:[^"]*)?"', k.asm["amdgcn"])
        else:
            assert k.metadata.target.arch == 90
            assert "ptx" in k.asm and "cubin" in k.asm


@pytest.mark.parametrize("D, block_m", [(72, 64), (160, 128)])
def test_compile_non_pow2_head_dim_split_spills_less_than_padding(D, block_m):
    """D=72 (64+16) and D=160 (128+32): the split spills less than padding to 128/256 on gfx942.

    (At D=80/96 the two are within ~10% either way; see docs/evidence/attention-2026-11-21-h100.md. Compiled
    with buffer loads, as a launch is, D=72 at 128x64 spills in both forms -- 16 split,
    7 padded, Triton 3.6 -- a tile the pruner drops either way; at 64x64 the split fits
    and padding spills 18.)
    """
    cfg = KernelConfig(BLOCK_M=block_m, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2)
    prob = Problem(head_dim=D)
    mod = get_variant("online")
    split = _amd_regs(mod.compile_for("gfx942", cfg, prob)[0])
    padded = _amd_regs(mod.compile_for("gfx942", cfg.replace(pad_head_dim=True), prob)[0])
    if padded["vgpr_spill_count"] > 0:  # Triton 3.6's LLVM: padding spills, the split spills less
        assert split["vgpr_spill_count"] < padded["vgpr_spill_count"]
    else:  # newer LLVMs (Triton 3.7+) fit both: the split must not be the one that spills
        assert split["vgpr_spill_count"] == 0


def test_split_d_shrinks_the_accumulator_on_gfx942():
    """The claim the variants exist for: the output accumulator dominates VGPRs."""
    prob = Problem(head_dim=128)
    base = dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=1)
    online = _amd_regs(get_variant("online").compile_for("gfx942", KernelConfig(**base), prob)[0])
    split4 = _amd_regs(get_variant("split_d").compile_for(
        "gfx942", KernelConfig(**base, variant="split_d", d_chunks=4), prob)[0])
    assert split4["vgpr_count"] < online["vgpr_count"]


def test_compile_options_reach_the_amd_backend():
    k = get_variant("online").compile_for(
        "gfx942", KernelConfig(waves_per_eu=2, schedule_hint="attention", matrix_instr_nonkdim=16),
        Problem(head_dim=64))[0]
    assert k.metadata.waves_per_eu == 2
    assert k.metadata.schedule_hint == "attention"
    assert k.metadata.matrix_instr_nonkdim == 16


def test_registry_and_targets_by_name():
    assert set(registry()) == set(VARIANTS)
    with pytest.raises(ValueError, match="variant"):
        get_variant("nope")
    # a catalog GPU name works as a target
    k = get_variant("online").compile_for("mi300x", KernelConfig(), Problem(head_dim=64))[0]
    assert k.metadata.target.arch == "gfx942"


@pytest.mark.parametrize("D,expected", [(16, (16, 0)), (64, (64, 0)), (72, (64, 16)), (80, (64, 16)),
                                        (96, (64, 32)), (112, (128, 0)), (160, (128, 32)),
                                        (192, (128, 64)), (200, (256, 0)), (24, (32, 0)), (48, (32, 16))])
def test_head_dim_pieces(D, expected):
    assert head_dim_pieces(D) == expected
    d0, d1 = head_dim_pieces(D)
    assert d0 + d1 >= D and d0 & (d0 - 1) == 0 and (d1 == 0 or d1 >= 16)
    assert head_dim_pieces(D, pad=True)[1] == 0


def test_online_halves_head_dim_only_where_registers_are_scarce():
    """The two-halves rule: AMD's 128x64 w4 wpe2 at D>=128, not NVIDIA configs, 8 warps, small accumulators."""
    from rocmflash.kernels.forward import online as online

    def pieces(cfg, D):
        c = online._constexprs(cfg, D, True, False)
        return c["BLOCK_D0"], c["BLOCK_D1"]

    amd = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2)
    assert pieces(amd, 128) == (64, 64)
    assert pieces(amd.replace(BLOCK_N=128), 128) == (64, 64)
    assert pieces(amd.replace(BLOCK_M=64), 256) == (128, 128)
    assert pieces(amd, 64) == (64, 0)  # fits whole
    assert pieces(amd, 80) == (64, 16)  # already two pieces
    assert pieces(amd.replace(waves_per_eu=0), 128) == (128, 0)  # no occupancy target
    assert pieces(amd.replace(BLOCK_N=32), 128) == (128, 0)  # small V tile: halves only add addressing
    assert pieces(amd.replace(BLOCK_M=64), 128) == (128, 0)  # small accumulator
    assert pieces(amd.replace(BLOCK_M=256, num_warps=8), 128) == (128, 0)  # 8-element V halves per thread
    for D in (64, 128, 256):  # CUDA configs never carry waves_per_eu
        assert pieces(default_config("sm_90", D), D)[1] == 0


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("nonkdim", [0, 16])
def test_amd_default_tile_fits_without_spills(arch, D, causal, nonkdim):
    """AMD's default forward tile (aiter fwd.default, perf-kernels: 128x64 w4 s1 wpe2) needs no scratch.

    At D=128 on gfx942 it spilled 4 VGPRs before the head dim was halved (docs/evidence/amd-tiles-2026-11-23.md).
    """
    cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2,
                       matrix_instr_nonkdim=nonkdim)
    k = get_variant("online").compile_for(arch, cfg, Problem(head_dim=D, causal=causal, dtype="bf16"))[0]
    regs = _amd_regs(k)
    assert regs["vgpr_spill_count"] == 0
    assert "scratch_" not in k.asm["amdgcn"]


def test_online_half_width_masked_blocks_only_on_amd_wide_tiles():
    """online._masked_blocks: 128-wide key blocks at an occupancy target and a >= 64-VGPR accumulator run
    masked blocks 64 wide (first, but last with 16x16 MFMAs); narrower blocks, no target, small accumulators
    and every CUDA default keep them."""
    from rocmflash.kernels.forward import online as online

    def plan(cfg, D=128):
        c = online._constexprs(cfg, D, True, False)
        return c["MASKED_N"], c["MASKED_FIRST"]

    amd = KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=1, waves_per_eu=2)
    assert plan(amd) == (64, True)
    assert plan(amd.replace(matrix_instr_nonkdim=32)) == (64, True)
    assert plan(amd.replace(matrix_instr_nonkdim=16)) == (64, False)
    assert plan(amd.replace(BLOCK_M=256, num_warps=8)) == (64, True)
    assert plan(amd.replace(BLOCK_N=64)) == (64, False)  # AMD's default tile: unchanged
    assert plan(amd.replace(waves_per_eu=0)) == (128, False)
    assert plan(amd.replace(waves_per_eu=1)) == (128, False)
    assert plan(amd, 64) == (128, False)  # 32-VGPR accumulator: fits either way
    assert plan(amd, 192) == (64, True)
    for D in (64, 128, 256):
        cfg = default_config("sm_90", D)
        assert plan(cfg) == (cfg.BLOCK_N, False)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("nonkdim", [0, 16])
def test_amd_wide_tile_fits_gfx950(causal, nonkdim):
    """ROCm/flash-attention's gfx950 tile (128x128 w4 s1 wpe2) at D=128: no spill with Triton's MFMA choice, and
    with 16x16 MFMAs at most what the pruner keeps (nothing reloaded inside a loop, <= 64 B per lane: Triton 3.6
    spills 0-1 VGPRs there, 3.9 8 VGPRs / 36 B non-causal); before half-width masked blocks: 19 causal, reloaded
    in both loops."""
    from isa_tools.scratch import scratch_use
    from rocmflash.static.prune import HARMLESS_SPILL_BYTES

    cfg = KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=1, waves_per_eu=2,
                       matrix_instr_nonkdim=nonkdim)
    k = get_variant("online").compile_for("gfx950", cfg, Problem(head_dim=128, causal=causal, dtype="bf16"))[0]
    use = scratch_use(k.asm["amdgcn"])
    assert use.loop_ops == 0
    regs = _amd_regs(k)
    if nonkdim == 16:
        assert regs["private_segment_fixed_size"] <= HARMLESS_SPILL_BYTES, regs
    else:
        assert regs["vgpr_spill_count"] == 0, regs


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("D", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_amd_forward_defaults_do_not_spill(arch, D, causal):
    """The shipped per-arch forward default (what run-time selection serves without a database entry)
    never reloads spilled registers inside its loop, at every head-dim class and on every Triton
    CI runs (64x64 spilled 24-56 VGPRs at D = 192/256 before; gfx90a's 32x32-MFMA 64x32 tile
    reloaded 4 in the loop at D=256 with Triton 3.9).

    Compiled as a launch is (buffer loads: each tensor's resource takes 4 SGPRs), a few
    SGPRs may be parked in VGPR lanes and a few VGPRs spilled outside the loop (Triton 3.9 at
    D = 96/128 causal, 3.6 at gfx90a D=256 causal: 1-2): the pruner's spill rule must keep it."""
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.static.compile import _summarize
    from rocmflash.static.prune import PruneSettings, spills

    gpu = get_gpu({"gfx90a": "mi250", "gfx942": "mi300x", "gfx950": "mi355x"}[arch])
    k = get_variant("online").compile_for(arch, default_config(arch, D), Problem(head_dim=D, causal=causal,
                                                                                  dtype="bf16"))[0]
    kernel = _summarize(k, gpu)
    assert kernel["arch"] == arch
    assert kernel["scratch_asm_known"] and kernel["scratch_loop_loads"] == kernel["scratch_loop_stores"] == 0, kernel
    assert kernel["vgpr_spill_count"] <= 2, kernel
    assert spills({"kernels": [kernel]}, PruneSettings()) is None, kernel
