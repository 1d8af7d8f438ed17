"""``rocmflash.varlen``, kept importable under its old name for one release (deprecated):
the code lives in :mod:`rocmflash.api.varlen`.

This module *is* :mod:`rocmflash.api.varlen` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import warnings as _warnings

_warnings.warn("rocmflash.varlen is deprecated and goes away in the next release: import rocmflash.api.varlen instead",
               DeprecationWarning, stacklevel=2)

import sys

from rocmflash.api import varlen as _moved

sys.modules[__name__] = _moved
