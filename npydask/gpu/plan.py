"""Pure planning for the GPU path: aligned reads into a staging buffer, then device steps.

A region of a file becomes a :class:`GpuReadPlan`:

1. **Reads.** The region's contiguous runs (:func:`npydask.plan.region.plan_read`)
   are merged into *spans* where the gaps between them are small
   (:meth:`~npydask.plan.region.ReadPlan.coalesce` with ``gap_bytes``), so a
   strided ROI is a few large reads, not thousands of tiny ones. Each span is
   rounded out to ``alignment`` (4 KiB, the GPUDirect Storage page), clamped
   to the file's size (the last page of a file need not exist): one
   :class:`SpanRead` each, one ``pread`` future (kvikio splits a read into its
   own ``task_size`` pieces on its thread pool; ``task_bytes`` > 0 splits
   spans here too).
2. **Staging.** Each read lands in one device buffer at an offset congruent to
   its file offset modulo the alignment, so every destination address is
   aligned too. Spans keep their file spacing up to the gap they skip, which
   is squeezed to a little over one alignment: the region sits in the staging
   buffer as one strided grid, cut out by a single view (:class:`Cut`).
3. **Device steps.** The cut is in file order; a Fortran file's region is
   transposed to C order (:attr:`GpuReadPlan.transpose`); a non-native byte
   order is reversed per component (:attr:`GpuReadPlan.swap_bytes`: a
   ``>c16`` swaps as two ``float64``, as ``ndarray.byteswap`` does); cells of
   a ``"pad"`` ROI outside the file are filled (:class:`Pad`). One copy into a
   C-contiguous, native-byte-order result does all of it.

:func:`npydask.gpu._exec.execute_plan` runs a plan with an injected
``read_span(offset, size, dest)`` and an array module ``xp``: numpy in the CPU
tests, CuPy on a GPU, the same code. Nothing here opens a file or imports CuPy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from npydask import config
from npydask.errors import RoiError
from npydask.format.header import NpyHeader
from npydask.plan.region import Box, FileSpan, plan_read
from npydask.plan.roi import FileRoi

__all__ = [
    "DEFAULT_ALIGNMENT",
    "DEFAULT_GAP_BYTES",
    "DEFAULT_HOST_BYTES",
    "DEFAULT_TASK_BYTES",
    "Cut",
    "GpuReadOptions",
    "GpuReadPlan",
    "Pad",
    "SpanRead",
    "c_contiguous",
    "gpu_read_options",
    "native_dtype",
    "plan_gpu_read",
    "through_host",
]

DEFAULT_ALIGNMENT = 4096
"""GPUDirect Storage page: file offsets, sizes and device addresses of reads are multiples of it."""
DEFAULT_GAP_BYTES = 64 * 1024
"""Runs closer than this are read as one span (a pread future costs about as much as this many bytes)."""
DEFAULT_HOST_BYTES = 1024 * 1024
"""Reads averaging less than this go through host memory: kvikio runs a read under its
``gds_threshold`` synchronously (a bounce copy and a stream sync each), and every file costs
an open, ``fstat`` s and a copy kernel, where the host path reads in one tight loop."""
DEFAULT_TASK_BYTES = 0
"""Largest single read; 0: one read per span (kvikio splits it by its own ``KVIKIO_TASK_SIZE``)."""


@dataclass(frozen=True)
class GpuReadOptions:
    """The settings that shape a GPU read, frozen into each task.

    Attributes
    ----------
    alignment : int
        Reads start (and, except at the end of the file, end) on multiples of
        this, and land at device addresses that are multiples of it.
    gap_bytes : int
        Runs whose gap is at most this are read as one span (never less than
        two alignments: aligned reads closer than that would overlap).
    task_bytes : int
        Largest single read; longer spans are split. 0 (the default): one read
        per span, which kvikio splits into ``KVIKIO_TASK_SIZE`` pieces itself
        (a ``pread`` future per piece here would only add calls).
    max_span_bytes : int
        Largest span that merging runs may build (as the host reader's setting).
    host_bytes : int
        A task whose reads average fewer bytes is read through host memory
        (:func:`through_host`); 0: never.
    """

    alignment: int = DEFAULT_ALIGNMENT
    gap_bytes: int = DEFAULT_GAP_BYTES
    task_bytes: int = DEFAULT_TASK_BYTES
    max_span_bytes: int = 64 * 1024 * 1024
    host_bytes: int = DEFAULT_HOST_BYTES

    def __post_init__(self) -> None:
        for name, least in (("alignment", 1), ("task_bytes", 0), ("gap_bytes", 0), ("max_span_bytes", 0),
                            ("host_bytes", 0)):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"GpuReadOptions.{name} must be an int >= {least}, found {value!r}")


def gpu_read_options(**overrides: int) -> GpuReadOptions:
    """Snapshot the current GPU read settings (``overrides`` win).

    ``max_span_bytes`` is the host reader's setting; ``gpu_gap_bytes``,
    ``gpu_task_bytes``, ``gpu_alignment`` and ``gpu_host_bytes`` are :mod:`npydask.config`'s.

    Examples
    --------
    >>> gpu_read_options(task_bytes=1 << 20).task_bytes
    1048576
    """
    values = {
        "alignment": int(config.get("gpu_alignment")),
        "gap_bytes": int(config.get("gpu_gap_bytes")),
        "task_bytes": int(config.get("gpu_task_bytes")),
        "max_span_bytes": int(config.get("max_span_bytes")),
        "host_bytes": int(config.get("gpu_host_bytes")),
    }
    values.update(overrides)
    return GpuReadOptions(**values)


def native_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order (what the device holds).

    Examples
    --------
    >>> native_dtype(np.dtype(">c16")).str, native_dtype(np.dtype("|b1")).str
    ('<c16', '|b1')
    """
    return np.dtype(dtype).newbyteorder("=")


@dataclass(frozen=True)
class SpanRead:
    """One read: ``size`` bytes at ``file_offset`` into the staging buffer at ``staging_offset``."""

    file_offset: int
    size: int
    staging_offset: int


@dataclass(frozen=True)
class Cut:
    """The region in the staging buffer, in *file* axis order.

    Element ``j`` (a file-order index into ``shape``) starts at byte
    ``offset + sum(j * strides)`` of the staging buffer.
    """

    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Pad:
    """Cells of a ``"pad"`` ROI outside the file: counts per axis before/after the data, and the fill."""

    before: tuple[int, ...]
    after: tuple[int, ...]
    fill: Any


@dataclass(frozen=True)
class GpuReadPlan:
    """How to read one region of one file onto the device.

    Attributes
    ----------
    shape : tuple of int
        The result's (C-order) shape.
    dtype : numpy.dtype
        The file's dtype (its byte order as stored).
    staging_nbytes : int
        Size of the staging buffer (its start must be ``alignment``-aligned).
    reads : tuple of SpanRead
        The reads, in file order, disjoint in the staging buffer.
    cut : Cut or None
        Where the region's data lies in the staging buffer; ``None`` when no
        byte of the file is needed (an empty region, or one wholly padding).
    transpose : tuple of int or None
        Axes taking the cut (file order) to C order: reversed for Fortran files.
    swap_bytes : int
        Size of the components whose bytes to reverse (0: native order already).
    aligned : bool
        Whether every element of the cut starts at a multiple of its itemsize
        (else it is copied bytewise: a stored ``.npz`` member may sit at any offset).
    pad : Pad or None
        The fill around the data, for a padded ROI.
    alignment : int
        The staging buffer's start must be a multiple of this (reads then land aligned).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    staging_nbytes: int
    reads: tuple[SpanRead, ...]
    cut: Cut | None
    transpose: tuple[int, ...] | None
    swap_bytes: int
    aligned: bool
    pad: Pad | None
    alignment: int = DEFAULT_ALIGNMENT

    @property
    def out_dtype(self) -> np.dtype:
        """The result's dtype: the file's in native byte order."""
        return native_dtype(self.dtype)

    @property
    def read_nbytes(self) -> int:
        """Bytes read in all (alignment and merged gaps included)."""
        return sum(r.size for r in self.reads)

    @property
    def direct(self) -> FileSpan | None:
        """The file's span (offset, length) when the result is exactly those bytes of the file, else ``None``.

        That is: one contiguous stretch of the file, stored native and
        aligned to its itemsize, unpadded, in the result's C order. Such a
        region may be read straight into its destination, without staging or
        a device step.
        """
        cut = self.cut
        if cut is None or self.pad is not None or self.swap_bytes or not self.aligned or not self.reads:
            return None
        delta = self.reads[0].file_offset - self.reads[0].staging_offset
        if any(r.file_offset - r.staging_offset != delta for r in self.reads):
            return None  # (spans kept apart: the staging buffer is not a copy of the file)
        shape, strides = cut.shape, cut.strides
        if self.transpose is not None:
            shape = tuple(shape[a] for a in self.transpose)
            strides = tuple(strides[a] for a in self.transpose)
        itemsize = self.dtype.itemsize
        if not c_contiguous(shape, strides, itemsize):
            return None
        return FileSpan(cut.offset + delta, math.prod(shape) * itemsize)

    @property
    def interior(self) -> tuple[slice, ...]:
        """Where the bytes read go in the result: all of it, or inside the padding."""
        if self.pad is None or self.cut is None:
            return tuple(slice(None) for _ in self.shape)
        data = self.cut.shape[::-1] if self.transpose is not None else self.cut.shape
        return tuple(slice(b, b + n) for b, n in zip(self.pad.before, data))


def c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """Whether ``strides`` (bytes) lay ``shape`` out in C order without gaps (axes of extent 1 ignored).

    Examples
    --------
    >>> c_contiguous((2, 3), (12, 4), 4), c_contiguous((2, 3), (4, 8), 4), c_contiguous((1, 3), (99, 4), 4)
    (True, False, True)
    """
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n > 1 and s != expected:
            return False
        expected *= n
    return True


def through_host(plan: GpuReadPlan, options: GpuReadOptions) -> bool:
    """Whether a task whose files plan like ``plan`` is cheaper read by the host path, then copied once.

    The cost model: a kvikio read under its ``gds_threshold`` (16 KiB) runs
    synchronously (a bounce copy and a stream sync each), and every file
    costs an open, ``fstat`` s and a device copy kernel, while the host path
    reads many small files or short runs in one tight loop; above about a
    MiB per read, kvikio's parallel reads and no host copy win.

    Examples
    --------
    >>> h = NpyHeader((1, 0), (64, 256, 256), np.dtype("<f4"), False, 128, 64 * 256 * 256 * 4)
    >>> roi = plan_gpu_read(h, Box((0, 0, 0), (32, 32, 32)), file_size=128 + h.nbytes)  # a 32^3 ROI
    >>> len(roi.reads), through_host(roi, GpuReadOptions())
    (32, True)
    >>> whole = plan_gpu_read(h, Box.whole(h.shape), file_size=128 + h.nbytes)
    >>> through_host(whole, GpuReadOptions()), through_host(roi, GpuReadOptions(host_bytes=0))
    (False, False)
    """
    return bool(plan.reads) and plan.read_nbytes < options.host_bytes * len(plan.reads)


def _clamp_box(shape: tuple[int, ...], lo: Sequence[int], hi: Sequence[int]) -> Box:
    inner_lo = tuple(min(max(a, 0), n) for a, n in zip(lo, shape))
    inner_hi = tuple(max(min(b, n), a) for b, n, a in zip(hi, shape, inner_lo))
    return Box(inner_lo, inner_hi)


def plan_gpu_read(
    header: NpyHeader,
    box: Box,
    *,
    file_size: int,
    roi: FileRoi | None = None,
    options: GpuReadOptions | None = None,
) -> GpuReadPlan:
    """Plan the aligned reads and device steps for ``box`` of a file with ``header``.

    Parameters
    ----------
    header : NpyHeader
        The file's header (``data_offset`` is absolute in the file).
    box : Box
        The region, in the file's logical coordinates, or in the ROI's output
        coordinates when ``roi`` is given.
    file_size : int
        The file's size: no read goes past it.
    roi : FileRoi, optional
        The file's ROI; cells outside the file are padded with its fill value.
    options : GpuReadOptions, optional
        Alignment, gap, task size; defaults to the module defaults.

    Examples
    --------
    Ten columns of a ``(100, 100000)`` big-endian float32 file: rows are
    400 kB apart, so each is one aligned 4 KiB read; with a gap threshold
    over the row stride they merge into one span, one read (or ``task_bytes`` pieces).

    >>> h = NpyHeader((1, 0), (100, 100_000), np.dtype(">f4"), False, 128, 40_000_000)
    >>> p = plan_gpu_read(h, Box((0, 0), (100, 10)), file_size=40_000_128)
    >>> len(p.reads), {(r.file_offset % 4096, r.size) for r in p.reads}, p.swap_bytes
    (100, {(0, 4096)}, 4)
    >>> p = plan_gpu_read(h, Box((0, 0), (100, 10)), file_size=40_000_128,
    ...                   options=GpuReadOptions(gap_bytes=1 << 20))
    >>> len(p.reads), p.reads[0].size
    (1, 39604224)
    >>> p = plan_gpu_read(h, Box((0, 0), (100, 10)), file_size=40_000_128,
    ...                   options=GpuReadOptions(gap_bytes=1 << 20, task_bytes=4 << 20))
    >>> len(p.reads), max(r.size for r in p.reads)
    (10, 4194304)
    """
    options = options or GpuReadOptions()
    dtype = header.dtype
    shape = box.shape
    if roi is None:
        lo, hi = box.start, box.stop
    else:
        if len(box.start) != len(roi.shape) or not all(
            0 <= a <= b <= n for a, b, n in zip(box.start, box.stop, roi.shape)
        ):
            raise RoiError(
                f"region start={list(box.start)} stop={list(box.stop)} does not fit the ROI of shape {roi.shape}"
            )
        lo = tuple(a + s for a, s in zip(box.start, roi.start))
        hi = tuple(b + s for b, s in zip(box.stop, roi.start))
    inner = _clamp_box(header.shape, lo, hi) if roi is not None else box
    pad = None
    if roi is not None and (inner.start != tuple(lo) or inner.stop != tuple(hi)) and math.prod(shape) > 0:
        fill = roi.fill_value if roi.fill_value is not None else 0
        before = tuple(a - b for a, b in zip(inner.start, lo))
        after = tuple(b - a for a, b in zip(inner.stop, hi))
        pad = Pad(before, after, np.array(fill).astype(native_dtype(dtype))[()])
    swap = _swap_size(dtype)
    rp = plan_read(header, inner)  # (raises RoiError for a box outside the file)
    if rp.run_nbytes == 0 or math.prod(shape) == 0:
        return GpuReadPlan(shape, dtype, 0, (), None, None, swap, True, pad, options.alignment)
    alignment = options.alignment
    co = rp.coalesce(max(options.gap_bytes, 2 * alignment), max(options.max_span_bytes, rp.run_nbytes))
    itemsize = dtype.itemsize
    modulus = math.lcm(alignment, itemsize)
    # Staging strides of the spans' grid: congruent to the file strides modulo the alignment (so
    # every read lands aligned) and wide enough that neighbouring aligned reads never overlap.
    levels = len(co.outer_shape)
    staging_strides = [0] * levels
    block = co.span_nbytes
    for d in range(levels - 1, -1, -1):
        staging_strides[d] = _staging_stride(block, co.outer_strides[d], alignment, modulus)
        block += (co.outer_shape[d] - 1) * staging_strides[d]
    base = co.offset % modulus  # staging position of the region's first byte
    staging_nbytes = -(-(base + block) // alignment) * alignment
    reads = _span_reads(co.offset, co.outer_shape, co.outer_strides, tuple(staging_strides), base,
                        co.span_nbytes, file_size, alignment, options.task_bytes)  # fmt: skip
    cut = Cut(base, rp.file_shape, _cut_strides(header, inner, len(rp.outer_shape), tuple(staging_strides)))
    transpose = tuple(range(len(shape) - 1, -1, -1)) if header.fortran_order else None
    aligned = itemsize > 0 and base % itemsize == 0 and all(s % itemsize == 0 for s in cut.strides)
    return GpuReadPlan(shape, dtype, staging_nbytes, reads, cut, transpose, swap, aligned, pad, alignment)


def _staging_stride(block: int, file_stride: int, alignment: int, modulus: int) -> int:
    """The smallest stride congruent to ``file_stride`` modulo ``modulus`` (a multiple of the
    alignment) at which the aligned pages of consecutive blocks of ``block`` bytes never overlap,
    whatever a block's offset modulo the alignment."""
    r = np.arange(alignment, dtype=np.int64)  # every offset of a block's first byte within its page
    t = file_stride % modulus
    last_end = -(-(r + block) // alignment) * alignment  # end of the block's last page
    next_start = (r + t) - (r + t) % alignment  # start of the next block's first page, before q*modulus
    q = max(0, -(-int((last_end - next_start).max()) // modulus))
    return t + q * modulus


def _swap_size(dtype: np.dtype) -> int:
    """Bytes per component to reverse for a non-native numeric dtype, else 0."""
    if dtype.isnative or dtype.itemsize <= 1 or dtype.fields is not None or dtype.subdtype is not None:
        return 0
    if dtype.kind == "c":
        return dtype.itemsize // 2
    return dtype.itemsize


def _cut_strides(header: NpyHeader, inner: Box, n_outer: int, staging_strides: tuple[int, ...]) -> tuple[int, ...]:
    """Staging strides of the region's file-order axes.

    The run grid's outer axes are the file axes of extent over one before the
    run (:func:`~npydask.plan.region.plan_read` drops the others); the first
    ``len(staging_strides)`` of them were left unmerged and move to their
    staging stride; every other axis keeps its file stride.
    """
    from npydask.plan.region import file_strides

    strides = list(file_strides(header))
    ext = inner.shape[::-1] if header.fortran_order else inner.shape
    outer_axes = [a for a, n in enumerate(ext) if n > 1][:n_outer]
    for axis, stride in zip(outer_axes, staging_strides):
        strides[axis] = stride
    return tuple(strides)


def _span_reads(
    offset: int,
    outer_shape: tuple[int, ...],
    outer_strides: tuple[int, ...],
    staging_strides: tuple[int, ...],
    base: int,
    span: int,
    file_size: int,
    alignment: int,
    task_bytes: int,
) -> tuple[SpanRead, ...]:
    """Every span rounded out to the alignment, clamped to the file, split into tasks (vectorised).

    ``task_bytes`` 0: one read per span."""
    file_at: npt.NDArray[np.int64] = np.full((), offset, np.int64)
    staged_at: npt.NDArray[np.int64] = np.full((), base, np.int64)
    for n, fs, ss in zip(outer_shape, outer_strides, staging_strides):
        file_at = file_at[..., None] + np.arange(n, dtype=np.int64) * fs
        staged_at = staged_at[..., None] + np.arange(n, dtype=np.int64) * ss
    file_at, staged_at = file_at.reshape(-1), staged_at.reshape(-1)
    lo = file_at - file_at % alignment
    hi = np.minimum(-(-(file_at + span) // alignment) * alignment, file_size)
    if (hi < file_at + span).any():
        raise ValueError(
            f"the region ends at byte {int((file_at + span).max())} but the file has {file_size}: "
            "plan with the file's current size"
        )
    dest = staged_at - (file_at - lo)
    piece = max(alignment, task_bytes - task_bytes % alignment)
    if not task_bytes or int((hi - lo).max()) <= piece:
        return tuple(SpanRead(*r) for r in zip(lo.tolist(), (hi - lo).tolist(), dest.tolist()))
    reads = []
    for a, b, s in zip(lo.tolist(), hi.tolist(), dest.tolist()):
        for start in range(a, b, piece):
            reads.append(SpanRead(start, min(piece, b - start), s + start - a))
    return tuple(reads)
