"""Why a served-SDPA row of ``benchmarks/untuned_grid.py`` differs between entry points: host (enqueue) and wall µs
per call, and the kernels each path runs, for one grid case, forward+backward and forward.

Usage (on a GPU): ``python benchmarks/diag/served_probe.py [--case "GQA3 S1000 D64 causal"] [--rounds 11]``
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="GQA3 S1000 D64 causal")
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    os.environ["ROCMFLASH_CONFIG_DIR"] = tempfile.mkdtemp(prefix="rocmflash-probe-")
    import torch

    import rocmflash
    from interleaved import host_and_wall_us, kernel_device_us
    from untuned_grid import GRID, _steps

    sdpa = torch._C._nn.scaled_dot_product_attention
    handle = rocmflash.patch_sdpa()
    report = {}
    for backward in (True, False):
        steps = _steps(torch, rocmflash, sdpa, GRID[args.case], backward, seed=0)
        paths = {p: steps[p] for p in ("attention", "sdpa", "patch_sdpa", "flash_attn_func", "sdpa bshd")}
        for s in paths.values():
            for _ in range(3):
                s()
        host, wall = {p: [] for p in paths}, {p: [] for p in paths}
        for r in range(args.rounds):
            for p in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
                h, w = host_and_wall_us(torch, paths[p], 100)
                host[p].append(h)
                wall[p].append(w)
        side = "fwd+bwd" if backward else "fwd"
        report[side] = {p: {"host_us": round(statistics.median(host[p]), 1), "wall_us": round(statistics.median(wall[p]), 1),
                            "kernels": kernel_device_us(torch, paths[p], 20)} for p in paths}
        for p, r in report[side].items():
            print(side, p, r["host_us"], r["wall_us"], flush=True)
            print("   ", r["kernels"], flush=True)
    handle.restore()
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "served-probe.json"), "w") as f:
        json.dump({"case": args.case, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "report": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
