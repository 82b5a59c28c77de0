"""Samples of several .npz members (``open_dataset(..., key=["x", "y"])``), checked against numpy.load."""

from __future__ import annotations

import io
import os

import dask
import numpy as np
import pytest
from _multikey import N, load_member, member_arrays, open_archives, write_archives

import npydask
from npydask.dataset.multikey import MultiKeyDataset
from npydask.storage import _handles


@pytest.fixture(params=["stored", "deflated"])
def archives(request, tmp_path):
    return write_archives(str(tmp_path), request.param == "deflated")


def test_stack_and_items_equal_numpy_load_of_each_member(archives):
    ds = open_archives(archives)
    assert isinstance(ds, MultiKeyDataset)
    assert len(ds) == N and ds.keys == ("x", "y", "m") and ds.files == archives
    assert ds.dtypes == {"x": np.dtype(">f4"), "y": np.dtype("<i8"), "m": np.dtype("u1")}
    stacked = ds.stack()
    assert set(stacked) == {"x", "y", "m"}
    (computed,) = dask.compute(stacked)
    for k in ds.keys:
        expected = np.stack([load_member(p, k) for p in archives])
        assert computed[k].shape == expected.shape
        np.testing.assert_array_equal(computed[k], expected)
    for i in (0, 5, -1):
        sample = ds[i]
        assert set(sample) == {"x", "y", "m"}
        for k, a in sample.items():
            got = a.compute()
            np.testing.assert_array_equal(got, load_member(archives[i], k))
            assert got.dtype == load_member(archives[i], k).dtype
    sub = ds[[3, 1]]
    assert isinstance(sub, MultiKeyDataset) and sub.files == [archives[3], archives[1]]
    np.testing.assert_array_equal(sub.stack()["m"].compute(), np.stack([load_member(archives[j], "m") for j in (3, 1)]))
    assert ds[2:4].files == archives[2:4]
    assert ds.shard(1, 3).files == archives[3:7] and ds.shard(1, 3).sharding == (1, 3)


def test_explicit_chunks_apply_to_every_member(archives):
    ds = open_archives(archives)
    got = ds.stack(chunks=3)
    assert got["x"].chunks[0] == (3, 3, 3, 2) and got["y"].chunks[0] == (3, 3, 3, 2)
    np.testing.assert_array_equal(got["x"].compute(), np.stack([load_member(p, "x") for p in archives]))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("shards", [1, 3])
def test_loader_epochs_give_dict_batches(archives, shuffle, shards):
    from npydask.loader import dataset_fingerprint

    ds = open_archives(archives)
    loaders = [
        npydask.Loader(ds, 4, shuffle=shuffle, seed=3, shard_id=k, num_shards=shards, with_index=True)
        for k in range(shards)
    ]
    orders = []
    for _epoch in range(2):
        seen = []
        for shard, loader in enumerate(loaders):
            mine = []
            for batch, idx in loader:
                assert set(batch) == {"x", "y", "m"}
                for k in ds.keys:
                    expected = np.stack([load_member(archives[i], k) for i in idx.tolist()])
                    np.testing.assert_array_equal(batch[k], expected)
                    assert batch[k].dtype == expected.dtype.newbyteorder("=")
                mine += idx.tolist()
            if not shuffle:
                assert mine == list(range(N * shard // shards, N * (shard + 1) // shards))
            seen += mine
        assert sorted(seen) == list(range(N))  # every sample once per epoch, over all shards
        orders.append(seen)
    assert (orders[0] != orders[1]) == shuffle
    plain = npydask.Loader(ds, 5, prefetch=0)
    assert [set(b) for b in plain] == [{"x", "y", "m"}] * 3
    assert dataset_fingerprint(ds) == dataset_fingerprint(ds[:])
    assert dataset_fingerprint(ds) != dataset_fingerprint(ds[::-1])


def test_members_of_different_shapes_per_file(tmp_path):
    paths = []
    for i in range(5):
        p = str(tmp_path / f"{i}.npz")
        np.savez(p, x=np.arange(i + 1, dtype="i2"), y=np.full((2, 2), i, "f8"))
        paths.append(p)
    ds = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "y"])
    with pytest.raises(ValueError, match="different shapes"):
        ds.stack()
    assert ds.shapes["x"] == [(i + 1,) for i in range(5)]
    batches = list(npydask.Loader(ds, 5))
    assert isinstance(batches[0]["x"], list) and batches[0]["y"].shape == (5, 2, 2)
    for i in range(5):
        np.testing.assert_array_equal(batches[0]["x"][i], np.load(paths[i])["x"])


