"""The PyTorch adapters with a patch sampler: values, dealing to ranks and workers, elastic resume."""

from __future__ import annotations

import collections
import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import npydask  # noqa: E402
from npydask.samplers import Grid, Uniform  # noqa: E402
from npydask.torch import NpyIterableDataset, NpyMapDataset  # noqa: E402

FORK = torch.multiprocessing.get_context("fork")


@pytest.fixture
def volumes(tmp_path):
    """Five small big-endian volumes of unequal shapes (one Fortran-ordered), each value unique."""
    shapes = [(9, 10), (12, 7), (8, 8), (11, 13), (7, 9)]
    for i, shape in enumerate(shapes):
        a = (np.arange(np.prod(shape), dtype="f4").reshape(shape) + 1000 * i).astype(">f4")
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if i == 3 else a)
    return npydask.open_dataset(tmp_path)


def _expected(ds, file, location, fill=0):
    """The box of ``location`` (start then stop) of file ``file`` as numpy gives it, padded with ``fill``."""
    a = np.load(ds.files[file])
    nd = len(location) // 2
    start, stop = location[:nd], location[nd:]
    out = np.full(a.shape[: a.ndim - nd] + tuple(b - s for s, b in zip(start, stop)), fill, a.dtype.newbyteorder("="))
    src, dst = [], []
    for s, e, n in zip(start, stop, a.shape[a.ndim - nd :]):
        lo, hi = max(s, 0), min(e, n)
        src.append(slice(lo, hi))
        dst.append(slice(lo - s, hi - s))
    out[(Ellipsis, *dst)] = a[(Ellipsis, *src)]
    return out


def _keys(bound, epoch, positions, seed=None, shuffle=False):
    """``(file, start + stop)`` of each position, as the adapters' index names a sample."""
    return [(p.file, p.start + p.stop) for p in bound.patches(epoch, list(positions), seed=seed, shuffle=shuffle)]


