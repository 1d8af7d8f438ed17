"""The live runner's numeric gate: a config must compute attention before it is timed.

Fresh random inputs of the tuned shape with batch 1
(every head, so the gate runs the very kernel that is timed), drawn from a new seed when
a worker first gates that shape and kept, with their fp32 reference (TF32 off), for every
config the worker gates on it: the reference of a long sequence costs more than the
config's own measurement (~0.19 s at S=16k, 32 heads, on an H100), and a race gates its
finalists again in every pass. The rule is :func:`rocmflash.measure.gate`, the one every tune uses:
the output poisoned with NaN first, every element finite, the relative error ``||out - ref|| / ||ref||``
within :data:`rocmflash.measure.TOLERANCE` (1e-2 fp16, 2e-2 bf16), the inputs left as they were (the
next configs are gated on them). A config that fails is ``incorrect`` and is never timed.
Runs in the live runner's worker (:mod:`rocmflash.tuning.live`).

fp8 shapes (``Shape.dtype == "fp8"``): fp8 q, k, v in the live arch's format with fp32 descales, a bf16
output, the reference computed from the dequantised inputs, and the fp8 bound (V's unit roundoff,
``2**-4`` for e4m3) as the tolerance: :mod:`rocmflash.tuning.live_fp8` says why.

The 2 GiB line. On AMD, Triton reads a tensor whose storage is under 2 GiB with 32-bit buffer
loads and one past it with global loads: two binaries of one config. A batch-1 stand-in of a
timed tensor past the line would build the other one, so on ROCm such stand-ins (the gate's
here, the pre-warm's in :mod:`rocmflash.tuning.live_worker` and the tuning workers) are views into one
storage just past the line (:func:`stand_ins`); :func:`beyond_32bit_range` is the one rule
that the static builds (:func:`rocmflash.tuning.spec.static_problem`, :func:`build_bytes`) follow too.

The cache flush. Every timing worker (forward, backward, varlen, decode) zeroes the buffer of
:func:`rocmflash.measure.flush_buffer` before each timed run, sized by :func:`rocmflash.hw.gpus.flush_bytes`.
"""

from __future__ import annotations

import math
import os
from typing import Optional

from rocmflash import measure
from rocmflash.config import FP8, KernelConfig
from rocmflash.hw.roofline import Shape


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
    """The torch dtype of ``"fp16"`` / ``"bf16"``, or of ``"fp8"``: the worker's arch's e4m3 format
    (:func:`rocmflash.tuning.live_fp8.input_dtype`)."""
    if name == FP8:
        from rocmflash.tuning import live_fp8

        return live_fp8.input_dtype(live_fp8.worker_arch())
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def tolerance(shape: Shape, dtype=None) -> float:
    """The gate's bound for ``shape`` (:func:`rocmflash.measure.tolerance`); for fp8 the unit roundoff of the
    inputs' format ``dtype``."""
    return measure.tolerance(dtype if shape.dtype == FP8 and dtype is not None else shape.dtype)


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


# ---------------------------------------------------------------------- the 2 GiB line
#: stand-ins carved from one storage start at multiples of this many bytes (16-byte aligned, as a launch needs)
_CARVE_ALIGN = 256


def beyond_32bit_range(nbytes: int) -> bool:
    """Whether a tensor of ``nbytes`` of storage lies past the 2 GiB line (``> MAX_32BIT_RANGE``).

    The one rule: on AMD, Triton addresses a tensor under the line with 32-bit buffer offsets
    (``tt.pointer_range = 32``: buffer loads) and one past it with global loads -- another
    binary with other register use. Every build or launch standing in for a timed one must
    keep each tensor on the timed tensor's side of it.
    """
    from rocmflash.kernels import build

    return int(nbytes) > build.MAX_32BIT_RANGE


def build_bytes(nbytes: int) -> int:
    """What a compile-only build must be told of a tensor's storage: ``nbytes`` past the 2 GiB line, else 0
    (every tensor under the line builds the same binary, so such problems share one build and cache entry)."""
    return int(nbytes) if beyond_32bit_range(nbytes) else 0


