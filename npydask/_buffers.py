"""Reusable memory for large chunk buffers.

A chunk read by copy (pread, a stacked group of files, a ROI, every chunk on
a ``dask.distributed`` worker) needs a fresh buffer, and fresh memory costs
a page fault per page touched: filling a new array takes about twice as
long as the same copy into memory touched before with transparent huge
pages, and several times as long without (figures on the performance
page). A worker reading a dataset allocates one such buffer
per task, and frees it as soon as the reduction after it has run.

:func:`empty` hands out arrays of at least :data:`MIN_BYTES` over anonymous
private mappings kept in a per-process :class:`BufferPool`. When the last
array viewing a buffer is gone (a ``weakref.finalize`` on the memoryview
numpy keeps as the arrays' base), the buffer goes back to the pool, which
keeps at most the ``pool_bytes`` setting (default 256 MiB; 0 turns pooling
off) of idle buffers and releases any idle for :data:`IDLE_SECONDS`. Idle
buffers are memory the process holds that dask does not count ("unmanaged"
in distributed's terms): the cap bounds it. A forked child starts with an
empty pool.

Below the pool sit the helpers every layer uses to move an array's bytes
exactly: :func:`raw` and :func:`raw_copy` (structured padding included),
:func:`exact_empty` (the dtype asked for, byte order included) and
:func:`as_bytes` (a flat ``uint8`` view).
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import threading
import time
import weakref
from typing import Any, NamedTuple

import numpy as np

from npydask import config

__all__ = [
    "MIN_BYTES",
    "BufferPool",
    "PooledBuffer",
    "ScratchPieces",
    "as_bytes",
    "empty",
    "exact_empty",
    "pieces",
    "pool",
    "pooled",
    "raw",
    "raw_copy",
    "scratch",
    "scratch_pieces",
]

MIN_BYTES = 1 << 20
"""Smaller arrays come from ``numpy.empty``: malloc's arenas already reuse such memory."""

IDLE_SECONDS = 5.0
"""An idle buffer is released after this long without being taken again."""

_GRAIN = 2 << 20  # sizes are rounded up to huge pages, so near sizes share buffers


class PooledBuffer(mmap.mmap):
    """Anonymous private memory owned by a :class:`BufferPool` (never a file's mapping)."""


class BufferPool:
    """Idle anonymous buffers by size, handed out again as 1-D ``uint8`` arrays.

    Examples
    --------
    >>> p = BufferPool()
    >>> a = p.take(5 << 20, limit=64 << 20); a[:3] = 7
    >>> a.nbytes, p.idle_bytes
    (5242880, 0)
    >>> del a
    >>> p.idle_bytes
    6291456
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entered when a collection frees an array mid-call
        self._idle: dict[int, list[tuple[float, PooledBuffer]]] = {}
        self._idle_bytes = 0
        self._timer: threading.Timer | None = None

    @property
    def idle_bytes(self) -> int:
        """Bytes of the buffers waiting to be taken again."""
        return self._idle_bytes

    def take(self, nbytes: int, *, limit: int) -> np.ndarray:
        """A writeable ``uint8`` array of ``nbytes`` whose buffer returns here when unused.

        ``limit`` caps the idle bytes kept when it comes back.
        """
        size = max(-(-nbytes // _GRAIN), 1) * _GRAIN
        buf = None
        with self._lock:
            stack = self._idle.get(size)
            if stack:
                _, buf = stack.pop()
                self._idle_bytes -= size
        if buf is None:
            buf = _new(size)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    buf.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass  # (a kernel without transparent huge pages)
        arr = np.frombuffer(buf, np.uint8, count=nbytes)
        # numpy keeps a memoryview of ``buf`` as the base of ``arr`` and of every view of it.
        done = weakref.finalize(arr.base, self._give, buf, limit)
        done.atexit = False
        return arr

    def _give(self, buf: PooledBuffer, limit: int) -> None:
        size = len(buf)
        with self._lock:
            if self._idle_bytes + size > limit:
                return  # over the cap: dropped, so unmapped
            self._idle.setdefault(size, []).append((time.monotonic(), buf))
            self._idle_bytes += size
            if self._timer is None:
                self._arm()

    def _arm(self) -> None:
        timer = threading.Timer(IDLE_SECONDS, self.trim)
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # interpreter shutdown: no new threads, and nothing left to trim for
            return
        self._timer = timer

    def trim(self, max_idle: float | None = None) -> None:
        """Release the buffers idle for ``max_idle`` seconds (default :data:`IDLE_SECONDS`) or more; 0: all."""
        if max_idle is None:
            max_idle = IDLE_SECONDS
        now = time.monotonic()
        with self._lock:
            for size, stack in list(self._idle.items()):
                keep = [(t, b) for t, b in stack if now - t < max_idle]
                self._idle_bytes -= size * (len(stack) - len(keep))
                if keep:
                    self._idle[size] = keep
                else:
                    del self._idle[size]
            self._timer = None
            if self._idle:
                self._arm()


def _new(size: int) -> PooledBuffer:
    """Fresh anonymous memory; ``MemoryError`` (saying how much) where the system refuses it."""
    try:
        return PooledBuffer(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as e:
        if e.errno != errno.ENOMEM:
            raise
        raise MemoryError(
            f"cannot allocate a buffer of {size} bytes ({size / (1 << 20):.1f} MiB): {e.strerror} "
            "(an address-space limit, `ulimit -v`, or memory exhausted)"
        ) from e


_POOL = BufferPool()


def pool() -> BufferPool:
    """This process's pool."""
    return _POOL


