"""``rocmflash tune --pass bwd``: tune the backward's two kernels (dK/dV and dQ) per problem.

The backward is two independent launches (:mod:`rocmflash.kernels.backward.host`): ``_bwd_dq``
(which also writes ``delta``) and ``_bwd_dkdv``. Each gets its own config space -- the
block a program owns, the block it loops over, warps, stages and, on AMD, ``waves_per_eu``
-- and the same static phase as the forward: cross-compiled for the target arch on the
CPU, read by :mod:`isa_tools`, pruned by :mod:`rocmflash.static.prune` (spills, LDS, occupancy,
cliffs, duplicate binaries), with a reason per verdict. Only on the live GPU are the
survivors gated against an fp32 reference gradient and timed, each kernel on its own
(their times add up: the best pair is the best of each), the dK/dV kernel at every
``head_splits`` that divides the GQA group (a launch argument: one binary serves all).
Backward kernels are few and cheap to time, so every survivor is measured -- no ranking
decides alone -- and the per-arch default is always timed beside them, so each entry
says what tuning gained.

Entries live in the GPU's config database under ``bwd-<forward key>`` (e.g.
``bwd-d128-bf16-causal-gqa1-s4096``) with ``"mode": "bwd"``; forward lookups skip them.
At run time :func:`rocmflash.db.lookups.backward.lookup_bwd` serves the measured entry of the same head dim, dtype,
causal flag and GQA ratio with the nearest sequence-length bucket; its ``head_splits`` is
kept only in its own bucket (elsewhere it is chosen per call). Without a live GPU of the
named kind, the static #1 of each kernel is written with ``"measured": false``, never served.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional

from rocmflash.config import KernelConfig, Problem
# the entry keys and the run-time lookup live on the run-time side (rocmflash.db.lookups.backward); bwd_key stays
# importable from here for benchmarks/bwd_tune.py
from rocmflash.db.lookups.backward import bwd_key  # noqa: F401

#: the two kernels, in launch order
KERNELS = ("dq", "dkdv")
#: head_splits values timed for the dK/dV kernel (the divisors of the GQA group among these)
HEAD_SPLIT_CHOICES = (1, 2, 4, 8)


# ----------------------------------------------------------------------------- keys


# ----------------------------------------------------------------------------- space and compile
def owned_and_looped(config: dict) -> tuple:
    """``(owned block, looped block)``: dK/dV owns keys (``BLOCK_N``), dQ owns queries (``BLOCK_M``)."""
    if config["kernel"] == "dkdv":
        return config["BLOCK_N"], config["BLOCK_M"]
    return config["BLOCK_M"], config["BLOCK_N"]


def kernel_config(config: dict) -> KernelConfig:
    """The :class:`KernelConfig` of one space point (the ``kernel`` key dropped)."""
    return KernelConfig.from_dict({k: v for k, v in config.items() if k != "kernel"})


def bwd_space(arch: str, head_dim: int) -> list:
    """The backward space of an arch: per kernel, owned x looped blocks x warps x stages (x AMD waves_per_eu).

    D > 128 halves the owned block (two fp32 ``owned x D`` accumulators live in registers).
    8 warps only with an owned block of at least 64 rows (fewer leave warps without rows).
    AMD: ``num_stages=1`` (as its forward space; AMD's guidance for fused GEMM chains) and
    ``waves_per_eu`` 0 (no hint), 1 and 2.
    """
    amd = arch.startswith("gfx")
    owned = (32, 64, 128) if head_dim <= 128 else (16, 32, 64)
    stages = (1,) if amd else (1, 2, 3)
    waves = (0, 1, 2) if amd else (0,)
    points = []
    for kernel in KERNELS:
        for own in owned:
            for loop in (16, 32, 64):
                for warps in (4, 8):
                    if warps == 8 and own < 64:
                        continue
                    for s in stages:
                        for wpe in waves:
                            m, n = (loop, own) if kernel == "dkdv" else (own, loop)
                            points.append(dict(kernel=kernel, BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=s,
                                               waves_per_eu=wpe))
    return points


def task_compile_options(config: dict, backend: str) -> dict:
    return kernel_config(config).compile_options(backend)


def compile_task(target, config: dict, problem: dict):
    """Family entry for :func:`rocmflash.static.compile.sweep_family`: the named backward kernel for ``target``."""
    from rocmflash.kernels.backward.host import compile_kernel_for

    return (compile_kernel_for(target, config["kernel"], kernel_config(config), Problem.from_dict(problem)),)


# ----------------------------------------------------------------------------- static phase
def _static_key(config: dict, kernel: dict, amd: bool, index: int) -> tuple:
    """Order of the survivors (smaller first); it orders the timing and picks the unmeasured #1.

    AMD: 2 waves/SIMD first (as AMD's forward defaults), then larger owned and looped blocks
    (operand reuse), then occupancy. NVIDIA: occupancy, fewer registers, larger owned block.
    """
    waves = kernel.get("waves_per_simd") or 0
    vgprs = kernel.get("allocated_vgprs") or kernel.get("vgpr_count") or 10 ** 6
    own, loop = owned_and_looped(config)
    if amd:
        return (waves < 2, -own, -loop, -waves, vgprs, index)
    return (-waves, vgprs, -own, -loop, index)


@dataclasses.dataclass
class BwdStatic:
    problem: object  #: a Problem (dense backward) or a VarlenProblem (the varlen backward)
    rows: list  #: per config: {"config", "kept", "reason", "detail", "static_rank", "kernel": summary}
    stats: object

    def ranked(self, kernel: str) -> list:
        """The kept rows of one kernel (``"dkdv"`` or ``"dq"``), best static rank first."""
        return sorted((r for r in self.rows if r["kept"] and r["config"]["kernel"] == kernel),
                      key=lambda r: r["static_rank"])

    def of(self, kernel: str) -> list:
        return [r for r in self.rows if r["config"]["kernel"] == kernel]


def rank_each_kernel(gpu, configs: list, observations: list, settings=None) -> list:
    """The static phase's rows of a backward space (:func:`rocmflash.static.families.family_rows`): each kernel's
    configs pruned and ranked on their own, so "every config pruned" falls back per kernel."""
    from rocmflash.static.families import family_rows
    from rocmflash.static.prune import PruneSettings, prune

    amd = gpu.arch.startswith("gfx")
    rows = []
    for kernel in KERNELS:
        index = [i for i, c in enumerate(configs) if c["kernel"] == kernel]
        sub = [observations[i] for i in index]

        def key(config, obs, j, index=index):
            return _static_key(config, obs["kernels"][0] if obs.get("kernels") else {}, amd, index[j])

        rows += family_rows([configs[i] for i in index], sub, prune(sub, settings or PruneSettings()), key)
    return rows


def static_phase(gpu, problem: Problem, cache_dir=None, workers=None, settings=None,
                 configs: Optional[list] = None, on_configs=None, on_result=None) -> BwdStatic:
    """Cross-compile the backward space for ``gpu``'s arch, prune each kernel's configs, rank (no GPU).
    ``on_configs(configs)``: what is compiled, before it is; ``on_result(observation)``: each compile result as it
    arrives (a streamed static phase)."""
    from rocmflash.static.compile import sweep_family

    configs = configs if configs is not None else bwd_space(gpu.arch, problem.head_dim)
    if on_configs is not None:
        on_configs(configs)
    observations, stats = sweep_family("backward", configs, problem.to_dict(), gpu, cache_dir, workers,
                                       on_result=on_result)
    return BwdStatic(problem, rank_each_kernel(gpu, configs, observations, settings), stats)


# ----------------------------------------------------------------------------- run-time lookup


# ----------------------------------------------------------------------------- live phase (worker side)
def split_choices(group: int) -> list:
    """``head_splits`` timed for the dK/dV kernel: the divisors of the GQA group up to 8."""
    return [s for s in HEAD_SPLIT_CHOICES if group % s == 0]


_INPUTS: dict = {}


def reference_grads(q, k, v, do, causal: bool, scale: float):
    """fp32 dQ of the first batch's first GQA group and dK, dV of its first key/value head.

    One query head at a time (an ``Sq x Sk`` fp32 score matrix each), bottom-right causal;
    rows that see no key get zero gradients.
    """
    import torch

    group = q.shape[1] // k.shape[1]
    Sq, Sk = q.shape[2], k.shape[2]
    k0, v0 = k[0, 0].float(), v[0, 0].float()
    dk, dv = torch.zeros_like(k0), torch.zeros_like(v0)
    dqs = []
    mask = None
    if causal:
        mask = torch.arange(Sk, device=q.device)[None, :] > torch.arange(Sq, device=q.device)[:, None] + (Sk - Sq)
    for h in range(group):
        qh, doh = q[0, h].float(), do[0, h].float()
        s = (qh @ k0.T) * scale
        if mask is not None:
            s.masked_fill_(mask, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num_(0.0)
        del s
        o = p @ v0
        dv += p.T @ doh
        dp = doh @ v0.T
        ds = p * (dp - (doh * o).sum(-1, keepdim=True))
        del dp, p
        dqs.append((ds @ k0) * scale)
        dk += (ds.T @ qh) * scale
        del ds
    return torch.stack(dqs), dk, dv


def _bwd_inputs(shape, device):
    """q, k, v, dO, the forward's out and LSE, delta, the fp32 reference and an L2 flush buffer (per shape)."""
    import torch

    from rocmflash.measure import flush_buffer

    if _INPUTS.get("shape") != shape:
        _INPUTS.clear()
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[shape.dtype]
        gen = torch.Generator(device=device).manual_seed(int.from_bytes(os.urandom(7), "little"))

        def rand(heads, seqlen):
            return torch.randn(shape.batch, heads, seqlen, shape.head_dim, device=device, dtype=dtype, generator=gen)

        q, do = rand(shape.heads_q, shape.seqlen_q), rand(shape.heads_q, shape.seqlen_q)
        k, v = rand(shape.heads_kv, shape.seqlen_k), rand(shape.heads_kv, shape.seqlen_k)
        scale = 1.0 / math.sqrt(shape.head_dim)
        out, lse, delta, dq = _forward_and_delta(q, k, v, do, shape, scale)
        ref = reference_grads(q, k, v, do, shape.causal, scale)
        flush = flush_buffer(device)
        _INPUTS.update(shape=shape, q=q, k=k, v=v, do=do, out=out, lse=lse, delta=delta, scale=scale, ref=ref,
                       flush=flush, dq=dq, dk=torch.empty_like(k), dv=torch.empty_like(v))
    return _INPUTS


#: the config key of the pre-warm task that builds what a backward measurement's inputs need (:func:`prewarm_bwd`)
INPUTS = "inputs"


def _forward_and_delta(q, k, v, do, shape, scale: float) -> tuple:
    """``(out, lse, delta, dq)`` of a backward measurement's inputs: the forward by a fixed config (the online
    kernel's generic default; any correct forward would do) and delta by the default dQ config, both built by the
    :data:`INPUTS` pre-warm before the first measurement needs them (a worker's first backward job had compiled them:
    +4-5.6 s on the 2-GPU H200 tune of 2026-11-26, once per worker and problem)."""
    import torch

    from rocmflash.config import default_config
    from rocmflash.kernels.backward import host as bw
    from rocmflash.kernels.forward import online as online
    from rocmflash.kernels.common import torch_backend

    B, Hq, Sq, _ = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    online.launch(q, k, v, default_config(None, shape.head_dim), shape.causal, scale, out, lse)
    delta = torch.empty(lse.shape, device=q.device, dtype=torch.float32)
    dq = torch.empty_like(q)
    bw.launch_dq(q, k, v, out, do, lse, None, delta, dq, shape.causal, scale,
                 bw.default_bwd_config(None, shape.head_dim).dq, torch_backend())
    return out, lse, delta, dq


def _gated_parts(inp: dict, kernel: str, group: int) -> tuple:
    """``(outputs, reference, inputs)`` of one kernel's gate (:func:`rocmflash.measure.gate`): dQ, or dK and dV,
    whole (every element must be written) and compared on their first GQA group / K/V head with the fp32 reference
    gradients; the inputs the launch reads (delta only for dK/dV: the dQ kernel writes it)."""
    ref_dq, ref_dk, ref_dv = inp["ref"]
    if kernel == "dq":
        return ({"dq": inp["dq"]}, {"dq": [((0, slice(None, group)), ref_dq)]},
                {n: inp[n] for n in ("q", "k", "v", "do", "out", "lse")})
    return ({"dk": inp["dk"], "dv": inp["dv"]}, {"dk": [((0, 0), ref_dk)], "dv": [((0, 0), ref_dv)]},
            {n: inp[n] for n in ("q", "k", "v", "do", "lse", "delta")})


def measure_bwd(task: dict) -> dict:
    """Gate one backward kernel config against the fp32 reference gradient, then time it (live worker).

    ``task``: ``{"config": space point, "shape": Shape dict, "reps": n}``. The dK/dV kernel is
    gated at the fewest and most head splits and timed at each; dQ once (``times_ms["1"]``).
    Each time is the larger of the GPU time (L2 flushed before every run, ``gpu_ms``) and the
    time per call of back-to-back calls (``call_ms``: host cost included, as a training loop
    sees it) -- a head split's extra allocations and reductions cost host time that a
    host-bound step pays in full.
    """
    import torch

    from rocmflash.hw.roofline import Shape
    from rocmflash.kernels.backward import host as bw
    from rocmflash.kernels.common import interpreting, torch_backend
    from rocmflash.measure import back_to_back_ms, time_flushed
    from rocmflash.measure import gate
    from rocmflash.messages import error_line
    from rocmflash.tuning.live_worker import interpreted_shape

    shape = Shape.from_dict(task["shape"])
    kernel = task["config"]["kernel"]
    result = {"config": task["config"], "status": "failed", "error": None, "rel_err": None, "times_ms": {}}
    try:
        cfg = kernel_config(task["config"])
        interp = interpreting()
        if interp:
            shape = interpreted_shape(shape)
        inp = _bwd_inputs(shape, torch.device("cpu" if interp else "cuda"))
        backend = torch_backend()
        q, k, v, do, out, lse, delta, scale = (inp[n] for n in ("q", "k", "v", "do", "out", "lse", "delta", "scale"))
        group = shape.heads_q // shape.heads_kv
        splits = split_choices(group) if kernel == "dkdv" else [1]

        def run(n):
            if kernel == "dq":
                bw.launch_dq(q, k, v, out, do, lse, None, delta, inp["dq"], shape.causal, scale, cfg, backend)
            else:
                bw.launch_dkdv(q, k, v, do, lse, delta, inp["dk"], inp["dv"], shape.causal, scale, cfg, n, backend)

        outputs, reference, inputs = _gated_parts(inp, kernel, group)
        for n in dict.fromkeys((splits[0], splits[-1])):  # the gate, on NaN-poisoned outputs
            verdict = gate(lambda n=n: run(n), reference, outputs, inputs, shape.dtype)
            err = verdict.rel_err
            result["rel_err"] = err if result["rel_err"] is None else max(result["rel_err"], err)
            if not verdict.passed:
                result.update(status="incorrect", error=f"{verdict.why} (head_splits={n})")
                if kernel == "dq" or verdict.inputs_written:  # delta is the dQ kernel's output too: rebuild it
                    _INPUTS.clear()
                return result
        result["gpu_ms"], result["call_ms"] = {}, {}
        for n in splits:
            gpu = time_flushed(lambda n=n: run(n), inp["flush"], task.get("reps", 20))
            # a call's host cost counts where it exceeds the GPU work (small problems, extra ops of a head
            # split): the time that ranks a config is the larger of the two
            call = back_to_back_ms(lambda n=n: run(n), task.get("reps", 20)) if inp["flush"] is not None else gpu
            result["gpu_ms"][str(n)], result["call_ms"][str(n)] = gpu, call
            result["times_ms"][str(n)] = max(gpu, call)
        result["status"] = "ok"
    except Exception as err:  # compile error, out of resources, launch failure
        result["error"] = error_line(err)
        _INPUTS.clear()
    return result


def prewarm_specs(shape) -> tuple[dict, dict]:
    """The pre-warm launch's stand-ins ``(half-precision, fp32)``, each ``{name: (dims, bytes of the timed
    tensor)}``: batch 1 of the shape's heads, lengths and head dim, each standing for the tensor of the
    whole batch (:func:`rocmflash.tuning.live_gate.stand_ins` keeps its side of the 2 GiB line)."""
    from rocmflash.tuning.live_gate import tensor_bytes

    q_real, kv_real = tensor_bytes(shape)
    q_dims = (1, shape.heads_q, shape.seqlen_q, shape.head_dim)
    kv_dims = (1, shape.heads_kv, shape.seqlen_k, shape.head_dim)
    half = {name: (q_dims, q_real) for name in ("q", "do", "out", "dq")}
    half.update({name: (kv_dims, kv_real) for name in ("k", "v", "dk", "dv")})
    rows = (q_dims[:3], 4 * shape.batch * shape.heads_q * shape.seqlen_q)
    return half, {"lse": rows, "delta": rows}


def prewarm_bwd(task: dict) -> Optional[str]:
    """Build one config's binary at the problem's specialisation (pre-warm worker): one launch on a
    batch-1 problem of the same heads, lengths and head dim (the same strides' specialisation), each
    tensor on the timed tensor's side of the 2 GiB line (:func:`prewarm_specs`), at one and at several
    head splits (Triton makes ``== 1`` a constant). ``{"kernel": INPUTS}``: the forward and delta that the
    measurements' inputs are made with (:func:`_forward_and_delta`). Returns None or the error."""
    import torch

    from rocmflash.hw.roofline import Shape
    from rocmflash.kernels.backward import host as bw
    from rocmflash.kernels.common import torch_backend
    from rocmflash.messages import error_line
    from rocmflash.tuning.live_gate import pads_storage, stand_ins

    try:
        shape = Shape.from_dict(task["shape"])
        dev = torch.device("cuda")
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[shape.dtype]
        half, rows = prewarm_specs(shape)
        t = {**stand_ins(half, dtype, dev, pads_storage()), **stand_ins(rows, torch.float32, dev, pads_storage())}
        q, k, v, do, out, lse, delta = (t[n] for n in ("q", "k", "v", "do", "out", "lse", "delta"))
        lse.zero_()
        delta.zero_()
        scale = 1.0 / math.sqrt(shape.head_dim)
        if task["config"]["kernel"] == INPUTS:  # the forward and delta every measurement's inputs start with
            _forward_and_delta(q, k, v, do, shape, scale)
            torch.cuda.synchronize()
            return None
        cfg = kernel_config(task["config"])
        if task["config"]["kernel"] == "dq":
            bw.launch_dq(q, k, v, out, do, lse, None, delta, t["dq"], shape.causal, scale, cfg, torch_backend())
        else:
            for n in dict.fromkeys((1, split_choices(shape.heads_q // shape.heads_kv)[-1])):
                bw.launch_dkdv(q, k, v, do, lse, delta, t["dk"], t["dv"], shape.causal, scale, cfg, n,
                               torch_backend())
        torch.cuda.synchronize()
        return None
    except Exception as err:
        return error_line(err, 200)


__all__ = ["KERNELS", "bwd_space", "kernel_config", "static_phase", "rank_each_kernel", "BwdStatic",
           "reference_grads", "measure_bwd", "prewarm_bwd", "split_choices", "INPUTS"]
