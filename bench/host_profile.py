"""Where the host time of one attention call goes: cProfile over many tiny calls.

Tiny shapes (B1, 2 heads, S=16, D=64, bf16) so the GPU work is negligible; the profile
shows the Python cost per call of ``rocmflash.attention`` forward and forward+backward,
split by function (``tottime``: time in the function itself).

Usage (on a GPU)::

    python bench/host_profile.py --calls 300 --out $OUT
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    import torch

    import rocmflash

    q, k, v = (torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)

    def fwd():
        with torch.no_grad():
            rocmflash.attention(q, k, v, causal=True)

    def fwd_bwd():
        rocmflash.attention(q, k, v, causal=True).backward(do)

    report = io.StringIO()
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(prof, stream=report)
        total = stats.total_tt / args.calls * 1e6
        report.write(f"\n===== {name}: {total:.1f} us of profiled host time per call ({args.calls} calls)\n")
        stats.sort_stats("tottime").print_stats(args.top)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host-profile.txt"), "w") as f:
        f.write(report.getvalue())
    print(report.getvalue()[:20000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
