"""One flat record per kernel: what it uses and what occupancy follows (the CLI's JSON contract)."""

from __future__ import annotations

from typing import Optional

from isa_tools.archs import AMD_ARCHS
from isa_tools.hsaco import KernelResources
from isa_tools.occupancy import amd_occupancy

#: keys every record carries, in display order (``rocmflash isa --json`` promises these names)
SUMMARY_KEYS = (
    "path", "name", "arch", "wavefront_size", "vgpr_count", "agpr_count", "sgpr_count",
    "vgpr_spill_count", "sgpr_spill_count", "scratch_bytes", "lds_bytes", "dynamic_lds_bytes",
    "num_warps", "allocated_vgprs", "allocated_sgprs", "accum_offset", "waves_per_simd_static",
    "waves_per_simd", "limiter", "vgprs_past_cliff", "vgpr_headroom",
)


def kernel_summary(kernel: KernelResources, dynamic_lds_bytes: int = 0,
                   num_warps: Optional[int] = None) -> dict:
    """Resources plus occupancy of one kernel as a flat dict keyed by :data:`SUMMARY_KEYS`.

    Occupancy fields are None when the arch is not in :data:`isa_tools.archs.AMD_ARCHS`.
    """
    record = kernel.to_dict()
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
