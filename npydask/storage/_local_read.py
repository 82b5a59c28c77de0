"""Reading local files: ``preadv`` loops through the page cache, or ``O_DIRECT`` through an aligned scratch.

Runs are read straight into the result when they are far apart; runs whose
gaps are under the ``gap_bytes`` setting are read as one span, either into a
scratch buffer and cut out with a strided copy (the ``spans`` strategy) or
scattered by one ``preadv`` straight into the result (``runs``), whichever
the cost model of :mod:`npydask.plan.read_strategy` prices lower for the region
(or the ``roi_strategy`` setting forces). Reads never move a shared file
position (``os.preadv`` only), so threads share descriptors safely.

With the ``direct_io`` setting each read is rounded out to 4096 bytes and
goes through an aligned scratch buffer on a second, ``O_DIRECT`` descriptor,
bypassing the page cache; where the file system refuses ``O_DIRECT`` (tmpfs,
some network file systems) a warning is issued and the page cache is used.

Many spans of one file (a batch's patches) are read with up to
:data:`SPAN_READS` ``preadv`` calls in flight: a disk serves several
reads at once, and reads that miss the page cache wait on it one at a time
otherwise. :func:`pages_cached` tells whether bytes are in the page cache
without reading the disk (a one-byte ``preadv`` with ``RWF_NOWAIT``).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from npydask._buffers import scratch_pieces
from npydask.config import ReadOptions
from npydask.plan.patch_runs import Spans
from npydask.plan.region import ReadPlan, align_span, region_spans
from npydask.storage._handles import OpenFile, acquire, pread_exact
from npydask.storage._iovec import read_iovecs
from npydask.storage._runs import BATCH_BYTES, grid, pread_strategy, read_plan
from npydask.storage.identity import FileIdentity, HeaderCheck, check_unchanged

__all__ = [
    "DIRECT_ALIGNMENT",
    "DirectReader",
    "FdReader",
    "ScratchSpans",
    "SPAN_READS",
    "SPAN_SPLIT_BYTES",
    "aligned_empty",
    "pages_cached",
    "preadv_all",
    "read_fd",
    "read_grid",
    "read_local",
    "read_local_spans",
    "read_scratch_spans",
    "scratch_spans",
]

DIRECT_ALIGNMENT = 4096

SPAN_READS = 8
"""``preadv`` calls in flight when one file's many spans are read (figures on the performance page)."""

SPAN_SPLIT_BYTES = 4 << 20
"""Spans of fewer bytes than this in all are read by the calling thread alone."""

_NOWAIT = getattr(os, "RWF_NOWAIT", None)
_CANNOT_TELL = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)

_DIRECT_PIECE = 16 * 1024 * 1024


def aligned_empty(nbytes: int, alignment: int = DIRECT_ALIGNMENT) -> np.ndarray:
    """A ``uint8`` buffer of ``nbytes`` whose address is a multiple of ``alignment``."""
    raw = np.empty(nbytes + alignment, np.uint8)
    shift = -raw.ctypes.data % alignment
    return raw[shift : shift + nbytes]


def read_local(f: OpenFile, plan: ReadPlan, options: ReadOptions, raw: np.ndarray) -> None:
    """Fill ``raw`` (``plan``'s bytes in file order) from a local file by :func:`pread_strategy`'s choice."""
    if not options.direct_io:
        read_fd(f.fd, f.path, plan, options, raw)
        return
    pread_strategy(plan, options)  # (O_DIRECT reads spans: this raises where roi_strategy forces another)
    read_plan(DirectReader(f), plan, options, raw)


def read_fd(fd: int, path: str, plan: ReadPlan, options: ReadOptions, raw: np.ndarray) -> None:
    """:func:`read_local` of a bare descriptor through the page cache (``direct_io`` is not looked at).

    For loops that open, read and close a file themselves (a group's ROIs):
    no handle, no header parsed, the same strategies.
    """
    if pread_strategy(plan, options) == "runs":
        read_iovecs(fd, path, plan, options.gap_bytes, options.max_span_bytes, raw)
    else:
        read_plan(FdReader(fd, path), plan, options, raw)


@dataclass(frozen=True)
class ScratchSpans:
    """:func:`read_plan`'s spans strategy for one plan whose spans fit one scratch buffer, worked out once.

    A group reads the same ROI of many files: the strategy, the spans, the
    scratch's pieces and the strided view that cuts the runs out of it are
    the same for every file, so :func:`read_scratch_spans` only issues the
    reads and one copy. Valid in the thread that made it (the scratch is
    that thread's).
    """

    parts: list[list[memoryview]]
    """One ``[memoryview]`` of the scratch per span, as ``os.preadv`` takes it."""
    size: int
    """Bytes per span."""
    offsets: tuple[int, ...]
    """File offset of each span."""
    grid: np.ndarray
    """The runs inside the scratch (a strided ``uint8`` view)."""
    shape: tuple[int, ...]
    """The destination's shape for one copy of ``grid``."""


