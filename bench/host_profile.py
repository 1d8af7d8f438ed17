"""Where the host time of one attention call goes: cProfile over many tiny calls.

``--case forward`` (default): tiny shapes (B1, 2 heads, S=16, D=64, bf16) so the GPU work
is negligible; the profile shows the Python cost per call of ``rocmflash.attention``
forward and forward+backward, split by function (``tottime``: time in the function itself);
``flash_attn_func`` and ``patch_sdpa`` forwards are timed beside it. ``--modules
rocmflash_before,rocmflash`` times two versions in the same interleaved rounds (the first a copy
of an older rocmflash with its package name and op namespace renamed, importable from
``PYTHONPATH``): a before/after under the same load.

``--case decode``: eager ``rocmflash.flash_attn_with_kvcache`` at batch 1 (Hq 32, Hkv 8,
D 128, bf16, 8192 cache slots, ``cache_seqlens`` given as an int32 tensor, one new token
with its k/v appended), on a contiguous and on a paged cache (``--page-size``, shuffled
block table), each also with ``check_values=False`` (no host read of the lengths/table), and
a cache that grows by one key every call without ``cache_seqlens`` (transformers' generate
through :mod:`rocmflash.integrations.hf`: a new shape each call, served by the plan of the length-free
signature and one launch plan per split count),
and the default call without an append (what ``bench/decode_entry.py`` times; the shipped rule,
``kv_decode.fuses_merge``, decides its merge), also with the decode kernel's fused merge forced on
(``kv_decode.FUSED_COMBINE``: one launch) and off (split + combine).
On a GPU, SDPA over the same cache (a view of the first ``cache_seqlens + 1`` keys) is
timed next to it. ``--modules`` works here too (each row per package, same rounds).

``--cpu-stub`` runs on a machine without a GPU: CPU tensors, Triton's launcher replaced
by a no-op, so what is timed is rocmflash's own Python (checks, selection, autograd
Function, argument building, launch-cache key) plus torch's allocations and autograd
engine, next to SDPA's whole CPU call on the same tensors (which includes its tiny
compute). It measures the layers above Triton, not a launch. The forward case then also
times the incumbent dispatch: a temporary database whose entry for the non-causal tiny
problem says SDPA won (forward and forward+backward), so ``rocmflash.attention``,
``flash_attn_func`` and ``patch_sdpa`` run SDPA there; their rows minus the plain SDPA rows
are what the dispatch adds. With ``--cpu-stub`` every row is timed in thread CPU time
(``time.thread_time``: robust against other processes on a shared machine) and wall time,
with torch on one thread.

Usage::

    python bench/host_profile.py --calls 300 --out $OUT          # on a GPU
    python bench/host_profile.py --cpu-stub --calls 2000         # on a CPU
    python bench/host_profile.py --cpu-stub --case decode --calls 2000
    PYTHONPATH=/tmp/old python bench/host_profile.py --cpu-stub --modules rocmflash_before,rocmflash

Each timed row is the median over ``--rounds`` loops of ``--calls`` calls, the rows interleaved
round by round (other load on the machine shows up as spread between rounds, not as a shifted mean).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import itertools
import os
import pstats
import statistics
import sys
import time


def _module(package: str, name: str):
    """``package.name`` (the subpackage layout: ``api.attention``), else the flat module of an older copy
    (``api`` for ``api.attention``, ``decode`` for ``api.decode``)."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError:
        flat = {"api.attention": "api"}.get(name, name.split(".")[-1])
        return importlib.import_module(f"{package}.{flat}")


