"""npydask.plan.region: boxes and byte-run plans, checked against brute-force oracles without files."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import as_strided

from npydask import RoiError
from npydask.format.header import NpyHeader
from npydask.plan.region import Box, ByteRun, Coalesced, ReadPlan, align_span, normalize_box, plan_read
from npydask.testing.strategies import region_slices, regions, shapes

ITEMSIZES = st.sampled_from([1, 2, 3, 4, 8, 12, 16])
GAPS = [0, 1, 7, 64, 4096, 1 << 20, 1 << 62]


def make_header(shape: tuple[int, ...], itemsize: int, fortran: bool, offset: int = 128) -> NpyHeader:
    dtype = np.dtype(f"V{itemsize}")
    return NpyHeader((1, 0), shape, dtype, fortran, offset, math.prod(shape) * itemsize)


@st.composite
def cases(draw, max_dims: int = 6, max_elements: int = 600):
    """(header, box) for a random shape, item size, order, payload offset and region."""
    shape = draw(shapes(max_dims=max_dims, max_elements=max_elements))
    header = make_header(shape, draw(ITEMSIZES), draw(st.booleans()), draw(st.integers(0, 300)))
    start, stop = draw(regions(shape))
    return header, normalize_box(shape, start, stop)


def oracle_bytes(header: NpyHeader, box: Box) -> np.ndarray:
    """File offsets of every byte of the box's elements, in file order (ascending)."""
    n = math.prod(header.shape)
    if header.fortran_order:
        index = np.arange(n).reshape(header.shape[::-1]).T  # logical view of a Fortran payload
    else:
        index = np.arange(n).reshape(header.shape)
    sel = index[tuple(slice(a, b) for a, b in zip(box.start, box.stop))]
    elements = np.sort(sel.ravel())
    k = header.itemsize
    return (header.data_offset + elements[:, None] * k + np.arange(k)[None, :]).ravel()


def run_bytes(runs: list[ByteRun]) -> np.ndarray:
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(r.offset, r.offset + r.length) for r in runs])


# --------------------------------------------------------------------------
# normalize_box


@pytest.mark.parametrize(
    ("shape", "start", "stop", "expected"),
    [
        ((4, 5), None, None, ((0, 0), (4, 5))),
        ((4, 5), [1], None, ((1, 0), (4, 5))),
        ((4, 5), None, [2], ((0, 0), (2, 5))),
        ((4, 5), (1, 2), (3, 4), ((1, 2), (3, 4))),
        ((4, 5), [], [], ((0, 0), (4, 5))),
        ((4, 5), [4, 5], [4, 5], ((4, 5), (4, 5))),
        ((4, 5), [np.int64(1), np.uint8(2)], (np.int32(3),), ((1, 2), (3, 5))),
        ((4, 5), np.array([1, 2]), np.array([3]), ((1, 2), (3, 5))),
        ((4, 5), range(2), (x for x in [3, 3]), ((0, 1), (3, 3))),
        ((), None, None, ((), ())),
        ((), [], (), ((), ())),
        ((0, 3), None, [0, 2], ((0, 0), (0, 2))),
        ((2**40,), [2**39], None, ((2**39,), (2**40,))),
    ],
    ids=[
        "none",
        "short-start",
        "short-stop",
        "full",
        "empty-lists",
        "at-end",
        "numpy-ints",
        "numpy-arrays",
        "iterables",
        "0d",
        "0d-empty",
        "empty-axis",
        "large",
    ],  # fmt: skip
)
def test_normalize_box(shape, start, stop, expected):
    box = normalize_box(shape, start, stop, source="f.npy")
    assert (box.start, box.stop) == expected
    assert all(type(v) is int for v in box.start + box.stop)
    assert box.shape == tuple(b - a for a, b in zip(*expected))
    assert box.size == math.prod(box.shape)


