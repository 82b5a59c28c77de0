"""Datasets of many ``.npy`` files: NVIDIA DALI ``fn.readers.numpy`` parity on Dask.

:func:`open_dataset` selects files as DALI does (:mod:`npydask.discovery`),
reads and checks every header (in parallel, or from a persistent index),
resolves the ROI arguments per file (:mod:`npydask.roi`) and keeps the files
of one shard. The :class:`NpyDataset` it returns is immutable and cheap: lazy
arrays are made only when asked for (``ds[i]``, ``ds.stack()``,
``ds.concatenate()``).
"""

from __future__ import annotations

import functools
import gc
from array import array
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import dask.array as da
import numpy as np

from npydask.array import NpyFileArray, check_device, chunk_limit, resolve_chunks, wrap
from npydask.file_views import Context, FileViews
from npydask.table import FileTable, Layout
from npydask.storage._handles import HeaderCheck
from npydask.storage.base import Scanned, Source
from npydask.storage.local import LOCAL, LocalLister
from npydask.storage.urls import is_url, redact
from npydask.storage.where import fspath, lister_for, resolve
from npydask.dali_args import refuse_dali_arguments
from npydask.config import read_options
from npydask.discovery import Selected, select_listed, shard_range
from npydask.header import NpyHeader
from npydask.paths import absolute_all
from npydask.reader import BACKENDS, _check_key
from npydask.roi import RoiArgs, cutting_roi
from npydask.stacking import join, plan_groups
from npydask.uniform import check_headers, first_table

if TYPE_CHECKING:
    from npydask.multikey import MultiKeyDataset

__all__ = ["NpyDataset", "open_dataset", "scan_headers"]

_BATCH = 256
_T = TypeVar("_T")
_STEP = 4096
_SLOW_FILE = 40e-6
"""Seconds a file over which :func:`scan_headers` moves to threads. Measured on the 2-core VM,
100,000 files: 9 us a file from the page cache in one thread, 93 us after ``drop_caches``."""
_FAST_THREADED = 25e-6
"""Seconds a file under which :func:`scan_headers` moves back from threads to this one. Measured on
the 2-core VM, 100,000 files on 8 threads: 21 us a file from the page cache (the threads take turns
holding the GIL), 34 us after ``drop_caches``."""


def scan_headers(
    paths: Sequence[str],
    *,
    threads: int | None = None,
    key: str | None = None,
    progress: Callable[[int], None] | None = None,
    source: Source = LOCAL,
) -> list[Scanned | BaseException]:
    """Identity, header and raw header bytes of every path; failures come back as exceptions.

    Batches of files go to ``source``'s scan (:meth:`Source.scan
    <npydask.storage.base.Source.scan>`): for local files, one ``open``,
    one ``fstat``, one ``pread`` and one ``close`` each; header texts shared
    by many files are parsed once. Files in
    the page cache are scanned in this thread (threads only fight over the
    GIL there); when a batch shows latency (over ``_SLOW_FILE`` seconds a
    file: a network or cold file system, or a cold part of a big folder),
    the next files are scanned by ``threads`` threads (default 8), whose
    reads overlap, and back in this thread once a round of them runs at
    page-cache speed (under ``_FAST_THREADED`` a file). Measured, 100,000
    files: 9.3 s in one thread after ``drop_caches`` and 3.4 s on 8
    threads; from the page cache 0.9 s in one thread and 2.1 s on 8.
    ``threads=1`` never starts threads; another number keeps them from the
    first batch on.

    ``progress``, when given, is called in this thread with the number of
    files scanned so far after each batch of ``_BATCH`` files (never per
    file), and once with ``len(paths)`` at the end; it cannot change the
    results.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.zeros(3))
    >>> seen = []
    >>> [s[1].shape for s in scan_headers([p] * 600, progress=seen.append)][:1], seen
    ([(3,)], [256, 512, 600])
    """
    report = progress if progress is not None else _ignore
    scan_files = source.scan
    if len(paths) <= _BATCH or not source.mappable:  # (an object store's scan has its own requests in flight)
        if not source.mappable and progress is not None:
            results = []
            for i in range(0, len(paths), _BATCH * 8):
                results += scan_files(paths[i : i + _BATCH * 8], key)
                report(len(results))
            return results
        results = scan_files(paths, key)
        report(len(paths))
        return results
    step = _BATCH if progress is not None else _STEP  # (a few calls when nobody is watching)
    results = []
    done = 0
    on_threads = False
    pool: ThreadPoolExecutor | None = None
    try:
        while done < len(paths):
            t0 = time.perf_counter()
            if not on_threads:
                batch = paths[done : done + (_BATCH if done == 0 else step)]
                results += scan_files(batch, key)
                report(done + len(batch))
                on_threads = threads != 1 and (
                    threads is not None or time.perf_counter() - t0 > _SLOW_FILE * len(batch))
            else:  # a round of batches on the threads, then a look at what they cost
                if pool is None:
                    pool = ThreadPoolExecutor(threads or 8, thread_name_prefix="npydask-scan")
                batch = paths[done : done + _STEP]
                parts = [batch[i : i + _BATCH] for i in range(0, len(batch), _BATCH)]
                for part in pool.map(scan_files, parts, [key] * len(parts)):
                    results += part
                    report(len(results))
                on_threads = threads is not None or time.perf_counter() - t0 > _FAST_THREADED * len(batch)
            done += len(batch)
    finally:
        if pool is not None:
            pool.shutdown()
    return results


