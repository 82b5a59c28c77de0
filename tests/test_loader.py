"""The loader over real files: DALI batches, seeded shuffles, resume, prefetch, ragged, cluster."""

from __future__ import annotations

import math
import pickle
import re
import warnings

import numpy as np
import pytest

import npydask
from npydask.plan.sampling import epoch_batches


@pytest.fixture
def folder(tmp_path):
    """Ten files; file i holds i in every cell, so a batch names its files."""
    for i in range(10):
        np.save(tmp_path / f"{i:02d}.npy", np.full((2, 3), i, "<i4"))
    return tmp_path


def ids(batch):
    return batch[:, 0, 0].tolist()


def epoch(loader):
    return [ids(b) for b in loader]


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_dali_padding_table(folder, prefetch):
    ds = npydask.open_dataset(folder)
    got = [
        epoch(npydask.Loader(ds, 3, shard_id=k, num_shards=3, pad_last_batch=True, prefetch=prefetch)) for k in range(3)
    ]
    assert got == [[[0, 1, 2], [2, 2, 2]], [[3, 4, 5], [5, 5, 5]], [[6, 7, 8], [9, 9, 9]]]


def test_len_and_short_or_dropped_last_batch(folder):
    ds = npydask.open_dataset(folder)
    loader = npydask.Loader(ds, 4)
    assert len(loader) == 3 and epoch(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    dropping = npydask.Loader(ds, 4, drop_last=True)
    assert len(dropping) == 2 and epoch(dropping) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    padded = npydask.Loader(ds, 4, pad_last_batch=True)
    assert len(padded) == 3 and epoch(padded)[-1] == [8, 9, 9, 9]


def test_values_equal_numpy(folder):
    ds = npydask.open_dataset(folder)
    for batch, idx in npydask.Loader(ds, 4, shuffle=True, with_index=True):
        expected = np.stack([np.load(ds.files[i]) for i in idx])
        np.testing.assert_array_equal(batch, expected)
        assert batch.dtype == expected.dtype and batch.flags.writeable and batch.flags.c_contiguous


def test_epochs_advance_and_shuffles_differ_but_repeat(folder):
    ds = npydask.open_dataset(folder)
    loader = npydask.Loader(ds, 5, shuffle=True, seed=3)
    assert loader.epoch == 0
    first, second = epoch(loader), epoch(loader)
    assert loader.epoch == 2 and first != second
    assert sorted(sum(first, [])) == list(range(10)) == sorted(sum(second, []))
    again = npydask.Loader(ds, 5, shuffle=True, seed=3)
    assert epoch(again) == first  # same seed, same order, every run
    again.set_epoch(1)
    assert epoch(again) == second
    expected = [b.tolist() for b in epoch_batches(10, 5, epoch=1, shuffle=True, seed=3)]
    assert second == expected


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_shards_are_disjoint_within_each_epoch(folder, shards):
    ds = npydask.open_dataset(folder)
    loaders = [npydask.Loader(ds, 2, shuffle=True, shard_id=k, num_shards=shards) for k in range(shards)]
    for _ in range(3):
        seen = [i for loader in loaders for batch in epoch(loader) for i in batch]
        assert sorted(seen) == list(range(10))
    assert {loader.epoch for loader in loaders} == {3}


def test_resume_mid_epoch_yields_the_remaining_batches(folder):
    ds = npydask.open_dataset(folder)
    full = npydask.Loader(ds, 2, shuffle=True, seed=9)
    full.set_epoch(4)
    expected = epoch(full)
    loader = npydask.Loader(ds, 2, shuffle=True, seed=9, prefetch=3)
    loader.set_epoch(4)
    it = iter(loader)
    head = [ids(next(it)) for _ in range(2)]
    state = loader.state_dict()
    del it  # the training job dies here
    assert state["epoch"] == 4 and state["batches_done"] == 2
    fresh = npydask.Loader(ds, 2, shuffle=True, seed=9)
    fresh.load_state_dict(state)
    assert head + epoch(fresh) == expected
    assert fresh.epoch == 5 and fresh.state_dict()["batches_done"] == 0


def test_a_state_at_the_end_of_an_epoch_goes_on_with_the_next(folder):
    ds = npydask.open_dataset(folder)
    loader = npydask.Loader(ds, 5, shuffle=True)
    state = dict(loader.state_dict(), batches_done=2)
    loader.load_state_dict(state)
    expected = [b.tolist() for b in epoch_batches(10, 5, epoch=1, shuffle=True)]
    assert epoch(loader) == expected and loader.epoch == 2


def test_a_state_from_another_plan_is_refused(folder):
    ds = npydask.open_dataset(folder)
    state = npydask.Loader(ds, 2, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        npydask.Loader(ds, 2, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        npydask.Loader(ds, 3, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        npydask.Loader(ds, 2, seed=1).load_state_dict({"epoch": 1})
    with pytest.raises(ValueError, match="exceeds"):
        npydask.Loader(ds, 2, seed=1).load_state_dict(dict(state, batches_done=99))


def test_with_index_gives_dataset_indices(folder):
    ds = npydask.open_dataset(folder)
    out = list(npydask.Loader(ds, 3, with_index=True, shard_id=1, num_shards=2, pad_last_batch=True))
    assert [idx.tolist() for _, idx in out] == [[5, 6, 7], [8, 9, 9]]
    assert all(ids(b) == idx.tolist() for b, idx in out)


def test_ragged_batches_are_lists(tmp_path):
    for i, n in enumerate([3, 4, 4, 5]):
        np.save(tmp_path / f"{i}.npy", np.arange(n, dtype=">f8") + i)
    ds = npydask.open_dataset(tmp_path)
    batches = list(npydask.Loader(ds, 2, prefetch=2))
    assert isinstance(batches[0], list) and isinstance(batches[1], list)
    flat = [a for b in batches for a in b]
    for a, f in zip(flat, ds.files):
        np.testing.assert_array_equal(a, np.load(f))
        assert a.dtype == np.dtype("<f8") and a.flags.writeable  # native order, writable


def test_equal_shapes_after_roi_stack(tmp_path):
    for i, n in enumerate([6, 7, 8]):
        np.save(tmp_path / f"{i}.npy", np.arange(n * 4, dtype="<f4").reshape(n, 4))
    ds = npydask.open_dataset(tmp_path, roi_start=[1, 0], roi_shape=[4, 2])
    (batch,) = list(npydask.Loader(ds, 3))
    np.testing.assert_array_equal(batch, np.stack([np.load(f)[1:5, 0:2] for f in ds.files]))


def test_single_file_batches_are_writable_copies(folder):
    ds = npydask.open_dataset(folder, backend="mmap")
    for batch in npydask.Loader(ds, 1, prefetch=0):
        assert batch.flags.writeable
        batch[...] = -1  # never writes through to a mapping
    np.testing.assert_array_equal(np.load(ds.files[0]), np.zeros((2, 3), "<i4"))


def test_bad_arguments(folder):
    ds = npydask.open_dataset(folder)
    with pytest.raises(TypeError, match="NpyDataset"):
        npydask.Loader([1, 2], 2)
    with pytest.raises(ValueError, match="batch_size"):
        npydask.Loader(ds, 0)
    with pytest.raises(ValueError, match="shard_id"):
        npydask.Loader(ds, 2, shard_id=2, num_shards=2)
    with pytest.raises(ValueError, match="prefetch"):
        npydask.Loader(ds, 2, prefetch=-1)
    with pytest.raises(ValueError, match="device"):
        npydask.Loader(ds, 2, device="tpu")


def test_gpu_without_cupy_fails_at_construction(folder, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cupy" else real(name, *a))
    with pytest.raises(ImportError, match=r"npydask\[gpu-cu12\]"):
        npydask.Loader(npydask.open_dataset(folder), 2, device="gpu")


def test_repr_and_len(folder):
    loader = npydask.Loader(npydask.open_dataset(folder), 3, num_shards=2, shard_id=1)
    assert len(loader) == math.ceil(5 / 3)
    assert "shard 1/2" in repr(loader) and "batch_size=3" in repr(loader)


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.mark.timeout(180)
def test_batches_read_on_the_cluster_equal_local_ones(folder, client):
    ds = npydask.open_dataset(folder)
    local = npydask.Loader(ds, 3, shuffle=True, seed=5, shard_id=1, num_shards=2, pad_last_batch=True)
    remote = npydask.Loader(
        ds, 3, shuffle=True, seed=5, shard_id=1, num_shards=2, pad_last_batch=True, client=client, prefetch=2
    )
    for _ in range(2):
        a, b = list(local), list(remote)
        assert len(a) == len(b) == len(local)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
            assert y.flags.writeable


# -- DALI's stick_to_shard=False (issue 13, item 9) ----------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("pad", [False, True])
def test_without_stick_to_shard_shards_rotate_each_epoch(folder, shuffle, pad):
    ds = npydask.open_dataset(folder)
    shards = 3
    rotating = [
        npydask.Loader(
            ds, 2, shuffle=shuffle, seed=4, shard_id=k, num_shards=shards, stick_to_shard=False, pad_last_batch=pad
        )
        for k in range(shards)
    ]
    sticking = [
        npydask.Loader(ds, 2, shuffle=shuffle, seed=4, shard_id=k, num_shards=shards, pad_last_batch=pad)
        for k in range(shards)
    ]
    for e in range(4):
        own = [[i for b in epoch(loader) for i in b] for loader in sticking]
        lengths = [len(loader) for loader in rotating]
        got = [[i for b in epoch(loader) for i in b] for loader in rotating]
        assert got == [own[(k + e) % shards] for k in range(shards)]  # shard k reads shard k+e's range
        own_lengths = [len(loader) for loader in sticking]
        assert lengths == own_lengths[e % shards :] + own_lengths[: e % shards]
        assert sorted({i for part in got for i in part}) == list(range(10))  # disjoint shards cover the epoch
    first = npydask.Loader(ds, 2, shard_id=0, num_shards=shards, stick_to_shard=False)
    assert [sorted({i for e in range(shards) for b in epoch(first) for i in b})] == [list(range(10))]


def test_a_rotating_loader_resumes_in_its_epochs_shard(folder):
    ds = npydask.open_dataset(folder)
    full = npydask.Loader(ds, 1, shard_id=0, num_shards=3, stick_to_shard=False)
    full.set_epoch(2)
    expected = epoch(full)  # shard 2's range: four samples
    loader = npydask.Loader(ds, 1, shard_id=0, num_shards=3, stick_to_shard=False)
    loader.set_epoch(2)
    it = iter(loader)
    head = [ids(next(it)) for _ in range(3)]
    state = loader.state_dict()
    del it
    assert state["stick_to_shard"] is False and state["batches_done"] == 3
    fresh = npydask.Loader(ds, 1, shard_id=0, num_shards=3, stick_to_shard=False)
    fresh.load_state_dict(state)
    assert head + epoch(fresh) == expected == [[6], [7], [8], [9]]
    with pytest.raises(ValueError, match="stick_to_shard"):
        npydask.Loader(ds, 1, shard_id=0, num_shards=3).load_state_dict(state)


def test_sharding_in_open_dataset_and_the_loader_warns(folder):
    sharded = npydask.open_dataset(folder, shard_id=0, num_shards=2)
    with pytest.warns(npydask.NpyDaskWarning, match=r"already shard 0 of 2.*1/4 of the whole list"):
        loader = npydask.Loader(sharded, 1, shard_id=1, num_shards=2)
    assert len(loader) == 3  # what compounding gives: 5 files, then its second shard
    for again in (sharded[1:], sharded[[0, 2]], npydask.open_dataset(folder).shard(1, 2)):
        with pytest.warns(npydask.NpyDaskWarning, match="already shard"):
            npydask.Loader(again, 1, num_shards=2)
    import pickle

    assert pickle.loads(pickle.dumps(sharded)).sharding == (0, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        npydask.Loader(sharded, 1)  # the dataset's shard alone
        npydask.Loader(npydask.open_dataset(folder), 1, shard_id=1, num_shards=2)  # the loader's alone
        npydask.Loader(npydask.open_dataset(folder, num_shards=1), 1, num_shards=2)
    assert npydask.open_dataset(folder).sharding is None


# -- a state belongs to its dataset (issue 12) ---------------------------------------------------


def _other_folder(factory, names, shape=(2, 3)):
    root = factory.mktemp("other")
    for i, name in enumerate(names):
        np.save(root / name, np.full(shape, i, "<i4"))
    return root


def test_a_state_of_another_dataset_of_the_same_length_is_refused(folder, tmp_path_factory):
    ds = npydask.open_dataset(folder)
    state = npydask.Loader(ds, 2, shuffle=True).state_dict()
    others = {
        "names": npydask.open_dataset(_other_folder(tmp_path_factory, [f"x{i}.npy" for i in range(10)])),
        "order": ds[::-1],
        "shapes": npydask.open_dataset(_other_folder(tmp_path_factory, [f"{i:02d}.npy" for i in range(10)], (3, 2))),
        "roi": npydask.open_dataset(folder, roi_shape=[1, 3]),
    }
    for what, other in others.items():
        assert len(other) == len(ds)
        match = "file names" if what in ("names", "order") else "samples' dtype or shapes"
        with pytest.raises(ValueError, match=rf"another dataset of 10 files: its {match}"):
            npydask.Loader(other, 2, shuffle=True).load_state_dict(state)


def test_a_state_resumes_on_a_copy_of_the_files_elsewhere(folder, tmp_path_factory):
    import shutil

    ds = npydask.open_dataset(folder)
    loader = npydask.Loader(ds, 3, shuffle=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    copy = shutil.copytree(folder, tmp_path_factory.mktemp("elsewhere") / "copy")
    fresh = npydask.Loader(npydask.open_dataset(copy), 3, shuffle=True)
    fresh.load_state_dict(state)
    assert [b.tolist() for b in epoch_batches(10, 3, shuffle=True)][1:] == epoch(fresh)


def test_an_old_state_without_a_fingerprint_resumes_with_a_warning(folder):
    ds = npydask.open_dataset(folder)
    state = npydask.Loader(ds, 2).state_dict()
    old = {k: v for k, v in state.items() if k not in ("dataset_fingerprint", "stick_to_shard")}
    loader = npydask.Loader(ds, 2)
    with pytest.warns(npydask.NpyDaskWarning, match="no dataset fingerprint"):
        loader.load_state_dict(dict(old, batches_done=4))
    assert epoch(loader) == [[8, 9]]


def _refused(ds, other, match):
    """``other``'s loader refuses the state of ``ds``'s, naming ``match``; ``ds``'s own takes it."""
    loader = npydask.Loader(ds, 2, shuffle=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match=match):
        npydask.Loader(other, 2, shuffle=True).load_state_dict(state)
    fresh = npydask.Loader(ds, 2, shuffle=True)
    fresh.load_state_dict(state)
    assert len(list(fresh)) == 4


def test_a_state_of_the_same_files_at_other_roi_starts_is_refused(folder):
    ds = npydask.open_dataset(folder, roi_start=[0, 0], roi_shape=[1, 3])
    moved = npydask.open_dataset(folder, roi_start=[1, 0], roi_shape=[1, 3])
    assert moved.shapes == ds.shapes and moved.dtype == ds.dtype
    _refused(
        ds,
        moved,
        re.escape(
            "its ROIs differ (the state's: start (0, 0) end (1, 3) for every file; "
            "this dataset's: start (1, 0) end (2, 3) for every file)"
        ),
    )
    _refused(ds, npydask.open_dataset(folder, rel_roi_start=[0.5, 0], roi_shape=[1, 3]), "its ROIs differ")


def test_a_state_with_one_per_file_roi_moved_is_refused(folder):
    starts = [[0, 0]] * 10
    ds = npydask.open_dataset(folder, roi_start=starts, roi_shape=[1, 2])
    one_moved = npydask.open_dataset(folder, roi_start=starts[:7] + [[0, 1]] + starts[8:], roi_shape=[1, 2])
    _refused(
        ds,
        one_moved,
        r"its ROIs differ \(the state's: start \(0, 0\) end \(1, 2\) for every file; "
        r"this dataset's: 2 different ROIs, the first file's start \(0, 0\) end \(1, 2\)\)",
    )


def test_a_state_with_another_fill_value_or_key_is_refused(folder, tmp_path_factory):
    pad = {"roi_start": [1, 0], "roi_shape": [2, 3], "out_of_bounds_policy": "pad"}
    ds = npydask.open_dataset(folder, **pad)
    _refused(ds, npydask.open_dataset(folder, **pad, fill_value=7), r"fill value .*the state's: 0; this dataset's: 7")
    root = tmp_path_factory.mktemp("npz")
    for i in range(10):
        np.savez(root / f"{i:02d}.npz", a=np.full((2, 3), i, "<i4"), b=np.full((2, 3), -i, "<i4"))
    a = npydask.open_dataset(root, file_filter="*.npz", key="a")
    _refused(a, npydask.open_dataset(root, file_filter="*.npz", key="b"), "another .npz key .*'a'.*'b'")
    both = npydask.open_dataset(root, file_filter="*.npz", key=["a", "b"])
    _refused(both, npydask.open_dataset(root, file_filter="*.npz", key=["b", "a"]), r"\['a', 'b'\].*\['b', 'a'\]")


def test_a_state_resumes_where_the_samples_hold_the_same(folder):
    """Arguments that do not change a sample (policy or fill value with every ROI inside, the device) pass."""
    roi = {"roi_start": [1, 0], "roi_shape": [1, 3]}
    ds = npydask.open_dataset(folder, **roi, out_of_bounds_policy="pad", fill_value=5)
    state = npydask.Loader(ds, 2, shuffle=True).state_dict()
    for same in [
        npydask.open_dataset(folder, **roi),
        npydask.open_dataset(folder, roi_start=[[1, 0]] * 10, roi_end=[2, 3], out_of_bounds_policy="trim_to_shape"),
        npydask.open_dataset(folder, **roi, headers="first", backend="pread"),
        pickle.loads(pickle.dumps(ds))[:],
    ]:
        npydask.Loader(same, 2, shuffle=True).load_state_dict(state)


def test_an_older_state_without_rois_resumes_with_a_warning_and_checks_the_rest(folder):
    ds = npydask.open_dataset(folder, roi_start=[1, 0], roi_shape=[1, 3])
    state = npydask.Loader(ds, 2).state_dict()
    state["dataset_fingerprint"] = {k: state["dataset_fingerprint"][k] for k in ("files", "layout")}
    loader = npydask.Loader(npydask.open_dataset(folder, roi_shape=[1, 3]), 2)
    with pytest.warns(npydask.NpyDaskWarning, match="records no ROI, .npz key or fill value"):
        loader.load_state_dict(dict(state, batches_done=4))
    with pytest.warns(npydask.NpyDaskWarning), pytest.raises(ValueError, match="file names"):
        npydask.Loader(ds[::-1], 2).load_state_dict(state)


def test_the_look_ahead_reads_an_epochs_first_batch_alone_then_opens(folder, monkeypatch):
    """Batch 0 is read before any other starts (over a link it would share the bandwidth and come last);
    then each batch taken lets one more be read, up to ``prefetch`` in flight."""
    import threading
    import time

    from npydask.loader import core

    events: list[tuple[str, int]] = []
    lock = threading.Lock()
    real = core.read_counted

    def traced(views, device="cpu"):
        first = views[0].ref.path
        with lock:
            events.append(("start", first))
        if len(events) == 1:
            time.sleep(0.2)  # (the others, were they sent with it, would start meanwhile)
        got = real(views, device)
        with lock:
            events.append(("end", first))
        return got

    monkeypatch.setattr(core, "read_counted", traced)
    loader = npydask.Loader(npydask.open_dataset(folder), 2, prefetch=4)
    assert epoch(loader) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert events[0][0] == "start" and events[1] == ("end", events[0][1])  # batch 0 alone
    in_flight = most = 0
    for kind, _ in events:
        in_flight += 1 if kind == "start" else -1
        most = max(most, in_flight)
    assert most <= 4
