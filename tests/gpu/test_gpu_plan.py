"""GPU read planning, executed on the CPU with numpy standing in for CuPy.

The same :func:`execute_plan` runs on a GPU with ``xp=cupy`` and kvikio's
``pread``; here a fake ``read_span`` serves the bytes of an in-memory ``.npy``
file, checks every read is aligned, inside the file and disjoint from the
others in the staging buffer, and counts them.
"""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npydask
from npydask.errors import FileChangedError, RoiError
from npydask.format.header import parse_header
from npydask.gpu._exec import aligned_empty, execute_plan
from npydask.gpu.plan import DEFAULT_TASK_BYTES, GpuReadOptions, gpu_read_options, native_dtype, plan_gpu_read
from npydask.plan.region import Box
from npydask.plan.roi import RoiArgs, resolve_roi

GPU_DTYPES = ["<f4", ">f4", "<f8", ">f8", "<f2", ">f2", "<c8", ">c8", "<c16", ">c16", "?", "|i1", "|u1",
              "<i2", ">i2", "<u4", ">u4", "<i8", ">i8", ">u8"]  # fmt: skip


def random_array(shape, dtype, seed=0):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, math.prod(shape) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw = raw % 2
    return np.frombuffer(raw.tobytes(), dtype=dtype).reshape(shape)


def npy_bytes(array, order="C"):
    buf = io.BytesIO()
    np.save(buf, np.array(array, order=order, copy=True))  # (ascontiguousarray makes 0-d arrays 1-d)
    return buf.getvalue()


class FakeDisk:
    """A file in memory behind ``read_span``: strict about alignment, EOF and overlaps."""

    def __init__(self, raw: bytes, options: GpuReadOptions, *, futures: bool = False, short_at: int | None = None):
        self.raw = raw
        self.options = options
        self.futures = futures
        self.short_at = short_at
        self.calls: list[tuple[int, int, int]] = []  # (file offset, size, dest address)
        self.gets = 0

    def read_span(self, offset: int, size: int, dest: np.ndarray):
        a = self.options.alignment
        assert dest.dtype == np.uint8 and dest.shape == (size,) and dest.flags.c_contiguous
        assert offset % a == 0, f"unaligned file offset {offset}"
        assert dest.ctypes.data % a == 0, "unaligned destination"
        assert offset + size <= len(self.raw), f"read past EOF: {offset}+{size} > {len(self.raw)}"
        assert size % a == 0 or offset + size == len(self.raw), f"unaligned size {size} before EOF"
        task = self.options.task_bytes
        assert 0 < size and (not task or size <= max(a, task - task % a))
        self.calls.append((offset, size, dest.ctypes.data))
        got = self.raw[offset : offset + size]
        if self.short_at is not None and offset <= self.short_at < offset + size:
            got = got[: self.short_at - offset]
        dest[: len(got)] = np.frombuffer(got, np.uint8)
        if not self.futures:
            return len(got)
        return _Future(self, len(got))


class _Future:
    def __init__(self, disk: FakeDisk, n: int):
        self.disk, self.n = disk, n

    def get(self) -> int:
        self.disk.gets += 1
        return self.n


def check_disjoint(plan):
    spans = sorted((r.staging_offset, r.staging_offset + r.size) for r in plan.reads)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "reads overlap in the staging buffer"
    assert all(0 <= a and b <= plan.staging_nbytes for a, b in spans)


def oracle(array, box, roi=None):
    """numpy's answer: the box of the array, or of the ROI's padded output; native, C order."""
    out_dtype = native_dtype(array.dtype)
    if roi is None:
        return np.array(array[tuple(slice(a, b) for a, b in zip(box.start, box.stop))], out_dtype, order="C")
    full = np.full(roi.shape, roi.fill_value if roi.fill_value is not None else 0, out_dtype)
    src = tuple(slice(a, b) for a, b in zip(roi.box.start, roi.box.stop))
    dst = tuple(slice(p, p + (b - a)) for p, a, b in zip(roi.pad_before, roi.box.start, roi.box.stop))
    full[dst] = array[src]
    return np.array(full[tuple(slice(a, b) for a, b in zip(box.start, box.stop))], order="C")


