"""Writing ``.npy`` files from dask arrays: chunks by offset, header last, then a rename.

Each chunk task of :func:`to_npy` writes its chunk's bytes with ``os.pwrite``
at their offsets (the byte runs :func:`~npydask.plan.region.plan_read` gives for
the output's header) into ``.<name>.<run>.npydask-tmp`` in the target's
folder: hidden, never ending in ``.npy``. ``<run>`` is drawn at random when
the graph is built, so the retried tasks of one graph share the file and two
calls never do. One last task, after every chunk task, takes the file away
under a name of its own, checks that it is the one file its chunk tasks
wrote and has the full size, writes the header at offset 0, calls
``fsync``, renames the file over the target and syncs the folder. Until then
the file's first bytes are zeros, so no partial array is ever loadable; a
failure in the last step removes the file. Tasks open the file themselves
(``O_WRONLY | O_CREAT``) and carry only their chunk and a small frozen
:class:`ChunkTarget` or :class:`FileTarget`, so workers sharing a file system
write one file together. In :func:`to_npy_files` an array of one chunk is
written by a single task into a file of its own.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.core import flatten
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from dask.utils import ensure_dict, parse_bytes

from npydask.backends.base import as_bytes, raw_copy
from npydask._keywords import suggest_keywords
from npydask.format.header import MAX_HEADER_BYTES, NpyHeader, format_header
from npydask.storage.local import LOCAL
from npydask.storage.where import fspath, resolve
from npydask.storage import check_inside, exists_error, new_run, temporary_name
from npydask.write._tasks import (
    WRITTEN,
    ChunkTarget,
    FileTarget,
    all_written,
    write_block_task,
    finish_file,
    write_file,
)

__all__ = ["ChunkTarget", "FileTarget", "check_names", "plan_header", "plan_target", "to_npy", "to_npy_files"]

NUMPY_MAX_HEADER = 10_000
"""The longest header text ``numpy.load`` reads by default (its ``max_header_size``)."""
MAX_ALIGN = 9984
"""The largest ``align`` whose padded header ``numpy.load`` still reads by default."""
def plan_target(
    path: str, dtype: np.dtype, shape: tuple[int, ...], run: str, *, align: int = 64, overwrite: bool = True,
    make_dirs: bool = False, sync_folder: bool = True, root: str = "",
) -> FileTarget:
    """The :class:`FileTarget` for writing an array of ``dtype`` and ``shape`` to ``path`` (absolute).

    ``run`` is the random id of the write call that names its temporary file;
    ``root`` (a real path) is the output folder the file must stay inside.

    Raises
    ------
    OSError
        ``ENAMETOOLONG`` naming ``path`` when its name is over 255 bytes (``NAME_MAX``).
    ValueError
        When ``align`` would make a header ``numpy.load`` refuses by default.

    Examples
    --------
    >>> t = plan_target("/data/a.npy", np.dtype("<f4"), (3, 4), "0123abcd")
    >>> t.tmp, t.chunk.header.data_offset, t.size
    ('/data/.a.npy.0123abcd.npydask-tmp', 128, 176)
    """
    preamble, header = plan_header(path, dtype, shape, align)
    tmp = temporary_name(path, run)
    return FileTarget(preamble, ChunkTarget(path, tmp, header, make_dirs, root), overwrite, sync_folder)


def plan_header(path: str, dtype: np.dtype, shape: tuple[int, ...], align: int = 64) -> tuple[bytes, NpyHeader]:
    """The first bytes of the file (magic, version, length, header text) and its :class:`NpyHeader`.

    Raises
    ------
    ValueError
        When ``align`` would make a header ``numpy.load`` refuses by default.

    Examples
    --------
    >>> preamble, header = plan_header("s3://b/a.npy", np.dtype("<f4"), (3, 4))
    >>> preamble[:6], header.data_offset, header.nbytes
    (b'\\x93NUMPY', 128, 48)
    """
    preamble = _header_bytes(dtype, tuple(shape), align)
    if len(preamble) > MAX_HEADER_BYTES:
        raise ValueError(
            f"{path}: the header for dtype {dtype} would be {len(preamble)} bytes, more than the "
            f"{MAX_HEADER_BYTES} bytes npydask reads back (numpy.load stops at 10,000); use fewer fields"
        )
    if align > 64 and _text_bytes(preamble) > NUMPY_MAX_HEADER >= _text_bytes(_header_bytes(dtype, tuple(shape), 64)):
        raise ValueError(
            f"{path}: align={align} pads the header of dtype {dtype} to {len(preamble)} bytes, over the "
            f"{NUMPY_MAX_HEADER:,} bytes numpy.load reads by default (max_header_size); use a smaller align"
        )
    nbytes = math.prod(shape) * dtype.itemsize
    return preamble, NpyHeader((preamble[6], preamble[7]), tuple(shape), dtype, False, len(preamble), nbytes)


def _text_bytes(preamble: bytes) -> int:
    """The header text's length as ``numpy.load`` measures it (after the magic, version and length field)."""
    return len(preamble) - (10 if preamble[6] == 1 else 12)


