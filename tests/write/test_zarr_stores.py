"""npydask.zarr_store: the store to_zarr wrote through, to read it back with zarr, for every kind of place."""

from __future__ import annotations

import os
import pickle

import dask.array as da
import numpy as np
import pytest

import npydask
from npydask.storage.local import LOCAL
from npydask.storage.where import StoragePath, resolve
from npydask.write.zarr_store import where_to

zarr = pytest.importorskip("zarr")


def test_an_s3_round_trip_with_the_same_storage_options(s3):  # noqa: F811
    pytest.importorskip("obstore")
    url = f"s3://{s3.space()}/vol.zarr"
    a = np.random.default_rng(7).random((40, 30)).astype("f4")
    npydask.to_zarr(da.from_array(a, chunks=(10, 15)), url, storage_options=s3.options, shards=(20, 30))

    store = npydask.zarr_store(url, s3.options)
    assert isinstance(store, zarr.storage.ObjectStore)
    z = zarr.open_array(store, mode="r")
    np.testing.assert_array_equal(z[:], a)
    assert z.shards == (20, 30)
    np.testing.assert_array_equal(zarr.open_array(pickle.loads(pickle.dumps(store)), mode="r")[5:9, 3], a[5:9, 3])

    # the same store writes too (read_only=False, zarr's default), and to_zarr sees the change
    zarr.open_array(store, mode="r+")[0, :] = -1
    a[0, :] = -1
    np.testing.assert_array_equal(zarr.open_array(npydask.zarr_store(url, s3.options, read_only=True))[:], a)
    with pytest.raises(ValueError, match="read-only"):
        zarr.open_array(npydask.zarr_store(url, s3.options, read_only=True), mode="r+")[0, 0] = 5


def test_an_s3_url_without_credentials_is_refused_naming_it(s3):  # noqa: F811
    url = f"s3://{s3.space()}/vol.zarr"
    npydask.to_zarr(np.arange(6), url, storage_options=s3.options)
    others = dict(s3.options, access_key_id="nobody", secret_access_key="wrong")
    with pytest.raises(PermissionError, match=r"access denied .*/vol\.zarr/") as caught:
        zarr.open_array(npydask.zarr_store(url, others), mode="r")
    assert "wrong" not in str(caught.value)


def test_a_local_path_and_a_file_url(tmp_path):
    a = np.arange(24).reshape(4, 6)
    npydask.to_zarr(a, tmp_path / "a.zarr", chunks=(2, 3))
    for where in (tmp_path / "a.zarr", str(tmp_path / "a.zarr"), f"file://{tmp_path}/a.zarr"):
        store = npydask.zarr_store(where)
        assert isinstance(store, zarr.storage.LocalStore)
        np.testing.assert_array_equal(zarr.open_array(store, mode="r")[:], a)
    for refuse in (npydask.zarr_store, lambda p, so: npydask.to_zarr(a, p, storage_options=so)):
        with pytest.raises(ValueError, match="storage_options apply to object-store URLs.*local path"):
            refuse(tmp_path / "a.zarr", {"region": "x"})


def test_a_relative_path_is_the_one_to_zarr_wrote(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    npydask.to_zarr(np.arange(3), "rel.zarr")
    store = npydask.zarr_store("rel.zarr")
    monkeypatch.chdir(os.path.dirname(tmp_path))
    assert zarr.open_array(store, mode="r")[:].tolist() == [0, 1, 2]


def test_other_urls_go_to_fsspec():
    pytest.importorskip("fsspec")
    npydask.to_zarr(np.arange(5), "memory://npydask-zarr-store-test.zarr")
    store = npydask.zarr_store("memory://npydask-zarr-store-test.zarr")
    assert isinstance(store, zarr.storage.FsspecStore)
    assert zarr.open_array(store, mode="r")[:].tolist() == list(range(5))


def test_where_to_and_to_zarr_agree_on_places(tmp_path):
    """to_zarr resolves a path or URL as every read does (npydask.storage.where.resolve)."""
    for url, so in (("s3://b/p/a.zarr", {"region": "x"}), ("gs://b/a.zarr", None)):
        where = where_to(url, so)
        assert where == resolve(url, so) and where.path == url and not where.local
    assert where_to("a.zarr", None) == resolve("a.zarr") == StoragePath(LOCAL, os.path.abspath("a.zarr"))
    assert where_to(f"file://{tmp_path}/a.zarr", None) == StoragePath(LOCAL, f"{tmp_path}/a.zarr")
    assert where_to("memory://a", {"x": 1}) is None
