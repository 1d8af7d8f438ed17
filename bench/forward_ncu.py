"""Profiler evidence for the forward's gap to cuDNN: one call of each, for Nsight Compute.

Run under ``ncu`` (NVIDIA only; on ROCm use ``rocprofv3`` on the same script)::

    ncu --profile-from-start off --metrics $(python bench/forward_ncu.py --metrics) --csv --page raw \\
        python bench/forward_ncu.py > ncu-raw.csv
    ncu --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy --csv --page details python bench/forward_ncu.py > ncu.csv
    python bench/forward_ncu.py --summarise ncu-raw.csv      # or ncu.csv

The script warms both paths up (compiles, cuDNN plan), then profiles exactly one
``rocmflash.attention`` call and one SDPA cuDNN call per shape between
``cudaProfilerStart``/``Stop``. ``--summarise`` turns ncu's CSV into a table of the
metrics that say what bounds each kernel: tensor-pipe and issue utilisation, the MUFU
(exp2) and FMA pipes, achieved occupancy.
"""

from __future__ import annotations

import argparse
import sys

#: name -> (B, H, S, D, causal)
SHAPES = {"D128 S8192 B2 H16": (2, 16, 8192, 128, False), "D64 S2048 B8 H32": (8, 32, 2048, 64, False)}


def profile_calls() -> None:
    import torch
    import rocmflash
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cases = []
    for name, (B, H, S, D, causal) in SHAPES.items():
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cases.append((q, k, v, causal))
    for q, k, v, causal in cases:  # warm-up: compile, plans
        for _ in range(3):
            rocmflash.attention(q, k, v, causal=causal)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for q, k, v, causal in cases:
        rocmflash.attention(q, k, v, causal=causal)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


#: what bounds an attention kernel: tensor pipe, exp2 (XU) pipe, FP32 pipes, issue slots, occupancy
METRICS = ("gpu__time_duration.sum", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
           "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
           "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
           "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
           "smsp__issue_active.avg.pct_of_peak_sustained_active", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "launch__registers_per_thread")


def summarise(path: str) -> str:
    """A markdown table, one row per profiled kernel and one column per metric, from ncu's CSV
    (``--csv --page details`` or ``--page raw``; other lines ncu prints are skipped)."""
    import io

    import pandas as pd

    with open(path) as f:
        lines = f.readlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    df = pd.read_csv(io.StringIO("".join(lines[start:])))
    if "Metric Name" in df.columns:  # details page: one row per metric
        df = df.pivot_table(index=["ID", "Kernel Name"], columns="Metric Name", values="Metric Value",
                            aggfunc="first").reset_index()
    else:  # raw page: one row per kernel (the second row holds units); the METRICS columns
        df = df.iloc[1:][["ID", "Kernel Name", "Block Size", "Grid Size", *[m for m in METRICS if m in df.columns]]]
    df["Kernel Name"] = df["Kernel Name"].astype(str).str.slice(0, 40)
    head = [str(c) for c in df.columns]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows += ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summarise", metavar="CSV", default=None, help="print a table from ncu's CSV instead of running")
    ap.add_argument("--metrics", action="store_true", help="print the metric list for ncu --metrics and stop")
    args = ap.parse_args(argv)
    if args.metrics:
        print(",".join(METRICS))
        return 0
    if args.summarise:
        print(summarise(args.summarise))
        return 0
    profile_calls()
    return 0


if __name__ == "__main__":
    sys.exit(main())