@functools.lru_cache(maxsize=256)
def _header_bytes(dtype: np.dtype, shape: tuple[int, ...], align: int) -> bytes:
    return format_header(dtype, shape, False, align=align)


# --------------------------------------------------------------------------
# Checks at call time and graph building


@dataclass(frozen=True)
class _Source:
    """One array to write: a dask array, or a numpy array small enough for one task."""

    array: Any
    dtype: np.dtype
    shape: tuple[int, ...]
    token: str
    one_task: bool


def _digest(*parts: Any) -> str:
    return hashlib.blake2b(repr(parts).encode("utf8", "surrogateescape"), digest_size=16).hexdigest()


def _source(x: Any, what: str, limit: int | None = None) -> _Source:
    """Check one array; numpy arrays up to ``limit`` bytes (one dask chunk) stay numpy, for one task."""
    if isinstance(x, da.Array):
        _check_dtype(x.dtype, what)
        if any(math.isnan(n) for n in x.shape):
            raise ValueError(f"{what}: the array's shape {x.shape} has unknown sizes; call x.compute_chunk_sizes()")
        return _Source(x, x.dtype, tuple(int(n) for n in x.shape), x.name, math.prod(x.numblocks) == 1)
    array = np.asarray(x)
    _check_dtype(array.dtype, what)
    if array.nbytes > (limit or int(parse_bytes(dask.config.get("array.chunk-size")))):
        if array.dtype.names is None:
            return _source(da.asarray(array), what)
        # from_array copies a numpy array first, and numpy's copy loses structured padding: give it views
        meta = np.empty((0,) * array.ndim, array.dtype)
        return _source(da.from_array(_Views(array), chunks="auto", asarray=False, meta=meta), what)
    # a digest of dtype, shape and values (much cheaper than dask's tokenize for many small arrays)
    h = hashlib.blake2b(repr((array.dtype.descr, array.dtype.str, array.shape)).encode("utf8"), digest_size=16)
    if array.size and array.dtype.itemsize:
        h.update(as_bytes(raw_copy(array)))
    return _Source(array, array.dtype, array.shape, h.hexdigest(), True)


