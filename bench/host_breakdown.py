"""Where one attention call's host time goes, layer by layer, on a GPU (no profiler).

Tiny shapes (B1, 2 heads, S=16, D=64, bf16, causal) make the GPU work negligible, so the
time to *enqueue* a loop of calls, divided by the number of calls, is the host cost of one
call. Each row times one layer of the call stack on its own, from the floor (an empty
Triton kernel launched through ``JITFunction`` and through the cached ``CompiledKernel``,
one ``torch.empty``, an empty autograd round trip) up to the public API, forward and
forward+backward, next to SDPA. Rows run in interleaved rounds; the median is reported.

A cProfile of the public forward+backward follows (``tottime`` order).

Usage (on a GPU)::

    python bench/host_breakdown.py --out $OUT
"""

from __future__ import annotations

import argparse
import io
import platform
import statistics
import sys
import time

from host_profile import profile_calls, write_report


def _noop_kernel(triton, tl):
    """An empty kernel, defined where Triton's JIT can resolve ``tl`` (module globals)."""
    globals()["tl"] = tl

    @triton.jit
    def _noop(X, n, BLOCK: tl.constexpr):
        pass

    return _noop


def _rows(torch, F, triton, tl):
    import rocmflash
    from rocmflash.api import ops
    from rocmflash.api.selection import select_bwd_config, select_config
    from rocmflash.kernels.backward import host as kb
    from rocmflash.kernels import common as C
    from rocmflash.kernels import get_variant

    dev = "cuda"
    q, k, v = (torch.randn(1, 2, 16, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    scale = 64 ** -0.5
    qd, kd, vd = (t.detach() for t in (q, k, v))
    cfg = select_config(q.device, 64, q.dtype, True, 1, 16, 16)
    bcfg = select_bwd_config(q.device, 64, q.dtype, True, 1, 16)
    out, lse = ops._forward_impl(qd, kd, vd, True, scale, "online", cfg)
    delta = torch.empty_like(lse)
    dq, dk, dv = (torch.empty_like(t) for t in (qd, kd, vd))
    backend = C.torch_backend()

    _noop = _noop_kernel(triton, tl)
    x = torch.empty(16, device=dev)
    compiled = _noop[(1,)](x, 1, BLOCK=16)

    class _Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, c):
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, g):
            return g, g, g

    variant = get_variant("online")

    def fwd_bwd_api():
        torch.autograd.grad(rocmflash.attention(q, k, v, causal=True), (q, k, v), do)

    def sdpa_fwd_bwd():
        torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), do)

    def single_thread(fn):
        def run():
            with torch.autograd.set_multithreading_enabled(False):
                fn()
        return run

    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn()
        return run

    return {
        "floor: torch.empty (1,2,16,64)": lambda: torch.empty((1, 2, 16, 64), device=dev, dtype=torch.bfloat16),
        "floor: triton empty kernel, JITFunction launch": lambda: _noop[(1,)](x, 1, BLOCK=16),
        "floor: triton empty kernel, CompiledKernel launch": lambda: compiled[(1, 1, 1)](x, 1, 16),
        "floor: empty autograd.Function fwd+bwd": lambda: torch.autograd.grad(_Empty.apply(q, k, v), (q, k, v), do),
        "fwd: kernel launch (variant.launch, buffers given)": lambda: variant.launch(
            qd, kd, vd, cfg, True, scale, out=out, lse=lse),
        "fwd: ops._forward_impl (alloc + select + launch)": lambda: ops._forward_impl(
            qd, kd, vd, True, scale, "online", None),
        "fwd: rocmflash.attention (no grad)": no_grad(lambda: rocmflash.attention(q, k, v, causal=True)),
        "fwd: SDPA default (no grad)": no_grad(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "bwd: launch_dq (buffers given)": lambda: kb.launch_dq(qd, kd, vd, out, do, lse, None, delta, dq, True,
                                                              scale, bcfg.dq, backend),
        "bwd: launch_dkdv (buffers given)": lambda: kb.launch_dkdv(qd, kd, vd, do, lse, delta, dk, dv, True, scale,
                                                                  bcfg.dkdv, 1, backend),
        "bwd: kernels.backward.backward (alloc + 2 launches)": lambda: kb.backward(
            do, qd, kd, vd, out, lse, True, scale, config=bcfg),
        "bwd: ops._backward_impl (select + backward)": lambda: ops._backward_impl(
            do, qd, kd, vd, out, lse, None, True, scale),
        "fwd (grad on): ops._EagerAttention.apply": lambda: ops._EagerAttention.apply(
            q, k, v, True, scale, "online", None),
        "fwd+bwd: ops._EagerAttention.apply + autograd.grad": lambda: torch.autograd.grad(
            ops._EagerAttention.apply(q, k, v, True, scale, "online", None)[0], (q, k, v), do),
        "fwd+bwd: rocmflash.attention + autograd.grad": fwd_bwd_api,
        "fwd+bwd: SDPA default + autograd.grad": sdpa_fwd_bwd,
        # the autograd engine runs CUDA backward nodes on its own device thread; with
        # multithreading off it runs them on the calling thread: the hand-off's cost
        "fwd+bwd, engine on the calling thread: empty autograd.Function": single_thread(
            lambda: torch.autograd.grad(_Empty.apply(q, k, v), (q, k, v), do)),
        "fwd+bwd, engine on the calling thread: rocmflash.attention": single_thread(fwd_bwd_api),
        "fwd+bwd, engine on the calling thread: SDPA default": single_thread(sdpa_fwd_bwd),
    }


def _time(torch, fn, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    import triton
    import triton.language as tl

    rows = _rows(torch, F, triton, tl)
    for fn in rows.values():  # compile and warm every path
        for _ in range(20):
            fn()
    samples = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, fn in rows.items():
            samples[name].append(_time(torch, fn, args.n))
    report = io.StringIO()
    report.write(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}, Triton {triton.__version__}, "
                 f"Python {platform.python_version()}; command: python bench/host_breakdown.py "
                 f"--n {args.n} --rounds {args.rounds}\n\n")
    report.write("host µs to enqueue one call (B1 H2 S16 D64 bf16 causal), median of interleaved rounds\n\n"
                 "| layer | host µs | min | max |\n|---|---|---|---|\n")
    for name, vals in samples.items():
        report.write(f"| {name} | {statistics.median(vals):.1f} | {min(vals):.1f} | {max(vals):.1f} |\n")
    stats = profile_calls(rows["fwd+bwd: rocmflash.attention + autograd.grad"], args.n, torch.cuda.synchronize,
                          report)
    report.write(f"\n## cProfile, public forward+backward ({args.n} calls)\n\n```\n")
    stats.sort_stats("tottime").print_stats(args.top)
    report.write("```\n")
    write_report(report, args.out, "host-breakdown.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
