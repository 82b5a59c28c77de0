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

import dask.array as da
import numpy as np
from dask.array.core import normalize_chunks

from npydask._buffers import empty, raw
from npydask._keywords import suggest_keywords
from npydask.cache.spec import cache_choice
from npydask.graph.build import chunk_array
from npydask.plan.chunks import auto_chunks, chunk_limit, drop_empty_chunks, regular_grid
from npydask.plan.region import Box, split_index
from npydask.plan.roi import FileRoi, fill_like
from npydask.reader import BACKENDS, FileRef
from npydask.storage.where import fspath, resolve

__all__ = ["NpyFileArray", "from_npy"]

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
        return f"NpyFileArray({self.ref.source.display(self.ref.path)!r}, shape={self.shape}, dtype={self.dtype.str})"

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


def resolve_chunks(chunks: Any, source: NpyFileArray, device: str = "cpu") -> tuple[tuple[int, ...], ...]:
    """Normalise ``chunks`` for ``source``; ``"auto"`` and sizes give file-contiguous chunks.

    ``"auto"`` aims at dask's ``array.chunk-size`` on the host and at the
    ``gpu_chunk_bytes`` setting on the device (:func:`~npydask.plan.chunks.chunk_limit`).

    A deflated ``.npz`` member is one chunk under ``"auto"``: every chunk of it
    would inflate the member's prefix again.
    """
    limit = chunk_limit(chunks, device)
    if limit is None:
        return normalize_chunks(chunks, source.shape, dtype=source.dtype)
    ref = source.ref
    if ref.compressed:
        return regular_grid(source.shape, source.shape)
    return regular_grid(source.shape, auto_chunks(source.shape, source.dtype, ref.header.fortran_order, limit))


def check_device(device: str) -> None:
    """Refuse an unknown device, and ``"gpu"`` where CuPy or a CUDA device is missing."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, found {device!r}")
    if device == "gpu":
        from npydask.gpu import require_gpu

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
    cache: Any = None,
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
    cache : None, bool, str or npydask.Cache, optional
        The node cache an object's reads use (local files ignore it: the
        operating system's page cache keeps them). ``None``: the ``cache``
        setting (``NPYDASK_CACHE``) read where each task runs; ``False``:
        off; ``True``: the setting read now (``ValueError`` when it is
        empty); a folder or :class:`~npydask.Cache`: that one. Objects whose
        store identifies versions by anything but a strong ETag are read
        without it, with one :class:`~npydask.errors.NpyDaskWarning`. It
        does not enter the name.

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
    choice = cache_choice(cache)
    given = fspath(path)  # (advice quotes the path as the user wrote it)
    resolved = resolve(given, storage_options, choice)
    path, where = resolved.path, resolved.source
    if not resolved.local and backend != "auto":
        raise ValueError(
            f"{resolved.shown}: object URLs are read with backend='auto' (range requests), found {backend!r}"
        )
    check_device(device)
    try:
        ref = FileRef.open(path, backend, key=key, source=where)
    except FileNotFoundError as e:
        advice = glob_advice(given) if resolved.local else None
        if advice is None:
            raise
        raise FileNotFoundError(errno.ENOENT, f"no such file; {advice}", given) from e
    if where.cache_in_use:
        where.warn_uncached([path], [ref.identity])
    source = NpyFileArray(ref)
    return wrap(source, resolve_chunks(chunks, source, device), device=device, key=key)


def several_files_advice(paths: list[Any] | tuple[Any, ...]) -> str:
    """What to call instead of ``from_npy`` on a list of paths (a dask user's first try).

    Examples
    --------
    >>> print(several_files_advice(["a.npy", "b.npy"]))  # doctest: +NORMALIZE_WHITESPACE
    from_npy reads one file, found a list of 2 paths; for several files use
    npydask.open_dataset(files=['a.npy', 'b.npy']).stack() (.concatenate(axis) for slabs of different lengths,
    .arrays() for one array per file)
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
    >>> print(glob_advice("data/*.npy"))  # doctest: +NORMALIZE_WHITESPACE
    'data/*.npy' looks like a glob pattern, and from_npy reads one file: for the files it matches use
    npydask.open_dataset('data', file_filter='*.npy').stack() (DALI's order, byte-wise sorted),
    or exactly the glob's files with npydask.open_dataset(files=sorted(glob.glob('data/*.npy'))).stack()
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
    the source becomes a :class:`~npydask.gpu.DeviceArray` (CuPy chunks; the
    dtype is checked now) and the meta a ``cupy.ndarray``. With
    ``inline=False`` the source is one key of the graph that every task
    refers to (for a source too big to copy into each task: many files).
    Zero-size chunks are dropped (:func:`~npydask.plan.chunks.drop_empty_chunks`).
    """
    chunks = drop_empty_chunks(chunks)
    if device == "gpu":
        from npydask.gpu import on_device  # (imports CuPy only here)

        source = on_device(source)
        meta = source.meta
    else:
        meta = np.empty((0,) * len(source.shape), source.dtype)
    # The source's token is already a hash of (path, identity, header, settings); hashing its
    # repr with the chunks is cheaper than tokenize() walking the chunk tuples.
    facts = repr((source.__dask_tokenize__(), chunks, key, device, inline)).encode("utf8", "surrogateescape")
    name = "npy-" + hashlib.blake2b(facts, digest_size=16).hexdigest()
    return chunk_array(source, chunks, name, meta, inline=inline)
