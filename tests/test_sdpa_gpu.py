"""GPU: patch_sdpa at realistic sizes -- routed calls match SDPA (outputs and gradients); masks fall back."""

import pytest
import torch
import torch.nn.functional as F

from rocmflash.api import sdpa
from rocmflash.api.sdpa import patch_sdpa

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("gqa", [1, 4])
def test_gpu_patched_sdpa_matches_with_grads(gqa):
    Hq, S, D = 16, 2048, 128
    q = torch.randn(2, Hq, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, Hq // gqa, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, Hq // gqa, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn_like(q)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa > 1)
    g_ref = torch.autograd.grad(ref, (q, k, v), do)
    before = sdpa.stats()["routed"]
    with patch_sdpa():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa > 1)
        mask = torch.ones(S, S, device="cuda", dtype=torch.bool).tril()
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa > 1)
    assert sdpa.stats()["routed"] - before == 1
    g = torch.autograd.grad(out, (q, k, v), do)
    assert _rel(out, ref) < 2e-2
    for a, b in zip(g, g_ref):
        assert _rel(a, b) < 2e-2
    assert torch.equal(masked, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa > 1))