def scratch_spans(plan: ReadPlan, options: ReadOptions) -> ScratchSpans | None:
    """The prepared spans read of ``plan``, or ``None`` where :func:`read_fd` does something else.

    That is where the cost model (or ``roi_strategy``) picks runs, a span is
    a single run (read straight into place), the spans outgrow one scratch
    batch, or ``direct_io`` is set.
    """
    if options.direct_io or plan.n_runs <= 1 or pread_strategy(plan, options) != "spans":
        return None
    co, offsets = region_spans(plan, options.gap_bytes, options.max_span_bytes)
    if len(co.inner_shape) == 1 or co.n_spans * co.span_nbytes > BATCH_BYTES:
        return None
    scratch, parts = scratch_pieces(co.span_nbytes, co.n_spans)
    return ScratchSpans(parts, co.span_nbytes, offsets, grid(scratch, co, co.n_spans), (co.n_spans, *co.inner_shape))


def read_scratch_spans(fd: int, path: str, spans: ScratchSpans, raw: np.ndarray) -> None:
    """Fill ``raw`` from ``fd`` as :func:`read_fd` would, by the prepared ``spans``: the reads, then one copy.

    Between two reads there is one loop step of Python: two threads
    reading this way overlap their system calls (through :func:`read_fd`,
    whose per-file planning lookups hold the GIL, two threads take as long
    as one).
    """
    preadv_all(fd, path, spans.parts, spans.size, spans.offsets)
    np.copyto(raw.reshape(spans.shape), spans.grid)


def preadv_all(fd: int, path: str, iovecs: Sequence[list[memoryview]], size: int, offsets: Sequence[int]) -> None:
    """``size`` bytes at each offset into the matching ``[memoryview]``: a tight loop of ``os.preadv``.

    A strided region is many small reads, so per-read Python overhead
    matters; a short read is completed by :func:`pread_exact` (which raises
    at the end of a truncated file).
    """
    preadv = os.preadv
    for bufs, offset in zip(iovecs, offsets):
        got = preadv(fd, bufs, offset)
        if got != size:
            pread_exact(fd, bufs[0][got:], offset + got, path)


