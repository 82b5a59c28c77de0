"""Pure planning: how to copy a strided region out of a local file, by a cost model calibrated on one machine.

A region that is not one contiguous run of the file (a ROI, a chunk cut
across rows) is a grid of byte runs (:class:`~npydask.plan.region.ReadPlan`). A
local file can deliver it three ways:

``"spans"``
    Runs closer than the ``gap_bytes`` setting are merged into spans
    (:meth:`ReadPlan.coalesce <npydask.plan.region.ReadPlan.coalesce>`); one
    ``preadv`` per span into a scratch buffer, then one strided numpy copy
    cuts the runs out (when a span is a single run it is read in place).
    The kernel copies the gaps too: a 32^3 float32 ROI of a 256x256 plane
    copies 32 KiB per plane to deliver 4 KiB.
``"runs"``
    The same spans, each one ``preadv`` whose iovecs scatter the runs
    straight into the result and every gap into one scratch buffer: no
    second copy, but one iovec (a Python ``memoryview``) per run and gap.
``"mapped"``
    The file's one shared read-only mapping (the ``mmap`` backend's, kept
    with the cached open file) and one strided numpy copy of just the runs:
    only the ROI's bytes are copied, but each page not yet mapped costs a
    page fault.

The model's estimate for each, in nanoseconds, with ``n_spans`` reads of
``read_bytes`` in all, ``n_runs`` runs of ``nbytes`` in all, ``n_iovecs``
iovecs (runs plus gaps), and ``pages``/``windows`` the distinct 4 KiB pages
and fault-around windows (:attr:`Costs.window_bytes`) the runs touch::

    spans  = n_spans * syscall + read_bytes * kernel_byte
             [+ copy_call + n_runs * copy_row + nbytes * copy_byte   when spans hold several runs]
    runs   = n_preadv * syscall + read_bytes * kernel_byte + n_iovecs * iovec
    mapped = map + syscall + windows * fault + pages * page
             + copy_call + n_runs * copy_row + nbytes * mapped_byte

The coefficients (:data:`MEASURED`) come from ``benchmarks/calibrate_roi.py``
run on the machine the project's benchmarks run on (the performance page
says which); it prints them, and the model's predictions beside measured
times for a few ROI shapes, so it can be run on another machine.
``mapped`` assumes a fresh mapping (a file first read, or one the
handle cache dropped): its page faults are paid again whenever the cache
reopens the file. Ties go to the first of spans, runs, mapped.

The ``roi_strategy`` setting (:mod:`npydask.config`) forces one strategy
instead of the model's choice. Which strategies a read may use depends on
the backend: ``"pread"`` never maps (spans or runs), ``"mmap"`` always maps,
``"auto"`` may use all three for files on local file systems; ``O_DIRECT``
reads (``direct_io``) are spans only. A contiguous region is always one read
(or a zero-copy view), never planned here. Nothing here touches a file.

Examples
--------
>>> import numpy as np
>>> from npydask.format.header import NpyHeader
>>> from npydask.plan.region import Box, plan_read
>>> h = NpyHeader((1, 0), (64, 256, 256), np.dtype("<f4"), False, 128, 64 * 256 * 256 * 4)
>>> plan = plan_read(h, Box((16, 100, 100), (48, 132, 132)))
>>> c = choose(plan, gap_bytes=4096, max_span_bytes=1 << 26)
>>> c.strategy in STRATEGIES, sorted(c.estimates_ns) == sorted(STRATEGIES)
(True, True)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from npydask.plan.region import Coalesced, ReadPlan, grid_offsets

__all__ = [
    "IOV_RUNS",
    "MEASURED",
    "PAGE_BYTES",
    "STRATEGIES",
    "Choice",
    "Costs",
    "Shape",
    "choose",
    "estimate",
    "measure_shape",
    "touched_blocks",
]

STRATEGIES = ("spans", "runs", "mapped")
"""The strategies, in the order ties are broken."""

PAGE_BYTES = 4096
"""The page size the fault estimate counts in."""

IOV_RUNS = 500
"""Most runs in one ``preadv`` of the ``runs`` strategy (with their gaps, under Linux's ``IOV_MAX`` of 1024)."""


@dataclass(frozen=True)
class Costs:
    """The model's coefficients, nanoseconds per unit (see the module docstring for the formulas).

    Attributes
    ----------
    syscall : float
        One ``preadv`` (or ``fstat``) from Python, its loop included.
    kernel_byte : float
        Per byte ``preadv`` copies out of the page cache.
    iovec : float
        Per iovec of a ``preadv``: the ``memoryview`` slice Python makes and the kernel's segment.
    copy_call : float
        One numpy strided copy (the call and its set-up).
    copy_row : float
        Per contiguous run of a strided copy.
    copy_byte : float
        Per byte of a strided copy out of a scratch buffer ``preadv`` just filled.
    mapped_byte : float
        Per byte of a strided copy out of a mapped file whose pages are mapped (page-cache memory).
    map : float
        Mapping a file and unmapping it (once per open file).
    fault : float
        Per fault-around window (``window_bytes``) first touched in a fresh mapping.
    page : float
        Per 4 KiB page first touched in a fresh mapping, on top of its window's fault.
    window_bytes : int
        Bytes the kernel maps around a faulting page (``fault_around_bytes``, 64 KiB by default).
    """

    syscall: float
    kernel_byte: float
    iovec: float
    copy_call: float
    copy_row: float
    copy_byte: float
    mapped_byte: float
    map: float
    fault: float
    page: float
    window_bytes: int = 65536


# Calibrated by ``benchmarks/calibrate_roi.py`` (files read back into the page cache; thread CPU time,
# the 25th percentile of many runs). The machine, and what a page fault cost there, are on the
# performance page.
MEASURED = Costs(
    syscall=299.9,
    kernel_byte=0.1093,
    iovec=53.3,
    copy_call=406.5,
    copy_row=1.04,
    copy_byte=0.0381,
    mapped_byte=0.019,
    map=6164.0,
    fault=5020.9,
    page=258.2,
)


@dataclass(frozen=True)
class Shape:
    """What the model counts of one region read, per strategy (see :func:`measure_shape`)."""

    n_spans: int
    read_bytes: int
    runs_per_span: int
    n_runs: int
    nbytes: int
    pages: int
    windows: int

    @property
    def n_iovecs(self) -> int:
        """Iovecs of the ``runs`` strategy: every run and every gap between runs of a span."""
        return self.n_spans * (2 * self.runs_per_span - 1)

    @property
    def n_preadv(self) -> int:
        """``preadv`` calls of the ``runs`` strategy (a span of many runs takes several)."""
        return self.n_spans * -(-self.runs_per_span // IOV_RUNS)


@dataclass(frozen=True)
class Choice:
    """The strategy chosen for a region, and every estimate it was chosen from (nanoseconds)."""

    strategy: str
    estimates_ns: Mapping[str, float]
    """Per strategy, read-only (a choice is memoised and shared)."""
    shape: Shape
    forced: bool = False

    def __hash__(self) -> int:  # (a dict field: hash what decides it)
        return hash((self.strategy, self.shape, self.forced))


def touched_blocks(plan: ReadPlan, block: int, exact_limit: int = 1 << 16) -> int:
    """How many distinct ``block``-aligned blocks of the file the runs of ``plan`` touch.

    Exact for up to ``exact_limit`` runs; beyond that, the innermost row of
    runs is counted exactly and multiplied by the number of rows (capped at
    the blocks the whole region spans).

    Examples
    --------
    >>> import numpy as np
    >>> from npydask.format.header import NpyHeader
    >>> from npydask.plan.region import Box, plan_read
    >>> h = NpyHeader((1, 0), (4, 1024), np.dtype("u1"), False, 0, 4096)
    >>> plan = plan_read(h, Box((0, 0), (4, 10)))
    >>> touched_blocks(plan, 4096), touched_blocks(plan, 1024)
    (1, 4)
    """
    if plan.n_runs == 0:
        return 0
    shape, strides = plan.outer_shape, plan.outer_strides
    span_blocks = (plan.end - 1) // block - plan.offset // block + 1
    if plan.n_runs > exact_limit:
        row = _blocks(plan.offset, shape[-1:], strides[-1:], plan.run_nbytes, block)
        return min(span_blocks, row * (plan.n_runs // shape[-1]))
    return _blocks(plan.offset, shape, strides, plan.run_nbytes, block)


def _blocks(offset: int, shape: tuple[int, ...], strides: tuple[int, ...], run: int, block: int) -> int:
    """Distinct blocks touched by runs of ``run`` bytes on a grid with ascending offsets (C order)."""
    starts = grid_offsets(offset, shape, strides)
    first = starts // block
    last = (starts + run - 1) // block
    # Runs ascend and never overlap, so a block is shared only by neighbours: count each once.
    return int((last - first + 1).sum() - np.count_nonzero(first[1:] == last[:-1]))


def measure_shape(plan: ReadPlan, gap_bytes: int, max_span_bytes: int, window_bytes: int = 65536) -> Shape:
    """The counts the model prices for ``plan`` read with these coalescing settings."""
    co: Coalesced = plan.coalesce(gap_bytes, max(max_span_bytes, plan.run_nbytes))
    runs_per_span = math.prod(co.inner_shape[:-1])
    return Shape(
        n_spans=co.n_spans,
        read_bytes=co.read_nbytes,
        runs_per_span=runs_per_span,
        n_runs=plan.n_runs,
        nbytes=plan.n_runs * plan.run_nbytes,
        pages=touched_blocks(plan, PAGE_BYTES),
        windows=touched_blocks(plan, window_bytes),
    )


def estimate(shape: Shape, costs: Costs = MEASURED) -> dict[str, float]:
    """The model's time for each strategy, in nanoseconds (see the module docstring)."""
    c = costs
    cut = c.copy_call + shape.n_runs * c.copy_row
    kernel = shape.read_bytes * c.kernel_byte
    spans = shape.n_spans * c.syscall + kernel
    if shape.runs_per_span > 1:
        spans += cut + shape.nbytes * c.copy_byte
    runs = shape.n_preadv * c.syscall + kernel + shape.n_iovecs * c.iovec
    mapped = c.map + c.syscall + shape.windows * c.fault + shape.pages * c.page + cut + shape.nbytes * c.mapped_byte
    return {"spans": spans, "runs": runs, "mapped": mapped}


def choose(
    plan: ReadPlan,
    gap_bytes: int,
    max_span_bytes: int,
    allowed: tuple[str, ...] = STRATEGIES,
    forced: str = "auto",
    costs: Costs = MEASURED,
) -> Choice:
    """The cheapest of ``allowed`` for ``plan`` by the model, or ``forced`` when not ``"auto"``.

    Memoised: a dataset's files share plans, so each ROI is priced once.

    Raises
    ------
    ValueError
        If ``forced`` is not ``"auto"`` and not one of ``allowed`` (a
        backend or setting that rules it out).
    """
    return _choose(plan, gap_bytes, max_span_bytes, allowed, forced, costs)


@functools.lru_cache(maxsize=1024)
def _choose(
    plan: ReadPlan, gap_bytes: int, max_span_bytes: int, allowed: tuple[str, ...], forced: str, costs: Costs
) -> Choice:
    shape = measure_shape(plan, gap_bytes, max_span_bytes, costs.window_bytes)
    estimates = MappingProxyType(estimate(shape, costs))
    if forced != "auto":
        if forced not in allowed:
            raise ValueError(
                f"roi_strategy={forced!r} cannot be used here: this read allows {list(allowed)} "
                "(backend='pread' never maps, backend='mmap' always does, direct_io reads spans only, "
                "files off local file systems are never mapped by backend='auto'); "
                "set roi_strategy='auto' or pick one of those"
            )
        return Choice(forced, estimates, shape, forced=True)
    best = min(allowed, key=lambda s: (estimates[s], STRATEGIES.index(s)))
    return Choice(best, estimates, shape)
