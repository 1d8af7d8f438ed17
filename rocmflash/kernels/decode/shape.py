"""Which attention calls are decode steps: a few queries over many keys, which every entry point
(``flash_attn_with_kvcache``, ``attention``, the custom ops, ``patch_sdpa``, the transformers
integration) runs through the split-KV decode kernel (:mod:`rocmflash.kernels.decode.host`). No Triton import:
the entry points ask it before they load a kernel.
"""

from __future__ import annotations

#: a short query over many keys runs the split-KV kernel from every entry point (``flash_attn_with_kvcache``,
#: ``attention``, the custom ops, the transformers integration)
#: (:func:`is_decode_shaped`): at most this many query tokens and (token, query head) rows per K/V head ...
DECODE_MAX_QUERIES = 16
DECODE_MAX_ROWS = 64
#: ... and at least this many keys (fewer: the dense kernel has work enough for the whole GPU)
DECODE_MIN_KEYS = 256


def is_decode_shaped(seqlen_q: int, seqlen_k: int, group: int) -> bool:
    """Whether attention of ``seqlen_q`` queries over ``seqlen_k`` keys (GQA ``group``) is a decode step.

    The dense kernels tile queries by ``BLOCK_M >= 16`` rows per query head: a step of one token
    leaves most of each tile empty and launches ``B * Hq`` programs -- too few to read a long K/V
    at the memory's speed. The decode kernel holds every query row of a K/V head in one tile and
    splits the keys across programs instead.
    """
    return (seqlen_q <= DECODE_MAX_QUERIES and seqlen_q * group <= DECODE_MAX_ROWS
            and seqlen_k >= max(DECODE_MIN_KEYS, 4 * seqlen_q))


__all__ = ["DECODE_MAX_QUERIES", "DECODE_MAX_ROWS", "DECODE_MIN_KEYS", "is_decode_shaped"]
