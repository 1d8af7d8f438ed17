"""Public attention API: ``attention`` (``(B, H, S, D)`` layout) and ``flash_attn_func``.

Both validate their inputs (bad input raises ``ValueError``/``TypeError`` naming the
argument and what was expected), pick a kernel config (the caller's, or
:func:`rocmflash.config.default_config` for the live GPU until the tuner database
exists) and launch one of the four kernel variants.

Tensors must be on a GPU (CUDA or ROCm). With ``TRITON_INTERPRET=1`` set in the
environment the same calls run CPU tensors through Triton's interpreter (that is how CI
checks numerics); the variable is read at call time.

Semantics: fp16/bf16 in, fp32 accumulation, output in the input dtype. fp8 in (inference only,
:mod:`rocmflash.api.fp8`): the arch's fp8 format with flash-attn 3's ``q_descale``/``k_descale``/
``v_descale`` (fp32, ``(batch, kv_heads)``), both GEMMs in fp8, output bf16 (or ``out_dtype``). Causal masking
is bottom-right aligned (flash-attn convention): query ``i`` attends key ``j`` iff
``j <= i + (Sk - Sq)``; with ``Sq > Sk`` the first ``Sq - Sk`` query rows attend nothing
and get output 0 and LSE ``-inf``. GQA/MQA: ``Hq`` must be a multiple of ``Hkv``; query
head ``h`` uses key/value head ``h // (Hq // Hkv)``.
"""

from __future__ import annotations

import math
from typing import Optional

from rocmflash.hw.compat import require_supported_versions

require_supported_versions()

import torch  # noqa: E402

from rocmflash.api.fp8 import attention_fp8, refuse_descales  # noqa: E402
from rocmflash.api.scale import check_softmax_scale  # noqa: E402
from rocmflash.api.sinks import check_sinks  # noqa: E402
from rocmflash.config import VARIANTS, KernelConfig, default_config  # noqa: E402
from rocmflash.hw.fp8 import is_fp8  # noqa: E402
from rocmflash.kernels import launch as _L  # noqa: E402
from rocmflash.kernels.launch import check_device  # noqa: E402

_DTYPES = (torch.float16, torch.bfloat16)


def _check_inputs(q, k, v, softmax_scale, names=("q", "k", "v"), layout="(B, H, S, D)"):
    if (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor and q.ndim == 4
            and k.ndim == 4 and v.ndim == 4 and q.dtype in _DTYPES and k.dtype is q.dtype and v.dtype is q.dtype
            and k.device == q.device and v.device == q.device
            and (softmax_scale is None or type(softmax_scale) is float and math.isfinite(softmax_scale))):
        check_device(names[0], q)  # the common call: every other check below passed (the same, fewer calls)
        return
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
    check_device(names[0], q)
    check_softmax_scale(softmax_scale)


def _check_shapes(q, k, v):
    """q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D) after any layout change."""
    B, Hq, Sq, D = q.shape
    ks = k.shape
    if ks == v.shape and ks[0] == B and ks[3] == D and 16 <= D <= 256 and ks[1] >= 1 and Hq % ks[1] == 0:
        return  # the common call: every check below passed
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
        from rocmflash.api.selection import device_identity

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


