"""Find code objects in Triton cache directories and pair each with Triton's metadata.

Triton stores each compiled kernel in ``<cache>/<hash>/<name>.hsaco`` beside
``<name>.json``. The json holds what the code object cannot: the dynamic LDS
Triton requests at launch (``shared``) and ``num_warps`` (waves per workgroup).
The assembly text ``<name>.amdgcn`` beside them says where scratch is used.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterator, Optional

from isa_tools.errors import CodeObjectError
from isa_tools.hsaco import KernelResources, read_code_object


@dataclasses.dataclass(frozen=True)
class TritonMeta:
    """The fields of Triton's per-kernel metadata json that occupancy needs."""

    shared: int  #: dynamic LDS bytes requested at launch
    num_warps: int  #: waves per workgroup
    extra: dict  #: the rest of Triton's metadata (options such as waves_per_eu)


def triton_meta_for(hsaco_path: str) -> Optional[TritonMeta]:
    """Triton's metadata json next to ``hsaco_path``, or None when there is none or it is unreadable."""
    json_path = os.path.splitext(hsaco_path)[0] + ".json"
    try:
        with open(json_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    shared, num_warps = meta.get("shared"), meta.get("num_warps")
    if not isinstance(shared, int) or not isinstance(num_warps, int):
        return None
    keep = ("name", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack", "schedule_hint", "arch")
    return TritonMeta(shared, num_warps, {k: meta[k] for k in keep if k in meta})


def triton_asm_for(hsaco_path: str) -> Optional[str]:
    """The assembly text Triton keeps beside a code object (``<name>.amdgcn``), or None when absent/unreadable."""
    try:
        with open(os.path.splitext(hsaco_path)[0] + ".amdgcn", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def find_code_objects(path: str) -> list[str]:
    """The ``.hsaco`` files under a directory (sorted), or ``[path]`` for a file.

    A directory with no code objects is an error: the user pointed at the wrong place.
    """
    if os.path.isdir(path):
        found = sorted(
            os.path.join(root, name)
            for root, _, names in os.walk(path)
            for name in names
            if name.endswith(".hsaco")
        )
        if not found:
            raise CodeObjectError("directory holds no .hsaco code objects", path)
        return found
    return [path]


def iter_kernels(paths: list[str]) -> Iterator[tuple[KernelResources, Optional[TritonMeta]]]:
    """Every kernel in the given files and directories, with Triton's metadata when it is beside it."""
    for path in paths:
        for hsaco in find_code_objects(path):
            meta = triton_meta_for(hsaco)
            for kernel in read_code_object(hsaco):
                yield kernel, meta
