"""Loader(sampler=, prefetch=K): windows of K // 2 batches read together, delivered one by one in order.

Values equal numpy (inside and padding) for Grid and Uniform, zipped datasets, local spans and objects;
grid tiles read fewer bytes and requests than batch by batch, random patches the same; resume mid-window;
an error raised at the batch it belongs to.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
from _boxes import expected_box, save_npz_members

import npydask
from npydask.errors import FileChangedError
from npydask.plan.lookahead import plan_window, windows
from npydask.plan.patches import Patch
from npydask.samplers import Grid, Uniform

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)

ARRAYS = [np.random.default_rng(i).standard_normal((10 + i, 16, 18)).astype("<f4") for i in range(5)]
GRID = Grid((6, 6, 6), overlap=0.25, fill_value=-1)


def saved(root, arrays):
    """``root`` (made) holding ``v{i}.npy`` for each array."""
    root.mkdir(exist_ok=True)
    for i, a in enumerate(arrays):
        np.save(root / f"v{i}.npy", a)
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved(tmp_path_factory.mktemp("vols"), ARRAYS)


@pytest.fixture
def spans():
    with npydask.config.set(patch_read="spans"):
        yield


def boxes(index):
    return [
        (int(f), tuple(a), tuple(b))
        for f, a, b in zip(index["file"].tolist(), index["start"].tolist(), index["stop"].tolist())
    ]


def check(loader, arrays, fill):
    """Iterate ``loader`` (with_index): every slot equals numpy; the boxes in delivery order."""
    order = []
    for batch, index in loader:
        got = boxes(index)
        assert len(batch) == len(got)
        for slot, (f, a, b) in zip(batch, got):
            np.testing.assert_array_equal(slot, expected_box(arrays[f], Patch(f, a, b), fill))
        order.append(got)
    return order


@pytest.mark.parametrize("prefetch", [4, 6, 10])
def test_grid_tiles_equal_numpy_in_order_and_read_less(folder, spans, prefetch):
    ds = npydask.open_dataset(folder)
    alone = npydask.Loader(ds, 4, sampler=GRID, with_index=True, prefetch=1)
    ahead = npydask.Loader(ds, 4, sampler=GRID, with_index=True, prefetch=prefetch)
    assert check(ahead, ARRAYS, -1) == check(alone, ARRAYS, -1)
    a, b = ahead.stats(), alone.stats()
    assert a.patch_bytes == b.patch_bytes
    assert a.bytes_read < b.bytes_read and a.requests < b.requests


def test_stats_count_each_windows_merged_spans_once(folder, spans):
    ds = npydask.open_dataset(folder)
    loader = npydask.Loader(ds, 3, sampler=GRID, prefetch=8)
    for _ in loader:
        pass
    bound = GRID.bind(ds)
    batches = loader.schedule.deal().batches()
    headers = [v.ref.header for v in ds.views]
    expected = 0
    for w in windows(len(batches), 4):
        window = [bound.patches(0, batches[i].tolist()) for i in w]
        gap = ds.views[0].ref.options.gap_bytes
        expected += sum(p.runs.bytes_read for p in plan_window(window, headers.__getitem__, max_gap=gap))
    assert loader.stats().bytes_read == expected
    assert loader.stats().patch_bytes == len(bound) * 6**3 * 4


def test_random_patches_read_what_they_read_batch_by_batch(folder, spans):
    ds = npydask.open_dataset(folder)
    sampler = Uniform((5, 7, 4), per_file=2, policy="pad", fill_value=3)
    stats = []
    orders = []
    for prefetch in (1, 8):
        loader = npydask.Loader(ds, 4, sampler=sampler, seed=2, with_index=True, prefetch=prefetch)
        orders.append(check(loader, ARRAYS, 3))
        stats.append(loader.stats())
    assert orders[0] == orders[1]
    assert stats[0].bytes_read == stats[1].bytes_read and stats[0].requests == stats[1].requests
    assert stats[0].patch_bytes == stats[1].patch_bytes


def test_the_mapped_route_reads_batch_by_batch(folder, monkeypatch):
    from npydask.loader import core

    called = []
    monkeypatch.setattr(core.Loader, "_window_batches", lambda self, *a: called.append(a) or iter(()))
    ds = npydask.open_dataset(folder)
    assert len(list(npydask.Loader(ds, 4, sampler=GRID, prefetch=6))) > 0 and not called
    with npydask.config.set(patch_read="spans"):
        assert list(npydask.Loader(ds, 4, sampler=GRID, prefetch=6)) == [] and called
    assert list(npydask.Loader(npydask.open_dataset(folder, backend="pread"), 4, sampler=GRID, prefetch=6)) == []
    assert len(called) == 2


def test_a_zipped_dataset_reads_each_member_ahead(tmp_path, spans):
    masks = [(a > 0).astype("u1") for a in ARRAYS]
    images, labels = saved(tmp_path / "img", ARRAYS), saved(tmp_path / "lab", masks)
    z = npydask.zip_datasets({"image": npydask.open_dataset(images), "label": npydask.open_dataset(labels)})
    got = {}
    for prefetch in (1, 6):
        seen = []
        loader = npydask.Loader(z, 5, sampler=Grid((6, 6, 6), overlap=0.25), with_index=True, prefetch=prefetch)
        for batch, index in loader:
            for k, (f, a, b) in enumerate(boxes(index)):
                np.testing.assert_array_equal(batch["image"][k], expected_box(ARRAYS[f], Patch(f, a, b), 0))
                np.testing.assert_array_equal(batch["label"][k], expected_box(masks[f], Patch(f, a, b), 0))
            seen.append(boxes(index))
        got[prefetch] = (seen, loader.stats())
    assert got[1][0] == got[6][0]
    assert got[6][1].bytes_read < got[1][1].bytes_read and got[6][1].patch_bytes == got[1][1].patch_bytes


@pytest.mark.parametrize("drop_last", [False, True])
def test_an_epoch_ending_mid_window_and_shards(folder, spans, drop_last):
    ds = npydask.open_dataset(folder)
    for k in range(2):
        kw = dict(sampler=GRID, with_index=True, shard_id=k, num_shards=2, drop_last=drop_last, shuffle=True)
        alone = npydask.Loader(ds, 7, prefetch=0, **kw)
        ahead = npydask.Loader(ds, 7, prefetch=6, **kw)
        for _ in range(2):  # two epochs: each pass starts afresh
            assert check(ahead, ARRAYS, -1) == check(alone, ARRAYS, -1)
            assert ahead.epoch == alone.epoch and len(ahead) % 3 != 0


def test_resume_mid_window_delivers_each_remaining_sample_once(folder, spans):
    ds = npydask.open_dataset(folder)
    bound = GRID.bind(ds)
    loader = npydask.Loader(ds, 4, sampler=GRID, with_index=True, prefetch=6)
    seen = Counter()
    it = iter(loader)
    for _ in range(4):  # the second window is read: one of its batches delivered, two read ahead
        seen.update(boxes(next(it)[1]))
    state = loader.state_dict()
    it.close()
    assert state["position"] == 16
    again = npydask.Loader(ds, 3, sampler=GRID, with_index=True, prefetch=8)
    again.load_state_dict(state)
    for _, index in again:
        seen.update(boxes(index))
    assert seen == Counter((p.file, p.start, p.stop) for p in bound.patches(0, range(len(bound))))


def test_stopping_mid_window_leaves_no_thread(folder, spans):
    import threading

    ds = npydask.open_dataset(folder)
    before = {t for t in threading.enumerate() if t.name.startswith("npydask-loader")}
    for _ in range(5):
        it = iter(npydask.Loader(ds, 2, sampler=GRID, prefetch=6))
        next(it), next(it), next(it)
        it.close()
    after = {t for t in threading.enumerate() if t.name.startswith("npydask-loader") and t.is_alive()}
    assert after <= before


def test_ordering_holds_over_many_threaded_passes(folder, spans):
    ds = npydask.open_dataset(folder)
    sampler = Uniform((4, 5, 6), per_file=3, policy="pad", fill_value=0)
    want = [boxes(i) for _, i in npydask.Loader(ds, 2, sampler=sampler, with_index=True, prefetch=0, seed=5)]
    for prefetch in (2, 4, 6, 8) * 8:
        loader = npydask.Loader(ds, 2, sampler=sampler, with_index=True, prefetch=prefetch, seed=5)
        assert [boxes(i) for _, i in loader] == want


def test_a_read_error_is_raised_at_its_batch(tmp_path, spans):
    root = saved(tmp_path / "v", ARRAYS)
    ds = npydask.open_dataset(root)
    loader = npydask.Loader(ds, 3, sampler=GRID, with_index=True, prefetch=8)
    batches = loader.schedule.deal().batches()
    bound = GRID.bind(ds)
    starts = {}
    for g, b in enumerate(batches):
        for p in bound.patches(0, b.tolist()):
            starts.setdefault(p.file, g)
    bad = next(f for f, g in starts.items() if g % 4 != 0)  # a file whose first batch is inside a window
    first = starts[bad]
    np.save(root / f"v{bad}.npy", ARRAYS[bad] + 1)  # changed after the dataset was opened
    os.utime(root / f"v{bad}.npy", ns=(1, 1))
    delivered = []
    it = iter(loader)
    for _ in range(first):
        delivered.append(next(it)[1]["file"])
    with pytest.raises(FileChangedError):
        next(it)
    assert bad not in np.concatenate(delivered)


def test_objects_equal_numpy_and_grid_tiles_use_fewer_requests(s3):
    space = s3.space()
    for i, a in enumerate(ARRAYS[:3]):
        s3.put_npy(f"{space}/v/{i}.npy", a)
    ds = npydask.open_dataset(f"s3://{space}/v", storage_options=s3.options)
    runs = {}
    for sampler in (GRID, Uniform((5, 6, 7), per_file=2, policy="pad", fill_value=-1)):
        for prefetch in (1, 6):
            loader = npydask.Loader(ds, 4, sampler=sampler, with_index=True, prefetch=prefetch, seed=1)
            runs[sampler is GRID, prefetch] = (check(loader, ARRAYS, -1), loader.stats())
    grid_alone, grid_ahead = runs[True, 1], runs[True, 6]
    assert grid_alone[0] == grid_ahead[0]
    assert grid_ahead[1].requests < grid_alone[1].requests
    assert grid_ahead[1].bytes_read <= grid_alone[1].bytes_read
    rand_alone, rand_ahead = runs[False, 1], runs[False, 6]
    assert rand_alone[0] == rand_ahead[0]
    assert (rand_alone[1].bytes_read, rand_alone[1].requests) == (rand_ahead[1].bytes_read, rand_ahead[1].requests)


def test_a_dataset_roi_reads_ahead_equal_to_numpy(folder, spans):
    ds = npydask.open_dataset(folder, roi_start=(1, 2, 3), roi_shape=(8, 12, 13))
    cut = [a[1:9, 2:14, 3:16] for a in ARRAYS]
    sampler = Grid((5, 5, 5), overlap=0.25, fill_value=-1)
    alone = npydask.Loader(ds, 4, sampler=sampler, with_index=True, prefetch=1)
    ahead = npydask.Loader(ds, 4, sampler=sampler, with_index=True, prefetch=6)
    assert check(ahead, cut, -1) == check(alone, cut, -1)
    assert ahead.stats().patch_bytes == alone.stats().patch_bytes


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_members_read_ahead_equal_to_numpy(tmp_path, compressed):
    members = save_npz_members(tmp_path, compressed)
    ds = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "m"])
    sampler = Grid((4, 3), overlap=0.25, fill_value=5)
    seen = {}
    for prefetch in (1, 6):
        loader = npydask.Loader(ds, 3, sampler=sampler, with_index=True, prefetch=prefetch)
        order = []
        for batch, index in loader:
            for k, (f, a, b) in enumerate(boxes(index)):
                for key in ("x", "m"):
                    np.testing.assert_array_equal(batch[key][k], expected_box(members[f][key], Patch(f, a, b), 5))
            order.append(boxes(index))
        seen[prefetch] = (order, loader.stats())
    assert seen[1][0] == seen[6][0] and seen[1][1].patch_bytes == seen[6][1].patch_bytes
    assert seen[6][1].bytes_read <= seen[1][1].bytes_read


def test_each_batch_is_stacked_where_its_own_files_agree(tmp_path, spans):
    arrays = [np.arange(2 * 8 * 8, dtype="<i2").reshape(2, 8, 8), np.arange(3 * 8 * 8, dtype="<i2").reshape(3, 8, 8)]
    ds = npydask.open_dataset(saved(tmp_path / "v", arrays))
    sampler = Grid((4, 4))  # 9 tiles a file: batches of 3 hold one file each, the fifth batch of 2 both
    for batch_size in (3, 2):
        alone = list(npydask.Loader(ds, batch_size, sampler=sampler, with_index=True, prefetch=1))
        ahead = list(npydask.Loader(ds, batch_size, sampler=sampler, with_index=True, prefetch=8))
        assert [type(b) for b, _ in ahead] == [type(b) for b, _ in alone]
        for (a, ia), (b, ib) in zip(alone, ahead):
            assert boxes(ia) == boxes(ib)
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    assert {type(b) for b, _ in ahead} == {list, np.ndarray}


@pytest.mark.parametrize("prefetch", [4, 5, 8])
def test_at_most_prefetch_batches_are_read_ahead(folder, spans, monkeypatch, prefetch):
    import time

    from npydask.loader import window

    read = []
    real = window.read_window

    def counting(dataset, batches, *args, **kwargs):
        got = real(dataset, batches, *args, **kwargs)
        read.append(len(batches))
        return got

    monkeypatch.setattr(window, "read_window", counting)
    loader = npydask.Loader(npydask.open_dataset(folder), 2, sampler=GRID, prefetch=prefetch)
    delivered = 0
    for _ in loader:
        delivered += 1
        time.sleep(0.02)  # (a slow training step: the threads read as far ahead as they may)
        assert sum(read) - delivered <= prefetch, (sum(read), delivered)
    assert read and max(read) == prefetch // 2 and sum(read) == delivered == len(loader)
