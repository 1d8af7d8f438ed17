"""flash-attn 2's packed forms: ``flash_attn_qkvpacked_func``, ``flash_attn_kvpacked_func`` and their varlen twins.

Each is flash-attn 2.8's signature over the unpacked call: ``qkv (..., 3, H, D)`` or ``kv (..., 2, Hkv, D)`` is
split into views (``unbind``: no copy; the kernels take any strides) and handed to
:func:`rocmflash.flash_attn_func` or :func:`rocmflash.flash_attn_varlen_func` with the same options, so the
semantics, the errors and the returns (``out``, or ``(out, softmax_lse, None)`` with ``return_attn_probs``) are
theirs. Gradients reach the packed tensor through the views (autograd stacks the three into one gradient).
"""

from __future__ import annotations

from typing import Optional

import torch

from rocmflash.api.attention import flash_attn_func
from rocmflash.api.varlen import flash_attn_varlen_func


def _unpack(name: str, packed, parts: int, ndim: int, layout: str) -> tuple:
    """``packed``'s ``parts`` operands along its third-to-last dim, as views."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(packed).__name__}")
    if packed.ndim != ndim or packed.shape[-3] != parts:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(packed.shape)}")
    return packed.unbind(dim=-3)


def flash_attn_qkvpacked_func(qkv, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                              causal: bool = False, window_size: tuple = (-1, -1), softcap: float = 0.0,
                              alibi_slopes=None, deterministic: bool = False, return_attn_probs: bool = False):
    """flash-attn 2's ``flash_attn_qkvpacked_func``: ``qkv (B, S, 3, H, D)`` -> ``(B, S, H, D)``.

    :func:`rocmflash.flash_attn_func` on ``qkv[:, :, 0]``, ``qkv[:, :, 1]``, ``qkv[:, :, 2]`` (views), same options
    and returns. For MQA/GQA use :func:`flash_attn_kvpacked_func`.
    """
    q, k, v = _unpack("qkv", qkv, 3, 5, "(B, S, 3, H, D)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                             causal: bool = False, window_size: tuple = (-1, -1), softcap: float = 0.0,
                             alibi_slopes=None, deterministic: bool = False, return_attn_probs: bool = False):
    """flash-attn 2's ``flash_attn_kvpacked_func``: ``q (B, Sq, Hq, D)``, ``kv (B, Sk, 2, Hkv, D)`` ->
    ``(B, Sq, Hq, D)`` (``Hq % Hkv == 0``). :func:`rocmflash.flash_attn_func` on views of ``kv``."""
    k, v = _unpack("kv", kv, 2, 5, "(B, Sk, 2, Hkv, D)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size: tuple = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                                     deterministic: bool = False, return_attn_probs: bool = False):
    """flash-attn 2's ``flash_attn_varlen_qkvpacked_func``: ``qkv (total, 3, H, D)`` with one ``cu_seqlens``
    for queries and keys -> ``(total, H, D)``. :func:`rocmflash.flash_attn_varlen_func` on views of ``qkv``."""
    q, k, v = _unpack("qkv", qkv, 3, 4, "(total, 3, H, D)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                    causal: bool = False, window_size: tuple = (-1, -1), softcap: float = 0.0,
                                    alibi_slopes=None, deterministic: bool = False, return_attn_probs: bool = False):
    """flash-attn 2's ``flash_attn_varlen_kvpacked_func``: ``q (total_q, Hq, D)``, ``kv (total_k, 2, Hkv, D)`` ->
    ``(total_q, Hq, D)``. :func:`rocmflash.flash_attn_varlen_func` on views of ``kv``."""
    k, v = _unpack("kv", kv, 2, 4, "(total_k, 2, Hkv, D)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


__all__ = ["flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func"]
