"""Pure planning: many boxes of one file read together, each byte read once.

A sampler gives several boxes per file (patches of a volume), possibly
overlapping, possibly hanging over the edges. Each box is clipped to the file
and planned as a grid of byte runs (:func:`npydask.plan.region.plan_read`),
whose runs closer than ``max_gap`` are merged into the box's own spans
(:meth:`ReadPlan.coalesce <npydask.plan.region.ReadPlan.coalesce>`, the
planner region reads use). The spans of all the boxes are then merged into
one list (:class:`Spans`) wherever they overlap, touch or lie within
``max_gap`` of each other: the bytes of a gap are read and thrown away, the
usual coalescing trade-off. A reader fills one buffer with the spans back to
back, grouped by the first box that needs each, and :func:`cut_boxes` cuts
every box out of it: one strided copy per box whose spans sit at regular
places in the buffer (a box that shares no span with another), else a gather
of its runs. The parts of a box outside the file take ``fill_value``
(converted to the dtype as :func:`npydask.plan.roi.convert_fill` does).

Boxes count the trailing axes of the file; leading axes they do not name are
kept whole (channels before the spatial axes). Nothing here touches a file.

Examples
--------
>>> import numpy as np
>>> from npydask.format.header import NpyHeader
>>> h = NpyHeader((1, 0), (4, 6), np.dtype("<u1"), False, 128, 24)
>>> runs = plan_boxes(h, [Box((0, 1), (2, 3)), Box((1, 2), (3, 4))], max_gap=0)
>>> runs.spans.offsets.tolist(), runs.spans.lengths.tolist(), runs.bytes_read
([129, 135, 142], [2, 3, 2], 7)
>>> payload = np.arange(24, dtype="u1")
>>> buffer = np.concatenate([payload[o - 128 : o - 128 + n] for o, n in zip([129, 135, 142], [2, 3, 2])])
>>> [a.tolist() for a in cut_boxes(runs, buffer)]
[[[1, 2], [7, 8]], [[8, 9], [14, 15]]]
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from npydask._buffers import as_bytes, empty, raw
from npydask.errors import RoiError
from npydask.format.header import NpyHeader
from npydask.plan.region import Box, Coalesced, ReadPlan, grid_offsets, plan_read, same_layout
from npydask.plan.roi import FileRoi, apply_pad, convert_fill, fill_like

__all__ = [
    "BoxCut",
    "BoxLike",
    "PatchRuns",
    "Spans",
    "check_outs",
    "cut_boxes",
    "file_box",
    "pad_box",
    "plan_boxes",
]


class BoxLike(Protocol):
    """A box as these functions take it: integer ``start`` and ``stop`` sequences (a :class:`Box`, a patch)."""

    @property
    def start(self) -> Sequence[int]: ...

    @property
    def stop(self) -> Sequence[int]: ...


class Spans(NamedTuple):
    """Byte ranges of a file read back to back into one buffer, in the buffer's order.

    Span ``k`` is ``lengths[k]`` bytes at file offset ``offsets[k]`` and lands
    at ``positions[k]`` of the buffer (``int64`` arrays, the same length;
    ``positions`` ascending, the spans disjoint and apart by more than the gap
    they were merged across).
    """

    offsets: np.ndarray
    lengths: np.ndarray
    positions: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes of all the spans: the buffer's size, what a read of them transfers."""
        return int(self.lengths.sum())

    def __len__(self) -> int:  # (a NamedTuple's length would be 3)
        return len(self.offsets)


@dataclass(frozen=True, eq=False)
class BoxCut:
    """Where one box's bytes lie in the buffer of :class:`Spans`.

    Attributes
    ----------
    box : Box
        The box asked for, over every axis of the file (may hang over its edges).
    inside : Box
        Its part inside the file (empty where it lies wholly outside).
    plan : ReadPlan
        The run grid of ``inside``.
    coalesced : Coalesced
        ``plan``'s runs merged into the box's own spans.
    first : int
        Buffer position of the box's first span.
    strides : tuple of int or None
        Buffer strides over ``coalesced.outer_shape`` where the box's spans sit
        at regular places in the buffer (one strided copy cuts the box), else ``None``.
    positions : numpy.ndarray or None
        Buffer position of each of the box's spans where ``strides`` is ``None``.
    """

    box: Box
    inside: Box
    plan: ReadPlan
    coalesced: Coalesced
    first: int = 0
    strides: tuple[int, ...] | None = ()
    positions: np.ndarray | None = None

    @property
    def padded(self) -> bool:
        """Whether part of the box lies outside the file."""
        return self.inside != self.box


