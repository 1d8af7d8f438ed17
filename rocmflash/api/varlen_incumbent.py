"""The platform's own varlen attention as the packed forward's incumbent: timed by the varlen tune, served where it won.

torch ships a varlen attention of its own, :func:`torch.nn.attention.varlen.varlen_attn` (FlashAttention's varlen
kernel on CUDA; on ROCm what torch builds for it): packed ``(total, H, D)`` tensors and ``cu_seqlens``, as
``flash_attn_varlen_func`` takes them -- no nested tensors, no copies, lengths never read on the host. ``rocmflash
tune --mode varlen`` times it beside the Triton winner, in the same worker, on the same packed batch, with the same
fp32 gate, L2 flush and repetitions (:func:`rocmflash.tuning.varlen_worker.measure_varlen_incumbent`), and the entry
keeps it as ``incumbent`` (:func:`rocmflash.api.incumbent.incumbent_field`'s layout; ``--no-incumbent`` skips it)::

    "incumbent": {"backend": "varlen_attn", "time_ms": 0.41, "triton_ms": 0.38,
                  "train": {"backend": "varlen_attn", "time_ms": 1.30, "triton_ms": 1.61},
                  "backends": {"varlen_attn": {...}}}

At run time (:func:`serving`) a ``flash_attn_varlen_func`` call runs torch's function where the nearest measured
varlen entry (at most one length bucket away) says it won: a forward-only call by the forward times, a call that
needs gradients by the training steps' times (forward and backward of each side: a backend's backward needs its
own forward), never under ``torch.use_deterministic_algorithms(True)`` with gradients (FlashAttention's backward
accumulates with atomics). torch's kernel addresses memory by the ``cu_seqlens`` values, which rocmflash never reads
on the host; so one tiny launch first makes a safe copy of them on the device (clamped into the packed tensors,
non-decreasing: equal to the given lists when they are right) and reports what is wrong through the varlen error
word, as the Triton kernel does (:func:`rocmflash.kernels.varlen.host.launch_sanitised_lengths`). Only where it computes
rocmflash's function (:func:`excludes`): no LSE, no window, no soft cap, and causal only with one ``cu_seqlens``
tensor for queries and keys (each sequence attends to itself, so the two conventions of the causal diagonal agree).
``ROCMFLASH_NO_INCUMBENT=1`` turns it off. The names of this
torch's function and keywords are read from its signature, never assumed: a torch without it (or without
``enable_gqa`` for a GQA call, or ``scale``) has no incumbent for that call. An entry timed on another platform
(CUDA, ROCm) never serves here (:func:`rocmflash.api.incumbent.serving_refusal`), and where torch's function raises
on the first served call of a problem (:func:`run_served`), that problem falls back to rocmflash's varlen kernel
with one warning and is not tried again.
"""

from __future__ import annotations

import math
from typing import Optional

from rocmflash.hw.platform import varlen_attn

#: the backend name an entry stores
NAME = "varlen_attn"


def excludes(causal: bool, same_cu: bool, group: int, head_dim: int, scale: Optional[float], want_lse: bool = False,
             windowed: bool = False, softcap: float = 0.0) -> Optional[str]:
    """Why this call never runs the incumbent, or None. ``same_cu``: queries and keys share one ``cu_seqlens``
    tensor; ``scale``: the softmax scale asked (None: ``1/sqrt(D)``)."""
    fn, names = varlen_attn()
    if fn is None:
        return "this torch has no torch.nn.attention.varlen.varlen_attn"
    if want_lse:
        return "the call returns the LSE"
    if windowed or softcap:
        return "a window or a soft cap (the tune timed neither)"
    if causal and not same_cu:
        return "causal with separate cu_seqlens_q/cu_seqlens_k (the causal diagonal's alignment may differ)"
    if causal and "window_size" not in names and "is_causal" not in names:
        return "this torch's varlen_attn takes no causal flag"
    if group > 1 and "enable_gqa" not in names:
        return "GQA, which this torch's varlen_attn does not take"
    if scale is not None and not math.isclose(scale, 1.0 / math.sqrt(head_dim), rel_tol=1e-6) and "scale" not in names:
        return "a softmax scale other than 1/sqrt(D), which this torch's varlen_attn does not take"
    return None


