"""npydask.plan.lookahead: a window's boxes grouped per file and planned together, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from _boxes import expected_box
from hypothesis import given, settings
from hypothesis import strategies as st

from npydask.format.header import NpyHeader
from npydask.plan.lookahead import WindowSlot, group_window, plan_window, windows
from npydask.plan.patch_runs import cut_boxes
from npydask.plan.patches import Patch

SHAPES = [(6, 20, 24), (5, 16, 16)]


def files(dtype="<f4"):
    dt = np.dtype(dtype)
    arrays = [np.random.default_rng(i).standard_normal(s).astype(dt) for i, s in enumerate(SHAPES)]
    headers = [NpyHeader((1, 0), a.shape, dt, False, 128, a.nbytes) for a in arrays]
    data = [b"\0" * 128 + a.tobytes() for a in arrays]
    return arrays, headers, data


def read(runs, data):
    s = runs.spans
    parts = [np.frombuffer(data, np.uint8, n, o) for o, n in zip(s.offsets.tolist(), s.lengths.tolist())]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def grid_batches(shape, tile, step, batch_size, file=0):
    tiles = [
        Patch(file, (z, y, x), (z + tile, y + tile, x + tile))
        for z in range(0, shape[0] - tile + 1, step)
        for y in range(0, shape[1] - tile + 1, step)
        for x in range(0, shape[2] - tile + 1, step)
    ]
    return [tiles[i : i + batch_size] for i in range(0, len(tiles), batch_size)]


def test_windows_cover_the_batches_in_order():
    assert [list(w) for w in windows(7, 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert windows(0, 2) == []
    assert [list(w) for w in windows(2, 5)] == [[0, 1]]
    with pytest.raises(ValueError, match="k >= 1"):
        windows(3, 0)


def test_group_window_lists_each_file_once_with_its_slots_in_window_order():
    a, b = Patch(1, (0,), (2,)), Patch(0, (1,), (3,))
    groups = group_window([[a, b], [b], [a, a]])
    assert [g.file for g in groups] == [0, 1]
    assert groups[0].slots == (WindowSlot(0, 1), WindowSlot(1, 0))
    assert groups[1].slots == (WindowSlot(0, 0), WindowSlot(2, 0), WindowSlot(2, 1))
    assert groups[1].boxes == (a, a, a) and groups[1].first_batch == 0 and groups[0].first_batch == 0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(0, 1), st.integers(-3, 18), st.integers(-3, 18), st.integers(1, 7)),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([0, 16, 4096]),
)
def test_every_slot_cut_from_the_window_spans_equals_numpy(spec, gap):
    arrays, headers, data = files()
    batches = [
        [Patch(f, (z % 5, y, x), (z % 5 + 1 + n % 3, y + n, x + n)) for f, y, x, n in batch for z in [y]]
        for batch in spec
    ]
    planned = plan_window(batches, headers.__getitem__, max_gap=gap, fill_value=-2)
    seen = set()
    for p in planned:
        got = cut_boxes(p.runs, read(p.runs, data[p.group.file]))
        for box, slot, arr in zip(p.group.boxes, p.group.slots, got):
            assert batches[slot.batch][slot.slot] is box
            np.testing.assert_array_equal(arr, expected_box(arrays[p.group.file], box, -2))
            seen.add(slot)
        offsets, lengths = p.runs.spans.offsets, p.runs.spans.lengths
        order = np.argsort(offsets)
        assert np.all(offsets[order][1:] > (offsets + lengths)[order][:-1])  # each byte read once
    assert seen == {WindowSlot(b, s) for b, batch in enumerate(batches) for s in range(len(batch))}


def test_grid_tiles_share_their_spans_across_batches():
    _, headers, _ = files()
    batches = grid_batches(SHAPES[0], 4, 3, 2)  # 25% overlap, tiles of one row in consecutive batches
    gap = 0

    def cost(window):
        planned = plan_window(window, headers.__getitem__, max_gap=gap)
        return sum(p.runs.bytes_read for p in planned), sum(len(p.runs.spans) for p in planned)

    alone = [cost([b]) for b in batches]
    together = [cost(batches[w.start : w.stop]) for w in windows(len(batches), 4)]
    assert sum(c[0] for c in together) < sum(c[0] for c in alone)
    assert sum(c[1] for c in together) < sum(c[1] for c in alone)


def test_random_boxes_of_files_in_one_batch_each_plan_the_same_spans():
    _, headers, _ = files()
    rng = np.random.default_rng(3)
    batches = []
    for f in range(2):
        starts = rng.integers(0, 8, (3, 3))
        batches.append([Patch(f, tuple(s), tuple(v + 4 for v in s)) for s in starts.tolist()])
    alone = [p.runs.bytes_read for b in batches for p in plan_window([b], headers.__getitem__, max_gap=64)]
    together = [p.runs.bytes_read for p in plan_window(batches, headers.__getitem__, max_gap=64)]
    assert alone == together
