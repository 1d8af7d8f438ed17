"""fp8 attention inputs: which fp8 formats each arch computes in, the descale checks, and the error report.

**Formats per arch.** The matrix units read one family of fp8 encodings each:

* gfx940/gfx941/gfx942 (MI300A/MI300X/MI325X, CDNA3): the *FNUZ* formats, ``torch.float8_e4m3fnuz``
  and ``torch.float8_e5m2fnuz`` (exponent bias 8/16, no negative zero, no infinities, one NaN: 0x80).
  Triton compiles OCP fp8 there too, but by converting it in software (no fp8 MFMA).
* gfx950 (MI355X, CDNA4) and NVIDIA sm_89+ (Ada, Hopper, Blackwell): the *OCP* formats,
  ``torch.float8_e4m3fn`` and ``torch.float8_e5m2`` (bias 7/15).
* gfx90a (MI250) and older, RDNA, NVIDIA before sm_89: no fp8 matrix instructions: no fp8 path.

Bit patterns differ between the families (the same byte is half or twice the value), so a tensor
in the other family is a one-line ``TypeError`` naming the arch and the dtypes it expects, never a
silent reinterpretation. Where the arch is unknown (the CPU interpreter with no GPU) all four
dtypes run: the kernels are the same source for both families.

**Descales** (flash-attn 3's ``q_descale``/``k_descale``/``v_descale``): fp32 tensors of shape
``(batch, kv_heads)`` on q's device, any strides (an ``expand``-ed scalar is fine); the true
values are ``q_fp8 * q_descale[b, h // group]`` etc. Type, dtype, shape and device are checked on
the host (:func:`check_descale`, shared with the fp8 KV cache). Zero and negative descales are legal
and exact (the output is attention over the dequantised inputs). **Finiteness is checked on the GPU**,
because reading a device tensor on the host waits for the GPU: each program of the kernel checks its
``q_descale * k_descale * softmax_scale`` and ``v_descale`` and sets a bit of a per-device error word
when one is NaN or infinite (its rows are then NaN). The word is read without waiting: every call
polls an asynchronous copy started every :data:`ERROR_POLL_CALLS` calls, so a later call raises the
``ValueError``; :func:`check_errors` reads it at once (it waits for the GPU). With CPU tensors (the
interpreter) the word is read right after the launch, so the offending call itself raises.
"""

from __future__ import annotations

from typing import Optional

import torch

from rocmflash.hw.fp8 import (  # noqa: F401  (re-exported: the code moved there)
    FAMILY_DTYPES,
    FNUZ_ARCHS,
    FP8_DTYPES,
    OUT_DTYPES,
    check_format,
    fp8_family,
    fp8_max,
    is_fp8,
    triton_type,
    unit_roundoff,
)
from rocmflash.kernels.fp8.errors import (  # noqa: F401  (re-exported: the code moved there)
    _ERROR_WORDS,
    _WATCHES,
    BAD_DESCALE,
    ERROR_POLL_CALLS,
    check_errors,
    error_word,
    poll_errors,
)


def check_out_dtype(out_dtype):
    """``torch.bfloat16`` (the default, for None) or ``torch.float16``; ``TypeError`` otherwise."""
    if out_dtype is None:
        return torch.bfloat16
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float16 (or None: bfloat16), got {out_dtype!r}")
    return out_dtype


