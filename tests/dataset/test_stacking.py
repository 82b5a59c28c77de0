"""Stacking over a dataset's table: table-slice groups, their tokens and pickles (the plans: test_grouping.py)."""

from __future__ import annotations

import os
import pickle

import dask
import numpy as np
import pytest

import npydask
from npydask.config import read_options
from npydask.dataset.stacking import FileGroup, table_token
from npydask.dataset.table import FileTable
from npydask.dataset.views import Context, FileViews
from npydask.format.header import NpyHeader
from npydask.storage.object import ObjectIdentity
from npydask.storage.where import resolve


def _folder(tmp_path, n, shape=(4, 5), dtype="<f4", fortran_every=0):
    arrays = []
    for i in range(n):
        a = np.random.default_rng(i).random(shape).astype(dtype)
        if fortran_every and i % fortran_every == 0:
            a = np.asfortranarray(a)
        np.save(tmp_path / f"{i:05d}.npy", a)
        arrays.append(a)
    return arrays


@pytest.mark.parametrize(("dtype", "shape"), [("<f4", (4, 5)), ("<i2", (3,)), ("u1", (2, 3, 2)), (">f8", (6,))])
def test_stack_over_table_slices_reads_as_numpy(tmp_path, dtype, shape):
    arrays = _folder(tmp_path, 257, shape, dtype, fortran_every=5 if len(shape) > 1 else 0)
    ds = npydask.open_dataset(tmp_path)
    for chunk in ["1KiB", "4KiB", "128MiB"]:
        with dask.config.set({"array.chunk-size": chunk}):
            x = ds.stack()
            np.testing.assert_array_equal(x.compute(), np.stack(arrays))
            np.testing.assert_array_equal(ds[7:200].stack()[3:150:7].compute(), np.stack(arrays[7:200])[3:150:7])
            np.testing.assert_array_equal(
                ds[[5, 3, 250, 5]].stack().compute(), np.stack([arrays[k] for k in (5, 3, 250, 5)])
            )


def test_stack_mixes_plain_rows_rois_and_other_layouts(tmp_path):
    arrays = _folder(tmp_path, 60, (6, 7), "<i4", fortran_every=4)
    ds = npydask.open_dataset(tmp_path, roi_start=[1, 2], roi_shape=[3, 4])
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays)[:, 1:4, 2:6])
    for backend in ["pread", "mmap"]:
        with dask.config.set({"array.chunk-size": "512B"}):
            got = npydask.open_dataset(tmp_path, roi_start=[1, 2], roi_shape=[3, 4], backend=backend).stack()
            np.testing.assert_array_equal(got.compute(), np.stack(arrays)[:, 1:4, 2:6])


def test_a_group_pickles_its_rows_compactly_and_reads_after_unpickling(tmp_path):
    arrays = _folder(tmp_path, 2000, (4, 4), "<f4")
    ds = npydask.open_dataset(tmp_path)
    whole = FileGroup(ds.views, 0, True)
    part = FileGroup(ds.views[1000:1500], 0, True)
    assert part.table.names is ds.table.names  # a slice, not a copy
    sent = len(pickle.dumps(part, protocol=5)) - len(pickle.dumps(FileGroup(ds.views[1000:1001], 0, True), protocol=5))
    assert sent / 499 < 60  # (a view per file pickled ~114 B/file)
    back = pickle.loads(pickle.dumps(part, protocol=5))
    assert len(back.table.names) < len(ds.table.names) / 3
    np.testing.assert_array_equal(back[0:500], np.stack(arrays[1000:1500]))
    np.testing.assert_array_equal(back[17:18, 1:3], np.stack(arrays[1017:1018])[:, 1:3])
    assert dask.base.tokenize(back) == dask.base.tokenize(part) != dask.base.tokenize(whole)


def test_a_changed_file_gives_another_graph_name(tmp_path):
    _folder(tmp_path, 30)
    name = npydask.open_dataset(tmp_path).stack().name
    assert npydask.open_dataset(tmp_path).stack().name == name
    os.utime(tmp_path / "00011.npy", ns=(1, 1))
    assert npydask.open_dataset(tmp_path).stack().name != name
    assert npydask.open_dataset(tmp_path, headers="first").stack().name != name


def test_table_token_of_presigned_urls_hashes_no_signature():
    url = "http://127.0.0.1:9/d/{}.npy?X-Amz-Signature={}&X-Amz-Credential=AKIA"
    source = resolve(url.format(0, "s"), None).source
    h = NpyHeader((1, 0), (3,), np.dtype("<f4"), False, 128, 12)
    context = Context(read_options(), "auto", None, source)

    def table(sig, etag="e"):
        paths = [url.format(i, sig) for i in range(4)]
        return FileTable.from_lists(paths, [ObjectIdentity(140, etag)] * 4, [h] * 4)

    redacted = FileTable.from_lists(
        [f"http://127.0.0.1:9/d/{i}.npy" for i in range(4)], [ObjectIdentity(140, "e")] * 4, [h] * 4
    )
    token = table_token(table("s1gn"), context)
    assert token == table_token(table("other"), context) == table_token(redacted, context)
    assert token != table_token(table("s1gn", "f"), context)  # the identity still counts
    assert dask.base.tokenize(FileGroup(FileViews(table("s1gn"), context), 0, True)) == dask.base.tokenize(
        FileGroup(FileViews(table("x"), context), 0, True)
    )
