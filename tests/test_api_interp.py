"""Public API (rocmflash.attention / flash_attn_func): layouts, strides, options, bad input."""

import math
import warnings

import pytest
import torch

import rocmflash
from rocmflash.config import KernelConfig

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def test_attention_default_config_and_lse(attention_reference):
    q = torch.randn(1, 4, 37, 64, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 45, 64, dtype=torch.bfloat16)
    v = torch.randn(1, 2, 45, 64, dtype=torch.bfloat16)
    out, lse = rocmflash.attention(q, k, v, causal=True, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, True, 1 / 8)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel(out, ref) < 2e-2
    assert (lse.double() - ref_lse).abs().max() < 1e-3


@pytest.mark.parametrize("variant", ["online", "split_kv", "two_phase", "split_d"])
def test_attention_arbitrary_strides_and_scale(variant, attention_reference):
    base = torch.randn(2, 29, 3, 2 * 48, dtype=torch.float16)  # (B, S, H, 2D): strided views
    q = base[..., :48].transpose(1, 2)
    kv = torch.randn(2, 3, 31, 96, dtype=torch.float16)
    k, v = kv[..., ::2], kv[..., 1::2]  # head-dim stride 2
    cfg = KernelConfig(BLOCK_M=16, BLOCK_N=16, variant=variant, num_splits=2)
    out = rocmflash.attention(q, k, v, softmax_scale=0.2, variant=variant, config=cfg)
    ref, _ = attention_reference(q, k, v, False, 0.2)
    assert _rel(out, ref) < 1e-2


def test_flash_attn_func_layout(attention_reference):
    q = torch.randn(2, 33, 8, 80, dtype=torch.float16)  # (B, S, H, D)
    k = torch.randn(2, 20, 2, 80, dtype=torch.float16)
    v = torch.randn(2, 20, 2, 80, dtype=torch.float16)
    out = rocmflash.flash_attn_func(q, k, v, causal=True)
    assert out.shape == (2, 33, 8, 80) and out.is_contiguous()
    ref, _ = attention_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True, 1 / math.sqrt(80))
    assert _rel(out.transpose(1, 2), ref) < 1e-2
    # bottom-right alignment with Sq > Sk: the first 13 query rows see no key -> exact zeros
    assert (out[:, :13] == 0).all()


def test_flash_attn_func_dropout_not_implemented():
    q = torch.randn(1, 8, 2, 16, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="dropout"):
        rocmflash.flash_attn_func(q, q, q, dropout_p=0.1)


def test_empty_key_sequence_gives_zeros():
    q = torch.randn(1, 2, 5, 32, dtype=torch.float16)
    k = torch.randn(1, 2, 0, 32, dtype=torch.float16)
    out, lse = rocmflash.attention(q, k, k, return_lse=True)
    assert (out == 0).all() and (lse == float("-inf")).all()


def _qkv(**over):
    t = dict(q=torch.randn(1, 4, 8, 32, dtype=torch.float16), k=torch.randn(1, 2, 8, 32, dtype=torch.float16),
             v=torch.randn(1, 2, 8, 32, dtype=torch.float16))
    t.update(over)
    return t


@pytest.mark.parametrize("over,exc,match", [
    (dict(k=torch.randn(1, 2, 8, 32, dtype=torch.bfloat16)), TypeError, "k.dtype"),
    (dict(q=torch.randn(4, 8, 32, dtype=torch.float16)), ValueError, "q must be 4-D"),
    (dict(v=torch.randn(1, 2, 8, 48, dtype=torch.float16)), ValueError, "same shape"),
    (dict(k=torch.randn(1, 2, 8, 48, dtype=torch.float16), v=torch.randn(1, 2, 8, 48, dtype=torch.float16)),
     ValueError, "head dim"),
    (dict(k=torch.randn(1, 3, 8, 32, dtype=torch.float16), v=torch.randn(1, 3, 8, 32, dtype=torch.float16)),
     ValueError, "multiple"),
    (dict(q=torch.randn(1, 4, 8, 8, dtype=torch.float16), k=torch.randn(1, 2, 8, 8, dtype=torch.float16),
          v=torch.randn(1, 2, 8, 8, dtype=torch.float16)), ValueError, "16..256"),
    (dict(q=torch.randn(1, 4, 8, 32), k=torch.randn(1, 2, 8, 32), v=torch.randn(1, 2, 8, 32)), TypeError,
     "float16 or torch.bfloat16"),
    (dict(q=[1, 2]), TypeError, "q must be a torch.Tensor"),
])
def test_bad_input_is_named(over, exc, match):
    with pytest.raises(exc, match=match):
        rocmflash.attention(**_qkv(**over))


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_non_finite_scale(scale):
    with pytest.raises(ValueError, match="softmax_scale"):
        rocmflash.attention(**_qkv(), softmax_scale=scale)


def test_config_variant_mismatch_and_bad_variant():
    with pytest.raises(ValueError, match="config.variant"):
        rocmflash.attention(**_qkv(), variant="online", config=KernelConfig(variant="split_d"))
    with pytest.raises(ValueError, match="variant"):
        rocmflash.attention(**_qkv(), variant="fastest")
    with pytest.raises(ValueError, match="schedule_hint"):
        rocmflash.attention(**_qkv(), config=KernelConfig(schedule_hint="bogus"))


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="GPU"):
        rocmflash.attention(**_qkv())
