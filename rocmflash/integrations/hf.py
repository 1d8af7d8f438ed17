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
static-cache prefill crop of keys to ``q_len``), and runs rocmflash when the call is one it
computes identically: no mask tensor, no dropout, fp16/bf16, head dim 16..256, equal
q/k/v head dims, GQA through ``module.num_key_value_groups`` (rocmflash's native GQA:
K/V are not repeated), no softcap/position bias/paged cache. Every other call goes to
transformers' own ``sdpa_attention_forward`` with the original arguments, so results are
never silently different. The output is ``(B, S, H, D)`` and contiguous, like SDPA's.
"""

from __future__ import annotations

import math
import os

import torch

NAME = "rocmflash"
_STATS = {"rocmflash": 0, "sdpa": 0}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _sdpa_forward():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def _routable(query, key, value, attention_mask, dropout, kwargs) -> bool:
    if attention_mask is not None or dropout not in (0, 0.0):
        return False
    for name in ("softcap", "position_bias", "cache", "sinks", "s_aux"):
        if kwargs.get(name) is not None:
            return False
    if kwargs.get("output_attentions", False):
        return False
    dtype = query.dtype
    if dtype not in (torch.float16, torch.bfloat16) or key.dtype != dtype or value.dtype != dtype:
        return False
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    if not (query.device.type == "cuda" or (query.device.type == "cpu" and _interpreting())):
        return False
    D = query.shape[-1]
    if key.shape[-1] != D or value.shape[-1] != D or not 16 <= D <= 256:
        return False
    if key.shape != value.shape or key.shape[0] != query.shape[0]:
        return False
    Hq, Hkv = query.shape[1], key.shape[1]
    if Hkv == 0 or Hq % Hkv:
        return False
    return min(query.shape[0], Hq, query.shape[2], key.shape[2]) > 0


def rocmflash_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                scaling=None, is_causal=None, **kwargs):
    """transformers attention function: ``(B, H, S, D)`` in, ``((B, S, H, D) output, None)`` out."""
    if not _routable(query, key, value, attention_mask, dropout, kwargs):
        _STATS["sdpa"] += 1
        return _sdpa_forward()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                               is_causal=is_causal, **kwargs)
    _STATS["rocmflash"] += 1
    q_len, kv_len = query.shape[2], key.shape[2]
    # the same decision as transformers' sdpa_attention_forward
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(q_len > 1 and is_causal)  # attention_mask is None here
    if is_causal and kv_len > q_len:
        # transformers' SDPA path crops the (static-cache) keys to q_len and applies a
        # top-left causal mask; do the same, then Sq == Sk and both alignments agree
        key = key[:, :, :q_len, :]
        value = value[:, :, :q_len, :]
    elif is_causal and kv_len < q_len:
        # SDPA would align the causal mask top-left here; rocmflash aligns bottom-right
        _STATS["rocmflash"] -= 1
        _STATS["sdpa"] += 1
        return _sdpa_forward()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                               is_causal=is_causal, **kwargs)
    from rocmflash.ops import attention_op

    scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    out, _ = attention_op(query, key, value, causal=is_causal, scale=scale, need_lse=False)
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
    """Calls that ran rocmflash and calls passed to transformers' SDPA path (since import)."""
    return dict(_STATS)


__all__ = ["register", "rocmflash_attention_forward", "stats", "NAME"]