@pytest.mark.parametrize(
    ("shape", "start", "stop", "match"),
    [
        ((4, 5), [-1], None, "outside"),
        ((4, 5), None, [5], "outside"),
        ((4, 5), None, [4, 6], "outside"),
        ((4, 5), [5], None, "outside"),
        ((4, 5), [3], [2], "ends before it starts"),
        ((4, 5), [0, 3], [4, 2], "ends before it starts"),
        ((4, 5), [1], [0], "ends before it starts"),
        ((4, 5), [0, 0, 0], None, "3 values"),
        ((4, 5), None, [1, 1, 1], "3 values"),
        ((), [0], None, "1 values"),
        ((0,), [1], None, "outside"),
    ],
    ids=[
        "negative",
        "stop-past-end",
        "stop-past-end-axis1",
        "start-past-end",
        "reversed",
        "reversed-axis1",
        "reversed-to-zero",
        "too-many-start",
        "too-many-stop",
        "0d-with-start",
        "empty-axis-start",
    ],  # fmt: skip
)
def test_normalize_box_out_of_range(shape, start, stop, match):
    with pytest.raises(RoiError, match=match) as info:
        normalize_box(shape, start, stop, source="/data/f.npy")
    message = str(info.value)
    assert "/data/f.npy" in message and str(shape) in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "bad",
    [
        [True],
        [0, False],
        [np.True_],
        [1.0],
        [np.float32(1)],
        ["1"],
        "12",
        3,
        [None],
        [[1]],
        [np.array([1])],
        [1 + 0j],
        object(),
    ],  # fmt: skip
    ids=[
        "bool",
        "bool-second",
        "numpy-bool",
        "float",
        "numpy-float",
        "str-item",
        "str",
        "int",
        "none-item",
        "nested",
        "array-item",
        "complex",
        "object",
    ],  # fmt: skip
)
@pytest.mark.parametrize("which", ["start", "stop"])
def test_normalize_box_refuses_non_integers(bad, which):
    kwargs = {which: bad}
    with pytest.raises(RoiError, match=which) as info:
        normalize_box((4, 5), source="/data/f.npy", **kwargs)
    assert "/data/f.npy" in str(info.value) and "(4, 5)" in str(info.value)


@given(shape=shapes(max_dims=8, max_elements=500), data=st.data())
def test_normalize_box_matches_numpy_slicing(shape, data):
    start, stop = data.draw(regions(shape))
    box = normalize_box(shape, start, stop)
    expected = np.empty(shape, dtype=np.uint8)[region_slices(shape, start, stop)].shape
    assert box.shape == expected and len(box.start) == len(shape)
    assert Box.whole(shape) == normalize_box(shape)


# --------------------------------------------------------------------------
# plan_read against the brute-force oracle


@given(cases())
def test_plan_runs_cover_exactly_the_region(case):
    header, box = case
    plan = plan_read(header, box)
    runs = list(plan.runs())
    expected = oracle_bytes(header, box)
    # The runs, concatenated, are the region's bytes in file order: no byte missing, none extra.
    np.testing.assert_array_equal(run_bytes(runs), expected)
    assert plan.nbytes == len(expected) == box.size * header.itemsize
    assert plan.shape == box.shape and plan.itemsize == header.itemsize
    assert plan.file_shape == (box.shape[::-1] if header.fortran_order else box.shape)
    assert plan.n_runs == len(runs)
    assert all(r.length == plan.run_nbytes for r in runs)
    assert all(a.offset + a.length < b.offset for a, b in zip(runs, runs[1:])), "runs overlap, touch or go back"
    if runs:
        assert plan.offset == runs[0].offset
        assert header.data_offset <= runs[0].offset and runs[-1].offset + runs[-1].length <= (
            header.data_offset + header.nbytes
        )
    # Contiguous means one interval of bytes.
    contiguous = len(expected) == 0 or expected[-1] - expected[0] + 1 == len(expected)
    assert plan.is_contiguous == contiguous


@given(cases(max_dims=32, max_elements=2000))
@settings(max_examples=30)
def test_plan_runs_many_dims(case):
    header, box = case
    plan = plan_read(header, box)
    np.testing.assert_array_equal(run_bytes(list(plan.runs())), oracle_bytes(header, box))


