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
* a ``generate()`` step (one new token): the split-KV decode kernel of
  :func:`rocmflash.flash_attn_with_kvcache`, reading transformers' cache tensors in place; a
  mask of one run of keys per sequence (left padding, a static cache's free slots) passes
  each run's first key as ``cache_leftpad`` and its end as ``cache_seqlens`` (no unpadding).

transformers hands every layer of a forward the same mask tensor: what is read from it (the
padding layout, gather indices, the longest sequence: host reads that wait for the GPU) is
worked out by the first layer and kept for the others while that tensor comes back unchanged.

Every other call (dropout, fp32, other mask patterns, position bias, attention sinks,
``output_attentions``, ...) goes to transformers' own ``sdpa_attention_forward`` with the
original arguments and a one-time ``RuntimeWarning`` naming the reason, so results are
never silently different. The output is ``(B, S, H, D)`` and contiguous, like SDPA's.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import NamedTuple, Optional

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


class _Padded(NamedTuple):
    """How a padded batch is packed for the varlen kernel: gather indices (None: no padding, nothing
    to gather), cumulative lengths and longest sequences (read from the mask, so never checked again)."""

    idx_q: Optional[torch.Tensor]
    idx_k: Optional[torch.Tensor]
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def _padded_plan(layout) -> Optional[_Padded]:
    """A :class:`_Padded` from :func:`padded_layout`'s answer (None stays None): two host reads."""
    if layout is None:
        return None
    valid_q, valid_k, lens_q, lens_k = layout
    idx_q = valid_q.reshape(-1).nonzero().squeeze(1)
    idx_k = valid_k.reshape(-1).nonzero().squeeze(1)
    unpadded = idx_q.numel() == valid_q.numel() and idx_k.numel() == valid_k.numel()
    max_q, max_k = (int(x) for x in torch.stack([lens_q.max(), lens_k.max()]).tolist())
    return _Padded(None if unpadded else idx_q, None if unpadded else idx_k, _cu(lens_q), _cu(lens_k), max_q, max_k)


def _varlen_mask_plan(mask, q_len: int, kv_len: int, causal: bool, window_left: int):
    """``(keys kept, _Padded)`` for a padded batch's boolean 4-D mask, or None when it is not one.

    A static cache's free slots (the key columns after the last one any query may see) are cut
    first, so that the queries are the last ``q_len`` of the kept keys, as :func:`padded_layout`
    reads them (transformers' prefill into a static cache: queries first, free slots after)."""
    kept = kv_len
    if mask.dtype == torch.bool and mask.dim() == 4 and kv_len > q_len:
        seen = mask.any(dim=(0, 1, 2))
        last = int(torch.where(seen, torch.arange(1, kv_len + 1, device=mask.device), 0).max())  # host read
        if q_len <= last < kv_len:
            kept = last
    plan = _padded_plan(padded_layout(mask[..., :kept] if kept < kv_len else mask, q_len, kept, causal,
                                      window_left))
    return None if plan is None else (kept, plan)


def _unpadded_plan(batch: int, q_len: int, kv_len: int, device) -> _Padded:
    """The :class:`_Padded` of a batch without padding (no host read)."""
    def cu(n):
        return torch.arange(0, (batch + 1) * n, n, dtype=torch.int32, device=device)

    return _Padded(None, None, cu(q_len), cu(kv_len), q_len, kv_len)


def _varlen_padded(query, key, value, plan: _Padded, causal, scale, window_left, softcap):
    """Unpad, run :func:`rocmflash.flash_attn_varlen_func`, re-pad (padded query rows get 0)."""
    from rocmflash.varlen import flash_attn_varlen_func

    B, Hq, Sq, D = query.shape
    Hkv, Sk = key.shape[1], key.shape[2]
    q = query.transpose(1, 2).reshape(B * Sq, Hq, D)
    k = key.transpose(1, 2).reshape(B * Sk, Hkv, D)
    v = value.transpose(1, 2).reshape(B * Sk, Hkv, D)
    if plan.idx_q is not None:
        q, k, v = q.index_select(0, plan.idx_q), k.index_select(0, plan.idx_k), v.index_select(0, plan.idx_k)
    # the lengths come from the mask (their maxima read with the plan): no host read of them here
    out = flash_attn_varlen_func(q, k, v, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, softmax_scale=scale,
                                 causal=causal, window_size=(window_left, -1), softcap=softcap or 0.0,
                                 check_values=False)
    if plan.idx_q is None:
        return out.reshape(B, Sq, Hq, D)
    padded = out.new_zeros(B * Sq, Hq, D).index_copy(0, plan.idx_q, out)
    return padded.view(B, Sq, Hq, D)


def decode_key_range(mask, batch: int, kv_len: int, window_left: int) -> Optional[tuple]:
    """``(starts, ends)``, int32 ``(B,)`` each, when ``mask`` is a one-token step's mask over one run of
    keys per row -- left padding before it, a static cache's unused slots after it, the left window
    cut from the query's own key (the last of the run) -- else None. One host read."""
    if (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4
            or tuple(mask.shape) != (batch, 1, 1, kv_len)):
        return None
    row = mask[:, 0, 0]
    pos = torch.arange(kv_len, device=mask.device)
    seen = row.any(1)
    starts = torch.where(seen, row.to(torch.int8).argmax(1), 0)
    ends = torch.where(seen, kv_len - row.flip(1).to(torch.int8).argmax(1), 0)  # a row with no key: [0, 0)
    expected = (pos[None, :] >= starts[:, None]) & (pos[None, :] < ends[:, None])
    if window_left >= 0:
        expected &= pos[None, :] >= (ends - 1 - window_left)[:, None]
    return (starts.to(torch.int32), ends.to(torch.int32)) if torch.equal(row, expected) else None


_MASK_PLANS: dict = {}  #: the last mask tensor, its version counter, and what was read from it (by route)


def _mask_plan(mask, key: tuple, build):
    """``build()`` for ``mask`` and ``key``, kept while the same mask tensor comes back unchanged
    (its version counter: an in-place change reads it anew). Inference-mode tensors have no version
    counter: nothing is kept for them."""
    try:
        version = mask._version
    except (AttributeError, RuntimeError):
        return build()
    if _MASK_PLANS.get("mask") is not mask or _MASK_PLANS.get("version") != version:
        _MASK_PLANS.clear()
        _MASK_PLANS.update(mask=mask, version=version)
    if key not in _MASK_PLANS:
        _MASK_PLANS[key] = build()
    return _MASK_PLANS[key]


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
    if q_len == 1 and kv_len > 1 and not torch.compiler.is_compiling():
        # a generate() step over the KV cache: the split-KV decode kernel reads the cache in place
        # ((B, Hkv, S, D) as a strided (B, S, Hkv, D) view: no copy); a mask of one run of keys per
        # sequence (left padding, a static cache's free slots) becomes its first key and its length.
        # Other masks take the varlen route below.
        key_range = None
        if isinstance(attention_mask, torch.Tensor):
            key_range = _mask_plan(attention_mask, ("decode", kv_len, window_left),
                                   lambda: decode_key_range(attention_mask, query.shape[0], kv_len, window_left))
        if attention_mask is None or key_range is not None:
            from rocmflash.decode import flash_attn_with_kvcache

            starts, ends = key_range if key_range is not None else (None, None)
            _STATS["rocmflash"] += 1
            _STATS["decode"] += 1
            out = flash_attn_with_kvcache(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                          cache_seqlens=ends, softmax_scale=scale, window_size=(window_left, -1),
                                          softcap=softcap or 0.0, check_values=False, cache_leftpad=starts)
            return out.contiguous(), None
    needs_varlen = attention_mask is not None or bool(softcap) or window_left >= 0
    if needs_varlen and torch.compiler.is_compiling():
        return _fall_back("torch.compile tracing a padded, windowed or soft-capped call (the varlen path "
                          "reads sequence lengths on the host)", *args)
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            return _fall_back(f"an attention mask of type {type(attention_mask).__name__}", *args)
        got = _mask_plan(attention_mask, ("varlen", q_len, kv_len, bool(module_causal), window_left),
                         lambda: _varlen_mask_plan(attention_mask, q_len, kv_len, bool(module_causal), window_left))
        if got is None:
            return _fall_back("an attention mask that is not padding + causal/sliding window", *args)
        kept, plan = got
        if kept < kv_len:  # a static cache's free slots: never seen
            key, value = key[:, :, :kept], value[:, :, :kept]
        _STATS["rocmflash"] += 1
        return _varlen_padded(query, key, value, plan, bool(module_causal), scale, window_left, softcap), None

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
        plan = _unpadded_plan(query.shape[0], q_len, key.shape[2], query.device)
        return _varlen_padded(query, key, value, plan, causal, scale, window_left, softcap), None
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


__all__ = ["register", "rocmflash_attention_forward", "stats", "decode_key_range", "padded_layout", "NAME"]
