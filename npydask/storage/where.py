"""Which :class:`~npydask.storage.base.Source` reads a path or URL: the one place that tells them apart.

Public functions take ``str``, ``os.PathLike`` or a URL; they call
:func:`resolve` once, carry the :class:`StoragePath` it returns and never
test for URLs again: the source says how it wants to be read
(:attr:`~npydask.storage.base.Source.concurrent`) and how its paths are
shown (:meth:`~npydask.storage.base.Source.display`). ``file://`` URLs become
local paths here; a relative local path is made absolute
(:mod:`npydask.storage.paths`); an object URL gets the process's one
:class:`~npydask.storage.object.ObjectSource` for its store and
``storage_options`` (obstore is imported only then).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from npydask.cache.spec import CacheChoice
from npydask.storage.base import Lister, Source
from npydask.storage.local import LOCAL, LocalLister
from npydask.storage.paths import absolute
from npydask.storage.urls import is_url, split_url, to_local

__all__ = ["StoragePath", "fspath", "lister_for", "resolve"]


@dataclass(frozen=True)
class StoragePath:
    """A path or URL and the source that reads it: what :func:`resolve` decides once.

    Examples
    --------
    >>> p = resolve("file:///data/a.npy")
    >>> p.path, p.source, p.shown, p.local
    ('/data/a.npy', LocalSource(), '/data/a.npy', True)
    """

    source: Source
    """The source that reads :attr:`path`."""
    path: str
    """An absolute local path, or the URL as given."""

    @property
    def shown(self) -> str:
        """:attr:`path` as messages show it (an object URL without its credentials)."""
        return self.source.display(self.path)

    @property
    def local(self) -> bool:
        """Whether :attr:`path` is a local file (read by :data:`~npydask.storage.local.LOCAL`)."""
        return self.source is LOCAL


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


def resolve(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None, cache: CacheChoice = None
) -> StoragePath:
    """The path to carry (absolute, or the URL as given) with the source that reads it.

    ``cache`` (a :data:`~npydask.cache.spec.CacheChoice`, already checked by
    :func:`~npydask.cache.spec.cache_choice`) is the node cache an object's
    reads use; it travels in the source's spec. Local paths ignore it: the
    operating system's page cache keeps local files.

    Raises
    ------
    ValueError
        For an unknown URL scheme, or ``storage_options`` given with a local path.
    ImportError
        For an object URL without the ``remote`` extra.

    Examples
    --------
    >>> resolve("file:///data/a.npy")
    StoragePath(source=LocalSource(), path='/data/a.npy')
    """
    path = fspath(path)
    if is_url(path):
        from npydask.storage._stores import StoreSpec, import_obstore
        from npydask.storage.object import source_for

        import_obstore()
        return StoragePath(source_for(StoreSpec.of(split_url(path).base, storage_options, cache)), path)
    if storage_options:
        raise ValueError(
            f"{path}: storage_options apply to object-store URLs (s3://, gs://, az://, http(s)://); "
            "this is a local path: drop storage_options"
        )
    return StoragePath(LOCAL, absolute(path))


def lister_for(root: str, source: Source) -> Lister:
    """The lister of the folder or prefix ``root`` (already resolved by :func:`resolve`)."""
    if source is LOCAL:
        return LocalLister(root)
    from npydask.storage.object_list import ObjectLister

    return ObjectLister(source, root)  # type: ignore[arg-type]