def test_plan_whole_array_is_one_run():
    for fortran in (False, True):
        h = make_header((3, 4, 5), 4, fortran, 64)
        plan = plan_read(h, Box.whole(h.shape))
        assert [(r.offset, r.length) for r in plan.runs()] == [(64, 240)]
        assert plan.is_contiguous and plan.outer_shape == ()


def test_plan_empty_region_has_no_runs():
    h = make_header((3, 4), 8, False)
    plan = plan_read(h, Box((1, 2), (1, 4)))
    assert list(plan.runs()) == [] and plan.n_runs == 0 and plan.nbytes == 0 and plan.is_contiguous
    h0 = make_header((3, 0), 8, True)
    assert list(plan_read(h0, Box.whole(h0.shape)).runs()) == []


def test_plan_fortran_example():
    # Logical (4, 6), Fortran: the file holds 6 columns of 4; rows 1..3 of columns 2..5 are 3 runs of 2.
    h = make_header((4, 6), 4, True, 0)
    plan = plan_read(h, Box((1, 2), (3, 5)))
    assert [(r.offset, r.length) for r in plan.runs()] == [(36, 8), (52, 8), (68, 8)]
    assert plan.file_shape == (3, 2)


def test_plan_0d():
    h = make_header((), 16, False, 80)
    plan = plan_read(h, normalize_box((), None, None))
    assert [(r.offset, r.length) for r in plan.runs()] == [(80, 16)]


# --------------------------------------------------------------------------
# coalesce


def spans_cover(co: Coalesced, runs: list[ByteRun]) -> bool:
    spans = list(co.spans())
    i = 0
    for r in runs:
        while i < len(spans) and spans[i].offset + spans[i].length < r.offset + r.length:
            i += 1
        if i == len(spans) or not spans[i].offset <= r.offset:
            return False
    return True


@given(cases(), st.integers(1, 1 << 16))
def test_coalesce(case, max_span):
    header, box = case
    plan = plan_read(header, box)
    runs = list(plan.runs())
    previous = None
    for gap in GAPS:
        co = plan.coalesce(gap)
        spans = list(co.spans())
        assert co.n_spans == len(spans) and co.read_nbytes == co.n_spans * co.span_nbytes
        assert co.read_nbytes >= plan.nbytes
        assert all(s.length == co.span_nbytes for s in spans)
        assert all(a.offset + a.length <= b.offset for a, b in zip(spans, spans[1:]))
        assert spans_cover(co, runs)
        if runs:
            assert spans[0].offset == runs[0].offset
            assert spans[-1].offset + spans[-1].length == runs[-1].offset + runs[-1].length
            # Each span's inner grid accounts for its share of the runs.
            assert math.prod(co.inner_shape) * co.n_spans == plan.n_runs * plan.run_nbytes
            assert co.inner_shape[-1] == plan.run_nbytes and co.inner_strides[-1] == 1
        if previous is not None:
            assert co.n_spans <= previous
        previous = co.n_spans
        if gap == 0 and runs:
            assert co.n_spans == plan.n_runs  # runs are maximal: there is a gap between any two
            assert co.read_nbytes == plan.nbytes
        if gap == GAPS[-1] and runs:
            assert co.n_spans == 1  # one read from the first to the last byte
            assert co.span_nbytes == runs[-1].offset + runs[-1].length - runs[0].offset
    limited = plan.coalesce(GAPS[-1], max_span)
    if runs:
        assert limited.span_nbytes <= max(max_span, plan.run_nbytes)
        assert spans_cover(limited, runs)


def test_coalesce_example():
    h = make_header((10, 10), 1, False, 0)
    plan = plan_read(h, Box((0, 2), (10, 6)))  # 10 runs of 4 bytes, 6 bytes apart
    assert plan.coalesce(5).n_spans == 10
    co = plan.coalesce(6)
    assert (co.n_spans, co.span_nbytes, co.inner_shape, co.inner_strides) == (1, 94, (10, 4), (10, 1))
    assert plan.coalesce(6, max_span=93).n_spans == 10


# --------------------------------------------------------------------------
# An in-memory executor: the plan applied to a bytes buffer reproduces numpy slicing.


