"""Reading a list of byte spans of one open file into one buffer, back to back.

The executor of :mod:`npydask.plan.patch_runs`: the merged spans of many
boxes of a file. A local file is read by one loop of ``os.preadv`` on its
cached descriptor (``O_DIRECT`` with the ``direct_io`` setting), then checked
with one ``fstat``: a file changed before or during the read raises
:class:`~npydask.errors.FileChangedError`. An object is read by its
source's range GETs, all spans at once (``remote_concurrency`` in flight,
spans longer than ``remote_part_bytes`` split), each conditional on the ETag
the object was opened with and its response checked against it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from npydask.config import ReadOptions
from npydask.plan.patch_runs import Spans
from npydask.storage._handles import OpenFile, pread_exact
from npydask.storage._local_read import DirectReader
from npydask.storage._stores import run_files
from npydask.storage.object import RemoteFile

__all__ = ["each_file", "read_spans"]

T = TypeVar("T")
R = TypeVar("R")


def read_spans(f: OpenFile | RemoteFile, spans: Spans, dest: np.ndarray, options: ReadOptions) -> int:
    """Fill ``dest`` (C-contiguous ``uint8``, ``spans.nbytes`` long) with ``spans`` of ``f``; the requests made.

    A local file takes one read per span (``preadv``, more only where the
    kernel returns a short read), an object one range GET per span or
    ``remote_part_bytes`` piece of one.

    Raises
    ------
    FileChangedError
        If the file's identity changed before or while it was read, or it
        ended early.
    ValueError
        If ``dest`` is not ``spans.nbytes`` long.
    """
    if len(dest) != spans.nbytes:
        raise ValueError(f"{f.path}: the buffer holds {len(dest)} bytes, the spans {spans.nbytes}")
    if not isinstance(f, OpenFile):
        return f.range_reader().read_spans(dest, spans.offsets.tolist(), spans.lengths.tolist())
    mv = dest.data
    offsets, lengths, positions = spans.offsets.tolist(), spans.lengths.tolist(), spans.positions.tolist()
    if options.direct_io:
        direct = DirectReader(f)
        for offset, n, at in zip(offsets, lengths, positions):
            direct.read_into(dest[at : at + n], offset)
    else:
        fd, path, preadv = f.fd, f.path, os.preadv
        for offset, n, at in zip(offsets, lengths, positions):
            part = mv[at : at + n]
            got = preadv(fd, [part], offset)
            if got != n:
                pread_exact(fd, part[got:], offset + got, path)
    f.check_unchanged()
    return len(offsets)


def each_file(fn: Callable[[T], R], items: Sequence[T], concurrent: bool) -> list[R]:
    """``[fn(item) for item in items]``, several files at once where ``concurrent`` (an object store's latency).

    Concurrent calls run on the object stores' pool for files (a file's
    thread waiting for its own range GETs never holds a request thread);
    the first error is raised once the running calls are done. Local files
    are read in turn: their reads are system calls at page-cache speed.
    """
    if concurrent:
        return run_files(fn, items)
    return [fn(item) for item in items]
