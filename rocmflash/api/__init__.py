"""What a model calls at run time: attention entry points, custom ops, config selection.

Imports nothing: import the submodule you need (keeps every import light)."""