def _select(
    file_root: Any,
    file_filter: str,
    file_list: Any,
    files: Any,
    recursive: bool,
    storage_options: dict[str, Any] | None,
    sort: str = "bytes",
    inodes: bool = False,
) -> tuple[Selected, Source]:
    """The dataset's paths in read order (with their listing's identities, for a listed prefix), and their source.

    With ``inodes``, a local folder's listing keeps each file's
    :class:`~npydask.storage._handles.InodeIdentity` (``headers="first"``).
    """
    first = file_root
    if first is None and files is not None and not isinstance(files, str | bytes | os.PathLike):
        files = list(files)
        first = files[0] if files else None
    probe = fspath(first) if isinstance(first, str | os.PathLike) else None
    if probe is None or not is_url(probe):
        if storage_options:
            raise ValueError(
                "storage_options apply to object-store URLs (s3://, gs://, az://, http(s)://); "
                f"the dataset's files are local ({probe!r}): drop storage_options"
            )
        root = None if file_root is None else fspath(file_root)
        listed = inodes and root is not None and files is None and file_list is None
        paths, identities = select_listed(
            root, file_filter=file_filter, file_list=file_list, files=files, recursive=recursive, sort=sort,
            lister=LocalLister(root, inodes=True) if listed else None,
        )
        for p in paths[:1] + paths[-1:]:
            if is_url(p):
                raise ValueError(f"{redact(p)}: a dataset reads one store; found local paths and URLs together")
        # (tasks may run in another working directory: npydask.paths; a listing under an absolute root is absolute)
        listed_absolute = root is not None and files is None and file_list is None and os.path.isabs(root)
        return Selected(paths if listed_absolute else absolute_all(paths), identities), LOCAL
    probe, source = resolve(probe, storage_options)
    root = probe if file_root is not None else None
    lister = lister_for(root, source) if root is not None and files is None and file_list is None else None
    selected = select_listed(
        root, file_filter=file_filter, file_list=file_list, files=files, recursive=recursive, lister=lister, sort=sort
    )
    base = source.spec.base + "/"  # type: ignore[attr-defined]
    for p in selected.paths:
        if not p.startswith(base):
            raise ValueError(
                f"a dataset reads objects of one store ({source.spec.public()}); found {redact(p)}: "  # type: ignore[attr-defined]
                "open a dataset per store"
            )
    return selected, source


def _member_path(key: str | None, path: str) -> str:
    return f"{path} (member {key!r})"


def _same(path: str) -> str:
    return path


def _ignore(done: int) -> None:
    """The progress callback of nobody watching."""


def _dtype_name(dtype: np.dtype) -> str:
    return f"{dtype.name} ({dtype.str})" if dtype.fields is None else str(dtype)


