"""The incumbent's worker side: gate and time the platform's SDPA backends (and rocmflash's served
forward+backward) inside a tune's timing worker. What the incumbent is, and the run-time dispatch to it
where it won: :mod:`rocmflash.api.incumbent`; the tune's side of it: :mod:`rocmflash.tuning.incumbents`.
"""

from __future__ import annotations

import math
import time

from rocmflash.api.incumbent import SdpaKernel, sdpa_attention
from rocmflash.hw.platform import sdpa_record  # what the times were taken on: kept in the entry's incumbent field


def measure(task: dict) -> dict:
    """Worker entry (:meth:`rocmflash.tuning.live.LiveRunner.call`): every backend of ``task["backends"]`` gated and
    timed on ``task["shape"]`` with ``task["settings"]``, forward and forward+backward, and rocmflash's served
    forward+backward with ``task["config"]`` beside them, and what they ran on (``timed_on``,
    :func:`rocmflash.hw.platform.sdpa_record`). Never raises for a backend that refuses the shape."""
    from rocmflash.config import KernelConfig
    from rocmflash.hw.roofline import Shape
    from rocmflash.tuning.live_gate import gate, interpreting
    from rocmflash.messages import error_line
    from rocmflash.tuning.live_worker import LiveSettings, _median, _time

    shape, settings = Shape.from_dict(task["shape"]), LiveSettings(**task["settings"])
    cfg = KernelConfig.from_dict(task["config"])
    results, start = {}, time.perf_counter()
    for backend in task["backends"]:
        r = {"status": None, "time_ms": None, "train_ms": None, "rel_err": None, "error": None}
        try:
            ok, err, why = gate(SdpaKernel(backend, write_out=True), cfg, shape)
            r["rel_err"] = None if math.isnan(err) else err
            if not ok:
                r.update(status="incorrect", error=why)
            elif interpreting():
                r.update(status="skipped", error="interpreter: SDPA is not timed on the CPU")
            else:
                r["time_ms"] = _median(_time(SdpaKernel(backend, write_out=False), cfg, shape, settings))
                r["train_ms"] = _train_ms(lambda q, k, v, b=backend: sdpa_attention(b, q, k, v, shape.causal,
                                                                                      _scale(shape)), shape, settings)
                r["status"] = "ok"
        except Exception as exc:  # a backend that does not take this shape, dtype or GQA on this GPU
            r.update(status="failed", error=error_line(exc))
        results[backend] = r
    triton_train = None
    if not interpreting():
        import rocmflash

        triton_train = _train_ms(lambda q, k, v: rocmflash.attention(q, k, v, causal=shape.causal, config=cfg),
                                 shape, settings)
    return {"status": "ok", "backends": results, "triton_train_ms": triton_train, "timed_on": sdpa_record(),
            "worker_s": round(time.perf_counter() - start, 3)}


def _scale(shape) -> float:
    return 1.0 / math.sqrt(shape.head_dim)


def _train_ms(forward, shape, settings) -> float:
    """Median ms of one forward+backward step (``torch.autograd.grad`` of all three inputs) on the live
    runner's rotating inputs, cache flushed before each timed step."""
    import torch

    from rocmflash.tuning.live_worker import _inputs

    sets, flush = _inputs(shape, settings)
    leaves = [tuple(t.detach().requires_grad_(True) for t in s[:3]) for s in sets]
    dout = torch.randn_like(sets[0][0])  # one output gradient serves every input set

    def step(i):
        q, k, v = leaves[i % len(leaves)]
        torch.autograd.grad(forward(q, k, v), (q, k, v), dout)

    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    times = []
    for i in range(max(5, min(settings.max_reps, 20))):
        if flush is not None:
            flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(i)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


