"""The command line's one error: bad input, reported as one line with exit status 2."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2."""