def check_descale(name: str, d, batch: int, kv_heads: int, device, required_with: str) -> None:
    """Raise ``TypeError``/``ValueError`` naming ``name`` unless ``d`` is an fp32 ``(batch, kv_heads)`` tensor on
    ``device`` (q's; any strides, an ``expand``-ed scalar is fine); None is "required with ``required_with``".

    The one metadata check of a descale, for the fp8 forward (:func:`check_descales`) and the fp8 KV cache
    (:func:`rocmflash.api.decode_fp8.check_descales`). Values are never read here (that would wait for the
    GPU): the kernels check them and report through their error word, by one principle -- a descale is
    refused exactly where the call could not give the dequantised answer:

    * **fp8 forward** (``q_descale``/``k_descale``/``v_descale``): finite. Zero and negative are legal and
      exact (the scale multiplies the scores before the row max and the output after the sum): a zero
      ``q_descale``/``k_descale`` gives uniform weights, a zero ``v_descale`` a zero output, as attention
      over the dequantised inputs does.
    * **fp8 KV cache** (``k_descale``/``v_descale`` of ``flash_attn_with_kvcache``): finite and > 0. The
      append stores ``k / k_descale``: with zero every value saturates (the cache would read back as 0),
      and a negative scale, which no quantiser produces, is taken for a wrong one. Such a call writes
      nothing to the cache (the kernels' error word, or ``check_values=True`` on the host)."""
    if d is None:
        raise ValueError(f"{name} is required with {required_with}: an fp32 tensor of shape (batch, kv_heads) = "
                         f"({batch}, {kv_heads}) (torch.ones for unscaled inputs)")
    if not isinstance(d, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape ({batch}, {kv_heads}), got {type(d).__name__}")
    if d.dtype != torch.float32:
        raise TypeError(f"{name}.dtype must be torch.float32, got {d.dtype}")
    if tuple(d.shape) != (batch, kv_heads):
        raise ValueError(f"{name} must have shape (batch, kv_heads) = ({batch}, {kv_heads}), got {tuple(d.shape)}")
    if d.device != device:
        raise ValueError(f"{name} is on {d.device} but q is on {device}; descales must be on q's device")


def check_descales(q, batch: int, kv_heads: int, q_descale, k_descale, v_descale) -> None:
    """Raise ``TypeError``/``ValueError`` unless each descale is an fp32 ``(batch, kv_heads)`` tensor on q's device
    (:func:`check_descale`). Values are not read here (that would wait for the GPU): the kernel checks that they
    are finite; zero and negative descales are exact."""
    for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        check_descale(name, d, batch, kv_heads, q.device, "fp8 inputs")


def refuse_descales(q_descale, k_descale, v_descale, out_dtype, dtype) -> None:
    """Raise ``TypeError`` when fp8-only arguments come with non-fp8 inputs (they would be ignored)."""
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale),
                        ("out_dtype", out_dtype)):
        if value is not None:
            raise TypeError(f"{name} applies to fp8 inputs only; q is {dtype} (pass {name}=None)")


# ----------------------------------------------------------------------------- the call
def attention_fp8(q, k, v, causal: bool, scale: float, config, return_lse: bool, q_descale, k_descale, v_descale,
                  out_dtype=None, out_bshd: bool = False, plan_signature=None):
    """fp8 attention on shape-checked ``(B, H, S, D)`` views (:mod:`rocmflash.api.attention` checks types and shapes).

    Checks the format against the live arch, the descales and the options, selects the config, and runs the call's
    plan (:func:`rocmflash.api.fp8_plans.execute`: the output in ``out_dtype``, bf16 by default, its memory
    ``(B, S, H, D)`` when ``out_bshd``; :mod:`rocmflash.kernels.fp8.forward`; the error word polled). Inference
    only: with autograd recording, the output's backward raises. Returns ``(out (B, Hq, Sq, D), lse or None)``.
    ``plan_signature``: the caller's :func:`rocmflash.api.fp8_plans.signature` of the call, whose plan is kept once
    every check here passed (None: none kept)."""
    from rocmflash.api.selection import device_identity

    arch = device_identity(q.device)[1]
    check_format(q.dtype, arch, "q")
    B, Hq, Sq, D = q.shape
    check_descales(q, B, k.shape[1], q_descale, k_descale, v_descale)
    out_dtype = check_out_dtype(out_dtype)
    cfg = _fp8_config(config, arch, D)
    from rocmflash.api import fp8_plans
    from rocmflash.kernels.fp8.forward import kmajor_v

    plan = fp8_plans.make(q, k, cfg, kmajor_v(arch), causal, scale, out_dtype, out_bshd, return_lse)
    out, lse = fp8_plans.execute(plan, q, k, v, q_descale, k_descale, v_descale)
    fp8_plans.keep(plan_signature, plan)
    return out, lse


def _fp8_config(config, arch: Optional[str], head_dim: int):
    """The caller's config (a KernelConfig or its dict, variant ``online``) or the fp8 kernel's default for the arch
    (:func:`rocmflash.kernels.fp8.forward.default_config`)."""
    from rocmflash.config import KernelConfig
    from rocmflash.kernels.fp8.forward import check_config, default_config

    if config is None:
        return default_config(arch, head_dim)
    if isinstance(config, dict):
        config = KernelConfig.from_dict(config)
    if not isinstance(config, KernelConfig):
        raise TypeError(f"config must be a KernelConfig, a dict or None, got {type(config).__name__}")
    if config.variant != "online":
        raise ValueError(f"fp8 attention runs the online kernel only; got a config for variant={config.variant!r}")
    return check_config(config)


__all__ = ["attention_fp8", "FP8_DTYPES", "FAMILY_DTYPES", "is_fp8", "fp8_family", "check_format", "fp8_max", "triton_type",
           "unit_roundoff", "check_out_dtype", "check_descale", "check_descales", "refuse_descales", "error_word",
           "check_errors", "poll_errors", "ERROR_POLL_CALLS"]