# ----------------------------------------------------------------------------- decode: eager, host time included
def measure_decode(problem: dict, config=None, backends=None, rounds: int = 3, iters: int = 20) -> dict:
    """A dense decode step (``problem``: :class:`rocmflash.tuning.decode.DecodeProblem`'s fields, 16-bit unpaged
    cache) as a user's eager call pays for it: ``rocmflash.attention(q, k, v)`` (q ``(B, Hq, 1, D)`` and k/v
    ``(B, Hkv, L, D)`` views of ``(B, S, H, D)`` tensors) served by the decode kernel (``config``: a
    ``DecodeConfig`` dict served in place of the run-time selection's; None: what the selection serves), and the
    same call served by each SDPA backend of ``backends`` (default :func:`rocmflash.api.incumbent.candidates`)
    as the dispatch serves it (``enable_gqa``, no copies): both sides pay the same validation and dispatch.

    Each path is first gated against an fp32 reference of the first two sequences (the tuner's tolerance),
    then timed over ``rounds`` interleaved rounds of ``iters`` back-to-back calls between two events (host time
    included, as ``benchmarks/decode_entry.py`` times); medians in ms. Which side serves is forced in the call's
    dispatch plan, so what a database already says does not matter. In the interpreter nothing is timed (gates
    only). Never raises for a backend that refuses the shape."""
    import torch

    from rocmflash.api.incumbent import DECODE_TIMING, candidates
    from rocmflash.tuning.decode import DecodeProblem
    from rocmflash.tuning.live_gate import interpreting
    from rocmflash.messages import error_line

    p = DecodeProblem(**problem).validate()
    if p.page_size or p.kv_dtype:
        raise ValueError(f"measure_decode times dense 16-bit decode calls; got page_size={p.page_size}, "
                         f"kv_dtype={p.kv_dtype!r}")
    start, timed = time.perf_counter(), not interpreting()
    held = list(_decode_inputs(torch, p, torch.device("cuda" if timed else "cpu")))  # q, k, v, ref: freed at the end
    q, k, v, ref = held
    paths, results = {}, {}
    with _served_decode(config) as served:
        route = _route(held, None)
        r = _gated(route, held, p.dtype, error_line)
        result = {"status": r["status"], "error": r["error"], "triton_rel_err": r["rel_err"], "triton_ms": None,
                  "config": served(p), "timing": DECODE_TIMING, "backends": results, "timed_on": sdpa_record()}
        if r["status"] == "ok":
            paths["rocmflash"] = route
        for name in backends or candidates():
            call = _route(held, name)
            results[name] = _gated(call, held, p.dtype, error_line)
            if results[name]["status"] == "ok":
                paths[name] = call
        if timed and "rocmflash" in paths:
            medians = _interleaved_ms(torch, paths, rounds, iters)
            result["triton_ms"] = medians.pop("rocmflash")
            for name, ms in medians.items():
                results[name]["time_ms"] = ms
        else:
            _skip_untimed(results, timed)
    del q, k, v, ref
    return _finish(torch, result, held, paths, timed, start)


def _skip_untimed(results: dict, timed: bool) -> None:
    """Mark the gated backends ``skipped`` (with why) when nothing was timed."""
    why = "the rocmflash route failed its gate" if timed else "interpreter: not timed on the CPU"
    for r in results.values():
        if r["status"] == "ok":
            r["status"], r["error"] = "skipped", why


def _finish(torch, result: dict, held: list, paths: dict, timed: bool, start: float) -> dict:
    """Free the inputs (and the GPU's cached blocks) and stamp the worker time."""
    held.clear()
    paths.clear()
    if timed:
        torch.cuda.empty_cache()
    result["worker_s"] = round(time.perf_counter() - start, 3)
    return result


