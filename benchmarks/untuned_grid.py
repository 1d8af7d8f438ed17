"""Never slower on a shape nobody tuned: the public API against PyTorch's default SDPA, no tune run.

Every shape of :data:`GRID` is one the shipped database holds no measured entry for (within the incumbent rule's
bucket distance: GQA 3:1-8:1, head dims 80/96/112/256, odd lengths, Sq != Sk), so what serves it is rocmflash's
run-time decision alone (the first-use timing, ``rocmflash.api.first_use``, into a fresh config directory). One
process, one GPU. For each shape, forward and forward+backward:

* ``attention``: ``rocmflash.attention`` on ``(B, H, S, D)`` tensors, against ``sdpa`` (``F.scaled_dot_product_attention``,
  SDPA's own backend choice, ``enable_gqa`` for GQA) on the same tensors;
* ``flash_attn_func``: ``rocmflash.flash_attn_func`` on ``(B, S, H, D)`` tensors, against ``sdpa bshd``: what a user
  writes instead (SDPA on the transposed views, the output made ``(B, S, H, D)`` contiguous);
* ``patch_sdpa``: ``F.scaled_dot_product_attention`` under ``rocmflash.patch_sdpa()``, against ``sdpa``;
* diagnostics: ``own`` (``rocmflash.attention`` with ``ROCMFLASH_NO_INCUMBENT=1``: rocmflash's kernel whatever the
  decision) and ``cudnn`` (SDPA's cuDNN backend).

Timing: ``n`` back-to-back calls between two events (host time included; Python's cyclic collector paused in the
loop), ``n`` filling ~30 ms, median of ``--rounds`` interleaved rounds, after two warm-up calls. The first call of ``attention`` per shape and pass is
timed alone too (``first call``: the compile of rocmflash's kernels and the first-use timing, both once per
problem). The decisions file is copied beside the report.

Usage (on a GPU)::

    python benchmarks/untuned_grid.py --out $OUT [--rounds 5] [--label h100] [--commit SHA]
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from interleaved import chosen_cases, grid_parser, run_meta  # beside this script (python benchmarks/untuned_grid.py)

#: name -> (B, Hq, Hkv, Sq, Sk, D, causal, dtype)
GRID = {
    "Qwen2-7B-like GQA7 S8192 D128 causal": (2, 28, 4, 8192, 8192, 128, True, "bf16"),
    "Phi-2-like fp16 S2048 D80 causal": (4, 32, 32, 2048, 2048, 80, True, "fp16"),
    "Gemma-2-like GQA2 S16384 D256 causal": (1, 16, 8, 16384, 16384, 256, True, "bf16"),
    "GQA4 S4096 D96 causal": (2, 32, 8, 4096, 4096, 96, True, "bf16"),
    "MHA S2048 D112 causal": (4, 16, 16, 2048, 2048, 112, True, "bf16"),
    "GQA8 S4096 D128 causal (70B-like)": (1, 64, 8, 4096, 4096, 128, True, "bf16"),
    "GQA2 Sq1024 Sk4096 D128": (2, 16, 8, 1024, 4096, 128, False, "bf16"),
    "GQA3 S1000 D64 causal": (8, 12, 4, 1000, 1000, 64, True, "bf16"),
    "GQA4 S1537 D80": (4, 32, 8, 1537, 1537, 80, False, "bf16"),
    "fp16 MHA S2048 D256 causal": (4, 8, 8, 2048, 2048, 256, True, "fp16"),
    "GQA6 S3000 D128 causal": (2, 48, 8, 3000, 3000, 128, True, "bf16"),
    "GQA4 S8192 D112": (1, 32, 8, 8192, 8192, 112, False, "bf16"),
    "GQA8 S16384 D64 causal": (1, 32, 4, 16384, 16384, 64, True, "bf16"),
    "fp16 GQA2 Sq512 Sk2048 D96": (8, 16, 8, 512, 2048, 96, False, "fp16"),
}
PATHS = ("attention", "sdpa", "flash_attn_func", "sdpa bshd", "patch_sdpa", "own", "cudnn")
AGAINST = {"attention": "sdpa", "flash_attn_func": "sdpa bshd", "patch_sdpa": "sdpa"}


def _time(torch, step, n: int) -> float:
    """ms per call of ``n`` back-to-back calls; Python's cyclic collector paused for the loop (as ``timeit`` does:
    a collection landing in one path's loop would charge it a few hundred µs that no other path pays)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gc.collect()
    gc.disable()
    try:
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            step()
        end.record()
        torch.cuda.synchronize()
    finally:
        gc.enable()
    return start.elapsed_time(end) / n