@dataclass(frozen=True, eq=False)
class PatchRuns:
    """The merged reads of many boxes of one file, and how to cut each box out of them.

    Attributes
    ----------
    header : NpyHeader
        The file's header the boxes were planned against.
    spans : Spans
        What to read: grouped by the first box that needs each span, in file order within a group.
    cuts : tuple of BoxCut
        One per box, in the order given.
    fill_value : numpy scalar
        The value of cells outside the file, converted to the file's dtype.
    """

    header: NpyHeader
    spans: Spans
    cuts: tuple[BoxCut, ...]
    fill_value: Any

    @property
    def bytes_read(self) -> int:
        """Bytes the reads transfer (gaps included, each byte once)."""
        return self.spans.nbytes

    @property
    def patch_bytes(self) -> int:
        """Bytes of the arrays the boxes make (their padding included)."""
        return sum(c.box.size for c in self.cuts) * self.header.itemsize


def file_box(shape: Sequence[int], box: BoxLike, source: str = "<array>") -> Box:
    """``box`` over every axis of an array of ``shape``: leading axes it does not name taken whole.

    The box may hang over the array's edges (negative starts, stops past the
    extent); only its own bounds are checked.

    Raises
    ------
    RoiError
        For more axes than the array has, non-integer bounds, or a stop before its start.

    Examples
    --------
    >>> file_box((3, 10, 10), Box((-2, 5), (2, 12)))
    Box(start=(0, -2, 5), stop=(3, 2, 12))
    """
    shape = tuple(shape)
    try:
        lo = tuple(operator.index(v) for v in box.start)
        hi = tuple(operator.index(v) for v in box.stop)
    except (TypeError, AttributeError) as e:
        raise RoiError(
            f"{source}: a box needs integer start and stop sequences (array of shape {shape}), found {box!r}"
        ) from e
    if len(lo) != len(hi) or len(lo) > len(shape):
        raise RoiError(
            f"{source}: box start={list(lo)} stop={list(hi)} must have as many start as stop values, at most "
            f"the array's {len(shape)} axes (shape {shape})"
        )
    for axis, (a, b) in enumerate(zip(lo, hi)):
        if b < a:
            raise RoiError(
                f"{source}: box start={list(lo)} stop={list(hi)} ends before it starts on axis "
                f"{len(shape) - len(lo) + axis}: expected start <= stop"
            )
    lead = shape[: len(shape) - len(lo)]
    return Box((0,) * len(lead) + lo, lead + hi)


def plan_boxes(
    header: NpyHeader,
    boxes: Sequence[BoxLike],
    *,
    max_gap: int,
    max_span: int = 1 << 30,
    fill_value: Any = 0,
    source: str = "<array>",
    merge: bool = True,
) -> PatchRuns:
    """Plan the reads of ``boxes`` of a file with ``header``: their spans merged, each box's place in them.

    Parameters
    ----------
    header : NpyHeader
        The file's header.
    boxes : sequence of BoxLike
        Boxes over the trailing axes (see :func:`file_box`); they may
        overlap each other and hang over the edges.
    max_gap : int
        Spans (of one box or of several) whose gap is at most this many bytes
        are read as one; overlapping and touching ones always are.
    max_span : int
        The longest span a box's own runs are merged into
        (:meth:`ReadPlan.coalesce <npydask.plan.region.ReadPlan.coalesce>`).
    fill_value : number
        The value of cells outside the file.
    source : str
        The file's name, for errors.
    merge : bool
        ``False``: plan each box alone and no spans (``spans`` empty, no
        buffer places), for a caller that copies each box from a mapping.

    Raises
    ------
    RoiError
        For a box that does not fit the array's axes (see :func:`file_box`).
    ValueError
        For a ``fill_value`` the dtype cannot hold, or a ``max_gap`` that is not a non-negative int.
    """
    if isinstance(max_gap, bool) or not isinstance(max_gap, int | np.integer) or max_gap < 0:
        raise ValueError(f"max_gap must be a non-negative number of bytes (an int), found {max_gap!r}")
    try:
        fill = convert_fill(fill_value, header.dtype)
    except ValueError as e:
        raise ValueError(f"{source} (array of shape {header.shape}): {e}") from e
    shape = header.shape
    parts: list[tuple[Box, Box, ReadPlan, Coalesced]] = []
    offsets: list[np.ndarray] = []
    lengths: list[int] = []
    for given in boxes:
        box = file_box(shape, given, source)
        inside = Box(
            tuple(min(max(a, 0), n) for a, n in zip(box.start, shape)),
            tuple(min(max(b, 0), n) for b, n in zip(box.stop, shape)),
        )
        plan = plan_read(header, inside)
        co = plan.coalesce(max_gap, max(max_span, plan.run_nbytes))
        parts.append((box, inside, plan, co))
        if plan.n_runs and merge:
            offsets.append(grid_offsets(co.offset, co.outer_shape, co.outer_strides))
            lengths.append(co.span_nbytes)
    spans, places = _merge(offsets, lengths, max_gap)
    cuts = []
    k = 0
    for box, inside, plan, co in parts:
        if not plan.n_runs or not merge:
            cuts.append(BoxCut(box, inside, plan, co))
            continue
        where = places[k]
        k += 1
        strides = _regular(where, co.outer_shape)
        cuts.append(BoxCut(box, inside, plan, co, int(where[0]), strides, None if strides is not None else where))
    return PatchRuns(header, spans, tuple(cuts), fill)


