"""``rocmflash.fp8``, kept importable under its old name: the code lives in :mod:`rocmflash.api.fp8`.

This module *is* :mod:`rocmflash.api.fp8` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import sys

from rocmflash.api import fp8 as _moved

sys.modules[__name__] = _moved
