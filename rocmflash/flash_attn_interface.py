"""flash-attn 3's Python interface (``hopper/flash_attn_interface.py``, installed as ``flash_attn_interface``).

Code written for flash-attn 3 switches by changing the import::

    from rocmflash.flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

Each function has flash-attn 3's signature (argument order, names, defaults; checked against a copy of them in
``tests/data/flash_attn_3_signatures.json``) and returns what it returns: ``out``, or ``(out, softmax_lse)`` with
``return_attn_probs=True``; ``flash_attn_with_kvcache`` returns ``out``, or with ``return_softmax_lse=True``
flash-attn 3's four values ``(out, softmax_lse, out_accum, softmax_lse_accum)`` -- the split partials are
rocmflash's kernels' own business, so the last two are empty tensors, as flash-attn 3's are when it does not
split. They run rocmflash's entry points (:func:`rocmflash.flash_attn_func`, :func:`rocmflash.flash_attn_varlen_func`,
:func:`rocmflash.flash_attn_with_kvcache`), so their semantics and errors are those.

Scheduling hints change no result and are taken as such: ``num_splits`` (the decode kernel's split count in
``flash_attn_with_kvcache``; elsewhere rocmflash's tuned choice stands), ``pack_gqa`` and ``sm_margin``.
What rocmflash does not implement raises a one-line ``NotImplementedError`` naming it: ``qv``,
``attention_chunk != 0``, fp8 descales outside the dense forward and the fp8 KV cache, ``scheduler_metadata``,
``rotary_seqlens``, and ``flash_attn_with_kvcache``'s varlen queries (``cu_seqlens_q``, ``cu_seqlens_k_new``,
``max_seqlen_q``).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from rocmflash.api import attention as _attention
from rocmflash.api import decode as _decode
from rocmflash.api import varlen as _varlen


def _refuse(name: str, given: bool, how: str = "") -> None:
    if given:
        raise NotImplementedError(f"rocmflash: {name} is not implemented{how}")


def _check_hints(num_splits, pack_gqa, sm_margin) -> None:
    """flash-attn 3's scheduling hints: accepted when well formed (they change no result)."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 = automatic), got {num_splits!r}")
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"pack_gqa must be None or a bool, got {type(pack_gqa).__name__}")
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int) or sm_margin < 0:
        raise ValueError(f"sm_margin must be an int >= 0, got {sm_margin!r}")


