"""``flash_attn_varlen_func``: packed (variable-length) attention, flash-attn's argument conventions.

Packed training and the prefill of many prompts hand attention one ``(total, H, D)``
tensor per operand plus cumulative sequence lengths instead of a padded batch: no padding
is stored or computed. Code written for flash-attn switches by changing the import::

    from rocmflash import flash_attn_varlen_func
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 causal=True)

Forward and backward (autograd), GQA/MQA, bottom-right causal per sequence, sliding
windows ``(left, right)``, tanh soft-capping, head dims 16..256, zero-length sequences.
Bad input raises ``ValueError``/``TypeError`` naming the argument before any kernel runs;
checking the values of ``cu_seqlens`` reads them on the host (one small copy), except
while a CUDA/HIP graph is being captured, where reading is impossible and only shapes and
dtypes are checked.
"""

from __future__ import annotations

import math
from typing import Optional

from rocmflash.compat import require_supported_versions

require_supported_versions()

import torch  # noqa: E402

from rocmflash.kernels import masks as M  # noqa: E402
from rocmflash.kernels import varlen as VK  # noqa: E402
from rocmflash.kernels import launch as L  # noqa: E402
from rocmflash.kernels.launch import check_device  # noqa: E402
from rocmflash.scale import check_softmax_scale  # noqa: E402

_DTYPES = (torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------- validation
def _check_tensor(name: str, t, ndim: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")


def check_qkv(q, k, v, layout_q: str = "(total_q, Hq, D)", layout_kv: str = "(total_k, Hkv, D)") -> None:
    """Types, ranks, dtypes, devices, head dim (16..256) and the GQA ratio of packed q/k/v."""
    _check_tensor("q", q, 3, layout_q)
    _check_tensor("k", k, 3, layout_kv)
    _check_tensor("v", v, 3, layout_kv)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype must be torch.float16 or torch.bfloat16, got {t.dtype}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must match q.dtype ({q.dtype})")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all must share a device")
    check_device("q", q)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    D = q.shape[2]
    if k.shape[2] != D:
        raise ValueError(f"q, k and v must share the head dim: q has {D}, k/v have {k.shape[2]}")
    if not 16 <= D <= 256:
        raise ValueError(f"head dim must be in 16..256, got {D}")
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"number of query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")


def check_options(softmax_scale, causal, window_size, softcap) -> tuple[int, int]:
    """Validate the scalar options; returns the band ``(left, right)`` for the kernels."""
    check_softmax_scale(softmax_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right) of ints >= -1, got {window_size!r}")
    for side, w in zip(("left", "right"), window_size):
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"window_size {side} must be an int, got {type(w).__name__}")
        if w < -1:
            raise ValueError(f"window_size {side} must be >= -1 (-1 = unbounded), got {w}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if not math.isfinite(float(softcap)) or softcap < 0:
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off), got {softcap}")
    return M.band_offsets(causal, tuple(window_size))


def _capturing(device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_cu_seqlens(name: str, cu, total: int, max_seqlen, device, batch: Optional[int] = None,
                     read_values: bool = True) -> int:
    """Check a cumulative-lengths tensor against its packed operand; returns the batch size.

    Shape and dtype always; values (starts at 0, non-decreasing, ends at ``total``, no
    sequence longer than ``max_seqlen``) when ``read_values`` and no graph is being captured.
    """
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; all must share a device")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"{name} has {cu.shape[0]} entries but cu_seqlens_q has {batch + 1}; "
                         "both must be (batch + 1,)")
    mname = name.replace("cu_seqlens", "max_seqlen")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise ValueError(f"{mname} must be an int >= 0, got {max_seqlen!r}")
    if not read_values or _capturing(device):
        return cu.shape[0] - 1
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    if values[-1] != total:
        raise ValueError(f"{name}[-1] ({values[-1]}) must equal the number of packed tokens ({total})")
    lengths = [b - a for a, b in zip(values, values[1:])]
    if any(n < 0 for n in lengths):
        bad = next(i for i, n in enumerate(lengths) if n < 0)
        raise ValueError(f"{name} must be non-decreasing; it drops at index {bad + 1} ({values[bad]} -> {values[bad + 1]})")
    if lengths and max(lengths) > max_seqlen:
        raise ValueError(f"{mname}={max_seqlen} is smaller than the longest sequence in {name} ({max(lengths)})")
    return cu.shape[0] - 1


# ----------------------------------------------------------------------------- configs
def _forward_config(device, head_dim: int, dtype, causal: bool, group: int, max_seqlen_k: int, softcap: float,
                    window_left: int):
    """The forward config, cached per problem and bucket: the measured varlen entry of the nearest bucket
    (``rocmflash tune --mode varlen``), else the dense problem's (database entry or per-arch default). On
    AMD the tile becomes the one the varlen kernel needs when a cap or a left window adds registers (the
    tune measured neither)."""
    from rocmflash.selection import device_identity, select_varlen_config

    fwd = select_varlen_config(device, head_dim, dtype, causal, group, max(1, max_seqlen_k))
    _, arch = device_identity(device)
    return VK.amd_forward_tile(fwd, arch, head_dim, softcap > 0, window_left < M.UNBOUNDED)


