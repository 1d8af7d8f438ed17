"""The per-arch AMD decode default compiles without spills (real compiler, HSACO metadata), contiguous and paged."""

import pytest

from isa_tools import kernel_summary, read_code_object
from rocmflash.kernels import kv_decode as KD


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("paged", [False, True])
def test_amd_decode_default_does_not_spill(arch, head_dim, paged):
    kernels = KD.compile_for(arch, KD.default_decode_config(arch, head_dim), head_dim, "bf16", group=8,
                             paged=paged, page_size=256)
    assert [k.name for k in kernels] == list(KD.KERNELS)
    for k in kernels:
        (res,) = read_code_object(k.asm["hsaco"])
        s = kernel_summary(res, num_warps=k.metadata.num_warps, asm=k.asm["amdgcn"])
        assert s["arch"] == arch
        assert s["vgpr_spill_count"] == 0 and s["sgpr_spill_count"] == 0 and s["scratch_bytes"] == 0, (k.name, s)
        assert s["waves_per_simd"] >= 2, (k.name, s)
