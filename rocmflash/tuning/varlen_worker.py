"""The varlen tune's live phase, worker side: packed inputs, the fp32 gate, the timing, the pre-warm.

Runs in the isolated workers of :mod:`rocmflash.tuning.isolated` (one config per task: a crash
or hang costs that config only). Every config runs through
:func:`rocmflash.kernels.varlen.host.launch_forward`, the launch ``flash_attn_varlen_func`` makes, on
the problem's packed batch (:class:`~rocmflash.tuning.varlen.VarlenProblem`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Optional

from rocmflash.tuning.varlen import VarlenProblem

#: timed runs per config (median); the L2 is flushed before each
REPS = 20
#: query rows per fp32 score block of the reference (bounds its memory at 32k keys to 512 MB)
REFERENCE_ROWS = 4096

_INPUTS: dict = {}


def reference_heads(q, k, v, causal: bool, heads: int):
    """fp32 attention of one sequence's first ``heads`` query heads (which share K/V head 0).

    ``q (n, Hq, D)``, ``k/v (n, Hkv, D)`` with as many keys as queries (causal: query ``i``
    sees keys ``<= i``); returns ``(n, heads, D)``. Scores are built ``REFERENCE_ROWS`` rows at
    a time so the longest sequence of a tune fits beside its inputs.
    """
    import torch

    n, d = q.shape[0], q.shape[2]
    k0, v0 = k[:, 0].float(), v[:, 0].float()
    out = torch.empty(n, heads, d, device=q.device, dtype=torch.float32)
    keys = torch.arange(n, device=q.device)
    for h in range(heads):
        for r0 in range(0, n, REFERENCE_ROWS):
            rows = torch.arange(r0, min(n, r0 + REFERENCE_ROWS), device=q.device)
            s = (q[rows, h].float() @ k0.T) / math.sqrt(d)
            if causal:
                s.masked_fill_(keys[None, :] > rows[:, None], float("-inf"))
            out[rows, h] = torch.softmax(s, -1) @ v0
    return out


def gated_sequences(p: VarlenProblem) -> list:
    """Indices of the sequences the gate checks: the shortest and the longest (the ragged edges)."""
    return list(dict.fromkeys((p.lengths.index(min(p.lengths)), p.lengths.index(p.max_seqlen))))


def packed_inputs(p: VarlenProblem, device) -> dict:
    """q, k, v, cu_seqlens, the output buffer, the reference of the gated sequences and an L2 flush
    buffer; kept per problem (every config of a tune reuses them)."""
    import torch

    from rocmflash.measure import flush_buffer

    if _INPUTS.get("problem") != p:
        _INPUTS.clear()
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
        gen = torch.Generator(device=device).manual_seed(0)
        total = sum(p.lengths)
        q = torch.randn(total, p.heads_q, p.head_dim, device=device, dtype=dtype, generator=gen)
        k = torch.randn(total, p.heads_kv, p.head_dim, device=device, dtype=dtype, generator=gen)
        v = torch.randn(total, p.heads_kv, p.head_dim, device=device, dtype=dtype, generator=gen)
        starts = [0, *itertools.accumulate(p.lengths)]
        cu = torch.tensor(starts, dtype=torch.int32, device=device)
        refs = {b: reference_heads(q[starts[b]:starts[b + 1]], k[starts[b]:starts[b + 1]],
                                   v[starts[b]:starts[b + 1]], p.causal, p.group) for b in gated_sequences(p)}
        flush = flush_buffer(device)
        _INPUTS.update(problem=p, q=q, k=k, v=v, cu=cu, starts=starts, out=torch.empty_like(q), refs=refs,
                       flush=flush)
    return _INPUTS


def varlen_call(p: VarlenProblem):
    """The :class:`~rocmflash.kernels.varlen.host.VarlenCall` of the problem (no window, no cap)."""
    from rocmflash.kernels import masks as M
    from rocmflash.kernels.varlen.host import VarlenCall

    return VarlenCall(len(p.lengths), p.heads_q, p.heads_kv, p.head_dim, p.max_seqlen, p.max_seqlen,
                      1 / math.sqrt(p.head_dim), 0.0, M.UNBOUNDED, 0 if p.causal else M.UNBOUNDED)


def gate_reference(inp: dict, p: VarlenProblem) -> dict:
    """The gate's reference (:func:`rocmflash.measure.gate`): the first GQA group of each gated sequence's rows of
    the output against its fp32 reference (the output must be finite everywhere, gated sequence or not)."""
    starts = inp["starts"]
    return {"out": [((slice(starts[b], starts[b + 1]), slice(None, p.group)), ref) for b, ref in inp["refs"].items()]}


def gated(inp: dict, p: VarlenProblem, fill) -> tuple:
    """Let ``fill()`` write the NaN-poisoned output, gate it (:func:`rocmflash.measure.gate`): ``(relative error,
    None)``, or ``(relative error, why it failed)`` past the dtype's tolerance, for a non-finite output or for a
    launch that wrote into the inputs (they are dropped: the next config gets new ones)."""
    from rocmflash.measure import gate

    inputs = {n: inp[n] for n in ("q", "k", "v", "cu")}
    verdict = gate(fill, gate_reference(inp, p), {"out": inp["out"]}, inputs, p.dtype)
    if verdict.inputs_written:
        _INPUTS.clear()
    return verdict.rel_err, (None if verdict.passed else verdict.why)


def measure_varlen(task: dict) -> dict:
    """Gate one config on the packed batch, then time it (runs in the live worker).

    ``task``: ``{"config": KernelConfig dict, "problem": VarlenProblem dict}``. The output is
    NaN-poisoned before the gated run, so a tile that skips rows fails the gate. The time is
    the median of :data:`REPS` launches with the L2 flushed before each (the interpreter: the
    wall clock of one call, never a GPU time).
    """
    import torch

    from rocmflash.config import KernelConfig
    from rocmflash.kernels.varlen import host as VK
    from rocmflash.kernels.common import interpreting
    from rocmflash.measure import time_flushed
    from rocmflash.messages import error_line

    p = VarlenProblem.from_dict(task["problem"])
    result = {"config": task["config"], "status": "failed", "error": None, "rel_err": None, "time_ms": None}
    try:
        cfg = KernelConfig.from_dict(task["config"]).validate()
        interp = interpreting()
        inp = packed_inputs(p, torch.device("cpu" if interp else "cuda"))
        call = varlen_call(p)

        def run():
            VK.launch_forward(call, inp["q"], inp["k"], inp["v"], inp["cu"], inp["cu"], cfg, inp["out"], None)

        result["rel_err"], why = gated(inp, p, run)
        if why is not None:
            result.update(status="incorrect", error=why)
            return result
        ms = time_flushed(run, inp["flush"], task.get("reps", REPS))
        result.update(status="ok", time_ms=ms, tflops=p.flops() / (ms * 1e-3) / 1e12,
                      timing="interpreter" if interp else "gpu")
    except Exception as err:  # compile error, out of resources, launch failure
        result["error"] = error_line(err)
    return result


def measure_varlen_incumbent(task: dict) -> dict:
    """The platform's varlen attention (:mod:`rocmflash.api.varlen_incumbent`) on the problem's packed batch, as
    :func:`measure_varlen` runs a config: the NaN-poisoned output gated against the same fp32 reference, then
    the median of ``task["reps"]`` (:data:`REPS`) calls with the L2 flushed before each. Runs in the live worker
    that timed the configs. Then one training step each (forward and ``torch.autograd.grad`` of q, k, v, flushed
    and timed the same way): torch's function, and rocmflash's varlen forward with ``task["config"]`` (the
    winner) and the backward this process selects -- a backend's backward needs its own forward, so training
    compares whole steps. ``{"status": "ok", "backends": {name: {"status", "time_ms", "train_ms", "rel_err",
    "error"}}, "triton_train_ms", "timed_on"}`` (:func:`rocmflash.api.incumbent.incumbent_field` reads it;
    ``timed_on``: :func:`rocmflash.hw.platform.sdpa_record`); a torch without the function, or a problem it does
    not compute, is ``"skipped"`` with the reason; a step whose backward torch refuses leaves ``train_ms`` None and says why in ``train_error``."""
    import torch

    from rocmflash.api import varlen_incumbent as VI
    from rocmflash.kernels.common import interpreting
    from rocmflash.measure import time_flushed
    from rocmflash.messages import error_line

    p = VarlenProblem.from_dict(task["problem"])
    row = {"status": "failed", "time_ms": None, "train_ms": None, "rel_err": None, "error": None}
    from rocmflash.hw.platform import sdpa_record

    result = {"status": "ok", "backends": {VI.NAME: row}, "triton_train_ms": None, "timed_on": sdpa_record()}
    why = VI.excludes(p.causal, True, p.group, p.head_dim, None)
    if why is not None:
        row.update(status="skipped", error=why)
        return result
    reps = task.get("reps", REPS)
    try:
        inp = packed_inputs(p, torch.device("cpu" if interpreting() else "cuda"))

        def run():
            return VI.run(inp["q"], inp["k"], inp["v"], inp["cu"], inp["cu"], p.max_seqlen, p.max_seqlen, p.causal,
                          None)

        row["rel_err"], why = gated(inp, p, lambda: inp["out"].copy_(run()))
        if why is not None:
            row.update(status="incorrect", error=why)
            return result
        row.update(status="ok", time_ms=time_flushed(run, inp["flush"], reps))
    except Exception as err:  # this torch refuses the inputs (a dtype, a head dim, the device)
        row["error"] = error_line(err)
        return result
    try:
        row["train_ms"] = _train_step_ms(inp, lambda q, k, v: VI.run(q, k, v, inp["cu"], inp["cu"], p.max_seqlen,
                                                                     p.max_seqlen, p.causal, None), reps)
    except Exception as err:  # a torch whose varlen function has no backward for these inputs
        row["train_error"] = error_line(err)
    if task.get("config"):
        result["triton_train_ms"] = _train_step_ms(inp, _rocmflash_forward(p, task["config"], inp["cu"]), reps)
    return result


def _rocmflash_forward(p: VarlenProblem, config: dict, cu):
    """rocmflash's differentiable varlen forward with ``config`` (its backward as this process selects it)."""
    from rocmflash.api.varlen_kernel import _VarlenAttention
    from rocmflash.config import KernelConfig

    cfg, call = KernelConfig.from_dict(config), varlen_call(p)
    return lambda q, k, v: _VarlenAttention.apply(q, k, v, cu, cu, call, cfg, False)[0]


