"""Occupancy: how many waves of a kernel can be resident per SIMD (AMD) or warps per SM (NVIDIA).

Two AMD numbers, deliberately kept apart:

* :func:`waves_per_simd_static` is what LLVM prints as ``; Occupancy: N``: the
  limit from allocated VGPRs, SGPRs and *static* LDS. It is tested to equal the
  compiler's line on every kernel we compile.
* :func:`amd_occupancy` adds what LLVM cannot see: Triton's LDS is allocated
  dynamically at launch (``metadata.shared``), rounded up to the arch's LDS
  granule, and only whole workgroups fit on a CU, so an 8-wave workgroup that
  registers would allow 3 waves/SIMD for actually gets 2.

Cliff arithmetic (``vgprs_past_cliff``, ``vgpr_headroom``) is on allocated VGPRs,
the number that decides the wave count.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from isa_tools.archs import AmdArch, NvidiaArch, amd_arch, nvidia_arch

#: order in which a tie between limits is reported: the first is what the user can most often change
LIMITER_ORDER = ("vgpr", "sgpr", "lds", "workgroup", "max_waves")


def _align_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


def _arch(arch) -> AmdArch:
    return arch if isinstance(arch, AmdArch) else amd_arch(arch)


def waves_from_vgprs(arch, allocated_vgprs: int) -> int:
    """Waves per SIMD the VGPR file allows (LLVM ``getNumWavesPerEUWithNumVGPRs``).

    ``allocated_vgprs`` counts AGPRs too on unified-file archs (gfx90a+).
    """
    a = _arch(arch)
    if allocated_vgprs < a.vgpr_alloc_granule:
        return a.max_waves_per_simd
    rounded = _align_up(allocated_vgprs, a.vgpr_alloc_granule)
    return max(1, min(a.vgprs_per_lane // rounded, a.max_waves_per_simd))


def waves_from_sgprs(arch, sgprs: int) -> int:
    """Waves per SIMD the SGPR file allows (gfx9 rule; SGPRs never limit from gfx10 on)."""
    a = _arch(arch)
    if not a.sgprs_limit_waves:
        return a.max_waves_per_simd
    if sgprs <= 80:
        waves = 10
    elif sgprs <= 88:
        waves = 9
    elif sgprs <= 100:
        waves = 8
    else:
        waves = 7
    return min(waves, a.max_waves_per_simd)


def waves_from_static_lds(arch, lds_bytes: int, workgroup_size: int) -> int:
    """Waves per SIMD that static LDS allows, as LLVM estimates it (no granule, even spread)."""
    a = _arch(arch)
    if lds_bytes <= 0:
        return a.max_waves_per_simd
    workgroups = a.lds_per_cu // lds_bytes
    if workgroups == 0:
        return 1
    waves_per_wg = max(1, math.ceil(workgroup_size / a.wavefront_size))
    waves = math.ceil(min(workgroups, a.max_workgroups_per_cu) * waves_per_wg / a.simds_per_cu)
    return max(1, min(waves, a.max_waves_per_simd))


def waves_per_simd_static(arch, allocated_vgprs: int, sgprs: int, lds_bytes: int = 0,
                          workgroup_size: int = 256) -> int:
    """LLVM's ``; Occupancy: N``: min of the VGPR, SGPR and static-LDS limits."""
    return min(
        waves_from_vgprs(arch, allocated_vgprs),
        waves_from_sgprs(arch, sgprs),
        waves_from_static_lds(arch, lds_bytes, workgroup_size),
    )


