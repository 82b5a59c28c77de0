"""A dataset of many ``.npy`` files: :class:`NpyDataset`, what :func:`~npydask.dataset.open.open_dataset` returns.

The dataset is immutable and cheap: its files are columns of a
:class:`~npydask.dataset.table.FileTable`, and lazy arrays are made only when asked
for (``ds[i]``, ``ds.stack()``, ``ds.concatenate()``), grouped into tasks by
:mod:`npydask.dataset.stacking`. Opening (selection, header scans, ROIs, shards) is
:mod:`npydask.dataset.open`'s; reading every header is :mod:`npydask.dataset.scan`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from npydask.array import resolve_chunks, wrap
from npydask.dataset._exports import adapter
from npydask.dataset._strings import human_bytes
from npydask.dataset.scan import dtype_name
from npydask.dataset.stacking import join
from npydask.dataset.table import FileTable, Layout
from npydask.dataset.traffic import plan_dataset
from npydask.dataset.views import Context, FileViews, per_file_shapes
from npydask.format.header import NpyHeader
from npydask.plan.chunks import chunk_limit
from npydask.plan.grouping import plan_groups
from npydask.plan.sampling import shard_range

__all__ = ["NpyDataset", "Skipped", "file_index", "human_bytes"]


@dataclass(frozen=True)
class Skipped:
    """A file ``open_dataset(..., on_error="skip")`` left out: its path (as ``ds.files`` shows it) and why.

    ``reason`` is the error its header gave, as text: the exception's
    type name and message (``"NpyFormatError: ... not an .npy file ..."``).
    """

    path: str
    reason: str


class NpyDataset:
    """An immutable, ordered set of ``.npy`` files with one dtype and ndim.

    Made by :func:`~npydask.dataset.open.open_dataset`. ``len(ds)``, ``ds.files``, ``ds.headers``,
    ``ds.shapes`` (after ROI), ``ds.dtype``, ``ds.ndim``, ``ds.nbytes``;
    ``ds[i]`` is file ``i`` as a lazy array, ``ds[a:b]`` and ``ds[[i, j]]`` are
    sub-datasets, ``ds.stack()`` and ``ds.concatenate()`` join the files.
    ``ds.sharding`` remembers a shard taken by ``open_dataset`` or
    ``ds.shard()``, so the Loader and the PyTorch adapter can warn when they
    shard it again.

    A ``torch.utils.data.DataLoader`` given an ``NpyDataset`` (which yields
    lazy dask arrays) fails with a ``TypeError`` naming the adapters to use,
    ``npydask.torch.NpyMapDataset`` and ``NpyIterableDataset``.
    """

    __slots__ = ("_context", "_device", "_sharding", "_skipped", "_start", "_table")
    _table: FileTable
    _context: Context
    _device: str
    _sharding: tuple[int, int] | None
    _start: int | None
    _skipped: tuple[Skipped, ...]

    def __init__(
        self,
        table: FileTable,
        context: Context,
        *,
        device: str = "cpu",
        sharding: tuple[int, int] | None = None,
        start: int | None = 0,
        skipped: tuple[Skipped, ...] = (),
    ) -> None:
        object.__setattr__(self, "_table", table)
        object.__setattr__(self, "_context", context)
        object.__setattr__(self, "_device", device)
        object.__setattr__(self, "_sharding", sharding)
        object.__setattr__(self, "_start", start)
        object.__setattr__(self, "_skipped", tuple(skipped))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"NpyDataset is immutable: cannot set {name!r}; select with ds[...] or ds.shard()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"NpyDataset is immutable: cannot delete {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._table, self._context, self._device, self._sharding, self._start, self._skipped))

    # -- facts ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self) -> Iterator[da.Array]:
        return (self[i] for i in range(len(self)))

    @property
    def files(self) -> list[str]:
        """The files' absolute paths (or URLs, query strings removed) in read order.

        Each is ``os.path.join(file_root, entry)``, relative roots made absolute.

        A new list each time, made from the dataset's columns (O(N); figures
        on the performance page).
        """
        return self._context.source.display_all(self._table.paths())

    def _shown(self, i: int) -> str:
        """File ``i``'s path as messages show it (an object URL's query string removed)."""
        path = self._table.path(i)
        return self._context.source.display(path)

    @property
    def headers(self) -> list[NpyHeader]:
        """Each file's header.

        Opened with ``headers="first"``: the first file's, relied on for every
        file and checked where each is read.
        """
        t = self._table
        if t.header_id is None:
            return [t.headers[0][0]] * len(t) if len(t) else []
        entries = [h for h, _ in t.headers]
        return [entries[k] for k in t.header_id.tolist()]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Each file's output shape, after the ROI."""
        lay = self._table.layout()
        return per_file_shapes(lay.shapes, lay.shape_id)

    @property
    def dtype(self) -> np.dtype:
        """The dtype every file shares (byte order included)."""
        if not len(self._table):
            raise ValueError("an empty dataset has no dtype")
        return self._table.header(0).dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions every file shares."""
        if not len(self._table):
            raise ValueError("an empty dataset has no ndim")
        return len(self.views[0].shape)

    @property
    def nbytes(self) -> int:
        """Bytes of all outputs (after ROI)."""
        return int(self._table.layout().nbytes.sum())

    @property
    def sharding(self) -> tuple[int, int] | None:
        """``(shard_id, num_shards)`` of the shard this dataset was cut to (kept by selections), else ``None``."""
        return self._sharding

    @property
    def start_index(self) -> int | None:
        """Where this dataset's first file stands in the list ``open_dataset`` selected before sharding.

        0 for a whole dataset, the shard's first position for a shard (of
        ``open_dataset`` or :meth:`shard`), moved by contiguous slices;
        ``None`` after a selection by list. Global sample ids (``npydask.ray.datasource``'s
        index column) start here.
        """
        return self._start

    @property
    def skipped(self) -> tuple[Skipped, ...]:
        """The files ``open_dataset(..., on_error="skip")`` left out, in list order, with why (:class:`Skipped`).

        Empty when none was (and always with ``on_error="raise"``). Files are
        skipped before sharding, so every shard (and every selection made
        from the dataset) lists all of them.
        """
        return self._skipped

    @property
    def table(self) -> FileTable:
        """The files' facts as columns (:class:`~npydask.dataset.table.FileTable`)."""
        return self._table

    @property
    def views(self) -> FileViews:
        """The per-file array-likes the lazy arrays are built on: a read-only sequence making each on demand."""
        return FileViews(self._table, self._context)

    def __repr__(self) -> str:
        if not len(self):
            return "NpyDataset(0 files)"
        shown = self._shapes_shown()
        first = self._shown(0)
        more = f" .. {self._shown(-1)}" if len(self) > 1 else ""
        return (
            f"NpyDataset({len(self)} files, dtype={dtype_name(self.dtype)}, ndim={self.ndim}, "
            f"shape {shown}, {human_bytes(self.nbytes)}, device={self._device!r}: {first}{more})"
        )

    def _shapes_shown(self) -> str:
        """The output shapes as ``repr`` shows them: the one shape, or how many and two of them."""
        shapes = self._table.layout().shapes
        return str(shapes[0]) if len(shapes) == 1 else f"{len(shapes)} shapes, e.g. {shapes[0]}..{shapes[-1]}"

    def _with(self, table: FileTable, sharding: tuple[int, int] | None, start: int | None) -> NpyDataset:
        return NpyDataset(
            table, self._context, device=self._device, sharding=sharding, start=start, skipped=self._skipped
        )

    # -- selection -----------------------------------------------------------
    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            lo, _, step = index.indices(len(self))
            start = self._start + lo if self._start is not None and step == 1 else None
            return self._with(self._table[index], self._sharding, start)
        if isinstance(index, tuple):
            raise TypeError(
                f"ds[{index!r}]: a dataset is indexed by file only; use a list for several files "
                "(ds[[i, j]]) and index the array for elements (ds[i][...])"
            )
        if isinstance(index, (list, np.ndarray)):
            picks = [self._index(i) for i in np.asarray(index).reshape(-1).tolist()] if len(index) else []
            return self._with(self._table.take(np.array(picks, np.int64)), self._sharding, None)
        return self.array(self._index(index))

    def __getitems__(self, indices: Any) -> Any:
        """Refuse a ``torch.utils.data.DataLoader``, the one caller of this hook, naming the adapters.

        DataLoader's fetcher asks a map-style dataset for each batch through
        ``__getitems__`` when it has one; ``ds[i]`` is a lazy dask array,
        which no DataLoader can batch.
        """
        raise TypeError(
            "an NpyDataset gives lazy dask arrays, which a torch DataLoader cannot batch: wrap it, "
            "DataLoader(npydask.torch.NpyMapDataset(ds), shuffle=True or sampler=...) for DataLoader's samplers, "
            "or DataLoader(npydask.torch.NpyIterableDataset(ds, shuffle=True)) for npydask's own epoch plan "
            "(or use npydask.Loader(ds, batch_size) for NumPy batches)"
        )

    def _index(self, i: Any) -> int:
        return file_index(i, len(self), "dataset indices are integers, slices or lists of integers")

    def shard(self, shard_id: int, num_shards: int) -> NpyDataset:
        """Shard ``shard_id`` of ``num_shards``: DALI's contiguous ``[floor(N*k/S), floor(N*(k+1)/S))``."""
        r = shard_range(len(self), shard_id, num_shards)
        sharding = (shard_id, num_shards) if num_shards > 1 else self._sharding
        start = self._start + r.start if self._start is not None else None
        return self._with(self._table[r.start : r.stop], sharding, start)

    # -- lazy arrays ---------------------------------------------------------
    def array(self, i: int, chunks: Any = "auto") -> da.Array:
        """File ``i`` (after ROI) as a lazy array."""
        view = self.views[self._index(i)]
        return wrap(view, resolve_chunks(chunks, view, self._device), device=self._device)

    def arrays(self) -> list[da.Array]:
        """Every file as a lazy array, in order."""
        return [self.array(i) for i in range(len(self))]

    def stack(self, chunks: Any = None) -> da.Array:
        """One lazy array of shape ``(len(ds), *shape)``; all output shapes must be equal.

        Its dtype is ``ds.dtype`` in native byte order, as ``numpy.stack``
        gives (``>f4`` files stack to ``float32``); ``ds[i]`` keeps the file's.

        Files under about an eighth of dask's ``array.chunk-size`` are read
        several per task; larger files keep chunks of their own. ``chunks``
        (anything ``normalize_chunks`` takes for the stacked shape) overrides
        the grouping.
        """
        self._need_files("stack")
        lay = self._table.layout()
        if len(lay.shapes) > 1:  # (one header and one shared ROI: one shape, no loop over files)
            i = int(np.flatnonzero(lay.shape_id != lay.shape_id[0])[0])
            first, other = lay.shapes[int(lay.shape_id[0])], lay.shapes[int(lay.shape_id[i])]
            raise ValueError(
                f"cannot stack files of different shapes: {self._shown(0)} has {first} but "
                f"{self._shown(i)} has {other}; use ds.concatenate(axis), ds.arrays(), or a ROI with roi_shape"
            )
        return self._join(chunks, lay, axis=0, stacked=True)

    def concatenate(self, axis: int = 0, chunks: Any = None) -> da.Array:
        """One lazy array joining the files along ``axis``; other extents must agree.

        Like ``numpy.concatenate``, the result is in native byte order. Files
        are grouped into tasks and chunked as :meth:`stack` does.
        """
        self._need_files("concatenate")
        ndim = self.ndim
        if not -ndim <= axis < ndim:
            raise ValueError(f"axis {axis} is out of range for arrays of {ndim} dimensions")
        axis %= ndim
        lay = self._table.layout()
        first = lay.shapes[int(lay.shape_id[0])]
        ref = first[:axis] + first[axis + 1 :]
        bad = [k for k, s in enumerate(lay.shapes) if s[:axis] + s[axis + 1 :] != ref]  # (per distinct shape)
        if bad:
            i = int(np.flatnonzero(np.isin(lay.shape_id, bad))[0])
            raise ValueError(
                f"cannot concatenate along axis {axis}: {self._shown(0)} has shape {first} but "
                f"{self._shown(i)} has {lay.shapes[int(lay.shape_id[i])]}; all extents but axis {axis} must agree"
            )
        return self._join(chunks, lay, axis=axis, stacked=False)

    def to_xarray(self, dims: Any = None, name: Any = "data") -> Any:
        """:meth:`stack` as an ``xarray.DataArray``, over npydask's own dask graph (grouping and chunks as is).

        Dims are ``("file", dim_0, ...)``: ``dims`` names each file's axes, or
        all axes with the file axis first. The file axis has a coordinate of
        the files' paths relative to the deepest folder holding them all;
        attrs carry ``npy_version`` and ``order``. Files of different output
        shapes raise ``ValueError`` suggesting a ``"pad"`` ROI. Needs
        ``pip install 'npydask[xarray]'``.

        Examples
        --------
        >>> import numpy as np, npydask, tempfile, os
        >>> root = tempfile.mkdtemp()
        >>> for i in range(3): np.save(os.path.join(root, f"{i}.npy"), np.full((2, 4), i, "i2"))
        >>> da = npydask.open_dataset(root).to_xarray(dims=["y", "x"])
        >>> da.dims, da["file"].values.tolist(), int(da.sel(file="2.npy").sum())
        (('file', 'y', 'x'), ['0.npy', '1.npy', '2.npy'], 16)
        """
        return adapter("to_xarray")(self, dims=dims, name=name)

    def to_ray(
        self,
        *,
        column: str = "data",
        index_column: str | None = "index",
        path_column: str | None = None,
        concatenate: bool = False,
        axis: int = 0,
        block_size: int | str = "128MiB",
        override_num_blocks: int | None = None,
        ray_remote_args: dict[str, Any] | None = None,
    ) -> Any:
        """This dataset as a ``ray.data.Dataset`` (extra ``ray``); see :func:`npydask.ray.datasource.read_npy`.

        Rows are files (after ROI), or with ``concatenate=True`` elements
        along ``axis`` of the joined files; read tasks follow npydask's
        grouping with ``block_size`` as the limit, and planning reads no payload.
        """
        return adapter("to_ray")(
            self,
            column=column,
            index_column=index_column,
            path_column=path_column,
            concatenate=concatenate,
            axis=axis,
            block_size=block_size,
            override_num_blocks=override_num_blocks,
            ray_remote_args=ray_remote_args,
        )

    def warm_cache(self, *, progress: bool = True) -> Any:
        """Read every file's output (after ROI) once, so that its bytes are held in the node cache; keep nothing.

        Stages a dataset, or the shard it was cut to, on the node's local disk
        before training: later reads of these bytes send no request. The reads
        take the dataset's own read path, a file at a time per thread, several
        at once. Returns a :class:`~npydask.dataset.warm.WarmSummary` (files,
        bytes, seconds, folder); ``progress`` shows a line on stderr.

        Raises
        ------
        ValueError
            The files are local (the page cache holds those), or no cache is on
            for the dataset here (``cache=False``, or ``cache=None`` with the
            ``cache`` setting, ``NPYDASK_CACHE``, empty).
        """
        from npydask.dataset.warm import cache_folder_of, warm

        folder = cache_folder_of(self._context.source, self._shown(0) if len(self) else "an empty dataset")
        return warm(self.views, folder, progress=progress)

    def traffic_plan(self, epochs: int = 1, *, cache_bytes: int | str | None = None, prices: Any = None) -> Any:
        """What opening this dataset and computing ``ds.stack()`` ``epochs`` times send to the store, counted now.

        The reads are the stack's with its default chunks (``ds.arrays()``
        where shapes differ): small files several per task, each object in
        one GET; larger files and ROIs as merged range GETs. Reads nothing
        (headers are held); local files are planned as if they were objects.
        ``cache_bytes`` models a node cache of that size (``pin``): bytes held
        are hits and send nothing. ``prices``: ``{"get": P, "list": P, "gb": P}``
        (per 1,000 requests, per 10^9 bytes). Returns a :class:`~npydask.TrafficPlan`.

        Examples
        --------
        >>> import numpy as np, npydask, tempfile, os
        >>> root = tempfile.mkdtemp()
        >>> for i in range(3): np.save(os.path.join(root, f"{i}.npy"), np.zeros(100, "f4"))
        >>> plan = npydask.open_dataset(root).traffic_plan(2, prices={"get": 0.0004})
        >>> plan.whole_object_gets, plan.epochs[0].whole_object_bytes, plan.open_header_requests
        (6, 1584, 3)
        """
        self._need_files("plan the traffic of")
        return plan_dataset(self, epochs, cache_bytes=cache_bytes, prices=prices)

    def _need_files(self, what: str) -> None:
        if not len(self):
            raise ValueError(f"cannot {what} an empty dataset")

    def _join(self, chunks: Any, lay: Layout, *, axis: int, stacked: bool) -> da.Array:
        views = self.views
        shapes = per_file_shapes(lay.shapes, lay.shape_id)
        limit = chunk_limit("auto" if chunks is None else chunks, self._device)
        if limit is None:
            return self._join_explicit(chunks, shapes, axis=axis, stacked=stacked)
        sizes, fortran = lay.nbytes, lay.fortran.tolist()  # plan_groups takes a sequence of bools
        cluster_threads = _cluster_threads()
        plan = plan_groups(
            sizes,
            shapes,
            self.dtype,
            fortran,
            limit=limit,
            axis=axis,
            stacked=stacked,
            threads=cluster_threads,
            strided=self._has_roi(),
            copies=cluster_threads is not None,
        )
        return join(views, plan, axis=axis, stacked=stacked, device=self._device, shared=cluster_threads is None)

    def _has_roi(self) -> bool:
        """Whether any file is cut to a ROI."""
        t = self._table
        used = (0,) if t.roi_id is None else np.unique(t.roi_id).tolist()
        return any(t.rois[k] is not None for k in used)

    def _join_explicit(self, chunks: Any, shapes: list[tuple[int, ...]], *, axis: int, stacked: bool) -> da.Array:
        from dask.array.core import normalize_chunks

        from npydask.plan.grouping import GroupPlan

        views = self.views
        lengths = [1] * len(shapes) if stacked else [s[axis] for s in shapes]
        first = shapes[0]
        total = (len(views), *first) if stacked else (*first[:axis], sum(lengths), *first[axis + 1 :])
        normalized = normalize_chunks(chunks, total, dtype=self.dtype)
        join_axis = 0 if stacked else axis
        # A group ends where a file boundary meets a chunk boundary; chunks may span files.
        # Files of length 0 along the axis join the next group (trailing ones the last), so
        # no group is empty unless every file is; each chunk, zero-sized ones included,
        # lands in exactly one group.
        n = len(views)
        sizes = normalized[join_axis]
        file_edges = np.cumsum([0, *lengths]).tolist()
        at_chunk_edge = set(np.cumsum([0, *sizes]).tolist())
        bounds: list[tuple[int, int]] = []
        inner: list[tuple[tuple[int, ...], ...]] = []
        a, ci, pos = 0, 0, 0
        for k in range(1, n + 1):
            hi = file_edges[k]
            last = k == n
            if not last and (hi == file_edges[a] or hi not in at_chunk_edge):
                continue
            pieces = []
            while ci < len(sizes) and (last or pos + sizes[ci] <= hi):
                pos += sizes[ci]
                pieces.append(sizes[ci])
                ci += 1
            if not pieces:  # trailing files of length 0: they join the last group
                bounds[-1] = (bounds[-1][0], n)
                break
            grid = list(normalized)
            grid[join_axis] = tuple(pieces)
            bounds.append((a, k))
            inner.append(tuple(grid))
            a = k
        return join(views, GroupPlan(tuple(bounds), tuple(inner)), axis=axis, stacked=stacked, device=self._device)


