"""End-to-end benchmark: a Llama-like model (random weights, bf16) with rocmflash vs SDPA attention.

Measures, in one process and interleaved per sequence length:

* prefill: ``model(input_ids)`` under ``torch.no_grad()`` (no KV cache), tokens/s;
* a training step: forward with labels, backward, AdamW step, tokens/s;
* peak GPU memory of each (``torch.cuda.max_memory_allocated`` over the timed region,
  weights and optimizer state included).

The model is built from a ``LlamaConfig`` (nothing is downloaded): by default hidden 2048,
16 layers, 32 query / 8 key-value heads (head dim 64, GQA 4), MLP 8192, vocab 32000
(~1.1 B parameters, Llama-3.2-1B-like with a smaller vocabulary). rocmflash runs through
``attn_implementation="rocmflash"`` (:mod:`rocmflash.integrations.hf`), SDPA through
transformers' ``"sdpa"`` (PyTorch picks its fastest backend).

``--attn-sweep`` first times the attention backward alone for a few backward configs
(D = 64 and 128, causal, bf16) next to SDPA's backward, once per SDPA backend that
exists on the platform (:func:`rocmflash.hw.platform.sdpa_backends`: flash, cuDNN and
efficient on CUDA; flash and efficient on ROCm); a missing backend is a ``skipped`` row.

Usage (on a GPU)::

    python benchmarks/e2e.py --out reports/e2e-tmp            # writes e2e.md and e2e.json there
    python benchmarks/e2e.py --prefill 2048,4096,8192 --train 2048,4096,8192 --attn-sweep
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time


def _versions():
    import torch
    import triton

    try:
        import transformers

        tv = transformers.__version__
    except ImportError:
        tv = None
    from rocmflash.hw.platform import sdpa_backends

    return {"torch": torch.__version__, "triton": triton.__version__, "transformers": tv,
            "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
            "device": torch.cuda.get_device_name(0), "sdpa_backends": sdpa_backends()}


def _runtime(versions):
    """``HIP 6.4.x`` on ROCm, ``CUDA 12.x`` otherwise."""
    return f"HIP {versions['hip']}" if versions.get("hip") else f"CUDA {versions['cuda']}"


def _time_cuda(fn, warmup=2, iters=5):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), times


# ----------------------------------------------------------------------------- attention sweep
SWEEP = [  # (dkdv BM, BN, warps, stages), (dq BM, BN, warps, stages)
    ((32, 128, 4, 3), (128, 32, 4, 3)),
    ((32, 128, 8, 2), (128, 32, 8, 2)),
    ((64, 64, 4, 2), (64, 64, 4, 2)),
    ((32, 64, 4, 3), (64, 32, 4, 3)),
    ((64, 128, 8, 2), (128, 64, 8, 2)),
]


def attn_sweep(tokens=16384, hd=2048):
    import torch
    from triton.testing import do_bench

    from rocmflash.config import KernelConfig
    from rocmflash.kernels.backward.host import BwdConfig, backward
    from rocmflash.api.ops import attention_op
    from rocmflash.api.selection import select_bwd_config

    rows = []
    for D in (64, 128):
        S = 4096
        H = hd // D
        B = tokens // S
        q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = 1 / math.sqrt(D)
        out, lse = attention_op(q, k, v, causal=True)
        flops = 2.5 * 4 * B * H * S * S * D / 2  # backward ~2.5x forward FLOPs, causal half
        default = select_bwd_config(q.device, D)
        for a, b in SWEEP:
            cfg = BwdConfig(KernelConfig(BLOCK_M=a[0], BLOCK_N=a[1], num_warps=a[2], num_stages=a[3]),
                            KernelConfig(BLOCK_M=b[0], BLOCK_N=b[1], num_warps=b[2], num_stages=b[3]))
            try:
                ms = do_bench(lambda: backward(do, q, k, v, out, lse, True, scale, config=cfg), warmup=25, rep=100,
                              return_mode="median")
                rows.append(dict(D=D, impl="rocmflash", config=f"{a} / {b}", default=cfg == default, ms=ms,
                                 tflops=flops / ms / 1e9))
            except Exception as err:  # noqa: BLE001 - a config that does not compile is a row, not a crash
                rows.append(dict(D=D, impl="rocmflash", config=f"{a} / {b}", default=cfg == default, ms=None,
                                 tflops=None, error=f"{type(err).__name__}: {str(err)[:120]}"))
            print(rows[-1], flush=True)
        for row in sdpa_backward_rows(q, k, v, do, flops):
            rows.append(dict(D=D, **row))
            print(rows[-1], flush=True)
        qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
        o2, _ = attention_op(qr, kr, vr, causal=True)
        ms = do_bench(lambda: torch.autograd.grad(o2, (qr, kr, vr), do, retain_graph=True), warmup=25, rep=100,
                      return_mode="median")
        rows.append(dict(D=D, impl="rocmflash (autograd backward, default)", config="-", default=True, ms=ms,
                         tflops=flops / ms / 1e9))
        print(rows[-1], flush=True)
        del q, k, v, do, out, lse
        torch.cuda.empty_cache()
    return rows


def sdpa_backward_rows(q, k, v, do, flops):
    """SDPA's autograd backward (causal), one row per SDPA backend; backends this platform lacks are skipped."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    from triton.testing import do_bench

    from rocmflash.hw.platform import SDPA_BACKENDS, missing_sdpa_backend, sdpa_backend_enum

    rows = []
    for be in SDPA_BACKENDS:
        row = dict(impl=f"sdpa {be} (autograd backward)", config="-", default=False, ms=None, tflops=None)
        why = missing_sdpa_backend(be)
        if why:
            rows.append(dict(row, error=f"skipped: {why}"))
            continue
        try:
            qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
            with sdpa_kernel(sdpa_backend_enum(be)):
                ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            ms = do_bench(lambda: torch.autograd.grad(ref, (qs, ks, vs), do, retain_graph=True), warmup=25,
                          rep=100, return_mode="median")
            rows.append(dict(row, ms=ms, tflops=flops / ms / 1e9))
        except Exception as err:  # noqa: BLE001 - a backend that rejects the shape is a row, not a crash
            rows.append(dict(row, error=f"{type(err).__name__}: {str(err)[:120]}"))
    return rows


