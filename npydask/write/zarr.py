"""Writing a dask array to a zarr v3 array, one task per shard-aligned chunk.

The rule that makes parallel zarr writes safe: **a dask chunk must cover whole
zarr shards** (whole chunks where there are no shards). A zarr write of part of
a shard is a read-modify-write of the whole shard object, so two tasks writing
different parts of one shard race and silently lose one another's data
(dask#12583, zarr-python#3514). Aligning to the inner chunks is not enough.

:func:`plan_zarr_layout` is pure (no zarr, no graph): it decides the zarr
chunks and shards and the dask chunks to write with. :func:`to_zarr` is the
thin shell: it checks the dtype, creates the array (metadata) at call time,
rechunks when the plan says so and maps one write task over the blocks, plus
a last step checking every block reported back. It uses only ``map_blocks``
and ``dask.delayed``, so it works with dask's array query planning on and off.

Layout rules (``W`` is the write unit: the shard shape, else the chunk shape):

1. Neither ``chunks`` nor ``shards`` given: the zarr chunks come from the dask
   grid, unsharded. A regular axis (equal chunks, a smaller last one) gives
   its chunk size and is written as is. An irregular axis keeps its chunks
   when their greatest common divisor ``g`` is at least half the largest chunk
   (zarr chunks of ``g``: every dask chunk covers whole zarr chunks, no data
   moves); otherwise it is rechunked to a regular grid of its largest chunk.
   Shards cannot spare that rechunk: a shard grid aligned to irregular
   boundaries must divide all of them, which for typical irregular chunks
   (``(3, 5, 2)``) is a shard of one element.
2. ``shards="auto"``: shards come from the dask grid as in rule 1 (not from
   zarr's own heuristic, which may pick shards far larger than the dask
   chunks and force a rechunk to huge chunks); inner chunks are the user's
   ``chunks`` (the shard is rounded up to a multiple of them) or divisors of
   the shard near 1 MiB.
3. ``shards`` given (with ``chunks``, or with inner chunks near 1 MiB chosen
   as divisors of the shard), or ``chunks`` given without shards: ``W`` is
   fixed. An axis whose dask chunks already cover whole units is kept; any
   other is rechunked to a regular grid of the multiple of ``W`` nearest its
   largest chunk (at least ``W``), so tasks stay near their original size. The
   last chunk may end at the array's edge mid-unit.

Examples
--------
>>> lay = plan_zarr_layout((10, 6), ((3, 5, 2), (6,)), 8)
>>> lay.chunks, lay.shards, lay.dask_chunks
((5, 6), None, ((5, 5), (6,)))
>>> plan_zarr_layout((100,), ((30, 30, 30, 10),), 4, shards=(20,), chunks=(5,)).dask_chunks
((40, 40, 20),)
"""

from __future__ import annotations

import math
import os
import pickle
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np

from npydask._keywords import suggest_keywords
from npydask.write.zarr_store import INSTALL_HINT, object_store, require_zarr, where_to

__all__ = ["INSTALL_HINT", "ZarrLayout", "check_zarr_dtype", "covers_whole_units", "plan_zarr_layout", "to_zarr"]

#: Inner chunks picked inside a given shard aim at this many bytes (zarr's own target with shards).
INNER_CHUNK_BYTES = 1 << 20

Chunks = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ZarrLayout:
    """How an array is laid out in zarr and in the dask tasks that write it.

    Attributes
    ----------
    shape : tuple of int
        The array's shape.
    chunks : tuple of int
        The zarr (inner) chunk shape.
    shards : tuple of int or None
        The zarr shard shape, a multiple of ``chunks``; ``None`` for no sharding.
    dask_chunks : tuple of tuple of int
        The dask chunks to write with; each covers whole write units.
    rechunk : bool
        Whether ``dask_chunks`` differ from the array's chunks.
    """

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None
    dask_chunks: Chunks
    rechunk: bool

    @property
    def write_unit(self) -> tuple[int, ...]:
        """The smallest region one task may write alone: the shard, else the chunk."""
        return self.chunks if self.shards is None else self.shards


