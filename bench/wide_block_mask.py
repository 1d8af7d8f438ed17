"""H100 check for the causal mask of key blocks >= 128 wide (kernels/common.py ``mask_scores``).

Times ``rocmflash.attention`` (causal, bf16, B*S = 16384 tokens, H*D = 2048) with BLOCK_N=128 configs, the only
configs whose NVIDIA code the change touched, for two rocmflash trees given on the command line (each imported in
its own subprocess), alternating ``--rounds`` times; prints median TFLOP/s per tree and config.

Usage (GPU): python bench/wide_block_mask.py --trees before=DIR after=DIR [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = [(128, 4096, dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)),
         (64, 4096, dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)),
         (128, 16384, dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)),
         (128, 4096, dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3))]

CHILD = r"""
import json, sys, torch, triton, rocmflash
from rocmflash.config import KernelConfig
out = []
for D, S, cfg in json.loads(sys.argv[1]):
    B, H = 16384 // S, 2048 // D
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    c = KernelConfig(**cfg)
    ms = triton.testing.do_bench(lambda: rocmflash.attention(q, k, v, causal=True, config=c), warmup=25, rep=200,
                                 return_mode="median")
    out.append(2.0 * B * H * S * S * D / (ms * 1e-3) / 1e12)
print(json.dumps(out))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", nargs="+", required=True, help="label=DIR (a folder holding a rocmflash package)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.trees)
    samples = {label: [] for label in trees}
    for _ in range(args.rounds):
        for label, root in trees.items():
            env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
            res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], capture_output=True, text=True,
                                 env=env, check=True)
            samples[label].append(json.loads(res.stdout.strip().splitlines()[-1]))
    print("| D | S | config | " + " | ".join(trees) + " |")
    print("|---|---|---|" + "---|" * len(trees))
    for i, (D, S, cfg) in enumerate(CASES):
        cells = [f"{statistics.median(r[i] for r in samples[label]):.1f}" for label in trees]
        print(f"| {D} | {S} | {cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']} | "
              + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
