"""The single error type isa_tools raises for anything wrong with its input."""

from __future__ import annotations

from typing import Optional


class CodeObjectError(ValueError):
    """A code object (or a path given as one) could not be read.

    ``str(err)`` is one line naming the file (when known) and the problem, fit to
    print to a user as it is.
    """

    def __init__(self, problem: str, path: Optional[str] = None):
        self.problem = problem
        self.path = path
        super().__init__(f"{path}: {problem}" if path else problem)

    def with_path(self, path: str) -> "CodeObjectError":
        """The same error, now naming ``path`` (a no-op if it already names one)."""
        return self if self.path else CodeObjectError(self.problem, path)
