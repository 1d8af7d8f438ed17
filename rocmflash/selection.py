"""``rocmflash.selection``, kept importable under its old name: the code lives in :mod:`rocmflash.api.selection`.

This module *is* :mod:`rocmflash.api.selection` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import sys

from rocmflash.api import selection as _moved

sys.modules[__name__] = _moved
