"""``rocmflash.space``, kept importable under its old name: the code lives in :mod:`rocmflash.static.space`.

This module *is* :mod:`rocmflash.static.space` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import sys

from rocmflash.static import space as _moved

sys.modules[__name__] = _moved