def _run(q, k, v, causal, softmax_scale, variant, config, return_lse, out=None, deterministic: bool = False,
         sinks=None, sinks_name: str = "sinks"):
    """Validate shapes, resolve an explicit config, run the attention (:func:`rocmflash.api.ops.attention_forward`).

    Eager calls on plain tensors skip the dispatcher; traced ones use the ``rocmflash::attn_fwd``
    op, which is differentiable and has a fake implementation, so this path works under
    autograd and ``torch.compile``. Without a config the op selects one
    at run time (:func:`rocmflash.api.selection.select_config`: the live GPU's database
    entry, else the per-arch default; cached). ``sinks``: attention-sink logits, checked
    (:func:`rocmflash.api.sinks.check_sinks`, errors naming ``sinks_name``) here against q's heads; the online
    kernel serves the call.
    """
    _check_shapes(q, k, v)
    if sinks is not None:
        sinks = check_sinks(sinks, q.shape[1], q.device, sinks_name)
    D = q.shape[3]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    if config is None:
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r} is unknown; expected one of {VARIANTS}")
    else:
        config = _resolve_config(config, variant, D, q.device)
    o, lse = _ops().attention_forward(q, k, v, bool(causal), scale, variant, config, need_lse=return_lse,
                                      deterministic=deterministic, sinks=sinks)
    if out is not None:
        out.copy_(o)
        o = out
    return o, (lse if return_lse else None)


_OPS = []


def _ops():
    """:mod:`rocmflash.api.ops`, imported on first use (it imports the kernels) and then kept: an import
    statement in the call path costs each call about a microsecond."""
    if not _OPS:
        from rocmflash.api import ops
        from rocmflash.api.selection import register_clear

        register_clear(_PLANS.clear)
        _OPS.append(ops)
    return _OPS[0]


_PLANS: dict = {}  #: :func:`_signature` of a default call that passed every check -> its ops plan (``ops._Call``)
_MAX_PLANS = 4096


def _signature(q, k, v, causal: bool, layout: str) -> tuple:
    """What every check of a default call reads (shapes, q's dtype and device, and whether the device can run here:
    CUDA/ROCm, or the CPU under the interpreter, read per call) plus what its ops plan is keyed by (q's strides): a
    call with a signature that passed before passes again, so it skips the checks -- given k and v as they were
    (:func:`_kv_signature`: checked only where rocmflash's kernels run; SDPA checks them itself)."""
    return (q.shape, q.stride(), k.shape, v.shape, q.dtype, q.get_device(), causal,
            True if q.is_cuda else (q.device, _L.interpreting()), layout)


def _kv_signature(k, v) -> tuple:
    """k's and v's dtypes and devices, as the checks saw them (a plan's second half, :func:`_signature`): GPU
    indices for CUDA/ROCm tensors (cheaper than device objects), the devices themselves otherwise."""
    if k.is_cuda and v.is_cuda:
        return k.dtype, v.dtype, k.get_device(), v.get_device()
    return k.dtype, v.dtype, k.device, v.device


