"""Pure planning: which bytes of a file hold a region of its array.

A region is a box ``[start, stop)`` in logical (C-order) coordinates. In the
file the array is laid out in C or Fortran order; for a Fortran file the
*file-order* axes are the logical axes reversed. In file order the box is a
regular grid of equally long contiguous byte *runs*: the innermost axes the
box covers whole are folded into one run together with the first axis it
covers only partly, and every outer axis repeats the run at its stride.

:class:`ReadPlan` describes that grid (first offset, outer counts and strides,
run length) without listing it. :meth:`ReadPlan.coalesce` merges runs whose
gaps are small into *spans*, one read each, from which the runs are then cut
in memory: a strided region read with a few large reads instead of thousands
of tiny ones. Nothing here touches a file.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from npydask.errors import RoiError
from npydask.format.header import NpyHeader

__all__ = [
    "Box",
    "ByteRun",
    "Coalesced",
    "FileSpan",
    "IndexSplit",
    "ReadPlan",
    "grid_offsets",
    "normalize_box",
    "plan_read",
    "region_spans",
    "same_layout",
    "split_index",
    "split_span",
]


@dataclass(frozen=True)
class Box:
    """A half-open box ``[start, stop)`` in logical (C-order) coordinates."""

    start: tuple[int, ...]
    stop: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """Extent along each axis."""
        return tuple(b - a for a, b in zip(self.start, self.stop))

    @property
    def size(self) -> int:
        """Number of elements in the box."""
        return math.prod(self.shape)

    @classmethod
    def whole(cls, shape: Sequence[int]) -> Box:
        """The box covering a whole array of ``shape``."""
        return cls((0,) * len(shape), tuple(shape))


def normalize_box(
    shape: Sequence[int],
    start: Sequence[int] | None = None,
    stop: Sequence[int] | None = None,
    *,
    source: str = "<array>",
) -> Box:
    """Validate ``start``/``stop`` against ``shape`` and fill in missing axes.

    ``None`` means the whole range; a shorter sequence covers the leading axes.
    Values must satisfy ``0 <= start <= stop <= shape``.

    Raises
    ------
    RoiError
        For a wrong number of values, non-integers, or bounds outside the array.

    Examples
    --------
    >>> normalize_box((4, 5), start=[1], stop=None)
    Box(start=(1, 0), stop=(4, 5))
    """
    shape = tuple(shape)
    ndim = len(shape)
    lo = _complete(start, (0,) * ndim, "start", shape, source)
    hi = _complete(stop, shape, "stop", shape, source)
    for axis, (a, b, n) in enumerate(zip(lo, hi, shape)):
        if not 0 <= a <= b <= n:
            what = "ends before it starts" if 0 <= b < a <= n else "is outside the array"
            raise RoiError(
                f"{source}: region start={list(lo)} stop={list(hi)} {what} (array of shape {shape}) "
                f"on axis {axis}: expected 0 <= start <= stop <= {n}, found start={a}, stop={b}"
            )
    return Box(lo, hi)


def _complete(
    given: Sequence[int] | None, default: tuple[int, ...], what: str, shape: tuple[int, ...], source: str
) -> tuple[int, ...]:
    if given is None:
        return default
    try:
        values = [_as_index(v) for v in given]
    except TypeError as e:
        raise RoiError(
            f"{source}: region {what} must be a sequence of integers (array of shape {shape}), found {given!r}"
        ) from e
    if len(values) > len(shape):
        raise RoiError(
            f"{source}: region {what} has {len(values)} values but the array of shape {shape} has {len(shape)} axes"
        )
    return tuple(values) + default[len(values) :]


def _as_index(value: object) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"not an integer: {value!r}")
    index: int = value.__index__()
    return index


@dataclass(frozen=True)
class ByteRun:
    """``length`` contiguous bytes at ``offset`` in the file."""

    offset: int
    length: int


class FileSpan(NamedTuple):
    """``length`` contiguous bytes at ``offset`` in the file, as one read takes them."""

    offset: int
    length: int


@dataclass(frozen=True)
class Coalesced:
    """Runs merged into spans: one read per span, runs cut from it in memory.

    Span ``k`` (in C order over ``outer_shape``) starts at
    ``offset + sum(i_d * outer_strides[d])`` and is ``span_nbytes`` long.
    Inside a span the runs form a byte grid of ``inner_shape`` with
    ``inner_strides`` (the last axis is the run itself, stride 1).
    """

    offset: int
    outer_shape: tuple[int, ...]
    outer_strides: tuple[int, ...]
    span_nbytes: int
    inner_shape: tuple[int, ...]
    inner_strides: tuple[int, ...]

    @property
    def n_spans(self) -> int:
        """Number of reads."""
        return math.prod(self.outer_shape)

    @property
    def read_nbytes(self) -> int:
        """Bytes read in all, gaps included."""
        return self.n_spans * self.span_nbytes

    def spans(self) -> Iterator[ByteRun]:
        """The spans in order."""
        for offset in self.offsets():
            yield ByteRun(offset, self.span_nbytes)

    def offsets(self) -> list[int]:
        """The spans' file offsets in order, as plain ints (computed with numpy, no per-span Python)."""
        return list(_span_offsets(self.offset, self.outer_shape, self.outer_strides))


