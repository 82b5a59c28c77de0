"""Tight loops over many small files: scanning headers, and reading whole payloads.

Opening a folder of 20,000 small files, or reading a task's group of them,
costs a few system calls per file, each a few microseconds, and Python's
own per-call overhead is of the same order. These loops do only what each file
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

from npydask.format.header import HEADER_MEMO, header_end, parse_header
from npydask.storage._handles import check_regular, pread_exact, read_header_raw, retry_open, scan_file
from npydask.storage._headers import truncated
from npydask.storage.identity import (
    FileIdentity,
    HeaderCheck,
    InodeIdentity,
    Scanned,
    differs,
    file_changed,
    header_mismatch,
)

__all__ = ["OPEN_FLAGS", "Scanned", "explain", "read_files", "scan_files"]


OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK

SCAN_READ = 512
"""Bytes :func:`scan_files` reads first: numpy's headers take 128 or 256 (a
longer one costs a second read). Not more: a larger first read costs a
few percent of a file's scan more (the bytes object outgrows Python's
small-object allocator)."""


def scan_files(paths: Sequence[str], key: str | None = None) -> list[Scanned | BaseException]:
    """:func:`~npydask.storage.scan_file` for each path; failures come back as exceptions.

    The loop reads each file's first :data:`SCAN_READ` bytes once; a header
    already seen (the exact same bytes) is taken from the header memo with
    its payload size checked against the file's, without parsing it again.
    A longer header, or one not seen before, is read and parsed by the
    general path.

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
    memo_get = HEADER_MEMO.get
    canonical: dict[bytes, bytes] = {}  # one bytes object per distinct header text (each file's slice is freed)
    same = canonical.setdefault
    identity = tuple.__new__  # (FileIdentity built in C: its own __new__ is a Python call)
    # The previous file's header bytes, header and payload end: a file whose first bytes start with
    # them holds the same header (its length is in those bytes), with no parsing or lookup at all.
    last_raw, last_hit, last_end = b"\0" * (SCAN_READ + 1), None, 0  # (longer than any read: matches nothing)
    for p in paths:
        try:
            fd = open_(p, OPEN_FLAGS)
        except OSError as e:
            try:
                fd = retry_open(p, OPEN_FLAGS, e)
            except OSError as e:
                append(e)
                continue
        try:
            st = fstat(fd)
            if not isreg(st.st_mode):
                check_regular(st, p)
            size = st.st_size
            first = pread(fd, SCAN_READ, 0)
            if first.startswith(last_raw) and size >= last_end and last_hit is not None:
                append((identity(FileIdentity, (size, st.st_mtime_ns, st.st_ino)), last_hit, last_raw, False))
                continue
            end = header_end(first)
            raw = first[:end]
            hit = memo_get(raw) if 0 < end <= len(first) else None
            if hit is not None and size >= hit.data_offset + hit.nbytes:
                raw = same(raw, raw)
                append((identity(FileIdentity, (size, st.st_mtime_ns, st.st_ino)), hit, raw, False))
                last_raw, last_hit, last_end = raw, hit, hit.data_offset + hit.nbytes
            else:  # unseen, long or truncated: parse (and report) as the general path does
                header, raw = read_header_raw(fd, size, p)
                append((FileIdentity(size, st.st_mtime_ns, st.st_ino), header, raw, False))
        except (OSError, ValueError) as e:
            append(e)
        finally:
            close(fd)
    return out


Item = tuple[str, FileIdentity | InodeIdentity, int, HeaderCheck | None]
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
    interleaving them only hand the GIL back and forth (figures on the
    performance page). Slower
    files (a network or cold file system) are read by all threads at once.

    A group whose identities are inodes only
    (:class:`~npydask.storage.identity.InodeIdentity`: a dataset opened with
    ``headers="first"``, every file of it alike) compares the inode and,
    from the same ``fstat``, the status change time against when the
    listing began; a file of it that ends early is reported as another
    header's file (its header bytes read again) or as a truncated one.

    Raises
    ------
    FileChangedError
        If a file's size, mtime or inode is not the one in ``items`` once it
        was read, or it ends early.
    NpyFormatError
        If a file's header bytes are not its ``check``'s, or (inode
        identities) it ends before the payload its header promises.
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
            fd = open_(path, OPEN_FLAGS)
        except OSError as e:
            fd = retry_open(path, OPEN_FLAGS, e)
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
                explain(fd, path, ident, e, check, offset + nbytes)
            st = fstat(fd)
            if type(ident) is InodeIdentity:  # (known from a listing: compares less)
                moved = st.st_ino != ident[0] or st.st_ctime_ns >= ident[1] >= 0
            else:
                moved = st.st_ino != ident[2] or st.st_size != ident[0] or st.st_mtime_ns != ident[1]
            if moved:
                raise file_changed(path, ident, st)
            if check is not None and head != check[0]:
                raise header_mismatch(path, check, bytes(head))
        finally:
            close(fd)
        pos += nbytes
    return time.perf_counter() - t0 < FAST_FILE * len(items)


def _too_short(fd: int, path: str, check: HeaderCheck, size: int) -> None:
    """Raise for a file of ``size`` bytes too short for the run planned: another header, or a truncated file."""
    found = os.pread(fd, len(check.raw), 0)
    if found != check.raw:
        raise header_mismatch(path, check, found)
    raise truncated(path, parse_header(check.raw, source=path), size)


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


def explain(
    fd: int, path: str, ident: FileIdentity | InodeIdentity, error: OSError, check: HeaderCheck | None, end: int
) -> None:
    """Re-raise a failed read: as a change of file when it is no longer the planned one, else naming the path.

    A file known by its inode only that ends before ``end`` (the read's
    end) is another header's file or a truncated one: :func:`_too_short`.
    """
    if type(ident) is InodeIdentity:
        st = os.fstat(fd)
        if differs(ident, st):
            raise file_changed(path, ident, st) from error
        if check is not None and st.st_size < end:
            _too_short(fd, path, check, st.st_size)
    if error.filename is not None:
        raise error
    st = os.fstat(fd)
    if differs(ident, st):
        raise file_changed(path, ident, st) from error
    raise OSError(error.errno, error.strerror, path) from error