# ----------------------------------------------------------------------------- short dense calls: eager, host included
def measure_eager(problem: dict, backends=None, rounds: int = 3, iters: int = 20) -> dict:
    """A short dense problem (``problem``: ``batch``, ``heads_q``, ``heads_kv``, ``seqlen``, ``head_dim``, ``dtype``
    "bf16"/"fp16", ``causal``) as a user's eager calls pay for it, forward and forward+backward: the public
    ``rocmflash.attention(q, k, v, causal=...)`` served by rocmflash's Triton kernels (the run-time selection's
    configs), and the same call served by each SDPA backend of ``backends`` (default
    :func:`rocmflash.api.incumbent.candidates`) as the dispatch serves it. Both sides pay the same checks and
    dispatch; which side serves is forced in the call's dispatch plan, so what a database says does not matter.

    Each route's forward is gated against an fp32 reference (the tuner's tolerance); then ``rounds`` interleaved
    rounds of ``iters`` back-to-back calls between two events time the forward, and the same for one training step
    (forward and ``torch.autograd.grad`` of q, k, v). Medians in ms: ``triton_ms``/``triton_train_ms`` and per
    backend ``time_ms``/``train_ms``. In the interpreter nothing is timed (gates only). Never raises for a backend
    that refuses the shape."""
    import torch

    from rocmflash.api.incumbent import candidates
    from rocmflash.tuning.live_gate import interpreting
    from rocmflash.messages import error_line

    start, timed = time.perf_counter(), not interpreting()
    held = list(_dense_inputs(torch, problem, torch.device("cuda" if timed else "cpu")))
    causal = bool(problem["causal"])
    results, paths = {}, {}
    with _served_decode(None):  # ROCMFLASH_NO_INCUMBENT unset within; the dispatch plans forgotten on exit
        r = _gated(_dense_route(held, None, causal, False), held, problem["dtype"], error_line)
        result = {"status": r["status"], "error": r["error"], "triton_rel_err": r["rel_err"], "triton_ms": None,
                  "triton_train_ms": None, "backends": results, "timed_on": sdpa_record()}
        if r["status"] == "ok":
            paths["rocmflash"] = _dense_route(held, None, causal, False)
            paths["rocmflash train"] = _dense_route(held, None, causal, True)
        for name in backends or candidates():
            results[name] = _gated(_dense_route(held, name, causal, False), held, problem["dtype"], error_line)
            if results[name]["status"] == "ok":
                paths[name] = _dense_route(held, name, causal, False)
                paths[name + " train"] = _dense_route(held, name, causal, True)
        if timed and "rocmflash" in paths:
            medians = _interleaved_ms(torch, paths, rounds, iters)
            result["triton_ms"] = medians.pop("rocmflash")
            result["triton_train_ms"] = medians.pop("rocmflash train")
            for name, r in results.items():
                if name in medians:
                    r["time_ms"], r["train_ms"] = medians[name], medians[name + " train"]
        else:
            _skip_untimed(results, timed)
    return _finish(torch, result, held, paths, timed, start)


def _dense_inputs(torch, p: dict, device):
    """q ``(B, Hq, S, D)``, k/v ``(B, Hkv, S, D)`` (requiring gradients), the fp32 reference output and an output
    gradient, fresh random (seeded) inputs."""
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    B, Hq, Hkv, S, D = p["batch"], p["heads_q"], p["heads_kv"], p["seqlen"], p["head_dim"]
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, h, S, D, device=device, dtype=dtype, generator=gen).requires_grad_(True)
               for h in (Hq, Hkv, Hkv))
    group = Hq // Hkv
    s = q.detach().float() @ k.detach().float().repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(D)
    if p["causal"]:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=device).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ v.detach().float().repeat_interleave(group, 1)
    return q, k, v, ref, torch.randn(B, Hq, S, D, device=device, dtype=dtype, generator=gen)


def _dense_route(held: list, backend, causal: bool, train: bool):
    """``rocmflash.attention(q, k, v, causal=causal)`` of ``held``'s tensors with the call's dispatch plan told which
    side serves (``backend`` None: the Triton kernels); ``train``: one step, forward and ``torch.autograd.grad``
    of q, k, v (returns the forward's output either way, detached)."""
    import torch

    import rocmflash
    from rocmflash.api import ops

    def call():
        q, k, v = held[0], held[1], held[2]
        ops._call_plan(q, k, causal).pin(backend)  # exactly this side: a backend that refuses fails its gate
        if not train:
            with torch.no_grad():
                return rocmflash.attention(q, k, v, causal=causal)
        out = rocmflash.attention(q, k, v, causal=causal)
        torch.autograd.grad(out, (q, k, v), held[4])
        return out.detach()

    return call


