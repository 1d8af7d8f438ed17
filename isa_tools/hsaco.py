"""Read register and memory use out of an AMD GPU code object (HSACO).

A code object is an ELF file (``e_machine`` = EM_AMDGPU). LLVM writes two records
of what each kernel uses:

* the **metadata note** (section SHT_NOTE, note name ``AMDGPU``, type 32): a
  msgpack map with ``amdhsa.target`` and one entry per kernel (``.vgpr_count``,
  ``.agpr_count``, ``.sgpr_count``, spill counts, segment sizes, ...);
* the **kernel descriptor**, a 64-byte record at symbol ``<kernel>.kd``, which is
  what the hardware reads at dispatch: the register *allocation* (after LLVM's
  padding for ``amdgpu-waves-per-eu``) lives there, not in the note.

Occupancy must be computed from the descriptor's allocation; ``.vgpr_count`` can
be far smaller when LLVM padded the allocation to honour ``waves_per_eu``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import struct
from typing import Optional, Union

import msgpack
from elftools.common.exceptions import ELFError
from elftools.construct import ConstructError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection

from isa_tools.archs import AMD_ARCHS
from isa_tools.errors import CodeObjectError

EM_AMDGPU = 224
NT_AMDGPU_METADATA = 32
KERNEL_DESCRIPTOR_SIZE = 64

#: ELF ``e_flags & 0xff`` (EF_AMDGPU_MACH) for the architectures we name when metadata lacks a target
ELF_MACH_TO_ARCH = {0x30: "gfx908", 0x3F: "gfx90a", 0x4C: "gfx942", 0x4F: "gfx950", 0x41: "gfx1100"}
#: EI_ABIVERSION of an HSA code object → code-object version
ABI_VERSION_TO_CODE_OBJECT = {1: 3, 2: 4, 3: 5, 4: 6}
_ELF_MAGIC = b"\x7fELF"


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """What one kernel in a code object uses, as the compiler recorded it."""

    path: Optional[str]
    name: str
    symbol: str
    arch: str  #: e.g. ``"gfx942"`` (features stripped; see ``target``)
    target: str  #: full ``amdhsa.target``, e.g. ``"amdgcn-amd-amdhsa--gfx942:sramecc+"``
    code_object_version: Optional[int]
    wavefront_size: int
    vgpr_count: int  #: ``.vgpr_count``: arch VGPRs + AGPRs as LLVM counts them (no padding)
    agpr_count: int
    sgpr_count: int
    vgpr_spill_count: int
    sgpr_spill_count: int
    scratch_bytes: int  #: private segment (per work-item) bytes: spills and stack
    lds_bytes: int  #: static LDS (group segment) bytes; Triton's LDS is dynamic and shows 0 here
    kernarg_size: int
    max_workgroup_size: int
    uses_dynamic_stack: bool
    allocated_vgprs: Optional[int]  #: from the kernel descriptor; None for an unknown arch
    allocated_sgprs: Optional[int]
    accum_offset: Optional[int]  #: first AGPR index in the unified file (gfx90a+); None elsewhere

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def read_code_object(source: Union[bytes, bytearray, str, os.PathLike], path: Optional[str] = None) -> list[KernelResources]:
    """Read every kernel's resources from a code object given as bytes or a file path.

    Raises :class:`CodeObjectError` (one line, naming the file) for anything that is
    not a readable AMD code object: missing or empty file, not ELF, another
    machine's ELF, no metadata note, corrupt msgpack, a truncated object, or a
    kernel without its descriptor.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    else:
        path = os.fspath(source) if path is None else path
        data = _read_file(os.fspath(source))
    try:
        return _parse(data, path)
    except CodeObjectError as err:
        raise err.with_path(path) if path else err
    except (ELFError, ConstructError, struct.error, ValueError, KeyError, IndexError, TypeError, AttributeError,
            OverflowError, UnicodeDecodeError, MemoryError, AssertionError) as err:
        # pyelftools reports a damaged ELF through many exception types; each means
        # the same thing to a user: the bytes are not a well-formed object.
        problem = f"malformed or truncated code object ({type(err).__name__}: {_first_line(err)})"
        raise CodeObjectError(problem, path) from err