def _kernel_table(torch, step, top: int = 12) -> list:
    """``[(kernel name, GPU µs in one step, launches)]`` of one profiled step, longest first: which kernels each
    implementation runs (a diagnostic beside the timed steps, not part of them)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = [(e.key, getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0), e.count)
            for e in prof.key_averages()]
    rows = [r for r in rows if r[1] > 0]
    return [(name[:90], round(us, 1), n) for name, us, n in sorted(rows, key=lambda r: -r[1])[:top]]


# ----------------------------------------------------------------------------- model benchmark
def build_model(layers, hidden, inter, heads, kv_heads, vocab, max_pos, device="cuda"):
    """A Llama-like ``LlamaForCausalLM`` with random weights (seed 0), bf16, built on ``device``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                      attention_dropout=0.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(torch.bfloat16)


def run_model(args):
    import torch

    import rocmflash.integrations.hf as rf_hf

    rf_hf.register()
    model = build_model(args.layers, args.hidden, args.inter, args.heads, args.kv_heads, args.vocab,
                        max(args.prefill + args.train) + 1)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e9:.3f} B parameters", flush=True)
    impls = ["sdpa", "rocmflash"]
    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)

    # ---- prefill
    model.eval()
    for S in args.prefill:
        ids = torch.randint(0, args.vocab, (args.batch, S), device="cuda", generator=g)
        logits = {}
        for impl in impls:
            model.set_attn_implementation(impl)

            def step():
                with torch.no_grad():
                    return model(input_ids=ids, use_cache=False).logits

            logits[impl] = step()[:, -8:].float()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            ms, all_ms = _time_cuda(step, args.warmup, args.iters)
            peak = torch.cuda.max_memory_allocated() / 2**30
            rows.append(dict(mode="prefill", seq=S, batch=args.batch, impl=impl, ms=ms,
                             tokens_per_s=args.batch * S / ms * 1e3, peak_gib=peak, times_ms=all_ms))
            print(rows[-1], flush=True)
        rel = ((logits["rocmflash"] - logits["sdpa"]).norm() / logits["sdpa"].norm()).item()
        rows[-1]["logits_rel_diff_vs_sdpa"] = rel
        # yardstick: how far transformers' own bf16 "eager" attention lands from "sdpa" on this model
        model.set_attn_implementation("eager")
        with torch.no_grad():
            eager = model(input_ids=ids, use_cache=False).logits[:, -8:].float()
        rows[-1]["eager_rel_diff_vs_sdpa"] = ((eager - logits["sdpa"]).norm() / logits["sdpa"].norm()).item()
        print(f"prefill S={S}: last-8-token logits relative difference vs sdpa: rocmflash {rel:.2e}, "
              f"eager {rows[-1]['eager_rel_diff_vs_sdpa']:.2e}", flush=True)
        del eager
        del ids, logits
        torch.cuda.empty_cache()

    # ---- training step
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for S in args.train:
        ids = torch.randint(0, args.vocab, (args.batch, S), device="cuda", generator=g)
        losses = {}
        for impl in impls:
            model.set_attn_implementation(impl)

            def step():
                out = model(input_ids=ids, labels=ids, use_cache=False)
                out.loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return out.loss

            losses[impl] = float(step().detach())
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            routed = rf_hf.stats()
            ms, all_ms = _time_cuda(step, args.warmup, args.iters)
            routed = {k: v - routed.get(k, 0) for k, v in rf_hf.stats().items()}
            peak = torch.cuda.max_memory_allocated() / 2**30
            rows.append(dict(mode="train", seq=S, batch=args.batch, impl=impl, ms=ms,
                             tokens_per_s=args.batch * S / ms * 1e3, peak_gib=peak, times_ms=all_ms,
                             first_loss=losses[impl], routed=routed if impl == "rocmflash" else None,
                             kernels=_kernel_table(torch, step) if args.profile else None))
            print(rows[-1], flush=True)
        del ids
        torch.cuda.empty_cache()
    return rows, n_params


