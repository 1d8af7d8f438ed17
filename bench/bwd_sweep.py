"""Backward configs by measurement: time every candidate dK/dV and dQ config per problem.

The two backward kernels are independent launches, so each is swept on its own (the
best pair is the best of each). Per problem:

1. the forward once (rocmflash, shipped config) for ``out``/``LSE``; the dQ kernel once (it
   writes ``delta``, which the dK/dV kernel reads);
2. every dK/dV candidate (``BLOCK_N`` owned x ``BLOCK_M`` looped x warps x stages, and for
   GQA every ``head_splits`` that divides the group) and every dQ candidate, a short
   ``do_bench`` each; the top 3 of each kernel and the current default again, longer, in
   interleaved rounds (the figures reported);
3. the best pair's gradients against SDPA's (fp32 math backend on the same inputs);
4. forward+backward through ``rocmflash.attention`` with the default and with the best
   backward config, against SDPA flash and cuDNN, interleaved rounds.

Compilation is warmed first in a pool of processes (``JITFunction.warmup`` with dtype
stand-ins, the same cache key as the launch), so the sweep times kernels, not compiles.

Usage (on a GPU)::

    python bench/bwd_sweep.py --out $OUT [--problems d256-full,gqa-s1025] [--workers 14]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import statistics
import sys
import time

#: name -> (B, Hq, Hkv, S, D, causal); bf16 unless the name says otherwise
PROBLEMS = {
    "d64-causal-s2048": (8, 16, 16, 2048, 64, True),
    "d96-causal-s4096": (4, 16, 16, 4096, 96, True),
    "d128-causal-s8192": (2, 16, 16, 8192, 128, True),
    "d128-full-s2048": (8, 16, 16, 2048, 128, False),
    "d192-full-s4096": (4, 8, 8, 4096, 192, False),
    "d256-full-s4096": (4, 8, 8, 4096, 256, False),
    "d256-causal-s4096": (4, 8, 8, 4096, 256, True),
    "gqa-s1025": (1, 32, 8, 1025, 128, True),
    "mqa-s2048": (1, 32, 1, 2048, 128, True),
}


def candidates(head_dim: int):
    """(owned block, looped block, warps, stages) candidates for either kernel at this head dim."""
    owned = (32, 64, 128) if head_dim <= 128 else (16, 32, 64)
    looped = (16, 32, 64)
    out = []
    for o, l, w, s in itertools.product(owned, looped, (4, 8), (1, 2, 3)):
        if w == 8 and o < 64:
            continue  # 8 warps on a 32-row tile: too little work per warp
        out.append((o, l, w, s))
    return out


def _cfg(K, owned, looped, warps, stages, role):
    if role == "dkdv":
        return K(BLOCK_N=owned, BLOCK_M=looped, num_warps=warps, num_stages=stages)
    return K(BLOCK_M=owned, BLOCK_N=looped, num_warps=warps, num_stages=stages)


def _label(cfg, splits=None):
    s = f"{cfg.BLOCK_M}x{cfg.BLOCK_N} w{cfg.num_warps} s{cfg.num_stages}"
    return s + (f" hs{splits}" if splits else "")


# ----------------------------------------------------------------------------- compile warm-up
def _mock(value):
    import torch
    from triton.runtime.jit import MockTensor

    return MockTensor(value.dtype) if isinstance(value, torch.Tensor) else value


def _warm_one(job):
    """Worker: compile one launch (kernel name, args with dtype stand-ins, constexprs, config)."""
    name, args, constexprs, cfg = job
    from rocmflash.kernels.backward import host as bw
    from rocmflash.kernels import common as C

    try:
        getattr(bw, name).warmup(grid=(1,), **args, **constexprs, **C.compile_options(cfg, C.torch_backend()))
        return None
    except Exception as err:  # the timing loop will report it again
        return f"{name} {constexprs} {cfg}: {type(err).__name__}: {err}"


def warm(jobs, workers: int) -> list:
    import multiprocessing as mp

    if workers <= 1 or not jobs:
        return [e for e in map(_warm_one, jobs) if e]
    with mp.get_context("spawn").Pool(workers) as pool:
        return [e for e in pool.map(_warm_one, jobs, chunksize=1) if e]


# ----------------------------------------------------------------------------- one problem
def _inputs(torch, B, Hq, Hkv, S, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=g)
    do = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype, generator=g)
    return q, k, v, do


def _bench(fn, rep):
    import triton

    return triton.testing.do_bench(fn, warmup=max(5, rep // 4), rep=rep)


def sweep_problem(name, spec, dtype, workers, rounds, log):
    import torch

    import rocmflash
    from rocmflash.api.selection import select_bwd_config
    from rocmflash.config import KernelConfig as K
    from rocmflash.kernels.backward import host as bw
    from rocmflash.kernels import common as C

    B, Hq, Hkv, S, D, causal = spec
    group = Hq // Hkv
    q, k, v, do = _inputs(torch, B, Hq, Hkv, S, D, dtype)
    scale = 1.0 / math.sqrt(D)
    out, lse = rocmflash.attention(q, k, v, causal=causal, return_lse=True)
    backend = C.torch_backend()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty((B, Hq, S), device="cuda", dtype=torch.float32)
    default = select_bwd_config(q.device, D)
    bw.launch_dq(q, k, v, out, do, lse, None, delta, dq, causal, scale, default.dq, backend)  # delta
    cus = C.num_compute_units(q.device)
    auto_splits = bw.choose_head_splits(B, Hkv, group, S, default.dkdv.BLOCK_N, cus)
    splits_opts = [s for s in (1, 2, 4, 8) if group % s == 0]

    dkdv = [(_cfg(K, *c, "dkdv"), s) for c in candidates(D) for s in splits_opts]
    dqs = [_cfg(K, *c, "dq") for c in candidates(D)]
    if (default.dkdv, auto_splits) not in dkdv:
        dkdv.append((default.dkdv, auto_splits))
    if default.dq not in dqs:
        dqs.append(default.dq)

    def run_dkdv(cfg, s):
        bw.launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, cfg, s, backend)

    def run_dq(cfg):
        bw.launch_dq(q, k, v, out, do, lse, None, delta, dq, causal, scale, cfg, backend)

    # warm every compile in parallel (partials buffers are fp32 and shaped per split count)
    jobs = []
    for cfg, s in dkdv:
        part = torch.empty((B, Hkv * s, S, D), device="meta", dtype=torch.float32)  # strides only
        grid, args, cx = bw.dkdv_call(q, k, v, do, lse, delta, dk if s == 1 else part, dv if s == 1 else part,
                                      causal, scale, cfg, s)
        jobs.append(("_bwd_dkdv", {a: _mock(x) for a, x in args.items()}, cx, cfg))
    for cfg in dqs:
        grid, args, cx = bw.dq_call(q, k, v, out, do, lse, None, delta, dq, causal, scale, cfg)
        jobs.append(("_bwd_dq", {a: _mock(x) for a, x in args.items()}, cx, cfg))
    t0 = time.time()
    errors = warm(jobs, workers)
    log(f"{name}: warmed {len(jobs)} compiles in {time.time() - t0:.0f} s ({len(errors)} failed)")

    def short(fn):
        try:
            return _bench(fn, 30)
        except Exception as err:  # out of resources etc.: not a candidate
            return f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"

    t_dkdv = {(cfg, s): short(lambda c=cfg, s=s: run_dkdv(c, s)) for cfg, s in dkdv}
    t_dq = {cfg: short(lambda c=cfg: run_dq(c)) for cfg in dqs}

    def top(table, n=3):
        ok = sorted((t, key) for key, t in table.items() if isinstance(t, float))
        return [key for _, key in ok[:n]]

    final_dkdv = list(dict.fromkeys(top(t_dkdv) + [(default.dkdv, auto_splits)]))
    final_dq = list(dict.fromkeys(top(t_dq) + [default.dq]))
    long_dkdv = {key: [] for key in final_dkdv}
    long_dq = {key: [] for key in final_dq}
    for _ in range(rounds):
        for key in final_dkdv:
            long_dkdv[key].append(_bench(lambda c=key: run_dkdv(*c), 100))
        for key in final_dq:
            long_dq[key].append(_bench(lambda c=key: run_dq(c), 100))
    med_dkdv = {key: statistics.median(v) for key, v in long_dkdv.items()}
    med_dq = {key: statistics.median(v) for key, v in long_dq.items()}
    best_dkdv = min(med_dkdv, key=med_dkdv.get)
    best_dq = min(med_dq, key=med_dq.get)
    best = bw.BwdConfig(best_dkdv[0], best_dq, head_splits=best_dkdv[1])

    # gradients of the best pair against fp32 math on the same inputs
    dq_b, dk_b, dv_b = bw.backward(do, q, k, v, out, lse, causal, scale, config=best)
    errs = _grad_errors(torch, q, k, v, do, causal, scale, (dq_b, dk_b, dv_b))

    whole = _whole_step(torch, rocmflash, q, k, v, do, causal, default, best, rounds)
    return {
        "problem": name, "shape": dict(B=B, Hq=Hq, Hkv=Hkv, S=S, D=D, causal=causal), "dtype": str(dtype),
        "default": {"dkdv": _label(default.dkdv, auto_splits), "dq": _label(default.dq),
                    "dkdv_ms": med_dkdv[(default.dkdv, auto_splits)], "dq_ms": med_dq[default.dq]},
        "best": {"dkdv": _label(*best_dkdv), "dq": _label(best_dq), "dkdv_ms": med_dkdv[best_dkdv],
                 "dq_ms": med_dq[best_dq], "config": _config_dict(best)},
        "grad_rel_err_vs_fp32": errs,
        "short": {"dkdv": {_label(c, s): t for (c, s), t in t_dkdv.items()},
                  "dq": {_label(c): t for c, t in t_dq.items()}},
        "whole": whole,
        "warm_errors": errors[:5],
    }


def _config_dict(cfg):
    def one(c):
        return dict(BLOCK_M=c.BLOCK_M, BLOCK_N=c.BLOCK_N, num_warps=c.num_warps, num_stages=c.num_stages)
    return {"dkdv": one(cfg.dkdv), "dq": one(cfg.dq), "head_splits": cfg.head_splits}


def _grad_errors(torch, q, k, v, do, causal, scale, got, heads=2):
    """Relative errors of (dq, dk, dv) against fp32 SDPA math, on the first batch and K/V heads."""
    import torch.nn.functional as F

    group = q.shape[1] // k.shape[1]
    hk = min(heads, k.shape[1])
    qs = q[:1, :hk * group].float().requires_grad_()
    ks = k[:1, :hk].float().requires_grad_()
    vs = v[:1, :hk].float().requires_grad_()
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=group > 1)
    ref.backward(do[:1, :hk * group].float())
    pieces = (got[0][:1, :hk * group], got[1][:1, :hk], got[2][:1, :hk])
    refs = (qs.grad, ks.grad, vs.grad)
    return {n: float((g.float() - r).norm() / r.norm()) for n, g, r in zip(("dq", "dk", "dv"), pieces, refs)}


def _whole_step(torch, rocmflash, q, k, v, do, causal, default, best, rounds):
    """fwd+bwd ms through rocmflash.attention (default / best bwd config) and SDPA flash / cuDNN."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import rocmflash.api.ops as ops

    group = q.shape[1] // k.shape[1]
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    original = ops.select_bwd_config

    def ours(cfg):
        def step():
            ops.select_bwd_config = lambda device, head_dim: cfg
            try:
                rocmflash.attention(*leaves, causal=causal).backward(do)
            finally:
                ops.select_bwd_config = original
        return step

    def sdpa(backend):
        kv = leaves[1:] if group == 1 else [x.repeat_interleave(group, 1).detach().requires_grad_()
                                            for x in leaves[1:]]

        def step():
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(leaves[0], *kv, is_causal=causal).backward(do)
        return step

    paths = {"rocmflash default bwd": ours(default), "rocmflash best bwd": ours(best),
             "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    times = {p: [] for p in paths}
    for _ in range(rounds):
        for p, fn in paths.items():
            try:
                times[p].append(_bench(fn, 200))
            except Exception as err:
                times[p] = f"{type(err).__name__}: {str(err).splitlines()[0][:100]}"
    B, Hq, S, D = q.shape
    flops = 4 * B * Hq * S * S * D * (0.5 if causal else 1.0) * 3.5
    out = {}
    for p, t in times.items():
        if isinstance(t, list) and t:
            ms = statistics.median(t)
            out[p] = {"ms": ms, "tflops": flops / ms / 1e9}
        else:
            out[p] = {"error": t}
    return out


# ----------------------------------------------------------------------------- output
def markdown(results, meta) -> str:
    lines = [f"# Backward configs by measurement ({meta['label']})", "",
             f"- date: {meta['date']}; device: {meta['device']}; torch {meta['torch']}, Triton {meta['triton']}",
             f"- command: `{meta['command']}`", "",
             "Kernel times: median of interleaved `do_bench` rounds (100 ms each); the sweep's short runs "
             "picked the top 3 per kernel. fwd+bwd: through `rocmflash.attention` (shipped forward config), "
             "TFLOP/s counted as 3.5x the forward's flops. hsN = dK/dV programs per K/V head (GQA split).", "",
             "| problem | default dK/dV | ms | best dK/dV | ms | default dQ | ms | best dQ | ms | grad err (dq/dk/dv) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        d, b, e = r["default"], r["best"], r["grad_rel_err_vs_fp32"]
        lines.append(f"| {r['problem']} | {d['dkdv']} | {d['dkdv_ms']:.3f} | {b['dkdv']} | {b['dkdv_ms']:.3f} | "
                     f"{d['dq']} | {d['dq_ms']:.3f} | {b['dq']} | {b['dq_ms']:.3f} | "
                     f"{e['dq']:.1e}/{e['dk']:.1e}/{e['dv']:.1e} |")
    lines += ["", "## fwd+bwd through the public API, TFLOP/s (ratio to SDPA flash)", "",
              "| problem | rocmflash default bwd | rocmflash best bwd | SDPA flash | SDPA cuDNN |", "|---|---|---|---|---|"]
    for r in results:
        w = r["whole"]
        flash = w["sdpa flash"].get("tflops")

        def cell(p):
            t = w[p].get("tflops")
            if t is None:
                return "error"
            return f"{t:.0f}" + (f" ({t / flash:.2f}x)" if flash and p.startswith("rocmflash") else "")
        lines.append(f"| {r['problem']} | " + " | ".join(cell(p) for p in w) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--label", default="gpu")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    import torch
    import triton

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    os.makedirs(args.out, exist_ok=True)
    names = [p for p in args.problems.split(",") if p]
    unknown = [p for p in names if p not in PROBLEMS]
    if unknown:
        ap.error(f"unknown problem(s) {unknown}; known: {', '.join(PROBLEMS)}")

    def log(msg):
        print(msg, flush=True)

    results = []
    for name in names:
        t0 = time.time()
        try:
            results.append(sweep_problem(name, PROBLEMS[name], dtype, args.workers, args.rounds, log))
        except Exception:  # one broken problem must not lose the others
            import traceback

            log(f"{name}: FAILED\n{traceback.format_exc()}")
            continue
        r = results[-1]
        log(f"{name}: {time.time() - t0:.0f} s; best {r['best']['dkdv']} / {r['best']['dq']}; "
            + ", ".join(f"{p} {w.get('tflops', 0):.0f}" for p, w in r["whole"].items()))
        with open(os.path.join(args.out, f"bwd-sweep-{args.label}.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    meta = {"label": args.label, "date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "command": "python bench/bwd_sweep.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    with open(os.path.join(args.out, f"bwd-sweep-{args.label}.md"), "w") as f:
        f.write(markdown(results, meta))
    print(markdown(results, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
