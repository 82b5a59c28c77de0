"""Which consecutive files form each task of a stack or a concatenation: pure planning, no I/O.

:func:`plan_groups` turns the files' payload sizes and shapes into a
:class:`GroupPlan`: small files packed several per task up to a target size,
larger ones in file-contiguous chunks of their own. :func:`one_grid` says
whether the groups line up on one chunk grid (then one source can serve them
all). :func:`plan_row_ranges` turns a plan into the row ranges of Ray Data's
read tasks. :mod:`npydask.dataset.stacking` reads what these plans describe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import dask
import numpy as np
from dask.system import CPU_COUNT

from npydask.plan.chunks import auto_chunks, regular_grid

__all__ = ["GroupPlan", "RowRange", "one_grid", "plan_groups", "plan_row_ranges"]


@dataclass(frozen=True)
class GroupPlan:
    """Which files form each task group, and the chunks inside each group."""

    bounds: tuple[tuple[int, int], ...]
    inner_chunks: tuple[tuple[tuple[int, ...], ...], ...]


def _target_group_bytes(total: int, limit: int, threads: int) -> int:
    """Bytes per task: at most ``limit``, yet two tasks per thread once the data exceeds a few MiB."""
    if total <= 4 << 20:
        return limit
    return max(1 << 20, min(limit, math.ceil(total / (2 * threads))))


def plan_groups(
    sizes: Sequence[int] | np.ndarray,
    shapes: Sequence[tuple[int, ...]],
    dtype: np.dtype,
    fortran: Sequence[bool],
    *,
    limit: int,
    axis: int,
    stacked: bool,
    threads: int | None = None,
    strided: bool = False,
    copies: bool = False,
) -> GroupPlan:
    """Group consecutive files for tasks.

    The target task size is ``limit``, or less once the data exceeds a few
    MiB, so that there are at least two tasks per thread (``threads``
    defaults to dask's ``num_workers`` setting, else ``CPU_COUNT``, as
    dask's threaded scheduler does), but never under 1 MiB. Files under
    ``limit / 8`` bytes are packed several per group up to the target; a
    larger file, or one over the target, is a group of its own, split into
    file-contiguous chunks of at most the target (along any axis when
    stacked; along ``axis`` only when concatenating, so groups still line up).
    With ``strided`` (files cut to ROIs: many small reads each, so the cost
    is per file rather than per byte), a group also holds at most
    ``ceil(n / (2 * threads))`` files, so every thread gets work. With
    ``copies`` (every chunk is a copy anyway, as on a distributed worker,
    which never maps files), files of any size up to the target are grouped
    too: a cluster pays milliseconds per task, so fewer, larger tasks win.

    Examples
    --------
    >>> plan = plan_groups([100] * 10, [(25,)] * 10, np.dtype("f4"), [False] * 10, limit=1000,
    ...                    axis=0, stacked=True)
    >>> plan.bounds
    ((0, 10),)
    """
    threads = threads or dask.config.get("num_workers", None) or CPU_COUNT or 1
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    target = _target_group_bytes(int(sizes.sum()), limit, threads)
    small = limit // 8
    max_files = math.ceil(len(sizes) / (2 * threads)) if strided else len(sizes)
    large = (sizes > 0) & ((sizes > target) | ((sizes >= small) & (not copies)))
    if not large.any():  # all small (the million-file case): O(groups) array steps, no loop over files
        bounds = _packed(sizes, target, max_files)
        return GroupPlan(tuple(bounds), tuple(_whole(shapes, a, b, axis, stacked) for a, b in bounds))
    return _plan_each(sizes.tolist(), shapes, dtype, fortran, target, small, max_files, axis, stacked, copies)


def _packed(sizes: np.ndarray, target: int, max_files: int) -> list[tuple[int, int]]:
    """Greedy groups of consecutive files, each under ``target`` bytes and ``max_files`` files (its first always in).

    The bounds :func:`_plan_each` gives files none of which is large, found
    by ``searchsorted`` on the running total: one step per group.
    """
    n = len(sizes)
    total = np.concatenate(([0], np.cumsum(sizes)))
    bounds: list[tuple[int, int]] = []
    a = 0
    while a < n:
        b = int(np.searchsorted(total, int(total[a]) + target, side="right")) - 1
        b = min(max(b, a + 1), a + max_files, n)
        bounds.append((a, b))
        a = b
    return bounds


def _plan_each(
    sizes: list[int],
    shapes: Sequence[tuple[int, ...]],
    dtype: np.dtype,
    fortran: Sequence[bool],
    target: int,
    small: int,
    max_files: int,
    axis: int,
    stacked: bool,
    copies: bool,
) -> GroupPlan:
    """:func:`plan_groups` file by file (some files are large: each gets a group of its own, split)."""
    bounds: list[tuple[int, int]] = []
    inner: list[tuple[tuple[int, ...], ...]] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        if size > 0 and ((size >= small and not copies) or size > target):
            if start < i:
                bounds.append((start, i))
                inner.append(_whole(shapes, start, i, axis, stacked))
            bounds.append((i, i + 1))
            inner.append(_split(shapes[i], dtype, bool(fortran[i]), target, axis, stacked))
            start, acc = i + 1, 0
            continue
        if (acc + size > target or i - start >= max_files) and start < i:
            bounds.append((start, i))
            inner.append(_whole(shapes, start, i, axis, stacked))
            start, acc = i, 0
        acc += size
    if start < len(sizes):
        bounds.append((start, len(sizes)))
        inner.append(_whole(shapes, start, len(sizes), axis, stacked))
    return GroupPlan(tuple(bounds), tuple(inner))


def _whole(shapes: Sequence[tuple[int, ...]], a: int, b: int, axis: int, stacked: bool) -> tuple[tuple[int, ...], ...]:
    first = shapes[a]
    if stacked:
        return ((b - a,), *((n,) for n in first))
    length = sum(s[axis] for s in shapes[a:b])
    return tuple((length,) if d == axis else (n,) for d, n in enumerate(first))


def _split(
    shape: tuple[int, ...], dtype: np.dtype, fortran: bool, limit: int, axis: int, stacked: bool
) -> tuple[tuple[int, ...], ...]:
    chunk = auto_chunks(shape, dtype, fortran, limit)
    if stacked:
        return ((1,), *regular_grid(shape, chunk))
    # Concatenating: only split along the joining axis, so every group spans the other axes whole.
    per = max(1, limit // max(1, math.prod(n for d, n in enumerate(shape) if d != axis) * dtype.itemsize))
    return regular_grid(shape, tuple(per if d == axis else n for d, n in enumerate(shape)))


def one_grid(plan: GroupPlan, axis: int) -> tuple[tuple[int, ...], ...] | None:
    """The chunks of all of ``plan``'s groups as one grid, or ``None`` if they do not line up.

    Groups line up when they are chunked alike on every axis but the joining
    ``axis``; the grid is then their chunks along ``axis`` one after another.

    Examples
    --------
    >>> one_grid(GroupPlan(((0, 2), (2, 3)), (((2,), (5,)), ((1,), (5,)))), 0)
    ((2, 1), (5,))
    >>> one_grid(GroupPlan(((0, 2), (2, 3)), (((2,), (5,)), ((1,), (3, 2)))), 0) is None
    True
    """
    others = {chunks[:axis] + chunks[axis + 1 :] for chunks in plan.inner_chunks}
    if len(others) != 1:
        return None
    rest = others.pop()
    along = tuple(n for chunks in plan.inner_chunks for n in chunks[axis])
    return (*rest[:axis], along, *rest[axis:])


@dataclass(frozen=True)
class RowRange:
    """Rows ``start..stop`` of the dataset (files when stacking, elements along ``axis`` when joining)."""

    start: int
    stop: int


def plan_row_ranges(
    lengths: Sequence[int],
    sizes: Sequence[int],
    shapes: Sequence[tuple[int, ...]],
    dtype: np.dtype,
    fortran: Sequence[bool],
    *,
    axis: int,
    stacked: bool,
    limit: int,
    num_blocks: int | None,
    threads: int | None = None,
) -> list[RowRange]:
    """The row ranges of the read tasks: ``num_blocks`` equal ones, else ``plan_groups``'s groups.

    ``lengths`` are each file's rows (1 when stacking, its extent along
    ``axis`` when joining). ``threads`` (the cluster's CPUs) caps a task's
    bytes once the data exceeds a few MiB, so every CPU gets work. With
    :func:`~npydask.plan.grouping.plan_groups` a stacked group is one range (a row
    is a whole file, never cut) and a joined group one range per chunk along
    ``axis``. Empty ranges are dropped.

    Examples
    --------
    >>> f4 = np.dtype("f4")
    >>> plan_row_ranges([1] * 4, [400] * 4, [(100,)] * 4, f4, [False] * 4, axis=0, stacked=True,
    ...                 limit=1 << 20, num_blocks=None)
    [RowRange(start=0, stop=4)]
    >>> plan_row_ranges([10], [400], [(10, 10)], f4, [False], axis=0, stacked=False, limit=1, num_blocks=3)
    [RowRange(start=0, stop=3), RowRange(start=3, stop=7), RowRange(start=7, stop=10)]
    """
    total = sum(lengths)
    if num_blocks is not None:
        edges = np.linspace(0, total, min(num_blocks, total) + 1).round().astype(int).tolist() if total else [0]
        return [RowRange(a, b) for a, b in zip(edges, edges[1:]) if b > a]
    # copies=True: a block is a copy into Ray's object store anyway, so files of any size up to the
    # target share a task (plan_groups keeps files over limit/8 apart only to map them without a copy).
    plan = plan_groups(
        sizes, shapes, dtype, fortran, limit=limit, axis=axis, stacked=stacked, threads=threads, copies=True
    )
    offsets = np.cumsum([0, *lengths]).tolist()
    ranges: list[RowRange] = []
    for (a, b), chunks in zip(plan.bounds, plan.inner_chunks):
        if stacked:
            pieces = [b - a]
        else:
            pieces = list(chunks[axis])
        at = offsets[a]
        for n in pieces:
            if n:
                ranges.append(RowRange(at, at + n))
            at += n
    return ranges
