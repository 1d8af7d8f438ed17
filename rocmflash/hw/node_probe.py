"""Which catalog GPU a node holds, read without importing torch (its import takes seconds).

A multi-GPU tune (``rocmflash tune --model ... --gpus``) can plan and start cross-compiling while torch
imports, if it knows the GPU kind. This module reads what the driver publishes:

- NVIDIA: the model name of each GPU in ``/proc/driver/nvidia/gpus/*/information`` (no arch there: the
  catalog's names decide), else ``nvidia-smi --query-gpu=name,compute_cap``;
- AMD: each KFD topology node with a GPU (``/sys/class/kfd/kfd/topology/nodes/N/properties``): its
  ``gfx_target_version`` (90402 -> gfx942), CUs (``simd_count / simd_per_cu``) and, from its memory banks,
  its VRAM. No marketing name: :func:`rocmflash.hw.detect.identify_device` decides by arch, CUs and memory.

The answer is a guess that torch confirms later (:mod:`rocmflash.cli.model`): every function returns None
rather than guess when a read fails or the node holds more than one kind of GPU.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from typing import Callable, Optional

from rocmflash.hw.detect import identify_device

NVIDIA_PROC = "/proc/driver/nvidia/gpus"
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def nvidia_reports(proc_dir: str = NVIDIA_PROC, run: Optional[Callable] = None) -> Optional[list]:
    """``[(name, arch), ...]`` of the node's NVIDIA GPUs (arch "" when only the name is known), or None."""
    names = []
    for info in sorted(glob.glob(os.path.join(proc_dir, "*", "information"))):
        match = re.search(r"^Model:\s*(.+)$", _read(info) or "", re.M)
        if match is None:
            names = []
            break
        names.append((match.group(1).strip(), ""))
    if names:
        return names
    try:
        out = (run or subprocess.run)(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                                      capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    found = []
    for line in out.stdout.strip().splitlines():
        name, _, cap = line.rpartition(",")
        major, _, minor = cap.strip().partition(".")
        if not name.strip() or not (major.isdigit() and minor.isdigit()):
            return None
        found.append((name.strip(), f"sm_{major}{minor}"))
    return found or None


def _properties(text: str) -> dict:
    props = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if value.strip().lstrip("-").isdigit():
            props[key] = int(value.strip())
    return props


def gfx_arch(target_version: int) -> str:
    """KFD's ``gfx_target_version`` as an arch name: 90402 -> ``gfx942``, 90010 -> ``gfx90a``."""
    major, minor, step = target_version // 10000, target_version // 100 % 100, target_version % 100
    return f"gfx{major}{minor}{step:x}"


def amd_reports(kfd_nodes: str = KFD_NODES) -> Optional[list]:
    """``[(arch, compute units, VRAM bytes or None), ...]`` of the node's KFD GPU nodes in node order, or None."""
    found = []
    nodes = sorted(glob.glob(os.path.join(kfd_nodes, "*")), key=lambda p: (len(p), p))
    for node in nodes:
        text = _read(os.path.join(node, "properties"))
        if text is None:
            return None
        props = _properties(text)
        if not props.get("simd_count"):
            continue  # a CPU node
        if not props.get("gfx_target_version") or not props.get("simd_per_cu"):
            return None
        vram = 0
        for bank in glob.glob(os.path.join(node, "mem_banks", "*", "properties")):
            bank_props = _properties(_read(bank) or "")
            if bank_props.get("heap_type") in (1, 2):  # frame buffer, public and private
                vram += bank_props.get("size_in_bytes", 0)
        found.append((gfx_arch(props["gfx_target_version"]), props["simd_count"] // props["simd_per_cu"],
                      vram or None))
    return found or None


def nvidia_device_name(nvidia: Optional[Callable] = None) -> Optional[str]:
    """The name every NVIDIA GPU of this node reports (the driver's model name, which CUDA reports too), or None
    when they differ or cannot be read. (KFD publishes no marketing name: there is none to give for AMD.)"""
    names = {name for name, _ in (nvidia or nvidia_reports)() or ()}
    return names.pop() if len(names) == 1 else None


def guess_node_gpu(rocm: bool, nvidia: Optional[Callable] = None, amd: Optional[Callable] = None):
    """The catalog GPU every GPU of this node is, from the driver's files (no torch), or None: a read failed,
    a GPU is not in the catalog, or the node mixes kinds (torch then decides, as without this guess)."""
    if rocm:
        reports = (amd or amd_reports)()
        matches = [identify_device("", arch, cus, vendor="amd", memory_bytes=vram)
                   for arch, cus, vram in reports or ()]
    else:
        reports = (nvidia or nvidia_reports)()
        matches = [identify_device(name, arch, 0, vendor="nvidia") for name, arch in reports or ()]
    kinds = {m.gpu.name if m.gpu is not None and not m.alternatives else None for m in matches}
    if not matches or None in kinds or len(kinds) != 1:
        return None
    return matches[0].gpu


__all__ = ["nvidia_reports", "amd_reports", "gfx_arch", "guess_node_gpu", "nvidia_device_name"]
