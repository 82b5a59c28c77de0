"""A Ray Data datasource over npydask datasets (extra ``ray``; Ray is imported lazily).

:func:`read_npy` opens a dataset with :func:`npydask.open_dataset` and turns
it into a ``ray.data.Dataset`` whose read tasks wrap npydask's own plan:

- Rows are samples. Without ``concatenate`` a row is one file (after its
  ROI); files are grouped into read tasks by :func:`npydask.plan.grouping.plan_groups`
  with ``block_size`` as the limit, so thousands of small files are a few
  tasks. With ``concatenate=True`` a row is one element along ``axis`` of the
  joined folder, and a large file is split across read tasks by byte range
  (Ray's own ``read_numpy`` reads each file whole, in one task).
- ``override_num_blocks`` wins over ``block_size``: the rows are cut into that
  many contiguous ranges (at most one per row). Either way the read tasks are
  the blocks: their count is passed to Ray as ``override_num_blocks``, so Ray
  does not cut them toward a parallelism of its own guessing.
- A read task carries only its own files' :class:`~npydask.array.NpyFileArray`
  views (path or URL, identity, header facts, ROI) and a box; it reads with
  :class:`~npydask.dataset.stacking.FileGroup`, as ``ds.stack()`` and
  ``ds.concatenate()`` do. Row counts, byte sizes and the schema come from the
  headers: planning (and ``ds.count()``) reads no payload.
- Blocks are Arrow tensor columns built from the C-contiguous block without a
  copy (a copy is made only for ``concatenate=True`` along an axis other than
  0, where rows are not contiguous in the block). The index column holds each
  row's position in the dataset, so order survives Ray's re-splitting of
  blocks.

Dtypes Arrow has no tensor type for (complex, structured or void, bytes ``S``,
longdouble, datetime64/timedelta64) are refused with a ``TypeError`` naming
the dtype and a view to use instead; ``device="gpu"`` is refused (blocks
live in host memory; move batches with ``iter_torch_batches(device=...)``).
"""

from __future__ import annotations

import bisect
import inspect
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.utils import parse_bytes

from npydask._keywords import suggest_keywords
from npydask.dataset.multikey import MultiKeyDataset
from npydask.dataset.npy_dataset import NpyDataset
from npydask.dataset.open import open_dataset
from npydask.dataset.stacking import FileGroup, joined_dtype
from npydask.dataset.views import view_layout
from npydask.errors import install_hint
from npydask.plan.grouping import RowRange, plan_row_ranges
from npydask.plan.region import Box
from npydask.ray._columns import check_arrow_dtype, column_type, ragged_column, tensor_column
from npydask.storage.urls import is_url, redact

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    import ray.data

    NpyDatasource: type  # made on first access by __getattr__ below (a ray.data Datasource subclass)

__all__ = ["NpyDatasource", "RowRange", "check_arrow_dtype", "dataset_to_ray", "plan_row_ranges", "read_npy"]

INSTALL = install_hint("ray")

# The keys of ray_remote_args that Ray 2.60's read_datasource takes as named parameters (the dict
# itself is deprecated there): passed by name, so only the others go through the dict.
_NAMED_REMOTE_ARGS = (
    "num_cpus",
    "num_gpus",
    "memory",
    "concurrency",
    "label_selector",
    "fallback_strategy",
    "max_calls",
    "resources",
    "accelerator_type",
    "runtime_env",
)


