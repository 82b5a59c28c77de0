"""Making a file cold for tests of reads that ask the page cache."""

from __future__ import annotations

import os

from npydask.storage import acquire, clear_cache, pages_cached


def evict(path: str) -> bool:
    """Drop ``path``'s pages from the page cache (the handle cache's mappings first); whether that took.

    ``False`` where the file system keeps a file's pages in memory (tmpfs).
    """
    clear_cache()  # (a mapping held by the handle cache keeps its pages)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    cold = not pages_cached(acquire(path), [0, os.path.getsize(path) // 2])
    clear_cache()
    return cold
