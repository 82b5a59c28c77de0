"""Writing ``.npy`` objects to object storage: ``to_npy`` by a multipart upload, ``to_npy_files`` by PUTs.

:func:`npydask.to_npy` and :func:`npydask.to_npy_files` hand URLs here.

``to_npy(x, "s3://bucket/key.npy")`` is an S3 multipart upload driven by
dask tasks (boto3, :mod:`npydask.storage.s3_upload`): a first task checks
the target (``overwrite=False``) and creates the upload; each chunk task
uploads its part, the contiguous byte range of a slab of whole rows (part 1
carries the header before its rows); a last task checks that every byte is
there and completes the upload, which publishes the object at once. A part
that fails, or a complete that fails, aborts the upload. S3 publishes
nothing before complete, so an existing object under the key stays
byte-identical until the new one replaces it whole. :func:`plan_parts`
(pure) picks the slabs: S3 wants parts of at least 5 MiB (all but the
last), at most 5 GiB, at most 10,000 of them.

``to_npy_files(arrays, "s3://bucket/prefix/")`` writes each array as one
object by one PUT (:class:`~npydask.storage.object_write.ObjectTarget`) in
one task that takes the array's chunks, on any store obstore writes to
(``s3://``, ``gs://``, ``az://``).
"""

from __future__ import annotations

import contextlib
import errno
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.delayed import Delayed

from npydask._buffers import as_bytes
from npydask.format.header import NpyHeader
from npydask.plan.region import Box
from npydask.storage import StoreSpec, run_each
from npydask.storage.object import ObjectSource
from npydask.storage.urls import join_url, redact, split_url
from npydask.write._graph import (
    Views,
    check_align,
    digest,
    graph_of,
    optimize,
    output_names,
    plan_header,
    write_input,
)
from npydask.write._tasks import as_block, block_runs

__all__ = ["MAX_PARTS", "MAX_PART_BYTES", "MIN_PART_BYTES", "ObjectFile", "Upload", "plan_parts"]

MIN_PART_BYTES = 5 << 20
"""S3's smallest part (every part but the last)."""
MAX_PART_BYTES = 5 << 30
"""S3's largest part."""
MAX_PARTS = 10_000
"""S3's most parts in one upload."""


# --------------------------------------------------------------------------
# Planning the parts (pure)


def _valid_parts(rows: Sequence[int], row_bytes: int, header_bytes: int) -> bool:
    sizes = [n * row_bytes for n in rows]
    sizes[0] += header_bytes
    if len(sizes) > MAX_PARTS or max(sizes) > MAX_PART_BYTES:
        return False
    return all(n >= MIN_PART_BYTES for n in sizes[:-1])