def _reset_after_fork() -> None:
    global _POOL
    _POOL = BufferPool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Like ``numpy.empty`` (C order); large arrays reuse pooled memory.

    Examples
    --------
    >>> empty((2, 3), "<f4").shape
    (2, 3)
    >>> big = empty((1024, 1024, 2), "<f4")
    >>> pooled(big), big.flags.writeable
    (True, True)
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES or config.get("pool_bytes") == 0:
        return exact_empty(shape, dtype)
    return _POOL.take(nbytes, limit=config.get("pool_bytes")).view(dtype).reshape(shape)


_local = threading.local()


def scratch(nbytes: int) -> np.ndarray:
    """A ``uint8`` buffer of ``nbytes`` for the calling thread, valid until its next call.

    Under :data:`MIN_BYTES` it is one buffer per thread, kept (a scratch
    allocated afresh for each strided read was faulted in each time, over a
    third of a small ROI read); larger ones come from :func:`empty`.

    Examples
    --------
    >>> a = scratch(1000); b = scratch(10)
    >>> a.nbytes, b.nbytes, a.ctypes.data == b.ctypes.data
    (1000, 10, True)
    """
    if nbytes >= MIN_BYTES:
        return empty((nbytes,), np.uint8)
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _local.buf = np.empty(max(nbytes, 64 << 10), np.uint8)
    return buf[:nbytes]


def pieces(buf: np.ndarray, size: int, n: int) -> list[list[memoryview]]:
    """``[[piece]]`` for ``n`` consecutive ``size``-byte pieces of ``buf``: ``os.preadv`` buffer lists."""
    mv = buf.data  # (the array's memoryview)
    return [[mv[j * size : (j + 1) * size]] for j in range(n)]


class ScratchPieces(NamedTuple):
    """A scratch buffer and its consecutive equal pieces, as ``os.preadv`` buffer lists."""

    buffer: np.ndarray
    pieces: list[list[memoryview]]


def scratch_pieces(size: int, n: int) -> ScratchPieces:
    """:func:`scratch` of ``size * n`` bytes and its :func:`pieces`, the pieces kept with the thread's buffer.

    A strided read cuts the same pieces of the same scratch for every file
    of a dataset: slicing them once saves slicing them at every read.

    Examples
    --------
    >>> buf, parts = scratch_pieces(100, 3)
    >>> [len(p[0]) for p in parts], scratch_pieces(100, 2)[1][1][0] is parts[1][0]
    ([100, 100, 100], True)
    """
    buf = scratch(size * n)
    if size * n >= MIN_BYTES:
        return ScratchPieces(buf, pieces(buf, size, n))
    base = _local.buf
    cached = getattr(_local, "pieces", None)
    if cached is None or cached[0] is not base or cached[1] != size or len(cached[2]) < n:
        cached = _local.pieces = (base, size, pieces(base, size, len(base) // size))
    return ScratchPieces(buf, cached[2][:n])


def pooled(arr: np.ndarray) -> bool:
    """Whether ``arr`` (or the array it views) lies in a pooled buffer."""
    base: Any = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, PooledBuffer)


# --------------------------------------------------------------------------
# Every byte of any array: structured padding, exact dtypes, flat byte views


def raw(a: np.ndarray) -> np.ndarray:
    """``a``, or for a structured dtype the same bytes viewed as ``V<itemsize>`` (any strides).

    numpy copies structured values field by field and leaves the padding
    between fields uninitialised; a copy through this view moves every byte.

    Examples
    --------
    >>> dt = np.dtype({"names": ["a"], "formats": ["u1"], "itemsize": 4})
    >>> raw(np.zeros(3, dt)).dtype, raw(np.zeros(3, "<f4")).dtype
    (dtype('V4'), dtype('float32'))
    """
    return a if a.dtype.names is None else a.view(np.dtype((np.void, a.dtype.itemsize)))


def raw_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``a`` with every byte, structured padding included."""
    return np.asarray(raw(a), order="C").view(a.dtype)  # (np.ascontiguousarray makes 0-d arrays 1-d)


def exact_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``numpy.empty(shape, dtype)`` with exactly ``dtype``.

    numpy makes a datetime or timedelta of generic units (``">m8"``)
    native-endian when it allocates, which would relabel a big-endian
    file's bytes as little-endian values: the array is viewed back as the
    dtype asked for.

    Examples
    --------
    >>> exact_empty((2,), np.dtype(">m8")).dtype.str
    '>m8'
    """
    out = np.empty(shape, dtype)
    return out if out.dtype.str == dtype.str else out.view(dtype)


def as_bytes(a: np.ndarray) -> np.ndarray:
    """A flat ``uint8`` view of a C-contiguous array of any dtype."""
    return a.reshape(-1).view(np.uint8)
