"""Forward-attention benchmark: rocmflash variants vs PyTorch SDPA (flash, cuDNN, efficient) in one run.

Shapes follow reports/anchors: 16,384 tokens per batch (B = 16384 / S), H x D = 2048,
S = 1k..16k, D = 64 and 128, bf16 and fp16, causal both. TFLOP/s = 4 B H S^2 D / t (half
for causal), median of ``triton.testing.do_bench``. Every kernel is checked against an
fp32 reference (two heads) before it is timed.

Sections (pick with --parts):
  sweep   online configs (BLOCK_M 64/128 x BLOCK_N 32/64/128 x warps 4/8 x stages 2/3/4,
          PRE_LOAD_V off) at D=128 and D=64, bf16, non-causal, S=4096
  nonpow2 online at D = 72/80/96/160/192: two-piece head-dim split vs padding
  table   every variant (online with the sweep's best config) vs SDPA flash / cuDNN / efficient
  gate    bf16 D=128 non-causal S=2k..16k: 8 online candidates vs SDPA, 3 interleaved rounds
  vgpr    (CPU) VGPR/AGPR/spills of each variant's table config for gfx90a and gfx942

SDPA backends: only those that exist on the platform are timed
(:func:`rocmflash.hw.platform.sdpa_backends`: flash, cuDNN and efficient on CUDA; flash and
efficient on ROCm, which has no cuDNN); a missing one is a ``skipped: <why>`` cell.

Usage: python benchmarks/attention.py --parts sweep,nonpow2,table --out DIR
       python benchmarks/attention.py --parts vgpr --out DIR        # no GPU needed
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rocmflash.config import KernelConfig, Problem  # noqa: E402
from rocmflash.hw.platform import SDPA_BACKENDS, missing_sdpa_backend, sdpa_backend_enum  # noqa: E402

TOKENS = 16384
HD = 2048
SEQS = (1024, 2048, 4096, 8192, 16384)

# hand-picked configs for the non-online variants (Hopper; see reports)
HAND = {
    "split_kv": KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, PRE_LOAD_V=True,
                             variant="split_kv", num_splits=2),
    "two_phase": KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, PRE_LOAD_V=True,
                              variant="two_phase"),
    "split_d": KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, PRE_LOAD_V=True,
                            variant="split_d", d_chunks=2),
}


def log(*a):
    print(*a, flush=True)


def tflops(B, H, S, D, causal, ms):
    f = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    return f / (ms * 1e-3) / 1e12


def make(B, H, S, D, dtype, device="cuda"):
    import torch

    return [torch.randn(B, H, S, D, device=device, dtype=dtype) for _ in range(3)]


def check(out, q, k, v, causal, dtype):
    """Relative error of out on batch 0, heads 0..1 against fp32 math."""
    import torch

    qs, ks, vs = (x[:1, :2].float() for x in (q, k, v))
    s = qs @ ks.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        S = q.shape[2]
        s = s.masked_fill(torch.ones(S, S, device=q.device, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ vs
    err = ((out[:1, :2].float() - ref).norm() / ref.norm()).item()
    tol = 1e-2 if dtype == torch.float16 else 2e-2
    return err, err <= tol and bool(torch.isfinite(out).all())


def bench_fn(fn):
    import triton

    fn()
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def run_rocmflash(q, k, v, causal, cfg):
    from rocmflash.api.attention import attention

    return lambda: attention(q, k, v, causal=causal, variant=cfg.variant, config=cfg)


def run_sdpa(q, k, v, causal, backend):
    import torch
    from torch.nn.attention import sdpa_kernel

    be = sdpa_backend_enum(backend)

    def fn():
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


class Skipped(str):
    """A benchmark column that is not run here; the text says why."""


def sdpa_runs(q, k, v, causal, backends=SDPA_BACKENDS):
    """``{"sdpa_<backend>": fn or Skipped(why)}``: SDPA backends this platform lacks are skipped, never run."""
    runs = {}
    for be in backends:
        why = missing_sdpa_backend(be)
        runs[f"sdpa_{be}"] = Skipped(f"skipped: {why}") if why else run_sdpa(q, k, v, causal, be)
    return runs


def timed(name, fn, q, k, v, causal, dtype, shape):
    """(tflops, err) or (None, reason)."""
    if isinstance(fn, Skipped):
        return None, str(fn)
    try:
        out = fn()
        err, ok = check(out, q, k, v, causal, dtype)
        if not ok:
            return None, f"WRONG err={err:.2e}"
        ms = bench_fn(fn)
        return tflops(*shape, causal, ms), err
    except Exception as e:  # keep the run going; report the failure in the table
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"


def _warm_one(job):
    """Worker: compile (and run once, B=1) one config so the timing run hits Triton's disk cache."""
    import torch

    H, S, D, dtype, causal, cfg = job
    try:
        q, k, v = make(1, H, S, D, getattr(torch, dtype))
        run_rocmflash(q, k, v, causal, KernelConfig.from_dict(cfg))()
        torch.cuda.synchronize()
        return None
    except Exception as e:
        return f"{type(e).__name__}"