def plan_parts(
    shape: tuple[int, ...], chunks: tuple[tuple[int, ...], ...], itemsize: int, header_bytes: int
) -> tuple[int, ...] | None:
    """The rows of each part along axis 0, or ``None`` when ``chunks`` already make valid parts.

    Chunks make parts when they are slabs of whole rows (one chunk along
    every axis but the first) of at least :data:`MIN_PART_BYTES` each but the
    last (the first counting the header), at most :data:`MAX_PART_BYTES`,
    at most :data:`MAX_PARTS` of them. Otherwise the slabs returned are equal
    (the last may be smaller), as large as the largest chunk but at least
    5 MiB, and few enough.

    Raises
    ------
    ValueError
        When one row is larger than a part may be (5 GiB), or the array is
        too large for 10,000 parts of 5 GiB.

    Examples
    --------
    12 MiB of float32 in 1 MiB row slabs become slabs of 5 MiB:

    >>> plan_parts((3 * 2**20,), ((2**18,) * 12,), 4, 128)
    (1310720, 1310720, 524288)
    >>> plan_parts((3 * 2**20,), ((1310720, 1310720, 524288),), 4, 128) is None
    True
    """
    if not shape:
        return None  # a 0-d array: one part
    row_bytes = math.prod(shape[1:]) * itemsize
    whole_rows = all(len(c) == 1 for c in chunks[1:])
    if shape[0] == 0 or row_bytes == 0:  # no payload: the header alone, in one part
        return None if whole_rows and len(chunks[0]) == 1 else (shape[0],)
    if whole_rows and _valid_parts(chunks[0], row_bytes, header_bytes):
        return None
    if row_bytes > MAX_PART_BYTES:
        raise ValueError(
            f"a row of this array holds {row_bytes} bytes, more than the {MAX_PART_BYTES} bytes of an S3 part; "
            "to_npy to s3:// uploads whole rows per part: write with to_zarr or to_npy_files instead"
        )
    largest = math.prod(max(sizes) for sizes in chunks)
    target = min(max(largest * itemsize, MIN_PART_BYTES), MAX_PART_BYTES)
    per = max(-(-MIN_PART_BYTES // row_bytes), target // row_bytes, -(-shape[0] // MAX_PARTS), 1)
    if per * row_bytes > MAX_PART_BYTES:
        raise ValueError(
            f"the array's {shape[0] * row_bytes} bytes need parts over {MAX_PART_BYTES} bytes to fit in "
            f"{MAX_PARTS} parts, more than S3 allows: write with to_zarr or to_npy_files instead"
        )
    full, rest = divmod(shape[0], per)
    return (per,) * full + ((rest,) if rest else ())


# --------------------------------------------------------------------------
# to_npy: the multipart upload's tasks


@dataclass(frozen=True)
class Upload:
    """What every task of one multipart upload carries: the store, the URL, the header and ``overwrite``."""

    spec: StoreSpec
    url: str
    preamble: bytes
    header: NpyHeader
    overwrite: bool

    @property
    def size(self) -> int:
        """The object's size in bytes."""
        return len(self.preamble) + self.header.nbytes


def _create(upload: Upload) -> str:
    """The first task: refuse an existing target (``overwrite=False``), then start the upload."""
    from npydask.storage import exists_error, s3_upload

    if not upload.overwrite and s3_upload.object_exists(upload.spec, upload.url):
        raise exists_error(redact(upload.url))
    return s3_upload.create_upload(upload.spec, upload.url)


def _part(block: Any, upload_id: str, upload: Upload, number: int, start: int, stop: int) -> tuple[int, str, int]:
    """A chunk task: upload rows ``start..stop`` as part ``number`` (the header first in part 1); abort on failure."""
    from npydask.storage import s3_upload

    try:
        shape = upload.header.shape
        box = Box((start, *(0,) * (len(shape) - 1)), (stop, *shape[1:])) if shape else Box((), ())
        data = as_bytes(as_block(block, upload.header, box, redact(upload.url)))
        body = b"".join((upload.preamble, data)) if number == 1 else data.tobytes()  # type: ignore[arg-type]  # numpy types ndarray.__buffer__ from Python 3.12
        etag = s3_upload.upload_part(upload.spec, upload.url, upload_id, number, body)
    except BaseException:
        with contextlib.suppress(Exception):
            s3_upload.abort_upload(upload.spec, upload.url, upload_id)
        raise
    return number, etag, len(body)


def _complete(parts: Sequence[tuple[int, str, int]], upload_id: str, upload: Upload) -> None:
    """The last task: every part there and every byte, then complete (publish); abort on failure."""
    from npydask.storage import s3_upload

    try:
        parts = sorted(parts)
        numbers = [p[0] for p in parts]
        total = sum(p[2] for p in parts)
        if numbers != list(range(1, len(parts) + 1)) or total != upload.size:
            raise OSError(
                errno.EIO,
                f"the part tasks uploaded parts {numbers[:5]}{'...' if len(numbers) > 5 else ''} holding {total} "
                f"bytes, expected parts 1..{len(parts)} holding {upload.size}: not publishing an incomplete object",
                redact(upload.url),
            )
        s3_upload.complete_upload(upload.spec, upload.url, upload_id, [p[1] for p in parts], overwrite=upload.overwrite)
    except BaseException:
        with contextlib.suppress(Exception):
            s3_upload.abort_upload(upload.spec, upload.url, upload_id)
        raise


def _abort(upload_id: str, upload: Upload) -> None:
    from npydask.storage import s3_upload

    s3_upload.abort_upload(upload.spec, upload.url, upload_id)


def _as_slabs(x: Any, what: str) -> tuple[da.Array, np.dtype, tuple[int, ...]]:
    """``x`` as a dask array (numpy arrays through views, keeping structured padding)."""
    src = write_input(x, what)
    if isinstance(src.array, da.Array):
        return src.array, src.dtype, src.shape
    array = src.array
    meta = np.empty((0,) * array.ndim, array.dtype)
    return da.from_array(Views(array), chunks=-1, asarray=False, meta=meta), src.dtype, src.shape


def to_npy_url(x: Any, url: str, source: ObjectSource, *, compute: bool, overwrite: bool, align: int) -> Delayed | None:
    """:func:`npydask.to_npy` to an ``s3://`` URL (see the module docs); other schemes are refused."""
    shown = source.display(url)
    if source.spec.kind != "s3":
        raise ValueError(
            f"{shown}: to_npy writes one object by a parallel multipart upload, which npydask does only for "
            "s3:// (and S3-compatible endpoints); for gs://, az:// and http(s):// use to_npy_files (one object "
            "per array, one PUT each) or to_zarr (chunked, any store)"
        )
    if not split_url(url).key or url.endswith("/"):
        raise ValueError(f"{shown}: expected the URL of an object (s3://bucket/key.npy), found a bucket or prefix")
    array, dtype, shape = _as_slabs(x, f"to_npy ({shown})")
    align = check_align(align)
    preamble, header = plan_header(shown, dtype, shape, align)
    slabs = plan_parts(shape, array.chunks, dtype.itemsize, len(preamble))
    if slabs is not None:
        array = array.rechunk((slabs, *((n,) for n in shape[1:])))
    if not overwrite:
        from npydask.storage.object_write import exists

        if exists(source, url):
            from npydask.storage import exists_error

            raise exists_error(shown)
    upload = Upload(source.spec, url, preamble, header, overwrite)
    token = digest(array.name, source.spec.public(), url, align, overwrite)
    create, key = "npy-upload-create-" + token, "npy-upload-" + token
    dsk, chunks = graph_of(optimize(array))
    bounds = np.cumsum((0, *array.chunks[0])) if shape else (0, 0)
    parts = []
    for i, chunk in enumerate(chunks):
        parts.append(("npy-upload-part-" + token, i))
        dsk[parts[-1]] = (_part, chunk, create, upload, i + 1, int(bounds[i]), int(bounds[i + 1]))
    dsk[key] = (_complete, parts, create, upload)
    if not compute:
        dsk[create] = (_create, upload)
        return Delayed(key, dsk)
    # Computed here: the upload id comes back first, so a failure anywhere (a chunk that fails to
    # compute, an interrupt) aborts the upload, on the workers (where the credentials are).
    (upload_id,) = dask.compute(Delayed(create, {create: (_create, upload)}))
    dsk[create] = upload_id
    try:
        dask.compute(Delayed(key, dsk))
    except BaseException:
        abort = "npy-upload-abort-" + token
        with contextlib.suppress(Exception):
            dask.compute(Delayed(abort, {abort: (_abort, upload_id, upload)}))
        raise
    return None


# --------------------------------------------------------------------------
# to_npy_files: one PUT per array


@dataclass(frozen=True)
class ObjectFile:
    """What the task writing one object carries: the store, the URL, the header and ``overwrite``."""

    source: ObjectSource
    url: str
    preamble: bytes
    header: NpyHeader
    overwrite: bool


def _put(blocks: Sequence[Any], boxes: Sequence[Box], target: ObjectFile) -> None:
    """Write one object: the header and each block's byte runs into the buffer, then one PUT."""
    from npydask.storage.object_write import ObjectTarget

    size = len(target.preamble) + target.header.nbytes
    with ObjectTarget(target.source, target.url, size, overwrite=target.overwrite) as out:
        out.write_block(0, target.preamble)
        for block, box in zip(blocks, boxes):
            data = as_block(block, target.header, box, target.source.display(target.url))
            if data.nbytes:
                for offset, piece in block_runs(data, target.header, box):
                    out.write_block(offset, piece)
        out.finish()


def _boxes(chunks: tuple[tuple[int, ...], ...]) -> list[Box]:
    """Each block's box, blocks in C order."""
    bounds = [np.cumsum((0, *c)).tolist() for c in chunks]
    boxes = []
    for index in np.ndindex(*(len(c) for c in chunks)):
        boxes.append(Box(tuple(b[i] for b, i in zip(bounds, index)), tuple(b[i + 1] for b, i in zip(bounds, index))))
    return boxes


def to_npy_files_url(
    arrays: list[Any],
    prefix: str,
    names: Sequence[Any] | None,
    source: ObjectSource,
    *,
    compute: bool,
    overwrite: bool,
    align: int,
) -> Delayed | None:
    """:func:`npydask.to_npy_files` to a URL prefix (see the module docs)."""
    align = check_align(align)
    rel = [r.replace("\\", "/") for r in output_names(names, len(arrays))]
    urls = [join_url(prefix, r) for r in rel]
    if not overwrite:
        found = run_each(lambda u: _exists(source, u), urls, source.spec.settings.concurrency)
        for u, there in zip(urls, found):
            if isinstance(there, BaseException):
                raise there
            if there:
                from npydask.storage import exists_error

                raise exists_error(source.display(u))
    dsk: dict = {}
    keys = []
    for i, (x, url) in enumerate(zip(arrays, urls)):
        shown = source.display(url)
        src = write_input(x, f"to_npy_files: array {i} ({shown})")
        preamble, header = plan_header(shown, src.dtype, src.shape, align)
        target = ObjectFile(source, url, preamble, header, overwrite)
        keys.append("npy-put-" + digest(src.token, source.spec.public(), url, align, overwrite))
        if isinstance(src.array, da.Array):
            graph, chunks = graph_of(optimize(src.array))
            dsk.update(graph)
            dsk[keys[-1]] = (_put, list(chunks), _boxes(src.array.chunks), target)
        else:
            dsk[keys[-1]] = (_put, [src.array], [Box.whole(src.shape)], target)
    top = "npy-puts-" + digest(source.spec.public(), prefix, tuple(keys))
    dsk[top] = (_joined, keys)
    value = Delayed(top, dsk)
    if not compute:
        return value
    dask.compute(value)
    return None


def _exists(source: ObjectSource, url: str) -> bool:
    from npydask.storage.object_write import exists

    return exists(source, url)


def _joined(results: Sequence[Any]) -> None:
    """The task joining the objects of :func:`to_npy_files_url`."""