def same(a, b):
    assert a.dtype == b.dtype and a.dtype.str == b.dtype.str, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.flags.c_contiguous
    assert a.tobytes() == b.tobytes()


def run(array, box, *, order="C", roi=None, options=None, futures=False, prefix=0):
    options = options or GpuReadOptions()
    raw = npy_bytes(array, order)
    header = parse_header(raw)
    if prefix:  # the payload at an offset no itemsize divides, as in a stored .npz member
        raw = b"\0" * prefix + raw
        header = header.with_offset(prefix)
    plan = plan_gpu_read(header, box, file_size=len(raw), roi=roi, options=options)
    check_disjoint(plan)
    disk = FakeDisk(raw, options, futures=futures)
    result = execute_plan(plan, disk.read_span, np, source="x.npy")
    return plan, disk, result


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_values_dtype_and_order_match_numpy(dtype, order):
    a = random_array((5, 6, 7), dtype, seed=len(dtype))
    boxes = [Box((0, 0, 0), (5, 6, 7)), Box((1, 2, 3), (4, 5, 6)), Box((4, 0, 6), (5, 6, 7)), Box((2, 3, 0), (3, 4, 7))]
    for box in boxes:
        plan, _, got = run(a, box, order=order)
        same(got, oracle(a, box))
        assert got.dtype.isnative and plan.swap_bytes == (
            0 if a.dtype.isnative or a.dtype.itemsize == 1 else a.dtype.itemsize // (2 if a.dtype.kind == "c" else 1)
        )


def test_complex_swaps_per_component():
    a = (np.arange(6) + 1j * np.arange(6, 12)).astype(">c16").reshape(2, 3)
    plan, _, got = run(a, Box((0, 0), (2, 3)))
    assert plan.swap_bytes == 8  # two float64s, as a.byteswap() on a view as the real dtype
    same(got, a.astype("<c16"))
    assert got.dtype.str == "<c16"


def test_zero_size_regions_and_arrays_read_nothing():
    a = random_array((4, 5), "<f4")
    plan, disk, got = run(a, Box((2, 0), (2, 5)))
    assert got.shape == (0, 5) and not disk.calls and plan.cut is None
    plan, disk, got = run(np.zeros((0, 3), ">i2"), Box((0, 0), (0, 3)))
    assert got.shape == (0, 3) and got.dtype.str == "<i2" and not disk.calls


def test_zero_dim_array():
    a = np.array(3.5, ">f8")
    _, _, got = run(a, Box((), ()))
    assert got.shape == () and got.dtype.str == "<f8" and float(got) == 3.5


def test_region_at_the_end_of_the_file_clamps_the_last_read():
    a = random_array((3, 1001), "<i2")  # payload ends at no page boundary
    raw = npy_bytes(a)
    assert len(raw) % 4096
    plan, disk, got = run(a, Box((2, 990), (3, 1001)))
    same(got, oracle(a, Box((2, 990), (3, 1001))))
    last = max(disk.calls)
    assert last[0] + last[1] == len(raw)  # short tail: up to EOF, not past it
    assert plan.reads[-1].size % 4096


def test_strided_roi_coalesces_into_few_aligned_reads():
    a = random_array((64, 128, 64), "<f4")  # 2 MiB; rows of 256 B, planes of 32 KiB
    box = Box((10, 10, 10), (50, 50, 50))  # 1600 runs of 160 bytes
    plan, disk, got = run(a, box)
    same(got, oracle(a, box))
    assert len(disk.calls) == 1  # the gaps (96 B between rows, 22 KiB between planes) are under 64 KiB
    assert plan.read_nbytes <= 40 * 32768 + 4096  # the 40 planes touched, not the file
    # With a small threshold (never below two pages) rows still merge but planes stay apart.
    plan, disk, got = run(a, box, options=GpuReadOptions(gap_bytes=0))
    same(got, oracle(a, box))
    assert len(disk.calls) == 40
    assert {size for _, size, _ in disk.calls} <= {12288, 16384}


