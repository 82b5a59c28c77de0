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
    """``xr.open_dataset(path, engine="npy")``: a ``.npy`` file, an ``.npz`` archive or a folder, read lazily.

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
      ``on_error``, ...), except that ``sort`` defaults to ``"natural"``:
      ``day_1 .. day_365`` is a series read by number (``day_2`` before
      ``day_10``), where ``open_dataset`` keeps DALI's byte-wise order for
      parity with DALI pipelines (and warns when the two differ). Pass
      ``sort="bytes"`` for DALI's order. Files of different shapes raise
      ``ValueError`` suggesting a ``"pad"`` ROI. ``dims`` names each file's
      axes, or all axes with the file axis first.
    - A folder of ``.npz`` archives: ``key="x"`` reads that member of each
      as ``data``; ``key=["x", "y"]`` gives one variable per member, dims
      ``("file", "x_dim_0", ...)``, ``("file", "y_dim_0", ...)`` (members
      may differ in dtype and shape; ``dims={member: names}``).
    - ``file_coord`` turns file names into coordinates along the file axis:
      a regular expression searched in each relative path, whose named
      groups name the coordinates (``file_coord=r"day_(?P<day>[0-9]+)"`` gives
      ``day`` as integers; decimals become floats, ISO 8601 dates
      ``datetime64``, anything else strings), or a function of the relative
      path with ``coord_name`` naming its coordinate. A coordinate named as
      the file axis (``dims=["day", "y", "x"]``) becomes its index, so
      ``ds.sel(day=10)`` works and the paths stay as coordinate ``file``;
      otherwise ``ds.swap_dims(file="day")`` makes it one. A file the
      expression does not match raises ``ValueError`` naming it.

    The ``file`` axis is chunked as npydask groups the files, evened out
    (10 files in two chunks are 5 and 5, never 9 and 1).
    Data stay in the files until read: ``chunks=None`` reads only what is
    indexed, ``chunks={}`` or ``"auto"`` follow npydask's chunking
    (``encoding["preferred_chunks"]``: contiguous in the file, several small
    files per chunk). ``encoding["source"]`` is the path (or URL); each
    variable's attrs carry ``npy_version`` and ``order`` (``"C"`` or ``"F"``).
    URLs take ``storage_options``. An ``.npy`` file holds no CF metadata, so
    there is nothing to decode.
    """

    description = "NumPy .npy files, .npz archives and folders of .npy files, read lazily by npydask"
    url = ""  # (no public home page yet: see docs/guide/xarray.md)
    open_dataset_parameters = (
        "filename_or_obj",
        "drop_variables",
        "dims",
        "key",
        "storage_options",
        "file_coord",
        "coord_name",
        *DATASET_KEYWORDS,
    )

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
        file_coord: Any = None,
        coord_name: str | None = None,
        **dataset_kwargs: Any,
    ) -> xr.Dataset:
        return open_npy(
            filename_or_obj,
            drop_variables=drop_variables,
            dims=dims,
            key=key,
            storage_options=storage_options,
            file_coord=file_coord,
            coord_name=coord_name,
            **dataset_kwargs,
        )
