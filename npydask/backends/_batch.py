"""Tight loops over many small files: scanning headers, and reading whole payloads.

Opening a folder of 20,000 small files, or reading a task's group of them,
costs a few system calls per file; on a VM each is 2-4 us, and Python's own
per-call overhead is of the same order. These loops do only what each file
needs (``open``, ``fstat``, one ``pread``, ``close``), bind the functions
they call to locals and take the memoised header without re-parsing, so the
cost per file stays close to the system calls' (measured in
``benchmarks/bench_dataset.py``). Anything unusual (a long header, a
truncated file, a special file) falls back to the general path in
:mod:`npydask.backends._files`, which gives the same results and errors.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Sequence

from npydask.backends._files import (
    _FIRST_READ,
    FileIdentity,
    _changed,
    _check_regular,
    _read_header_raw,
    pread_exact,
    scan_file,
)
from npydask.header import _MEMO, NpyHeader, header_end

__all__ = ["Scanned", "read_files", "scan_files"]

Scanned = tuple[FileIdentity, NpyHeader, bytes, bool]
"""(identity, header, raw header bytes, deflated) of one file, as :func:`scan_file` gives it."""

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


def scan_files(paths: Sequence[str], key: str | None = None) -> list[Scanned | BaseException]:
    """:func:`~npydask.backends._files.scan_file` for each path; failures come back as exceptions.

    The loop reads each file's first 4 KiB once; a header already seen (the
    exact same bytes) is taken from the header memo with its payload size
    checked against the file's, without parsing it again.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.zeros(3))
    >>> [(s[1].shape, s[3]) for s in scan_files([p, p])]
    [((3,), False), ((3,), False)]
    >>> type(scan_files([p + ".missing"])[0]).__name__
    'FileNotFoundError'
    """
    out: list[Scanned | BaseException] = []
    append = out.append
    if key is not None:  # .npz members: the zip directory first, the general path
        for p in paths:
            try:
                append(scan_file(p, key))
            except (OSError, ValueError, KeyError) as e:
                append(e)
        return out
    open_, fstat, pread, close, isreg = os.open, os.fstat, os.pread, os.close, stat.S_ISREG
    memo_get = _MEMO.get
    for p in paths:
        try:
            fd = open_(p, _FLAGS)
        except OSError as e:
            append(e)
            continue
        try:
            st = fstat(fd)
            if not isreg(st.st_mode):
                _check_regular(st, p)
            size = st.st_size
            first = pread(fd, _FIRST_READ, 0)
            end = header_end(first)
            hit = memo_get(first[:end]) if 0 < end <= len(first) else None
            if hit is not None and size >= hit.data_offset + hit.nbytes:
                append((FileIdentity(size, st.st_mtime_ns, st.st_ino), hit, first[:end], False))
            else:  # unseen, long or truncated: parse (and report) as the general path does
                header, raw = _read_header_raw(fd, size, p)
                append((FileIdentity(size, st.st_mtime_ns, st.st_ino), header, raw, False))
        except (OSError, ValueError) as e:
            append(e)
        finally:
            close(fd)
    return out


def read_files(items: Sequence[tuple[str, FileIdentity, int]], dest: memoryview, nbytes: int) -> None:
    """Fill ``dest`` with ``nbytes`` from each ``(path, identity, offset)`` in turn.

    One uncached ``open``, ``fstat``, ``pread`` and ``close`` per file (a task
    reads each file of its group once: caching descriptors would only churn
    the cache). Each file's identity is checked on its descriptor first.

    Loops over files served at page-cache speed (under :data:`FAST_FILE`
    seconds each, as the previous loop measured) run one at a time in the
    process: they are system calls of a few microseconds, and two threads
    interleaving them only hand the GIL back and forth (20,000 files of 4 KiB
    on 2 cores: 652 ms on dask's two threads against 299 ms in one). Slower
    files (a network or cold file system) are read by all threads at once.

    Raises
    ------
    FileChangedError
        If a file's size, mtime or inode is not the one in ``items``, or it
        ends early.
    """
    global _fast
    if not _fast:
        _fast = _read_loop(items, dest, nbytes)
        return
    with _SERIAL:
        _fast = _read_loop(items, dest, nbytes)


FAST_FILE = 50e-6
"""Seconds per file under which :func:`read_files` loops are serialised across threads."""

_SERIAL = threading.Lock()
_fast = True  # whether the last loop ran at page-cache speed


def _read_loop(items: Sequence[tuple[str, FileIdentity, int]], dest: memoryview, nbytes: int) -> bool:
    """The loop of :func:`read_files`; whether it took under :data:`FAST_FILE` a file."""
    t0 = time.perf_counter()
    open_, fstat, preadv, close = os.open, os.fstat, os.preadv, os.close
    pos = 0
    for path, ident, offset in items:
        fd = open_(path, _FLAGS)
        try:
            st = fstat(fd)
            if st.st_size != ident[0] or st.st_mtime_ns != ident[1] or st.st_ino != ident[2]:
                raise _changed(path, ident, FileIdentity.of(st))
            part = dest[pos : pos + nbytes]
            got = preadv(fd, [part], offset)
            if got != nbytes:
                pread_exact(fd, part[got:], offset + got, path)
        finally:
            close(fd)
        pos += nbytes
    return time.perf_counter() - t0 < FAST_FILE * len(items)