def test_far_apart_runs_are_one_small_read_each_and_staging_stays_small():
    a = random_array((50, 20_000), "<f8")  # rows 160 kB apart
    box = Box((0, 100), (50, 104))
    plan, disk, got = run(a, box)
    same(got, oracle(a, box))
    assert len(disk.calls) == 50 and {size for _, size, _ in disk.calls} <= {4096, 8192}
    assert plan.staging_nbytes < 50 * 3 * 4096  # not the 8 MB the rows span in the file


def test_a_span_is_one_read_and_kvikio_splits_it():
    a = random_array((10, 1 << 17), "<f8")  # 10 MiB, contiguous
    plan, disk, got = run(a, Box.whole(a.shape))
    same(got, a)
    assert DEFAULT_TASK_BYTES == 0 and gpu_read_options().task_bytes == 0
    assert disk.calls == [(0, a.nbytes + 128, disk.calls[0][2])]  # one pread future: kvikio splits by task_size


def test_task_bytes_splits_spans_into_task_sized_reads():
    a = random_array((10, 1 << 17), "<f8")  # 10 MiB, contiguous
    task = 4 << 20
    plan, disk, got = run(a, Box.whole(a.shape), options=GpuReadOptions(task_bytes=task))
    same(got, a)
    assert len(disk.calls) == math.ceil((a.nbytes + 128) / task)
    assert max(size for _, size, _ in disk.calls) == task
    assert sorted(o for o, _, _ in disk.calls) == [k * task for k in range(len(disk.calls))]
    options = GpuReadOptions(task_bytes=1 << 20)
    _, disk, got = run(a, Box((3, 0), (5, 1 << 17)), options=options)
    assert len(disk.calls) == 3 and max(s for _, s, _ in disk.calls) <= 1 << 20
    same(got, a[3:5])


def test_whole_contiguous_native_read_is_a_view_of_the_staging_buffer():
    a = random_array((8, 9), "<f4")
    plan, _, got = run(a, Box.whole(a.shape))
    assert not got.flags.owndata and got.flags.c_contiguous
    same(got, a)


def test_reads_are_all_issued_before_any_future_is_waited_on():
    a = random_array((40, 3000), "<f4")
    box = Box((0, 0), (40, 10))
    options = GpuReadOptions(gap_bytes=0)
    raw = npy_bytes(a)
    plan = plan_gpu_read(parse_header(raw), box, file_size=len(raw), options=options)
    disk = FakeDisk(raw, options, futures=True)
    order = []
    real = disk.read_span

    def read_span(offset, size, dest):
        order.append(("read", disk.gets))
        return real(offset, size, dest)

    got = execute_plan(plan, read_span, np)
    same(got, oracle(a, box))
    assert len(order) > 1 and all(gets == 0 for _, gets in order)
    assert disk.gets == len(plan.reads)


def test_short_read_is_a_changed_file_naming_it():
    a = random_array((4, 2000), "<f8")
    raw = npy_bytes(a)
    options = GpuReadOptions()
    plan = plan_gpu_read(parse_header(raw), Box((1, 0), (3, 2000)), file_size=len(raw), options=options)
    disk = FakeDisk(raw, options, short_at=len(raw) - 20_000)
    with pytest.raises(FileChangedError, match=r"truncated.*x\.npy"):
        execute_plan(plan, disk.read_span, np, source="x.npy")


def test_a_failing_future_still_waits_for_the_others():
    a = random_array((30, 5000), "<f4")
    raw = npy_bytes(a)
    options = GpuReadOptions(gap_bytes=0)
    plan = plan_gpu_read(parse_header(raw), Box((0, 0), (30, 4)), file_size=len(raw), options=options)
    waited = []

    class Bad:
        def __init__(self, k):
            self.k = k

        def get(self):
            waited.append(self.k)
            if self.k == 2:
                raise RuntimeError("boom")
            return plan.reads[self.k].size

    calls = iter(range(len(plan.reads)))
    with pytest.raises(RuntimeError, match="boom"):
        execute_plan(plan, lambda o, s, d: Bad(next(calls)), np)
    assert sorted(waited) == list(range(len(plan.reads)))


