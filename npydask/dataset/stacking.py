"""Many files as one lazy array: groups of files per task, stacked or concatenated.

Which files form a task is planned apart, without I/O, by
:func:`npydask.plan.grouping.plan_groups`: consecutive files are grouped so a
task reads several small files into one block, while a file of about an
eighth of dask's ``array.chunk-size`` or more gets chunks of its own and is
never copied together with another. This module reads such plans: each group
becomes one
``dask.array.from_array`` over a :class:`FileGroup` (which carries only its
own files' rows of the dataset's :class:`~npydask.dataset.table.FileTable`, a slice
that pickles compactly) and the groups are joined with
``dask.array.concatenate``, so no task carries the whole dataset. Where the
groups line up on one grid, one source serves them all instead (:func:`join`):
held once in the graph for a local scheduler, or, on a cluster, carried by
every task while all the files' facts together stay light
(:data:`LIGHT_FILE_TASKS`).
"""

from __future__ import annotations

import array
import bisect
import hashlib
import math
from collections.abc import Sequence
from itertools import chain
from typing import Any

import dask.array as da
import numpy as np

from npydask._buffers import as_bytes, empty
from npydask.array import NpyFileArray, wrap
from npydask.dataset.table import FileTable
from npydask.dataset.views import Context, FileViews
from npydask.format.header import NpyHeader
from npydask.plan.grouping import GroupPlan, one_grid
from npydask.plan.read_strategy import STRATEGIES, choose
from npydask.plan.region import Box, ReadPlan, plan_read, same_layout, split_index
from npydask.reader import shared_facts
from npydask.storage.base import Item

__all__ = ["LIGHT_FILE_TASKS", "FileGroup", "join", "joined_dtype", "plain_run"]

LIGHT_FILE_TASKS = 16_384
"""Files times tasks up to which a cluster's tasks each carry every file's facts (~50 B a file pickled:
at most about 800 KiB in all), so one ``from_array`` serves every group.

One source means one dask layer: dask then fuses each read with the
reduction after it, with no ``concatenate`` step and none of the alias
tasks its fusion leaves behind, so fewer tasks and a faster sum (figures on
the performance page). Past the limit each
group keeps its own small source, so no task ships a large dataset's facts.
"""


