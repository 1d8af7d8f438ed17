"""fp8 forward cross-compiled for gfx942 (FNUZ), gfx950 (OCP) and sm_90 on the CPU: the code LLVM emits.

From the assembly text (read with ``isa_tools.asm_cfg``): every matrix instruction is an fp8 one of
the input format -- so both GEMMs, Q·Kᵀ and P·V, run in fp8 -- and P is converted to fp8 by the
arch's packed conversion. From the code object (``isa_tools.read_code_object``): registers, spills,
scratch and occupancy agree with LLVM's own metadata and ``; Occupancy:`` line.

Each AMD arch compiles in its own spawned process: Triton 3.6 fills its AMD fp8 conversion table
once per process, from the first compile's generation (``fp8_forward._claim_amd_generation``).
"""

import concurrent.futures
import multiprocessing
import re

import pytest
import torch

from compile_helpers import asm_field, asm_occupancy

FORMATS = {  # arch -> (torch dtype, (MFMA mnemonic suffixes), f8f6f4 format modifiers, P's conversion)
    "gfx942": [(torch.float8_e4m3fnuz, ("_fp8_fp8",), "", "v_cvt_pk_fp8_f32"),
               (torch.float8_e5m2fnuz, ("_bf8_bf8",), "", "v_cvt_pk_bf8_f32")],
    # gfx950: the f8f6f4 MFMAs name the operand formats in cbsz (A) / blgp (B): 0 (printed as nothing) is
    # FP8 E4M3, 1 is BF8 E5M2; the 16x16x32 fp8_fp8/bf8_bf8 forms read OCP bytes on this arch
    "gfx950": [(torch.float8_e4m3fn, ("_f8f6f4", "_fp8_fp8"), "", "v_cvt_scalef32_pk_fp8_f32"),
               (torch.float8_e5m2, ("_f8f6f4", "_bf8_bf8"), "cbsz:1 blgp:1", "v_cvt_scalef32_pk_bf8_f32")],
}
SHAPES = [(64, False, 0), (128, True, 0), (128, True, 16), (64, True, 16)]  # D, causal, matrix_instr_nonkdim


def _compile_arch(arch: str, cache_dir: str) -> dict:
    """In a fresh process: every (format, shape) build of ``arch``, then a try at the other AMD generation."""
    import os

    os.environ["TRITON_CACHE_DIR"] = cache_dir
    from rocmflash.config import Problem, default_config
    from rocmflash.kernels.fp8 import forward as fp8_forward

    results = []
    for dtype, *_ in FORMATS[arch]:
        for D, causal, nonk in SHAPES:
            cfg = default_config(arch, D).replace(matrix_instr_nonkdim=nonk)
            (k,) = fp8_forward.compile_for(arch, cfg, Problem(head_dim=D, causal=causal, dtype="bf16"), dtype)
            results.append({"dtype": str(dtype), "D": D, "causal": causal, "nonk": nonk, "name": k.name,
                            "hsaco": k.asm["hsaco"], "amdgcn": k.asm["amdgcn"], "shared": k.metadata.shared,
                            "num_warps": k.metadata.num_warps})
    other = "gfx950" if arch == "gfx942" else "gfx942"
    try:
        fp8_forward.compile_for(other, default_config(other, 64), Problem(head_dim=64))
        guard = None
    except RuntimeError as err:
        guard = str(err)
    return {"results": results, "guard": guard}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=ctx, max_tasks_per_child=1) as pool:
        futures = {arch: pool.submit(_compile_arch, arch, str(tmp_path_factory.mktemp(f"cache-{arch}")))
                   for arch in FORMATS}
        return {arch: f.result(timeout=900) for arch, f in futures.items()}


def _instructions(asm: str, name: str):
    from isa_tools.asm_cfg import Instruction, parse_function, split_functions

    return [i for i in parse_function(split_functions(asm)[name]) if isinstance(i, Instruction)]


