"""``.npy`` files, ``.npz`` archives and folders as xarray datasets, planned by npydask.

Every path goes through :func:`npydask.open_dataset` (a single file or
archive member as ``files=[path]``), so discovery, headers, ROIs, indexes and
object storage are npydask's own; this module only names the dimensions,
wraps each array-like in :class:`~npydask.xarray._array.NpyBackendArray` and
tells xarray npydask's chunking (``encoding["preferred_chunks"]``, used by
``chunks={}`` and ``chunks="auto"``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import xarray as xr
from xarray.core import indexing

from npydask.dataset.npy_dataset import NpyDataset
from npydask.dataset.open import open_dataset
from npydask.dataset.stacking import FileGroup
from npydask.format.npz import arrays_in
from npydask.storage import open_regular, reader
from npydask.storage.urls import is_url, redact
from npydask.storage.where import fspath, resolve
from npydask.xarray._array import FILE_DIM, NpyBackendArray, axis_names, file_names, npy_attrs, same_shapes
from npydask.xarray._coords import balanced, coords_from_names

__all__ = ["DATASET_KEYWORDS", "FOLDER_ONLY", "dataset_to_xarray", "open_npy"]

DATASET_KEYWORDS = tuple(
    name
    for name, p in inspect.signature(open_dataset).parameters.items()
    if p.kind is p.KEYWORD_ONLY and name not in ("key", "device", "storage_options")
)
"""The keywords of :func:`npydask.open_dataset` the engine passes through (besides ``key`` and ``storage_options``)."""

FOLDER_ONLY = frozenset(
    ("file_filter", "file_list", "files", "recursive", "sort", "shard_id", "num_shards", "on_error")
)
"""Keywords that choose files of a folder: refused for a single file or archive."""

ENGINE_SORT = "natural"
"""The engine's default ``sort``: numbered files (``day_1 .. day_365``) are a series, read by number."""

DATA = "data"
"""The variable of a file or folder."""


def open_npy(
    filename_or_obj: str | os.PathLike[str],
    *,
    drop_variables: str | Iterable[str] | None = None,
    dims: Any = None,
    key: str | Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    file_coord: Any = None,
    coord_name: str | None = None,
    **dataset_kwargs: Any,
) -> xr.Dataset:
    """The lazy :class:`xarray.Dataset` of a ``.npy`` file, an ``.npz`` archive or a folder.

    See :class:`~npydask.xarray.NpyBackendEntrypoint` for the layout and the
    keywords.
    """
    if not isinstance(filename_or_obj, str | os.PathLike):
        raise TypeError(
            f"the npy engine reads paths and object URLs, found {type(filename_or_obj).__name__}; "
            "save the array to a file or read it with numpy"
        )
    device = dataset_kwargs.pop("device", "cpu")
    if device != "cpu":
        raise ValueError(
            f"device={device!r}: the npy engine reads into host memory; for CuPy chunks open the files with "
            "npydask.open_dataset(..., device='gpu')"
        )
    unknown = sorted(set(dataset_kwargs) - set(DATASET_KEYWORDS))
    if unknown:
        raise TypeError(
            f"the npy engine takes no keyword {', '.join(map(repr, unknown))}; it takes dims, key, "
            f"storage_options, file_coord, coord_name and npydask.open_dataset's {', '.join(DATASET_KEYWORDS)}"
        )
    path = fspath(filename_or_obj)
    drop = {drop_variables} if isinstance(drop_variables, str) else set(drop_variables or ())
    options = {"storage_options": storage_options, **dataset_kwargs}
    if _is_folder(path):
        return _folder(path, drop, dims, key, {"sort": ENGINE_SORT, **options}, (file_coord, coord_name))
    given = sorted(FOLDER_ONLY & set(dataset_kwargs)) + [
        k for k, v in (("file_coord", file_coord), ("coord_name", coord_name)) if v is not None
    ]
    if given:
        raise ValueError(
            f"{redact(path)}: {', '.join(given)} choose files in a folder; this is one "
            f"{'archive' if _is_archive(path, key) else 'file'}: open its folder, or drop them"
        )
    if _is_archive(path, key):
        return _archive(path, drop, dims, key, options)
    ds = open_dataset(files=[path], **options)
    variables = {} if DATA in drop else {DATA: _variable(ds, dims, "dim_")}
    return _dataset(variables, {}, ds.files[0])


