"""One-line forms of exceptions, for results, records, warnings and reports.

A failed compile can raise pages of MLIR; a worker's result, a database record, a warning or ``rocmflash doctor``
keeps the exception's type and the first line of its message only. Imports nothing, so every layer (run time,
tuner, static phase, ``hw``) can use it.
"""

from __future__ import annotations


def error_line(err: BaseException, limit: int = 300) -> str:
    """``"TypeName: first line of the message"``, the line cut at ``limit`` characters (``"TypeName"`` alone when
    the message is empty)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:limit]}" if lines else type(err).__name__


__all__ = ["error_line"]
