"""One HF decode step's attention call, rocmflash against transformers' own SDPA path, on the same inputs.

``generate()`` timings mix the attention call with everything else a step does and vary run to run; this times
the attention function alone, as a Llama layer calls it during ``generate()``: one new token, query
``(B, Hq, 1, D)``, the cache's key/value ``(B, Hkv, L, D)`` (a transposed view of ``(B, L, Hkv, D)`` storage, as
transformers' caches hand them), and

- ``dynamic``: no mask (a dynamic cache of one unpadded sequence, or a padded batch's sequences all as long);
- ``static``: a static cache of ``L`` slots of which ``used`` are written, the free slots masked (bool mask
  ``(B, 1, 1, L)``, as transformers' ``sdpa_mask`` builds it); with ``B > 1`` the sequences are left-padded by
  random amounts up to a quarter of ``used``.

``rocmflash.integrations.hf.rocmflash_attention_forward`` and ``transformers.integrations.sdpa_attention.
sdpa_attention_forward`` run back to back ``--calls`` times between CUDA events (host time included), in
interleaved rounds; the median per call is reported, with which way rocmflash routed (``hf.stats()``). A third
path, ``kernels``, is rocmflash with ``ROCMFLASH_NO_INCUMBENT=1`` (its own kernels wherever it can compute the
call): what the entry's choice of SDPA is weighed against. A fourth, ``folded`` (a probe, not a rocmflash path),
is one SDPA call with the GQA group folded into the query length (:func:`_folded`).

Usage (on a GPU)::

    python bench/hf_decode_call.py --out DIR [--batches 1,8,32] [--used 576,4096] [--rounds 5] [--calls 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import types


def _inputs(torch, B, Hq, Hkv, D, slots, used, static, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
    length = slots if static else used
    k, v = (torch.randn(B, length, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
            for _ in range(2))
    mask = None
    if static:
        mask = torch.zeros(B, 1, 1, slots, dtype=torch.bool, device="cuda")
        starts = [0] + [int(x) for x in torch.randint(0, max(used // 4, 1), (B - 1,), generator=g,
                                                          device="cuda").tolist()]
        for b, s in enumerate(starts):
            mask[b, :, :, s:used] = True
    return q, k, v, mask


def _folded(torch, q, k, v, mask, scale):
    """Probe: one SDPA call with the GQA group folded into the query length (``(B, Hkv, Hq/Hkv, D)`` against the
    cache's ``(B, Hkv, L, D)``; a one-token step has no causal mask to misalign): no ``repeat_kv`` copies under a
    mask, no ``enable_gqa``. Output ``(B, 1, Hq, D)``, as transformers' path returns it."""
    B, Hq, _, D = q.shape
    Hkv = k.shape[1]
    o = torch.nn.functional.scaled_dot_product_attention(q.reshape(B, Hkv, Hq // Hkv, D), k, v, attn_mask=mask,
                                                         scale=scale)
    return o.reshape(B, 1, Hq, D)


def _time(torch, fn, calls: int) -> float:
    """µs per call of ``calls`` back-to-back calls between CUDA events (the user grid's loop)."""
    from user_grid import _time as ms_per_call  # bench/ is the script's folder

    return ms_per_call(torch, fn, calls) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--used", default="576,4096", help="keys written so far (a static cache has 2x slots)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args(argv)
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from rocmflash.api.selection import NO_INCUMBENT_ENV as NO_INCUMBENT
    from rocmflash.integrations import hf

    hf.register()
    module = types.SimpleNamespace(is_causal=True, num_key_value_groups=args.heads // args.kv_heads,
                                   training=False)
    scale = args.head_dim ** -0.5
    lines = [f"# One HF decode step's attention call: rocmflash vs transformers' SDPA path "
             f"({torch.cuda.get_device_name()})", "",
             f"torch {torch.__version__}; Hq {args.heads}, Hkv {args.kv_heads}, D {args.head_dim}, bf16; "
             f"µs per call, host included, median of {args.rounds} interleaved rounds of {args.calls} calls", "",
             f"command: `python bench/hf_decode_call.py --batches {args.batches} --used {args.used} "
             f"--rounds {args.rounds} --calls {args.calls}`", "",
             "| B | cache | keys used | sdpa µs | rocmflash µs | rocmflash's kernels µs | folded GQA µs (probe) | "
             "sdpa / rocmflash | rocmflash routed (all paths) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for B in (int(x) for x in args.batches.split(",")):
        for used in (int(x) for x in args.used.split(",")):
            for static in (False, True):
                q, k, v, mask = _inputs(torch, B, args.heads, args.kv_heads, args.head_dim, 2 * used, used, static,
                                        seed=B * 7 + used)
                paths = {
                    "sdpa": lambda: sdpa_attention_forward(module, q, k, v, mask, scaling=scale),
                    "rocmflash": lambda: hf.rocmflash_attention_forward(module, q, k, v, mask, scaling=scale)}
                paths["kernels"] = paths["rocmflash"]
                paths["folded"] = lambda: _folded(torch, q, k, v, mask, scale)
                ref = paths["sdpa"]()[0].float()
                out = paths["rocmflash"]()[0].float()
                err = ((out - ref).norm() / ref.norm()).item()
                times = {name: [] for name in paths}
                before = hf.stats()
                for _ in range(args.rounds):
                    for name, fn in paths.items():
                        if name == "kernels":  # read per call by the dispatch: set for this path's loop only
                            os.environ[NO_INCUMBENT] = "1"
                        try:
                            if name == "kernels":
                                fn()  # a first call of this path outside the timed loop
                            times[name].append(_time(torch, fn, args.calls))
                        finally:
                            os.environ.pop(NO_INCUMBENT, None)
                routed = {key: val - before.get(key, 0) for key, val in hf.stats().items() if val - before.get(key, 0)}
                s, r, kern, fold = (statistics.median(times[n]) for n in ("sdpa", "rocmflash", "kernels", "folded"))
                fout = paths["folded"]().float()
                ferr = ((fout - ref).norm() / ref.norm()).item()
                lines.append(f"| {B} | {'static' if static else 'dynamic'} | {used} | {s:.1f} | {r:.1f} | {kern:.1f} | "
                             f"{fold:.1f} (err {ferr:.1e}) | {s / r:.2f}x | "
                             f"{', '.join(f'{a} {b}' for a, b in routed.items())} (err {err:.1e}) |")
                print(lines[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hf-decode-call.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