def vgprs_past_cliff(arch, allocated_vgprs: int) -> int:
    """Allocated VGPRs above the last cliff: how many to shed to gain at least one wave per SIMD (0 at max waves)."""
    a = _arch(arch)
    waves = waves_from_vgprs(a, allocated_vgprs)
    if waves >= a.max_waves_per_simd:
        return 0
    best_for_one_more = (a.vgprs_per_lane // (waves + 1)) // a.vgpr_alloc_granule * a.vgpr_alloc_granule
    return max(0, _align_up(allocated_vgprs, a.vgpr_alloc_granule) - best_for_one_more)


def vgpr_headroom(arch, allocated_vgprs: int) -> int:
    """How many more VGPRs the kernel could allocate before it loses a wave per SIMD."""
    a = _arch(arch)
    waves = waves_from_vgprs(a, allocated_vgprs)
    most_at_this_level = (a.vgprs_per_lane // waves) // a.vgpr_alloc_granule * a.vgpr_alloc_granule
    return max(0, most_at_this_level - allocated_vgprs)


def vgpr_cliffs(arch) -> list[tuple[int, int]]:
    """``(max allocated VGPRs, waves per SIMD)`` for every wave level of the arch, most waves first."""
    a = _arch(arch)
    return [
        ((a.vgprs_per_lane // w) // a.vgpr_alloc_granule * a.vgpr_alloc_granule, w)
        for w in range(a.max_waves_per_simd, 0, -1)
    ]


@dataclasses.dataclass(frozen=True)
class AmdOccupancy:
    """Occupancy of one AMD kernel, with each limit shown so the user can see what binds."""

    waves_per_simd_static: int  #: LLVM's ``; Occupancy:`` line
    waves_per_simd: int  #: with dynamic LDS and whole-workgroup placement
    limiter: str  #: one of :data:`LIMITER_ORDER`
    waves_from_vgprs: int
    waves_from_sgprs: int
    waves_from_lds: int
    workgroups_per_cu: int
    waves_per_workgroup: int
    lds_allocated_bytes: int  #: static + dynamic LDS per workgroup, rounded to the LDS granule
    vgprs_past_cliff: int
    vgpr_headroom: int


def amd_occupancy(arch, allocated_vgprs: int, sgprs: int, static_lds_bytes: int = 0,
                  dynamic_lds_bytes: int = 0, waves_per_workgroup: Optional[int] = None,
                  max_workgroup_size: int = 256) -> AmdOccupancy:
    """Full occupancy model for an AMD kernel.

    ``waves_per_workgroup`` is Triton's ``num_warps`` (a Triton warp is a wave on
    AMD); when unknown it is taken from ``max_workgroup_size``. A workgroup of W
    waves puts W/4 waves on each SIMD and only whole workgroups are resident, so
    the register limit is quantised to multiples of W/4 waves. A workgroup whose
    LDS exceeds the per-workgroup maximum cannot launch: 0 waves, limiter ``lds``.
    """
    a = _arch(arch)
    if waves_per_workgroup is None:
        waves_per_workgroup = max(1, math.ceil(max_workgroup_size / a.wavefront_size))
    w = waves_per_workgroup
    static = waves_per_simd_static(a, allocated_vgprs, sgprs, static_lds_bytes, max_workgroup_size)
    vgpr_waves = waves_from_vgprs(a, allocated_vgprs)
    sgpr_waves = waves_from_sgprs(a, sgprs)
    register_waves = min(vgpr_waves, sgpr_waves, a.max_waves_per_simd)

    lds_total = static_lds_bytes + dynamic_lds_bytes
    lds_alloc = _align_up(lds_total, a.lds_alloc_granule) if lds_total > 0 else 0
    slots = a.max_waves_per_simd * a.simds_per_cu
    if lds_alloc > a.max_lds_per_workgroup:
        lds_workgroups = 0
    else:
        lds_workgroups = a.lds_per_cu // lds_alloc if lds_alloc else slots
    register_workgroups = register_waves * a.simds_per_cu // w
    slot_workgroups = a.max_workgroups_per_cu if w > 1 else slots
    workgroups = min(register_workgroups, lds_workgroups, slot_workgroups)

    def per_simd(n_workgroups: int) -> int:
        return min(a.max_waves_per_simd, n_workgroups * w // a.simds_per_cu)

    candidates = {
        "vgpr": vgpr_waves,
        "sgpr": sgpr_waves,
        "lds": per_simd(lds_workgroups),
        "workgroup": per_simd(min(register_workgroups, slot_workgroups)),
        "max_waves": a.max_waves_per_simd,
    }
    waves = per_simd(workgroups)
    # At the hardware maximum nothing the kernel does is binding; say so rather than naming a resource.
    limiter = "max_waves" if waves == a.max_waves_per_simd else next(
        name for name in LIMITER_ORDER if candidates[name] == waves)
    return AmdOccupancy(
        waves_per_simd_static=static,
        waves_per_simd=waves,
        limiter=limiter,
        waves_from_vgprs=vgpr_waves,
        waves_from_sgprs=sgpr_waves,
        waves_from_lds=candidates["lds"],
        workgroups_per_cu=workgroups,
        waves_per_workgroup=w,
        lds_allocated_bytes=lds_alloc,
        vgprs_past_cliff=vgprs_past_cliff(a, allocated_vgprs),
        vgpr_headroom=vgpr_headroom(a, allocated_vgprs),
    )


@dataclasses.dataclass(frozen=True)
class NvidiaOccupancy:
    """Occupancy of one NVIDIA kernel per SM (and per scheduler, the analogue of an AMD SIMD)."""

    warps_per_sm: int
    warps_per_scheduler: float  #: an SM has 4 schedulers (sub-partitions)
    blocks_per_sm: int
    limiter: str  #: ``registers``, ``shared``, ``blocks``, ``warps``
    registers_per_warp: int
    shared_allocated_bytes: int


def nvidia_occupancy(arch, registers_per_thread: int, shared_bytes: int, warps_per_block: int) -> NvidiaOccupancy:
    """Resident warps per SM from registers (allocated per warp), shared memory and block limits."""
    a: NvidiaArch = arch if isinstance(arch, NvidiaArch) else nvidia_arch(arch)
    regs_per_warp = _align_up(max(1, registers_per_thread) * a.warp_size, a.register_alloc_unit)
    if registers_per_thread > a.max_registers_per_thread:
        reg_blocks = 0
    else:
        reg_blocks = (a.registers_per_sm // regs_per_warp) // warps_per_block
    shared_alloc = _align_up(shared_bytes + a.reserved_shared_per_block, a.shared_alloc_unit)
    if shared_bytes > a.max_shared_per_block:
        shared_blocks = 0
    else:
        shared_blocks = a.shared_per_sm // shared_alloc
    limits = {
        "registers": reg_blocks,
        "shared": shared_blocks,
        "blocks": a.max_blocks_per_sm,
        "warps": a.max_warps_per_sm // warps_per_block,
    }
    blocks = min(limits.values())
    limiter = next(name for name, value in limits.items() if value == blocks)
    warps = blocks * warps_per_block
    return NvidiaOccupancy(warps, warps / 4, blocks, limiter, regs_per_warp, shared_alloc)
