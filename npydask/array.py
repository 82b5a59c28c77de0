"""Lazy dask arrays over ``.npy`` files: one graph layer of tiny read tasks.

:func:`from_npy` puts a :class:`NpyFileArray` (a tiny array-like holding a
:class:`~npydask.reader.FileRef`) into every task of a one-layer graph that
:func:`npydask.graph.build.chunk_array` builds directly, the graph
``dask.array.from_array(..., inline_array=True)`` would build, without its
cost: each task is ``getter(NpyFileArray, slices)`` and reads exactly its
chunk's bytes on whichever worker runs it. The array-like carries no data; its
token is (path, size, mtime, inode, header, settings), which makes ``x.name``
deterministic, and the same under both of dask's array engines.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import re
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.array.core import normalize_chunks
from dask.utils import parse_bytes

from npydask._keywords import suggest_keywords
from npydask._buffers import empty
from npydask.graph.build import chunk_array
from npydask.reader import BACKENDS, FileRef
from npydask._buffers import raw
from npydask.plan.region import Box
from npydask.plan.roi import FileRoi, fill_like
from npydask.storage.local import LOCAL
from npydask.storage.urls import redact
from npydask.storage.where import fspath, resolve

__all__ = ["NpyFileArray", "auto_chunks", "drop_empty_chunks", "from_npy", "regular_grid"]

DEVICES = ("cpu", "gpu")

_GLOB_MAGIC = re.compile(r"[*?[]")  # (what glob.has_magic looks for)


class NpyFileArray:
    """An array-like view of one ``.npy`` file (optionally cut to a ROI) for ``from_array``.

    Supports basic indexing (integers, slices with any step, ``Ellipsis``);
    each access reads only the bytes of the box it covers, and fills the
    cells a ``"pad"`` ROI puts outside the file.
    """

    __slots__ = ("ref", "roi")

    def __init__(self, ref: FileRef, roi: FileRoi | None = None) -> None:
        self.ref = ref
        self.roi = roi

    @property
    def shape(self) -> tuple[int, ...]:
        return self.ref.header.shape if self.roi is None else self.roi.shape

    @property
    def dtype(self) -> np.dtype:
        return self.ref.header.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"NpyFileArray({redact(self.ref.path)!r}, shape={self.shape}, dtype={self.dtype.str})"

    def __dask_tokenize__(self) -> Any:
        roi = self.roi
        return ("npydask.NpyFileArray", self.ref.token, None if roi is None else repr(roi))

    def __reduce__(self) -> tuple[Any, ...]:
        return (NpyFileArray, (self.ref, self.roi))

    def __getitem__(self, index: Any) -> np.ndarray:
        box, post = split_index(index, self.shape)
        block = self.read(box)
        return block[post] if post else block

    def file_box(self, box: Box) -> tuple[Box, Box]:
        """``box`` (in this view's output coordinates) in the file's coordinates, and its part inside the file.

        The two are equal unless a ``"pad"`` ROI reaches outside the file.
        """
        roi = self.roi
        if roi is None:
            return box, box
        shape = self.ref.header.shape
        lo = tuple(a + s for a, s in zip(box.start, roi.start))
        hi = tuple(b + s for b, s in zip(box.stop, roi.start))
        inside_lo = tuple(min(max(a, 0), n) for a, n in zip(lo, shape))
        inside_hi = tuple(max(min(b, n), a) for b, n, a in zip(hi, shape, inside_lo))
        return Box(lo, hi), Box(inside_lo, inside_hi)

    def read(self, box: Box, out: np.ndarray | None = None) -> np.ndarray:
        """Read ``box`` (in this view's output coordinates) into ``out`` or a new array."""
        if self.roi is None:
            return self.ref.read(box, out)
        wanted, inner = self.file_box(box)
        if inner == wanted:
            return self.ref.read(wanted, out)
        out = fill_like(empty(box.shape, self.dtype) if out is None else out, self.roi)
        if inner.size:
            where = tuple(slice(a - s, b - s) for a, b, s in zip(inner.start, inner.stop, wanted.start))
            raw(out)[where] = raw(self.ref.read(inner))  # every byte, structured padding included
        else:  # all padding: the file is still checked (a header relied on may not be its own)
            self.ref.verify()
        return out


def split_index(index: Any, shape: tuple[int, ...]) -> tuple[Box, tuple[Any, ...]]:
    """Split a basic index into the box it covers and the in-memory index that finishes it.

    Returns ``(box, post)`` with ``numpy_array[index] == read(box)[post]``;
    ``post`` is empty when the box is the answer.
    """
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        at = next(k for k, i in enumerate(index) if i is Ellipsis)
        fill = (slice(None),) * (len(shape) - len(index) + 1)
        index = index[:at] + fill + index[at + 1 :]
    if len(index) > len(shape):
        raise IndexError(f"too many indices: {len(index)} for an array of {len(shape)} dimensions")
    index = index + (slice(None),) * (len(shape) - len(index))
    start, stop, post, trivial = [], [], [], True
    for axis, (i, n) in enumerate(zip(index, shape)):
        if isinstance(i, slice):
            a, b, step = i.indices(n)
            count = len(range(a, b, step))
            if count == 0:
                start.append(0)
                stop.append(0)
                post.append(slice(None))
            elif step > 0:
                start.append(a)
                stop.append(a + (count - 1) * step + 1)
                post.append(slice(None, None, step))
                trivial &= step == 1
            else:
                start.append(a + (count - 1) * step)
                stop.append(a + 1)
                post.append(slice(None, None, step))
                trivial = False
        elif hasattr(i, "__index__") and not isinstance(i, bool | np.bool_):
            k = i.__index__()
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {axis} with size {n}")
            k %= n
            start.append(k)
            stop.append(k + 1)
            post.append(0)
            trivial = False
        else:
            raise IndexError(f"npydask arrays take integers, slices and Ellipsis only, found {i!r}")
    return Box(tuple(start), tuple(stop)), (() if trivial else tuple(post))


def auto_chunks(shape: tuple[int, ...], dtype: np.dtype, fortran_order: bool, limit: int) -> tuple[int, ...]:
    """A chunk shape of at most ``limit`` bytes whose chunks are contiguous in the file.

    Axes are kept whole from the fastest-varying file axis outwards; the first
    axis that no longer fits is split into balanced pieces and slower axes
    get chunks of one.

    Examples
    --------
    >>> auto_chunks((64, 256, 256), np.dtype("f4"), False, 1 << 20)
    (4, 256, 256)
    >>> auto_chunks((300, 1000), np.dtype("f8"), True, 800_000)
    (300, 250)
    """
    if 0 in shape or dtype.itemsize == 0:
        return tuple(shape)  # nothing to read (no elements, or elements of 0 bytes): one chunk
    file_shape = shape[::-1] if fortran_order else shape
    itemsize = max(dtype.itemsize, 1)
    inner = itemsize
    k = len(file_shape)
    while k > 0 and inner * file_shape[k - 1] <= limit:
        inner *= file_shape[k - 1]
        k -= 1
    chunks = list(file_shape)
    if k > 0:
        n = file_shape[k - 1]
        per = max(1, limit // inner)
        pieces = math.ceil(n / per)
        chunks[k - 1] = max(1, math.ceil(n / pieces))
        for axis in range(k - 1):
            chunks[axis] = 1
    return tuple(chunks[::-1] if fortran_order else chunks)


def chunk_limit(chunks: Any) -> int | None:
    """The byte limit ``"auto"`` or a size string stands for; ``None`` for explicit chunks."""
    if isinstance(chunks, str):
        text = dask.config.get("array.chunk-size") if chunks == "auto" else chunks
        try:
            return int(parse_bytes(text))
        except ValueError as e:
            raise ValueError(f"chunks={chunks!r}: expected 'auto', a byte size like '128MiB', or sizes") from e
    return None


def resolve_chunks(chunks: Any, source: NpyFileArray) -> tuple[tuple[int, ...], ...]:
    """Normalise ``chunks`` for ``source``; ``"auto"`` and sizes give file-contiguous chunks.

    A deflated ``.npz`` member is one chunk under ``"auto"``: every chunk of it
    would inflate the member's prefix again.
    """
    limit = chunk_limit(chunks)
    if limit is None:
        return normalize_chunks(chunks, source.shape, dtype=source.dtype)
    ref = source.ref
    if ref.compressed:
        return regular_grid(source.shape, source.shape)
    return regular_grid(source.shape, auto_chunks(source.shape, source.dtype, ref.header.fortran_order, limit))


def regular_grid(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """``normalize_chunks(block, shape)`` for a block shape from :func:`auto_chunks`, without its checks.

    Each axis is cut into blocks of ``block[i]`` and a shorter last one; an
    empty axis has one chunk of 0.

    Examples
    --------
    >>> regular_grid((10, 4, 0), (4, 4, 0))
    ((4, 4, 2), (4,), (0,))
    """
    return tuple(((b,) * (n // b) + ((n % b,) if n % b else ())) if n else (0,) for n, b in zip(shape, block))


def check_device(device: str) -> None:
    """Refuse an unknown device, and ``"gpu"`` where CuPy or a CUDA device is missing."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, found {device!r}")
    if device == "gpu":
        from npydask.gpu.device import require_gpu

        require_gpu()


@suggest_keywords
def from_npy(
    path: str | os.PathLike[str],
    chunks: Any = "auto",
    *,
    key: str | None = None,
    device: str = "cpu",
    backend: str = "auto",
    storage_options: dict[str, Any] | None = None,
) -> da.Array:
    """A lazy dask array equal to ``numpy.load(path)``.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npy`` file. Its header is read and checked now. A relative
        path is made absolute against the current working directory now
        (:mod:`npydask.storage.paths`), so tasks read the same file on any worker.
    chunks : "auto", int, tuple, or byte size
        Anything ``dask.array.core.normalize_chunks`` takes. ``"auto"`` (or a
        byte size such as ``"128MiB"``) picks chunks of at most
        ``array.chunk-size`` bytes that are contiguous in the file.
    key : str, optional
        Member name inside an ``.npz`` archive.
    device : {"cpu", "gpu"}
        ``"gpu"`` gives CuPy chunks (needs ``pip install 'npydask[gpu]'``).
    backend : {"auto", "mmap", "pread"}
        Host reader. ``"auto"`` maps whole contiguous chunks on local file
        systems (zero-copy, read-only) and preads everything else. Object
        URLs take ``"auto"`` only (range requests).
    storage_options : dict, optional
        For object URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``):
        obstore's store and client options. They travel inside the tasks
        (keep credentials in the workers' environment); only the bucket,
        endpoint and region enter the name.

    Returns
    -------
    dask.array.Array
        Each task carries the path, the header facts and its region only. The
        name is deterministic in (path, size, mtime, key, chunks, device,
        backend). A task whose file changed since this call fails with
        :class:`~npydask.errors.FileChangedError` naming the file.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.arange(12.0).reshape(3, 4))
    >>> x = npydask.from_npy(p, chunks=(1, 4))
    >>> x.numblocks, float(x.sum().compute())
    ((3, 1), 66.0)
    """
    if isinstance(path, list | tuple):
        raise TypeError(several_files_advice(path))
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, found {backend!r}")
    given = fspath(path)  # (advice quotes the path as the user wrote it)
    path, where = resolve(given, storage_options)
    if where is not LOCAL and backend != "auto":
        raise ValueError(f"{redact(path)}: object URLs are read with backend='auto' (range requests), found {backend!r}")
    check_device(device)
    try:
        ref = FileRef.open(path, backend, key=key, source=where)
    except FileNotFoundError as e:
        advice = glob_advice(given) if where is LOCAL else None
        if advice is None:
            raise
        raise FileNotFoundError(errno.ENOENT, f"no such file; {advice}", given) from e
    source = NpyFileArray(ref)
    return wrap(source, resolve_chunks(chunks, source), device=device, key=key)


def several_files_advice(paths: list[Any] | tuple[Any, ...]) -> str:
    """What to call instead of ``from_npy`` on a list of paths (a dask user's first try).

    Examples
    --------
    >>> print(several_files_advice(["a.npy", "b.npy"]))
    from_npy reads one file, found a list of 2 paths; for several files use npydask.open_dataset(files=['a.npy', 'b.npy']).stack() (.concatenate(axis) for slabs of different lengths, .arrays() for one array per file)
    """
    shown = [os.fspath(p) if isinstance(p, str | os.PathLike) else p for p in paths[:3]]
    listing = repr(shown) if len(paths) <= 3 else repr(shown)[:-1] + ", ...]"
    return (
        f"from_npy reads one file, found a {type(paths).__name__} of {len(paths)} paths; for several files use "
        f"npydask.open_dataset(files={listing}).stack() (.concatenate(axis) for slabs of different lengths, "
        ".arrays() for one array per file)"
    )


def glob_advice(path: str) -> str | None:
    """What to call instead of ``from_npy`` on a glob pattern; ``None`` when ``path`` holds no glob characters.

    Asked only for a path that does not exist, so a file whose name holds
    ``*``, ``?`` or ``[`` is still read. A pattern in the folder part
    (``data/*/x.npy``) becomes a recursive search from the folder before it.

    Examples
    --------
    >>> print(glob_advice("data/*.npy"))
    'data/*.npy' looks like a glob pattern, and from_npy reads one file: for the files it matches use npydask.open_dataset('data', file_filter='*.npy').stack() (DALI's order, byte-wise sorted), or exactly the glob's files with npydask.open_dataset(files=sorted(glob.glob('data/*.npy'))).stack()
    >>> glob_advice("data/a.npy") is None
    True
    """
    folder, name = os.path.split(path)
    if not name or not _GLOB_MAGIC.search(path):
        return None
    parts = folder.split(os.sep) if folder else []
    wild = next((i for i, part in enumerate(parts) if _GLOB_MAGIC.search(part)), None)
    if wild is None:
        call = f"npydask.open_dataset({folder or os.curdir!r}, file_filter={name!r})"
    else:
        root = os.sep.join(parts[:wild]) or (os.sep if path.startswith(os.sep) else os.curdir)
        call = f"npydask.open_dataset({root!r}, file_filter={name!r}, recursive=True)"
    return (
        f"{path!r} looks like a glob pattern, and from_npy reads one file: for the files it matches use "
        f"{call}.stack() (DALI's order, byte-wise sorted), or exactly the glob's files with "
        f"npydask.open_dataset(files=sorted(glob.glob({path!r}))).stack()"
    )


def drop_empty_chunks(chunks: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """``chunks`` without zero-size chunks, as ``dask.array.concatenate`` leaves them.

    An axis of extent 0 keeps its one chunk ``(0,)``, as dask's own
    constructors give it. Empty files (or files emptied by a ROI) would
    otherwise add zero-size chunks inside an axis, which dask's slicing
    mishandles (``x[300000::-1]`` of such an array came out empty).

    Examples
    --------
    >>> drop_empty_chunks(((256, 0, 44, 0), (0,), (3,)))
    ((256, 44), (0,), (3,))
    """
    return tuple(tuple(c for c in axis if c) or (0,) for axis in chunks)


def wrap(
    source: Any,
    chunks: tuple[tuple[int, ...], ...],
    *,
    device: str = "cpu",
    key: str | None = None,
    inline: bool = True,
) -> da.Array:
    """A dask array over an npydask array-like, one small task per chunk.

    ``source`` (an :class:`NpyFileArray` or a group of files) is embedded in
    every task (:func:`npydask.graph.build.chunk_array`): it is a few hundred bytes
    and carries no data; its ``__dask_tokenize__`` makes the name
    deterministic. With ``device="gpu"``
    the source becomes a :class:`~npydask.gpu.device.DeviceArray` (CuPy chunks; the
    dtype is checked now) and the meta a ``cupy.ndarray``. With
    ``inline=False`` the source is one key of the graph that every task
    refers to (for a source too big to copy into each task: many files).
    Zero-size chunks are dropped (:func:`drop_empty_chunks`).
    """
    chunks = drop_empty_chunks(chunks)
    if device == "gpu":
        from npydask.gpu.device import on_device  # (imports CuPy only here)

        source = on_device(source)
        meta = source.meta
    else:
        meta = np.empty((0,) * len(source.shape), source.dtype)
    # The source's token is already a hash of (path, identity, header, settings); hashing its
    # repr with the chunks is ~10x cheaper than tokenize() walking the chunk tuples.
    facts = repr((source.__dask_tokenize__(), chunks, key, device, inline)).encode("utf8", "surrogateescape")
    name = "npy-" + hashlib.blake2b(facts, digest_size=16).hexdigest()
    return chunk_array(source, chunks, name, meta, inline=inline)
