"""Decode through every entry point: ``rocmflash.attention``, ``patch_sdpa`` and ``flash_attn_with_kvcache``
against PyTorch's default SDPA, one GPU, one process, interleaved rounds.

One new token per sequence over ``KV`` cached keys, D=128, Hq=32 with Hkv=8 (GQA 4:1) and Hkv=32 (MHA),
bf16. The cache is one ``(B, KV, Hkv, D)`` tensor; SDPA and ``rocmflash.attention`` get ``(B, H, S, D)``
views of it (no copies), as a model holding its cache in flash-attn's layout would pass them. Every
rocmflash path is the public call with the shipped databases, host time included:

- ``attention``: ``rocmflash.attention(q, k, v)`` -- a decode-shaped call routed to the decode kernel;
- ``patch_sdpa``: ``F.scaled_dot_product_attention(..., enable_gqa=True)`` with ``rocmflash.patch_sdpa()`` called once
  for the run (a model's start-up), SDPA's own function bound before it for the baseline;
- ``kvcache``: ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)`` (the default call);
- ``kvcache unchecked``: the same with ``check_values=False``;
- with ``--fused``, also ``attention fused``/``kvcache fused`` and ``attention two launches``/``kvcache two
  launches``: the same calls with the decode kernel's fused merge forced on (``rocmflash.kernels.decode.host.FUSED_COMBINE``
  = True: one launch, the last split program of each (sequence, K/V head) merges the splits) and forced off
  (split + combine), timed in the same interleaved rounds as the default rows, which run the shipped rule
  (``kv_decode.fuses_merge``: fused for small caches on CUDA).

Ratio = SDPA default µs / path µs (> 1: rocmflash faster). Bandwidth = K+V bytes / time.

Usage (on a GPU): ``python benchmarks/decode_entry.py --out $OUT [--rounds 5] [--batches 1,8,32] [--lengths ...]``
"""

from __future__ import annotations

import argparse
import os
import sys

from interleaved import MarkdownTable, gpu_table_head, interleaved_medians


def _with_fused_merge(fn, on: bool = True):
    """``fn`` run with the decode kernel's fused merge forced on (``on``) or off (and the flag restored after)."""
    from rocmflash.kernels.decode import host as KD

    def call():
        before, KD.FUSED_COMBINE = KD.FUSED_COMBINE, on
        try:
            return fn()
        finally:
            KD.FUSED_COMBINE = before

    return call


def _paths(torch, B, L, Hq, Hkv, D=128, fused=False):
    import torch.nn.functional as F

    import rocmflash
    from rocmflash.api import sdpa

    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=dt)
    kc = torch.randn(B, L, Hkv, D, device=dev, dtype=dt)
    vc = torch.randn_like(kc)
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    qs, ks, vs = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)

    # patched once for the run, as a model does (`rocmflash.patch_sdpa()` at start-up); SDPA's own function is
    # bound before, so the baseline never goes through the wrapper
    original = getattr(F.scaled_dot_product_attention, "_rocmflash_original", F.scaled_dot_product_attention)
    if not sdpa.is_patched():
        sdpa.patch_sdpa()
    wrapper = sdpa._WRAPPER

    def patched():
        return wrapper(qs, ks, vs, enable_gqa=True)

    paths = {
        "sdpa default": lambda: original(qs, ks, vs, enable_gqa=True),
        "attention": lambda: rocmflash.attention(qs, ks, vs),
        "patch_sdpa": patched,
        "kvcache": lambda: rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens),
        "kvcache unchecked": lambda: rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                                       check_values=False),
    }
    if fused:
        paths["attention fused"] = _with_fused_merge(paths["attention"])
        paths["kvcache fused"] = _with_fused_merge(paths["kvcache"])
        paths["attention two launches"] = _with_fused_merge(paths["attention"], False)
        paths["kvcache two launches"] = _with_fused_merge(paths["kvcache"], False)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--lengths", default="2048,8192,32768,65536")
    ap.add_argument("--kv-heads", default="8,32", help="Hkv values (Hq=32)")
    ap.add_argument("--fused", action="store_true", help="also time the decode kernel's fused merge forced on (one launch) and off (two)")
    args = ap.parse_args(argv)
    import torch

    head = gpu_table_head(torch, "decode_entry.py", "decode through every entry point vs SDPA",
                          "Sq=1, D=128, Hq=32, bf16; µs per call (public API, host time included), median of "
                          "interleaved rounds; ratio = SDPA default / path",
                          ["Hkv", "B", "KV", "path", "µs", "GB/s", "SDPA default / this"])
    if head is None:
        return 2
    os.makedirs(args.out, exist_ok=True)
    table = MarkdownTable(os.path.join(args.out, "decode_entry.md"), head)
    for Hkv in (int(h) for h in args.kv_heads.split(",")):
        for B in (int(b) for b in args.batches.split(",")):
            for L in (int(n) for n in args.lengths.split(",")):
                nbytes = 2 * B * L * Hkv * 128 * 2
                if nbytes > 40e9:
                    continue
                paths = _paths(torch, B, L, 32, Hkv, fused=args.fused)
                med = interleaved_medians(torch, paths, args.rounds, args.iters)
                for p, t in med.items():
                    table.add(f"| {Hkv} | {B} | {L} | {p} | {t:.1f} | {nbytes / (t * 1e-6) / 1e9:.0f} | "
                              f"{med['sdpa default'] / t:.2f}x |")
                table.flush()
                del paths
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
