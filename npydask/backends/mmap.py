"""The ``mmap`` backend: a read-only mapping of just the bytes a region spans.

A region that is one contiguous run in C layout comes back as a zero-copy,
read-only view of a mapping made with ``MAP_POPULATE`` (the pages are wired
in by the kernel at once instead of faulting one by one); anything else is
copied out of the mapping with one strided copy and the mapping is dropped.

Truncation: touching a mapped page past the end of a file that shrank kills
the process with ``SIGBUS``. The file's size is checked with ``fstat`` right
before mapping, and a mapping lives only as long as the array viewing it, so
the remaining window is a truncation between that check and the copy (for a
copy) or during the life of a zero-copy view. Use the ``pread`` backend for
files other processes may truncate.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import ClassVar

import numpy as np

from npydask.backends._files import OpenFile
from npydask.backends.base import Backend, copy_runs, same_layout
from npydask.config import ReadOptions
from npydask.errors import FileChangedError
from npydask.region import ReadPlan

__all__ = ["MmapBackend"]

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class MmapBackend(Backend):
    """Map, then view (contiguous regions) or copy (everything else)."""

    name: ClassVar[str] = "mmap"

    def read(self, f: OpenFile, plan: ReadPlan, options: ReadOptions, out: np.ndarray | None = None) -> np.ndarray:
        dtype = f.header.dtype
        if plan.n_runs == 0:
            return np.empty(plan.shape, dtype) if out is None else out
        zero_copy = out is None and plan.is_contiguous and same_layout(plan)
        base = _map(f, plan.offset, plan.end, populate=zero_copy)
        if zero_copy:
            return base.view(dtype).reshape(plan.shape)
        return copy_runs(base, plan, dtype, out)


def _map(f: OpenFile, start: int, end: int, *, populate: bool) -> np.ndarray:
    """A read-only ``uint8`` array over bytes ``[start, end)`` of the file."""
    size = os.fstat(f.fd).st_size
    if size < end:
        raise FileChangedError(
            errno.EIO,
            f"file is {size} bytes but the region ends at byte {end}: it was truncated after opening; re-open it",
            f.path,
        )
    lo = start - start % mmap.ALLOCATIONGRANULARITY
    flags = mmap.MAP_SHARED | (_POPULATE if populate else 0)
    m = mmap.mmap(f.fd, end - lo, flags=flags, prot=mmap.PROT_READ, offset=lo)
    return np.frombuffer(m, np.uint8, count=end - start, offset=start - lo)
