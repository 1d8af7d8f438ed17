"""``rocmflash.decode``, kept importable under its old name for one release (deprecated):
the code lives in :mod:`rocmflash.api.decode`.

This module *is* :mod:`rocmflash.api.decode` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import warnings as _warnings

_warnings.warn("rocmflash.decode is deprecated and goes away in the next release: import rocmflash.api.decode instead",
               DeprecationWarning, stacklevel=2)

import sys

from rocmflash.api import decode as _moved

sys.modules[__name__] = _moved
