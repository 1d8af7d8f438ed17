"""What differs between ROCm and CUDA builds of PyTorch, in one place.

* :func:`is_rocm`: is this a ROCm (HIP) build of torch? ``torch.cuda`` is HIP there.
* :func:`visible_devices_env`: the environment that pins a worker process to one device
  of this process (the live tuner's timing and pre-warm workers).
* :func:`visible_device_ids`: the devices a launcher pinned this process to, as the node names them.
* :func:`sdpa_backends`: the PyTorch SDPA backends a benchmark can compare against here.
* :func:`varlen_attn`: torch's own packed (varlen) attention, where this torch has it.
* :func:`sdpa_record`: what an SDPA timing ran on (torch, CUDA or HIP version, the library behind SDPA where
  torch says), kept with an entry's incumbent; :func:`torch_platform` and :func:`record_platform` compare it.

Device visibility. CUDA reads ``CUDA_VISIBLE_DEVICES``. ROCm has three layers: the ROCr
runtime applies ``ROCR_VISIBLE_DEVICES`` first, then HIP indexes into what ROCr left with
``HIP_VISIBLE_DEVICES`` (or, when that is unset, ``CUDA_VISIBLE_DEVICES``, which HIP
honours as an alias; PyTorch gives HIP's variable the same precedence). A worker is
pinned on ROCm by narrowing ``HIP_VISIBLE_DEVICES`` only: its entries are relative to
ROCr's list, so copying a physical id from ``ROCR_VISIBLE_DEVICES`` into it would name
the wrong device (or none). ``ROCR_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` are
left as the user set them.
"""

from __future__ import annotations

from typing import Mapping, Optional

#: the variables that decide which devices a process sees (ROCm's two layers, and CUDA's)
VISIBILITY_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
#: every SDPA backend rocmflash benchmarks against, in table order
SDPA_BACKENDS = ("flash", "cudnn", "efficient")
#: why a backend is not compared on ROCm
ROCM_MISSING_SDPA = {"cudnn": "cuDNN attention is NVIDIA-only (ROCm builds of PyTorch have no cuDNN)"}
_SDPA_ENUM = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def is_rocm() -> bool:
    """True on a ROCm (HIP) build of PyTorch, where ``torch.cuda`` drives AMD GPUs."""
    import torch

    return bool(getattr(torch.version, "hip", None))


def _device_list(value: str) -> list[str]:
    """Entries of a ``*_VISIBLE_DEVICES`` value (indices or UUIDs), blanks dropped."""
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def _pick(index: int, var: str, value: str) -> str:
    entries = _device_list(value)
    if index >= len(entries):
        raise ValueError(f"device index {index} is not visible: {var}={value!r} leaves {len(entries)} device(s)")
    return entries[index]


def visible_devices_env(index: int, environ: Mapping[str, str], rocm: bool) -> dict[str, str]:
    """The variables to set in a worker's environment so that it sees only device ``index`` of this process.

    ``index`` is a device index as this process sees it (``torch.cuda`` numbering). When
    the user already narrowed the devices with a list, the worker gets the ``index``-th
    entry of that list; otherwise the index itself. On ROCm only ``HIP_VISIBLE_DEVICES``
    is returned (see the module docstring for why), on CUDA only ``CUDA_VISIBLE_DEVICES``.
    Raises ValueError when ``index`` is not among the visible devices.
    """
    if type(index) is not int or index < 0:
        raise ValueError(f"device index {index!r} is invalid; expected an int >= 0")
    if not rocm:
        if "CUDA_VISIBLE_DEVICES" in environ:
            return {"CUDA_VISIBLE_DEVICES": _pick(index, "CUDA_VISIBLE_DEVICES", environ["CUDA_VISIBLE_DEVICES"])}
        return {"CUDA_VISIBLE_DEVICES": str(index)}
    for var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):  # HIP's own variable takes precedence
        if var in environ:
            return {"HIP_VISIBLE_DEVICES": _pick(index, var, environ[var])}
    if "ROCR_VISIBLE_DEVICES" in environ:  # only ROCr narrowed: HIP's index is relative to its list
        _pick(index, "ROCR_VISIBLE_DEVICES", environ["ROCR_VISIBLE_DEVICES"])
    return {"HIP_VISIBLE_DEVICES": str(index)}


def visible_device_ids(environ: Mapping[str, str], rocm: bool) -> Optional[list[str]]:
    """The devices this process sees, as the node names them (indices or UUIDs), or None when no variable narrows them.

    What a launcher (Ray, a job scheduler) pinned a process to. CUDA: the
    ``CUDA_VISIBLE_DEVICES`` list. ROCm: HIP's list (``HIP_VISIBLE_DEVICES``, else its alias
    ``CUDA_VISIBLE_DEVICES``) indexes into ROCr's (``ROCR_VISIBLE_DEVICES``), so with both
    set the node's ids are ROCr's entries that HIP's select; with one set, that one's list.
    """
    if not rocm:
        return _device_list(environ["CUDA_VISIBLE_DEVICES"]) if "CUDA_VISIBLE_DEVICES" in environ else None
    rocr = _device_list(environ["ROCR_VISIBLE_DEVICES"]) if "ROCR_VISIBLE_DEVICES" in environ else None
    hip_var = next((var for var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if var in environ), None)
    if hip_var is None:
        return rocr
    hip = _device_list(environ[hip_var])
    if rocr is None:
        return hip
    return [rocr[int(e)] if e.isdigit() and int(e) < len(rocr) else e for e in hip]


