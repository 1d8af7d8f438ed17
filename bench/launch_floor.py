"""Where a kept launch's host time goes on a GPU host: the public call against its own Triton launch.

A diagnostic of host cost, not a kernel figure. For the default decode call
(``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)``, B1, Hq 32, Hkv 8, D 128, bf16, a full
2048-key cache) and a tiny ``rocmflash.attention`` forward (B1, 2 heads, S 16, D 64), each launch of the call is
recorded once from rocmflash's kept launch plans (:mod:`rocmflash.kernels.launch`), then timed alone, three ways:

* ``runner``: Triton's public launch API, ``CompiledKernel[grid](*args)``, as rocmflash replays it;
* ``run``: the compiled kernel's launcher called with the stream read once per call and no launch hooks (what the
  runner does after its Python; Triton 3.6's layout, read here for the diagnostic only);
* ``launch``: the launcher's C function itself (no Python between the call and the driver).

Beside them: the whole public call, SDPA's call on the same tensors, and the torch calls a launch needs
(``torch.cuda.current_device``, the raw stream, an output allocation, one elementwise op as a C++ launch's floor).
Rows are timed in interleaved rounds (median µs per call); ``--out`` gets the table.

Usage::

    python bench/launch_floor.py --calls 2000 --rounds 7 --out $OUT
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from interleaved import host_and_wall_us


def _record_plans(L):
    """Wrap every kept launch plan's runner so that its next call records its arguments."""
    seen = []
    for key, plan in list(L._PLANS.items()):
        def recorder(*args, _run=plan.runner, _key=key, **kw):
            seen.append((_key, _run, args))
            return _run(*args, **kw)
        L._PLANS[key] = plan._replace(runner=recorder)
    return seen


def _restore(L, originals):
    L._PLANS.clear()
    L._PLANS.update(originals)


def _ways(runner, args, torch):
    """``(name, callable)`` for one recorded launch: Triton's runner, the launcher without hooks, its C function."""
    compiled = next(c.cell_contents for c in runner.__closure__ if type(c.cell_contents).__name__ == "CompiledKernel")
    grid = next(c.cell_contents for c in runner.__closure__ if isinstance(c.cell_contents, tuple))
    g0, g1, g2 = grid
    raw_stream = torch._C._cuda_getCurrentRawStream
    dev = torch.cuda.current_device()
    launcher = compiled.run
    function, packed = compiled.function, compiled.packed_metadata

    def run():
        launcher(g0, g1, g2, raw_stream(dev), function, packed, None, None, None, *args)

    ways = [("runner", lambda: runner(*args)), ("run, no hooks", run)]
    c_launch = getattr(launcher, "launch", None)
    if c_launch is not None and not launcher.global_scratch_size and not launcher.profile_scratch_size:
        coop, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl

        def launch():
            c_launch(g0, g1, g2, raw_stream(dev), function, coop, pdl, None, None, packed, None, None, None, *args)
        ways.append(("C launch", launch))
    return ways


def _time_rows(rows, calls: int, rounds: int, torch):
    per_row = {name: [] for name, _ in rows}
    for _ in range(rounds):
        for name, fn in rows:
            for _ in range(20):
                fn()
            per_row[name].append(host_and_wall_us(torch, fn, calls)[0])
    return {name: (statistics.median(v), min(v), max(v)) for name, v in per_row.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch
    import triton

    import rocmflash
    from rocmflash.kernels import launch as L

    if not torch.cuda.is_available():
        print("launch_floor.py needs a GPU", file=sys.stderr)
        return 2
    dev = "cuda"
    torch.manual_seed(0)
    B, Hq, Hkv, D, KV = 1, 32, 8, 128, 2048
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
    kc = torch.randn(B, KV, Hkv, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    lens = torch.full((B,), KV, device=dev, dtype=torch.int32)
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    small = [torch.randn(1, 2, 16, 64, device=dev, dtype=torch.bfloat16) for _ in range(3)]
    sdpa = torch._C._nn.scaled_dot_product_attention
    os.environ.setdefault("ROCMFLASH_NO_INCUMBENT", "1")  # rocmflash's own kernels, every row

    def decode():
        return rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)

    def forward():
        return rocmflash.attention(*small)

    tables = []
    for label, call, sdpa_call in (
            ("decode, default call", decode, lambda: sdpa(qt, kt, vt, enable_gqa=True)),
            ("forward, tiny", forward, lambda: sdpa(*small))):
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        originals = dict(L._PLANS)
        seen = _record_plans(L)
        call()
        torch.cuda.synchronize()
        _restore(L, originals)
        rows = [("public call", call), ("SDPA, same tensors", sdpa_call)]
        for i, (_, runner, args) in enumerate(seen):
            for name, fn in _ways(runner, args, torch):
                rows.append((f"launch {i + 1} ({len(args)} args): {name}", fn))
        out_like = torch.empty_like(q)
        rows += [("torch.cuda.current_device()", torch.cuda.current_device),
                 ("raw stream", lambda: torch._C._cuda_getCurrentRawStream(0)),
                 ("torch.empty_like(q)", lambda: torch.empty_like(q)),
                 ("out.add_(1) (a C++ launch)", lambda: out_like.add_(1))]
        tables.append((label, len(seen), _time_rows(rows, a.calls, a.rounds, torch)))

    lines = [f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}; "
             f"{a.calls} calls per loop, {a.rounds} interleaved loops; host µs per call", ""]
    for label, launches, result in tables:
        lines += [f"## {label} ({launches} launch(es) per call)", "", "| row | median µs | min..max |", "|---|---|---|"]
        lines += [f"| {name} | {med:.1f} | {lo:.1f}..{hi:.1f} |" for name, (med, lo, hi) in result.items()]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "launch-floor.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
