"""Where a kernel touches scratch memory, read from its AMD assembly text.

The code object's metadata says *that* a kernel spills (``.vgpr_spill_count``,
``.private_segment_fixed_size``) but not *where*. A value spilled once before the
KV loop and reloaded once after it costs a few memory round trips per workgroup;
a reload inside the loop costs one on every iteration. This module reads LLVM's
assembly (Triton's ``compiled.asm["amdgcn"]``, the ``.amdgcn`` file beside each
``.hsaco`` in a Triton cache) and counts scratch loads and stores inside and
outside loop bodies (loops: :mod:`isa_tools.asm_cfg`).

What counts as scratch traffic, as LLVM emits it for spills (checked on Triton 3.6
compiles that spill):

* gfx942 and gfx950 use architected flat scratch: ``scratch_load_*`` and
  ``scratch_store_*`` (LLVM comments them ``; 16-byte Folded Spill/Reload``);
* gfx90a spills through MUBUF ``buffer_load_*``/``buffer_store_*`` with the scratch
  resource: the private segment buffer SGPRs ``s[0:3]``, which the prologue copies
  (``s_mov_b64 s[40:41], s[0:1]`` ...) and offsets by the wave's scratch offset.
  Triton's own global loads on gfx90a are buffer loads too (``... s[0:3], 0 offen``
  with a resource it rebuilt in s0-s3), so a buffer access is scratch only when LLVM
  comments it as a spill or reload, or its resource is that prologue copy.

SGPR spills normally touch no memory: LLVM parks them in lanes of a VGPR with
``v_writelane_b32`` and reads them back with ``v_readlane_b32`` (counted as
``lane_ops``: every write-lane, and the read-lanes from a VGPR that a write-lane
filled; Triton's cross-lane reductions read lanes of ordinary VGPRs and do not
count). Only when no VGPR lane is free do SGPR spills go through scratch, and then
they count as scratch too.

Pure text processing; no torch, no Triton.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from isa_tools.asm_cfg import Instruction, in_loop_flags, parse_function, split_functions

#: ``amdhsa`` directive saying kernels get the private segment buffer in s[0:3] (gfx90a-style scratch)
_PRIVATE_SEGMENT_BUFFER = re.compile(r"^\s*\.amdhsa_user_sgpr_private_segment_buffer\s+1\b", re.M)
_WIDTH_BYTES = {"ubyte": 1, "sbyte": 1, "byte": 1, "b8": 1, "u8": 1, "i8": 1, "ushort": 2, "sshort": 2,
                "short": 2, "b16": 2, "u16": 2, "i16": 2, "dword": 4, "b32": 4, "dwordx2": 8, "b64": 8,
                "dwordx3": 12, "b96": 12, "dwordx4": 16, "b128": 16}


@dataclasses.dataclass(frozen=True)
class ScratchUse:
    """Scratch loads/stores of one kernel, split by where they sit: inside a loop body or outside.

    ``known`` is False when no assembly was available (a bare ``.hsaco``); every count
    is then None. Byte counts are per lane and count each instruction once: the loop
    figure is what one pass over every loop body moves if every path is taken.
    """

    known: bool
    loads: Optional[int] = None  #: scratch loads (reloads) anywhere in the kernel
    stores: Optional[int] = None  #: scratch stores (spills) anywhere in the kernel
    loop_loads: Optional[int] = None  #: of ``loads``, inside a loop body
    loop_stores: Optional[int] = None  #: of ``stores``, inside a loop body
    loop_bytes: Optional[int] = None  #: bytes per lane the in-loop scratch instructions move
    outside_bytes: Optional[int] = None  #: bytes per lane the scratch instructions outside loops move
    store_bytes: Optional[int] = None  #: bytes per lane all scratch stores write (4 x ``.vgpr_spill_count``)
    lane_ops: Optional[int] = None  #: write/read-lane moves of SGPR spills kept in VGPR lanes (no memory)
    loop_lane_ops: Optional[int] = None  #: of ``lane_ops``, inside a loop body
    loops: Optional[int] = None  #: natural loops (distinct loop headers)
    loop_instructions: Optional[int] = None  #: instructions inside loop bodies
    instructions: Optional[int] = None  #: all instructions of the kernel

    @property
    def ops(self) -> Optional[int]:
        """All scratch loads and stores (None when unknown)."""
        return None if not self.known else self.loads + self.stores

    @property
    def loop_ops(self) -> Optional[int]:
        """Scratch loads and stores inside loop bodies (None when unknown)."""
        return None if not self.known else self.loop_loads + self.loop_stores

    @property
    def outside_ops(self) -> Optional[int]:
        """Scratch loads and stores outside every loop body (None when unknown)."""
        return None if not self.known else self.ops - self.loop_ops

    def to_dict(self) -> dict:
        """Flat record keyed by :data:`SCRATCH_KEYS`, as kernel summaries and observations carry it."""
        record = {"scratch_asm_known": self.known}
        record.update({f"scratch_{f.name}": getattr(self, f.name) for f in dataclasses.fields(self)
                       if f.name != "known"})
        return record

    @classmethod
    def from_dict(cls, record: dict) -> "ScratchUse":
        """Inverse of :meth:`to_dict`; a record without the keys (e.g. NVIDIA, old data) is :data:`UNKNOWN`."""
        if not record.get("scratch_asm_known"):
            return UNKNOWN
        return cls(True, **{f.name: record[f"scratch_{f.name}"] for f in dataclasses.fields(cls)
                            if f.name != "known"})


#: keys :meth:`ScratchUse.to_dict` adds to a kernel summary
SCRATCH_KEYS = ("scratch_asm_known",) + tuple(f"scratch_{f.name}" for f in dataclasses.fields(ScratchUse)
                                              if f.name != "known")
UNKNOWN = ScratchUse(known=False)


def scratch_resources(instructions: list[Instruction], private_segment_buffer: bool) -> set[str]:
    """SGPR tuples holding the scratch buffer resource (gfx90a-style MUBUF scratch).

    The resource of every buffer access LLVM comments as a spill or reload, and, when
    the kernel receives the private segment buffer in ``s[0:3]``, the 4-SGPR copy the
    prologue makes of it (``s_mov_b64`` from ``s[0:1]`` and ``s[2:3]`` before anything
    else writes s0-s3). ``s[0:3]`` itself is not assumed: once the copy is made, Triton
    builds its own global buffer resources there (checked on gfx90a).
    """
    found, low, high = set(), set(), set()
    pristine = private_segment_buffer
    for ins in instructions:
        if pristine and ins.mnemonic == "s_mov_b64":
            dest, _, src = (part.strip() for part in ins.operands.partition(","))
            base = _tuple_base(dest)
            if base is not None and src == "s[0:1]":
                low.add(base)
            elif base is not None and src == "s[2:3]":
                high.add(base - 2)
        if pristine and _writes_s0_to_s3(ins):
            pristine = False
        if _is_buffer_access(ins.mnemonic) and _is_spill_comment(ins.comment):
            rsrc = _buffer_rsrc(ins)
            if rsrc:
                found.add(rsrc)
    found.update(f"s[{b}:{b + 3}]" for b in low & high)
    return found


#: instructions whose first operand is read, not written (memory stores and loads name VGPRs or
#: resources first; compares and branches write no SGPR)
_NO_SGPR_DEST = ("buffer_", "scratch_", "global_", "flat_", "ds_", "s_cmp", "s_bitcmp", "s_cbranch", "s_branch",
                 "s_store", "s_buffer_store", "s_setpc", "s_waitcnt", "s_nop")


def _writes_s0_to_s3(ins: Instruction) -> bool:
    """Whether the instruction's destination (its first operand) overlaps s0-s3."""
    dest = ins.operands.split(",")[0].strip()
    match = re.fullmatch(r"s(\d+)|s\[(\d+):(\d+)\]", dest)
    if not match or ins.mnemonic.startswith(_NO_SGPR_DEST):
        return False
    first = int(match.group(1) or match.group(2))
    return first <= 3


