"""Planning a region's reads apart from the fetcher: which runs merge into spans, and the loop that reads them.

A region of a C-order array is a grid of byte runs (:class:`npydask.plan.region.ReadPlan`).
Runs closer than the ``gap_bytes`` setting merge into one span (read once,
the gaps thrown away); :func:`read_plan` walks the spans and asks a
:class:`RangeReader` for their bytes, a local file's ``preadv`` loop
(:mod:`npydask.storage._local_read`) or an object's range requests
(:mod:`npydask.storage.object`), then cuts the runs out with one strided copy per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from npydask._buffers import pieces, scratch_pieces
from npydask.config import ReadOptions
from npydask.plan.read_strategy import choose
from npydask.plan.region import Coalesced, ReadPlan, region_spans

__all__ = ["BATCH_BYTES", "RangeReader", "grid", "pread_strategy", "read_plan"]

BATCH_BYTES = 16 * 1024 * 1024

"""Bytes of scratch one batch of spans is read into before its runs are cut out."""


class RangeReader(Protocol):
    """Where :func:`read_plan` gets bytes: whole ranges into buffers."""

    def read_into(self, dest: np.ndarray, offset: int) -> None:
        """Fill ``dest`` (``uint8``) from ``offset``."""

    def read_many(self, iovecs: Sequence[list[memoryview]], size: int, offsets: Sequence[int]) -> None:
        """Read ``size`` bytes at each offset into the matching ``[memoryview]``."""


_PREAD = ("spans", "runs")

_DIRECT = ("spans",)


def pread_strategy(plan: ReadPlan, options: ReadOptions) -> str:
    """``"spans"`` or ``"runs"`` for ``plan`` (:func:`npydask.plan.read_strategy.choose`; ``O_DIRECT`` reads spans).

    Raises
    ------
    ValueError
        If the ``roi_strategy`` setting forces one this backend cannot use (``"mapped"``; ``"runs"`` with
        ``direct_io``).
    """
    if plan.n_runs <= 1:
        return "spans"
    allowed = _DIRECT if options.direct_io else _PREAD
    return choose(plan, options.gap_bytes, options.max_span_bytes, allowed, options.roi_strategy).strategy


def read_plan(reader: RangeReader, plan: ReadPlan, options: ReadOptions, raw: np.ndarray) -> None:
    """Fill ``raw`` (the region's bytes in file order) from the run grid of ``plan``.

    ``reader`` is where the bytes come from (:class:`RangeReader`): a local
    file's ``preadv`` loop, or an object's range requests
    (:class:`npydask.storage.object.RangeReader`); this is the one planner
    both use, coalescing runs closer than ``options.gap_bytes``.
    """
    co, offsets = region_spans(plan, options.gap_bytes, options.max_span_bytes)
    per_span = len(raw) // co.n_spans
    if len(co.inner_shape) == 1:  # every span is one run: read straight into place
        reader.read_many(pieces(raw, per_span, co.n_spans), per_span, offsets)
        return
    # Spans are read back to back into one scratch buffer (up to BATCH_BYTES at a time), then cut
    # out with a single strided copy per batch: one numpy call instead of one per span.
    size = co.span_nbytes
    batch = max(1, min(co.n_spans, BATCH_BYTES // size))
    scratch, parts = scratch_pieces(size, batch)
    dest = raw.reshape((co.n_spans, *co.inner_shape))
    for first in range(0, co.n_spans, batch):
        n = min(batch, co.n_spans - first)
        reader.read_many(parts, size, offsets[first : first + n])  # (zip stops at the offsets)
        np.copyto(dest[first : first + n], grid(scratch, co, n))


def grid(scratch: np.ndarray, co: Coalesced, n: int) -> np.ndarray:
    """The runs of ``n`` spans read back to back into ``scratch``: a strided ``uint8`` view of it.

    (``np.ndarray`` over the buffer: numpy's ``as_strided`` costs more Python per call.)
    """
    return np.ndarray((n, *co.inner_shape), np.uint8, scratch, 0, (co.span_nbytes, *co.inner_strides))
