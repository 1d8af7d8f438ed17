"""Which catalog GPU (and compute partition) a live device is, from what the runtime reports.

ROCm reports three things that matter: the marketing name (``AMD Instinct MI300X``,
also the combined ``AMD Instinct MI250X / MI250`` of Aldebaran boards, a ``VF``
suffix under virtualisation, sometimes nothing at all), the arch (``gcnArchName``,
``gfx942:sramecc+:xnack-``) and the CU count of the device one process sees. The
name narrows the models, the arch must agree, and the CU count decides between the
models left and the compute-partition mode: an MI300X in CPX mode is eight devices of
38 CUs each, and each is its own tuning target (``mi300x-cpx``).

:func:`identify_device` is pure (a table of real-world name/arch/CU triples pins it in
``tests/test_detect.py``); :func:`identify_live_device` feeds it a torch device.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from rocmflash.hw.gpus import _CATALOG, GPU, known_gpu_names

#: the archs rocmflash tunes (wave-64 CDNA); other AMD archs get a message that says so
TUNED_AMD_ARCHS = tuple(sorted({g.arch for g in _CATALOG if g.vendor == "amd"}))
#: when a report fits several targets equally (no name), the more common board wins, with a note
_PREFERRED_WHEN_AMBIGUOUS = ("mi250", "mi300x", "mi355x")
_MODEL = re.compile(r"\bmi\s*-?\s*(\d{3})\s*([a-z]?)(?![a-z0-9])")


@dataclasses.dataclass(frozen=True)
class DeviceMatch:
    """A live device as reported, and the tuning target it resolves to (``gpu``, None if off-catalog)."""

    name: str  #: the name the runtime reports ("" when it reports none)
    arch: str  #: ``gfx942`` / ``sm_90`` (feature suffixes dropped)
    compute_units: int
    warp_size: int
    vendor: str  #: ``"amd"`` or ``"nvidia"``
    gpu: Optional[GPU] = None
    #: other targets the same report fits equally well (e.g. an unnamed 104-CU gfx90a: mi210 or mi250)
    alternatives: tuple = ()
    problem: str = ""  #: why ``gpu`` is None, or what was assumed; one sentence

    @property
    def partition(self) -> str:
        """``"spx"``/``"cpx"``/... for partitionable GPUs, ``""`` otherwise."""
        if self.gpu is None:
            return ""
        return self.gpu.partition or ("spx" if self.gpu.partition_modes else "")

    def describe(self) -> str:
        """``AMD Instinct MI300X (gfx942, wave64, 38 CUs) -> mi300x-cpx``, with the problem if any."""
        unit = "SMs" if self.vendor == "nvidia" else "CUs"
        head = f"{self.name or '(no name)'} ({self.arch or 'unknown arch'}, wave{self.warp_size}, " \
               f"{self.compute_units} {unit})"
        if self.gpu is None:
            return f"{head}: {self.problem}"
        tail = f" ({self.problem})" if self.problem else ""
        return f"{head} -> {self.gpu.name}{tail}"


def default_warp_size(arch: str) -> int:
    """Wave size a runtime uses by default for ``arch``: 32 on NVIDIA and RDNA (gfx10+), 64 on GCN/CDNA."""
    return 32 if arch.startswith("sm_") or re.match(r"gfx1\d{3}", arch) else 64


def models_named(name: str) -> list[str]:
    """Catalog-style model names in a device name: ``AMD Instinct MI250X / MI250`` -> ``['mi250x', 'mi250']``."""
    return [f"mi{num}{suffix}" for num, suffix in _MODEL.findall(name.lower())]


def identify_device(name: str, arch: str, compute_units: int, warp_size: Optional[int] = None,
                    vendor: Optional[str] = None, memory_bytes: Optional[int] = None) -> DeviceMatch:
    """Resolve a reported device to a catalog target; see the module docstring.

    ``memory_bytes`` (``total_memory``) separates whole GPUs that differ only in memory
    when the name does not say (ROCm without a name table reports "AMD Radeon Graphics"
    or "" for every Instinct GPU: an MI300X has 192 GiB, an MI325X 256 GiB).
    """
    arch = str(arch or "").split(":")[0].strip()
    name = " ".join(str(name or "").split())
    vendor = vendor or ("nvidia" if arch.startswith("sm_") else "amd")
    report = DeviceMatch(name, arch, int(compute_units or 0), int(warp_size or default_warp_size(arch)), vendor)
    if vendor == "nvidia":
        return _identify_nvidia(report)
    return _identify_amd(report, memory_bytes)


def _memory_fits(gpu: GPU, memory_bytes: Optional[int]) -> bool:
    """A whole GPU whose memory is within 10% of the reported figure (partitions: memory says nothing)."""
    if not memory_bytes or gpu.partition:
        return True
    return abs(memory_bytes / 2**30 - gpu.memory_gib) <= 0.1 * gpu.memory_gib


def _identify_amd(report: DeviceMatch, memory_bytes: Optional[int] = None) -> DeviceMatch:
    same_arch = [g for g in _CATALOG if g.arch == report.arch]
    if not same_arch:
        return dataclasses.replace(report, problem=_off_catalog_reason(report))
    named = models_named(report.name)
    unknown_models = [m for m in named if m not in known_gpu_names()]
    candidates = [g for g in same_arch if g.name in named] or same_arch
    if named and not any(g.name in named for g in same_arch):
        if unknown_models:
            return dataclasses.replace(report, problem=(
                f"{unknown_models[0].upper()} is not in rocmflash's catalog (same arch as "
                f"{', '.join(g.name for g in same_arch)}); name one of those with --gpu for a static tune"))
        return dataclasses.replace(report, problem=(
            f"the name says {', '.join(named)} but the arch is {report.arch}; the catalog has "
            f"{', '.join(g.name for g in same_arch)} for {report.arch}"))
    fits = [p for g in candidates for p in g.partitions() if p.compute_units == report.compute_units]
    if not fits:
        sizes = "; ".join(f"{g.name}: " + "/".join(str(p.compute_units) for p in g.partitions()) for g in candidates)
        return dataclasses.replace(report, problem=(
            f"{report.compute_units} CUs fit no catalog GPU or compute partition of {report.arch} ({sizes})"))
    fits = [p for p in fits if _memory_fits(p, memory_bytes)] or fits
    fits.sort(key=lambda p: p.base_name not in _PREFERRED_WHEN_AMBIGUOUS)
    gpu, others = fits[0], tuple(p.name for p in fits[1:])
    note = ""
    if others:
        note = (f"assumed {gpu.name}: the report also fits {', '.join(others)} (same arch and CUs); "
                f"name the GPU with --gpu to choose")
    return dataclasses.replace(report, gpu=gpu, alternatives=others, problem=note)


def _off_catalog_reason(report: DeviceMatch) -> str:
    tuned = ", ".join(TUNED_AMD_ARCHS)
    if report.arch.startswith("gfx1") or report.warp_size == 32:
        return (f"an RDNA (wave32) GPU, outside rocmflash's scope: it tunes wave-64 CDNA Instinct GPUs "
                f"({tuned}); rocmflash.attention runs here only with untuned defaults, and unverified")
    return (f"{report.arch or 'this arch'} is not in rocmflash's catalog, which tunes wave-64 CDNA Instinct "
            f"GPUs ({tuned}); `rocmflash gpus` lists them")


def _identify_nvidia(report: DeviceMatch) -> DeviceMatch:
    lowered = report.name.lower()
    nvidia = [g for g in _CATALOG if g.vendor == "nvidia"]
    for g in nvidia:
        if re.search(rf"\b{g.name}\b", lowered):
            note = "" if report.compute_units in (0, g.compute_units) else (
                f"reports {report.compute_units} SMs; the catalog's {g.name} ({g.marketing_name}) has "
                f"{g.compute_units}, so roofline figures assume that board")
            return dataclasses.replace(report, gpu=g, problem=note)
    same_arch = [g for g in nvidia if g.arch == report.arch]
    if same_arch:
        return dataclasses.replace(report, gpu=same_arch[0], problem=f"assumed {same_arch[0].name} from {report.arch}")
    return dataclasses.replace(report, problem=f"{report.arch} is not in rocmflash's catalog "
                                               f"({', '.join(g.name for g in nvidia)} are)")


def torch_device_report(index: int) -> dict:
    """What torch reports of device ``index`` (CUDA, or HIP on ROCm builds of torch), as the keyword arguments of
    :func:`identify_device`: plain values, so a timing worker can send its device's report to the tune process,
    which then identifies the node's GPUs without opening a device itself."""
    import torch

    props = torch.cuda.get_device_properties(index)
    warp = getattr(props, "warp_size", None)
    if getattr(torch.version, "hip", None):
        return {"name": props.name, "arch": str(getattr(props, "gcnArchName", "")),
                "compute_units": props.multi_processor_count, "warp_size": warp, "vendor": "amd",
                "memory_bytes": getattr(props, "total_memory", None)}
    return {"name": props.name, "arch": f"sm_{props.major}{props.minor}", "compute_units": props.multi_processor_count,
            "warp_size": warp, "vendor": "nvidia", "memory_bytes": None}


def identify_torch_device(index: int) -> DeviceMatch:
    """Identify torch device ``index`` (CUDA, or HIP on ROCm builds of torch)."""
    return identify_device(**torch_device_report(index))


def identify_live_device(index: Optional[int] = None) -> Optional[DeviceMatch]:
    """:func:`identify_torch_device` of ``index`` (default: the current device); None without a live GPU."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is checked by rocmflash.hw.compat
        return None
    if not torch.cuda.is_available():
        return None
    return identify_torch_device(torch.cuda.current_device() if index is None else index)


def detect_live_gpu(index: Optional[int] = None) -> Optional[GPU]:
    """The tuning target of a live device (default: the current one), or None without one or off-catalog.

    :func:`identify_live_device` says why a device is not in the catalog. (It lived in :mod:`rocmflash.hw.gpus`,
    which the catalog's users import without detection; ``rocmflash.hw.gpus`` still serves it.)
    """
    match = identify_live_device(index)
    return match.gpu if match is not None else None


__all__ = ["DeviceMatch", "identify_device", "torch_device_report", "identify_torch_device", "identify_live_device",
           "detect_live_gpu", "models_named", "default_warp_size", "TUNED_AMD_ARCHS"]
