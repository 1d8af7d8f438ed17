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
    import csv

    with open(path, newline="") as f:
        lines = f.readlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    records = list(csv.DictReader(lines[start:]))
    if records and "Metric Name" in records[0]:  # details page: one row per metric, folded into one per kernel
        kernels: dict = {}
        for r in records:
            row = kernels.setdefault((r["ID"], r["Kernel Name"]), {"ID": r["ID"], "Kernel Name": r["Kernel Name"]})
            row.setdefault(r["Metric Name"], r["Metric Value"])  # the first value of a metric, as ncu lists it
        head = ["ID", "Kernel Name", *sorted({k for row in kernels.values() for k in row} - {"ID", "Kernel Name"})]
        table = [[row.get(k, "") for k in head] for row in kernels.values()]
    else:  # raw page: one row per kernel (the second row holds units); the METRICS columns
        head = ["ID", "Kernel Name", "Block Size", "Grid Size", *[m for m in METRICS if records and m in records[0]]]
        table = [[r.get(k, "") for k in head] for r in records[1:]]
    name = head.index("Kernel Name")
    for row in table:
        row[name] = str(row[name])[:40]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows += ["| " + " | ".join(str(v) for v in r) + " |" for r in table]
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