class FdReader:
    """Reads byte ranges of one descriptor through the page cache."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, path

    def read_into(self, dest: np.ndarray, offset: int) -> None:
        pread_exact(self.fd, dest.data, offset, self.path)  # (.data: the array's memoryview)

    def read_many(self, iovecs: Sequence[list[memoryview]], size: int, offsets: Sequence[int]) -> None:
        """Read ``size`` bytes at each offset into the matching ``[memoryview]`` (:func:`preadv_all`)."""
        preadv_all(self.fd, self.path, iovecs, size, offsets)


class DirectReader(FdReader):
    """Reads byte ranges of one open file through ``O_DIRECT``, or the page cache where that is refused."""

    def __init__(self, f: OpenFile) -> None:
        super().__init__(f.fd, f.path)
        self.f = f
        # Hold the O_DIRECT handle itself, not just its number: the file may
        # drop it meanwhile (another thread finding O_DIRECT refused).
        self.direct = f.direct_file()
        self._scratch: np.ndarray | None = None

    def read_into(self, dest: np.ndarray, offset: int) -> None:
        if self.direct is not None:
            try:
                self._read_direct(dest, offset)
                return
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.f.refuse_direct(e)
                self.direct = None
        super().read_into(dest, offset)

    def read_many(self, iovecs: Sequence[list[memoryview]], size: int, offsets: Sequence[int]) -> None:
        if self.direct is not None:
            for bufs, offset in zip(iovecs, offsets):
                self.read_into(np.frombuffer(bufs[0], np.uint8), offset)
            return
        super().read_many(iovecs, size, offsets)

    def _read_direct(self, dest: np.ndarray, offset: int) -> None:
        assert self.direct is not None
        fd = self.direct.fileno()
        size = self.f.identity.size
        done = 0
        while done < len(dest):
            piece = min(len(dest) - done, _DIRECT_PIECE)
            lo, length = align_span(offset + done, piece, DIRECT_ALIGNMENT)
            # At the end of the file only the bytes up to EOF come back.
            wanted = min(length, max(size - lo, 0))
            wanted = -(-wanted // DIRECT_ALIGNMENT) * DIRECT_ALIGNMENT
            if self._scratch is None or len(self._scratch) < length:
                self._scratch = aligned_empty(max(length, DIRECT_ALIGNMENT))
            scratch = self._scratch[:length]
            got = 0
            # Stop at EOF: a short read there leaves an unaligned offset that
            # O_DIRECT would refuse (EINVAL), which is not a refusal of O_DIRECT.
            while got < wanted and lo + got < size:
                n = os.preadv(fd, [scratch[got:wanted].data], lo + got)
                if n == 0:
                    break
                got += n
            skip = offset + done - lo
            if got < skip + piece:
                pread_exact(self.f.fd, dest[done : done + piece].data, offset + done, self.f.path)
            else:
                dest[done : done + piece] = scratch[skip : skip + piece]
            done += piece


def read_grid(
    path: str,
    identity: FileIdentity,
    plan: ReadPlan,
    options: ReadOptions,
    raw: np.ndarray,
    check: HeaderCheck | None = None,
) -> None:
    """Fill ``raw`` (C-contiguous ``uint8``) with ``plan``'s bytes of ``path`` in file order.

    The short way for a group's strided reads (ROIs of many files): the
    cached descriptor is checked against ``identity`` (and its header
    against ``check``), read through the page cache (spans or scattered
    runs, see :func:`pread_strategy`), or ``O_DIRECT`` with the
    ``direct_io`` setting, and checked against ``identity`` again.

    Raises
    ------
    FileChangedError
        If the file is no longer the one ``identity`` describes, before or after the read.
    NpyFormatError
        If its header bytes are not ``check.raw``.
    ValueError
        If the ``roi_strategy`` setting forces ``"mapped"`` (this path never maps).
    """
    f = acquire(path, identity, check=check)
    read_local(f, plan, options, raw)
    check_unchanged(f.fd, f.identity, path)  # (the whole identity acquire found, even for an inode-only one)


def read_local_spans(f: OpenFile, spans: Spans, dest: np.ndarray, options: ReadOptions) -> int:
    """Fill ``dest`` with ``spans`` of ``f`` (back to back at their positions): one ``preadv`` per span on its
    cached descriptor, through :class:`DirectReader` with ``direct_io``. Returns the spans read (a short read is
    completed by more, not counted); the caller checks the file afterwards.

    Spans of :data:`SPAN_SPLIT_BYTES` or more in all are read by up to
    :data:`SPAN_READS` threads at once, each a run of consecutive spans of
    about equal bytes (the first error raised is the one reported)."""
    offsets, lengths, positions = spans.offsets.tolist(), spans.lengths.tolist(), spans.positions.tolist()
    if options.direct_io:
        direct = DirectReader(f)
        for offset, n, at in zip(offsets, lengths, positions):
            direct.read_into(dest[at : at + n], offset)
        return len(offsets)
    parts = min(SPAN_READS, len(offsets)) if spans.nbytes >= SPAN_SPLIT_BYTES else 1
    if parts <= 1:
        _read_spans(f, dest, offsets, lengths, positions)
        return len(offsets)
    cuts = np.searchsorted(np.cumsum(spans.lengths), np.arange(1, parts) * (spans.nbytes / parts))
    bounds = [0, *sorted({int(c) + 1 for c in cuts if 0 <= c < len(offsets) - 1}), len(offsets)]
    pool = _span_pool()
    done = [
        pool.submit(_read_spans, f, dest, offsets[a:b], lengths[a:b], positions[a:b])
        for a, b in zip(bounds, bounds[1:])
    ]
    errors = [e for e in (d.exception() for d in done) if e is not None]  # (every read ends before the return)
    if errors:
        raise errors[0]
    return len(offsets)


def _read_spans(f: OpenFile, dest: np.ndarray, offsets: list[int], lengths: list[int], positions: list[int]) -> None:
    """The ``preadv`` loop over some spans."""
    mv = dest.data
    fd, path, preadv = f.fd, f.path, os.preadv
    for offset, n, at in zip(offsets, lengths, positions):
        part = mv[at : at + n]
        got = preadv(fd, [part], offset)
        if got != n:
            pread_exact(fd, part[got:], offset + got, path)


_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _span_pool() -> ThreadPoolExecutor:
    """This process's threads for span reads (made on first use; a forked child makes its own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(SPAN_READS, thread_name_prefix="npydask-spans")
        return _pool


def _forget_pool() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def pages_cached(f: OpenFile, offsets: Sequence[int]) -> bool:
    """Whether the bytes at ``offsets`` of ``f`` are in the page cache, asked without reading the disk.

    One one-byte ``preadv`` with ``RWF_NOWAIT`` per offset: it fails with
    ``EAGAIN`` where the byte's page would have to be read. Where the flag
    is unknown (not Linux) or the file system refuses it, the answer is
    ``True`` (the caller's choice for memory).

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.zeros(10_000))
    >>> f = acquire(p)
    >>> pages_cached(f, [0, 8192, 80_000])  # (just written: in the page cache)
    True
    """
    if _NOWAIT is None:
        return True
    probe = [memoryview(bytearray(1))]
    fd = f.fd
    for offset in offsets:
        try:
            os.preadv(fd, probe, offset, _NOWAIT)
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno in _CANNOT_TELL:
                return True
            raise OSError(e.errno, f"cannot ask whether bytes are cached: {e.strerror}", f.path) from e
    return True
