"""``model.generate()`` through transformers with ``attn_implementation="rocmflash"`` vs ``"sdpa"``, on one GPU.

What a user of a Hugging Face model feels: a Llama-like model (random weights, bf16, built from a
``LlamaConfig``: nothing is downloaded; by default 16 layers, hidden 2048, 16 query / 4 key-value
heads of 128, MLP 5632) generates ``--new`` tokens greedily after a prompt, eagerly as
``generate()`` runs by default. A batch of one has no padding; larger batches hold prompts of
random lengths in ``[P/2, P]``, left-padded (the padding mask goes through every attention call).
Both the default dynamic cache and ``cache_implementation="static"`` are run (the latter with
``disable_compile=True``: eager too, where transformers would otherwise compile the forward on CUDA).

Timing (wall clock around the call, GPU synchronised): ``generate(max_new_tokens=1)`` is the
prefill, ``generate(max_new_tokens=N, min_new_tokens=N)`` the whole call; decode ms/token =
(whole - prefill) / (N - 1). Median over interleaved rounds (which of sdpa and rocmflash runs first
alternates from round to round), after an untimed warm-up of each. Also: how many rows of tokens are identical between the two
(random bf16 weights: a near-tie can flip a greedy choice) and rocmflash's routing counters
(decode-kernel calls, calls passed to SDPA). Beside the ratio of medians, the per-round ratios: SDPA's time over
rocmflash's within each round (the two ran back to back, so drift between rounds cancels), per decode token
and for the whole call, as median (min..max).

Usage (on a GPU)::

    python benchmarks/generate.py --out $OUT [--batches 1,8] [--prompt 512] [--new 64] [--rounds 3] [--label NAME]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

from e2e import build_model


def _prompts(torch, batch: int, prompt: int, vocab: int, gen):
    """``(input_ids, attention_mask)``: one full prompt at B=1, else random lengths in [P/2, P], left-padded."""
    ids = torch.randint(1, vocab, (batch, prompt), generator=gen)
    mask = torch.ones(batch, prompt, dtype=torch.long)
    if batch > 1:
        lengths = torch.randint(prompt // 2, prompt + 1, (batch,), generator=gen)
        for b, n in enumerate(lengths.tolist()):
            mask[b, :prompt - n] = 0
            ids[b, :prompt - n] = 0
    return ids.cuda(), mask.cuda()


def _generate(torch, model, ids, mask, new: int, cache: str):
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                  pad_token_id=0)
    if cache == "static":  # eager, like the dynamic runs (transformers would compile the forward on CUDA)
        kwargs.update(cache_implementation="static", disable_compile=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**kwargs)
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def run(args):
    import torch

    import rocmflash.integrations.hf as rf_hf

    rf_hf.register()
    model = build_model(args.layers, args.hidden, args.inter, args.heads, args.kv_heads, args.vocab,
                        args.prompt + args.new + 16)
    model.generation_config.eos_token_id = None  # every row generates exactly --new tokens
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in args.batches:
        ids, mask = _prompts(torch, batch, args.prompt, args.vocab, gen)
        for cache in args.caches:
            times = {impl: {"prefill": [], "whole": []} for impl in ("sdpa", "rocmflash")}
            tokens, routed = {}, {}
            for rnd in range(args.rounds + 1):  # round 0: warm-up (compiles), not timed
                # which goes first alternates by round: a run's second generate() can be systematically slower
                for impl in (("sdpa", "rocmflash") if rnd % 2 else ("rocmflash", "sdpa")):
                    model.set_attn_implementation(impl)
                    before = rf_hf.stats()
                    t1, _ = _generate(torch, model, ids, mask, 1, cache)
                    tn, out = _generate(torch, model, ids, mask, args.new, cache)
                    after = rf_hf.stats()
                    if rnd:
                        times[impl]["prefill"].append(t1)
                        times[impl]["whole"].append(tn)
                    tokens[impl] = out[:, ids.shape[1]:].cpu()
                    routed[impl] = {k: after[k] - before[k] for k in after}
            same = int((tokens["sdpa"] == tokens["rocmflash"]).all(1).sum())
            paired = _paired_ratios(times, args.new)
            for impl in ("sdpa", "rocmflash"):
                prefill = statistics.median(times[impl]["prefill"]) * 1e3
                whole = statistics.median(times[impl]["whole"]) * 1e3
                rows.append(dict(batch=batch, cache=cache, impl=impl, prefill_ms=prefill, whole_ms=whole,
                                 decode_ms=_per_token(whole, prefill, args.new), identical=same,
                                 decode_calls=routed[impl]["decode"], sdpa_calls=routed[impl]["sdpa"],
                                 **(paired if impl == "rocmflash" else {})))
                print(rows[-1], flush=True)
    return rows


def _paired_ratios(times: dict, new: int) -> dict:
    """SDPA's time over rocmflash's within each round (the two ran back to back, so host drift between rounds
    cancels): ``decode`` (per decode token: whole minus prefill) and ``whole`` (the whole generate() call), each
    as the sorted list of the rounds' ratios."""
    def decode(impl, r):
        return _per_token(times[impl]["whole"][r], times[impl]["prefill"][r], new)

    rounds = range(len(times["sdpa"]["whole"]))
    return {"paired_decode": sorted(decode("sdpa", r) / decode("rocmflash", r) for r in rounds),
            "paired_whole": sorted(times["sdpa"]["whole"][r] / times["rocmflash"]["whole"][r] for r in rounds)}


