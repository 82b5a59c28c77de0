"""Pure planning of a loader's look-ahead: the boxes of the next ``K`` batches grouped per file and planned together.

A sampler loader knows its whole epoch's order, so the reads of several
batches can be planned at once. :func:`windows` cuts an epoch's batches
into windows of ``K`` consecutive batches; :func:`group_window` lists, per
file, every box the window's batches ask of it and the slot (batch, place in
the batch) each box fills; :func:`plan_window` plans each file's boxes with
:func:`~npydask.plan.patch_runs.plan_boxes` as one set of merged spans, one
cut per slot. Tiles of a grid that share whole per-plane spans (same rows,
other columns) or overlap (neighbouring rows) are then read once for the
window instead of once per batch; random patches share nothing and plan the
same spans as batch by batch. Nothing here touches a file.

Examples
--------
>>> from npydask.plan.patches import Patch
>>> batches = [[Patch(0, (0,), (2,)), Patch(1, (0,), (2,))], [Patch(0, (2,), (4,))]]
>>> [(g.file, [b.start for b in g.boxes], [tuple(s) for s in g.slots]) for g in group_window(batches)]
[(0, [(0,), (2,)], [(0, 0), (1, 0)]), (1, [(0,)], [(0, 1)])]
>>> [list(w) for w in windows(5, 2)]
[[0, 1], [2, 3], [4]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from npydask.format.header import NpyHeader
from npydask.plan.patch_runs import PatchRuns, plan_boxes

__all__ = ["FileWindow", "PlannedFile", "SlotBox", "WindowSlot", "group_window", "plan_window", "windows"]


class SlotBox(Protocol):
    """A sample's box as the planner takes it: a ``file`` index and integer ``start``/``stop`` (a patch)."""

    @property
    def file(self) -> int: ...

    @property
    def start(self) -> Sequence[int]: ...

    @property
    def stop(self) -> Sequence[int]: ...


class WindowSlot(NamedTuple):
    """The place a box fills: batch ``batch`` of the window (0 first), sample ``slot`` of that batch."""

    batch: int
    slot: int


@dataclass(frozen=True)
class FileWindow:
    """Every box a window asks of one file, in window order (batch, then slot), and the slot each fills.

    Attributes
    ----------
    file : int
        The file's index in the dataset.
    boxes : tuple
        The boxes (the samples themselves), one per slot.
    slots : tuple of WindowSlot
        Where each box goes, ``slots[i]`` for ``boxes[i]``.
    """

    file: int
    boxes: tuple[Any, ...]
    slots: tuple[WindowSlot, ...]

    @property
    def first_batch(self) -> int:
        """The earliest batch of the window that needs this file."""
        return self.slots[0].batch


@dataclass(frozen=True)
class PlannedFile:
    """A file's boxes of a window planned together: :class:`FileWindow` and its :class:`PatchRuns`."""

    group: FileWindow
    runs: PatchRuns


def windows(n_batches: int, k: int) -> list[range]:
    """The batches ``0..n_batches-1`` in windows of ``k`` consecutive batches (the last may be shorter).

    Raises
    ------
    ValueError
        For ``k < 1`` or a negative ``n_batches``.
    """
    if k < 1 or n_batches < 0:
        raise ValueError(f"windows needs k >= 1 batches and n_batches >= 0, found k={k}, n_batches={n_batches}")
    return [range(i, min(i + k, n_batches)) for i in range(0, n_batches, k)]


def group_window(batches: Sequence[Sequence[SlotBox]]) -> tuple[FileWindow, ...]:
    """The window's boxes grouped per file (files in ascending order), each box with its slot.

    Within a file the boxes keep window order: batch by batch, slot by slot,
    so a planner that groups spans by the first box needing them lays out an
    earlier batch's bytes first.
    """
    found: dict[int, tuple[list[Any], list[WindowSlot]]] = {}
    for b, batch in enumerate(batches):
        for s, box in enumerate(batch):
            boxes, slots = found.setdefault(int(box.file), ([], []))
            boxes.append(box)
            slots.append(WindowSlot(b, s))
    return tuple(FileWindow(f, tuple(found[f][0]), tuple(found[f][1])) for f in sorted(found))


def plan_window(
    batches: Sequence[Sequence[SlotBox]],
    header: Callable[[int], NpyHeader],
    *,
    max_gap: int,
    max_span: int = 1 << 30,
    fill_value: Any = 0,
) -> tuple[PlannedFile, ...]:
    """Each file's boxes of the window planned as one set of merged spans (:func:`plan_boxes`), one cut per slot.

    Parameters
    ----------
    batches : sequence of sequences of SlotBox
        The window's batches, each a list of boxes naming their file.
    header : callable
        ``header(file)``: the file's :class:`~npydask.format.header.NpyHeader`.
    max_gap, max_span, fill_value
        As :func:`~npydask.plan.patch_runs.plan_boxes` takes them.

    Examples
    --------
    >>> import numpy as np
    >>> from npydask.plan.patches import Patch
    >>> h = NpyHeader((1, 0), (4, 8), np.dtype("u1"), False, 128, 32)
    >>> tiles = [[Patch(0, (0, 0), (4, 4))], [Patch(0, (0, 4), (4, 8))]]  # one batch each, same rows
    >>> [(p.runs.bytes_read, len(p.runs.spans)) for p in plan_window(tiles, lambda f: h, max_gap=0)]
    [(32, 1)]
    >>> [(p.runs.bytes_read, len(p.runs.spans)) for b in tiles for p in plan_window([b], lambda f: h, max_gap=0)]
    [(16, 4), (16, 4)]
    """
    return tuple(
        PlannedFile(
            g,
            plan_boxes(
                header(g.file),
                g.boxes,
                max_gap=max_gap,
                max_span=max_span,
                fill_value=fill_value,
                source=f"file {g.file}",
            ),
        )
        for g in group_window(batches)
    )