def _steps(torch, rocmflash, sdpa, spec, backward: bool, seed: int) -> dict:
    """``{path: step}`` on one set of fresh inputs (a path's step is one call, and its backward with ``backward``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, Hq, Hkv, Sq, Sk, D, causal, dt = spec
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, h, s, D, device="cuda", dtype=dtype, generator=g).requires_grad_(backward)
               for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    qs, ks, vs = (t.detach().transpose(1, 2).contiguous().requires_grad_(backward) for t in (q, k, v))
    do = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dtype, generator=g)
    do_s = do.transpose(1, 2).contiguous()
    gqa = Hq != Hkv
    F = torch.nn.functional

    def own(q, k, v):
        os.environ["ROCMFLASH_NO_INCUMBENT"] = "1"
        try:
            return rocmflash.attention(q, k, v, causal=causal)
        finally:
            del os.environ["ROCMFLASH_NO_INCUMBENT"]

    def cudnn(q, k, v):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)

    calls = {
        "attention": (lambda q, k, v: rocmflash.attention(q, k, v, causal=causal), (q, k, v), do),
        "sdpa": (lambda q, k, v: sdpa(q, k, v, is_causal=causal, enable_gqa=gqa), (q, k, v), do),
        "flash_attn_func": (lambda q, k, v: rocmflash.flash_attn_func(q, k, v, causal=causal), (qs, ks, vs), do_s),
        "sdpa bshd": (lambda q, k, v: sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                           enable_gqa=gqa).transpose(1, 2).contiguous(), (qs, ks, vs), do_s),
        "patch_sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
                       (q, k, v), do),
        "own": (own, (q, k, v), do),
        "cudnn": (cudnn, (q, k, v), do),
    }

    def make(fn, leaves, grad_out):
        def step():
            if backward:
                torch.autograd.grad(fn(*leaves), leaves, grad_out)
            else:
                with torch.no_grad():
                    fn(*leaves)
        return step
    return {path: make(*calls[path]) for path in PATHS}


def measure(rounds: int, grid: dict, out_dir: str) -> dict:
    import torch

    import rocmflash

    sdpa = torch._C._nn.scaled_dot_product_attention  # the real SDPA, bound before patch_sdpa replaces F's attribute
    results = {}
    handle = rocmflash.patch_sdpa()
    try:
        for name, spec in grid.items():
            for backward in (False, True):
                label = f"{name} {'fwd+bwd' if backward else 'fwd'}"
                steps = _steps(torch, rocmflash, sdpa, spec, backward, seed=len(results))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                steps["attention"]()  # the problem's first call: compile and first-use timing
                torch.cuda.synchronize()
                row = {"first call ms": (time.perf_counter() - t0) * 1e3}
                live = {}
                for path, step in steps.items():
                    try:
                        step()
                        step()
                        torch.cuda.synchronize()
                        live[path] = step
                    except RuntimeError as err:  # e.g. a backend that refuses the shape
                        row[path] = {"error": str(err).splitlines()[0][:120]}
                probe = _time(torch, live["sdpa"], 2)
                n = max(3, min(200, int(30.0 / max(probe, 1e-3))))
                samples = {p: [] for p in live}
                for r in range(rounds):
                    for p in (list(live) if r % 2 == 0 else list(live)[::-1]):
                        samples[p].append(_time(torch, live[p], n))
                for p in live:
                    row[p] = {"ms": statistics.median(samples[p])}
                results[label] = row
                print(label, {p: (round(r["ms"], 4) if isinstance(r, dict) and "ms" in r else r)
                              for p, r in row.items()}, flush=True)
                with open(os.path.join(out_dir, "untuned-grid-partial.json"), "w") as f:
                    json.dump(results, f, indent=1)
                del steps, live
                torch.cuda.empty_cache()
    finally:
        handle.restore()
    return results


def _ratio(row: dict, path: str, against: str) -> str:
    a, b = row.get(path), row.get(against)
    if not (isinstance(a, dict) and "ms" in a and isinstance(b, dict) and "ms" in b):
        return "n/a"
    return f"{b['ms'] / a['ms']:.2f}x"


def markdown(results: dict, meta: dict, decisions: dict) -> str:
    lines = [f"# Untuned shapes: the public API against PyTorch's default SDPA ({meta['label']})", "",
             f"- date: {meta['date']}; device: {meta['device']}; torch {meta['torch']}, Triton {meta['triton']}; "
             f"rocmflash {meta['commit']}",
             f"- command: `{meta['command']}`",
             "- shipped database, no tune; the first-use decisions in a fresh config directory. Ratios are speed "
             "(SDPA's time over rocmflash's: >= 1 is as fast or faster). Method: benchmarks/untuned_grid.py's "
             f"docstring ({meta['rounds']} interleaved rounds).", "",
             "| case | attention | flash_attn_func | patch_sdpa | own kernel vs SDPA | own vs cuDNN | first call ms |",
             "|---|---|---|---|---|---|---|"]
    worst = {p: None for p in AGAINST}
    for label, row in results.items():
        cells = []
        for path, against in AGAINST.items():
            cells.append(_ratio(row, path, against))
            try:
                value = float(cells[-1].rstrip("x"))
                worst[path] = value if worst[path] is None else min(worst[path], value)
            except ValueError:
                pass
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_ratio(row, 'own', 'sdpa')} | "
                     f"{_ratio(row, 'own', 'cudnn')} | {row['first call ms']:.0f} |")
    lines += ["", "Worst row: " + ", ".join(f"{p} {w:.2f}x" for p, w in worst.items() if w is not None), "",
              "## The first-use decisions (rocmflash's call against SDPA's, ms per call)", "",
              "| decision key | served by | rocmflash ms | SDPA ms |", "|---|---|---|---|"]
    for key, rec in sorted(decisions.items()):
        lines.append(f"| {key} | {rec.get('served_by')} | {rec.get('rocmflash_ms')} | {rec.get('sdpa_ms')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = grid_parser(__doc__)
    args = ap.parse_args(argv)
    config_dir = tempfile.mkdtemp(prefix="rocmflash-untuned-")
    os.environ["ROCMFLASH_CONFIG_DIR"] = config_dir  # a fresh user directory: no tune, no earlier decision
    os.environ.pop("ROCMFLASH_FIRST_USE_TIMING", None)
    import torch

    grid = chosen_cases(ap, GRID, args.cases)
    os.makedirs(args.out, exist_ok=True)
    results = measure(args.rounds, grid, args.out)
    decisions = {}
    for name in os.listdir(config_dir):
        if name.endswith(".first-use.json"):
            shutil.copy(os.path.join(config_dir, name), os.path.join(args.out, name))
            with open(os.path.join(config_dir, name)) as f:
                decisions.update(json.load(f)["decisions"])
    meta = run_meta(torch, args, "untuned_grid.py", argv)
    text = markdown(results, meta, decisions)
    with open(os.path.join(args.out, f"untuned-grid-{args.label}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, f"untuned-grid-{args.label}.json"), "w") as f:
        json.dump({"meta": meta, "results": results, "decisions": decisions}, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
