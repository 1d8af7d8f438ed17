"""Control flow of AMD assembly text: functions, basic blocks, and which instructions sit in loops.

Reads LLVM's AMDGPU assembly (``llc`` output, as Triton keeps it in
``compiled.asm["amdgcn"]``). Loops are natural loops of the control-flow graph:
an edge ``u → h`` is a back edge when ``h`` dominates ``u``, and the loop body is
``h`` plus every block that reaches ``u`` without passing through ``h``. Nested
loops lie inside their outer loop's body, so they count as loop.

Why not "any branch to an earlier label is a loop"? LLVM's block placement may put
a shared exit (e.g. the epilogue) *before* a later loop, and that loop's exit
branch then jumps backwards without closing a loop; counting the span between
label and branch would call the whole epilogue a loop body. The dominance test
rejects such edges: the epilogue does not dominate the loop that jumps to it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Union

_LABEL = re.compile(r"^([A-Za-z_.$][\w.$]*):")
_FUNCTION_TYPE = re.compile(r"^\s*\.type\s+([\w.$]+)\s*,\s*@function", re.M)
#: instructions after which control never falls through to the next line
_NO_FALLTHROUGH = ("s_branch", "s_endpgm", "s_setpc_b64")


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction line of a function: mnemonic, operand text and LLVM's trailing comment."""

    mnemonic: str
    operands: str
    comment: str


@dataclasses.dataclass
class Block:
    """A basic block: instruction indices ``first`` (inclusive) to ``end`` (exclusive) and its successors."""

    first: int
    end: int
    last_mnemonic: Optional[str] = None
    successors: list = dataclasses.field(default_factory=list)


Item = Union[str, Instruction]  #: a label name or an instruction


def split_functions(asm: str) -> dict[str, list[str]]:
    """The body lines of every function in the assembly text, by name, in order of appearance.

    A function runs from its ``name:`` label (declared ``.type name,@function``) to
    the next ``.Lfunc_end`` label; the metadata after it belongs to no function.
    """
    names = set(_FUNCTION_TYPE.findall(asm))
    functions: dict[str, list[str]] = {}
    current: Optional[list[str]] = None
    for line in asm.splitlines():
        match = _LABEL.match(line)
        if match and match.group(1) in names:
            current = functions.setdefault(match.group(1), [])
        elif match and match.group(1).startswith(".Lfunc_end"):
            current = None
        elif current is not None:
            current.append(line)
    return functions


def parse_line(line: str) -> Optional[Item]:
    """A label name, an :class:`Instruction`, or None for directives, comments and blank lines."""
    match = _LABEL.match(line)
    if match:
        return match.group(1)
    code, _, comment = line.partition(";")
    code = code.strip()
    if not code or code.startswith("."):
        return None
    mnemonic, _, operands = code.partition(" ")
    return Instruction(mnemonic, operands.strip(), comment.strip())


def parse_function(lines: list[str]) -> list[Item]:
    """A function's labels and instructions in order (directives and comments dropped)."""
    return [item for item in map(parse_line, lines) if item is not None]


def is_branch(mnemonic: str) -> bool:
    """``s_branch`` or a conditional ``s_cbranch_*``."""
    return mnemonic == "s_branch" or mnemonic.startswith("s_cbranch_")


def branch_target(ins: Instruction) -> str:
    """The label a branch names."""
    return ins.operands.split(",")[0].strip()


def basic_blocks(items: list[Item]) -> list[Block]:
    """The basic blocks of a parsed function, as LLVM's machine blocks.

    A label starts a block; a branch ends one, except that a conditional branch and
    the unconditional branch right after it are the same block's terminators (as in
    LLVM, whose loop comments this then matches). Successors are branch targets plus
    the next block when control can fall through.
    """
    blocks, labels, targets = [Block(0, 0)], {}, []
    index, after_branch = 0, False
    for item in items:
        if isinstance(item, str):
            if blocks[-1].end > blocks[-1].first:
                blocks.append(Block(index, index))
            labels[item] = len(blocks) - 1
            after_branch = False
            continue
        if after_branch and not is_branch(item.mnemonic):
            blocks.append(Block(index, index))
        index += 1
        blocks[-1].end, blocks[-1].last_mnemonic = index, item.mnemonic
        after_branch = is_branch(item.mnemonic) or item.mnemonic in _NO_FALLTHROUGH
        if is_branch(item.mnemonic):
            targets.append((len(blocks) - 1, branch_target(item)))
    for block, target in targets:
        if target in labels and labels[target] not in blocks[block].successors:
            blocks[block].successors.append(labels[target])
    for number, block in enumerate(blocks[:-1]):
        if block.last_mnemonic not in _NO_FALLTHROUGH and number + 1 not in block.successors:
            block.successors.append(number + 1)
    return blocks


def dominators(blocks: list[Block]) -> list[Optional[set[int]]]:
    """For each block the set of blocks dominating it (itself included); None if unreachable from block 0."""
    predecessors: list[list[int]] = [[] for _ in blocks]
    for number, block in enumerate(blocks):
        for succ in block.successors:
            predecessors[succ].append(number)
    reachable = _reachable(blocks)
    every = set(reachable)
    dom: list[Optional[set[int]]] = [every.copy() if b in every else None for b in range(len(blocks))]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for b in sorted(reachable - {0}):
            incoming = [dom[p] for p in predecessors[b] if dom[p] is not None]
            new = set.intersection(*incoming) | {b} if incoming else {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def _reachable(blocks: list[Block]) -> set[int]:
    seen, stack = {0}, [0]
    while stack:
        for succ in blocks[stack.pop()].successors:
            if succ not in seen:
                seen.add(succ)
                stack.append(succ)
    return seen


def natural_loops(blocks: list[Block]) -> dict[int, set[int]]:
    """``{header block: body blocks}`` of every natural loop (back edges to one header merged)."""
    dom = dominators(blocks)
    predecessors: list[list[int]] = [[] for _ in blocks]
    for number, block in enumerate(blocks):
        for succ in block.successors:
            predecessors[succ].append(number)
    loops: dict[int, set[int]] = {}
    for tail, block in enumerate(blocks):
        for head in block.successors:
            if dom[tail] is not None and head in dom[tail]:
                body = loops.setdefault(head, {head})
                stack = [tail] if tail not in body else []
                body.add(tail)
                while stack:
                    for pred in predecessors[stack.pop()]:
                        if pred not in body:
                            body.add(pred)
                            stack.append(pred)
    return loops


def in_loop_flags(items: list[Item]) -> tuple[list[bool], int]:
    """Per instruction of a parsed function: is it inside a loop body? Also the number of loops."""
    blocks = basic_blocks(items)
    loops = natural_loops(blocks)
    looped = set().union(*loops.values()) if loops else set()
    flags = [False] * (blocks[-1].end if blocks else 0)
    for number in looped:
        block = blocks[number]
        flags[block.first:block.end] = [True] * (block.end - block.first)
    return flags, len(loops)