def _cluster_threads() -> int | None:
    """The threads of the ``dask.distributed`` cluster this graph will run on, if any.

    That is the default client's (the one ``compute()`` uses) when dask's
    scheduler setting does not name another; ``None`` for local schedulers.
    """
    import sys

    if "distributed" not in sys.modules:  # no client can exist without it
        return None
    from dask.base import get_scheduler

    try:
        from distributed import default_client

        client = default_client()
    except (ImportError, ValueError):
        return None
    if get_scheduler() != client.get:
        return None
    try:
        return max(1, sum(client.nthreads().values()))
    except Exception:  # a closing client: plan as for local threads
        return None


def file_index(i: Any, n: int, kinds: str) -> int:
    """``i`` as a file index in ``range(n)`` (negative counts from the end); ``kinds`` says what is accepted.

    Raises
    ------
    TypeError
        ``i`` is not an integer (bools are refused).
    IndexError
        ``i`` is out of range.
    """
    if isinstance(i, bool) or not hasattr(i, "__index__"):
        raise TypeError(f"{kinds}, found {i!r}")
    k = i.__index__()
    if not -n <= k < n:
        raise IndexError(f"file index {k} is out of range for a dataset of {n} files")
    return k % n


def _rebuild(
    table: FileTable,
    context: Context,
    device: str,
    sharding: tuple[int, int] | None = None,
    start: int | None = 0,
    skipped: tuple[Skipped, ...] = (),
) -> NpyDataset:
    return NpyDataset(table, context, device=device, sharding=sharding, start=start, skipped=skipped)
