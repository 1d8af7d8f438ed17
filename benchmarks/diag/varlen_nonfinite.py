"""Diagnostic: which varlen backward output goes non-finite on the GPU for test_compile_varlen_kvcache_gpu's
packing (lens_q [300, 1, 777, 0, 64], lens_k [300, 513, 777, 9, 64], GQA 4, D128, causal), and under which
variations (no LSE term, no empty sequence, each config the launches used)."""

import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

import rocmflash  # noqa: E402
from rocmflash.kernels.launch import observe_launches  # noqa: E402
from test_compile_varlen_kvcache_gpu import _packed as packed  # noqa: E402  (the test's packing, its seeds)


def case(lens_q, lens_k, lse_term, silu, label, scale_q=False):
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, seed=len(lens_q))
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16, requires_grad=True) if scale_q else None
    with observe_launches() as seen:
        out, lse = rocmflash.flash_attn_varlen_func(q * w if scale_q else q, k, v, cu_q, cu_k, max(lens_q),
                                                    max(lens_k), causal=True, return_lse=True)
        y = torch.nn.functional.silu(out).sum(-1) if silu else out
        loss = y.float().square().sum() + (lse.sum() if lse_term else 0)
        grads = torch.autograd.grad(loss, (q, k, v))
        torch.cuda.synchronize()
    print(f"## {label}: out finite {torch.isfinite(out).all().item()} lse finite {torch.isfinite(lse).all().item()}")
    for name, g in zip("qkv", grads):
        bad = ~torch.isfinite(g)
        rows = bad.any(-1).any(-1).nonzero().flatten()
        print(f"  d{name}: non-finite rows {rows.numel()}", rows[:8].tolist(),
              rows[-3:].tolist() if rows.numel() else "")
    for r in seen:
        print("   launch", r.get("kernel"), r.get("options"))


def grads_of(lens_q, lens_k, jit: bool):
    """(out, lse, dq, dk, dv) of the test's loss, through the JIT (no kept plan) or the kept launch plans."""
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, seed=len(lens_q))
    ctx = observe_launches() if jit else contextlib.nullcontext()
    with ctx:
        out, lse = rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                                    return_lse=True)
        loss = torch.nn.functional.silu(out).sum(-1).float().square().sum() + lse.sum()
        grads = torch.autograd.grad(loss, (q, k, v))
    torch.cuda.synchronize()
    return (out, lse) + grads


def poison_allocator(gib: float = 8.0) -> None:
    """Leave NaN-filled blocks in PyTorch's caching allocator, as a long test session leaves garbage: a kernel
    that reads memory it never wrote then sees NaN instead of a fresh process's zeros."""
    blocks = [torch.full((1 << 26,), float("nan"), device="cuda") for _ in range(int(gib * 4))]
    del blocks


def plans_and_poison() -> None:
    """The test's packing through kept plans made by another packing of the same heads, after poisoning."""
    LQ, LK = [300, 1, 777, 0, 64], [300, 513, 777, 9, 64]
    want = grads_of(LQ, LK, jit=True)
    poison_allocator()
    grads_of([129, 1000], [200, 1000], jit=False)  # makes the plans
    for label in ("replayed plans after poison", "again"):
        got = grads_of(LQ, LK, jit=False)
        print(f"## {label}")
        for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
            rel = ((g.double() - w.double()).norm() / w.double().norm()).item()
            bad = (~torch.isfinite(g)).nonzero()
            print(f"  {name}: finite {bool(torch.isfinite(g).all())} rel {rel:.3g} non-finite at", bad[:4].tolist())


if __name__ == "__main__":
    if "--plans-poison" in sys.argv:
        plans_and_poison()
        sys.exit(0)
    LQ, LK = [300, 1, 777, 0, 64], [300, 513, 777, 9, 64]
    torch.manual_seed(0)
    case(LQ, LK, True, True, "the test's loss, q * w", scale_q=True)
    case(LQ, LK, True, True, "the test's loss")
    case(LQ, LK, False, True, "no lse term")
    case(LQ, LK, True, False, "out^2 + lse")
    case([300, 1, 777, 64], [300, 513, 777, 64], True, True, "without the empty sequence")
    case([300, 1, 777, 0], [300, 513, 777, 9], True, True, "empty sequence last")
    case([0, 300], [9, 300], True, True, "empty sequence first")
