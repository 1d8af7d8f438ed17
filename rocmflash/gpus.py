"""``rocmflash.gpus``, kept importable under its old name for one release (deprecated): the GPU catalog
lives in :mod:`rocmflash.hw.gpus`, live-device detection (:func:`detect_live_gpu`) in :mod:`rocmflash.hw.detect`.

Every name of :mod:`rocmflash.hw.gpus` (private ones included) and ``detect_live_gpu``. Not an alias of
the catalog module (as ``rocmflash.space`` is of its module) because it serves a name the catalog no longer
has: the catalog must not import detection, which imports the catalog.
"""

import warnings as _warnings

_warnings.warn("rocmflash.gpus is deprecated and goes away in the next release: import rocmflash.hw.gpus "
               "(and rocmflash.hw.detect.detect_live_gpu) instead",
               DeprecationWarning, stacklevel=2)

from rocmflash.hw import gpus as _catalog
from rocmflash.hw.detect import detect_live_gpu  # noqa: F401  (re-exported)

globals().update({k: v for k, v in vars(_catalog).items() if not k.startswith("__")})
