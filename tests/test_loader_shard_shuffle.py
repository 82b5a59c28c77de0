"""shuffle="shard": each shard permutes only its own range, so it reads the same files every epoch."""

from __future__ import annotations

import numpy as np
import pytest

import npydask
from npydask.plan.sampling import shard_range
from npydask.torch import NpyIterableDataset


@pytest.fixture
def folder(tmp_path):
    """Ten files; file i holds i in every cell, so a batch names its files."""
    for i in range(10):
        np.save(tmp_path / f"{i:02d}.npy", np.full((2, 3), i, "<i4"))
    return tmp_path


def epoch(loader):
    return [b[:, 0, 0].tolist() for b in loader]


@pytest.mark.parametrize("pad", [False, True])
def test_each_shard_reads_its_own_files_every_epoch_in_a_new_order(folder, pad):
    ds = npydask.open_dataset(folder)
    loaders = [
        npydask.Loader(ds, 2, shuffle="shard", seed=3, shard_id=k, num_shards=3, pad_last_batch=pad) for k in range(3)
    ]
    orders = {k: [] for k in range(3)}
    for _ in range(4):
        seen = []
        for k, loader in enumerate(loaders):
            got = sum(epoch(loader), [])
            own = list(shard_range(10, k, 3))
            assert set(got) == set(own)  # exactly its own files
            if pad:  # padded to ceil(10/3)=4 rounded to whole batches, with the shard's last sample
                assert len(got) == 4 and got[: len(own)] != [] and sorted(got[: len(own)]) == own
                assert all(x == got[len(own) - 1] for x in got[len(own) :])
            else:
                assert sorted(got) == own
            orders[k].append(got[: len(own)])
            seen += got[: len(own)]
        assert sorted(seen) == list(range(10))  # the shards together: the whole dataset once
    for k in range(3):
        assert len({tuple(o) for o in orders[k]}) > 1, orders[k]  # the order changes between epochs
    # values are the files' (numpy is the oracle)
    arrays = [np.load(folder / f"{i:02d}.npy") for i in range(10)]
    loader = npydask.Loader(ds, 2, shuffle="shard", shard_id=1, num_shards=3, with_index=True)
    for batch, index in loader:
        np.testing.assert_array_equal(batch, np.stack([arrays[i] for i in index]))


def test_the_same_seed_and_epoch_give_the_same_order_on_a_new_loader(folder):
    ds = npydask.open_dataset(folder)
    first = npydask.Loader(ds, 3, shuffle="shard", seed=5, shard_id=1, num_shards=2)
    first.set_epoch(7)
    again = npydask.Loader(ds, 3, shuffle="shard", seed=5, shard_id=1, num_shards=2)
    again.set_epoch(7)
    assert epoch(first) == epoch(again)
    default = [epoch(npydask.Loader(ds, 3, shuffle="shard", shard_id=0, num_shards=2)) for _ in range(2)]
    assert default[0] == default[1] and sorted(sum(default[0], [])) == [0, 1, 2, 3, 4]