@pytest.mark.parametrize("order", ["C", "F"])
def test_payload_at_an_odd_offset_is_copied_bytewise(order):
    a = random_array((6, 7), "<c16")
    plan, _, got = run(a, Box((1, 2), (5, 6)), order=order, prefix=3)
    assert not plan.aligned
    same(got, oracle(a, Box((1, 2), (5, 6))))


def _pad_roi(shape, dtype, start, end, fill):
    args = RoiArgs.from_user(roi_start=list(start), roi_end=list(end), out_of_bounds_policy="pad", fill_value=fill)
    return resolve_roi(args, shape, dtype)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [">f4", "<u2", "?", ">c8"])
def test_roi_padding_with_the_fill_value(dtype, order):
    a = random_array((5, 6), dtype, seed=3)
    roi = _pad_roi(a.shape, a.dtype, (-2, 3), (4, 9), 7)
    assert roi.padded and roi.shape == (6, 6)
    for box in [Box((0, 0), roi.shape), Box((1, 2), (5, 5)), Box((0, 3), (2, 6)), Box((3, 0), (6, 2))]:
        plan, _, got = run(a, box, order=order, roi=roi)
        same(got, oracle(a, box, roi))


def test_roi_wholly_outside_the_file_is_all_fill_and_reads_nothing():
    a = random_array((4, 4), "<i4")
    roi = _pad_roi(a.shape, a.dtype, (10, 0), (12, 3), -5)
    plan, disk, got = run(a, Box((0, 0), roi.shape), roi=roi)
    assert not disk.calls and plan.cut is None
    same(got, np.full((2, 3), -5, "<i4"))


def test_box_outside_the_roi_or_file_is_refused():
    raw = npy_bytes(np.zeros((3, 4)))
    h = parse_header(raw)
    with pytest.raises(RoiError):
        plan_gpu_read(h, Box((0, 0), (4, 4)), file_size=len(raw))
    roi = _pad_roi((3, 4), h.dtype, (0, 0), (2, 2), 0)
    with pytest.raises(RoiError, match="ROI of shape"):
        plan_gpu_read(h, Box((0, 0), (3, 2)), file_size=len(raw), roi=roi)


def test_out_is_filled_and_returned():
    a = random_array((4, 5, 6), ">i4")
    for box in [Box((0, 0, 0), (4, 5, 6)), Box((1, 1, 1), (3, 4, 5))]:
        raw = npy_bytes(a, "F")
        plan = plan_gpu_read(parse_header(raw), box, file_size=len(raw))
        out = np.empty(box.shape, "<i4")
        got = execute_plan(plan, FakeDisk(raw, GpuReadOptions()).read_span, np, out=out)
        assert got is out
        same(out, oracle(a, box))


def test_options_come_from_config_and_are_checked():
    with npydask.config.set(max_span_bytes=1 << 20):
        assert gpu_read_options().max_span_bytes == 1 << 20
    assert gpu_read_options(gap_bytes=0).gap_bytes == 0
    for bad in [dict(alignment=0), dict(task_bytes=-1), dict(gap_bytes=-1), dict(alignment=True)]:
        with pytest.raises(ValueError, match="GpuReadOptions"):
            GpuReadOptions(**bad)


def test_plans_are_frozen_and_staging_is_aligned():
    raw = npy_bytes(np.zeros((3, 4)))
    plan = plan_gpu_read(parse_header(raw), Box((0, 0), (3, 4)), file_size=len(raw))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.shape = (1,)  # type: ignore[misc]
    assert aligned_empty(np, 0).shape == (0,)
    for n in [1, 4095, 100_000]:
        buf = aligned_empty(np, n, 4096)
        assert buf.shape == (n,) and buf.ctypes.data % 4096 == 0


