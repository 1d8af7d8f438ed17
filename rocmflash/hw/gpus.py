"""GPU catalog: what rocmflash knows about each supported GPU.

Figures are for the device a single PyTorch process sees. On MI250/MI250X that is
one GCD (graphics compute die): a module holds two, and ROCm shows each as its own
device, so the catalog stores per-GCD numbers and the module size in
``devices_per_module``.

Peak rates are dense fp16/bf16 and fp8 matrix rates from the vendors' datasheets (no
sparsity); bandwidth is HBM peak. They are used for roofline floors, never as
measured results. ``peak_fp8_tflops`` is None where the arch has no fp8 matrix
instructions (gfx90a, sm_80); each figure's source is named at :data:`_FP8_PEAKS`.
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
    #: compute-partition modes and how many devices each splits the GPU into (``{"cpx": 8}``)
    partition_modes: tuple = ()
    partition: str = ""  #: ``""`` for the whole GPU (SPX), else the mode (``"cpx"``)
    base_name: str = ""  #: the whole GPU's catalog name for a partition (``"mi300x"``), else ``name``
    memory_gib: int = 0  #: device memory of the whole GPU (per GCD on MI250/MI250X), GiB
    #: dense fp8 (e4m3/e5m2) matrix peak of that device; None: no fp8 matrix instructions
    peak_fp8_tflops: Optional[float] = None

    def __post_init__(self):
        if not self.base_name:
            object.__setattr__(self, "base_name", self.name)

    def partitioned(self, mode: str) -> "GPU":
        """The device one process sees in compute-partition ``mode`` (``spx``: the whole GPU).

        A partition is its own tuning target (``mi300x-cpx``): its CUs, matrix peak, L2,
        Infinity Cache and HBM bandwidth are this GPU's divided by the number of
        partitions (HBM bandwidth is the partition's share when all partitions are busy).
        """
        mode = mode.lower()
        if mode == "spx" and self.partition_modes:
            return self
        parts = dict(self.partition_modes).get(mode)
        if parts is None:
            modes = ", ".join(["spx"] + [m for m, _ in self.partition_modes]) if self.partition_modes else "none"
            raise UnknownGPUError(f"{self.name} has no compute-partition mode {mode!r}; its modes: {modes}")
        return dataclasses.replace(
            self, name=f"{self.name}-{mode}", marketing_name=f"{self.marketing_name}, {mode.upper()} partition",
            compute_units=self.compute_units // parts, peak_fp16_tflops=round(self.peak_fp16_tflops / parts, 2),
            peak_fp8_tflops=None if self.peak_fp8_tflops is None else round(self.peak_fp8_tflops / parts, 2),
            hbm_tbs=round(self.hbm_tbs / parts, 4), l2_bytes=self.l2_bytes // parts,
            last_level_cache_bytes=self.last_level_cache_bytes // parts, partition_modes=(), partition=mode,
            base_name=self.name)

    def partitions(self) -> list["GPU"]:
        """Every partition mode of this GPU, the whole GPU (SPX) first; ``[self]`` if it has none."""
        return [self] + [self.partitioned(mode) for mode, _ in self.partition_modes]

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


# compute-partition modes (amd-smi set --compute-partition): the XCDs of one GPU shown as several devices
_MI300X_MODES = (("dpx", 2), ("qpx", 4), ("cpx", 8))  # 8 XCDs x 38 CUs
_MI300A_MODES = (("tpx", 3), ("cpx", 6))  # 6 XCDs x 38 CUs
_MI350_MODES = (("dpx", 2), ("qpx", 4), ("cpx", 8))  # 8 XCDs x 32 CUs

#: dense fp8 matrix peaks, TFLOP/s (the datasheets print twice these "with sparsity"); gfx90a and sm_80 have none.
#: AMD's figures are CUs x peak engine clock x fp8 FLOPs per CU per clock (CDNA3: 4096, CDNA4: 8192), as the
#: datasheets' footnotes compute them.
_FP8_PEAKS = {
    # AMD Instinct MI300A data sheet / AMD CDNA 3 white paper: 1961.2 TFLOPS FP8 (3922.3 with sparsity)
    "mi300a": 1961.2,
    # AMD Instinct MI300X data sheet / AMD CDNA 3 white paper: 2614.9 TFLOPS FP8 (5229.8 with sparsity)
    "mi300x": 2614.9,
    # AMD Instinct MI325X data sheet: 2614.9 TFLOPS FP8 (5229.8 with sparsity): MI300X's compute, HBM3E
    "mi325x": 2614.9,
    # AMD Instinct MI350X data sheet / AMD CDNA 4 white paper: 4.6 PFLOPS FP8 (4613.7 TFLOPS; 9.2 with sparsity)
    "mi350x": 4613.7,
    # AMD Instinct MI355X data sheet / AMD CDNA 4 white paper: 5.0 PFLOPS FP8 (5033.2 TFLOPS; 10.1 with sparsity)
    "mi355x": 5033.2,
    # NVIDIA H100 Tensor Core GPU datasheet (SXM): FP8 Tensor Core 3,958 TFLOPS "with sparsity", halved
    "h100": 1979.0,
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): FP8 Tensor Core 3,958 TFLOPS "with sparsity", halved
    "h200": 1979.0,
}

_CATALOG = [
    GPU("mi210", "AMD Instinct MI210", "amd", "gfx90a", 104, 181.0, 1.6, 64 * KIB, 8 * MIB, memory_gib=64),
    GPU("mi250", "AMD Instinct MI250 (one GCD)", "amd", "gfx90a", 104, 181.0, 1.6, 64 * KIB, 8 * MIB, 2, memory_gib=64),
    GPU("mi250x", "AMD Instinct MI250X (one GCD)", "amd", "gfx90a", 110, 191.5, 1.6, 64 * KIB, 8 * MIB, 2, memory_gib=64),
    GPU("mi300a", "AMD Instinct MI300A", "amd", "gfx942", 228, 980.6, 5.3, 64 * KIB, 24 * MIB, 1, 256 * MIB,
        _MI300A_MODES, memory_gib=128),
    GPU("mi300x", "AMD Instinct MI300X", "amd", "gfx942", 304, 1307.4, 5.3, 64 * KIB, 32 * MIB, 1, 256 * MIB,
        _MI300X_MODES, memory_gib=192),
    GPU("mi325x", "AMD Instinct MI325X", "amd", "gfx942", 304, 1307.4, 6.0, 64 * KIB, 32 * MIB, 1, 256 * MIB,
        _MI300X_MODES, memory_gib=256),
    GPU("mi350x", "AMD Instinct MI350X", "amd", "gfx950", 256, 2306.9, 8.0, 160 * KIB, 32 * MIB, 1, 256 * MIB,
        _MI350_MODES, memory_gib=288),
    GPU("mi355x", "AMD Instinct MI355X", "amd", "gfx950", 256, 2516.0, 8.0, 160 * KIB, 32 * MIB, 1, 256 * MIB,
        _MI350_MODES, memory_gib=288),
    GPU("a100", "NVIDIA A100 SXM 80GB", "nvidia", "sm_80", 108, 312.0, 2.039, 164 * KIB, 40 * MIB, memory_gib=80),
    GPU("h100", "NVIDIA H100 SXM", "nvidia", "sm_90", 132, 989.0, 3.35, 228 * KIB, 50 * MIB, memory_gib=80),
    GPU("h200", "NVIDIA H200", "nvidia", "sm_90", 132, 989.0, 4.8, 228 * KIB, 50 * MIB, memory_gib=141),
]

_CATALOG = [dataclasses.replace(g, peak_fp8_tflops=_FP8_PEAKS.get(g.name)) for g in _CATALOG]
GPUS: dict[str, GPU] = {g.name: g for g in _CATALOG}
#: every tuning target: the catalog's GPUs and each of their compute partitions (``mi300x-cpx``)
TARGETS: dict[str, GPU] = {p.name: p for g in _CATALOG for p in g.partitions()}


def known_gpu_names() -> list[str]:
    """Catalog keys in catalog order (whole GPUs; partitions are ``<name>-<mode>``)."""
    return [g.name for g in _CATALOG]


def _squash(name: str) -> str:
    return "".join(ch for ch in str(name).strip().lower() if ch.isalnum())


_BY_SQUASHED = {_squash(n): g for n, g in TARGETS.items()}
_BY_SQUASHED.update({_squash(g.name + "spx"): g for g in _CATALOG if g.partition_modes})


def get_gpu(name: str) -> GPU:
    """Look a tuning target up by name: ``mi300x``, ``MI-300X``, ``mi300x-cpx`` (case, ``-``/``_``/spaces ignored).

    Raises :class:`UnknownGPUError` naming the known GPUs (and partition modes) otherwise.
    """
    gpu = _BY_SQUASHED.get(_squash(name))
    if gpu is None:
        partitioned = ", ".join(f"{g.name}-{{{','.join(m for m, _ in g.partition_modes)}}}"
                                for g in _CATALOG if g.partition_modes)
        raise UnknownGPUError(f"unknown GPU {name!r}; known GPUs: {', '.join(known_gpu_names())} "
                              f"(compute partitions: {partitioned})")
    return gpu


#: the smallest cache flush a timing worker zeroes (rocmflash's flush before it was sized per GPU)
MIN_FLUSH_BYTES = 256 * MIB
#: the last-level cache an AMD device off the catalog is taken to have (the MI300 family's Infinity Cache)
AMD_UNKNOWN_LAST_LEVEL_CACHE = 256 * MIB


def flush_bytes(gpu: Optional[GPU] = None, l2_bytes: int = 0, amd: bool = False) -> int:
    """Bytes a timing worker zeroes before each timed run, so that no run finds its inputs in a cache.

    Twice the larger of ``gpu``'s L2 and last-level cache (a flush only as large as the cache
    leaves part of it warm), at least :data:`MIN_FLUSH_BYTES`: 512 MiB on MI300X/MI325X/MI355X
    (256 MiB Infinity Cache, and on their compute partitions), the 256 MiB floor on an H100
    (50 MB L2). ``l2_bytes``: the L2 the runtime reports for the live device (counted too);
    ``amd`` with no catalog ``gpu`` (a device off the catalog): its last-level cache is taken
    to be 256 MiB. The one place the flush is sized: every timing worker calls it through
    :func:`rocmflash.measure.flush_buffer`.
    """
    if gpu is not None and not isinstance(gpu, GPU):
        raise TypeError(f"flush_bytes: expected a catalog GPU or None, got {type(gpu).__name__}")
    if type(l2_bytes) is not int or l2_bytes < 0:
        raise ValueError(f"flush_bytes: l2_bytes {l2_bytes!r} is invalid; expected an int >= 0")
    caches = [l2_bytes]
    if gpu is not None:
        # a compute partition counts its whole GPU's caches: its share of the Infinity Cache is a roofline
        # figure, while (in NPS1 memory mode) every XCD's reads go through the whole cache
        whole = GPUS.get(gpu.base_name, gpu)
        caches += [gpu.l2_bytes, gpu.last_level_cache_bytes, whole.l2_bytes, whole.last_level_cache_bytes]
    elif amd:
        caches.append(AMD_UNKNOWN_LAST_LEVEL_CACHE)
    return max(MIN_FLUSH_BYTES, 2 * max(caches))
