"""Which :class:`~npydask.storage.base.Source` reads a path or URL: the one place that tells them apart.

Public functions take ``str``, ``os.PathLike`` or a URL; they call
:func:`resolve` once and never test for URLs again. ``file://`` URLs become
local paths here; a relative local path is made absolute
(:mod:`npydask.storage.paths`); an object URL gets the process's one
:class:`~npydask.storage.object.ObjectSource` for its store and
``storage_options`` (obstore is imported only then).
"""

from __future__ import annotations

import os
from typing import Any

from npydask.storage.paths import absolute
from npydask.storage.base import Lister, Source
from npydask.storage.local import LOCAL, LocalLister
from npydask.storage.urls import is_url, split_url, to_local

__all__ = ["fspath", "lister_for", "resolve"]


def fspath(path: str | os.PathLike[str]) -> str:
    """``os.fspath(path)`` with ``file://`` URLs made local; bytes refused.

    Raises
    ------
    TypeError
        For bytes or anything that is not a path.
    """
    path = os.fspath(to_local(path))
    if isinstance(path, bytes):
        raise TypeError(f"expected a str or os.PathLike path, found bytes {path!r}")
    return path


def resolve(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> tuple[str, Source]:
    """The path to carry (absolute, or the URL as given) and the source that reads it.

    Raises
    ------
    ValueError
        For an unknown URL scheme, or ``storage_options`` given with a local path.
    ImportError
        For an object URL without the ``remote`` extra.

    Examples
    --------
    >>> import os
    >>> resolve("file:///data/a.npy")
    ('/data/a.npy', LocalSource())
    """
    path = fspath(path)
    if is_url(path):
        from npydask.storage._stores import StoreSpec, import_obstore
        from npydask.storage.object import source_for

        import_obstore()
        return path, source_for(StoreSpec.of(split_url(path).base, storage_options))
    if storage_options:
        raise ValueError(
            f"{path}: storage_options apply to object-store URLs (s3://, gs://, az://, http(s)://); "
            "this is a local path: drop storage_options"
        )
    return absolute(path), LOCAL


def lister_for(root: str, source: Source) -> Lister:
    """The lister of the folder or prefix ``root`` (already resolved by :func:`resolve`)."""
    if source is LOCAL:
        return LocalLister(root)
    from npydask.storage.object_list import ObjectLister

    return ObjectLister(source, root)  # type: ignore[arg-type]
