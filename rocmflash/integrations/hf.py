"""HuggingFace transformers integration: ``attn_implementation="rocmflash"``.

::

    import rocmflash.integrations.hf as rf_hf
    rf_hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="rocmflash",
                                                 torch_dtype=torch.bfloat16)

:func:`register` adds two entries under the name ``"rocmflash"``:

* ``AttentionInterface.register("rocmflash", rocmflash_attention_forward)``
* ``AttentionMaskInterface.register("rocmflash", sdpa_mask)`` -- the same mask function as
  ``"sdpa"``; without a mask function transformers would build no causal mask at all.
  ``sdpa_mask`` returns ``None`` when the mask is the plain causal (or no) mask, so those
  layers take rocmflash's ``is_causal`` path; a real mask (padding, sliding window,
  packed sequences, ...) arrives as a tensor.

transformers takes any implementation name containing "flash" for a flash-attn kernel
and tries to preload it when a model is built; :func:`register` makes that preload a
no-op for the name it registers (see :func:`_skip_flash_preload`).

:func:`rocmflash_attention_forward` mirrors transformers' ``sdpa_attention_forward``
decision for decision (``is_causal`` only for ``q_len > 1`` without a mask; the
static-cache prefill crop of keys to ``q_len``) and routes each call to the rocmflash
kernel that computes it identically:

* no mask: the dense kernel (GQA through ``module.num_key_value_groups`` natively: K/V
  are not repeated);
* a padded batch (left or right padding, during training, prefill or ``generate()``), with
  or without a sliding window: the boolean 4-D mask is checked to be exactly "padding +
  causal/window" (:func:`padded_layout`), then the tokens are unpadded, run through
  :func:`rocmflash.flash_attn_varlen_func` and re-padded (padded query rows get 0);
* soft-capping (Gemma 2) or a sliding window without a mask: the varlen kernel;
* a ``generate()`` step (one new token, no padding mask): the split-KV decode kernel of
  :func:`rocmflash.flash_attn_with_kvcache`, reading transformers' cache tensors in place.

Every other call (dropout, fp32, other mask patterns, position bias, attention sinks,
``output_attentions``, ...) goes to transformers' own ``sdpa_attention_forward`` with the
original arguments and a one-time ``RuntimeWarning`` naming the reason, so results are
never silently different. The output is ``(B, S, H, D)`` and contiguous, like SDPA's.
"""

from __future__ import annotations

import math
import os
import warnings

import torch

NAME = "rocmflash"
_STATS = {"rocmflash": 0, "sdpa": 0, "decode": 0}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _sdpa_forward():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def _unroutable_reason(query, key, value, dropout, kwargs):
    """Why rocmflash cannot compute this call exactly (None: it can), apart from the mask."""
    if dropout not in (0, 0.0):
        return "attention dropout"
    for name in ("position_bias", "cache", "sinks", "s_aux"):
        if kwargs.get(name) is not None:
            return f"the {name!r} argument"
    if kwargs.get("output_attentions", False):
        return "output_attentions=True"
    dtype = query.dtype
    if dtype not in (torch.float16, torch.bfloat16) or key.dtype != dtype or value.dtype != dtype:
        return f"dtype {dtype} (rocmflash runs fp16/bf16)"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "non-4-D query/key/value"
    if not (query.device.type == "cuda" or (query.device.type == "cpu" and _interpreting())):
        return f"tensors on {query.device.type}"
    D = query.shape[-1]
    if key.shape[-1] != D or value.shape[-1] != D or not 16 <= D <= 256:
        return f"head dims q {D}, k {key.shape[-1]}, v {value.shape[-1]} (rocmflash needs equal head dims in 16..256)"
    if key.shape != value.shape or key.shape[0] != query.shape[0]:
        return "key/value shapes that differ"
    Hq, Hkv = query.shape[1], key.shape[1]
    if Hkv == 0 or Hq % Hkv:
        return f"{Hq} query heads over {Hkv} key/value heads"
    if min(query.shape[0], Hq, query.shape[2], key.shape[2]) == 0:
        return "an empty batch"
    softcap = kwargs.get("softcap")
    if softcap is not None and not (softcap > 0 and math.isfinite(softcap)):
        return f"softcap={softcap}"
    return None


_WARNED: set = set()


