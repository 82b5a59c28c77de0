"""Every exception and warning npydask raises of its own, and :func:`warn`, which gives the warnings.

Each subclasses the builtin a user would catch anyway, so ``except ValueError``
keeps working. Operating-system failures (a missing file, a permission denied,
a directory given as a file) are *not* wrapped: they surface as the builtin
``OSError`` subclass with the path in the message (SPEC section 7).

This module imports nothing of npydask's.
"""

from __future__ import annotations

import os
import sys
import warnings
import zipfile

__all__ = [
    "FileChangedError",
    "GpuUnavailableError",
    "NpyDaskWarning",
    "NpyFormatError",
    "NpzCrcError",
    "RoiError",
    "warn",
]


class NpyFormatError(ValueError):
    """A file (or header buffer) is not a valid, loadable ``.npy`` payload.

    Raised for a bad magic string, an unknown version, a malformed or oversized
    header, an object dtype (npydask never unpickles) and a truncated payload.
    The message names the file, what was expected and what was found.
    """


class NpzCrcError(NpyFormatError, zipfile.BadZipFile):
    """A member of an ``.npz`` archive does not match the CRC-32 its zip directory records.

    ``numpy.load`` refuses such a member with ``zipfile.BadZipFile`` ("Bad
    CRC-32"); this is both that and an :class:`NpyFormatError` (a
    ``ValueError``). The message names the archive, the member, the recorded
    and the computed CRC.
    """


class RoiError(ValueError):
    """A region of interest lies outside the array, or ends before it starts."""


class FileChangedError(OSError):
    """A file changed (size, mtime or inode) after it was opened lazily.

    Raised by a task at compute time instead of returning other data. Re-open
    the file (call ``from_npy`` again) to read its new contents.
    """


class GpuUnavailableError(RuntimeError):
    """``device="gpu"`` was asked for but CuPy or a usable CUDA device is missing."""


class NpyDaskWarning(UserWarning):
    """A fallback was taken (for example O_DIRECT refused by the file system)."""


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
