"""Per-architecture resource tables for occupancy arithmetic.

The AMD numbers follow LLVM's AMDGPU backend (``Utils/AMDGPUBaseInfo.cpp``,
``GCNSubtarget``): they are the rules the compiler itself uses when it prints
``; Occupancy: N``. The NVIDIA numbers follow the CUDA occupancy calculator.
Adding an architecture is adding one row.
"""

from __future__ import annotations

import dataclasses

from isa_tools.errors import CodeObjectError

KIB = 1024


@dataclasses.dataclass(frozen=True)
class AmdArch:
    """Register-file and LDS limits of one AMD GPU architecture (per SIMD unless noted)."""

    name: str
    wavefront_size: int
    max_waves_per_simd: int
    simds_per_cu: int
    vgprs_per_lane: int  #: total VGPR file per lane and SIMD (unified arch+acc on gfx90a+)
    vgpr_alloc_granule: int  #: registers are handed out to a wave in blocks of this many
    vgpr_encode_granule: int  #: unit of the kernel descriptor's GRANULATED_WORKITEM_VGPR_COUNT
    unified_vgpr_file: bool  #: AGPRs share the VGPR file (gfx90a+); gfx908 keeps them separate
    has_agprs: bool
    sgprs_limit_waves: bool  #: gfx9 SGPR file can limit waves; from gfx10 on it never does
    sgpr_encode_granule: int
    lds_per_cu: int  #: bytes of LDS a CU shares among its resident workgroups
    max_lds_per_workgroup: int
    lds_alloc_granule: int  #: LDS is allocated to a workgroup in blocks of this many bytes
    max_workgroups_per_cu: int

    @property
    def vendor(self) -> str:
        return "amd"


@dataclasses.dataclass(frozen=True)
class NvidiaArch:
    """Register-file and shared-memory limits of one NVIDIA SM architecture (per SM)."""

    name: str
    registers_per_sm: int
    max_registers_per_thread: int
    register_alloc_unit: int  #: registers are allocated per warp in units of this many
    max_warps_per_sm: int
    max_blocks_per_sm: int
    shared_per_sm: int  #: configurable shared-memory carve-out maximum, bytes
    max_shared_per_block: int
    shared_alloc_unit: int
    reserved_shared_per_block: int  #: the driver reserves this much shared memory per block
    warp_size: int = 32

    @property
    def vendor(self) -> str:
        return "nvidia"


AMD_ARCHS: dict[str, AmdArch] = {
    a.name: a
    for a in [
        AmdArch("gfx908", 64, 10, 4, 256, 4, 4, False, True, True, 8, 64 * KIB, 64 * KIB, 512, 16),
        AmdArch("gfx90a", 64, 8, 4, 512, 8, 8, True, True, True, 8, 64 * KIB, 64 * KIB, 512, 16),
        AmdArch("gfx942", 64, 8, 4, 512, 8, 8, True, True, True, 8, 64 * KIB, 64 * KIB, 512, 16),
        AmdArch("gfx950", 64, 8, 4, 512, 8, 8, True, True, True, 8, 160 * KIB, 160 * KIB, 1280, 16),
        AmdArch("gfx1100", 32, 16, 4, 1536, 24, 8, False, False, False, 8, 128 * KIB, 64 * KIB, 512, 32),
    ]
}

NVIDIA_ARCHS: dict[str, NvidiaArch] = {
    a.name: a
    for a in [
        NvidiaArch("sm_80", 65536, 255, 256, 64, 32, 164 * KIB, 163 * KIB, 128, 1 * KIB),
        NvidiaArch("sm_90", 65536, 255, 256, 64, 32, 228 * KIB, 227 * KIB, 128, 1 * KIB),
    ]
}


def amd_arch(name: str) -> AmdArch:
    """The table row for a gfx name; feature suffixes (``gfx90a:xnack-``) are ignored."""
    base = str(name).split(":")[0].strip().lower()
    try:
        return AMD_ARCHS[base]
    except KeyError:
        raise CodeObjectError(
            f"unsupported AMD architecture {name!r}; known: {', '.join(AMD_ARCHS)}"
        ) from None


def nvidia_arch(name) -> NvidiaArch:
    """The table row for ``"sm_90"``, ``"sm_90a"``, ``90`` or ``(9, 0)``."""
    if isinstance(name, tuple):
        name = f"sm_{name[0]}{name[1]}"
    elif isinstance(name, int):
        name = f"sm_{name}"
    key = str(name).lower().rstrip("a")
    try:
        return NVIDIA_ARCHS[key]
    except KeyError:
        raise CodeObjectError(
            f"unsupported NVIDIA architecture {name!r}; known: {', '.join(NVIDIA_ARCHS)}"
        ) from None