def _tail(bound, epoch, start, world, batch, seed=1, shuffle=True):
    """The keys a pass from ``start`` at ``world`` ranks of ``batch`` wraps in to complete its last round."""
    n = len(bound)
    end = start + -(-(n - start) // (batch * world)) * batch * world if world > 1 else n
    return collections.Counter(_keys(bound, epoch, [q % n for q in range(n, end)], seed=seed, shuffle=shuffle))


def _batches(it, workers, *, take=None, **kwargs):
    """The ``(file, location)`` of each sample of each batch a DataLoader over ``it`` returns, checked against numpy."""
    loader = torch.utils.data.DataLoader(
        it, batch_size=it.batch_size, num_workers=workers, multiprocessing_context=FORK if workers else None, **kwargs
    )
    out = []
    for batch, index in loader:
        keys = list(zip(index["file"].tolist(), map(tuple, index["location"].tolist())))
        for sample, (f, loc) in zip(batch.numpy(), keys):
            np.testing.assert_array_equal(sample, _expected(it.dataset, f, loc, it.bound.fill_value))
        out.append(keys)
        if take is not None and len(out) == take:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(120)
def test_values_equal_numpy_and_batches_arrive_in_dealt_order(volumes, workers):
    sampler = Uniform((6, 6), per_file=3, policy="pad", fill_value=-1.0)
    it = NpyIterableDataset(volumes, sampler=sampler, batch_size=4, shuffle=True, seed=5, with_index=True)
    got = _batches(it, workers)
    bound = sampler.bind(volumes)
    expected = _keys(bound, 0, range(15), seed=5, shuffle=True)
    assert got == [expected[i : i + 4] for i in range(0, 15, 4)]  # global batches, in order, the last short
    assert len(it) == 15


@pytest.mark.parametrize(("world", "workers"), [(2, 0), (3, 2), (4, 2)])
@pytest.mark.timeout(120)
def test_each_position_once_across_ranks_and_workers(volumes, world, workers):
    sampler = Uniform((5, 5), per_file=4)
    seen = []
    rounds = -(-20 // (3 * world))  # 20 positions: whole rounds of `world` global batches, the last one wrapped
    everything = _keys(sampler.bind(volumes), 0, [p % 20 for p in range(rounds * world * 3)])
    for rank in range(world):
        it = NpyIterableDataset(volumes, sampler=sampler, batch_size=3, rank=rank, world_size=world, with_index=True)
        batches = _batches(it, workers)
        assert [len(b) for b in batches] == [3] * rounds  # every rank the same number of full batches
        assert sum(map(len, batches)) == len(it) and len(torch.utils.data.DataLoader(it, batch_size=3)) == rounds
        # rank k receives global batches k, k+S, ... in order whatever the number of workers
        assert batches == [everything[g * 3 : g * 3 + 3] for g in range(rank, rounds * world, world)]
        seen += [k for b in batches for k in b]
    assert collections.Counter(seen) == collections.Counter(everything)
    assert set(everything) == set(_keys(sampler.bind(volumes), 0, range(20)))


@pytest.mark.timeout(120)
def test_drop_last_drops_the_epochs_short_batch(volumes):
    it = NpyIterableDataset(volumes, sampler=Grid((6, 6)), batch_size=4, drop_last=True, with_index=True)
    n = len(Grid((6, 6)).bind(volumes))
    got = _batches(it, 2, drop_last=True)
    assert [len(b) for b in got] == [4] * (n // 4)
    assert len(it) == n // 4 * 4


def _resume_run(ds, sampler, start_shape, b, resume_shape, *, seed=1):
    """Take ``b`` batches on each rank of ``start_shape`` (world, workers, batch), save, resume at ``resume_shape``."""
    world, workers, batch = start_shape
    before, states = [], []
    for rank in range(world):
        it = NpyIterableDataset(
            ds,
            sampler=sampler,
            batch_size=batch,
            rank=rank,
            world_size=world,
            seed=seed,
            shuffle=True,
            with_index=True,
        )
        it.set_epoch(1)
        taken = _batches(it, workers, take=b) if b else []
        before += [k for part in taken for k in part]
        states.append(it.state_dict(b))
    assert all(s == states[0] for s in states)  # the same state on every rank
    world, workers, batch = resume_shape
    after = []
    for rank in range(world):
        it = NpyIterableDataset(
            ds,
            sampler=sampler,
            batch_size=batch,
            rank=rank,
            world_size=world,
            seed=seed,
            shuffle=True,
            with_index=True,
        )
        it.load_state_dict(pickle.loads(pickle.dumps(states[0])))
        it.set_epoch(states[0]["epoch"])  # the loop's usual call keeps the state's position
        after += [k for part in _batches(it, workers) for k in part]
    return before, after, states[0]


@pytest.mark.parametrize(
    ("start_shape", "resume_shape"),
    [((4, 2, 2), (2, 1, 3)), ((4, 2, 2), (3, 2, 1)), ((2, 0, 3), (1, 0, 4))],
)
@pytest.mark.timeout(240)
def test_resume_at_another_world_worker_count_and_batch_size_delivers_the_rest_once(volumes, start_shape, resume_shape):
    sampler = Uniform((4, 4), per_file=5)
    everything = collections.Counter(_keys(sampler.bind(volumes), 1, range(25), seed=1, shuffle=True))
    for b in (0, 1, 2):
        before, after, state = _resume_run(volumes, sampler, start_shape, b, resume_shape)
        assert state["epoch"] == 1
        assert state["position"] == min(25, b * start_shape[0] * start_shape[2])
        wrapped = _tail(sampler.bind(volumes), 1, state["position"], resume_shape[0], resume_shape[2])
        assert collections.Counter(before + after) == everything + wrapped, f"after {b} batches"


@pytest.mark.timeout(120)
def test_a_state_at_the_epochs_end_resumes_with_the_next_epoch(volumes):
    sampler = Uniform((4, 4))
    it = NpyIterableDataset(volumes, sampler=sampler, batch_size=2, rank=1, world_size=2)
    state = it.state_dict(2)  # 5 samples in 3 global batches: rank 0 holds two, rank 1 one: all consumed
    assert (state["epoch"], state["position"]) == (1, 0)
    fresh = NpyIterableDataset(volumes, sampler=sampler, batch_size=5)
    fresh.load_state_dict(state)
    assert fresh.epoch == 1
    with pytest.raises(ValueError, match="at most 2"):
        it.state_dict(3)


@pytest.mark.timeout(120)
def test_set_epoch_after_load_state_dict_keeps_the_position_only_for_the_states_epoch(volumes):
    sampler = Uniform((4, 4), per_file=2)
    it = NpyIterableDataset(volumes, sampler=sampler, batch_size=2, with_index=True)
    it.set_epoch(3)
    state = it.state_dict(2)
    assert (state["epoch"], state["position"]) == (3, 4)
    bound = sampler.bind(volumes)
    for first in (3, 2):
        resumed = NpyIterableDataset(volumes, sampler=sampler, batch_size=2, with_index=True)
        resumed.load_state_dict(state)
        assert [k for b in _batches(resumed, 0) for k in b] == _keys(bound, 3, range(4, 10))  # no set_epoch: resumes
        resumed.set_epoch(first)
        start = 4 if first == 3 else 0
        assert [k for b in _batches(resumed, 0) for k in b] == _keys(bound, first, range(start, 10))
        resumed.set_epoch(3)  # a second call starts the epoch over
        assert [k for b in _batches(resumed, 0) for k in b] == _keys(bound, 3, range(10))


@pytest.mark.parametrize(("workers", "context"), [(2, "fork"), (1, "spawn")])
@pytest.mark.timeout(240)
def test_set_epoch_and_resume_reach_persistent_workers(volumes, workers, context):
    sampler = Uniform((4, 4), per_file=2)
    it = NpyIterableDataset(volumes, sampler=sampler, batch_size=3, with_index=True)
    loader = torch.utils.data.DataLoader(
        it,
        batch_size=3,
        num_workers=workers,
        persistent_workers=True,
        multiprocessing_context=torch.multiprocessing.get_context(context),
    )

    def keys():
        return [k for _, ix in loader for k in zip(ix["file"].tolist(), map(tuple, ix["location"].tolist()))]

    bound = sampler.bind(volumes)
    epochs = []
    for e in range(2):
        it.set_epoch(e)
        epochs.append(keys())
        assert epochs[-1] == _keys(bound, e, range(10))
    assert epochs[0] != epochs[1]  # set_epoch changes the draws
    it.load_state_dict({**it.state_dict(2), "epoch": 0})
    assert keys() == _keys(bound, 0, range(6, 10))


def test_the_pass_survives_pickling_outside_process_start(volumes):
    it = NpyIterableDataset(volumes, sampler=Uniform((4, 4)), batch_size=2)
    it.load_state_dict({**it.state_dict(1), "epoch": 4})
    for clone in (pickle.loads(pickle.dumps(it)), copy.deepcopy(it)):
        assert clone.state_dict(0)["position"] == 2 and clone.epoch == 4
        clone.set_epoch(6)  # a copy made outside process start has its own pass
    assert it.epoch == 4


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(120)
def test_map_dataset_with_a_shuffling_torch_sampler(volumes, workers):
    sampler = Uniform((5, 5), per_file=3, policy="pad")
    ds = NpyMapDataset(volumes, sampler=sampler, seed=2, with_index=True)
    assert len(ds) == 15
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, shuffle=True, num_workers=workers, multiprocessing_context=FORK if workers else None
    )
    bound = sampler.bind(volumes)
    epochs = []
    for e in range(2):
        ds.set_epoch(e)
        seen = []
        for batch, index in loader:
            for sample, f, loc in zip(batch.numpy(), index["file"].tolist(), index["location"].tolist()):
                np.testing.assert_array_equal(sample, _expected(volumes, f, loc))
                seen.append((f, tuple(loc)))
        assert collections.Counter(seen) == collections.Counter(_keys(bound, e, range(15), seed=2))
        epochs.append(sorted(seen))
    assert epochs[0] != epochs[1]
    assert (ds[7][1]["file"].item(), tuple(ds[7][1]["location"].tolist())) == _keys(bound, 1, [7], seed=2)[0]
    with pytest.raises(IndexError):
        ds[15]


@pytest.fixture
def pairs(tmp_path):
    images, labels = tmp_path / "img", tmp_path / "lab"
    images.mkdir()
    labels.mkdir()
    for i in range(3):
        np.save(images / f"{i}.npy", np.arange(2 * 9 * 11, dtype="i2").reshape(2, 9, 11) + 300 * i)
        np.save(labels / f"{i}.npy", (np.arange(9 * 11).reshape(9, 11) % 7 == i).astype("u1"))
    return npydask.zip_datasets({"image": npydask.open_dataset(images), "label": npydask.open_dataset(labels)})


@pytest.mark.parametrize("adapter", ["iterable", "map"])
@pytest.mark.timeout(120)
def test_zipped_datasets_give_dict_samples_of_the_same_box(pairs, adapter):
    sampler = Uniform((4, 5), per_file=2)
    if adapter == "iterable":
        ds = NpyIterableDataset(pairs, sampler=sampler, batch_size=4, with_index=True)
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=FORK)
    else:
        ds = NpyMapDataset(pairs, sampler=sampler, with_index=True)
        loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
    seen = 0
    for batch, index in loader:
        assert set(batch) == {"image", "label"}
        assert batch["image"].shape[1:] == (2, 4, 5) and batch["label"].shape[1:] == (4, 5)
        assert batch["image"].dtype == torch.int16 and batch["label"].dtype == torch.uint8
        for j, (f, loc) in enumerate(zip(index["file"].tolist(), index["location"].tolist())):
            np.testing.assert_array_equal(batch["image"][j].numpy(), _expected(pairs["image"], f, loc))
            np.testing.assert_array_equal(batch["label"][j].numpy(), _expected(pairs["label"], f, loc))
        seen += len(index["file"])
    assert seen == 6


def test_samples_without_index_are_bare_tensors(volumes):
    it = NpyIterableDataset(volumes, sampler=Uniform((3, 4)), batch_size=2)
    batches = list(torch.utils.data.DataLoader(it, batch_size=2))
    assert [tuple(b.shape) for b in batches] == [(2, 3, 4), (2, 3, 4), (1, 3, 4)]
    assert isinstance(NpyMapDataset(volumes, sampler=Uniform((3, 4)))[0], torch.Tensor)


def test_refusals(volumes, pairs):
    with pytest.raises(ValueError, match="only with a sampler"):
        NpyIterableDataset(volumes, batch_size=4)
    with pytest.raises(ValueError, match="only with a sampler"):
        NpyIterableDataset(volumes, drop_last=True)
    with pytest.raises(TypeError, match="patch sampler"):
        NpyIterableDataset(volumes, sampler=torch.utils.data.RandomSampler(range(3)))
    with pytest.raises(TypeError, match="only with a sampler"):
        NpyMapDataset(pairs)
    with pytest.raises(npydask.errors.RoiError, match="smaller than the patch"):
        NpyMapDataset(volumes, sampler=Uniform((9, 9)))
    with pytest.raises(ValueError, match="only with a sampler"):
        NpyIterableDataset(volumes).state_dict(0)
    with pytest.raises(ValueError, match="only with a sampler"):
        NpyIterableDataset(volumes).load_state_dict({})
    it = NpyIterableDataset(volumes, sampler=Uniform((4, 4)), batch_size=2, seed=1)
    state = it.state_dict(1)
    for other, named in [
        (NpyIterableDataset(volumes, sampler=Uniform((4, 4)), batch_size=2, seed=2), "another seed"),
        (NpyIterableDataset(volumes, sampler=Uniform((4, 3)), batch_size=2, seed=1), "another sampler"),
        (NpyIterableDataset(volumes, sampler=Uniform((4, 4)), batch_size=2, seed=1, shuffle=True), "another shuffle"),
        (NpyIterableDataset(volumes[1:], sampler=Uniform((4, 4)), batch_size=2, seed=1), "another dataset"),
    ]:
        with pytest.raises(ValueError, match=named):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        it.load_state_dict({"epoch": 0})


@pytest.mark.timeout(120)
def test_grid_tiles_through_workers_stitch_back_the_volumes(volumes):
    from npydask.samplers import Stitcher

    grid = Grid((4, 5), overlap=0.5)
    it = NpyIterableDataset(volumes, sampler=grid, batch_size=3, shuffle=True, with_index=True)  # (Grid ignores it)
    stitcher = Stitcher(grid, volumes, weights="gaussian")
    loader = torch.utils.data.DataLoader(it, batch_size=3, num_workers=2, multiprocessing_context=FORK)
    for batch, index in loader:
        stitcher.add(2 * batch + 1, index)  # the adapters' index as it comes
    for f, result in enumerate(stitcher.result()):
        np.testing.assert_allclose(result, 2 * np.load(volumes.files[f]) + 1, rtol=1e-6)


@pytest.mark.timeout(120)
def test_foreground_patches_of_zipped_volumes_through_workers(pairs, tmp_path):
    from npydask.samplers import Foreground

    sampler = Foreground((3, 3), p=1.0, per_file=4, index=str(tmp_path / "fg.npz"))
    it = NpyIterableDataset(pairs, sampler=sampler, batch_size=4, seed=3, with_index=True)
    loader = torch.utils.data.DataLoader(it, batch_size=4, num_workers=2, multiprocessing_context=FORK)
    seen = []
    for batch, index in loader:
        for j, (f, loc) in enumerate(zip(index["file"].tolist(), index["location"].tolist())):
            np.testing.assert_array_equal(batch["image"][j].numpy(), _expected(pairs["image"], f, loc))
            np.testing.assert_array_equal(batch["label"][j].numpy(), _expected(pairs["label"], f, loc))
            assert batch["label"][j].any()  # p=1: every box holds a labelled voxel
            seen.append((f, tuple(loc)))
    assert seen == _keys(sampler.bind(pairs), 0, range(12), seed=3)


def test_a_map_dataset_takes_a_seed_only_with_a_sampler(volumes):
    with pytest.raises(ValueError, match="seed only with a sampler"):
        NpyMapDataset(volumes, seed=1)


@pytest.mark.timeout(120)
def test_a_zipped_datasets_state_resumes(pairs):
    sampler = Uniform((4, 5), per_file=2)
    it = NpyIterableDataset(pairs, sampler=sampler, batch_size=2, with_index=True)
    state = it.state_dict(1)
    resumed = NpyIterableDataset(pairs, sampler=sampler, batch_size=4, with_index=True)
    resumed.load_state_dict(state)
    got = [k for _, ix in torch.utils.data.DataLoader(resumed, batch_size=4)
           for k in zip(ix["file"].tolist(), map(tuple, ix["location"].tolist()))]  # fmt: skip
    assert got == _keys(sampler.bind(pairs), 0, range(2, 6))
    labels_only = npydask.zip_datasets({"image": pairs["image"], "label": pairs["image"]})
    with pytest.raises(ValueError, match="another dataset"):
        NpyIterableDataset(labels_only, sampler=sampler, batch_size=2).load_state_dict(state)


# NpyIterableDataset(volumes, sampler=Uniform((4, 4), per_file=3), batch_size=2, shuffle=True, seed=4, rank=0,
# world_size=2).state_dict(1) in epoch 2, as saved (the fingerprints hash names relative to the folder)
SAVED = {
    "epoch": 2,
    "position": 4,
    "samples": 15,
    "seed": 4,
    "shuffle": True,
    "sampler": "930b85898377c35b86c577c8bfe5b661",
    "dataset_fingerprint": {
        "files": "2d17c5dfeed01dc86ccdc23f28dfd597",
        "layout": "793b0ef4859e22968b73b73bf9bfff4b",
        "roi": "fc1e79feb1f26444debd353785b78b04",
        "roi_shown": "whole files",
        "key": "None",
        "fill": "none",
    },
}


@pytest.mark.timeout(120)
def test_a_saved_state_keeps_its_format_and_resumes(volumes):
    sampler = Uniform((4, 4), per_file=3)
    it = NpyIterableDataset(volumes, sampler=sampler, batch_size=2, shuffle=True, seed=4, rank=0, world_size=2)
    it.set_epoch(2)
    assert it.state_dict(1) == SAVED and list(it.state_dict(1)) == list(SAVED)
    assert it.state_dict(4) == {**SAVED, "epoch": 3, "position": 0}  # all 8 global batches taken
    resumed = NpyIterableDataset(volumes, sampler=sampler, batch_size=3, shuffle=True, seed=4, with_index=True)
    resumed.load_state_dict(SAVED)
    assert resumed.epoch == 2
    got = [k for b in _batches(resumed, 0) for k in b]
    assert got == _keys(sampler.bind(volumes), 2, range(4, 15), seed=4, shuffle=True)


@pytest.mark.timeout(120)
def test_the_loaders_state_and_the_adapters_resume_each_other(volumes):
    sampler = Uniform((4, 4), per_file=3)
    bound = sampler.bind(volumes)
    loader = npydask.Loader(volumes, 2, sampler=sampler, shuffle=True, seed=4, shard_id=0, num_shards=2)
    loader.set_epoch(2)
    next(iter(loader))
    it = NpyIterableDataset(volumes, sampler=sampler, batch_size=3, shuffle=True, seed=4, with_index=True)
    it.load_state_dict(loader.state_dict())  # position 4 of epoch 2
    got = [k for b in _batches(it, 0, take=2) for k in b]
    assert got == _keys(bound, 2, range(4, 10), seed=4, shuffle=True)
    back = npydask.Loader(volumes, 5, sampler=sampler, shuffle=True, seed=4, with_index=True)
    back.load_state_dict(it.state_dict(2))  # position 10 of epoch 2
    _, index = next(iter(back))
    location = np.concatenate([index["start"], index["stop"]], axis=1)
    assert list(zip(index["file"].tolist(), map(tuple, location.tolist()))) == _keys(
        bound, 2, range(10, 15), seed=4, shuffle=True
    )


@pytest.mark.timeout(240)
def test_saved_at_every_step_at_4x2_resumes_at_2x1_and_3x2_and_then_again_at_1x1(volumes):
    sampler = Uniform((4, 4), per_file=5)
    everything = collections.Counter(_keys(sampler.bind(volumes), 1, range(25), seed=1, shuffle=True))

    def adapter(rank, world, batch, state=None):
        it = NpyIterableDataset(
            volumes,
            sampler=sampler,
            batch_size=batch,
            rank=rank,
            world_size=world,
            seed=1,
            shuffle=True,
            with_index=True,
        )
        if state is not None:
            it.load_state_dict(state)
        it.set_epoch(1 if state is None else state["epoch"])
        return it

    bound = sampler.bind(volumes)
    full = [_batches(adapter(rank, 4, 2), 2) for rank in range(4)]  # 13 global batches, 3 more wrapped: 4 per rank
    assert [len(f) for f in full] == [4, 4, 4, 4]
    for b in range(5):
        state = adapter(0, 4, 2).state_dict(b)
        before = [k for f in full for part in f[:b] for k in part]
        if b == 4:  # the epoch is over: the state is the next epoch's start
            assert (state["epoch"], state["position"]) == (2, 0)
            assert collections.Counter(before) == everything + _tail(bound, 1, 0, 4, 2)
            continue
        for world, workers, batch in [(2, 1, 3), (3, 2, 1)]:
            runs = [_batches(adapter(rank, world, batch, state), workers) for rank in range(world)]
            after = [k for run in runs for part in run for k in part]
            wrapped = _tail(bound, 1, state["position"], world, batch)
            assert collections.Counter(before + after) == everything + wrapped, (b, world, workers, batch)
        # the (3x2) pass saved again after one batch on each rank, resumed at (1x1)
        again = adapter(0, 3, 1, state).state_dict(1)
        taken = [k for run in runs for part in run[:1] for k in part]
        rest = [k for part in _batches(adapter(0, 1, 4, again), 0) for k in part] if again["epoch"] == 1 else []
        assert again["epoch"] == 1 or b == 3  # (b=3: one position remained, which the (3x2) pass's round took)
        wrapped = collections.Counter() if again["epoch"] == 1 else _tail(bound, 1, state["position"], 3, 1)
        assert collections.Counter(before + taken + rest) == everything + wrapped, b


@pytest.mark.timeout(180)
def test_patches_of_objects_in_the_main_process_and_a_spawned_worker(s3):
    space = s3.space()
    arrays = [np.arange(9 * 10, dtype=">i4").reshape(9, 10) * (i + 1) for i in range(3)]
    for i, a in enumerate(arrays):
        s3.put_npy(f"{space}/v{i}.npy", a)
    ds = npydask.open_dataset(f"s3://{space}", storage_options=s3.options)
    sampler = Uniform((4, 5), per_file=2)
    it = NpyIterableDataset(ds, sampler=sampler, batch_size=4, seed=2, with_index=True)
    for workers, context in [(0, None), (1, "spawn")]:
        loader = torch.utils.data.DataLoader(
            it,
            batch_size=4,
            num_workers=workers,
            multiprocessing_context=torch.multiprocessing.get_context(context) if context else None,
        )
        seen = []
        for batch, index in loader:
            for sample, f, (r0, c0, r1, c1) in zip(batch.numpy(), index["file"].tolist(), index["location"].tolist()):
                np.testing.assert_array_equal(sample, arrays[f][r0:r1, c0:c1])
                seen.append((f, (r0, c0, r1, c1)))
        assert seen == _keys(sampler.bind(ds), 0, range(6), seed=2)
    mapped = NpyMapDataset(ds, sampler=sampler, seed=2)
    forked = torch.utils.data.DataLoader(mapped, batch_size=4, num_workers=1, multiprocessing_context=FORK)
    with pytest.raises(RuntimeError, match="spawn"):
        next(iter(forked))


def test_a_sharded_dataset_dealt_to_ranks_again_warns(volumes):
    with pytest.warns(npydask.NpyDaskWarning, match="shards compound"):
        NpyIterableDataset(volumes.shard(0, 2), sampler=Uniform((4, 4)), batch_size=2, rank=0, world_size=2)


@pytest.mark.timeout(120)
def test_npz_members_give_dict_samples_with_their_state(tmp_path):
    members = [{"x": np.arange(2 * 8 * 9, dtype="f4").reshape(2, 8, 9) + i, "m": np.eye(8, 9, k=i, dtype="u1")}
               for i in range(3)]  # fmt: skip
    for i, m in enumerate(members):
        np.savez(tmp_path / f"s{i}.npz", **m)
    ds = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "m"])
    sampler = Uniform((3, 4), per_file=2, policy="pad", fill_value=7)
    it = NpyIterableDataset(ds, sampler=sampler, batch_size=4, with_index=True)
    mapped = NpyMapDataset(ds, sampler=sampler, with_index=True)
    for loader in (torch.utils.data.DataLoader(it, batch_size=4), torch.utils.data.DataLoader(mapped, batch_size=4)):
        for batch, index in loader:
            for j, (f, loc) in enumerate(zip(index["file"].tolist(), index["location"].tolist())):
                for key in ("x", "m"):
                    want = np.full(members[f][key].shape[:-2] + (3, 4), 7, members[f][key].dtype)
                    (r0, c0, r1, c1), a = loc, members[f][key]
                    lo, hi = (max(r0, 0), max(c0, 0)), (min(r1, 8), min(c1, 9))
                    want[..., lo[0] - r0 : hi[0] - r0, lo[1] - c0 : hi[1] - c0] = a[..., lo[0] : hi[0], lo[1] : hi[1]]
                    np.testing.assert_array_equal(batch[key][j].numpy(), want)
    resumed = NpyIterableDataset(ds, sampler=sampler, batch_size=2)
    resumed.load_state_dict(it.state_dict(1))  # the members' fingerprint agrees
    assert (resumed.state_dict(0)["position"], resumed.state_dict(1)["epoch"]) == (4, 1)  # (1 batch was left)


@pytest.mark.timeout(120)
def test_a_spawned_worker_reads_the_share_of_its_parents_torch_distributed_rank(volumes, monkeypatch):
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # rank 1 of 2 here; a spawned child has no group
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    sampler = Uniform((4, 4), per_file=2)
    it = NpyIterableDataset(volumes, sampler=sampler, batch_size=2, with_index=True)
    whole = NpyIterableDataset(volumes)
    clone = pickle.loads(pickle.dumps(whole))  # as a spawned worker receives it
    loader = torch.utils.data.DataLoader(
        it, batch_size=2, num_workers=1, multiprocessing_context=torch.multiprocessing.get_context("spawn")
    )
    got = [k for _, ix in loader for k in zip(ix["file"].tolist(), map(tuple, ix["location"].tolist()))]
    everything = _keys(sampler.bind(volumes), 0, [p % 10 for p in range(12)])  # 3 rounds, the last wrapped
    assert got == [k for g in (1, 3, 5) for k in everything[2 * g : 2 * g + 2]]  # global batches 1, 3 and 5
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    assert clone.indices().tolist() == [2, 3, 4]  # without a sampler: rank 1 of 2's files
