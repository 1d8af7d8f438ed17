"""What a tune keeps: the config database (``configs/<gpu>.json``) and its tuning journal.

Imports nothing: import the submodule you need (keeps every import light)."""
