"""The fp8 forward's kept plans on a GPU (rocmflash.api.fp8_plans): compiled launches, kept launch keys, poisoned
outputs. Skipped without a GPU with fp8 matrix instructions."""

import pytest
import torch

import rocmflash
from rocmflash.api import fp8 as F8
from rocmflash.api import fp8_plans
from rocmflash.tuning import live_fp8, live_gate

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled", "fresh_selection")]


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """torch.empty fills every float buffer it makes with NaN: anything a call leaves unwritten shows."""
    real = torch.empty

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.is_floating_point() and t.element_size() > 1:
            t.fill_(float("nan"))
        return t
    monkeypatch.setattr(torch, "empty", empty)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_planned_calls_give_the_checked_answer(poisoned_outputs, causal):
    """flash_attn_func on fp8 (B, S, H, D) inputs, GQA 4, an odd length: the planned third call equals the checked
    first one bit for bit and its LSE, holds fp8's relative error against fp32 attention of the dequantised
    inputs, and on an arch that reads V K-major keeps both launch keys; fresh inputs of the signature get their
    own answer."""
    from rocmflash.api.selection import device_identity

    arch = device_identity(torch.device("cuda"))[1]
    family = F8.fp8_family(arch)
    if family is None:
        pytest.skip("this GPU has no fp8 matrix instructions")
    dtype = F8.FAMILY_DTYPES[family][0]
    gen = torch.Generator(device="cuda").manual_seed(7)
    B, Hq, Hkv, S, D = 2, 8, 2, 1037, 128

    def inputs():
        q, k, v = (live_fp8.fill(torch.zeros(B, S, h, D, device="cuda").to(dtype), gen) for h in (Hq, Hkv, Hkv))
        return (q, k, v), live_fp8.descales(B, Hkv, dtype, "cuda", gen)

    def call(q, k, v, ds):
        out, lse, _ = rocmflash.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, q_descale=ds[0],
                                                k_descale=ds[1], v_descale=ds[2])
        return out, lse

    (q, k, v), ds = inputs()
    first, lse1 = call(q, k, v, ds)
    call(q, k, v, ds)
    (plan,) = fp8_plans._PLANS.values()
    third, lse3 = call(q, k, v, ds)
    torch.cuda.synchronize()
    F8.check_errors()
    assert torch.equal(first, third) and torch.equal(lse1, lse3) and third.is_contiguous()
    deq = [live_fp8.dequantised(x.transpose(1, 2), d) for x, d in zip((q, k, v), ds)]
    ref = live_gate.reference(*deq, causal, D ** -0.5).transpose(1, 2)
    rel = ((third.float() - ref).norm() / ref.norm()).item()
    assert rel < 2 ** -4, rel
    if plan.kmajor:
        assert set(plan.keys) == {("kmajor",), ("fp8",)}
    (q2, k2, v2), ds2 = inputs()
    other, _ = call(q2, k2, v2, ds2)
    deq2 = [live_fp8.dequantised(x.transpose(1, 2), d) for x, d in zip((q2, k2, v2), ds2)]
    ref2 = live_gate.reference(*deq2, causal, D ** -0.5).transpose(1, 2)
    assert ((other.float() - ref2).norm() / ref2.norm()).item() < 2 ** -4
