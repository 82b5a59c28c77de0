"""npydask.plan.roi: DALI ``readers.numpy`` ROI arithmetic, with numpy slicing and ``np.pad`` as the oracle.

The DALI numpy-reader ROI suite (``dali/test/python/reader/test_numpy.py``) is
re-expressed on its eight file shapes; a reference implementation written
independently below (vectorised over axes, ``Decimal`` rounding) is compared
with :func:`resolve_roi` + :func:`apply_pad` on random arrays and arguments.
"""

from __future__ import annotations

import math
import pickle
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npydask import RoiError
from npydask.plan.region import Box
from npydask.plan.roi import FileRoi, RoiArgs, apply_pad, convert_fill, resolve_roi
from npydask.testing.strategies import arrays, assert_same_array, dtypes, shapes

DALI_SHAPES = [(10, 10), (12, 10), (10, 12), (20, 15), (10, 11), (12, 11), (13, 11), (19, 10)]
POLICIES = ["error", "trim_to_shape", "pad"]
NAMES = ["roi_start", "rel_roi_start", "roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape"]


# --------------------------------------------------------------------------
# Reference implementation: a direct transliteration of DALI's rules.


def _llround(x: float) -> int:
    return int(Decimal(float(x)).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def ref_window(shape: tuple[int, ...], kw: dict[str, Any], index: int = 0) -> tuple[list[int], list[int]]:
    """Rounded (start, end) per axis, before the policy; raises like DALI."""
    ndim = len(shape)

    def given(name: str) -> np.ndarray | None:
        v = kw.get(name)
        if v is None:
            return None
        v = np.asarray(v, dtype=object)
        if v.ndim == 2 or (v.ndim == 1 and len(v) and isinstance(v[0], (list, tuple, np.ndarray))):
            v = np.asarray(list(kw[name][index]), dtype=object)  # per-file row
            if v.size == 0:
                return None
            return v
        v = np.atleast_1d(v)
        return None if v.size == 0 else v

    axes = kw.get("roi_axes")
    axes = list(range(ndim)) if axes is None or len(np.atleast_1d(axes)) == 0 else list(np.atleast_1d(axes))
    if any(not -ndim <= a < ndim for a in axes) or len({a % ndim for a in axes}) != len(axes):
        raise ValueError("bad axes")
    axes = [a % ndim for a in axes]
    ext = np.array([shape[a] for a in axes], dtype=np.int64)
    ext32 = ext.astype(np.float32)
    v = {}
    for name in NAMES:
        g = given(name)
        if g is not None:
            if len(g) == 1 and len(axes) != 1:
                g = np.repeat(g, len(axes))
            if len(g) != len(axes):
                raise ValueError("wrong count")
            g = g.astype(np.float32) if name.startswith("rel") else g.astype(np.float64)
        v[name] = g
    if v["roi_start"] is not None:
        s = v["roi_start"].astype(np.float64)
    elif v["rel_roi_start"] is not None:
        s = (v["rel_roi_start"] * ext32).astype(np.float64)  # float32 product
    else:
        s = np.zeros(len(axes))
    if v["roi_end"] is not None:
        e = v["roi_end"]
    elif v["rel_roi_end"] is not None:
        e = (v["rel_roi_end"] * ext32).astype(np.float64)
    elif v["roi_shape"] is not None:
        e = s + v["roi_shape"]
    elif v["rel_roi_start"] is not None and v["rel_roi_shape"] is not None:
        e = (v["rel_roi_start"].astype(np.float64) + v["rel_roi_shape"].astype(np.float64)) * ext
    elif v["rel_roi_shape"] is not None:
        e = s + (v["rel_roi_shape"] * ext32).astype(np.float64)
    else:
        e = ext.astype(np.float64)
    if np.any(e < s):
        raise RoiError("end before start")
    start, end = [0] * ndim, list(shape)
    for k, a in enumerate(axes):
        start[a], end[a] = _llround(s[k]), _llround(e[k])
    return start, end


def ref_read(full: np.ndarray, kw: dict[str, Any], index: int = 0) -> np.ndarray:
    """The ROI of ``full`` by slicing and ``np.pad``."""
    start, end = ref_window(full.shape, kw, index)
    policy = kw.get("out_of_bounds_policy", "error")
    shape = full.shape
    if policy == "error":
        if any(not (0 <= a <= n and 0 <= b <= n) for a, b, n in zip(start, end, shape)):
            raise RoiError("out of bounds")
    if policy == "trim_to_shape":
        start = [min(max(a, 0), n) for a, n in zip(start, shape)]
        end = [min(max(b, 0), n) for b, n in zip(end, shape)]
    if policy != "pad" or full.ndim == 0:
        return full[tuple(slice(a, b) for a, b in zip(start, end)) + (...,)]
    widths = [(max(0, -a), max(0, b - n)) for a, b, n in zip(start, end, shape)]
    window = tuple(slice(a + w, b + w) for a, b, (w, _) in zip(start, end, widths))
    if full.dtype.kind in "VSUMm":  # zero bytes: pad a byte view
        raw = np.frombuffer(full.tobytes(), np.uint8).reshape(full.shape + (full.dtype.itemsize,))
        raw = np.pad(raw, widths + [(0, 0)])[window]
        return np.frombuffer(raw.tobytes(), full.dtype).reshape(raw.shape[:-1])
    fill = kw.get("fill_value", 0)
    if full.dtype.kind in "iu":
        info = np.iinfo(full.dtype)
        fill = min(max(_llround(fill), int(info.min)), int(info.max))
    return np.pad(full, widths, mode="constant", constant_values=fill)[window]


def read(full: np.ndarray, kw: dict[str, Any], index: int = 0, n_files: int | None = None) -> np.ndarray:
    """The ROI of ``full`` through npydask.plan.roi, checking the FileRoi invariants on the way."""
    args = RoiArgs.from_user(**kw, n_files=n_files)
    roi = resolve_roi(args, full.shape, full.dtype, index=index, source="f.npy")
    assert roi.shape == tuple(b - a for a, b in zip(roi.start, roi.end))
    for lo, hi, pb, pa, n, m in zip(roi.box.start, roi.box.stop, roi.pad_before, roi.pad_after, full.shape, roi.shape):
        assert 0 <= lo <= hi <= n and pb >= 0 and pa >= 0 and pb + (hi - lo) + pa == m
    if roi.padded:
        assert args.out_of_bounds_policy == "pad"
    block = full[tuple(slice(a, b) for a, b in zip(roi.box.start, roi.box.stop)) + (...,)]
    out = apply_pad(block, roi)
    assert out.shape == roi.shape and out.dtype == full.dtype and out.flags.c_contiguous
    return out


def dali_files(dtype: Any = np.uint8) -> list[np.ndarray]:
    rng = np.random.default_rng(4242)
    return [rng.integers(0, 250, size=sh).astype(dtype) for sh in DALI_SHAPES]


# --------------------------------------------------------------------------
# DALI's ROI suite (test_numpy_reader_roi), on its eight shapes

DALI_ROI_ARGS = [
    dict(roi_start=[1, 2]),
    dict(rel_roi_start=[0.1, 0.2]),
    dict(roi_end=[8, 7]),
    dict(rel_roi_end=[0.5, 0.9]),
    dict(roi_shape=[4, 5]),
    dict(rel_roi_shape=[0.4, 0.8]),
    dict(roi_start=1, roi_end=9, roi_axes=[0]),
    dict(roi_start=1, roi_end=9, roi_axes=[1]),
    dict(roi_start=[1, 2], roi_end=[8, 9], roi_axes=[0, 1]),
    dict(roi_start=[1, 2], rel_roi_end=[0.5, 0.4], roi_axes=[0, 1]),
    dict(rel_roi_start=[0.1, 0.2], roi_end=[8, 9], roi_axes=[0, 1]),
    dict(roi_start=[1, 2], roi_end=[20, 9], roi_axes=[0, 1], out_of_bounds_policy="pad"),
    dict(roi_start=[-10, 2], roi_end=[8, 9], roi_axes=[0, 1], out_of_bounds_policy="pad"),
    dict(roi_start=[1, 2], roi_end=[20, 9], roi_axes=[0, 1], out_of_bounds_policy="trim_to_shape"),
    dict(roi_start=[-10, 2], roi_end=[8, 9], roi_axes=[0, 1], out_of_bounds_policy="trim_to_shape"),
    # beyond DALI's list: negative and permuted axes, relative start with relative shape
    dict(roi_start=1, roi_end=9, roi_axes=[-1]),
    dict(roi_start=[2, 1], roi_end=[9, 8], roi_axes=[1, 0]),
    dict(roi_start=[1, 2], roi_end=[8, 9], roi_axes=[-2, -1]),
    dict(rel_roi_start=[0.1, 0.3], rel_roi_shape=[0.5, 0.6]),
    dict(roi_start=[3, 3], rel_roi_shape=[0.5, 0.25]),
    dict(roi_start=2),
    dict(rel_roi_start=[-0.5, 0.5], rel_roi_shape=[1.0, 1.0], out_of_bounds_policy="pad"),
]


@pytest.mark.parametrize("fill_value", [0, 10.0])
@pytest.mark.parametrize("kw", DALI_ROI_ARGS, ids=[str(i) for i in range(len(DALI_ROI_ARGS))])
def test_dali_roi_suite(kw, fill_value):
    for full in dali_files():
        kw2 = dict(kw, fill_value=fill_value)
        np.testing.assert_array_equal(read(full, kw2), ref_read(full, kw2))


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        (dict(roi_start=[1, 2]), [(9, 8), (11, 8), (9, 10), (19, 13), (9, 9), (11, 9), (12, 9), (18, 8)]),
        # 0.9f * 12 = 10.8 -> 11; 0.5f * 13 = 6.5 -> 7; 0.9f * 11 = 9.9 -> 10; 0.5f * 19 = 9.5 -> 10
        (dict(rel_roi_end=[0.5, 0.9]), [(5, 9), (6, 9), (5, 11), (10, 14), (5, 10), (6, 10), (7, 10), (10, 9)]),
        (dict(roi_start=1, roi_end=9, roi_axes=[1]), [(n, 8) for n, _ in DALI_SHAPES]),
        (dict(roi_start=[-10, 2], roi_end=[8, 9], out_of_bounds_policy="pad"), [(18, 7)] * 8),
        (dict(roi_start=[-10, 2], roi_end=[8, 9], out_of_bounds_policy="trim_to_shape"), [(8, 7)] * 8),
        (
            dict(roi_start=[1, 2], roi_end=[20, 9], out_of_bounds_policy="trim_to_shape"),
            [(n - 1, 7) for n, _ in DALI_SHAPES],
        ),
    ],
)
def test_dali_suite_shapes(kw, expected):
    got = [resolve_roi(RoiArgs.from_user(**kw), sh, "u1").shape for sh in DALI_SHAPES]
    assert got == expected