def stand_in_bytes(own: int, real: int) -> int:
    """Storage bytes for a smaller stand-in (``own`` bytes of data) of a tensor of ``real`` bytes, on the real
    tensor's side of the 2 GiB line: ``own``, or just past the line when only the real tensor is past it.

    ValueError when the stand-in itself is past the line and the real tensor is not (no storage can
    bring it back under: the caller must shrink it).
    """
    from rocmflash.kernels import build

    past, own_past = beyond_32bit_range(real), beyond_32bit_range(own)
    if own_past and not past:
        raise ValueError(f"a stand-in of {own} bytes for a tensor of {real} bytes crosses the 2 GiB line; "
                         f"expected a stand-in no larger than the tensor it stands for")
    return build.MAX_32BIT_RANGE + 1 if past and not own_past else int(own)


def tensor_bytes(shape: Shape) -> tuple[int, int]:
    """``(q bytes, k bytes)``: the storage of the timed ``q`` and ``k``/``v`` of ``shape`` (2-byte dtypes; fp8: 1)."""
    size = 1 if shape.dtype == FP8 else 2
    q = size * shape.batch * shape.heads_q * shape.seqlen_q * shape.head_dim
    return q, size * shape.batch * shape.heads_kv * shape.seqlen_k * shape.head_dim


def out_bytes(shape: Shape) -> int:
    """The storage of the timed output of ``shape``: q's shape in a 2-byte dtype (an fp8 run writes bf16)."""
    return 2 * shape.batch * shape.heads_q * shape.seqlen_q * shape.head_dim


def largest_bytes(shape: Shape) -> int:
    """The storage of the largest timed tensor of ``shape`` (inputs and output): which side of the 2 GiB line
    its builds must take (:func:`beyond_32bit_range`)."""
    return max(*tensor_bytes(shape), out_bytes(shape))


def storage_plan(specs: dict, itemsize: int) -> dict:
    """``{name: storage bytes}`` of the stand-ins ``{name: (dims, bytes of the tensor it stands for)}``
    (:func:`stand_in_bytes` of each: its own size, or just past the line)."""
    return {name: stand_in_bytes(math.prod(dims) * itemsize, real) for name, (dims, real) in specs.items()}


def pads_storage() -> bool:
    """Whether stand-ins here must keep the 2 GiB side of the tensors they stand for: on ROCm (CUDA builds
    do not depend on storage size), never in the interpreter (nothing is compiled)."""
    from rocmflash.hw.platform import is_rocm

    return is_rocm() and not interpreting()


