"""patch_sdpa: routes only what rocmflash computes identically; everything else untouched (CPU, interpreter)."""

import pytest
import torch
import torch.nn.functional as F

from rocmflash.api import sdpa
from rocmflash.api.sdpa import patch_sdpa, unpatch_sdpa

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

ORIGINAL = F.scaled_dot_product_attention


@pytest.fixture(autouse=True)
def _always_restored():
    yield
    unpatch_sdpa()
    assert F.scaled_dot_product_attention is ORIGINAL


def _t(*shape, dtype=torch.float16, grad=False):
    return torch.randn(*shape, dtype=dtype, requires_grad=grad)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _routed(fn):
    before = sdpa.stats()["routed"]
    out = fn()
    return out, sdpa.stats()["routed"] - before


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(is_causal=True),
    dict(scale=0.3),
    dict(is_causal=True, scale=0.11),
], ids=["plain", "causal", "scale", "causal-scale"])
def test_supported_calls_are_routed_and_match(kwargs):
    q, k, v = _t(2, 4, 21, 32), _t(2, 4, 21, 32), _t(2, 4, 21, 32)
    ref = ORIGINAL(q.float(), k.float(), v.float(), **kwargs)
    with patch_sdpa():
        out, n = _routed(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs))
    assert n == 1
    assert out.dtype == q.dtype and out.shape == q.shape
    assert _rel(out, ref) < 1e-2


def test_gqa_routed_with_enable_gqa_and_cross_attention():
    q, k, v = _t(1, 8, 13, 16, dtype=torch.bfloat16), _t(1, 2, 30, 16, dtype=torch.bfloat16), \
        _t(1, 2, 30, 16, dtype=torch.bfloat16)
    ref = ORIGINAL(q.float(), k.float(), v.float(), enable_gqa=True)
    with patch_sdpa():
        out, n = _routed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    assert n == 1 and _rel(out, ref) < 2e-2


@pytest.mark.parametrize("case", ["mask", "bool_mask", "dropout", "fp32", "causal_sq_ne_sk", "gqa_without_flag",
                                  "head_dim_8", "3d", "batch_broadcast", "empty"])
def test_unsupported_calls_fall_back_unchanged(case):
    q, k, v = _t(1, 2, 9, 16), _t(1, 2, 9, 16), _t(1, 2, 9, 16)
    kw = {}
    if case == "mask":
        kw["attn_mask"] = torch.randn(9, 9, dtype=torch.float16)
    elif case == "bool_mask":
        kw["attn_mask"] = torch.rand(9, 9) > 0.3
    elif case == "dropout":
        kw["dropout_p"] = 0.5
    elif case == "fp32":
        q, k, v = q.float(), k.float(), v.float()
    elif case == "causal_sq_ne_sk":  # SDPA aligns top-left, rocmflash bottom-right
        k, v = _t(1, 2, 14, 16), _t(1, 2, 14, 16)
        kw["is_causal"] = True
    elif case == "gqa_without_flag":  # SDPA would broadcast/err; never rocmflash's GQA
        k, v = _t(1, 1, 9, 16), _t(1, 1, 9, 16)
    elif case == "head_dim_8":
        q, k, v = _t(1, 2, 9, 8), _t(1, 2, 9, 8), _t(1, 2, 9, 8)
    elif case == "3d":
        q, k, v = q[0], k[0], v[0]
    elif case == "batch_broadcast":  # q batch 3, k/v batch 1: SDPA broadcasts
        q = _t(3, 2, 9, 16)
    elif case == "empty":
        q = _t(1, 2, 0, 16)

    def call(fn):
        torch.manual_seed(0)
        try:
            return fn(q, k, v, **kw), None
        except Exception as err:  # the original's own errors must come through unchanged too
            return None, type(err)

    expected, exp_err = call(ORIGINAL)
    with patch_sdpa():
        (got, got_err), n = _routed(lambda: call(F.scaled_dot_product_attention))
    assert n == 0
    assert got_err is exp_err
    if expected is not None:
        assert torch.equal(got, expected)


def test_restore_on_exception_nested_and_plain_call():
    with pytest.raises(RuntimeError):
        with patch_sdpa():
            assert F.scaled_dot_product_attention is not ORIGINAL
            raise RuntimeError("boom")
    assert F.scaled_dot_product_attention is ORIGINAL
    with patch_sdpa():
        with patch_sdpa() as inner:
            assert sdpa.is_patched()
        assert inner.active is False
        assert sdpa.is_patched() and F.scaled_dot_product_attention is not ORIGINAL
    assert F.scaled_dot_product_attention is ORIGINAL and not sdpa.is_patched()
    # plain call: patched until restore(); restore is idempotent; out-of-order restores are fine
    a = patch_sdpa()
    b = patch_sdpa()
    a.restore()
    assert sdpa.is_patched()
    a.restore()
    b.restore()
    assert F.scaled_dot_product_attention is ORIGINAL


def test_backward_through_patched_sdpa():
    q, k, v = (_t(1, 2, 17, 32, dtype=torch.bfloat16, grad=True) for _ in range(3))
    do = torch.randn(1, 2, 17, 32, dtype=torch.bfloat16)
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    ORIGINAL(qd, kd, vd, is_causal=True).backward(do.double())
    with patch_sdpa():
        out, n = _routed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert n == 1
    out.backward(do)
    for got, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert _rel(got, ref) < 2e-2