def test_pad_fill_values_on_dali_files():
    full = dali_files()[0]  # (10, 10)
    out = read(full, dict(roi_start=[-2, 8], roi_end=[3, 12], out_of_bounds_policy="pad", fill_value=10))
    assert out.shape == (5, 4)
    assert (out[:2] == 10).all() and (out[:, 2:] == 10).all()
    np.testing.assert_array_equal(out[2:, :2], full[:3, 8:])


@pytest.mark.parametrize("axes", [[], None])
def test_empty_axes_read_everything(axes):
    # DALI: roi_start=[], roi_end=[], roi_axes=[] reads the whole array
    for full in dali_files():
        args = RoiArgs.from_user(roi_start=[], roi_end=[], roi_axes=axes)
        assert not args.has_roi and args.roi_axes is None
        np.testing.assert_array_equal(read(full, dict(roi_start=[], roi_end=[], roi_axes=axes)), full)


def test_empty_range():
    # DALI: roi_start=[1], roi_end=[1], roi_axes=[1] gives an empty axis 1
    for full in dali_files():
        out = read(full, dict(roi_start=[1], roi_end=[1], roi_axes=[1]))
        assert out.shape == (full.shape[0], 0)


@pytest.mark.parametrize("policy", POLICIES)
def test_empty_roi_at_the_end_is_in_bounds(policy):
    roi = resolve_roi(RoiArgs.from_user(roi_start=[15, 0], out_of_bounds_policy=policy), (15, 10), "u1")
    assert roi.shape == (0, 10) and roi.box == Box((15, 0), (15, 10))


