"""What a config's static verdict rests on, as a database entry records it, and the compiler that produced it.

A tune judges each config on the compiler's own truth (:mod:`rocmflash.static.prune`). The same config can compile
to more registers, spill, or lose occupancy under another Triton/LLVM, so an entry records, beside the winner and
each near-best (or ranked) config it keeps, the **static profile** it was judged by (:func:`static_profile`) and, per
entry, the **compiler** (:func:`compiler_identity`). ``rocmflash check-db`` (:mod:`rocmflash.static.check_db`)
compiles the same configs with the installed Triton and compares (:func:`compare_profiles`).

A profile is a small JSON object (no tensors, no Triton import to read it)::

    {"status": "ok", "kernel": "_fwd_online", "vgprs": 168, "agprs": 0, "sgprs": 48, "vgpr_spills": 0,
     "sgpr_spills": 0, "scratch_bytes": 0, "spills_in_loop": false, "scratch_loop_ops": 0, "lds_bytes": 32768,
     "waves_per_simd": 2, "limiter": "vgpr"}

Registers, LDS, occupancy and the limiter are the main kernel's (the first a family compiles: the attention kernel,
not e.g. the decode's combine); the spill fields sum over every kernel of the build, as the ``spills`` rule reads
them all. ``spills_in_loop`` is None where no assembly was read (NVIDIA: SASS is not read; a bare code object).
``waves_per_simd`` is waves per SIMD on AMD and warps per scheduler on NVIDIA. A build that failed is
``{"status": "failed", "error": "<first line>"}``.
"""

from __future__ import annotations

import functools
import io
import os
import re
from typing import Optional

# scratch bytes per lane past which a spill is a regression even outside loops: the pruner's harmless budget
from rocmflash.static.prune import HARMLESS_SPILL_BYTES

#: the fields of a profile of a build that compiled, in the order they are written
PROFILE_FIELDS = ("status", "kernel", "vgprs", "agprs", "sgprs", "vgpr_spills", "sgpr_spills", "scratch_bytes",
                  "spills_in_loop", "scratch_loop_ops", "lds_bytes", "waves_per_simd", "limiter")


def static_profile(observation: dict) -> dict:
    """The profile (see the module docstring) of one observation of :mod:`rocmflash.static.compile`."""
    if observation.get("status") != "ok" or not observation.get("kernels"):
        error = observation.get("error") or "compile failed"
        return {"status": "failed", "error": str(error).splitlines()[0][:300] if str(error) else "compile failed"}
    kernels = observation["kernels"]
    main = kernels[0]
    in_loop = [_loop_ops(k) for k in kernels]
    known = all(ops is not None for ops in in_loop)
    return {
        "status": "ok",
        "kernel": main.get("name"),
        "vgprs": main.get("allocated_vgprs") or main.get("vgpr_count"),
        "agprs": main.get("agpr_count"),
        "sgprs": main.get("allocated_sgprs") or main.get("sgpr_count"),
        "vgpr_spills": sum(int(k.get("vgpr_spill_count") or 0) for k in kernels),
        "sgpr_spills": sum(int(k.get("sgpr_spill_count") or 0) for k in kernels),
        "scratch_bytes": max(int(k.get("scratch_bytes") or 0) for k in kernels),
        "spills_in_loop": (sum(in_loop) > 0) if known else None,
        "scratch_loop_ops": sum(in_loop) if known else None,
        "lds_bytes": int(main.get("lds_bytes") or 0) + int(main.get("dynamic_lds_bytes") or 0),
        "waves_per_simd": main.get("waves_per_simd"),
        "limiter": main.get("limiter"),
    }


def _loop_ops(kernel: dict) -> Optional[int]:
    """Scratch loads, stores and SGPR lane moves inside loops (:mod:`isa_tools.scratch`); None: assembly not read."""
    if not kernel.get("scratch_asm_known"):
        return None if _spilled(kernel) else 0  # nothing spilled: nothing can be in the loop, read or not
    return (int(kernel.get("scratch_loop_loads") or 0) + int(kernel.get("scratch_loop_stores") or 0)
            + (int(kernel.get("scratch_loop_lane_ops") or 0) if kernel.get("sgpr_spill_count") else 0))