def _stub_launches(package: str = "rocmflash"):
    """CPU tensors through the compiled-launch path of ``package``, with Triton's launcher replaced by a no-op."""
    api, decode, sdpa, L = (_module(package, m) for m in ("api.attention", "api.decode", "api.sdpa",
                                                            "kernels.launch"))

    class _NoLaunch:  # stands in for Triton's CompiledKernel: compiled[grid](*args) does nothing
        def __getitem__(self, grid):
            return lambda *args: None

    real_check = L.check_device

    def check_device(name, t):  # the real check's cost for a GPU tensor (and a bit more), CPU tensors accepted
        if not t.is_cuda and t.device.type != "cpu":
            real_check(name, t)

    L.interpreting = lambda: False
    api.check_device = L.check_device = check_device  # accept CPU tensors at the API's device check
    decode._interpreting = lambda: True  # and at flash_attn_with_kvcache's
    sdpa._interpreting = lambda: True  # and at patch_sdpa's
    L._jit_launch = lambda fn, grid, kwargs: _NoLaunch()
    L._is_compiled_kernel = lambda obj: isinstance(obj, _NoLaunch)
    L.FAST_LAUNCH = True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=("forward", "decode", "fp8"), default="forward")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5, help="timed loops per row (the median is reported)")
    ap.add_argument("--page-size", type=int, default=256, help="decode: page size of the paged cache")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--cpu-stub", action="store_true", help="no GPU: CPU tensors, launches stubbed out")
    ap.add_argument("--modules", default="rocmflash",
                    help="packages timed side by side in the same interleaved rounds, forward and decode (e.g. a renamed copy "
                         "of an older version: rocmflash_before,rocmflash)")
    ap.add_argument("--no-profile", action="store_true", help="timings only (no cProfile tables)")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    import torch

    device = "cpu" if args.cpu_stub else "cuda"
    packages = [m.strip() for m in args.modules.split(",") if m.strip()]
    if args.cpu_stub:
        torch.set_num_threads(1)  # SDPA's CPU anchor on one thread: no pool hand-offs on a shared machine
        for package in packages:
            _stub_launches(package)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    if args.case == "forward":
        rows, profiled = _forward_case(torch, device, packages)
    elif args.case == "fp8":
        rows, profiled = _fp8_case(torch, device, packages)
    else:
        rows, profiled = _decode_case(torch, device, args, packages)
    report = io.StringIO()
    clock = "thread CPU µs per call" if args.cpu_stub else "µs per call"
    report.write(f"torch {torch.__version__}; device {device}{' (launches stubbed)' if args.cpu_stub else ''}; "
                 f"case {args.case}; {args.calls} calls per loop, {args.rounds} interleaved loops\n\n"
                 f"| call | {clock}, median (no profiler) | min..max over loops | wall µs, median |\n"
                 "|---|---|---|---|\n")
    for name, (cpu, wall) in time_rows(rows, args.calls, args.rounds, sync, thread_clock=args.cpu_stub).items():
        report.write(f"| {name} | {statistics.median(cpu):.1f} | {min(cpu):.1f}..{max(cpu):.1f} | "
                     f"{statistics.median(wall):.1f} |\n")
    for name, fn in ([] if args.no_profile else profiled):
        stats = profile_calls(fn, args.calls, sync, report)
        report.write(f"\n===== {name}: {stats.total_tt / args.calls * 1e6:.1f} us of profiled host time per call\n")
        stats.sort_stats("tottime").print_stats(args.top)
    write_report(report, args.out, "host-profile.txt" if args.case == "forward" else f"host-profile-{args.case}.txt")
    return 0


