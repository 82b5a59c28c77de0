"""Opening files safely, and a bounded per-process cache of open files.

Every path npydask reads goes through :func:`open_regular`: it opens without
blocking (``O_NONBLOCK``, so a FIFO cannot hang the caller), refuses anything
that is not a regular file with a builtin ``OSError`` carrying the path, and
returns a ``FileIO`` that closes its descriptor when the last reference goes.

:func:`acquire` is the cache every task uses: one ``stat`` per call, and the
cached :class:`OpenFile` (descriptor, parsed header and its raw bytes) is
reused while the file's identity (size, mtime, inode) is unchanged. The
members of one ``.npz`` archive share one descriptor: a member first read
while another of its archive is cached (at the same identity) reuses it,
so a task reading every member of its files opens each file once. A task
that was built for one identity and finds another raises
:class:`~npydask.errors.FileChangedError`; a task that relies on a header
(a :class:`HeaderCheck`: the raw header bytes, and where they came from)
and finds other header bytes in the file raises
:class:`~npydask.errors.NpyFormatError`. Read sites call
:func:`check_unchanged` once the bytes are in, so a change *during* a read is
caught too.

The cache holds at most the ``handle_cache_size`` setting of files and at
most an eighth of the process's ``RLIMIT_NOFILE`` soft limit (a cached file
may hold two descriptors: its own and its mapping's; a third with
``direct_io``), so it uses at most a quarter of the descriptors the process
may open. Opening a file that fails
with ``EMFILE``/``ENFILE`` empties the cache and tries once more. Eviction
drops the cache's reference: a thread still reading holds its own, so a
descriptor is never closed (and its number reused) under a reader; it
closes as soon as the last reader lets go.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from npydask import config
from npydask.errors import FileChangedError, NpyDaskWarning
from npydask.format.header import NpyHeader
from npydask.format.npz import Member, Read, directory
from npydask.storage._headers import member_header as _member_header
from npydask.storage._headers import member_header_in as _member_header_in
from npydask.storage._headers import member_headers as _member_headers
from npydask.storage._headers import npy_header
from npydask.storage._mounts import is_local
from npydask.storage.base import PieceReader
from npydask.storage.identity import (
    FileIdentity,
    HeaderCheck,
    Scanned,
    check_unchanged,
    differs,
    file_changed,
    header_mismatch,
)

__all__ = [
    "OpenFile",
    "acquire",
    "cache_limit",
    "check_regular",
    "clear_cache",
    "member_header",
    "nofile_soft",
    "open_regular",
    "pread_exact",
    "read_header_from",
    "read_header_raw",
    "reader",
    "retry_open",
    "scan_file",
    "scan_members",
]

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


def check_regular(st: os.stat_result, path: str, what: str = "a regular .npy file") -> None:
    if stat.S_ISREG(st.st_mode):
        return
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"expected {what}, found a directory", path)
    raise OSError(errno.EINVAL, f"expected {what}, found {kind}", path)


class _Handle(io.FileIO):
    """A ``FileIO`` that closes quietly when collected.

    Cached handles are meant to be closed by the garbage collector once no
    reader holds them; that is not a leak, so no ``ResourceWarning``.
    """

    def __del__(self) -> None:
        self.close()


def open_regular(
    path: str, *, direct: bool = False, what: str = "a regular .npy file"
) -> tuple[io.FileIO, os.stat_result]:
    """Open ``path`` read-only without blocking and check it is a regular file (``what`` names it in errors).

    Returns
    -------
    file, stat_result
        An unbuffered ``FileIO`` (closed when garbage collected) and its ``fstat``.

    Raises
    ------
    OSError
        The builtin subclass for the failure (``FileNotFoundError``,
        ``PermissionError``, ``IsADirectoryError``), or ``OSError`` with
        ``EINVAL`` for a FIFO, socket or device; the path is in the message.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
    if direct:
        flags |= os.O_DIRECT
    fd, st = _open_fd(path, flags, what)
    try:
        os.set_blocking(fd, True)
        f = _Handle(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise
    return f, st


def _open_fd(path: str, flags: int, what: str = "a regular .npy file") -> tuple[int, os.stat_result]:
    """A descriptor for ``path`` opened with ``flags`` (retried once past the open-file limit) and its ``fstat``.

    Raises the builtin ``OSError`` subclass naming the path, or ``OSError``
    with ``EINVAL`` when it is not a regular file (the descriptor is closed).
    """
    try:
        fd = os.open(path, flags)
    except OSError as e:
        fd = retry_open(path, flags, e)
    try:
        st = os.fstat(fd)
        check_regular(st, path, what)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


_TOO_MANY = (errno.EMFILE, errno.ENFILE)
_RETRY_SECONDS = 0.5  # how long an open past the descriptor limit waits for other threads' descriptors


def retry_open(path: str, flags: int, error: OSError) -> int:
    """``os.open`` again after ``error``, if it was ``EMFILE``/``ENFILE``: after emptying the cache, for a while.

    Other threads may refill the cache between our emptying it and our
    ``open``, and descriptors they hold mid-read come back within
    milliseconds, so the cache is emptied and the open retried with a short
    back-off for up to :data:`_RETRY_SECONDS` before the limit is reported.
    Call it from the ``except`` of a failed ``os.open`` (the tight loops keep
    only the ``os.open`` in their common path).
    """
    if error.errno not in _TOO_MANY:
        raise error
    deadline = time.monotonic() + _RETRY_SECONDS
    pause = 0.0005
    while True:
        clear_cache()
        try:
            return os.open(path, flags)
        except OSError as again:
            if again.errno not in _TOO_MANY:
                raise
            if time.monotonic() >= deadline:
                raise OSError(
                    again.errno,
                    f"{again.strerror} even after closing npydask's cached files: the process's open-file "
                    f"limit (RLIMIT_NOFILE, `ulimit -n`, soft {nofile_soft()}) is used up elsewhere; raise it",
                    path,
                ) from error
        time.sleep(pause)
        pause = min(2 * pause, 0.02)


def reader(fd: int) -> Read:
    """``read(offset, n)`` over a descriptor (one ``pread``), as :mod:`npydask.format.npz` reads archives."""

    def read(offset: int, n: int) -> bytes:
        return os.pread(fd, n, offset)

    return read


def member_header(f: io.FileIO, size: int, path: str, key: str) -> tuple[NpyHeader, bytes, Member]:
    """Header of ``.npz`` member ``key`` of the archive ``f`` (:func:`npydask.storage._headers.member_header`)."""
    return _member_header(reader(f.fileno()), size, path, key)


def scan_members(path: str, keys: Sequence[str]) -> list[Scanned]:
    """:func:`scan_file` of each ``.npz`` member ``keys`` of ``path``.

    One open, one fstat, the zip directory read once.
    """
    f, st = open_regular(path)
    with f:
        found = _member_headers(reader(f.fileno()), st.st_size, path, keys)
    identity = FileIdentity.of(st)
    return [(identity, header, raw, not member.stored) for header, raw, member in found]


def scan_file(path: str, key: str | None = None) -> tuple[FileIdentity, NpyHeader, bytes, bool]:
    """Identity, checked header, raw header bytes and whether it is deflated: one open, fstat, pread, close.

    The lean twin of :func:`open_regular` plus :func:`read_header_from` for
    opening datasets of many files (no ``FileIO`` wrapper; ``O_NONBLOCK`` is
    left on, as it has no effect on regular files). With ``key``, the header
    of that ``.npz`` member (see :func:`member_header`).
    """
    if key is not None:
        f, st = open_regular(path)
        with f:
            header, raw, member = member_header(f, st.st_size, path, key)
        return FileIdentity.of(st), header, raw, not member.stored
    fd, st = _open_fd(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        header, raw = read_header_raw(fd, st.st_size, path)
        return FileIdentity.of(st), header, raw, False
    finally:
        os.close(fd)


def pread_exact(fd: int, dest: memoryview, offset: int, path: str) -> None:
    """Fill ``dest`` from ``offset``, looping over short reads.

    Raises
    ------
    FileChangedError
        If the file ends before ``dest`` is full (it was truncated).
    """
    done = 0
    total = len(dest)
    while done < total:
        n = os.preadv(fd, [dest[done:]], offset + done)
        if n == 0:
            raise FileChangedError(
                errno.EIO,
                f"file ended at byte {offset + done} while reading bytes {offset}..{offset + total}: "
                "it was truncated after opening; re-open it",
                path,
            )
        done += n


def read_header_from(f: io.FileIO | int, size: int, path: str) -> NpyHeader:
    """Read and parse the header of an open file (or descriptor) and check its payload is all there."""
    return read_header_raw(f if isinstance(f, int) else f.fileno(), size, path)[0]


def read_header_raw(fd: int, size: int, path: str) -> tuple[NpyHeader, bytes]:
    """Header and raw header bytes of an open file (:func:`npydask.storage._headers.npy_header`)."""
    return npy_header(reader(fd), size, path)


@dataclass(eq=False)
class OpenFile:
    """An open ``.npy`` file with its parsed header, as kept in the cache.

    Its descriptors close when the last reference to it goes (the cache's or
    a reader's), never while a reader holds it.
    """

    path: str
    file: io.FileIO
    identity: FileIdentity
    header: NpyHeader
    local: bool
    member: Member | None = None
    """The ``.npz`` member read (stored or deflated), ``None`` for a plain ``.npy`` file."""
    raw: bytes = field(default=b"", repr=False)
    """The header bytes as read from the file (up to ``data_offset``, of the member for a member)."""
    _direct: io.FileIO | None = field(default=None, repr=False)
    _direct_refused: bool = field(default=False, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Guards the lazily made O_DIRECT handle and mapping."""
    pid: int = field(default_factory=os.getpid, repr=False)
    """The process that opened it (a forked child shares its descriptors' leases: :mod:`npydask.storage._lease`)."""
    mapping: Any = field(default=None, repr=False)
    """The mmap backend's one read-only mapping of this open file (made on first use)."""
    archive: Any = field(default=None, repr=False)
    """For an ``.npz`` member: the archive's central directory (a ``zipfile.ZipFile``), shared by its members."""

    @property
    def deflated(self) -> bool:
        """Whether this is a deflated ``.npz`` member (only inflating reads it)."""
        return self.member is not None and not self.member.stored

    @property
    def fd(self) -> int:
        """The (buffered-I/O-free) descriptor for ``pread``."""
        return self.file.fileno()

    def check_unchanged(self) -> None:
        """:func:`check_unchanged` of this file: one ``fstat`` (after a read, to catch a change during it)."""
        check_unchanged(self.file.fileno(), self.identity, self.path)

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``offset`` (one ``pread``): the :data:`npydask.format.npz.Read` of this file."""
        return os.pread(self.file.fileno(), n, offset)

    def piece_reader(self) -> PieceReader:
        """:meth:`read_at` (a local file has nothing to keep)."""
        return PieceReader(self.read_at)

    def direct_file(self) -> io.FileIO | None:
        """A second handle opened with ``O_DIRECT``, or ``None`` where refused (warned once).

        The caller keeps the returned object for as long as it reads through
        it, so a concurrent :meth:`refuse_direct` cannot close it underneath.

        Raises
        ------
        FileChangedError
            If the path now names another file than the one opened (replaced
            or rewritten meanwhile): reading it would return other data.
        """
        with self.lock:
            if self._direct is None and not self._direct_refused:
                try:
                    direct, st = open_regular(self.path, direct=True)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    self._refuse(e)
                else:
                    found = FileIdentity.of(st)
                    if found != self.identity:
                        direct.close()
                        raise file_changed(self.path, self.identity, found)
                    self._direct = direct
            return self._direct

    def refuse_direct(self, cause: BaseException) -> None:
        """Record that the file system refuses ``O_DIRECT`` here and warn once."""
        with self.lock:
            if not self._direct_refused:
                self._refuse(cause)

    def _refuse(self, cause: BaseException) -> None:
        # Dropping the reference is safe: readers hold their own (see direct_file).
        self._direct_refused = True
        self._direct = None
        warnings.warn(
            f"{self.path}: the file system refuses O_DIRECT ({cause}); reading through the page cache instead",
            NpyDaskWarning,
            stacklevel=5,
        )


_cache: OrderedDict[tuple[str, str | None], OpenFile] = OrderedDict()
_cache_lock = threading.Lock()
_archives: weakref.WeakValueDictionary[str, OpenFile] = weakref.WeakValueDictionary()
"""Per archive path, a cached member's open file: the other members of that archive reuse its descriptor."""


def acquire(
    path: str, expected: FileIdentity | None = None, *, key: str | None = None, check: HeaderCheck | None = None
) -> OpenFile:
    """The cached open file for ``path``, (re)opened if its identity changed.

    Parameters
    ----------
    path : str
        The file.
    expected : FileIdentity, optional
        The identity the caller planned for; a different one raises
        :class:`FileChangedError` instead of reading other data.
    key : str, optional
        A member of an ``.npz`` archive: its header, and its
        :class:`~npydask.format.npz.Member` when it must be inflated to be read.
    check : HeaderCheck, optional
        The header bytes the caller relies on; the file's (read when it was
        opened, with this identity) must be the same.

    Raises
    ------
    FileChangedError
        The file's identity is not ``expected``.
    NpyFormatError
        The file's header bytes are not ``check.raw``.
    """
    st = os.stat(path)
    ident = FileIdentity.of(st)
    if expected is not None and differs(expected, st):
        raise file_changed(path, expected, st)
    cache_key = (path, key)
    with _cache_lock:
        hit = _cache.get(cache_key)
        if hit is not None and hit.identity == ident:
            _cache.move_to_end(cache_key)
            _trim(min(config.get("handle_cache_size"), _budget))  # the setting may have been lowered since
            if check is not None and hit.raw != check.raw:
                raise header_mismatch(path, check, hit.raw)
            return hit
        sibling = _archives.get(path) if key is not None else None
    if sibling is not None and sibling.identity == ident:
        # Another member of this archive, at this identity: its descriptor serves (one open per archive).
        header, raw, member = _member_header_in(reader(sibling.fd), sibling.archive, path, key)  # type: ignore[arg-type]
        if check is not None and raw != check.raw:
            raise header_mismatch(path, check, raw)
        opened = OpenFile(path, sibling.file, ident, header, sibling.local, member, raw=raw, archive=sibling.archive)
    else:
        opened = _open_new(path, expected, key, check)
    with _cache_lock:
        if key is not None:
            _archives[path] = opened
        _cache[cache_key] = opened
        _cache.move_to_end(cache_key)
        _trim(cache_limit())
    return opened


def _open_new(path: str, expected: FileIdentity | None, key: str | None, check: HeaderCheck | None) -> OpenFile:
    """Open ``path`` (or its member ``key``), parse and check its header: the cache's miss."""
    f, fst = open_regular(path)
    try:
        ident = FileIdentity.of(fst)
        if expected is not None and differs(expected, fst):
            raise file_changed(path, expected, fst)
        if key is None:
            header, raw = read_header_raw(f.fileno(), fst.st_size, path)
            opened = OpenFile(path, f, ident, header, is_local(fst), raw=raw)
        else:  # (the archive's directory is kept: its other members are found without reading it again)
            read = reader(f.fileno())
            archive = directory(read, fst.st_size, path, repr(key))
            header, raw, member = _member_header_in(read, archive, path, key)
            opened = OpenFile(path, f, ident, header, is_local(fst), member, raw=raw, archive=archive)
        if check is not None and raw != check.raw:
            raise header_mismatch(path, check, raw)
    except BaseException:
        f.close()
        raise
    return opened


_budget = 1 << 62
"""The cache's share of the open-file limit, in files, as :func:`cache_limit` last found it."""


def nofile_soft() -> int:
    try:
        import resource
    except ImportError:  # (not a POSIX system)
        return -1
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def cache_limit() -> int:
    """How many files the cache may hold now: ``handle_cache_size``, at most the soft open-file limit / 8.

    Each cached file holds up to two descriptors (its own and its mapping's),
    so the cache takes at most a quarter of ``RLIMIT_NOFILE``, leaving the
    rest to the process (sockets, libraries, the grouped reads). Read on
    every open, so a limit lowered at run time is followed.

    Examples
    --------
    >>> import resource
    >>> soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    >>> cache_limit() == min(config.get("handle_cache_size"), max(1, soft // 8))
    True
    """
    global _budget
    soft = nofile_soft()
    _budget = 1 << 62 if soft < 0 else max(1, soft // 8)
    return min(int(config.get("handle_cache_size")), _budget)


def _trim(limit: int) -> None:
    """Drop the least recently used entries beyond ``limit`` (call with the lock held)."""
    while len(_cache) > limit:
        _cache.popitem(last=False)  # drop our reference only; readers keep theirs


def clear_cache() -> None:
    """Forget every cached open file (descriptors close once no reader holds them)."""
    with _cache_lock:
        _cache.clear()
        _archives.clear()