def test_roi_and_pad_apply_to_every_member(tmp_path):
    paths = []
    for i in range(4):
        p = str(tmp_path / f"{i}.npz")
        np.savez(p, a=np.arange(30, dtype="f4").reshape(5, 6) + i, b=np.arange(12, dtype="i4").reshape(3, 4) - i)
        paths.append(p)
    ds = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["a", "b"], roi_start=[1, 2], roi_shape=[2, 2])
    got = ds.stack()
    np.testing.assert_array_equal(got["a"].compute(), np.stack([load_member(p, "a")[1:3, 2:4] for p in paths]))
    np.testing.assert_array_equal(got["b"].compute(), np.stack([load_member(p, "b")[1:3, 2:4] for p in paths]))
    padded = npydask.open_dataset(
        str(tmp_path),
        file_filter="*.npz",
        key=["a", "b"],
        roi_start=[2, 3],
        roi_shape=[4, 4],
        out_of_bounds_policy="pad",
        fill_value=-1,
    )
    for i, batch in enumerate(npydask.Loader(padded, 1)):
        for k in ("a", "b"):
            full = np.full((4, 4), -1, load_member(paths[i], k).dtype)
            src = load_member(paths[i], k)[2:6, 3:7]
            full[: src.shape[0], : src.shape[1]] = src
            np.testing.assert_array_equal(batch[k][0], full)
            np.testing.assert_array_equal(padded[i][k].compute(), full)


def test_an_roi_that_does_not_fit_a_member_names_it_and_the_file(tmp_path):
    for i in range(2):
        np.savez(str(tmp_path / f"{i}.npz"), big=np.zeros((8, 8)), small=np.zeros((2, 8)))
    with pytest.raises(ValueError, match="member 'small'") as e:
        npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["big", "small"], roi_start=[1, 0], roi_end=[5, 8])
    assert isinstance(e.value, npydask.RoiError)
    assert "member 'small'" in str(e.value) and "0.npz" in str(e.value)
    np.savez(str(tmp_path / "0.npz"), big=np.zeros((8, 8)), small=np.zeros(3))
    np.savez(str(tmp_path / "1.npz"), big=np.zeros((8, 8)), small=np.zeros(3))
    with pytest.raises(ValueError, match="member 'small'"):  # a ROI of the wrong rank, too
        npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["big", "small"], roi_start=[1, 0])


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [
        ([], ValueError, r"key=\[\] names no \.npz member"),
        (["x", "x"], ValueError, "names member 'x' twice"),
        (["x", "x.npy"], ValueError, "names member 'x' twice"),
        (["x", 3], TypeError, "found 3"),
        ({"x": 1}, TypeError, "a list of names"),
        (b"x", TypeError, "a list of names"),
    ],
)
def test_bad_key_lists_are_refused(archives, key, error, match):
    with pytest.raises(error, match=match):
        npydask.open_dataset(os.path.dirname(archives[0]), file_filter="*.npz", key=key)


def test_a_missing_member_lists_the_members(archives):
    with pytest.raises(KeyError, match=r"no member 'z' in the archive; its members are \['m', 'x', 'y'\]"):
        npydask.open_dataset(os.path.dirname(archives[0]), file_filter="*.npz", key=["x", "z"])


