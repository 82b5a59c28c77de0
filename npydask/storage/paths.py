"""Local paths made absolute where a lazy array or dataset is built, never where a task runs.

A task runs in whichever process picks it up, in that process's working
directory: a cluster worker started in another folder (``dask worker`` from a
login shell, a batch system's scratch folder) would find another file under a
relative path, or none. So npydask makes every local path absolute against the
working directory of the process that *builds* the array or dataset, as
fsspec does for local files.

Symlinks are kept, not resolved (``os.path.abspath``, not ``realpath``):
``ds.files`` and error messages show the names the user gave, and a
symlinked folder still reads through its link. A relative path holding a
``..`` component is only prefixed with the working directory and not
normalised, because lexical normalisation changes its meaning after a
symlink: ``link/../x.npy`` is the ``x.npy`` beside the link's *target*, which
``os.path.abspath`` would turn into ``x.npy`` beside the link. Absolute paths
are kept exactly as given.

This module imports nothing of npydask's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["absolute", "absolute_all"]

_SPECIAL = frozenset(("", os.curdir, os.pardir))


def absolute(path: str) -> str:
    """``path`` made absolute against the working directory, symlinks kept.

    Examples
    --------
    >>> absolute("/data/scans/a.npy")
    '/data/scans/a.npy'
    >>> absolute("scans/./a.npy") == os.path.join(os.getcwd(), "scans", "a.npy")
    True
    >>> absolute("link/../a.npy") == os.path.join(os.getcwd(), "link/../a.npy")
    True
    """
    if os.path.isabs(path):
        return path
    if os.pardir in path.split(os.sep):
        return os.path.join(os.getcwd(), path)
    return os.path.abspath(path)


def absolute_all(paths: Iterable[str]) -> list[str]:
    """:func:`absolute` of each path, resolving each folder once (a dataset may list 100,000 files).

    An all-absolute list costs one ``startswith`` a path.

    Examples
    --------
    >>> absolute_all(["/a/b.npy", "c.npy"]) == ["/a/b.npy", os.path.join(os.getcwd(), "c.npy")]
    True
    """
    out: list[str] = []
    folders: dict[str, str] = {}
    sep = os.sep
    for path in paths:
        if path.startswith(sep) or os.path.isabs(path):
            out.append(path)
            continue
        folder, _, name = path.rpartition(sep)
        if name in _SPECIAL:
            out.append(absolute(path))
            continue
        base = folders.get(folder)
        if base is None:
            base = folders[folder] = absolute(folder or os.curdir)
        out.append(base + name if base.endswith(sep) else base + sep + name)
    return out
