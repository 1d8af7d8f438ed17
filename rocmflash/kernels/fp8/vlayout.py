"""V made K-major for the fp8 forward: one Triton transpose of V's bytes, ``(B, H, Sk, D)`` -> ``(B, H, D, Sk16)``.

The fp8 ``wgmma`` (sm_90) and the gfx942 fp8 MFMA path read the P·V dot's V operand with the keys contiguous
(:func:`rocmflash.kernels.fp8.forward.kmajor_v`), so the forward copies V once per call into that layout. torch's
``copy_`` of a transposed one-byte tensor moves it element by element: on an H100 (B4 Hkv8 D128) 31 µs at 1k keys,
56 µs at 2k and 220 µs at 8k, against 8-26 µs for a plain copy of the same bytes -- a third of a 1k-key call's
time beyond its kernel (``archive/reports:bench/fp8_overhead.py``). This kernel moves ``BLOCK_S x D`` tiles through registers
instead, and writes the zero pad up to the 16-key row alignment in the same pass.

It moves bytes (``uint8`` views), so every fp8 format takes the same binary.
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.config import KernelConfig
from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit
from rocmflash.kernels.launch import fits_buffer_addressing

BLOCK_S = 64  #: keys per program (a 64 x 128-byte tile: 8 KiB)
V_ROW_ALIGN = 16  #: a K-major V's key count is padded to this, so its rows start 16-byte aligned
_CONFIG = KernelConfig(BLOCK_M=16, BLOCK_N=BLOCK_S, num_warps=4, num_stages=1)


@kernel_jit
def _kmajor_bytes(V, OUT, SEQ_K, SEQ_V, H, stride_vz, stride_vh, stride_vn, stride_vd, stride_oz, stride_oh, stride_od,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """One ``BLOCK_S``-key tile of one (batch, head): V rows ``(keys, D)`` in, ``(D, keys)`` out; keys from
    ``SEQ_K`` up to ``SEQ_V`` (the row alignment's pad) are written as zeros."""
    off_z = tl.program_id(1) // H
    off_h = tl.program_id(1) % H
    offs_n = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    src = V + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    tile = tl.load(src + offs_n[:, None].to(tl.int64) * stride_vn + offs_d[None, :] * stride_vd,
                   mask=(offs_n[:, None] < SEQ_K) & dmask[None, :], other=0)
    dst = OUT + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    tl.store(dst + offs_d[:, None].to(tl.int64) * stride_od + offs_n[None, :], tl.trans(tile),
             mask=dmask[:, None] & (offs_n[None, :] < SEQ_V))


def padded_keys(seqlen_k: int) -> int:
    """The key count of a K-major V's rows: ``seqlen_k`` rounded up to :data:`V_ROW_ALIGN`."""
    return -(-seqlen_k // V_ROW_ALIGN) * V_ROW_ALIGN


def torch_kmajor_copy(v):
    """:func:`kmajor_copy` by torch's ``copy_`` of the transposed view (element by element for one-byte data):
    CPU tensors outside the interpreter take it, and ``archive/reports:bench/fp8_overhead.py`` times it as the reference."""
    import torch

    B, H, Sk, D = v.shape
    seq_v = padded_keys(Sk)
    buf = torch.empty((B, H, D, seq_v), dtype=v.dtype, device=v.device)
    buf[..., :Sk].copy_(v.transpose(2, 3))
    buf[..., Sk:].zero_()
    return buf[..., :Sk].transpose(2, 3), seq_v


def kmajor_copy(v, keys=None):
    """``(v_kmajor, seq_v)``: a copy of ``v`` (``(B, H, Sk, D)``, any strides, one-byte elements) in ``(B, H, D, Sk16)``
    memory (:func:`padded_keys`; the pad zeroed), returned as the ``(B, H, Sk, D)`` view of it, and ``Sk16``. GPU
    tensors (and CPU ones under ``TRITON_INTERPRET=1``) take the kernel; other CPU tensors
    :func:`torch_kmajor_copy`. ``keys``: a kept plan's launch keys (its V signature is fixed: see
    :func:`rocmflash.kernels.launch.kept_key`), else the key is kept here per V signature."""
    import torch

    if not (v.is_cuda or C.interpreting()):
        return torch_kmajor_copy(v)
    B, H, Sk, D = v.shape
    seq_v = padded_keys(Sk)
    buf = torch.empty((B, H, D, seq_v), dtype=v.dtype, device=v.device)
    if buf.numel():
        src, dst = v.view(torch.uint8), buf.view(torch.uint8)
        block_d = C.next_pow2(D)
        backend = C.torch_backend()

        def build():
            grid = (-(-seq_v // BLOCK_S), B * H)
            args = dict(V=src, OUT=dst, SEQ_K=Sk, SEQ_V=seq_v, H=H, stride_vz=src.stride(0), stride_vh=src.stride(1),
                        stride_vn=src.stride(2), stride_vd=src.stride(3), stride_oz=dst.stride(0),
                        stride_oh=dst.stride(1), stride_od=dst.stride(2))
            return grid, args, dict(HEAD_DIM=D, BLOCK_D=block_d, BLOCK_S=BLOCK_S)

        key = _kept_key(src, dst, backend) if keys is None else \
            C.kept_key(keys, _SCALARS, _kmajor_bytes, _SCALARS, (src, dst), _CONFIG, backend)
        C.launch_cached(_kmajor_bytes, _SCALARS, (src, dst), build, _CONFIG, backend, key)
    return buf[..., :Sk].transpose(2, 3), seq_v


_SCALARS = ("kmajor",)
_KEYS: dict = {}  #: V's shape, strides, device (and on ROCm its 2 GiB bit) -> the launch key of an aligned V
_MAX_KEYS = 1024


def _kept_key(src, dst, backend: str):
    """The launch key of this copy, kept per V signature (it hashes once: computing and hashing the whole key is
    most of a short call's host cost), or None (computed by ``launch_cached``) when V is not 16-byte aligned. The
    output is a fresh buffer of V's shape: its part of the key follows from V's."""
    if src.data_ptr() % 16:
        return None
    sig = (src.shape, src.stride(), src.get_device(), backend,
           backend == "hip" and fits_buffer_addressing(src))
    key = _KEYS.get(sig)
    if key is None:
        if len(_KEYS) >= _MAX_KEYS:
            _KEYS.clear()
        key = _KEYS[sig] = C.KeptKey(C.launch_key(_kmajor_bytes, _SCALARS, (src, dst), _CONFIG, backend))
    return key


__all__ = ["kmajor_copy", "torch_kmajor_copy", "padded_keys", "V_ROW_ALIGN", "BLOCK_S"]
