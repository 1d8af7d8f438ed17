"""``python -m rocmflash.cli``: the ``rocmflash`` command (its code is :mod:`rocmflash.cli`)."""

import sys

from rocmflash.cli import main

sys.exit(main())
