"""The append of ``flash_attn_with_kvcache``'s new keys/values into a 16-bit cache, in one launch.

A decode step at batch 1 is host-bound: each torch op is a kernel launch and several microseconds of host
time, and the append in torch took four or five of them (the positions as int64, their clamp, an index write
for K and one for V) plus one more for the lengths the attention reads (``cache_seqlens + Sk_new``). This
kernel does all of it in one launch: one program per (sequence, new token, K/V head) copies that row of K and
of V to ``cache_seqlens[b] + t`` and the first program of each sequence writes ``cache_seqlens[b] + Sk_new``
for the attention kernel. The GPU never waits and the host never reads a value.

**A bad value writes nothing.** A sequence whose length is outside ``0..capacity - Sk_new`` (negative, past the
cache, or too close to its end for the new keys: they would run into its own earlier rows or past its block
table) or one of whose new rows' pages is outside the pool stores none of its new rows: their addresses are
computed from row 0 of page 0 (never outside the cache) and the stores are masked, so no other sequence's rows
and no unused page change -- in a shared page pool a clamped page would be another sequence's. Its first program
ORs what was wrong (:data:`~rocmflash.kernels.decode.checks.BAD_LENGTH` / ``BAD_PAGE``) and
:data:`~rocmflash.kernels.decode.checks.NOT_STORED` into the decode error word. The fp8 append (:mod:`.quant`)
takes its rows from the same :func:`append_rows`; the decode kernel reads page 0 in place of a bad page as well,
and reports the same values (that sequence's output is undefined).
"""

from __future__ import annotations

import functools

import triton.language as tl

from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit
from rocmflash.kernels.decode.checks import BAD_LENGTH, BAD_PAGE, NOT_STORED, error_word


