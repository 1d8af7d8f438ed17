"""fp8 in the live runner: what a timing worker gates and times for an fp8 forward shape (``Shape.dtype == "fp8"``).

* **The format** is the live arch's e4m3 (:func:`input_dtype`: FNUZ ``float8_e4m3fnuz`` on gfx942, OCP
  ``float8_e4m3fn`` on gfx950 and sm_89+). A tune measures only on the GPU it names, so the worker's arch
  (:func:`worker_arch`, Triton's active target) is the tuned GPU's; without a target (the bare CPU
  interpreter) the OCP format stands in.
* **Inputs** are fp8 tensors whose values spread over the format's range (``N(0, 1) * fp8_max / 8``,
  saturated: :func:`fill`) with fp32 ``(B, Hkv)`` descales of ``8 / fp8_max`` times a factor in ``[0.5, 1.5]``
  per (batch, kv head) (:func:`descales`): the dequantised values are ``N(0, s^2)``, as an amax-scaled
  activation's are, so ``1/sqrt(D)`` gives scores of the size real ones have.
* **The kernel** is :mod:`rocmflash.kernels.fp8.forward` behind the variants' interface
  (:class:`Fp8Forward`: ``launch(q, k, v, cfg, causal, scale, out, descales)``, ``compile_for``).
  Timed inputs hold V as a caller passes it (row-major ``(B, Hkv, Sk, D)``), so where the arch reads V
  K-major (:func:`rocmflash.kernels.fp8.forward.kmajor_v`: gfx942, sm_89/sm_90/sm_12x) every timed launch
  makes the copy the public API makes on every call (:func:`rocmflash.kernels.fp8.forward.launch_kept`, the
  function :func:`rocmflash.api.fp8_plans.execute` runs): the tune times the call that is served, not the
  kernel alone on a V copied once beforehand (that measured a cheaper call than the API's).
* **The gate** compares with fp32 attention of the *dequantised* inputs; the tolerance on the relative L2
  error is V's unit roundoff ``u`` (e4m3: ``2**-4``, :func:`tolerance`), the bound that
  ``tests/test_fp8_forward.py`` holds every interpreted and compiled (H100) run to: P is rounded to fp8 at
  the format's scale, its relative errors have rms below ``u/sqrt(3)`` (typically 2-2.5e-2 measured), so a
  correct config stays under ``u`` and a wrong tile, mask or descale goes far past it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

#: the dequantised inputs' scale: fp8 values ``N(0, 1) * fp8_max / DIVISOR``, descales ``DIVISOR / fp8_max``
DIVISOR = 8.0


def worker_arch() -> Optional[str]:
    """The arch of Triton's active target (``gfx942``, ``sm_90``), or None without one (plain CPU)."""
    from triton.runtime import driver

    try:
        target = driver.active.get_current_target()
    except RuntimeError:  # Triton found no active backend
        return None
    return str(target.arch) if target.backend == "hip" else f"sm_{target.arch}"


def input_dtype(arch: Optional[str]):
    """The torch e4m3 dtype ``arch`` computes fp8 attention in (OCP when the arch has none or is unknown)."""
    from rocmflash.hw.fp8 import FAMILY_DTYPES, fp8_family

    return FAMILY_DTYPES[fp8_family(arch) or "ocp"][0]


def tolerance(dtype) -> float:
    """The gate's bound on the relative L2 error of an fp8 run: V's unit roundoff (see the module docstring;
    the one table is :data:`rocmflash.measure.TOLERANCE`)."""
    from rocmflash.measure import tolerance as bound

    return bound(dtype)


def fill(t, generator=None):
    """Fill the fp8 tensor ``t`` (any view) with ``N(0, 1) * fp8_max / DIVISOR``, saturated; returns ``t``."""
    import torch

    from rocmflash.hw.fp8 import fp8_max

    top = fp8_max(t.dtype)
    values = torch.empty(t.shape, dtype=torch.float32, device=t.device).normal_(generator=generator)
    t.copy_(values.mul_(top / DIVISOR).clamp_(-top, top))
    return t


def descales(batch: int, kv_heads: int, dtype, device, generator=None) -> tuple:
    """``(q_descale, k_descale, v_descale)``: fp32 ``(batch, kv_heads)``, ``DIVISOR / fp8_max`` times [0.5, 1.5]."""
    import torch

    from rocmflash.hw.fp8 import fp8_max

    base = DIVISOR / fp8_max(dtype)
    return tuple(torch.empty(batch, kv_heads, dtype=torch.float32, device=device)
                 .uniform_(0.5, 1.5, generator=generator).mul_(base) for _ in range(3))


def dequantised(x, descale):
    """``x`` (fp8 ``(B, H, S, D)``) as fp32 values: each head times its kv head's descale (GQA: ``h // group``)."""
    group = x.shape[1] // descale.shape[1]
    return x.float() * descale.repeat_interleave(group, 1)[:, :, None, None]


@dataclasses.dataclass(frozen=True)
class Fp8Forward:
    """:mod:`rocmflash.kernels.fp8.forward` with the interface the live runner gives a variant's module."""

    arch: Optional[str]

    @property
    def dtype(self):
        return input_dtype(self.arch)

    def launch(self, q, k, v, cfg, causal: bool, scale: float, out, descales: tuple):
        from rocmflash.kernels.fp8 import forward as fp8_forward

        return fp8_forward.launch(q, k, v, *descales, cfg, causal, scale, out, arch=self.arch)

    def compile_for(self, target, cfg, problem):
        """Cross-compile the fp8 build of ``problem`` (``dtype="fp8"``: bf16 output) for ``target``."""
        from rocmflash.kernels.fp8 import forward as fp8_forward

        return fp8_forward.compile_for(target, cfg, dataclasses.replace(problem, dtype="bf16"), self.dtype)


def kernel() -> Fp8Forward:
    """The fp8 forward for this worker's arch."""
    return Fp8Forward(worker_arch())


def inputs(shape, dev, generator=None, arch: Optional[str] = None) -> tuple:
    """``(q, k, v, out, descales)``: one timed input set of an fp8 ``shape``, every tensor row-major as a caller's
    (V too: each launch copies it K-major where the arch reads it so, as an API call does; ``arch`` picks the
    format)."""
    import torch

    dtype = input_dtype(arch)
    q = fill(torch.empty(shape.batch, shape.heads_q, shape.seqlen_q, shape.head_dim, device=dev, dtype=dtype),
             generator)
    k, v = (fill(torch.empty(shape.batch, shape.heads_kv, shape.seqlen_k, shape.head_dim, device=dev, dtype=dtype),
                 generator) for _ in range(2))
    out = torch.empty(q.shape, device=dev, dtype=torch.bfloat16)
    return q, k, v, out, descales(shape.batch, shape.heads_kv, dtype, dev, generator)


__all__ = ["Fp8Forward", "kernel", "inputs", "fill", "descales", "dequantised", "tolerance",
           "input_dtype", "worker_arch", "DIVISOR"]
