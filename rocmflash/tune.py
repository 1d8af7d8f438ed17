"""``rocmflash tune``, kept importable under its old name for one release (deprecated): everything lives in :mod:`rocmflash.tuning`."""

import warnings as _warnings

_warnings.warn("rocmflash.tune is deprecated and goes away in the next release: import rocmflash.tuning instead",
               DeprecationWarning, stacklevel=2)

from rocmflash.tuning import *  # noqa: F401,F403
from rocmflash.tuning import __all__  # noqa: F401
from rocmflash.tuning.output import _label  # noqa: F401  (used by reports and rocmflash explain)
from rocmflash.tuning.run import _no_live_reason  # noqa: F401