def _refuse_fa3_only(qv, attention_chunk) -> None:
    _refuse("qv (an extra query operand against v)", qv is not None)
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int):
        raise TypeError(f"attention_chunk must be an int, got {type(attention_chunk).__name__}")
    _refuse(f"chunked attention (attention_chunk={attention_chunk})", attention_chunk != 0, "; pass 0")


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    """flash-attn 3's ``flash_attn_func``: q ``(B, Sq, Hq, D)``, k/v ``(B, Sk, Hkv, D)`` -> ``out``, or
    ``(out, softmax_lse)`` (fp32 ``(B, Hq, Sq)``) with ``return_attn_probs``. :func:`rocmflash.flash_attn_func`
    (fp8 q/k/v with fp32 ``(B, Hkv)`` descales: bf16 output, plain or causal, inference only)."""
    _refuse_fa3_only(qv, attention_chunk)
    _check_hints(num_splits, pack_gqa, sm_margin)
    got = _attention.flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size, softcap, None, deterministic,
                                     return_attn_probs, q_descale=q_descale, k_descale=k_descale,
                                     v_descale=v_descale)
    return got[:2] if return_attn_probs else got


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None, k_descale=None,
                              v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                              deterministic=False, num_heads_q=None, sm_margin=0, return_attn_probs=False):
    """flash-attn 3's ``flash_attn_qkvpacked_func``: ``qkv (B, S, 3, H, D)``, or ``(B, S, Hq + 2 * Hkv, D)`` with
    ``num_heads_q`` (GQA), split into views -> as :func:`flash_attn_func`."""
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.ndim == 5 and qkv.shape[2] == 3:
        q, k, v = qkv.unbind(dim=2)
    elif qkv.ndim == 4 and num_heads_q is not None:
        if isinstance(num_heads_q, bool) or not isinstance(num_heads_q, int) or not 0 < num_heads_q < qkv.shape[2] \
                or (qkv.shape[2] - num_heads_q) % 2:
            raise ValueError(f"num_heads_q must be an int with qkv's {qkv.shape[2]} heads = num_heads_q + "
                             f"2 * kv heads, got {num_heads_q!r}")
        hkv = (qkv.shape[2] - num_heads_q) // 2
        q, k, v = qkv.split([num_heads_q, hkv, hkv], dim=2)
    else:
        raise ValueError(f"qkv must be (B, S, 3, H, D), or (B, S, Hq + 2 * Hkv, D) with num_heads_q, got shape "
                         f"{tuple(qkv.shape)} and num_heads_q={num_heads_q!r}")
    return flash_attn_func(q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale, window_size,
                           attention_chunk, softcap, 1, None, deterministic, sm_margin, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                           seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                           v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False, *,
                           check_values=False):
    """flash-attn 3's ``flash_attn_varlen_func``: packed q ``(total_q, Hq, D)``, k/v ``(total_k, Hkv, D)`` ->
    ``out``, or ``(out, softmax_lse)`` (fp32 ``(Hq, total_q)``) with ``return_attn_probs``.

    ``seqused_q``/``seqused_k`` (int32 ``(batch,)``): only the first ``seqused_*[b]`` queries/keys of sequence
    ``b``'s span in ``cu_seqlens_*`` take part (:mod:`rocmflash.api.seqused`: the used rows are gathered into a
    packing of their own on the device, no host read; an extra copy of q/k/v); output rows past ``seqused_q[b]``
    are 0 (LSE ``-inf``), and their gradient is 0. A value outside ``0..span`` is clamped into it, or raises with
    ``check_values=True`` (keyword only, rocmflash's: also checks ``cu_seqlens`` on the host).
    :func:`rocmflash.flash_attn_varlen_func` otherwise; fp8 is not implemented for packed sequences.
    """
    _refuse_fa3_only(qv, attention_chunk)
    _check_hints(num_splits, pack_gqa, sm_margin)
    _refuse("fp8 packed attention (q_descale/k_descale/v_descale in flash_attn_varlen_func)",
            q_descale is not None or k_descale is not None or v_descale is not None)
    if seqused_q is not None or seqused_k is not None:
        from rocmflash.api.seqused import varlen_seqused

        return varlen_seqused(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                              softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs,
                              check_values)
    got = _varlen.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0,
                                         softmax_scale, causal, window_size, softcap, None, deterministic,
                                         return_attn_probs, check_values=check_values)
    return got[:2] if return_attn_probs else got


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """flash-attn 3's ``flash_attn_combine``: merge split-KV partials -> ``(out, softmax_lse)``.

    ``out_partial`` fp32 ``(num_splits, B, S, H, D)`` and ``lse_partial`` fp32 ``(num_splits, B, S, H)``, each
    split's normalised output and natural-log LSE. Returns ``out (B, S, H, D)`` in ``out_dtype`` (default fp32;
    fp16/bf16/fp32), written into ``out`` when given (its shape, dtype and device are checked), and the merged
    LSE ``(B, S, H)`` fp32 (a ``(B, H, S)`` tensor's transposed view, as flash-attn 3's). Splits with LSE ``-inf``
    (no key) count for nothing; a row with none gets output 0 and LSE ``-inf``. Torch ops on the device.
    """
    for name, t, ndim in (("out_partial", out_partial, 5), ("lse_partial", lse_partial, 4)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32 or t.ndim != ndim:
            raise ValueError(f"{name} must be a {ndim}-D fp32 tensor, got {t.dtype} {tuple(t.shape)}")
    if lse_partial.shape != out_partial.shape[:4] or lse_partial.device != out_partial.device:
        raise ValueError(f"lse_partial must be (num_splits, B, S, H) = {tuple(out_partial.shape[:4])} on "
                         f"{out_partial.device}, got {tuple(lse_partial.shape)} on {lse_partial.device}")
    dtype = torch.float32 if out_dtype is None else out_dtype
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"out_dtype must be torch.float32, torch.float16 or torch.bfloat16, got {out_dtype}")
    shape = tuple(out_partial.shape[1:])
    if out is not None:
        _check_out(out, shape, dtype, out_partial.device)
    lse = torch.logsumexp(lse_partial, dim=0)  # (B, S, H); -inf where every split is -inf
    finite = torch.isfinite(lse)
    weights = torch.where(finite, torch.exp(lse_partial - torch.where(finite, lse, 0.0)), 0.0)
    merged = (weights.unsqueeze(-1) * out_partial).sum(dim=0)
    lse_out = lse.transpose(1, 2).contiguous().transpose(1, 2)  # flash-attn 3's layout: (B, H, S) memory
    if out is None:
        return merged.to(dtype), lse_out
    out.copy_(merged)
    return out, lse_out


