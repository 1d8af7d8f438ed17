"""What a user gets: ``rocmflash.attention`` with the shipped configs against PyTorch SDPA.

One process, one GPU, interleaved rounds. For every shape of the grid, forward and
forward+backward through the public API (``rocmflash.attention``: input checks, run-time
config selection from the shipped database, launch; host time included), against SDPA's
flash backend, its cuDNN backend and SDPA's default choice on the same inputs.

Timing: ``n`` back-to-back calls between two CUDA events after a warm-up, divided by
``n`` (no cache flush between calls: host overhead shows wherever the GPU work is too
small to hide it), median over interleaved rounds. TFLOP/s = 4·B·Hq·Sq·Sk·D / t (half
for causal); forward+backward counts 3.5x the forward's flops. GQA goes to SDPA with
``enable_gqa=True``; a backend that refuses it gets K/V repeated outside the timed region
(a small advantage to that backend, marked ``*``).

A host-overhead section times tiny shapes (B1 H2 S16 D64), where the GPU work is negligible.

Usage (on a GPU)::

    python benchmarks/user_grid.py --out $OUT [--rounds 5] [--label h100]
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from interleaved import chosen_cases, grid_parser, run_meta  # beside this script (python benchmarks/user_grid.py)

#: name -> (B, Hq, Hkv, S, D, causal, dtype)
GRID = {
    "D128 S2048 B8 H16": (8, 16, 16, 2048, 128, False, "bf16"),
    "D128 S8192 B2 H16": (2, 16, 16, 8192, 128, False, "bf16"),
    "D128 S8192 B2 H16 causal": (2, 16, 16, 8192, 128, True, "bf16"),
    "D64 S2048 B8 H32 causal": (8, 32, 32, 2048, 64, True, "bf16"),
    "D64 S2048 B8 H32": (8, 32, 32, 2048, 64, False, "bf16"),
    "D96 S4096 B4 H16 causal": (4, 16, 16, 4096, 96, True, "bf16"),
    "D256 S4096 B4 H8": (4, 8, 8, 4096, 256, False, "bf16"),
    "B1 Hq32 Hkv8 S1025 D128 causal": (1, 32, 8, 1025, 128, True, "bf16"),
    "fp16 B2 Hq32 Hkv8 S4096 D128 causal": (2, 32, 8, 4096, 128, True, "fp16"),
}
PATHS = ("rocmflash", "sdpa flash", "sdpa cudnn", "sdpa default")


def _flops(B, Hq, S, D, causal, backward):
    f = 4.0 * B * Hq * S * S * D * (0.5 if causal else 1.0)
    return f * (3.5 if backward else 1.0)


def _sdpa_call(torch, F, backend, group):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"sdpa flash": [SDPBackend.FLASH_ATTENTION], "sdpa cudnn": [SDPBackend.CUDNN_ATTENTION]}

    def call(q, k, v, causal, expanded):
        if expanded:
            k, v = expanded
        if backend == "sdpa default":
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=group > 1 and not expanded)
        with sdpa_kernel(backends[backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=group > 1 and not expanded)
    return call


def _make_step(torch, call, q, k, v, do, causal, backward, expanded=None):
    leaves = (q, k, v) if not expanded else (q, *expanded)

    def step():
        if backward:
            out = call(q, k, v, causal, expanded)
            torch.autograd.grad(out, leaves, do)
        else:
            with torch.no_grad():
                call(q, k, v, causal, expanded)
    return step


def _time(torch, step, n):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def _build(torch, F, rocmflash, spec, backward, seed):
    B, Hq, Hkv, S, D, causal, dt = spec
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=g).requires_grad_(backward)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=g).requires_grad_(backward)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=g).requires_grad_(backward)
    do = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=g)
    group = Hq // Hkv
    steps, marks = {}, {}
    for path in PATHS:
        if path == "rocmflash":
            steps[path] = _make_step(torch, lambda q, k, v, c, e: rocmflash.attention(q, k, v, causal=c),
                                     q, k, v, do, causal, backward)
            continue
        call = _sdpa_call(torch, F, path, group)
        step = _make_step(torch, call, q, k, v, do, causal, backward)
        try:
            step()
            torch.cuda.synchronize()
        except RuntimeError:
            if group == 1:
                steps[path] = None
                continue
            expanded = tuple(x.detach().repeat_interleave(group, 1).requires_grad_(backward) for x in (k, v))
            step = _make_step(torch, call, q, k, v, do, causal, backward, expanded)
            try:
                step()
                torch.cuda.synchronize()
            except RuntimeError:
                steps[path] = None
                continue
            marks[path] = "*"
        steps[path] = step
    return steps, marks, (q, k, v, do)


def measure(rounds: int, grid: dict) -> dict:
    import torch
    import torch.nn.functional as F

    import rocmflash

    results = {}
    for name, spec in grid.items():
        B, Hq, Hkv, S, D, causal, dt = spec
        for backward in (False, True):
            label = f"{name} {'fwd+bwd' if backward else 'fwd'}"
            steps, marks, _ = _build(torch, F, rocmflash, spec, backward, seed=len(results))
            live = {p: s for p, s in steps.items() if s is not None}
            for s in live.values():  # warm-up: compile, select, autotune-free
                for _ in range(3):
                    s()
            probe = _time(torch, live["rocmflash"], 3)
            n = max(5, min(200, int(50.0 / max(probe, 1e-3))))  # ~50 ms per timed loop
            samples = {p: [] for p in live}
            for _ in range(rounds):
                for p, s in live.items():
                    samples[p].append(_time(torch, s, n))
            flops = _flops(B, Hq, S, D, causal, backward)
            row = {}
            for p in PATHS:
                if p not in live:
                    row[p] = None
                    continue
                ms = statistics.median(samples[p])
                row[p] = {"ms": ms, "tflops": flops / ms / 1e9, "mark": marks.get(p, "")}
            results[label] = row
            print(label, {p: round(r["tflops"], 1) if r else None for p, r in row.items()}, flush=True)
            del steps, live
            torch.cuda.empty_cache()
    return results


def host_section(rounds: int) -> dict:
    """Wall µs per call on tiny shapes (GPU work negligible): rocmflash vs SDPA default."""
    import torch
    import torch.nn.functional as F

    import rocmflash

    out = {}
    for backward in (False, True):
        q, k, v = (torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
                   for _ in range(3))
        do = torch.randn_like(q)
        steps = {"rocmflash": _make_step(torch, lambda q, k, v, c, e: rocmflash.attention(q, k, v, causal=c),
                                         q, k, v, do, True, backward),
                 "sdpa default": _make_step(torch, _sdpa_call(torch, F, "sdpa default", 1), q, k, v, do, True,
                                            backward)}
        for s in steps.values():
            for _ in range(20):
                s()
        samples = {p: [] for p in steps}
        for _ in range(rounds):
            for p, s in steps.items():
                samples[p].append(_time(torch, s, 300) * 1000.0)
        out["tiny fwd+bwd" if backward else "tiny fwd"] = {p: statistics.median(v) for p, v in samples.items()}
    return out


def markdown(results: dict, host: dict, meta: dict) -> str:
    lines = [f"# What a user gets: rocmflash.attention vs PyTorch SDPA ({meta['label']})", "",
             f"- date: {meta['date']}; device: {meta['device']}; torch {meta['torch']}, Triton {meta['triton']}; "
             f"rocmflash {meta['commit']}",
             f"- command: `{meta['command']}`",
             "- method: back-to-back calls of the public API between CUDA events (host time included), median of "
             f"{meta['rounds']} interleaved rounds; TFLOP/s, fwd+bwd counted as 3.5x the forward; "
             "`*` = SDPA backend refused GQA, K/V repeated outside the timed region.", "",
             "| case | rocmflash | SDPA flash | cuDNN | SDPA default | vs flash | vs cuDNN |",
             "|---|---|---|---|---|---|---|"]
    for label, row in results.items():
        def cell(p):
            r = row.get(p)
            return "n/a" if r is None else f"{r['tflops']:.0f}{r['mark']}"

        def ratio(p):
            r, o = row.get("rocmflash"), row.get(p)
            return "n/a" if (r is None or o is None) else f"{r['tflops'] / o['tflops']:.2f}x"
        lines.append(f"| {label} | " + " | ".join(cell(p) for p in PATHS) + f" | {ratio('sdpa flash')} | "
                     f"{ratio('sdpa cudnn')} |")
    lines += ["", "## Host overhead: wall µs per call on tiny shapes (B1 H2 S16 D64, causal)", "",
              "| case | rocmflash | SDPA default | ratio |", "|---|---|---|---|"]
    for label, row in host.items():
        lines.append(f"| {label} | {row['rocmflash']:.1f} | {row['sdpa default']:.1f} | "
                     f"{row['rocmflash'] / row['sdpa default']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = grid_parser(__doc__)
    args = ap.parse_args(argv)
    import torch

    grid = chosen_cases(ap, GRID, args.cases)
    results = measure(args.rounds, grid)
    host = host_section(args.rounds)
    meta = run_meta(torch, args, "user_grid.py", argv)
    os.makedirs(args.out, exist_ok=True)
    text = markdown(results, host, meta)
    with open(os.path.join(args.out, f"user-grid-{args.label}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, f"user-grid-{args.label}.json"), "w") as f:
        json.dump({"meta": meta, "results": results, "host": host}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
