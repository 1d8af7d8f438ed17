"""``rocmflash.decode``, kept importable under its old name: the code lives in :mod:`rocmflash.api.decode`.

This module *is* :mod:`rocmflash.api.decode` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import sys

from rocmflash.api import decode as _moved

sys.modules[__name__] = _moved
