"""Where an fp8 forward call's time goes beyond its kernel: the public call against its parts, on the live GPU.

``flash_attn_func`` on fp8 q/k/v (B 4, Hq 32, Hkv 8, D 128, e4m3) at each ``--seqlens`` length, causal and not, timed
seven ways in the same interleaved rounds (CUDA events around ``--iters`` back-to-back calls, host included):

- ``api``: the public call (V made K-major by :func:`rocmflash.kernels.fp8.forward.as_kmajor_v` where the arch
  wants it, the launch, the error-word poll; the checks, the selection and the launch keys once per call
  signature: :mod:`rocmflash.api.fp8_plans`);
- ``api, checked every call``: the same with the kept plans cleared before each call, so each runs the checks,
  the selection and the launch-key computation (as every call did before the plans);
- ``kernel``: :func:`rocmflash.kernels.fp8.forward.launch` with the same config on a V that is K-major already
  (no copy), the output preallocated;
- ``kmajor copy``: :func:`~rocmflash.kernels.fp8.forward.as_kmajor_v` alone (the Triton transpose,
  :func:`rocmflash.kernels.fp8.vlayout.kmajor_copy`);
- ``torch copy`` and ``api, torch copy``: the same copy made as rocmflash made it before that kernel
  (:func:`~rocmflash.kernels.fp8.vlayout.torch_kmajor_copy`: ``copy_`` of the transposed view into the padded
  buffer), alone and swapped into the public call;
- ``byte copy``: ``torch.Tensor.copy_`` of V's bytes into a contiguous buffer (the same bytes moved, no
  transpose): what a copy at the memory's speed costs.

A second table gives the device time per launch (torch's profiler) of the fp8 kernel on a K-major V, of the copy
that makes it, and of the kernel reading V as given (no copy, one launch fewer, a slower kernel on sm_90): the GPU
side of choosing the copy.

Usage (on a GPU)::

    python bench/fp8_overhead.py --out $OUT [--seqlens 1024,2048,8192] [--rounds 5] [--iters 20]
"""

from __future__ import annotations

import argparse
import os
import sys

from interleaved import MarkdownTable, gpu_table_head, interleaved_medians, kernel_device_us


def _paths(torch, S: int, causal: bool):
    import rocmflash
    from rocmflash.api.selection_fp8 import select_fp8_config
    from rocmflash.kernels.fp8 import forward as F8
    from rocmflash.kernels.fp8 import vlayout as VL

    B, Hq, Hkv, D = 4, 32, 8, 128
    f8 = torch.float8_e4m3fn
    q, k, v = (torch.randn(B, S, h, D, device="cuda").to(f8) for h in (Hq, Hkv, Hkv))
    qd, kd, vd = (torch.rand(B, Hkv, device="cuda") + 0.5 for _ in range(3))
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # the API's (B, H, S, D) views
    cfg = select_fp8_config(q.device, D, f8, causal, Hq // Hkv, S) or F8.default_config("sm_90", D)
    v_kmajor, _ = F8.as_kmajor_v(vh)
    out = torch.empty(B, S, Hq, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    flat = torch.empty(v.numel(), device="cuda", dtype=torch.uint8)
    v_bytes = v.view(torch.uint8).reshape(-1)
    scale = D ** -0.5

    def api():
        return rocmflash.flash_attn_func(q, k, v, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)

    def api_torch_copy():
        kept, F8.kmajor_copy = F8.kmajor_copy, lambda v, keys=None: VL.torch_kmajor_copy(v)
        try:
            return api()
        finally:
            F8.kmajor_copy = kept

    try:
        from rocmflash.api.fp8_plans import clear as clear_plans
    except ImportError:  # a rocmflash from before the kept plans: every call is checked already
        clear_plans = None

    def api_checked():  # no kept plan: every call runs the checks, the selection and the launch keys, as before them
        if clear_plans is not None:
            clear_plans()
        return api()

    device = {  # device time per kernel (torch profiler): what reading V as given would cost instead of the copy
        "fp8 kernel, V K-major": lambda: F8.launch(qh, kh, v_kmajor, qd, kd, vd, cfg, causal, scale, out,
                                                   arch="sm_90"),
        "fp8 kernel, V as given": lambda: F8.launch(qh, kh, vh, qd, kd, vd, cfg, causal, scale, out, arch=None),
        "copy": lambda: F8.as_kmajor_v(vh),
    }
    return {
        "api": api,
        "api, torch copy": api_torch_copy,
        "api, checked every call": api_checked,
        "kernel": lambda: F8.launch(qh, kh, v_kmajor, qd, kd, vd, cfg, causal, scale, out, arch="sm_90"),
        "kmajor copy": lambda: F8.as_kmajor_v(vh),
        "torch copy": lambda: VL.torch_kmajor_copy(vh),
        "byte copy": lambda: flat.copy_(v_bytes),
    }, cfg, device


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--seqlens", default="1024,2048,8192")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    import torch

    head = gpu_table_head(torch, "fp8_overhead.py", "fp8 forward: the public call against its parts",
                          "B 4, Hq 32, Hkv 8, D 128, e4m3 q/k/v; µs per call (CUDA events around back-to-back calls, "
                          "host included), median of interleaved rounds",
                          ["S", "causal", "config", "api µs", "api, checked every call µs", "checked / api",
                           "api, torch copy µs", "kernel µs", "kmajor copy µs", "torch copy µs", "byte copy µs",
                           "api - kernel µs"])
    if head is None:
        return 2
    os.makedirs(args.out, exist_ok=True)
    table = MarkdownTable(os.path.join(args.out, "fp8_overhead.md"), head)
    table.tail += ["Device time per launch (torch profiler, 30 eager calls): the fp8 kernel on a K-major V, the copy "
                   "that makes it, and the kernel reading V as given (no copy; one launch fewer):", "",
                   "| S | causal | fp8 kernel, V K-major µs | copy µs | fp8 kernel, V as given µs | "
                   "as given - (K-major + copy) µs |", "|---|---|---|---|---|---|"]
    for S in (int(s) for s in args.seqlens.split(",")):
        for causal in (False, True):
            paths, cfg, device = _paths(torch, S, causal)
            med = interleaved_medians(torch, paths, args.rounds, args.iters)
            gpu = {name: sum(us for kernel, us in kernel_device_us(torch, fn).items()
                             if kernel.startswith(("_fwd_fp8", "_kmajor_bytes"))) for name, fn in device.items()}
            kmajor = gpu["fp8 kernel, V K-major"] + gpu["copy"]
            table.tail.append(f"| {S} | {causal} | {gpu['fp8 kernel, V K-major']:.1f} | {gpu['copy']:.1f} | "
                              f"{gpu['fp8 kernel, V as given']:.1f} | {gpu['fp8 kernel, V as given'] - kmajor:+.1f} |")
            label = f"{cfg.BLOCK_M}x{cfg.BLOCK_N} w{cfg.num_warps} s{cfg.num_stages}"
            checked = med["api, checked every call"]
            table.add(f"| {S} | {causal} | {label} | {med['api']:.1f} | {checked:.1f} | {checked / med['api']:.2f}x | "
                      f"{med['api, torch copy']:.1f} | "
                      f"{med['kernel']:.1f} | {med['kmajor copy']:.1f} | {med['torch copy']:.1f} | "
                      f"{med['byte copy']:.1f} | {med['api'] - med['kernel']:.1f} |")
            table.flush()
            del paths
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