def precompile(jobs, procs=12):
    """Compile many configs in parallel processes (Triton compiles one kernel per process at a time)."""
    import multiprocessing as mp

    t0 = time.time()
    jobs = [(H, S, D, str(dt).replace("torch.", ""), c, cfg.to_dict()) for (H, S, D, dt, c, cfg) in jobs]
    with mp.get_context("spawn").Pool(min(procs, os.cpu_count() or 4)) as pool:
        res = pool.map(_warm_one, jobs, chunksize=1)
    log(f"precompiled {len(jobs)} configs in {time.time() - t0:.1f}s ({sum(r is not None for r in res)} failed)")


def sweep_configs():
    return [KernelConfig(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
            for bm in (64, 128) for bn in (32, 64, 128) for w in (4, 8) for st in (2, 3, 4)]


def sweep(out_dir, S=4096):
    import torch

    rows = []
    best = {}
    precompile([(HD // D, S, D, torch.bfloat16, False, cfg) for D in (128, 64) for cfg in sweep_configs()])
    for D in (128, 64):
        H, B = HD // D, TOKENS // S
        q, k, v = make(B, H, S, D, torch.bfloat16)
        for cfg in sweep_configs():
            t0 = time.time()
            tf, err = timed("online", run_rocmflash(q, k, v, False, cfg), q, k, v, False,
                            torch.bfloat16, (B, H, S, D))
            rows.append(dict(D=D, S=S, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, num_warps=cfg.num_warps,
                             num_stages=cfg.num_stages, tflops=tf, note=err if tf is None else f"{err:.1e}"))
            log(f"sweep D={D} BM{cfg.BLOCK_M} BN{cfg.BLOCK_N} w{cfg.num_warps} s{cfg.num_stages}: "
                f"{tf if tf is None else round(tf, 1)} ({time.time() - t0:.1f}s) {'' if tf else err}")
            if tf is not None and tf > best.get(D, (0, None))[0]:
                best[D] = (tf, cfg)
        # PRE_LOAD_V on the best config
        cfg = best[D][1].replace(PRE_LOAD_V=True)
        tf, err = timed("online", run_rocmflash(q, k, v, False, cfg), q, k, v, False, torch.bfloat16, (B, H, S, D))
        rows.append(dict(D=D, S=S, **{f: getattr(cfg, f) for f in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")},
                         PRE_LOAD_V=True, tflops=tf, note=str(err)))
        if tf is not None and tf > best[D][0]:
            best[D] = (tf, cfg)
        del q, k, v
    with open(os.path.join(out_dir, "sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
    best_cfgs = {D: c.to_dict() for D, (t, c) in best.items()}
    with open(os.path.join(out_dir, "best.json"), "w") as f:
        json.dump(best_cfgs, f, indent=1)
    log("best:", {D: (round(t, 1), c.to_json()) for D, (t, c) in best.items()})
    return {D: c for D, (t, c) in best.items()}


def nonpow2(out_dir, best, S=4096):
    import torch

    rows = []
    bases = {D: (best.get(128) if D <= 128 else KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2))
             for D in (72, 80, 96, 160, 192)}
    precompile([(max(1, HD // D), S, D, torch.bfloat16, False, bases[D].replace(pad_head_dim=p))
                for D in bases for p in (False, True)])
    for D in (72, 80, 96, 160, 192):
        H = max(1, HD // D)
        B = TOKENS // S
        q, k, v = make(B, H, S, D, torch.bfloat16)
        base = bases[D]
        for pad in (False, True):
            cfg = base.replace(pad_head_dim=pad)
            tf, err = timed("online", run_rocmflash(q, k, v, False, cfg), q, k, v, False, torch.bfloat16, (B, H, S, D))
            rows.append(dict(D=D, H=H, S=S, pad=pad, tflops=tf, note=str(err), config=cfg.to_dict()))
            log(f"nonpow2 D={D} pad={pad}: {tf if tf is None else round(tf, 1)} {err}")
        for name, fn in sdpa_runs(q, k, v, False).items():
            be = name[len("sdpa_"):]
            tf, err = timed(be, fn, q, k, v, False, torch.bfloat16, (B, H, S, D))
            rows.append(dict(D=D, H=H, S=S, pad=be, tflops=tf, note=str(err)))
            log(f"nonpow2 D={D} sdpa-{be}: {tf if tf is None else round(tf, 1)} {err}")
        del q, k, v
    with open(os.path.join(out_dir, "nonpow2.json"), "w") as f:
        json.dump(rows, f, indent=1)


def table(out_dir, best, seqs=SEQS):
    import torch

    rows = []
    jobs = []
    for dtype in (torch.bfloat16, torch.float16):
        for D in (128, 64):
            for causal in (False, True):
                for cfg in [best[D], *HAND.values()]:
                    jobs.append((HD // D, 4096, D, dtype, causal, cfg))
    precompile(jobs)
    for dtype in (torch.bfloat16, torch.float16):
        for D in (128, 64):
            for causal in (False, True):
                for S in seqs:
                    H, B = HD // D, TOKENS // S
                    q, k, v = make(B, H, S, D, dtype)
                    r = dict(dtype=str(dtype).replace("torch.", ""), D=D, S=S, B=B, H=H, causal=causal)
                    for name, fn in sdpa_runs(q, k, v, causal).items():
                        r[name] = timed(name, fn, q, k, v, causal, dtype, (B, H, S, D))
                    cfgs = {"online": best[D]}
                    cfgs.update(HAND)
                    for name, cfg in cfgs.items():
                        r[name] = timed(name, run_rocmflash(q, k, v, causal, cfg), q, k, v, causal, dtype,
                                        (B, H, S, D))
                    rows.append(r)
                    log(" ".join(f"{k_}={(round(v_[0], 1) if v_[0] else v_[1]) if isinstance(v_, tuple) else v_}"
                                 for k_, v_ in r.items()))
                    del q, k, v
    with open(os.path.join(out_dir, "table.json"), "w") as f:
        json.dump(rows, f, indent=1)


GATE_CANDIDATES = [
    KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, PRE_LOAD_V=True),
    KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=4, PRE_LOAD_V=True),
    KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2, PRE_LOAD_V=True),
    KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, PRE_LOAD_V=True),
    KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
    KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, PRE_LOAD_V=True),
    KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, PRE_LOAD_V=True),
]


def gate(out_dir, seqs=(2048, 4096, 8192, 16384), rounds=3, D=128):
    """The gate shape (bf16, D=128, non-causal): candidate online configs and SDPA, interleaved rounds."""
    import statistics

    import torch

    precompile([(HD // D, 4096, D, torch.bfloat16, False, c) for c in GATE_CANDIDATES])
    rows = []
    for S in seqs:
        H, B = HD // D, TOKENS // S
        q, k, v = make(B, H, S, D, torch.bfloat16)
        fns = sdpa_runs(q, k, v, False)
        for c in GATE_CANDIDATES:
            fns[c.to_json()] = run_rocmflash(q, k, v, False, c)
        res = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                tf, err = timed(name, fn, q, k, v, False, torch.bfloat16, (B, H, S, D))
                res[name].append(tf if tf is not None else float("nan"))
        for name, ts in res.items():
            rows.append(dict(S=S, name=name, tflops=ts, median=statistics.median(ts)))
        best_name = max((n for n in res if not n.startswith("sdpa")), key=lambda n: statistics.median(res[n]))
        fl = statistics.median(res["sdpa_flash"])
        others = ", ".join(f"{n[len('sdpa_'):]} " + (str(fns[n]) if isinstance(fns[n], Skipped)
                                                      else f"{statistics.median(res[n]):.1f}")
                           for n in res if n.startswith("sdpa_") and n != "sdpa_flash")
        log(f"gate S={S}: flash {fl:.1f} (rounds {[round(x) for x in res['sdpa_flash']]}), "
            f"{others}; best online {statistics.median(res[best_name]):.1f} "
            f"rounds {[round(x) for x in res[best_name]]} = {statistics.median(res[best_name]) / fl:.3f}x flash; {best_name}")
        for n in res:
            if not n.startswith("sdpa"):
                log(f"   {statistics.median(res[n]):6.1f}  {n}")
        del q, k, v
    with open(os.path.join(out_dir, "gate.json"), "w") as f:
        json.dump(rows, f, indent=1)


def vgpr(out_dir, best):
    """Register cost per variant (table configs, D=128/64, causal False) for gfx90a and gfx942."""
    from rocmflash.kernels import get_variant

    rows = []
    cfgs = {"online": best}
    for name, c in HAND.items():
        cfgs[name] = {D: c for D in best}
    for name, per_d in cfgs.items():
        for D, cfg in per_d.items():
            for arch in ("gfx90a", "gfx942"):
                try:
                    kernels = get_variant(name).compile_for(arch, cfg, Problem(head_dim=int(D), dtype="bf16"))
                    asm = kernels[0].asm["amdgcn"]
                    vals = {key: int(val) for key, val in re.findall(
                        r"\.(vgpr_count|agpr_count|vgpr_spill_count):\s+(\d+)", asm)}
                    occ = re.search(r"; Occupancy: (\d+)", asm)
                    vals["occupancy"] = int(occ.group(1)) if occ else None
                except Exception as e:
                    vals = {"error": f"{type(e).__name__}: {e}"[:120]}
                rows.append(dict(variant=name, D=int(D), arch=arch, config=cfg.to_dict(), **vals))
                log(name, D, arch, vals)
    with open(os.path.join(out_dir, "vgpr.json"), "w") as f:
        json.dump(rows, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="sweep,nonpow2,table")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--best", help="JSON {D: config} to use instead of running the sweep")
    ap.add_argument("--seqs", default=",".join(map(str, SEQS)))
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    parts = a.parts.split(",")
    best = None
    if a.best:
        best = {int(D): KernelConfig.from_dict(c) for D, c in json.load(open(a.best)).items()}
    if "sweep" in parts:
        best = sweep(a.out)
    if best is None:
        best = {128: KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
                64: KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)}
    if "nonpow2" in parts:
        nonpow2(a.out, best)
    if "table" in parts:
        table(a.out, best, tuple(int(s) for s in a.seqs.split(",")))
    if "gate" in parts:
        gate(a.out)
    if "vgpr" in parts:
        vgpr(a.out, best)


if __name__ == "__main__":
    main()