def _spilled(kernel: dict) -> bool:
    return bool(kernel.get("vgpr_spill_count") or kernel.get("sgpr_spill_count") or kernel.get("scratch_bytes"))


def profile_from_ranked_row(row: dict) -> Optional[dict]:
    """The part of a profile a schema-1 static entry's ``ranked`` row holds (occupancy, VGPRs, LDS; no spills:
    the row of a kept config, so none that pruned), or None when the row says nothing."""
    if not isinstance(row, dict) or row.get("waves_per_simd") is None:
        return None
    return {"status": "ok", "vgprs": row.get("allocated_vgprs"), "lds_bytes": row.get("lds_bytes"),
            "waves_per_simd": row.get("waves_per_simd"), "partial": "ranked row"}


# ---------------------------------------------------------------------- the comparison
def compare_profiles(then: Optional[dict], now: dict) -> tuple:
    """``(regressions, changes)``: what got worse from ``then`` (the record; None: unrecorded) to ``now`` (the
    build under the installed compiler), and what changed without costing anything (lists of short phrases).

    A regression is what makes a served config no longer hold: it fails to build; it spills inside a loop (paid
    every iteration) where the record did not; it keeps fewer waves per SIMD than the record; it uses more than
    :data:`~rocmflash.static.prune.HARMLESS_SPILL_BYTES` of scratch per lane, more than the record. A field the
    record lacks (a schema-1 ``ranked`` row has no spills) is compared as "none recorded". Other differences
    (registers, LDS, an outside-the-loop spill within the budget) are ``changes``.
    """
    if now.get("status") != "ok":
        return [f"fails to build ({now.get('error') or 'compile failed'})"], []
    then = then or {}
    if then.get("status") not in (None, "ok"):
        return [], [f"built now (failed then: {then.get('error') or 'compile failed'})"]
    regressions, changes = [], []
    if now.get("spills_in_loop") and not then.get("spills_in_loop"):
        regressions.append(f"spills in the loop ({now.get('scratch_loop_ops')} scratch ops, "
                           f"{now.get('scratch_bytes')} B/lane)")
    waves_then, waves_now = then.get("waves_per_simd"), now.get("waves_per_simd")
    if waves_then is not None and waves_now is not None and waves_now < waves_then:
        regressions.append(f"waves/SIMD {waves_then} -> {waves_now} ({now.get('limiter')}-limited)")
    scratch_then, scratch_now = int(then.get("scratch_bytes") or 0), int(now.get("scratch_bytes") or 0)
    if scratch_now > max(scratch_then, HARMLESS_SPILL_BYTES):
        regressions.append(f"scratch {scratch_then} -> {scratch_now} B/lane")
    elif scratch_now != scratch_then and "scratch_bytes" in then:
        changes.append(f"scratch {scratch_then} -> {scratch_now} B")
    for name, label in (("vgprs", "VGPRs"), ("agprs", "AGPRs"), ("sgprs", "SGPRs"), ("lds_bytes", "LDS")):
        if then.get(name) is not None and now.get(name) is not None and then[name] != now[name]:
            changes.append(f"{label} {then[name]} -> {now[name]}")
    if waves_then is not None and waves_now is not None and waves_now > waves_then:
        changes.append(f"waves/SIMD {waves_then} -> {waves_now}")
    return regressions, changes


def profile_label(profile: Optional[dict]) -> str:
    """A profile in a table cell: ``168v 2w``, ``256v 1w spill-loop``, ``failed``, ``-`` (None)."""
    if not profile:
        return "-"
    if profile.get("status") != "ok":
        return "failed"
    text = f"{profile.get('vgprs') if profile.get('vgprs') is not None else '?'}v {profile.get('waves_per_simd')}w"
    if profile.get("spills_in_loop"):
        text += " spill-loop"
    elif profile.get("scratch_bytes"):
        text += f" spill{profile['scratch_bytes']}B"
    return text


# ---------------------------------------------------------------------- the compiler
#: ``Linker: LLD 22.0.0 (https://github.com/llvm/llvm-project f6ded0be...)``: an AMD code object's ``.comment``
_LLD = re.compile(r"LLD ([0-9][0-9.a-z-]*)(?: \((\S+) ([0-9a-f]{7,40})\))?")


