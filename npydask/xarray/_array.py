"""The lazy array xarray holds for each variable, and the facts a variable carries.

:class:`NpyBackendArray` is xarray's ``BackendArray`` over one of npydask's
own array-likes: an :class:`~npydask.array.NpyFileArray` (one file or
``.npz`` member, after its ROI) or a stacked
:class:`~npydask.dataset.stacking.FileGroup` (a folder). Indexing goes through
``explicit_indexing_adapter`` with xarray's ``OUTER_1VECTOR`` support:
integers and slices become one box read (:func:`~npydask.plan.region.split_index`),
and the one list of indices xarray passes (on the axis where it saves
most) is read run by run of consecutive indices, or for a folder's file
axis as a group of just the picked files; other lists, and vectorized
indexing, read the box that covers them and finish in memory. It holds no
open file and no data: it pickles as the paths, the identities and the
header facts, and reads (thread-safely, through the per-process handle
cache) wherever it is unpickled.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
from xarray.backends import BackendArray
from xarray.core import indexing

from npydask.array import NpyFileArray
from npydask.dataset.stacking import FileGroup
from npydask.format.header import NpyHeader
from npydask.storage.paths import absolute
from npydask.storage.urls import is_url, redact

__all__ = ["NpyBackendArray", "axis_names", "file_names", "npy_attrs", "runs", "same_shapes"]

FILE_DIM = "file"
"""The dimension of a folder's files, and the name of its coordinate of relative paths."""


class NpyBackendArray(BackendArray):
    """xarray's lazy view of an npydask array-like (a file, an ``.npz`` member, a folder's stack)."""

    __slots__ = ("dtype", "shape", "source")

    def __init__(self, source: NpyFileArray | FileGroup) -> None:
        self.source = source
        self.shape = tuple(source.shape)
        self.dtype = np.dtype(source.dtype)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER_1VECTOR, self._read)

    def _read(self, key: tuple[Any, ...]) -> np.ndarray:
        """``source[key]`` for integers, slices and at most one array of sorted, distinct indices."""
        at = next((axis for axis, k in enumerate(key) if isinstance(k, np.ndarray)), None)
        if at is None:
            return np.asarray(self.source[key])  # (an integer index of every axis gives a numpy scalar)
        picks = key[at].tolist()
        if at == 0 and isinstance(self.source, FileGroup):  # the files picked, read as one group
            group = FileGroup([self.source.views[i] for i in picks], 0, stacked=True)
            return np.asarray(group[(slice(None), *key[1:])])
        out_axis = sum(1 for k in key[:at] if isinstance(k, slice))  # (integers drop their axes)
        parts = [np.asarray(self.source[(*key[:at], run, *key[at + 1 :])]) for run in runs(picks)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=out_axis)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NpyBackendArray, (self.source,))

    def __repr__(self) -> str:
        """The file (a URL's query string and userinfo removed), or the group's count, with shape and dtype."""
        source = self.source
        if isinstance(source, NpyFileArray):
            return f"NpyBackendArray({redact(source.ref.path)!r}, shape={self.shape}, dtype={self.dtype.str})"
        return f"NpyBackendArray({source!r})"  # (a FileGroup shows no path)


def runs(indices: Sequence[int]) -> list[slice]:
    """Sorted, distinct ``indices`` as slices of consecutive ones.

    Examples
    --------
    >>> runs([2, 3, 4, 9, 11, 12])
    [slice(2, 5, None), slice(9, 10, None), slice(11, 13, None)]
    """
    out: list[slice] = []
    for i in indices:
        if out and out[-1].stop == i:
            out[-1] = slice(out[-1].start, i + 1)
        else:
            out.append(slice(i, i + 1))
    return out


def axis_names(dims: Any, default: Sequence[str], what: str) -> tuple[Hashable, ...]:
    """``dims`` checked against the ``len(default)`` axes it names, or ``default`` when it is ``None``.

    ``what`` names the array in the error (its path and shape).

    Examples
    --------
    >>> axis_names(None, ("dim_0", "dim_1"), "a.npy")
    ('dim_0', 'dim_1')
    >>> axis_names(["y", "x"], ("dim_0", "dim_1"), "a.npy")
    ('y', 'x')
    """
    if dims is None:
        return tuple(default)
    if isinstance(dims, str) or not isinstance(dims, Sequence):
        raise TypeError(f"{what}: dims must be a sequence of {len(default)} names, found {dims!r}")
    names = tuple(dims)
    if len(names) != len(default):
        raise ValueError(
            f"{what}: dims must name each of its {len(default)} axes, found {len(names)} names {list(names)!r}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"{what}: dims must be distinct names, found {list(names)!r}")
    return names


def npy_attrs(headers: Sequence[NpyHeader]) -> dict[str, str]:
    """A variable's attributes: the NPY format version and the files' order (``"C"`` or ``"F"``).

    For several files that differ, each attribute lists the distinct values
    (``"C, F"``). Strings, so that netCDF and zarr writers take them.

    Examples
    --------
    >>> from npydask.format.header import parse_header
    >>> import io, numpy as np
    >>> buf = io.BytesIO(); np.save(buf, np.zeros((2, 3)))
    >>> npy_attrs([parse_header(buf.getvalue())])
    {'npy_version': '1.0', 'order': 'C'}
    """
    versions = sorted({h.version for h in headers})
    orders = sorted({"F" if h.fortran_order else "C" for h in headers})
    return {"npy_version": ", ".join(f"{a}.{b}" for a, b in versions), "order": ", ".join(orders)}


def file_names(files: Sequence[str], root: str | None = None) -> list[str]:
    """The files' paths relative to ``root`` (default: the deepest folder holding them all).

    URLs are made relative to ``root`` (or their common prefix) with ``/``;
    a file outside ``root`` keeps its whole path (or URL).

    Examples
    --------
    >>> file_names(["/data/a/x.npy", "/data/b/y.npy"])
    ['a/x.npy', 'b/y.npy']
    >>> file_names(["s3://bkt/p/x.npy", "s3://bkt/p/q/y.npy"], "s3://bkt/p/")
    ['x.npy', 'q/y.npy']
    """
    if not files:
        return []
    if is_url(files[0]):
        base = root if root is not None else posixpath.commonprefix([f.rsplit("/", 1)[0] + "/" for f in files])
        base = base if base.endswith("/") else base + "/"
        base = base[: base.rindex("/") + 1]
        return [f[len(base) :] if f.startswith(base) else f for f in files]
    base = absolute(root) if root is not None else os.path.commonpath([os.path.dirname(f) for f in files])
    inside = base if base.endswith(os.sep) else base + os.sep  # (as discovery joins root and entry)
    return [f[len(inside) :] if f.startswith(inside) else f for f in files]


def same_shapes(files: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> None:
    """Refuse files of different shapes (after ROI): they cannot share one variable.

    The message names two files and their shapes and suggests a ``"pad"``
    ROI of the largest extents, which gives every file the same shape.

    Raises
    ------
    ValueError
        Two shapes differ.
    """
    first = shapes[0]
    for path, shape in zip(files, shapes):
        if shape != first:
            biggest = [max(s[d] for s in shapes) for d in range(len(first))]
            raise ValueError(
                f"files of different shapes cannot form one variable: {files[0]} has shape {first} but {path} has "
                f"{shape}; give them one shape with a ROI, e.g. roi_shape={biggest}, out_of_bounds_policy='pad' "
                "(cells outside a file are fill_value), or open them one by one"
            )
