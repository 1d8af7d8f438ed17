"""KV-cache decode: ``rocmflash.flash_attn_with_kvcache`` against PyTorch SDPA on a dense cache, on one GPU.

One new token per sequence (Sq=1), D=128, Hq=32 / Hkv=4 (GQA 8:1), bf16, every sequence holding
``KV`` cached keys. rocmflash runs through the public API (validation, config selection from the
GPU's databases -- tuned decode entries when ``rocmflash tune --mode decode`` wrote them -- and
the split-KV kernels; host time included), on a contiguous cache and on a paged one (pages of
256, shuffled block table); ``unchecked`` passes ``check_values=False`` (no host read of the
lengths: the call does not wait for the GPU); ``graph`` replays the unchecked call (and SDPA's)
captured in a CUDA/HIP graph, as serving engines run decode: what is left is GPU time. SDPA gets ``q (B, Hq, 1, D)`` and the dense K/V ``(B, Hkv, KV, D)``
with ``enable_gqa=True`` (its default backend choice, and the flash and memory-efficient backends
where they accept the call). ``--cold`` adds ``graph cold`` paths for both: one graph of calls cycling
through copies of the K/V cache that together exceed twice the L2, so no call finds its keys cached
(each layer of a model reads its own cache; at B*KV <= 32k the whole cache fits an H100's L2, and the
plain ``graph`` rows then time the L2). The decode tuner times the same way.

Decode reads every cached key and value once: bandwidth = ``2 * B * KV * Hkv * D * 2`` bytes / time,
reported against the GPU's HBM peak (``--hbm-peak-gbs``, default from the device name). Timing:
``n`` back-to-back calls between CUDA events (the caches exceed the L2 from KV=8k at B=8), median
over interleaved rounds.

Usage (on a GPU)::

    python benchmarks/decode.py --out $OUT [--rounds 5] [--quick] [--cold] [--batches 8,32] [--lengths 2048,8192]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

from interleaved import MarkdownTable, capture_graph, interleaved_medians

PEAKS_GBS = {"H100": 3350, "H200": 4800, "MI300X": 5300, "MI250": 3277, "MI355": 8000}
BATCHES = (1, 8, 32, 64)
LENGTHS = (2048, 8192, 32768, 65536)


def hbm_peak(name: str) -> float:
    for key, gbs in PEAKS_GBS.items():
        if key in name.upper():
            return gbs
    return float("nan")


COLD_CALLS = 16  # calls per cold graph replay (cycling through the copies)


def _cold_copies(torch, nbytes: int) -> int:
    """How many K/V cache copies exceed twice the L2 together (2..8)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(8, -(-2 * l2 // nbytes)))


def _cold_paths(torch, q, kc, vc, lens) -> dict:
    """``graph cold`` paths: one graph of COLD_CALLS calls cycling through fresh K/V copies > 2x L2.
    Each returned callable replays the graph; the caller divides its time by COLD_CALLS."""
    import functools

    import torch.nn.functional as F

    import rocmflash
    from rocmflash.tuning.isolated import capture_graph

    copies = [(kc, vc)] + [(torch.randn_like(kc), torch.randn_like(vc))
                           for _ in range(_cold_copies(torch, 2 * kc.numel() * kc.element_size()) - 1)]
    ours = [functools.partial(rocmflash.flash_attn_with_kvcache, q, k, v, cache_seqlens=lens, check_values=False)
            for k, v in copies]
    qs = q.transpose(1, 2)
    theirs = [functools.partial(F.scaled_dot_product_attention, qs, k.transpose(1, 2), v.transpose(1, 2),
                                enable_gqa=True) for k, v in copies]
    return {"rocmflash graph cold": capture_graph(ours, COLD_CALLS),
            "sdpa default graph cold": capture_graph(theirs, COLD_CALLS)}


def _paths(torch, B, L, Hq=32, Hkv=4, D=128, cold=False):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import rocmflash

    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=dt)
    kc = torch.randn(B, L, Hkv, D, device=dev, dtype=dt)
    vc = torch.randn_like(kc)
    page = 256
    pages = L // page
    kp = torch.randn(B * pages, page, Hkv, D, device=dev, dtype=dt)
    vp = torch.randn_like(kp)
    table = torch.randperm(B * pages, device=dev).view(B, pages).int()
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    qs, ks, vs = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)  # SDPA layout, views

    def graphed(fn):
        """``fn`` captured once into a CUDA/HIP graph; the path replays it."""
        return capture_graph(torch, fn)

    unchecked = lambda: rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, check_values=False)  # noqa: E731
    paths = {
        "rocmflash": lambda: rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens),
        "rocmflash unchecked": unchecked,
        "rocmflash graph": graphed(unchecked),
        "rocmflash paged": lambda: rocmflash.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table),
        "rocmflash paged unchecked": lambda: rocmflash.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens,
                                                                               block_table=table, check_values=False),
        "sdpa default": lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True),
        "sdpa default graph": graphed(lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)),
    }
    for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def call(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)
        try:
            call()
            paths[name] = call
        except RuntimeError:  # this backend refuses the call (layout, GQA): left out, said in the table
            pass
    if cold:
        paths.update(_cold_paths(torch, q, kc, vc, lens))
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".", help="directory for decode.md (written after every row)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--hbm-peak-gbs", type=float, default=None)
    ap.add_argument("--quick", action="store_true", help="B 1/8, KV 8k/32k only")
    ap.add_argument("--cold", action="store_true", help="add graph-replayed paths that find no K/V in the L2")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8,32,64)")
    ap.add_argument("--lengths", default=None, help="comma-separated KV lengths (default 2048,8192,32768,65536)")
    args = ap.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("benchmarks/decode.py needs a GPU", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    peak = args.hbm_peak_gbs or hbm_peak(name)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "decode.md")
    head = [f"# decode: flash_attn_with_kvcache vs SDPA ({datetime.date.today()})", "",
            f"- device: {name}; torch {torch.__version__}; triton {triton.__version__}; HBM peak {peak:.0f} GB/s",
            f"- command: `python {' '.join(sys.argv)}`",
            "- Sq=1, D=128, Hq=32, Hkv=4 (GQA 8:1), bf16; µs per call (public API, host time included), median of "
            "rounds; GB/s = K+V bytes read / time; ratio = SDPA default time / rocmflash time "
            "(`graph cold` rows: against SDPA's `graph cold`)", "",
            "| B | KV | path | µs | GB/s | % HBM peak | SDPA default / this |", "|---|---|---|---|---|---|---|"]
    table = MarkdownTable(path, head)
    batches = (1, 8) if args.quick else BATCHES
    lengths = (8192, 32768) if args.quick else LENGTHS
    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
    if args.lengths:
        lengths = tuple(int(n) for n in args.lengths.split(","))
    for B in batches:
        for L in lengths:
            paths = _paths(torch, B, L, cold=args.cold)
            med = interleaved_medians(torch, paths, args.rounds, args.iters)
            med = {p: t / COLD_CALLS if p.endswith(" cold") else t for p, t in med.items()}
            nbytes = 2 * B * L * 4 * 128 * 2
            for p, t in med.items():
                gbs = nbytes / (t * 1e-6) / 1e9
                anchor = med["sdpa default graph cold" if p.endswith(" cold") else "sdpa default"]
                table.add(f"| {B} | {L} | {p} | {t:.1f} | {gbs:.0f} | {100 * gbs / peak:.0f}% | "
                          f"{anchor / t:.2f}x |")
            table.flush()
            del paths
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
