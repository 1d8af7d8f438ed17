"""The static phase (no GPU): config space, cross-compile, dedupe, prune, and its reports.

Imports nothing: import the submodule you need (keeps every import light)."""
