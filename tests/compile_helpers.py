"""Cross-compile many real Triton kernels for AMD targets in a process pool (test helper).

Each result carries the code object, the compiler's assembly text and Triton's
metadata, so tests compare isa_tools against what LLVM itself printed.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import os
import re

from rocmflash.kernels.demo import FA_LIKE_SIGNATURE as FA_SIGNATURE

GEMM_SIGNATURE = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
                  "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32", "BLOCK_M": "constexpr",
                  "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
REDUCE_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


def compile_one(spec: dict) -> dict:
    """Compile one spec ``{kernel, arch, constexprs, options}``; returns bytes, asm and metadata."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import rocmflash.kernels.demo as demo_kernels

    fn = getattr(demo_kernels, spec["kernel"])
    signature = {"fa_like_kernel": FA_SIGNATURE, "gemm_kernel": GEMM_SIGNATURE,
                 "lds_reduce_kernel": REDUCE_SIGNATURE}[spec["kernel"]]
    src = ASTSource(fn=fn, signature=signature, constexprs=spec["constexprs"])
    compiled = triton.compile(src, target=GPUTarget("hip", spec["arch"], 64), options=dict(spec["options"]))
    return {"spec": spec, "hsaco": compiled.asm["hsaco"], "amdgcn": compiled.asm["amdgcn"],
            "shared": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps}


def _use_cache_dir(cache_dir: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir


def compile_many(specs: list[dict], cache_dir: str, workers: int | None = None) -> list[dict]:
    """Compile specs in parallel into a fresh Triton cache directory (so every compile is real).

    Workers are spawned, so no parent state (or GPU context) leaks into them.
    """
    workers = workers or max(1, os.cpu_count() or 1)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_use_cache_dir,
                                                initargs=(str(cache_dir),)) as pool:
        return list(pool.map(compile_one, specs, chunksize=4))


def agreement_specs() -> list[dict]:
    """FA-like and GEMM-like kernels over gfx90a/gfx942/gfx950 and the knobs that move registers."""
    specs = []
    archs = ["gfx90a", "gfx942", "gfx950"]
    fa_tiles = [(128, 64, 128), (64, 64, 64), (128, 128, 64), (64, 32, 128)]
    for arch, (bm, bn, d), wpe, nw, nonk in itertools.product(archs, fa_tiles, range(5), (4, 8), (16, 32)):
        specs.append({"kernel": "fa_like_kernel", "arch": arch,
                      "constexprs": {"BLOCK_M": bm, "BLOCK_N": bn, "HEAD_DIM": d},
                      "options": {"num_warps": nw, "num_stages": 1, "waves_per_eu": wpe,
                                  "matrix_instr_nonkdim": nonk}})
    gemm_tiles = [(128, 128, 64), (64, 64, 32), (256, 128, 64)]
    for arch, (bm, bn, bk), wpe, nw, nonk in itertools.product(archs, gemm_tiles, (0, 2, 4), (4, 8), (16, 32)):
        options = {"num_warps": nw, "num_stages": 2, "waves_per_eu": wpe, "matrix_instr_nonkdim": nonk}
        if arch != "gfx950" and bm == 128:
            options["kpack"] = 2
        specs.append({"kernel": "gemm_kernel", "arch": arch,
                      "constexprs": {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, "options": options})
    for arch, block, nw in itertools.product(archs, (1024, 4096), (1, 4, 16)):
        specs.append({"kernel": "lds_reduce_kernel", "arch": arch, "constexprs": {"BLOCK": block},
                      "options": {"num_warps": nw, "num_stages": 1}})
    return specs


def asm_field(asm: str, key: str) -> int:
    """An integer metadata field from the assembly text, e.g. ``.vgpr_count:`` (0 if absent)."""
    match = re.search(rf"^\s*-?\s*\.{re.escape(key)}:\s+(\d+)", asm, re.M)
    return int(match.group(1)) if match else 0


def asm_occupancy(asm: str) -> int:
    """LLVM's ``; Occupancy: N`` line."""
    return int(re.search(r"; Occupancy: (\d+)", asm).group(1))


def llvm_loop_comments(lines: list[str]) -> tuple[set, list[bool]]:
    """LLVM's loop headers and its per-instruction "in a loop" flags, from the block comments it prints."""
    headers = set(re.findall(r"Header=BB(\d+_\d+)", "\n".join(lines)))
    flags, current = [], False
    for line in lines:
        label = re.match(r"^(\.LBB(\d+_\d+)):", line)
        if label or re.match(r"^; %bb\.\d+:", line):
            current = "Loop Header" in line or "in Loop:" in line
            if label and "Loop Header" in line:
                headers.add(label.group(2))
            continue
        code = line.split(";")[0].strip()
        if code and not code.startswith(".") and not re.match(r"^[\w.$]+:", line):
            flags.append(current)
    return headers, flags