def test_mixed_dtypes_of_one_member_across_files_name_the_member(tmp_path):
    np.savez(str(tmp_path / "0.npz"), x=np.zeros(2, "f4"), y=np.zeros(2))
    np.savez(str(tmp_path / "1.npz"), x=np.zeros(2, "f8"), y=np.zeros(2))
    with pytest.raises(ValueError, match=r"1\.npz \(member 'x'\) holds float64"):
        npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "y"])


def _count_opens(monkeypatch) -> list[str]:
    """The paths ``open_regular`` opens from now on (the handle cache's and the scans' one way in)."""
    opened: list[str] = []
    real = _handles.open_regular
    monkeypatch.setattr(_handles, "open_regular", lambda path, *a, **kw: (opened.append(path), real(path, *a, **kw))[1])
    return opened


def test_open_reads_each_zip_directory_once_and_a_batch_opens_each_file_once(archives, monkeypatch):
    """At open: one open per archive for all members; reading a batch of all members: one open per archive."""
    opened = _count_opens(monkeypatch)
    _handles.clear_cache()
    ds = open_archives(archives)
    assert sorted(opened) == sorted(archives)  # 3 members, one open each
    opened.clear()
    _handles.clear_cache()
    batch = next(iter(npydask.Loader(ds, N, prefetch=0)))
    assert sorted(opened) == sorted(archives)
    np.testing.assert_array_equal(batch["m"], np.stack([load_member(p, "m") for p in archives]))
    opened.clear()
    _handles.clear_cache()
    dask.compute(ds.stack(), scheduler="sync")
    assert sorted(opened) == sorted(archives)


def test_a_rewritten_archive_is_not_read_through_a_siblings_descriptor(tmp_path):
    """A member's cached descriptor serves its siblings only at the same identity."""
    paths = write_archives(str(tmp_path), False, n=3)
    ds = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "y"])
    _handles.clear_cache()
    ds[0]["x"].compute()
    new = str(tmp_path / "new.npz")
    np.savez(new, x=np.ones((4, 6), ">f4"), y=np.int64(-1), m=np.zeros((3, 5, 2), "u1"))
    os.replace(new, paths[0])
    with pytest.raises(npydask.FileChangedError):
        ds[0]["y"].compute()
    fresh = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "y"])
    assert fresh[0]["y"].compute().item() == -1


def test_pickled_dataset_reads_the_same(archives):
    import pickle

    ds = pickle.loads(pickle.dumps(open_archives(archives)))
    np.testing.assert_array_equal(ds.stack()["y"].compute(), np.arange(N) * 7)


def test_torch_dataloader_collates_dicts(archives):
    torch = pytest.importorskip("torch")
    from npydask.torch import NpyIterableDataset, NpyMapDataset

    ds = open_archives(archives)
    for wrapped in (NpyIterableDataset(ds, with_index=True), NpyMapDataset(ds, with_index=True)):
        seen = []
        for batch, idx in torch.utils.data.DataLoader(wrapped, batch_size=4):
            assert set(batch) == {"x", "y", "m"}
            for k in ds.keys:
                expected = np.stack([load_member(archives[i], k) for i in idx.tolist()])
                np.testing.assert_array_equal(batch[k].numpy(), expected)
            seen += idx.tolist()
        assert sorted(seen) == list(range(N))
    sample = NpyMapDataset(ds)[3]
    assert sample["y"].item() == 21


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mapped", [False, True])
def test_torch_spawned_workers_collate_dicts(archives, mapped):
    torch = pytest.importorskip("torch")
    from npydask.torch import NpyIterableDataset, NpyMapDataset

    ds = open_archives(archives)
    wrapped = NpyMapDataset(ds, with_index=True) if mapped else NpyIterableDataset(ds, with_index=True)
    loader = torch.utils.data.DataLoader(
        wrapped,
        batch_size=3,
        num_workers=2,
        multiprocessing_context=torch.multiprocessing.get_context("spawn"),
        shuffle=mapped,
    )
    seen = []
    for batch, idx in loader:
        for k in ds.keys:
            expected = np.stack([load_member(archives[i], k) for i in idx.tolist()])
            np.testing.assert_array_equal(batch[k].numpy(), expected)
        seen += idx.tolist()
    assert sorted(seen) == list(range(N))


