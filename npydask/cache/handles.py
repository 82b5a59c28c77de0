"""Extent files kept open for reading: a warm read is one ``preadv``, not an open, a read and a close.

Rules:

- At most ``capacity`` files are kept open per process (least recently used closed first), a
  file in use by a reader is closed only when its last reader is done.
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

__all__ = ["OpenExtents", "default_capacity"]

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
    __slots__ = ("fd", "path", "retired", "users")

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path, self.users, self.retired = fd, path, 1, False


class OpenExtents:
    """The extent files of one cache folder that this process keeps open."""

    def __init__(self, dir_fd: int, capacity: int) -> None:
        self.dir_fd, self.capacity = dir_fd, capacity
        self._open: OrderedDict[str, _Handle] = OrderedDict()
        self._lock = threading.Lock()

    def use(self, path: str, read: Callable[[int], bool]) -> bool:
        """``read(fd)`` on the open file ``path`` (relative to the folder); its result (``False`` if missing).

        A ``False`` from ``read`` (damage) drops the descriptor.
        """
        handle = self._get(path)
        if handle is None:
            return False
        ok = False
        try:
            ok = read(handle.fd)
            return ok
        finally:
            self._put(handle, drop=not ok)

    def forget(self, path: str) -> None:
        """Drop ``path``'s descriptor (its file was removed or replaced)."""
        with self._lock:
            handle = self._open.pop(path, None)
            close = handle is not None and self._retire(handle)
        if close:
            assert handle is not None
            os.close(handle.fd)

    def forget_all(self) -> None:
        """Drop every descriptor (files were removed: ``npydask cache clear`` or ``prune``)."""
        with self._lock:
            handles = list(self._open.values())
            self._open.clear()
            closing = [h.fd for h in handles if self._retire(h)]
        for fd in closing:
            os.close(fd)

    def _get(self, path: str) -> _Handle | None:
        with self._lock:
            handle = self._open.get(path)
            if handle is not None:
                self._open.move_to_end(path)
                handle.users += 1
                return handle
        try:
            fd = os.open(path, _FLAGS, dir_fd=self.dir_fd)
        except OSError:
            return None
        closing: list[int] = []
        with self._lock:
            handle = self._open.get(path)
            if handle is not None:  # (another thread opened it meanwhile)
                handle.users += 1
                closing.append(fd)
            else:
                handle = self._open[path] = _Handle(fd, path)
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
            if drop and self._open.get(handle.path) is handle:
                del self._open[handle.path]
                handle.retired = True
            close = handle.retired and handle.users == 0
        if close:
            os.close(handle.fd)

    @staticmethod
    def _retire(handle: _Handle) -> bool:
        """Mark ``handle`` out of the table; whether it may be closed now (no reader holds it)."""
        handle.retired = True
        return handle.users == 0
