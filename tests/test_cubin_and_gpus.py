"""NVIDIA side of isa_tools (checked against cuobjdump from Triton's wheel) and the GPU catalog."""

import os
import re
import subprocess

import pytest

from isa_tools import CodeObjectError, nvidia_occupancy, read_cubin
from rocmflash.hw.gpus import GPUS, UnknownGPUError, get_gpu, known_gpu_names


def _cuobjdump():
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(path):
        pytest.skip("cuobjdump not shipped with this Triton wheel")
    return path


@pytest.mark.parametrize("block_m,block_n", [(64, 64), (128, 128), (256, 128)])
def test_cubin_reader_matches_cuobjdump(block_m, block_n, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from compile_helpers import FA_SIGNATURE
    from rocmflash.kernels.demo import fa_like_kernel

    src = ASTSource(fn=fa_like_kernel, signature=FA_SIGNATURE,
                    constexprs={"BLOCK_M": block_m, "BLOCK_N": block_n, "HEAD_DIM": 128})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    (kernel,) = read_cubin(compiled.asm["cubin"])
    dump = subprocess.run([_cuobjdump(), "--dump-resource-usage", str(cubin)], capture_output=True,
                          text=True, check=True).stdout
    fields = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", dump))
    assert kernel.arch == "sm_90"
    assert kernel.registers_per_thread == int(fields["REG"])
    assert kernel.local_bytes == int(fields["STACK"])
    assert kernel.static_shared_bytes == int(fields["SHARED"])
    occ = nvidia_occupancy("sm_90", kernel.registers_per_thread,
                           kernel.static_shared_bytes + compiled.metadata.shared, 4)
    assert occ.warps_per_sm >= 4


def test_cubin_reader_rejects_amd_and_garbage():
    with pytest.raises(CodeObjectError):
        read_cubin(b"")
    with pytest.raises(CodeObjectError):
        read_cubin(b"\x7fELF" + b"\x00" * 10)


def test_catalog_has_required_gpus():
    for name in ["mi210", "mi250", "mi250x", "mi300a", "mi300x", "mi325x", "mi355x", "a100", "h100", "h200"]:
        gpu = get_gpu(name)
        assert gpu.compute_units > 0 and gpu.peak_fp16_tflops > 0 and gpu.hbm_tbs > 0
        assert gpu.lds_per_cu_bytes > 0 and gpu.l2_bytes > 0
    assert get_gpu("MI-300X") is GPUS["mi300x"]
    assert get_gpu("mi250").arch == "gfx90a" and get_gpu("mi355x").arch == "gfx950"
    assert get_gpu("mi355x").lds_per_cu_bytes == 160 * 1024
    assert get_gpu("h200").triton_target().backend == "cuda"
    assert get_gpu("mi300x").triton_target().arch == "gfx942"


def test_amd_catalog_agrees_with_isa_tools_tables():
    from isa_tools import amd_arch

    for gpu in GPUS.values():
        if gpu.vendor == "amd":
            assert amd_arch(gpu.arch).lds_per_cu == gpu.lds_per_cu_bytes


def test_unknown_gpu_lists_known_names():
    with pytest.raises(UnknownGPUError) as info:
        get_gpu("mi999")
    for name in known_gpu_names():
        assert name in str(info.value)
