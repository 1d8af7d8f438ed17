"""Where the host time of one attention call goes: cProfile over many tiny calls.

``--case forward`` (default): tiny shapes (B1, 2 heads, S=16, D=64, bf16) so the GPU work
is negligible; the profile shows the Python cost per call of ``rocmflash.attention``
forward and forward+backward, split by function (``tottime``: time in the function itself).

``--case decode``: eager ``rocmflash.flash_attn_with_kvcache`` at batch 1 (Hq 32, Hkv 8,
D 128, bf16, 8192 cache slots, ``cache_seqlens`` given as an int32 tensor, one new token
with its k/v appended), on a contiguous and on a paged cache (``--page-size``, shuffled
block table), each also with ``check_values=False`` (no host read of the lengths/table), and
a cache that grows by one key every call without ``cache_seqlens`` (transformers' generate
through :mod:`rocmflash.integrations.hf`: a new shape, so nothing cached per shape is reused).
On a GPU, SDPA over the same cache (a view of the first ``cache_seqlens + 1`` keys) is
timed next to it.

``--cpu-stub`` runs on a machine without a GPU: CPU tensors, Triton's launcher replaced
by a no-op, so what is timed is rocmflash's own Python (checks, selection, autograd
Function, argument building, launch-cache key) plus torch's allocations and autograd
engine, next to SDPA's whole CPU call on the same tensors (which includes its tiny
compute). It measures the layers above Triton, not a launch.

Usage::

    python bench/host_profile.py --calls 300 --out $OUT          # on a GPU
    python bench/host_profile.py --cpu-stub --calls 2000         # on a CPU
    python bench/host_profile.py --cpu-stub --case decode --calls 2000

Each timed row is the median over ``--rounds`` loops of ``--calls`` calls (other load on
the machine shows up as spread between rounds, not as a shifted mean).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import os
import pstats
import statistics
import sys
import time


def _stub_launches():
    """CPU tensors through the compiled-launch path, with Triton's launcher replaced by a no-op."""
    import rocmflash.api as api
    import rocmflash.decode as decode
    from rocmflash.kernels import launch as L

    class _NoLaunch:  # stands in for Triton's CompiledKernel: compiled[grid](*args) does nothing
        def __getitem__(self, grid):
            return lambda *args: None

    L.interpreting = lambda: False
    api._interpreting = lambda: True  # accept CPU tensors at the API's device check
    decode._interpreting = lambda: True  # and at flash_attn_with_kvcache's
    L._jit_launch = lambda fn, grid, kwargs: _NoLaunch()
    L._is_compiled_kernel = lambda obj: isinstance(obj, _NoLaunch)
    L.FAST_LAUNCH = True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=("forward", "decode"), default="forward")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5, help="timed loops per row (the median is reported)")
    ap.add_argument("--page-size", type=int, default=256, help="decode: page size of the paged cache")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--cpu-stub", action="store_true", help="no GPU: CPU tensors, launches stubbed out")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    import torch

    device = "cpu" if args.cpu_stub else "cuda"
    if args.cpu_stub:
        _stub_launches()

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    rows, profiled = (_forward_case if args.case == "forward" else _decode_case)(torch, device, args)
    report = io.StringIO()
    report.write(f"torch {torch.__version__}; device {device}{' (launches stubbed)' if args.cpu_stub else ''}; "
                 f"case {args.case}; {args.calls} calls per loop, median of {args.rounds} loops\n\n"
                 "| call | µs per call (no profiler) | min..max over loops |\n|---|---|---|\n")
    for name, fn in rows:
        per_call = time_calls(fn, args.calls, args.rounds, sync)
        report.write(f"| {name} | {statistics.median(per_call):.1f} | {min(per_call):.1f}..{max(per_call):.1f} |\n")
    for name, fn in profiled:
        stats = profile_calls(fn, args.calls, sync, report)
        report.write(f"\n===== {name}: {stats.total_tt / args.calls * 1e6:.1f} us of profiled host time per call\n")
        stats.sort_stats("tottime").print_stats(args.top)
    write_report(report, args.out, "host-profile.txt" if args.case == "forward" else f"host-profile-{args.case}.txt")
    return 0