def _fall_back(reason, module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """transformers' own SDPA path, with the original arguments; one warning per distinct reason."""
    _STATS["sdpa"] += 1
    if reason not in _WARNED and not torch.compiler.is_compiling():
        _WARNED.add(reason)
        warnings.warn(f"rocmflash: this attention call runs transformers' SDPA instead ({reason}); "
                      "later calls for the same reason fall back silently", RuntimeWarning, stacklevel=3)
    return _sdpa_forward()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                           is_causal=is_causal, **kwargs)


def _window_left(sliding_window):
    """transformers' sliding window ``W`` (``kv > q - W``) as flash-attn's left window ``W - 1``."""
    return -1 if not sliding_window else int(sliding_window) - 1


def padded_layout(mask, q_len: int, kv_len: int, causal: bool, window_left: int):
    """Read a padded batch from transformers' boolean 4-D mask, or None when the mask is anything else.

    Queries are the last ``q_len`` of ``kv_len`` positions (transformers' convention). A key
    is real when some query may attend it; a query is real when its own position's key is.
    The mask is accepted only if, on the real queries, it equals the band (causal and/or
    window) over the real tokens *in order* -- exactly what the varlen kernel computes on
    the unpadded sequences. Returns ``(valid_q (B, Sq), valid_k (B, Sk), lens_q, lens_k)``.
    """
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
        return None
    B = mask.shape[0]
    m = mask[:, 0].expand(B, q_len, kv_len)
    valid_k = m.any(1)
    valid_q = valid_k[:, kv_len - q_len:] if kv_len >= q_len else m.any(2)
    lens_q, lens_k = valid_q.sum(1), valid_k.sum(1)
    rank_q = valid_q.cumsum(1) - 1
    rank_k = valid_k.cumsum(1) - 1
    rel = rank_k[:, None, :] - rank_q[:, :, None] - (lens_k - lens_q)[:, None, None]
    expected = valid_q[:, :, None] & valid_k[:, None, :]
    if causal:
        expected &= rel <= 0
    if window_left >= 0:
        expected &= rel >= -window_left
    if not torch.equal(m & valid_q[:, :, None], expected):
        return None
    return valid_q, valid_k, lens_q, lens_k


def _cu(lengths):
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


def _varlen_padded(query, key, value, layout, causal, scale, window_left, softcap):
    """Unpad, run :func:`rocmflash.flash_attn_varlen_func`, re-pad (padded query rows get 0)."""
    from rocmflash.varlen import flash_attn_varlen_func

    valid_q, valid_k, lens_q, lens_k = layout
    B, Hq, Sq, D = query.shape
    Hkv, Sk = key.shape[1], key.shape[2]
    idx_q = valid_q.reshape(-1).nonzero().squeeze(1)
    idx_k = valid_k.reshape(-1).nonzero().squeeze(1)
    q = query.transpose(1, 2).reshape(B * Sq, Hq, D)
    k = key.transpose(1, 2).reshape(B * Sk, Hkv, D)
    v = value.transpose(1, 2).reshape(B * Sk, Hkv, D)
    unpadded = idx_q.numel() == B * Sq and idx_k.numel() == B * Sk  # a mask with no padding: nothing to gather
    if not unpadded:
        q, k, v = q.index_select(0, idx_q), k.index_select(0, idx_k), v.index_select(0, idx_k)
    max_q, max_k = (int(x) for x in torch.stack([lens_q.max(), lens_k.max()]).tolist())
    # the lengths come from the mask here (their maxima read above): no second host read of them
    out = flash_attn_varlen_func(q, k, v, _cu(lens_q), _cu(lens_k), max_q, max_k, softmax_scale=scale,
                                 causal=causal, window_size=(window_left, -1), softcap=softcap or 0.0,
                                 check_values=False)
    if unpadded:
        return out.reshape(B, Sq, Hq, D)
    padded = out.new_zeros(B * Sq, Hq, D).index_copy(0, idx_q, out)
    return padded.view(B, Sq, Hq, D)


