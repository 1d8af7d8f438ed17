"""Packed (varlen) prefill against the dense kernel on padded batches, on one GPU.

A batch of prompts with mixed lengths is run three ways on the same tokens:

* ``rocmflash varlen`` -- ``rocmflash.flash_attn_varlen_func`` on the packed tokens (no padding);
* ``rocmflash dense padded`` -- ``rocmflash.flash_attn_func`` on the batch right-padded to the
  longest prompt (what a model without a varlen path runs; the padding is computed and thrown away);
* ``sdpa padded`` -- PyTorch SDPA's default backend on the same right-padded batch with
  ``is_causal=True`` (right padding keeps every real query's causal row exact).

Forward and forward+backward, through the public APIs (host time included). TFLOP/s count only
useful work: 4·Hq·D·sum(Sq_b·Sk_b)/2 per causal forward, 3.5x that for forward+backward. Timing:
``n`` back-to-back calls between CUDA events after a warm-up, median over interleaved rounds.

Usage (on a GPU)::

    python bench/varlen.py --out $OUT [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

from interleaved import MarkdownTable, interleaved_medians

#: name -> (lengths, Hq, Hkv, D)
def _mixes(torch, quick: bool):
    gen = torch.Generator().manual_seed(0)
    mixes = {
        "16 prompts 256..4096 (~34k tok) Hq32 Hkv8 D128": (torch.randint(256, 4097, (16,), generator=gen).tolist(), 32, 8, 128),
        "64 prompts 64..1024 (~35k tok) Hq32 Hkv8 D128": (torch.randint(64, 1025, (64,), generator=gen).tolist(), 32, 8, 128),
        "8 prompts 4096 (equal) Hq32 Hkv8 D128": ([4096] * 8, 32, 8, 128),
        "4 docs 8k + 28 short 128..512, Hq16 Hkv16 D64": ([8192] * 4 + torch.randint(128, 513, (28,), generator=gen).tolist(), 16, 16, 64),
    }
    if quick:
        return dict(list(mixes.items())[:2])
    return mixes


def _cases(torch, lengths, hq, hkv, d, dtype):
    import torch.nn.functional as F

    import rocmflash

    dev = "cuda"
    total, B, S = sum(lengths), len(lengths), max(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    q = torch.randn(total, hq, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(total, hkv, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(total, hkv, d, device=dev, dtype=dtype, requires_grad=True)
    # the same tokens right-padded to (B, S, H, D)
    pad = [torch.zeros(B, S, h, d, device=dev, dtype=dtype) for h in (hq, hkv, hkv)]
    for b, (lo, n) in enumerate(zip(cu.tolist(), lengths)):
        for dst, src in zip(pad, (q, k, v)):
            dst[b, :n] = src.detach()[lo:lo + n]
    qp, kp, vp = (t.requires_grad_(True) for t in pad)
    go_packed, go_pad = torch.randn_like(q), torch.randn_like(qp)

    def varlen(bwd):
        out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=True)
        if bwd:
            out.backward(go_packed)

    def dense(bwd):
        out = rocmflash.flash_attn_func(qp, kp, vp, causal=True)
        if bwd:
            out.backward(go_pad)

    def sdpa(bwd):
        out = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2),
                                             is_causal=True, enable_gqa=hq != hkv)
        if bwd:
            out.backward(go_pad.transpose(1, 2))

    return {"rocmflash varlen": varlen, "rocmflash dense padded": dense, "sdpa padded": sdpa}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".", help="directory for varlen.md (written after every row)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10, help="calls per timed round")
    ap.add_argument("--quick", action="store_true", help="two mixes only")
    args = ap.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("bench/varlen.py needs a GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "varlen.md")
    head = [f"# varlen prefill: packed vs padded ({datetime.date.today()})", "",
            f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}",
            f"- command: `python {' '.join(sys.argv)}`", "- causal, bf16; µs per call (median of rounds), "
            "useful TFLOP/s (padding not counted); ratio = time / rocmflash varlen", "",
            "| mix | pass | path | µs | TFLOP/s | time vs varlen |", "|---|---|---|---|---|---|"]
    table = MarkdownTable(path, head)
    for name, (lengths, hq, hkv, d) in _mixes(torch, args.quick).items():
        useful = 4.0 * hq * d * sum(n * n for n in lengths) / 2
        cases = _cases(torch, lengths, hq, hkv, d, torch.bfloat16)
        for bwd in (False, True):
            med = interleaved_medians(torch, {p: (lambda fn=fn: fn(bwd)) for p, fn in cases.items()}, args.rounds,
                                      args.iters)
            for p, t in med.items():
                flops = useful * (3.5 if bwd else 1.0)
                table.add(f"| {name} | {'fwd+bwd' if bwd else 'fwd'} | {p} | {t:.0f} | {flops / t / 1e6:.0f} | "
                          f"{t / med['rocmflash varlen']:.2f}x |")
            table.flush()
        del cases
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