def joined_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype ``numpy.concatenate`` (and so ``numpy.stack`` and dask) gives arrays of ``dtype``.

    That is ``dtype`` in native byte order: ``>f4`` files stack to ``float32``,
    as ``np.stack([np.load(f) for f in files])`` does, whatever the grouping.

    Examples
    --------
    >>> joined_dtype(np.dtype(">f4")).str, joined_dtype(np.dtype("<i2")).str
    ('<f4', '<i2')
    """
    meta = np.empty((0,), dtype)
    return np.concatenate([meta, meta]).dtype


class FileGroup:
    """Consecutive files as one array-like: stacked on a new axis 0, or joined along ``axis``.

    Made from a dataset's :class:`~npydask.dataset.views.FileViews` (a table
    slice and its context: what a task pickles, ~50 B a file), or from any
    sequence of :class:`~npydask.array.NpyFileArray` views (kept as they
    are: files of different settings or sources each read their own way).
    Blocks are in :func:`joined_dtype` (native byte order), as ``numpy.stack``
    and ``dask.array.concatenate`` make them, so a join promises the same
    dtype however many groups it has.
    """

    __slots__ = ("_list", "axis", "context", "dtype", "offsets", "shape", "stacked", "table")

    def __init__(self, views: Sequence[NpyFileArray], axis: int, stacked: bool) -> None:
        self.axis = axis
        self.stacked = stacked
        if isinstance(views, FileViews):
            self.table: FileTable | None = views.table
            self.context: Context | None = views.context
            self._list: tuple[NpyFileArray, ...] | None = None
            lay = views.table.layout()
            first = lay.shapes[int(lay.shape_id[0])]
            self.dtype = joined_dtype(views.table.header(0).dtype)
            lengths = None if stacked else np.array([s[axis] for s in lay.shapes], np.int64)[lay.shape_id]
        else:
            self.table = self.context = None
            self._list = tuple(views)
            first = self._list[0].shape
            self.dtype = joined_dtype(self._list[0].dtype)
            lengths = None if stacked else np.array([v.shape[axis] for v in self._list], np.int64)
        n = len(views)
        if stacked:
            self.shape = (n, *first)
            self.offsets = tuple(range(n + 1))
        else:
            assert lengths is not None  # (set above whenever the files are concatenated)
            self.offsets = (0, *np.cumsum(lengths).tolist())
            self.shape = (*first[:axis], self.offsets[-1], *first[axis + 1 :])

    @property
    def views(self) -> Sequence[NpyFileArray]:
        """The files as views (over a table: a :class:`~npydask.dataset.views.FileViews`, views made on demand)."""
        if self._list is not None:
            return self._list
        return FileViews(self.table, self.context)  # type: ignore[arg-type]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def _count(self) -> int:
        return len(self._list) if self._list is not None else len(self.table)  # type: ignore[arg-type]

    def _path(self, k: int) -> str:
        return self._list[k].ref.path if self._list is not None else self.table.path(k)  # type: ignore[union-attr]

    def __repr__(self) -> str:
        how = "stack" if self.stacked else f"concatenate(axis={self.axis})"
        return f"FileGroup({self._count()} files, {how}, shape={self.shape}, dtype={self.dtype.str})"

    def __dask_tokenize__(self) -> Any:
        if self._list is not None:
            return ("npydask.FileGroup", self.axis, self.stacked, group_token(self._list))
        return ("npydask.FileGroup", self.axis, self.stacked, table_token(self.table, self.context))  # type: ignore[arg-type]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FileGroup, (self.views, self.axis, self.stacked))

    def __getitem__(self, index: Any) -> np.ndarray:
        box, post = split_index(index, self.shape)
        if self.stacked:
            block = self._read_stacked(box)
            return block[post] if post else block
        out = self._buffer(box.shape, 0, self._count())
        axis = 0 if self.stacked else self.axis
        lo, hi = box.start[axis], box.stop[axis]
        views = self.views
        source = views[0].ref.source
        rois: list[tuple[Any, ...]] = []  # ROIs inside their files, each into its slice of `out`: run at the end
        # (only the files the box meets: a view is made per file over a table)
        first = max(0, bisect.bisect_right(self.offsets, lo) - 1)
        last = min(len(views), bisect.bisect_left(self.offsets, hi))
        for k in range(first, last):
            view = views[k]
            a, b = max(lo, self.offsets[k]), min(hi, self.offsets[k + 1])
            if a >= b:
                continue
            in_place = view.dtype.str == self.dtype.str and view.dtype == self.dtype
            dest = [slice(None)] * len(box.shape)
            dest[axis] = slice(a - lo, b - lo)
            start = list(box.start)
            stop = list(box.stop)
            start[axis], stop[axis] = a - self.offsets[k], b - self.offsets[k]
            part = Box(tuple(start), tuple(stop))
            if axis == 0 and in_place:
                slab = out[a - lo : b - lo]  # (C-contiguous: a slice along axis 0)
                plan = _fast_roi(view, part, self.dtype, source)
                if plan is None:
                    view.read(part, out=slab)
                else:
                    ref = view.ref
                    rois.append((ref.path, ref.identity, plan, as_bytes(slab), ref.options, ref.check))
            else:
                out[tuple(dest)] = view.read(part)
        if rois:
            source.read_runs_many(rois)
        return out[post] if post else out

    def _buffer(self, shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
        """The block for files ``lo..hi``; without memory for it, a ``MemoryError`` naming them."""
        try:
            return empty(shape, self.dtype)
        except MemoryError as e:
            nbytes = math.prod(shape) * self.dtype.itemsize
            files = self._path(lo) + ("" if hi - lo <= 1 else f" .. {self._path(hi - 1)}")
            raise MemoryError(
                f"{files}: {e}; it was reading {nbytes} bytes ({nbytes / (1 << 20):.1f} MiB) of {hi - lo} "
                f"file(s) as one block of shape {shape}: use smaller chunks (stack(chunks=...))"
            ) from e

    def _read_stacked(self, box: Box) -> np.ndarray:
        """Files ``box.start[0]..box.stop[0]``, each cut to the inner box, on a new axis 0."""
        inner = Box(box.start[1:], box.stop[1:])
        lo, hi = box.start[0], box.stop[0]
        if hi - lo == 1:  # one file: let its backend choose (a zero-copy mapping under "auto")
            block = self.views[lo].read(inner)
            if not _same_dtype(block.dtype, self.dtype):  # (a structured dtype's fields too, which .str hides)
                block = block.astype(self.dtype)
            return block[np.newaxis]
        out = self._buffer(box.shape, lo, hi)
        if self._list is None:
            return self._read_rows(inner, lo, hi, out)
        row = out.nbytes // (hi - lo) if hi > lo else 0
        source = self.views[lo].ref.source  # (a group's files share theirs; any other goes through its own read)
        read_many = source.read_many
        flat = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # numpy types ndarray.__buffer__ from Python 3.12
        runs: dict[int, tuple[int, int] | None] = {}  # per distinct header: its one plain run
        strided: dict[tuple[Any, ...], ReadPlan | None] = {}  # per distinct (header, ROI, ...): its plan
        batch: list[Item] = []  # consecutive plain files, read in one tight loop
        rois: list[tuple[Any, ...]] = []  # ROIs inside their files: read_runs jobs, run together at the end
        at = lo  # where the batch starts
        for k in range(lo, hi):
            view = self.views[k]
            ref = view.ref
            run = None
            if view.roi is None and ref.key is None and not ref.options.direct_io and ref.source is source:
                h = ref.header
                if id(h) in runs:
                    run = runs[id(h)]
                else:
                    run = runs[id(h)] = plain_run(h, inner, self.dtype)
            if run is not None:
                batch.append((ref.path, ref.identity, run[0], ref.check))
                continue
            if batch:
                read_many(batch, flat[(at - lo) * row : (k - lo) * row], row)
                batch = []
            at = k + 1
            slab = out[k - lo, ...]  # a C-contiguous slab: read in place
            if view.roi is not None:
                memo = (id(ref.header), id(view.roi), id(ref.options), ref.backend, ref.key, id(ref.source))
                plan = strided.get(memo, False)
                if plan is False:
                    plan = strided[memo] = _fast_roi(view, inner, self.dtype, source)
                if plan is not None:  # a ROI inside the file, many runs: straight to the pread grid
                    rois.append((ref.path, ref.identity, plan, as_bytes(slab), ref.options, ref.check))
                    continue
            _read_into(view, inner, slab, self.dtype)
        if batch and row:
            read_many(batch, flat[(at - lo) * row : (hi - lo) * row], row)
        if rois:
            source.read_runs_many(rois)
        return out

    def _read_rows(self, inner: Box, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        """Table rows ``lo..hi`` into ``out``: plain files in one ``read_many`` loop, the others as views.

        What depends only on a row's header and ROI (its one plain run, or its
        ROI plan) is worked out once per distinct pair, not per file.
        """
        t, c = self.table[lo:hi], self.context  # type: ignore[index]
        source, options = c.source, c.options  # type: ignore[union-attr]
        row = out.nbytes // (hi - lo)
        flat = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # numpy types ndarray.__buffer__ from Python 3.12
        plain = c.key is None and not options.direct_io  # type: ignore[union-attr]
        checks = [check for _, check in t.headers]
        runs: list[tuple[int, int] | None | bool] = [False] * len(t.headers)  # per header: its plain run, when asked
        if plain and t.roi_id is None and t.rois[0] is None:
            used = [0] if t.header_id is None else np.unique(t.header_id).tolist()
            for h in used:
                runs[h] = plain_run(t.headers[h][0], inner, self.dtype)
            if all(runs[h] is not None for h in used):
                # the common case: every file one plain run (one open, one preadv, one fstat, one close each)
                source.read_many(t.items([r[0] if r else 0 for r in runs]), flat, row)  # type: ignore[index]
                return out
        views = FileViews(t, c)  # type: ignore[arg-type]
        batch: list[Item] = []  # consecutive plain files, read in one tight loop
        rois: list[tuple[Any, ...]] = []  # ROIs inside their files: read_runs jobs, run together at the end
        strided: dict[tuple[int, int], ReadPlan | None] = {}  # per distinct (header, ROI): its plan
        at = 0  # where the batch starts
        for k, (path, ident, h, r) in enumerate(t.rows()):
            run = None
            if plain and t.rois[r] is None:
                run = runs[h]
                if run is False:
                    run = runs[h] = plain_run(t.headers[h][0], inner, self.dtype)
            if run is not None:
                batch.append((path, ident, run[0], checks[h]))
                continue
            if batch:
                source.read_many(batch, flat[at * row : k * row], row)
                batch = []
            at = k + 1
            slab = out[k, ...]  # a C-contiguous slab: read in place
            if t.rois[r] is not None:
                plan = strided.get((h, r), False)
                if plan is False:  # (a view is built for the first file of each (header, ROI) pair only)
                    plan = strided[(h, r)] = _fast_roi(views[k], inner, self.dtype, source)
                if plan is not None:  # a ROI inside the file, many runs: straight to the pread grid
                    rois.append((path, ident, plan, as_bytes(slab), options, checks[h]))
                    continue
            _read_into(views[k], inner, slab, self.dtype)
        if batch and row:
            source.read_many(batch, flat[at * row : (hi - lo) * row], row)
        if rois:
            source.read_runs_many(rois)
        return out


def _read_into(view: NpyFileArray, inner: Box, slab: np.ndarray, dtype: np.dtype) -> None:
    """``inner`` of ``view`` into ``slab`` (in place, or converted to native byte order and fields of ``dtype``)."""
    if not _same_dtype(view.dtype, dtype):
        slab[...] = view.read(inner)  # to native byte order (fields of a structured dtype too)
    else:
        view.read(inner, out=slab)


def table_token(table: FileTable, context: Context) -> str:
    """One hash of a group's rows (:meth:`FileTable.token`: its column buffers) and what they are read with.

    An object URL's query string (a presigned URL's signature) is removed
    before hashing, as :meth:`FileRef.facts <npydask.reader.FileRef.facts>`
    does: only the store's public part and the redacted paths are hashed.
    """
    if b"?" in table.names:
        table = table.map_paths(context.source.display)
    return FileViews(table, context).token()


def group_token(views: Sequence[NpyFileArray]) -> str:
    """One hash over every file's facts (as :meth:`FileRef.facts` renders them) and ROI.

    What files share (header, settings, backend, key, ROI) is rendered once
    per distinct object: for thousands of files this is the per-file cost of
    building a graph. The paths are hashed joined by NUL (which no path
    holds), each file's number of shared facts and its identity as 64-bit
    integers (local files; an object's ETag is text, hashed as its repr),
    cheaper than the ``repr`` of nanosecond mtimes (figures on the
    performance page).
    """
    shared: dict[tuple[int, int, str, str | None, int], int] = {}
    heads: list[str] = []
    numbers: list[int] = []
    paths: list[str] = []
    identities: list[tuple[Any, ...]] = []
    for v in views:
        r = v.ref
        k = (id(r.header), id(r.options), r.backend, r.key, id(v.roi))
        n = shared.get(k)
        if n is None:
            n = shared[k] = len(shared)
            heads.append(f"#{n}={shared_facts(r.header, r.options, r.backend, r.key)}|{v.roi!r}")
        numbers.append(n)
        paths.append(r.path)
        identities.append(r.identity)
    h = hashlib.blake2b(digest_size=16)
    kind = type(identities[0]).__name__ if identities else ""
    if kind == "InodeIdentity":  # (when the listing ran changes no data read: the inode alone, as facts() has it)
        identities = [i[:1] for i in identities]
    text = "\n".join(heads) + "\n" + kind + "\n" + "\0".join(paths)
    h.update(text.encode("utf8", "surrogateescape"))
    h.update(array.array("q", numbers).tobytes())
    try:
        h.update(array.array("q", chain.from_iterable(identities)).tobytes())
    except (TypeError, OverflowError):  # (an object's ETag, or an integer past 64 bits)
        h.update(repr(identities).encode("utf8", "surrogateescape"))
    return h.hexdigest()


def _fast_roi(view: NpyFileArray, inner: Box, dtype: np.dtype, source: Any) -> ReadPlan | None:
    """The plan of ``inner`` of ``view`` when a group reads it with ``source.read_runs`` (the short way), else ``None``.

    That is a ROI of a plain file (no ``.npz`` key) of the group's source,
    not forced onto the mmap backend, that :func:`_strided_plan` accepts.
    """
    ref = view.ref
    if view.roi is None or ref.key is not None or ref.backend == "mmap" or ref.source is not source:
        return None
    return _strided_plan(view, inner, dtype)


def _strided_plan(view: NpyFileArray, inner: Box, dtype: np.dtype) -> ReadPlan | None:
    """The plan of ``inner`` of ``view``'s ROI, when it lies inside the file, reads as ``dtype`` in C order
    and is read with ``pread`` (spans or runs: :func:`npydask.storage.pread_strategy`).

    Anything else (padding, a byte swap, a Fortran layout, a ROI the cost
    model maps) takes the general path.
    """
    ref = view.ref
    if view.roi is None or not _same_dtype(ref.header.dtype, dtype):
        return None
    wanted, inside = view.file_box(inner)
    if inside != wanted:
        return None
    plan = plan_read(ref.header, wanted)
    if not (plan.n_runs and same_layout(plan)):
        return None
    options = ref.options
    if plan.n_runs > 1 and ref.backend == "auto" and ref.source.mappable and not options.direct_io:
        choice = choose(plan, options.gap_bytes, options.max_span_bytes, STRATEGIES, options.roi_strategy)
        if choice.strategy == "mapped":
            return None  # (the general path maps it, on a local file system)
    return plan


def _same_dtype(a: np.dtype, b: np.dtype) -> bool:
    """Equal dtypes that also print alike (``str``: byte order included): bytes read as one are the other's."""
    return a.str == b.str and a == b


def plain_run(header: NpyHeader, inner: Box, dtype: np.dtype) -> tuple[int, int] | None:
    """(offset, nbytes) when ``inner`` of a file with ``header`` is one run already laid out as ``dtype``.

    A group reads such a part of a plain object in one GET from byte 0 through it (a whole small
    object in one request); :mod:`npydask.dataset.traffic` plans the same.
    """
    if not _same_dtype(header.dtype, dtype):
        return None
    plan = plan_read(header, inner)
    if not (plan.is_contiguous and same_layout(plan)):
        return None
    return plan.offset, plan.nbytes


def join(
    views: Sequence[NpyFileArray],
    plan: GroupPlan,
    *,
    axis: int,
    stacked: bool,
    device: str = "cpu",
    shared: bool = False,
) -> da.Array:
    """One lazy array from the groups of ``plan``.

    Groups whose chunks line up on one grid are read from a single
    :class:`FileGroup` of all the files: one ``from_array`` call however many
    groups. With ``shared`` (a graph for a local scheduler) that source is
    held once in the graph (``inline_array=False``) rather than embedded in
    every task, so stacking 10,000 large files costs one ``from_array``, not
    one per file (figures on the performance page). On a cluster every task carries it
    (a worker then needs no other key first), as long as files times tasks
    stays within :data:`LIGHT_FILE_TASKS`; past that, each group keeps a
    small source of its own and the groups are concatenated, so no task
    ships every file's facts to every worker.
    """
    if len(plan.bounds) > 1:
        grid = one_grid(plan, 0 if stacked else axis)
        if grid is not None and (shared or len(views) * math.prod(len(c) for c in grid) <= LIGHT_FILE_TASKS):
            return wrap(FileGroup(views, axis, stacked), grid, device=device, inline=not shared)
    arrays = [
        wrap(FileGroup(views[a:b], axis, stacked), chunks, device=device)
        for (a, b), chunks in zip(plan.bounds, plan.inner_chunks)
    ]
    if len(arrays) == 1:
        return arrays[0]
    return da.concatenate(arrays, axis=0 if stacked else axis)