@functools.lru_cache(maxsize=1024)
def _span_offsets(offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(grid_offsets(offset, shape, strides).tolist())


def grid_offsets(offset: int, shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """``offset + sum(i_d * strides[d])`` for every index of ``shape`` in C order, as a flat ``int64`` array.

    Examples
    --------
    >>> grid_offsets(100, (2, 3), (10, 1)).tolist()
    [100, 101, 102, 110, 111, 112]
    """
    offsets = np.full((), offset, np.int64)
    for n, s in zip(shape, strides):
        offsets = offsets[..., None] + np.arange(n, dtype=np.int64) * s
    return offsets.reshape(-1)


@dataclass(frozen=True)
class ReadPlan:
    """Where a box of an array lies in its file, as a grid of byte runs.

    Attributes
    ----------
    shape : tuple of int
        The region's logical (C-order) shape: the shape of the result.
    fortran_order : bool
        Whether the file is Fortran-ordered; the bytes then come in the
        reversed axis order, ``file_shape == shape[::-1]``.
    itemsize : int
        Bytes per element.
    offset : int
        Absolute file offset of the region's first byte.
    outer_shape, outer_strides : tuple of int
        How many runs along each outer file axis and their stride in bytes
        (axes of extent one are dropped).
    run_nbytes : int
        Length of each contiguous run.
    """

    shape: tuple[int, ...]
    fortran_order: bool
    itemsize: int
    offset: int
    outer_shape: tuple[int, ...]
    outer_strides: tuple[int, ...]
    run_nbytes: int

    @property
    def file_shape(self) -> tuple[int, ...]:
        """The region's shape in file axis order."""
        return self.shape[::-1] if self.fortran_order else self.shape

    @property
    def nbytes(self) -> int:
        """Bytes of the region (what the result holds)."""
        return math.prod(self.shape) * self.itemsize

    @property
    def end(self) -> int:
        """File offset just past the region's last byte (``offset`` for an empty region)."""
        if self.run_nbytes == 0:
            return self.offset
        return self.offset + sum((n - 1) * s for n, s in zip(self.outer_shape, self.outer_strides)) + self.run_nbytes

    @property
    def n_runs(self) -> int:
        """Number of contiguous runs (0 for an empty region)."""
        return 0 if self.run_nbytes == 0 else math.prod(self.outer_shape)

    @property
    def is_contiguous(self) -> bool:
        """Whether the region is one run of bytes in the file (or empty)."""
        return self.n_runs <= 1

    def runs(self) -> Iterator[ByteRun]:
        """Every run in file order; run ``k`` fills bytes ``[k*run, (k+1)*run)`` of the result."""
        if self.run_nbytes == 0:
            return
        yield from Coalesced(self.offset, self.outer_shape, self.outer_strides, self.run_nbytes, (), ()).spans()

    def coalesce(self, max_gap: int, max_span: int = 1 << 30) -> Coalesced:
        """Merge runs into spans where the bytes skipped between them are few.

        Outer axes are merged from the innermost outwards while the gap between
        consecutive spans is at most ``max_gap`` bytes and a span stays within
        ``max_span`` bytes (an axis of one run is always merged).
        """
        m = len(self.outer_shape)
        level = m
        span = self.run_nbytes
        while level > 0:
            n, stride = self.outer_shape[level - 1], self.outer_strides[level - 1]
            wider = span + (n - 1) * stride
            if stride - span > max_gap or wider > max_span:
                break
            span, level = wider, level - 1
        return Coalesced(
            offset=self.offset,
            outer_shape=self.outer_shape[:level],
            outer_strides=self.outer_strides[:level],
            span_nbytes=span if self.run_nbytes else 0,
            inner_shape=self.outer_shape[level:] + (self.run_nbytes,),
            inner_strides=self.outer_strides[level:] + (1,),
        )


@functools.lru_cache(maxsize=1024)
def region_spans(plan: ReadPlan, max_gap: int, max_span: int) -> tuple[Coalesced, tuple[int, ...]]:
    """The spans a region read of ``plan`` asks for, and their offsets: runs merged across gaps of at most ``max_gap``.

    A span grows to at most ``max_span`` bytes, or one run where a run is
    longer. The one rule behind every region read (a local file's preads, an
    object's range GETs, :mod:`npydask.plan.traffic`'s counts); memoised, as
    a dataset's ROIs share plans.

    Examples
    --------
    >>> import numpy as np
    >>> from npydask.format.header import NpyHeader
    >>> h = NpyHeader((1, 0), (4, 100), np.dtype("u1"), False, 128, 400)
    >>> co, offsets = region_spans(plan_read(h, Box((0, 0), (4, 10))), 100, 1 << 30)
    >>> co.n_spans, co.span_nbytes, offsets
    (1, 310, (128,))
    >>> region_spans(plan_read(h, Box((0, 0), (4, 10))), 10, 1 << 30)[1]
    (128, 228, 328, 428)
    """
    co = plan.coalesce(max_gap, max(max_span, plan.run_nbytes))
    return co, tuple(co.offsets())


def split_span(offset: int, length: int, part: int) -> list[FileSpan]:
    """A span of ``length`` bytes at ``offset`` cut into requests of at most ``part`` bytes, in order.

    How an object's range GETs split a long span (``remote_part_bytes``);
    an empty span is no request.

    Examples
    --------
    >>> split_span(100, 25, 10)
    [FileSpan(offset=100, length=10), FileSpan(offset=110, length=10), FileSpan(offset=120, length=5)]
    """
    return [FileSpan(offset + lo, min(part, length - lo)) for lo in range(0, length, max(1, part))]


def file_strides(header: NpyHeader) -> tuple[int, ...]:
    """Byte strides of the payload along the file-order axes."""
    shape = header.shape[::-1] if header.fortran_order else header.shape
    strides = []
    acc = header.itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def plan_read(header: NpyHeader, box: Box) -> ReadPlan:
    """Plan the reads of ``box`` (logical coordinates) from a file with ``header``.

    Plans are memoised on ``(header, box)``: a dataset's files share header
    objects, and the same ROI of each plans once.

    Examples
    --------
    >>> import numpy as np
    >>> h = NpyHeader((1, 0), (4, 6), np.dtype("<f4"), False, 128, 96)
    >>> p = plan_read(h, Box((1, 2), (3, 5)))
    >>> [(r.offset, r.length) for r in p.runs()]
    [(160, 12), (184, 12)]
    """
    return _plan_read(header, box)


@functools.lru_cache(maxsize=4096)
def _plan_read(header: NpyHeader, box: Box) -> ReadPlan:
    if not (len(box.start) == len(box.stop) == header.ndim) or not all(
        0 <= a <= b <= n for a, b, n in zip(box.start, box.stop, header.shape)
    ):
        # A box that does not fit would silently plan reads of other bytes.
        raise RoiError(
            f"region start={list(box.start)} stop={list(box.stop)} does not fit the array of shape "
            f"{header.shape}: expected {header.ndim} axes with 0 <= start <= stop <= shape; use normalize_box"
        )
    fortran = header.fortran_order
    shape = header.shape[::-1] if fortran else header.shape
    lo = box.start[::-1] if fortran else box.start
    hi = box.stop[::-1] if fortran else box.stop
    strides = file_strides(header)
    offset = header.data_offset + sum(a * s for a, s in zip(lo, strides))
    ext = [b - a for a, b in zip(lo, hi)]
    itemsize = header.itemsize
    if 0 in ext or itemsize == 0:
        return ReadPlan(box.shape, fortran, itemsize, offset, (), (), 0)
    # Fold trailing whole axes, plus the first partial one, into the run.
    p = len(shape) - 1
    while p >= 0 and ext[p] == shape[p]:
        p -= 1
    if p < 0:
        run = math.prod(shape) * itemsize
        return ReadPlan(box.shape, fortran, itemsize, offset, (), (), run)
    run = ext[p] * strides[p]
    outer = [(n, s) for n, s in zip(ext[:p], strides[:p]) if n != 1]
    return ReadPlan(
        box.shape,
        fortran,
        itemsize,
        offset,
        tuple(n for n, _ in outer),
        tuple(s for _, s in outer),
        run,
    )


def same_layout(plan: ReadPlan) -> bool:
    """Whether the file-order bytes of the region are already its C-order bytes."""
    return not plan.fortran_order or sum(n > 1 for n in plan.shape) <= 1


def align_span(offset: int, length: int, alignment: int) -> FileSpan:
    """Round a byte range out to ``alignment``: the aligned offset and length.

    Examples
    --------
    >>> align_span(5000, 100, 4096)
    FileSpan(offset=4096, length=4096)
    """
    lo = offset - offset % alignment
    end = offset + length
    hi = -(-end // alignment) * alignment
    return FileSpan(lo, hi - lo)


# --------------------------------------------------------------------------
# Basic indexes


class IndexSplit(NamedTuple):
    """A basic index as a box to read and the in-memory index that finishes it.

    ``numpy_array[index] == read(box)[post]``; ``post`` is empty when the box
    is the answer.
    """

    box: Box
    post: tuple[Any, ...]


def split_index(index: Any, shape: tuple[int, ...]) -> IndexSplit:
    """Split a basic index into the box it covers and the in-memory index that finishes it.

    Examples
    --------
    >>> split_index((1, slice(None, None, 2)), (3, 5))
    IndexSplit(box=Box(start=(1, 0), stop=(2, 5)), post=(0, slice(None, None, 2)))
    >>> split_index(slice(1, 3), (4,)).post
    ()
    """
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        at = next(k for k, i in enumerate(index) if i is Ellipsis)
        fill = (slice(None),) * (len(shape) - len(index) + 1)
        index = index[:at] + fill + index[at + 1 :]
    if len(index) > len(shape):
        raise IndexError(f"too many indices: {len(index)} for an array of {len(shape)} dimensions")
    index = index + (slice(None),) * (len(shape) - len(index))
    start: list[int] = []
    stop: list[int] = []
    post: list[Any] = []
    trivial = True
    for axis, (i, n) in enumerate(zip(index, shape)):
        if isinstance(i, slice):
            a, b, step = i.indices(n)
            count = len(range(a, b, step))
            if count == 0:
                start.append(0)
                stop.append(0)
                post.append(slice(None))
            elif step > 0:
                start.append(a)
                stop.append(a + (count - 1) * step + 1)
                post.append(slice(None, None, step))
                trivial &= step == 1
            else:
                start.append(a + (count - 1) * step)
                stop.append(a + 1)
                post.append(slice(None, None, step))
                trivial = False
        elif hasattr(i, "__index__") and not isinstance(i, bool | np.bool_):
            k = i.__index__()
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {axis} with size {n}")
            k %= n
            start.append(k)
            stop.append(k + 1)
            post.append(0)
            trivial = False
        else:
            raise IndexError(f"npydask arrays take integers, slices and Ellipsis only, found {i!r}")
    return IndexSplit(Box(tuple(start), tuple(stop)), () if trivial else tuple(post))