def _forward_case(torch, device, args):
    """``(timed rows, profiled rows)``, each ``[(name, fn)]``: the dense forward and forward+backward, and SDPA."""
    import torch.nn.functional as F

    import rocmflash

    q, k, v = (torch.randn(1, 2, 16, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)

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

    rows = [("rocmflash forward", fwd), ("rocmflash forward+backward", fwd_bwd),
            ("SDPA forward", sdpa_fwd), ("SDPA forward+backward", sdpa_fwd_bwd)]
    return rows, [("forward", fwd), ("forward+backward", fwd_bwd)]


def _decode_case(torch, device, args):
    """``(timed rows, profiled rows)`` of eager decode: contiguous and paged caches, with and without the
    host read of the lengths/table; SDPA over the same keys on a GPU."""
    import torch.nn.functional as F

    import rocmflash

    B, Hq, Hkv, D, capacity, length = 1, 32, 8, 128, 8192, 4096
    dt = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, 1, Hq, D, device=device, dtype=dt, generator=gen)
    k_new, v_new = (torch.randn(B, 1, Hkv, D, device=device, dtype=dt, generator=gen) for _ in range(2))
    lens = torch.full((B,), length, dtype=torch.int32, device=device)  # fixed: every call rewrites one slot
    kc, vc = (torch.randn(B, capacity, Hkv, D, device=device, dtype=dt, generator=gen) for _ in range(2))
    page = args.page_size
    pages = capacity // page
    kp, vp = (t.view(B * pages, page, Hkv, D) for t in (kc, vc))
    table = torch.randperm(B * pages, device=device, generator=gen).view(B, pages).to(torch.int32)

    def contiguous(check=True):
        with torch.no_grad():
            rocmflash.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, causal=True,
                                              check_values=check)

    def paged(check=True):
        with torch.no_grad():
            rocmflash.flash_attn_with_kvcache(q, kp, vp, k_new, v_new, cache_seqlens=lens, block_table=table,
                                              causal=True, check_values=check)

    big = 4 * capacity  # room for every call of a default run (2000 x 5 + warm-up) to see a new length
    kg, vg = (torch.randn(B, big, Hkv, D, device=device, dtype=dt, generator=gen) for _ in range(2))
    grown = itertools.count()

    def growing():  # (B, L, Hkv, D) views of a cache, L one longer each call (wraps after 31k calls)
        L = 1024 + next(grown) % (big - 1024)
        with torch.no_grad():
            rocmflash.flash_attn_with_kvcache(q, kg[:, :L], vg[:, :L], softmax_scale=D ** -0.5)

    rows = [("decode contiguous", contiguous), ("decode contiguous, check_values=False", lambda: contiguous(False)),
            (f"decode paged (page {page})", paged), (f"decode paged (page {page}), check_values=False",
                                                     lambda: paged(False)),
            ("decode, cache one key longer each call, no cache_seqlens", growing)]
    if device == "cuda":  # on the CPU SDPA's time is its compute over 4k keys, no host cost
        qs = q.transpose(1, 2)
        ks, vs = (t[:, :length + 1].transpose(1, 2) for t in (kc, vc))

        def sdpa():
            with torch.no_grad():
                F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)

        rows.append(("SDPA (same keys, GQA)", sdpa))
    return rows, [("decode contiguous", contiguous), (f"decode paged (page {page})", paged)]


def time_calls(fn, calls: int, rounds: int, sync) -> list:
    """µs per call of ``fn`` in each of ``rounds`` loops of ``calls`` calls (after 50 warm-up calls)."""
    for _ in range(50):
        fn()
    sync()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return out


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
