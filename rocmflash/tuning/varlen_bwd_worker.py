"""The varlen backward tune's live phase, worker side: packed inputs, the fp32 gate, the timing, the pre-warm.

Runs in the isolated workers of :mod:`rocmflash.tuning.isolated` (one config per task: a crash or
hang costs that config only). Each task is one kernel's config (a point of the backward space:
``{"kernel": "dq" | "dkdv", ...}``), run through :func:`rocmflash.kernels.varlen.host.launch_dq` or
:func:`~rocmflash.kernels.varlen.host.launch_dkdv`, the launches ``flash_attn_varlen_func``'s backward
makes, on the problem's packed batch (:class:`~rocmflash.tuning.varlen.VarlenProblem`).

The forward's output and LSE come from ``flash_attn_varlen_func`` itself; ``delta = rowsum(dO * O)``
is computed in torch, so the dK/dV configs read a delta no config under test wrote, and the dQ
configs are gated on the delta they write as well as on dQ.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from typing import Optional

from rocmflash.tuning.varlen import VarlenProblem
from rocmflash.tuning.varlen_worker import REPS, gated_sequences, varlen_call

_INPUTS: dict = {}


def _sequence_grads(q, k, v, do, causal: bool, scale: float):
    """fp32 reference gradients of one packed sequence (``(n, H, D)`` views): dQ of the first GQA group as
    ``(n, group, D)``, dK and dV of key/value head 0 as ``(n, D)``."""
    from rocmflash.tuning.backward import reference_grads

    dq, dk, dv = reference_grads(*(t.transpose(0, 1)[None] for t in (q, k, v, do)), causal, scale)
    return dq.transpose(0, 1), dk, dv


def backward_inputs(p: VarlenProblem, device) -> dict:
    """Fresh random q, k, v, dO of the packed batch, the forward's output and LSE, delta, the fp32 reference
    gradients of the gated sequences, output buffers and an L2 flush buffer; kept per problem (every config
    a worker times reuses them)."""
    import torch

    import rocmflash
    from rocmflash.measure import flush_buffer

    if _INPUTS.get("problem") != p:
        _INPUTS.clear()
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
        gen = torch.Generator(device=device).manual_seed(int.from_bytes(os.urandom(7), "little"))
        total = sum(p.lengths)

        def rand(heads):
            return torch.randn(total, heads, p.head_dim, device=device, dtype=dtype, generator=gen)

        q, do, k, v = rand(p.heads_q), rand(p.heads_q), rand(p.heads_kv), rand(p.heads_kv)
        starts = [0, *itertools.accumulate(p.lengths)]
        cu = torch.tensor(starts, dtype=torch.int32, device=device)
        out, lse = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, p.max_seqlen, p.max_seqlen, causal=p.causal,
                                                    return_lse=True)
        delta = (do.float() * out.float()).sum(-1).T.contiguous()  # (Hq, total), as the dQ kernel computes it
        scale = 1.0 / math.sqrt(p.head_dim)
        refs = {b: _sequence_grads(*(t[starts[b]:starts[b + 1]] for t in (q, k, v, do)), p.causal, scale)
                for b in gated_sequences(p)}
        flush = flush_buffer(device)
        _INPUTS.update(problem=p, q=q, k=k, v=v, do=do, cu=cu, starts=starts, out=out, lse=lse, delta=delta,
                       refs=refs, flush=flush, dq=torch.empty_like(q), dk=torch.empty_like(k),
                       dv=torch.empty_like(v), delta_out=torch.empty_like(delta))
    return _INPUTS


def gate_parts(inp: dict, p: VarlenProblem, kernel: str) -> tuple:
    """``(outputs, reference, inputs)`` of one kernel's gate (:func:`rocmflash.measure.gate`): ``{"dq", "delta"}``
    (dQ of the first GQA group of each gated sequence, and the whole delta it wrote) or ``{"dk", "dv"}`` (key/value
    head 0 of each gated sequence) against the fp32 reference, every output finite in the whole packed batch; the
    inputs the launch reads (delta only for dK/dV: the dQ kernel writes its own, ``delta_out``)."""
    starts, refs = inp["starts"], inp["refs"]
    rows = {b: slice(starts[b], starts[b + 1]) for b in refs}
    reads = ("do", "q", "k", "v", "out", "lse", "cu")
    if kernel == "dq":
        return ({"dq": inp["dq"], "delta": inp["delta_out"]},
                {"dq": [((rows[b], slice(None, p.group)), r[0]) for b, r in refs.items()], "delta": inp["delta"]},
                {n: inp[n] for n in reads})
    return ({"dk": inp["dk"], "dv": inp["dv"]},
            {"dk": [((rows[b], 0), r[1]) for b, r in refs.items()],
             "dv": [((rows[b], 0), r[2]) for b, r in refs.items()]},
            {n: inp[n] for n in (*reads, "delta")})


def _launcher(inp: dict, call, kernel: str, cfg):
    """The launch a config of ``kernel`` makes on the packed inputs (no LSE gradient, as a plain backward)."""
    from rocmflash.kernels.varlen import host as VK

    if kernel == "dq":
        return lambda: VK.launch_dq(call, inp["do"], inp["q"], inp["k"], inp["v"], inp["out"], inp["lse"], None,
                                    inp["delta_out"], inp["dq"], inp["cu"], inp["cu"], cfg)
    return lambda: VK.launch_dkdv(call, inp["do"], inp["q"], inp["k"], inp["v"], inp["lse"], inp["delta"], inp["dk"],
                                  inp["dv"], inp["cu"], inp["cu"], cfg)


def measure_varlen_bwd(task: dict) -> dict:
    """Gate one backward kernel config on the packed batch, then time it (runs in the live worker).

    ``task``: ``{"config": backward space point, "problem": VarlenProblem dict}``. The kernel's outputs
    are NaN-poisoned before the gated run, so a tile that skips rows fails the gate; ``rel_errs`` holds
    the error of each output (:func:`gate_parts`), ``rel_err`` the worst. The time
    (``times_ms["1"]``: the dense backward tune's result format, one entry as there are no head splits)
    is the median of :data:`~rocmflash.tuning.varlen_worker.REPS` launches with the L2 flushed before
    each (the interpreter: the wall clock of one call, never a GPU time).
    """
    import torch

    from rocmflash.kernels.common import interpreting
    from rocmflash.tuning.backward import kernel_config
    from rocmflash.measure import time_flushed
    from rocmflash.measure import gate
    from rocmflash.messages import error_line

    p = VarlenProblem.from_dict(task["problem"])
    kernel = task["config"]["kernel"]
    result = {"config": task["config"], "status": "failed", "error": None, "rel_err": None, "times_ms": {}}
    try:
        cfg = kernel_config(task["config"]).validate()
        interp = interpreting()
        inp = backward_inputs(p, torch.device("cpu" if interp else "cuda"))
        run = _launcher(inp, varlen_call(p), kernel, cfg)
        outputs, reference, reads = gate_parts(inp, p, kernel)
        verdict = gate(run, reference, outputs, reads, p.dtype, against="the fp32 reference gradient")
        result.update(rel_err=verdict.rel_err, rel_errs=verdict.errors)
        if not verdict.passed:
            worst = ", ".join(f"{o} {e:.3g}" for o, e in verdict.errors.items())
            result.update(status="incorrect", error=f"{verdict.why} ({worst})")
            if verdict.inputs_written:
                _INPUTS.clear()
            return result
        result["times_ms"]["1"] = time_flushed(run, inp["flush"], task.get("reps", REPS))
        result.update(status="ok", timing="interpreter" if interp else "gpu")
    except Exception as err:  # compile error, out of resources, launch failure
        result["error"] = error_line(err)
        _INPUTS.clear()
    return result


def prewarm_varlen_bwd(task: dict) -> Optional[str]:
    """Build one kernel config's binary at the problem's specialisation (runs in a pre-warm worker).

    One launch on a single 16-token sequence of the same heads and head dim, each tensor on the
    packed batch's side of the 2 GiB line (:func:`~rocmflash.tuning.varlen_worker.prewarm_specs`), with
    LSE and delta buffers as wide as the problem's packed batch (their row stride is an argument Triton
    specialises on), so the timing worker finds the binary in Triton's cache. Returns None or the error.
    """
    import torch

    from rocmflash.tuning.backward import kernel_config
    from rocmflash.messages import error_line
    from rocmflash.tuning.live_gate import pads_storage, stand_ins
    from rocmflash.tuning.varlen_worker import PREWARM_TOKENS, prewarm_specs

    try:
        full = VarlenProblem.from_dict(task["problem"])
        p = dataclasses.replace(full, lengths=(PREWARM_TOKENS,))
        dev = torch.device("cuda")
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
        inp = stand_ins(prewarm_specs(full, ("q", "do", "out", "dq", "k", "v", "dk", "dv")), dtype, dev,
                        pads_storage())
        lse, delta = (torch.zeros(p.heads_q, sum(full.lengths), device=dev, dtype=torch.float32) for _ in range(2))
        inp.update(lse=lse, delta=delta, delta_out=delta,
                   cu=torch.tensor([0, PREWARM_TOKENS], dtype=torch.int32, device=dev))
        _launcher(inp, varlen_call(p), task["config"]["kernel"], kernel_config(task["config"]))()
        torch.cuda.synchronize()
        return None
    except Exception as err:
        return error_line(err, 200)


__all__ = ["measure_varlen_bwd", "prewarm_varlen_bwd", "backward_inputs", "gate_parts"]
