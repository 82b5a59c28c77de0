"""npydask.plan.patch_runs: many boxes of one file planned as one set of spans, checked against numpy without files."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _boxes import box_lists, expected_box
from hypothesis import given, settings
from hypothesis import strategies as st

from npydask import RoiError
from npydask.format.header import NpyHeader
from npydask.plan.patch_runs import PatchRuns, cut_boxes, file_box, plan_boxes
from npydask.plan.region import Box
from npydask.testing.strategies import assert_same_array, shapes

DTYPES = ["u1", "<i2", ">i4", "<f4", ">f8", "<c8", "V3", "?", [("a", "<u2"), ("b", "u1")]]
FILL = 3


def make(shape: tuple[int, ...], dtype: object, fortran: bool, seed: int, offset: int = 128):
    """A header and the file's bytes (header bytes as zeros, then a random payload)."""
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    nbytes = math.prod(shape) * dt.itemsize
    header = NpyHeader((1, 0), shape, dt, fortran, offset, nbytes)
    payload = np.random.default_rng(seed).bytes(nbytes)
    if dt.kind == "b":
        payload = bytes(b & 1 for b in payload)
    return header, b"\0" * offset + payload


def array_of(header: NpyHeader, data: bytes) -> np.ndarray:
    a = np.frombuffer(data, header.dtype, math.prod(header.shape), header.data_offset)
    if header.fortran_order:
        return a.reshape(header.shape[::-1]).T
    return a.reshape(header.shape)


def read(runs: PatchRuns, data: bytes) -> np.ndarray:
    """The spans of ``runs`` read from ``data`` back to back, as a reader fills its buffer."""
    s = runs.spans
    parts = [np.frombuffer(data, np.uint8, n, o) for o, n in zip(s.offsets.tolist(), s.lengths.tolist())]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def box_bytes(header: NpyHeader, box: Box) -> set[int]:
    """File offsets of every byte of the elements of ``box`` inside the file."""
    shape = header.shape
    index = np.arange(math.prod(shape))
    index = index.reshape(shape[::-1]).T if header.fortran_order else index.reshape(shape)
    lo = [min(max(a, 0), n) for a, n in zip(box.start, shape)]
    hi = [min(max(b, 0), n) for b, n in zip(box.stop, shape)]
    elements = index[tuple(slice(a, b) for a, b in zip(lo, hi))].ravel()
    k = header.itemsize
    return set((header.data_offset + elements[:, None] * k + np.arange(k)).ravel().tolist())


@st.composite
def cases(draw):
    shape = draw(shapes(max_dims=4, max_elements=400))
    dtype = draw(st.sampled_from(DTYPES))
    header, data = make(shape, dtype, draw(st.booleans()), draw(st.integers(0, 2**32 - 1)))
    return header, data, draw(box_lists(shape))


@settings(max_examples=300, deadline=None)
@given(cases(), st.sampled_from([0, 1, 5, 64, 4096, 1 << 40]))
def test_boxes_equal_numpy_and_each_byte_is_read_once(case, max_gap):
    header, data, boxes = case
    fill = 0 if header.dtype.kind == "V" else FILL  # (non-numeric dtypes take zeros only)
    runs = plan_boxes(header, boxes, max_gap=max_gap, fill_value=fill)
    a = array_of(header, data)
    got = cut_boxes(runs, read(runs, data))
    assert len(got) == len(boxes)
    for g, b in zip(got, boxes):
        full = file_box(header.shape, b)
        assert g.flags.c_contiguous and g.flags.writeable
        assert_same_array(g, expected_box(a, full, fill))
    s = runs.spans
    ends = s.offsets + s.lengths
    assert np.all(s.lengths > 0)
    by_offset = np.argsort(s.offsets)
    assert np.all(s.offsets[by_offset][1:] - ends[by_offset][:-1] > max_gap)  # merged where it may: no byte twice
    assert s.positions.tolist() == np.concatenate([[0], np.cumsum(s.lengths)[:-1]]).astype(int).tolist()[: len(s)]
    wanted = set().union(*(box_bytes(header, file_box(header.shape, b)) for b in boxes))
    spanned = set().union(*(range(o, e) for o, e in zip(s.offsets.tolist(), ends.tolist())))
    assert wanted <= spanned
    if max_gap == 0:
        assert runs.bytes_read == len(wanted)  # exactly the boxes' bytes
    assert runs.patch_bytes == sum(file_box(header.shape, b).size for b in boxes) * header.itemsize


def test_overlapping_boxes_read_their_union_once():
    header, data = make((8, 10, 12), "<f4", False, 1)
    a, b = Box((0, 0, 0), (4, 10, 12)), Box((2, 0, 0), (6, 10, 12))  # whole planes: one run each
    runs = plan_boxes(header, [a, b], max_gap=0)
    assert runs.spans.offsets.tolist() == [128] and runs.spans.lengths.tolist() == [6 * 480]
    assert runs.bytes_read == 6 * 480 < a.size * 4 + b.size * 4


