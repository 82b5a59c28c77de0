"""Kernel locks of the node cache: byte-range locks for one fetch per extent, whole-file locks for the rest.

Rules:

- **One fetch per extent.** A fetcher holds an exclusive lock on a byte range of the folder's
  ``lock`` file while it fetches and publishes a run; a thread or process that needs an
  overlapping run waits for that lock, then looks in the cache again. The locks are open file
  description (OFD) locks on Linux, which belong to one open of the file (two threads of one
  process exclude each other, as two processes do) and are released by the kernel when the
  holder dies. Where OFD locks are missing, ``flock`` on the whole file stands in (fetches then
  take turns; nothing else changes).
- The range of a run ``[start, stop)`` of an entry is ``[base + start mod 2**38, ...)`` where
  ``base`` is 24 bits of the entry's name shifted by 38 bits: runs of one entry lock their own
  bytes; runs of entries whose bits collide, or runs longer than 256 GiB, may wait on each other.
  A lock never decides what is read, only who fetches first: every holder looks in the cache
  again, so a collision costs a wait, never other data.
- **A wait is bounded**: :func:`acquire_range` polls (1 ms, doubling to 20 ms) for at most
  ``wait_s`` seconds and returns ``None`` when it gives up; the caller then fetches by itself.
- :class:`FileLock` is an exclusive ``flock`` of a whole file, taken by threads of one process in
  turn (a ``threading.Lock`` beside it): the ledger's lock and a process's registration.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time

__all__ = ["FileLock", "RangeLock", "acquire_range", "lock_span"]

_SLOT_SHIFT = 38
_SLOT_MASK = (1 << _SLOT_SHIFT) - 1
_OFD = hasattr(fcntl, "F_OFD_SETLK")
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on Linux (l_type, l_whence, l_start, l_len, l_pid)


def lock_span(entry_name: str, start: int, stop: int) -> tuple[int, int]:
    """The ``(offset, length)`` of the lock file that a run ``[start, stop)`` of an entry locks.

    Examples
    --------
    >>> lock_span("00" * 32, 0, 10)
    (0, 10)
    >>> lock_span("000001" + "00" * 29, 5, 6)
    (274877906949, 1)
    """
    base = int(entry_name[:6], 16) << _SLOT_SHIFT
    lo = start & _SLOT_MASK
    return base + lo, max(1, min(stop - start, (1 << _SLOT_SHIFT) - lo))


class RangeLock:
    """A held lock on a range of the lock file; :meth:`release` (or ``with``) gives it up."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self.fd, self.offset, self.length = fd, offset, length

    def release(self) -> None:
        """Give the lock up and close its open of the file."""
        if self.fd < 0:
            return
        try:
            if _OFD:
                fcntl.fcntl(
                    self.fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, self.offset, self.length, 0)
                )
        finally:
            os.close(self.fd)  # (closing releases it as well)
            self.fd = -1

    def __enter__(self) -> RangeLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try(fd: int, offset: int, length: int) -> bool:
    try:
        if _OFD:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, length, 0))
        else:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


def acquire_range(
    dir_fd: int, lock_name: str, offset: int, length: int, wait_s: float
) -> tuple[RangeLock | None, bool]:
    """Lock ``[offset, offset + length)`` of ``lock_name`` (in the folder ``dir_fd``), waiting at most ``wait_s``.

    Returns
    -------
    (RangeLock or None, bool)
        The lock (``None`` when the wait ran out) and whether another held it first (the caller
        looks in the cache again before fetching).

    Raises
    ------
    OSError
        Where the lock file cannot be opened or locked for another reason than a holder.
    """
    fd = os.open(lock_name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        if _try(fd, offset, length):
            return RangeLock(fd, offset, length), False
        deadline = time.monotonic() + max(0.0, wait_s)
        pause = 0.001
        while time.monotonic() < deadline:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            if _try(fd, offset, length):
                return RangeLock(fd, offset, length), True
            pause = min(pause * 2, 0.02)
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None, True


class FileLock:
    """An exclusive ``flock`` of one file, for the threads of this process in turn and for other processes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._threads = threading.Lock()

    def __enter__(self) -> FileLock:
        self._threads.acquire()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()
