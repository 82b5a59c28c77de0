"""The ``runs`` strategy (:mod:`npydask.plan.read_strategy`): scattered ``preadv`` straight into the result.

Each span of a plan (runs closer than ``gap_bytes``, as the ``spans``
strategy reads them) is read with ``preadv`` whose iovecs alternate the
runs' places in the result with the gaps, which all land in one discarded
scratch buffer. No second copy is made; the kernel still copies the gaps.
A span of more than :data:`~npydask.plan.read_strategy.IOV_RUNS` runs is read in
several calls (Linux takes at most 1024 iovecs per call).

The plan's layout (each call's offset, first run and gaps) is worked out
once per plan and memoised; per read, only the runs' buffers are sliced.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from npydask.plan.read_strategy import IOV_RUNS
from npydask.plan.region import ReadPlan, grid_offsets
from npydask.storage._handles import pread_exact

__all__ = ["IovLayout", "iov_layout", "read_iovecs"]


@dataclass(frozen=True, eq=False)
class IovLayout:
    """The ``preadv`` calls of one plan: where each reads, which runs it fills, and its gap buffers."""

    offsets: tuple[int, ...]
    """File offset of each call."""
    first_runs: tuple[int, ...]
    """Index (in the result's run order) of each call's first run."""
    counts: tuple[int, ...]
    """Runs each call fills."""
    nbytes: tuple[int, ...]
    """Bytes each call reads, gaps included."""
    gaps: tuple[tuple[memoryview, ...], ...]
    """Per call, the scratch buffers for the gaps between its runs (views of one shared buffer)."""


_gap_lock = threading.Lock()
_gap_buffer = bytearray(0)
"""Where every gap lands, shared by all layouts and threads: its bytes are never read."""


def _gap_views(lengths: Sequence[int]) -> tuple[memoryview, ...]:
    global _gap_buffer
    need = max(lengths, default=0)
    with _gap_lock:
        if len(_gap_buffer) < need:
            _gap_buffer = bytearray(need)  # (layouts made before keep the old one alive through their views)
        mv = memoryview(_gap_buffer)
    return tuple(mv[:n] for n in lengths)


def iov_layout(plan: ReadPlan, gap_bytes: int, max_span_bytes: int) -> IovLayout:
    """The calls reading ``plan`` with runs coalesced as the ``spans`` strategy would (memoised).

    Examples
    --------
    >>> from npydask.format.header import NpyHeader
    >>> from npydask.plan.region import Box, plan_read
    >>> plan = plan_read(NpyHeader((1, 0), (4, 6), np.dtype("<f4"), False, 128, 96), Box((1, 2), (3, 5)))
    >>> lay = iov_layout(plan, 4096, 1 << 20)
    >>> lay.offsets, lay.counts, lay.nbytes, [len(g) for g in lay.gaps[0]]
    ((160,), (2,), (36,), [12])
    """
    return _iov_layout(plan, gap_bytes, max(max_span_bytes, plan.run_nbytes))


@functools.lru_cache(maxsize=256)
def _iov_layout(plan: ReadPlan, gap_bytes: int, max_span_bytes: int) -> IovLayout:
    co = plan.coalesce(gap_bytes, max_span_bytes)
    run = plan.run_nbytes
    per_span = co.n_spans and plan.n_runs // co.n_spans
    # The runs' offsets inside a span (ascending: C order over positive strides).
    inner = grid_offsets(0, co.inner_shape[:-1], co.inner_strides[:-1])
    gaps = (inner[1:] - inner[:-1] - run).tolist()
    pieces = []  # (offset in span, first run in span, runs, bytes, gap lengths)
    for a in range(0, per_span, IOV_RUNS):
        b = min(a + IOV_RUNS, per_span)
        lo = int(inner[a])
        pieces.append((lo, a, b - a, int(inner[b - 1]) + run - lo, gaps[a : b - 1]))
    views = {k: _gap_views(g) for k, (*_, g) in enumerate(pieces)}
    offsets, firsts, counts, sizes, gap_views = [], [], [], [], []
    for k, span_offset in enumerate(co.offsets()):
        for j, (lo, a, n, size, _) in enumerate(pieces):
            offsets.append(span_offset + lo)
            firsts.append(k * per_span + a)
            counts.append(n)
            sizes.append(size)
            gap_views.append(views[j])
    return IovLayout(tuple(offsets), tuple(firsts), tuple(counts), tuple(sizes), tuple(gap_views))


def read_iovecs(fd: int, path: str, plan: ReadPlan, gap_bytes: int, max_span_bytes: int, raw: np.ndarray) -> None:
    """Fill ``raw`` (the region's bytes in file order, C-contiguous ``uint8``) with scattered ``preadv`` calls.

    Raises
    ------
    FileChangedError
        If the file ends before a call is complete (it was truncated).
    """
    if plan.n_runs == 0:
        return
    lay = iov_layout(plan, gap_bytes, max_span_bytes)
    rows = list(raw.reshape(plan.n_runs, plan.run_nbytes))  # (row views made in C: no Python loop)
    preadv = os.preadv
    bufs: list[object] = []
    for offset, first, n, size, gaps in zip(lay.offsets, lay.first_runs, lay.counts, lay.nbytes, lay.gaps):
        if len(bufs) != 2 * n - 1:
            bufs = [None] * (2 * n - 1)
        bufs[0::2] = rows[first : first + n]
        bufs[1::2] = gaps
        got = preadv(fd, bufs, offset)  # type: ignore[arg-type]  # numpy stubs: ndarray.__buffer__ only on 3.12+
        if got != size:
            _finish(fd, path, bufs, offset, got)


def _finish(fd: int, path: str, bufs: Sequence[object], offset: int, done: int) -> None:
    """Complete a short ``preadv`` buffer by buffer (``pread_exact`` raises at the end of a truncated file)."""
    for buf in bufs:
        view = memoryview(buf).cast("B")  # type: ignore[arg-type]
        n = len(view)
        if done < n:
            pread_exact(fd, view[done:], offset + done, path)
            done = n
        offset += n
        done -= n
