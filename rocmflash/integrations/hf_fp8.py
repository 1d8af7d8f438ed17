"""An fp8 KV cache for transformers' ``generate()``, read in place by rocmflash's decode kernel.

::

    import rocmflash.integrations.hf as rf_hf
    from rocmflash.integrations.hf_fp8 import Fp8Cache

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=rf_hf.register(), dtype=torch.bfloat16)
    cache = Fp8Cache(model.config, max_cache_len=4096)  # the arch's e4m3: FNUZ on gfx942, OCP on gfx950/sm_89+
    out = model.generate(**inputs, cache=cache, max_new_tokens=256)

:class:`Fp8Cache` is a transformers ``Cache`` with one :class:`Fp8Layer` per attention layer. Each layer
holds ``k / k_descale[b, h]`` and ``v / v_descale[b, h]`` in an fp8 buffer of ``max_cache_len`` keys
(flash-attn's ``(B, S_max, Hkv, D)`` layout, allocated at the first forward: half the bytes of a bf16
cache, and a decode step reads half the bytes):

* **prefill** (the first forward, an empty cache): the prompt's K/V are quantised into the cache (one
  kernel launch, :func:`rocmflash.kernels.decode.quant.append_quantised`: torch's bytes, rounded to nearest and
  saturated), and the prompt's own attention runs on the K/V as computed (bf16/fp16, unquantised);
* **decode** (one new token per sequence): the new K/V are quantised into the cache and the step's
  attention reads the fp8 cache in place through :func:`rocmflash.flash_attn_with_kvcache`'s fp8 path
  (``k_descale``/``v_descale``), left padding included (``cache_leftpad``);
* any other call on a filled cache (several new tokens: assisted decoding, a continued prompt; a mask with
  holes; an argument rocmflash does not serve) runs on the cache's values dequantised to q's dtype
  (exact: every fp8 value times its fp32 scale, rounded once), through rocmflash's 16-bit routes or SDPA.

**Descales** (flash-attn 3's, fp32 ``(batch, kv_heads)`` per layer): given to the constructor (one tensor
``(batch, kv_heads)`` for every layer, or ``(num_layers, batch, kv_heads)``; finite and > 0), or, by
default, computed once per layer from the prefill's K/V: ``amax / fp8_max`` over each (sequence, kv head)'s
prompt tokens (1 where that amax is 0), so the prompt uses the format's whole range. Later tokens larger than
the prompt's amax saturate to ``±fp8_max * descale``; pass descales with headroom (from calibration) if the
keys grow. The computed ones are kept until :meth:`Fp8Cache.reset`.

**Formats** (:mod:`rocmflash.api.fp8`): ``dtype=None`` takes the arch's e4m3 (``float8_e4m3fnuz`` on gfx942,
``float8_e4m3fn`` on gfx950 and sm_89+ and under the CPU interpreter without a GPU); a format the arch does
not compute in -- or any fp8 on gfx90a -- is ``rocmflash.api.fp8``'s one-line ``TypeError`` naming the arch and
the formats expected, raised before anything is allocated (at construction when ``device`` is given, else
at the first forward).

The cache is read by rocmflash's attention only (the model's ``attn_implementation`` must be a name from
:func:`rocmflash.integrations.hf.register`): its fp8 tensors carry their descales to
:func:`rocmflash.integrations.hf.rocmflash_attention_forward`. Not for ``torch.compile`` (``is_compileable``
is False, so ``generate`` runs it eagerly). Beam search and batch selection reorder the bytes and scales.
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from rocmflash.hw import fp8 as F8
from rocmflash.integrations import hf as HF

#: layer types of a config that an :class:`Fp8Layer` serves (a sliding layer keeps every key: the window is
#: the mask's and the kernel's, not the cache's)
ATTENTION_TYPES = ("full_attention", "sliding_attention")


def _check_descale_pair(k_descale, v_descale, num_layers: int, kv_heads: Optional[int]) -> tuple:
    """The constructor's descales as per-layer lists ``[(batch, kv_heads)] * num_layers`` (None: computed at
    prefill). Values are read here, once (a host read at construction, not in a step)."""
    if (k_descale is None) != (v_descale is None):
        raise ValueError("Fp8Cache takes k_descale and v_descale together (or neither: computed from the prefill's "
                         "K/V amax)")
    if k_descale is None:
        return None, None
    out = []
    for name, d in (("k_descale", k_descale), ("v_descale", v_descale)):
        if not isinstance(d, torch.Tensor):
            raise TypeError(f"Fp8Cache {name} must be a torch.Tensor, got {type(d).__name__}")
        if d.dtype != torch.float32:
            raise TypeError(f"Fp8Cache {name}.dtype must be torch.float32, got {d.dtype}")
        shape = tuple(d.shape)
        if d.ndim == 2:
            d = d.expand(num_layers, *d.shape)
        if d.ndim != 3 or d.shape[0] != num_layers or (kv_heads is not None and d.shape[2] != kv_heads):
            heads = kv_heads if kv_heads is not None else "kv_heads"
            raise ValueError(f"Fp8Cache {name} must have shape (batch, {heads}) or ({num_layers} layers, batch, "
                             f"{heads}), got {shape}")
        bad = ~(torch.isfinite(d) & (d > 0))
        if bool(bad.any()):
            idx = tuple(int(x) for x in bad.nonzero()[0])
            raise ValueError(f"Fp8Cache {name}{list(idx)} = {float(d[idx])}: descales must be finite and > 0 (the "
                             "cache holds k / k_descale)")
        out.append(list(d.unbind(0)))
    return out[0], out[1]


def _resolve_dtype(dtype, device) -> torch.dtype:
    """``dtype`` checked against ``device``'s arch, or the arch's e4m3 for None (``rocmflash.api.fp8``'s errors)."""
    from rocmflash.api.selection import device_identity

    arch = device_identity(device)[1]
    if dtype is None:
        dtype = torch.float8_e4m3fnuz if F8.fp8_family(arch) == "fnuz" else torch.float8_e4m3fn
    F8.check_format(dtype, arch, "Fp8Cache")
    return dtype


class _Spec:
    """What every layer of one :class:`Fp8Cache` shares: capacity, format, the model's config."""

    def __init__(self, config, max_cache_len: int, dtype):
        self.config, self.max_cache_len, self.dtype = config, max_cache_len, dtype

    def check_ready(self, device) -> torch.dtype:
        """At the first forward, before anything is allocated: the model runs rocmflash's attention, the device
        runs the kernels, the format fits the arch. Returns the fp8 dtype."""
        impl = getattr(self.config, "_attn_implementation", None)
        if impl not in HF._REGISTERED:
            raise ValueError(f"Fp8Cache is read by rocmflash's attention only, but the model runs "
                             f"attn_implementation={impl!r}: load it with attn_implementation=rocmflash.integrations."
                             f"hf.register() (or model.set_attn_implementation(register()))")
        if not (device.type == "cuda" or (device.type == "cpu" and HF._interpreting())):
            raise ValueError(f"Fp8Cache needs the model on a CUDA/ROCm GPU (or on the CPU with TRITON_INTERPRET=1), "
                             f"got {device}")
        self.dtype = _resolve_dtype(self.dtype, device)  # None: the arch's e4m3, from here on
        return self.dtype


class Fp8Layer(CacheLayerMixin):
    """One attention layer's fp8 K/V (see the module docstring). ``keys``/``values`` are ``(B, Hkv, S_max, D)``
    views of the ``(B, S_max, Hkv, D)`` buffers; ``k_descale``/``v_descale`` fp32 ``(B, Hkv)`` once known."""

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, spec: _Spec, k_descale=None, v_descale=None):
        super().__init__()
        self._spec = spec
        self.max_cache_len = spec.max_cache_len
        self.length = 0
        self._given = k_descale is not None
        self.k_descale, self.v_descale = k_descale, v_descale
        self._k = self._v = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Check (implementation, device, format, descales' batch) and allocate the fp8 buffers."""
        device = key_states.device
        dtype = self._spec.check_ready(device)
        B, H, _, D = key_states.shape
        if value_states.shape[:2] != (B, H) or value_states.shape[-1] != D:
            raise ValueError(f"Fp8Cache needs keys and values of one shape (B, kv_heads, S, D), got "
                             f"{tuple(key_states.shape)} and {tuple(value_states.shape)}")
        if self._given:
            for name in ("k_descale", "v_descale"):
                d = getattr(self, name)
                if tuple(d.shape) != (B, H):
                    raise ValueError(f"Fp8Cache {name} must have shape (batch, kv_heads) = ({B}, {H}) for this "
                                     f"batch, got {tuple(d.shape)}")
                setattr(self, name, d.to(device))  # the caller's tensor may live on the host
        self.device, self.batch_size, self.num_heads, self.head_dim = device, B, H, D
        self._k = torch.empty((B, self.max_cache_len, H, D), dtype=dtype, device=device)
        self._v = torch.empty_like(self._k)
        self.keys, self.values = self._k.transpose(1, 2), self._v.transpose(1, 2)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Quantise the new K/V ``(B, Hkv, n, D)`` into the cache. Returns the prefill's own K/V (an empty cache),
        else the cache's ``(B, Hkv, length, D)`` fp8 views, tagged with their descales for rocmflash's attention."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.length + n > self.max_cache_len:
            raise ValueError(f"Fp8Cache is full: {self.length} cached + {n} new keys > max_cache_len="
                             f"{self.max_cache_len}; build it with a larger max_cache_len")
        if n == 0:
            return self._views() if self.length else (key_states, value_states)
        if self.k_descale is None:  # the first tokens (the prompt) set the scales: amax / fp8_max per (b, h)
            self.k_descale, self.v_descale = (_amax_descale(t, self._k.dtype) for t in (key_states, value_states))
        self._append(key_states, value_states)
        first = self.length == 0
        self.length += n
        return (key_states, value_states) if first else self._views()

    def _append(self, key_states, value_states) -> None:
        """One launch: the quantising append of ``flash_attn_with_kvcache`` (a bad scale writes nothing and is
        reported through the decode error word, as there)."""
        from rocmflash.kernels import common as C
        from rocmflash.kernels.decode import host as KD
        from rocmflash.kernels.decode import checks as DC
        from rocmflash.kernels.decode import quant as KQ

        lens = torch.full((self.batch_size,), self.length, dtype=torch.int32, device=self.device)
        KQ.append_quantised(self._k, self._v, key_states.transpose(1, 2), value_states.transpose(1, 2), lens, None, 0,
                            self.k_descale, self.v_descale, KD.error_word(self.device), DC.BAD_DESCALE.value,
                            C.torch_backend())

    def _views(self) -> tuple:
        keys = self._k[:, :self.length].transpose(1, 2)
        values = self._v[:, :self.length].transpose(1, 2)
        HF.tag_fp8(keys, self.k_descale)
        HF.tag_fp8(values, self.v_descale)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_cache_len

    def reset(self) -> None:
        """Empty the cache (the buffers stay allocated); computed descales are computed anew at the next prefill."""
        self.length = 0
        if not self._given:
            self.k_descale = self.v_descale = None

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` keys (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"Fp8Cache.crop takes a negative number of tokens to remove, got {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)

    def _map_batch(self, fn) -> None:
        """Apply a batch reindexing ``fn`` to the bytes (as uint8: fp8 indexing is not on every device) and scales."""
        if not self.is_initialized:
            return
        dtype = self._k.dtype
        self._k, self._v = (fn(t.view(torch.uint8)).view(dtype) for t in (self._k, self._v))
        self.keys, self.values = self._k.transpose(1, 2), self._v.transpose(1, 2)
        if self.k_descale is not None:
            self.k_descale, self.v_descale = fn(self.k_descale), fn(self.v_descale)
        self.batch_size = self._k.shape[0]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices.to(t.device) if isinstance(indices, torch.Tensor) else indices])

    def offload(self):  # pragma: no cover - Fp8Cache builds no offloading cache
        raise NotImplementedError("Fp8Cache does not offload")


def _amax_descale(x: torch.Tensor, dtype) -> torch.Tensor:
    """fp32 ``(B, Hkv)`` descales ``amax / fp8_max`` of ``x (B, Hkv, n, D)`` (1 where the amax is 0). On the
    device, no host read: a non-finite amax gives a non-finite scale, which the append reports."""
    amax = x.abs().amax(dim=(2, 3)).float()
    return torch.where(amax > 0, amax / F8.fp8_max(dtype), torch.ones_like(amax))


class Fp8Cache(Cache):
    """An fp8 KV cache for ``model.generate(..., cache=Fp8Cache(model.config, max_cache_len))`` with rocmflash's
    attention (module docstring: prefill, decode, descales, formats).

    ``config``: the model's config (its layer types and attention implementation are read).
    ``max_cache_len``: keys per sequence the cache holds (prompt + new tokens); allocated at the first forward,
    when the batch, heads, device and dtype are known. ``dtype``: an fp8 dtype the arch computes in, or None
    for the arch's e4m3. ``k_descale``/``v_descale``: fp32 ``(batch, kv_heads)`` (every layer) or
    ``(num_layers, batch, kv_heads)``, finite and > 0; None (both): ``amax / fp8_max`` of each layer's prefill
    K/V per (sequence, kv head). ``device``: check the format against this device's arch now (else at the
    first forward). Bad input raises a one-line ``ValueError``/``TypeError`` before anything is written.
    """

    def __init__(self, config, max_cache_len: int, dtype=None, k_descale=None, v_descale=None, device=None):
        if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1:
            raise ValueError(f"Fp8Cache max_cache_len must be a positive int, got {max_cache_len!r}")
        if dtype is not None:
            F8.check_format(dtype, None, "Fp8Cache")  # an fp8 dtype at all (the arch is checked with the device)
        text = config.get_text_config(decoder=True)
        layer_types, _ = get_layer_types_and_kwargs(text)
        for i, kind in enumerate(layer_types):
            if kind not in ATTENTION_TYPES:
                raise ValueError(f"Fp8Cache serves attention layers ({', '.join(ATTENTION_TYPES)}); layer {i} of "
                                 f"this model is {kind!r}")
        kv_heads = getattr(text, "num_key_value_heads", None)
        ks, vs = _check_descale_pair(k_descale, v_descale, len(layer_types), kv_heads)
        if device is not None:
            dtype = _resolve_dtype(dtype, torch.device(device))
        spec = _Spec(config, max_cache_len, dtype)
        layers = [Fp8Layer(spec, ks[i] if ks else None, vs[i] if vs else None) for i in range(len(layer_types))]
        super().__init__(layers=layers)
        self.max_cache_len = max_cache_len

    @property
    def dtype(self) -> Optional[torch.dtype]:
        """The cache's fp8 dtype (None until known: ``dtype=None`` without ``device``, before the first forward)."""
        return self.layers[0]._spec.dtype if self.layers else None


__all__ = ["Fp8Cache", "Fp8Layer", "ATTENTION_TYPES"]