def covers_whole_units(sizes: Sequence[int], unit: int, extent: int) -> bool:
    """Whether chunks of ``sizes`` along an axis of ``extent`` start and end on multiples of ``unit``.

    The last chunk may end at ``extent`` mid-unit (the array's edge).

    Examples
    --------
    >>> covers_whole_units((8, 16, 5), 8, 29), covers_whole_units((8, 12, 9), 8, 29)
    (True, False)
    """
    stop = 0
    for size in sizes:
        stop += size
        if stop % unit and stop != extent:
            return False
    return True


def _regular(extent: int, size: int) -> tuple[int, ...]:
    """``extent`` cut into pieces of ``size``, the last one shorter."""
    if extent == 0:
        return (0,)
    full, rest = divmod(extent, size)
    return (size,) * full + ((rest,) if rest else ())


def _is_regular(sizes: tuple[int, ...]) -> bool:
    return all(s == sizes[0] for s in sizes[:-1]) and sizes[-1] <= sizes[0]


def _grid_unit(sizes: tuple[int, ...]) -> int:
    """The zarr chunk size rule 1 derives from one axis of dask chunks."""
    if _is_regular(sizes):
        return max(1, sizes[0])
    largest = max(sizes)
    g = math.gcd(*sizes[:-1])
    return g if 2 * g >= largest else largest