def test_resume_mid_epoch_delivers_the_rest_once_and_refuses_another_num_shards(folder):
    ds = npydask.open_dataset(folder)
    full = npydask.Loader(ds, 1, shuffle="shard", seed=9, shard_id=1, num_shards=2)
    full.set_epoch(3)
    expected = epoch(full)
    loader = npydask.Loader(ds, 1, shuffle="shard", seed=9, shard_id=1, num_shards=2)
    loader.set_epoch(3)
    it = iter(loader)
    head = [next(it)[:, 0, 0].tolist() for _ in range(2)]
    state = loader.state_dict()
    del it
    assert state["shuffle"] == "shard" and state["num_shards"] == 2 and state["batches_done"] == 2
    fresh = npydask.Loader(ds, 1, shuffle="shard", seed=9, shard_id=1, num_shards=2)
    fresh.load_state_dict(state)
    rest = epoch(fresh)
    assert head + rest == expected and sorted(sum(head + rest, [])) == [5, 6, 7, 8, 9]
    other = npydask.Loader(ds, 1, shuffle="shard", seed=9, shard_id=1, num_shards=5)
    with pytest.raises(ValueError, match=r"num_shards=2.*num_shards=5.*range"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle"):  # a whole-list shuffle's state is another plan
        npydask.Loader(ds, 1, shuffle=True, seed=9, shard_id=1, num_shards=2).load_state_dict(state)


def test_saved_states_keep_their_format(folder):
    ds = npydask.open_dataset(folder)
    plan = {"n": 10, "batch_size": 2, "seed": 4, "shard_id": 0, "num_shards": 2, "pad_last_batch": False}
    plan |= {"drop_last": False, "stick_to_shard": True, "epoch": 1, "batches_done": 1}
    for shuffle in (False, True, "shard"):
        state = npydask.Loader(ds, 2, shuffle=shuffle, seed=4, num_shards=2).state_dict()
        state.pop("dataset_fingerprint")
        assert state == dict(plan, shuffle=shuffle, epoch=0, batches_done=0)
        assert type(state["shuffle"]) is type(shuffle)
    old = dict(plan, shuffle=True)  # saved before "shard" existed (and before the fingerprint)
    old.pop("stick_to_shard")
    loader = npydask.Loader(ds, 2, shuffle=True, seed=4, num_shards=2)
    with pytest.warns(npydask.NpyDaskWarning, match="no dataset fingerprint"):
        loader.load_state_dict(old)
    order = np.random.default_rng([4, 1]).permutation(10)[:5].tolist()
    assert sum(epoch(loader), []) == order[2:]
    literal = dict(plan, shuffle="shard")
    loader = npydask.Loader(ds, 2, shuffle="shard", seed=4, num_shards=2)
    with pytest.warns(npydask.NpyDaskWarning, match="no dataset fingerprint"):
        loader.load_state_dict(literal)
    order = (np.random.default_rng([4, 1, 0, 5]).permutation(5)).tolist()
    assert sum(epoch(loader), []) == order[2:]


def test_bad_values_and_a_sampler_are_refused(folder):
    ds = npydask.open_dataset(folder)
    for bad in ("shards", "Shard", None, 2, "true"):
        with pytest.raises(ValueError, match=r"Loader: shuffle must be one of \(False, True, 'shard'\).*found"):
            npydask.Loader(ds, 2, shuffle=bad)
        with pytest.raises(ValueError, match=r"shuffle must be one of"):
            NpyIterableDataset(ds, shuffle=bad)
    sampler = npydask.samplers.Uniform((1, 2))
    with pytest.raises(ValueError, match=r"sampler.*whole dataset.*open_dataset\(\.\.\., shard_id=, num_shards=\)"):
        npydask.Loader(ds, 2, shuffle="shard", sampler=sampler)
    with pytest.raises(ValueError, match=r"sampler.*whole dataset"):
        NpyIterableDataset(ds, shuffle="shard", sampler=sampler)
    with pytest.raises(ValueError, match="stick_to_shard=False"):
        npydask.Loader(ds, 2, shuffle="shard", num_shards=2, stick_to_shard=False)


def test_the_iterable_adapter_permutes_inside_each_ranks_range(folder):
    ds = npydask.open_dataset(folder)
    for rank in range(3):
        orders = []
        for e in range(3):
            it = NpyIterableDataset(ds, shuffle="shard", seed=2, rank=rank, world_size=3)
            it.set_epoch(e)
            got = [int(t[0, 0]) for t in it]
            assert sorted(got) == list(shard_range(10, rank, 3))
            orders.append(got)
            loader = npydask.Loader(ds, 1, shuffle="shard", seed=2, shard_id=rank, num_shards=3)
            loader.set_epoch(e)
            assert sum(epoch(loader), []) == got  # the Loader's order
        assert len({tuple(o) for o in orders}) > 1