@suggest_keywords(also=lambda: open_dataset)
def read_npy(
    file_root: str | os.PathLike[str] | None = None,
    *,
    column: str = "data",
    index_column: str | None = "index",
    path_column: str | None = None,
    concatenate: bool = False,
    axis: int = 0,
    block_size: int | str = "128MiB",
    override_num_blocks: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
    **open_dataset_kwargs: Any,
) -> ray.data.Dataset:
    """A ``ray.data.Dataset`` of ``.npy`` files, planned by npydask.

    Parameters
    ----------
    file_root
        As :func:`npydask.open_dataset` (a folder, an object-store prefix, or
        ``None`` with ``files=``/``file_list=``), or one file (a local
        ``.npy``/``.npz`` file, or a URL ending in ``.npy`` or ``.npz``), read
        alone, as ``ray.data.read_numpy`` takes a file.
    column : str
        Name of the tensor column.
    index_column : str or None
        Name of the int64 column of each row's global sample id (``None``: no
        such column): its file's position in the list ``open_dataset``
        selected before sharding (:attr:`NpyDataset.start_index` onwards), so
        the shards of one folder never share an id; with ``concatenate=True``,
        the row's position in the joined array of this dataset.
    path_column : str or None
        Name of a string column of each row's file (``None``: none).
    concatenate : bool
        ``False``: one row per file (after ROI). ``True``: one row per element
        along ``axis`` of the files joined as ``ds.concatenate(axis)``; files
        are split across read tasks by byte range.
    axis : int
        The joining axis with ``concatenate=True``.
    block_size : int or str
        Bytes a read task aims at (``"128MiB"``), the ``limit`` of
        :func:`npydask.plan.grouping.plan_groups`.
    override_num_blocks : int, optional
        Exactly this many read tasks (fewer only when there are fewer rows);
        wins over ``block_size``.
    ray_remote_args : dict, optional
        Options of each read task (``num_cpus``, ``memory``, ``resources``,
        ``scheduling_strategy``, ...).
    **open_dataset_kwargs
        Everything :func:`npydask.open_dataset` takes: ``file_filter``,
        ``files``, ``key``, ROI arguments, ``shard_id``/``num_shards`` (DALI's
        static shards, cut before planning), ``storage_options``, ...

    Raises
    ------
    TypeError
        A dtype Arrow holds no tensors of (the message names a view to use).
    ValueError
        ``device="gpu"``, a bad axis or block size, or what ``open_dataset`` refuses.
    ImportError
        Ray Data is not installed.

    Examples
    --------
    >>> import numpy as np, npydask.ray.datasource, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for i in range(3): np.save(os.path.join(root, f"{i}.npy"), np.full((2, 2), i, "i4"))
    >>> ds = npydask.ray.datasource.read_npy(root)                     # doctest: +SKIP
    >>> ds.count(), ds.take(1)[0]["data"].tolist()           # doctest: +SKIP
    (3, [[0, 0], [0, 0]])
    """
    if open_dataset_kwargs.get("device", "cpu") != "cpu":
        raise ValueError(_gpu_refusal(open_dataset_kwargs["device"]))
    _require_ray()
    file_root, open_dataset_kwargs = _one_file(file_root, open_dataset_kwargs)
    return dataset_to_ray(
        open_dataset(file_root, **open_dataset_kwargs),
        column=column,
        index_column=index_column,
        path_column=path_column,
        concatenate=concatenate,
        axis=axis,
        block_size=block_size,
        override_num_blocks=override_num_blocks,
        ray_remote_args=ray_remote_args,
    )


