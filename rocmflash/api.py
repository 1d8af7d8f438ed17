"""Public attention API: ``attention`` (``(B, H, S, D)`` layout) and ``flash_attn_func``.

Both validate their inputs (bad input raises ``ValueError``/``TypeError`` naming the
argument and what was expected), pick a kernel config (the caller's, or
:func:`rocmflash.config.default_config` for the live GPU until the tuner database
exists) and launch one of the four kernel variants.

Tensors must be on a GPU (CUDA or ROCm). With ``TRITON_INTERPRET=1`` set in the
environment the same calls run CPU tensors through Triton's interpreter (that is how CI
checks numerics); the variable is read at call time.

Semantics: fp16/bf16 in, fp32 accumulation, output in the input dtype. Causal masking
is bottom-right aligned (flash-attn convention): query ``i`` attends key ``j`` iff
``j <= i + (Sk - Sq)``; with ``Sq > Sk`` the first ``Sq - Sk`` query rows attend nothing
and get output 0 and LSE ``-inf``. GQA/MQA: ``Hq`` must be a multiple of ``Hkv``; query
head ``h`` uses key/value head ``h // (Hq // Hkv)``.
"""

from __future__ import annotations

import math
from typing import Optional

from rocmflash.compat import require_supported_versions

require_supported_versions()

import torch  # noqa: E402

from rocmflash.config import VARIANTS, KernelConfig, default_config

_DTYPES = (torch.float16, torch.bfloat16)


def _interpreting() -> bool:
    from rocmflash.kernels.common import interpreting

    return interpreting()


def _check_inputs(q, k, v, softmax_scale, names=("q", "k", "v"), layout="(B, H, S, D)"):
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype must be torch.float16 or torch.bfloat16, got {t.dtype}")
    for name, t in zip(names[1:], (k, v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must match {names[0]}.dtype ({q.dtype})")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but {names[0]} is on {q.device}; all must share a device")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(
            f"{names[0]} is on {q.device}; rocmflash kernels need a CUDA or ROCm GPU tensor "
            "(or set TRITON_INTERPRET=1 to run CPU tensors through Triton's interpreter)"
        )
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
        if not math.isfinite(float(softmax_scale)):
            raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")


def _check_shapes(q, k, v):
    """q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D) after any layout change."""
    B, Hq, Sq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[3] != D:
        raise ValueError(f"q, k and v must share the head dim: q has {D}, k/v have {k.shape[3]}")
    if not 16 <= D <= 256:
        raise ValueError(f"head dim must be in 16..256, got {D}")
    Hkv = k.shape[1]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"number of query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")


def _resolve_config(config, variant: str, head_dim: int, device) -> KernelConfig:
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is unknown; expected one of {VARIANTS}")
    if config is None:
        from rocmflash.selection import device_identity

        return default_config(device_identity(device)[1], head_dim, variant)
    if isinstance(config, dict):
        config = KernelConfig.from_dict(config)
    if not isinstance(config, KernelConfig):
        raise TypeError(f"config must be a KernelConfig, a dict or None, got {type(config).__name__}")
    config.validate()
    if config.variant != variant:
        raise ValueError(
            f"variant={variant!r} but config.variant={config.variant!r}; pass variant={config.variant!r} "
            "or a config for the variant you want"
        )
    return config


def _run(q, k, v, causal, softmax_scale, variant, config, return_lse, out=None):
    """Validate shapes, resolve an explicit config, run the attention (:func:`rocmflash.ops.attention_forward`).

    Eager calls on plain tensors skip the dispatcher; traced ones use the ``rocmflash::attn_fwd``
    op, which is differentiable and has a fake implementation, so this path works under
    autograd and ``torch.compile``. Without a config the op selects one
    at run time (:func:`rocmflash.selection.select_config`: the live GPU's database
    entry, else the per-arch default; cached).
    """
    _check_shapes(q, k, v)
    D = q.shape[3]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    if config is None:
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r} is unknown; expected one of {VARIANTS}")
    else:
        config = _resolve_config(config, variant, D, q.device)
    from rocmflash.ops import attention_forward

    o, lse = attention_forward(q, k, v, bool(causal), scale, variant, config, need_lse=return_lse)
    if out is not None:
        out.copy_(o)
        o = out
    return o, (lse if return_lse else None)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def attention(q, k, v, causal: bool = False, softmax_scale: Optional[float] = None,
              variant: str = "online", config: Optional[KernelConfig] = None,
              return_lse: bool = False):
    """Scaled dot-product attention forward, ``softmax(q kᵀ * scale) v``.

    Args:
        q: ``(B, Hq, Sq, D)`` fp16/bf16, any strides.
        k, v: ``(B, Hkv, Sk, D)``, same dtype and device; ``Hq % Hkv == 0`` (GQA/MQA).
        causal: bottom-right aligned causal mask (query ``i`` sees keys ``j <= i + Sk - Sq``).
        softmax_scale: defaults to ``1/sqrt(D)``; must be finite.
        variant: ``"online"``, ``"split_kv"``, ``"two_phase"`` or ``"split_d"``.
        config: a :class:`~rocmflash.config.KernelConfig` (or its dict) whose ``variant``
            matches; ``None`` uses the default for the live GPU and head dim.
        return_lse: also return the fp32 natural-log log-sum-exp ``(B, Hq, Sq)``.

    Returns:
        ``(B, Hq, Sq, D)`` output in q's dtype, or ``(out, lse)`` with ``return_lse``.
    """
    _check_inputs(q, k, v, softmax_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    out, lse = _run(q, k, v, causal, softmax_scale, variant, config, return_lse)
    out = out.contiguous()  # (B, Hq, Sq, D) contiguous, as before (a no-op unless q was a transposed view)
    return (out, lse) if return_lse else out


def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False):
    """flash-attn compatible forward: q ``(B, Sq, Hq, D)``, k/v ``(B, Sk, Hkv, D)`` -> ``(B, Sq, Hq, D)``.

    Dropout is not implemented: ``dropout_p`` other than 0 raises NotImplementedError.
    Causal masking is bottom-right aligned, as in flash-attn >= 2.1.
    """
    _check_inputs(q, k, v, softmax_scale, layout="(B, S, H, D)")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p}: rocmflash does not implement attention dropout; use dropout_p=0.0")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    # the kernels take any strides: work on (B, H, S, D) views, no copies; for contiguous
    # (B, S, H, D) inputs the op's output is (B, S, H, D) in memory, so this is contiguous
    out, _ = _run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, softmax_scale,
                  "online", None, False)
    return out.transpose(1, 2).contiguous()


__all__ = ["attention", "flash_attn_func"]