def _tuple_base(register: str) -> Optional[int]:
    match = re.fullmatch(r"s\[(\d+):(\d+)\]", register)
    return int(match.group(1)) if match else None


def _is_buffer_access(mnemonic: str) -> bool:
    return mnemonic.startswith(("buffer_load", "buffer_store"))


def _is_spill_comment(comment: str) -> bool:
    return "Spill" in comment or "Reload" in comment


def _buffer_rsrc(ins: Instruction) -> Optional[str]:
    operands = [part.strip() for part in ins.operands.split(",")]
    return operands[2].split()[0] if len(operands) >= 3 and operands[2] else None


def scratch_kind(ins: Instruction, rsrcs: set[str]) -> Optional[str]:
    """``"load"`` or ``"store"`` when the instruction reads or writes scratch memory, else None."""
    m = ins.mnemonic
    if m.startswith("scratch_load"):
        return "load"
    if m.startswith("scratch_store"):
        return "store"
    if _is_buffer_access(m) and (_is_spill_comment(ins.comment) or _buffer_rsrc(ins) in rsrcs):
        return "load" if m.startswith("buffer_load") else "store"
    return None


def lane_spill_vgprs(instructions: list[Instruction]) -> set[str]:
    """VGPRs that ``v_writelane_b32`` writes: where LLVM parks spilled SGPRs."""
    return {_operand(ins, 0) for ins in instructions if ins.mnemonic == "v_writelane_b32"}