def test_torch_refuses_a_member_dtype_it_cannot_hold(tmp_path):
    pytest.importorskip("torch")
    from npydask.torch import NpyMapDataset

    np.savez(str(tmp_path / "0.npz"), x=np.zeros(2), s=np.array(["a"]))
    ds = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "s"])
    with pytest.raises(TypeError, match="torch tensors cannot hold dtype str32"):
        NpyMapDataset(ds)


def test_object_store_prefix(s3):
    root = s3.space()
    arrays = []
    for i in range(5):
        buf = io.BytesIO()
        members = member_arrays(i)
        (np.savez_compressed if i % 2 else np.savez)(buf, **members)
        s3.put(f"{root}/{i}.npz", buf.getvalue())
        arrays.append(members)
    ds = npydask.open_dataset(f"s3://{root}/", file_filter="*.npz", key=["x", "m"], storage_options=s3.options)
    got = ds.stack()
    for k in ("x", "m"):
        np.testing.assert_array_equal(got[k].compute(), np.stack([a[k] for a in arrays]))
    for batch, idx in npydask.Loader(ds, 2, shuffle=True, with_index=True):
        for k in ("x", "m"):
            np.testing.assert_array_equal(batch[k], np.stack([arrays[i][k] for i in idx.tolist()]))


@pytest.mark.timeout(300)
def test_threads_reading_members_while_archives_are_replaced_never_get_other_data(tmp_path):
    """Members share a descriptor only at one identity: a replaced archive fails the read, never mixes versions."""
    import threading

    n, rounds = 6, 60
    paths = [str(tmp_path / f"{i}.npz") for i in range(n)]

    def write(i: int, version: int) -> None:
        tmp = str(tmp_path / f"tmp{i}.npz")
        np.savez(tmp, x=np.full((64,), version * 100 + i, "i8"), y=np.full((3, 3), version * 100 + i, "f8"))
        os.replace(tmp, paths[i])

    for i in range(n):
        write(i, 0)
    ds = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "y"])
    bad: list[str] = []
    failures = [0]
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            i = int(np.random.default_rng().integers(n))
            try:
                batch = npydask.loader.read_batch({k: [d.views[i]] for k, d in ds.members.items()})
            except npydask.FileChangedError:
                failures[0] += 1
                continue
            for k in ("x", "y"):
                if not (batch[k] == i).all():  # the dataset was opened at version 0: only its data may come back
                    bad.append(f"{k} of {i}: {np.unique(batch[k])}")

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for version in range(1, rounds + 1):
            if version % 7 == 0:
                _handles.clear_cache()  # (readers then open afresh, at whatever identity the path has)
            write(version % n, version)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad, bad[:5]
    assert failures[0] > 0  # the replacements were seen


def test_members_share_the_archives_names_and_identities(tmp_path):
    for i in range(5):
        np.savez(tmp_path / f"{i}.npz", x=np.full((2, 3), i, "<f4"), y=np.array([i * i], "<i8"))
    ds = npydask.open_dataset(tmp_path, file_filter="*.npz", key=["x", "y"])
    tx, ty = ds.members["x"].table, ds.members["y"].table
    assert tx.names is ty.names and tx.ino is ty.ino and tx.size is ty.size
    assert tx.headers[0][0].shape == (2, 3) and ty.headers[0][0].shape == (1,)
    part = ds[1:4]
    assert part.members["x"].table.names is tx.names
    got = dask.compute(part.stack())[0]
    np.testing.assert_array_equal(got["x"], np.stack([np.full((2, 3), i, "<f4") for i in range(1, 4)]))
    np.testing.assert_array_equal(got["y"], np.array([[1], [4], [9]]))
