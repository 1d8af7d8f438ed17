"""Packed batches for the transformers integration: several sequences flattened into the rows of one batch.

transformers hands attention a packed batch in one of two forms (:mod:`rocmflash.integrations.hf` routes both to
the varlen kernel, causal per sequence, with the layer's sliding window and soft-cap):

* **the packing kwargs** ``cu_seq_lens_q``, ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k``
  (``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``): cumulative lengths over the batch's tokens
  flattened row after row, ``(B * S)``, as transformers' flash path reads them (:func:`packing_from_kwargs`);
* **position_ids only** (``DataCollatorWithFlattening``'s default): a sequence starts at each row's first token and
  wherever a position is not the previous one plus 1 -- transformers' own rule
  (``masking_utils.find_packed_sequence_indices``), so the sequences are the ones its eager and SDPA masks separate
  (:func:`packing_from_position_ids`).

Where transformers also built a 4-D mask (it does for a packed batch without a cache: a block-diagonal causal mask,
a sliding one for sliding layers), the mask is checked to be exactly that packing's causal/window band
(:func:`packed_mask_matches`): a mask that says anything else is not served by the packing.

Host reads: the packing kwargs need none (their values are checked by the varlen kernel, reported through its
error word; a ``max_length_*`` given as a tensor is read once). ``position_ids`` are read once per tensor (every
layer of a forward gets the same one; kept while it is unchanged, like :func:`hf_masks._mask_plan`): the number
of sequences sizes the kernel's grid, so it has to reach the host -- a packing sized without it would launch a grid
of ``B * S`` sequences, almost all empty. A 4-D mask checked against a packing is read with it (one read).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from rocmflash.integrations.hf_masks import kept_per_tensor

#: the packing kwargs, all four or none (transformers' flash path takes them only together)
PACKING_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


class Packed(NamedTuple):
    """A packed batch for the varlen kernel: int32 cumulative lengths over the flattened ``(B * S)`` rows of q and
    of k/v, and the longest sequence of each (host ints: they size the grid)."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def _host_int(name: str, value) -> int:
    """A ``max_length_*`` kwarg as a host int (a 0-d integer tensor is read: one wait); else a one-line error."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"rocmflash: {name} must be an int >= 0 (the longest packed sequence), got {value!r}")
    return value


def _cu(name: str, cu, device) -> torch.Tensor:
    """A ``cu_seq_lens_*`` kwarg as the varlen kernel's int32 tensor on q's device (no host read)."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.is_floating_point() or cu.dtype == torch.bool:
        got = tuple(cu.shape) if isinstance(cu, torch.Tensor) else type(cu).__name__
        raise ValueError(f"rocmflash: {name} must be a 1-D integer tensor (batch + 1,) of cumulative lengths, "
                         f"got {got}")
    return cu.to(device=device, dtype=torch.int32)


def packing_from_kwargs(kwargs, device) -> Optional[Packed]:
    """The :class:`Packed` of transformers' packing kwargs (None: none given). Some but not all four is a one-line
    ``ValueError`` naming the missing ones (transformers' flash path would silently ignore them all)."""
    given = [kwargs.get(name) is not None for name in PACKING_KWARGS]
    if not any(given):
        return None
    if not all(given):
        missing = ", ".join(n for n, g in zip(PACKING_KWARGS, given) if not g)
        raise ValueError(f"rocmflash: a packed batch needs all of {', '.join(PACKING_KWARGS)}; missing {missing} "
                         "(DataCollatorWithFlattening(return_flash_attn_kwargs=True) returns all four)")
    return Packed(_cu("cu_seq_lens_q", kwargs["cu_seq_lens_q"], device),
                  _cu("cu_seq_lens_k", kwargs["cu_seq_lens_k"], device),
                  _host_int("max_length_q", kwargs["max_length_q"]), _host_int("max_length_k", kwargs["max_length_k"]))


def _starts(position_ids: torch.Tensor) -> torch.Tensor:
    """Where a sequence starts in each row of ``position_ids`` ``(B, S)``: the row's first token and every position
    that is not the previous one plus 1 (``find_packed_sequence_indices``' rule)."""
    step = torch.diff(position_ids, dim=-1) != 1
    return torch.nn.functional.pad(step, (1, 0), value=True)


def _cu_from_starts(starts: torch.Tensor) -> tuple:
    """``(cu (B*S + 1,) int32, lengths (B*S,))`` of the sequences that start at ``starts`` (flattened): sequence
    ``i`` is rows ``cu[i]..cu[i+1]``; the entries after the last sequence repeat the total (no host read)."""
    flat = starts.reshape(-1)
    seq = flat.cumsum(0) - 1  # 0-based sequence of each token
    lengths = torch.zeros_like(seq).scatter_add_(0, seq, torch.ones_like(seq))
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32), lengths