@pytest.mark.parametrize("arch", list(FORMATS))
def test_every_matrix_instruction_is_fp8_of_the_input_format(builds, arch):
    by_dtype = {str(d): (suffixes, mods, cvt) for d, suffixes, mods, cvt in FORMATS[arch]}
    seen = set()
    for r in builds[arch]["results"]:
        suffixes, mods, cvt = by_dtype[r["dtype"]]
        ins = _instructions(r["amdgcn"], r["name"])
        mfma = [i for i in ins if i.mnemonic.startswith("v_mfma")]
        assert mfma, r["dtype"]
        for i in mfma:  # no bf16/f16 MFMA anywhere: P·V is an fp8 GEMM too
            assert re.fullmatch(r"v_mfma_f32_\d+x\d+x\d+(" + "|".join(suffixes) + ")", i.mnemonic), (r["dtype"], i)
            modifiers = " ".join(re.findall(r"\b(?:cbsz|blgp):\d+", i.operands))
            assert modifiers == (mods if i.mnemonic.endswith("_f8f6f4") else ""), (r["dtype"], i)
        mnemonics = {i.mnemonic for i in ins}
        assert cvt in mnemonics, (r["dtype"], sorted(m for m in mnemonics if "cvt" in m))
        seen |= {i.mnemonic for i in mfma}
    print(f"\n{arch}: {sorted(seen)}")
    if arch == "gfx942":
        assert {"v_mfma_f32_32x32x16_fp8_fp8", "v_mfma_f32_16x16x32_fp8_fp8",
                "v_mfma_f32_32x32x16_bf8_bf8", "v_mfma_f32_16x16x32_bf8_bf8"} <= seen
    else:
        assert "v_mfma_f32_32x32x64_f8f6f4" in seen


@pytest.mark.parametrize("arch", list(FORMATS))
def test_isa_tools_registers_and_occupancy_equal_llvm(builds, arch):
    from isa_tools import kernel_summary, read_code_object

    for r in builds[arch]["results"]:
        asm = r["amdgcn"]
        (kernel,) = read_code_object(r["hsaco"])
        summary = kernel_summary(kernel, r["shared"], r["num_warps"], asm)
        expected = {
            "arch": arch,
            "vgpr_count": asm_field(asm, "vgpr_count"),
            "agpr_count": asm_field(asm, "agpr_count"),
            "sgpr_count": asm_field(asm, "sgpr_count"),
            "vgpr_spill_count": asm_field(asm, "vgpr_spill_count"),
            "sgpr_spill_count": asm_field(asm, "sgpr_spill_count"),
            "scratch_bytes": asm_field(asm, "private_segment_fixed_size"),
            "waves_per_simd_static": asm_occupancy(asm),
        }
        assert {key: summary[key] for key in expected} == expected, (r["dtype"], r["D"], r["nonk"])
        assert kernel.allocated_vgprs >= kernel.vgpr_count
        assert summary["waves_per_simd"] <= summary["waves_per_simd_static"]
        assert summary["scratch_asm_known"] and summary["vgpr_spill_count"] == 0, (r["dtype"], r["D"], r["nonk"])  # the shipped tiles fit


def test_v_layout_per_amd_arch(builds):
    """gfx942 reads V K-major (``fp8_forward.kmajor_v``): no two-byte LDS stores transposing V (32 at D=128 with
    V row-major). gfx950 keeps V as given: CDNA4 reads it transposed from LDS (``ds_read_b64_tr_b8``)."""
    for r in builds["gfx942"]["results"]:
        mnemonics = [i.mnemonic for i in _instructions(r["amdgcn"], r["name"])]
        assert "ds_write_b16" not in mnemonics and "ds_write_b8" not in mnemonics, (r["dtype"], r["D"], r["nonk"])
    for r in builds["gfx950"]["results"]:
        mnemonics = [i.mnemonic for i in _instructions(r["amdgcn"], r["name"])]
        assert "ds_read_b64_tr_b8" in mnemonics, (r["dtype"], r["D"], r["nonk"])