@st.composite
def cases(draw):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from(GPU_DTYPES))
    order = draw(st.sampled_from("CF"))
    options = GpuReadOptions(
        alignment=draw(st.sampled_from([1, 2, 8, 64, 512, 4096])),
        gap_bytes=draw(st.sampled_from([0, 16, 300, 5000, 1 << 16])),
        task_bytes=draw(st.sampled_from([0, 1, 7, 100, 4096, 1 << 22])),
        max_span_bytes=draw(st.sampled_from([0, 64, 1 << 26])),
    )
    roi = None
    out_shape = shape
    if ndim and draw(st.booleans()):
        start = [draw(st.integers(-3, n + 2)) for n in shape]
        end = [s + draw(st.integers(0, n + 4)) for s, n in zip(start, shape)]
        roi = _pad_roi(shape, np.dtype(dtype), start, end, draw(st.integers(-3, 200)))
        out_shape = roi.shape
    lo = [draw(st.integers(0, n)) for n in out_shape]
    hi = [draw(st.integers(a, n)) for a, n in zip(lo, out_shape)]
    prefix = draw(st.sampled_from([0, 0, 0, 5]))
    return shape, dtype, order, options, roi, Box(tuple(lo), tuple(hi)), prefix


@settings(max_examples=80)
@given(cases(), st.booleans(), st.integers(0, 2**32 - 1))
def test_random_regions_match_numpy(case, futures, seed):
    shape, dtype, order, options, roi, box, prefix = case
    a = random_array(shape, dtype, seed)
    plan, _, got = run(a, box, order=order, roi=roi, options=options, futures=futures, prefix=prefix)
    same(got, oracle(a, box, roi))


def test_a_file_shorter_than_the_region_is_refused_at_planning():
    raw = npy_bytes(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="file has"):
        plan_gpu_read(parse_header(raw), Box((0, 0), (3, 4)), file_size=len(raw) - 1)


def test_an_error_while_issuing_waits_for_the_reads_already_issued():
    a = random_array((30, 5000), "<f4")
    raw = npy_bytes(a)
    options = GpuReadOptions(gap_bytes=0)
    plan = plan_gpu_read(parse_header(raw), Box((0, 0), (30, 4)), file_size=len(raw), options=options)
    disk = FakeDisk(raw, options, futures=True)

    def read_span(offset, size, dest):
        if len(disk.calls) == 3:
            raise OSError("device gone")
        return disk.read_span(offset, size, dest)

    with pytest.raises(OSError, match="device gone"):
        execute_plan(plan, read_span, np)
    assert disk.gets == 3


def test_direct_names_the_file_bytes_when_the_result_is_them_as_they_are():
    a = random_array((6, 50), "<f4")
    raw = npy_bytes(a)
    h = parse_header(raw)
    plan = plan_gpu_read(h, Box((2, 0), (5, 50)), file_size=len(raw))
    assert plan.direct == (128 + 2 * 200, 3 * 200)
    assert raw[plan.direct[0] : plan.direct[0] + plan.direct[1]] == a[2:5].tobytes()
    assert plan_gpu_read(h, Box((2, 0), (5, 50)), file_size=len(raw), options=GpuReadOptions(task_bytes=1)).direct
    assert plan_gpu_read(h, Box((0, 0), (6, 10)), file_size=len(raw)).direct is None  # strided
    for other in (npy_bytes(a.astype(">f4")), npy_bytes(a, order="F")):  # swapped; transposed
        assert plan_gpu_read(parse_header(other), Box((2, 0), (5, 50)), file_size=len(other)).direct is None
    f = npy_bytes(a, order="F")  # a column of a Fortran file is contiguous in it and in C order
    plan = plan_gpu_read(parse_header(f), Box((0, 3), (6, 4)), file_size=len(f))
    assert plan.direct == (128 + 3 * 6 * 4, 24)
    roi = _pad_roi(a.shape, a.dtype, [4, 0], [8, 50], 0)  # rows 4..8 of 6: padded
    assert plan_gpu_read(h, Box((0, 0), (4, 50)), file_size=len(raw), roi=roi).direct is None