def _read_file(path: str) -> bytes:
    if os.path.isdir(path):
        raise CodeObjectError("is a directory, not a code object", path)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CodeObjectError("no such file", path) from None
    except OSError as err:
        raise CodeObjectError(f"cannot read file ({err.strerror or err})", path) from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:160] if text else "no detail"


def _parse(data: bytes, path: Optional[str]) -> list[KernelResources]:
    if not data:
        raise CodeObjectError("empty file")
    if data[:4] != _ELF_MAGIC:
        raise CodeObjectError("not an ELF file (bad magic), so not an AMD code object")
    elf = ELFFile(io.BytesIO(data))
    if elf.header["e_machine"] != "EM_AMDGPU" and elf.header["e_machine"] != EM_AMDGPU:
        raise CodeObjectError(
            f"ELF for machine {elf.header['e_machine']}, not an AMD GPU code object (EM_AMDGPU)"
        )
    metadata = _metadata(elf)
    target = metadata.get("amdhsa.target")
    arch = _arch_from_target(target) if isinstance(target, str) else None
    if arch is None:
        arch = ELF_MACH_TO_ARCH.get(elf.header["e_flags"] & 0xFF)
        target = target if isinstance(target, str) else f"amdgcn-amd-amdhsa--{arch}"
    if arch is None:
        raise CodeObjectError("metadata names no amdhsa.target and the ELF flags name no known arch")
    co_version = ABI_VERSION_TO_CODE_OBJECT.get(elf.header["e_ident"]["EI_ABIVERSION"])
    kernels = metadata.get("amdhsa.kernels")
    if not isinstance(kernels, list) or not kernels:
        raise CodeObjectError("metadata note lists no kernels (amdhsa.kernels missing or empty)")
    symbols = _symbols(elf)
    return [_kernel(elf, data, entry, symbols, arch, target, co_version, path) for entry in kernels]


def _metadata(elf: ELFFile) -> dict:
    for section in elf.iter_sections():
        if not isinstance(section, NoteSection):
            continue
        for note in section.iter_notes():
            if note["n_name"] != "AMDGPU" or note["n_type"] not in (NT_AMDGPU_METADATA, "NT_AMDGPU_METADATA"):
                continue
            desc = note["n_desc"]
            raw = desc if isinstance(desc, bytes) else str(desc).encode("latin-1")
            try:
                meta = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            except Exception as err:  # msgpack raises several unrelated types for bad input
                raise CodeObjectError(f"corrupt metadata note: msgpack could not decode it ({_first_line(err)})") from None
            if not isinstance(meta, dict):
                raise CodeObjectError("corrupt metadata note: msgpack payload is not a map")
            return meta
    raise CodeObjectError("no AMDGPU metadata note (NT_AMDGPU_METADATA); not a code object v3+ or it was stripped")


def _arch_from_target(target: str) -> Optional[str]:
    # "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-" (LLVM <= 21) or
    # "amdgpu9.42-amd-amdhsa-unknown-gfx942" (newer LLVM, e.g. Triton 3.9) -> "gfx942"
    match = re.search(r"(?:^|-)(gfx[0-9a-f]+)(?::|$)", target.strip())
    return match.group(1) if match else None


def _symbols(elf: ELFFile) -> dict:
    found = {}
    for section in elf.iter_sections():
        if isinstance(section, SymbolTableSection):
            for sym in section.iter_symbols():
                if sym.name and sym.name not in found:
                    found[sym.name] = sym
    return found


def _int_field(entry: dict, key: str, default: Optional[int] = None) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if value is None:
            raise CodeObjectError(f"kernel metadata lacks {key}")
        raise CodeObjectError(f"kernel metadata {key} is {value!r}, not an integer")
    return value


