"""The xarray engine ``npy``: the entry point xarray finds in the ``xarray.backends`` group.

Registered in ``pyproject.toml`` as ``npy = "npydask.xarray:NpyBackendEntrypoint"``;
the work is in :mod:`npydask.xarray._open` and :mod:`npydask.xarray._array`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import xarray as xr
from xarray.backends import BackendEntrypoint

from npydask.storage.urls import is_url, redact
from npydask.xarray._open import DATASET_KEYWORDS, open_npy

__all__ = ["NpyBackendEntrypoint"]


class NpyBackendEntrypoint(BackendEntrypoint):
    """``xr.open_dataset(path, engine="npy")``: a ``.npy`` file, an ``.npz`` archive or a folder, read lazily by npydask.

    - A ``.npy`` file gives the variable ``data`` with dims ``dim_0, dim_1, ...``
      (or ``dims=[...]``).
    - An ``.npz`` archive (or any file given ``key=``) gives one variable per
      ``.npy`` member (or per name in ``key``) with dims ``<member>_dim_0, ...``,
      so members of different shapes do not clash (``dims={member: [...]}``).
    - A folder (or an object-store prefix) gives ``data`` with dims
      ``("file", dim_0, ...)`` and a coordinate ``file`` of the files' paths
      relative to it. Files are chosen as :func:`npydask.open_dataset`
      chooses them, whose keywords are backend keywords here
      (``file_filter``, ``recursive``, ``files``, ROI arguments, ``index``,
      ...); a ``key`` names the member to read of each archive. Files of
      different shapes raise ``ValueError`` suggesting a ``"pad"`` ROI.
      ``dims`` names each file's axes, or all axes with the file axis first.

    Data stay in the files until read: ``chunks=None`` reads only what is
    indexed, ``chunks={}`` or ``"auto"`` follow npydask's chunking
    (``encoding["preferred_chunks"]``: contiguous in the file, several small
    files per chunk). ``encoding["source"]`` is the path (or URL); each
    variable's attrs carry ``npy_version`` and ``order`` (``"C"`` or ``"F"``).
    URLs take ``storage_options``. An ``.npy`` file holds no CF metadata, so
    there is nothing to decode.
    """

    description = "NumPy .npy files, .npz archives and folders of .npy files, read lazily by npydask"
    url = ""  # (no public home page yet: see README.md, section "xarray")
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "dims", "key", "storage_options", *DATASET_KEYWORDS)

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        """True for paths and URLs ending in ``.npy`` or ``.npz`` (folders need ``engine="npy"``)."""
        try:
            path = os.fspath(filename_or_obj)
        except TypeError:
            return False
        if not isinstance(path, str):
            return False
        try:
            name = redact(path) if is_url(path) else path
        except ValueError:  # an unknown URL scheme: not ours
            return False
        return name.lower().endswith((".npy", ".npz"))

    def open_dataset(  # type: ignore[override]
        self,
        filename_or_obj: str | os.PathLike[str],
        *,
        drop_variables: str | Iterable[str] | None = None,
        dims: Any = None,
        key: Any = None,
        storage_options: dict[str, Any] | None = None,
        **dataset_kwargs: Any,
    ) -> xr.Dataset:
        return open_npy(
            filename_or_obj, drop_variables=drop_variables, dims=dims, key=key, storage_options=storage_options,
            **dataset_kwargs,
        )