def _backward_config(device, dtype, call: VK.VarlenCall):
    """The backward config, chosen when a backward runs (a forward-only call never reads a backward entry
    nor builds one): :func:`rocmflash.selection.select_varlen_bwd_config` -- the measured ``varlen-bwd-``
    entry of the nearest bucket (``rocmflash tune --mode varlen --pass bwd``), else the dense ``bwd-``
    entry, else the per-arch default, each kernel checked to build as the varlen kernel with this call's
    cap and window. Cached per problem, bucket and flags."""
    from rocmflash.selection import select_varlen_bwd_config

    return select_varlen_bwd_config(device, call.head_dim, dtype, call.win_right == 0, call.group,
                                    max(1, call.max_seqlen_k), call.softcap > 0, call.win_left < M.UNBOUNDED)


# ----------------------------------------------------------------------------- autograd
class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, call, fwd_cfg, need_lse):
        out = torch.empty_like(q)
        needs_grad = any(ctx.needs_input_grad[:3])
        lse = None
        if need_lse or needs_grad:
            lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
        if q.shape[0]:
            with L.on_device(q):
                VK.launch_forward(call, q, k, v, cu_q, cu_k, fwd_cfg, out, lse)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.call = call
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        if q.shape[0] == 0 or k.shape[0] == 0:
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None, None, None, None
        bwd_cfg = _backward_config(q.device, q.dtype, ctx.call)
        with L.on_device(q):
            dq, dk, dv = VK.launch_backward(ctx.call, dout, q, k, v, out, lse,
                                            dlse.contiguous() if dlse is not None else None, cu_q, cu_k, bwd_cfg)
        return dq, dk, dv, None, None, None, None, None


# ----------------------------------------------------------------------------- public
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: tuple = (-1, -1), softcap: float = 0.0, return_lse: bool = False, *,
                           check_values: bool = True):
    """Attention over packed variable-length sequences (flash-attn's ``flash_attn_varlen_func``).

    Args:
        q: ``(total_q, Hq, D)`` fp16/bf16; sequence ``b`` is rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``.
        k, v: ``(total_k, Hkv, D)``; ``Hq % Hkv == 0`` (query head ``h`` uses K/V head ``h // (Hq // Hkv)``).
        cu_seqlens_q, cu_seqlens_k: int32 ``(batch + 1,)``, from 0 to the packed length, non-decreasing
            (zero-length sequences allowed).
        max_seqlen_q, max_seqlen_k: the longest sequence of each (sizes the grid).
        dropout_p: must be 0 (dropout is not implemented).
        softmax_scale: defaults to ``1/sqrt(D)``.
        causal: bottom-right aligned per sequence (query ``i`` sees key ``j <= i + Sk_b - Sq_b``).
        window_size: ``(left, right)`` sliding window, ``-1`` = unbounded on that side; query ``i``
            sees keys ``[i + shift - left, i + shift + right]``; ``causal`` sets ``right = 0``.
        softcap: ``> 0`` caps scores as ``softcap * tanh(scale * q·k / softcap)`` (Gemma 2).
        return_lse: also return the fp32 natural-log LSE, ``(Hq, total_q)``.

    Returns:
        ``(total_q, Hq, D)`` in q's dtype (rows that see no key are 0 with LSE ``-inf``), or
        ``(out, lse)``. Differentiable in q, k and v (and through the LSE).

    ``check_values=False`` (keyword only, not in flash-attn) skips the host read of the
    cumulative lengths' *values* -- the one step that makes a call wait for the GPU (twice: q's
    and k's). Shapes, dtypes and devices are always checked. Use it in a training or prefill loop
    whose lengths are built by the caller and known to be valid (start at 0, non-decreasing, end
    at the packed lengths, no sequence longer than ``max_seqlen_*``): wrong values then read
    outside the tensors instead of raising. (A captured graph skips the read anyway.)
    """
    check_qkv(q, k, v)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p}: rocmflash does not implement attention dropout; "
                                  "use dropout_p=0.0")
    left, right = check_options(softmax_scale, causal, window_size, softcap)
    if not isinstance(check_values, bool):
        raise TypeError(f"check_values must be a bool, got {type(check_values).__name__}")
    batch = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, q.device,
                             read_values=check_values)
    check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, q.device, batch,
                     read_values=check_values)
    D = q.shape[2]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    call = VK.VarlenCall(batch, q.shape[1], k.shape[1], D, int(max_seqlen_q), int(max_seqlen_k), scale,
                         float(softcap), left, right)
    fwd_cfg = _forward_config(q.device, D, q.dtype, right == 0, call.group, int(max_seqlen_k), float(softcap), left)
    out, lse = _VarlenAttention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, call, fwd_cfg, bool(return_lse))
    return (out, lse) if return_lse else out


__all__ = ["flash_attn_varlen_func"]
