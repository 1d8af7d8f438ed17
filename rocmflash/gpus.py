"""``rocmflash.gpus``, kept importable under its old name: the code lives in :mod:`rocmflash.hw.gpus`.

This module *is* :mod:`rocmflash.hw.gpus` (one module object under both names), so every name, private
ones included, and every ``monkeypatch`` of it reach the same code.
"""

import sys

from rocmflash.hw import gpus as _moved

sys.modules[__name__] = _moved