class NpyDataset:
    """An immutable, ordered set of ``.npy`` files with one dtype and ndim.

    Made by :func:`open_dataset`. ``len(ds)``, ``ds.files``, ``ds.headers``,
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

    __slots__ = ("_context", "_device", "_sharding", "_start", "_table")

    def __init__(
        self,
        table: FileTable,
        context: Context,
        *,
        device: str = "cpu",
        sharding: tuple[int, int] | None = None,
        start: int | None = 0,
    ) -> None:
        object.__setattr__(self, "_table", table)
        object.__setattr__(self, "_context", context)
        object.__setattr__(self, "_device", device)
        object.__setattr__(self, "_sharding", sharding)
        object.__setattr__(self, "_start", start)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"NpyDataset is immutable: cannot set {name!r}; select with ds[...] or ds.shard()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"NpyDataset is immutable: cannot delete {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._table, self._context, self._device, self._sharding, self._start))

    # -- facts ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self) -> Iterator[da.Array]:
        return (self[i] for i in range(len(self)))

    @property
    def files(self) -> list[str]:
        """The files' absolute paths (or URLs, query strings removed) in read order (``os.path.join(file_root, entry)``, relative roots made absolute).

        A new list each time, made from the dataset's columns (O(N): about
        0.2 us a file).
        """
        if not self._context.source.mappable:
            return list(map(redact, self._table.paths()))
        return self._table.paths()

    def _shown(self, i: int) -> str:
        """File ``i``'s path as messages show it (an object URL's query string removed)."""
        path = self._table.path(i)
        return path if self._context.source.mappable else redact(path)

    @property
    def headers(self) -> list[NpyHeader]:
        """Each file's header (opened with ``headers="first"``: the first file's, relied on for every file and checked where each is read)."""
        t = self._table
        if t.header_id is None:
            return [t.headers[0][0]] * len(t) if len(t) else []
        entries = [h for h, _ in t.headers]
        return [entries[k] for k in t.header_id.tolist()]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Each file's output shape, after the ROI."""
        lay = self._table.layout()
        return _per_file(lay.shapes, lay.shape_id)

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
        ``None`` after a selection by list. Global sample ids (``npydask.ray``'s
        index column) start here.
        """
        return self._start

    @property
    def table(self) -> FileTable:
        """The files' facts as columns (:class:`~npydask.table.FileTable`)."""
        return self._table

    @property
    def views(self) -> FileViews:
        """The per-file array-likes the lazy arrays are built on: a read-only sequence making each on demand."""
        return FileViews(self._table, self._context)

    def __repr__(self) -> str:
        if not len(self):
            return "NpyDataset(0 files)"
        shapes = self._table.layout().shapes
        shown = str(shapes[0]) if len(shapes) == 1 else f"{len(shapes)} shapes, e.g. {shapes[0]}..{shapes[-1]}"
        first = self._shown(0)
        more = f" .. {self._shown(-1)}" if len(self) > 1 else ""
        return (
            f"NpyDataset({len(self)} files, dtype={_dtype_name(self.dtype)}, ndim={self.ndim}, "
            f"shape {shown}, {_human(self.nbytes)}, device={self._device!r}: {first}{more})"
        )

    def _with(self, table: FileTable, sharding: tuple[int, int] | None, start: int | None) -> NpyDataset:
        return NpyDataset(table, self._context, device=self._device, sharding=sharding, start=start)

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
        return wrap(view, resolve_chunks(chunks, view), device=self._device)

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
        try:
            import xarray  # noqa: F401  (npydask imports it only here)
        except ImportError as e:
            raise ImportError(
                "NpyDataset.to_xarray needs xarray, which is not installed: pip install 'npydask[xarray]'"
            ) from e
        from npydask.xarray import dataset_to_xarray

        return dataset_to_xarray(self, dims=dims, name=name)

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
        """This dataset as a ``ray.data.Dataset`` (extra ``ray``); see :func:`npydask.ray.read_npy`.

        Rows are files (after ROI), or with ``concatenate=True`` elements
        along ``axis`` of the joined files; read tasks follow npydask's
        grouping with ``block_size`` as the limit, and planning reads no payload.
        """
        from npydask.ray import dataset_to_ray

        options = dict(column=column, index_column=index_column, path_column=path_column, concatenate=concatenate,
                       axis=axis, block_size=block_size, override_num_blocks=override_num_blocks,
                       ray_remote_args=ray_remote_args)
        return dataset_to_ray(self, options)

    def _need_files(self, what: str) -> None:
        if not len(self):
            raise ValueError(f"cannot {what} an empty dataset")

    def _join(self, chunks: Any, lay: Layout, *, axis: int, stacked: bool) -> da.Array:
        views = self.views
        shapes = _per_file(lay.shapes, lay.shape_id)
        limit = chunk_limit("auto" if chunks is None else chunks)
        if limit is None:
            return self._join_explicit(chunks, shapes, axis=axis, stacked=stacked)
        sizes, fortran = lay.nbytes, lay.fortran
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

        from npydask.stacking import GroupPlan

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
        bounds, inner = [], []
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