def is_lane_spill(ins: Instruction, lane_vgprs: set[str]) -> bool:
    """A write-lane, or a read-lane from a VGPR a write-lane filled (an SGPR spill or its reload)."""
    if ins.mnemonic == "v_writelane_b32":
        return True
    return ins.mnemonic == "v_readlane_b32" and _operand(ins, 1) in lane_vgprs


def _operand(ins: Instruction, index: int) -> Optional[str]:
    operands = [part.strip() for part in ins.operands.split(",")]
    return operands[index] if index < len(operands) else None


def access_bytes(mnemonic: str) -> int:
    """Bytes per lane one load/store moves, from its width suffix (``_dwordx4`` → 16); 4 if unknown."""
    for part in reversed(mnemonic.split("_")):
        if part in _WIDTH_BYTES:
            return _WIDTH_BYTES[part]
    return 4


def function_scratch_use(lines: list[str], private_segment_buffer: bool = False) -> ScratchUse:
    """Scratch use of one function, given its body lines (see :func:`isa_tools.asm_cfg.split_functions`)."""
    items = parse_function(lines)
    instructions = [item for item in items if isinstance(item, Instruction)]
    in_loop, loops = in_loop_flags(items)
    rsrcs = scratch_resources(instructions, private_segment_buffer)
    lanes = lane_spill_vgprs(instructions)
    counts = {"load": [0, 0], "store": [0, 0], "lane": [0, 0]}  # [outside, inside]
    moved, stored = [0, 0], 0
    for ins, looped in zip(instructions, in_loop):
        kind = scratch_kind(ins, rsrcs)
        if is_lane_spill(ins, lanes):
            counts["lane"][looped] += 1
        elif kind:
            counts[kind][looped] += 1
            moved[looped] += access_bytes(ins.mnemonic)
            stored += access_bytes(ins.mnemonic) if kind == "store" else 0
    return ScratchUse(
        known=True, loads=sum(counts["load"]), stores=sum(counts["store"]), loop_loads=counts["load"][1],
        loop_stores=counts["store"][1], loop_bytes=moved[1], outside_bytes=moved[0], store_bytes=stored,
        lane_ops=sum(counts["lane"]), loop_lane_ops=counts["lane"][1], loops=loops,
        loop_instructions=sum(in_loop), instructions=len(instructions),
    )


def scratch_use_by_function(asm: str) -> dict[str, ScratchUse]:
    """:class:`ScratchUse` of every function in an AMD assembly text, by name."""
    psb = bool(_PRIVATE_SEGMENT_BUFFER.search(asm))
    return {name: function_scratch_use(lines, psb) for name, lines in split_functions(asm).items()}


def scratch_use(asm: Optional[str], name: Optional[str] = None) -> ScratchUse:
    """Scratch use of kernel ``name`` (default: the first function) in the assembly text ``asm``.

    No assembly (None or empty: only a code object was available), or a text without
    the named function, gives :data:`UNKNOWN`.
    """
    if not asm:
        return UNKNOWN
    functions = scratch_use_by_function(asm)
    if name is not None:
        return functions.get(name, UNKNOWN)
    return next(iter(functions.values()), UNKNOWN)
