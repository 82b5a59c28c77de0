"""open_dataset / NpyDataset: DALI readers.numpy parity against numpy."""

from __future__ import annotations

import os

import numpy as np
import pytest

import npydask

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
    with pytest.raises(ValueError):
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