_Layout = tuple[list[tuple[int, ...]], list[int], list[bool]]


def _per_file(shapes: tuple[tuple[int, ...], ...], shape_id: np.ndarray) -> list[tuple[int, ...]]:
    """Each file's shape from a :class:`~npydask.table.Layout` (one shape: one list repeat, no loop)."""
    if len(shapes) == 1:
        return [shapes[0]] * len(shape_id)
    return [shapes[k] for k in shape_id.tolist()]


def _layout(views: Sequence[NpyFileArray]) -> _Layout:
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
    return shapes, sizes, fortran


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
    table: FileTable, context: Context, device: str, sharding: tuple[int, int] | None = None, start: int | None = 0
) -> NpyDataset:
    return NpyDataset(table, context, device=device, sharding=sharding, start=start)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _gc_paused(fn: Callable[..., _T]) -> Callable[..., _T]:
    """``fn`` with Python's cyclic garbage collector paused while it runs (turned on again only if it was on).

    Opening a folder builds a few transient objects per file (paths, the
    scan's results and identities, before they become the table's
    columns), none in a cycle; every 700 new ones start a collection, which
    walks the ones still young, and every tenth of those a larger one.
    Measured with the table (100,000 files, warm): 0.80 s paused against
    1.19 s collecting with ``headers="all"``, 0.24 s against 0.28 s with
    ``"first"``. Another
    thread (or the caller) may have turned the collector off: it is then
    left as found.
    """

    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> _T:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return paused


