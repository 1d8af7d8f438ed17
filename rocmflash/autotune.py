"""``rocmflash.autotune``, kept importable under its old name for one release (deprecated):
the code lives in :mod:`rocmflash.static.autotune`.

This module *is* :mod:`rocmflash.static.autotune` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import warnings as _warnings

_warnings.warn("rocmflash.autotune is deprecated and goes away in the next release: import rocmflash.static.autotune instead",
               DeprecationWarning, stacklevel=2)

import sys

from rocmflash.static import autotune as _moved

sys.modules[__name__] = _moved