@kernel_jit
def append_rows(b, t, given, BT, stride_btb, stride_kcb, stride_kcn, stride_vcb, stride_vcn, NEW, CAPACITY,
                PAGE_SIZE, NUM_BLOCKS, PAGED: tl.constexpr):
    """``(k_row, v_row, bits)``: the offsets of the K and V cache rows new token ``t`` of sequence ``b`` goes to
    (``given``: its cached length), and what is wrong with the sequence (0: store the row).

    ``bits`` is :data:`BAD_LENGTH` for a length outside ``0..CAPACITY-NEW`` and :data:`BAD_PAGE` when any page
    the sequence's new rows land on is outside ``0..NUM_BLOCKS-1``: the same for every program of the sequence,
    so either all its rows are stored or none. The offsets of a bad sequence are those of row 0 of page 0 (its
    own row 0 in a contiguous cache): inside the cache, for a masked store. A few integer ops per program; the
    page loop runs once per page the new rows touch (once for one new token)."""
    fits = (given >= 0) & (given <= CAPACITY - NEW)
    bits = tl.where(fits, 0, BAD_LENGTH)
    start = tl.where(fits, given, 0)
    pos = tl.where(fits, given + t, 0)
    if PAGED:
        BT_row = BT + b.to(tl.int64) * stride_btb
        # this row's block-table entry (none read for a bad length: its rows may be past the table)
        page = tl.load(BT_row + pos // PAGE_SIZE, mask=fits, other=0)
        bits = bits | tl.where((page < 0) | (page >= NUM_BLOCKS), BAD_PAGE, 0)
        if NEW > 1:  # every entry the sequence's new rows use (Triton specialises NEW == 1: no loop for one token)
            for j in range(start // PAGE_SIZE, tl.where(fits, (start + NEW - 1) // PAGE_SIZE + 1, 0)):
                entry = tl.load(BT_row + j)
                bits = bits | tl.where((entry < 0) | (entry >= NUM_BLOCKS), BAD_PAGE, 0)
        page = tl.where(bits == 0, page, 0)
        k_row = page.to(tl.int64) * stride_kcb + (pos % PAGE_SIZE).to(tl.int64) * stride_kcn
        v_row = page.to(tl.int64) * stride_vcb + (pos % PAGE_SIZE).to(tl.int64) * stride_vcn
    else:
        k_row = b.to(tl.int64) * stride_kcb + pos.to(tl.int64) * stride_kcn
        v_row = b.to(tl.int64) * stride_vcb + pos.to(tl.int64) * stride_vcn
    return k_row, v_row, bits


@kernel_jit
def report_unstored(ERR, bits, first):
    """OR ``bits`` and :data:`NOT_STORED` into the error word from the ``first`` program of a sequence whose rows
    were not stored (one atomic per bad sequence; none on the path of good values)."""
    if (bits != 0) & first:
        tl.atomic_or(ERR, bits | NOT_STORED, sem="relaxed")


@kernel_jit
def _append_rows(KN, VN, KC, VC, BT, SEQLENS, SEQ_OUT, ERR,
                 stride_knb, stride_knt, stride_knh, stride_knd, stride_vnb, stride_vnt, stride_vnh, stride_vnd,
                 stride_kcb, stride_kcn, stride_kch, stride_kcd, stride_vcb, stride_vcn, stride_vch, stride_vcd,
                 stride_btb, NEW, CAPACITY, PAGE_SIZE, NUM_BLOCKS,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGED: tl.constexpr):
    bt_idx = tl.program_id(0)  # sequence * NEW + new token
    h = tl.program_id(1)
    b = bt_idx // NEW
    t = bt_idx % NEW
    given = tl.load(SEQLENS + b)
    if (t == 0) & (h == 0):  # the lengths the attention reads: the given ones (even out of range) plus NEW
        tl.store(SEQ_OUT + b, given + NEW)
    k_row, v_row, bits = append_rows(b, t, given, BT, stride_btb, stride_kcb, stride_kcn, stride_vcb, stride_vcn,
                                     NEW, CAPACITY, PAGE_SIZE, NUM_BLOCKS, PAGED)
    report_unstored(ERR, bits, (t == 0) & (h == 0))
    offs_d = tl.arange(0, BLOCK_D)
    smask = (offs_d < HEAD_DIM) & (bits == 0)  # a bad sequence stores nothing
    k = tl.load(KN + b.to(tl.int64) * stride_knb + t * stride_knt + h * stride_knh + offs_d * stride_knd, mask=smask)
    v = tl.load(VN + b.to(tl.int64) * stride_vnb + t * stride_vnt + h * stride_vnh + offs_d * stride_vnd, mask=smask)
    tl.store(KC + k_row + h * stride_kch + offs_d * stride_kcd, k, mask=smask)
    tl.store(VC + v_row + h * stride_vch + offs_d * stride_vcd, v, mask=smask)


@functools.lru_cache(maxsize=64)
def _constexprs(head_dim: int, paged: bool) -> dict:
    return dict(HEAD_DIM=head_dim, BLOCK_D=max(16, C.next_pow2(head_dim)), PAGED=paged)


def append_args(k, v, k_cache, v_cache, block_table, seqlens, seq_out, page_size: int, *, err) -> dict:
    """The kernel's arguments (a contiguous cache passes ``seqlens`` as the unread block table); ``err``: the
    int32 decode error word of the device (:func:`rocmflash.kernels.decode.checks.error_word`)."""
    sk, sv, skc, svc = k.stride(), v.stride(), k_cache.stride(), v_cache.stride()
    paged = block_table is not None
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    return dict(KN=k, VN=v, KC=k_cache, VC=v_cache, BT=block_table if paged else seqlens, SEQLENS=seqlens,
                SEQ_OUT=seq_out, ERR=err,
                stride_knb=sk[0], stride_knt=sk[1], stride_knh=sk[2], stride_knd=sk[3],
                stride_vnb=sv[0], stride_vnt=sv[1], stride_vnh=sv[2], stride_vnd=sv[3],
                stride_kcb=skc[0], stride_kcn=skc[1], stride_kch=skc[2], stride_kcd=skc[3],
                stride_vcb=svc[0], stride_vcn=svc[1], stride_vch=svc[2], stride_vcd=svc[3],
                stride_btb=block_table.stride(0) if paged else 0, NEW=k.shape[1], CAPACITY=capacity,
                PAGE_SIZE=page_size if paged else 1, NUM_BLOCKS=k_cache.shape[0])


_APPEND_CFG = None


def append_config():
    """The launch config of an append (this one and the fp8 cache's, :mod:`.kv_quant`): one warp per row."""
    global _APPEND_CFG
    if _APPEND_CFG is None:
        from rocmflash.config import KernelConfig

        _APPEND_CFG = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    return _APPEND_CFG


def append(k_cache, v_cache, k, v, lens, block_table, page_size: int, backend: str, keys=None, err=None):
    """Write ``k``/``v`` ``(B, Sk_new, Hkv, D)`` into the 16-bit caches at ``lens[b] + t`` (one launch, no host
    read); returns the int32 ``(B,)`` lengths after the append (``lens + Sk_new``), written by the same launch.
    A sequence with a bad length or page stores nothing and raises bits of ``err``, the int32 ``(1,)`` decode error
    word (None: :func:`rocmflash.kernels.decode.checks.error_word` of the cache's device).

    ``keys``: the caller's dict of kept launch keys, under the promise of ``kv_decode.launch``'s ``keys`` (the
    same dtypes, shapes, strides, device and storage class as when it was filled)."""
    import torch

    if err is None:
        err = error_word(k_cache.device)
    cfg = append_config()
    B, new, hkv, d = k.shape
    seq_out = torch.empty_like(lens)
    paged = block_table is not None
    bt = block_table if paged else lens  # unread without pages
    tensors = (k, v, k_cache, v_cache, bt, lens, seq_out, err)
    scalars = (page_size, paged)
    C.launch_cached(_append_rows, scalars, tensors,
                    lambda: ((B * new, hkv), append_args(k, v, k_cache, v_cache, block_table, lens, seq_out,
                                                         page_size, err=err), _constexprs(d, paged)),
                    cfg, backend,
                    key=C.kept_key(keys, ("append", backend), _append_rows, scalars, tensors, cfg, backend))
    return seq_out


__all__ = ["append", "append_args", "append_config", "append_rows", "report_unstored"]