def write_report(out_dir, versions, cmd, model_rows, n_params, sweep_rows, args):
    os.makedirs(out_dir, exist_ok=True)
    date = datetime.date.today().isoformat()
    lines = [f"# End-to-end: Llama-like model, rocmflash vs SDPA ({versions['device']})", "",
             f"- date: {date}", f"- device: {versions['device']}",
             f"- versions: torch {versions['torch']}, triton {versions['triton']}, transformers "
             f"{versions['transformers']}, {_runtime(versions)}",
             f"- command: `{cmd}`",
             f"- model: random-init `LlamaForCausalLM`, {n_params / 1e9:.2f} B parameters, bf16: hidden "
             f"{args.hidden}, {args.layers} layers, {args.heads} query / {args.kv_heads} KV heads (head dim "
             f"{args.hidden // args.heads}), MLP {args.inter}, vocab {args.vocab}; batch {args.batch}",
             "- rocmflash: `attn_implementation=\"rocmflash\"` (forward and backward Triton kernels, run-time "
             "config selection); sdpa: `attn_implementation=\"sdpa\"` (PyTorch picks the backend; SDPA backends "
             f"on this platform: {', '.join(versions.get('sdpa_backends') or [])})",
             f"- timing: CUDA/HIP events, median of {args.iters} after {args.warmup} warm-up steps; the two "
             "implementations alternate per sequence length in one process; peak memory = "
             "`torch.cuda.max_memory_allocated()` over the timed steps (weights, gradients and AdamW state "
             "included for training)", ""]
    for mode, title in (("prefill", "Prefill (forward, no KV cache)"), ("train", "Training step (forward + backward + AdamW)")):
        sel = [r for r in model_rows if r["mode"] == mode]
        if not sel:
            continue
        lines += [f"## {title}", "",
                  "| seq | sdpa tok/s | rocmflash tok/s | speed ratio | sdpa peak GiB | rocmflash peak GiB | memory ratio |",
                  "|---|---|---|---|---|---|---|"]
        for S in sorted({r["seq"] for r in sel}):
            a = next(r for r in sel if r["seq"] == S and r["impl"] == "sdpa")
            b = next(r for r in sel if r["seq"] == S and r["impl"] == "rocmflash")
            lines.append(f"| {S} | {a['tokens_per_s']:,.0f} | {b['tokens_per_s']:,.0f} | "
                         f"{b['tokens_per_s'] / a['tokens_per_s']:.3f} | {a['peak_gib']:.2f} | {b['peak_gib']:.2f} | "
                         f"{b['peak_gib'] / a['peak_gib']:.3f} |")
        lines.append("")
        if mode == "prefill":
            diffs = [f"S={r['seq']}: rocmflash {r['logits_rel_diff_vs_sdpa']:.1e}, eager "
                     f"{r['eager_rel_diff_vs_sdpa']:.1e}" for r in sel if "logits_rel_diff_vs_sdpa" in r]
            lines += ["Relative difference (L2) of the last 8 positions' logits from sdpa's, for rocmflash and, as a "
                      "yardstick, transformers' bf16 `eager` attention on the same model and input: "
                      + "; ".join(diffs), ""]
        else:
            ls = [f"S={r['seq']} {r['impl']} {r['first_loss']:.4f}" for r in sel]
            lines += ["Loss of the first (warm-up) step: " + ", ".join(ls), ""]
            for r in sel:
                if r.get("routed"):
                    lines += [f"S={r['seq']} rocmflash's attention calls over the timed steps (`hf.stats()`): "
                              + ", ".join(f"{k} {v}" for k, v in r["routed"].items()), ""]
                if r.get("kernels"):
                    lines += [f"GPU kernels of one S={r['seq']} training step, {r['impl']} (torch.profiler, longest "
                              "first):", "", "| kernel | µs | launches |", "|---|---|---|"]
                    lines += [f"| `{name}` | {us} | {n} |" for name, us, n in r["kernels"]] + [""]
    if sweep_rows:
        lines += ["## Attention backward alone (causal, bf16, S=4096, 16k tokens, H x D = 2048)", "",
                  "| D | implementation | config: dK/dV (BM, BN, warps, stages) / dQ | default | ms | TFLOP/s |",
                  "|---|---|---|---|---|---|"]
        for r in sweep_rows:
            ms = f"{r['ms']:.3f}" if r.get("ms") else r.get("error", "failed")
            tf = f"{r['tflops']:.0f}" if r.get("tflops") else "-"
            lines.append(f"| {r['D']} | {r['impl']} | {r['config']} | {'yes' if r['default'] else ''} | {ms} | {tf} |")
        lines += ["", "TFLOP/s counts the backward as 2.5x the forward's 4·B·H·S²·D, halved for causal.", ""]
    md = "\n".join(lines)
    with open(os.path.join(out_dir, "e2e.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out_dir, "e2e.json"), "w") as f:
        json.dump({"versions": versions, "command": cmd, "model": model_rows, "attn_sweep": sweep_rows,
                   "params": n_params}, f, indent=1)
    print(md, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--out", default="reports/e2e-tmp")
    p.add_argument("--prefill", type=ints, default=[2048, 4096, 8192])
    p.add_argument("--train", type=ints, default=[2048, 4096, 8192])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--attn-sweep", action="store_true")
    p.add_argument("--profile", action="store_true", help="training: each implementation's GPU kernels in one "
                   "profiled step (a table per row)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/e2e.py needs a GPU", file=sys.stderr)
        return 2
    cmd = "python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:]))
    versions = _versions()
    print(versions, flush=True)
    t0 = time.time()
    sweep_rows = attn_sweep() if args.attn_sweep else []
    print(f"sweep: {time.time() - t0:.0f} s", flush=True)
    model_rows, n_params = run_model(args)
    print(f"total: {time.time() - t0:.0f} s", flush=True)
    write_report(args.out, versions, cmd, model_rows, n_params, sweep_rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