def rocmflash_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                scaling=None, is_causal=None, **kwargs):
    """transformers attention function: ``(B, H, S, D)`` in, ``((B, S, H, D) output, None)`` out.

    Routes: no mask -> the dense kernel (or the decode kernel for a few new tokens over a
    KV cache); a padded batch (left or right padding, sliding windows) -> unpad, the varlen
    kernel, re-pad; soft-capping -> the varlen kernel. Anything rocmflash would not compute
    identically goes to transformers' SDPA with a one-time warning that names the reason.
    """
    args = (module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
    reason = _unroutable_reason(query, key, value, dropout, kwargs)
    if reason is not None:
        return _fall_back(reason, *args)
    q_len, kv_len = query.shape[2], key.shape[2]
    scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    softcap = kwargs.get("softcap")
    window_left = _window_left(kwargs.get("sliding_window"))
    module_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is None and q_len == 1 and kv_len > 1 and not torch.compiler.is_compiling():
        # a generate() step over the KV cache with no padding: the split-KV decode kernel reads the
        # cache in place ((B, Hkv, S, D) as a strided (B, S, Hkv, D) view: no copy)
        from rocmflash.decode import flash_attn_with_kvcache

        _STATS["rocmflash"] += 1
        _STATS["decode"] += 1
        out = flash_attn_with_kvcache(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                      softmax_scale=scale, window_size=(window_left, -1), softcap=softcap or 0.0)
        return out.contiguous(), None
    needs_varlen = attention_mask is not None or bool(softcap) or window_left >= 0
    if needs_varlen and torch.compiler.is_compiling():
        return _fall_back("torch.compile tracing a padded, windowed or soft-capped call (the varlen path "
                          "reads sequence lengths on the host)", *args)
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            return _fall_back(f"an attention mask of type {type(attention_mask).__name__}", *args)
        layout = padded_layout(attention_mask, q_len, kv_len, bool(module_causal), window_left)
        if layout is None:
            return _fall_back("an attention mask that is not padding + causal/sliding window", *args)
        _STATS["rocmflash"] += 1
        return _varlen_padded(query, key, value, layout, bool(module_causal), scale, window_left, softcap), None

    # the same decision as transformers' sdpa_attention_forward
    causal = bool(q_len > 1 and module_causal)  # attention_mask is None here
    if causal and kv_len > q_len:
        # transformers' SDPA path crops the (static-cache) keys to q_len and applies a
        # top-left causal mask; do the same, then Sq == Sk and both alignments agree
        key = key[:, :, :q_len, :]
        value = value[:, :, :q_len, :]
    elif causal and kv_len < q_len:
        return _fall_back("a causal call with fewer keys than queries (SDPA aligns it top-left)", *args)
    _STATS["rocmflash"] += 1
    if softcap or window_left >= 0:
        lens_q = torch.full((query.shape[0],), q_len, dtype=torch.int64, device=query.device)
        lens_k = torch.full((query.shape[0],), key.shape[2], dtype=torch.int64, device=query.device)
        ones_q = torch.ones(query.shape[0], q_len, dtype=torch.bool, device=query.device)
        ones_k = torch.ones(query.shape[0], key.shape[2], dtype=torch.bool, device=query.device)
        return _varlen_padded(query, key, value, (ones_q, ones_k, lens_q, lens_k), causal, scale,
                              window_left, softcap), None
    from rocmflash.ops import attention_op

    out, _ = attention_op(query, key, value, causal=causal, scale=scale, need_lse=False)
    # (B, H, S, D) -> (B, S, H, D); free when q was a transposed (B, S, H, D) projection
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> str:
    """Register rocmflash's attention and mask functions with transformers under ``name``.

    Idempotent. Returns the name, to pass as ``attn_implementation``.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, rocmflash_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    _REGISTERED.add(name)
    _skip_flash_preload()
    return name


_REGISTERED: set = set()


def _skip_flash_preload() -> None:
    """Keep transformers from treating ``"rocmflash"`` as a flash-attn *kernel* to download.

    transformers (5.x) decides "is this flash attention?" by ``"flash" in name`` and then,
    in ``PreTrainedModel._check_and_adjust_attn_implementation``, preloads the flash-attn
    package or a hub kernel of that name -- which fails for a registered attention
    function whose name merely contains "flash". The preload is skipped for the names
    registered here and nothing else (the model's forward never uses that preload: it
    calls the registered function).
    """
    try:
        import transformers.modeling_utils as mu
    except ImportError:  # pragma: no cover
        return
    original = getattr(mu, "lazy_import_flash_attention", None)
    if original is None or getattr(original, "_rocmflash_wrapped", False):
        return

    def lazy_import_flash_attention(implementation, *args, **kwargs):
        if implementation in _REGISTERED:
            return None
        return original(implementation, *args, **kwargs)

    lazy_import_flash_attention._rocmflash_wrapped = True
    lazy_import_flash_attention.__wrapped__ = original
    mu.lazy_import_flash_attention = lazy_import_flash_attention


def stats() -> dict:
    """Calls that ran rocmflash (``decode``: of those, the ones through the KV-cache decode kernel) and calls
    passed to transformers' SDPA path (since import)."""
    return dict(_STATS)


__all__ = ["register", "rocmflash_attention_forward", "stats", "NAME"]