def _per_token(whole, prefill, new: int):
    """Decode time per token: the whole call minus its prefill, over the ``new - 1`` tokens after the first."""
    return (whole - prefill) / (new - 1)


def _spread(ratios) -> str:
    """``median (min..max)`` of per-round ratios, or "-"."""
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.3f}x ({ratios[0]:.2f}..{ratios[-1]:.2f})"


def markdown(rows, meta, args) -> str:
    lines = [f"# generate(): rocmflash vs SDPA ({meta['device']})", "",
             f"- date: {meta['date']}; torch {meta['torch']}, Triton {meta['triton']}, transformers "
             f"{meta['transformers']}" + (f"; label: {args.label}" if args.label else ""),
             f"- command: `{meta['command']}`",
             f"- model: {args.layers} layers, hidden {args.hidden}, {args.heads} query / {args.kv_heads} key-value heads "
             f"(head dim {args.hidden // args.heads}), MLP {args.inter}, vocab {args.vocab}, bf16, random weights; "
             f"prompt {args.prompt} (B > 1: random lengths in [{args.prompt // 2}, {args.prompt}], left-padded), "
             f"{args.new} new tokens, greedy, eager; median of {args.rounds} interleaved rounds", "",
             "| B | cache | impl | prefill ms | decode ms/token | decode tokens/s | SDPA decode time / this | "
             "per round: SDPA decode / this, median (range) | per round: SDPA whole call / this | "
             "rows identical to SDPA | rocmflash decode calls | calls passed to SDPA |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {(r["batch"], r["cache"]): r["decode_ms"] for r in rows if r["impl"] == "sdpa"}
    for r in rows:
        lines.append(f"| {r['batch']} | {r['cache']} | {r['impl']} | {r['prefill_ms']:.1f} | {r['decode_ms']:.2f} | "
                     f"{r['batch'] * 1e3 / r['decode_ms']:.0f} | {base[(r['batch'], r['cache'])] / r['decode_ms']:.2f}x | "
                     f"{_spread(r.get('paired_decode'))} | {_spread(r.get('paired_whole'))} | "
                     f"{r['identical']}/{r['batch']} | {r['decode_calls']} | {r['sdpa_calls']} |")
    return "\n".join(lines) + "\n"


def add_model_args(ap) -> None:
    """The Llama-like model's shape (random weights, :func:`e2e.build_model`), shared with ``generate_profile.py``."""
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--caches", default="dynamic,static", help="dynamic and/or static")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    add_model_args(ap)
    ap.add_argument("--label", default="", help="names this run in the output file (generate-LABEL.md)")
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.caches = args.caches.split(",")
    if args.new < 2:
        ap.error("--new must be at least 2 (decode time = whole - prefill over new - 1 tokens)")
    import torch
    import triton
    import transformers

    if not torch.cuda.is_available():
        print("benchmarks/generate.py needs a GPU", file=sys.stderr)
        return 2
    rows = run(args)
    meta = dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(), torch=torch.__version__,
                triton=triton.__version__, transformers=transformers.__version__,
                command="python " + " ".join([os.path.relpath(__file__)] + (argv or sys.argv[1:])))
    text = markdown(rows, meta, args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "generate" + (f"-{args.label}" if args.label else "") + ".md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