# --------------------------------------------------------------------------
# DALI's error suite (test_numpy_reader_roi_error) and the other refusals


@pytest.mark.parametrize(
    ("kw", "a", "b"),
    [
        (dict(roi_start=[1, 2], rel_roi_start=[0.1, 0.2]), "roi_start", "rel_roi_start"),
        (dict(roi_end=[8, 7], rel_roi_end=[0.4, 0.5]), "roi_end", "rel_roi_end"),
        (dict(roi_end=[8, 7], roi_shape=[8, 7]), "roi_end", "roi_shape"),
        (dict(roi_end=[8, 7], rel_roi_shape=[0.4, 0.5]), "roi_end", "rel_roi_shape"),
        (dict(rel_roi_end=[0.5, 0.4], roi_shape=[8, 7]), "rel_roi_end", "roi_shape"),
        (dict(rel_roi_end=[0.5, 0.4], rel_roi_shape=[0.1, 0.1]), "rel_roi_end", "rel_roi_shape"),
        # DALI 2.4: '"roi_end", "rel_roi_end", "roi_shape", and "rel_roi_shape" arguments are mutually exclusive'
        (dict(roi_shape=[3, 3], rel_roi_shape=[0.5, 0.5]), "roi_shape", "rel_roi_shape"),
        (dict(roi_start=[[1, 2]], rel_roi_start=[[]]), "roi_start", "rel_roi_start"),
    ],
)
def test_mutually_exclusive(kw, a, b):
    with pytest.raises(ValueError, match=f"{a} and {b} are mutually exclusive") as info:
        RoiArgs.from_user(**kw)
    assert not isinstance(info.value, RoiError)


