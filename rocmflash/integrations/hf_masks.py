"""What the transformers integration knows of an attention mask without reading it, or reads once: the
padding + causal/window layout of a 2-D mask (:func:`padded_layout`), the mask function that records
how it built one (:func:`rocmflash_mask`), the packing plans of padded tokens and the decode key range,
kept per mask tensor while it is unchanged (:func:`_mask_plan`). :mod:`rocmflash.integrations.hf`
re-exports these names.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple, Optional

import torch


def padded_layout(mask, q_len: int, kv_len: int, causal: bool, window_left: int):
    """Read a padded batch from transformers' boolean 4-D mask, or None when the mask is anything else.

    Queries are the last ``q_len`` of the keys up to the last one any query may see (a static
    cache's free slots after it are cut: transformers' prefill into a static cache). A key is real
    when some query may attend it; a query is real when its own position's key is. The mask is
    accepted only if, on the real queries, it equals the band (causal and/or window) over the real
    tokens *in order* -- exactly what the varlen kernel computes on the unpadded sequences. Returns
    ``(valid_q (B, Sq), valid_k (B, kept), lens_q, lens_k)``, ``kept <= kv_len`` the keys up to that last one.

    A mask built by :func:`rocmflash_mask` as "causal + 2-D padding" is known without reading it
    (:func:`_built_layout`). Any other mask is read once on the host (a wait for the GPU): whether it
    is one rocmflash computes exactly decides the route (rocmflash or SDPA), so it cannot stay on the device.
    """
    built = _built_layout(mask, q_len, kv_len, causal, window_left)
    if built is not None:
        return built
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
        return None
    B = mask.shape[0]
    m = mask[:, 0].expand(B, q_len, kv_len)
    valid_k = m.any(1)
    if kv_len >= q_len:  # the queries end at the last key any query sees (at least q_len keys)
        pos = torch.arange(1, kv_len + 1, device=mask.device)
        end = torch.where(valid_k.any(0), pos, 0).max().clamp(min=q_len)
        valid_q = valid_k.gather(1, (end - q_len + pos[:q_len] - 1).expand(B, q_len))
    else:
        end = valid_k.new_full((), kv_len, dtype=torch.int64)
        valid_q = m.any(2)
    lens_q, lens_k = valid_q.sum(1), valid_k.sum(1)
    rank_q = valid_q.cumsum(1) - 1
    rank_k = valid_k.cumsum(1) - 1
    rel = rank_k[:, None, :] - rank_q[:, :, None] - (lens_k - lens_q)[:, None, None]
    expected = valid_q[:, :, None] & valid_k[:, None, :]
    if causal:
        expected &= rel <= 0
    if window_left >= 0:
        expected &= rel >= -window_left
    same = ((m & valid_q[:, :, None]) == expected).all()
    ok, kept = torch.stack([same.to(end.dtype), end]).tolist()  # the one host read
    if not ok:
        return None
    return valid_q, valid_k[:, :kept], lens_q, lens_k


#: the last mask :func:`rocmflash_mask` built as "causal + 2-D padding" (a weak reference: the mask is not
#: kept alive for it), its version and its layout
_BUILT: dict = {}


def rocmflash_mask(*args, **kwargs):
    """transformers mask function for ``"rocmflash"``: ``sdpa_mask``'s mask, bit for bit (and its choice to
    build none), remembering for a plain causal mask over a 2-D padding mask its padded layout, computed on
    the device from the 2-D mask: the attention layers then never read the 4-D mask on the host.

    Only ``causal_mask_function`` with integer offsets is remembered: any other pattern (sliding windows,
    packed sequences, ``or``/``and`` overlays, a static cache's tensor offset) is read and checked by
    :func:`padded_layout`. transformers' own ``sdpa_mask`` still reads the 2-D mask to decide whether a mask
    is needed at all (its ``is_causal`` skip); that read is transformers', once per forward.
    """
    from transformers.masking_utils import (
        causal_mask_function,
        prepare_padding_mask,
        sdpa_mask,
    )

    mask = sdpa_mask(*args, **kwargs)
    if args or not isinstance(mask, torch.Tensor) or torch.compiler.is_compiling():
        return mask
    pad = kwargs.get("attention_mask")
    if pad is None:
        _remember_unpadded(mask)
    sizes = [kwargs.get(name) for name in ("q_length", "kv_length", "q_offset", "kv_offset")]
    if (kwargs.get("mask_function") is not causal_mask_function or not isinstance(pad, torch.Tensor)
            or pad.dtype != torch.bool or pad.dim() != 2 or any(type(x) is not int for x in sizes)):
        return mask
    q_len, kv_len, q_off, kv_off = sizes
    end = q_off + q_len  # one past the last query's position: later keys are never seen (causal)
    try:
        version = mask._version
    except (AttributeError, RuntimeError):  # inference-mode tensors have no version counter
        return mask
    if not (kv_off <= q_off and end <= kv_off + kv_len) or mask.shape != (pad.shape[0], 1, q_len, kv_len):
        return mask
    pad = prepare_padding_mask(pad, kv_len, kv_off)  # as sdpa_mask pads it
    valid_q, valid_k = pad[:, q_off:end], pad[:, kv_off:end]
    _BUILT.clear()
    _BUILT.update(mask=weakref.ref(mask), version=version, sizes=(q_len, kv_len),
                  layout=(valid_q, valid_k, valid_q.sum(1), valid_k.sum(1)))
    return mask


#: the last masks :func:`rocmflash_mask` built without a 2-D padding mask (weak references and versions): a causal
#: or sliding mask transformers built over a row it did not check for packed sequences (a cache was passed), or the
#: block-diagonal mask of the packed sequences it found -- the masks a packing by ``position_ids`` may come with
_UNPADDED: list = []


def _remember_unpadded(mask) -> None:
    try:
        version = mask._version
    except (AttributeError, RuntimeError):
        return
    del _UNPADDED[:-3]  # a forward builds one mask per layer type: keep the last few
    _UNPADDED.append((weakref.ref(mask), version))


def built_without_padding(mask) -> bool:
    """Whether ``mask`` is one :func:`rocmflash_mask` built without a 2-D padding mask, unchanged since."""
    try:
        version = mask._version
    except (AttributeError, RuntimeError):
        return False
    return any(ref() is mask and v == version for ref, v in _UNPADDED)


def _built_layout(mask, q_len: int, kv_len: int, causal: bool, window_left: int):
    """:func:`padded_layout`'s answer for a mask :func:`rocmflash_mask` built as "causal + 2-D padding" and
    unchanged since, without reading it (None otherwise, or when the call asks for another band).

    A real query (its own key real) at position ``p`` sees the real keys at positions ``<= p``: the
    real keys of rank ``<=`` its rank plus the real keys before the first query, which is the varlen
    kernel's bottom-right causal band over the packed tokens, holes in the padding included. A window
    counts positions in the mask but tokens in the kernel, which differ across holes: not served here.
    """
    ref = _BUILT.get("mask")
    if ref is None or ref() is not mask or not causal or window_left >= 0 or _BUILT["sizes"] != (q_len, kv_len):
        return None
    try:
        if mask._version != _BUILT["version"]:
            return None
    except (AttributeError, RuntimeError):
        return None
    return _BUILT["layout"]


def _cu(lengths):
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


def _destinations(valid):
    """Where each padded token of ``valid`` ``(B, S)`` goes in a packed ``(B * S)`` batch: real tokens first,
    in order (sequence ``b`` at ``cu[b]..cu[b+1]``), padding after them. Device ops only: the number of real
    tokens stays on the device, so the packed tensors keep ``B * S`` rows (the tail unused)."""
    flat = valid.reshape(-1)
    real = flat.cumsum(0)  # 1-based rank among real tokens
    pad_rank = torch.arange(1, flat.numel() + 1, device=flat.device) - real  # 1-based rank among padding
    return torch.where(flat, real - 1, real[-1:] + pad_rank - 1)


class _Padded(NamedTuple):
    """How a padded batch is packed for the varlen kernel: the packed row of each padded token (None: no
    padding, nothing to move), cumulative lengths and the longest sequences' bounds."""

    dest_q: Optional[torch.Tensor]
    dest_k: Optional[torch.Tensor]
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def _padded_plan(layout) -> Optional[_Padded]:
    """A :class:`_Padded` from :func:`padded_layout`'s answer (None stays None); no host read (the grid is
    sized by the padded lengths, which bound every sequence)."""
    if layout is None:
        return None
    valid_q, valid_k, lens_q, lens_k = layout
    return _Padded(_destinations(valid_q), _destinations(valid_k), _cu(lens_q), _cu(lens_k), valid_q.shape[1],
                   valid_k.shape[1])

def _unpadded_plan(batch: int, q_len: int, kv_len: int, device) -> _Padded:
    """The :class:`_Padded` of a batch without padding (no host read)."""
    def cu(n):
        return torch.arange(0, (batch + 1) * n, n, dtype=torch.int32, device=device)

    return _Padded(None, None, cu(q_len), cu(kv_len), q_len, kv_len)

def decode_key_range(mask, batch: int, kv_len: int, window_left: int) -> Optional[tuple]:
    """``(starts, ends)``, int32 ``(B,)`` each, when ``mask`` is a one-token step's mask over one run of
    keys per row -- left padding before it, a static cache's unused slots after it, the left window
    cut from the query's own key (the last of the run) -- else None. One host read: whether the mask is
    one run decides the kernel (the decode kernel, or the varlen route for holes), so it cannot stay on the
    device -- a wrong guess would be a wrong answer, not an error."""
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


def kept_per_tensor(store: dict, tensor, key: tuple, build):
    """``build()`` for ``tensor`` and ``key``, kept in ``store`` while the same tensor comes back unchanged (its
    version counter: an in-place change reads it anew; another tensor empties the store). Inference-mode tensors
    have no version counter: nothing is kept for them."""
    try:
        version = tensor._version
    except (AttributeError, RuntimeError):
        return build()
    if store.get("tensor") is not tensor or store.get("version") != version:
        store.clear()
        store.update(tensor=tensor, version=version)
    if key not in store:
        store[key] = build()
    return store[key]


def _mask_plan(mask, key: tuple, build):
    """``build()`` for ``mask`` and ``key``, kept while the same mask tensor comes back unchanged
    (:func:`kept_per_tensor`)."""
    return kept_per_tensor(_MASK_PLANS, mask, key, build)
