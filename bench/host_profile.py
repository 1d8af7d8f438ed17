"""Where the host time of one attention call goes: cProfile over many tiny calls.

Tiny shapes (B1, 2 heads, S=16, D=64, bf16) so the GPU work is negligible; the profile
shows the Python cost per call of ``rocmflash.attention`` forward and forward+backward,
split by function (``tottime``: time in the function itself).

``--cpu-stub`` runs on a machine without a GPU: CPU tensors, Triton's launcher replaced
by a no-op, so what is timed is rocmflash's own Python (checks, selection, autograd
Function, argument building, launch-cache key) plus torch's allocations and autograd
engine, next to SDPA's whole CPU call on the same tensors (which includes its tiny
compute). It measures the layers above Triton, not a launch.

Usage::

    python bench/host_profile.py --calls 300 --out $OUT          # on a GPU
    python bench/host_profile.py --cpu-stub --calls 2000         # on a CPU
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time


def _stub_launches():
    """CPU tensors through the compiled-launch path, with Triton's launcher replaced by a no-op."""
    import rocmflash.api as api
    from rocmflash.kernels import common as C

    class _NoLaunch:  # stands in for Triton's CompiledKernel: compiled[grid](*args) does nothing
        def __getitem__(self, grid):
            return lambda *args: None

    C.interpreting = lambda: False
    api._interpreting = lambda: True  # accept CPU tensors at the API's device check
    C._jit_launch = lambda fn, grid, kwargs: _NoLaunch()
    C._is_compiled_kernel = lambda obj: isinstance(obj, _NoLaunch)
    C.FAST_LAUNCH = True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--cpu-stub", action="store_true", help="no GPU: CPU tensors, launches stubbed out")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    import rocmflash

    device = "cpu" if args.cpu_stub else "cuda"
    if args.cpu_stub:
        _stub_launches()
    q, k, v = (torch.randn(1, 2, 16, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def fwd():
        with torch.no_grad():
            rocmflash.attention(q, k, v, causal=True)

    def fwd_bwd():
        torch.autograd.grad(rocmflash.attention(q, k, v, causal=True), (q, k, v), do)

    def sdpa_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def sdpa_fwd_bwd():
        torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), do)

    report = io.StringIO()
    report.write(f"torch {torch.__version__}; device {device}{' (launches stubbed)' if args.cpu_stub else ''}; "
                 f"{args.calls} calls per loop\n\n| call | µs per call (no profiler) |\n|---|---|\n")
    for name, fn in (("rocmflash forward", fwd), ("rocmflash forward+backward", fwd_bwd),
                     ("SDPA forward", sdpa_fwd), ("SDPA forward+backward", sdpa_fwd_bwd)):
        for _ in range(50):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        sync()
        report.write(f"| {name} | {(time.perf_counter() - t0) / args.calls * 1e6:.1f} |\n")
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
        stats = profile_calls(fn, args.calls, sync, report)
        report.write(f"\n===== {name}: {stats.total_tt / args.calls * 1e6:.1f} us of profiled host time per call\n")
        stats.sort_stats("tottime").print_stats(args.top)
    write_report(report, args.out, "host-profile.txt")
    return 0


def profile_calls(fn, calls: int, sync, stream) -> pstats.Stats:
    """cProfile over ``calls`` calls of ``fn`` (``sync()`` after), as Stats printing to ``stream``."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    sync()
    return pstats.Stats(prof, stream=stream)


def write_report(report: io.StringIO, out: str, name: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "w") as f:
        f.write(report.getvalue())
    print(report.getvalue()[:30000])


if __name__ == "__main__":
    sys.exit(main())