@pytest.mark.parametrize(
    "kw",
    [
        dict(roi_start=[-1, 2]),  # out of bounds anchor
        dict(roi_end=[100, 8]),  # out of bounds end
        dict(roi_shape=[100, 8]),  # out of bounds shape
        dict(rel_roi_start=[-0.05, 0.0]),  # -0.5 rounds to -1
        dict(rel_roi_end=[1.1, 1.0]),
        dict(roi_start=[0, 16], roi_end=[1, 17]),
    ],
)
def test_out_of_bounds_error(kw):
    for sh in DALI_SHAPES:
        with pytest.raises(RoiError) as info:
            resolve_roi(RoiArgs.from_user(**kw), sh, "u1", source="/data/x.npy")
        msg = str(info.value)
        assert "/data/x.npy" in msg and str(sh) in msg and "start=" in msg and "end=" in msg


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    "kw",
    [
        dict(roi_start=[5, 0], roi_end=[3, 10]),
        dict(roi_start=[-3, 0], roi_end=[-5, 10]),
        dict(rel_roi_start=[0.8, 0.0], rel_roi_end=[0.2, 1.0]),
        dict(roi_start=[20, 0]),  # default end is the extent, before a start past it
        # DALI compares before rounding: start 0.16f * 15 = 2.4 is after end 2 although llround(2.4) == 2
        dict(rel_roi_start=[0.16, 0.0], roi_end=[2, 10]),
    ],
)
def test_end_before_start_under_every_policy(kw, policy):
    with pytest.raises(RoiError, match="ends before it starts") as info:
        resolve_roi(RoiArgs.from_user(**kw, out_of_bounds_policy=policy), (15, 10), "u1", source="/d/f.npy")
    assert "/d/f.npy" in str(info.value) and "(15, 10)" in str(info.value)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(roi_start=[1.5, 2]), "integers"),
        (dict(roi_start=[True, 2]), "real numbers"),
        (dict(roi_end=[float("nan")]), "integers"),
        (dict(roi_end=[math.inf]), "integers"),
        (dict(roi_start="12"), "real numbers"),
        (dict(roi_start=[[1, [2]]]), "at most 2-D"),
        (dict(roi_start=[1, [2]]), "mixes numbers and rows"),
        (dict(roi_start=np.zeros((1, 1, 1))), "3-D array"),
        (dict(rel_roi_start=[float("nan")]), "finite"),
        (dict(rel_roi_end=[1e39]), "finite"),  # float32 overflow
        (dict(rel_roi_end=[np.bool_(True)]), "real numbers"),
        (dict(roi_shape=[-1, 3]), ">= 0"),
        (dict(rel_roi_shape=[0.5, -0.1]), ">= 0"),
        (dict(roi_start=[2**63]), "int64"),
        (dict(roi_axes=[0, 0]), "more than once"),
        (dict(roi_axes=[0.0]), "integers"),
        (dict(roi_axes=[True]), "integers"),
        (dict(out_of_bounds_policy="wrap"), "out_of_bounds_policy"),
        (dict(fill_value="1"), "fill_value"),
        (dict(roi_start=[[1, 2], [3, 4]], n_files=3), "expected 3 rows, found 2"),
        (dict(roi_start=[[1, 2], [3, 4]], roi_end=[[5, 5]]), "same number of rows"),
    ],
)
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        RoiArgs.from_user(**kw)


STRUCTURED = np.dtype([("a", "<i4"), ("b", "<f8")])


@pytest.mark.parametrize(
    ("kw", "dtype", "match"),
    [
        (dict(roi_start=[1, 1, 1]), "u1", r"roi_start has 3 values .* expected 2 values, or 1 for every axis"),
        (dict(roi_start=[1, 1], roi_axes=[1]), "u1", r"roi_start has 2 values .* expected 1 values"),
        (dict(roi_axes=[2], roi_start=1), "u1", r"axis 2 out of range .* expected -2 <= axis < 2"),
        (dict(roi_axes=[-3], roi_start=1), "u1", "out of range"),
        (dict(roi_axes=[0, -2], roi_start=1), "u1", "more than once"),
        (dict(roi_start=[[1], [2, 3]]), "u1", r"roi_start has 1 values .* expected 2 values$"),  # rows never broadcast
        (dict(roi_start=7, out_of_bounds_policy="pad", fill_value=3), STRUCTURED, "only 0"),
        (dict(roi_start=7, out_of_bounds_policy="pad", fill_value=math.nan), "i4", "nan"),
    ],
)
def test_bad_arguments_for_a_file(kw, dtype, match):
    args = RoiArgs.from_user(**kw)
    with pytest.raises(ValueError, match=match) as info:
        resolve_roi(args, (10, 12), dtype, source="/d/g.npy")
    assert not isinstance(info.value, RoiError)
    assert "/d/g.npy" in str(info.value) and "(10, 12)" in str(info.value)


def test_coordinates_beyond_int64():
    args = RoiArgs.from_user(rel_roi_start=[1e30], out_of_bounds_policy="pad")
    with pytest.raises(RoiError, match="int64"):
        resolve_roi(args, (15,), "u1")


# --------------------------------------------------------------------------
# Arithmetic: float32 products, double sums, rounding half away from zero


def test_rel_roi_end_09_on_15_gives_14():
    assert np.float32(0.9) * np.float32(15) == np.float32(13.5)  # float32 product is exactly 13.5
    assert float(np.float32(0.9)) * 15 < 13.5  # the double product would round to 13
    roi = resolve_roi(RoiArgs.from_user(rel_roi_end=0.9), (15,), "u1")
    assert roi.end == (14,) and roi.shape == (14,)


