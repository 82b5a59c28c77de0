"""Making a file cold: its pages dropped from the kernel's page cache, for tests and benchmarks of cold reads."""

from __future__ import annotations

import ctypes
import mmap
import os

from npydask.storage import clear_cache


def drop_page_cache(path: str | os.PathLike[str]) -> bool:
    """Drop the cached pages of the local file at ``path``; whether they are all gone.

    Clears npydask's per-process handle cache first (a memory mapping it holds
    keeps the file's pages), writes the file's dirty pages back (``fsync``: the
    kernel drops only clean pages), asks the kernel to drop them
    (``posix_fadvise(POSIX_FADV_DONTNEED)``), then counts the pages still
    cached with ``mincore``, which reads nothing (a probing read would start
    read-ahead and bring pages back). The handle cache is left empty.

    Returns ``False`` where pages stay: a file system that keeps files in
    memory (tmpfs), another process's mapping or read of the file, or a
    platform without ``posix_fadvise`` (macOS). Root is not needed (unlike
    ``echo 1 > /proc/sys/vm/drop_caches``), and other files' pages are left
    alone.

    Parameters
    ----------
    path : str or os.PathLike
        A regular local file.

    Returns
    -------
    bool
        Whether none of the file's pages is in the page cache.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from npydask.testing import drop_page_cache
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.zeros(100_000))
    >>> isinstance(drop_page_cache(p), bool)  # (False on tmpfs)
    True
    """
    path = os.fspath(path)
    clear_cache()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if not hasattr(os, "posix_fadvise"):
            return os.fstat(fd).st_size == 0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return cached_pages(fd) == 0
    finally:
        os.close(fd)


def cached_pages(fd: int) -> int:
    """How many pages of the open file ``fd`` are in the page cache (``mincore`` over a mapping; nothing is read).

    Examples
    --------
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "b"); open(p, "wb").write(b"x" * 10_000)
    10000
    >>> fd = os.open(p, os.O_RDONLY); cached_pages(fd) <= 3; os.close(fd)
    True
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        e = ctypes.get_errno()
        raise OSError(e, f"cannot map the file to count its cached pages: {os.strerror(e)}")
    try:
        resident = (ctypes.c_ubyte * (-(-size // mmap.PAGESIZE)))()
        if libc.mincore(address, size, resident) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"cannot count the file's cached pages: {os.strerror(e)}")
        return sum(b & 1 for b in resident)
    finally:
        libc.munmap(address, size)