def run(q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: Optional[float]):
    """``(total_q, Hq, D)``: torch's ``varlen_attn`` of packed tensors (a call :func:`excludes` lets through)."""
    fn, names = varlen_attn()
    kwargs = {}
    if causal:
        if "window_size" in names:
            kwargs["window_size"] = (-1, 0)
        else:
            kwargs["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        kwargs["enable_gqa"] = True
    if scale is not None and "scale" in names:
        kwargs["scale"] = float(scale)
    return fn(q, k, v, cu_q, cu_k, int(max_q), int(max_k), **kwargs)


def run_safe(q, k, v, cu_q, cu_k, batch: int, max_q: int, max_k: int, causal: bool, scale: Optional[float]):
    """:func:`run` on device-side safe copies of ``cu_q``/``cu_k`` (one launch that also reports wrong values)."""
    from rocmflash.kernels.varlen.host import launch_sanitised_lengths

    safe_q, safe_k = launch_sanitised_lengths(cu_q, cu_k, batch, q.shape[0], k.shape[0], int(max_q), int(max_k))
    return run(q, k, v, safe_q, safe_k, max_q, max_k, causal, scale)


_SERVING: dict = {}  #: ((device, head dim, dtype, causal, group, bucket), train) -> whether the incumbent serves
_RAN: set = set()  #: the :data:`_SERVING` keys whose first served call ran (:func:`run_served`)


def serving(device, head_dim: int, dtype, causal: bool, group: int, max_seqlen_k: int, train: bool = False) -> bool:
    """Whether the live GPU's nearest measured varlen entry says the incumbent was faster (:func:`lookup`; ``train``:
    by the training steps' times). Cached per problem, length bucket and pass; :func:`rocmflash.api.selection.clear_cache`
    forgets."""
    return served_key(device, head_dim, dtype, causal, group, max_seqlen_k, train) is not None


def served_key(device, head_dim: int, dtype, causal: bool, group: int, max_seqlen_k: int,
               train: bool = False) -> Optional[tuple]:
    """:func:`serving` as the problem's key for :func:`run_served` (None: rocmflash's kernel serves): the nearest
    measured entry says the incumbent was faster and it did not raise on this problem's first call here
    (:func:`rocmflash.api.incumbent.fell_back`)."""
    from rocmflash.api import selection

    if selection.incumbent_disabled():
        return None
    key = (selection._varlen_key(device, head_dim, dtype, causal, group, max_seqlen_k), train)
    served = _SERVING.get(key)
    if served is None:
        from rocmflash.api.incumbent import fell_back

        served = _SERVING[key] = lookup(device, head_dim, dtype, causal, group, max_seqlen_k, train)[0] is not None \
            and not fell_back(NAME, train, _problem(key))
    return key if served else None


def _problem(key: tuple) -> tuple:
    """A :func:`served_key` as :func:`rocmflash.api.incumbent.first_call`'s ``(what, lengths)``: the length bucket
    last in the selection's key."""
    return key[0][:-1], key[0][-1:]


def run_served(key: tuple, q, k, v, cu_q, cu_k, batch: int, max_q: int, max_k: int, causal: bool,
               scale: Optional[float]):
    """:func:`run_safe` for a call :func:`served_key` gave ``key``, or None: torch's function raised on the first
    served call of this problem (:func:`rocmflash.api.incumbent.first_call`: one warning), and rocmflash's kernel
    serves it and every later call of it. Only the first call is guarded; later ones pay one set lookup."""
    if key in _RAN:
        return run_safe(q, k, v, cu_q, cu_k, batch, max_q, max_k, causal, scale)
    from rocmflash.api.incumbent import first_call

    out = first_call(run_safe, NAME, key[1], _problem(key), q, k, v, cu_q, cu_k, batch, max_q, max_k, causal, scale)
    if out is None:
        _SERVING[key] = False
    else:
        _RAN.add(key)
    return out


def lookup(device, head_dim: int, dtype, causal: bool, group: int, max_seqlen_k: int, train: bool = False) -> tuple:
    """``(the backend served or None, the deciding entry's key or None, why not or None)`` on ``device``'s GPU
    (:func:`decide`)."""
    from rocmflash.api.selection import db_disabled, device_identity

    gpu_name, _ = device_identity(device)
    if gpu_name is None or db_disabled():
        return None, None, "no database for this device"
    d = decide(gpu_name, head_dim, dtype, causal, group, max_seqlen_k, train)
    return d["serves"], d["entry"], d["why"]


def decide(gpu_name: str, head_dim: int, dtype, causal: bool, group: int, max_seqlen_k: int,
           train: bool = False) -> dict:
    """What the nearest measured varlen entry of ``gpu_name`` (:func:`rocmflash.db.lookups.varlen.nearest_entry`, the
    one whose tile the Triton kernel runs) says of the incumbent, for forward-only calls or (``train``) calls that need
    gradients, by the training steps' times: ``{"entry", "bucket_distance", "incumbent_ms", "triton_ms", "serves"
    (:data:`NAME` or None), "why" (None when it serves)}``. It serves when the entry is at most
    ``INCUMBENT_MAX_BUCKET_DISTANCE`` length buckets away and its ``incumbent`` beat rocmflash
    (:func:`rocmflash.api.incumbent.winner`). ``rocmflash explain`` prints both."""
    from rocmflash.api.incumbent import database_platform, serving_refusal, winner
    from rocmflash.api.selection import INCUMBENT_MAX_BUCKET_DISTANCE
    from rocmflash.config import normalize_dtype
    from rocmflash.db.lookups.varlen import PREFIX, nearest_entry

    match = nearest_entry(gpu_name, PREFIX, int(head_dim), normalize_dtype(dtype), int(group), bool(causal),
                          max(int(max_seqlen_k), 1), lambda entry: entry.get("incumbent") or {})
    out = {"entry": None, "bucket_distance": None, "incumbent_ms": None, "triton_ms": None, "serves": None,
           "why": "no measured varlen entry"}
    if match is None:
        return out
    field = match.config
    row = (field.get("backends") or {}).get(NAME) or {}
    side = (field.get("train") or {}) if train else field
    out.update(entry=match.key, bucket_distance=match.bucket_distance,
               incumbent_ms=row.get("train_ms" if train else "time_ms"), triton_ms=side.get("triton_ms"))
    if match.bucket_distance > INCUMBENT_MAX_BUCKET_DISTANCE:
        out["why"] = f"the nearest varlen entry is {match.bucket_distance} length buckets away"
    elif not field:
        out["why"] = "the entry has no incumbent timing (tuned without it)"
    elif row.get("status") not in (None, "ok"):
        out["why"] = f"{NAME} was not timed: {row.get('status')}: {row.get('error')}"
    elif train and not side:
        out["why"] = f"no training step of {NAME} was timed" + (f" ({row['train_error']})" if row.get("train_error")
                                                                 else "")
    elif winner(field, train=train, check=False) != NAME:
        out["why"] = "rocmflash's kernels were as fast or faster" if train else "rocmflash's kernel was as fast or faster"
    else:
        out.update(serves=NAME, why=None)
        refusal = serving_refusal(NAME, field, database_platform(match.path))  # timed elsewhere, or absent here
        if refusal:
            out.update(serves=None, why=refusal)
    return out


def clear() -> None:
    """Forget the cached verdicts (``selection.clear_cache`` calls this)."""
    _SERVING.clear()
    _RAN.clear()


def _register() -> None:
    from rocmflash.api.clear_hooks import register_clear

    register_clear(clear)


_register()

__all__ = ["NAME", "excludes", "run", "run_safe", "serving", "served_key", "run_served", "lookup", "decide", "clear"]