# (rel, extent, float32 result): llround(float32(rel) * float32(extent)) differs from the double product
FLOAT32_CASES = [(0.7, 5, 4), (0.9, 5, 5), (0.35, 10, 4), (0.95, 10, 10), (0.175, 20, 4), (0.02, 25, 1), (0.9, 15, 14)]


@pytest.mark.parametrize(("rel", "extent", "expected"), FLOAT32_CASES)
def test_relative_products_are_float32(rel, extent, expected):
    assert _llround(float(np.float32(rel)) * extent) == expected - 1  # the case is a real one
    for kw, field in [
        (dict(rel_roi_end=rel), "end"),
        (dict(rel_roi_start=rel, out_of_bounds_policy="pad"), "start"),
        (dict(roi_start=0, rel_roi_shape=rel), "end"),  # start + float32(rel_shape * extent)
    ]:
        roi = resolve_roi(RoiArgs.from_user(**kw), (extent,), "u1")
        assert getattr(roi, field) == (expected,), kw


@pytest.mark.parametrize(
    ("rel_start", "rel_shape", "extent", "end"),
    [(0.0, 0.7, 5, 3), (0.0, 0.9, 5, 4), (0.6, 0.9, 3, 5), (0.21, 0.29, 3, 1), (0.04, 0.46, 3, 2)],
)
def test_relative_start_plus_relative_shape_in_double(rel_start, rel_shape, extent, end):
    # (rel_start + rel_shape) * extent in double precision, not start + float32(rel_shape * extent)
    alternative = _llround(
        float(np.float32(rel_start) * np.float32(extent)) + float(np.float32(rel_shape) * np.float32(extent))
    )
    assert alternative != end
    kw = dict(rel_roi_start=rel_start, rel_roi_shape=rel_shape, out_of_bounds_policy="pad")
    assert resolve_roi(RoiArgs.from_user(**kw), (extent,), "u1").end == (end,)


@pytest.mark.parametrize(
    ("rel_start", "roi_shape", "start", "end"),
    [
        (-0.05, 1, -1, 1),  # -0.5 -> -1, end -0.5 + 1 = 0.5 -> 1: two cells, not roi_shape=1
        (-0.25, 3, -3, 1),  # -2.5 -> -3, end 0.5 -> 1: four cells
        (0.25, 2, 3, 5),  # 2.5 -> 3, end 4.5 -> 5
        (0.45, 0, 5, 5),  # 4.5 -> 5: empty
    ],
)
def test_absolute_shape_uses_the_unrounded_start(rel_start, roi_shape, start, end):
    args = RoiArgs.from_user(rel_roi_start=rel_start, roi_shape=roi_shape, out_of_bounds_policy="pad")
    roi = resolve_roi(args, (10,), "u1")
    assert (roi.start, roi.end) == ((start,), (end,))


@pytest.mark.parametrize(("extent", "start"), [(15, -8), (10, -5), (13, -7), (1, -1), (3, -2)])
def test_negative_relative_start_rounds_away_from_zero(extent, start):
    roi = resolve_roi(RoiArgs.from_user(rel_roi_start=-0.5, out_of_bounds_policy="pad"), (extent,), "u1")
    assert roi.start == (start,) and roi.end == (extent,)
    assert roi.pad_before == (-start,) and roi.box == Box((0,), (extent,))


def test_pad_negative_relative_start_values():
    # DALI: rel_roi_start=[-0.1, -0.05] with pad on (15, 10) gives (17, 11): -1.5 -> -2, -0.5 -> -1
    full = np.arange(150, dtype=np.uint8).reshape(15, 10)
    out = read(full, dict(rel_roi_start=[-0.1, -0.05], out_of_bounds_policy="pad", fill_value=7))
    assert out.shape == (17, 11)
    assert (out[:2] == 7).all() and (out[:, 0] == 7).all()
    np.testing.assert_array_equal(out[2:, 1:], full)


# --------------------------------------------------------------------------
# Policies


def test_pad_entirely_outside():
    for kw, box in [
        (dict(roi_start=[20, 0], roi_end=[22, 2]), Box((15, 0), (15, 2))),
        (dict(roi_start=[-5, 0], roi_end=[-2, 2]), Box((0, 0), (0, 2))),
    ]:
        args = RoiArgs.from_user(**kw, out_of_bounds_policy="pad", fill_value=7)
        roi = resolve_roi(args, (15, 10), "u1")
        assert roi.box == box and roi.box.size == 0 and roi.padded
        out = apply_pad(np.zeros(roi.box.shape, "u1"), roi)
        assert out.shape == roi.shape and (out == 7).all()


def test_trim_to_shape_may_be_empty():
    args = RoiArgs.from_user(roi_start=[20, -5], roi_end=[25, -1], out_of_bounds_policy="trim_to_shape")
    roi = resolve_roi(args, (15, 10), "u1")
    assert roi.shape == (0, 0) and roi.start == (15, 0) and roi.end == (15, 0) and not roi.padded


