"""open_dataset / NpyDataset: DALI readers.numpy parity against numpy.

numpy is the oracle (np.load, slicing, np.pad, np.stack, np.concatenate) and
the files are real. The ROI suite re-expresses DALI's own numpy-reader tests
(``test_numpy_reader_roi``/``_roi_error``: the same eight 2-D shapes in C,
Fortran and mixed order); tests/dataset/test_dataset_dali.py compares with DALI itself.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import stat
import tempfile
from collections.abc import Sequence

import dask
import dask.array as da
import numpy as np
import pytest
from dask.array.utils import assert_eq
from hypothesis import given
from hypothesis import strategies as st

import npydask
import npydask.dataset.stacking
from npydask.dataset.npy_dataset import Skipped
from npydask.errors import NpyDaskWarning

SHAPES = [(10, 10), (12, 10), (10, 12), (20, 15), (10, 11), (12, 11), (13, 11), (19, 10)]


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(42)
    arrays = []
    for i, shape in enumerate(SHAPES):
        a = rng.standard_normal(shape).astype("<f4")
        arrays.append(a)
        np.save(tmp_path / f"{i:02d}.npy", np.asfortranarray(a) if i % 2 else a)
    return tmp_path, arrays


def test_files_headers_shapes(folder):
    root, arrays = folder
    ds = npydask.open_dataset(root)
    assert len(ds) == len(SHAPES)
    assert ds.files == [os.path.join(root, f"{i:02d}.npy") for i in range(len(SHAPES))]
    assert ds.shapes == SHAPES and ds.dtype == np.dtype("<f4") and ds.ndim == 2
    assert ds.nbytes == sum(a.nbytes for a in arrays)
    assert [h.fortran_order for h in ds.headers] == [bool(i % 2) for i in range(len(SHAPES))]
    assert "8 files" in repr(ds) and "float32" in repr(ds)
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(ds[i].compute(), a)


def test_roi_stack_equals_numpy(folder):
    root, arrays = folder
    ds = npydask.open_dataset(root, roi_start=[1, 2], roi_shape=[8, 7])
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([a[1:9, 2:9] for a in arrays]))


@pytest.mark.parametrize("fill", [0, 10])
def test_pad_policy(folder, fill):
    root, arrays = folder
    ds = npydask.open_dataset(root, roi_start=[-2, 3], roi_end=[14, 13], out_of_bounds_policy="pad", fill_value=fill)
    expected = []
    for a in arrays:
        padded = np.pad(a, ((2, max(0, 14 - a.shape[0])), (0, max(0, 13 - a.shape[1]))), constant_values=fill)
        expected.append(padded[0:16, 3:13])
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(expected))


def test_trim_policy_gives_ragged_shapes(folder):
    root, arrays = folder
    ds = npydask.open_dataset(root, roi_start=[5, 0], roi_end=[15, 11], out_of_bounds_policy="trim_to_shape")
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(ds[i].compute(), a[5:15, 0:11])
    with pytest.raises(ValueError, match="different shapes"):
        ds.stack()


def test_out_of_bounds_error_names_file_and_shape(folder):
    root, _ = folder
    with pytest.raises(npydask.RoiError, match=r"00\.npy.*\(10, 10\)"):
        npydask.open_dataset(root, roi_end=[11, 5])


def test_concatenate_equals_numpy(folder):
    root, arrays = folder
    ds = npydask.open_dataset(root, files=["00.npy", "01.npy", "04.npy", "05.npy", "06.npy"])
    rows = npydask.open_dataset(root, files=["00.npy", "02.npy"])  # (10, 10) and (10, 12): join along axis 1
    np.testing.assert_array_equal(rows.concatenate(axis=1).compute(), np.concatenate([arrays[0], arrays[2]], axis=1))
    cols = npydask.open_dataset(root, files=["00.npy", "01.npy", "07.npy"])  # (10|12|19, 10)
    expected = np.concatenate([arrays[0], arrays[1], arrays[7]])
    np.testing.assert_array_equal(cols.concatenate().compute(), expected)
    np.testing.assert_array_equal(cols.concatenate(chunks=(7, 4)).compute(), expected)
    with pytest.raises(ValueError, match="axis 0"):
        ds.concatenate(axis=0)


def test_shards_and_subsets(folder):
    root, _ = folder
    ds = npydask.open_dataset(root)
    assert [len(ds.shard(k, 3)) for k in range(3)] == [2, 3, 3]
    assert npydask.open_dataset(root, shard_id=1, num_shards=3).files == ds.files[2:5]
    assert ds[[5, 1]].files == [ds.files[5], ds.files[1]]
    assert ds[2:4].files == ds.files[2:4]
    with pytest.raises(ValueError, match=r"shard_id must be in \[0, num_shards\)"):
        npydask.open_dataset(root, shard_id=3, num_shards=3)


def test_mixed_dtype_and_ndim_are_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3, "i4"))
    np.save(tmp_path / "b.npy", np.zeros(3, "f4"))
    with pytest.raises(ValueError, match=r"a\.npy.*int32.*b\.npy.*float32"):
        npydask.open_dataset(tmp_path)
    np.save(tmp_path / "b.npy", np.zeros((3, 1), "i4"))
    with pytest.raises(ValueError, match="ndim"):
        npydask.open_dataset(tmp_path)


def test_small_files_are_grouped_into_few_tasks(tmp_path):
    for i in range(3000):
        np.save(tmp_path / f"{i:05d}.npy", np.full((4, 4), i, "f4"))
    ds = npydask.open_dataset(tmp_path)
    x = ds.stack()
    assert x.shape == (3000, 4, 4)
    assert len(dict(x.__dask_graph__())) < 100
    np.testing.assert_array_equal(x.compute()[:, 0, 0], np.arange(3000, dtype="f4"))


# ==========================================================================
# Helpers: numpy is the oracle (np.load, slicing and np.pad)


def rnd(x: float) -> int:
    """Round half away from zero (C's llround)."""
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def rel(r: float, n: int) -> float:
    """DALI's float32 product of a relative value and an extent."""
    return float(np.float32(r) * np.float32(n))


def roi_expected(a: np.ndarray, bounds, policy: str = "error", fill=0) -> np.ndarray | None:
    """``a`` cut to ``bounds`` ([(start, end)] per axis) under ``policy``; None when "error" refuses."""
    bounds = [(int(s), int(e)) for s, e in bounds]
    if policy == "error":
        if any(not (0 <= s <= n and 0 <= e <= n) for (s, e), n in zip(bounds, a.shape)):
            return None
        return a[tuple(slice(s, e) for s, e in bounds)]
    if policy == "trim_to_shape":
        return a[tuple(slice(min(max(s, 0), n), min(max(e, 0), n)) for (s, e), n in zip(bounds, a.shape))]
    before = [max(0, -s) for s, _ in bounds]
    after = [max(0, e - n) for (_, e), n in zip(bounds, a.shape)]
    padded = np.pad(a, list(zip(before, after)), constant_values=fill).astype(a.dtype)  # (np.pad makes '>f8' native)
    return padded[tuple(slice(s + b, e + b) for (s, e), b in zip(bounds, before))]


def write_folder(root, shapes, dtype, order: str, seed: int = 0, name="test_{:02d}.npy"):
    """Files of ``shapes`` in ``order`` ("C", "F" or "mixed"); returns the arrays as np.load reads them."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = []
    for i, shape in enumerate(shapes):
        a = (rng.random(shape) * 100).astype(dtype)
        fortran = order == "F" or (order == "mixed" and rng.random() < 0.5) or (order == "mixed" and i == 1)
        np.save(os.path.join(root, name.format(i)), np.asfortranarray(a) if fortran else a)
        arrays.append(np.load(os.path.join(root, name.format(i))))
    return arrays


def assert_datasets_equal(pairs, *, check_chunks: bool = True, per_file: bool = True) -> None:
    """For each ``(ds, expected[, label])``: every ds[i], ds.arrays() and (equal shapes) ds.stack() equal numpy.

    Everything is computed in one synchronous ``dask.compute``; ``check_chunks``
    adds dask's own ``assert_eq(..., check_chunks=True)`` on each stack (every
    block of the promised shape and dtype). ``per_file=False`` reads the files
    through ds.stack() only, where the shapes allow.
    """
    lazy, checks = [], []
    for ds, expected, *label in pairs:
        label = label[0] if label else ""
        assert len(ds) == len(expected), label
        assert ds.shapes == [e.shape for e in expected], label
        same = len({e.shape for e in expected}) == 1
        if per_file or not same:
            each = ds.arrays()
            assert ds[-1].name == each[-1].name, label  # the same graphs
            for x, e, f in zip(each, expected, ds.files):
                assert x.shape == e.shape and x.dtype == e.dtype, (label, f, x.shape, e.shape, x.dtype, e.dtype)
                lazy.append(x)
                checks.append((e, f"{label} {f}"))
        if same:
            stacked = ds.stack()
            want = np.stack(expected)  # numpy's dtype: native byte order
            assert stacked.dtype == want.dtype and stacked.shape == want.shape, label
            lazy.append(stacked)
            checks.append((want, f"{label} stack()"))
            if check_chunks:
                assert_eq(stacked, want, check_chunks=True)
        else:
            with pytest.raises(ValueError, match="different shapes"):
                ds.stack()
    for got, (want, what) in zip(dask.compute(*lazy, scheduler="sync"), checks):
        assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=what)
        assert got.flags.c_contiguous or got.size == 0, what


def assert_dataset_equals(ds, expected: list[np.ndarray], *, check_chunks: bool = True) -> None:
    """Every ds[i] and ds.arrays(), and ds.stack() when all shapes agree, equal ``expected``."""
    assert_datasets_equal([(ds, expected)], check_chunks=check_chunks)


# ==========================================================================
# DALI's numpy-reader ROI suite, through open_dataset


@pytest.fixture(scope="module", params=["C", "F", "mixed"])
def dali_folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"dali_{request.param}")
    arrays = write_folder(root, SHAPES, "u1", request.param, seed=12345)
    if request.param == "F":
        assert all(npydask.read_header(root / f"test_{i:02d}.npy").fortran_order for i in range(len(SHAPES)))
    if request.param == "mixed":
        orders = {npydask.read_header(root / f"test_{i:02d}.npy").fortran_order for i in range(len(SHAPES))}
        assert orders == {False, True}
    return str(root), arrays, request.param


def _full(shape):
    return [(0, n) for n in shape]


def _axes(shape, **per_axis):
    b = _full(shape)
    for d, (s, e) in per_axis.items():
        b[int(d[1:])] = (s, e)
    return b


# name: (open_dataset ROI kwargs, shape -> [(start, end)] per axis, rounded half away from zero as DALI does)
ROI_CASES = {
    "roi_start": (dict(roi_start=[1, 2]), lambda s: [(1, s[0]), (2, s[1])]),
    "rel_roi_start": (
        dict(rel_roi_start=[0.1, 0.2]),
        lambda s: [(rnd(rel(0.1, s[0])), s[0]), (rnd(rel(0.2, s[1])), s[1])],
    ),
    "roi_end": (dict(roi_end=[8, 7]), lambda s: [(0, 8), (0, 7)]),
    "rel_roi_end": (dict(rel_roi_end=[0.5, 0.9]), lambda s: [(0, rnd(rel(0.5, s[0]))), (0, rnd(rel(0.9, s[1])))]),
    "roi_shape": (dict(roi_shape=[4, 5]), lambda s: [(0, 4), (0, 5)]),
    "rel_roi_shape": (dict(rel_roi_shape=[0.4, 0.8]), lambda s: [(0, rnd(rel(0.4, s[0]))), (0, rnd(rel(0.8, s[1])))]),
    "scalar_axis0": (dict(roi_start=1, roi_end=9, roi_axes=[0]), lambda s: _axes(s, a0=(1, 9))),
    "scalar_axis1": (dict(roi_start=1, roi_end=9, roi_axes=[1]), lambda s: _axes(s, a1=(1, 9))),
    "scalar_axis_scalar": (dict(roi_start=2, roi_end=[7], roi_axes=1), lambda s: _axes(s, a1=(2, 7))),
    "start_end_axes01": (dict(roi_start=[1, 2], roi_end=[8, 9], roi_axes=[0, 1]), lambda s: [(1, 8), (2, 9)]),
    "start_end_axes10": (dict(roi_start=[2, 1], roi_end=[9, 8], roi_axes=[1, 0]), lambda s: [(1, 8), (2, 9)]),
    "negative_axis": (dict(roi_start=[3], roi_end=[6], roi_axes=[-1]), lambda s: _axes(s, a1=(3, 6))),
    "negative_axes": (dict(roi_start=[3, 1], roi_shape=[2, 4], roi_axes=[-1, -2]), lambda s: [(1, 5), (3, 5)]),
    "start_rel_end": (
        dict(roi_start=[1, 2], rel_roi_end=[0.5, 0.4], roi_axes=[0, 1]),
        lambda s: [(1, rnd(rel(0.5, s[0]))), (2, rnd(rel(0.4, s[1])))],
    ),
    "rel_start_end": (
        dict(rel_roi_start=[0.1, 0.2], roi_end=[8, 9], roi_axes=[0, 1]),
        lambda s: [(rnd(rel(0.1, s[0])), 8), (rnd(rel(0.2, s[1])), 9)],
    ),
    "start_shape": (dict(roi_start=[1, 2], roi_shape=[4, 5]), lambda s: [(1, 5), (2, 7)]),
    "rel_start_shape": (
        # end = the unrounded start + roi_shape
        dict(rel_roi_start=[0.15, 0.25], roi_shape=[3, 4]),
        lambda s: [(rnd(rel(0.15, s[0])), rnd(rel(0.15, s[0]) + 3)), (rnd(rel(0.25, s[1])), rnd(rel(0.25, s[1]) + 4))],
    ),
    "rel_start_rel_shape": (
        # end = (rel_roi_start + rel_roi_shape) * extent, the float32 values summed in double
        dict(rel_roi_start=[0.1, 0.3], rel_roi_shape=[0.5, 0.45]),
        lambda s: [
            (rnd(rel(r0, n)), rnd((float(np.float32(r0)) + float(np.float32(r1))) * n))
            for r0, r1, n in [(0.1, 0.5, s[0]), (0.3, 0.45, s[1])]
        ],
    ),
    "start_rel_shape": (
        dict(roi_start=[2, 1], rel_roi_shape=[0.3, 0.5]),
        lambda s: [(2, rnd(2 + rel(0.3, s[0]))), (1, rnd(1 + rel(0.5, s[1])))],
    ),
    "all_axes_one_value": (dict(roi_start=3), lambda s: [(3, s[0]), (3, s[1])]),
    "empty_axes": (dict(roi_start=[], roi_end=[], roi_axes=[]), _full),
    "empty_range": (dict(roi_start=[1], roi_end=[1], roi_axes=[1]), lambda s: _axes(s, a1=(1, 1))),
    "empty_both": (dict(roi_start=[4, 3], roi_end=[4, 3]), lambda s: [(4, 4), (3, 3)]),
    "whole": (dict(roi_start=[0, 0], rel_roi_end=[1.0, 1.0]), _full),
    "out_end": (dict(roi_start=[1, 2], roi_end=[20, 9], roi_axes=[0, 1]), lambda s: [(1, 20), (2, 9)]),
    "out_start": (dict(roi_start=[-10, 2], roi_end=[8, 9], roi_axes=[0, 1]), lambda s: [(-10, 8), (2, 9)]),
    "out_rel": (
        dict(rel_roi_start=[-0.25, 0.5], rel_roi_end=[0.5, 1.3]),
        lambda s: [(rnd(rel(-0.25, s[0])), rnd(rel(0.5, s[0]))), (rnd(rel(0.5, s[1])), rnd(rel(1.3, s[1])))],
    ),
    "out_shape": (dict(roi_shape=[100, 8]), lambda s: [(0, 100), (0, 8)]),
    "fully_outside": (dict(roi_start=[12, -9], roi_end=[18, -1]), lambda s: [(12, 18), (-9, -1)]),
}


def test_dali_roi_suite(dali_folder):
    """Every ROI form, under every policy (pad with fills 0 and 10), against numpy slicing and np.pad."""
    root, arrays, order = dali_folder
    full = order == "mixed"  # C and Fortran files together: every policy, every file alone
    policies = [("error", 0), ("trim_to_shape", 0), ("pad", 0), ("pad", 10)] if full else [("error", 0), ("pad", 10)]
    pairs, refused = [], 0
    for case, (kw, bounds) in ROI_CASES.items():
        read = {}
        for policy, fill in policies:
            label = f"{case} {policy} fill={fill}"
            expected = [roi_expected(a, bounds(a.shape), policy, fill) for a in arrays]
            if any(e is None for e in expected):
                bad = next(i for i, e in enumerate(expected) if e is None)
                name = f"test_{bad:02d}.npy"
                with pytest.raises(npydask.RoiError, match=rf"{name}.*{re.escape(str(SHAPES[bad]))}") as info:
                    npydask.open_dataset(root, out_of_bounds_policy=policy, fill_value=fill, **kw)
                assert "start=" in str(info.value) and "end=" in str(info.value), label
                refused += 1
                continue
            ds = npydask.open_dataset(root, out_of_bounds_policy=policy, fill_value=fill, **kw)
            assert ds.files == [os.path.join(root, f"test_{i:02d}.npy") for i in range(len(SHAPES))]
            read[policy, fill] = ds
            if not full and policy == "error":
                assert ds.shapes == [e.shape for e in expected], label
                continue  # C or Fortran only: "pad" reads the same cells, and its fill too
            if ("error", 0) in read and (policy, fill) in [("trim_to_shape", 0), ("pad", 0)]:
                # inside every file: the same graphs as "error" (and "pad" reads no fill)
                assert ds.shapes == read["error", 0].shapes, label
                if policy == "trim_to_shape":
                    assert [x.name for x in ds.arrays()] == [x.name for x in read["error", 0].arrays()], label
                continue
            pairs.append((ds, expected, label))
        if full:
            # dask's own check that every block is what the graph promises, once per case
            ds, expected, _ = pairs[-1]  # "pad" always reads
            if len({e.shape for e in expected}) == 1:
                assert_eq(ds.stack(chunks=(3, 4, 5)), np.stack(expected), check_chunks=True)
            else:
                assert_eq(ds[3], expected[3], check_chunks=True)
    assert refused >= 5
    assert_datasets_equal(pairs, check_chunks=False, per_file=full)


def test_dali_roi_suite_covers_every_outcome(dali_folder):
    """The table above reads some cases under "error" and refuses others."""
    _, arrays, _ = dali_folder
    refused = [c for c, (_, b) in ROI_CASES.items() if any(roi_expected(a, b(a.shape)) is None for a in arrays)]
    assert {"out_end", "out_start", "out_rel", "out_shape", "fully_outside"} <= set(refused)
    assert len(refused) < len(ROI_CASES) // 2


def test_rel_roi_end_rounds_half_away(tmp_path):
    # 0.9f * 15 = 13.5f -> 14 (SPEC's example); 0.5f * 13 = 6.5 -> 7; 0.3f * 5 = 1.5 -> 2
    a = write_folder(tmp_path, [(15, 13, 5)], "i2", "F")[0]
    ds = npydask.open_dataset(tmp_path, rel_roi_end=[0.9, 0.5, 0.3])
    assert ds.shapes == [(14, 7, 2)]
    np.testing.assert_array_equal(ds[0].compute(), a[:14, :7, :2])


@pytest.mark.parametrize(
    ("kw", "names"),
    [
        (dict(roi_start=[1, 2], rel_roi_start=[0.1, 0.2]), ("roi_start", "rel_roi_start")),
        (dict(roi_end=[8, 7], rel_roi_end=[0.4, 0.5]), ("roi_end", "rel_roi_end")),
        (dict(roi_end=[8, 7], roi_shape=[8, 7]), ("roi_end", "roi_shape")),
        (dict(roi_end=[8, 7], rel_roi_shape=[0.4, 0.5]), ("roi_end", "rel_roi_shape")),
        (dict(rel_roi_end=[0.5, 0.4], roi_shape=[8, 7]), ("rel_roi_end", "roi_shape")),
        (dict(rel_roi_end=[0.5, 0.4], rel_roi_shape=[0.1, 0.1]), ("rel_roi_end", "rel_roi_shape")),
        (dict(roi_start=[[1, 1]] * 8, rel_roi_start=[0.1, 0.2]), ("roi_start", "rel_roi_start")),
    ],
)
def test_exclusive_roi_arguments(dali_folder, kw, names):
    root, *_ = dali_folder
    with pytest.raises(ValueError, match=rf"{names[0]}.*{names[1]}") as info:
        npydask.open_dataset(root, **kw)
    assert not isinstance(info.value, npydask.RoiError)


@pytest.mark.parametrize(
    ("kw", "file", "shape"),
    [
        (dict(roi_start=[-1, 2]), "test_00.npy", (10, 10)),
        (dict(roi_end=[100, 8]), "test_00.npy", (10, 10)),
        (dict(roi_shape=[100, 8]), "test_00.npy", (10, 10)),
        (dict(roi_end=[11, 5]), "test_00.npy", (10, 10)),
        (dict(roi_start=[0, 11], roi_end=[5, 11]), "test_00.npy", (10, 10)),
        (dict(roi_end=[5, 15], files=["test_03.npy", "test_02.npy"]), "test_02.npy", (10, 12)),
        (dict(rel_roi_end=[1.05], roi_axes=[0], files=["test_03.npy"]), "test_03.npy", (20, 15)),
    ],
)
def test_out_of_bounds_error_names_file_shape_and_roi(dali_folder, kw, file, shape):
    root, *_ = dali_folder
    with pytest.raises(npydask.RoiError, match=rf"{re.escape(file)}.*{re.escape(str(shape))}") as info:
        npydask.open_dataset(root, **kw)
    assert isinstance(info.value, ValueError)
    assert "start=" in str(info.value) and "end=" in str(info.value)


@pytest.mark.parametrize("policy", ["error", "trim_to_shape", "pad"])
@pytest.mark.parametrize(
    "kw",
    [
        dict(roi_start=[5], roi_end=[3], roi_axes=[0]),
        dict(roi_start=[5, 5], roi_end=[6, 2]),
        dict(rel_roi_start=[0.5], rel_roi_end=[0.2], roi_axes=[-1]),
        dict(roi_start=[-2], roi_end=[-5], roi_axes=[1]),
        dict(roi_start=[30], roi_end=[25], roi_axes=[0]),
        dict(roi_start=[[0, 0]] * 5 + [[4, 4]] + [[0, 0]] * 2, roi_end=[3, 3]),  # only file 5
    ],
)
def test_end_before_start_is_refused_whatever_the_policy(dali_folder, kw, policy):
    root, *_ = dali_folder
    with pytest.raises(npydask.RoiError, match="ends before it starts"):
        npydask.open_dataset(root, out_of_bounds_policy=policy, fill_value=3, **kw)


def test_bad_roi_arguments(dali_folder):
    root, *_ = dali_folder
    with pytest.raises(ValueError, match="out_of_bounds_policy"):
        npydask.open_dataset(root, out_of_bounds_policy="clamp")
    with pytest.raises(ValueError, match="roi_axes"):
        npydask.open_dataset(root, roi_start=[1], roi_axes=[0, -2])  # the same axis twice
    with pytest.raises(ValueError, match="roi_axes"):
        npydask.open_dataset(root, roi_start=[1], roi_axes=[2])
    with pytest.raises(ValueError, match="roi_start"):
        npydask.open_dataset(root, roi_start=[1, 2, 3])
    with pytest.raises(ValueError, match="one row per file"):
        npydask.open_dataset(root, roi_start=[[1, 2]] * 7)  # 8 files
    with pytest.raises(ValueError, match="fill_value"):
        npydask.open_dataset(root, out_of_bounds_policy="pad", fill_value="x")


@pytest.mark.parametrize("order", ["C", "F", "mixed"])
def test_per_file_rois_are_rows_of_the_whole_list_before_sharding(tmp_path, order):
    arrays = write_folder(tmp_path, SHAPES, ">i4", order, seed=3)
    starts = [[i % 3, (i + 1) % 4] for i in range(len(SHAPES))]
    ends = [[s0 + 5 + i % 2, s1 + 6] for i, (s0, s1) in enumerate(starts)]
    rows = [a[s0:e0, s1:e1] for a, (s0, s1), (e0, e1) in zip(arrays, starts, ends)]
    ds = npydask.open_dataset(tmp_path, roi_start=starts, roi_end=ends)
    assert_dataset_equals(ds, rows)
    for k, (lo, hi) in enumerate([(0, 4), (4, 8)]):
        shard = npydask.open_dataset(tmp_path, roi_start=starts, roi_end=ends, shard_id=k, num_shards=2)
        assert shard.files == ds.files[lo:hi]
        assert_dataset_equals(shard, rows[lo:hi])
        assert ds.shard(k, 2).files == shard.files
        assert_dataset_equals(ds.shard(k, 2), rows[lo:hi])
    # numpy 2-D arrays work as rows too, mixed with a shared argument; an empty row means "not given"
    shapes = np.array([[4, 3]] * len(SHAPES))
    ds = npydask.open_dataset(tmp_path, roi_start=np.array(starts), roi_shape=shapes, shard_id=1, num_shards=2)
    assert_dataset_equals(ds, [a[s0 : s0 + 4, s1 : s1 + 3] for a, (s0, s1) in list(zip(arrays, starts))[4:]])
    some = [[1, 1] if i % 2 else [] for i in range(len(SHAPES))]
    ds = npydask.open_dataset(tmp_path, roi_start=some)
    assert_dataset_equals(ds, [a[1:, 1:] if i % 2 else a for i, a in enumerate(arrays)])


@pytest.mark.parametrize("fill", [0, 10, -3.5, 1e10])
def test_pad_fill_is_converted_as_dali_does(tmp_path, fill):
    arrays = write_folder(tmp_path, [(4, 5), (6, 3)], "i1", "mixed")
    ds = npydask.open_dataset(tmp_path, roi_start=[-2, 1], roi_end=[5, 7], out_of_bounds_policy="pad", fill_value=fill)
    converted = {0: 0, 10: 10, -3.5: -4, 1e10: 127}[fill]
    expected = [roi_expected(a, [(-2, 5), (1, 7)], "pad", converted) for a in arrays]
    assert_dataset_equals(ds, expected)
    assert_eq(ds.stack(chunks=(1, 3, 2)), np.stack(expected), check_chunks=True)


def test_pad_on_non_native_fortran_3d_files(tmp_path):
    a = (np.arange(3 * 4 * 5) - 7.25).reshape(3, 4, 5).astype(">f8")
    np.save(tmp_path / "a.npy", np.asfortranarray(a))
    np.save(tmp_path / "b.npy", (a * 2).astype(">f8"))
    ds = npydask.open_dataset(
        tmp_path, roi_start=[-1, 2, -3], roi_shape=[5, 4, 4], out_of_bounds_policy="pad", fill_value=0.5
    )
    b = [(-1, 4), (2, 6), (-3, 1)]
    expected = [roi_expected(np.load(f), b, "pad", 0.5) for f in ds.files]
    np.testing.assert_array_equal(np.load(ds.files[1]), a * 2)
    assert ds.dtype == np.dtype(">f8")
    assert_dataset_equals(ds, expected)
    for chunks in [(1, 1, 2, 3), (2, 3, 2, 1), "64B"]:
        assert_eq(ds.stack(chunks=chunks), np.stack(expected), check_chunks=True)


# ==========================================================================
# Which files, in which order


@pytest.fixture
def tree(tmp_path):
    rels = ["b.npy", "a.npy", "B.npy", "a10.npy", "a2.npy", "sub2/x.npy", "sub1/z.npy", "sub1/deep/q.npy",
            "sub1/a.npy", ".h.npy", "A.NPY"]  # fmt: skip
    for k, rel_path in enumerate(rels):
        path = tmp_path / rel_path
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:  # (np.save would add .npy to A.NPY)
            np.save(f, np.full((2, 3), k, "i8"))
    (tmp_path / "notes.txt").write_text("not an array")
    (tmp_path / "dir.npy").mkdir()
    return tmp_path, {r: k for k, r in enumerate(rels)}


def _check_order(ds, root, rels, value_of):
    assert ds.files == [os.path.join(root, r) for r in rels]
    np.testing.assert_array_equal(ds.stack()[:, 0, 0].compute(), [value_of[r] for r in rels])


def test_discovery_order_through_open_dataset(tree):
    root, value_of = tree
    flat = [".h.npy", "B.npy", "a.npy", "a10.npy", "a2.npy", "b.npy", "sub1/a.npy", "sub1/z.npy", "sub2/x.npy"]
    with pytest.warns(NpyDaskWarning, match="puts 'a10.npy' before 'a2.npy'"):  # (the default: DALI's, said)
        _check_order(npydask.open_dataset(root), str(root), flat, value_of)
    _check_order(npydask.open_dataset(str(root), sort="bytes"), str(root), flat, value_of)
    deep = [".h.npy", "B.npy", "a.npy", "a10.npy", "a2.npy", "b.npy", "sub1/a.npy", "sub1/deep/q.npy",
            "sub1/z.npy", "sub2/x.npy"]  # fmt: skip
    _check_order(npydask.open_dataset(root, recursive=True, sort="bytes"), str(root), deep, value_of)
    a_star = ["a.npy", "a10.npy", "a2.npy", "sub1/a.npy"]
    _check_order(npydask.open_dataset(root, file_filter="a*.npy", sort="bytes"), str(root), a_star, value_of)
    _check_order(npydask.open_dataset(root, file_filter="*.NPY"), str(root), ["A.NPY"], value_of)
    with pytest.raises(ValueError, match="no file found"):
        npydask.open_dataset(root, file_filter="*.npz")
    with pytest.raises(FileNotFoundError):
        npydask.open_dataset(root / "missing")


@pytest.mark.parametrize("dtype", ["<f4", ">i2", "u1"])
@pytest.mark.parametrize("n", [3, 12, 105])
def test_natural_sort_concatenates_slices_in_numeric_order(tmp_path, dtype, n):
    # slice_0 .. slice_{n-1}, of different lengths: byte-wise order would put slice_10 before slice_2
    slices = [np.full((1 + i % 3, 4), i, dtype) for i in range(n)]
    for i, a in enumerate(slices):
        np.save(tmp_path / f"slice_{i}.npy", a)
    ds = npydask.open_dataset(tmp_path, file_filter="slice_*.npy", sort="natural")
    assert ds.files == [str(tmp_path / f"slice_{i}.npy") for i in range(n)]
    np.testing.assert_array_equal(ds.concatenate(axis=0).compute(), np.concatenate(slices))
    if n > 10:  # the default stays DALI's, and says natural order differs
        with pytest.warns(NpyDaskWarning, match=r"puts 'slice_1\d+\.npy' before 'slice_\d+\.npy'") as record:
            dali = npydask.open_dataset(tmp_path, file_filter="slice_*.npy")
        assert len(record) == 1 and record[0].filename == __file__
        assert dali.files != ds.files
    else:
        dali = npydask.open_dataset(tmp_path, file_filter="slice_*.npy")
    assert dali.files == sorted(ds.files)
    assert npydask.open_dataset(tmp_path, file_filter="slice_*.npy", sort="bytes").files == dali.files
    natural_shard = npydask.open_dataset(tmp_path, sort="natural", shard_id=1, num_shards=3)
    assert natural_shard.files == ds.files[n // 3 : 2 * n // 3]  # shards cut the sorted list, as DALI


def test_natural_sort_recursive_and_listed_files(tmp_path):
    for rel in ["v2/t10.npy", "v2/t9.npy", "v10/t1.npy", "v2/deep/t3.npy"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp_path / rel, np.array([len(rel)]))
    deep = npydask.open_dataset(tmp_path, recursive=True, sort="natural")
    assert [os.path.relpath(f, tmp_path) for f in deep.files] == [
        "v2/deep/t3.npy",
        "v2/t9.npy",
        "v2/t10.npy",
        "v10/t1.npy",
    ]
    listed = npydask.open_dataset(tmp_path, files=["v2/t10.npy", "v2/t9.npy"], sort="natural")
    assert [os.path.relpath(f, tmp_path) for f in listed.files] == ["v2/t10.npy", "v2/t9.npy"]  # order kept
    with pytest.raises(ValueError, match=r"sort must be one of \('bytes', 'natural'\).*found 'numeric'"):
        npydask.open_dataset(tmp_path, sort="numeric")


def test_file_list_and_files_keep_their_order(tree):
    root, value_of = tree
    order = ["sub1/deep/q.npy", "b.npy", "sub1/z.npy", "a.npy", "b.npy"]
    lst = root / "list.txt"
    lst.write_text("\n".join(order[:3]) + "\n\n" + "\n".join(order[3:]) + "\n")
    _check_order(npydask.open_dataset(root, file_list=lst), str(root), order, value_of)
    ds = npydask.open_dataset(file_list=str(lst))  # relative to the list's folder
    assert ds.files == [os.path.join(str(root), r) for r in order]
    _check_order(npydask.open_dataset(root, files=order), str(root), order, value_of)
    # an absolute entry overrides file_root
    ds = npydask.open_dataset(root / "sub1", files=[str(root / "a2.npy"), "z.npy"])
    assert ds.files == [str(root / "a2.npy"), os.path.join(str(root / "sub1"), "z.npy")]
    np.testing.assert_array_equal(ds.stack()[:, 0, 0].compute(), [value_of["a2.npy"], value_of["sub1/z.npy"]])
    with pytest.raises(ValueError, match="file_list"):
        npydask.open_dataset(root, files=order, file_list=lst)
    with pytest.raises(ValueError, match="files is an empty list"):
        npydask.open_dataset(root, files=[])
    with pytest.raises(ValueError, match="file_root"):
        npydask.open_dataset()


# ==========================================================================
# Shards and sub-datasets


@pytest.fixture(scope="module")
def ten(tmp_path_factory):
    root = tmp_path_factory.mktemp("ten")
    for i in range(10):
        np.save(root / f"{i}.npy", np.full((2 + i % 3, 4), i, "u2"))
    return root


@pytest.mark.parametrize(
    ("n_shards", "table"),
    [
        (3, [(0, 3), (3, 6), (6, 10)]),
        (1, [(0, 10)]),
        (4, [(0, 2), (2, 5), (5, 7), (7, 10)]),
        (7, [(0, 1), (1, 2), (2, 4), (4, 5), (5, 7), (7, 8), (8, 10)]),
        (10, [(k, k + 1) for k in range(10)]),
    ],
)
def test_shard_tables(ten, n_shards, table):
    ds = npydask.open_dataset(ten)
    for k, (lo, hi) in enumerate(table):
        assert ds.files[lo:hi] == [os.path.join(ten, f"{i}.npy") for i in range(lo, hi)]
        for shard in (ds.shard(k, n_shards), npydask.open_dataset(ten, shard_id=k, num_shards=n_shards)):
            assert shard.files == ds.files[lo:hi]
            firsts = dask.compute(*[x[0, 0] for x in shard.arrays()], scheduler="sync")
            assert [int(v) for v in firsts] == list(range(lo, hi))
    assert sum((ds.shard(k, n_shards).files for k in range(n_shards)), []) == ds.files


@pytest.mark.parametrize(("shard_id", "num_shards"), [(3, 3), (0, 11), (0, 0), (-1, 2), (1.0, 2), (True, 2)])
def test_bad_shards(ten, shard_id, num_shards):
    with pytest.raises(ValueError, match="shard"):
        npydask.open_dataset(ten, shard_id=shard_id, num_shards=num_shards)
    with pytest.raises(ValueError, match="shard"):
        npydask.open_dataset(ten).shard(shard_id, num_shards)


def test_sub_datasets(ten):
    ds = npydask.open_dataset(ten)
    files = ds.files
    for index, picks in [
        (slice(2, 5), [2, 3, 4]),
        (slice(None, None, -3), [9, 6, 3, 0]),
        (slice(-2, None), [8, 9]),
        (slice(5, 2), []),
        ([7, 1, 7], [7, 1, 7]),
        ([-1, -10], [9, 0]),
        (np.array([2, 0]), [2, 0]),
        (np.array([], dtype=int), []),
        ([], []),
        ([np.int64(5)], [5]),
    ]:
        sub = ds[index]
        assert isinstance(sub, npydask.NpyDataset), index
        assert sub.files == [files[i] for i in picks], index
        assert len(sub) == len(picks)
        if picks:
            assert_eq(sub.concatenate(), np.concatenate([np.load(files[i]) for i in picks]), check_chunks=True)
            assert sub.dtype == ds.dtype
    assert ds[[1, 2]][-1].compute()[0, 0] == 2
    assert ds[2:8].shard(1, 2).files == files[5:8]
    for i in [0, 9, -1, -10, np.int32(3), np.uint8(4)]:
        x = ds[i]
        assert isinstance(x, da.Array)
        np.testing.assert_array_equal(x.compute(), np.load(files[int(i)]))
    for bad in [10, -11, [0, 10], [-11]]:
        with pytest.raises(IndexError):
            ds[bad]
    for bad in [1.0, "0", None, True, np.bool_(False), [0.5], [True, False], {0}, [[0], 1]]:
        with pytest.raises((TypeError, ValueError)):
            ds[bad]
    empty = ds[:0]
    assert len(empty) == 0 and empty.files == [] and empty.nbytes == 0 and "0 files" in repr(empty)
    for call in (empty.stack, empty.concatenate, lambda: empty.dtype, lambda: empty.ndim):
        with pytest.raises(ValueError, match="an empty dataset"):
            call()


def test_dataset_is_immutable(ten):
    ds = npydask.open_dataset(ten)
    files = ds.files
    for name in ["files", "shapes", "dtype", "_table", "_device", "anything"]:
        with pytest.raises(AttributeError):
            setattr(ds, name, None)
    with pytest.raises(AttributeError):
        del ds._table
    ds.files.append("x")
    ds.shapes.clear()
    ds.headers.clear()
    assert ds.files == files and len(ds.shapes) == 10 and len(ds.headers) == 10
    sub, shard = ds[1:3], ds.shard(0, 2)
    assert sub is not ds and shard is not ds and len(ds) == 10
    # sub-datasets share the table's buffers (O(1) slices), nothing is copied
    for part in (ds[:1], sub, shard):
        t = part.views.table
        assert np.shares_memory(t.ends, ds.table.ends) and np.shares_memory(t.ino, ds.table.ino)
        assert t.names is ds.table.names
    assert ds.views[0].ref == ds[:1].views[0].ref
    again = pickle.loads(pickle.dumps(ds))
    assert again.files == files and again.shapes == ds.shapes and again.dtype == ds.dtype
    np.testing.assert_array_equal(again[3].compute(), np.load(files[3]))


def test_repr_is_readable(ten, folder):
    ds = npydask.open_dataset(ten)
    text = repr(ds)
    assert "10 files" in text and "uint16" in text and "(2, 4)" in text and "(4, 4)" in text
    assert len(text) < 300 and "\n" not in text
    one = npydask.open_dataset(ten, files=["0.npy"])
    assert "1 files" in repr(one) or "1 file" in repr(one)
    assert "(2, 4)" in repr(one) and "uint16" in repr(one)
    root, _ = folder
    roi = npydask.open_dataset(root, roi_shape=[3, 2])
    assert "(3, 2)" in repr(roi) and "8 files" in repr(roi) and "float32" in repr(roi)


# ==========================================================================
# Mixed dtypes and ndims


@pytest.mark.parametrize(
    ("first", "second", "names"),
    [
        ("<f4", ">f4", ("float32", "float32")),
        ("i4", "f4", ("int32", "float32")),
        ("u1", "i1", ("uint8", "int8")),
        ("<i8", "<u8", ("int64", "uint64")),
        ("f8", "c16", ("float64", "complex128")),
    ],
)
def test_mixed_dtypes_name_two_files_and_dtypes(tmp_path, first, second, names):
    np.save(tmp_path / "a.npy", np.zeros((3, 2), first))
    np.save(tmp_path / "b.npy", np.zeros((3, 2), first))
    np.save(tmp_path / "c.npy", np.zeros((2, 2), second))
    with pytest.raises(ValueError, match=rf"a\.npy.*{names[0]}.*c\.npy.*{names[1]}") as info:
        npydask.open_dataset(tmp_path)
    text = str(info.value)
    if first[1:] == second[1:]:  # byte order only: both spellings are named
        assert first in text and second in text
    with pytest.raises(ValueError, match=r"c\.npy.*a\.npy"):
        npydask.open_dataset(tmp_path, files=["c.npy", "a.npy"])
    assert len(npydask.open_dataset(tmp_path, files=["a.npy", "b.npy"])) == 2


def test_mixed_ndims_name_two_files(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((3, 2), "f4"))
    np.save(tmp_path / "b.npy", np.zeros((3, 2, 1), "f4"))
    with pytest.raises(ValueError, match=r"a\.npy.*2.*b\.npy.*3"):
        npydask.open_dataset(tmp_path)
    with pytest.raises(ValueError, match=r"b\.npy.*3.*a\.npy.*2"):
        npydask.open_dataset(tmp_path, files=["b.npy", "a.npy"])


# ==========================================================================
# Errors surface at open (or, for files changed later, at compute)


def test_non_npy_file_in_folder_fails_at_open_naming_it(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(3))
    (tmp_path / "b.npy").write_bytes(b"PK\x03\x04 this is a zip, not an npy file")
    with pytest.raises(npydask.NpyFormatError, match=r"b\.npy"):
        npydask.open_dataset(tmp_path)
    (tmp_path / "b.npy").write_bytes(b"")
    with pytest.raises(npydask.NpyFormatError, match=r"b\.npy"):
        npydask.open_dataset(tmp_path)
    np.save(tmp_path / "b.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(npydask.NpyFormatError, match=r"b\.npy"):
        npydask.open_dataset(tmp_path)
    full = tmp_path / "b.npy"
    np.save(full, np.arange(100))
    full.write_bytes(full.read_bytes()[:-8])  # truncated payload
    with pytest.raises(npydask.NpyFormatError, match=r"b\.npy"):
        npydask.open_dataset(tmp_path)
    assert npydask.open_dataset(tmp_path, file_filter="a.npy").files == [str(tmp_path / "a.npy")]


def test_missing_listed_file_fails_at_open_naming_it(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(3))
    with pytest.raises(FileNotFoundError, match=r"nope\.npy"):
        npydask.open_dataset(tmp_path, files=["a.npy", "nope.npy"])
    (tmp_path / "list.txt").write_text("a.npy\nsub/gone.npy\n")
    with pytest.raises(FileNotFoundError, match=r"gone\.npy"):
        npydask.open_dataset(tmp_path, file_list=tmp_path / "list.txt")
    os.mkdir(tmp_path / "sub")
    with pytest.raises(OSError, match="sub"):
        npydask.open_dataset(tmp_path, files=["a.npy", "sub"])


@pytest.mark.parametrize("how", ["rewrite", "touch", "replace"])
def test_file_changed_after_open_fails_at_compute_naming_it(tmp_path, how):
    for i in range(3):
        np.save(tmp_path / f"{i}.npy", np.full((4, 5), i, "f4"))
    ds = npydask.open_dataset(tmp_path, roi_start=[-1, 0], roi_end=[4, 5], out_of_bounds_policy="pad")
    lazy = [ds[1], ds.stack(), ds.concatenate(axis=1), ds.stack(chunks=(1, 2, 5))]
    target = tmp_path / "1.npy"
    if how == "rewrite":
        np.save(target, np.full((5, 5), 9, "f4"))
    elif how == "touch":
        st = os.stat(target)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    else:
        np.save(tmp_path / "tmp.npy", np.full((4, 5), 9, "f4"))
        os.replace(tmp_path / "tmp.npy", target)
    for x in lazy:
        with pytest.raises(npydask.FileChangedError, match=r"1\.npy"):
            x.compute()
    # a file not touched still reads
    np.testing.assert_array_equal(ds[0].compute()[1:], np.zeros((4, 5), "f4"))
    # opening again sees the new file
    np.testing.assert_array_equal(npydask.open_dataset(tmp_path)[1].compute(), np.load(target))


# ==========================================================================
# stack and concatenate: grouping, chunks, equality


def _chunk_edges(chunks):
    return set(np.cumsum([0, *chunks]).tolist())


def test_stack_medium_files_keep_one_chunk_each(tmp_path):
    arrays = []
    for i in range(6):
        a = np.full((256, 512), i, "f4") + np.arange(512, dtype="f4")  # 512 KiB
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if i % 2 else a)
        arrays.append(a)
    with dask.config.set({"array.chunk-size": "1MiB"}):
        ds = npydask.open_dataset(tmp_path)
        x = ds.stack()
        assert x.chunks == ((1,) * 6, (256,), (512,))
        assert_eq(x, np.stack(arrays), check_chunks=True)
        y = ds.concatenate(axis=0)
        assert y.chunks[0] == (256,) * 6
        assert_eq(y, np.concatenate(arrays), check_chunks=True)
        z = ds.concatenate(axis=-1)
        assert z.chunks[1] == (512,) * 6
        assert_eq(z, np.concatenate(arrays, axis=1), check_chunks=True)


def test_a_local_stack_holds_every_file_in_one_source_key(tmp_path):
    """Locally, one source for all files: n small tasks plus one key, whatever n is."""
    arrays = [np.full((64, 128), i, "<f4") + np.arange(128, dtype="<f4") for i in range(40)]  # 32 KiB each
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i:02d}.npy", a if i % 3 else np.asfortranarray(a))
    with dask.config.set({"array.chunk-size": "128KiB"}):  # files over 16 KiB: a chunk per file
        ds = npydask.open_dataset(tmp_path, backend="auto")
        x = ds.stack()
        y = ds.concatenate(axis=1)
    assert x.chunks[0] == (1,) * 40 and y.chunks[1] == (128,) * 40
    for joined in (x, y):
        graph = dict(joined.__dask_graph__())
        sizes = sorted(len(pickle.dumps(task)) for task in graph.values())
        assert len(graph) == 41
        assert sizes[-2] < 1000 < sizes[-1], sizes  # tiny tasks; the one source holds the 40 files
    assert_eq(x, np.stack(arrays), check_chunks=True)
    assert_eq(y, np.concatenate(arrays, axis=1), check_chunks=True)
    # a plan whose groups are chunked differently is joined group by group
    plan = npydask.plan.grouping.GroupPlan(((0, 2), (2, 3)), (((2,), (64,), (128,)), ((1,), (32, 32), (128,))))
    assert npydask.plan.grouping.one_grid(plan, 0) is None
    z = npydask.dataset.stacking.join(ds.views[:3], plan, axis=0, stacked=True, shared=True)
    assert z.chunks == ((2, 1), (32, 32), (128,))  # (dask unifies the two grids)
    assert_eq(z, np.stack(arrays[:3]))


def test_a_cluster_stack_of_few_files_is_one_layer_each_task_carrying_every_file(tmp_path, monkeypatch):
    """On a cluster (``shared=False``) a light dataset is one source in every task: one layer, which
    dask fuses with the reduction after it; past ``LIGHT_FILE_TASKS`` each group has its own source."""
    from npydask.dataset import stacking
    from npydask.plan import grouping

    arrays = [np.full((16, 32), i, "<f4") + np.arange(32, dtype="<f4") for i in range(12)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i:02d}.npy", a if i % 3 else np.asfortranarray(a))
    ds = npydask.open_dataset(tmp_path)
    plan = grouping.GroupPlan(tuple((a, a + 3) for a in range(0, 12, 3)), (((3,), (16,), (32,)),) * 4)
    x = stacking.join(ds.views, plan, axis=0, stacked=True)
    assert x.chunks == ((3, 3, 3, 3), (16,), (32,))
    tasks = dict(x.__dask_graph__())
    assert len(tasks) == 4 and len({k[0] for k in tasks}) == 1  # one source, one name
    assert all(len(pickle.dumps(t)) > 12 * 40 for t in tasks.values())  # (every file in each)
    assert_eq(x, np.stack(arrays), check_chunks=True)
    assert float(x.sum().compute()) == pytest.approx(float(np.stack(arrays).sum()), rel=1e-6)

    monkeypatch.setattr(stacking, "LIGHT_FILE_TASKS", 12 * 4 - 1)  # one file-task over: a source per group
    y = stacking.join(ds.views, plan, axis=0, stacked=True)
    reads = {k: t for k, t in dict(y.__dask_graph__()).items() if "getter" in repr(t)}
    assert len(reads) == 4 and len({k[0] for k in reads}) == 4  # a source (and a name) per group
    assert all(len(pickle.dumps(t)) < len(pickle.dumps(next(iter(tasks.values())))) for t in reads.values())
    assert_eq(y, np.stack(arrays), check_chunks=True)
    # each read fuses with its partial sum only without the concatenate step: fewer tasks to schedule
    (one,), (grouped,) = dask.optimize(x.sum()), dask.optimize(y.sum())
    assert len(dict(one.__dask_graph__())) < len(dict(grouped.__dask_graph__()))


@pytest.mark.parametrize("order", ["C", "F"])
def test_stack_large_files_get_several_chunks_never_spanning_files(tmp_path, order):
    arrays = []
    for i in range(3):
        a = np.arange(1024 * 1024, dtype="f4").reshape(1024, 1024) * (i + 1)  # 4 MiB
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if order == "F" else a)
        arrays.append(a)
    with dask.config.set({"array.chunk-size": "1MiB"}):
        ds = npydask.open_dataset(tmp_path)
        x = ds.stack()
        assert x.chunks[0] == (1, 1, 1)
        assert x.numblocks[1] * x.numblocks[2] >= 4
        # chunks are contiguous in the file: whole rows (C) or whole columns (F)
        assert x.chunks[2 if order == "C" else 1] == (1024,)
        assert all(c * 1024 * 4 <= 1 << 20 for c in x.chunks[1 if order == "C" else 2])
        assert_eq(x, np.stack(arrays), check_chunks=True)
        y = ds.concatenate(axis=0)
        assert _chunk_edges([1024] * 3) <= _chunk_edges(y.chunks[0])
        assert len(y.chunks[0]) >= 12
        assert_eq(y, np.concatenate(arrays), check_chunks=True)
        z = ds.concatenate(axis=1)
        assert _chunk_edges([1024] * 3) <= _chunk_edges(z.chunks[1])
        assert_eq(z, np.concatenate(arrays, axis=1), check_chunks=True)


def test_mixed_small_and_large_files_never_share_a_chunk(tmp_path):
    lengths = [2, 3, 300, 1, 1, 600, 4]  # rows of 1 KiB: files of 2 KiB .. 600 KiB
    arrays = []
    for i, n in enumerate(lengths):
        a = np.arange(n * 256, dtype="i4").reshape(n, 256) + 1000 * i
        np.save(tmp_path / f"{i}.npy", a)
        arrays.append(a)
    with dask.config.set({"array.chunk-size": "256KiB"}):
        ds = npydask.open_dataset(tmp_path)
        y = ds.concatenate()
        edges = _chunk_edges(y.chunks[0])
        file_edges = np.cumsum([0, *lengths]).tolist()
        # the large files (>= 32 KiB) start and end on chunk edges; the small ones may share
        for k in (2, 5):
            assert file_edges[k] in edges and file_edges[k + 1] in edges
        assert max(y.chunks[0]) <= 256
        assert_eq(y, np.concatenate(arrays), check_chunks=True)


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_stack_gives_two_tasks_per_thread_beyond_a_few_mib(tmp_path, threads):
    arrays = []
    for i in range(8):
        a = np.full((512, 1024), i, "f4")  # 2 MiB each, 16 MiB in all
        np.save(tmp_path / f"{i}.npy", a)
        arrays.append(a)
    ds = npydask.open_dataset(tmp_path)
    with dask.config.set(num_workers=threads):  # what dask's threaded scheduler runs
        x = ds.stack()
        y = ds.concatenate(axis=1)
    assert math.prod(x.numblocks) >= 2 * threads
    assert_eq(x, np.stack(arrays), check_chunks=True)
    assert math.prod(y.numblocks) >= 2 * threads
    assert_eq(y, np.concatenate(arrays, axis=1), check_chunks=True)


def test_small_files_grouped_with_roi(tmp_path):
    arrays = write_folder(tmp_path, [(6, 7)] * 200, "u2", "mixed", name="{:04d}.npy")
    ds = npydask.open_dataset(tmp_path, roi_start=[-1, 2], roi_shape=[4, 4], out_of_bounds_policy="pad", fill_value=7)
    x = ds.stack()
    assert math.prod(x.numblocks) < 10
    assert_eq(x, np.stack([roi_expected(a, [(-1, 3), (2, 6)], "pad", 7) for a in arrays]), check_chunks=True)


@pytest.mark.parametrize(
    "chunks",
    [(3, 5, 4), (1, -1, -1), (8, 1, 1), ((2, 3, 3), (10,), (4, 6)), 4, -1, "auto", "2KiB", (5, "auto", -1)],
)
def test_stack_explicit_chunks(tmp_path, chunks):
    arrays = write_folder(tmp_path, [(10, 10)] * 8, "<f8", "mixed")
    ds = npydask.open_dataset(tmp_path)
    x = ds.stack(chunks=chunks)
    if not isinstance(chunks, str) and chunks != -1 and "auto" not in (chunks if isinstance(chunks, tuple) else ()):
        assert x.chunks == da.core.normalize_chunks(chunks, (8, 10, 10), dtype="f8")
    assert_eq(x, np.stack(arrays), check_chunks=True)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("chunks", [(7, 4, 3), (2, 1, 3), (-1, 2, -1), 5, "1KiB", None])
def test_concatenate_explicit_chunks(tmp_path, axis, chunks):
    rng = np.random.default_rng(abs(axis))
    lengths = [3, 7, 1, 12, 5]
    arrays = []
    for i, n in enumerate(lengths):
        shape = [4, 6, 5]
        shape[axis] = n
        a = rng.standard_normal(shape).astype(">f4")
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if i % 2 else a)
        arrays.append(a)
    ds = npydask.open_dataset(tmp_path)
    x = ds.concatenate(axis=axis, chunks=chunks)
    expected = np.concatenate(arrays, axis=axis)
    if isinstance(chunks, tuple) or isinstance(chunks, int):
        assert x.chunks == da.core.normalize_chunks(chunks, expected.shape, dtype=expected.dtype)
    assert_eq(x, expected, check_chunks=True)


@pytest.mark.parametrize("dtype", [">f4", ">i8", "<u2", ">c8", "|b1"])
def test_joins_have_numpy_dtype_however_grouped(tmp_path, dtype):
    """ds[i] keeps the file's dtype (as np.load); stack/concatenate give np.stack's (native byte order)."""
    arrays = [(np.arange(64 * 32) % 7 + i).reshape(64, 32).astype(dtype) for i in range(6)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if i % 2 else a)
    ds = npydask.open_dataset(tmp_path)
    assert ds.dtype == np.dtype(dtype) and ds.dtype.str == np.dtype(dtype).str
    assert ds[0].dtype.str == np.dtype(dtype).str and ds[0].compute().dtype.str == np.dtype(dtype).str
    want = np.stack(arrays)
    for size in ["128MiB", "8KiB"]:  # one group; a group per file
        with dask.config.set({"array.chunk-size": size}):
            joins = [
                (ds.stack(), want),
                (ds.concatenate(axis=1), np.concatenate(arrays, axis=1)),
                (ds.stack(chunks=(4, 64, 32)), want),
                (ds.concatenate(chunks=(100, 7)), np.concatenate(arrays)),
            ]
            for x, e in joins:
                assert x.dtype.str == e.dtype.str, (size, x.dtype, e.dtype)
                assert_eq(x, e, check_chunks=True)


def test_ragged_stack_names_two_shapes(folder):
    root, _ = folder
    ds = npydask.open_dataset(root)
    with pytest.raises(ValueError, match=r"00\.npy.*\(10, 10\).*01\.npy.*\(12, 10\)"):
        ds.stack()
    with pytest.raises(ValueError, match=r"\(10, 10\).*\(10, 12\)"):
        ds[[0, 2]].stack(chunks=(1, 1, 1))
    assert_eq(ds[[0, 4]].concatenate(axis=1), np.concatenate([np.load(ds.files[0]), np.load(ds.files[4])], axis=1))
    with pytest.raises(ValueError, match="axis 2"):
        ds.concatenate(axis=2)
    with pytest.raises(ValueError, match="axis"):
        ds.concatenate(axis=-3)


@pytest.mark.parametrize("order", ["C", "F", "mixed"])
def test_concatenate_slabs(tmp_path, order):
    rng = np.random.default_rng(7)
    lengths = [5, 1, 9, 3, 13, 2]
    arrays = write_folder(tmp_path, [(n, 6, 4) for n in lengths], "<i2", order)
    ds = npydask.open_dataset(tmp_path)
    assert_eq(ds.concatenate(), np.concatenate(arrays), check_chunks=True)
    assert_eq(ds.concatenate(axis=-3), np.concatenate(arrays), check_chunks=True)
    assert_eq(ds[::-1].concatenate(), np.concatenate(arrays[::-1]), check_chunks=True)
    # with a ROI that keeps the slabs ragged along axis 0 only
    roi = npydask.open_dataset(
        tmp_path, roi_start=[1, -1], roi_end=[5, 3], roi_axes=[1, 2], out_of_bounds_policy="pad", fill_value=-9
    )
    expected = [roi_expected(a, [(0, a.shape[0]), (1, 5), (-1, 3)], "pad", -9) for a in arrays]
    assert_eq(roi.concatenate(), np.concatenate(expected), check_chunks=True)
    assert_eq(roi.concatenate(chunks=(4, 2, 2)), np.concatenate(expected), check_chunks=True)
    # slabs along the last axis, cut by a relative ROI on axis 0
    arrays = write_folder(tmp_path / "cols", [(6, 4, n) for n in lengths], "<i2", order, seed=int(rng.integers(99)))
    ds = npydask.open_dataset(tmp_path / "cols", rel_roi_start=[0.25], rel_roi_end=[0.75], roi_axes=[0])
    expected = [a[2:5] for a in arrays]  # 0.25 * 6 = 1.5 -> 2, 0.75 * 6 = 4.5 -> 5
    assert_eq(ds.concatenate(axis=-1), np.concatenate(expected, axis=-1), check_chunks=True)
    assert_eq(ds.concatenate(axis=2), np.concatenate(expected, axis=2), check_chunks=True)
    with pytest.raises(ValueError, match="axis 0"):
        ds.concatenate(axis=0)


def test_concatenate_trimmed_to_empty(tmp_path):
    arrays = write_folder(tmp_path, [(3, 4), (6, 4), (2, 4)], "f4", "mixed")
    ds = npydask.open_dataset(tmp_path, roi_start=[3], roi_end=[5], roi_axes=[0], out_of_bounds_policy="trim_to_shape")
    assert ds.shapes == [(0, 4), (2, 4), (0, 4)]
    assert_eq(ds.concatenate(), arrays[1][3:5], check_chunks=True)
    empty = npydask.open_dataset(tmp_path, roi_start=[1, 2], roi_end=[1, 2])
    assert_eq(empty.stack(), np.zeros((3, 0, 0), "f4"), check_chunks=True)
    assert_eq(empty.concatenate(axis=1), np.zeros((0, 0), "f4"), check_chunks=True)


_lengths = st.lists(st.integers(0, 6), min_size=1, max_size=6)


@given(
    lengths=_lengths,
    axis=st.integers(-2, 1),
    fortran=st.lists(st.booleans(), min_size=6, max_size=6),
    chunks=st.one_of(
        st.none(),
        st.sampled_from(["16B", "64B", "1KiB"]),
        st.tuples(st.integers(1, 9), st.integers(1, 4)),
        st.integers(1, 5),
    ),
    start=st.integers(-2, 2),
)
def test_joins_match_numpy_property(lengths, axis, fortran, chunks, start):
    """Random slab lengths, orders, ROIs and chunks: concatenate and stack equal numpy, chunk for chunk."""
    with tempfile.TemporaryDirectory() as root:
        arrays = []
        for i, n in enumerate(lengths):
            shape = [3, 3]
            shape[axis] = n
            a = np.arange(math.prod(shape), dtype="<i4").reshape(shape) + 100 * i
            np.save(os.path.join(root, f"{i}.npy"), np.asfortranarray(a) if fortran[i] else a)
            arrays.append(a)
        other = 1 - axis % 2
        ds = npydask.open_dataset(
            root, roi_start=[start], roi_shape=[2], roi_axes=[other], out_of_bounds_policy="pad", fill_value=-1
        )
        bounds = [(0, 3), (0, 3)]
        bounds[other] = (start, start + 2)
        expected = []
        for a in arrays:
            b = list(bounds)
            b[axis % 2] = (0, a.shape[axis % 2])
            expected.append(roi_expected(a, b, "pad", -1))
        assert_eq(ds.concatenate(axis=axis, chunks=chunks), np.concatenate(expected, axis=axis), check_chunks=True)
        same = [e for e in expected if e.shape == expected[0].shape]
        if len(same) == len(expected):
            stacked_chunks = chunks if not isinstance(chunks, tuple) else (chunks[0], chunks[1], 2)
            assert_eq(ds.stack(chunks=stacked_chunks), np.stack(expected), check_chunks=True)


# ==========================================================================
# A distributed cluster of processes


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as c,
    ):
        yield c


def test_distributed_roi_pad_stack(client, tmp_path):
    arrays = write_folder(tmp_path, SHAPES, "u1", "mixed", seed=5)
    root = str(tmp_path)
    bounds = [(-3, 9), (2, 14)]
    ds = npydask.open_dataset(root, roi_start=[-3, 2], roi_end=[9, 14], out_of_bounds_policy="pad", fill_value=10)
    expected = np.stack([roi_expected(a, bounds, "pad", 10) for a in arrays])
    for x in (ds.stack(), ds.stack(chunks=(3, 5, 4))):
        got = client.compute(x, sync=True)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    shard = npydask.open_dataset(root, roi_start=[[i, 0] for i in range(8)], roi_shape=[3, 3], shard_id=1, num_shards=2)
    got = client.compute(shard.stack(), sync=True)
    np.testing.assert_array_equal(got, np.stack([a[i : i + 3, :3] for i, a in list(enumerate(arrays))[4:]]))


def test_distributed_concatenate_and_ragged_arrays(client, tmp_path):
    lengths = [4, 9, 1, 6]
    arrays = write_folder(tmp_path, [(n, 5) for n in lengths], ">f8", "mixed")
    ds = npydask.open_dataset(tmp_path)
    got = client.compute(ds.concatenate(chunks=(3, 2)), sync=True)
    np.testing.assert_array_equal(got, np.concatenate(arrays))
    total = client.compute(ds.concatenate().sum(), sync=True)
    assert np.isclose(total, np.concatenate(arrays).sum())
    trimmed = npydask.open_dataset(tmp_path, roi_start=[2, 1], roi_end=[7, 9], out_of_bounds_policy="trim_to_shape")
    parts = client.compute(trimmed.arrays(), sync=True)
    for got, a in zip(parts, arrays):
        np.testing.assert_array_equal(got, a[2:7, 1:9])
    pickle.loads(pickle.dumps(ds))  # a dataset travels too
    futures = client.map(lambda d, i: d[i].compute(scheduler="sync"), [ds] * len(ds), range(len(ds)))
    for got, a in zip(client.gather(futures), arrays):
        np.testing.assert_array_equal(got, a)


def test_distributed_changed_file_fails_on_the_worker(client, tmp_path):
    write_folder(tmp_path, [(3, 3)] * 3, "f4", "C")
    ds = npydask.open_dataset(tmp_path)
    np.save(tmp_path / "test_02.npy", np.zeros((4, 4), "f4"))
    with pytest.raises(npydask.FileChangedError, match=r"test_02\.npy"):
        client.compute(ds.stack(), sync=True)


@pytest.mark.parametrize("roi", [False, True], ids=["whole", "roi"])
@pytest.mark.parametrize("how", ["rewrite", "touch", "replace", "delete"])
def test_plain_stacked_reads_check_the_file_too(tmp_path, how, roi):
    """Groups of small files read on short paths (whole files, strided ROIs): still identity-checked."""
    for i in range(6):
        np.save(tmp_path / f"{i}.npy", np.full((4, 5), i, "f4"))
    ds = npydask.open_dataset(tmp_path, **({"roi_start": (1, 1), "roi_shape": (2, 3)} if roi else {}))
    x = ds.stack()
    assert all(n > 1 for n in x.chunks[0])  # groups of several files: the short paths
    target = tmp_path / "3.npy"
    if how == "rewrite":
        np.save(target, np.full((4, 5), 9, "f4"))
        st = os.stat(target)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    elif how == "touch":
        st = os.stat(target)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    elif how == "replace":
        np.save(tmp_path / "tmp.npy", np.full((4, 5), 9, "f4"))
        os.replace(tmp_path / "tmp.npy", target)
    else:
        os.remove(target)
    error = FileNotFoundError if how == "delete" else npydask.FileChangedError
    with pytest.raises(error, match=r"3\.npy"):
        x.compute()


@pytest.mark.parametrize("backend", ["auto", "pread", "mmap"])
def test_stacked_rois_equal_numpy_on_every_path(tmp_path, backend):
    """In-file ROIs of C files take the short strided path; Fortran, swapped and padded ones the general one."""
    rng = np.random.default_rng(7)
    arrays = [rng.random((9, 10, 11)).astype("<f4") for _ in range(12)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i:02d}.npy", np.asfortranarray(a) if i % 4 == 1 else a)
    roi = (slice(2, 7), slice(1, 9), slice(3, 6))
    with npydask.config.set(gap_bytes=0):  # every run its own read too
        for gap in (0, 4096):
            with npydask.config.set(gap_bytes=gap):
                ds = npydask.open_dataset(tmp_path, roi_start=(2, 1, 3), roi_end=(7, 9, 6), backend=backend)
                x = ds.stack(chunks=(4, 5, 8, 3))
                for _ in range(2):  # the second time through cached pieces of the scratch
                    assert_eq(x, np.stack([a[roi] for a in arrays]))
    padded = npydask.open_dataset(
        tmp_path, roi_start=(-1, 1, 3), roi_end=(7, 9, 12), out_of_bounds_policy="pad", fill_value=-1, backend=backend
    ).stack(chunks=(4, 8, 8, 9))
    want = np.full((12, 8, 8, 9), -1, "<f4")
    for i, a in enumerate(arrays):
        want[i, 1:, :, :8] = a[0:7, 1:9, 3:11]
    assert_eq(padded, want)


def test_tuple_index_is_refused_as_ambiguous(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"{i}.npy", np.zeros(2))
    ds = npydask.open_dataset(tmp_path)
    with pytest.raises(TypeError, match="list"):
        ds[1, 2]
    assert ds[[1, 2]].files == ds.files[1:]


# --------------------------------------------------------------------------
# An index= or file_list= path that is a FIFO is refused at once, never waited on


def refused_without_blocking(fifo, call) -> BaseException:
    """Run ``call`` in a thread; if it blocks on ``fifo``, unblock it (a writer that closes) and fail."""
    import threading

    box: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            box.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # a reader is waiting: this opens, then EOF
        os.close(fd)
        t.join(10)
        pytest.fail(f"{fifo} blocked the call for 10 s")
    assert box and box[0] is not None, "the FIFO was accepted"
    return box[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
@pytest.mark.parametrize("which", ["index", "file_list", "file_list-with-root"])
def test_a_fifo_as_index_or_file_list_is_refused_without_blocking(tmp_path, which):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        np.save(data / f"{i}.npy", np.full((2, 3), i, "<i2"))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    if which == "index":
        call = lambda: npydask.open_dataset(data, index=fifo)  # noqa: E731
    elif which == "file_list":
        call = lambda: npydask.open_dataset(file_list=fifo)  # noqa: E731
    else:
        call = lambda: npydask.open_dataset(data, file_list=str(fifo))  # noqa: E731
    err = refused_without_blocking(fifo, call)
    assert isinstance(err, OSError) and str(fifo) in str(err) and "FIFO" in str(err), repr(err)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # left as it was


# --------------------------------------------------------------------------
# Empty files (or files empty after a ROI) add no zero-size chunks (issue 12, item 5)


def _no_empty_chunks(x: da.Array) -> None:
    """Every axis of extent > 0 has only non-empty chunks; an empty axis has the one chunk (0,), as dask."""
    for n, c in zip(x.shape, x.chunks):
        assert c == (0,) if n == 0 else 0 not in c, x.chunks


def _random_slices(rng: np.random.Generator, n: int, count: int, edges: Sequence[int] = ()) -> list[slice]:
    """``count`` random slices of an axis of ``n``, and slices starting at and around the file ``edges``."""
    picks = [slice(None, None, -1), slice(n - 1, None, -1), slice(300_000, None, -1), slice(None, None, -2)]
    picks += [slice(-n, None, -1), slice(-n - 1, None, 2)]  # (dask gets a start below -n wrong for step < 0)
    for e in edges:  # dask mishandled a negative step starting at a chunk edge followed by empty chunks
        picks += [slice(e, None, -1), slice(e - 1, None, -2), slice(e - n, None, -3), slice(e, 0, -1)]
    for _ in range(count):
        a, b = (int(v) if rng.random() < 0.85 else None for v in rng.integers(-n, n + 5, 2))
        step = int(rng.choice([-7, -3, -2, -1, 1, 2, 3, 5]))
        picks.append(slice(a, b, step))
    return picks


@pytest.mark.parametrize("chunk_size", ["256B", "1KiB", "128MiB"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_concatenate_ragged_folder_with_empty_files_slices_as_numpy(tmp_path, seed, chunk_size):
    rng = np.random.default_rng(seed)
    lengths = [int(rng.choice([0, 0, 1, 37, 300, 701])) for _ in range(9)]
    lengths[int(rng.integers(9))] = 0
    lengths[-1 if seed % 2 == 0 else 0] = 0  # an empty file at an end too
    arrays = [rng.integers(-1000, 1000, (n, 3)).astype("<i4") for n in lengths]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if i % 3 == 1 else a)
    expected = np.concatenate(arrays)
    with dask.config.set({"array.chunk-size": chunk_size}):
        variants = [
            npydask.open_dataset(tmp_path).concatenate(),
            npydask.open_dataset(tmp_path).concatenate(chunks=(64, 3)),
        ]
    for x in variants:
        _no_empty_chunks(x)
        assert_eq(x, expected, check_chunks=True)
        edges = np.cumsum(lengths).tolist()
        for s in _random_slices(rng, len(expected), 40, edges):
            np.testing.assert_array_equal(x[s].compute(), expected[s], err_msg=f"{s} of chunks {x.chunks}")
            np.testing.assert_array_equal(x[s, ::-1].compute(), expected[s, ::-1], err_msg=f"{s} of chunks {x.chunks}")


@pytest.mark.parametrize("chunk_size", ["256B", "128MiB"])
def test_rois_that_empty_files_add_no_empty_chunks(tmp_path, chunk_size):
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal((n, 4)).astype("<f8") for n in (90, 20, 150, 10, 64)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", a)
    # rows 30..130 of every file, trimmed: files of 20 and 10 rows come out empty
    with dask.config.set({"array.chunk-size": chunk_size}):
        ds = npydask.open_dataset(
            tmp_path, roi_start=[30], roi_shape=[100], roi_axes=[0], out_of_bounds_policy="trim_to_shape"
        )
        x = ds.concatenate()
        empty = ds[1]
    expected = np.concatenate([a[30:130] for a in arrays])
    _no_empty_chunks(x)
    assert empty.shape == (0, 4) and empty.chunks == ((0,), (4,))
    edges = np.cumsum([len(a[30:130]) for a in arrays]).tolist()
    for s in _random_slices(rng, len(expected), 60, edges):
        np.testing.assert_array_equal(x[s].compute(), expected[s], err_msg=f"{s} of chunks {x.chunks}")


def test_stack_of_empty_files_keeps_the_one_empty_chunk_of_its_empty_axis(tmp_path):
    arrays = [np.zeros((0, 5), "<f4") for _ in range(6)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", a)
    with dask.config.set({"array.chunk-size": "256B"}):
        x = npydask.open_dataset(tmp_path).stack()
        y = npydask.open_dataset(tmp_path).concatenate()
        z = npydask.open_dataset(tmp_path).concatenate(axis=1)
    for lazy, expected in ((x, np.stack(arrays)), (y, np.concatenate(arrays)), (z, np.concatenate(arrays, axis=1))):
        _no_empty_chunks(lazy)
        assert_eq(lazy, expected, check_chunks=True)
        np.testing.assert_array_equal(lazy[::-1].compute(), expected[::-1])
    single = npydask.from_npy(tmp_path / "0.npy")
    assert single.chunks == da.from_array(arrays[0]).chunks == ((0,), (5,))


@pytest.mark.parametrize("enabled", [True, False])
def test_open_dataset_leaves_the_garbage_collector_as_it_found_it(tmp_path, enabled):
    import gc

    np.save(tmp_path / "a.npy", np.arange(3))
    seen = []
    real = npydask.dataset.open.scan_headers

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())  # (paused while the per-file objects are built)
        return real(*args, **kwargs)

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        with pytest.MonkeyPatch.context() as m:
            m.setattr(npydask.dataset.open, "scan_headers", spy)
            npydask.open_dataset(tmp_path)
            assert gc.isenabled() is enabled and seen == [False]
            with pytest.raises(ValueError, match="no file found"):
                npydask.open_dataset(tmp_path, file_filter="*.none")
            assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_group_token_follows_every_identity_local_or_object(tmp_path):
    from npydask.array import NpyFileArray
    from npydask.dataset.stacking import group_token
    from npydask.reader import FileRef
    from npydask.storage.object import ObjectIdentity

    for i in range(3):
        np.save(tmp_path / f"{i}.npy", np.full(4, i, "<f4"))
    views = list(npydask.open_dataset(tmp_path).views)
    token = group_token(views)
    assert token == group_token(list(npydask.open_dataset(tmp_path).views))
    os.utime(tmp_path / "1.npy", ns=(1, 1))  # another mtime: another graph
    assert group_token(list(npydask.open_dataset(tmp_path).views)) != token
    assert group_token(list(npydask.open_dataset(tmp_path, headers="first").views)) != token

    def as_object(etag):  # (identities holding text take the repr path)
        return [NpyFileArray(v.ref._replace(identity=ObjectIdentity(100, etag))) for v in views]

    assert group_token(as_object("e1")) == group_token(as_object("e1")) != group_token(as_object("e2"))
    assert isinstance(views[0].ref, FileRef)


def test_dataset_pickles_its_rows_compactly(tmp_path):
    arrays = [np.full((3, 2), i, "<i4") for i in range(1500)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i:05d}.npy", a)
    ds = npydask.open_dataset(tmp_path)
    whole, part = len(pickle.dumps(ds, protocol=5)), len(pickle.dumps(ds[100:200], protocol=5))
    assert whole / len(ds) < 80  # (a view per file pickled at ~114 B/file)
    assert part < whole / 5  # a slice ships only its own rows
    back = pickle.loads(pickle.dumps(ds[[7, 1400, 7]], protocol=5))
    assert back.files == [ds.files[7], ds.files[1400], ds.files[7]] and back.start_index is None
    np.testing.assert_array_equal(back.stack().compute(), np.stack([arrays[7], arrays[1400], arrays[7]]))
    assert repr(ds).count(str(tmp_path)) == 2  # first and last file named once each


# -- on_error="skip" ----------------------------------------------------------------------------


def _folder_with_bad_files(root):
    """Files 0..9 as ``f{i:02d}.npy`` holding ``i``; 2 is garbage, 5 a truncated header, 7 an object array."""
    for i in range(10):
        np.save(root / f"f{i:02d}.npy", np.full((3, 4), i, "i4"))
    (root / "f02.npy").write_bytes(b"not an array at all")
    (root / "f05.npy").write_bytes((root / "f05.npy").read_bytes()[:20])
    np.save(root / "f07.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    return [0, 1, 3, 4, 6, 8, 9]


def test_on_error_skip_leaves_out_bad_headers_in_one_warning(tmp_path):
    kept = _folder_with_bad_files(tmp_path)
    with pytest.raises(npydask.NpyFormatError, match=r"f02\.npy"):
        npydask.open_dataset(tmp_path)  # (the default raises)
    with pytest.warns(NpyDaskWarning) as record:
        ds = npydask.open_dataset(tmp_path, on_error="skip")
    assert len(record) == 1 and record[0].filename == __file__
    message = str(record[0].message)
    assert "left out 3 of 10 files" in message and "ds.skipped" in message
    for i in (2, 5, 7):
        assert str(tmp_path / f"f{i:02d}.npy") in message
    assert ds.files == [str(tmp_path / f"f{i:02d}.npy") for i in kept]
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([np.full((3, 4), i, "i4") for i in kept]))
    assert [s.path for s in ds.skipped] == [str(tmp_path / f"f{i:02d}.npy") for i in (2, 5, 7)]
    assert all(isinstance(s, Skipped) and s.reason.startswith("NpyFormatError: ") for s in ds.skipped)
    assert "magic" in ds.skipped[0].reason and "object" in ds.skipped[2].reason
    assert str(tmp_path) not in ds.skipped[0].reason  # (the path is said once, in .path)
    with pytest.raises(AttributeError):
        ds.skipped[0].reason = "x"  # (frozen)
    again = pickle.loads(pickle.dumps(ds))
    assert again.skipped == ds.skipped and again.files == ds.files
    assert ds[1:3].skipped == ds.skipped and ds.shard(0, 2).skipped == ds.skipped
    assert npydask.open_dataset(tmp_path, file_filter="f0[01].npy", on_error="skip").skipped == ()  # (no warning)


def test_on_error_skip_missing_and_special_files_of_a_list(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(3))
    os.mkdir(tmp_path / "sub")
    with pytest.warns(NpyDaskWarning, match="left out 2 of 3"):
        ds = npydask.open_dataset(tmp_path, files=["nope.npy", "a.npy", "sub"], on_error="skip")
    assert ds.files == [str(tmp_path / "a.npy")]
    assert [s.path for s in ds.skipped] == [str(tmp_path / "nope.npy"), str(tmp_path / "sub")]
    assert ds.skipped[0].reason.startswith("FileNotFoundError")
    assert isinstance(ds.skipped[1].reason, str) and ds.skipped[1].reason


def test_on_error_skip_removes_files_before_sharding_keeping_their_roi_rows(tmp_path):
    kept = _folder_with_bad_files(tmp_path)
    starts = [[i % 3, i % 4] for i in range(10)]  # one row per file of the whole list, bad files included
    rows = {i: np.full((3, 4), i, "i4")[s0:, s1:] for i, (s0, s1) in enumerate(starts)}
    with pytest.warns(NpyDaskWarning):
        whole = npydask.open_dataset(tmp_path, roi_start=starts, on_error="skip")
    assert [a.compute().tolist() for a in whole.arrays()] == [rows[i].tolist() for i in kept]
    got = []
    for k in range(3):
        with pytest.warns(NpyDaskWarning, match="left out 3 of 10"):  # (every shard reads every header)
            shard = npydask.open_dataset(tmp_path, roi_start=starts, shard_id=k, num_shards=3, on_error="skip")
        lo, hi = len(kept) * k // 3, len(kept) * (k + 1) // 3
        assert shard.files == whole.files[lo:hi] and shard.start_index == lo and shard.sharding == (k, 3)
        assert len(shard.skipped) == 3
        got += [a.compute().tolist() for a in shard.arrays()]
    assert got == [rows[i].tolist() for i in kept]


def test_on_error_skip_keeps_other_errors_and_refuses_what_it_cannot_keep(tmp_path):
    kept = _folder_with_bad_files(tmp_path)
    np.save(tmp_path / f"f{kept[-1]:02d}.npy", np.zeros((3, 4), "f8"))  # another dtype: not a header failure
    with pytest.raises(ValueError, match="one dtype"), pytest.warns(NpyDaskWarning):
        npydask.open_dataset(tmp_path, on_error="skip")
    with pytest.raises(npydask.RoiError), pytest.warns(NpyDaskWarning):
        npydask.open_dataset(tmp_path, file_filter="f0[0-5].npy", roi_start=[5, 0], on_error="skip")
    with pytest.raises(ValueError, match="headers='first'"):
        npydask.open_dataset(tmp_path, headers="first", on_error="skip")
    with pytest.raises(ValueError, match="index="):
        npydask.open_dataset(tmp_path, index=tmp_path / "index.json", on_error="skip")
    assert not (tmp_path / "index.json").exists()
    for bad in ("ignore", "Skip", None, True):
        with pytest.raises(ValueError, match=r"on_error must be 'raise'.*'skip'.*found " + re.escape(repr(bad))):
            npydask.open_dataset(tmp_path, on_error=bad)
    with pytest.raises(ValueError, match=r"left no file.*f02\.npy"):
        npydask.open_dataset(tmp_path, file_filter="f0[257].npy", on_error="skip")


def test_on_error_skip_names_at_most_twenty_files_in_the_warning(tmp_path):
    for i in range(25):
        (tmp_path / f"bad{i:02d}.npy").write_bytes(b"x")
    np.save(tmp_path / "ok.npy", np.arange(2))
    with pytest.warns(NpyDaskWarning, match="left out 25 of 26.*and 5 more") as record:
        ds = npydask.open_dataset(tmp_path, on_error="skip")
    assert "bad19.npy" in str(record[0].message) and "bad20.npy" not in str(record[0].message)
    assert len(ds.skipped) == 25 and ds.files == [str(tmp_path / "ok.npy")]


def test_a_prefix_warns_of_natural_order_and_skips_bad_objects(s3):  # noqa: F811
    space = s3.space()
    for i in (1, 2, 10):
        s3.put_npy(f"{space}/day_{i}.npy", np.full(3, i, "<i2"))
    s3.put(f"{space}/day_5.npy", b"not an array")
    with pytest.warns(NpyDaskWarning) as record:
        ds = npydask.open_dataset(f"s3://{space}/", storage_options=s3.options, on_error="skip")
    messages = [str(w.message) for w in record]
    assert len(messages) == 2 and all(w.filename == __file__ for w in record)
    assert "puts 'day_10.npy' before 'day_2.npy'" in messages[0]
    assert "left out 1 of 4" in messages[1] and f"s3://{space}/day_5.npy" in messages[1]
    assert ds.files == [f"s3://{space}/day_{i}.npy" for i in (1, 10, 2)]
    assert [s.path for s in ds.skipped] == [f"s3://{space}/day_5.npy"]
    with pytest.warns(NpyDaskWarning, match="left out 1 of 4"):  # (only the skip: natural order asked for)
        natural = npydask.open_dataset(f"s3://{space}", storage_options=s3.options, sort="natural", on_error="skip")
    np.testing.assert_array_equal(natural.stack().compute()[:, 0], [1, 2, 10])


def test_skipped_urls_show_no_query_string(tmp_path, http_server):
    np.save(tmp_path / "a.npy", np.arange(3))
    (tmp_path / "b.npy").write_bytes(b"garbage")
    server = http_server(tmp_path)
    urls = [server.url(n) + "?X-Amz-Signature=s1gn" for n in ("a.npy", "b.npy", "gone.npy")]
    with pytest.warns(NpyDaskWarning) as record:
        ds = npydask.open_dataset(files=urls, on_error="skip")
    shown = str(record[0].message) + repr(ds.skipped) + repr(ds)
    assert "s1gn" not in shown and "left out 2 of 3" in shown
    assert [s.path for s in ds.skipped] == [server.url("b.npy"), server.url("gone.npy")]
    assert ds.skipped[1].reason.startswith("FileNotFoundError")
    np.testing.assert_array_equal(ds[0].compute(), np.arange(3))


def test_on_error_skip_with_npz_members_skips_archives_missing_one(tmp_path):
    for i in range(6):
        members = {"x": np.full((2, 2), i), "y": np.arange(i + 1.0)}
        if i == 2:
            del members["y"]
        np.savez(tmp_path / f"p{i}.npz", **members)
    (tmp_path / "p4.npz").write_bytes(b"not a zip")
    with pytest.raises(KeyError, match="'y'"):
        npydask.open_dataset(tmp_path, file_filter="*.npz", key=["x", "y"])
    with pytest.warns(NpyDaskWarning, match=r"left out 2 of 6.*p2\.npz: KeyError.*p4\.npz: NpyFormatError"):
        both = npydask.open_dataset(tmp_path, file_filter="*.npz", key=["x", "y"], on_error="skip")
    assert both.files == [str(tmp_path / f"p{i}.npz") for i in (0, 1, 3, 5)]
    assert [s.path for s in both.skipped] == [str(tmp_path / "p2.npz"), str(tmp_path / "p4.npz")]
    samples = [{k: v.compute() for k, v in both[i].items()} for i in range(len(both))]
    for sample, i in zip(samples, (0, 1, 3, 5)):
        np.testing.assert_array_equal(sample["x"], np.full((2, 2), i))
        np.testing.assert_array_equal(sample["y"], np.arange(i + 1.0))
    with pytest.warns(NpyDaskWarning, match="left out 2 of 6"):
        shard = npydask.open_dataset(
            tmp_path, file_filter="*.npz", key=["x", "y"], on_error="skip", shard_id=1, num_shards=2
        )
    assert shard.files == both.files[2:] and shard.start_index == 2 and len(shard.skipped) == 2
    with pytest.warns(NpyDaskWarning, match="left out 1 of 6"):  # (one member: only the broken archive)
        xs = npydask.open_dataset(tmp_path, file_filter="*.npz", key="x", on_error="skip")
    np.testing.assert_array_equal(xs.stack()[:, 0, 0].compute(), [0, 1, 2, 3, 5])


@pytest.mark.parametrize("headers", ["all", "first"])
def test_sort_none_warns_once_for_every_listing_of_a_folder(tmp_path, headers):
    for rel in ["v2.npy", "v10.npy", "s2/a.npy", "s10/a.npy"]:
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        np.save(tmp_path / rel, np.zeros(2))
    for recursive in (False, True):
        with pytest.warns(NpyDaskWarning) as record:
            ds = npydask.open_dataset(tmp_path, headers=headers, recursive=recursive)
        assert len(record) == 1, [str(w.message) for w in record]
        assert ds.files == npydask.open_dataset(tmp_path, headers=headers, recursive=recursive, sort="bytes").files
    assert npydask.open_dataset(tmp_path, headers=headers, sort="natural").files == [
        str(tmp_path / r) for r in ["v2.npy", "v10.npy", "s2/a.npy", "s10/a.npy"]
    ]
