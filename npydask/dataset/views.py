"""A table's files as per-file lazy views, made on demand: what ``ds.views`` callers index.

:class:`FileViews` is a read-only :class:`collections.abc.Sequence` over a
:class:`~npydask.dataset.table.FileTable` and a :class:`Context` (the ``FileRef``
fields no file changes: read options, backend, ``.npz`` key, source).
``views[i]`` builds ``NpyFileArray(FileRef(...), roi)`` for row ``i`` (a few
microseconds), so a dataset holds no per-file objects for its lifetime;
``views[a:b]`` is a ``FileViews`` over ``table[a:b]`` (O(1)). Read loops
over many files should take :meth:`FileTable.rows
<npydask.dataset.table.FileTable.rows>` or :meth:`~npydask.dataset.table.FileTable.items`
instead of a view per file.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import astuple
from typing import Any, NamedTuple

import numpy as np

from npydask.array import NpyFileArray
from npydask.config import ReadOptions
from npydask.dataset._strings import ENCODING
from npydask.dataset.table import FileTable
from npydask.reader import FileRef
from npydask.storage.base import Source
from npydask.storage.local import LOCAL

__all__ = ["Context", "FileViews", "ViewLayout", "per_file_shapes", "view_layout"]


class Context(NamedTuple):
    """What every file of a table is read with: the ``FileRef`` fields no file changes."""

    options: ReadOptions
    backend: str = "auto"
    key: str | None = None
    source: Source = LOCAL

    def facts(self) -> str:
        """The text a token hashes (an object store's public part only, never credentials)."""
        where = "local" if self.source is LOCAL else self.source.spec.public()  # type: ignore[attr-defined]
        return f"{astuple(self.options)!r}|{self.backend}|{self.key!r}|{where}"


class FileViews(Sequence[NpyFileArray]):
    """The files of a table as :class:`~npydask.array.NpyFileArray` views, made on demand (read-only).

    ``views[i]`` builds ``NpyFileArray(FileRef(...), roi)`` for row ``i``;
    ``views[a:b]`` is a ``FileViews`` over ``table[a:b]``. Each access makes
    a new view (equal reads, not the same object).
    """

    __slots__ = ("context", "table")

    table: FileTable
    context: Context

    def __init__(self, table: FileTable, context: Context) -> None:
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "context", context)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"FileViews is read-only: cannot set {name!r}; slice it or build another")

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return FileViews(self.table[index], self.context)
        t = self.table
        i = t._index(index)
        c = self.context
        ref = FileRef(
            t.path(i), t.identity(i), t.header(i), c.options, c.backend, c.key, t.is_deflated(i), t.check(i), c.source
        )
        return NpyFileArray(ref, t.roi(i))

    def __iter__(self) -> Iterator[NpyFileArray]:
        t, c = self.table, self.context
        flags = [False] * len(t) if t.deflated is None else t.deflated.tolist()
        for (path, ident, h, r), deflated in zip(t.rows(), flags):
            header, check = t.headers[h]
            ref = FileRef(path, ident, header, c.options, c.backend, c.key, deflated, check, c.source)
            yield NpyFileArray(ref, t.rois[r])

    def __reduce__(self) -> tuple[Any, ...]:
        return (FileViews, (self.table, self.context))

    def __repr__(self) -> str:
        return f"FileViews({self.table!r})"

    def __dask_tokenize__(self) -> Any:
        return ("npydask.FileViews", self.token())

    def token(self) -> str:
        """The table's token with the context's facts."""
        text = f"{self.table.token()}|{self.context.facts()}"
        return hashlib.blake2b(text.encode(*ENCODING), digest_size=16).hexdigest()


class ViewLayout(NamedTuple):
    """Each view's output shape, output bytes and file order (``True``: Fortran order), one entry per view."""

    shapes: list[tuple[int, ...]]
    sizes: list[int]
    fortran: list[bool]


def per_file_shapes(shapes: tuple[tuple[int, ...], ...], shape_id: np.ndarray) -> list[tuple[int, ...]]:
    """Each file's shape from a :class:`~npydask.dataset.table.Layout` (one shape: one list repeat, no loop).

    >>> per_file_shapes(((2, 3), (4,)), np.array([0, 1, 0]))
    [(2, 3), (4,), (2, 3)]
    """
    if len(shapes) == 1:
        return [shapes[0]] * len(shape_id)
    return [shapes[k] for k in shape_id.tolist()]


def view_layout(views: Sequence[NpyFileArray]) -> ViewLayout:
    """Each view's output shape, output bytes and file order, in one pass (per-file cost counts here)."""
    shapes: list[tuple[int, ...]] = []
    sizes: list[int] = []
    fortran: list[bool] = []
    for v in views:
        h = v.ref.header
        roi = v.roi
        if roi is None:
            shapes.append(h.shape)
            sizes.append(h.nbytes)
        else:
            shapes.append(roi.shape)
            sizes.append(math.prod(roi.shape) * h.dtype.itemsize)
        fortran.append(h.fortran_order)
    return ViewLayout(shapes, sizes, fortran)