def test_fill_value_only_converted_for_pad():
    dtype = np.dtype([("a", "<i4")])
    for policy in ["error", "trim_to_shape"]:
        roi = resolve_roi(RoiArgs.from_user(roi_start=1, fill_value=3, out_of_bounds_policy=policy), (4,), dtype)
        assert roi.fill_value is None


# --------------------------------------------------------------------------
# Per-file ROIs


def test_per_file_rows():
    files = dali_files()
    rng = np.random.default_rng(1902)
    # DALI's random tensor-argument cases, as one row per file
    starts = rng.integers(0, 2, size=(8, 2))
    ends = rng.integers(7, 10, size=(8, 2))
    for kw in [
        dict(roi_start=starts, roi_end=ends.tolist(), roi_axes=(0, 1)),
        dict(roi_start=starts[:, :1], roi_end=ends[:, :1], roi_axes=(1,)),
        dict(rel_roi_start=rng.uniform(0, 0.2, (8, 1)), rel_roi_end=rng.uniform(0.8, 1.0, (8, 1)), roi_axes=(1,)),
    ]:
        args = RoiArgs.from_user(**kw, n_files=8)
        assert args.n_rows == 8 and args.per_file
        for i, full in enumerate(files):
            np.testing.assert_array_equal(read(full, kw, index=i, n_files=8), ref_read(full, kw, index=i))


def test_per_file_values_are_normalised():
    args = RoiArgs.from_user(
        roi_start=[[1, 2], []], rel_roi_end=np.array([[0.5, 0.9], [1.0, 1.0]]), roi_axes=np.array([0, -1])
    )
    assert args.per_file == ("roi_start", "rel_roi_end")
    assert args.roi_start == ((1, 2), ())
    assert all(type(v) is np.float32 for row in args.rel_roi_end for v in row)
    assert args.roi_axes == (0, -1)
    second = args.for_file(1)
    assert second.roi_start is None and second.rel_roi_end == (np.float32(1.0), np.float32(1.0))
    assert second.per_file == () and second.for_file(5) is second
    assert resolve_roi(args, (4, 4), "u1", index=1).shape == (4, 4)  # empty row: not given for that file
    assert resolve_roi(args, (4, 4), "u1", index=0).shape == (1, 2)  # [1, 2) x [2, round(3.6) = 4)
    with pytest.raises(IndexError, match="out of range"):
        args.for_file(2)


def test_shared_values_are_normalised():
    args = RoiArgs.from_user(roi_start=np.int64(3), rel_roi_shape=(0.5,), roi_end=None, roi_axes=-1)
    assert args.roi_start == (3,) and type(args.roi_start[0]) is int
    assert args.rel_roi_shape == (np.float32(0.5),) and type(args.rel_roi_shape[0]) is np.float32
    assert args.roi_axes == (-1,) and args.has_roi and args.per_file == ()
    assert RoiArgs.from_user(roi_start=[2.0]).roi_start == (2,)
    assert RoiArgs.from_user(roi_start=np.array([1, 2])).roi_start == (1, 2)
    assert not RoiArgs.from_user().has_roi and not RoiArgs.from_user(roi_start=[], rel_roi_end=[]).has_roi


def test_args_and_rois_pickle_and_hash():
    args = RoiArgs.from_user(rel_roi_start=[[0.1, 0.2], [0.3, 0.4]], out_of_bounds_policy="pad", fill_value=2)
    assert pickle.loads(pickle.dumps(args)) == args and hash(args) == hash(pickle.loads(pickle.dumps(args)))
    roi = resolve_roi(args, (5, 6), "i2", index=1)
    assert isinstance(roi, FileRoi) and pickle.loads(pickle.dumps(roi)) == roi


# --------------------------------------------------------------------------
# fill_value conversion (DALI ConvertSat: round half away from zero, saturate)


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [
        (300.6, "u1", 255),
        (-3.5, "i1", -4),
        (-1000.0, "i1", -128),
        (1e30, "i4", 2147483647),
        (-1e30, "i4", -2147483648),
        (2.5, "i8", 3),
        (-2.5, "i8", -3),
        (0.5, "u1", 1),
        (-0.5, "i2", -1),
        (0.49999999999999994, "i4", 0),
        (-2.0, "u2", 0),
        (255.5, "u1", 255),
        (math.inf, "u1", 255),
        (-math.inf, "i1", -128),
        (2**70, "u8", 2**64 - 1),
        (-(2**70), "i8", -(2**63)),
        (2**53 + 1, "i8", 2**53 + 1),  # integers stay exact
        (np.int64(-7), ">i4", -7),
        (True, "u1", 1),
        (10.0, "u1", 10),
        (0.5, "?", True),
        (0.0, "?", False),
        (math.nan, "?", True),
        (0.1, "f8", 0.1),
        (0.1, "f4", np.float32(0.1)),
        (1e30, "f2", math.inf),
        (10**400, "f8", math.inf),
        (-(10**400), "f4", -math.inf),
        (1 + 2j, "c8", 1 + 2j),
        (3, "c16", 3 + 0j),
        (2 + 0j, "i4", 2),
    ],
    ids=repr,
)
def test_convert_fill(value, dtype, expected):
    got = convert_fill(value, dtype)
    assert isinstance(got, np.generic) and got.dtype == np.dtype(dtype).newbyteorder("=")
    assert got == expected and type(got.item()) is type(np.array(expected, dtype=dtype).item())


