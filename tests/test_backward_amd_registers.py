"""The shipped AMD backward defaults compile without spills (real compiler, read from the code object).

``default_bwd_config(arch, D)`` for gfx90a and gfx942, cross-compiled on this CPU; every kernel's
VGPR/SGPR spill counts and scratch come from the HSACO's metadata via ``isa_tools``. Occupancy is
reported by the same record (``docs/evidence/bwd-amd-registers-2026-11-23.md``), not asserted: the dK/dV
kernel holds two fp32 ``BLOCK_N x D`` accumulators and runs at one wave/SIMD at D=128.
"""

import pytest

from isa_tools import kernel_summary, read_code_object
from rocmflash.config import Problem
from rocmflash.kernels.backward.host import compile_for, default_bwd_config


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_amd_backward_defaults_do_not_spill(arch, head_dim):
    kernels = compile_for(arch, default_bwd_config(arch, head_dim), Problem(head_dim=head_dim, causal=True,
                                                                             dtype="bf16"))
    assert [k.name for k in kernels] == ["_bwd_dkdv", "_bwd_dq"]
    for k in kernels:
        (res,) = read_code_object(k.asm["hsaco"])
        s = kernel_summary(res, num_warps=k.metadata.num_warps, asm=k.asm["amdgcn"])
        assert s["arch"] == arch
        assert s["vgpr_spill_count"] == 0 and s["sgpr_spill_count"] == 0 and s["scratch_bytes"] == 0, (k.name, s)
        assert s["waves_per_simd"] >= 1