def _check_out(out, shape: tuple, dtype, device) -> None:
    """``out=``: a tensor of the result's shape, dtype and device (one-line errors)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape or out.dtype != dtype or out.device != device:
        raise ValueError(f"out must be {dtype} {shape} on {device}, got {out.dtype} {tuple(out.shape)} on "
                         f"{out.device}")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens: Optional[Union[(int, torch.Tensor)]] = None,
                            cache_batch_idx: Optional[torch.Tensor] = None,
                            cache_leftpad: Optional[torch.Tensor] = None,
                            page_table: Optional[torch.Tensor] = None,
                            cu_seqlens_q: Optional[torch.Tensor] = None,
                            cu_seqlens_k_new: Optional[torch.Tensor] = None, max_seqlen_q: Optional[int] = None,
                            rotary_seqlens: Optional[torch.Tensor] = None, q_descale: Optional[torch.Tensor] = None,
                            k_descale: Optional[torch.Tensor] = None, v_descale: Optional[torch.Tensor] = None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0, pack_gqa=None,
                            sm_margin=0, return_softmax_lse=False, *, check_values=False):
    """flash-attn 3's ``flash_attn_with_kvcache``: :func:`rocmflash.flash_attn_with_kvcache` with ``page_table`` as
    its ``block_table`` -> ``out``, or ``(out, softmax_lse, out_accum, softmax_lse_accum)`` with
    ``return_softmax_lse`` (the last two empty: see the module docstring).

    ``k_descale``/``v_descale`` (fp32 ``(B, Hkv)``) go with an fp8 cache, q stays bf16/fp16 (so ``q_descale`` is not
    implemented); ``num_splits`` is the decode kernel's split count (0 = automatic). ``check_values`` (keyword
    only, rocmflash's): check the lengths, starts and pages on the host.
    """
    _refuse_fa3_only(qv, attention_chunk)
    _check_hints(num_splits, pack_gqa, sm_margin)
    _refuse("q_descale (fp8 queries) in flash_attn_with_kvcache", q_descale is not None,
            "; rocmflash's fp8 cache takes bf16/fp16 q with k_descale/v_descale")
    _refuse("scheduler_metadata (flash-attn 3's precomputed schedule)", scheduler_metadata is not None,
            "; pass None")
    _refuse("rotary_seqlens (rotary positions apart from cache_seqlens)", rotary_seqlens is not None)
    _refuse("varlen queries in flash_attn_with_kvcache (cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q)",
            cu_seqlens_q is not None or cu_seqlens_k_new is not None or max_seqlen_q is not None)
    got = _decode.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                          cache_batch_idx, cache_leftpad, page_table, softmax_scale, causal,
                                          window_size, softcap, rotary_interleaved, None, num_splits,
                                          return_softmax_lse, check_values=check_values, k_descale=k_descale,
                                          v_descale=v_descale)
    if not return_softmax_lse:
        return got
    out, lse = got
    nothing = out.new_empty(0, dtype=torch.float32)
    return out, lse, nothing, nothing.new_empty(0)


__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func", "flash_attn_combine",
           "flash_attn_with_kvcache"]
