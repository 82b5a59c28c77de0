"""Warnings npydask gives, shown at the user's line rather than inside npydask.

This module imports nothing of npydask's but :mod:`npydask.errors`.
"""

from __future__ import annotations

import os
import sys
import warnings

from npydask.errors import NpyDaskWarning

__all__ = ["warn"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str) -> None:
    """Issue an :class:`~npydask.errors.NpyDaskWarning` attributed to the first caller outside npydask.

    However deep inside npydask the warning starts, the filters and the
    line shown are those of the code that called npydask (the
    ``stacklevel`` is counted, not guessed).
    """
    frame = sys._getframe(0)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, NpyDaskWarning, stacklevel=level)