def test_convert_fill_nan_float():
    assert math.isnan(convert_fill(math.nan, "f4"))


@pytest.mark.parametrize(
    ("value", "dtype", "match"),
    [
        (math.nan, "i4", "nan"),
        (1 + 1j, "f4", "complex"),
        (7, [("a", "i4")], "only 0"),
        (1, "U3", "only 0"),
        (1, "M8[s]", "only 0"),
        ("1", "i4", "number"),
    ],
)
def test_convert_fill_refused(value, dtype, match):
    with pytest.raises(ValueError, match=match):
        convert_fill(value, dtype)


def test_convert_fill_zero_for_structured():
    dtype = np.dtype([("a", "<i4"), ("b", ">f8", (2,))])
    assert convert_fill(0, dtype).tobytes() == bytes(dtype.itemsize)


# --------------------------------------------------------------------------
# apply_pad


def test_apply_pad_checks_the_block_and_copies_only_when_needed():
    roi = resolve_roi(RoiArgs.from_user(roi_start=[1, 1]), (3, 4), "f4")
    with pytest.raises(ValueError, match="does not match"):
        apply_pad(np.zeros((3, 4), "f4"), roi)
    block = np.zeros((2, 3), "f4")
    assert apply_pad(block, roi) is block
    fortran = np.asfortranarray(np.arange(6, dtype="f4").reshape(2, 3))
    out = apply_pad(fortran, roi)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, fortran)


def _no_longdouble(dtype: np.dtype) -> bool:
    """np.pad and slice assignment copy a long double's unused bytes differently."""
    if dtype.names is not None:
        return all(_no_longdouble(dtype.fields[name][0]) for name in dtype.names)
    base = dtype.subdtype[0] if dtype.subdtype else dtype
    return base.kind not in "fc" or base.itemsize <= 8 * (1 + (base.kind == "c"))


@given(
    full=arrays(dtypes().filter(_no_longdouble), shapes(max_dims=3, max_elements=40, max_side=6), max_nbytes=4096),
    data=st.data(),
)
def test_apply_pad_any_dtype(full, data):
    ndim = full.ndim
    start = [data.draw(st.integers(-3, n + 3)) for n in full.shape]
    end = [data.draw(st.integers(a, a + 6)) for a in start]
    kw = dict(roi_start=start or None, roi_end=end or None, out_of_bounds_policy="pad")
    got = read(full, kw)
    assert got.ndim == ndim
    assert_same_array(got, np.asarray(ref_read(full, kw), order="C"))


# --------------------------------------------------------------------------
# Random arguments against the reference implementation

REL = st.one_of(
    st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.35, 0.45, 0.5, 0.7, 0.9, 0.95, 1.0, -0.5, 1.5]),
    st.floats(-0.5, 1.5, width=32),
)


@st.composite
def roi_kwargs(draw, shape: tuple[int, ...]) -> dict[str, Any]:
    ndim = len(shape)
    kw: dict[str, Any] = {}
    if draw(st.booleans()):
        axes = draw(st.permutations(range(ndim)))[: draw(st.integers(0, ndim))]
        kw["roi_axes"] = [a - ndim if draw(st.booleans()) else a for a in axes]
        n = len(axes) or ndim
    else:
        n = ndim
    big = max(shape, default=1) + 3
    count = st.sampled_from([n, n, n, 1])  # a single value is broadcast
    start = draw(st.sampled_from([None, "roi_start", "rel_roi_start"]))
    if start == "roi_start":
        kw[start] = draw(count.flatmap(lambda c: st.lists(st.integers(-3, big), min_size=c, max_size=c)))
    elif start:
        kw[start] = draw(count.flatmap(lambda c: st.lists(REL, min_size=c, max_size=c)))
    end = draw(st.sampled_from([None, "roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape"]))
    if end in ("roi_end", "roi_shape"):
        lo = 0 if end == "roi_shape" else -3
        kw[end] = draw(count.flatmap(lambda c: st.lists(st.integers(lo, big), min_size=c, max_size=c)))
    elif end:
        rel = REL.filter(lambda x: x >= 0) if end == "rel_roi_shape" else REL
        kw[end] = draw(count.flatmap(lambda c: st.lists(rel, min_size=c, max_size=c)))
    kw["out_of_bounds_policy"] = draw(st.sampled_from(POLICIES))
    kw["fill_value"] = draw(st.sampled_from([0, 10, -3.5, 300.6, 2.5]))
    return kw


