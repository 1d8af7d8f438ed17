"""Which fp8 formats each arch computes in, and what a kernel needs of a format (its Triton type,
largest finite value, rounding). The formats per arch: :mod:`rocmflash.api.fp8` (which re-exports these names).

A hardware fact, below the kernels and the static phase: the fp8 kernels and the config space read it
without importing the attention API.
"""

from __future__ import annotations

import functools
from typing import Optional

FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")
#: torch fp8 dtype name -> (family, Triton element type, largest finite value, mantissa bits); no torch needed
_FORMATS = {
    "float8_e4m3fn": ("ocp", "fp8e4nv", 448.0, 3),
    "float8_e5m2": ("ocp", "fp8e5", 57344.0, 2),
    "float8_e4m3fnuz": ("fnuz", "fp8e4b8", 240.0, 3),
    "float8_e5m2fnuz": ("fnuz", "fp8e5b16", 57344.0, 2),
}
#: Triton's fp8 element types and their family (a cross-compile asks, without torch)
TRITON_FAMILY = {triton: family for family, triton, _, _ in _FORMATS.values()}
_FAMILY_NAMES = {"ocp": "OCP", "fnuz": "FNUZ"}


@functools.lru_cache(maxsize=None)
def _tables() -> dict:
    """The tables keyed by torch dtypes, made at their first use: the static phase's compile workers import this
    module and never import torch (seconds per process)."""
    import torch

    fp8_dtypes = {getattr(torch, name): info for name, info in _FORMATS.items()}
    return {"FP8_DTYPES": fp8_dtypes,
            "FAMILY_DTYPES": {family: tuple(d for d, info in fp8_dtypes.items() if info[0] == family)
                              for family in ("ocp", "fnuz")},
            "OUT_DTYPES": (torch.bfloat16, torch.float16)}


def __getattr__(name: str):
    """``FP8_DTYPES`` (torch fp8 dtype -> family, Triton type, largest finite value, mantissa bits),
    ``FAMILY_DTYPES`` (family -> its dtypes) and ``OUT_DTYPES``."""
    if name in ("FP8_DTYPES", "FAMILY_DTYPES", "OUT_DTYPES"):
        return _tables()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_fp8(dtype) -> bool:
    """Whether ``dtype`` is one of torch's four fp8 dtypes."""
    return dtype in _tables()["FP8_DTYPES"]


def fp8_family(arch: Optional[str]) -> Optional[str]:
    """``"fnuz"`` (gfx940-942), ``"ocp"`` (gfx950, sm_89+) or None (no fp8 matrix instructions) for an arch
    such as ``gfx942``, ``gfx942:sramecc+:xnack-`` or ``sm_90``."""
    arch = str(arch or "").split(":", 1)[0].strip().lower()
    if arch in FNUZ_ARCHS:
        return "fnuz"
    if arch == "gfx950":
        return "ocp"
    if arch.startswith("sm_"):
        digits = "".join(c for c in arch[3:] if c.isdigit())
        return "ocp" if digits and int(digits) >= 89 else None
    return None


def _names(dtypes) -> str:
    return " or ".join(str(d) for d in dtypes)


def check_format(dtype, arch: Optional[str], name: str = "q") -> None:
    """Raise a one-line ``TypeError`` unless the fp8 ``dtype`` is the family ``arch`` computes in.

    ``arch`` None (unknown: the interpreter without a GPU) accepts every fp8 dtype."""
    tables = _tables()
    if not is_fp8(dtype):
        raise TypeError(f"{name}.dtype must be an fp8 dtype ({_names(tables['FP8_DTYPES'])}), got {dtype}")
    if arch is None:
        return
    want = fp8_family(arch)
    if want is None:
        raise TypeError(f"{name}.dtype is {dtype}, but {arch} has no fp8 matrix instructions: fp8 attention needs "
                        f"gfx942 (FNUZ: {_names(tables['FAMILY_DTYPES']['fnuz'])}) or gfx950/sm_89+ "
                        f"(OCP: {_names(tables['FAMILY_DTYPES']['ocp'])}); pass float16 or bfloat16 on {arch}")
    have = tables["FP8_DTYPES"][dtype][0]
    if have != want:
        raise TypeError(f"{name}.dtype is {dtype} ({_FAMILY_NAMES[have]} fp8), but {arch} computes in "
                        f"{_FAMILY_NAMES[want]} fp8: expected {_names(tables['FAMILY_DTYPES'][want])}")


def fp8_max(dtype) -> float:
    """The largest finite value of an fp8 dtype (448 e4m3fn, 240 e4m3fnuz, 57344 e5m2/e5m2fnuz)."""
    return _tables()["FP8_DTYPES"][dtype][2]


def triton_type(dtype) -> str:
    """Triton's name of an fp8 element type (``fp8e4nv``, ``fp8e5``, ``fp8e4b8``, ``fp8e5b16``)."""
    return _tables()["FP8_DTYPES"][dtype][1]


def unit_roundoff(dtype) -> float:
    """``2**-(mantissa bits + 1)``: the relative error of rounding to nearest in the dtype's normal range
    (2**-4 for the e4m3 formats, 2**-3 for e5m2)."""
    return 2.0 ** -(_tables()["FP8_DTYPES"][dtype][3] + 1)
