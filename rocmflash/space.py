"""``rocmflash.space``, kept importable under its old name for one release (deprecated):
the code lives in :mod:`rocmflash.static.space`.

This module *is* :mod:`rocmflash.static.space` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import warnings as _warnings

_warnings.warn("rocmflash.space is deprecated and goes away in the next release: import rocmflash.static.space instead",
               DeprecationWarning, stacklevel=2)

import sys

from rocmflash.static import space as _moved

sys.modules[__name__] = _moved