def test_without_merging_each_box_keeps_its_own_plan_and_no_spans():
    header, _ = make((8, 10, 12), "<f4", True, 1)
    boxes = [Box((0, 1, 2), (4, 6, 9)), Box((-2, 0, 0), (3, 10, 12)), Box((9, 0, 0), (12, 3, 3))]
    merged, alone = (plan_boxes(header, boxes, max_gap=64, merge=m) for m in (True, False))
    assert len(alone.spans) == 0 and alone.bytes_read == 0 and len(merged.spans) > 0
    assert [(c.box, c.inside, c.plan) for c in alone.cuts] == [(c.box, c.inside, c.plan) for c in merged.cuts]
    assert [c.padded for c in alone.cuts] == [c.padded for c in merged.cuts] == [False, True, True]


def test_boxes_that_share_no_span_are_one_strided_copy_each():
    # Planes of three random boxes interleave in file order; grouped by box in the buffer, each box's
    # spans sit at a regular stride.
    header, data = make((40, 32, 32), "<f4", False, 9)
    boxes = [Box((3, 4, 5), (19, 20, 13)), Box((10, 1, 20), (26, 17, 28)), Box((5, 16, 0), (21, 32, 4))]
    runs = plan_boxes(header, boxes, max_gap=0)
    assert all(cut.strides is not None for cut in runs.cuts) and len(runs.spans) == 3 * 16 * 16
    arr = array_of(header, data)
    for g, b in zip(cut_boxes(runs, read(runs, data)), boxes):
        np.testing.assert_array_equal(g, expected_box(arr, b, 0))


def test_spans_at_irregular_places_are_gathered():
    # Box A's planes fall into spans that box B lengthens on some planes only: A's spans do not
    # sit at a regular stride in the buffer, so A is gathered rather than cut with one view.
    header, data = make((6, 16, 16), "u1", False, 2)
    a, b = Box((0, 0, 0), (6, 2, 4)), Box((2, 0, 4), (3, 4, 16))
    runs = plan_boxes(header, [a, b], max_gap=2)
    assert runs.cuts[0].strides is None and runs.cuts[0].positions is not None
    arr = array_of(header, data)
    got = cut_boxes(runs, read(runs, data))
    np.testing.assert_array_equal(got[0], arr[0:6, 0:2, 0:4])
    np.testing.assert_array_equal(got[1], arr[2:3, 0:4, 4:16])


def test_leading_axes_are_kept_whole():
    header, data = make((2, 5, 6), ">i2", True, 3)
    runs = plan_boxes(header, [Box((1, -1), (4, 3))], max_gap=0, fill_value=-7)
    (got,) = cut_boxes(runs, read(runs, data))
    assert got.shape == (2, 3, 4) and got.dtype.str == ">i2"
    assert_same_array(got, expected_box(array_of(header, data), Box((0, 1, -1), (2, 4, 3)), -7))


def test_a_box_wholly_outside_reads_nothing():
    header, data = make((4, 4), "<f8", False, 4)
    runs = plan_boxes(header, [Box((5, 5), (7, 6)), Box((-3, 0), (-1, 4))], max_gap=4096, fill_value=1.5)
    assert runs.bytes_read == 0 and len(runs.spans) == 0
    got = cut_boxes(runs, np.zeros(0, np.uint8))
    assert [g.tolist() for g in got] == [[[1.5], [1.5]], [[1.5] * 4] * 2]


def test_zero_d_and_empty_arrays():
    header, data = make((), "<i4", False, 5)
    runs = plan_boxes(header, [Box((), ()), Box((), ())], max_gap=0)
    assert runs.bytes_read == 4
    got = cut_boxes(runs, read(runs, data))
    assert [g.shape for g in got] == [(), ()] and got[0] == array_of(header, data)[()]
    header, data = make((3, 0), "<i4", False, 5)
    runs = plan_boxes(header, [Box((0, 0), (2, 0)), Box((-1, -1), (1, 1))], max_gap=0, fill_value=9)
    got = cut_boxes(runs, read(runs, data))
    assert runs.bytes_read == 0 and got[0].shape == (2, 0) and got[1].tolist() == [[9, 9], [9, 9]]


@pytest.mark.parametrize(
    ("box", "match"),
    [
        (Box((0, 0, 0, 0), (1, 1, 1, 1)), "at most the array's 3 axes"),
        (Box((0, 0), (1,)), "as many start as stop"),
        (Box((0, 3), (1, 2)), "ends before it starts on axis 2"),
        (Box((0.5,), (1,)), "integer start and stop"),  # type: ignore[arg-type]
        ("not a box", "integer start and stop"),
    ],
)
def test_bad_boxes_are_refused_naming_the_file(box, match):
    header, _ = make((2, 3, 4), "u1", False, 6)
    with pytest.raises(RoiError, match=match) as info:
        plan_boxes(header, [box], max_gap=0, source="/data/v.npy")
    assert "/data/v.npy" in str(info.value)


def test_bad_fill_value_and_gap():
    header, _ = make((2, 3), "<i4", False, 7)
    with pytest.raises(ValueError, match=r"/data/v\.npy.*nan"):
        plan_boxes(header, [], max_gap=0, fill_value=float("nan"), source="/data/v.npy")
    for gap in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_gap"):
            plan_boxes(header, [], max_gap=gap)  # type: ignore[arg-type]


def test_the_buffer_must_be_the_spans():
    header, data = make((4,), "u1", False, 8)
    runs = plan_boxes(header, [Box((1,), (3,))], max_gap=0)
    with pytest.raises(ValueError, match="holds 5 bytes, the spans 2"):
        cut_boxes(runs, np.zeros(5, np.uint8))
