"""The zarr store for a place :func:`npydask.to_zarr` writes to, built one way for writing and reading back.

:func:`npydask.to_zarr` and :func:`zarr_store` both go through
:func:`where_to` (the place :func:`~npydask.storage.where.resolve` gives a
path or URL, as for every read) and
:func:`object_store` (an object-store URL as zarr's
``zarr.storage.ObjectStore`` over npydask's own obstore store, rooted at the
URL, with the same ``storage_options`` dialect, remote settings and fork
guard as every read: :class:`~npydask.storage.zarr_store.SpecObjectStore`).
So what ``to_zarr(x, url, storage_options=so)`` wrote,
``zarr.open_array(npydask.zarr_store(url, so))`` reads back.

zarr and obstore are imported only when a store is built.
"""

from __future__ import annotations

import os
from typing import Any

from npydask._keywords import suggest_keywords
from npydask.errors import install_hint
from npydask.storage.urls import is_url, split_url
from npydask.storage.where import StoragePath, resolve

__all__ = ["INSTALL_HINT", "object_store", "require_zarr", "where_to", "zarr_store"]

INSTALL_HINT = "install the zarr extra with: " + install_hint("zarr")


def require_zarr(what: str = "to_zarr") -> Any:
    """Import zarr (version 3 or later), or raise ``ImportError`` naming ``what`` needs it and the install hint."""
    try:
        import zarr
    except ImportError as e:
        raise ImportError(f"{what} needs zarr>=3.0, which is not installed; {INSTALL_HINT}") from e
    version = getattr(zarr, "__version__", "0")
    if int(version.split(".")[0]) < 3:
        raise ImportError(f"{what} works with zarr v3 and needs zarr>=3.0, found zarr {version}; {INSTALL_HINT}")
    return zarr


def where_to(store: str, storage_options: dict[str, Any] | None) -> StoragePath | None:
    """Where ``store`` is, as every read resolves it: a local folder (made absolute) or an object URL with its source.

    ``None`` for a URL of a scheme npydask does not read (``memory://``:
    fsspec's, which zarr opens with ``storage_options`` itself).

    Raises
    ------
    ValueError
        ``storage_options`` given with a local path.

    Examples
    --------
    >>> where_to("file:///data/a.zarr", None)
    StoragePath(source=LocalSource(), path='/data/a.zarr')
    >>> where_to("memory://a.zarr", None) is None
    True
    """
    try:
        is_url(store)
    except ValueError:  # a scheme npydask does not read (memory://, ...)
        return None
    return resolve(store, storage_options)


def object_store(url: str, storage_options: dict[str, Any] | None, *, read_only: bool = False) -> Any:
    """An object-store URL as a zarr store: npydask's obstore store rooted at the URL, in zarr's ``ObjectStore``.

    Rooted at the URL as zarr roots an fsspec URL: zarr sees keys below it
    only (``zarr.json`` is ``url/zarr.json``). It pickles as its spec, not as
    an obstore store, and builds the store again once per process.
    """
    from npydask.storage import StoreSpec, import_obstore
    from npydask.storage.zarr_store import SpecObjectStore

    import_obstore()
    parts = split_url(url)
    root = parts.base + ("/" + parts.key.strip("/") if parts.key.strip("/") else "")
    return SpecObjectStore(StoreSpec.of(root, storage_options), read_only=read_only)


@suggest_keywords
def zarr_store(
    url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None, *, read_only: bool = False
) -> Any:
    """The zarr store that :func:`npydask.to_zarr` writes ``url`` through, to read it back (or write more).

    Parameters
    ----------
    url : str or os.PathLike
        What was given to ``to_zarr``: an object-store URL
        (``s3://bucket/data/vol.zarr``, ``gs://``, ``az://``), a local path
        (or ``file://`` URL), or another fsspec URL (``memory://``).
    storage_options : dict, optional
        The same dict ``to_zarr`` was given (for an object-store URL:
        obstore's ``endpoint``, ``region``, ... as for reading; for other
        URLs, fsspec's).
    read_only : bool
        Open the store read-only.

    Returns
    -------
    zarr store
        For an object-store URL, zarr's ``zarr.storage.ObjectStore`` over the
        same obstore store ``to_zarr`` used, rooted at ``url``; for a local
        path a ``zarr.storage.LocalStore``; otherwise a
        ``zarr.storage.FsspecStore``. Give it to ``zarr.open_array`` or
        ``zarr.open_group``.

    Raises
    ------
    ImportError
        zarr>=3.0 (``pip install 'npydask[zarr]'``) or, for an object-store
        URL, obstore (``pip install 'npydask[remote]'``) is not installed.
    ValueError
        ``storage_options`` with a local path, or an unusable URL.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os, zarr
    >>> path = os.path.join(tempfile.mkdtemp(), "a.zarr")
    >>> npydask.to_zarr(np.arange(6).reshape(2, 3), path)
    >>> zarr.open_array(npydask.zarr_store(path), mode="r")[:].sum()
    np.int64(15)

    Over S3 (the same ``storage_options`` as for reading and writing)::

        so = {"endpoint": "http://127.0.0.1:8333", "region": "us-east-1"}
        npydask.to_zarr(x, "s3://bucket/vol.zarr", storage_options=so)
        z = zarr.open_array(npydask.zarr_store("s3://bucket/vol.zarr", so), mode="r")
    """
    zarr = require_zarr("zarr_store")
    url = os.fspath(url)
    where = where_to(url, storage_options)
    if where is None:
        return zarr.storage.FsspecStore.from_url(url, storage_options=storage_options, read_only=read_only)
    if where.local:
        return zarr.storage.LocalStore(where.path, read_only=read_only)
    return object_store(where.path, storage_options, read_only=read_only)