def _train_step_ms(inp: dict, forward, reps: int) -> float:
    """Median ms of one step, ``forward`` then ``torch.autograd.grad`` of q, k and v, the L2 flushed before each."""
    import torch

    from rocmflash.measure import time_flushed

    q, k, v = (inp[name].detach().requires_grad_(True) for name in ("q", "k", "v"))
    dout = torch.randn_like(inp["q"])

    def step():
        torch.autograd.grad(forward(q, k, v), (q, k, v), dout)

    return time_flushed(step, inp["flush"], reps)


#: tokens of the pre-warm's one sequence
PREWARM_TOKENS = 16


def prewarm_specs(p: VarlenProblem, names=("q", "k", "v", "out")) -> dict:
    """Pre-warm stand-ins ``{name: (dims, bytes of the timed tensor)}`` of one :data:`PREWARM_TOKENS`-token
    sequence: ``q``-like names (``q``, ``out``, ``do``, ``dq``) ``(16, Hq, D)``, the others ``(16, Hkv, D)``,
    each standing for the tensor of the whole packed batch (whose side of the 2 GiB line it keeps)."""
    total = sum(p.lengths)
    specs = {}
    for name in names:
        heads = p.heads_q if name in ("q", "out", "do", "dq") else p.heads_kv
        specs[name] = ((PREWARM_TOKENS, heads, p.head_dim), 2 * total * heads * p.head_dim)
    return specs


