"""Which GPU kernels one public call runs, rocmflash beside PyTorch's SDPA default, on the same inputs.

A diagnostic for the dispatch (issue #28): where an entry says the platform's SDPA serves a shape, the rocmflash
call must run exactly SDPA's kernels -- no extra copy, no other backend. For each shape, ``--calls`` back-to-back
forward calls (or forward+backward with ``--train``) of ``rocmflash.attention`` and of
``F.scaled_dot_product_attention`` run under ``torch.profiler``; the table lists every GPU kernel with its launches
per call and its mean µs, and the CUDA-event wall per call of the same loop unprofiled.

Usage (on a GPU)::

    python benchmarks/served_kernels.py --out DIR [--shapes 1x32x8x1025x128c,1x2x2x16x64c] [--train] [--calls 50]

A shape is ``BxHqxHkvxSxD`` with a trailing ``c`` for causal (bf16).
"""

from __future__ import annotations

import argparse
import os
import statistics


def _shape(text: str) -> tuple:
    causal = text.endswith("c")
    B, Hq, Hkv, S, D = (int(x) for x in text.rstrip("c").split("x"))
    return B, Hq, Hkv, S, D, causal


def _calls(torch, F, rocmflash, shape, train: bool, bshd: bool = False):
    B, Hq, Hkv, S, D, causal = shape
    g = torch.Generator(device="cuda").manual_seed(0)

    def tensor(H):  # (B, H, S, D), or with bshd a view of (B, S, H, D) memory (a model's projections)
        t = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2) if bshd \
            else torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        return t.requires_grad_(train)
    q, k, v = tensor(Hq), tensor(Hkv), tensor(Hkv)
    do = torch.randn_like(q)
    gqa = Hq != Hkv

    def wrap(fn):
        def call():
            if train:
                torch.autograd.grad(fn(), (q, k, v), do)
            else:
                with torch.no_grad():
                    fn()
        return call
    return {"sdpa default": wrap(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)),
            "rocmflash.attention": wrap(lambda: rocmflash.attention(q, k, v, causal=causal))}


def _kernels(torch, call, n: int, cpu_ops: bool = False) -> list:
    """``[(name, per call, µs each)]``: the GPU kernels of ``n`` calls, or with ``cpu_ops`` the host-side torch ops
    (``aten::``) each call dispatches, by their CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU if cpu_ops else ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if cpu_ops:
            us = e.self_cpu_time_total if e.key.startswith(("aten::", "cuda", "cud")) else 0.0
        else:
            us = getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0)
        if us > 0:
            rows.append((e.key[:100], e.count / n, us / max(e.count, 1)))
    return sorted(rows, key=lambda r: -r[1] * r[2])


def _wall_us(torch, call, n: int, rounds: int = 5) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            call()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / n)
    return statistics.median(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default="1x32x8x1025x128c,1x2x2x16x64c")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--cpu-ops", action="store_true", help="list the host-side torch ops of each call instead")
    ap.add_argument("--bshd", action="store_true", help="inputs as (B, H, S, D) views of (B, S, H, D) memory")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    import rocmflash

    lines = [f"# GPU kernels per public call ({torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             f"command: `python benchmarks/served_kernels.py --shapes {args.shapes}{' --train' if args.train else ''}"
             f"{' --cpu-ops' if args.cpu_ops else ''}{' --bshd' if args.bshd else ''} --calls {args.calls}`", ""]
    for text in args.shapes.split(","):
        shape = _shape(text)
        calls = _calls(torch, F, rocmflash, shape, args.train, args.bshd)
        for call in calls.values():  # warm-up: compile, select, plan
            for _ in range(3):
                call()
        torch.cuda.synchronize()
        lines += [f"## {text} {'forward+backward' if args.train else 'forward'}", "",
                  "| path | wall µs per call | kernel | launches per call | µs each |", "|---|---|---|---|---|"]
        for name, call in calls.items():
            wall = _wall_us(torch, call, args.calls)
            for i, (kernel, per_call, us) in enumerate(_kernels(torch, call, args.calls, args.cpu_ops)):
                lines.append(f"| {name if i == 0 else ''} | {f'{wall:.1f}' if i == 0 else ''} | `{kernel}` | "
                             f"{per_call:.2f} | {us:.1f} |")
        lines.append("")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"served-{'ops' if args.cpu_ops else 'kernels'}{'-train' if args.train else ''}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