def _merge(offsets: list[np.ndarray], lengths: list[int], max_gap: int) -> tuple[Spans, list[np.ndarray]]:
    """The union of every box's spans, merged across gaps of at most ``max_gap``; each box span's buffer place."""
    if not offsets:
        none = np.zeros(0, np.int64)
        return Spans(none, none, none), []
    counts = [len(o) for o in offsets]
    starts = np.concatenate(offsets)
    ends = starts + np.repeat(np.asarray(lengths, np.int64), counts)
    order = np.argsort(starts, kind="stable")
    s, reach = starts[order], np.maximum.accumulate(ends[order])
    new = np.empty(len(s), bool)
    new[0] = True
    np.greater(s[1:] - reach[:-1], max_gap, out=new[1:])
    first = np.flatnonzero(new)
    merged = s[first]
    merged_len = reach[np.append(first[1:] - 1, len(s) - 1)] - merged
    # The buffer holds the spans grouped by the first box that needs each (file order within a group):
    # a box that shares no span then finds its spans at a regular stride, cut by one strided copy.
    owner = np.minimum.reduceat(np.repeat(np.arange(len(counts)), counts)[order], first)
    layout = np.lexsort((merged, owner))
    placed = np.zeros(len(merged), np.int64)
    np.cumsum(merged_len[layout][:-1], out=placed[1:])
    positions = np.empty_like(placed)
    positions[layout] = placed
    which = np.searchsorted(merged, starts, "right") - 1
    places = positions[which] + (starts - merged[which])
    return Spans(merged[layout], merged_len[layout], placed), np.split(places, np.cumsum(counts[:-1]))


