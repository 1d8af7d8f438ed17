"""GPU: backward kernels at realistic sizes against fp64 reference gradients (computed on the GPU)."""

import math

import pytest
import torch

from rocmflash.api.selection import select_bwd_config, select_config
from rocmflash.kernels import get_variant
from rocmflash.kernels.backward.host import backward

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
# (B, Hq, Hkv, Sq, Sk, D), causal, dtype
CASES = [
    ((2, 16, 4, 1024, 1024, 128), True, torch.bfloat16),
    ((1, 8, 8, 2048, 2048, 64), False, torch.float16),
    ((1, 8, 8, 2048, 2048, 64), True, torch.bfloat16),
    ((2, 4, 1, 512, 1537, 80), True, torch.float16),     # Sq < Sk, MQA, padded head dim
    ((1, 4, 2, 1000, 700, 96), True, torch.bfloat16),    # Sq > Sk: rows with no key
    ((1, 2, 2, 777, 777, 256), False, torch.float16),
    ((1, 4, 4, 333, 333, 16), True, torch.float16),
    ((1, 6, 2, 1025, 1025, 192), True, torch.bfloat16),
]


def _ref_grads(q, k, v, do, causal, scale, ref_fn):
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    out, _ = ref_fn(qd, kd, vd, causal, scale)
    out.backward(do.double())
    return qd.grad, kd.grad, vd.grad


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}H{}x{}S{}x{}D{}".format(*c[0]) + ("-causal" if c[1] else ""))
def test_gpu_backward(case, attention_reference):
    (B, Hq, Hkv, Sq, Sk, D), causal, dtype = case
    dev = torch.device("cuda")
    q = torch.randn(B, Hq, Sq, D, device=dev, dtype=dtype)
    k = torch.randn(B, Hkv, Sk, D, device=dev, dtype=dtype)
    v = torch.randn(B, Hkv, Sk, D, device=dev, dtype=dtype)
    do = torch.randn(B, Hq, Sq, D, device=dev, dtype=dtype)
    scale = 1 / math.sqrt(D)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Sq), float("nan"), device=dev)
    cfg = select_config(dev, D, dtype, causal, Hq // Hkv, Sq, Sk)
    get_variant("online").launch(q, k, v, cfg, causal, scale, out=out, lse=lse)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    backward(do, q, k, v, out, lse, causal, scale, config=select_bwd_config(dev, D), dq=dq, dk=dk, dv=dv)
    torch.cuda.synchronize()
    refs = _ref_grads(q, k, v, do, causal, scale, attention_reference)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        assert torch.isfinite(got).all(), f"{name}: unwritten or non-finite"
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err <= TOL[dtype], f"{name}: relative error {err:.3e}"
