"""One flat record per kernel: what it uses and what occupancy follows (the CLI's JSON contract)."""

from __future__ import annotations

from typing import Optional

from isa_tools.archs import AMD_ARCHS
from isa_tools.hsaco import KernelResources
from isa_tools.occupancy import amd_occupancy
from isa_tools.scratch import SCRATCH_KEYS, scratch_use

#: keys every record carries, in display order (``rocmflash isa --json`` promises these names)
SUMMARY_KEYS = (
    "path", "name", "arch", "wavefront_size", "vgpr_count", "agpr_count", "sgpr_count",
    "vgpr_spill_count", "sgpr_spill_count", "scratch_bytes", "lds_bytes", "dynamic_lds_bytes",
    "num_warps", "allocated_vgprs", "allocated_sgprs", "accum_offset", "waves_per_simd_static",
    "waves_per_simd", "limiter", "vgprs_past_cliff", "vgpr_headroom", *SCRATCH_KEYS,
)


def kernel_summary(kernel: KernelResources, dynamic_lds_bytes: int = 0,
                   num_warps: Optional[int] = None, asm: Optional[str] = None) -> dict:
    """Resources plus occupancy of one kernel as a flat dict keyed by :data:`SUMMARY_KEYS`.

    Occupancy fields are None when the arch is not in :data:`isa_tools.archs.AMD_ARCHS`.
    ``asm``: the kernel's assembly text, from which the ``scratch_*`` fields say where
    scratch is used (:mod:`isa_tools.scratch`); without it they are None and
    ``scratch_asm_known`` is False.
    """
    record = kernel.to_dict()
    record.update(scratch_use(asm, kernel.name).to_dict())
    record["dynamic_lds_bytes"] = dynamic_lds_bytes
    waves_per_workgroup = num_warps or max(1, -(-kernel.max_workgroup_size // kernel.wavefront_size))
    record["num_warps"] = waves_per_workgroup
    occupancy_keys = ("waves_per_simd_static", "waves_per_simd", "limiter", "vgprs_past_cliff", "vgpr_headroom")
    if kernel.arch in AMD_ARCHS and kernel.allocated_vgprs is not None:
        occ = amd_occupancy(
            kernel.arch, kernel.allocated_vgprs, kernel.sgpr_count, kernel.lds_bytes,
            dynamic_lds_bytes, waves_per_workgroup, kernel.max_workgroup_size,
        )
        for key in occupancy_keys:
            record[key] = getattr(occ, key)
    else:
        record.update({key: None for key in occupancy_keys})
    ordered = {key: record[key] for key in SUMMARY_KEYS}
    ordered.update({k: v for k, v in record.items() if k not in ordered})
    return ordered


def cuda_kernel_summary(kernel, dynamic_shared_bytes: int = 0, num_warps: int = 4) -> dict:
    """The NVIDIA counterpart of :func:`kernel_summary`, with the same keys where they have a meaning.

    Registers are per thread (``vgpr_count`` = ``allocated_vgprs``); spills are the
    per-thread stack frame in 32-bit words; ``waves_per_simd`` is resident warps per SM
    scheduler (an SM has 4, as a CU has 4 SIMDs), ``waves_per_simd_static`` the same
    without shared memory. AMD-only fields are None.
    """
    from isa_tools.occupancy import nvidia_occupancy

    shared = kernel.static_shared_bytes + dynamic_shared_bytes
    occ = nvidia_occupancy(kernel.arch, kernel.registers_per_thread, shared, num_warps)
    registers_only = nvidia_occupancy(kernel.arch, kernel.registers_per_thread, 0, num_warps)
    record = {key: None for key in SUMMARY_KEYS}
    record["scratch_asm_known"] = False  # ptxas spills; the SASS is not read
    record.update(
        path=None, name=kernel.name, arch=kernel.arch, wavefront_size=32,
        vgpr_count=kernel.registers_per_thread, agpr_count=0, sgpr_count=None,
        vgpr_spill_count=kernel.spill_estimate, sgpr_spill_count=0, scratch_bytes=kernel.local_bytes,
        lds_bytes=kernel.static_shared_bytes, dynamic_lds_bytes=dynamic_shared_bytes, num_warps=num_warps,
        allocated_vgprs=kernel.registers_per_thread,
        waves_per_simd_static=registers_only.warps_per_sm // 4, waves_per_simd=occ.warps_per_sm // 4,
        limiter={"registers": "vgpr", "shared": "lds", "blocks": "workgroup", "warps": "max_waves"}[occ.limiter],
    )
    return record
