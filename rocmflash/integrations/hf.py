"""HuggingFace transformers integration: ``attn_implementation="rocmfa"``.

::

    import rocmflash.integrations.hf as rf_hf
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=rf_hf.register(),  # "rocmfa"
                                                 torch_dtype=torch.bfloat16)

**The name.** transformers takes any ``attn_implementation`` containing "flash" for a flash-attn kernel; the
families that list their own flash kernels (``_compatible_flash_implementations``: gpt-oss, granite-swa,
granitemoe-swa, flint, mimo-v2-flash, minimax-m3-vl, openai-privacy-filter) then swap it for a hub kernel
(``kernels-community/vllm-flash-attn3``). :func:`register` therefore registers :data:`DEFAULT_NAME`
(``"rocmfa"``: none of the substrings transformers dispatches on) and returns it, and still registers
:data:`NAME` (``"rocmflash"``), which every other family loads as before; loading one of those seven with
``"rocmflash"`` is a one-line ``ValueError`` naming ``"rocmfa"`` instead of the swap.

:func:`register` adds two entries under each name:

* ``AttentionInterface.register("rocmflash", rocmflash_attention_forward)``
* ``AttentionMaskInterface.register("rocmflash", rocmflash_mask)`` -- ``"sdpa"``'s mask function
  (:func:`rocmflash_mask` returns ``sdpa_mask``'s mask unchanged); without a mask function
  transformers would build no causal mask at all. ``sdpa_mask`` returns ``None`` when the mask
  is the plain causal (or no) mask, so those layers take rocmflash's ``is_causal`` path; a real
  mask (padding, sliding window, packed sequences, ...) arrives as a tensor.

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
  causal/window" (:func:`padded_layout`), then the tokens are packed on the device, run
  through the varlen kernel and unpacked (padded query rows get 0);
* soft-capping (Gemma 2) or a sliding window without a mask: the varlen kernel;
* a ``generate()`` step (one new token): the split-KV decode kernel of
  :func:`rocmflash.flash_attn_with_kvcache`, reading transformers' cache tensors in place; a
  mask of one run of keys per sequence (left padding, a static cache's free slots) passes
  each run's first key as ``cache_leftpad`` and its end as ``cache_seqlens`` (no unpadding); an unmasked
  step (no padding, window, soft-cap or fp8 cache) runs the platform's SDPA instead where the GPU's ``decode-``
  entry timed it faster, eager with host time (:func:`rocmflash.api.ops.decode_incumbent`);
* a ``generate()`` step over an fp8 KV cache (:class:`rocmflash.integrations.hf_fp8.Fp8Cache`, whose
  key/value views carry their descales, :func:`tag_fp8`): the same decode kernel's fp8 path; every other
  call over that cache runs on its values dequantised to q's dtype, through the routes above.

Host reads (each waits for the GPU), per mask: a causal mask built over a 2-D padding mask
(training, prefill) is known from the 2-D mask by :func:`rocmflash_mask` and never read; any
other 4-D mask is read once, to decide whether rocmflash computes it exactly (else SDPA runs
it); a one-token step's mask is read once, to decide whether it is one run of keys per row
(the decode kernel) or not (the varlen route). Packing, lengths and bounds stay on the device.
transformers hands every layer of a forward the same mask tensor: what is worked out from it
is kept for the other layers while that tensor comes back unchanged.

* a packed batch (:mod:`rocmflash.integrations.hf_packed`; ``DataCollatorWithFlattening``): transformers' packing
  kwargs, or ``position_ids`` that restart inside a row (with transformers' block-diagonal mask, checked, or with
  none): the varlen kernel over the flattened ``(B * S)`` tokens, causal per sequence, window and soft-cap included.

Every other call (dropout, fp32, other mask patterns, position bias, ...) goes to transformers' own
``sdpa_attention_forward`` with the original arguments and a one-time ``RuntimeWarning`` naming the reason --
but only where SDPA computes all of it: a call SDPA would get wrong (soft-capping, packing, a window without a
mask) is a one-line ``ValueError`` instead. The output is ``(B, S, H, D)`` and contiguous, like SDPA's.

**Keyword arguments** (``**kwargs`` of :func:`rocmflash_attention_forward`; anything not listed is a one-line
``ValueError`` naming it, never dropped):

==========================================  ===============================================================
argument                                    treatment
==========================================  ===============================================================
``dropout``, ``scaling``, ``is_causal``     honoured (dropout > 0: SDPA, which computes it)
``sliding_window``                          honoured: the kernels' left window ``W - 1``
``softcap``                                 honoured: the kernels' tanh cap (never SDPA: it refuses it)
``cu_seq_lens_q``, ``cu_seq_lens_k``,       honoured: the varlen kernel (all four or a ``ValueError``); a mask
``max_length_q``, ``max_length_k``          given with them must be their block-diagonal band
``position_ids``                            honoured: restarts inside a row are a packed batch (varlen kernel):
                                            one row without a mask, or with transformers' mask over unpadded
                                            rows (read once per forward); not read under ``torch.compile``
                                            (transformers' mask separates them there)
``deterministic``                           honoured: flash_attn_varlen_func's ``deterministic``
``s_aux``, ``sinks``                        honoured: attention sinks in every kernel route (never SDPA)
``output_attentions=True``                  ``ValueError`` (no attention matrix is formed; use eager)
``position_bias``, ``cache``                transformers' SDPA (it computes them, and rocmflash does not)
``use_cache``, ``output_hidden_states``,    not attention's: accepted, not read (the cache is updated before
``output_router_logits``,                   the call; ``seq_idx`` comes with ``position_ids`` or the packing
``num_items_in_batch``, ``seq_idx``,        kwargs, which carry the same packing)
``return_dict``
==========================================  ===============================================================
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import torch

from rocmflash.hw.fp8 import is_fp8
from rocmflash.kernels.launch import interpreting
from rocmflash.integrations.hf_packed import (
    PACKING_KWARGS,
    Packed,
    packed_mask_matches,
    packing_from_kwargs,
    packing_from_position_ids,
    position_plan,
)
from rocmflash.integrations.hf_masks import (  # noqa: F401  (re-exported: the code moved there)
    _BUILT,
    _MASK_PLANS,
    _built_layout,
    _mask_plan,
    _Padded,
    _padded_plan,
    _unpadded_plan,
    built_without_padding,
    decode_key_range,
    padded_layout,
    rocmflash_mask,
)

NAME = "rocmflash"  #: the first name (still registered): transformers takes it for a flash-attn kernel's
#: the name :func:`register` returns: no "flash" in it (transformers dispatches on the substrings "flash", "sdpa",
#: "flex_attention", a "paged|" prefix and "org/repo" hub kernel ids; "rocmfa" has none of them)
DEFAULT_NAME = "rocmfa"
_STATS = {"rocmflash": 0, "sdpa": 0, "decode": 0, "fp8": 0, "incumbent": 0, "packed": 0}
_DTYPES = (torch.float16, torch.bfloat16)


_interpreting = interpreting  #: TRITON_INTERPRET, read per call at a dict read's cost (tests swap it here)


def _sdpa_forward():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def _unroutable_reason(query, key, value, dropout, kwargs, kv_fp8: bool = False):
    """Why rocmflash cannot compute this call exactly (None: it can), apart from the mask. ``kv_fp8``: key/value
    are an fp8 cache's (their dtype is not q's)."""
    why = _kwargs_unroutable(kwargs)  # first: an argument refused is refused whatever else the call is
    if why is not None:
        return why
    if dropout not in (0, 0.0):
        return "attention dropout"
    dtype = query.dtype
    if dtype not in _DTYPES or (not kv_fp8 and (key.dtype is not dtype or value.dtype is not dtype)):
        return f"dtype {dtype} (rocmflash runs fp16/bf16)"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "non-4-D query/key/value"
    if not query.is_cuda and not (query.device.type == "cpu" and _interpreting()):
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


def _kwargs_unroutable(kwargs) -> Optional[str]:
    """Why a keyword argument transformers passes keeps rocmflash from computing the call (None: none does); an
    argument neither rocmflash nor SDPA computes is refused here (:func:`_refuse_kwargs`)."""
    if kwargs:
        _refuse_kwargs(kwargs)
        for name in _SDPA_KWARGS:
            if kwargs.get(name) is not None:
                return f"the {name!r} argument"
    return None


#: keyword arguments transformers' SDPA path computes and rocmflash does not: those calls run SDPA
_SDPA_KWARGS = ("position_bias", "cache")
#: keyword arguments that are not attention's (the model's other layers, the loss, the cache update before the
#: call): accepted and not read. ``seq_idx`` (Mamba / linear layers) comes with ``position_ids`` or the packing
#: kwargs, which carry the same packing to attention, as in transformers' flash path.
_NOT_ATTENTIONS = frozenset(("use_cache", "output_hidden_states", "output_router_logits", "num_items_in_batch",
                             "seq_idx", "return_dict"))
#: keyword arguments rocmflash computes (see the table in the module docstring)
_HONOURED = frozenset(("sliding_window", "softcap", "position_ids", "deterministic", "output_attentions",
                       "s_aux", "sinks", *PACKING_KWARGS))
_SINKS = ("s_aux", "sinks")


def _sinks(query, kwargs) -> Optional[torch.Tensor]:
    """The call's attention sinks (gpt-oss passes ``s_aux=module.sinks``, one logit per query head) as the fp32
    ``(Hq,)`` tensor the kernels read, or None; a bad tensor is a one-line ``ValueError`` naming the argument."""
    if not kwargs:
        return None
    given = [name for name in _SINKS if kwargs.get(name) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ValueError("rocmflash: both s_aux and sinks were passed; pass the attention sinks once")
    from rocmflash.api.sinks import check_sinks

    return check_sinks(kwargs[given[0]], query.shape[1], query.device, given[0])


def _refuse_kwargs(kwargs) -> None:
    """A one-line error for a keyword argument neither rocmflash nor transformers' SDPA path computes:
    ``output_attentions=True`` (no attention matrix is ever formed), and any argument this module does not know
    (it would otherwise be dropped)."""
    if kwargs.get("output_attentions", False):
        raise ValueError("rocmflash: output_attentions=True needs the attention weights, which rocmflash never forms "
                         "(nor do SDPA and flash attention); load the model with attn_implementation='eager' for them")
    for name in kwargs:
        if name not in _HONOURED and name not in _NOT_ATTENTIONS and name not in _SDPA_KWARGS:
            raise ValueError(f"rocmflash: the attention argument {name!r} is not supported by rocmflash's "
                             "transformers integration (it would be ignored); load this model with "
                             "attn_implementation='eager' or 'sdpa'")


def _kwargs_plain(kwargs) -> bool:
    """Whether transformers' keyword arguments leave the call plain attention: nothing :func:`_kwargs_unroutable`
    names, no soft-cap, no sliding window, no packing kwargs (what a kept one-token step, :data:`_KEPT_STEPS`, was
    decided for); ``position_ids`` of a one-token step are the new token's position (never a packing)."""
    return not kwargs or (_kwargs_unroutable(kwargs) is None and kwargs.get("softcap") is None
                          and not kwargs.get("sliding_window") and kwargs.get("cu_seq_lens_q") is None
                          and kwargs.get("cu_seq_lens_k") is None
                          and all(kwargs.get(name) is None for name in _SINKS))


