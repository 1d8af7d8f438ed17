"""What :func:`rocmflash.api.selection.clear_cache` forgets beyond the selection's own caches.

Modules that keep what they worked out from a selection or a database (the per-signature call plans of
:mod:`rocmflash.api.ops`, the incumbent verdicts of :mod:`rocmflash.api.incumbent` and
:mod:`rocmflash.api.varlen_incumbent`, ...) register a hook here; ``clear_cache`` calls every hook first. A module of
its own, below the selection: a module the selection reads (:mod:`rocmflash.api.incumbent`) registers here without
importing the selection back. :mod:`rocmflash.api.selection` re-exports :func:`register_clear`.
"""

from __future__ import annotations

_CLEAR_HOOKS: list = []  #: callables that forget what callers keep from a selection, in registration order


def register_clear(hook) -> None:
    """Have :func:`rocmflash.api.selection.clear_cache` call ``hook()`` too: for a cache kept elsewhere of answers
    given from a selection or a database."""
    _CLEAR_HOOKS.append(hook)


def run_clear_hooks() -> None:
    """Call every registered hook, in registration order (the first step of ``clear_cache``)."""
    for hook in _CLEAR_HOOKS:
        hook()


__all__ = ["register_clear", "run_clear_hooks"]
