"""``rocmflash.fp8``, kept importable under its old name for one release (deprecated):
the code lives in :mod:`rocmflash.api.fp8`.

This module *is* :mod:`rocmflash.api.fp8` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import warnings as _warnings

_warnings.warn("rocmflash.fp8 is deprecated and goes away in the next release: import rocmflash.api.fp8 instead",
               DeprecationWarning, stacklevel=2)

import sys

from rocmflash.api import fp8 as _moved

sys.modules[__name__] = _moved
