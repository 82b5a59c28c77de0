"""Reading a list of byte spans of one open file into one buffer, back to back, and counting what it cost.

The executor of :mod:`npydask.plan.patch_runs`: the merged spans of many
boxes of a file. A local file is read by one loop of ``os.preadv`` on its
cached descriptor (``O_DIRECT`` with the ``direct_io`` setting), then checked
with one ``fstat``: a file changed before or during the read raises
:class:`~npydask.errors.FileChangedError`. An object is read by its
source's range GETs, all spans at once (``remote_concurrency`` in flight,
spans longer than ``remote_part_bytes`` split), each conditional on the ETag
the object was opened with and its response checked against it. A deflated
``.npz`` member is inflated once from its start, through the last span.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

import numpy as np

from npydask.config import ReadOptions
from npydask.format.npz import inflate_into
from npydask.plan.patch_runs import Spans
from npydask.storage._stores import run_files
from npydask.storage.base import OpenedFile, Source

__all__ = ["SpansRead", "each_file", "inflate_spans", "read_spans"]

T = TypeVar("T")
R = TypeVar("R")


class SpansRead(NamedTuple):
    """What reading spans cost."""

    requests: int
    """Reads issued: ``preadv`` calls for a local file (one per span), range GETs for an object."""
    nbytes: int
    """Bytes read from the file (for a deflated member: compressed bytes)."""


def read_spans(source: Source, f: OpenedFile, spans: Spans, dest: np.ndarray, options: ReadOptions) -> SpansRead:
    """Fill ``dest`` (C-contiguous ``uint8``, ``spans.nbytes`` long) with ``spans`` of ``f``, which ``source`` opened.

    The source reads them (:meth:`~npydask.storage.base.Source.read_spans`: a
    local file one ``preadv`` per span, a short read completed by more and
    not counted; an object one range GET per span or ``remote_part_bytes``
    piece of one), then ``f`` is checked to be the file opened.

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
    requests = source.read_spans(f, spans, dest, options)
    f.check_unchanged()
    return SpansRead(requests, len(dest))


def inflate_spans(f: OpenedFile, spans: Spans, dest: np.ndarray, *, verify: bool) -> SpansRead:
    """Fill ``dest`` with the one span of a deflated ``.npz`` member (its bytes as inflated), counting the reads.

    With ``verify`` (a box is the whole member) inflation goes on to the
    member's end and its CRC-32 is checked.

    Raises
    ------
    NpzCrcError
        With ``verify``: the member's bytes do not match its CRC-32.
    FileChangedError
        If the file changed (a local file: checked after the reads; an object: each GET is conditional).
    """
    member = f.member
    if member is None or member.stored or len(spans) > 1:
        raise ValueError(f"{f.path}: inflate_spans reads one span of a deflated .npz member")
    requests, nbytes = 0, 0

    def read(offset: int, n: int) -> bytes:
        nonlocal requests, nbytes
        data = f.read_at(offset, n)
        requests += 1
        nbytes += len(data)
        return data

    if len(spans) or verify:
        start = int(spans.offsets[0]) if len(spans) else f.header.data_offset
        inflate_into(read, member, f.path, dest.data, start, verify=verify)
    f.check_unchanged()
    return SpansRead(requests, nbytes)


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
