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
import os
from collections.abc import Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.delayed import Delayed
from dask.utils import parse_bytes

from npydask._keywords import suggest_keywords
from npydask.storage import check_inside, exists_error, new_run, temporary_name
from npydask.storage.where import resolve
from npydask.write._graph import (
    MAX_ALIGN,
    WriteInput,
    check_align,
    check_names,
    digest,
    graph_of,
    optimize,
    output_names,
    plan_header,
    write_input,
)
from npydask.write._remote import to_npy_files_url, to_npy_url
from npydask.write._tasks import (
    WRITTEN,
    ChunkTarget,
    FileTarget,
    all_written,
    finish_file,
    write_block_task,
    write_file,
)

__all__ = [
    "MAX_ALIGN",
    "ChunkTarget",
    "FileTarget",
    "check_names",
    "plan_header",
    "plan_target",
    "to_npy",
    "to_npy_files",
]


def plan_target(
    path: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    run: str,
    *,
    align: int = 64,
    overwrite: bool = True,
    make_dirs: bool = False,
    sync_folder: bool = True,
    root: str = "",
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


# --------------------------------------------------------------------------
# Checks at call time and graph building


def _check_target(path: str, overwrite: bool) -> None:
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "the target is a folder; give a file path", path)
    if not overwrite and os.path.lexists(path):
        raise exists_error(path)


def _file_graph(src: WriteInput, target: FileTarget, key: str) -> dict:
    """The tasks writing one file, the last under ``key``: one task, or chunk tasks plus a last task."""
    if src.one_task:
        if not isinstance(src.array, da.Array):
            return {key: (write_file, src.array, target)}
        dsk, (chunk,) = graph_of(src.array)
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
    dsk, chunks = graph_of(optimize(parts))
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
    where = resolve(path, storage_options)
    path, source = where.path, where.source
    if not where.local:
        return to_npy_url(x, path, source, compute=compute, overwrite=overwrite, align=align)  # type: ignore[arg-type]
    src = write_input(x, "to_npy")
    align = check_align(align)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise NotADirectoryError(errno.ENOTDIR, "the .npy file's folder is not a folder", folder)
        raise FileNotFoundError(errno.ENOENT, "the .npy file's folder does not exist; create it first", folder)
    _check_target(path, overwrite)
    token = digest(src.token, path, align, overwrite)
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
    where = resolve(folder, storage_options)
    root, source = where.path, where.source
    if not where.local:
        return to_npy_files_url(
            arrays,
            root,
            names,
            source,  # type: ignore[arg-type]
            compute=compute,
            overwrite=overwrite,
            align=align,
        )
    align = check_align(align)
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotADirectoryError(errno.ENOTDIR, "the output folder is a file", root)
    rel = output_names(names, len(arrays))
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
        src = write_input(x, f"to_npy_files: array {i} ({path})", limit)
        token = digest(src.token, path, align, overwrite)
        target = plan_target(
            path,
            src.dtype,
            src.shape,
            new_run(),
            align=align,
            overwrite=overwrite,
            make_dirs=True,
            sync_folder=False,
            root=real_root,
        )
        keys.append("npy-write-" + token)
        dsk.update(_file_graph(src, target, keys[-1]))
    top = "npy-files-" + digest(root, tuple(keys))
    dsk[top] = (all_written, keys, sorted({os.path.dirname(p) for p in paths}))
    value = Delayed(top, dsk)
    if not compute:
        return value
    dask.compute(value)
    return None


def _dataset_names(files: Sequence[str]) -> list[str]:
    """Paths relative to the files' common folder (a dataset's default names)."""
    if not files:
        return []
    full = [os.path.abspath(f) for f in files]
    root = os.path.commonpath([os.path.dirname(f) for f in full])
    return [os.path.relpath(f, root) for f in full]
