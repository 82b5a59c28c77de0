"""The oracle of the box-reading tests: numpy slicing, with the cells outside the array filled."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from npydask.plan.patch_runs import file_box
from npydask.plan.region import Box


def expected_box(a: np.ndarray, box: Box, fill: Any) -> np.ndarray:
    """``a[box]`` (``box`` over a's trailing axes, leading ones whole), cells outside ``a`` set to ``fill``.

    Non-numeric dtypes are filled with zero bytes (they take ``fill=0`` only).
    """
    full = file_box(a.shape, box)
    out = np.zeros(full.shape, a.dtype)
    if a.dtype.kind not in "VSUMmO" and out.size:
        out[...] = fill
    lo = [min(max(s, 0), n) for s, n in zip(full.start, a.shape)]
    hi = [min(max(s, 0), n) for s, n in zip(full.stop, a.shape)]
    inside = a[tuple(slice(p, q) for p, q in zip(lo, hi))]
    out[tuple(slice(p - s, q - s) for p, q, s in zip(lo, hi, full.start))] = inside
    return out


@st.composite
def box_lists(draw: st.DrawFn, shape: tuple[int, ...], max_boxes: int = 6) -> list[Box]:
    """Up to ``max_boxes`` boxes over the same trailing axes of ``shape``, and now and then the first one again.

    Boxes lie inside, overlap, touch, hang over the edges or lie wholly outside.
    """
    k = draw(st.integers(0, len(shape)))
    boxes = []
    for _ in range(draw(st.integers(0, max_boxes))):
        lo, hi = [], []
        for n in shape[len(shape) - k :]:
            a = draw(st.integers(-3, n + 2))
            lo.append(a)
            hi.append(draw(st.integers(a, a + n + 3)))
        boxes.append(Box(tuple(lo), tuple(hi)))
    if boxes and draw(st.booleans()):
        boxes.append(boxes[0])
    return boxes


def save_npz_members(root: Any, compressed: bool) -> list[dict[str, np.ndarray]]:
    """Three ``s{i}.npz`` files under ``root``, members ``"x"`` (2, 9, 8) >f4 and ``"m"`` (9, 8) u1; their arrays."""
    rng = np.random.default_rng(0)
    members = [{"x": rng.standard_normal((2, 9, 8)).astype(">f4"), "m": rng.integers(0, 9, (9, 8), "u1")}
               for _ in range(3)]  # fmt: skip
    for i, m in enumerate(members):
        (np.savez_compressed if compressed else np.savez)(root / f"s{i}.npz", **m)
    return members