@_gc_paused
def open_dataset(
    file_root: str | os.PathLike[str] | None = None,
    *,
    file_filter: str = "*.npy",
    file_list: str | os.PathLike[str] | None = None,
    files: Sequence[str | os.PathLike[str]] | None = None,
    recursive: bool = False,
    key: str | Sequence[str] | None = None,
    index: str | os.PathLike[str] | None = None,
    roi_start: Any = None,
    rel_roi_start: Any = None,
    roi_end: Any = None,
    rel_roi_end: Any = None,
    roi_shape: Any = None,
    rel_roi_shape: Any = None,
    roi_axes: Any = None,
    out_of_bounds_policy: str = "error",
    fill_value: Any = 0,
    shard_id: int = 0,
    num_shards: int = 1,
    device: str = "cpu",
    backend: str = "auto",
    headers: str = "all",
    sort: str = "bytes",
    storage_options: dict[str, Any] | None = None,
    **dali_only: Any,
) -> NpyDataset | MultiKeyDataset:
    """Open a dataset of ``.npy`` files with DALI ``fn.readers.numpy`` semantics.

    Returns an :class:`NpyDataset`, or a :class:`~npydask.multikey.MultiKeyDataset`
    when ``key`` is a list of ``.npz`` members.

    Parameters
    ----------
    file_root, file_filter, file_list, files, recursive
        Which files, in which order (see :mod:`npydask.discovery`). Relative
        paths are made absolute against the current working directory now
        (:mod:`npydask.paths`), so tasks read the same files on any worker.
        ``file_root`` may be an object-store prefix (``s3://bucket/prefix``,
        with or without the trailing ``/``), listed once; ``files`` and
        ``file_list`` may hold URLs of one store (``http(s)://`` servers
        have no listing: only these two work there).
    key : str or list of str, optional
        Member name inside ``.npz`` archives. A list of names makes each
        sample a dict of those members (a
        :class:`~npydask.multikey.MultiKeyDataset`): members may differ in
        dtype and shape, ROI arguments apply to each, and each archive's
        zip directory is read once for all of them (``index`` is not used).
    index : path or URL, optional
        A persistent header index (JSON, never pickle, see
        :mod:`npydask.index`), reused while files keep their identity (a
        local file's size, mtime and inode; an object's size and ETag) and
        refreshed for the others. Over a listed prefix, reusing it costs the
        LIST pages and no header request; over ``files``/``file_list`` URLs,
        one HEAD per object. For objects the index may itself be a URL
        (one GET to read, one PUT to write, with ``storage_options``).
    roi_start, rel_roi_start, roi_end, rel_roi_end, roi_shape, rel_roi_shape, roi_axes
        DALI's ROI arguments (see :mod:`npydask.roi`); a 2-D value gives one
        row per file of the whole list, before sharding.
    out_of_bounds_policy : {"error", "trim_to_shape", "pad"}
    fill_value : scalar
        Value of padded cells (``"pad"``).
    shard_id, num_shards : int
        Keep shard ``shard_id`` of ``num_shards`` (contiguous, as DALI).
    device : {"cpu", "gpu"}
    backend : {"auto", "mmap", "pread"}
        Object URLs take ``"auto"`` or ``"pread"`` (range requests).
    headers : {"all", "first"}, default ``"all"``
        ``"all"`` reads and checks every file's header now (one ``open``,
        ``fstat``, ``pread`` and ``close`` per local file; one GET per
        object). ``"first"`` reads only the first file's (of the shard) and
        gives every file that header: a folder is listed keeping each
        file's inode (``os.scandir`` gives it without a ``stat``) or each
        object's size and ETag (the LIST gives them), so opening costs the
        listing and one header; ``files``/``file_list`` cost one ``stat``
        per file (the whole identity) or one HEAD per object. Each task
        then compares each file's header bytes where it reads them (no
        extra read) and raises ``NpyFormatError`` naming the file, the
        header expected and the one found when they differ; a replaced
        file (another inode or ETag) raises ``FileChangedError``, a file
        too short for the payload ``NpyFormatError``. A rewrite in place
        that keeps a file's inode and header bytes is not seen in this
        mode (size and mtime are unknown). Not with ``index`` (which
        keeps per-file headers) nor ``key`` (``.npz`` members sit at a
        different offset in each archive).
    sort : {"bytes", "natural"}, default ``"bytes"``
        Order of discovered files (every discovery mode: flat, ``recursive``,
        object-store prefixes): DALI's byte-wise order (``slice_10`` before
        ``slice_2``), or ``"natural"``, runs of digits by value (``slice_2``
        before ``slice_10``; :func:`npydask.discovery.natural_key`).
        ``files`` and ``file_list`` keep their order either way.
    storage_options : dict, optional
        For an object-store ``file_root`` or URLs in ``files``/``file_list``:
        obstore's store and client options (see :func:`npydask.from_npy`).
    **dali_only
        Taken only to explain them: DALI reader arguments that live
        elsewhere in npydask (``random_shuffle``, ``stick_to_shard``,
        ``dont_use_mmap``, ...) raise a ``TypeError`` saying where
        (:data:`npydask.dali_args.DALI_ONLY`).

    Raises
    ------
    TypeError
        A DALI reader argument npydask has elsewhere, an unknown keyword, a ``key`` that is not a str or list of str.
    ValueError
        Bad ROI or shard arguments, no files, mixed dtypes or ndims, an unknown ``sort`` or
        ``headers``, ``headers="first"`` with ``index`` or ``key``, an empty ``key`` list or one
        naming a member twice.
    KeyError
        An archive without a ``key`` member (the message lists its members).
    NpyFormatError
        A file that is not a valid ``.npy`` file.
    OSError
        A file that cannot be opened (the builtin subclass, naming it).
    RoiError
        A ROI outside a file with ``out_of_bounds_policy="error"``, or ending before it starts.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for i in range(4): np.save(os.path.join(root, f"{i}.npy"), np.full((3, 5), i, "i2"))
    >>> ds = npydask.open_dataset(root, roi_start=[1, 1], roi_shape=[2, 3])
    >>> len(ds), ds.shapes[0], int(ds.stack().sum().compute())
    (4, (2, 3), 36)
    """
    refuse_dali_arguments(dali_only)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, found {backend!r}")
    check_device(device)
    first = check_headers(headers, index, key)
    keys = None
    if key is not None and not isinstance(key, str):
        from npydask.multikey import member_keys

        keys, key = member_keys(key), None
    (paths, listed), source = _select(
        file_root, file_filter, file_list, files, recursive, storage_options, sort, inodes=first
    )
    _check_key(key)
    roi_args = RoiArgs.from_user(
        roi_start=roi_start,
        rel_roi_start=rel_roi_start,
        roi_end=roi_end,
        rel_roi_end=rel_roi_end,
        roi_shape=roi_shape,
        rel_roi_shape=rel_roi_shape,
        roi_axes=roi_axes,
        out_of_bounds_policy=out_of_bounds_policy,
        fill_value=fill_value,
        n_files=len(paths),
    )
    picked = shard_range(len(paths), shard_id, num_shards)
    chosen = paths[picked.start : picked.stop]  # (a range of step 1)
    sharding = (shard_id, num_shards) if num_shards > 1 else None
    if keys is not None:  # several members: each archive's zip directory read once for all of them
        from npydask.multikey import MultiKeyDataset

        columns = scan_members_of(chosen, keys, source)
        origin = ("the header read when the dataset was opened", "open the dataset again", True)
        members: dict[str, NpyDataset] = {}
        shared: FileTable | None = None  # (the first member's names and identities, shared by the others)
        for k, column in zip(keys, columns):
            t = _table(picked, chosen, column, origin, roi_args, k, member=True)
            shared = t if shared is None else shared.with_entries(t.headers, t.header_id, t.rois, t.roi_id, t.deflated)
            members[k] = NpyDataset(shared, _context(backend, k, source), device=device, sharding=sharding,
                                    start=picked.start)
        return MultiKeyDataset(members)
    if first:
        identities = listed[picked.start : picked.stop] if listed is not None else source.identities(chosen)
        table = first_table(picked, chosen, identities, roi_args, source)
    else:
        table = _scanned_table(
            picked, chosen, None if listed is None else listed[picked.start : picked.stop], roi_args,
            key, source, index, storage_options,
        )
    if device == "gpu" and len(table):
        from npydask.gpu import check_gpu_dtype

        check_gpu_dtype(table.header(0).dtype, table.path(0))  # refused at open, not at the first read
    return NpyDataset(table, _context(backend, key, source), device=device, sharding=sharding, start=picked.start)


