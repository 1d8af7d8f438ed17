"""GPU tests (skipped without a CUDA/ROCm GPU): larger shapes with the real compiler.

Every variant with its default config for the live GPU, against an fp64 reference
computed on the GPU, outputs and LSE poisoned with NaN first.
"""

import math

import pytest
import torch

from rocmflash.api.attention import _resolve_config, attention, flash_attn_func
from rocmflash.kernels import get_variant

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
VARIANTS = ["online", "split_kv", "two_phase", "split_d"]
# (B, Hq, Hkv, Sq, Sk, D)
SHAPES = [
    (2, 8, 2, 1000, 1000, 128),
    (1, 8, 8, 2048, 2048, 64),
    (2, 4, 1, 512, 2049, 80),
    (1, 4, 4, 1537, 1024, 192),
    (4, 8, 1, 1, 4096, 128),
    (1, 6, 2, 777, 1333, 96),
    (1, 2, 2, 1025, 1025, 256),
    (1, 4, 2, 333, 333, 160),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}x{}S{}x{}D{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_variant(variant, shape, causal, attention_reference):
    B, Hq, Hkv, Sq, Sk, D = shape
    dtype = torch.bfloat16 if (SHAPES.index(shape) + causal) % 2 else torch.float16
    dev = torch.device("cuda")
    q = torch.randn(B, Hq, Sq, D, device=dev, dtype=dtype)
    k = torch.randn(B, Hkv, Sk, D, device=dev, dtype=dtype)
    v = torch.randn(B, Hkv, Sk, D, device=dev, dtype=dtype)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Sq), float("nan"), device=dev, dtype=torch.float32)
    cfg = _resolve_config(None, variant, D, dev)
    get_variant(variant).launch(q, k, v, cfg, causal, 1 / math.sqrt(D), out=out, lse=lse)
    torch.cuda.synchronize()
    ref, ref_lse = attention_reference(q, k, v, causal, 1 / math.sqrt(D))
    assert torch.isfinite(out).all()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= TOL[dtype], f"relative error {err:.3e}"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    if fin.any():
        assert (lse.double()[fin] - ref_lse[fin]).abs().max().item() < 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_gpu_flash_attn_func_matches_sdpa(causal):
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(), is_causal=causal
    ).transpose(1, 2)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2


def test_gpu_attention_default_config_non_contiguous():
    base = torch.randn(2, 700, 8, 3 * 64, device="cuda", dtype=torch.float16)
    q, k, v = (base[..., i * 64:(i + 1) * 64].transpose(1, 2) for i in range(3))  # strided views
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    assert lse.shape == (2, 8, 700)
