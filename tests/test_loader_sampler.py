"""Loader(sampler=): batch-strided shards, values equal numpy, determinism, elastic resume, stats, stitching."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
from _boxes import expected_box as expected

import npydask
from npydask.plan.patches import Patch
from npydask.samplers import Grid, ReadStats, Stitcher, Uniform

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)

ARRAYS = [np.random.default_rng(i).standard_normal((2, 12 + i, 14, 10)).astype(">f4") for i in range(7)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("vols")
    for i, a in enumerate(ARRAYS):
        np.save(root / f"v{i}.npy", a)
    return root


@pytest.fixture
def ds(folder):
    return npydask.open_dataset(folder)


def boxes(index):
    """A batch's index as hashable boxes."""
    return [
        (int(f), tuple(a), tuple(b))
        for f, a, b in zip(index["file"].tolist(), index["start"].tolist(), index["stop"].tolist())
    ]


def epoch_boxes(bound, epoch, seed=None, shuffle=False):
    return Counter(
        (p.file, p.start, p.stop) for p in bound.patches(epoch, range(len(bound)), seed=seed, shuffle=shuffle)
    )


def tail(bound, epoch, start, world, batch, seed=5, shuffle=True):
    """The boxes a pass from ``start`` at ``world`` ranks of ``batch`` wraps in to complete its last round."""
    n = len(bound)
    if world == 1:
        return Counter()
    end = start + -(-(n - start) // (batch * world)) * batch * world
    wrapped = [q % n for q in range(n, end)]
    return Counter((p.file, p.start, p.stop) for p in bound.patches(epoch, wrapped, seed=seed, shuffle=shuffle))


def test_every_sample_is_read_once_across_shards_and_equals_numpy(ds):
    sampler = Uniform((5, 6, 4), per_file=2, policy="pad", fill_value=-1)
    bound = sampler.bind(ds)
    seen = Counter()
    for k in range(3):
        loader = npydask.Loader(ds, 3, sampler=sampler, shard_id=k, num_shards=3, seed=4, shuffle=True, with_index=True)
        assert len(loader) == 2  # 14 positions: 2 rounds of 3 global batches, positions 14-17 wrapped to 0-3
        for batch, index in loader:
            assert batch.dtype == np.float32 and batch.shape[1:] == (2, 5, 6, 4)
            for slot, (f, a, b) in zip(batch, boxes(index)):
                np.testing.assert_array_equal(slot, expected(ARRAYS[f], Patch(f, a, b), -1))
            seen.update(boxes(index))
        assert loader.epoch == 1
    assert seen == epoch_boxes(bound, 0, seed=4, shuffle=True) + tail(bound, 0, 0, 3, 3, seed=4)
    assert sum(tail(bound, 0, 0, 3, 3, seed=4).values()) == 4


def test_shards_take_global_batches_in_turn(ds):
    sampler = Uniform((4, 4, 4))  # one patch per file, in file order
    got = [[idx["file"].tolist() for _, idx in npydask.Loader(ds, 2, sampler=sampler, shard_id=k, num_shards=2,
                                                                 with_index=True)] for k in range(2)]  # fmt: skip
    assert got == [[[0, 1], [4, 5]], [[2, 3], [6, 0]]]  # equal counts: the last round wraps to file 0
    dropped = npydask.Loader(ds, 2, sampler=sampler, shard_id=1, num_shards=2, drop_last=True, with_index=True)
    assert [i["file"].tolist() for _, i in dropped] == [[2, 3]]


def test_same_seed_same_batches_and_epochs_differ(ds):
    sampler = Uniform((4, 4, 4), per_file=3)

    def epoch(loader):
        return [boxes(i) for _, i in loader]

    a = npydask.Loader(ds, 4, sampler=sampler, seed=11, shuffle=True, with_index=True)
    b = npydask.Loader(ds, 4, sampler=sampler, seed=11, shuffle=True, with_index=True, prefetch=0)
    first = epoch(a)
    assert first == epoch(b)
    second = epoch(a)
    assert second != first and a.epoch == 2
    files = [f for batch in first for f, _, _ in batch]
    assert files != sorted(files)  # units shuffled, a file's 3 patches adjacent
    assert all(files[3 * u] == files[3 * u + 1] == files[3 * u + 2] for u in range(7))
    a.set_epoch(0)
    assert epoch(a) == first
    c = npydask.Loader(ds, 4, sampler=sampler, seed=12, shuffle=True, with_index=True)
    assert epoch(c) != first


def run(ds, sampler, num_shards, batch_size, steps=None, state=None, seed=5):
    """Each rank's loader, optionally resumed from ``state``; ``steps`` batches per rank (all if None)."""
    loaders = [npydask.Loader(ds, batch_size, sampler=sampler, shard_id=k, num_shards=num_shards, seed=seed,
                              shuffle=True, with_index=True, prefetch=1) for k in range(num_shards)]  # fmt: skip
    delivered = Counter()
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        for _ in range(len(loader) if steps is None else steps):
            try:
                _, index = next(it)
            except StopIteration:
                break
            delivered.update(boxes(index))
        if steps is None:
            assert next(it, None) is None
    states = [loader.state_dict() for loader in loaders]
    return delivered, states


@pytest.mark.parametrize("then", [(2, 3), (3, 1), (1, 4)])
def test_resume_at_another_world_size_delivers_each_remaining_sample_once(ds, then):
    sampler = Uniform((3, 3, 3), per_file=3)  # 21 positions
    whole = epoch_boxes(sampler.bind(ds), 0, seed=5, shuffle=True)
    for step in range(0, 4):
        before, states = run(ds, sampler, 4, 2, steps=step)
        assert all(s == states[0] for s in states)  # the same state on every rank
        at = (0, step * 8) if step * 8 < 21 else (1, 0)  # (an epoch fully consumed: the next, from 0)
        assert (states[0]["epoch"], states[0]["position"]) == at
        after, end = run(ds, sampler, *then, state=states[0])
        assert end[0]["epoch"] == at[0] + 1 and end[0]["position"] == 0
        bound = sampler.bind(ds)
        if at[0] == 1:  # every rank consumed the epoch (24 positions, 3 wrapped): the resumed run is the next, whole
            assert before == whole + tail(bound, 0, 0, 4, 2)
            assert after == epoch_boxes(bound, 1, seed=5, shuffle=True) + tail(bound, 1, 0, *then)
            continue
        assert before + after == whole + tail(bound, 0, at[1], *then), step
        # resumed twice: part of the rest at `then`, the remainder on one rank of batch 1
        mid, again = run(ds, sampler, *then, steps=1, state=states[0])
        done = again[0]["epoch"] == 1  # (the epoch is over: resuming it would go on with the next)
        rest = Counter() if done else run(ds, sampler, 1, 1, state=again[0])[0]
        assert before + mid + rest == whole + (tail(bound, 0, at[1], *then) if done else Counter()), step


# Loader(ds, 3, sampler=Uniform((3, 3, 3), per_file=2), seed=4, shuffle=True).state_dict() after two batches,
# as saved: the fingerprints hash names relative to the folder, the dtype, shapes and sampler parameters
SAVED = {
    "epoch": 0,
    "position": 6,
    "samples": 14,
    "seed": 4,
    "shuffle": True,
    "sampler": "e1149a66f6c94942f89f35a369d20dbf",
    "dataset_fingerprint": {
        "files": "a83415dfb3cd2b8aafa557af117ad143",
        "layout": "8d99f97c706a72f8191e340110718905",
        "roi": "296552f32e933853426ace98593310e9",
        "roi_shown": "whole files",
        "key": "None",
        "fill": "none",
    },
}


def test_a_saved_state_keeps_its_format_and_resumes(ds):
    sampler = Uniform((3, 3, 3), per_file=2)
    loader = npydask.Loader(ds, 3, sampler=sampler, seed=4, shuffle=True)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state == SAVED and list(state) == list(SAVED)
    it.close()
    resumed = npydask.Loader(ds, 4, sampler=sampler, seed=4, shuffle=True, with_index=True)
    resumed.load_state_dict(SAVED)  # another batch size: positions 6-13 of epoch 0, once each, in order
    got = [b for _, index in resumed for b in boxes(index)]
    assert got == [(p.file, p.start, p.stop) for p in sampler.bind(ds).patches(0, range(6, 14), seed=4, shuffle=True)]


def test_a_state_at_the_end_of_an_epoch_goes_on_with_the_next(ds):
    sampler = Uniform((3, 3, 3))

    def loader(b=3):
        return npydask.Loader(ds, b, sampler=sampler, with_index=True)

    whole = loader()
    list(whole)
    assert (whole.state_dict()["epoch"], whole.state_dict()["position"]) == (1, 0)
    fresh = loader(2)
    fresh.set_epoch(1)
    second = [boxes(i) for _, i in fresh]
    left = loader()
    it = iter(left)
    for _ in range(3):
        next(it)  # the whole epoch taken, the generator left before its end
    state = left.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    resumed = loader(2)
    resumed.load_state_dict(state)
    assert [boxes(i) for _, i in resumed] == second
    it.close()
    assert [boxes(i) for _, i in left][:1] == [sum(second[:2], [])[:3]]  # the same loader rolls over too


def test_refusals_name_the_difference(ds, folder, tmp_path):
    sampler = Uniform((3, 3, 3))
    with pytest.raises(ValueError, match="pad_last_batch=True does not apply with a sampler"):
        npydask.Loader(ds, 2, sampler=sampler, pad_last_batch=True)
    with pytest.raises(ValueError, match="stick_to_shard=False does not apply"):
        npydask.Loader(ds, 2, sampler=sampler, stick_to_shard=False)
    with pytest.raises(TypeError, match="sampler must be a patch sampler"):
        npydask.Loader(ds, 2, sampler="uniform")
    with pytest.raises(TypeError, match="ZippedDataset .* only with sampler="):
        npydask.Loader(npydask.zip_datasets({"a": ds}), 2)
    state = npydask.Loader(ds, 2, sampler=sampler, seed=1, shuffle=True).state_dict()
    with pytest.raises(ValueError, match="another seed"):
        npydask.Loader(ds, 2, sampler=sampler, seed=2, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="another shuffle"):
        npydask.Loader(ds, 2, sampler=sampler, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="another sampler"):
        npydask.Loader(ds, 2, sampler=Uniform((3, 3, 4)), seed=1, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="another dataset .*files"):
        npydask.Loader(ds[::-1], 2, sampler=sampler, seed=1, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="saved by a loader with sampler="):
        npydask.Loader(ds, 2, seed=1, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="saved by a loader without a sampler"):
        npydask.Loader(ds, 2, sampler=sampler).load_state_dict(npydask.Loader(ds, 2).state_dict())
    plain = npydask.Loader(ds, 2)  # (stats of a loader without a sampler: the samples delivered)
    assert plain.stats() == ReadStats()
    delivered = sum(sum(a.nbytes for a in b) if isinstance(b, list) else b.nbytes for b in plain)
    assert plain.stats().patch_bytes == delivered > 0


def test_stats_sum_the_epoch(ds):
    sampler = Uniform((4, 5, 6), per_file=2, policy="pad")
    loader = npydask.Loader(ds, 4, sampler=sampler)
    assert loader.stats() == ReadStats()
    total = sum(b.nbytes for b in loader)
    stats = loader.stats()
    assert stats.patch_bytes == total and stats.bytes_read > 0 and stats.io_wait_s > 0
    with npydask.config.set(patch_read="spans"):
        list(loader)
    assert loader.stats().requests >= 7 and loader.stats().patch_bytes == total


def test_zipped_batches_are_dicts(folder, tmp_path):
    labels = tmp_path / "lab"
    labels.mkdir()
    for i, a in enumerate(ARRAYS):
        np.save(labels / f"v{i}.npy", (a[0] > 0).astype("u1"))
    z = npydask.zip_datasets({"image": npydask.open_dataset(folder), "label": npydask.open_dataset(labels)})
    loader = npydask.Loader(z, 3, sampler=Uniform((4, 4, 4), per_file=2), with_index=True)
    for batch, index in loader:
        assert set(batch) == {"image", "label"} and batch["label"].dtype == np.uint8
        for i, (f, a, b) in enumerate(boxes(index)):
            np.testing.assert_array_equal(
                batch["label"][i], expected((ARRAYS[f][0] > 0).astype("u1"), Patch(f, a, b), 0)
            )
    assert "samples of Uniform" in repr(loader)
    # the fingerprint covers every member's files: a state is refused over other labels
    state = loader.state_dict()
    other = npydask.zip_datasets({"image": npydask.open_dataset(folder), "label": npydask.open_dataset(folder)})
    with pytest.raises(ValueError, match="another dataset"):
        npydask.Loader(other, 3, sampler=Uniform((4, 4, 4), per_file=2)).load_state_dict(state)


def test_zipped_dataset_facts(folder):
    ds = npydask.open_dataset(folder)
    z = npydask.zip_datasets({"a": ds, "b": ds})
    assert z.files == {"a": ds.files, "b": ds.files} and z.sharding is None
    assert z.shard(1, 2).sharding == (1, 2)
    with pytest.warns(npydask.errors.NpyDaskWarning, match="compound"):
        npydask.Loader(z.shard(0, 2), 2, sampler=Uniform((3, 3, 3)), shard_id=0, num_shards=2)


def test_grid_tiles_stitch_back_the_volumes(ds):
    grid = Grid((8, 8, 6), overlap=0.25)
    loader = npydask.Loader(ds, 5, sampler=grid, with_index=True, shuffle=True)  # shuffle is ignored by Grid
    stitcher = Stitcher(grid, ds, channels=(2,), weights="gaussian")
    for batch, index in loader:
        stitcher.add(batch, index)  # the identity model
    for got, a in zip(stitcher.result(), ARRAYS):
        np.testing.assert_allclose(got, a, rtol=1e-6)
    assert loader.state_dict()["shuffle"] is False


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.mark.timeout(180)
def test_batches_read_on_the_cluster_equal_local_ones(ds, client):
    sampler = Uniform((4, 4, 4), per_file=2)
    local = npydask.Loader(ds, 3, sampler=sampler, seed=2, shuffle=True, with_index=True)
    remote = npydask.Loader(ds, 3, sampler=sampler, seed=2, shuffle=True, with_index=True, client=client)
    for (a, i), (b, j) in zip(local, remote, strict=True):
        np.testing.assert_array_equal(a, b)
        assert boxes(i) == boxes(j)
    assert remote.stats().patch_bytes == local.stats().patch_bytes


@pytest.mark.timeout(180)
def test_the_patch_read_setting_travels_to_the_workers(ds, client):
    # The worker processes keep the default ("auto": these page-cached files are copied from their mapping,
    # no read requests); the setting in force where the loader iterates is the one its tasks read by.
    assert set(client.run(lambda: npydask.config.get("patch_read")).values()) == {"auto"}
    remote = npydask.Loader(ds, 3, sampler=Uniform((4, 4, 4), per_file=2), seed=2, with_index=True, client=client)
    for route in ("spans", None):  # (None: the default again, mapped)
        with npydask.config.set(patch_read=route or ""):
            for batch, index in remote:
                for slot, (f, a, b) in zip(batch, boxes(index)):  # checked after the read
                    np.testing.assert_array_equal(slot, expected(ARRAYS[f], Patch(f, a, b), 0))
        if route == "spans":
            assert remote.stats().requests > 0  # the spans were read with preadv on the workers
        else:
            assert remote.stats().requests == 0 and remote.stats().bytes_read > 0


@pytest.mark.timeout(180)
def test_cache_figures_are_counted_on_the_workers_and_come_back_with_the_batches(s3, client, tmp_path):
    """Objects read through the node cache by a cluster's worker processes: each task returns its figures."""
    space = s3.space()
    arrays = [np.random.default_rng(i).standard_normal((8, 300)).astype("f4") for i in range(4)]
    for i, a in enumerate(arrays):
        s3.put_npy(f"{space}/{i}.npy", a)
    cache = npydask.Cache(str(tmp_path / "cache"))
    ds = npydask.open_dataset(f"s3://{space}/", storage_options=s3.options, cache=cache)
    for sampler in (None, Grid((4, 300))):
        loader = npydask.Loader(ds, 2, sampler=sampler, client=client)
        runs = []
        for _ in range(2):
            got = list(loader)
            if sampler is None:
                np.testing.assert_array_equal(np.concatenate(got), np.stack(arrays))
            runs.append(loader.stats())
        cold, warm = runs
        if sampler is None:  # (the Grid's pass follows: everything is held by then)
            assert cold.cache_misses >= 4 and cold.cache_hits == 0 and cold.requests > 0
        assert warm.cache_misses == 0 and warm.cache_hits > 0 and warm.cache_hit_bytes > 0
        assert warm.patch_bytes == cold.patch_bytes >= sum(a.nbytes for a in arrays)


def test_gpu_batches(ds, monkeypatch):
    from test_loader_gpu import FakeCupy

    from npydask.gpu import device as gpu

    xp = FakeCupy()
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "array_module", lambda: xp)
    for prefetch in (0, 2):
        loader = npydask.Loader(ds, 4, sampler=Uniform((4, 4, 4)), device="gpu", prefetch=prefetch, with_index=True)
        for batch, index in loader:
            assert isinstance(batch, xp.ndarray)
            for slot, (f, a, b) in zip(batch, boxes(index)):
                np.testing.assert_array_equal(slot, expected(ARRAYS[f], Patch(f, a, b), 0))