def _band(seq: torch.Tensor, causal: bool, window_left: int) -> torch.Tensor:
    """The ``(B, S, S)`` boolean mask of a packing whose token ``t`` of row ``b`` belongs to sequence ``seq[b, t]``:
    same sequence, and (causal) no later key, and (window) no key more than ``window_left`` tokens back."""
    S = seq.shape[1]
    pos = torch.arange(S, device=seq.device)
    rel = pos[None, :] - pos[:, None]  # key - query
    band = seq[:, :, None] == seq[:, None, :]
    if causal:
        band = band & (rel <= 0)
    if window_left >= 0:
        band = band & (rel >= -window_left)
    return band


def _mask_ok(mask, seq: torch.Tensor, causal: bool, window_left: int, rows_too: bool = False) -> torch.Tensor:
    """A device bool: whether the boolean 4-D ``mask`` ``(B or 1, 1, S, S)`` is exactly the packing's band (or,
    ``rows_too``, the band of each whole row: the mask transformers builds when a cache kept it from looking for
    packed sequences)."""
    B, S = seq.shape
    m = mask[:, 0].expand(B, S, S)
    ok = (m == _band(seq, causal, window_left)).all()
    if rows_too:
        ok = ok | (m == _band(torch.zeros_like(seq), causal, window_left)).all()
    return ok


def _mask_readable(mask, B: int, S: int) -> bool:
    """Whether ``mask`` is a boolean 4-D mask of a ``(B, S)`` packed batch's queries and keys (no read)."""
    return (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 4
            and mask.shape[1] == 1 and mask.shape[0] in (1, B) and tuple(mask.shape[2:]) == (S, S))


def packing_from_position_ids(position_ids, batch: int, seq_len: int, mask=None, causal: bool = True,
                              window_left: int = -1) -> Optional[Packed]:
    """The :class:`Packed` of a batch packed by ``position_ids`` ``(B or 1, S)``, or None: one sequence per row
    (nothing packed), ``position_ids`` of another shape, or a ``mask`` (4-D, boolean) that is neither the
    packing's causal/window band nor the whole rows' (transformers' mask where a cache kept it from looking for the
    sequences: ``position_ids`` then tell them, as in transformers' flash path). One host read: the number of
    sequences, the longest, and the mask's check."""
    if (not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 or position_ids.is_floating_point()
            or position_ids.shape[0] not in (1, batch) or position_ids.shape[1] != seq_len):
        return None
    if mask is not None and not _mask_readable(mask, batch, seq_len):
        return None
    pos = position_ids.to(mask.device if mask is not None else position_ids.device).expand(batch, seq_len)
    starts = _starts(pos)
    cu, lengths = _cu_from_starts(starts)
    count = starts.sum()
    ok = _mask_ok(mask, (starts.reshape(-1).cumsum(0) - 1).view(batch, seq_len), causal, window_left, True) \
        if mask is not None else torch.ones((), dtype=torch.bool, device=pos.device)
    n, longest, good = torch.stack([count, lengths.max(), ok.to(count.dtype)]).tolist()  # the one host read
    if n == batch or not good:  # one sequence per row: the batch's own routes; a mask saying otherwise: not this
        return None
    cu = cu[:n + 1]
    return Packed(cu, cu, longest, longest)


def packed_mask_matches(mask, packed: Packed, batch: int, seq_len: int, causal: bool, window_left: int,
                        rows_too: bool = False) -> bool:
    """Whether a 4-D ``mask`` handed with the packing kwargs is exactly their causal/window band over the batch's
    rows (no sequence across two rows: a ``(B, 1, S, S)`` mask cannot let one attend the other) -- or, ``rows_too``,
    the whole rows' band (transformers' mask where a cache kept it from looking for the sequences). One host read."""
    if not _mask_readable(mask, batch, seq_len) or packed.cu_q is not packed.cu_k and not torch.equal(
            packed.cu_q, packed.cu_k):
        return False
    total = batch * seq_len
    rows = torch.arange(total, device=packed.cu_q.device)
    seq = (torch.searchsorted(packed.cu_q[1:], rows, right=True)).view(batch, seq_len)
    crosses = (seq[1:, 0] == seq[:-1, -1]).any() if batch > 1 else torch.zeros((), dtype=torch.bool,
                                                                               device=seq.device)
    ok = _mask_ok(mask.to(seq.device), seq, causal, window_left) & ~crosses
    if rows_too:
        ok = ok | _mask_ok(mask.to(seq.device), torch.zeros_like(seq), causal, window_left)
    return bool(ok.item())


_POSITION_PLANS: dict = {}  #: the last position_ids tensor, its version, and the packings read from it (by key)


def position_plan(position_ids, key: tuple, build):
    """``build()`` for ``position_ids`` and ``key``, kept while the same tensor comes back unchanged (every layer
    of a forward gets the same one); inference-mode tensors (no version counter) are read each time."""
    return kept_per_tensor(_POSITION_PLANS, position_ids, key, build)
