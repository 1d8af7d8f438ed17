"""The full occupancy model on constructed cases, and properties of the cliff arithmetic.

The register-limited part is checked against LLVM on real compiles in
test_isa_agreement.py; what LLVM cannot see (dynamic LDS, whole-workgroup
placement) is checked here on cases built from the hardware rules.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isa_tools import (
    AMD_ARCHS,
    CodeObjectError,
    amd_arch,
    amd_occupancy,
    nvidia_occupancy,
    vgpr_cliffs,
    vgpr_headroom,
    vgprs_past_cliff,
    waves_from_sgprs,
    waves_from_vgprs,
)

UNIFIED = ["gfx90a", "gfx942", "gfx950"]


@pytest.mark.parametrize("arch", UNIFIED)
def test_unified_file_cliffs(arch):
    # 512 VGPRs per lane in blocks of 8: the wave levels are 512 // n rounded down to the granule.
    levels = {v: w for v, w in vgpr_cliffs(arch)}
    assert levels == {64: 8, 72: 7, 80: 6, 96: 5, 128: 4, 168: 3, 256: 2, 512: 1}
    assert waves_from_vgprs(arch, 128) == 4 and waves_from_vgprs(arch, 129) == 3


def test_gfx908_has_a_separate_256_file():
    assert waves_from_vgprs("gfx908", 256) == 1 and waves_from_vgprs("gfx908", 24) == 10


def test_sgpr_limit_only_on_gfx9():
    assert waves_from_sgprs("gfx90a", 101) == 7
    assert waves_from_sgprs("gfx90a", 100) == 8
    assert waves_from_sgprs("gfx1100", 106) == 16


def test_dynamic_lds_limits_workgroups_gfx942():
    # 40 KiB per workgroup: one fits in 64 KiB, so a 4-wave workgroup gives 1 wave per SIMD.
    occ = amd_occupancy("gfx942", 64, 20, dynamic_lds_bytes=40 * 1024, waves_per_workgroup=4)
    assert occ.waves_per_simd_static == 8
    assert (occ.waves_per_simd, occ.limiter, occ.workgroups_per_cu) == (1, "lds", 1)


def test_lds_granule_is_applied():
    # 13,057 bytes round up to 13,312 (512-byte blocks): 65,536 // 13,312 = 4 workgroups, not 65,536 // 13,057 = 5.
    occ = amd_occupancy("gfx90a", 32, 20, dynamic_lds_bytes=13057, waves_per_workgroup=4)
    assert occ.lds_allocated_bytes == 13312
    assert occ.workgroups_per_cu == 4 and occ.waves_per_simd == 4


def test_gfx950_160k_lds_and_1280_byte_granule():
    # 32,001 bytes → 33,280 (26 blocks of 1280): 163,840 // 33,280 = 4 workgroups (5 without the granule).
    occ = amd_occupancy("gfx950", 64, 20, dynamic_lds_bytes=32001, waves_per_workgroup=4)
    assert occ.lds_allocated_bytes == 33280
    assert occ.workgroups_per_cu == 4 and occ.waves_per_simd == 4 and occ.limiter == "lds"
    # The same request on gfx942 (64 KiB, 512-byte blocks) fits only 2 workgroups → 2 waves.
    assert amd_occupancy("gfx942", 64, 20, dynamic_lds_bytes=32001, waves_per_workgroup=4).waves_per_simd == 2
    # More than a workgroup may have: cannot launch at all.
    too_big = amd_occupancy("gfx942", 64, 20, dynamic_lds_bytes=65 * 1024, waves_per_workgroup=4)
    assert too_big.waves_per_simd == 0 and too_big.limiter == "lds"
    assert amd_occupancy("gfx950", 64, 20, dynamic_lds_bytes=65 * 1024, waves_per_workgroup=4).waves_per_simd == 2


def test_num_warps_8_quantises_three_waves_to_two():
    occ = amd_occupancy("gfx90a", 136, 20, waves_per_workgroup=8)
    assert occ.waves_from_vgprs == 3 and occ.waves_per_simd_static == 3
    assert occ.waves_per_simd == 2 and occ.limiter == "workgroup"
    # With 4-wave workgroups, three fit whole: no loss.
    assert amd_occupancy("gfx90a", 136, 20, waves_per_workgroup=4).waves_per_simd == 3


def test_num_warps_16_quantises_to_multiples_of_four():
    occ = amd_occupancy("gfx942", 96, 20, waves_per_workgroup=16)
    assert occ.waves_from_vgprs == 5 and occ.waves_per_simd == 4 and occ.limiter == "workgroup"
    occ = amd_occupancy("gfx942", 136, 20, waves_per_workgroup=16)
    assert occ.waves_per_simd == 0  # a 16-wave workgroup needs 4 waves on each SIMD


def test_workgroup_slots_cap_single_wave_workgroups_only_by_slots():
    occ = amd_occupancy("gfx942", 32, 20, waves_per_workgroup=1)
    assert occ.waves_per_simd == 8 and occ.limiter == "max_waves"
    occ = amd_occupancy("gfx942", 32, 20, waves_per_workgroup=2)
    assert occ.waves_per_simd == 8  # 16 workgroups x 2 waves = 32 waves = 8 per SIMD


def test_cliff_distances_seed_case():
    # 136 allocated: 3 waves; 8 over the 128 cliff, 32 left before 168.
    assert vgprs_past_cliff("gfx90a", 136) == 8
    assert vgpr_headroom("gfx90a", 136) == 32
    assert vgprs_past_cliff("gfx90a", 64) == 0 and vgpr_headroom("gfx90a", 64) == 0


@given(arch=st.sampled_from(sorted(AMD_ARCHS)), data=st.data())
def test_cliff_arithmetic_is_consistent(arch, data):
    a = amd_arch(arch)
    vgprs = data.draw(st.integers(a.vgpr_alloc_granule, a.vgprs_per_lane).map(
        lambda v: v // a.vgpr_alloc_granule * a.vgpr_alloc_granule))
    waves = waves_from_vgprs(a, vgprs)
    past, room = vgprs_past_cliff(a, vgprs), vgpr_headroom(a, vgprs)
    if waves < a.max_waves_per_simd:
        assert past > 0
        assert waves_from_vgprs(a, vgprs - past) > waves  # gfx1100 (granule 24) can jump several levels
        assert waves_from_vgprs(a, vgprs - past + a.vgpr_alloc_granule) == waves
    else:
        assert past == 0
    assert waves_from_vgprs(a, vgprs + room) == waves
    if vgprs + room + a.vgpr_alloc_granule <= a.vgprs_per_lane:
        assert waves_from_vgprs(a, vgprs + room + a.vgpr_alloc_granule) < waves


@given(st.integers(1, 512), st.integers(1, 512))
def test_more_vgprs_never_more_waves(v1, v2):
    lo, hi = sorted((v1, v2))
    assert waves_from_vgprs("gfx942", lo) >= waves_from_vgprs("gfx942", hi)


def test_nvidia_occupancy_sm90():
    # 255 registers/thread → 8,192 per warp (rounded to 256); 65,536 / 8,192 = 8 warps: one 8-warp block.
    occ = nvidia_occupancy("sm_90", 255, 32 * 1024, 8)
    assert (occ.warps_per_sm, occ.limiter, occ.registers_per_warp) == (8, "registers", 8192)
    # 128 registers, 4 warps, 100 KB shared: shared memory binds at 2 blocks.
    occ = nvidia_occupancy("sm_90", 128, 100 * 1024, 4)
    assert (occ.blocks_per_sm, occ.limiter) == (2, "shared")
    assert nvidia_occupancy("sm_80", 32, 0, 4).warps_per_sm == 64


def test_unknown_arch_is_a_clear_error():
    with pytest.raises(CodeObjectError, match="gfx90a"):
        amd_arch("gfx9999")
