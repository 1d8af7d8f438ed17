"""The per-arch AMD decode default compiles without spills (real compiler, HSACO metadata), contiguous and paged."""

import pytest

from isa_tools import kernel_summary, read_code_object
from rocmflash.kernels.decode import host as KD
from rocmflash.kernels.decode import kernel as DK


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("paged", [False, True])
def test_amd_decode_default_does_not_spill(arch, head_dim, paged):
    kernels = KD.compile_for(arch, KD.default_decode_config(arch, head_dim), head_dim, "bf16", group=8,
                             paged=paged, page_size=256)
    assert [k.name for k in kernels] == list(KD.KERNELS)
    for k in kernels:
        (res,) = read_code_object(k.asm["hsaco"])
        s = kernel_summary(res, num_warps=k.metadata.num_warps, asm=k.asm["amdgcn"])
        assert s["arch"] == arch
        assert s["vgpr_spill_count"] == 0 and s["sgpr_spill_count"] == 0 and s["scratch_bytes"] == 0, (k.name, s)
        assert s["waves_per_simd"] >= 2, (k.name, s)


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("paged", [False, True])
def test_amd_left_padded_decode_default_keeps_its_occupancy(arch, paged):
    """The ``cache_leftpad`` build (transformers' left-padded generate() steps) of the AMD default, D=128:
    no VGPR spill, no scratch, the same waves/SIMD as the plain build, and what its spills cost passes the
    pruner's spill rule. (Its masked first-block loop costs SGPRs: with Triton 3.6, 4-42 are parked in
    VGPR lanes, at most 9 lane moves inside a loop; VGPRs e.g. 150 -> 167 on gfx942.)"""
    from rocmflash.static.prune import PruneSettings, spills

    cfg = KD.default_decode_config(arch, 128)
    summaries = []
    for leftpad in (False, True):
        k = KD.compile_for(arch, cfg, 128, "bf16", group=8, paged=paged, page_size=256, leftpad=leftpad)[0]
        (res,) = read_code_object(k.asm["hsaco"])
        summaries.append(kernel_summary(res, num_warps=k.metadata.num_warps, asm=k.asm["amdgcn"]))
    plain, padded = summaries
    assert padded["scratch_loops"] == plain["scratch_loops"] + 1  # the masked first-block loop of this build
    assert padded["vgpr_spill_count"] == 0 and padded["scratch_bytes"] == 0, padded
    assert spills({"status": "ok", "kernels": [padded]}, PruneSettings()) is None, padded
    assert padded["waves_per_simd"] == plain["waves_per_simd"] >= 2, (plain, padded)


#: the L1 invalidate LLVM puts after an agent-scope acquire on each arch (the merge then reads other CUs' partials)
_ACQUIRE = {"gfx90a": "buffer_wbinvl1_vol", "gfx942": "buffer_inv sc1", "gfx950": "buffer_inv sc1"}


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950"])
def test_amd_fused_merge_build_orders_its_count_and_keeps_its_occupancy(arch):
    """The fused-merge split kernel (``FUSED_COMBINE``) of the AMD default, D=128, as LLVM compiled it: one atomic
    add on the arrival count followed by the L1 invalidate of an acquire, the count reset by an atomic swap, no
    spill, and the plain build's waves/SIMD (isa_tools' reading, checked against LLVM's own occupancy line)."""
    import re

    cfg = KD.default_decode_config(arch, 128)
    summaries = []
    for fused in (False, True):
        k = KD.compile_for(arch, cfg, 128, "bf16", group=8, fused=fused)[0]
        asm = k.asm["amdgcn"]
        (res,) = read_code_object(k.asm["hsaco"])
        s = kernel_summary(res, num_warps=k.metadata.num_warps, asm=asm)
        assert s["waves_per_simd_static"] == int(re.search(r"; Occupancy: (\d+)", asm).group(1)), s
        summaries.append(s)
        lines = [line.strip() for line in asm.splitlines()]
        adds = [i for i, line in enumerate(lines) if line.startswith("global_atomic_add ")]
        if not fused:
            assert not adds
            continue
        assert len(adds) == 1, adds
        assert any(line.startswith(_ACQUIRE[arch]) for line in lines[adds[0]:adds[0] + 4]), lines[adds[0]:adds[0] + 4]
        assert any(line.startswith("global_atomic_swap ") for line in lines)
    plain, fused = summaries
    assert fused["vgpr_spill_count"] == 0 and fused["scratch_bytes"] == 0, fused
    assert fused["waves_per_simd"] == plain["waves_per_simd"] >= 2, (plain, fused)


