"""GPU identification from what ROCm/CUDA report: names as they really appear, arch, CU counts, partitions.

The rows are real-world reports (ROCm issues, vendor trackers, container logs) or the
catalog's partition arithmetic, noted per row. No GPU needed.
"""

import pytest

from rocmflash.hw.detect import identify_device, models_named
from rocmflash.hw.gpus import TARGETS, UnknownGPUError, get_gpu

GIB = 2**30

# (reported name, gcnArchName, CUs, total memory or None) -> target; provenance in the comment
REAL_WORLD = [
    ("AMD Instinct MI210", "gfx90a:sramecc+:xnack-", 104, None, "mi210"),
    ("AMD Instinct MI250X / MI250", "gfx90a:sramecc+:xnack-", 104, None, "mi250"),  # upstream amdgpu.ids spelling
    ("AMD Instinct MI250X/MI250", "gfx90a:sramecc+:xnack-", 104, None, "mi250"),  # AMD's amdgpu.ids spelling
    ("AMD Instinct MI250X / MI250", "gfx90a:sramecc+:xnack-", 110, None, "mi250x"),  # one name, both boards
    ("AMD Instinct MI250X", "gfx90a:sramecc+:xnack-", 110, None, "mi250x"),  # LUMI
    ("", "gfx90a:sramecc+:xnack-", 110, None, "mi250x"),  # ROCm <= 6.0 reports no name
    ("AMD Instinct MI300A", "gfx942:sramecc+:xnack+", 228, None, "mi300a"),
    ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 304, None, "mi300x"),
    ("AMD Instinct MI300X VF", "gfx942:sramecc+:xnack-", 304, None, "mi300x"),  # virtual function (cloud VMs)
    ("AMD Instinct MI300X HF", "gfx942:sramecc+:xnack-", 304, None, "mi300x"),
    ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 38, None, "mi300x-cpx"),  # CPX: name unchanged, 38 CUs
    ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 152, None, "mi300x-dpx"),
    ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 76, None, "mi300x-qpx"),
    ("AMD Instinct MI300A", "gfx942:sramecc+:xnack+", 76, None, "mi300a-tpx"),
    ("AMD Instinct MI325X", "gfx942:sramecc+:xnack-", 304, None, "mi325x"),
    ("AMD Instinct MI325X VF", "gfx942:sramecc+:xnack-", 38, None, "mi325x-cpx"),
    ("AMD Radeon Graphics", "gfx942:sramecc+:xnack-", 304, 255.98 * GIB, "mi325x"),  # generic name: memory decides
    ("AMD Radeon Graphics", "gfx942:sramecc+:xnack-", 304, 191.98 * GIB, "mi300x"),
    ("AMD Instinct MI350X", "gfx950:sramecc+:xnack-", 256, None, "mi350x"),
    ("AMD Instinct MI355X", "gfx950:sramecc+:xnack-", 256, None, "mi355x"),
    ("AMD Instinct MI355X", "gfx950:sramecc+:xnack-", 32, None, "mi355x-cpx"),
    ("AMD Radeon Graphics", "gfx950:sramecc+:xnack-", 256, 287.98 * GIB, "mi355x"),  # ROCm 7.2 container, MI355X
]


@pytest.mark.parametrize("name,arch,cus,memory,target", REAL_WORLD)
def test_real_world_reports_resolve_to_their_target(name, arch, cus, memory, target):
    match = identify_device(name, arch, cus, memory_bytes=int(memory) if memory else None)
    assert match.gpu is not None, match.describe()
    assert match.gpu.name == target, match.describe()
    assert match.gpu.compute_units == cus
    assert match.arch == arch.split(":")[0] and match.warp_size == 64


def test_ambiguous_reports_pick_the_common_board_and_say_so():
    unnamed = identify_device("", "gfx90a", 104)
    assert unnamed.gpu.name == "mi250" and unnamed.alternatives == ("mi210",)
    assert "also fits mi210" in unnamed.describe() and "--gpu" in unnamed.problem
    generic = identify_device("AMD Radeon Graphics", "gfx950:sramecc+:xnack-", 256)  # no memory figure
    assert generic.gpu.name == "mi355x" and "mi350x" in generic.alternatives
    cpx = identify_device("", "gfx942", 38)
    assert cpx.gpu.name == "mi300x-cpx" and set(cpx.alternatives) == {"mi300a-cpx", "mi325x-cpx"}


@pytest.mark.parametrize("name,arch,cus,warp,words", [
    ("Radeon RX 7900 XTX", "gfx1100", 48, 32, ["RDNA", "wave32", "gfx1100", "Radeon RX 7900 XTX"]),
    ("AMD Radeon RX 9070 XT", "gfx1201", 32, None, ["RDNA", "wave32", "gfx1201"]),
    ("AMD Instinct MI100", "gfx908:sramecc+:xnack-", 120, 64, ["gfx908", "wave64", "not in rocmflash's catalog"]),
    ("AMD Instinct MI308X", "gfx942:sramecc+:xnack-", 80, 64, ["MI308X", "not in rocmflash's catalog", "--gpu"]),
    ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 200, 64, ["200 CUs fit no", "304/152/76/38"]),
])
def test_off_catalog_devices_are_named_with_arch_and_wave_size(name, arch, cus, warp, words):
    match = identify_device(name, arch, cus, warp)
    assert match.gpu is None
    text = match.describe()
    for word in words:
        assert word in text, text


def test_nvidia_reports():
    assert identify_device("NVIDIA H100 80GB HBM3", "sm_90", 132).gpu.name == "h100"
    assert identify_device("NVIDIA H200", "sm_90", 132).gpu.name == "h200"
    pcie = identify_device("NVIDIA H100 PCIe", "sm_90", 114)
    assert pcie.gpu.name == "h100" and "114 SMs" in pcie.problem
    assert identify_device("NVIDIA GeForce RTX 4090", "sm_89", 128).gpu is None


def test_models_named_reads_combined_and_suffixed_names():
    assert models_named("AMD Instinct MI250X / MI250") == ["mi250x", "mi250"]
    assert models_named("AMD Instinct MI300X VF") == ["mi300x"]
    assert models_named("AMD Radeon Graphics") == []


def test_partitions_are_their_own_targets():
    cpx = get_gpu("mi300x-cpx")
    whole = get_gpu("mi300x")
    assert (cpx.compute_units, cpx.partition, cpx.base_name, cpx.arch) == (38, "cpx", "mi300x", "gfx942")
    assert cpx.peak_fp16_tflops == pytest.approx(whole.peak_fp16_tflops / 8, rel=1e-3)
    assert cpx.hbm_tbs == pytest.approx(whole.hbm_tbs / 8, rel=1e-3)
    assert get_gpu("MI300X_SPX") is whole and get_gpu("mi-355x-cpx").compute_units == 32
    assert get_gpu("mi300a-tpx").compute_units == 76
    for target in TARGETS.values():
        assert get_gpu(target.name) is target
    with pytest.raises(UnknownGPUError, match="mi300x-{dpx,qpx,cpx}"):
        get_gpu("mi300x-tpx")
    with pytest.raises(UnknownGPUError, match="no compute-partition mode"):
        get_gpu("mi250").partitioned("cpx")


def test_partition_roofline_uses_its_compute_units():
    from rocmflash.hw.roofline import Shape, roofline

    shape = Shape(batch=1, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, head_dim=128, dtype="bf16")
    cpx, whole = roofline(get_gpu("mi300x-cpx"), shape), roofline(get_gpu("mi300x"), shape)
    assert cpx.floor_ms == pytest.approx(8 * whole.floor_ms, rel=1e-3)
