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
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from npydask._buffers import scratch_pieces
from npydask.config import ReadOptions
from npydask.plan.patch_runs import Spans
from npydask.plan.region import ReadPlan, align_span
from npydask.storage._handles import OpenFile, acquire, pread_exact
from npydask.storage._iovec import read_iovecs
from npydask.storage._runs import BATCH_BYTES, coalesced, grid, pread_strategy, read_plan
from npydask.storage.identity import FileIdentity, HeaderCheck, check_unchanged

__all__ = [
    "DIRECT_ALIGNMENT",
    "DirectReader",
    "FdReader",
    "ScratchSpans",
    "aligned_empty",
    "preadv_all",
    "read_fd",
    "read_grid",
    "read_local",
    "read_local_spans",
    "read_scratch_spans",
    "scratch_spans",
]

DIRECT_ALIGNMENT = 4096

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
    co, offsets = coalesced(plan, options.gap_bytes, max(options.max_span_bytes, plan.run_nbytes))
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
    completed by more, not counted); the caller checks the file afterwards."""
    mv = dest.data
    offsets, lengths, positions = spans.offsets.tolist(), spans.lengths.tolist(), spans.positions.tolist()
    if options.direct_io:
        direct = DirectReader(f)
        for offset, n, at in zip(offsets, lengths, positions):
            direct.read_into(dest[at : at + n], offset)
    else:
        fd, path, preadv = f.fd, f.path, os.preadv
        for offset, n, at in zip(offsets, lengths, positions):
            part = mv[at : at + n]
            got = preadv(fd, [part], offset)
            if got != n:
                pread_exact(fd, part[got:], offset + got, path)
    return len(offsets)