def execute(plan: ReadPlan, file: bytes, max_gap: int, max_span: int, dtype: np.dtype) -> np.ndarray:
    """Read a plan from ``file`` (the I/O is a slice of bytes), as a backend would."""
    raw = np.empty(plan.nbytes, np.uint8)
    if plan.nbytes:
        co = plan.coalesce(max_gap, max(max_span, plan.run_nbytes))
        per_span = plan.nbytes // co.n_spans
        for k, span in enumerate(co.spans()):
            scratch = np.frombuffer(file, np.uint8, count=span.length, offset=span.offset)
            grid = as_strided(scratch, co.inner_shape, co.inner_strides, writeable=False)
            raw[k * per_span : (k + 1) * per_span] = grid.ravel()
    out = raw.view(dtype).reshape(plan.file_shape)
    return np.ascontiguousarray(out.T if plan.fortran_order else out)


def execute_runs(plan: ReadPlan, file: bytes, dtype: np.dtype) -> np.ndarray:
    raw = b"".join(file[r.offset : r.offset + r.length] for r in plan.runs())
    out = np.frombuffer(raw, dtype).reshape(plan.file_shape)
    return np.ascontiguousarray(out.T if plan.fortran_order else out)


@given(
    shape=shapes(max_dims=5, max_elements=800),
    dtype=st.sampled_from(["<f4", ">i2", "u1", "<c16", "S3", "V5"]).map(np.dtype),
    fortran=st.booleans(),
    offset=st.integers(0, 200),
    gap=st.sampled_from(GAPS),
    max_span=st.integers(1, 4096),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_executor_reproduces_numpy_slicing(shape, dtype, fortran, offset, gap, max_span, seed, data):
    rng = np.random.default_rng(seed)
    payload = rng.bytes(math.prod(shape) * dtype.itemsize)
    file = rng.bytes(offset) + payload + rng.bytes(7)
    stored = np.frombuffer(payload, dtype)
    array = stored.reshape(shape[::-1]).T if fortran else stored.reshape(shape)
    header = NpyHeader((1, 0), shape, dtype, fortran, offset, len(payload))
    start, stop = data.draw(regions(shape))
    expected = np.ascontiguousarray(array[region_slices(shape, start, stop) + (...,)])  # `...`: 0-d stays an array
    plan = plan_read(header, normalize_box(shape, start, stop))
    for got in (execute(plan, file, gap, max_span, dtype), execute_runs(plan, file, dtype)):
        assert got.shape == expected.shape and got.flags.c_contiguous
        assert got.tobytes() == expected.tobytes()


# --------------------------------------------------------------------------
# align_span


@given(
    offset=st.integers(0, 1 << 40),
    length=st.integers(0, 1 << 24),
    alignment=st.one_of(st.sampled_from([1, 512, 4096]), st.integers(1, 10_000)),
)
def test_align_span(offset, length, alignment):
    lo, n = align_span(offset, length, alignment)
    hi = lo + n
    assert lo % alignment == 0 and n % alignment == 0
    assert lo <= offset and offset + length <= hi
    assert offset - lo < alignment and hi - (offset + length) < alignment  # the smallest such range


@pytest.mark.parametrize(
    ("offset", "length", "alignment", "expected"),
    [
        (0, 0, 4096, (0, 0)),
        (4096, 0, 4096, (4096, 0)),
        (1, 1, 512, (0, 512)),
        (511, 2, 512, (0, 1024)),
        (4096, 4096, 4096, (4096, 4096)),
        (100, 10, 1, (100, 10)),
    ],  # fmt: skip
)
def test_align_span_examples(offset, length, alignment, expected):
    assert align_span(offset, length, alignment) == expected


@pytest.mark.parametrize(
    "box",
    [Box((0,), (3,)), Box((0, 0, 0), (3, 4, 1)), Box((0, 0), (4, 4)), Box((2, 0), (1, 4)), Box((-1, 0), (2, 4))],
    ids=["too-few-axes", "too-many-axes", "past-end", "reversed", "negative"],
)
def test_plan_read_refuses_a_box_that_does_not_fit(box):
    with pytest.raises(RoiError, match=r"\(3, 4\)"):
        plan_read(make_header((3, 4), 4, False), box)
