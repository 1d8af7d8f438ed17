"""Host time per generated token on a CPU: ``attn_implementation="rocmflash"`` against ``"sdpa"`` where SDPA serves.

On the lent GPU hosts a whole ``generate()`` call moves by up to 1.6x from one round to the next, far more than
the few per cent rocmflash's HF integration could add or save (``bench/generate.py``'s per-round ratios). This
measures that integration's host cost without a GPU: a Llama-like model (random weights, bf16, 16 layers,
head dim 128, GQA 4, small hidden size so that the model's own CPU compute stays short) generates greedily on
CPU tensors, every decode step served by SDPA (``decode_incumbent`` forced to ``default``: what the shipped
H100 database decides for B1 decode, with ``rocmflash.api.selection.device_identity`` answering "h100"). The
prefill runs rocmflash's kernel in Triton's interpreter once per call. Reported:

- thread CPU ms per ``generate()`` call, median of interleaved rounds (order alternating), and the ratio;
- ``cProfile`` of ``--profiled`` calls each (alternating, summed): total own time per token and the functions
  whose own time per token differs most (CPU profiles jitter by several per cent: read the rocmflash and
  transformers attention rows).

Usage (CPU, no GPU needed)::

    python bench/generate_host_cpu.py [--cache static] [--batch 1] [--new 32] [--rounds 6] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import os
import pstats
import statistics
import sys
import time

from e2e import build_model


def _own_times(fn) -> dict:
    """``{function: own seconds}`` of one call of ``fn`` under cProfile."""
    profile = cProfile.Profile()
    profile.enable()
    fn()
    profile.disable()
    stats = pstats.Stats(profile).stats
    return {f"{k[0].split('site-packages/')[-1]}:{k[1]}({k[2]})": v[2] for k, v in stats.items()}


def run(args) -> list:
    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import rocmflash.integrations.hf as rf_hf
    from rocmflash.api import ops, selection

    torch.set_num_threads(1)
    selection.device_identity = lambda device: ("h100", "sm_90")
    ops.decode_incumbent = lambda *a, **k: "default"  # every decode step served by SDPA, as on the H100 at B1
    rf_hf.register()
    # hidden 512 (4 query heads, 1 key/value head, of 128), MLP 512, vocab 1000: the model's own CPU work stays short
    model = build_model(args.layers, 512, 512, 4, 1, 1000, args.prompt + args.new + 8, device="cpu")
    model.generation_config.eos_token_id = None  # every call generates exactly --new tokens
    ids = torch.randint(1, 1000, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                  min_new_tokens=args.new, do_sample=False, pad_token_id=0)
    if args.cache == "static":
        kwargs.update(cache_implementation="static", disable_compile=True)

    def generate():
        with torch.no_grad():
            model.generate(**kwargs)

    impls = ("sdpa", "rocmflash")
    for impl in impls:  # warm-up: first uses, the prefill's interpreter
        model.set_attn_implementation(impl)
        generate()
    times = {impl: [] for impl in impls}
    for rnd in range(args.rounds):
        for impl in (impls if rnd % 2 else impls[::-1]):
            model.set_attn_implementation(impl)
            start = time.thread_time()
            generate()
            times[impl].append(time.thread_time() - start)
    before = rf_hf.stats()
    own = {impl: {} for impl in impls}
    for rnd in range(args.profiled):  # alternating, summed: one profiled call jitters as much as the differences
        for impl in (impls if rnd % 2 else impls[::-1]):
            model.set_attn_implementation(impl)
            for k, v in _own_times(generate).items():
                own[impl][k] = own[impl].get(k, 0.0) + v
    routed = {k: (v - before[k]) // args.profiled for k, v in rf_hf.stats().items()}
    lines = [f"# generate() host time on a CPU: rocmflash vs sdpa where SDPA serves ({datetime.date.today()})", "",
             f"- torch {torch.__version__}; command: `python {' '.join(sys.argv)}`",
             f"- {args.layers} layers, hidden 512, 4 query / 1 key-value heads of 128, bf16, batch {args.batch}, "
             f"prompt {args.prompt}, {args.new} new tokens, {args.cache} cache, {args.rounds} interleaved rounds; "
             f"rocmflash's HF calls per profiled call: {routed}", "",
             "| impl | thread CPU ms per generate(), median | min..max | sdpa / this |", "|---|---|---|---|"]
    base = statistics.median(times["sdpa"])
    for impl in impls:
        t = sorted(times[impl])
        lines.append(f"| {impl} | {statistics.median(t) * 1e3:.1f} | {t[0] * 1e3:.1f}..{t[-1] * 1e3:.1f} | "
                     f"{base / statistics.median(t):.3f}x |")
    tokens = args.new * args.profiled
    per_token = {impl: sum(own[impl].values()) / tokens * 1e6 for impl in impls}
    lines += ["", f"cProfile, own time per token: sdpa {per_token['sdpa']:.0f} µs, rocmflash "
                  f"{per_token['rocmflash']:.0f} µs. Largest differences (rocmflash - sdpa, µs per token):", "",
              "| µs/token | function |", "|---|---|"]
    keys = set(own["sdpa"]) | set(own["rocmflash"])
    diff = sorted(((own["rocmflash"].get(k, 0.0) - own["sdpa"].get(k, 0.0)) / tokens * 1e6, k) for k in keys)
    for d, k in diff[::-1][:args.top] + diff[:args.top]:
        lines.append(f"| {d:+.1f} | `{k}` |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", choices=("dynamic", "static"), default="static")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--profiled", type=int, default=4, help="profiled calls of each implementation, alternating")
    ap.add_argument("--out", default=None, help="also write generate-host-cpu-CACHE.md there")
    args = ap.parse_args(argv)
    if min(args.new, args.rounds, args.batch, args.profiled) < 1:
        ap.error("--new, --rounds, --batch and --profiled must be at least 1")
    text = "\n".join(run(args)) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"generate-host-cpu-{args.cache}.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
