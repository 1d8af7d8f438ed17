"""isa_tools: read AMD (and NVIDIA) GPU code objects and turn register use into occupancy facts.

Stands alone: no torch, no attention; works on any ``.hsaco`` file or Triton cache
directory.

>>> from isa_tools import read_code_object, kernel_summary, scratch_use
>>> [kernel_summary(k) for k in read_code_object("kernel.hsaco")]  # doctest: +SKIP
>>> scratch_use(open("kernel.amdgcn").read()).loop_ops  # scratch loads/stores inside loops  # doctest: +SKIP
"""

from isa_tools.archs import AMD_ARCHS, NVIDIA_ARCHS, AmdArch, NvidiaArch, amd_arch, nvidia_arch
from isa_tools.cubin import CudaKernelResources, read_cubin
from isa_tools.errors import CodeObjectError
from isa_tools.hsaco import KernelResources, read_code_object
from isa_tools.occupancy import (
    AmdOccupancy,
    NvidiaOccupancy,
    amd_occupancy,
    nvidia_occupancy,
    vgpr_cliffs,
    vgpr_headroom,
    vgprs_past_cliff,
    waves_from_sgprs,
    waves_from_vgprs,
    waves_per_simd_static,
)
from isa_tools.scratch import SCRATCH_KEYS, ScratchUse, scratch_use
from isa_tools.summary import SUMMARY_KEYS, kernel_summary
from isa_tools.triton_cache import TritonMeta, find_code_objects, iter_kernels, triton_asm_for, triton_meta_for

__all__ = [
    "AMD_ARCHS", "NVIDIA_ARCHS", "AmdArch", "NvidiaArch", "amd_arch", "nvidia_arch",
    "CudaKernelResources", "read_cubin", "CodeObjectError", "KernelResources", "read_code_object",
    "AmdOccupancy", "NvidiaOccupancy", "amd_occupancy", "nvidia_occupancy", "vgpr_cliffs",
    "vgpr_headroom", "vgprs_past_cliff", "waves_from_sgprs", "waves_from_vgprs",
    "waves_per_simd_static", "SCRATCH_KEYS", "ScratchUse", "scratch_use", "SUMMARY_KEYS", "kernel_summary",
    "TritonMeta", "find_code_objects", "iter_kernels", "triton_asm_for", "triton_meta_for",
]
