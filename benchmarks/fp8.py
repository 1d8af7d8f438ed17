"""fp8 attention through the public API on the live GPU: the forward, and decode over an fp8 KV cache.

    python benchmarks/fp8.py --out DIR [--quick] [--seqlens 2048,8192] [--skip-decode]

1. Forward (``rocmflash.flash_attn_func``): bf16 q/k/v against the same tensors quantised to the GPU's
   e4m3 format (per-(batch, kv-head) descales from the amax), B 4, Hq 32, Hkv 8, D 128, S 2k/8k, causal
   and not; beside them torch's own fp8 attention where the installed torch has one (SDPA on fp8 tensors;
   its error is recorded when it refuses). Accuracy: relative L2 error of each output against an fp32
   reference from the *dequantised* inputs (S 2k). Times: CUDA events, median of 50 calls, host included.
2. Decode (``rocmflash.flash_attn_with_kvcache``, one new query token, bf16 q): a bf16 KV cache against an
   e4m3 one, contiguous, paged (256) and with a one-token append, B 8/32, KV 8k-64k, GQA 32:8, D 128, in CUDA
   graphs over enough cache copies to miss the L2 (cold reads). GB/s = K+V bytes read / time; % of the
   catalog's HBM peak.

Writes ``DIR/fp8.json`` and ``DIR/fp8.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _quant(x, dtype, group_heads: int):
    """``(x8, descale)``: x ``(B, S, H, D)`` quantised per (batch, kv head) (query heads grouped by GQA)."""
    import torch

    b, s, h, d = x.shape
    amax = x.float().abs().view(b, s, h // group_heads, group_heads, d).amax(dim=(1, 3, 4)).clamp_min(1e-6)
    scale = amax / torch.finfo(dtype).max  # (B, Hkv)
    rep = scale.repeat_interleave(group_heads, dim=1)[:, None, :, None]
    return (x.float() / rep).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype), scale.float()


def _dequant(x8, scale, group_heads: int):
    return x8.float() * scale.repeat_interleave(group_heads, dim=1)[:, None, :, None]


def _events_ms(fn, calls: int = 50) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def _reference(q, k, v, causal: bool):
    """fp32 attention of ``(B, S, H, D)`` inputs (GQA by repetition)."""
    import torch

    g = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2).float() for t in (q, k, v))
    kt, vt = kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1)
    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def forward_rows(fmt, seqlens, quick: bool) -> list:
    import torch

    import rocmflash

    rows = []
    B, Hq, Hkv, D = 4, 32, 8, 128
    g = Hq // Hkv
    for S in seqlens:
        for causal in (False, True):
            q, k, v = (torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16) for h in (Hq, Hkv, Hkv))
            q8, qd = _quant(q, fmt, g)
            k8, kd = _quant(k, fmt, 1)
            v8, vd = _quant(v, fmt, 1)
            row = {"B": B, "S": S, "Hq": Hq, "Hkv": Hkv, "D": D, "causal": causal}
            row["bf16_ms"] = _events_ms(lambda: rocmflash.flash_attn_func(q, k, v, causal=causal))
            run8 = functools.partial(rocmflash.flash_attn_func, q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                     v_descale=vd)
            row["fp8_ms"] = _events_ms(run8)
            flops = 4 * B * Hq * S * S * D * (0.5 if causal else 1.0)
            row["fp8_tflops"] = flops / (row["fp8_ms"] * 1e-3) / 1e12
            row["bf16_tflops"] = flops / (row["bf16_ms"] * 1e-3) / 1e12
            row["fp8_speedup"] = row["bf16_ms"] / row["fp8_ms"]
            try:  # torch's own fp8 attention, if this torch has one
                qt, kt, vt = (t.transpose(1, 2) for t in (q8, k8, v8))
                torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)
                row["torch_fp8_ms"] = _events_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=causal, enable_gqa=True))
            except Exception as err:  # noqa: BLE001 - recorded: torch has no fp8 attention for this input
                row["torch_fp8"] = f"none: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
            if S <= 2048 or not quick:
                ref = _reference(_dequant(q8, qd, g), _dequant(k8, kd, 1), _dequant(v8, vd, 1), causal)
                out8 = run8()
                row["fp8_rel_err_vs_dequant_ref"] = _rel(out8, ref)
                row["bf16_rel_err_vs_ref"] = _rel(rocmflash.flash_attn_func(q, k, v, causal=causal),
                                                  _reference(q, k, v, causal))
                del ref, out8
            rows.append(row)
            print(json.dumps(row), flush=True)
            del q, k, v, q8, k8, v8
            torch.cuda.empty_cache()
    rocmflash.api.fp8.check_errors()
    return rows


def decode_rows(fmt, batches, lengths, hbm_gbs: float) -> list:
    import torch

    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api.decode import check_errors
    from rocmflash.tuning.isolated import graph_replay_ms

    rows = []
    Hq, Hkv, D = 32, 8, 128
    for B in batches:
        for KV in lengths:
            q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
            lens = torch.full((B,), KV, device="cuda", dtype=torch.int32)
            descale = torch.ones(B, Hkv, device="cuda")
            kn = torch.randn(B, 1, Hkv, D, device="cuda", dtype=torch.bfloat16)
            vn = torch.randn_like(kn)
            row = {"B": B, "KV": KV, "Hq": Hq, "Hkv": Hkv, "D": D}
            for name in ("bf16", "fp8", "bf16_paged256", "fp8_paged256", "bf16_append", "fp8_append"):
                dt = torch.bfloat16 if name.startswith("bf16") else fmt
                nbytes = 2 * B * KV * Hkv * D * (2 if dt == torch.bfloat16 else 1)
                copies = max(2, min(6, -(-2 * 50 * 2**20 // nbytes)))
                caches = [tuple(torch.randn(B, KV, Hkv, D, device="cuda", dtype=torch.bfloat16).to(dt)
                                for _ in range(2)) for _ in range(copies)]
                kw = dict(k_descale=descale, v_descale=descale) if dt != torch.bfloat16 else {}
                if "paged" in name:
                    table = torch.randperm(B * KV // 256, device="cuda", dtype=torch.int32).view(B, KV // 256)
                    caches = [(k.view(-1, 256, Hkv, D), v.view(-1, 256, Hkv, D)) for k, v in caches]
                    kw["block_table"] = table
                if name.endswith("append"):
                    kw.update(k=kn, v=vn)
                seqlens = lens - 1 if name.endswith("append") else lens
                fns = [functools.partial(flash_attn_with_kvcache, q, k, v, cache_seqlens=seqlens, **kw)
                       for k, v in caches]
                for f in fns:
                    f()
                check_errors()
                us = graph_replay_ms(fns, 20, 5, warmup=2) * 1e3
                row[f"{name}_us"] = us
                row[f"{name}_gbs"] = nbytes / (us * 1e-6) / 1e9
                del caches, fns
                torch.cuda.empty_cache()
            for kind in ("", "_paged256", "_append"):
                row[f"speedup{kind}"] = row[f"bf16{kind}_us"] / row[f"fp8{kind}_us"]
            row["fp8_hbm_fraction"] = row["fp8_gbs"] / hbm_gbs
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--seqlens", default="2048,8192", help="forward sequence lengths, comma-separated")
    ap.add_argument("--skip-decode", action="store_true", help="the forward only")
    args = ap.parse_args()
    seqlens = tuple(int(s) for s in args.seqlens.split(","))
    if min(seqlens) < 1:
        ap.error("--seqlens must be positive")
    import torch
    import triton

    from rocmflash.hw.detect import detect_live_gpu
    from rocmflash.hw.fp8 import check_format  # noqa: F401 - the arch's format is checked by the API

    gpu = detect_live_gpu()
    fmt = torch.float8_e4m3fnuz if gpu is not None and gpu.arch == "gfx942" else torch.float8_e4m3fn
    hbm_gbs = gpu.hbm_tbs * 1e3 if gpu is not None else float("nan")
    meta = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0), "gpu": getattr(gpu, "name", None),
            "format": str(fmt), "torch": torch.__version__, "triton": triton.__version__,
            "hbm_peak_gbs": hbm_gbs, "peak_fp8_tflops": getattr(gpu, "peak_fp8_tflops", None),
            "command": " ".join(sys.argv)}
    os.makedirs(args.out, exist_ok=True)
    fwd = forward_rows(fmt, seqlens, args.quick)
    dec = [] if args.skip_decode else \
        decode_rows(fmt, (8, 32), (8192, 16384, 32768, 65536) if not args.quick else (8192, 65536), hbm_gbs)
    with open(os.path.join(args.out, "fp8.json"), "w") as f:
        json.dump({"meta": meta, "forward": fwd, "decode": dec}, f, indent=1)
    lines = [f"# fp8 attention, public API, {meta['device']} ({meta['format']})", "",
             f"{meta['date']} · torch {meta['torch']} · Triton {meta['triton']} · `{meta['command']}`", "",
             "## Forward (`flash_attn_func`), B 4, Hq 32, Hkv 8, D 128", "",
             "| S | causal | bf16 ms | fp8 ms | fp8/bf16 speed-up | fp8 TFLOP/s | torch fp8 | fp8 rel err (dequant ref) "
             "| bf16 rel err |", "|---|---|---|---|---|---|---|---|---|"]
    for r in fwd:
        torch_fp8 = f"{r['torch_fp8_ms']:.3f} ms" if "torch_fp8_ms" in r else r.get("torch_fp8", "-")
        err8 = f"{r['fp8_rel_err_vs_dequant_ref']:.2e}" if "fp8_rel_err_vs_dequant_ref" in r else "-"
        err16 = f"{r['bf16_rel_err_vs_ref']:.2e}" if "bf16_rel_err_vs_ref" in r else "-"
        lines.append(f"| {r['S']} | {r['causal']} | {r['bf16_ms']:.3f} | {r['fp8_ms']:.3f} | {r['fp8_speedup']:.2f}x | "
                     f"{r['fp8_tflops']:.0f} | {torch_fp8} | {err8} | {err16} |")
    lines += ["", f"## Decode (`flash_attn_with_kvcache`), one token, GQA 32:8, D 128; HBM peak {hbm_gbs:.0f} GB/s", "",
              "| B | KV | bf16 µs | fp8 µs | speed-up | fp8 GB/s (% peak) | paged 256 speed-up | append speed-up |",
              "|---|---|---|---|---|---|---|---|"]
    for r in dec:
        lines.append(f"| {r['B']} | {r['KV']} | {r['bf16_us']:.1f} | {r['fp8_us']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['fp8_gbs']:.0f} ({100 * r['fp8_hbm_fraction']:.0f}%) | {r['speedup_paged256']:.2f}x | "
                     f"{r['speedup_append']:.2f}x |")
    with open(os.path.join(args.out, "fp8.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