def test_without_a_sampler_batches_are_unchanged(folder):
    ds = npydask.open_dataset(folder, roi_start=(0, 0, 0, 0), roi_shape=(2, 12, 14, 10))
    loader = npydask.Loader(ds, 3, with_index=True)
    got = [(b.shape, i.tolist()) for b, i in loader]
    assert got == [((3, 2, 12, 14, 10), [0, 1, 2]), ((3, 2, 12, 14, 10), [3, 4, 5]), ((1, 2, 12, 14, 10), [6])]
    assert set(loader.state_dict()) >= {"batches_done", "n"} and os.path.isdir(folder)


def test_foreground_batches_centre_on_labels(folder, tmp_path):
    from npydask.samplers import Foreground

    labels = tmp_path / "lab"
    labels.mkdir()
    for i, a in enumerate(ARRAYS):
        lab = np.zeros(a.shape[1:], "u1")
        lab[2:4, 3:5, 1:3] = 1
        np.save(labels / f"v{i}.npy", lab)
    z = npydask.zip_datasets({"image": npydask.open_dataset(folder), "label": npydask.open_dataset(labels)})
    loader = npydask.Loader(z, 4, sampler=Foreground((4, 4, 4), p=1.0, per_file=2), with_index=True, prefetch=3)
    for batch, index in loader:
        assert (batch["label"].reshape(len(batch["label"]), -1).max(axis=1) == 1).all()  # every box holds a label
        for i, (f, a, b) in enumerate(boxes(index)):
            np.testing.assert_array_equal(batch["image"][i], expected(ARRAYS[f], Patch(f, a, b), 0))


def test_patches_of_objects_through_the_loader(s3):
    space = s3.space()
    for i, a in enumerate(ARRAYS[:4]):
        s3.put_npy(f"{space}/v{i}.npy", a)
    ds = npydask.open_dataset(f"s3://{space}", storage_options=s3.options)
    loader = npydask.Loader(ds, 3, sampler=Uniform((4, 5, 6), per_file=2), seed=3, shuffle=True, with_index=True)
    for batch, index in loader:
        for slot, (f, a, b) in zip(batch, boxes(index)):
            np.testing.assert_array_equal(slot, expected(ARRAYS[f], Patch(f, a, b), 0))
    stats = loader.stats()
    assert stats.patch_bytes == 8 * 2 * 4 * 5 * 6 * 4 and stats.requests >= 4 and stats.bytes_read >= stats.patch_bytes
