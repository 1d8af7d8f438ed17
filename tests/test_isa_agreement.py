"""isa_tools against the compiler: every field and LLVM's occupancy line, on 300+ real compiles."""

import collections

import pytest

from compile_helpers import agreement_specs, asm_field, asm_occupancy, compile_many, llvm_loop_comments
from isa_tools import kernel_summary, read_code_object, scratch_use
from isa_tools.asm_cfg import in_loop_flags, parse_function, split_functions


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return compile_many(agreement_specs(), tmp_path_factory.mktemp("triton-cache"))


@pytest.mark.slow
def test_reader_and_static_occupancy_equal_llvm(compiled):
    assert len(compiled) >= 300
    checked = collections.Counter()
    mismatches = []
    for result in compiled:
        asm = result["amdgcn"]
        (kernel,) = read_code_object(result["hsaco"])
        summary = kernel_summary(kernel, result["shared"], result["num_warps"])
        expected = {
            "vgpr_count": asm_field(asm, "vgpr_count"),
            "agpr_count": asm_field(asm, "agpr_count"),
            "sgpr_count": asm_field(asm, "sgpr_count"),
            "vgpr_spill_count": asm_field(asm, "vgpr_spill_count"),
            "sgpr_spill_count": asm_field(asm, "sgpr_spill_count"),
            "scratch_bytes": asm_field(asm, "private_segment_fixed_size"),
            "waves_per_simd_static": asm_occupancy(asm),
        }
        got = {key: summary[key] for key in expected}
        if got != expected:
            mismatches.append((result["spec"], got, expected))
        assert kernel.arch == result["spec"]["arch"]
        assert kernel.wavefront_size == 64
        assert kernel.code_object_version == 5
        # The descriptor's allocation is never below what the metadata counts.
        assert kernel.allocated_vgprs >= kernel.vgpr_count
        checked[kernel.arch] += 1
    print(f"\nisa_tools agreed with LLVM on {len(compiled) - len(mismatches)}/{len(compiled)} kernels: "
          + ", ".join(f"{arch} {n}" for arch, n in sorted(checked.items())))
    assert not mismatches, mismatches[:5]


@pytest.mark.slow
def test_matrix_covers_what_matters(compiled):
    """The matrix is only a test if it reaches spills, padding, AGPRs and several wave levels."""
    kernels = [(r, read_code_object(r["hsaco"])[0]) for r in compiled]
    assert any(k.vgpr_spill_count > 0 for _, k in kernels), "no spilling kernel in the matrix"
    assert any(k.agpr_count > 0 for _, k in kernels), "no kernel using AGPRs"
    padded = [k for _, k in kernels if k.allocated_vgprs - k.vgpr_count >= 8]
    assert padded, "no kernel whose allocation was padded for waves_per_eu"
    levels = {asm_occupancy(r["amdgcn"]) for r, _ in kernels}
    assert len(levels) >= 5, levels
    # .vgpr_count alone would mispredict occupancy on the padded ones: the reason to read the descriptor.
    from isa_tools import waves_from_vgprs
    assert any(waves_from_vgprs(k.arch, k.vgpr_count) != waves_from_vgprs(k.arch, k.allocated_vgprs)
               for k in padded)


@pytest.mark.slow
def test_dynamic_lds_lowers_full_occupancy_on_real_kernels(compiled):
    """Triton's dynamic LDS is invisible to LLVM's line; the full model must account for it."""
    lowered = 0
    for result in compiled:
        (kernel,) = read_code_object(result["hsaco"])
        summary = kernel_summary(kernel, result["shared"], result["num_warps"])
        assert summary["waves_per_simd"] <= summary["waves_per_simd_static"]
        if summary["limiter"] == "lds":
            lowered += 1
            assert summary["waves_per_simd"] < summary["waves_per_simd_static"]
    assert lowered > 0


@pytest.mark.slow
def test_scratch_and_loops_agree_with_llvm(compiled):
    """Where scratch is used: present exactly when LLVM reserves scratch, stores covering every spilled VGPR,
    and loops that are LLVM's own (same headers; every instruction LLVM puts in a loop is in ours)."""
    spilling = 0
    for result in compiled:
        asm = result["amdgcn"]
        (kernel,) = read_code_object(result["hsaco"])
        use = scratch_use(asm, kernel.name)
        spills = asm_field(asm, "vgpr_spill_count")
        to_memory = asm_field(asm, "private_segment_fixed_size") > 0
        # scratch traffic exactly when the kernel reserves scratch; then its stores cover every spilled VGPR.
        # Without scratch, LLVM parked the spills in free AGPRs (Triton 3.9 on gfx90a): no memory traffic.
        # A kernel that uses AGPRs can park part of its spills there and store only the rest (Triton 3.8,
        # gfx90a, a 256x128x64 gemm: 32 spills, 256 AGPRs, 2 memory slots): then at least one store, never more
        # stores than spills.
        assert bool(use.ops) == to_memory, (result["spec"], spills, use)
        if to_memory:
            parked = asm_field(asm, "agpr_count") > 0
            least = 1 if parked else spills
            assert least <= use.store_bytes // 4 <= spills + max(2, spills // 10), (result["spec"], spills, use)
        else:
            assert use.store_bytes == 0, (result["spec"], spills, use)
        assert bool(use.lane_ops) == bool(asm_field(asm, "sgpr_spill_count")), result["spec"]
        spilling += spills > 0
        (lines,) = split_functions(asm).values()
        headers, llvm_flags = llvm_loop_comments(lines)
        flags, loops = in_loop_flags(parse_function(lines))
        assert loops == len(headers) and len(flags) == len(llvm_flags), result["spec"]
        assert not any(llvm and not ours for ours, llvm in zip(flags, llvm_flags)), result["spec"]
    assert spilling > 0