def _context(backend: str, key: str | None, source: Source) -> Context:
    """What every file of a dataset is read with (the source's default coalescing gap)."""
    return Context(read_options(gap_bytes=source.gap_bytes), backend, key, source)


def _scanned_table(
    picked: range,
    chosen: Sequence[str],
    listed: Sequence[Any] | None,
    roi_args: RoiArgs,
    key: str | None,
    source: Source,
    index: Any,
    storage_options: dict[str, Any] | None,
) -> FileTable:
    """``headers="all"``: every file's header, scanned or from the ``index`` (``listed``: the listing's identities)."""
    if index is not None and key is None:
        from npydask.index import scan_with_index

        index_path = fspath(index)
        shown = redact(index_path)
        scanned = scan_with_index(
            index_path,
            chosen,
            partial(scan_headers, source=source),
            source=source,
            identities=listed,
            storage_options=storage_options,
        )
        origin = (f"the header index {shown!r}",
                  f"the index is stale or was edited: delete {shown!r} and open the dataset again to rebuild it",
                  False)  # (an entry's header is the index's: each object's is compared where it is read)
    else:  # (.npz members are not indexed: their headers sit at offsets the index does not record)
        scanned = scan_headers(chosen, key=key, source=source)
        origin = ("the header read when the dataset was opened", "open the dataset again", True)
    return _table(picked, chosen, scanned, origin, roi_args, key)


