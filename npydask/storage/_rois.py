"""A tight loop over a group's ROIs: one ``open``, the strided reads, one ``fstat``, one ``close`` per file.

A task that stacks the same ROI of many files reads each file once, so
going through the handle cache only churns it: a group of 256 volumes
against the cache's 128 files opened, parsed the header of, and evicted
every file, a large share of each read (figures on the performance page).
This loop does what
:func:`npydask.storage._batch.read_files` does for whole small files. The
header was parsed when the dataset was opened, so a file is checked by its
identity (one ``fstat`` after the read, which catches a file changed
before or during it); when the group carries a header check (``index=``,
``headers="first"``), by its header bytes (one ``pread``); and where only
its inode is known, by its size against the payload that header promises.
The strided read itself is the pread backend's
(:func:`npydask.storage.read_fd`: spans or runs by the cost model),
its spans prepared once per plan (:func:`~npydask.storage.scratch_spans`).
``O_DIRECT`` reads (``direct_io``) take the cached handle's path, which
holds the second descriptor.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

from npydask.format.header import parse_header
from npydask.storage._batch import OPEN_FLAGS, explain
from npydask.storage._handles import retry_open
from npydask.storage._headers import truncated
from npydask.storage._local_read import ScratchSpans, read_fd, read_grid, read_scratch_spans, scratch_spans
from npydask.storage.identity import InodeIdentity, file_changed, header_mismatch

__all__ = ["read_rois"]


def read_rois(jobs: Sequence[tuple[Any, ...]]) -> None:
    """Fill each job's destination: ``(path, identity, plan, dest, options, check)``, as ``read_runs`` takes them.

    Raises
    ------
    FileChangedError
        If a file's size, mtime or inode (for an
        :class:`~npydask.storage.identity.InodeIdentity`: its inode, and a
        status change before the listing began) is not the job's once it
        was read, or it ends early.
    NpyFormatError
        If a file's header bytes are not its ``check``'s.
    """
    open_, fstat, pread, close = os.open, os.fstat, os.pread, os.close
    prepared: dict[tuple[int, int], ScratchSpans | None] = {}  # per (plan, options), while jobs holds them
    for path, ident, plan, dest, options, check in jobs:
        if options.direct_io:
            read_grid(path, ident, plan, options, dest, check)
            continue
        try:
            fd = open_(path, OPEN_FLAGS)
        except OSError as e:
            fd = retry_open(path, OPEN_FLAGS, e)
        try:
            head = None
            try:
                if check is not None:
                    head = pread(fd, len(check.raw), 0)
                job = (id(plan), id(options))
                spans = prepared[job] if job in prepared else prepared.setdefault(job, scratch_spans(plan, options))
                if spans is None:
                    read_fd(fd, path, plan, options, dest)
                else:
                    read_scratch_spans(fd, path, spans, dest)
            except OSError as e:
                explain(fd, path, ident, e, check, plan.end)
            st = fstat(fd)
            inode_only = type(ident) is InodeIdentity
            if (
                st.st_ino != ident[0] or st.st_ctime_ns >= ident[1] >= 0
                if inode_only
                else st.st_ino != ident[2] or st.st_size != ident[0] or st.st_mtime_ns != ident[1]
            ):
                raise file_changed(path, ident, st)
            if head is not None:
                if head != check.raw:
                    raise header_mismatch(path, check, head)
                if inode_only and st.st_size < _payload_end(check.raw):  # (a ROI short of the end reads fine)
                    raise truncated(path, parse_header(check.raw), st.st_size)
        finally:
            close(fd)


@functools.lru_cache(maxsize=64)
def _payload_end(raw: bytes) -> int:
    """Where the payload of the header ``raw`` ends (parsed once: a group's files share a few headers)."""
    header = parse_header(raw)
    return header.data_offset + header.nbytes
