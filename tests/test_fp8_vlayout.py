"""The fp8 forward's K-major V copy (``rocmflash.kernels.fp8.vlayout``): the same bytes in ``(B, H, D, Sk16)`` memory
with a zeroed pad, in Triton's interpreter on poisoned buffers; real builds for sm_90 and gfx942 move V in 16-byte
global accesses and spill nothing."""

import re

import pytest
import torch

from rocmflash.kernels.fp8 import vlayout as VL
from rocmflash.kernels.fp8.forward import as_kmajor_v

POISON = 0x7F  #: e4m3fn NaN: a byte the copy failed to write shows up as NaN, never as a plausible value


@pytest.fixture
def poisoned_empty(monkeypatch):
    """torch.empty fills its one-byte buffers with :data:`POISON` (what the copy leaves unwritten stays visible)."""
    real = torch.empty

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.element_size() == 1:
            t.view(torch.uint8).fill_(POISON)
        return t
    monkeypatch.setattr(torch, "empty", empty)


def _kmajor_memory(out, seq_v):
    """The whole ``(B, H, D, seq_v)`` buffer behind ``as_kmajor_v``'s view (pad included), as bytes."""
    B, H, _, D = out.shape
    return torch.as_strided(out.view(torch.uint8), (B, H, D, seq_v), (out.stride(0), out.stride(1), out.stride(3), 1))


@pytest.mark.parametrize("shape", [(2, 3, 37, 64), (1, 2, 16, 128), (2, 1, 5, 96), (1, 1, 1, 32), (1, 2, 130, 256)])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_copy_is_the_same_bytes_keys_contiguous_and_the_pad_zero(interpret, poisoned_empty, shape, layout):
    B, H, S, D = shape
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(B, S, H, D, generator=g) * 50).to(torch.float8_e4m3fn)  # every byte drawn, not one value
    v = x.transpose(1, 2) if layout == "bshd" else x.permute(0, 2, 1, 3).contiguous()
    out, seq_v = as_kmajor_v(v)
    assert seq_v == -(-S // 16) * 16 and seq_v % VL.V_ROW_ALIGN == 0
    assert out.shape == v.shape and out.stride(2) == 1 and out.dtype == v.dtype
    assert torch.equal(out.view(torch.uint8), v.view(torch.uint8))
    memory = _kmajor_memory(out, seq_v)
    assert int(memory[..., S:].sum()) == 0  # the pad: zeros (read by masked loads as weight-0 keys: never NaN)
    assert out.data_ptr() % 16 == 0 and (out.stride(3) * out.element_size()) % 16 == 0


def test_a_k_major_v_is_not_copied(interpret):
    buf = torch.randn(1, 2, 64, 32).to(torch.float8_e4m3fn)  # (B, H, D, S) memory
    v = buf.transpose(2, 3)
    out, seq_v = as_kmajor_v(v)
    assert out is v and seq_v == 32


def test_every_fp8_format_takes_the_same_bytes(interpret):
    raw = torch.randint(0, 256, (1, 2, 20, 32), dtype=torch.uint8)
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
        out, _ = VL.kmajor_copy(raw.view(dtype))
        assert out.dtype == dtype and torch.equal(out.view(torch.uint8), raw)


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_kept_launch_key_is_the_computed_one_and_only_for_aligned_v(backend):
    from rocmflash.kernels.launch import launch_key

    raw = torch.randint(0, 256, (4096 + 1,), dtype=torch.uint8)
    for offset, aligned in ((0, True), (1, False)):
        src = raw[offset:offset + 4096].view(1, 2, 32, 64).view(torch.uint8)
        dst = torch.empty(1, 2, 64, 32, dtype=torch.uint8)
        key = VL._kept_key(src, dst, backend)
        if aligned:
            assert key == launch_key(VL._kmajor_bytes, VL._SCALARS, (src, dst), VL._CONFIG, backend)
            assert VL._kept_key(src, torch.empty_like(dst), backend) is key  # kept: found, not rebuilt
        else:
            assert key is None  # launch_cached computes the misaligned launch's own key


def _build(target, S=2048, H=8, D=128):
    from rocmflash.kernels.build import Ptr, compile_kernel

    seq_v = VL.padded_keys(S)
    args = dict(V=Ptr("*u8"), OUT=Ptr("*u8"), SEQ_K=S, SEQ_V=seq_v, H=H, stride_vz=S * H * D, stride_vh=D,
                stride_vn=H * D, stride_vd=1, stride_oz=H * D * seq_v, stride_oh=D * seq_v, stride_od=seq_v)
    consts = dict(HEAD_DIM=D, BLOCK_D=D, BLOCK_S=VL.BLOCK_S)
    return compile_kernel(VL._kmajor_bytes, target, args, consts, VL._CONFIG)


def test_sm90_build_moves_v_in_16_byte_global_accesses():
    ptx = _build("sm_90").asm["ptx"]
    globals_ = set(re.findall(r"\b(ld\.global[\w.]*|st\.global[\w.]*)", ptx))
    assert globals_ == {"ld.global.v4.b32", "st.global.v4.b32"}, globals_
    assert "local" not in set(re.findall(r"\b(?:ld|st)\.(local)", ptx))  # no spills to local memory


def test_gfx942_build_moves_v_in_16_byte_accesses_and_spills_nothing():
    from isa_tools import kernel_summary, read_code_object

    k = _build("gfx942")
    asm = k.asm["amdgcn"]
    memory_ops = set(re.findall(r"^\s*((?:buffer|global)_(?:load|store)\w*)", asm, re.M))
    assert memory_ops == {"buffer_load_dwordx4", "buffer_store_dwordx4"}, memory_ops
    (kernel,) = read_code_object(k.asm["hsaco"])
    summary = kernel_summary(kernel, k.metadata.shared, VL._CONFIG.num_warps, asm)
    assert summary["scratch_asm_known"] and summary["vgpr_spill_count"] == 0 and summary["scratch_bytes"] == 0
    occupancy = re.search(r"; Occupancy: (\d+)", asm)
    assert occupancy and summary["waves_per_simd_static"] == int(occupancy.group(1))  # isa_tools agrees with LLVM


@pytest.mark.gpu
@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("shape", [(4, 8, 2048, 128), (2, 3, 1037, 64), (1, 2, 130, 256)])
def test_gpu_copy_is_the_same_bytes_and_the_pad_zero(poisoned_empty, shape):
    B, H, S, D = shape
    g = torch.Generator(device="cuda").manual_seed(S)
    x = torch.randint(0, 256, (B, S, H, D), dtype=torch.uint8, device="cuda", generator=g).view(torch.float8_e4m3fn)
    v = x.transpose(1, 2)  # (B, H, S, D) view of (B, S, H, D) memory, as flash_attn_func passes it
    out, seq_v = as_kmajor_v(v)
    assert out.is_cuda and out.stride(2) == 1 and torch.equal(out.view(torch.uint8), v.view(torch.uint8))
    assert int(_kmajor_memory(out, seq_v)[..., S:].sum()) == 0
