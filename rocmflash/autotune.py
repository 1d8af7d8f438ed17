"""``rocmflash.autotune``, kept importable under its old name: the code lives in :mod:`rocmflash.static.autotune`.

This module *is* :mod:`rocmflash.static.autotune` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import sys

from rocmflash.static import autotune as _moved

sys.modules[__name__] = _moved