def _is_folder(path: str) -> bool:
    """A local directory, or a URL that names a prefix (ends in ``/`` or names no ``.npy``/``.npz`` object)."""
    if is_url(path):
        return not redact(path).lower().endswith((".npy", ".npz"))
    return os.path.isdir(path)


def _is_archive(path: str, key: Any) -> bool:
    return key is not None or redact(path).lower().endswith(".npz")


def _variable(ds: NpyDataset, dims: Any, prefix: str) -> xr.Variable:
    """The one file (or member) of ``ds`` as a lazy variable with dims ``<prefix>0, ...`` (or ``dims``)."""
    view = ds.views[0]
    names = axis_names(dims, [f"{prefix}{i}" for i in range(view.ndim)], f"{ds.files[0]} (shape {view.shape})")
    return _lazy(names, NpyBackendArray(view), ds.array(0).chunks, ds.headers, ds.files[0])


def _lazy(
    names: Sequence[Hashable], array: NpyBackendArray, chunks: Sequence[tuple[int, ...]], headers: Any, source: str
) -> xr.Variable:
    encoding = {"source": source, "preferred_chunks": dict(zip(names, chunks))}
    return xr.Variable(names, indexing.LazilyIndexedArray(array), attrs=npy_attrs(headers), encoding=encoding)


def _dataset(variables: dict[str, xr.Variable], coords: Mapping[Hashable, Any], source: str) -> xr.Dataset:
    ds = xr.Dataset(variables, coords=coords)
    ds.encoding["source"] = source
    return ds


def _archive(path: str, drop: set[str], dims: Any, key: Any, options: dict[str, Any]) -> xr.Dataset:
    """One variable per ``.npy`` member (or per member in ``key``), dims ``<member>_dim_0, ...``."""
    if key is None:
        members = _members(path, options["storage_options"])
    else:
        members = [key] if isinstance(key, str) else list(key)
    if dims is not None and not isinstance(dims, dict):
        raise TypeError(
            f"{redact(path)}: an archive's members have dims of their own: give dims as a dict "
            f"{{member: names}}, found {dims!r}"
        )
    variables = {}
    for member in members:
        if member not in drop:
            ds = open_dataset(files=[path], key=member, **options)
            variables[member] = _variable(ds, (dims or {}).get(member), f"{member}_dim_")
    return _dataset(variables, {}, _shown(path, options["storage_options"]))


def _shown(path: str, storage_options: dict[str, Any] | None) -> str:
    """``path`` as npydask carries it (absolute, or the URL) and shows it (no query string)."""
    return resolve(path, storage_options).shown


def _members(path: str, storage_options: dict[str, Any] | None) -> list[str]:
    """The archive's ``.npy`` members in archive order (its zip directory only)."""
    where = resolve(path, storage_options)
    path = where.path
    if not where.local:
        read, size = where.source.range_read(path)  # type: ignore[attr-defined]
        return arrays_in(read, size, where.shown)
    f, st = open_regular(path, what="a regular .npz archive")
    with f:
        return arrays_in(reader(f.fileno()), st.st_size, path)