def _forward_case(torch, device, packages):
    """``(timed rows, profiled rows)``, each ``[(name, fn)]``: per package, the dense forward and forward+backward
    through rocmflash's kernel (causal), ``flash_attn_func`` and ``patch_sdpa``, and on the CPU the same through
    the incumbent dispatch (non-causal); SDPA itself beside them."""
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, 2, 16, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn_like(q)
    sdpa = F.scaled_dot_product_attention  # bound before any patch: torch's own function

    def sdpa_fwd(causal=True, fn=sdpa):
        with torch.no_grad():
            fn(q, k, v, is_causal=causal)

    def sdpa_fwd_bwd(causal=True):
        torch.autograd.grad(sdpa(q, k, v, is_causal=causal), (q, k, v), do)

    rows, profiled, incumbent_rows = [], [], []
    if device == "cpu":  # the incumbent rows need a database whose entry says SDPA won: a temporary one
        _incumbent_db(q, packages)
    for package in packages:
        rows_p, profiled_p, incumbent_p = _package_rows(torch, importlib.import_module(package), q, k, v, do,
                                                        sdpa_fwd, f" [{package}]" if len(packages) > 1 else "")
        rows += rows_p
        profiled += profiled_p
        incumbent_rows += incumbent_p if device == "cpu" else []
    rows += [("SDPA forward", sdpa_fwd), ("SDPA forward+backward", sdpa_fwd_bwd)]
    if incumbent_rows:
        rows += incumbent_rows + [("incumbent: SDPA forward (direct)", lambda: sdpa_fwd(False)),
                                  ("incumbent: SDPA forward+backward (direct)", lambda: sdpa_fwd_bwd(False))]
    return rows, profiled


def _package_rows(torch, rf, q, k, v, do, sdpa_fwd, tag):
    """``(rows, profiled, incumbent rows)`` of one rocmflash package ``rf``."""
    qb, kb, vb = (t.detach().transpose(1, 2).requires_grad_(True) for t in (q, k, v))  # (B, S, H, D) views
    sdpa_mod = _module(rf.__name__, "api.sdpa")
    sdpa_mod.patch_sdpa()  # kept open; its wrapper is called directly (another package may patch on top)
    patched = sdpa_mod._WRAPPER

    def fwd(causal=True):
        with torch.no_grad():
            rf.attention(q, k, v, causal=causal)

    def fwd_bwd(causal=True):
        torch.autograd.grad(rf.attention(q, k, v, causal=causal), (q, k, v), do)

    def fa_fwd(causal=True):
        with torch.no_grad():
            rf.flash_attn_func(qb, kb, vb, causal=causal)

    rows = [(f"rocmflash.attention forward{tag}", fwd), (f"rocmflash.attention forward+backward{tag}", fwd_bwd),
            (f"flash_attn_func forward{tag}", fa_fwd), (f"patch_sdpa forward{tag}", lambda: sdpa_fwd(True, patched))]
    incumbent = [(f"incumbent: rocmflash.attention forward{tag}", lambda: fwd(False)),
                 (f"incumbent: flash_attn_func forward{tag}", lambda: fa_fwd(False)),
                 (f"incumbent: patch_sdpa forward{tag}", lambda: sdpa_fwd(False, patched)),
                 (f"incumbent: rocmflash.attention forward+backward{tag}", lambda: fwd_bwd(False))]
    profiled = [(f"forward{tag}", fwd), (f"forward+backward{tag}", fwd_bwd), (f"incumbent forward{tag}",
                                                                          lambda: fwd(False))]
    return rows, profiled, incumbent


_DB_DIR: list = []


def _incumbent_db(q, packages) -> None:
    """A temporary user database for a stand-in "h100" whose tiny non-causal entry (q's head dim and dtype,
    GQA 1, q's length bucket) carries an incumbent that won forward and forward+backward; the shipped
    databases are hidden from every package. The causal problem has no entry: rocmflash's kernel."""
    import atexit
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="rocmflash-host-profile-")
    atexit.register(shutil.rmtree, tmp, True)
    for package in packages:
        db, selection = importlib.import_module(f"{package}.db"), _module(package, "api.selection")
        KernelConfig = importlib.import_module(f"{package}.config").KernelConfig
        os.environ[db.CONFIG_DIR_ENV] = tmp
        os.environ.pop(selection.NO_DB_ENV, None)
        db.shipped_config_dir = lambda: os.path.join(tmp, "no-shipped")
        selection.device_identity = lambda device: ("h100", "sm_90")
        d = db.ConfigDB.open(os.path.join(tmp, "h100.json"), "h100", "sm_90", {"host_profile": True})
        field = {"backend": "default", "time_ms": 0.01, "triton_ms": 0.02,
                 "train": {"backend": "default", "time_ms": 0.03, "triton_ms": 0.06}}
        entry = {"best": KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1).to_dict(),
                 "measured": True, "incumbent": field}
        d.put(db.problem_key(q.shape[3], "bf16", False, 1, db.seqlen_bucket(q.shape[2])), entry)
        d.save()
        selection.clear_cache()


