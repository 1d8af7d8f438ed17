"""The KV-cache kernels' error bits, and the narrowing of int64 lengths to the kernels' int32.

``flash_attn_with_kvcache`` does not read ``cache_seqlens``/``cache_leftpad``/``block_table`` on the host (each
read waits for the GPU): its kernels check the values. A value out of range is never used as an address -- the
appends (:mod:`rocmflash.kernels.decode.append`, :mod:`rocmflash.kernels.decode.quant`) store nothing for that sequence,
the decode kernel (:mod:`rocmflash.kernels.decode.kernel`) reads a safe row in its place -- and a bit below is
ORed into the decode error word (:data:`ERRORS` here; its messages:
:mod:`rocmflash.api.decode_errors`). The bits live here, below every kernel module that raises them (the
appends are imported by the decode kernels).

The kernels take int32 lengths. An int64 ``cache_seqlens``/``cache_leftpad`` (flash-attn accepts both) is
narrowed on the device by :func:`narrow_int32`, one launch as torch's ``.to(torch.int32)`` was, but a value
outside int32 (e.g. ``2**32 + 3`` from ``torch.empty``) saturates instead of wrapping to a plausible length,
and sets :data:`BAD_WIDE`: the saturated value is out of range for every cache, so the kernels then also mask
that sequence.
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.kernels import common as C
from rocmflash.kernels import error_words as EW
from rocmflash.kernels.common import kernel_jit

#: bits of the decode error word (``tl.atomic_or``), one per kind of value the kernels would not use
BAD_LENGTH = tl.constexpr(1)  #: a ``cache_seqlens`` value outside ``0..capacity - new``
BAD_START = tl.constexpr(2)  #: a ``cache_leftpad`` value outside ``0..cache_seqlens + new``
BAD_PAGE = tl.constexpr(4)  #: a used ``block_table`` entry outside the page pool
BAD_DESCALE = tl.constexpr(8)  #: an fp8 cache's ``k_descale``/``v_descale`` not finite and > 0 (nothing appended)
BAD_WIDE = tl.constexpr(16)  #: an int64 ``cache_seqlens``/``cache_leftpad`` value outside int32
NOT_STORED = tl.constexpr(32)  #: an append stored none of some sequence's new keys (with the bit saying why)
BAD_SINK = tl.constexpr(64)  #: an attention sink (``s_aux``) NaN or +inf: its head's rows are NaN (-inf: no sink)

#: the decode kernels' error word per device (:mod:`rocmflash.kernels.error_words`): they and the appends OR their
#: :data:`BAD_LENGTH` / ``BAD_START`` / ``BAD_PAGE`` / ``BAD_DESCALE`` / ``BAD_WIDE`` / ``NOT_STORED`` bits
#: (above) into it; zero until a launch met a value it would not use (read, reported
#: and reset by :mod:`rocmflash.api.decode_errors`)
ERRORS = EW.ErrorWord()
_ERROR_WORDS = ERRORS.words  #: device -> int32 (1,) error word
error_word = ERRORS.word  #: ``error_word(device)``: the int32 ``(1,)`` word of ``device``

INT32_MAX = tl.constexpr(2**31 - 1)
INT32_MIN = tl.constexpr(-(2**31))


@kernel_jit
def _narrow_int32(SRC, DST, ERR, N, stride_src, BIT: tl.constexpr, BLOCK: tl.constexpr):
    """``DST[i] = SRC[i]`` saturated to int32; ``BIT`` ORed into ``ERR`` (one atomic) when some value did not fit."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < N
    x = tl.load(SRC + offs.to(tl.int64) * stride_src, mask=live, other=0)
    wide = (x > INT32_MAX) | (x < INT32_MIN)
    tl.store(DST + offs, tl.minimum(tl.maximum(x, INT32_MIN), INT32_MAX).to(tl.int32), mask=live)
    if tl.max(wide.to(tl.int32), 0) != 0:
        tl.atomic_or(ERR, BIT, sem="relaxed")


_NARROW_CFG = None


def _narrow_config():
    global _NARROW_CFG
    if _NARROW_CFG is None:
        from rocmflash.config import KernelConfig

        _NARROW_CFG = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    return _NARROW_CFG


def narrow_int32(t, err, backend: str, bit: int = BAD_WIDE.value):
    """``t`` (1-D int32 or int64, on ``err``'s device) as int32: ``t`` itself when it is int32, else a new tensor
    written by one launch (no host read), every value outside int32 saturated to its nearest end and ``bit`` ORed
    into the int32 error word ``err``."""
    import torch

    if t.dtype is torch.int32:
        return t
    n = t.shape[0]
    out = torch.empty(n, dtype=torch.int32, device=t.device)
    block = min(1024, max(16, C.next_pow2(n)))
    cfg = _narrow_config()
    C.launch_cached(_narrow_int32, (bit, block), (t, out, err),
                    lambda: ((max(1, -(-n // block)),), dict(SRC=t, DST=out, ERR=err, N=n, stride_src=t.stride(0)),
                             dict(BIT=bit, BLOCK=block)),
                    cfg, backend)
    return out


__all__ = ["BAD_DESCALE", "BAD_LENGTH", "BAD_PAGE", "BAD_SINK", "BAD_START", "BAD_WIDE", "NOT_STORED",
           "narrow_int32"]
