"""The ``mmap`` backend: read-only views of one shared mapping per open file.

Each cached open file (see :func:`~npydask.storage.acquire`) maps its
payload once, on first use; every chunk of that file is then a slice of the
same mapping. A region that is one contiguous run in C layout comes back as a
zero-copy, read-only view; anything else is copied out with one strided copy.
Mapping once per file instead of once per chunk saves the page-table set-up
and tear-down of every chunk (figures on the performance page). The
mapping is dropped with the cache entry; views keep it alive as long as they
live.

Truncation: touching a mapped page past the end of a file that shrank kills
the process with ``SIGBUS``. Every task first checks the file's identity
(size, mtime, inode; a truncated file fails with ``FileChangedError``), and
this backend checks the size with ``fstat`` again right before touching the
mapping; after a copy the reader checks the identity once more (a rewrite
in place during the copy raises ``FileChangedError``). A copy is made only
under a read lease (:func:`~npydask.storage.truncation_blocked`), which
keeps every process from truncating the file until the copy is done; where
no lease can be had (the file is open for writing elsewhere, belongs to
another user and the process lacks ``CAP_LEASE``, or sits on a file system
without leases) the same bytes are read with ``pread`` instead. The
remaining window is the life of a zero-copy view, which also shows later
writes: use the ``pread`` backend for files other processes may truncate
while results are alive.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import os
from typing import ClassVar, cast

import numpy as np

from npydask._buffers import exact_empty
from npydask.backends.base import Backend, copy_runs
from npydask.backends.pread import PreadBackend
from npydask.config import ReadOptions
from npydask.errors import FileChangedError
from npydask.plan.read_strategy import choose
from npydask.plan.region import ReadPlan, same_layout
from npydask.storage import OpenFile, clear_cache, truncation_blocked
from npydask.storage.base import OpenedFile, Source
from npydask.storage.local import LOCAL

__all__ = ["MapError", "MmapBackend"]


class MapError(OSError):
    """The file could not be mapped (the ``auto`` backend then reads it with pread)."""


class MmapBackend(Backend):
    """Map, then view (contiguous regions) or copy (everything else: the ``mapped`` strategy of
    :mod:`npydask.plan.read_strategy`, which ``"auto"`` also picks where the cost model prices it lowest)."""

    name: ClassVar[str] = "mmap"

    def read(
        self,
        f: OpenedFile,
        plan: ReadPlan,
        options: ReadOptions,
        out: np.ndarray | None = None,
        *,
        source: Source = LOCAL,
    ) -> np.ndarray:
        dtype = f.header.dtype
        if plan.n_runs == 0:
            return exact_empty(plan.shape, dtype) if out is None else out
        if plan.n_runs > 1 and options.roi_strategy not in ("auto", "mapped"):  # (raises for a forced spans or runs)
            choose(plan, options.gap_bytes, options.max_span_bytes, _MAPPED, options.roi_strategy)
        # (a local file from the handle cache: the reader refuses "mmap" for sources that cannot map)
        opened = cast(OpenFile, f)
        if out is None and plan.is_contiguous and same_layout(plan):
            return _mapped(opened, plan.end)[plan.offset : plan.end].view(dtype).reshape(plan.shape)
        with truncation_blocked(opened) as held:
            if held:  # (no process can truncate the file until the copy is made)
                return copy_runs(_mapped(opened, plan.end)[plan.offset : plan.end], plan, dtype, out)
        # (a truncation would kill the copy with SIGBUS: read the same bytes with pread instead)
        return _PREAD.read(f, plan, dataclasses.replace(options, roi_strategy="auto"), out, source=source)


_MAPPED = ("mapped",)
_PREAD = PreadBackend()


def _map(fd: int, length: int) -> mmap.mmap:
    """A shared read-only mapping (Python's mmap keeps a duplicate descriptor: retried once on ``EMFILE``)."""
    try:
        return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
    clear_cache()
    return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)


def _mapped(f: OpenFile, end: int) -> np.ndarray:
    """The file's shared read-only mapping as ``uint8``, after checking it still reaches ``end``."""
    size = os.fstat(f.fd).st_size
    if size < end:
        raise FileChangedError(
            errno.EIO,
            f"file is {size} bytes but the region ends at byte {end}: it was truncated after opening; re-open it",
            f.path,
        )
    whole = f.mapping
    if whole is None:
        with f.lock:
            if f.mapping is None:
                payload_end = f.header.data_offset + f.header.nbytes
                try:
                    m = _map(f.fd, payload_end)
                except OSError as e:  # ENOMEM under an address-space limit, a file system without mmap...
                    raise MapError(
                        e.errno,
                        f"cannot map the file's {payload_end} bytes ({e.strerror}); use backend='pread'",
                        f.path,
                    ) from e
                f.mapping = np.frombuffer(m, np.uint8)
            whole = f.mapping
    return whole
