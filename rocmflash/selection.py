"""``rocmflash.selection``, kept importable under its old name for one release (deprecated):
the code lives in :mod:`rocmflash.api.selection`.

This module *is* :mod:`rocmflash.api.selection` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import warnings as _warnings

_warnings.warn("rocmflash.selection is deprecated and goes away in the next release: import rocmflash.api.selection instead",
               DeprecationWarning, stacklevel=2)

import sys

from rocmflash.api import selection as _moved

sys.modules[__name__] = _moved