def _kernel(elf, data, entry, symbols, arch, target, co_version, path) -> KernelResources:
    if not isinstance(entry, dict):
        raise CodeObjectError("corrupt metadata: a kernel entry is not a map")
    name = entry.get(".name")
    if not isinstance(name, str):
        raise CodeObjectError("corrupt metadata: a kernel entry has no .name")
    symbol = entry.get(".symbol") if isinstance(entry.get(".symbol"), str) else f"{name}.kd"
    descriptor = _descriptor_bytes(elf, data, symbols, symbol, name)
    wavefront_size = _int_field(entry, ".wavefront_size")
    rsrc3, rsrc1 = struct.unpack_from("<II", descriptor, 44)
    code_properties = struct.unpack_from("<H", descriptor, 56)[0]
    allocated_vgprs, allocated_sgprs, accum_offset = _descriptor_allocation(
        arch, rsrc1, rsrc3, code_properties, _int_field(entry, ".sgpr_count")
    )
    return KernelResources(
        path=path,
        name=name,
        symbol=symbol,
        arch=arch,
        target=target,
        code_object_version=co_version,
        wavefront_size=wavefront_size,
        vgpr_count=_int_field(entry, ".vgpr_count"),
        agpr_count=_int_field(entry, ".agpr_count", 0),
        sgpr_count=_int_field(entry, ".sgpr_count"),
        vgpr_spill_count=_int_field(entry, ".vgpr_spill_count", 0),
        sgpr_spill_count=_int_field(entry, ".sgpr_spill_count", 0),
        scratch_bytes=_int_field(entry, ".private_segment_fixed_size", 0),
        lds_bytes=_int_field(entry, ".group_segment_fixed_size", 0),
        kernarg_size=_int_field(entry, ".kernarg_segment_size", 0),
        max_workgroup_size=_int_field(entry, ".max_flat_workgroup_size", 1024),
        uses_dynamic_stack=bool(entry.get(".uses_dynamic_stack", False)),
        allocated_vgprs=allocated_vgprs,
        allocated_sgprs=allocated_sgprs,
        accum_offset=accum_offset,
    )


def _descriptor_bytes(elf, data, symbols, symbol: str, name: str) -> bytes:
    sym = symbols.get(symbol)
    if sym is None:
        raise CodeObjectError(f"kernel {name!r} has no kernel descriptor symbol {symbol!r}")
    shndx = sym["st_shndx"]
    if not isinstance(shndx, int) or shndx >= elf.num_sections():
        raise CodeObjectError(f"kernel descriptor {symbol!r} points at no section")
    section = elf.get_section(shndx)
    offset = sym["st_value"] - section["sh_addr"] + section["sh_offset"]
    end = offset + KERNEL_DESCRIPTOR_SIZE
    if offset < 0 or end > len(data) or sym["st_value"] < section["sh_addr"]:
        raise CodeObjectError(f"kernel descriptor {symbol!r} lies outside the file (truncated object?)")
    return data[offset:end]


def _descriptor_allocation(arch_name, rsrc1, rsrc3, code_properties, sgpr_count):
    """Allocated VGPRs/SGPRs and accum_offset decoded from the descriptor's rsrc fields."""
    arch = AMD_ARCHS.get(arch_name)
    if arch is None:
        return None, None, None
    vgpr_field = rsrc1 & 0x3F
    sgpr_field = (rsrc1 >> 6) & 0xF
    if arch.wavefront_size == 32:  # gfx10+: the encoding unit depends on the wave size used
        wave32 = bool(code_properties & (1 << 10))
        vgpr_unit = 8 if wave32 else 4
    else:
        vgpr_unit = arch.vgpr_encode_granule
    allocated_vgprs = (vgpr_field + 1) * vgpr_unit
    # From gfx10 on the SGPR field is reserved (SGPRs are not allocated per wave).
    allocated_sgprs = (sgpr_field + 1) * arch.sgpr_encode_granule if arch.sgprs_limit_waves else sgpr_count
    accum_offset = ((rsrc3 & 0x3F) + 1) * 4 if arch.unified_vgpr_file else None
    return allocated_vgprs, allocated_sgprs, accum_offset
