"""The incumbent's worker side: gate and time the platform's SDPA backends (and rocmflash's served
forward+backward) inside a tune's timing worker. What the incumbent is, and the run-time dispatch to it
where it won: :mod:`rocmflash.api.incumbent`; the tune's side of it: :mod:`rocmflash.tuning.incumbents`.
"""

from __future__ import annotations

import math
import time

from rocmflash.api.incumbent import SdpaKernel, sdpa_attention


def measure(task: dict) -> dict:
    """Worker entry (:meth:`rocmflash.tuning.live.LiveRunner.call`): every backend of ``task["backends"]`` gated and
    timed on ``task["shape"]`` with ``task["settings"]``, forward and forward+backward, and rocmflash's served
    forward+backward with ``task["config"]`` beside them. Never raises for a backend that refuses the shape."""
    from rocmflash.config import KernelConfig
    from rocmflash.hw.roofline import Shape
    from rocmflash.tuning.live_gate import gate, interpreting
    from rocmflash.tuning.live_worker import LiveSettings, _median, _time, error_line

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
    return {"status": "ok", "backends": results, "triton_train_ms": triton_train,
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
