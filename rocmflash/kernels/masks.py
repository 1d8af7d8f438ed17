"""Band masks (causal, sliding window) and tanh soft-capping, shared by the varlen and decode kernels.

**Which key a query sees.** flash-attn's convention, bottom-right aligned per sequence:
with ``shift = Sk - Sq``, query ``i`` attends key ``j`` iff::

    i + shift - left  <=  j  <=  i + shift + right        (and 0 <= j < Sk)

``window_size=(left, right)`` with ``-1`` meaning unbounded on that side; ``causal`` is
``right = 0``. The kernels take the band as two integer offsets from the row index,
``lo_off = shift - left`` and ``hi_off = shift + right`` (:data:`UNBOUNDED` stands for an
infinite side), so the same device code walks rows = queries over columns = keys (forward,
dQ) and rows = keys over columns = queries (dK/dV: ``lo_off = -shift - right``,
``hi_off = -shift + left``).

**Soft-capping** (Gemma 2): scores become ``cap * tanh(scale * qk / cap)`` before the
softmax. ``tanh`` is written with ``exp2`` (portable: no vendor libdevice call), and the
backward's chain rule uses ``1 - tanh²``, recomputed from the capped score.
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.kernels.common import LOG2E, kernel_jit

_LOG2E = tl.constexpr(LOG2E)  # a jit function may read module globals only as constexprs

#: stands for an unbounded side of the band (|offsets| stay far from int32 overflow)
UNBOUNDED = 1 << 30


def band_offsets(causal: bool, window_size: tuple) -> tuple[int, int]:
    """``(left, right)`` as non-negative ints, :data:`UNBOUNDED` for ``-1``; causal forces ``right = 0``.

    The per-sequence ``shift`` is added inside the kernels (varlen sequences differ).
    """
    left, right = (int(w) for w in window_size)
    left = UNBOUNDED if left < 0 else left
    right = UNBOUNDED if right < 0 else right
    if causal:
        right = 0
    return left, right


@kernel_jit
def band_bounds(row_start, NUM_ROWS, NUM_COLS, lo_off, hi_off,
                BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Column-block loop bounds ``(lo, full_lo, full_hi, hi)`` for rows ``[row_start, row_start + BLOCK_R)``.

    Row ``r`` may see columns ``[r + lo_off, r + hi_off] ∩ [0, NUM_COLS)``. Blocks in
    ``[full_lo, full_hi)`` are visible to every valid row of the block (no mask needed);
    ``[lo, full_lo)`` and ``[full_hi, hi)`` need the mask; columns outside ``[lo, hi)`` are
    never visited. All of ``lo``, ``full_lo``, ``full_hi`` are multiples of ``BLOCK_C``
    (``full_lo``/``full_hi`` may be clamped to ``hi``).
    """
    last_row = tl.minimum(row_start + BLOCK_R, NUM_ROWS) - 1
    lo = (tl.maximum(0, row_start + lo_off) // BLOCK_C) * BLOCK_C
    hi = tl.maximum(lo, tl.minimum(NUM_COLS, last_row + hi_off + 1))
    # every valid row sees column c iff last_row + lo_off <= c <= row_start + hi_off (and c < NUM_COLS)
    full_lo = ((tl.maximum(0, last_row + lo_off) + BLOCK_C - 1) // BLOCK_C) * BLOCK_C
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = (tl.maximum(0, tl.minimum(NUM_COLS, row_start + hi_off + 1)) // BLOCK_C) * BLOCK_C
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@kernel_jit
def band_keep(offs_r, offs_c, NUM_COLS, lo_off, hi_off, LOWER: tl.constexpr, UPPER: tl.constexpr):
    """``[R, C]`` boolean: column ``c`` allowed for row ``r`` (inside the band and before the end).

    ``LOWER``/``UPPER`` say whether that side of the band is bounded at all; an unbounded
    side costs no compare. On AMD every compare is a 64-bit lane mask held in SGPRs, so
    the upper bound and the end of the sequence are folded into one compare.
    """
    if UPPER:
        last = tl.minimum(offs_r + hi_off, NUM_COLS - 1)
        keep = offs_c[None, :] <= last[:, None]
    else:
        keep = offs_c[None, :] < NUM_COLS
    if LOWER:
        keep = keep & (offs_c[None, :] >= (offs_r + lo_off)[:, None])
    return keep


@kernel_jit
def log2_scores(s, qk_scale, sm_scale, softcap, SOFTCAP: tl.constexpr):
    """Raw ``q·k`` scores -> the log2-domain logits the softmax uses (``qk_scale = sm_scale * log2(e)``).

    With ``SOFTCAP``: ``cap * tanh(sm_scale * s / cap) * log2(e)``, using
    ``tanh(y) = 1 - 2 / (2^(2 y log2 e) + 1)`` (saturates to ±1 cleanly for large |y|).
    """
    if SOFTCAP:
        y = s * (sm_scale / softcap)
        t = 1.0 - 2.0 / (tl.math.exp2(y * (2.0 * _LOG2E)) + 1.0)
        out = t * (softcap * _LOG2E)
    else:
        out = s * qk_scale
    return out


@kernel_jit
def softcap_grad(x2, softcap, SOFTCAP: tl.constexpr):
    """``d(capped)/d(scaled)`` = ``1 - tanh²``, from the log2-domain capped logits ``x2`` (1.0 without a cap)."""
    if SOFTCAP:
        t = x2 / (softcap * _LOG2E)
        g = 1.0 - t * t
    else:
        g = 1.0
    return g


__all__ = ["UNBOUNDED", "band_offsets", "band_bounds", "band_keep", "log2_scores", "softcap_grad"]