def test_second_amd_generation_in_one_process_is_refused(builds):
    for arch, other in (("gfx942", "gfx950"), ("gfx950", "gfx942")):
        guard = builds[arch]["guard"]
        assert guard is not None and f"for {other} in a process that compiled it for {arch}" in guard
        assert "\n" not in guard


@pytest.mark.parametrize("D", [64, 128])
def test_sm90_both_gemms_in_fp8_and_p_converted_saturating(D):
    from rocmflash.config import Problem
    from rocmflash.kernels.fp8 import forward as fp8_forward

    for dtype, ty in ((torch.float8_e4m3fn, "e4m3"), (torch.float8_e5m2, "e5m2")):
        cfg = fp8_forward.default_config("sm_90", D)
        (k,) = fp8_forward.compile_for("sm_90", cfg, Problem(head_dim=D, causal=True), dtype)
        ptx = k.asm["ptx"]
        mma = re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)", ptx)
        assert mma and all(m.endswith(f".f32.{ty}.{ty}") for m in mma), set(mma)
        # per key block: Q·Kᵀ (n = BLOCK_N) runs D/32 k32 steps, P·V (n = D) BLOCK_N/32; two loops
        shapes = [tuple(int(x) for x in re.search(r"\.m64n(\d+)k32\.", m).groups()) for m in mma]
        assert sorted(shapes) == sorted([(cfg.BLOCK_N,)] * (2 * D // 32) + [(D,)] * (2 * cfg.BLOCK_N // 32)), shapes
        assert f"cvt.rn.satfinite.{ty}x2.f32" in ptx


@pytest.mark.parametrize("seqlen_k", [4096, 517])
def test_sm90_v_is_k_major_no_byte_transpose(seqlen_k):
    """fp8 wgmma reads K-major B tiles only: with V row-major Triton loaded it synchronously and stored it into
    shared memory byte by byte (64 st.shared.b8 at D=128). The launch's K-major V (key count padded to 16)
    arrives by 16-byte cp.async, also in masked blocks at an odd key count; no byte loads or stores."""
    from rocmflash.config import Problem
    from rocmflash.kernels.fp8 import forward as fp8_forward

    cfg = fp8_forward.default_config("sm_90", 128)
    problem = Problem(head_dim=128, causal=True, seqlen_q=seqlen_k, seqlen_k=seqlen_k)
    (k,) = fp8_forward.compile_for("sm_90", cfg, problem, torch.float8_e4m3fn)
    ptx = k.asm["ptx"]
    assert not re.findall(r"\b(?:st|ld)\.(?:shared|global)[\w.]*\.[bu]8\b", ptx)
    copies = re.findall(r"cp\.async\.\w+\.shared\.global \[[^\]]*\], \[[^\]]*\], (0x\w+)", ptx)
    tiles = 2 * cfg.BLOCK_N * 128 // (16 * 32 * cfg.num_warps)  # K and V key blocks: 16-byte copies per thread
    assert set(copies) == {"0x10"} and len(copies) == 2 * cfg.num_stages * tiles  # prologue + loop, two loops


@pytest.mark.parametrize("target, dtype, match", [
    ("gfx942", torch.float8_e4m3fn, "gfx942 computes in FNUZ fp8"),
    ("gfx950", torch.float8_e5m2fnuz, "gfx950 computes in OCP fp8"),
    ("gfx90a", None, "gfx90a has no fp8 matrix instructions"),
    ("sm_80", None, "sm_80 has no fp8 matrix instructions"),
])
def test_cross_compile_refuses_a_format_the_target_lacks(target, dtype, match):
    """Refused before anything compiles (so no AMD generation is claimed in this process)."""
    from rocmflash.config import KernelConfig, Problem
    from rocmflash.kernels.fp8 import forward as fp8_forward

    with pytest.raises(TypeError, match=match):
        fp8_forward.compile_for(target, KernelConfig(), Problem(head_dim=64), dtype)
