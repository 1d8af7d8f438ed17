"""``flash_attn_with_kvcache``: attention of a few new tokens over a KV cache (decode), flash-attn's conventions.

::

    from rocmflash import flash_attn_with_kvcache
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens, causal=True)

``q (B, Sq, Hq, D)``; the cache is contiguous ``(B, S_max, Hkv, D)`` or paged
``(num_blocks, page_size, Hkv, D)`` with ``block_table (B, max_blocks)`` int32. New
``k``/``v`` ``(B, Sk_new, Hkv, D)`` are written into the cache in place at
``cache_seqlens[b]`` (torch indexing: no host sync), then attention runs over
``cache_seqlens[b] + Sk_new`` keys per sequence (from key ``cache_leftpad[b]`` on, when given:
a left-padded batch), through the split-KV decode kernels of
:mod:`rocmflash.kernels.decode.host`. ``num_splits=0`` takes the split count from the tuned
database (``rocmflash tune --mode decode``) or a CU-count heuristic.

An fp8 cache (the arch's format) takes fp32 ``k_descale``/``v_descale`` ``(B, Hkv)`` (flash-attn 3's
names): new keys are quantised into it, the kernel reads half the bytes (:mod:`rocmflash.api.decode_fp8`).

Attention sinks (``s_aux``, vLLM's name; gpt-oss's per-head ``sinks``): one logit per query head joined to each
row's softmax denominator, read by the decode kernel itself (never by SDPA, which has none).

Bad input raises ``ValueError``/``TypeError`` naming the argument before any kernel runs or anything is written to
the cache; bad *values* (lengths, starts, pages, scales) are caught on the GPU (:func:`flash_attn_with_kvcache`).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

from rocmflash.hw.compat import require_supported_versions

require_supported_versions()

import torch  # noqa: E402

from rocmflash.api import decode_fp8 as F8D  # noqa: E402
from rocmflash.api.decode_cache import (  # noqa: E402,F401  (re-exported: the code moved there)
    _check_values,
    _lengths,
    as_int32,
)
from rocmflash.api.decode_choice import _DECODE_CONFIGS, decode_config  # noqa: E402,F401 (re-exported)
from rocmflash.api.decode_errors import (  # noqa: E402,F401 (re-exported)
    ERROR_POLL_CALLS,
    _capturing,
    _poll_errors,
    check_errors,
)
from rocmflash.api.varlen_checks import check_options  # noqa: E402
from rocmflash.kernels import common as C  # noqa: E402
from rocmflash.kernels.decode import append as kv_append  # noqa: E402
from rocmflash.kernels.decode import host as KD  # noqa: E402
from rocmflash.kernels.decode import checks as DC
from rocmflash.kernels.decode import quant as KQ  # noqa: E402
from rocmflash.kernels import launch as L  # noqa: E402
from rocmflash.kernels.decode.shape import (  # noqa: E402,F401  (public here too: the routing rule is the kernel's)
    DECODE_MAX_QUERIES,
    DECODE_MAX_ROWS,
    DECODE_MIN_KEYS,
    is_decode_shaped,
)

_DTYPES = (torch.float16, torch.bfloat16)


def _check4(name: str, t, layout: str, like=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != 4:
        raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}.dtype must be torch.float16 or torch.bfloat16, got {t.dtype}")
    if like is not None:
        if t.dtype != like.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must match q.dtype ({like.dtype})")
        if t.device != like.device:
            raise ValueError(f"{name} is on {t.device} but q is on {like.device}; all must share a device")


def _int_tensor(name: str, t, ndim: int, device, dtypes=(torch.int32,)) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}; all must share a device")


_SINK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_sinks(s_aux, heads_q: int, device) -> None:
    """``s_aux`` (attention sinks) is a ``(Hq,)`` fp32/bf16/fp16 tensor on q's device (any stride), or None;
    else a one-line ``ValueError`` saying what was expected (``TypeError`` for a non-tensor, as every argument)."""
    if s_aux is None:
        return
    if not isinstance(s_aux, torch.Tensor):
        raise TypeError(f"s_aux (attention sinks) must be a torch.Tensor of shape (Hq={heads_q},) or None, "
                        f"got {type(s_aux).__name__}")
    if s_aux.dtype not in _SINK_DTYPES:
        raise ValueError(f"s_aux (attention sinks) must be a float32, bfloat16 or float16 tensor (one logit per "
                         f"query head), got {s_aux.dtype}")
    if s_aux.shape != (heads_q,):
        raise ValueError(f"s_aux (attention sinks) must have shape (Hq={heads_q},), one logit per query head, got "
                         f"{tuple(s_aux.shape)}")
    if s_aux.device != device:
        raise ValueError(f"s_aux (attention sinks) is on {s_aux.device} but q is on {device}; all must share a device")


def _check_sink_values(s_aux, device) -> None:
    """``check_values=True``'s host check of the sinks (one wait): NaN or ``+inf`` raises (``-inf``: no sink);
    on the default path the kernel raises ``BAD_SINK`` in the error word instead. Skipped while a graph is
    captured."""
    if s_aux is None or _capturing(device):
        return
    bad = torch.isnan(s_aux) | (s_aux == float("inf"))
    if bool(bad.any()):
        h = int(bad.nonzero()[0, 0])
        raise ValueError(f"s_aux[{h}] = {float(s_aux[h])}: attention sinks must be finite or -inf (no sink)")


def _interpreting() -> bool:
    """Whether CPU tensors are accepted (Triton's interpreter); a hook ``archive/reports:bench/host_profile.py --cpu-stub`` replaces."""
    return C.interpreting()


def _validate(q, k_cache, v_cache, k, v, cache_seqlens, block_table, num_splits, cache_leftpad=None,
              k_descale=None, v_descale=None, s_aux=None) -> tuple:
    """Every check but the options' and those of tensor values; returns ``(paged, page_size, capacity, new, fp8)``.

    It reads only metadata (types, dtypes, shapes, devices) and the value of an int
    ``cache_seqlens``: what :func:`_signature` keys, so a call of a known signature passes it.
    """
    _check4("q", q, "(B, Sq, Hq, D)")
    paged = block_table is not None
    layout = "(num_blocks, page_size, Hkv, D)" if paged else "(B, S_max, Hkv, D)"
    fp8 = F8D.check_caches(q, k_cache, v_cache, layout)
    if not fp8:
        _check4("k_cache", k_cache, layout, q)
        _check4("v_cache", v_cache, layout, q)
    if q.device.type != "cuda" and not (q.device.type == "cpu" and _interpreting()):
        L.check_device("q", q)  # raises: names the device (meta: no data) and what is needed
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    if k_cache.shape[3] != D:
        raise ValueError(f"q and k_cache must share the head dim: q has {D}, the cache has {k_cache.shape[3]}")
    if not 16 <= D <= 256:
        raise ValueError(f"head dim must be in 16..256, got {D}")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"number of query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    F8D.check_descales(fp8, q, B, Hkv, k_descale, v_descale)
    _check_sinks(s_aux, Hq, q.device)
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (new keys and values to append), or both None")
    new = 0
    if k is not None:
        _check4("k", k, "(B, Sk_new, Hkv, D)", q)
        _check4("v", v, "(B, Sk_new, Hkv, D)", q)
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.shape[0] != B or k.shape[2] != Hkv or k.shape[3] != D:
            raise ValueError(f"k must be (B={B}, Sk_new, Hkv={Hkv}, D={D}), got {tuple(k.shape)}")
        new = k.shape[1]
    if paged:
        _int_tensor("block_table", block_table, 2, q.device)
        if block_table.shape[0] != B:
            raise ValueError(f"block_table has {block_table.shape[0]} rows but q has batch {B}")
        page_size = k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
    else:
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache has batch {k_cache.shape[0]} but q has {B} (a paged cache needs block_table)")
        page_size, capacity = 0, k_cache.shape[1]
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 0 <= num_splits <= 128:
        raise ValueError(f"num_splits must be an int in 0..128 (0 = automatic), got {num_splits!r}")

    if cache_seqlens is None:
        if paged:
            raise ValueError("cache_seqlens is required with a paged cache (block_table)")
        if new:
            raise ValueError("cache_seqlens is required to append k/v (where do the new keys go?)")
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if not 0 <= cache_seqlens <= capacity - new:
            raise ValueError(f"cache_seqlens={cache_seqlens} plus {new} new key(s) does not fit the cache "
                             f"(capacity {capacity})")
    else:
        _int_tensor("cache_seqlens", cache_seqlens, 1, q.device, (torch.int32, torch.int64))
        if cache_seqlens.shape[0] != B:
            raise ValueError(f"cache_seqlens must be (B={B},), got shape {tuple(cache_seqlens.shape)}")
    if new > capacity:  # metadata: no length could hold them (a tensor length's values are the kernels' to check)
        raise ValueError(f"k has {new} new keys per sequence but the cache holds {capacity} "
                         f"({'block_table.shape[1] * page_size' if paged else 'k_cache.shape[1]'})")
    if cache_leftpad is not None:
        _int_tensor("cache_leftpad", cache_leftpad, 1, q.device, (torch.int32, torch.int64))
        if cache_leftpad.shape[0] != B:
            raise ValueError(f"cache_leftpad must be (B={B},), got shape {tuple(cache_leftpad.shape)}")
    return paged, page_size, capacity, new, fp8


def clear_cache() -> None:
    """Forget cached decode choices (after a new tune in this process): configs, database lookups and call plans."""
    from rocmflash.db.lookups.decode import lookup_decode

    _DECODE_CONFIGS.clear()
    _CALL_PLANS.clear()
    _WHOLE_PLANS.clear()
    _SEEN.clear()
    _CALLS.clear()
    lookup_decode.cache_clear()


# ----------------------------------------------------------------------------- per-signature plans
# Eager decode at small batch is host-bound, so what depends on metadata only (the checks, the DecodeCall, the
# config, the split count, the launch keys) is kept in a _Plan once a signature repeats (:func:`_seen_before`);
# later calls redo only what reads values or allocates: value checks, the append, the buffers, the launches.

class _Plan(NamedTuple):
    """What a call signature (:func:`_signature`) decides; made by a call that passed the checks."""

    backend: str  #: ``"cuda"`` or ``"hip"`` (part of the signature: torch's build decides it)
    on_gpu: bool  #: q on a CUDA/ROCm device (CPU tensors pass only while the interpreter is on: rechecked)
    paged: bool
    page_size: int
    capacity: int
    new: int  #: keys appended per sequence
    lse_shape: Optional[tuple]  #: ``(B, Hq, Sq)`` when the LSE is returned
    nonempty: bool  #: q has elements (else nothing is launched)
    call: "KD.DecodeCall"
    cfg: "KD.DecodeConfig"
    splits: int
    #: None, or the cache's length is not in the signature (:func:`_per_length`): a cache one key longer each call
    #: keeps its plan, capacity, config and split count worked out per call (:func:`_at_length`); then this is
    #: the length and the strides that follow it (:func:`_geometry`) of the call that made the plan, which its
    #: launch keys promise
    geometry: Optional[tuple]
    launch_keys: Optional[dict]  #: ``kv_decode.launch``'s kept launch keys for this signature (None: not kept)


_CALL_PLANS: dict = {}  #: signature -> _Plan; cleared with :func:`clear_cache`
_MAX_CALL_PLANS = 1024  #: a full table is emptied (a cache one key longer each call makes a new signature per call)
_CALLS: dict = {}  #: DecodeCall -> the same (:func:`_interned`)
_SEEN: set = set()  #: hashes of signatures seen once (:func:`_seen_before`)
_WHOLE_PLANS: dict = {}  #: :func:`_whole_cache_key` -> a kept _Plan of a dense decode call (:func:`attend_whole_cache`)
_SCALARS = (type(None), bool, int, float)  #: kinds of non-tensor inputs a signature holds as ``(type, value)``


def _signature(backend: str, tensors: tuple, options: tuple, window_size) -> Optional[tuple]:
    """A hashable key of everything the metadata checks and the launch keys read, or None when an
    input is of a kind it does not cover (that call takes the checked path, uncached).

    Per tensor: dtype, shape, strides, device and, on ROCm, whether its storage fits 2 GiB
    (Triton's buffer-load specialisation); and which tensors are one object (the kept launch keys' promise,
    :func:`rocmflash.kernels.launch.kept_key`). Alignment is not in it: ``kv_decode.launch`` checks it
    per call. Other inputs (options, an int ``cache_seqlens``, None) as ``(type, value)``, so
    ``True`` never stands for ``1`` nor ``1`` for ``1.0``: a key equal to a known good one is
    one that passed :func:`_validate` and ``check_options``. Exact ``torch.Tensor`` only; a
    subclass is checked on every call. NaN options are never equal to anything, so they always
    reach the checks (which reject them).
    """
    parts = [backend]
    for x in options:
        kind = type(x)
        if kind not in _SCALARS:
            return None
        parts.append((kind, x))
    if type(window_size) not in (tuple, list) or len(window_size) != 2:
        return None
    for x in window_size:
        kind = type(x)
        if kind not in _SCALARS:
            return None
        parts.append((kind, x))
    hip = backend == "hip"
    ids = []
    for t in tensors:
        kind = type(t)
        if kind is torch.Tensor:
            parts.append((t.dtype, t.shape, t.stride(), t.device, hip and L.fits_buffer_addressing(t)))
            ids.append(id(t))
        elif kind in _SCALARS:
            parts.append((kind, t))
        else:
            return None
    # one tensor in two places (k_cache is v_cache): its own launch plans. launch.alias_pattern inline, on the ids
    # this loop collects (calling it costs ~0.25 µs more per call); first, as _length_free counts from the end
    if len({*ids}) != len(ids):
        parts.insert(1, ("aliased", tuple(map(ids.index, ids))))
    return tuple(parts)


def _make_plan(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, window_size, softcap,
               num_splits, want_lse: bool, backend: str, keep: bool = False, cache_leftpad=None, k_descale=None,
               v_descale=None, per_length: bool = False, s_aux=None) -> _Plan:
    """Check every input's metadata and the options (raising before anything runs), choose the config and
    split count. ``keep``: the plan will be kept, so it gets a dict for its launch keys. ``per_length``: see
    :func:`_per_length` (the plan records the caches' :func:`_geometry`)."""
    paged, page_size, capacity, new, fp8 = _validate(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                                     num_splits, cache_leftpad, k_descale, v_descale, s_aux)
    if fp8:
        F8D.check_arch(q.device, k_cache.dtype)
    left, right = check_options(softmax_scale, causal, window_size, softcap)
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    call = _interned(KD.DecodeCall(B, Sq, Hkv, Hq // Hkv, D, paged, page_size, scale, float(softcap), left, right,
                                   cache_leftpad is not None, fp8, s_aux is not None))
    cfg = decode_config(q.device, D, q.dtype, Hq // Hkv, capacity, B, page_size, k_cache.dtype if fp8 else False)
    return _Plan(backend, q.device.type == "cuda", paged, page_size, capacity, new, (B, Hq, Sq) if want_lse else None,
                 q.numel() > 0, call, cfg, _split_count(num_splits, cfg, call, capacity, q.device),
                 _geometry(k_cache, v_cache) if per_length else None, {} if keep else None)


def _geometry(k_cache, v_cache) -> tuple:
    """What a ``per_length`` signature leaves out of the caches: the length and the strides that follow it."""
    sk, sv = k_cache.stride(), v_cache.stride()
    return k_cache.shape[1], v_cache.shape[1], sk[0], sk[2], sv[0], sv[2]


def _length_free(sig: Optional[tuple]) -> Optional[tuple]:
    """``sig`` (:func:`_signature`) without the caches' length and the strides that follow it (dims 1, and 0 and 2,
    of their (B, L, Hkv, D) view): one key for every length of a ``per_length`` call (None: not 4-D tensors).
    The caches are the signature's 11th and 10th entries from the end (the tensors close it, k_cache second)."""
    if sig is None:
        return None
    k, v = sig[-11], sig[-10]
    if len(k) != 5 or len(v) != 5 or len(k[1]) != 4 or len(v[1]) != 4:
        return None
    return sig[:-11] + ((k[0], k[1][0], k[1][2:], k[2][1], k[2][3], k[3], k[4]),
                        (v[0], v[1][0], v[1][2:], v[2][1], v[2][3], v[3], v[4])) + sig[-9:]


def _per_length(block_table, k, cache_seqlens) -> bool:
    """Whether a call's signature leaves its cache's length out: an unpaged cache read as a whole (lengths from a
    tensor or the cache itself), nothing appended -- transformers' cache, a new tensor one key longer each step."""
    return block_table is None and k is None and not isinstance(cache_seqlens, int)


def _split_count(num_splits: int, cfg: "KD.DecodeConfig", call: "KD.DecodeCall", capacity: int, device) -> int:
    """The caller's split count, else the config's, else the CU-count rule; at most one per key block."""
    splits = num_splits or cfg.num_splits
    if not splits:
        splits = KD.choose_num_splits(call.batch, call.heads_kv, capacity, cfg.BLOCK_N, C.num_compute_units(device),
                                      KD.programs_per_cu(cfg, call.kv_fp8))
    return max(1, min(splits, -(-capacity // cfg.BLOCK_N)))


def _at_length(plan: _Plan, q, k_cache, v_cache, num_splits: int) -> _Plan:
    """A ``per_length`` plan for this call's cache: itself when the cache has the geometry it was made for (a cache
    a model keeps: its launch keys hold), else with this length's capacity, the config of its bucket and the split
    count, and no launch keys (the signature holds everything else). ``ValueError`` when K and V differ in length
    (the signature leaves both lengths out)."""
    geometry = _geometry(k_cache, v_cache)
    if geometry == plan.geometry:
        return plan
    capacity = geometry[0]
    if geometry[1] != capacity:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    call = plan.call
    cfg = decode_config(q.device, call.head_dim, q.dtype, call.group, capacity, call.batch, 0,
                        k_cache.dtype if call.kv_fp8 else False)
    return plan._replace(capacity=capacity, cfg=cfg, splits=_split_count(num_splits, cfg, call, capacity, q.device),
                         geometry=geometry, launch_keys=None)


def _replayable(plan: _Plan) -> bool:
    """Whether a kept plan may serve this call: made for a GPU, or the interpreter is on (a CPU plan is kept only
    for the interpreter's tests; without it the call takes the checked path and its error)."""
    return plan.on_gpu or _interpreting()


def _interned(call: "KD.DecodeCall") -> "KD.DecodeCall":
    """One DecodeCall object per distinct value: launch keys holding it then compare by identity
    (a dataclass's ``__eq__`` runs in Python) when a kept plan's key meets an earlier plan's equal one."""
    hit = _CALLS.get(call)
    if hit is None:
        if len(_CALLS) >= _MAX_CALL_PLANS:
            _CALLS.clear()
        hit = _CALLS[call] = call
    return hit


def _plan(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, window_size, softcap,
          num_splits, want_lse: bool, cache_leftpad=None, out=None, k_descale=None, v_descale=None,
          s_aux=None) -> _Plan:
    """The kept plan of this call's signature, or a new one (checked; kept when the signature is known).
    ``out``: the caller's output buffer when it is not ``empty_like(q)`` (its layout joins the signature).
    ``s_aux`` joins the signature as the tensors do (None or its dtype, shape, stride, device): a plan made
    without sinks never serves a call with them, nor the other way round."""
    backend = C.torch_backend()
    sig = _signature(backend, (q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_leftpad, out, k_descale,
                               v_descale, s_aux),
                     (softmax_scale, causal, softcap, num_splits, want_lse), window_size)
    plan = _CALL_PLANS.get(sig) if sig is not None else None
    if plan is not None and _replayable(plan):
        return plan  # (a per-length plan kept under this full signature was made at this geometry)
    per_length = _per_length(block_table, k, cache_seqlens)
    loose = _length_free(sig) if per_length else None
    if loose is not None:  # a cache one key longer each call: the plan of its length-free signature
        plan = _CALL_PLANS.get(loose)
        if plan is not None and _replayable(plan):
            plan = _at_length(plan, q, k_cache, v_cache, num_splits)
            if plan.launch_keys is None and _seen_before(sig):  # a cache of this length again: kept as its own
                plan = _CALL_PLANS[sig] = plan._replace(launch_keys={})
            return plan
    keep = sig is not None and _seen_before(sig)
    keep_loose = loose is not None and _seen_before(loose)
    plan = _make_plan(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, window_size,
                      softcap, num_splits, want_lse, backend, keep or keep_loose, cache_leftpad, k_descale, v_descale,
                      per_length, s_aux)
    for kept, key in ((keep, sig), (keep_loose, loose)):
        if kept:
            if len(_CALL_PLANS) >= _MAX_CALL_PLANS:
                _CALL_PLANS.clear()
            _CALL_PLANS[key] = plan
    return plan


def _whole_cache_key(owner, q, k, v, softmax_scale, want_lse: bool, sinks=None) -> tuple:
    """What :func:`_signature` holds of a dense decode call beyond its ``owner``'s key (ROCm: the 2 GiB bits of
    q, k and v, which can be views of larger buffers; ``out`` is allocated whole from the owner's layout), and
    the ``sinks``' layout (None: no sinks; the owner's key does not know them)."""
    sink_key = None if sinks is None else (sinks.dtype, sinks.shape, sinks.stride(), sinks.get_device())
    key = (owner, k.stride(), v.shape, v.stride(), k.dtype, v.dtype, k.get_device(), v.get_device(),
           type(softmax_scale), softmax_scale, want_lse, sink_key)
    if C.torch_backend() == "hip":
        key += tuple(L.fits_buffer_addressing(t) for t in (q, k, v))
    return key


def _seen_before(sig: tuple) -> bool:
    """Whether ``sig`` was seen on an earlier call (:func:`rocmflash.kernels.launch.seen_before`)."""
    return L.seen_before(_SEEN, sig, _MAX_CALL_PLANS)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: tuple = (-1, -1), softcap: float = 0.0, rotary_interleaved: bool = True,
                            alibi_slopes=None, num_splits: int = 0, return_softmax_lse: bool = False, *,
                            return_lse: bool = False, check_values: bool = False, k_descale=None, v_descale=None,
                            s_aux=None):
    """Decode attention over a KV cache (flash-attn's ``flash_attn_with_kvcache``); see the module docstring.

    flash-attn 2.8's signature: its argument order, names and defaults. Returns ``(B, Sq, Hq, D)`` in q's
    dtype, or ``(out, lse)`` with ``return_softmax_lse=True`` (``return_lse=True``, keyword only, is the older
    rocmflash name of the same) and ``lse`` fp32 ``(B, Hq, Sq)`` (natural log; rows that see no key: output 0,
    LSE ``-inf``). Causal masking is bottom-right aligned: new token ``t`` sits at position ``L - Sq + t`` of its
    sequence's ``L`` keys. Not differentiable (inference).

    ``rotary_cos``/``rotary_sin`` ``(seqlen_ro, rotary_dim / 2)`` (``rotary_dim`` even, at most the head dim;
    ``seqlen_ro`` at least the cache's capacity): the rotary embedding of q and of the new ``k`` (which must be
    given) before the append, flash-attn's rules -- new key ``t`` of sequence ``b`` at position
    ``cache_seqlens[b] + t``; queries at the same positions when causal or local, else all at
    ``cache_seqlens[b]``; ``rotary_interleaved`` pairs features ``(0, 1), (2, 3), ...``, else
    ``(i, i + rotary_dim / 2)`` (GPT-NeoX). Done with torch ops in fp32 on the device (new tensors: the caller's
    ``q``/``k`` are unchanged). ``cache_batch_idx`` ``(B,)`` int32: the row of a ``(B_cache, S_max, Hkv, D)``
    cache that batch row ``b`` uses (read and appended in place, as a paged cache of one ``S_max``-key page per
    row; indices out of range are reported as bad pages are). Not implemented, each a one-line
    ``NotImplementedError``: ``alibi_slopes``, and ``cache_batch_idx`` with ``block_table``
    (:mod:`rocmflash.api.kvcache_compat`).

    **The call never waits for the GPU.** Shapes, dtypes and devices are checked on the host; the
    *values* of ``cache_seqlens``, ``cache_leftpad`` and ``block_table`` live on the GPU, and reading
    them would make every call wait for it. So the kernels check them instead. A sequence whose length
    is outside ``0..capacity - Sk_new``, or one of whose new rows falls on a page outside the pool, stores
    none of its new ``k``/``v`` (no other sequence's rows and no unused page of a shared pool change); a
    start outside its sequence, a used page outside the pool or such a length is never used as an address
    (nothing outside the cache is read or written). That sequence's output is undefined, and a bit of a
    per-device error word is set (as for an int64 value outside int32). The error reaches you as a
    ``ValueError`` naming what was out of range: from :func:`check_errors` (waits for the GPU; call
    it where a step may wait, e.g. once per generated token batch or in tests), and on its own from a
    later call on that device -- every call looks at the word's last copy without waiting, and a
    copy is started every :data:`ERROR_POLL_CALLS` calls. ``check_values=True`` (keyword only, not in
    flash-attn) checks the values on the host before anything runs, as earlier releases did by
    default: the exact value and index in the message, at the price of one wait per call (skipped
    while a graph is captured).

    ``cache_leftpad`` (flash-attn's argument of that name): int32 ``(B,)``, the
    key each sequence starts at -- a left-padded batch, whose keys before it are ignored (not
    read). Sequence ``b`` is keys ``[cache_leftpad[b], cache_seqlens[b] + Sk_new)``; causal
    masks and windows keep counting positions in the cache, so the new tokens stay aligned to
    its end. Each value must be in ``0..cache_seqlens[b] + Sk_new`` (checked with the values).

    **fp8 cache** (keyword-only ``k_descale``/``v_descale``, flash-attn 3's names): ``k_cache``/``v_cache``
    of the arch's fp8 format (``float8_e4m3fnuz``/``e5m2fnuz`` on gfx942; ``float8_e4m3fn``/``e5m2`` on
    gfx950 and sm_89+; none on gfx90a: a ``TypeError`` naming arch and format), holding
    ``k / k_descale[b, h]``; the descales are fp32 ``(B, Hkv)``, required, finite and > 0. ``q`` and the
    new ``k``/``v`` stay bf16/fp16: the new keys are written as ``k / k_descale`` rounded to nearest (ties
    to even) and **saturated** to the format's largest finite value (448, 240 or 57344; NaN stays NaN),
    the bytes of torch's ``(k.float() / k_descale[:, None, :, None]).clamp(-max, max).to(k_cache.dtype)``.
    The kernel reads half the bytes, widens K/V to fp16 in registers (exactly) and runs both dots in fp16
    (q scaled by a power of two into fp16's range); the scales multiply the scores and the output. A
    scale not finite and > 0 is a value: checked on the GPU (reported like the others above; that call
    writes nothing to the cache) or on the host with ``check_values=True`` (raises before anything is
    written).

    **Attention sinks** (keyword-only ``s_aux``, vLLM's name; gpt-oss's ``module.sinks``): a ``(Hq,)`` fp32/bf16/fp16
    tensor, one logit per query head in the scaled-score domain (natural log, after ``softmax_scale`` and
    ``softcap``, which it is not put through), joined to each row's softmax denominator as a key whose value is
    zero: ``softmax([q·k * scale ..., s_aux[h]])`` with the sink's column dropped -- transformers' eager gpt-oss
    attention. ``softmax_lse`` then holds the sink (a row that sees no key: output 0, LSE ``s_aux[h]``).
    ``-inf`` is no sink for that head; NaN or ``+inf`` makes the head's rows NaN and is reported as the values
    above are (``check_values=True``: a ``ValueError`` before anything runs). Any cache (paged, fp8), window and
    split count. Not differentiable (no gradient reaches ``s_aux``).

    The metadata checks, config and split count are worked out once per call signature
    (dtypes, shapes, strides, devices, options) and kept; :func:`clear_cache` forgets them.
    """
    if rotary_cos is not None or rotary_sin is not None or cache_batch_idx is not None or alibi_slopes is not None:
        q, k, cache_seqlens, block_table = _compat().prepare(q, k_cache, k, rotary_cos, rotary_sin, cache_seqlens,
                                                             cache_batch_idx, block_table, causal, window_size,
                                                             rotary_interleaved, alibi_slopes)
    want_lse = bool(return_lse or return_softmax_lse)
    if torch.compiler.is_compiling():  # one custom op (rocmflash::kvcache_fwd / _append_fwd), values at run time
        return _traced(q, k_cache, v_cache, k, v, cache_seqlens, cache_leftpad, block_table, softmax_scale, causal,
                       window_size, softcap, num_splits, want_lse, check_values, k_descale, v_descale, s_aux)
    plan = _plan(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal, window_size, softcap,
                 num_splits, want_lse, cache_leftpad, None, k_descale, v_descale, s_aux)
    device = q.device
    fp8 = plan.call.kv_fp8
    # the whole cache (nothing appended: appending needs cache_seqlens) and no host check: the kernel reads no
    # lengths (WHOLE_CACHE), so no (B,) tensor is filled per call (a cache one key longer each step: a new one each)
    whole = cache_seqlens is None and cache_leftpad is None and not check_values
    new = plan.new
    if check_values:  # int64 values narrowed by torch: the host check reads the caller's
        lens = _lengths(cache_seqlens, plan.call.batch, plan.capacity, device)
        starts = as_int32(cache_leftpad) if cache_leftpad is not None else None
        _check_values(cache_seqlens, lens, block_table, k_cache, new, plan.capacity, plan.page_size, device, starts,
                      (k_descale, v_descale) if fp8 else None, cache_leftpad)
        _check_sink_values(s_aux, device)
        check_errors(device)
    else:
        _poll_errors(device)  # (before the narrowing, which may set a bit of this call: raised by a later one)
        # an int64 value outside int32 saturates and sets BAD_WIDE (one launch, as torch's conversion)
        lens = None if whole else _lengths(cache_seqlens, plan.call.batch, plan.capacity, device, plan.backend)
        starts = as_int32(cache_leftpad, plan.backend) if cache_leftpad is not None else None
    out = torch.empty_like(q)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=device) if want_lse else None
    with L.on_device(q):
        if new and fp8:  # quantise (one launch; a bad scale writes nothing and sets BAD_DESCALE)
            seqlens = KQ.append_quantised(k_cache, v_cache, k, v, lens, block_table, plan.page_size, k_descale,
                                          v_descale, KD.error_word(device), DC.BAD_DESCALE.value, plan.backend)
        elif new:  # one launch: the rows, and the lengths after them
            seqlens = kv_append.append(k_cache, v_cache, k, v, lens, block_table, plan.page_size, plan.backend,
                                       plan.launch_keys, KD.error_word(device))
        else:
            seqlens = lens
        if plan.nonempty:
            KD.launch(plan.call, q, k_cache, v_cache, block_table if plan.paged else None, seqlens, plan.cfg,
                      plan.splits, out, lse, keys=plan.launch_keys, backend=plan.backend, leftpads=starts,
                      new_keys=new, k_descale=k_descale if fp8 else None, v_descale=v_descale if fp8 else None,
                      sinks=s_aux)
    return (out, lse) if want_lse else out


def _traced(q, k_cache, v_cache, k, v, cache_seqlens, cache_leftpad, block_table, softmax_scale, causal,
            window_size, softcap, num_splits, want_lse: bool, check_values: bool, k_descale, v_descale, s_aux=None):
    """What :func:`flash_attn_with_kvcache` runs while torch.compile traces, after its compatibility step: the
    metadata checks (the eager call's own, at trace time: a bad call fails to trace with the eager message), then
    one op -- ``torch.ops.rocmflash.kvcache_append_fwd`` when there are new keys, else ``kvcache_fwd``
    (:mod:`rocmflash.api.decode_ops`), whose implementation is this eager call. Returns ``out`` or ``(out, lse)``
    as the eager call does. ``s_aux``: the attention sinks, the ops' last argument."""
    if isinstance(cache_seqlens, torch.SymInt):  # an int length traced as dynamic: its range check needs the value
        cache_seqlens = int(cache_seqlens)  # (a guard: a new value recompiles; a tensor length does not)
    _validate(q, k_cache, v_cache, k, v, cache_seqlens, block_table, num_splits, cache_leftpad, k_descale,
              v_descale)
    check_options(softmax_scale, causal, window_size, softcap)
    _check_sinks(s_aux, q.shape[2], q.device)
    is_tensor = isinstance(cache_seqlens, torch.Tensor)
    op = torch.ops.rocmflash.kvcache_append_fwd if k is not None else torch.ops.rocmflash.kvcache_fwd
    out, lse = op(q, k_cache, v_cache, k, v, cache_seqlens if is_tensor else None,
                  None if is_tensor else cache_seqlens, cache_leftpad, block_table, k_descale, v_descale,
                  None if softmax_scale is None else float(softmax_scale), causal, window_size[0], window_size[1],
                  float(softcap), num_splits, want_lse, check_values, s_aux)
    return (out, lse) if want_lse else out


_COMPAT = []


def _compat():
    """:mod:`rocmflash.api.kvcache_compat`, imported on first use (rotary, ``cache_batch_idx``) and then kept."""
    if not _COMPAT:
        from rocmflash.api import kvcache_compat

        _COMPAT.append(kvcache_compat)
    return _COMPAT[0]


def attend_whole_cache(q, k, v, softmax_scale: float, causal: bool, out, lse=None, owner=None, sinks=None) -> None:
    """Attention of ``q (B, Sq, Hq, D)`` over every key of ``k``/``v`` ``(B, Sk, Hkv, D)`` into ``out``
    (``q``'s shape) and, when given, ``lse`` ``(B, Hq, Sq)`` fp32: the decode kernel serving a dense call
    (``rocmflash.attention``, ``flash_attn_func``, the torch op and ``patch_sdpa`` route decode-shaped
    calls here, :func:`is_decode_shaped`). Any strides; inputs validated by the caller (checked again
    once per signature); no host read, no copy. ``owner``: the caller's plan of the call (``ops._Call``), whose
    key fixes q, k's shape, causal and ``out``'s layout: a kept plan is then found by :func:`_whole_cache_key`.
    ``sinks``: ``(Hq,)`` attention sinks, as :func:`flash_attn_with_kvcache`'s ``s_aux`` (checked with the plan)."""
    key = None if owner is None else _whole_cache_key(owner, q, k, v, softmax_scale, lse is not None, sinks)
    plan = _WHOLE_PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _plan(q, k, v, None, None, None, None, softmax_scale, causal, (-1, -1), 0.0, 0, lse is not None, None,
                     out, s_aux=sinks)
        if key is not None and plan.launch_keys is not None and _replayable(plan):
            if len(_WHOLE_PLANS) >= _MAX_CALL_PLANS:
                _WHOLE_PLANS.clear()
            _WHOLE_PLANS[key] = plan  # only a kept plan: its signature passed the checks and was seen before
    with L.on_device(q):  # no lengths: every sequence is the whole cache (the kernel reads none)
        KD.launch(plan.call, q, k, v, None, None, plan.cfg, plan.splits, out, lse, keys=plan.launch_keys,
                  backend=plan.backend, sinks=sinks)


__all__ = ["flash_attn_with_kvcache", "decode_config", "clear_cache", "check_errors", "attend_whole_cache",
           "is_decode_shaped"]