def prewarm_varlen(task: dict) -> Optional[str]:
    """Build one config's binary at the problem's specialisation (runs in a pre-warm worker).

    One launch on a single 16-token sequence of the same heads and head dim: the strides and
    integer arguments Triton specialises on are those of the problem (lengths are read from
    ``cu_seqlens`` on the device), and each tensor is on the packed batch's side of the 2 GiB line
    (:func:`prewarm_specs`), so the timing worker finds the binary in Triton's cache.
    Returns None or the error.
    """
    import torch

    from rocmflash.config import KernelConfig
    from rocmflash.kernels.varlen import host as VK
    from rocmflash.messages import error_line
    from rocmflash.tuning.live_gate import pads_storage, stand_ins

    try:
        full = VarlenProblem.from_dict(task["problem"])
        p = dataclasses.replace(full, lengths=(PREWARM_TOKENS,))
        dev = torch.device("cuda")
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
        t = stand_ins(prewarm_specs(full), dtype, dev, pads_storage())
        cu = torch.tensor([0, PREWARM_TOKENS], dtype=torch.int32, device=dev)
        VK.launch_forward(varlen_call(p), t["q"], t["k"], t["v"], cu, cu, KernelConfig.from_dict(task["config"]),
                          t["out"], None)
        torch.cuda.synchronize()
        return None
    except Exception as err:
        return error_line(err, 200)


__all__ = ["measure_varlen", "measure_varlen_incumbent", "prewarm_varlen", "packed_inputs", "reference_heads", "gated_sequences", "varlen_call"]