def scan_members_of(paths: Sequence[str], keys: Sequence[str], source: Source) -> list[list[Scanned]]:
    """Per key, each path's scan of that ``.npz`` member (:meth:`Source.scan_members`); the first failure raised."""
    columns: list[list[Scanned]] = [[] for _ in keys]
    for result in source.scan_members(paths, keys):
        if isinstance(result, BaseException):
            raise result
        for column, scanned in zip(columns, result):
            column.append(scanned)
    return columns


def _table(
    picked: range,
    chosen: Sequence[str],
    scanned: Sequence[Scanned | BaseException],
    origin: tuple[str, str, bool],
    roi_args: RoiArgs,
    key: str | None,
    *,
    member: bool = False,
) -> FileTable:
    """The scanned files as a table: one dtype and ndim checked, ROIs resolved (``member``: errors name the member).

    Distinct headers (with their :class:`HeaderCheck`) and ROIs are numbered
    as the loop meets them; per file it keeps only the identity and two ids.
    """
    checks: dict[int, HeaderCheck] = {}  # per header object: the bytes every read site compares
    entries: dict[tuple[int, int], int] = {}  # per (header, check): its number in the table
    entry_table: list[tuple[NpyHeader, HeaderCheck]] = []
    identities: list[Any] = []
    header_id = array("i")
    roi_id = array("i")
    deflated = array("b")
    first: tuple[str, np.dtype, int] | None = None
    checked: NpyHeader | None = None  # headers are memoised objects: equal files share one
    shown_as = partial(_member_path, key) if member else _same
    with_roi = roi_args.has_roi or roi_args.out_of_bounds_policy != "error"
    rois: dict[tuple[tuple[int, ...], np.dtype], Any] = {}
    roi_numbers: dict[int, int] = {}  # per ROI object: its number in the table
    roi_table: list[Any] = []
    shared_roi = with_roi and not roi_args.per_file
    last: tuple[Any, Any, int] = (None, None, -1)  # (header, raw bytes, entry) of the previous file
    for global_i, path, result in zip(picked, chosen, scanned):
        if isinstance(result, BaseException):
            raise result
        identity, header, raw, compressed = result
        identities.append(identity)
        deflated.append(compressed)
        if header is last[0] and raw is last[1] and not with_roi:  # (the scan shares a bytes object per header text)
            header_id.append(last[2])
            continue
        check = checks.get(id(header))
        if check is None or (check.raw is not raw and check.raw != raw):
            check = checks[id(header)] = HeaderCheck(raw, *origin)
        if header is checked:
            pass
        elif first is None:
            first = (shown_as(path), header.dtype, header.ndim)
        elif header.dtype != first[1] or header.dtype.str != first[1].str:
            raise ValueError(
                f"all files of a dataset must share one dtype: {first[0]} holds {_dtype_name(first[1])} "
                f"but {shown_as(path)} holds {_dtype_name(header.dtype)}"
            )
        elif header.ndim != first[2]:
            raise ValueError(
                f"all files of a dataset must share one ndim: {first[0]} has {first[2]} dimensions "
                f"but {shown_as(path)} has {header.ndim} (shape {header.shape})"
            )
        checked = header
        entry = entries.setdefault((id(header), id(check)), len(entry_table))
        if entry == len(entry_table):
            entry_table.append((header, check))
        header_id.append(entry)
        last = (header, raw, entry)
        if with_roi:
            memo_key = (header.shape, header.dtype)
            if shared_roi and memo_key in rois:
                roi = rois[memo_key]  # the same arguments on the same shape resolve the same
            else:
                roi = cutting_roi(roi_args, header.shape, header.dtype, index=global_i, source=shown_as(path))
                if shared_roi:
                    rois[memo_key] = roi
            number = roi_numbers.setdefault(id(roi), len(roi_table))
            if number == len(roi_table):
                roi_table.append(roi)
            roi_id.append(number)
    return FileTable.from_rows(
        chosen, identities, entry_table, None if len(entry_table) <= 1 else header_id,
        roi_table or (None,), None if len(roi_table) <= 1 else roi_id,
        deflated=deflated if any(deflated) else None,
    )
