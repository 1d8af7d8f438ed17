"""Varlen calls with a new packing every call, against the same packing every call, on one GPU.

Training on packed sequences, and serving prefill, give ``flash_attn_varlen_func`` new totals, longest sequences
and sequence counts on every call. This times the public call (host time included) two ways, in interleaved
rounds:

* ``same packing``: one packed batch, called again and again;
* ``new packing each call``: a cycle of ``--packings`` different batches of about the same tokens, the next one
  every call (made before timing: only the call is timed).

Forward (no grad, ``ROCMFLASH_NO_INCUMBENT=1``: rocmflash's kernel) and forward+backward, for a small, host-bound
problem and a larger one. With ``--code DIR`` the ``rocmflash`` package is imported from ``DIR`` (an older
checkout): run once with it and once without, on the same machine, for a before/after.

Usage (on a GPU)::

    python bench/varlen_repack.py --out $OUT [--rounds 7] [--code /tmp/before] [--label after]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys

from interleaved import host_and_wall_us

#: (name, total tokens, sequences, Hq, Hkv, D)
PROBLEMS = (("small", 1024, 6, 8, 2, 64), ("large", 8192, 8, 32, 8, 128))


def _lengths(rng, total: int, count: int) -> list:
    cuts = sorted(rng.sample(range(1, total), count - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


def _batch(torch, lens, hq, hkv, d, grad: bool):
    dev, dt = "cuda", torch.bfloat16
    total = sum(lens)
    q = torch.randn(total, hq, d, device=dev, dtype=dt, requires_grad=grad)
    k = torch.randn(total, hkv, d, device=dev, dtype=dt, requires_grad=grad)
    v = torch.randn(total, hkv, d, device=dev, dtype=dt, requires_grad=grad)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), device=dev, dtype=torch.int32)
    return q, k, v, cu, max(lens), torch.randn(total, hq, d, device=dev, dtype=dt)


def _timed(torch, fn, batches, calls: int) -> float:
    """µs per call of ``fn`` over ``calls`` calls cycling through ``batches`` (GPU work included: synchronised)."""
    for i in range(3):
        fn(batches[i % len(batches)])
    cycle = itertools.cycle(batches)
    return host_and_wall_us(torch, lambda: fn(next(cycle)), calls)[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--packings", type=int, default=64, help="different packed batches cycled through")
    ap.add_argument("--code", default=None, help="import rocmflash from this checkout (a before/after)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.code:
        sys.path.insert(0, os.path.abspath(a.code))
    os.environ["ROCMFLASH_NO_INCUMBENT"] = "1"
    import torch
    import triton

    import rocmflash

    def forward(b):
        q, k, v, cu, m, _ = b
        with torch.no_grad():
            rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=True)

    def train(b):
        q, k, v, cu, m, do = b
        out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=True)
        torch.autograd.grad(out, (q, k, v), do)

    rng = random.Random(0)
    rows = []
    for name, total, count, hq, hkv, d in PROBLEMS:
        for label, fn, grad in (("forward", forward, False), ("forward+backward", train, True)):
            fixed = [_batch(torch, _lengths(rng, total, count), hq, hkv, d, grad)]
            cycle = [_batch(torch, _lengths(rng, total - rng.randrange(0, total // 8), count + rng.randrange(-2, 3)),
                            hq, hkv, d, grad) for _ in range(a.packings)]
            times = {"same packing": [], "new packing each call": []}
            for _ in range(a.rounds):
                times["same packing"].append(_timed(torch, fn, fixed, a.calls))
                times["new packing each call"].append(_timed(torch, fn, cycle, a.calls))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append((name, label, med["same packing"], med["new packing each call"],
                         min(times["new packing each call"]), max(times["new packing each call"])))
            del fixed, cycle
    lines = [f"# varlen calls with a new packing each call ({a.label or 'this checkout'})", "",
             f"- {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; rocmflash from "
             f"{os.path.dirname(rocmflash.__file__)}",
             f"- command: `python {' '.join([os.path.relpath(__file__)] + sys.argv[1:])}`",
             f"- µs per call (public `flash_attn_varlen_func`, causal, bf16, host time included), median of {a.rounds} "
             f"interleaved rounds of {a.calls} calls; new packings cycle through {a.packings} batches", "",
             "| problem | pass | same packing µs | new packing each call µs (min..max) | new / same |",
             "|---|---|---|---|---|"]
    for name, label, same, new, lo, hi in rows:
        lines.append(f"| {name} | {label} | {same:.1f} | {new:.1f} ({lo:.1f}..{hi:.1f}) | {new / same:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"varlen-repack{'-' + a.label if a.label else ''}.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
