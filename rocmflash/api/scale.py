"""The softmax scale every entry point takes: its checks, and the odd-but-legal values zero and negative.

The dense forward kernels (``rocmflash.kernels``: online, split_kv, two_phase, split_d) take each
row's running maximum of the raw scores ``q·k`` and scale afterwards (one multiply per score, fused
into the exponent). That is exact for a positive scale only: with a
negative scale the maximum of the raw scores is the *minimum* of the scaled ones, and a masked
``-inf`` score times zero is NaN. Both values are legal -- ``softmax(scale * q·k)`` is defined for
any finite scale -- so the sign is folded into the query instead, before any kernel runs:
``scale * q·k == |scale| * (sign(scale) * q)·k``, and a zero scale is a uniform softmax over the keys
a row sees, which a zero query gives at scale 1. The fold is differentiable (autograd sees ``-q``
or ``q * 0``), costs one elementwise pass over ``q`` for these values only, and nothing otherwise.
The packed (varlen) and decode kernels scale each score before the maximum and need no fold.
"""

from __future__ import annotations

import math


def check_softmax_scale(softmax_scale) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``softmax_scale`` is None or a finite real number."""
    if softmax_scale is None:
        return
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not -math.inf < softmax_scale < math.inf:  # NaN fails both (math.isfinite: see varlen.check_options)
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")


def fold_scale_sign(q, scale: float):
    """``(q, scale)`` with ``scale > 0`` and the same ``softmax(scale * q·k)``: unchanged when positive,
    ``(-q, -scale)`` when negative, ``(q * 0, 1.0)`` when zero (every visible key weighs the same)."""
    if scale > 0:
        return q, scale
    if scale == 0:
        return q * 0, 1.0
    return -q, -scale


__all__ = ["check_softmax_scale", "fold_scale_sign"]
