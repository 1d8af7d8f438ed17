"""Read register, local-memory (spill) and shared-memory use out of an NVIDIA cubin.

The per-kernel numbers live in ELF sections ``.nv.info`` (global) and
``.nv.info.<kernel>``: a list of attribute records, each ``format:u8 attribute:u8``
then either a 16-bit value or a 16-bit size and a payload. We read the
attributes the driver reports through ``cuFuncGetAttribute``: the register count
(``EIATTR_REGCOUNT``) and the per-thread stack frame (``EIATTR_FRAME_SIZE``),
which is where ptxas puts spills, as Triton's ``n_spills`` does. Static shared
memory is the size of ``.nv.shared.<kernel>``; Triton's shared memory is dynamic
and comes from its metadata instead.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from typing import Optional

from elftools.common.exceptions import ELFError
from elftools.construct import ConstructError
from elftools.elf.elffile import ELFFile

from isa_tools.errors import CodeObjectError

EM_CUDA = 190
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F


@dataclasses.dataclass(frozen=True)
class CudaKernelResources:
    """What one kernel in a cubin uses."""

    name: str
    arch: str  #: ``sm_90`` etc., from ``e_flags``
    registers_per_thread: int
    local_bytes: int  #: per-thread stack frame: spills and local arrays
    static_shared_bytes: int

    @property
    def spill_estimate(self) -> int:
        """Spilled 32-bit values, as Triton estimates them (local bytes / 4)."""
        return self.local_bytes // 4


def read_cubin(data: bytes, path: Optional[str] = None) -> list[CudaKernelResources]:
    """Every kernel's register/local/shared use in a cubin (bytes); :class:`CodeObjectError` if unreadable."""
    if not data:
        raise CodeObjectError("empty file", path)
    try:
        elf = ELFFile(io.BytesIO(data))
        if elf.header["e_machine"] not in ("EM_CUDA", EM_CUDA):
            raise CodeObjectError(f"ELF for machine {elf.header['e_machine']}, not a CUDA cubin", path)
        arch = _arch(elf.header["e_flags"])
        symbols = elf.get_section_by_name(".symtab")
        if symbols is None:
            raise CodeObjectError("cubin has no symbol table", path)
        names = [s.name for s in symbols.iter_symbols()]
        attrs = _attributes(elf, names)
        kernels = []
        for section in elf.iter_sections():
            if not section.name.startswith(".text."):
                continue
            name = section.name[len(".text."):]
            shared = elf.get_section_by_name(f".nv.shared.{name}")
            kernels.append(CudaKernelResources(
                name=name,
                arch=arch,
                registers_per_thread=attrs.get((name, EIATTR_REGCOUNT), 0),
                local_bytes=attrs.get((name, EIATTR_FRAME_SIZE), 0),
                static_shared_bytes=shared["sh_size"] if shared is not None else 0,
            ))
    except (ELFError, ConstructError, struct.error, ValueError, IndexError, KeyError) as err:
        if isinstance(err, CodeObjectError):
            raise
        raise CodeObjectError(f"malformed cubin ({type(err).__name__}: {err})", path) from err
    if not kernels:
        raise CodeObjectError("cubin holds no kernels", path)
    return kernels


def _arch(e_flags: int) -> str:
    # CUDA ≥ 12.x cubins (ELF ABI v8) keep the SM number in bits 15:8; older ones in bits 7:0.
    sm = (e_flags >> 8) & 0xFF
    if sm < 20:
        sm = e_flags & 0xFF
    return f"sm_{sm}"


def _attributes(elf: ELFFile, symbol_names: list[str]) -> dict:
    """``{(kernel name, attribute): value}`` for per-function attributes in all .nv.info sections."""
    found = {}
    for section in elf.iter_sections():
        if not section.name.startswith(".nv.info"):
            continue
        data = section.data()
        pos = 0
        while pos + 4 <= len(data):
            fmt, attr, value = struct.unpack_from("<BBH", data, pos)
            pos += 4
            if fmt != EIFMT_SVAL:
                continue
            payload = data[pos:pos + value]
            pos += value
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(payload) >= 8:
                sym_index, number = struct.unpack_from("<II", payload, 0)
                if sym_index < len(symbol_names):
                    found[(symbol_names[sym_index], attr)] = number
    return found