def _planned(q, k, v, causal, softmax_scale, layout: str):
    """``(ops plan, k/v signature)`` of a default call whose :func:`_signature` passed the checks before, or None
    (check it in full). Only plain tensors (a subclass or a traced tensor takes the checked path) and a scale the
    checks need not see again (None or a finite float). Where the plan runs rocmflash's kernels the caller also
    compares :func:`_kv_signature`."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor \
            or not (causal is True or causal is False) \
            or not (softmax_scale is None or type(softmax_scale) is float and math.isfinite(softmax_scale)):
        return None
    return _PLANS.get((q.shape, q.stride(), k.shape, v.shape, q.dtype, q.get_device(), causal,
                       True if q.is_cuda else (q.device, _L.interpreting()), layout))  # _signature, inlined


def served_incumbent(call, q, k, v, deterministic: bool = False):
    """The planned call's incumbent to run now (:meth:`~rocmflash.api.ops._Call.served`: the entry's SDPA call for
    the forward, or for the training step when a gradient is wanted), or None: rocmflash's kernels serve it,
    ``ROCMFLASH_NO_INCUMBENT`` forbids SDPA, a gradient is wanted deterministically, or torch.compile traces (the
    op keeps the graph whole: :func:`~rocmflash.api.ops.attention_forward`)."""
    if torch.compiler.is_compiling():
        return None
    return call.served(torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad),
                       deterministic)


def _keep_plan(q, k, v, causal, layout: str) -> None:
    """Remember that this default call passed every check (eager plain tensors only: a traced call keeps none)."""
    if type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor \
            and not torch.compiler.is_compiling():
        if len(_PLANS) >= _MAX_PLANS:  # a new shape every call: start over, never grow unbounded
            _PLANS.clear()
        bhsd = (q, k, v) if layout == "bhsd" else (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        _PLANS[_signature(q, k, v, causal, layout)] = (_ops()._call_plan(bhsd[0], bhsd[1], causal),
                                                       _kv_signature(k, v))


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def attention(q, k, v, causal: bool = False, softmax_scale: Optional[float] = None,
              variant: str = "online", config: Optional[KernelConfig] = None,
              return_lse: bool = False, *, q_descale=None, k_descale=None, v_descale=None, out_dtype=None,
              sinks=None):
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
        q_descale, k_descale, v_descale: fp8 inputs only (then required): fp32 ``(B, Hkv)``
            dequantisation factors, flash-attn 3's names (:mod:`rocmflash.api.fp8`).
        out_dtype: fp8 inputs only: ``torch.bfloat16`` (default) or ``torch.float16``.
        sinks: attention sinks (gpt-oss; vLLM's ``s_aux``): a float ``(Hq,)`` tensor on q's device, one logit
            per query head in the scaled-score domain, joined to each row's softmax denominator --
            ``softmax(cat([q kᵀ * scale, sink_h]))`` with the sink column dropped. Kept in fp32 inside; the
            LSE includes the sink; differentiable (its gradient comes back in its dtype). ``-inf`` = no sink.
            ``variant="online"`` only, not with fp8; always rocmflash's kernel (SDPA has no sinks).

    fp8 q/k/v (one dtype, the arch's format: FNUZ on gfx942, OCP on gfx950 and sm_89+) run
    :mod:`rocmflash.kernels.fp8.forward` (``variant="online"`` only; inference only).

    Returns:
        ``(B, Hq, Sq, D)`` output in q's dtype (fp8: ``out_dtype``), or ``(out, lse)`` with ``return_lse``. Laid
        out as q is, as SDPA's output is: contiguous for a contiguous q, a ``(B, H, S, D)`` view of
        ``(B, S, H, D)`` memory for such a view of q (no copy; fp8: contiguous).
    """
    default = config is None and variant == "online" and q_descale is None and k_descale is None \
        and v_descale is None and out_dtype is None and sinks is None
    if default:  # a signature that passed the checks before: its plan, no checks (the common repeat call)
        plan = _planned(q, k, v, causal, softmax_scale, "bhsd")
        if plan is not None:
            call = plan[0]
            if call.serving and not return_lse:  # the entry's incumbent: SDPA's call (SDPA checks k and v itself)
                serve = served_incumbent(call, q, k, v)
                if serve is not None:
                    return serve(q, k, v, softmax_scale)
        if plan is not None and _kv_signature(k, v) == plan[1]:
            out, lse = _OPS[0].attention_forward(q, k, v, causal, call.scale if softmax_scale is None else softmax_scale,
                                                 "online", None, return_lse, call)
            return (out, lse) if return_lse else out
    sig = None
    fp8_plain = q_descale is not None and config is None and variant == "online" and sinks is None
    if fp8_plain:  # fp8: a signature checked before skips it
        sig = _fp8_plans().signature(q, k, v, causal, softmax_scale, return_lse, (q_descale, k_descale, v_descale),
                                     out_dtype, "bhsd")
        plan = _fp8_plans().planned(sig)
        if plan is not None:
            out, lse = _fp8_plans().run(plan, q, k, v, q_descale, k_descale, v_descale)
            return (out, lse) if return_lse else out
    if _is_fp8(q):
        if variant != "online":
            raise ValueError(f"variant={variant!r}: fp8 attention has one kernel; pass variant='online'")
        if sinks is not None:
            raise ValueError(_FP8_SINKS)
        out, lse = _fp8_run(q, k, v, causal, softmax_scale, config, return_lse,
                            (q_descale, k_descale, v_descale), out_dtype, bshd=False, plan_signature=sig)
        out = out.contiguous()
        return (out, lse) if return_lse else out
    if q_descale is not None or k_descale is not None or v_descale is not None or out_dtype is not None:
        refuse_descales(q_descale, k_descale, v_descale, out_dtype, getattr(q, "dtype", None))
    _check_inputs(q, k, v, softmax_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if sinks is not None and variant != "online":
        raise ValueError(_ops().sinks_variant_error(variant))
    out, lse = _run(q, k, v, causal, softmax_scale, variant, config, return_lse, sinks=sinks)
    if default:
        _keep_plan(q, k, v, causal, "bhsd")
    # laid out as q is, as SDPA does: no copy (a model's (B, S, H, D) projections then need none to merge heads)
    return (out, lse) if return_lse else out


def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: tuple = (-1, -1), softcap: float = 0.0,
                    alibi_slopes=None, deterministic: bool = False, return_attn_probs: bool = False, *,
                    q_descale=None, k_descale=None, v_descale=None, out_dtype=None, s_aux=None):
    """flash-attn compatible forward: q ``(B, Sq, Hq, D)``, k/v ``(B, Sk, Hkv, D)`` -> ``(B, Sq, Hq, D)``.

    flash-attn 2's signature and conventions. Causal masking is bottom-right aligned, as in
    flash-attn >= 2.1. ``window_size=(left, right)`` (``-1``: unbounded; Mistral-style sliding
    windows) and ``softcap > 0`` (``softcap * tanh(scale * q·k / softcap)``, Gemma 2) run the
    packed kernel of :func:`rocmflash.flash_attn_varlen_func` on views of the batch (one sequence
    per batch row, no copies for contiguous inputs); differentiable like the plain call.
    ``deterministic=True`` keeps a call that needs gradients on rocmflash's kernels, whose backward is
    deterministic (no atomics), where the database would serve the platform's SDPA (its flash backward is not);
    so does ``torch.use_deterministic_algorithms(True)`` for every entry point.
    ``return_attn_probs=True`` returns ``(out, softmax_lse, None)`` as flash-attn does without
    dropout (``softmax_lse`` fp32 ``(B, Hq, Sq)``; the attention matrix is never formed).
    Not implemented, each a one-line error: dropout (``dropout_p`` other than 0) and ALiBi
    (``alibi_slopes`` other than None).

    fp8 q/k/v (flash-attn 3): pass ``q_descale``/``k_descale``/``v_descale`` (fp32 ``(B, Hkv)``);
    the output is bf16, or ``out_dtype=torch.float16``. Plain or causal attention only (no window,
    no softcap), inference only; see :func:`attention` and :mod:`rocmflash.api.fp8`.

    ``s_aux`` (keyword only, not in flash-attn 2; vLLM's name): attention sinks, a float ``(Hq,)`` tensor of
    per-query-head logits joined to the softmax denominator (gpt-oss); see :func:`attention`'s ``sinks``. With
    windows and soft-capping too (the packed kernel takes them); not with fp8.
    """
    plain = s_aux is None and alibi_slopes is None and type(window_size) is tuple and window_size == (-1, -1) \
        and type(softcap) is float and softcap == 0.0 and type(dropout_p) is float and dropout_p == 0.0 \
        and (deterministic is True or deterministic is False) \
        and (return_attn_probs is True or return_attn_probs is False)  # options a kept plan may skip checking
    default = plain and q_descale is None and k_descale is None and v_descale is None and out_dtype is None
    if default:  # a signature that passed the checks before: its plan, no checks (the common repeat call)
        plan = _planned(q, k, v, causal, softmax_scale, "bshd")
        if plan is not None:
            call = plan[0]
            if call.serving and not return_attn_probs:  # the entry's incumbent on (B, H, S, D) views
                serve = served_incumbent(call, q, k, v, deterministic)
                if serve is not None:
                    return serve(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 softmax_scale).transpose(1, 2).contiguous()
        if plan is not None and _kv_signature(k, v) == plan[1]:
            out, lse = _OPS[0].attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal,
                                                 call.scale if softmax_scale is None else softmax_scale, "online",
                                                 None, return_attn_probs, call, deterministic)
            out = out.transpose(1, 2).contiguous()
            return (out, lse, None) if return_attn_probs else out
    sig = None
    if plain and q_descale is not None:  # fp8: a signature checked before skips it
        sig = _fp8_plans().signature(q, k, v, causal, softmax_scale, return_attn_probs,
                                     (q_descale, k_descale, v_descale), out_dtype, "bshd")
        plan = _fp8_plans().planned(sig)
        if plan is not None:
            out, lse = _fp8_plans().run(plan, q, k, v, q_descale, k_descale, v_descale)
            out = out.transpose(1, 2)  # (B, S, H, D) memory: contiguous
            return (out, lse, None) if return_attn_probs else out
    fp8_in = _is_fp8(q)
    if not fp8_in:
        if q_descale is not None or k_descale is not None or v_descale is not None or out_dtype is not None:
            refuse_descales(q_descale, k_descale, v_descale, out_dtype, getattr(q, "dtype", None))
        _check_inputs(q, k, v, softmax_scale, layout="(B, S, H, D)")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p}: rocmflash does not implement attention dropout; use dropout_p=0.0")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: rocmflash does not implement ALiBi biases; pass alibi_slopes=None")
    for name, flag in (("deterministic", deterministic), ("return_attn_probs", return_attn_probs)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if not fp8_in and type(window_size) is tuple and window_size == (-1, -1) and type(softcap) is float \
            and softcap == 0.0:
        banded = False  # the defaults: what check_options checks beyond the above passed (scale: _check_inputs)
    else:
        from rocmflash.api.varlen_checks import check_options

        left, right = check_options(softmax_scale, causal, window_size, softcap)
        banded = _banded(left, right, causal) or softcap > 0
    if fp8_in:
        if s_aux is not None:
            raise ValueError(_FP8_SINKS.replace("sinks:", "s_aux:", 1))
        if banded:
            raise NotImplementedError("window_size/softcap with fp8 inputs: rocmflash's fp8 kernel runs plain or "
                                      "causal attention only; pass window_size=(-1, -1) and softcap=0.0")
        out, lse = _fp8_run(q, k, v, causal, softmax_scale, None, return_attn_probs,
                            (q_descale, k_descale, v_descale), out_dtype, bshd=True, plan_signature=sig)
        out = out.transpose(1, 2)  # (B, S, H, D) memory: contiguous
        return (out, lse, None) if return_attn_probs else out
    if banded:
        _check_shapes(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out, lse = _batch_as_packed(q, k, v, softmax_scale, causal, tuple(window_size), float(softcap), s_aux)
    else:
        # the kernels take any strides: work on (B, H, S, D) views, no copies; for contiguous
        # (B, S, H, D) inputs the op's output is (B, S, H, D) in memory, so this is contiguous
        out, lse = _run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, softmax_scale,
                        "online", None, return_attn_probs, deterministic=deterministic, sinks=s_aux,
                        sinks_name="s_aux")
        if default:
            _keep_plan(q, k, v, causal, "bshd")
        out = out.transpose(1, 2).contiguous()
    return (out, lse, None) if return_attn_probs else out


_FP8_PLANS = []
_FP8_SINKS = "sinks: fp8 attention (rocmflash.kernels.fp8.forward) has no attention-sink support; pass fp16/bf16 q/k/v"


def _fp8_plans():
    """:mod:`rocmflash.api.fp8_plans`, imported on first use and then kept (no import statement per call)."""
    if not _FP8_PLANS:
        from rocmflash.api import fp8_plans

        _FP8_PLANS.append(fp8_plans)
    return _FP8_PLANS[0]


def _is_fp8(q) -> bool:
    return isinstance(q, torch.Tensor) and is_fp8(q.dtype)


def _fp8_run(q, k, v, causal, softmax_scale, config, return_lse, descales, out_dtype, bshd: bool,
             plan_signature=None):
    """Check fp8 q/k/v (one fp8 dtype, 4-D, one device) and run :func:`rocmflash.api.fp8.attention_fp8`
    on ``(B, H, S, D)`` views; ``bshd``: the inputs are ``(B, S, H, D)`` and so is the output's memory.
    ``plan_signature``: the call's :func:`rocmflash.api.fp8_plans.signature` (its plan is kept once it passed)."""
    names, layout = ("q", "k", "v"), "(B, S, H, D)" if bshd else "(B, H, S, D)"
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")
    for name, t in zip(names[1:], (k, v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must match q.dtype ({q.dtype}): fp8 q, k and v share one format")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all must share a device")
    check_device("q", q)
    check_softmax_scale(softmax_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if bshd:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    _check_shapes(q, k, v)
    D = q.shape[3]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    if config is None:  # the measured entry of these inputs' format (tune --dtype fp8), else the fp8 default
        from rocmflash.api.selection_fp8 import select_fp8_config

        config = select_fp8_config(q.device, D, q.dtype, causal, q.shape[1] // max(k.shape[1], 1), k.shape[2])
    return attention_fp8(q, k, v, causal, scale, config, bool(return_lse), *descales, out_dtype, out_bshd=bshd,
                         plan_signature=plan_signature)


def _banded(left: int, right: int, causal: bool) -> bool:
    """Whether ``window_size`` bounds a side that plain (causal or not) attention leaves open."""
    from rocmflash.kernels.masks import UNBOUNDED

    return left < UNBOUNDED or (right < UNBOUNDED and not causal)


_CU_SEQLENS: dict = {}  #: (batch, length, device) -> int32 (batch + 1,) offsets of equal-length sequences


def _equal_offsets(batch: int, length: int, device) -> torch.Tensor:
    """``[0, length, 2 * length, ...]`` on ``device``, made once per (batch, length, device)."""
    key = (batch, length, device)
    cu = _CU_SEQLENS.get(key)
    if cu is None:
        if len(_CU_SEQLENS) >= 256:
            _CU_SEQLENS.clear()
        cu = _CU_SEQLENS[key] = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device) \
            if length else torch.zeros(batch + 1, dtype=torch.int32, device=device)
    return cu


def _batch_as_packed(q, k, v, softmax_scale, causal: bool, window_size: tuple, softcap: float, sinks=None):
    """A ``(B, S, H, D)`` batch through the packed (varlen) kernel: ``(out (B, Sq, Hq, D), lse (B, Hq, Sq))``
    (:func:`rocmflash.api.varlen_kernel.packed_forward`: ``flash_attn_varlen_func``'s kernel path, LSE returned).

    Every batch row is one sequence of the same length, so the packed views are reshapes
    (views for inputs contiguous over batch and sequence) and the offsets are known without
    reading anything back from the GPU.
    """
    from rocmflash.api.varlen_kernel import packed_forward

    B, Sq, Hq, D = q.shape
    Sk = k.shape[1]
    cu_q, cu_k = _equal_offsets(B, Sq, q.device), _equal_offsets(B, Sk, q.device)
    out, lse = packed_forward(q.reshape(B * Sq, Hq, D), k.reshape(B * Sk, k.shape[2], D),
                              v.reshape(B * Sk, v.shape[2], D), cu_q, cu_k, Sq, Sk, softmax_scale, causal,
                              window_size, softcap, sinks)
    return out.view(B, Sq, Hq, D), lse.view(Hq, B, Sq).transpose(0, 1)


__all__ = ["attention", "flash_attn_func"]
