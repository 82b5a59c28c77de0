"""Chunk shapes for one file's array: pure arithmetic, no I/O.

:func:`auto_chunks` picks a chunk shape of at most a byte limit whose chunks
are contiguous in the file; :func:`chunk_limit` turns ``chunks="auto"`` or a
size string into that limit (dask's ``array.chunk-size`` for ``"auto"``, or
npydask's ``gpu_chunk_bytes`` for device arrays);
:func:`regular_grid` lays a block shape out as dask's chunk tuples; and
:func:`drop_empty_chunks` removes the zero-size chunks a concatenation of
empty files would leave.
"""

from __future__ import annotations

import math
from typing import Any

import dask
import numpy as np
from dask.utils import parse_bytes

from npydask import config

__all__ = ["auto_chunks", "chunk_limit", "drop_empty_chunks", "regular_grid"]


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


def chunk_limit(chunks: Any, device: str = "cpu") -> int | None:
    """The byte limit ``"auto"`` or a size string stands for; ``None`` for explicit chunks.

    ``"auto"`` is dask's ``array.chunk-size`` (128 MiB by default) for host
    arrays and npydask's ``gpu_chunk_bytes`` setting (1 GiB by default) for
    ``device="gpu"``: kvikio reads one chunk with all its threads, so a bigger
    device chunk costs no read parallelism and saves dask's per-task overhead,
    which a GPU reading tens of GB/s cannot hide behind 128 MiB chunks.

    Examples
    --------
    >>> chunk_limit("64MiB"), chunk_limit("auto", device="gpu") == config.get("gpu_chunk_bytes"), chunk_limit((2, 3))
    (67108864, True, None)
    """
    if isinstance(chunks, str):
        if chunks == "auto" and device == "gpu":
            limit = int(config.get("gpu_chunk_bytes"))
            if limit < 1:
                raise ValueError(f"the gpu_chunk_bytes setting must be at least 1 byte, found {limit}")
            return limit
        text = dask.config.get("array.chunk-size") if chunks == "auto" else chunks
        try:
            return int(parse_bytes(text))
        except ValueError as e:
            raise ValueError(f"chunks={chunks!r}: expected 'auto', a byte size like '128MiB', or sizes") from e
    return None


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