_WARNED: set = set()

# ----------------------------------------------------------------------------- fp8 KV cache (hf_fp8.Fp8Cache)
#: the attribute by which an fp8 cache's key/value views carry their fp32 (B, Hkv) descales from the cache's
#: ``update`` to the attention function (transformers passes the tensors, and nothing else, between the two)
_FP8_DESCALE = "_rocmflash_descale"


def tag_fp8(t: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """Attach ``descale`` (fp32 ``(B, Hkv)``) to an fp8 cache view ``t`` for :func:`rocmflash_attention_forward`."""
    setattr(t, _FP8_DESCALE, descale)
    return t


def _fp8_descales(key, value) -> Optional[tuple]:
    """``(k_descale, v_descale)`` of an fp8 cache's key/value views, None for 16-bit ones; fp8 without descales
    (not an :class:`~rocmflash.integrations.hf_fp8.Fp8Cache`'s) is a one-line ``TypeError``."""
    if not (is_fp8(key.dtype) or is_fp8(value.dtype)):
        return None
    ks, vs = getattr(key, _FP8_DESCALE, None), getattr(value, _FP8_DESCALE, None)
    if ks is None or vs is None:
        raise TypeError(f"rocmflash: key/value of dtype {key.dtype}/{value.dtype} without descales; an fp8 KV cache "
                        "runs through rocmflash.integrations.hf_fp8.Fp8Cache")
    return ks, vs


def _dequantised(key, value, descales, dtype) -> tuple:
    """An fp8 cache's values in q's dtype (``x * descale``, one rounding): for every call the decode kernel does not
    serve (several new tokens, a mask with holes, a fallback to SDPA)."""
    ks, vs = descales
    return tuple((t.float() * s[:, :, None, None]).to(dtype) for t, s in ((key, ks), (value, vs)))


def _sdpa_ignores(query, key, attention_mask, kwargs) -> Optional[str]:
    """What of this call transformers' SDPA path would not compute (None: it computes all of it, with the mask):
    soft-capping (it raises), the packing kwargs and a packing by ``position_ids`` without a mask (it attends
    across the sequences), a sliding window without a mask over more keys than the window."""
    if kwargs.get("softcap") is not None:
        return "soft-capping (softcap)"
    for name in _SINKS:
        if kwargs.get(name) is not None:
            return f"the attention sinks ({name})"
    if any(kwargs.get(name) is not None for name in PACKING_KWARGS):
        return "the packing kwargs (cu_seq_lens_*, max_length_*)"
    if attention_mask is None:
        window = kwargs.get("sliding_window")
        if window and key.shape[2] > int(window):
            return f"the sliding window ({window} keys)"
        if _position_packing(query, key, None, True, -1, kwargs) is not None:
            return "the packed sequences of position_ids"
    return None


def _fall_back(reason, module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """transformers' own SDPA path, with the original arguments; one warning per distinct reason. A call SDPA would
    not compute in full (:func:`_sdpa_ignores`) is a one-line ``ValueError`` naming both instead."""
    ignored = _sdpa_ignores(query, key, attention_mask, kwargs)
    if ignored is not None:
        raise ValueError(f"rocmflash: this attention call cannot run on rocmflash ({reason}) and transformers' SDPA "
                         f"would ignore {ignored}; load the model with attn_implementation='eager'")
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


def _varlen_mask_plan(mask, q_len: int, kv_len: int, causal: bool, window_left: int):
    """``(keys kept, _Padded)`` for a padded batch's boolean 4-D mask, or None when it is not one (a static
    cache's free slots, the key columns after the last one any query may see, are not kept)."""
    plan = _padded_plan(padded_layout(mask, q_len, kv_len, causal, window_left))
    return None if plan is None else (plan.max_k, plan)


def _varlen_padded(query, key, value, plan: _Padded, causal, scale, window_left, softcap, deterministic=False,
                   sinks=None):
    """Pack, run the varlen kernel, unpack (padded query rows get 0). No host read: a packing with padding
    runs :func:`rocmflash.api.varlen.packed_varlen`, whose packed tensors keep the padded rows as an unused tail."""
    from rocmflash.api.varlen import flash_attn_varlen_func, packed_varlen

    B, Hq, Sq, D = query.shape
    Hkv, Sk = key.shape[1], key.shape[2]
    q = query.transpose(1, 2).reshape(B * Sq, Hq, D)
    k = key.transpose(1, 2).reshape(B * Sk, Hkv, D)
    v = value.transpose(1, 2).reshape(B * Sk, Hkv, D)
    if plan.dest_q is None:
        out = flash_attn_varlen_func(q, k, v, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, softmax_scale=scale,
                                     causal=causal, window_size=(window_left, -1), softcap=softcap or 0.0,
                                     deterministic=deterministic, s_aux=sinks)
        return out.reshape(B, Sq, Hq, D)
    q = q.new_empty(q.shape).index_copy(0, plan.dest_q, q)
    k = k.new_empty(k.shape).index_copy(0, plan.dest_k, k)
    v = v.new_empty(v.shape).index_copy(0, plan.dest_k, v)
    out = packed_varlen(q, k, v, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, scale, causal, window_left,
                        softcap or 0.0, sinks)
    return out.index_select(0, plan.dest_q).view(B, Sq, Hq, D)  # padded rows: the zero tail


def _deterministic(kwargs) -> bool:
    """transformers' ``deterministic`` (ModernBERT's): keep a call that needs gradients on rocmflash's kernels (their
    backward is deterministic) where the database would serve the platform's varlen attention (atomics)."""
    flag = kwargs.get("deterministic")
    if flag is not None and not isinstance(flag, bool):
        raise TypeError(f"rocmflash: deterministic must be a bool, got {type(flag).__name__}")
    return bool(flag)


def _kwargs_packing(query, key, attention_mask, causal: bool, window_left: int, kwargs) -> Optional[Packed]:
    """The packing of transformers' packing kwargs (None: not given). A mask handed with them must be exactly
    their block-diagonal causal/window band (transformers builds that from ``position_ids``), or, built by
    transformers over unpadded rows (a cache kept it from looking for the sequences), the rows' band: one host read
    per mask, kept for the forward's other layers; any other mask is a one-line ``ValueError``."""
    if not kwargs or kwargs.get("cu_seq_lens_q") is None and kwargs.get("cu_seq_lens_k") is None \
            and kwargs.get("max_length_q") is None and kwargs.get("max_length_k") is None:
        return None
    if torch.compiler.is_compiling():
        raise ValueError("rocmflash: torch.compile cannot trace a packed batch (cu_seq_lens_*: the varlen path is "
                         "not traceable); run the packed model eagerly, or compile it with attn_implementation='eager'")
    packed = packing_from_kwargs(kwargs, query.device)
    if attention_mask is None:
        return packed
    B, Sq, Sk = query.shape[0], query.shape[2], key.shape[2]
    kept = _mask_plan(attention_mask, ("packed-kwargs", causal, window_left),
                      lambda: (packed.cu_q, Sq == Sk and packed_mask_matches(attention_mask, packed, B, Sq, causal,
                                                                                window_left,
                                                                                built_without_padding(attention_mask))))
    if kept[0] is not packed.cu_q and not torch.equal(kept[0], packed.cu_q):  # (the same mask, other kwargs: anew)
        _MASK_PLANS.pop(("packed-kwargs", causal, window_left), None)
        return _kwargs_packing(query, key, attention_mask, causal, window_left, kwargs)
    if not kept[1]:
        raise ValueError("rocmflash: the attention mask passed with cu_seq_lens_q/cu_seq_lens_k is not their packed "
                         "sequences' causal/sliding-window mask; pass one or the other")
    return packed


def _position_packing(query, key, attention_mask, causal: bool, window_left: int, kwargs) -> Optional[Packed]:
    """The packing of a batch packed by ``position_ids`` (a position that is not the previous one plus 1 starts a
    sequence), or None: no ``position_ids``, a call with past keys or one query, one sequence per row, several rows
    without a mask, or an ``attention_mask`` that is not exactly the packing's causal/window band. One host read per
    ``position_ids`` tensor (and mask), kept for the forward's other layers
    (:func:`rocmflash.integrations.hf_packed.position_plan`).
    Not under ``torch.compile`` (the read would break the graph): there transformers' own mask separates them."""
    position_ids = kwargs.get("position_ids") if kwargs else None
    q_len = query.shape[2]
    if position_ids is None or q_len < 2 or key.shape[2] != q_len or torch.compiler.is_compiling():
        return None
    B = query.shape[0]
    if attention_mask is None:
        if B != 1:  # a flattened batch is one row (DataCollatorWithFlattening; transformers' flash path alike): an
            return None  # unmasked prefill of several prompts reads nothing
        return position_plan(position_ids, ("no mask", B, q_len, query.device),
                             lambda: packing_from_position_ids(position_ids, B, q_len))
    kept = _mask_plan(attention_mask, ("packed-positions", causal, window_left),
                      lambda: (position_ids, packing_from_position_ids(position_ids, B, q_len, attention_mask,
                                                                       causal, window_left)))
    if kept[0] is not position_ids:  # the same mask with other position_ids: read anew
        _MASK_PLANS.pop(("packed-positions", causal, window_left), None)
        return _position_packing(query, key, attention_mask, causal, window_left, kwargs)
    return kept[1]


def _run_packed(query, key, value, packed: Packed, causal: bool, scale, window_left, softcap, kwargs, sinks):
    """A packed batch, ``(B, H, S, D)`` in (its ``B * S`` tokens the packed sequences), through the varlen kernel
    (forward and backward): ``(B, S, H, D)`` out, contiguous. ``sinks``: the checked sinks of :func:`_sinks`."""
    from rocmflash.api.varlen import flash_attn_varlen_func

    B, Hq, Sq, D = query.shape
    Hkv, Sk = key.shape[1], key.shape[2]
    q = query.transpose(1, 2).reshape(B * Sq, Hq, D)
    k = key.transpose(1, 2).reshape(B * Sk, Hkv, D)
    v = value.transpose(1, 2).reshape(B * Sk, Hkv, D)
    _STATS["rocmflash"] += 1
    _STATS["packed"] += 1
    out = flash_attn_varlen_func(q, k, v, packed.cu_q, packed.cu_k, packed.max_q, packed.max_k, softmax_scale=scale,
                                 causal=causal, window_size=(window_left, -1), softcap=softcap or 0.0,
                                 deterministic=_deterministic(kwargs), s_aux=sinks)
    return out.view(B, Sq, Hq, D)


def rocmflash_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                scaling=None, is_causal=None, **kwargs):
    """transformers attention function: ``(B, H, S, D)`` in, ``((B, S, H, D) output, None)`` out.

    Routes: no mask -> the dense kernel (or the decode kernel for a few new tokens over a
    KV cache); a padded batch (left or right padding, sliding windows) -> unpad, the varlen
    kernel, re-pad; soft-capping -> the varlen kernel. Anything rocmflash would not compute
    identically goes to transformers' SDPA with a one-time warning that names the reason.
    """
    step = None
    if not dropout:  # a one-token step whose route an earlier layer of this step decided (same shapes): no checks
        step = (query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype, query.get_device(), scaling,
                attention_mask is None)
        kept = _KEPT_STEPS.get(step)
        if kept is not None and _kwargs_plain(kwargs) and not _INCUMBENT_FNS[1]() \
                and not torch.compiler.is_compiling():
            return kept(module, query, key, value, attention_mask, is_causal, kwargs)
    descales = _fp8_descales(key, value)
    if descales is not None:  # an Fp8Cache's step: the decode kernel reads the fp8 cache, else its values in q's dtype
        if _unroutable_reason(query, key, value, dropout, kwargs, kv_fp8=True) is None \
                and not any(kwargs.get(name) is not None for name in PACKING_KWARGS):
            out = _decode_step(query, key, value, attention_mask, *_options(query, scaling, kwargs), descales,
                               _sinks(query, kwargs))
            if out is not None:
                return out, None
        key, value = _dequantised(key, value, descales, query.dtype)
        step = None  # (a route kept under the fp8 views' key would skip the dequantisation)
    args = (module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
    reason = _unroutable_reason(query, key, value, dropout, kwargs)
    if reason is not None:
        return _fall_back(reason, *args)
    q_len, kv_len = query.shape[2], key.shape[2]
    scale, softcap, window_left = _options(query, scaling, kwargs)
    sinks = _sinks(query, kwargs)  # (SDPA has none: a call with sinks never takes an SDPA route below)
    module_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    packed = _kwargs_packing(query, key, attention_mask, bool(module_causal), window_left, kwargs)
    if packed is not None:  # transformers' packing kwargs: they define the sequences, whatever the call's shape
        return _run_packed(query, key, value, packed, bool(module_causal), scale, window_left, softcap, kwargs,
                           sinks), None
    if q_len == 1 and query.shape[0] == 1 and attention_mask is not None and not softcap and window_left < 0 \
            and sinks is None and _decode_backend(query, key) is not None:
        # one sequence's step, masked only where a static cache has free slots (or the caller's own mask): where
        # the decode entry timed SDPA faster (a host-bound step), transformers' SDPA path runs it as it would
        # without rocmflash -- over the whole cache with the mask, as measured (the entry's length is the cache's)
        run = _transformers_sdpa(scaling)
        if step is not None:
            _keep_step(step, run)
        return run(module, query, key, value, attention_mask, is_causal, kwargs)
    # (no kwargs check here: _unroutable_reason passed, and the soft-cap and window are tested; a kept route is
    # only run for calls _kwargs_plain passes)
    if attention_mask is None and not softcap and window_left < 0 and sinks is None:
        run = _served_step(query, key, value, scale)
        if run is not None:
            if step is not None:
                _keep_step(step, run)
            return run(module, query, key, value, None, is_causal, kwargs)
    out = _decode_step(query, key, value, attention_mask, scale, softcap, window_left, sinks=sinks)
    if out is not None:
        return out, None
    needs_varlen = attention_mask is not None or bool(softcap) or window_left >= 0
    if needs_varlen and torch.compiler.is_compiling():
        return _fall_back("torch.compile tracing a padded, windowed or soft-capped call (the varlen path is "
                          "not traceable)", *args)
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            return _fall_back(f"an attention mask of type {type(attention_mask).__name__}", *args)
        if built_without_padding(attention_mask):  # transformers' mask over unpadded rows: packed by position_ids?
            packed = _position_packing(query, key, attention_mask, bool(module_causal), window_left, kwargs)
            if packed is not None:
                return _run_packed(query, key, value, packed, bool(module_causal), scale, window_left, softcap,
                                   kwargs, sinks), None
        got = _mask_plan(attention_mask, ("varlen", q_len, kv_len, bool(module_causal), window_left),
                         lambda: _varlen_mask_plan(attention_mask, q_len, kv_len, bool(module_causal), window_left))
        if got is None:
            return _fall_back("an attention mask that is not padding + causal/sliding window", *args)
        kept, plan = got
        if kept < kv_len:  # a static cache's free slots: never seen
            key, value = key[:, :, :kept], value[:, :, :kept]
        _STATS["rocmflash"] += 1
        return _varlen_padded(query, key, value, plan, bool(module_causal), scale, window_left, softcap,
                              _deterministic(kwargs), sinks), None

    packed = _position_packing(query, key, None, bool(module_causal), window_left, kwargs)
    if packed is not None:  # packed by position_ids, no mask (transformers skips its check when a cache is passed)
        return _run_packed(query, key, value, packed, bool(module_causal), scale, window_left, softcap, kwargs,
                           sinks), None

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
        return _varlen_padded(query, key, value, plan, causal, scale, window_left, softcap,
                              _deterministic(kwargs), sinks), None
    from rocmflash.api.ops import attention_op

    out, _ = attention_op(query, key, value, causal=causal, scale=scale, need_lse=False, sinks=sinks)
    # (B, H, S, D) -> (B, S, H, D); free when q was a transposed (B, S, H, D) projection
    return out.transpose(1, 2).contiguous(), None


def _options(query, scaling, kwargs) -> tuple:
    """``(scale, softcap, window_left)`` of a call rocmflash computes."""
    scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    return scale, kwargs.get("softcap"), _window_left(kwargs.get("sliding_window"))


def _decode_step(query, key, value, attention_mask, scale, softcap, window_left, descales=None, sinks=None):
    """A generate() step over the KV cache through the split-KV decode kernel, or None when it is not one.

    The kernel reads the cache in place ((B, Hkv, S, D) as a strided (B, S, Hkv, D) view: no copy); a
    mask of one run of keys per sequence (left padding, a static cache's free slots) becomes its first key
    and its length. Other masks return None (the varlen route). ``descales``: an fp8 cache's
    ``(k_descale, v_descale)``, passed to the kernel's fp8 path. ``sinks``: the checked attention sinks (``s_aux``)."""
    q_len, kv_len = query.shape[2], key.shape[2]
    if q_len != 1 or kv_len <= 1 or torch.compiler.is_compiling():
        return None
    key_range = None
    if isinstance(attention_mask, torch.Tensor):
        key_range = _mask_plan(attention_mask, ("decode", kv_len, window_left),
                               lambda: decode_key_range(attention_mask, query.shape[0], kv_len, window_left))
    if attention_mask is not None and key_range is None:
        return None
    from rocmflash.api.decode import flash_attn_with_kvcache

    starts, ends = key_range if key_range is not None else (None, None)
    ks, vs = descales if descales is not None else (None, None)
    _STATS["rocmflash"] += 1
    _STATS["decode"] += 1
    _STATS["fp8"] += descales is not None
    out = flash_attn_with_kvcache(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                  cache_seqlens=ends, softmax_scale=scale, window_size=(window_left, -1),
                                  softcap=softcap or 0.0, check_values=False, cache_leftpad=starts,
                                  k_descale=ks, v_descale=vs, s_aux=sinks)
    return out.contiguous()


def _served_step(query, key, value, scale):
    """An unmasked one-token step's SDPA call, ``(query, key, value) -> (B, 1, Hq, D)``, where the ``decode-`` entry
    of its KV-length and batch buckets says SDPA was faster (eager, host time included); else None (the decode
    kernel, or not a decode step). No copies: SDPA reads the cache views (``enable_gqa`` for GQA). Callers keep it
    per shapes, dtypes, device and ``scaling`` (:data:`_KEPT_STEPS`): a step's other layers then run it after one
    dict lookup. Its first call is guarded (:func:`rocmflash.api.incumbent.first_call`): where SDPA refuses it, the
    decode kernel serves that step and, with one warning, every later step of the problem."""
    if query.shape[2] != 1 or key.shape[2] <= 1 or torch.compiler.is_compiling():
        return None
    backend = _decode_backend(query, key)
    if backend is None:
        return None
    from rocmflash.api.incumbent import fell_back, first_call, refusal_problem

    problem = refusal_problem(query, key, False)  # what the dispatch plans key a refusal by, too
    if fell_back(backend, False, problem):  # this torch refused the backend for this problem before: the decode kernel
        return None
    sdpa = _INCUMBENT_FNS[2](backend, False, query.shape[1] != key.shape[1])
    tried = []  #: non-empty once the first call ran: later calls run SDPA unguarded

    def served_step(module, q, k, v, attention_mask, is_causal, kwargs):
        if tried:
            out = sdpa(q, k, v, scale)
        else:  # the first call: where SDPA refuses it, the decode kernel serves this problem from now on
            out = first_call(sdpa, backend, False, problem, q, k, v, scale)
            if out is None:
                for step in [s for s, run in _KEPT_STEPS.items() if run is served_step]:
                    del _KEPT_STEPS[step]
                return _decode_step(q, k, v, None, scale, 0.0, -1), None
            tried.append(True)
        _STATS["incumbent"] += 1
        return out.transpose(1, 2).contiguous(), None
    return served_step


def _transformers_sdpa(scaling):
    """A step run by transformers' own SDPA path, with the caller's arguments (counted as ``sdpa``)."""
    sdpa_forward = _sdpa_forward()

    def transformers_step(module, q, k, v, attention_mask, is_causal, kwargs):
        _STATS["sdpa"] += 1
        return sdpa_forward(module, q, k, v, attention_mask, dropout=0.0, scaling=scaling, is_causal=is_causal,
                            **kwargs)
    return transformers_step


def _keep_step(step: tuple, run) -> None:
    """Keep a one-token step's route for the step's other layers (:data:`_KEPT_STEPS`)."""
    if len(_KEPT_STEPS) >= _MAX_KEPT_STEPS:
        _KEPT_STEPS.clear()
    _KEPT_STEPS[step] = run


#: (q, k, v shapes and dtypes, device index, ``scaling``, unmasked) -> the route of a one-token step whose
#: ``decode-`` entry gives it to SDPA (:func:`_served_step`, or transformers' path for a masked single sequence):
#: every layer of a step has the same shapes, so its first layer decides and the others run the kept route after
#: one dict lookup (a dynamic cache is one key longer each step: one new key per step). Only calls with plain
#: keyword arguments (:func:`_kwargs_plain`) use it; ``ROCMFLASH_NO_INCUMBENT`` is read per call. Emptied when
#: full and by ``rocmflash.clear_cache`` (a new database may route these steps otherwise).
_KEPT_STEPS: dict = {}
_MAX_KEPT_STEPS = 256


def _decode_backend(query, key):
    """The SDPA backend the ``decode-`` entry of this one-token step's KV-length and batch buckets says to run (cached
    per bucket: one dict lookup), or None: the decode kernel (or ``ROCMFLASH_NO_INCUMBENT`` is set)."""
    if not _INCUMBENT_FNS:  # imported once (an import statement per call costs about a microsecond each)
        from rocmflash.api.incumbent import sdpa_server
        from rocmflash.api.ops import decode_incumbent
        from rocmflash.api.selection import incumbent_disabled, register_clear

        _INCUMBENT_FNS.extend((decode_incumbent, incumbent_disabled, sdpa_server))
        register_clear(_KEPT_STEPS.clear)  # a new database may serve these steps otherwise
    decode_incumbent, incumbent_disabled, _ = _INCUMBENT_FNS
    B, Hq, _, D = query.shape
    backend = decode_incumbent(query.device, D, query.dtype, Hq // key.shape[1], key.shape[2], B)
    return None if backend is None or incumbent_disabled() else backend


_INCUMBENT_FNS: list = []  #: (decode_incumbent, incumbent_disabled, sdpa_server), bound on first use


def register(name: Optional[str] = None) -> str:
    """Register rocmflash's attention and mask functions with transformers; returns the name to pass as
    ``attn_implementation``.

    With no ``name``: under :data:`DEFAULT_NAME` (``"rocmfa"``, returned) and under :data:`NAME` (``"rocmflash"``,
    kept for existing code). transformers takes any name containing "flash" for a flash-attn kernel: the families
    that list their own flash kernels (``_compatible_flash_implementations``: gpt-oss, ...) swap such a name for
    one of those hub kernels, so loading them with ``"rocmflash"`` is a one-line ``ValueError`` naming
    ``"rocmfa"`` (:func:`_refuse_kernel_swap`). With a ``name``: under that name only. Idempotent.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for each in (DEFAULT_NAME, NAME) if name is None else (name,):
        AttentionInterface.register(each, rocmflash_attention_forward)
        AttentionMaskInterface.register(each, rocmflash_mask)
        _REGISTERED.add(each)
    _skip_flash_preload()
    _refuse_kernel_swap()
    return DEFAULT_NAME if name is None else name


_REGISTERED: set = set()


def _refuse_kernel_swap() -> None:
    """Make loading a model whose class lists compatible flash implementations with a registered name containing
    "flash" a one-line ``ValueError`` naming :data:`DEFAULT_NAME`, before transformers swaps the name for a hub kernel.

    transformers (5.x), in ``PreTrainedModel._check_and_adjust_attn_implementation``, replaces any
    ``attn_implementation`` containing "flash" that is not in the class's ``_compatible_flash_implementations``
    by the first of those (``kernels-community/vllm-flash-attn3`` for gpt-oss) and downloads it: the model would
    not run rocmflash at all, or fail to load. Names without "flash" (``"rocmfa"``) are left alone there. A
    transformers without that method is left alone.
    """
    try:
        from transformers.modeling_utils import PreTrainedModel
    except ImportError:  # pragma: no cover
        return
    original = PreTrainedModel.__dict__.get("_check_and_adjust_attn_implementation")
    if original is None or getattr(original, "_rocmflash_wrapped", False):
        return

    def _check_and_adjust_attn_implementation(self, attn_implementation, *args, **kwargs):
        if isinstance(attn_implementation, str) and attn_implementation in _REGISTERED \
                and "flash" in attn_implementation:
            listed = getattr(self, "_compatible_flash_implementations", None)
            if listed and attn_implementation not in listed:
                raise ValueError(f"rocmflash: {type(self).__name__} lists its own flash attention kernels "
                                 f"({', '.join(listed)}), so transformers would replace "
                                 f"attn_implementation={attn_implementation!r} with {listed[0]!r}; use "
                                 f"attn_implementation={DEFAULT_NAME!r} (registered by "
                                 "rocmflash.integrations.hf.register())")
        return original(self, attn_implementation, *args, **kwargs)

    _check_and_adjust_attn_implementation._rocmflash_wrapped = True
    _check_and_adjust_attn_implementation.__wrapped__ = original
    PreTrainedModel._check_and_adjust_attn_implementation = _check_and_adjust_attn_implementation


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
    """Calls that ran rocmflash (``decode``: of those, the ones through the KV-cache decode kernel; ``fp8``: of
    those, the ones reading an fp8 cache), calls passed to transformers' SDPA path (``sdpa``) and one-token steps
    run by the platform's SDPA where the decode entry timed it faster (``incumbent``), since import."""
    return dict(_STATS)


__all__ = ["register", "rocmflash_attention_forward", "rocmflash_mask", "stats", "decode_key_range", "padded_layout",
           "tag_fp8", "NAME", "DEFAULT_NAME"]
