"""The varlen kernels' handling of ``cu_seqlens`` values they cannot trust: clamps and an error word.

``flash_attn_varlen_func`` does not read the cumulative lengths on the host by default (each read
waits for the GPU). So every varlen kernel takes a sequence's rows through :func:`seq_range`, which
clamps them into the packed tensor -- no value, however wrong, addresses memory outside q, k, v or
their outputs and gradients -- and the forward's first program of each sequence ORs what is wrong
(:func:`report_lengths`, the ``BAD_*`` bits) into a per-device int32 word (:func:`error_word`) with
one atomic, only when something is. :mod:`rocmflash.api.varlen` reads the word and raises
(the word's host side is :mod:`rocmflash.kernels.error_words`, shared with decode and the fp8 forward).

The kernels' packed sizes (rows of q and k, ``max_seqlen_*``) are integer arguments that change from
call to call: they are left unspecialised (:data:`UNSPECIALISED`), or every new size divisible by 16
(or equal to 1) would compile the kernel again.
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.kernels import error_words as EW
from rocmflash.kernels.common import jit_unspecialised, kernel_jit

#: bits of the error word for ``cu_seqlens_q``; ``cu_seqlens_k``'s are these shifted left by :data:`K_SHIFT`
BAD_FIRST = tl.constexpr(1)  #: the first entry is not 0
BAD_LAST = tl.constexpr(2)  #: the last entry is not the packed length (with a tail of unused rows: past it)
BAD_ORDER = tl.constexpr(4)  #: an entry is smaller than the one before it
BAD_LONG = tl.constexpr(8)  #: a sequence is longer than ``max_seqlen_*``
K_SHIFT = tl.constexpr(4)

#: the forward's integers Triton must not specialise (the packed sizes, and the row stride of the ``(Hq, total_q)``
#: LSE, which is ``total_q``): one binary and one launch plan serve every packing (``varlen.launch_forward``)
UNSPECIALISED = ("TOTAL_Q", "TOTAL_K", "MAX_Q", "MAX_K", "STRICT_END", "stride_lh")
#: the backward kernels' (they take no ``max_seqlen``: it sizes their grids only)
BWD_UNSPECIALISED = ("TOTAL_Q", "TOTAL_K", "stride_lh")
#: the length check's and the safe-list kernel's
CHECK_UNSPECIALISED = ("TOTAL_Q", "TOTAL_K", "MAX_Q", "MAX_K", "BATCH")
#: their value in a compile-only build: ``kernels.build.compile_kernel`` specialises every integer it is
#: given, and one that is neither 1 nor a multiple of 16 specialises as an unspecialised launch does
AS_UNSPECIALISED = 17
COMPILE_TOTALS = (AS_UNSPECIALISED, AS_UNSPECIALISED)


@kernel_jit
def seq_range(CU, off_b, TOTAL):
    """``(first row, length)`` of sequence ``off_b``, clamped into the ``TOTAL`` packed rows: whatever the
    values of ``CU``, rows ``first .. first + length - 1`` exist (a decreasing pair gives length 0)."""
    start = tl.minimum(tl.maximum(tl.load(CU + off_b), 0), TOTAL)
    end = tl.minimum(tl.maximum(tl.load(CU + off_b + 1), start), TOTAL)
    return start, end - start


@kernel_jit
def _length_errors(CU, off_b, last_b, TOTAL, MAX_LEN, STRICT_END):
    """Error bits of sequence ``off_b``'s two entries of ``CU`` (the host check's rules, ``check_values=True``)."""
    lo, hi = tl.load(CU + off_b), tl.load(CU + off_b + 1)
    bits = tl.where((off_b == 0) & (lo != 0), BAD_FIRST, 0)
    end_bad = (hi > TOTAL) | ((STRICT_END != 0) & (hi != TOTAL))
    bits = bits | tl.where((off_b == last_b) & end_bad, BAD_LAST, 0)
    bits = bits | tl.where(hi < lo, BAD_ORDER, 0)
    return bits | tl.where(hi - lo > MAX_LEN, BAD_LONG, 0)


@kernel_jit
def report_lengths(CU_Q, CU_K, ERR, off_b, last_b, TOTAL_Q, TOTAL_K, MAX_Q, MAX_K, STRICT_END):
    """OR sequence ``off_b``'s error bits into ``ERR`` (one atomic, only when something is wrong).

    Together the rules say what the host check says: entries from 0 to the packed length, non-decreasing
    (so inside the tensor), no sequence longer than its ``max_seqlen``."""
    err = _length_errors(CU_Q, off_b, last_b, TOTAL_Q, MAX_Q, STRICT_END)
    err = err | (_length_errors(CU_K, off_b, last_b, TOTAL_K, MAX_K, STRICT_END) << K_SHIFT)
    if err != 0:
        tl.atomic_or(ERR, err, sem="relaxed")


@jit_unspecialised(CHECK_UNSPECIALISED)
def _check_lengths(CU_Q, CU_K, ERR, TOTAL_Q, TOTAL_K, MAX_Q, MAX_K, BATCH):
    """One program per sequence: :func:`report_lengths` alone, for a call that runs no varlen kernel (an
    equal-length batch served by the dense path), so its wrong values are reported as the forward's are."""
    report_lengths(CU_Q, CU_K, ERR, tl.program_id(0), BATCH - 1, TOTAL_Q, TOTAL_K, MAX_Q, MAX_K, 1)


@jit_unspecialised(CHECK_UNSPECIALISED)
def _sanitise_lengths(CU_Q, CU_K, SAFE_Q, SAFE_K, ERR, TOTAL_Q, TOTAL_K, MAX_Q, MAX_K, BATCH, BLOCK: tl.constexpr):
    """One program per entry (``BATCH + 1``): :func:`report_lengths` of its sequence, and the entry made safe for a
    kernel that trusts its ``cu_seqlens`` (the platform's varlen attention): :func:`_safe_entry` of each list."""
    b = tl.program_id(0)
    if b < BATCH:
        report_lengths(CU_Q, CU_K, ERR, b, BATCH - 1, TOTAL_Q, TOTAL_K, MAX_Q, MAX_K, 1)
    tl.store(SAFE_Q + b, _safe_entry(CU_Q, b, TOTAL_Q, BLOCK))
    tl.store(SAFE_K + b, _safe_entry(CU_K, b, TOTAL_K, BLOCK))


@kernel_jit
def _safe_entry(CU, b, TOTAL, BLOCK: tl.constexpr):
    """Entry ``b`` of a list that stays inside the ``TOTAL`` packed rows whatever ``CU`` holds: 0 first, then the
    largest of entries ``0..b`` clamped into ``0..TOTAL`` (non-decreasing, so no sequence has a negative length
    or rows outside the tensor). Equal to ``CU[b]`` for a list the host check would pass."""
    top = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, b + 1, BLOCK):
        j = start + tl.arange(0, BLOCK)
        top = tl.maximum(top, tl.load(CU + j, mask=j <= b, other=0))
    return tl.where(b == 0, 0, tl.minimum(tl.max(top, axis=0), TOTAL))


#: the varlen forward's error word per device (:mod:`rocmflash.kernels.error_words`): zero until a launch met
#: cumulative lengths it had to clamp; read, reported and reset by :mod:`rocmflash.api.varlen`
ERRORS = EW.ErrorWord()
_ERROR_WORDS = ERRORS.words  #: device -> int32 (1,) error word
error_word = ERRORS.word  #: ``error_word(device)``: the int32 ``(1,)`` word the forward ORs its ``BAD_*`` bits into