def _one_file(file_root: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A ``file_root`` naming one file, as its folder and ``files=[name]``; anything else unchanged.

    A file is a local path to a regular file, or a URL (without a query
    string) whose last segment ends in ``.npy`` or ``.npz``.
    """
    if file_root is None:
        return file_root, kwargs
    path = os.fspath(file_root)
    if not isinstance(path, str):
        return file_root, kwargs
    if is_url(path):
        single = "?" not in path and path.rsplit("/", 1)[-1].endswith((".npy", ".npz"))
        folder, _, name = path.rpartition("/")
        folder += "/"
    else:
        single = os.path.isfile(path)
        folder, name = os.path.split(os.path.abspath(path))
    if not single:
        return file_root, kwargs
    if kwargs.get("files") is not None or kwargs.get("file_list") is not None:
        raise ValueError(
            f"read_npy: file_root {redact(path)!r} is a file, so it is the only one read; pass its folder as "
            "file_root to read files= or file_list= from it"
        )
    return folder, {**kwargs, "files": [name]}


def dataset_to_ray(
    ds: NpyDataset | MultiKeyDataset,
    *,
    column: str = "data",
    index_column: str | None = "index",
    path_column: str | None = None,
    concatenate: bool = False,
    axis: int = 0,
    block_size: int | str = "128MiB",
    override_num_blocks: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
) -> ray.data.Dataset:
    """``ds`` as a ``ray.data.Dataset``: what :meth:`NpyDataset.to_ray` and :func:`read_npy` call.

    The keywords are :func:`read_npy`'s other than ``open_dataset``'s.
    """
    ray_data = _require_ray()
    source = _datasource_class()(
        ds,
        column=column,
        index_column=index_column,
        path_column=path_column,
        concatenate=concatenate,
        axis=axis,
        block_size=block_size,
        override_num_blocks=override_num_blocks,
    )
    named, rest = _split_remote_args(ray_remote_args, ray_data.read_datasource)
    if rest:
        named["ray_remote_args"] = rest
    # Without override_num_blocks, Ray would split each task's block into pieces until it reaches the
    # parallelism it guesses (1 MiB blocks, hundreds of them); the plan's tasks are the blocks instead.
    blocks = override_num_blocks or len(source._plan.ranges) or None
    return ray_data.read_datasource(source, override_num_blocks=blocks, **named)


def _cluster_cpus() -> int | None:
    """The CPUs of the Ray cluster this process is connected to; ``None`` when it is not (yet)."""
    import ray

    if not ray.is_initialized():
        return None
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _require_ray() -> Any:
    try:
        import ray.data
    except ImportError as e:
        raise ImportError(f"npydask.ray.datasource needs Ray Data: {INSTALL} (or pip install 'ray[data]')") from e
    return ray.data


def _split_remote_args(args: dict[str, Any] | None, read_datasource: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``args`` split into those ``read_datasource`` takes by name and the rest (for its ``ray_remote_args``)."""
    if not args:
        return {}, {}
    takes = inspect.signature(read_datasource).parameters
    named = {k: v for k, v in args.items() if k in _NAMED_REMOTE_ARGS and k in takes}
    return named, {k: v for k, v in args.items() if k not in named}


def _gpu_refusal(device: Any) -> str:
    return (
        f"npydask.ray.datasource reads into host memory (Arrow blocks in Ray's object store), found device={device!r}: "
        "drop device= and move batches to the GPU with ds.iter_torch_batches(device='cuda')"
    )


# -- the datasource ----------------------------------------------------------------------------------


class _Plan:
    """What the datasource knows at planning: the views, the layout, the row ranges' builder. No payload."""

    def __init__(
        self,
        ds: NpyDataset,
        *,
        column: str,
        index_column: str | None,
        path_column: str | None,
        concatenate: bool,
        axis: int,
        block_size: int | str,
        override_num_blocks: int | None,
    ) -> None:
        views = ds.views
        names = [c for c in (column, index_column, path_column) if c is not None]
        if len(set(names)) != len(names):
            raise ValueError(f"column, index_column and path_column must differ, found {names!r}")
        if override_num_blocks is not None and (isinstance(override_num_blocks, bool) or override_num_blocks < 1):
            raise ValueError(f"override_num_blocks must be a positive integer, found {override_num_blocks!r}")
        limit = int(parse_bytes(block_size)) if isinstance(block_size, str) else block_size
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"block_size must be a positive byte count or a size like '128MiB', found {block_size!r}")
        if ds._device != "cpu":
            raise ValueError(_gpu_refusal(ds._device))
        shapes, sizes, fortran = view_layout(views)
        dtype = ds.dtype if views else np.dtype("f8")
        if views:
            check_arrow_dtype(dtype, ds.files[0])
        row_shape: tuple[int, ...] | None
        if concatenate and views:
            ndim = ds.ndim
            if not -ndim <= axis < ndim:
                raise ValueError(f"axis {axis} is out of range for arrays of {ndim} dimensions")
            axis %= ndim
            ds.concatenate(axis)  # (checks the extents agree; builds a graph of a few tasks, reads nothing)
            lengths = [s[axis] for s in shapes]
            row_shape = shapes[0][:axis] + shapes[0][axis + 1 :]
        else:
            axis = 0
            lengths = [1] * len(views)
            row_shape = shapes[0] if views and len(set(shapes)) == 1 else None
        self.views = views
        self.files = ds.files
        self.dtype = joined_dtype(dtype)
        self.column, self.index_column, self.path_column = column, index_column, path_column
        self.stacked = not concatenate
        self.axis = axis
        # Global sample ids: a shard's rows (files) count from its place in the whole list; rows of a
        # joined array count from 0 (the shard does not know the element counts before it).
        self.first_id = (ds.start_index or 0) if self.stacked else 0
        self.offsets = np.cumsum([0, *lengths]).tolist()
        self.row_shape = row_shape  # None: files of different shapes (variable-shaped tensors)
        self.row_ndim = len(shapes[0]) - (1 if concatenate else 0) if views else 0
        row_bytes = [sz // max(n, 1) for sz, n in zip(sizes, lengths)]
        self.row_bytes = max(row_bytes, default=0) + (8 if index_column else 0)
        self.ranges = plan_row_ranges(
            lengths,
            sizes,
            shapes,
            dtype,
            fortran,
            axis=axis,
            stacked=self.stacked,
            limit=limit,
            num_blocks=override_num_blocks,
            threads=_cluster_cpus(),
        )

    @property
    def total(self) -> int:
        return self.offsets[-1]

    def files_of(self, rows: RowRange) -> tuple[int, int]:
        """The files ``a..b`` that rows ``rows`` touch (files without rows at the ends left out)."""
        a = bisect.bisect_right(self.offsets, rows.start) - 1
        b = bisect.bisect_left(self.offsets, rows.stop)
        return a, b

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        fields = [(self.column, column_type(self.row_shape, self.dtype, self.row_ndim))]
        if self.index_column is not None:
            fields.append((self.index_column, pa.int64()))
        if self.path_column is not None:
            fields.append((self.path_column, pa.string()))
        return pa.schema(fields)

    def task(self, rows: RowRange) -> Read:
        """The read of ``rows``: only the files it touches, and the box of ``rows`` in their group."""
        a, b = self.files_of(rows)
        group = FileGroup(self.views[a:b], self.axis, self.stacked)
        lo, hi = rows.start - self.offsets[a], rows.stop - self.offsets[a]
        join = 0 if self.stacked else self.axis
        start = [0] * len(group.shape)
        stop = list(group.shape)
        start[join], stop[join] = lo, hi
        paths: tuple[str, ...] | tuple[tuple[str, int], ...] | None = None
        if self.path_column is not None:
            per_file = self.files[a:b]
            if self.stacked:
                paths = tuple(per_file[lo:hi])
            else:  # each row's file: the run lengths of the files over the rows
                offsets = self.offsets
                counts = [
                    max(0, min(hi, offsets[k + 1] - offsets[a]) - max(lo, offsets[k] - offsets[a])) for k in range(a, b)
                ]
                paths = tuple(zip(per_file, counts))
        return Read(
            group,
            Box(tuple(start), tuple(stop)),
            self.first_id + rows.start,
            self.column,
            self.index_column,
            self.path_column,
            paths,
            self.row_shape is None,
        )


@dataclass(frozen=True)
class Read:
    """One read task's work: a :class:`FileGroup` of its files, the box to read, and how to lay out the block.

    ``paths`` holds each row's file (stacking) or ``(file, rows)`` runs (joining).
    """

    group: FileGroup
    box: Box
    first_row: int
    column: str
    index_column: str | None
    path_column: str | None
    paths: tuple[Any, ...] | None
    ragged: bool

    @property
    def input_files(self) -> tuple[str, ...]:
        """The files this task reads."""
        return tuple(redact(v.ref.path) for v in self.group.views)  # (Ray lists them: no query string)

    def __call__(self) -> list[pa.Table]:
        import pyarrow as pa

        if self.ragged:  # files of different shapes: one array per row
            views = self.group.views[self.box.start[0] : self.box.stop[0]]
            rows = [v.read(Box((0,) * v.ndim, v.shape)).astype(self.group.dtype, copy=False) for v in views]
            data = ragged_column(rows)
            n = len(rows)
        else:
            block = self.group[tuple(slice(a, b) for a, b in zip(self.box.start, self.box.stop))]
            if not self.group.stacked and self.group.axis:
                block = np.moveaxis(block, self.group.axis, 0)
            block = np.ascontiguousarray(block)  # (a no-op for the C-contiguous blocks FileGroup reads)
            data = tensor_column(block)
            n = len(block)
        columns, names = [data], [self.column]
        if self.index_column is not None:
            columns.append(pa.array(np.arange(self.first_row, self.first_row + n, dtype=np.int64)))
            names.append(self.index_column)
        if self.path_column is not None:
            assert self.paths is not None  # (Plan.task gives the paths whenever it names a path column)
            if self.group.stacked:
                paths = list(self.paths)
            else:
                paths = [p for p, count in self.paths for _ in range(count)]
            columns.append(pa.array(paths, pa.string()))
            names.append(self.path_column)
        return [pa.Table.from_arrays(columns, names=names)]


class _MembersPlan:
    """A :class:`_Plan` per ``.npz`` member over the same row ranges: one tensor column per member.

    Rows are files (``concatenate=True`` is refused); the ranges follow the
    members' bytes together, so one task reads every member of its files
    (and opens each file once: the members share its descriptor).
    """

    def __init__(
        self,
        ds: MultiKeyDataset,
        *,
        column: str,
        index_column: str | None,
        path_column: str | None,
        concatenate: bool,
        axis: int,
        block_size: int | str,
        override_num_blocks: int | None,
    ) -> None:
        if concatenate:
            raise ValueError(
                f"concatenate=True joins the files of one array; the dataset's samples are dicts of members "
                f"{list(ds.keys)}: read them as rows (concatenate=False), or open one member (key='x') to join it"
            )
        if column != "data":
            raise ValueError(
                f"with key={list(ds.keys)!r} the tensor columns are named after the members; column={column!r} "
                "does not apply: leave it out"
            )
        names = [*ds.keys, *(c for c in (index_column, path_column) if c is not None)]
        if len(set(names)) != len(names):
            raise ValueError(
                f"the member columns {list(ds.keys)!r}, index_column and path_column must differ, found {names!r}: "
                "rename index_column= or path_column="
            )
        self.plans = [  # (the first member's plan carries the index and path columns)
            _Plan(
                d,
                column=k,
                index_column=index_column if j == 0 else None,
                path_column=path_column if j == 0 else None,
                concatenate=False,
                axis=0,
                block_size=block_size,
                override_num_blocks=override_num_blocks,
            )
            for j, (k, d) in enumerate(ds.members.items())
        ]
        first = self.plans[0]
        sizes = [sum(v) for v in zip(*(view_layout(p.views)[1] for p in self.plans))]
        shapes, _, fortran = view_layout(first.views)
        limit = int(parse_bytes(block_size)) if isinstance(block_size, str) else block_size
        self.ranges = plan_row_ranges(
            [1] * len(sizes),
            sizes,
            shapes,
            first.dtype,
            fortran,
            axis=0,
            stacked=True,
            limit=limit,
            num_blocks=override_num_blocks,
            threads=_cluster_cpus(),
        )
        self.total = first.total
        self.row_bytes = sum(p.row_bytes for p in self.plans)

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        schemas = [p.schema() for p in self.plans]
        return pa.schema([s.field(0) for s in schemas] + list(schemas[0])[1:])

    def task(self, rows: RowRange) -> MembersRead:
        """Each member's read of ``rows`` (the files' members share their descriptors in the task)."""
        return MembersRead(tuple(p.task(rows) for p in self.plans))


@dataclass(frozen=True)
class MembersRead:
    """One read task over several members: their tensor columns side by side, then the index and path columns."""

    reads: tuple[Read, ...]

    @property
    def input_files(self) -> tuple[str, ...]:
        return self.reads[0].input_files

    def __call__(self) -> list[pa.Table]:
        import pyarrow as pa

        tables = [read()[0] for read in self.reads]
        columns = [t.column(0) for t in tables] + tables[0].columns[1:]
        names = [t.column_names[0] for t in tables] + tables[0].column_names[1:]
        return [pa.Table.from_arrays(columns, names=names)]


def _read_tasks(plan: _Plan | _MembersPlan, per_task_row_limit: int | None) -> list[Any]:
    from ray.data.block import BlockMetadata
    from ray.data.datasource import ReadTask

    schema = plan.schema() if plan.ranges else None
    tasks = []
    for rows in plan.ranges:
        read = plan.task(rows)
        n = rows.stop - rows.start
        meta = BlockMetadata(
            num_rows=n, size_bytes=int(n * plan.row_bytes), input_files=read.input_files, exec_stats=None
        )
        tasks.append(ReadTask(read, meta, schema=schema, per_task_row_limit=per_task_row_limit))
    return tasks


def _make_class() -> type:
    """The datasource class, made on first use so that importing this module does not import Ray."""
    from ray.data.datasource import Datasource

    class NpyDatasource(Datasource):
        """A Ray Data ``Datasource`` over an :class:`~npydask.NpyDataset` (see :func:`read_npy`).

        Its read tasks are :class:`Read` objects over npydask's groups; it
        plans once, at construction, from the headers.
        """

        def __init__(self, ds: NpyDataset | MultiKeyDataset, **options: Any) -> None:
            super().__init__()
            self._plan = _MembersPlan(ds, **options) if isinstance(ds, MultiKeyDataset) else _Plan(ds, **options)

        def get_name(self) -> str:
            return "NpyDask"

        def estimate_inmemory_data_size(self) -> int:
            return int(self._plan.row_bytes * self._plan.total)

        def get_read_tasks(
            self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
        ) -> list[Any]:
            # (the plan follows block_size, or override_num_blocks, which Ray also passes as parallelism)
            return _read_tasks(self._plan, per_task_row_limit)

    NpyDatasource.__module__ = __name__
    NpyDatasource.__qualname__ = "NpyDatasource"  # (pickled by reference: this module's __getattr__ finds it)
    return NpyDatasource


_CLASS: list[type] = []


def _datasource_class() -> type:
    if not _CLASS:
        _CLASS.append(_make_class())
    return _CLASS[0]


def __getattr__(name: str) -> Any:
    """``NpyDatasource``, made on first access (Ray is imported then)."""
    if name == "NpyDatasource":
        return _datasource_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
