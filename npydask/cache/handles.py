"""Extent files kept open for reading: a warm read is one ``preadv``, not an open, a read and a close.

Rules:

- At most :func:`default_capacity` files are kept open per process, whatever number of cache
  folders it reads (one table for all; least recently used closed first); a file in use by a
  reader is closed only when its last reader is done.
- An extent file's bytes never change under its name: the name is its entry (object version)
  and its range, so a file removed and written again holds the same bytes. A descriptor kept
  open across a removal (eviction, another process's repair) still reads a valid extent, and every
  read checks the header and the blocks anyway; a read that finds damage drops the descriptor, so
  the next read opens the name again. A removed file's space is freed when its descriptor is
  closed: at most ``capacity`` such files per process.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["ExtentTable", "OpenExtents", "default_capacity", "process_table"]

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def default_capacity() -> int:
    """4,096 files, or a quarter of the process's open-file limit where that is less (at least 8)."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return 64
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(8, min(4096, soft // 4))


class _Handle:
    __slots__ = ("fd", "key", "retired", "users")

    def __init__(self, fd: int, key: tuple[int, str]) -> None:
        self.fd, self.key, self.users, self.retired = fd, key, 1, False


class ExtentTable:
    """The extent files a process keeps open, of every cache folder: at most ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._open: OrderedDict[tuple[int, str], _Handle] = OrderedDict()
        self._lock = threading.Lock()

    def use(self, dir_fd: int, path: str, read: Callable[[int], bool]) -> bool:
        """``read(fd)`` on the open file ``path`` of the folder ``dir_fd``; its result (``False`` if missing).

        A ``False`` from ``read`` (damage) drops the descriptor.
        """
        handle = self._get(dir_fd, path)
        if handle is None:
            return False
        ok = False
        try:
            ok = read(handle.fd)
            return ok
        finally:
            self._put(handle, drop=not ok)

    def forget(self, dir_fd: int, path: str) -> None:
        """Drop ``path``'s descriptor (its file was removed or replaced)."""
        with self._lock:
            handle = self._open.pop((dir_fd, path), None)
            close = handle is not None and self._retire(handle)
        if close:
            assert handle is not None
            os.close(handle.fd)

    def forget_all(self, dir_fd: int) -> None:
        """Drop every descriptor of the folder ``dir_fd`` (files were removed: ``clear`` or ``prune``)."""
        with self._lock:
            keys = [k for k in self._open if k[0] == dir_fd]
            handles = [self._open.pop(k) for k in keys]
            closing = [h.fd for h in handles if self._retire(h)]
        for fd in closing:
            os.close(fd)

    def _get(self, dir_fd: int, path: str) -> _Handle | None:
        key = (dir_fd, path)
        with self._lock:
            handle = self._open.get(key)
            if handle is not None:
                self._open.move_to_end(key)
                handle.users += 1
                return handle
        try:
            fd = os.open(path, _FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
        closing: list[int] = []
        with self._lock:
            handle = self._open.get(key)
            if handle is not None:  # (another thread opened it meanwhile)
                handle.users += 1
                closing.append(fd)
            else:
                handle = self._open[key] = _Handle(fd, key)
                while len(self._open) > self.capacity:
                    _, old = self._open.popitem(last=False)
                    if self._retire(old):
                        closing.append(old.fd)
        for old_fd in closing:
            os.close(old_fd)
        return handle

    def _put(self, handle: _Handle, *, drop: bool) -> None:
        with self._lock:
            handle.users -= 1
            if drop and self._open.get(handle.key) is handle:
                del self._open[handle.key]
                handle.retired = True
            close = handle.retired and handle.users == 0
        if close:
            os.close(handle.fd)

    @staticmethod
    def _retire(handle: _Handle) -> bool:
        """Mark ``handle`` out of the table; whether it may be closed now (no reader holds it)."""
        handle.retired = True
        return handle.users == 0


_TABLE: ExtentTable | None = None
_TABLE_LOCK = threading.Lock()


def process_table() -> ExtentTable:
    """This process's one :class:`ExtentTable` (of :func:`default_capacity` files)."""
    global _TABLE
    with _TABLE_LOCK:
        if _TABLE is None:
            _TABLE = ExtentTable(default_capacity())
        return _TABLE


class OpenExtents:
    """The open extent files of one cache folder: its part of a process's :class:`ExtentTable`."""

    def __init__(self, dir_fd: int, table: ExtentTable | None = None) -> None:
        self.dir_fd = dir_fd
        self.table = process_table() if table is None else table

    def use(self, path: str, read: Callable[[int], bool]) -> bool:
        """``read(fd)`` on the open file ``path`` (see :meth:`ExtentTable.use`)."""
        return self.table.use(self.dir_fd, path, read)

    def forget(self, path: str) -> None:
        """Drop ``path``'s descriptor."""
        self.table.forget(self.dir_fd, path)

    def forget_all(self) -> None:
        """Drop every descriptor of this folder."""
        self.table.forget_all(self.dir_fd)