def _fp8_case(torch, device, packages=("rocmflash",)):
    """``(timed rows, profiled rows)`` of the fp8 forward per package: ``flash_attn_func`` on fp8 (B, S, H, D)
    inputs (B1, S 128, Hq 8, Hkv 2, D 128, e4m3fn, causal) beside the same call in bf16 and SDPA's."""
    import torch.nn.functional as F

    f8 = torch.float8_e4m3fn
    q, k, v = (torch.randn(1, 128, h, 128, device=device) for h in (8, 2, 2))
    q8, k8, v8 = (t.to(f8) for t in (q, k, v))
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    ds = torch.ones(1, 2, device=device)
    rows, profiled = [], []
    for package in packages:
        rf = importlib.import_module(package)
        tag = f" [{package}]" if len(packages) > 1 else ""

        def fp8(rf=rf):
            with torch.no_grad():
                rf.flash_attn_func(q8, k8, v8, causal=True, q_descale=ds, k_descale=ds, v_descale=ds)

        def bf16(rf=rf):
            with torch.no_grad():
                rf.flash_attn_func(qb, kb, vb, causal=True)

        rows += [(f"flash_attn_func fp8{tag}", fp8), (f"flash_attn_func bf16{tag}", bf16)]
        profiled.append((f"flash_attn_func fp8{tag}", fp8))

    def sdpa():
        with torch.no_grad():
            F.scaled_dot_product_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)

    return rows + [("SDPA bf16", sdpa)], profiled


def _decode_case(torch, device, args, packages=("rocmflash",)):
    """``(timed rows, profiled rows)`` of eager decode per package (``--modules``: each row once per package,
    tagged, in the same interleaved rounds): contiguous and paged caches, with and without the host read of the
    lengths/table, the default call without an append, and with the decode kernel's fused merge; SDPA over the
    same keys on a GPU."""
    import torch.nn.functional as F

    rows, profiled = [], []
    for package in packages:
        tag = f" [{package}]" if len(packages) > 1 else ""
        rows_p, profiled_p, sdpa_row = _decode_rows(torch, F, importlib.import_module(package), device, args, tag)
        rows += rows_p
        profiled += profiled_p
    return rows + sdpa_row, profiled


