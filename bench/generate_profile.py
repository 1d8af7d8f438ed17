"""Where a ``generate()`` decode step's host time goes, ``attn_implementation="rocmflash"`` against ``"sdpa"``.

``bench/generate.py`` gives the ratio; this says where a difference comes from. One Llama-like model (random
weights, bf16, as ``generate.py`` builds it), one batch, each cache kind, both implementations on the same model
(``set_attn_implementation``), after two untimed warm-up calls each:

- ``--rounds`` interleaved timings of ``generate(max_new_tokens=--new)`` (wall clock, GPU synchronised);
- host waits: one call under ``torch.cuda.set_sync_debug_mode("warn")``, counting the synchronising CUDA calls
  (and where the first of each kind came from);
- the garbage collector: collections and time spent in them during one call (``gc.callbacks``);
- ``cProfile`` of one call: each implementation's top functions by own time, and the functions whose own time
  per generated token differs most between the two.

Usage (on a GPU)::

    python bench/generate_profile.py --out $OUT [--batch 1] [--caches dynamic,static] [--rounds 5]
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import os
import pstats
import statistics
import sys
import time
import traceback
import warnings

from e2e import build_model
from generate import _generate, _prompts, add_model_args

IMPLS = ("sdpa", "rocmflash")


def _gc_during(fn) -> tuple:
    """``(collections per generation, seconds in the collector)`` while ``fn`` runs."""
    counts, spent, started = [0, 0, 0], [0.0], [0.0]

    def hook(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            counts[info["generation"]] += 1
            spent[0] += time.perf_counter() - started[0]

    gc.callbacks.append(hook)
    try:
        fn()
    finally:
        gc.callbacks.remove(hook)
    return counts, spent[0]


def _syncs_during(torch, fn) -> tuple:
    """``(synchronising CUDA calls, {first line of the caller outside torch: count})`` while ``fn`` runs."""
    where: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    n = 0
    for w in caught:
        if "synchroniz" not in str(w.message):
            continue
        n += 1
        key = f"{os.path.basename(w.filename)}:{w.lineno}"
        where[key] = where.get(key, 0) + 1
    return n, where


def _profile(fn) -> dict:
    """``{function: own seconds}`` of one run of ``fn`` under cProfile."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    stats = pstats.Stats(prof).stats
    return {f"{os.path.basename(f)}:{line}({name})": tt for (f, line, name), (_, _, tt, _, _) in stats.items()}


def run(args, torch, model) -> list:
    gen = torch.Generator().manual_seed(0)
    ids, mask = _prompts(torch, args.batch, args.prompt, args.vocab, gen)
    sections = []
    for cache in args.caches:
        def call(impl, new=args.new):
            model.set_attn_implementation(impl)
            return _generate(torch, model, ids, mask, new, cache)[0]

        for impl in IMPLS:  # warm-up: compiles, plans, first uses
            call(impl)
            call(impl, 1)
        times = {impl: [] for impl in IMPLS}
        for rnd in range(args.rounds):
            for impl in (IMPLS if rnd % 2 == 0 else IMPLS[::-1]):  # which goes first alternates
                times[impl].append((call(impl) - call(impl, 1)) / (args.new - 1) * 1e3)
        row = {}
        for impl in IMPLS:
            model.set_attn_implementation(impl)
            syncs, where = _syncs_during(torch, lambda: call(impl))
            counts, spent = _gc_during(lambda: call(impl))
            row[impl] = dict(ms=statistics.median(times[impl]), all_ms=times[impl], syncs=syncs, where=where,
                             gc=counts, gc_ms=spent * 1e3, prof=_profile(lambda: call(impl)))
        sections.append((cache, row))
        print(cache, {i: (round(r["ms"], 3), r["syncs"], r["gc"], round(r["gc_ms"], 2)) for i, r in row.items()},
              flush=True)
    return sections


def markdown(sections, meta, args) -> str:
    per_token = 1e3 / args.new  # profiled seconds of one whole call -> µs per generated token
    lines = [f"# Where generate()'s decode time goes: rocmflash vs SDPA ({meta['device']})", "",
             f"- date: {meta['date']}; torch {meta['torch']}, Triton {meta['triton']}, transformers "
             f"{meta['transformers']}",
             f"- command: `{meta['command']}`",
             f"- model: {args.layers} layers, hidden {args.hidden}, {args.heads} query / {args.kv_heads} key-value heads, "
             f"bf16, random weights; B {args.batch}, prompt {args.prompt}, {args.new} new tokens, greedy, eager", ""]
    for cache, row in sections:
        s, r = row["sdpa"], row["rocmflash"]
        lines += [f"## {cache} cache", "",
                  "| impl | decode ms/token (median) | rounds | SDPA / this | synchronising CUDA calls per call | "
                  "GC collections (gen 0/1/2), ms |", "|---|---|---|---|---|---|"]
        for impl in IMPLS:
            x = row[impl]
            lines.append(f"| {impl} | {x['ms']:.3f} | {', '.join(f'{t:.2f}' for t in x['all_ms'])} | "
                         f"{s['ms'] / x['ms']:.2f}x | {x['syncs']} "
                         f"({', '.join(f'{k} x{v}' for k, v in sorted(x['where'].items())) or '-'}) | "
                         f"{'/'.join(map(str, x['gc']))}, {x['gc_ms']:.1f} |")
        names = set(s["prof"]) | set(r["prof"])
        diff = sorted(names, key=lambda n: abs(r["prof"].get(n, 0) - s["prof"].get(n, 0)), reverse=True)
        lines += ["", "Own time per generated token (cProfile of one call; profiled, so slower than above), "
                      "largest differences:", "",
                  "| function | sdpa µs/token | rocmflash µs/token | difference |", "|---|---|---|---|"]
        for n in diff[:args.top]:
            a, b = s["prof"].get(n, 0) * per_token * 1e3, r["prof"].get(n, 0) * per_token * 1e3
            lines.append(f"| `{n}` | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
        for impl in IMPLS:
            top = sorted(row[impl]["prof"].items(), key=lambda kv: kv[1], reverse=True)[:args.top]
            lines += ["", f"{impl}: top functions by own time", "", "| function | µs/token |", "|---|---|"]
            lines += [f"| `{n}` | {t * per_token * 1e3:.1f} |" for n, t in top]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--caches", default="dynamic,static")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    add_model_args(ap)
    args = ap.parse_args(argv)
    args.caches = args.caches.split(",")
    if args.new < 2:
        ap.error("--new must be at least 2")
    import torch
    import transformers
    import triton

    if not torch.cuda.is_available():
        print("bench/generate_profile.py needs a GPU", file=sys.stderr)
        return 2
    import rocmflash.integrations.hf as rf_hf

    rf_hf.register()
    model = build_model(args.layers, args.hidden, args.inter, args.heads, args.kv_heads, args.vocab,
                        args.prompt + args.new + 16)
    model.generation_config.eos_token_id = None
    try:
        sections = run(args, torch, model)
    except Exception:
        traceback.print_exc()
        return 1
    meta = dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(), torch=torch.__version__,
                triton=triton.__version__, transformers=transformers.__version__,
                command="python " + " ".join([os.path.relpath(__file__)] + (argv or sys.argv[1:])))
    text = markdown(sections, meta, args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"generate-profile-b{args.batch}.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
