"""Roofline floors for forward attention: the fastest any kernel could run a shape on a GPU.

Two times from the catalog (:mod:`rocmflash.hw.gpus`), never from a measurement:

* **compute**: the matrix FLOPs over the GPU's dense fp16/bf16 peak. FLOPs are
  ``4·B·Hq·Sq·Sk·D`` (two GEMMs, 2 FLOPs per multiply-add), halved for causal masks;
  this is also the numerator of every TFLOP/s figure rocmflash reports.
* **memory**: the fewest bytes any kernel must move (Q, K, V read once, O written once)
  over the GPU's peak HBM bandwidth.

The floor is the larger of the two; ``efficiency = floor / measured`` says how close a
measured time came to it (1.0 = at the roofline). Forward attention at S >= 1k is
compute-bound on every GPU in the catalog, so the floor is the compute term there.

**fp8** (``Shape.dtype == "fp8"``: both GEMMs in fp8, :mod:`rocmflash.kernels.fp8.forward`): the
compute term uses the GPU's dense fp8 peak (``peak_fp8_tflops``), the memory term reads 1-byte Q,
K and V and writes a 2-byte (bf16/fp16) output. A GPU without fp8 matrix instructions has no fp8
floor: a one-line ``ValueError``.
"""

from __future__ import annotations

import dataclasses

from rocmflash.hw.gpus import GPU

ELEMENT_BYTES = {"fp16": 2, "bf16": 2}
FP8 = "fp8"
FP8_INPUT_BYTES, FP8_OUTPUT_BYTES = 1, 2  #: fp8 Q/K/V; the output is bf16 (or fp16)


@dataclasses.dataclass(frozen=True)
class Shape:
    """One attention call: ``q (B, Hq, Sq, D)``, ``k/v (B, Hkv, Sk, D)``."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str = "fp16"
    causal: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Shape":
        return cls(**d)


def flops(shape: Shape) -> float:
    """``4·B·Hq·Sq·Sk·D``, halved for causal (the convention of every TFLOP/s figure here)."""
    f = 4.0 * shape.batch * shape.heads_q * shape.seqlen_q * shape.seqlen_k * shape.head_dim
    return f * (0.5 if shape.causal else 1.0)


def min_bytes(shape: Shape) -> float:
    """Bytes every kernel must move: Q and O once each, K and V once each (fp8: 1-byte Q/K/V, 2-byte O)."""
    if shape.dtype == FP8:
        q = shape.batch * shape.heads_q * shape.seqlen_q * shape.head_dim
        k_v = 2 * shape.batch * shape.heads_kv * shape.seqlen_k * shape.head_dim
        return float(FP8_INPUT_BYTES * (q + k_v) + FP8_OUTPUT_BYTES * q)
    e = ELEMENT_BYTES.get(shape.dtype, 2)
    q_o = 2 * shape.batch * shape.heads_q * shape.seqlen_q * shape.head_dim
    k_v = 2 * shape.batch * shape.heads_kv * shape.seqlen_k * shape.head_dim
    return float(e * (q_o + k_v))


def tflops(shape: Shape, ms: float) -> float:
    """Achieved TFLOP/s of a run that took ``ms`` milliseconds."""
    return flops(shape) / (ms * 1e-3) / 1e12


@dataclasses.dataclass(frozen=True)
class Roofline:
    """Floors of one shape on one GPU, in milliseconds."""

    compute_ms: float
    memory_ms: float

    @property
    def floor_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms >= self.memory_ms else "memory"

    def efficiency(self, measured_ms: float) -> float:
        """Floor over measured time (1.0 = at the roofline)."""
        return self.floor_ms / measured_ms if measured_ms > 0 else float("nan")

    def to_dict(self) -> dict:
        return {"compute_ms": round(self.compute_ms, 5), "memory_ms": round(self.memory_ms, 5),
                "floor_ms": round(self.floor_ms, 5), "bound": self.bound}


def peak_tflops(gpu: GPU, dtype: str) -> float:
    """The dense matrix peak a ``dtype`` shape runs at: ``peak_fp8_tflops`` for fp8, else ``peak_fp16_tflops``.

    ``ValueError`` (one line) for fp8 on a GPU without fp8 matrix instructions (gfx90a, sm_80)."""
    if dtype != FP8:
        return gpu.peak_fp16_tflops
    if gpu.peak_fp8_tflops is None:
        raise ValueError(f"{gpu.name} ({gpu.arch}) has no fp8 matrix peak: it has no fp8 matrix instructions "
                         "(fp8 needs gfx942, gfx950 or sm_89+)")
    return gpu.peak_fp8_tflops


def roofline(gpu: GPU, shape: Shape) -> Roofline:
    """Compute time at :func:`peak_tflops` (fp16/bf16 or fp8) and memory time at ``gpu.hbm_tbs``."""
    compute_ms = flops(shape) / (peak_tflops(gpu, shape.dtype) * 1e12) * 1e3
    memory_ms = min_bytes(shape) / (gpu.hbm_tbs * 1e12) * 1e3
    return Roofline(compute_ms, memory_ms)
