"""The varlen kernels as served on AMD compile with no VGPR spill and no scratch (real compiler, HSACO metadata).

The forward tile comes from :func:`rocmflash.kernels.varlen.host.amd_forward_tile` over the
dense per-arch default, the backward from ``default_bwd_config``; plain causal, soft-capped
and sliding-window builds at D = 64/128/256, cross-compiled on this CPU for gfx90a and gfx942.
"""

import pytest

from isa_tools import kernel_summary, read_code_object
from rocmflash.config import default_config
from rocmflash.kernels.varlen import host as VK
from rocmflash.kernels.backward.host import default_bwd_config


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("softcap,window", [(False, False), (True, False), (False, True)],
                         ids=["causal", "softcap", "window"])
def test_varlen_amd_kernels_do_not_spill(arch, head_dim, softcap, window):
    fwd = VK.amd_forward_tile(default_config(arch, head_dim), arch, head_dim, softcap, window)
    kernels = VK.compile_for(arch, fwd, default_bwd_config(arch, head_dim), head_dim, softcap=softcap,
                             window=window, causal=True)
    assert [k.name for k in kernels] == list(VK.KERNELS)
    for k in kernels:
        (res,) = read_code_object(k.asm["hsaco"])
        s = kernel_summary(res, num_warps=k.metadata.num_warps, asm=k.asm["amdgcn"])
        assert s["arch"] == arch
        assert s["vgpr_spill_count"] == 0 and s["scratch_bytes"] == 0, (k.name, s)
        assert s["waves_per_simd"] >= 1
