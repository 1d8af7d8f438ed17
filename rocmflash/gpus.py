"""GPU catalog: what rocmflash knows about each supported GPU.

Figures are for the device a single PyTorch process sees. On MI250/MI250X that is
one GCD (graphics compute die): a module holds two, and ROCm shows each as its own
device, so the catalog stores per-GCD numbers and the module size in
``devices_per_module``.

Peak rates are dense fp16/bf16 matrix rates from the vendors' datasheets (no
sparsity); bandwidth is HBM peak. They are used for roofline floors, never as
measured results.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

KIB = 1024
MIB = 1024 * 1024


class UnknownGPUError(ValueError):
    """Raised for a GPU name that is not in the catalog; the message lists the known ones."""


@dataclasses.dataclass(frozen=True)
class GPU:
    """One GPU model as seen by one process (one GCD on multi-die AMD modules)."""

    name: str  #: catalog key, e.g. ``"mi300x"``
    marketing_name: str
    vendor: str  #: ``"amd"`` or ``"nvidia"``
    arch: str  #: ``"gfx942"`` or ``"sm_90"``
    compute_units: int  #: CUs (AMD) or SMs (NVIDIA) visible to one process
    peak_fp16_tflops: float  #: dense fp16/bf16 matrix peak of that device
    hbm_tbs: float  #: peak HBM bandwidth of that device, TB/s
    lds_per_cu_bytes: int  #: LDS (AMD) or shared memory (NVIDIA) per CU/SM
    l2_bytes: int
    devices_per_module: int = 1
    last_level_cache_bytes: int = 0  #: Infinity Cache (MI300 family), 0 if none

    @property
    def backend(self) -> str:
        """Triton backend name for this GPU: ``"hip"`` or ``"cuda"``."""
        return "hip" if self.vendor == "amd" else "cuda"

    @property
    def warp_size(self) -> int:
        """Threads per wavefront/warp (64 on CDNA, 32 on NVIDIA)."""
        return 64 if self.vendor == "amd" else 32

    @property
    def cuda_capability(self) -> Optional[int]:
        """Compute capability as an int (``90``) for NVIDIA GPUs, else None."""
        return int(self.arch[3:]) if self.vendor == "nvidia" else None

    def triton_target(self):
        """The ``triton.backends.compiler.GPUTarget`` to cross-compile for this GPU."""
        from triton.backends.compiler import GPUTarget

        if self.vendor == "amd":
            return GPUTarget("hip", self.arch, 64)
        return GPUTarget("cuda", self.cuda_capability, 32)


_CATALOG = [
    GPU("mi210", "AMD Instinct MI210", "amd", "gfx90a", 104, 181.0, 1.6, 64 * KIB, 8 * MIB),
    GPU("mi250", "AMD Instinct MI250 (one GCD)", "amd", "gfx90a", 104, 181.0, 1.6, 64 * KIB, 8 * MIB, 2),
    GPU("mi250x", "AMD Instinct MI250X (one GCD)", "amd", "gfx90a", 110, 191.5, 1.6, 64 * KIB, 8 * MIB, 2),
    GPU("mi300a", "AMD Instinct MI300A", "amd", "gfx942", 228, 980.6, 5.3, 64 * KIB, 24 * MIB, 1, 256 * MIB),
    GPU("mi300x", "AMD Instinct MI300X", "amd", "gfx942", 304, 1307.4, 5.3, 64 * KIB, 32 * MIB, 1, 256 * MIB),
    GPU("mi325x", "AMD Instinct MI325X", "amd", "gfx942", 304, 1307.4, 6.0, 64 * KIB, 32 * MIB, 1, 256 * MIB),
    GPU("mi355x", "AMD Instinct MI355X", "amd", "gfx950", 256, 2516.0, 8.0, 160 * KIB, 32 * MIB, 1, 256 * MIB),
    GPU("a100", "NVIDIA A100 SXM 80GB", "nvidia", "sm_80", 108, 312.0, 2.039, 164 * KIB, 40 * MIB),
    GPU("h100", "NVIDIA H100 SXM", "nvidia", "sm_90", 132, 989.0, 3.35, 228 * KIB, 50 * MIB),
    GPU("h200", "NVIDIA H200", "nvidia", "sm_90", 132, 989.0, 4.8, 228 * KIB, 50 * MIB),
]

GPUS: dict[str, GPU] = {g.name: g for g in _CATALOG}


def known_gpu_names() -> list[str]:
    """Catalog keys in catalog order."""
    return [g.name for g in _CATALOG]


def get_gpu(name: str) -> GPU:
    """Look a GPU up by catalog name (case-insensitive, ``-``/``_`` ignored).

    Raises :class:`UnknownGPUError` naming the known GPUs when the name is not in the catalog.
    """
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    gpu = GPUS.get(key)
    if gpu is None:
        raise UnknownGPUError(
            f"unknown GPU {name!r}; known GPUs: {', '.join(known_gpu_names())}"
        )
    return gpu


def detect_live_gpu() -> Optional[GPU]:
    """The catalog entry of the live device 0, or None if there is none or it is not in the catalog.

    On ROCm PyTorch ``torch.cuda`` is HIP and the device reports its gfx arch; the
    CU count tells an MI300A from an MI300X and an MI250 GCD from an MI250X GCD. On
    CUDA the device name tells A100/H100/H200 apart.
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    if getattr(torch.version, "hip", None):
        arch = str(getattr(props, "gcnArchName", "")).split(":")[0]
        return _match_amd(arch, props.multi_processor_count, props.name)
    return _match_nvidia(props.name, (props.major, props.minor))


def _match_amd(arch: str, compute_units: int, device_name: str) -> Optional[GPU]:
    candidates = [g for g in _CATALOG if g.arch == arch]
    if not candidates:
        return None
    lowered = device_name.lower()
    for g in candidates:
        if g.name in lowered.replace(" ", ""):
            return g
    return min(candidates, key=lambda g: abs(g.compute_units - compute_units))


def _match_nvidia(device_name: str, capability: tuple[int, int]) -> Optional[GPU]:
    lowered = device_name.lower()
    for g in _CATALOG:
        if g.vendor == "nvidia" and g.name in lowered:
            return g
    arch = f"sm_{capability[0]}{capability[1]}"
    same_arch = [g for g in _CATALOG if g.arch == arch]
    return same_arch[0] if same_arch else None