def sdpa_backends(rocm: Optional[bool] = None) -> list[str]:
    """Names of the SDPA backends to compare against on this platform, in table order.

    ROCm: ``flash`` and ``efficient`` (no cuDNN); CUDA: ``flash``, ``cudnn``, ``efficient``.
    A backend this torch build does not define (an old ``SDPBackend``) is left out too.
    ``rocm`` defaults to :func:`is_rocm`.
    """
    rocm = is_rocm() if rocm is None else rocm
    return [name for name in SDPA_BACKENDS if not missing_sdpa_backend(name, rocm)]


def missing_sdpa_backend(name: str, rocm: Optional[bool] = None) -> Optional[str]:
    """Why SDPA backend ``name`` is not compared on this platform, or None when it is."""
    if name not in SDPA_BACKENDS:
        raise ValueError(f"SDPA backend {name!r} is unknown; expected one of {SDPA_BACKENDS}")
    rocm = is_rocm() if rocm is None else rocm
    if rocm and name in ROCM_MISSING_SDPA:
        return ROCM_MISSING_SDPA[name]
    if sdpa_backend_enum(name) is None:
        return f"this torch build has no SDPBackend.{_SDPA_ENUM[name]}"
    return None


def sdpa_backend_enum(name: str):
    """``torch.nn.attention.SDPBackend`` member for a backend name, or None when this torch lacks it."""
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, _SDPA_ENUM[name], None)


_VARLEN_ATTN: list = []  #: [torch's varlen_attn or None, frozenset of its parameter names], bound on first use


def varlen_attn() -> tuple:
    """``(torch.nn.attention.varlen.varlen_attn or None, frozenset of its parameter names)``: torch's own packed
    attention, or None where this torch has none. The names of its keywords are read from its signature, never
    assumed. Bound once; the packed forward's incumbent (:mod:`rocmflash.api.varlen_incumbent`) runs it, and
    :func:`rocmflash.api.incumbent.backend_refusal` refuses an entry naming it where this torch lacks it."""
    if not _VARLEN_ATTN:
        import inspect

        try:
            from torch.nn.attention.varlen import varlen_attn as fn

            names = frozenset(inspect.signature(fn).parameters)
        except (ImportError, AttributeError, TypeError, ValueError):
            fn, names = None, frozenset()
        _VARLEN_ATTN.extend((fn, names))
    return _VARLEN_ATTN[0], _VARLEN_ATTN[1]


#: the platforms a torch build runs SDPA on, as people name them
PLATFORM_NAMES = {"hip": "ROCm", "cuda": "CUDA", "cpu": "CPU (a torch without CUDA or HIP)"}


def torch_platform() -> str:
    """``"hip"`` (a ROCm build of torch), ``"cuda"`` or ``"cpu"`` (neither): the platform this torch runs SDPA on."""
    import torch

    if getattr(torch.version, "hip", None):
        return "hip"
    return "cuda" if getattr(torch.version, "cuda", None) else "cpu"


def sdpa_record() -> dict:
    """What an SDPA timing in this process runs on: ``{"platform"`` (:func:`torch_platform`), ``"torch"``,
    ``"cuda"``, ``"hip"`` (``torch.version``'s, None where not that build), and the library behind SDPA where
    torch says: ``"cudnn"`` (``torch.backends.cudnn.version()``, CUDA builds: cuDNN's attention), ``"rocm_fa_library"``
    (``torch.backends.cuda.preferred_rocm_fa_library()``, ROCm builds: AOTriton or CK behind flash and efficient)}``.
    A library torch does not report is left out; nothing here initialises a device."""
    import torch

    platform = torch_platform()
    record = {"platform": platform, "torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
              "hip": getattr(torch.version, "hip", None)}
    try:
        if platform == "cuda":  # on ROCm torch.backends.cudnn is MIOpen, which SDPA does not use
            cudnn = torch.backends.cudnn.version()
            if cudnn is not None:
                record["cudnn"] = cudnn
        elif platform == "hip":
            library = torch.backends.cuda.preferred_rocm_fa_library()
            record["rocm_fa_library"] = getattr(library, "name", str(library))
    except Exception:  # noqa: BLE001 - an older torch without the query: the record goes without it
        pass
    return record


def record_platform(record) -> Optional[str]:
    """The platform (``"hip"``, ``"cuda"``, ``"cpu"``) an :func:`sdpa_record` names, or None for no record."""
    if not isinstance(record, dict):
        return None
    if record.get("platform") in PLATFORM_NAMES:
        return record["platform"]
    if record.get("hip"):
        return "hip"
    return "cuda" if record.get("cuda") else None


def runtime_platform(runtime) -> Optional[str]:
    """The GPU platform a database fingerprint's ``runtime`` (``"cuda 13.0"``, ``"hip 6.4.43482"``,
    :func:`rocmflash.db.files.environment`) names, or None: ``"cpu"`` (the last save was on a machine without a
    GPU runtime, e.g. a static tune: it says nothing of where entries were timed), missing, or unknown."""
    if not isinstance(runtime, str):
        return None
    name = runtime.split(" ", 1)[0].lower()
    return name if name in ("cuda", "hip") else None


def lower_priority(increment: int) -> None:
    """Raise this process's niceness by ``increment`` (what it spawns inherits it): the helper processes of a tune
    (compile and pre-warm workers) yield the CPU to its timing workers and scheduler. A no-op where the OS has no
    ``nice`` or refuses."""
    import os

    try:
        os.nice(increment)
    except (AttributeError, OSError):
        pass


__all__ = ["VISIBILITY_VARS", "SDPA_BACKENDS", "is_rocm", "visible_devices_env", "visible_device_ids", "sdpa_backends",
           "missing_sdpa_backend", "sdpa_backend_enum", "varlen_attn", "lower_priority", "PLATFORM_NAMES",
           "torch_platform", "sdpa_record", "record_platform", "runtime_platform"]