def stand_ins(specs: dict, dtype, dev, pad: bool, generator=None) -> dict:
    """Random-normal tensors ``{name: tensor of dims}`` for the stand-ins ``{name: (dims, real bytes)}``.

    With ``pad``, each stand-in whose real tensor is past the 2 GiB line (and it is not) is a view
    into one storage shared by all such stand-ins and sized just past the line (:func:`storage_plan`):
    its launch then builds the binary of the real tensor (global loads, not buffer loads), at the
    cost of one such storage rather than one per tensor.
    """
    import torch

    itemsize = dtype.itemsize
    plan = storage_plan(specs, itemsize) if pad else {}
    carved = [n for n, (dims, _) in specs.items() if plan.get(n, 0) > math.prod(dims) * itemsize]
    align = _CARVE_ALIGN // itemsize
    offsets, end = {}, 0
    for name in carved:
        offsets[name] = end
        end += -(-math.prod(specs[name][0]) // align) * align
    shared = None
    if carved:
        elems = max(end, -(-max(plan[n] for n in carved) // itemsize))
        shared = torch.empty(elems, device=dev, dtype=dtype)
    out = {}
    for name, (dims, _) in specs.items():
        if name in offsets:
            t = shared[offsets[name]:offsets[name] + math.prod(dims)].view(dims)
        else:
            t = torch.empty(dims, device=dev, dtype=dtype)
        out[name] = _random(t, generator)
    return out


def _random(t, generator=None):
    """``t`` filled with N(0, 1) values (fp8: spread over the format's range, :func:`rocmflash.tuning.live_fp8.fill`)."""
    from rocmflash.hw.fp8 import is_fp8

    if is_fp8(t.dtype):
        from rocmflash.tuning.live_fp8 import fill

        return fill(t, generator)
    return t.normal_(generator=generator)


# ---------------------------------------------------------------------- the gate
_GATE: dict = {}


def gate_specs(shape: Shape) -> dict:
    """The gate's stand-ins ``{"q", "k", "v", "out": (dims, bytes of the timed tensor)}``: one batch, every
    head, the shape's lengths (Triton specialises the head count on ``% 16`` and ``== 1``, so fewer heads
    could compile another kernel), each standing for the timed tensor of the whole batch."""
    q_real, kv_real = tensor_bytes(shape)
    q_dims = (1, shape.heads_q, shape.seqlen_q, shape.head_dim)
    kv_dims = (1, shape.heads_kv, shape.seqlen_k, shape.head_dim)
    return {"q": (q_dims, q_real), "k": (kv_dims, kv_real), "v": (kv_dims, kv_real), "out": (q_dims, out_bytes(shape))}


def gate_inputs(shape: Shape, pad: Optional[bool] = None):
    """``(q, k, v, fp32 reference)`` of the gate for ``shape``: drawn from a fresh seed the first time this
    worker gates the shape, then kept (with the reference and an output buffer) for every config it gates
    on it. ``pad`` (default :func:`pads_storage`): tensors on the timed tensors' side of the 2 GiB line."""
    import torch

    if _GATE.get("shape") != shape:
        _GATE.clear()
        dev = device()
        gen = torch.Generator(device=dev)
        gen.manual_seed(int.from_bytes(os.urandom(7), "little"))
        pad = pads_storage() if pad is None else pad
        if shape.dtype == FP8:
            return _fp8_gate_inputs(shape, dev, pad, gen)
        t = stand_ins(gate_specs(shape), torch_dtype(torch, shape.dtype), dev, pad, gen)
        q, k, v = t["q"], t["k"], t["v"]
        ref = reference(q, k, v, shape.causal, 1.0 / math.sqrt(shape.head_dim))
        _GATE.update(shape=shape, tensors=(q, k, v, ref), out=t["out"])
    return _GATE["tensors"]


def _fp8_gate_inputs(shape: Shape, dev, pad: bool, gen):
    """:func:`gate_inputs` of an fp8 shape: fp8 q, k, v (the worker's format) and their descales (kept in
    ``_GATE["descales"]``), a bf16 output, and the fp32 reference of the dequantised inputs."""
    import torch

    from rocmflash.tuning import live_fp8

    specs = gate_specs(shape)
    dtype = torch_dtype(torch, FP8)
    t = stand_ins({n: specs[n] for n in ("q", "k", "v")}, dtype, dev, pad, gen)
    out = stand_ins({"out": specs["out"]}, torch.bfloat16, dev, pad, gen)["out"]
    d = live_fp8.descales(1, shape.heads_kv, dtype, dev, gen)
    q, k, v = t["q"], t["k"], t["v"]
    ref = reference(*(live_fp8.dequantised(x, s) for x, s in zip((q, k, v), d)), shape.causal,
                    1.0 / math.sqrt(shape.head_dim))
    _GATE.update(shape=shape, tensors=(q, k, v, ref), out=out, descales=d, dtype=dtype)
    return _GATE["tensors"]


def gate(mod, cfg: KernelConfig, shape: Shape) -> tuple[bool, float, str]:
    """``(passed, relative error, why not)`` of ``mod.launch`` with ``cfg`` on the gate inputs of ``shape``
    (:func:`rocmflash.measure.gate`); a config that wrote into the inputs drops them (the next gate draws new ones)."""
    q, k, v, ref = gate_inputs(shape)
    out, descales = _GATE["out"], _GATE.get("descales", ())
    fp8 = {"descales": descales} if shape.dtype == FP8 else {}
    inputs = {"q": q, "k": k, "v": v, **dict(zip(("q_descale", "k_descale", "v_descale"), descales))}

    def launch():
        mod.launch(q, k, v, cfg, shape.causal, 1.0 / math.sqrt(shape.head_dim), out=out, **fp8)

    against = "the fp32 reference of the dequantised fp8 inputs" if fp8 else "the fp32 reference"
    verdict = measure.gate(launch, {"out": ref}, {"out": out}, inputs, _GATE.get("dtype", shape.dtype), against)
    if verdict.inputs_written:
        _GATE.clear()
    return verdict.passed, verdict.rel_err, verdict.why
