"""rocmflash's version, in a module of its own: the database fingerprint reads it without importing the package's
entry points (keep it equal to pyproject.toml's ``version``; tests/test_cli_version.py checks it)."""

__version__ = "0.1.0"