def _align(sizes: tuple[int, ...], unit: int, extent: int) -> tuple[int, ...]:
    """Keep ``sizes`` if they cover whole units, else a regular grid of the multiple nearest the largest."""
    if covers_whole_units(sizes, unit, extent):
        return sizes
    multiple = max(1, (2 * max(sizes) + unit) // (2 * unit))  # round half up
    return _regular(extent, multiple * unit)


def _inner_chunks(shard: tuple[int, ...], itemsize: int, target: int = INNER_CHUNK_BYTES) -> tuple[int, ...]:
    """Divisors of ``shard`` per axis whose product is near ``target`` bytes (at most, where it can).

    The longest axis is divided by its smallest prime factor until the chunk fits.

    Examples
    --------
    >>> _inner_chunks((1024, 1024), 4)
    (512, 512)
    """
    inner = list(shard)
    while math.prod(inner) * max(itemsize, 1) > target:
        axis = max((a for a in range(len(inner)) if inner[a] > 1), key=lambda a: inner[a], default=None)
        if axis is None:
            break
        n = inner[axis]
        factor = next((p for p in range(2, math.isqrt(n) + 1) if n % p == 0), n)
        inner[axis] = n // factor
    return tuple(inner)


def _shape_arg(value: Any, ndim: int, name: str) -> tuple[int, ...]:
    """An int or a sequence of positive ints, one per axis."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        value = (int(value),) * ndim
    out = tuple(value) if isinstance(value, Sequence | np.ndarray) else ()
    if len(out) != ndim or not all(isinstance(v, int | np.integer) and not isinstance(v, bool) and v > 0 for v in out):
        raise ValueError(f"{name} must be a tuple of {ndim} positive ints (one per axis), found {value!r}")
    return tuple(int(v) for v in out)


def plan_zarr_layout(
    shape: Sequence[int], dask_chunks: Sequence[Sequence[int]], itemsize: int, chunks: Any = None, shards: Any = None
) -> ZarrLayout:
    """Decide zarr chunks and shards, and dask chunks that each cover whole shards.

    Pure: needs neither zarr nor a dask graph. See the module docstring for
    the rules and why they were chosen.

    Parameters
    ----------
    shape : sequence of int
        The array's shape.
    dask_chunks : sequence of sequence of int
        The dask array's ``chunks`` (known sizes).
    itemsize : int
        Bytes per element (sizes the inner chunks picked inside shards).
    chunks : int, tuple of int, "auto" or None
        The zarr chunk shape; ``None`` or ``"auto"`` derive it (rules 1 and 2).
    shards : int, tuple of int, dict with "shape", "auto" or None
        The zarr shard shape; ``"auto"`` derives it from the dask grid.

    Returns
    -------
    ZarrLayout

    Raises
    ------
    ValueError
        Unknown (NaN) dask chunk sizes, chunks that do not add up to ``shape``,
        malformed ``chunks``/``shards``, or shards that are no multiple of chunks.

    Examples
    --------
    >>> plan_zarr_layout((64, 64), ((16,) * 4, (64,)), 4).chunks
    (16, 64)
    >>> lay = plan_zarr_layout((64, 64), ((10,) * 6 + (4,), (64,)), 4, shards=(16, 64), chunks=(4, 64))
    >>> lay.dask_chunks[0], lay.write_unit
    ((16, 16, 16, 16), (16, 64))
    """
    shape = tuple(int(n) for n in shape)
    ndim = len(shape)
    sizes_in = tuple(tuple(c) for c in dask_chunks)
    if len(sizes_in) != ndim:
        raise ValueError(f"dask_chunks must have one entry per axis ({ndim}), found {len(sizes_in)}: {dask_chunks!r}")
    for axis, (sizes, n) in enumerate(zip(sizes_in, shape)):
        if any(isinstance(s, float) and math.isnan(s) for s in sizes):
            raise ValueError(
                f"axis {axis} has unknown (NaN) chunk sizes {sizes!r}; zarr needs known sizes: "
                "call x.compute_chunk_sizes() first"
            )
        if sum(sizes) != n or not sizes:
            raise ValueError(f"dask chunks {sizes!r} of axis {axis} do not add up to its extent {n}")
    sizes_in = tuple(tuple(int(s) for s in sizes) for sizes in sizes_in)

    if isinstance(chunks, str) and chunks != "auto":
        raise ValueError(f"chunks must be a tuple of ints, 'auto' or None, found {chunks!r}")
    user_chunks = None if chunks is None or chunks == "auto" else _shape_arg(chunks, ndim, "chunks")
    if isinstance(shards, dict):
        if "shape" not in shards:
            raise ValueError(f"a shards dict needs a 'shape' entry (zarr's ShardsConfigParam), found {shards!r}")
        shards = shards["shape"]
    if isinstance(shards, str) and shards != "auto":
        raise ValueError(f"shards must be a tuple of ints, 'auto' or None, found {shards!r}")

    grid = tuple(_grid_unit(sizes) for sizes in sizes_in)
    if shards is None:
        zchunks, zshards = (grid if user_chunks is None else user_chunks), None
        unit = zchunks
    else:
        if shards == "auto":
            zshards = grid
            if user_chunks is not None:  # round each shard up to whole inner chunks
                zshards = tuple(-(-s // c) * c for s, c in zip(zshards, user_chunks))
        else:
            zshards = _shape_arg(shards, ndim, "shards")
        zchunks = _inner_chunks(zshards, itemsize) if user_chunks is None else user_chunks
        bad = [a for a in range(ndim) if zshards[a] % zchunks[a]]
        if bad:
            raise ValueError(
                f"shards {zshards} must be a multiple of chunks {zchunks} on every axis "
                f"(zarr's sharding codec splits a shard into whole chunks); axis {bad[0]} is not: "
                "pick shards that are multiples of the chunks"
            )
        unit = zshards
    aligned = tuple(_align(sizes, u, n) for sizes, u, n in zip(sizes_in, unit, shape))
    return ZarrLayout(shape, zchunks, zshards, aligned, aligned != sizes_in)


def check_zarr_dtype(dtype: Any) -> np.dtype:
    """Refuse a dtype zarr v3 cannot store exactly; return it as a numpy dtype.

    Refused (``TypeError``): object dtypes, dtypes the installed zarr has no
    v3 data type for (``longdouble``, ``clongdouble``) and dtypes zarr would
    store as another dtype (structured fields with subarrays) or read back as
    other values (structured fields in non-native byte order). Fixed-width
    bytes, unicode, void and structured dtypes pass: zarr stores them and warns
    (``UnstableSpecificationWarning``) that their v3 encoding is not yet
    standardised.

    Examples
    --------
    >>> check_zarr_dtype(object)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: to_zarr cannot write dtype dtype('O'): zarr v3 has no fixed encoding for Python objects; ...
    """
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(
            f"to_zarr cannot write dtype {dtype!r}: zarr v3 has no fixed encoding for Python objects; "
            "convert first, e.g. x.astype('U16') for strings or a numeric dtype"
        )
    zarr = require_zarr()
    if dtype.names is not None and dtype.newbyteorder("=") != dtype:
        raise TypeError(
            f"to_zarr cannot write dtype {dtype!r}: zarr {zarr.__version__} drops the byte order of "
            "structured fields, so non-native fields would read back as other values; convert first "
            "with x.astype(x.dtype.newbyteorder('='))"
        )
    parse = getattr(getattr(zarr, "dtype", None), "parse_dtype", None)
    if parse is None:  # zarr 3.0: no data type registry to ask
        if dtype.kind in "fc" and dtype.itemsize > 8 * (1 + (dtype.kind == "c")):
            raise TypeError(f"to_zarr cannot write dtype {dtype!r}: zarr v3 has no {dtype.name}; convert first")
        return dtype
    try:
        native = parse(dtype, zarr_format=3).to_native_dtype()
    except Exception as e:
        raise TypeError(
            f"to_zarr cannot write dtype {dtype!r}: zarr {zarr.__version__} has no zarr v3 data type for it "
            f"({e}); convert first, e.g. x.astype('f8') for longdouble or x.astype('c16') for clongdouble"
        ) from e
    if native != dtype:
        raise TypeError(
            f"to_zarr cannot write dtype {dtype!r} exactly: zarr {zarr.__version__} would store it as "
            f"{native!r}; convert first (for subarray fields, split them into plain fields or arrays)"
        )
    return dtype


# ---------------------------------------------------------------------------------------------
# The thin shell: a picklable reference to the store, the write task, to_zarr.

#: Stores that cannot leave this process (in-memory, zip), by key, for tasks run in this process.
_LOCAL_STORES: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


class StoreRef:
    """What a write task carries to reopen the zarr array: the store and the array's path in it.

    A store that pickles to an independent copy (a ``MemoryStore``), one file that
    many processes must not open for writing (a ``ZipStore``) or no picklable
    store pickles to its key only; a task in another process then fails saying
    what to do, instead of writing into a copy that is thrown away.
    """

    __slots__ = ("desc", "key", "local", "path", "pid", "store")

    def __init__(self, store: Any, path: str, key: str, pid: int, desc: str, local: bool) -> None:
        self.store, self.path, self.key, self.pid, self.desc, self.local = store, path, key, pid, desc, local

    @classmethod
    def create(cls, store: Any, path: str) -> StoreRef:
        """A reference to ``store``; an in-memory, zip or unpicklable one is registered in this process."""
        from zarr.storage import MemoryStore, ZipStore

        local = isinstance(store, MemoryStore | ZipStore)
        if not local:
            try:
                pickle.dumps(store)
            except Exception:
                local = True
        ref = cls(store, path, uuid.uuid4().hex, os.getpid(), repr(store), local)
        if local:
            _LOCAL_STORES[ref.key] = store
        return ref

    def __dask_tokenize__(self) -> Any:
        return ("npydask.zarr-store", self.key)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.local:
            return (_local_store_ref, (self.path, self.key, self.pid, self.desc))
        return (StoreRef, (self.store, self.path, self.key, self.pid, self.desc, False))

    def open(self) -> Any:
        """The zarr array, opened for writing."""
        if self.store is None:
            raise RuntimeError(
                f"to_zarr: the store {self.desc} can only be written from process {self.pid} (in-memory and "
                f"zip stores are not shared), found a task in process {os.getpid()}; write to a path or "
                "zarr.storage.LocalStore on a file system the workers share, or compute with scheduler='threads'"
            )
        import zarr

        return zarr.open_array(self.store, path=self.path, mode="r+", zarr_format=3)


def _local_store_ref(path: str, key: str, pid: int, desc: str) -> StoreRef:
    store = _LOCAL_STORES.get(key) if pid == os.getpid() else None
    return StoreRef(store, path, key, pid, desc, True)


def _write_block(
    block: np.ndarray, target: StoreRef, unit: tuple[int, ...], block_info: dict[Any, Any] | None = None
) -> np.ndarray:
    """Write one dask block into its region of the zarr array; return a one-element marker."""
    if block_info is None:
        raise RuntimeError("to_zarr: dask passed no block_info to the write task; please report this")
    location = block_info[0]["array-location"]
    shape = block_info[0]["shape"]
    for axis, ((start, stop), u, n) in enumerate(zip(location, unit, shape)):
        if start % u or (stop % u and stop != n):
            raise RuntimeError(
                f"to_zarr: block {location} is not aligned to the write unit {unit} on axis {axis}; "
                "writing it would race with another task over one shard. Please report this as a bug."
            )
    region = tuple(slice(start, stop) for start, stop in location)
    to_host = getattr(block, "get", None)
    if type(block).__module__.startswith("cupy") and callable(to_host):
        block = to_host()  # a CuPy block (device="gpu") goes to the host store through the host
    target.open()[region] = block
    return np.ones((1,) * block.ndim, dtype=np.int64)


def _finish(written: np.ndarray, expected: int) -> None:
    """The last step: every block reported its write."""
    count = int(np.asarray(written).sum())
    if count != expected:
        raise RuntimeError(f"to_zarr: expected {expected} blocks to be written, {count} reported back")


def _zarr_store(store: Any, storage_options: dict[str, Any] | None, zarr_kwargs: dict[str, Any]) -> Any:
    """The store to give zarr: an absolute local path, npydask's store rooted at an object URL, or ``store``.

    ``storage_options`` for other URLs go to zarr in ``zarr_kwargs``. (The
    same places as :func:`npydask.zarr_store`'s, built by the same
    :func:`~npydask.write.zarr_store.object_store`.)
    """
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    if not isinstance(store, str):
        return store
    where = where_to(store, storage_options)
    if where is None:  # (a URL for fsspec, through zarr)
        if storage_options is not None:
            zarr_kwargs["storage_options"] = storage_options
        return store
    return where.path if where.local else object_store(where.path, storage_options)


@suggest_keywords(also=lambda: require_zarr().create_array)
def to_zarr(
    x: Any, store: Any, *, compute: bool = True, storage_options: dict[str, Any] | None = None, **zarr_kwargs: Any
) -> Any:
    """Write ``x`` to a zarr v3 array, each task writing whole shards.

    Parameters
    ----------
    x : dask.array.Array or array-like
        The data; anything else goes through ``dask.array.asarray``.
    store : str, os.PathLike or zarr store
        What ``zarr.create_array`` takes: a path, a ``zarr.storage.LocalStore``,
        a ``MemoryStore`` or ``ZipStore`` (in-process schedulers only), an fsspec URL, ...
        A relative local path is made absolute now, so every worker writes there.
        An object-store URL (``s3://bucket/path/a.zarr``, ``gs://``, ``az://``)
        is written through npydask's own obstore store (wrapped in
        ``zarr.storage.ObjectStore``) with ``storage_options``; other URLs
        (``memory://``, ...) go to zarr as they are.
    compute : bool
        Write now (``True``) or return a lazy ``dask.delayed.Delayed``.
    storage_options : dict, optional
        For an object-store URL, the same options as for reading it
        (``endpoint``, ``region``, credentials, ...); for other URLs, passed
        to zarr (fsspec's options).
    **zarr_kwargs
        Passed to ``zarr.create_array``: ``chunks``, ``shards``, ``compressors``,
        ``fill_value``, ``overwrite``, ``name``, ``attributes``, ... ``shape``,
        ``dtype`` and ``data`` come from ``x``; ``zarr_format`` may only be 3.
        Without ``chunks`` and ``shards`` the zarr chunks follow the dask chunks.

    Returns
    -------
    None or dask.delayed.Delayed
        ``None`` once written; the lazy write with ``compute=False``.

    Raises
    ------
    ImportError
        zarr>=3.0 is not installed (``pip install 'npydask[zarr]'``).
    TypeError
        A dtype zarr v3 cannot store exactly, or ``shape``/``dtype``/``data`` given.
    ValueError
        ``zarr_format`` other than 3, unknown chunk sizes, bad ``chunks``/``shards``.

    Notes
    -----
    The array (its metadata) is created at call time, so an existing array is
    refused then unless ``overwrite=True``. Dask chunks are rechunked where
    needed so every task writes whole shards (whole chunks without sharding):
    two tasks writing parts of one shard would race and lose data. Tasks carry
    the store (or its path) and reopen the array; they never carry data.

    Examples
    --------
    Chunks of 3 straddle shards of 6, so they are written as chunks of 6:

    >>> plan_zarr_layout((10,), ((3, 3, 3, 1),), 8, shards=(6,), chunks=(2,)).dask_chunks
    ((6, 4),)
    >>> import numpy as np, dask.array as da, tempfile, os, zarr  # doctest: +SKIP
    >>> path = os.path.join(tempfile.mkdtemp(), "a.zarr")  # doctest: +SKIP
    >>> to_zarr(da.arange(10, chunks=3), path, shards=(6,), chunks=(2,))  # doctest: +SKIP
    >>> zarr.open_array(path).shards, int(zarr.open_array(path)[:].sum())  # doctest: +SKIP
    ((6,), 45)
    """
    zarr = require_zarr()
    if not isinstance(x, da.Array):
        x = da.asarray(x)
    given = [k for k in ("shape", "dtype", "data") if k in zarr_kwargs]
    if given:
        raise TypeError(
            f"to_zarr takes shape, dtype and data from x; found {', '.join(given)} in zarr_kwargs: "
            "drop them (use x.astype(...) to change the dtype)"
        )
    fmt = zarr_kwargs.pop("zarr_format", 3)
    if fmt != 3:
        raise ValueError(f"to_zarr writes zarr v3 only: expected zarr_format=3, found {fmt!r}")
    if any(math.isnan(s) for sizes in x.chunks for s in sizes):
        raise ValueError(f"x has unknown chunk sizes {x.chunks}; call x.compute_chunk_sizes() before to_zarr")
    dtype = check_zarr_dtype(x.dtype)
    chunks = zarr_kwargs.pop("chunks", None)
    shards = zarr_kwargs.pop("shards", None)
    layout = plan_zarr_layout(x.shape, x.chunks, dtype.itemsize, chunks=chunks, shards=shards)
    shards_arg: Any = layout.shards
    if isinstance(shards, dict) and layout.shards is not None:
        shards_arg = {**shards, "shape": layout.shards}
    store = _zarr_store(store, storage_options, zarr_kwargs)
    z = zarr.create_array(
        store, shape=x.shape, dtype=dtype, chunks=layout.chunks, shards=shards_arg, zarr_format=3, **zarr_kwargs
    )
    if (tuple(z.chunks), z.shards and tuple(z.shards)) != (layout.chunks, layout.shards):
        raise RuntimeError(
            f"to_zarr: zarr created chunks {z.chunks} and shards {z.shards}, expected {layout.chunks} and "
            f"{layout.shards}; please report this with your zarr version ({zarr.__version__})"
        )
    if layout.rechunk:
        x = x.rechunk(layout.dask_chunks)
    target = StoreRef.create(z.store, z.path)
    markers = tuple((1,) * len(sizes) for sizes in x.chunks)
    meta = np.empty((0,) * x.ndim, dtype=np.int64)
    written = da.map_blocks(
        _write_block, x, target=target, unit=layout.write_unit, chunks=markers, dtype=np.int64, meta=meta
    )
    done = dask.delayed(_finish, pure=False)(written, math.prod(x.numblocks))
    if not compute:
        return done
    done.compute()
    return None
