"""Host (CPU) cost per attention call through each public entry point, against SDPA.

Two measurements per path, forward and forward+backward, on one GPU:

* ``host_us``: tiny shapes (B1, 2 heads, S=16, D=64, bf16), where the GPU work is a few
  microseconds: the time to *enqueue* ``n`` calls divided by ``n`` (no synchronisation
  inside the loop). This is the Python/dispatcher/launcher cost a model pays per call.
* ``wall_us``: the same loop including the final synchronisation, divided by ``n``;
  equal to ``host_us`` when the host is the bottleneck.

Then the case the issue found CPU-bound (B1, Hq32/Hkv8, S=1025, D=128, causal): wall time
per call, rocmflash vs SDPA's default, forward and forward+backward; and one decode step
(one new token, B = 1 and 8, KV = 8192, Hq32/Hkv4, D=128): ``flash_attn_with_kvcache``
with and without its host read of the lengths, against SDPA on the dense cache.

``--modules rocmflash_before,rocmflash`` times two versions in the same interleaved rounds
(a copy of an older rocmflash with its package and op namespace renamed).

Paths: ``sdpa`` (PyTorch's default backend choice), ``rocmflash.attention``,
``flash_attn_func``, the torch op ``torch.ops.rocmflash.attn_fwd``, the transformers
attention function (``rocmflash.integrations.hf``), and ``F.scaled_dot_product_attention``
under ``rocmflash.patch_sdpa()``: ``patch_sdpa (patched once)`` is the form a model uses (one plain
``patch_sdpa()`` call for the run, then SDPA calls), ``patch_sdpa (with-block per call)`` enters and
leaves ``with rocmflash.patch_sdpa():`` around every call (a new wrapper each time). Configs come from the shipped databases, as a user gets them.

Usage (on a GPU)::

    python benchmarks/host_overhead.py --out reports/host-tmp --label after
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

from interleaved import host_and_wall_us


def _paths(torch, F, rf, tag=""):
    """The entry points of one rocmflash package ``rf`` (``tag`` names it in the table)."""
    import importlib

    hf = importlib.import_module(rf.__name__ + ".integrations.hf")
    ops_ns = getattr(torch.ops, rf.__name__)
    suffix = f" [{tag}]" if tag else ""

    class _Module:  # what transformers passes as `module`
        is_causal = False

    def hf_path(q, k, v, causal):
        _Module.is_causal = causal
        return hf.rocmflash_attention_forward(_Module, q, k, v, None, is_causal=causal)[0]

    def patched_per_call(q, k, v, causal):  # a context entered and left around every call
        with rf.patch_sdpa():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])

    # the form a model uses: patched once (a plain call, kept open for the run) and F's attribute called. Its
    # wrapper is called directly: another package's wrapper may be installed on top of it (--modules)
    sdpa_mod = _submodule(rf, "api.sdpa", "sdpa")
    rf.patch_sdpa()
    wrapper = sdpa_mod._WRAPPER

    def patched(q, k, v, causal):
        return wrapper(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])

    return {
        "rocmflash.attention" + suffix: lambda q, k, v, c: rf.attention(q, k, v, causal=c),
        "flash_attn_func" + suffix: lambda q, k, v, c: rf.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2),
                                                                          v.transpose(1, 2), causal=c),
        "torch op attn_fwd" + suffix: lambda q, k, v, c: ops_ns.attn_fwd(q, k, v, c, q.shape[-1] ** -0.5,
                                                                         "online", "")[0],
        "transformers (hf)" + suffix: hf_path,
        "patch_sdpa (patched once)" + suffix: patched,
        "patch_sdpa (with-block per call)" + suffix: patched_per_call,
    }


def _submodule(rf, name: str, flat: str):
    """``rf.name`` (the subpackage layout), else ``rf.flat`` (an older flat copy)."""
    import importlib

    try:
        return importlib.import_module(f"{rf.__name__}.{name}")
    except ModuleNotFoundError:
        return importlib.import_module(f"{rf.__name__}.{flat}")


def _all_paths(torch, F, modules):
    import importlib

    sdpa = _SDPA[0]  # torch's own, bound before any patch_sdpa handle opens
    paths = {"sdpa (default)": lambda q, k, v, c: sdpa(q, k, v, is_causal=c, enable_gqa=q.shape[1] != k.shape[1])}
    hf_sdpa = _transformers_sdpa(torch)
    if hf_sdpa is not None:  # the HF row's own baseline: what attn_implementation="sdpa" runs without rocmflash
        paths["transformers sdpa (no rocmflash)"] = hf_sdpa
    for name in modules:
        rf = importlib.import_module(name)
        for ops in (name + ".api.ops", name + ".ops"):  # registers the torch ops (rocmflash.ops before the layout)
            try:
                importlib.import_module(ops)
                break
            except ModuleNotFoundError:
                continue
        paths.update(_paths(torch, F, rf, name if len(modules) > 1 else ""))
    return paths


def _transformers_sdpa(torch):
    """transformers' own ``sdpa_attention_forward`` as a path (None without transformers): what a model with
    ``attn_implementation="sdpa"`` runs per layer -- the baseline of the ``transformers (hf)`` row."""
    try:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError:
        return None

    class _Module(torch.nn.Module):  # the attributes transformers' attention modules carry
        def __init__(self):
            super().__init__()
            self.is_causal, self.num_key_value_groups = False, 1

    module = _Module()

    def path(q, k, v, causal):
        module.is_causal, module.num_key_value_groups = causal, q.shape[1] // k.shape[1]
        return sdpa_attention_forward(module, q, k, v, None, is_causal=causal)[0]

    return path


def _inputs(torch, B, Hq, Hkv, S, D, grad):
    """``(B, H, S, D)`` views of ``(B, S, H, D)`` tensors (the leaves): the layout a model's projections give
    (transformers' ``view(B, S, H, D).transpose(1, 2)``) and flash-attn's own, so ``flash_attn_func``'s
    ``(B, S, H, D)`` arguments (these views transposed back) are contiguous, as a model passes them."""
    dev, dt = "cuda", torch.bfloat16
    return tuple(torch.randn(B, S, h, D, device=dev, dtype=dt, requires_grad=grad).transpose(1, 2)
                 for h in (Hq, Hkv, Hkv))


def _step(torch, fn, q, k, v, causal, backward):
    if not backward:
        return lambda: fn(q, k, v, causal)

    def run():
        out = fn(q, k, v, causal)
        out.backward(torch.ones_like(out))
    return run


_SDPA: list = []  #: ``F.scaled_dot_product_attention`` as torch defines it (the patched-once rows replace it)


def measure(n: int, rounds: int, modules=("rocmflash",)) -> dict:
    import torch
    import torch.nn.functional as F

    if not _SDPA:
        _SDPA.append(F.scaled_dot_product_attention)

    paths = _all_paths(torch, F, list(modules))
    results = {}
    cases = [("tiny fwd", (1, 2, 2, 16, 64), False, False), ("tiny fwd+bwd", (1, 2, 2, 16, 64), False, True),
             ("B1 Hq32 Hkv8 S1025 D128 causal fwd", (1, 32, 8, 1025, 128), True, False),
             ("B1 Hq32 Hkv8 S1025 D128 causal fwd+bwd", (1, 32, 8, 1025, 128), True, True)]
    for label, shape, causal, backward in cases:
        q, k, v = _inputs(torch, *shape, grad=backward)
        runs = {name: _step(torch, fn, q, k, v, causal, backward) for name, fn in paths.items()}
        results[label] = _interleaved(torch, runs, rounds, n if "tiny" in label else max(20, n // 10))
    for batch, kv in ((1, 8192), (8, 8192)):
        label = f"decode B{batch} Hq32 Hkv4 KV{kv} D128 (one new token)"
        results[label] = _interleaved(torch, _decode_runs(torch, F, list(modules), batch, kv), rounds, max(50, n // 4))
    return results


def _interleaved(torch, runs: dict, rounds: int, n: int) -> dict:
    """``{name: {"host_us", "wall_us"}}``: medians over interleaved rounds (drift hits every path alike)."""
    for run in runs.values():  # warm-up: JIT, autotune-free config lookup, caches
        for _ in range(20):
            run()
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(host_and_wall_us(torch, run, n))
    return {name: {"host_us": statistics.median(s[0] for s in vals), "wall_us": statistics.median(s[1] for s in vals)}
            for name, vals in samples.items()}


def _decode_runs(torch, F, modules, batch, kv):
    """SDPA on the dense cache against ``flash_attn_with_kvcache`` (value-checked and unchecked) per module."""
    import importlib

    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(batch, 1, 32, 128, device=dev, dtype=dt)
    k_cache, v_cache = (torch.randn(batch, kv, 4, 128, device=dev, dtype=dt) for _ in range(2))
    seqlens = torch.full((batch,), kv, device=dev, dtype=torch.int32)
    qt, kt, vt = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    runs = {"sdpa (default)": lambda: _SDPA[0](qt, kt, vt, enable_gqa=True)}
    for name in modules:
        rf = importlib.import_module(name)
        suffix = f" [{name}]" if len(modules) > 1 else ""
        runs["flash_attn_with_kvcache" + suffix] = (
            lambda rf=rf: rf.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens))
        runs["flash_attn_with_kvcache unchecked" + suffix] = (
            lambda rf=rf: rf.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, check_values=False))
    return runs


def _versions():
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__, "device": torch.cuda.get_device_name(0),
            "runtime": f"HIP {torch.version.hip}" if getattr(torch.version, "hip", None) else f"CUDA {torch.version.cuda}"}


def markdown(results: dict, meta: dict) -> str:
    lines = [f"# Host overhead per attention call ({meta['label']})", "",
             f"- date: {meta['date']}; device: {meta['device']} ({meta['runtime']}); torch {meta['torch']}, "
             f"Triton {meta['triton']}", f"- command: `{meta['command']}`",
             f"- rocmflash: {meta['rocmflash_file']}", "",
             "host µs = time to enqueue one call (no sync); wall µs = per call including the final sync. "
             "Median of interleaved rounds. Dense inputs: (B, H, S, D) views of (B, S, H, D) tensors, the layout a "
             "model's projections give (flash_attn_func gets them transposed back: contiguous (B, S, H, D)).", ""]
    for label, per_path in results.items():
        base = per_path["sdpa (default)"]["wall_us"]
        lines += [f"## {label}", "", "| path | host µs | wall µs | wall vs sdpa |", "|---|---|---|---|"]
        for name, r in per_path.items():
            lines.append(f"| {name} | {r['host_us']:.1f} | {r['wall_us']:.1f} | {r['wall_us'] / base:.2f}x |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=500, help="calls per timed loop on tiny shapes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", default="current")
    parser.add_argument("--out", default=None, help="folder for host_overhead-<label>.md/.json")
    parser.add_argument("--modules", default="rocmflash",
                        help="comma-separated rocmflash packages to compare in the same interleaved rounds "
                             "(e.g. a renamed copy of an older version: rocmflash_before,rocmflash)")
    args = parser.parse_args(argv)
    import importlib

    modules = args.modules.split(",")
    results = measure(args.n, args.rounds, modules)
    meta = dict(_versions(), label=args.label, date=datetime.date.today().isoformat(),
                command="python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
                rocmflash_file=", ".join(os.path.dirname(importlib.import_module(m).__file__) for m in modules))
    text = markdown(results, meta)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"host_overhead-{args.label}.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, f"host_overhead-{args.label}.json"), "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
