"""Paged prefill: ``flash_attn_varlen_func(..., block_table=...)`` over a page pool of keys and values.

flash-attn 2.8's paged form: ``k``/``v`` are a pool of pages ``(num_blocks, page_block_size, Hkv, D)``, and
sequence ``b``'s key ``j`` (``j < cu_seqlens_k[b + 1] - cu_seqlens_k[b]``) is row ``j % page_block_size`` of page
``block_table[b, j // page_block_size]``. rocmflash's varlen kernel reads keys as packed rows, so the pages a call
uses are gathered into a packing of ``batch * max_seqlen_k`` rows first (an extra copy of the keys and values the
call reads; the row of each key is worked out on the device, nothing is read back), whose rows after the last
sequence are an unused tail the kernel leaves alone (:func:`rocmflash.api.varlen.packed_varlen`'s convention).
The gather is differentiable: gradients reach the pages a call read.

Bad values never reach memory outside the pool: a ``block_table`` entry outside ``0..num_blocks-1``, or a sequence
with more keys than its ``block_table`` row holds, is clamped into the pool and sets :data:`BAD_PAGE` in the varlen
error word, reported as the word's other bits are (those sequences' outputs are wrong); ``check_values=True``
checks the values on the host first and raises with the index and value.
"""

from __future__ import annotations

import torch

#: the varlen error word's bit for a page a paged call had to clamp (after ``cu_seqlens_k``'s shifted bits)
BAD_PAGE = 1 << 8
BAD_PAGE_TEXT = ("a block_table entry is outside the page pool (k.shape[0] pages), or a sequence has more keys "
                 "than its block_table row holds")


def check_pages(q, k, v, block_table, batch: int, max_seqlen_k: int) -> None:
    """Shapes, dtypes and devices of a paged call (one-line errors saying what was expected)."""
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"with block_table, {name} must be a page pool (num_blocks, page_block_size, Hkv, D), "
                             f"got {got}")
    if k.shape != v.shape:
        raise ValueError(f"k and v page pools must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.dtype != torch.int32:
        got = (f"{tuple(block_table.shape)} {block_table.dtype}" if isinstance(block_table, torch.Tensor)
               else type(block_table).__name__)
        raise ValueError(f"block_table must be an int32 (batch, max_pages) tensor, got {got}")
    if block_table.device != q.device:
        raise ValueError(f"block_table is on {block_table.device} but q is on {q.device}; all must share a device")
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table has {block_table.shape[0]} rows but cu_seqlens_k describes {batch} sequences")
    page = k.shape[1]
    if page < 1 or block_table.shape[1] * page < max_seqlen_k:
        raise ValueError(f"block_table rows hold {block_table.shape[1]} pages of {page} keys, fewer than "
                         f"max_seqlen_k={max_seqlen_k}")


def check_page_values(block_table, cu_k, num_blocks: int, page: int) -> None:
    """``check_values=True``: every page a sequence uses is in the pool (one host read)."""
    lengths = (cu_k[1:] - cu_k[:-1]).tolist()
    table = block_table.tolist()
    for b, n in enumerate(lengths):
        for i in range(-(-max(n, 0) // page)):
            if i >= len(table[b]):
                raise ValueError(f"sequence {b} has {n} keys but block_table[{b}] holds {len(table[b])} pages of "
                                 f"{page}")
            if not 0 <= table[b][i] < num_blocks:
                raise ValueError(f"block_table[{b}, {i}]={table[b][i]} is outside the page pool 0..{num_blocks - 1}")


def gather_pages(k, v, block_table, cu_k, batch: int, max_seqlen_k: int) -> tuple:
    """``(k_packed, v_packed)``: ``(batch * max_seqlen_k, Hkv, D)`` packings of the keys each sequence uses (in
    ``cu_seqlens_k``'s order, then an unused tail); bad pages clamped and reported (:data:`BAD_PAGE`)."""
    num_blocks, page, heads, dim = k.shape
    device = k.device
    rows = batch * max_seqlen_k
    r = torch.arange(rows, device=device, dtype=torch.int32)
    cu = cu_k.to(torch.int32)
    seq = torch.searchsorted(cu[1:].contiguous(), r, right=True).clamp_(max=max(batch - 1, 0))
    j = r - cu[seq]  # the key's position in its sequence (a tail row: anything)
    owned = (r < cu[-1]) & (j >= 0)
    col = torch.div(j.clamp(min=0), page, rounding_mode="floor")
    short = col >= block_table.shape[1]
    pages = block_table[seq.long(), col.clamp(max=block_table.shape[1] - 1).long()]
    bad = owned & (short | (pages < 0) | (pages >= num_blocks))
    from rocmflash.kernels.varlen import checks as VC

    VC.error_word(device).bitwise_or_(bad.any().to(torch.int32) * BAD_PAGE)  # (no host read)
    src = (pages.clamp(0, num_blocks - 1).long() * page + (j.clamp(min=0) % page).long())
    return (k.reshape(num_blocks * page, heads, dim).index_select(0, src),
            v.reshape(num_blocks * page, heads, dim).index_select(0, src))


__all__ = ["BAD_PAGE", "BAD_PAGE_TEXT", "check_pages", "check_page_values", "gather_pages"]