def _instruction_counts(asm: str, nvidia: bool = False) -> dict:
    """Loads, stores, LDS and matrix instructions by kind: ``benchmarks/decode_length_args.py``'s count (one rule for
    the benchmark's table and these assertions)."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "decode_length_args.py")
    spec = importlib.util.spec_from_file_location("rocmflash_bench_decode_length_args", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.instruction_counts(asm, nvidia)


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("paged", [False, True])
def test_unspecialised_lengths_keep_the_specialised_build_s_loads_and_registers(arch, paged, monkeypatch):
    """The split kernel leaves the cache's length and the strides that follow it unspecialised (one binary, one
    launch plan for every length: ``LENGTH_ARGS``) and gives the strides back their divisibility (``KV_ALIGNED``).
    As LLVM compiled it, D=128: the same loads, stores, LDS and MFMA instructions, the same VGPRs, SGPR
    spills and waves/SIMD as the build Triton specialises on those values."""
    from rocmflash.kernels import common as C

    cfg = KD.default_decode_config(arch, 128)
    unspecialised = KD.compile_for(arch, cfg, 128, "bf16", group=8, paged=paged, page_size=256)[0]
    specialised_fn = C._DualJIT(DK._decode_split.fn)  # every integer specialised, as before LENGTH_ARGS
    assert DK._decode_split.unspecialised == DK.LENGTH_ARGS and specialised_fn.unspecialised == ()
    monkeypatch.setattr(KD, "_decode_split", specialised_fn)
    monkeypatch.setattr(KD, "strides_aligned", lambda lengths: False)  # the divisibility comes from Triton
    specialised = KD.compile_for(arch, cfg, 128, "bf16", group=8, paged=paged, page_size=256)[0]
    assert "stride_kb: i32 {tt.divisibility" in specialised.asm["ttgir"]
    assert "%stride_kb: i32 {" not in unspecialised.asm["ttgir"]  # no attribute: not specialised
    summaries = []
    for k in (specialised, unspecialised):
        (res,) = read_code_object(k.asm["hsaco"])
        summaries.append(kernel_summary(res, num_warps=k.metadata.num_warps, asm=k.asm["amdgcn"]))
    before, after = summaries
    for key in ("vgpr_count", "agpr_count", "vgpr_spill_count", "sgpr_spill_count", "scratch_bytes", "lds_bytes",
                "waves_per_simd"):
        assert after[key] == before[key], (key, before, after)
    assert _instruction_counts(unspecialised.asm["amdgcn"]) == _instruction_counts(specialised.asm["amdgcn"])


def test_unspecialised_lengths_keep_the_specialised_build_s_loads_on_sm90(monkeypatch):
    """The same on NVIDIA sm_90 (the lent H100s), read from the PTX: the same global loads/stores by width and
    the same tensor-core instructions as the specialised build."""
    from rocmflash.kernels import common as C

    cfg = KD.default_decode_config("sm_90", 128)
    unspecialised = KD.compile_for("sm_90", cfg, 128, "bf16", group=8)[0]
    monkeypatch.setattr(KD, "_decode_split", C._DualJIT(DK._decode_split.fn))
    monkeypatch.setattr(KD, "strides_aligned", lambda lengths: False)
    specialised = KD.compile_for("sm_90", cfg, 128, "bf16", group=8)[0]
    counts = [_instruction_counts(k.asm["ptx"], nvidia=True) for k in (unspecialised, specialised)]
    assert counts[0] == counts[1] and counts[1]
    assert specialised.metadata.shared == unspecialised.metadata.shared


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950"])
def test_whole_cache_build_reads_no_lengths_and_keeps_its_occupancy(arch):
    """The build a call without ``cache_seqlens`` runs (``WHOLE_CACHE``: every sequence the whole cache, no lengths
    read or filled per call), D=128: fewer loads than the build that reads lengths (the length, by a scalar or a
    vector load, and its pointer), the same K/V loads, no spill, no more VGPRs and the same waves/SIMD."""
    import re

    cfg = KD.default_decode_config(arch, 128)
    summaries, loads, kv_loads = [], [], []
    for whole in (False, True):
        k = KD.compile_for(arch, cfg, 128, "bf16", group=8, whole_cache=whole)[0]
        asm = k.asm["amdgcn"]
        (res,) = read_code_object(k.asm["hsaco"])
        summaries.append(kernel_summary(res, num_warps=k.metadata.num_warps, asm=asm))
        loads.append(len(re.findall(r"^\s*(?:s_load|s_buffer_load|buffer_load|global_load)\w*", asm, re.M)))
        kv_loads.append(_instruction_counts(asm).get("buffer_load_dwordx4"))
    lengths, whole = summaries
    assert loads[1] < loads[0] and kv_loads[0] == kv_loads[1], (loads, kv_loads)
    assert whole["vgpr_spill_count"] == 0 and whole["scratch_bytes"] == 0, whole
    assert whole["vgpr_count"] <= lengths["vgpr_count"] and whole["waves_per_simd"] == lengths["waves_per_simd"]