class _Views:
    """A numpy array behind ``dask.array.from_array`` that hands out views, never a copy of the array."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def ndim(self) -> int:
        return self.array.ndim

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.array[index]

    def __dask_tokenize__(self) -> Any:
        return ("npydask.write.npy._Views", tokenize(self.array))


def _check_dtype(dtype: np.dtype, what: str) -> None:
    if dtype.hasobject:
        raise ValueError(
            f"{what}: cannot write dtype {dtype}: it holds Python objects, which the .npy format stores only "
            f"by pickling (npydask never pickles); convert to a numeric, string or structured dtype first"
        )


def _check_align(align: Any) -> int:
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align % 64:
        raise ValueError(
            f"align must be a positive multiple of 64, found {align!r}: the NPY format puts the payload "
            f"at a multiple of 64 bytes (numpy's ARRAY_ALIGN) so that every dtype is aligned and files map "
            f"well; use 64 (numpy's default) or 4096 for page-aligned payloads (O_DIRECT, mmap)"
        )
    if align > MAX_ALIGN:
        raise ValueError(
            f"align must be at most {MAX_ALIGN}, found {align!r}: a larger one pads the header past the "
            f"{NUMPY_MAX_HEADER:,} bytes numpy.load reads by default (max_header_size); use 4096 for "
            f"page-aligned payloads"
        )
    return align


def _check_target(path: str, overwrite: bool) -> None:
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "the target is a folder; give a file path", path)
    if not overwrite and os.path.lexists(path):
        raise exists_error(path)


def _graph_of(x: Any) -> tuple[dict, list]:
    """A collection's graph as one flat dict (culled where cheap), and its keys in C order of blocks.

    One flat graph keeps dask's culling linear in the number of tasks (with a
    layer per file it culls each layer against every key).
    """
    graph, keys = x.__dask_graph__(), list(flatten(x.__dask_keys__()))
    if isinstance(graph, HighLevelGraph):
        graph = graph.cull(set(keys))
    return ensure_dict(graph), keys


def _optimize(x: da.Array) -> da.Array:
    """Fuse the chunk tasks with the tasks that make them, under either array engine."""
    if callable(getattr(x, "optimize", None)):  # array expressions (query planning)
        return x.optimize()
    (x,) = dask.optimize(x)
    return x


def _file_graph(src: _Source, target: FileTarget, key: str) -> dict:
    """The tasks writing one file, the last under ``key``: one task, or chunk tasks plus a last task."""
    if src.one_task:
        if not isinstance(src.array, da.Array):
            return {key: (write_file, src.array, target)}
        dsk, (chunk,) = _graph_of(src.array)
        dsk[key] = (write_file, chunk, target)
        return dsk
    ndim = len(src.shape)
    parts = src.array.map_blocks(
        write_block_task,
        target=target.chunk,
        chunks=(1,) * ndim,
        dtype=WRITTEN,
        meta=np.empty((0,) * ndim, dtype=WRITTEN),
        name="npy-write-chunks-" + key.rsplit("-", 1)[-1],
    )
    dsk, chunks = _graph_of(_optimize(parts))
    dsk[key] = (finish_file, chunks, target)
    return dsk


@suggest_keywords
def to_npy(
    x: Any,
    path: str | os.PathLike[str],
    *,
    compute: bool = True,
    overwrite: bool = True,
    align: int = 64,
    storage_options: dict[str, Any] | None = None,
) -> Delayed | None:
    """Write a dask (or numpy) array to one ``.npy`` file, chunk by chunk, without gathering it.

    Each task writes its chunk at its offsets in a hidden temporary file in
    the same folder (``.<name>.<run>.npydask-tmp``, ``<run>`` random per
    call); one last task checks that it is the file its chunk tasks wrote,
    writes the header, calls ``fsync`` and renames the file over ``path``. A
    failed or interrupted write never leaves a file at ``path`` that
    ``numpy.load`` accepts as complete, and leaves an existing file there
    untouched; concurrent writers each publish a whole file or fail.

    Parameters
    ----------
    x : dask.array.Array or array_like
        The array; numpy arrays are split into chunks when they are larger
        than one chunk (``array.chunk-size``). Written in C order and in
        ``x.dtype``, byte order and structured padding included, as
        ``numpy.save`` writes it.
    path : str or os.PathLike
        The file, used as given (no ``.npy`` is appended). Its folder must
        exist. On a cluster, every worker must see it at this path.
    compute : bool, optional
        Write now (default) or return a lazy value.
    overwrite : bool, optional
        With ``False`` an existing ``path`` raises :class:`FileExistsError`
        now, and a file that appears there meanwhile is not replaced.
    align : int, optional
        The payload starts at a multiple of this many bytes: 64 as numpy, or
        for example 4096 for page-aligned reads. A multiple of 64, at most
        :data:`MAX_ALIGN` (9984) so that ``numpy.load`` reads the header with
        its default ``max_header_size``.
    storage_options : dict, optional
        For an ``s3://`` URL: the store's options, as for reading
        (``endpoint``, ``region``, ``access_key_id``, ``secret_access_key``,
        ``session_token``, ``skip_signature``, ``request_payer``, ...; without
        credentials boto3's own chain, e.g. the workers' environment).

    Returns
    -------
    dask.delayed.Delayed or None
        With ``compute=False``, a lazy value that does the whole write when
        computed (several may be computed together); otherwise ``None``.

    Notes
    -----
    To ``s3://bucket/key.npy`` (and S3-compatible endpoints) the write is a
    parallel multipart upload with boto3 (``pip install 'npydask[remote]'``):
    a first task creates the upload (with ``overwrite=False``, after a HEAD
    finds no object), each chunk task uploads its part (part 1 carries the
    header), a last task completes it, and S3 publishes the object only then:
    an existing object stays byte-identical until it is replaced whole. The
    chunks must be slabs of whole rows of at least 5 MiB (but the last), at
    most 5 GiB and 10,000 of them; other chunks are **rechunked** to equal
    row slabs of at least 5 MiB (as large as the largest chunk). A failed
    part or complete aborts the upload; with ``compute=True`` any failure
    (a chunk that fails to compute, an interrupt) aborts it too. With
    ``compute=False`` a chunk that fails *before* its upload leaves the
    upload incomplete (invisible, but stored): set the bucket lifecycle rule
    ``AbortIncompleteMultipartUpload`` (it also covers killed clients).
    ``overwrite=False`` sends ``If-None-Match: *`` on complete, so a store
    with conditional writes (AWS S3, SeaweedFS) never replaces an object that
    appeared meanwhile. Other schemes (``gs://``, ``az://``, ``http(s)://``)
    raise ``ValueError`` naming :func:`to_npy_files` and :func:`to_zarr`.

    Raises
    ------
    FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError
        Before any work: a missing folder, a folder at ``path``, or an
        existing ``path`` with ``overwrite=False``.
    OSError
        ``ENAMETOOLONG`` naming ``path`` when its name is over 255 bytes.
    ValueError
        For an object dtype, unknown chunk sizes, or an ``align`` that is not
        a multiple of 64 or pads the header past what ``numpy.load`` reads.
    npydask.FileChangedError
        At compute, when the temporary file is not the one the chunk tasks
        wrote (the same lazy value computed twice at once, or tampering).

    Examples
    --------
    >>> import numpy as np, dask.array as da, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> to_npy(da.from_array(np.arange(12).reshape(3, 4), chunks=(2, 3)), p)
    >>> np.load(p)
    array([[ 0,  1,  2,  3],
           [ 4,  5,  6,  7],
           [ 8,  9, 10, 11]])
    """
    path, source = resolve(path, storage_options)
    if source is not LOCAL:
        from npydask.write._remote import to_npy_url

        return to_npy_url(x, path, source, compute=compute, overwrite=overwrite, align=align)  # type: ignore[arg-type]
    src = _source(x, "to_npy")
    align = _check_align(align)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise NotADirectoryError(errno.ENOTDIR, "the .npy file's folder is not a folder", folder)
        raise FileNotFoundError(errno.ENOENT, "the .npy file's folder does not exist; create it first", folder)
    _check_target(path, overwrite)
    token = _digest(src.token, path, align, overwrite)
    key = "npy-write-" + token
    target = plan_target(path, src.dtype, src.shape, new_run(), align=align, overwrite=overwrite)
    value = Delayed(key, _file_graph(src, target, key))
    if not compute:
        return value
    dask.compute(value)
    return None


@suggest_keywords
def to_npy_files(
    arrays: Any,
    folder: str | os.PathLike[str],
    names: Sequence[str | os.PathLike[str]] | None = None,
    *,
    compute: bool = True,
    overwrite: bool = True,
    align: int = 64,
    storage_options: dict[str, Any] | None = None,
) -> Delayed | None:
    """Write one ``.npy`` file per array into ``folder`` (subfolders allowed), each as :func:`to_npy` does.

    Parameters
    ----------
    arrays : sequence of arrays, or NpyDataset
        Dask or numpy arrays. For an :class:`~npydask.NpyDataset` the arrays
        are ``ds.arrays()`` and the default names mirror ``ds.files`` relative
        to their common folder.
    folder : str or os.PathLike
        The output folder; it and any subfolders are created when written.
    names : sequence of str, optional
        One relative path per array (``"a/b/c"``); ``.npy`` is appended
        unless present, as ``numpy.save`` does. By default ``00000.npy``,
        ``00001.npy``, ... (or the dataset's names).
    compute, overwrite, align
        As in :func:`to_npy`; with ``overwrite=False`` every target is
        checked before any work.
    storage_options : dict, optional
        For a URL prefix (``s3://bucket/prefix/``, ``gs://``, ``az://``): the
        store's options, as for reading. Each array is then one object under
        the prefix (names joined with ``/``), written by one task that takes
        the array's chunks and sends header and payload in one PUT;
        ``overwrite=False`` checks every object (HEAD) before any work and
        PUTs create-only (``If-None-Match``), so an object that appears
        meanwhile is not replaced (``FileExistsError``); a store without
        create-only PUTs raises ``OSError`` (``EOPNOTSUPP``) saying so.

    Returns
    -------
    dask.delayed.Delayed or None
        With ``compute=False``, one lazy value writing every file.

    Raises
    ------
    ValueError
        Bad names (see :func:`check_names`), a name count that differs from
        the array count, or an array :func:`to_npy` refuses.
    PermissionError
        A file's folder that resolves (through a symbolic link) outside the
        output folder, checked when the graph is built and again right
        before the file is created.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> out = tempfile.mkdtemp()
    >>> to_npy_files([np.arange(3), np.eye(2)], out, names=["a", "sub/b"])
    >>> np.load(os.path.join(out, "sub", "b.npy"))
    array([[1., 0.],
           [0., 1.]])
    """
    from npydask.dataset.npy_dataset import NpyDataset

    if isinstance(arrays, NpyDataset):
        names = _dataset_names(arrays.files) if names is None else names
        arrays = arrays.arrays()
    elif isinstance(arrays, (np.ndarray, da.Array)):
        raise TypeError(
            "to_npy_files takes a sequence of arrays (or an NpyDataset), found one array; "
            "use to_npy for one file, or list(x) for one file per row"
        )
    arrays = list(arrays)
    root, source = resolve(folder, storage_options)
    if source is not LOCAL:
        from npydask.write._remote import to_npy_files_url

        return to_npy_files_url(
            arrays, root, names, source, compute=compute, overwrite=overwrite, align=align  # type: ignore[arg-type]
        )
    align = _check_align(align)
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotADirectoryError(errno.ENOTDIR, "the output folder is a file", root)
    if names is None:
        rel = [f"{i:0{max(5, len(str(len(arrays) - 1)))}d}.npy" for i in range(len(arrays))]
    elif len(names := list(names)) != len(arrays):
        raise ValueError(f"names has {len(names)} entries for {len(arrays)} arrays; give one name per array")
    else:
        rel = check_names(names)
    paths = [os.path.join(root, r) for r in rel]
    real_root = os.path.realpath(root)
    for folder_ in sorted({os.path.dirname(p) for p in paths}):
        check_inside(folder_, real_root, folder_)
    for p in paths:
        _check_target(p, overwrite)
    limit = int(parse_bytes(dask.config.get("array.chunk-size")))
    dsk: dict = {}
    keys = []
    for i, (x, path) in enumerate(zip(arrays, paths)):
        src = _source(x, f"to_npy_files: array {i} ({path})", limit)
        token = _digest(src.token, path, align, overwrite)
        target = plan_target(path, src.dtype, src.shape, new_run(), align=align, overwrite=overwrite,
                             make_dirs=True, sync_folder=False, root=real_root)
        keys.append("npy-write-" + token)
        dsk.update(_file_graph(src, target, keys[-1]))
    top = "npy-files-" + _digest(root, tuple(keys))
    dsk[top] = (all_written, keys, sorted({os.path.dirname(p) for p in paths}))
    value = Delayed(top, dsk)
    if not compute:
        return value
    dask.compute(value)
    return None


def check_names(names: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Normalise output names into distinct relative paths ending in ``.npy``.

    Raises
    ------
    ValueError
        For an absolute or escaping (``..``) name, one that names no file
        (empty, or ending in a separator or in ``.``), a name given twice, or
        a file that another name needs as a folder.

    Examples
    --------
    >>> check_names(["a", "b.npy", "sub/./c"])
    ['a.npy', 'b.npy', 'sub/c.npy']
    """
    out: list[str] = []
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        text = fspath(name)
        parts = [p for p in text.replace(os.sep, "/").split("/") if p not in ("", ".")]
        if os.path.isabs(text) or text.startswith("/"):
            raise ValueError(f"names[{i}] = {text!r} must be a relative path inside the output folder")
        if ".." in parts:
            raise ValueError(f"names[{i}] = {text!r} escapes the output folder ('..'); use a path inside it")
        if not parts or text.endswith(("/", os.sep)) or text.replace(os.sep, "/").rsplit("/", 1)[-1] == ".":
            raise ValueError(
                f"names[{i}] = {text!r} names no file (it ends in a folder: '/', '.' or nothing); give a file "
                f"name such as 'a' or 'sub/a'"
            )
        rel = "/".join(parts)
        rel += "" if rel.endswith(".npy") else ".npy"
        if rel in seen:
            raise ValueError(
                f"names[{seen[rel]}] = {names[seen[rel]]!r} and names[{i}] = {text!r} both write {rel!r}; "
                f"give every array its own name"
            )
        seen[rel] = i
        out.append(rel)
    clash = sorted({r.rsplit("/", k)[0] for r in out for k in range(1, r.count("/") + 1)}.intersection(seen))
    if clash:
        raise ValueError(f"{clash[0]!r} is both a file and the folder of another file in names; rename one")
    return [r.replace("/", os.sep) for r in out]


def _dataset_names(files: Sequence[str]) -> list[str]:
    """Paths relative to the files' common folder (a dataset's default names)."""
    if not files:
        return []
    full = [os.path.abspath(f) for f in files]
    root = os.path.commonpath([os.path.dirname(f) for f in full])
    return [os.path.relpath(f, root) for f in full]
