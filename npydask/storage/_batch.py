"""Tight loops over many small files: scanning headers, and reading whole payloads.

Opening a folder of 20,000 small files, or reading a task's group of them,
costs a few system calls per file; on a VM each is 2-4 us, and Python's own
per-call overhead is of the same order. These loops do only what each file
needs (``open``, ``fstat``, one ``pread``, ``close``), bind the functions
they call to locals and take the memoised header without re-parsing, so the
cost per file stays close to the system calls' (measured in
``benchmarks/bench_dataset.py``). Anything unusual (a long header, a
truncated file, a special file) falls back to the general path in
:mod:`npydask.storage._handles`, which gives the same results and errors.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Sequence

from npydask.storage._handles import (
    FileIdentity,
    HeaderCheck,
    _changed,
    _check_regular,
    _read_header_raw,
    header_mismatch,
    pread_exact,
    retry_open,
    scan_file,
)
from npydask.header import _MEMO, NpyHeader, header_end
from npydask.storage._headers import FIRST_READ

__all__ = ["Scanned", "read_files", "scan_files"]

Scanned = tuple[FileIdentity, NpyHeader, bytes, bool]
"""(identity, header, raw header bytes, deflated) of one file, as :func:`scan_file` gives it."""

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


def scan_files(paths: Sequence[str], key: str | None = None) -> list[Scanned | BaseException]:
    """:func:`~npydask.storage._handles.scan_file` for each path; failures come back as exceptions.

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
            try:
                fd = retry_open(p, _FLAGS, e)
            except OSError as e:
                append(e)
                continue
        try:
            st = fstat(fd)
            if not isreg(st.st_mode):
                _check_regular(st, p)
            size = st.st_size
            first = pread(fd, FIRST_READ, 0)
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


Item = tuple[str, FileIdentity, int, "HeaderCheck | None"]
"""(path, identity, payload offset, header check) of one file of a group: what :func:`read_files` reads."""


def read_files(items: Sequence[Item], dest: memoryview, nbytes: int) -> None:
    """Fill ``dest`` with ``nbytes`` from each ``(path, identity, offset, check)`` in turn.

    One uncached ``open``, ``preadv``, ``fstat`` and ``close`` per file (a
    task reads each file of its group once: caching descriptors would only
    churn the cache). Where the run starts right after the header (a whole
    file), the one ``preadv`` reads the header bytes too, into a small
    buffer, so checking them against ``check`` costs a ``memcmp``, not a
    read. The ``fstat`` comes after the read: it catches a file changed
    before the read and one rewritten during it alike.

    Loops over files served at page-cache speed (under :data:`FAST_FILE`
    seconds each, as the previous loop measured) run one at a time in the
    process: they are system calls of a few microseconds, and two threads
    interleaving them only hand the GIL back and forth (20,000 files of 4 KiB
    on 2 cores: 652 ms on dask's two threads against 299 ms in one). Slower
    files (a network or cold file system) are read by all threads at once.

    Raises
    ------
    FileChangedError
        If a file's size, mtime or inode is not the one in ``items`` once it
        was read, or it ends early.
    NpyFormatError
        If a file's header bytes are not its ``check``'s.
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


def _read_loop(items: Sequence[Item], dest: memoryview, nbytes: int) -> bool:
    """The loop of :func:`read_files`; whether it took under :data:`FAST_FILE` a file."""
    t0 = time.perf_counter()
    open_, fstat, preadv, close = os.open, os.fstat, os.preadv, os.close
    head = bytearray()  # the header bytes of the file being read (resized when a header's length differs)
    pos = 0
    for path, ident, offset, check in items:
        try:
            fd = open_(path, _FLAGS)
        except OSError as e:
            fd = retry_open(path, _FLAGS, e)
        try:
            part = dest[pos : pos + nbytes]
            try:
                if check is None:
                    got = preadv(fd, [part], offset)
                    if got != nbytes:
                        pread_exact(fd, part[got:], offset + got, path)
                else:
                    n = len(check[0])
                    if len(head) != n:
                        head = bytearray(n)
                    if offset == n:  # the payload follows the header: one read for both
                        got = preadv(fd, [head, part], 0)
                        if got != n + nbytes:
                            _read_rest(fd, head, part, got, path)
                    else:  # a run inside the payload: the header apart
                        _read_apart(fd, head, part, offset, path)
            except OSError as e:
                _explain(fd, path, ident, e)
            st = fstat(fd)
            if st.st_size != ident[0] or st.st_mtime_ns != ident[1] or st.st_ino != ident[2]:
                raise _changed(path, ident, FileIdentity.of(st))
            if check is not None and head != check[0]:
                raise header_mismatch(path, check, bytes(head))
        finally:
            close(fd)
        pos += nbytes
    return time.perf_counter() - t0 < FAST_FILE * len(items)


def _read_rest(fd: int, head: bytearray, part: memoryview, got: int, path: str) -> None:
    """Finish a short ``preadv(fd, [head, part], 0)`` that returned ``got`` bytes."""
    n = len(head)
    if got < n:
        pread_exact(fd, memoryview(head)[got:], got, path)
        got = n
    pread_exact(fd, part[got - n :], got, path)


def _read_apart(fd: int, head: bytearray, part: memoryview, offset: int, path: str) -> None:
    pread_exact(fd, memoryview(head), 0, path)
    pread_exact(fd, part, offset, path)


def _explain(fd: int, path: str, ident: FileIdentity, error: OSError) -> None:
    """Re-raise a failed read: as a change of file when it is no longer the planned one, else naming the path."""
    if error.filename is not None:
        raise error
    st = os.fstat(fd)
    if FileIdentity.of(st) != ident:
        raise _changed(path, ident, FileIdentity.of(st)) from error
    raise OSError(error.errno, error.strerror, path) from error