def code_object_comment(data: bytes) -> Optional[str]:
    """The ``.comment`` section of an ELF code object (AMD: the linker that built it), or None."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        section = ELFFile(io.BytesIO(data)).get_section_by_name(".comment")
    except (ELFError, ValueError, OSError):
        return None
    if section is None:
        return None
    text = section.data().replace(b"\x00", b" ").decode("utf-8", "replace").strip()
    return text or None


def compiler_identity(backend: str) -> dict:
    """The compiler the installed Triton is, for ``backend`` (``"hip"`` or ``"cuda"``), as an entry records it::

        {"triton": "3.6.0", "backend": "hip", "llvm": "22.0.0", "llvm_hash": "f6ded0be...",
         "producer": "Linker: LLD 22.0.0 (...)", "build_env": {...}}

    LLVM's version and commit are read from a code object Triton builds (a tiny kernel, cross-compiled once per
    process on the CPU: on AMD the linker's ``.comment`` names the LLVM build, which is Triton's own); on CUDA the
    cubin names none, so ``ptxas`` (the wheel's, ``--version``) says which assembler built it. ``build_env``: the
    environment variables set in this process that change what Triton compiles
    (:data:`rocmflash.static.compile.BUILD_ENV_VARS`). A field that cannot be read is None, never a guess."""
    import triton

    from rocmflash.static.compile import build_env

    out = {"triton": triton.__version__, "backend": backend, "llvm": None, "llvm_hash": None, "producer": None}
    out.update(_code_object_producer(backend))
    out["build_env"] = build_env(backend)
    return out


@functools.lru_cache(maxsize=None)
def _code_object_producer(backend: str) -> dict:
    """``{"llvm", "llvm_hash", "producer"}`` of the installed Triton's builds for ``backend`` (see
    :func:`compiler_identity`); cached per process (the installed Triton does not change under it)."""
    try:
        if backend == "hip":
            comment = code_object_comment(_tiny_build("hip"))
            match = _LLD.search(comment or "")
            return {"producer": comment, "llvm": match.group(1) if match else None,
                    "llvm_hash": match.group(3) if match else None}
        if backend == "cuda":
            return {"producer": _ptxas_version()}
    except Exception as err:  # noqa: BLE001 - no compiler for it here: the record says so instead of guessing
        from rocmflash.messages import error_line

        return {"producer": f"unknown ({error_line(err, 120)})"}
    return {}


def _tiny_build(backend: str) -> bytes:
    """A code object of the smallest rocmflash kernel (:func:`rocmflash.kernels.demo.lds_reduce_kernel`), built for
    gfx942 / sm_90 into a private temporary Triton cache (nothing of the user's caches is touched)."""
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rocmflash.kernels.demo import lds_reduce_kernel

    target = GPUTarget("hip", "gfx942", 64) if backend == "hip" else GPUTarget("cuda", 90, 32)
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    saved = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="rocmflash-compiler-id-") as tmp:
        os.environ["TRITON_CACHE_DIR"] = tmp
        try:
            kernel = triton.compile(ASTSource(fn=lds_reduce_kernel, signature=signature, constexprs={"BLOCK": 64}),
                                    target=target, options={"num_warps": 1})
        finally:
            if saved is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = saved
        return kernel.asm["hsaco" if backend == "hip" else "cubin"]


def _ptxas_version() -> Optional[str]:
    """``ptxas --version``'s last line for the ptxas the Triton wheel ships (None where it has none)."""
    import subprocess

    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.isfile(path):
        return None
    text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    return text.splitlines()[-1] if text else None


def same_compiler(a: Optional[dict], b: Optional[dict]) -> bool:
    """Whether two :func:`compiler_identity` records name the same compiler (Triton, LLVM build, build env)."""
    if not a or not b:
        return False
    return all(a.get(k) == b.get(k) for k in ("triton", "backend", "llvm_hash", "producer", "build_env"))


__all__ = ["PROFILE_FIELDS", "static_profile", "profile_from_ranked_row", "compare_profiles", "profile_label",
           "code_object_comment", "compiler_identity", "same_compiler"]
