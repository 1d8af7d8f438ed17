"""Start-up hook of the fake ROCm layer (tests/fake_rocm.py) for child Pythons.

On ``PYTHONPATH`` only while a test uses the ``fake_rocm`` fixture; does nothing unless
``ROCMFLASH_FAKE_ROCM`` is set. The module is loaded from its file rather than through
``sys.path`` so that the child's import path is not changed. This shadows any other
``sitecustomize`` for those children (CI's Python has none).
"""

import os

if os.environ.get("ROCMFLASH_FAKE_ROCM"):
    import importlib.util
    import sys

    _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fake_rocm.py")
    _spec = importlib.util.spec_from_file_location("rocmflash_tests_fake_rocm", _path)
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _module  # dataclasses resolve the module's annotations through sys.modules
    _spec.loader.exec_module(_module)
    _module.install_from_env()