@given(shape=shapes(max_dims=3, max_elements=60, max_side=8), data=st.data())
def test_random_rois_match_the_reference(shape, data):
    dtype = data.draw(st.sampled_from(["u1", "i2", ">i4", "f4", "f8", "?"]))
    full = np.arange(math.prod(shape)).reshape(shape).astype(dtype)
    kw = data.draw(roi_kwargs(shape))
    try:
        want = ref_read(full, kw)
    except (RoiError, ValueError) as e:
        refused: RoiError | ValueError = e
    else:
        np.testing.assert_array_equal(read(full, kw), want)
        return
    with pytest.raises(type(refused)) as info:
        read(full, kw)
    assert type(info.value) is type(refused), (info.value, refused)


@given(shape=shapes(min_dims=1, max_dims=2, max_elements=30, max_side=6), data=st.data())
def test_random_per_file_rows(shape, data):
    full = np.arange(math.prod(shape), dtype=np.int16).reshape(shape)
    n_files = 3
    big = max(shape) + 3

    def rows(name: str) -> list[list[Any]]:
        if name.startswith("rel"):
            value = REL.filter(lambda x: x >= 0) if name == "rel_roi_shape" else REL
        else:
            value = st.integers(0 if name == "roi_shape" else -3, big)
        row = st.one_of(st.just([]), st.lists(value, min_size=full.ndim, max_size=full.ndim))
        return [data.draw(row) for _ in range(n_files)]

    start = data.draw(st.sampled_from(["roi_start", "rel_roi_start"]))
    end = data.draw(st.sampled_from(["roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape"]))
    kw = {start: rows(start), end: rows(end), "out_of_bounds_policy": data.draw(st.sampled_from(POLICIES))}
    for i in range(n_files):
        try:
            want = ref_read(full, kw, index=i)
        except RoiError:
            with pytest.raises(RoiError):
                read(full, kw, index=i, n_files=n_files)
            continue
        np.testing.assert_array_equal(read(full, kw, index=i, n_files=n_files), want)


# --------------------------------------------------------------------------
# Structured padding: a padded ROI holds the file's bytes and zero bytes, never heap bytes


PADDED = [
    np.dtype({"names": ["a", "b"], "formats": ["u1", "<i4"], "offsets": [0, 4], "itemsize": 12}),
    np.dtype([("x", "u1"), ("y", "<f8")], align=True),
    np.dtype({"names": ["p"], "formats": [np.dtype([("q", "u1"), ("r", "<i2")], align=True)], "itemsize": 16}),
]


def _patterned(shape, dtype, seed):
    """An array whose every byte (padding included) is a non-zero pattern."""
    rng = np.random.default_rng(seed)
    a = np.empty(shape, dtype)
    a.view(np.uint8).reshape(-1)[:] = rng.integers(1, 256, a.nbytes, dtype=np.uint8)
    return a


def _dirty_heap(dtype, n=64):
    """Leave freed buffers full of 0xEE where the next np.empty may find them."""
    for _ in range(4):
        np.full(n * dtype.itemsize, 0xEE, np.uint8)


@pytest.mark.parametrize("dtype", PADDED, ids=["holes", "aligned", "nested"])
@pytest.mark.parametrize("backend", ["auto", "pread", "mmap"])
def test_a_padded_roi_of_structured_values_holds_file_bytes_and_zero_bytes(tmp_path, dtype, backend):
    import npydask
    from npydask._buffers import raw

    src = _patterned((6, 5), dtype, seed=dtype.itemsize)
    p = tmp_path / "s.npy"
    np.save(p, src)
    ds = npydask.open_dataset(
        files=[str(p)], roi_start=[-2, 1], roi_shape=[9, 6], out_of_bounds_policy="pad", backend=backend
    )
    view = ds.views[0]
    for box in (Box((0, 0), (9, 6)), Box((1, 2), (8, 5)), Box((0, 0), (2, 6))):
        _dirty_heap(dtype)
        got = view.read(box)
        want = np.zeros((9, 6), dtype)  # zero bytes everywhere outside the file
        raw(want)[2:8, 0:4] = raw(src)[:, 1:5]
        sel = tuple(slice(a, b) for a, b in zip(box.start, box.stop))
        assert got.tobytes() == np.ascontiguousarray(raw(want)[sel]).tobytes()


@pytest.mark.parametrize("dtype", PADDED, ids=["holes", "aligned", "nested"])
def test_apply_pad_moves_every_byte_of_structured_values(dtype):
    from npydask._buffers import raw

    args = RoiArgs.from_user(roi_start=[-1, 0], roi_end=[4, 5], out_of_bounds_policy="pad")
    roi = resolve_roi(args, (3, 3), dtype)
    block = _patterned(roi.box.shape, dtype, seed=3)
    _dirty_heap(dtype)
    got = apply_pad(block, roi)
    want = np.zeros(roi.shape, dtype)
    raw(want)[1:4, 0:3] = raw(block)
    assert got.tobytes() == np.ascontiguousarray(raw(want)).tobytes()
