"""The live runner's numeric gate: a config must compute attention before it is timed.

Fresh random inputs of the tuned shape with batch 1
(every head, so the gate runs the very kernel that is timed), drawn from a new seed when
a worker first gates that shape and kept, with their fp32 reference (TF32 off), for every
config the worker gates on it: the reference of a long sequence costs more than the
config's own measurement (~0.19 s at S=16k, 32 heads, on an H100), and a race gates its
finalists again in every pass. Each config's output is poisoned with NaN first; every
element must be finite and the relative error ``||out - ref|| / ||ref||`` must be
<= 1e-2 (fp16) or 2e-2 (bf16), and the kernel must have left its inputs as they were (the
next configs are gated on them). A config that fails is ``incorrect`` and is never timed.
Runs in the live runner's worker (:mod:`rocmflash.live`).
"""

from __future__ import annotations

import math
import os

from rocmflash.config import KernelConfig
from rocmflash.roofline import Shape

TOLERANCE = {"fp16": 1e-2, "bf16": 2e-2}


def interpreting() -> bool:
    """Whether the workers run kernels in Triton's interpreter (``TRITON_INTERPRET``, read at call time)."""
    from rocmflash.kernels.common import interpreting

    return interpreting()


def device():
    """Where a worker's tensors live: the GPU, or the CPU under the interpreter."""
    import torch

    return torch.device("cpu" if interpreting() else "cuda")


def synchronize() -> None:
    """Wait for the device (nothing to wait for under the interpreter)."""
    import torch

    if not interpreting():  # interpreted launches are synchronous
        torch.cuda.synchronize()


def torch_dtype(torch, name: str):
    """The torch dtype of ``"fp16"`` / ``"bf16"``."""
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def reference(q, k, v, causal: bool, scale: float):
    """fp32 attention per (batch, head), bottom-right causal, GQA by head grouping."""
    import torch

    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    mask = None
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        mask = j > i + (Sk - Sq)
    for b in range(B):
        for h in range(Hq):
            s = (q[b, h].float() @ k[b, h // group].float().T) * scale
            if mask is not None:
                s.masked_fill_(mask, float("-inf"))
            p = torch.softmax(s, dim=-1).nan_to_num_(0.0)
            out[b, h] = p @ v[b, h // group].float()
    return out


_GATE: dict = {}


def gate_inputs(shape: Shape):
    """``(q, k, v, fp32 reference)`` of the gate for ``shape``: drawn from a fresh seed the first time this
    worker gates the shape, then kept (with the reference) for every config it gates on it."""
    import torch

    if _GATE.get("shape") != shape:
        _GATE.clear()
        dev = device()
        dtype = torch_dtype(torch, shape.dtype)
        gen = torch.Generator(device=dev)
        gen.manual_seed(int.from_bytes(os.urandom(7), "little"))
        # one batch, all heads: the gate must launch the very kernel that is timed (Triton
        # specialises the head count on % 16 and == 1, so fewer heads could compile another one)
        hkv, hq = shape.heads_kv, shape.heads_q
        q = torch.randn(1, hq, shape.seqlen_q, shape.head_dim, device=dev, dtype=dtype, generator=gen)
        k = torch.randn(1, hkv, shape.seqlen_k, shape.head_dim, device=dev, dtype=dtype, generator=gen)
        v = torch.randn(1, hkv, shape.seqlen_k, shape.head_dim, device=dev, dtype=dtype, generator=gen)
        ref = reference(q, k, v, shape.causal, 1.0 / math.sqrt(shape.head_dim))
        _GATE.update(shape=shape, tensors=(q, k, v, ref), fingerprint=_fingerprint((q, k, v)))
    return _GATE["tensors"]


def _fingerprint(tensors) -> list:
    """Sum and sum of squares of each tensor (fp64): changes when a kernel writes into its inputs."""
    return [(t.double().sum().item(), t.double().square().sum().item()) for t in tensors]


def _inputs_intact() -> bool:
    """Whether the kept gate inputs are unchanged; if not they are dropped (the next gate draws new ones)."""
    intact = _fingerprint(_GATE["tensors"][:3]) == _GATE["fingerprint"]
    if not intact:
        _GATE.clear()
    return intact


def gate(mod, cfg: KernelConfig, shape: Shape) -> tuple[bool, float, str]:
    """``(passed, relative error, why not)`` of ``mod.launch`` with ``cfg`` on the gate inputs of ``shape``."""
    import torch

    q, k, v, ref = gate_inputs(shape)
    out = torch.full_like(q, float("nan"))  # poisoned: an unwritten element fails the gate
    mod.launch(q, k, v, cfg, shape.causal, 1.0 / math.sqrt(shape.head_dim), out=out)
    synchronize()
    finite = bool(torch.isfinite(out).all())
    err = ((out.float() - ref).norm() / ref.norm()).item() if finite else float("nan")
    if not _inputs_intact():
        return False, err, "the kernel wrote into its inputs q/k/v"
    tol = TOLERANCE[shape.dtype]
    if not finite:
        bad = int((~torch.isfinite(out)).sum())
        return False, err, f"{bad} of {out.numel()} output elements are NaN/inf (unwritten or overflowed)"
    if not err <= tol:
        return False, err, f"relative error {err:.3e} > {tol:g} against the fp32 reference"
    return True, err, ""