def _decode_rows(torch, F, rocmflash, device, args, tag):
    """``(rows, profiled rows, [the SDPA row on a GPU])`` of one rocmflash package."""
    B, Hq, Hkv, D, capacity, length = 1, 32, 8, 128, 8192, 4096
    dt = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, 1, Hq, D, device=device, dtype=dt, generator=gen)
    k_new, v_new = (torch.randn(B, 1, Hkv, D, device=device, dtype=dt, generator=gen) for _ in range(2))
    lens = torch.full((B,), length, dtype=torch.int32, device=device)  # fixed: every call rewrites one slot
    kc, vc = (torch.randn(B, capacity, Hkv, D, device=device, dtype=dt, generator=gen) for _ in range(2))
    page = args.page_size
    pages = capacity // page
    kp, vp = (t.view(B * pages, page, Hkv, D) for t in (kc, vc))
    table = torch.randperm(B * pages, device=device, generator=gen).view(B, pages).to(torch.int32)

    def contiguous(check=True):
        with torch.no_grad():
            rocmflash.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, causal=True,
                                              check_values=check)

    def paged(check=True):
        with torch.no_grad():
            rocmflash.flash_attn_with_kvcache(q, kp, vp, k_new, v_new, cache_seqlens=lens, block_table=table,
                                              causal=True, check_values=check)

    big = 4 * capacity  # room for every call of a default run (2000 x 5 + warm-up) to see a new length
    kg, vg = (torch.randn(B, big, Hkv, D, device=device, dtype=dt, generator=gen) for _ in range(2))
    grown = itertools.count()

    def growing():  # (B, L, Hkv, D) views of a cache, L one longer each call (wraps after 31k calls)
        L = 1024 + next(grown) % (big - 1024)
        with torch.no_grad():
            rocmflash.flash_attn_with_kvcache(q, kg[:, :L], vg[:, :L], softmax_scale=D ** -0.5)

    def no_append():  # the default call over a cache a model keeps (flash_attn_with_kvcache's decode entry)
        with torch.no_grad():
            rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)

    kv_decode = _module(rocmflash.__name__, "kernels.kv_decode")

    def forced_merge(on: bool):  # the default call with the fused merge forced on (one launch) or off (two)
        def call():
            before = getattr(kv_decode, "FUSED_COMBINE", None)
            kv_decode.FUSED_COMBINE = on
            try:
                no_append()
            finally:
                kv_decode.FUSED_COMBINE = before
        return call

    rows = [("decode contiguous", contiguous), ("decode contiguous, check_values=False", lambda: contiguous(False)),
            (f"decode paged (page {page})", paged), (f"decode paged (page {page}), check_values=False",
                                                     lambda: paged(False)),
            ("decode, cache one key longer each call, no cache_seqlens", growing),
            ("decode contiguous, no append (default call)", no_append)]
    if hasattr(kv_decode, "FUSED_COMBINE"):
        rows += [("decode contiguous, no append, fused merge", forced_merge(True)),
                 ("decode contiguous, no append, two launches", forced_merge(False))]
    rows = [(name + tag, fn) for name, fn in rows]
    profiled = [(f"decode contiguous{tag}", contiguous), (f"decode paged (page {page}){tag}", paged),
                (f"decode, cache one key longer each call{tag}", growing)]
    sdpa_row = []
    if device == "cuda":  # on the CPU SDPA's time is its compute over 4k keys, no host cost
        qs = q.transpose(1, 2)
        ks, vs = (t[:, :length + 1].transpose(1, 2) for t in (kc, vc))

        def sdpa():
            with torch.no_grad():
                F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)

        sdpa_row = [("SDPA (same keys, GQA)", sdpa)]
    return rows, profiled, sdpa_row


def time_rows(rows, calls: int, rounds: int, sync, thread_clock: bool = False) -> dict:
    """``{name: (µs per call by the row's clock per round, wall µs per call per round)}``, rows interleaved
    round by round after 50 warm-up calls each. ``thread_clock``: the first list is this thread's CPU time
    (``time.thread_time``), which other processes on the machine do not inflate; else it is the wall time."""
    for _, fn in rows:
        for _ in range(50):
            fn()
    sync()
    out = {name: ([], []) for name, _ in rows}
    for _ in range(rounds):
        for name, fn in rows:
            c0, t0 = time.thread_time(), time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            c1, t1 = time.thread_time(), time.perf_counter()
            out[name][0].append(((c1 - c0) if thread_clock else (t1 - t0)) / calls * 1e6)
            out[name][1].append((t1 - t0) / calls * 1e6)
    return out


def profile_calls(fn, calls: int, sync, stream) -> pstats.Stats:
    """cProfile over ``calls`` calls of ``fn`` (``sync()`` after), as Stats printing to ``stream``."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    sync()
    return pstats.Stats(prof, stream=stream)


def write_report(report: io.StringIO, out: str, name: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "w") as f:
        f.write(report.getvalue())
    print(report.getvalue()[:30000])


if __name__ == "__main__":
    sys.exit(main())