def _folder(
    path: str, drop: set[str], dims: Any, key: Any, options: dict[str, Any], naming: tuple[Any, str | None]
) -> xr.Dataset:
    """The folder's files, stacked: variables of dims ``("file", ...)``, and coordinates.

    One variable per member of a ``key`` list.
    """
    opened = open_dataset(path, key=key, **options)
    shown = _shown(path, options["storage_options"])
    if isinstance(opened, NpyDataset):
        members = {DATA: (opened, "dim_", dims)}
    else:  # key=[...]: one variable per member, each file's axes named after it
        if dims is not None and not isinstance(dims, dict):
            raise TypeError(
                f"{redact(path)}: with key={list(opened.keys)!r} each member has dims of its own: give dims as a "
                f"dict {{member: names}}, found {dims!r}"
            )
        members = {k: (m, f"{k}_dim_", (dims or {}).get(k)) for k, m in opened.members.items()}
    variables = {}
    file_dim: Hashable | None = None
    for name, (ds, prefix, member_dims) in members.items():
        try:
            same_shapes(ds.files, ds.shapes)
        except ValueError as e:
            if name == DATA:
                raise
            raise ValueError(f"member {name!r}: {e}") from None
        names = stacked_names(member_dims, ds.ndim, f"{redact(path)} (files of shape {ds.shapes[0]})", prefix)
        if file_dim is not None and names[0] != file_dim:
            raise ValueError(
                f"{redact(path)}: every member's file axis must have one name, found {file_dim!r} and {names[0]!r}"
            )
        file_dim = names[0]
        if name not in drop:
            chunks = ds.stack().chunks
            chunks = (balanced(len(ds), len(chunks[0])), *chunks[1:])  # (no trailing one-file chunk)
            group = FileGroup(ds.views, 0, stacked=True)  # what ds.stack() reads, as one array-like
            variables[name] = _lazy(names, NpyBackendArray(group), chunks, ds.headers, shown)
    assert file_dim is not None
    relative = file_names(opened.files, path)
    coords: dict[Hashable, Any] = {} if file_dim in drop else {file_dim: relative}
    if naming[0] is not None:
        coords.update(_named(coords, file_dim, relative, naming, variables, redact(path)))
    return _dataset(variables, coords, shown)


def _named(
    coords: dict[Hashable, Any],
    file_dim: Hashable,
    relative: list[str],
    naming: tuple[Any, str | None],
    variables: dict[str, xr.Variable],
    shown: str,
) -> dict[Hashable, Any]:
    """``file_coord``'s coordinates along ``file_dim``; one named as the file axis becomes its index."""
    out: dict[Hashable, Any] = {}
    for name, values in coords_from_names(relative, *naming).items():
        if name in variables or (name != file_dim and any(name in v.dims for v in variables.values())):
            raise ValueError(f"{shown}: file_coord makes a coordinate {name!r}, which names a variable or axis already")
        if name == file_dim:
            if file_dim == FILE_DIM:
                raise ValueError(
                    f"{shown}: file_coord makes a coordinate {name!r}, the name of the files' paths; name it otherwise"
                )
            out[FILE_DIM] = (file_dim, coords.pop(file_dim, relative))  # (the paths stay, as "file")
            out[name] = values
        else:
            out[name] = (file_dim, values)
    return out


def stacked_names(dims: Any, ndim: int, what: str, prefix: str = "dim_") -> tuple[Hashable, ...]:
    """Dims of a stack of files of ``ndim`` axes: ``("file", *dims)``, or ``dims`` naming the file axis too.

    Without ``dims``: ``("file", "<prefix>0", ...)``.

    Examples
    --------
    >>> stacked_names(None, 2, "scans/")
    ('file', 'dim_0', 'dim_1')
    >>> stacked_names(["y", "x"], 2, "scans/"), stacked_names(["t", "y", "x"], 2, "scans/")
    (('file', 'y', 'x'), ('t', 'y', 'x'))
    """
    default = [FILE_DIM, *(f"{prefix}{i}" for i in range(ndim))]
    if dims is None:
        return tuple(default)
    if isinstance(dims, str) or not isinstance(dims, Sequence) or len(dims) not in (ndim, ndim + 1):
        raise ValueError(
            f"{what}: dims must name the files' {ndim} axes (the file axis is then {FILE_DIM!r}) or all "
            f"{ndim + 1} axes, file axis first; found {dims!r}"
        )
    return axis_names(dims if len(dims) == ndim + 1 else (FILE_DIM, *dims), default, what)


def dataset_to_xarray(ds: NpyDataset, dims: Any = None, name: Hashable = DATA) -> xr.DataArray:
    """:meth:`NpyDataset.to_xarray <npydask.NpyDataset.to_xarray>`: the stack as a DataArray over npydask's graph."""
    if not len(ds):
        raise ValueError("an empty dataset has no array to give xarray")
    same_shapes(ds.files, ds.shapes)
    names = stacked_names(dims, ds.ndim, f"the dataset's files (shape {ds.shapes[0]})")
    coords = {names[0]: file_names(ds.files)}
    return xr.DataArray(ds.stack(), dims=names, coords=coords, name=name, attrs=npy_attrs(ds.headers))
