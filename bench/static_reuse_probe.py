"""Diagnostic: what Triton is asked to compile by the static phase and by a live launch of one config.

The live runner reuses the static phase's builds only if both ask Triton for the same build
(same source, argument types, specialisation, constants and options). This probe compiles
one config per variant both ways in one process, on the live GPU, and prints every field
that differs. It hooks ``triton.compile`` (a diagnostic may read Triton's objects; the
package does not).

    python bench/static_reuse_probe.py [--head-dim 64] [--causal] [--seqlen 2048]
"""

from __future__ import annotations

import argparse
import json


def _record(calls: list):
    import triton
    import triton.compiler as tc

    original = tc.compile

    def compile(src, target=None, options=None, **kw):
        calls.append({"name": getattr(src, "name", "?"), "signature": dict(getattr(src, "signature", {})),
                      "constants": {str(k): repr(v) for k, v in getattr(src, "constants", {}).items()},
                      "attrs": {str(k): v for k, v in getattr(src, "attrs", {}).items()},
                      "target": repr(target), "options": dict(options or {}),
                      "hash": src.hash() if hasattr(src, "hash") else None})
        return original(src, target=target, options=options, **kw)

    tc.compile = compile
    triton.compile = compile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    calls: list = []
    _record(calls)
    import torch

    from rocmflash.hw.detect import detect_live_gpu
    from rocmflash.hw.roofline import Shape
    from rocmflash.kernels import get_variant
    from rocmflash.static.space import default_space
    from rocmflash.tuning.live_worker import _launch_once
    from rocmflash.tuning.spec import static_problem

    gpu = detect_live_gpu()
    shape = Shape(batch=2, heads_q=8, heads_kv=2, seqlen_q=args.seqlen, seqlen_k=args.seqlen, head_dim=args.head_dim,
                  dtype="fp16", causal=args.causal)
    problem = static_problem(shape)
    seen = set()
    for cfg in default_space(gpu).configs(problem, gpu):
        if cfg.variant in seen:
            continue
        seen.add(cfg.variant)
        mod = get_variant(cfg.variant)
        calls.clear()
        mod.compile_for(gpu.triton_target(), cfg, problem)
        static = list(calls)
        calls.clear()
        _launch_once(mod, cfg, shape)
        torch.cuda.synchronize()
        launched = list(calls)
        print(f"== {cfg.variant}: static asked {len(static)} build(s), the launch {len(launched)}")
        for s, l in zip(static, launched):
            diff = {k: (s[k], l[k]) for k in s if s[k] != l[k]}
            print(json.dumps({"kernel": s["name"], "same_hash": s["hash"] == l["hash"], "differs": diff},
                             default=str, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