def _decode_inputs(torch, p, device):
    """q ``(B, Hq, Sq, D)`` and k/v ``(B, Hkv, L, D)`` views of ``(B, S, H, D)`` tensors (a model's cache in
    flash-attn's layout), and the fp32 reference of the first two sequences ``(rows, Hq, Sq, D)``."""
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(p.batch, p.seqlen_q, p.heads_q, p.head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(p.batch, p.seqlen_k, p.heads_kv, p.head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(p.batch, p.seqlen_k, p.heads_kv, p.head_dim, device=device, dtype=dtype, generator=gen)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    rows = min(p.batch, 2)
    kr = k[:rows].float().repeat_interleave(p.group, 1)
    vr = v[:rows].float().repeat_interleave(p.group, 1)
    s = q[:rows].float() @ kr.transpose(-1, -2) / math.sqrt(p.head_dim)
    return q, k, v, torch.softmax(s, -1) @ vr


def _gated(fn, held: list, dtype: str, error_line) -> dict:
    """``{"status", "time_ms", "rel_err", "error"}`` of one call of ``fn`` gated (:func:`rocmflash.measure.gate`):
    the output it returns, on its first rows, against the fp32 reference ``held[3]``; ``held``'s q, k, v intact."""
    from rocmflash.measure import gate

    r = {"status": None, "time_ms": None, "rel_err": None, "error": None}
    q, k, v, ref = held[:4]
    try:
        verdict = gate(lambda: {"out": fn()}, {"out": [(slice(None, ref.shape[0]), ref)]}, {},
                       {"q": q, "k": k, "v": v}, dtype)
        r["rel_err"] = None if math.isnan(verdict.rel_err) else round(verdict.rel_err, 6)
        if verdict.passed:
            r["status"] = "ok"
        else:
            r.update(status="incorrect", error=verdict.why)
    except Exception as exc:  # a backend that does not take this shape, dtype or GQA on this GPU
        r.update(status="failed", error=error_line(exc))
    return r


def _route(held: list, backend):
    """``rocmflash.attention(q, k, v)`` of ``held``'s q, k, v, served by SDPA ``backend`` (None: the decode kernel):
    the public call with the call's dispatch plan (:func:`rocmflash.api.ops._call_plan`) told which side serves,
    host time included. The plan is looked up on every call (one dict lookup, on both sides alike)."""
    import rocmflash
    from rocmflash.api import ops

    def call():
        q, k, v = held[0], held[1], held[2]
        ops._call_plan(q, k, False).pin(backend)  # exactly this side: a backend that refuses fails its gate
        return rocmflash.attention(q, k, v)

    return call


class _served_decode:
    """Within: the decode route serves ``config`` (a DecodeConfig dict; None: the run-time selection's) for every
    problem (:meth:`rocmflash.api.select.Selector.override`); ``as served``: ``served(problem)`` -> the config dict
    the route serves for that problem. The kept choices and plans are forgotten on entry and exit (the override
    does it), so no call keeps a config across the swap; and ``ROCMFLASH_NO_INCUMBENT`` is unset within (it would
    keep the SDPA side on the decode kernel)."""

    def __init__(self, config):
        self.config = config

    def __enter__(self):
        import contextlib
        import os

        from rocmflash.api.select import SELECTOR
        from rocmflash.api.selection import NO_INCUMBENT_ENV

        self.env = os.environ.pop(NO_INCUMBENT_ENV, None)
        self.stack = contextlib.ExitStack()
        if self.config is not None:
            self.stack.enter_context(SELECTOR.override("decode", self.config))  # clears on entry and exit
        else:
            SELECTOR.clear()
            self.stack.callback(SELECTOR.clear)
        return self.served

    def served(self, p) -> dict:
        import torch

        from rocmflash.api.select import SELECTOR

        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        problem = dict(head_dim=p.head_dim, dtype=dtype, group=p.group, seqlen_k=p.seqlen_k, batch=p.batch)
        return SELECTOR.choose("decode", problem, device).config.to_dict()

    def __exit__(self, *exc):
        import os

        from rocmflash.api.selection import NO_INCUMBENT_ENV

        self.stack.close()
        if self.env is not None:
            os.environ[NO_INCUMBENT_ENV] = self.env
        return False


def _interleaved_ms(torch, paths: dict, rounds: int, iters: int) -> dict:
    """``{path: median ms per call}`` over ``rounds`` rounds, each timing every path's ``iters`` back-to-back calls
    (after one warm-up call) between two events (:func:`rocmflash.tuning.live_worker.events_ms`), path after path
    (drift hits all alike)."""
    from rocmflash.measure import events_ms

    times = {name: [] for name in paths}
    for _ in range(max(1, rounds)):
        for name, fn in paths.items():
            fn()
            torch.cuda.synchronize()
            times[name].append(events_ms([fn], iters))
    return {name: round(sorted(t)[len(t) // 2], 5) for name, t in times.items()}