def _regular(where: np.ndarray, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides ``s`` with ``where == where[0] + sum(i_d * s_d)`` over ``shape`` in C order, or ``None``."""
    if len(where) == 1:
        return (0,) * len(shape)
    steps = []
    unit = 1
    for n in reversed(shape):
        steps.append(int(where[unit] - where[0]))
        unit *= n
    strides = tuple(reversed(steps))
    if np.array_equal(grid_offsets(int(where[0]), shape, strides), where):
        return strides
    return None


def check_outs(runs: PatchRuns, out: Sequence[np.ndarray | None] | None, path: str) -> list[np.ndarray | None]:
    """``out`` checked against the boxes of ``runs`` (an array or ``None`` per box), or ``None`` for each box.

    An array must be writeable, C-contiguous, of the box's shape, and of the
    file's dtype or its native-order twin (:func:`cut_boxes` converts).

    Raises
    ------
    ValueError
        For another number of entries than boxes, or an array that does not fit its box.
    TypeError
        For an entry that is neither an array nor ``None``.
    """
    if out is None:
        return [None] * len(runs.cuts)
    out = list(out)
    if len(out) != len(runs.cuts):
        raise ValueError(f"{path}: out must hold one array (or None) per box: {len(runs.cuts)} boxes, {len(out)} found")
    dtype = runs.header.dtype
    for k, (dest, cut) in enumerate(zip(out, runs.cuts)):
        if dest is None:
            continue
        if not isinstance(dest, np.ndarray):
            raise TypeError(f"{path}: out[{k}] must be a numpy.ndarray or None, found {type(dest).__name__}")
        native = dtype.newbyteorder("=")
        fits = dest.dtype in (dtype, native) and dest.dtype.str in (dtype.str, native.str)
        if dest.shape != cut.box.shape or not fits or not dest.flags.c_contiguous or not dest.flags.writeable:
            raise ValueError(
                f"{path}: out[{k}] must be a writeable C-contiguous array of shape {cut.box.shape} and dtype "
                f"{dtype.str} (or {native.str}), found shape {dest.shape}, dtype {dest.dtype.str}, "
                f"{'C-contiguous' if dest.flags.c_contiguous else 'not C-contiguous'}, "
                f"{'writeable' if dest.flags.writeable else 'read-only'}"
            )
    return out


def cut_boxes(runs: PatchRuns, buffer: np.ndarray, out: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
    """Every box of ``runs`` cut out of ``buffer`` (``uint8``, the spans read back to back).

    Each array has the box's shape and the file's dtype (byte order as in
    the file, as :func:`numpy.load` gives it), is C-contiguous and fresh;
    cells outside the file hold :attr:`PatchRuns.fill_value`. Where ``out``
    gives an array for a box (C-contiguous, writeable, the box's shape, the
    file's dtype or its native-order twin: checked by the caller), the box
    is written there and that array returned.
    """
    if len(buffer) != runs.bytes_read:
        raise ValueError(f"the buffer holds {len(buffer)} bytes, the spans {runs.bytes_read}")
    dests = [None] * len(runs.cuts) if out is None else out
    return [_cut(cut, buffer, runs, dest) for cut, dest in zip(runs.cuts, dests)]


def _cut(cut: BoxCut, buffer: np.ndarray, runs: PatchRuns, out: np.ndarray | None) -> np.ndarray:
    plan, co = cut.plan, cut.coalesced
    dtype = runs.header.dtype
    direct = out is not None and not cut.padded and out.dtype.str == dtype.str and out.dtype == dtype
    result = out if direct and out is not None else empty(plan.shape, dtype)
    block = result if same_layout(plan) else empty(plan.file_shape, dtype)
    if plan.n_runs:
        grid = co.outer_shape + co.inner_shape
        dest = as_bytes(block).reshape(grid)
        if cut.strides is not None:
            # (np.ndarray over the buffer: numpy's as_strided costs more Python per call)
            src = np.ndarray(grid, np.uint8, buffer, cut.first, cut.strides + co.inner_strides)
        else:  # spans at irregular places: every run gathered by one fancy index over a window view
            assert cut.positions is not None
            run = plan.run_nbytes
            within = grid_offsets(0, co.inner_shape[:-1], co.inner_strides[:-1])
            starts = (cut.positions[:, None] + within[None, :]).reshape(-1)
            window = np.ndarray((len(buffer) - run + 1, run), np.uint8, buffer, 0, (1, 1))
            src, dest = window[starts], dest.reshape(-1, run)
        np.copyto(dest, src)
        if block is not result:
            np.copyto(raw(result), raw(block.T))
    return pad_box(runs, cut, result, out)


def pad_box(runs: PatchRuns, cut: BoxCut, inside: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The box of ``cut`` from ``inside``, the array of its part inside the file: ``inside`` itself, or padded.

    With ``out`` (the box's shape; the file's dtype or another byte order
    of it) the box is written there and ``out`` returned.

    Examples
    --------
    >>> import numpy as np
    >>> from npydask.format.header import NpyHeader
    >>> h = NpyHeader((1, 0), (4,), np.dtype("<i2"), False, 128, 8)
    >>> runs = plan_boxes(h, [Box((-1,), (2,))], max_gap=0, fill_value=-9)
    >>> pad_box(runs, runs.cuts[0], np.array([5, 6], "<i2"))
    array([-9,  5,  6], dtype=int16)
    """
    if inside is out:
        return out
    if not cut.padded:
        if out is None:
            return inside
        _copy(out, inside)
        return out
    before = tuple(a - b for a, b in zip(cut.inside.start, cut.box.start))
    after = tuple(b - a for a, b in zip(cut.inside.stop, cut.box.stop))
    roi = FileRoi(cut.box.start, cut.box.stop, cut.inside, before, after, cut.box.shape, runs.fill_value)
    if out is None:
        return apply_pad(inside, roi)
    fill_like(out, roi)
    _copy(out[tuple(slice(b, b + n) for b, n in zip(before, inside.shape))], inside)
    return out


def _copy(dest: np.ndarray, src: np.ndarray) -> None:
    """``src`` into ``dest``: every byte where the dtypes are the same, else converted (another byte order)."""
    if dest.dtype == src.dtype and dest.dtype.str == src.dtype.str:
        np.copyto(raw(dest), raw(src))
    else:
        np.copyto(dest, src, casting="equiv")
