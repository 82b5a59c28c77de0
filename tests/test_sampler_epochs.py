"""A sampler's epochs across ranks: equal steps per rank (a real DDP loop), one state per rank, set_epoch after a
resume, a lazy deal, and batches that interleave several files."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import time
import tracemalloc
from collections import Counter

import numpy as np
import pytest
import torch
import torch.distributed as dist

import npydask
from npydask.samplers import Grid, Uniform
from npydask.torch import NpyIterableDataset

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)

SHAPES = [(10 + i, 9) for i in range(9)]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("nine")
    for i, shape in enumerate(SHAPES):
        np.save(root / f"f{i}.npy", np.arange(np.prod(shape), dtype="f4").reshape(shape) + 1000 * i)
    return npydask.open_dataset(root)


def boxes(index):
    """A Loader batch's index as hashable boxes."""
    return [
        (int(f), tuple(a), tuple(b))
        for f, a, b in zip(index["file"].tolist(), index["start"].tolist(), index["stop"].tolist())
    ]


def epoch_boxes(sampler, ds, epoch=0, seed=None, shuffle=False):
    bound = sampler.bind(ds)
    patches = bound.patches(epoch, range(len(bound)), seed=seed, shuffle=shuffle)
    return Counter((p.file, p.start, p.stop) for p in patches)


def check_once_plus_wrap(got, whole, round_size):
    """``got`` holds every box of ``whole`` once, and beyond them only a wrapped tail of under one round."""
    extra = got - whole
    assert got - extra == whole  # every box of the epoch delivered...
    assert sum(extra.values()) < round_size  # ...and only the last round's wrapped ones twice


def _ddp_rank(rank, world, init, root, out):
    """One DDP rank: a Loader and a DataLoader over NpyIterableDataset, one all_reduce per step each."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=4))  # fmt: skip
    try:
        ds = npydask.open_dataset(root)
        sampler = Uniform((4, 4), per_file=3)  # 27 samples: 27 / (2 x 4) is not whole
        steps = [0, 0]
        for _ in npydask.Loader(ds, 4, sampler=sampler, shard_id=rank, num_shards=world, prefetch=0):
            dist.all_reduce(torch.ones(1))  # a rank that ran out would leave the other waiting here
            steps[0] += 1
        it = NpyIterableDataset(ds, sampler=sampler, batch_size=4)  # rank and world size from the process group
        for _ in torch.utils.data.DataLoader(it, batch_size=4):
            dist.all_reduce(torch.ones(1))
            steps[1] += 1
        dist.barrier()
        out.put((rank, steps))
    except Exception as e:  # (reported to the test: a timeout here is the stall)
        out.put((rank, repr(e)))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_a_ddp_loop_takes_equal_steps_on_every_rank(ds, tmp_path):
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    root = os.path.dirname(str(ds.files[0]))
    procs = [context.Process(target=_ddp_rank, args=(r, 2, init, root, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(10)
    assert got == {0: [4, 4], 1: [4, 4]}  # 27 samples in batches of 4 on 2 ranks: 4 rounds, the last wrapped


def test_ranks_get_equal_counts_through_the_loader_and_a_dataloader(ds):
    sampler = Uniform((4, 4), per_file=3)  # 27 samples
    for world, batch, drop_last, count in [(2, 4, False, 4), (3, 2, False, 5), (2, 4, True, 3), (4, 8, True, 0)]:
        counts, lens = set(), set()
        for rank in range(world):
            loader = npydask.Loader(ds, batch, sampler=sampler, shard_id=rank, num_shards=world, drop_last=drop_last)
            got = [len(b) for b in loader]
            it = NpyIterableDataset(ds, sampler=sampler, batch_size=batch, rank=rank, world_size=world,
                                    drop_last=drop_last)  # fmt: skip
            torch_loader = torch.utils.data.DataLoader(it, batch_size=batch, drop_last=drop_last)
            from_torch = [len(b) for b in torch_loader]
            assert got == from_torch == [batch] * count  # every batch full on every rank
            counts.add(len(got))
            lens |= {len(loader), len(torch_loader)}
        assert counts == lens == {count}, (world, batch, drop_last)


def test_an_empty_epoch_after_drop_last_moves_on(ds):
    loader = npydask.Loader(ds, 8, sampler=Uniform((4, 4), per_file=3), num_shards=4, drop_last=True)  # 27 < 32
    assert list(loader) == [] and loader.epoch == 1 and len(loader) == 0
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (2, 0)


def test_the_state_is_the_same_whether_a_rank_stopped_or_ran_out(ds):
    # 5 samples, batch 1, 2 ranks: each rank stops after k batches (rank 0) or runs its loop to its end (rank 1)
    sampler = Uniform((4, 4))
    small = ds[:5]

    def loader(rank, world=2):
        return npydask.Loader(small, 1, sampler=sampler, shard_id=rank, num_shards=world, with_index=True)

    whole = epoch_boxes(sampler, small)
    ran_out = loader(1)
    delivered = [boxes(i) for _, i in ran_out]  # the loop ends by itself
    for k in range(len(delivered) + 1):
        stopped = loader(0)
        it = iter(stopped)
        taken = [boxes(next(it)[1]) for _ in range(k)]
        one = loader(1)
        it1 = iter(one)
        taken += [boxes(next(it1)[1]) for _ in range(k)]
        if k == len(delivered):
            assert next(it1, None) is None  # rank 1 ran out
        assert stopped.state_dict() == one.state_dict()
        if k == len(delivered):
            assert one.state_dict() == ran_out.state_dict()
        resumed = loader(0, 1)
        resumed.load_state_dict(one.state_dict())
        rest = [] if one.state_dict()["epoch"] == 1 else [b for _, i in resumed for b in boxes(i)]
        check_once_plus_wrap(Counter(b for batch in taken for b in batch) + Counter(rest), whole, 2)


@pytest.mark.parametrize("adapter", [False, True])
def test_set_epoch_of_the_resumed_epoch_keeps_the_position(ds, adapter):
    sampler = Uniform((4, 4), per_file=2)  # 18 samples
    bound = sampler.bind(ds)

    def keys(epoch, positions):
        return [(p.file, p.start, p.stop) for p in bound.patches(epoch, list(positions), seed=3, shuffle=True)]

    saver = npydask.Loader(ds, 4, sampler=sampler, seed=3, shuffle=True)
    saver.set_epoch(2)
    it = iter(saver)
    next(it), next(it)
    state = saver.state_dict()
    assert (state["epoch"], state["position"]) == (2, 8)

    def resumed_epoch(*epochs):
        if adapter:
            r = NpyIterableDataset(ds, sampler=sampler, batch_size=4, seed=3, shuffle=True, with_index=True)
        else:
            r = npydask.Loader(ds, 4, sampler=sampler, seed=3, shuffle=True, with_index=True)
        r.load_state_dict(state)
        for e in epochs:
            r.set_epoch(e)
        if adapter:
            got = [(int(ix["file"]), tuple(ix["location"][:2].tolist()), tuple(ix["location"][2:].tolist()))
                   for _, ix in r]  # fmt: skip
            return got
        return [b for _, ix in r for b in boxes(ix)]

    assert resumed_epoch(2) == keys(2, range(8, 18))  # the usual loop's set_epoch resumes the state
    assert resumed_epoch() == keys(2, range(8, 18))
    assert resumed_epoch(1) == keys(1, range(18))  # another epoch starts fresh
    assert resumed_epoch(2, 2) == keys(2, range(18))  # a second call starts the epoch over


def _first_batch_cost(make):
    """Seconds and peak bytes that ``make()``'s first batch takes."""
    tracemalloc.start()
    began = time.perf_counter()
    try:
        next(iter(make()))
        return time.perf_counter() - began, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.timeout(120)
def test_the_deal_is_lazy(ds):
    one = ds[:1]

    def loader(per_file, **kw):
        return lambda: npydask.Loader(one, 4, sampler=Uniform((2, 2), per_file=per_file), prefetch=0, **kw)

    def adapter(per_file):
        return lambda: NpyIterableDataset(one, sampler=Uniform((2, 2), per_file=per_file), batch_size=4)

    huge = 10_000_000
    for make_small, make_huge in [
        (loader(8), loader(huge)),
        (loader(8, num_shards=2, shard_id=1, shuffle=True), loader(huge, num_shards=2, shard_id=1, shuffle=True)),
        (adapter(8), adapter(huge)),
    ]:
        _first_batch_cost(make_small)  # (warm: imports and caches)
        small_s, small_bytes = _first_batch_cost(make_small)
        huge_s, huge_bytes = _first_batch_cost(make_huge)
        assert huge_bytes < small_bytes + 2**20, (small_bytes, huge_bytes)  # not one byte per sample
        assert huge_s < small_s + 0.5, (small_s, huge_s)
    resumed = npydask.Loader(one, 4, sampler=Uniform((2, 2), per_file=huge), prefetch=0, num_shards=3)
    state = resumed.state_dict()
    resumed.load_state_dict({**state, "position": huge // 2})
    assert _first_batch_cost(lambda: resumed)[1] < 2**20 + small_bytes


def test_interleave_mixes_files_in_a_batch_and_delivers_each_sample_once(ds):
    sampler = Uniform((4, 4), per_file=4)  # 36 samples, 9 units
    whole = epoch_boxes(sampler, ds, seed=2, shuffle=True)
    plain = [boxes(i) for _, i in npydask.Loader(ds, 8, sampler=sampler, seed=2, shuffle=True, with_index=True)]
    assert [len({f for f, _, _ in b}) for b in plain][:4] == [2, 2, 2, 2]  # per_file=4, batch 8: two files a batch
    for prefetch in (0, 4, 8):  # batch by batch, and in look-ahead windows
        mixed = npydask.Loader(ds, 8, sampler=sampler, seed=2, shuffle=True, with_index=True, interleave=8,
                               prefetch=prefetch)  # fmt: skip
        got = [boxes(i) for _, i in mixed]
        assert [len({f for f, _, _ in b}) for b in got][:4] == [8, 8, 8, 8]  # eight files a batch
        assert Counter(b for batch in got for b in batch) == whole  # every sample once
        assert mixed.state_dict()["interleave"] == 8
    # resume at another world size, then once more at one rank
    first = [npydask.Loader(ds, 3, sampler=sampler, seed=2, shuffle=True, with_index=True, interleave=8,
                            shard_id=k, num_shards=2) for k in range(2)]  # fmt: skip
    before = Counter()
    for loader in first:
        it = iter(loader)
        for _ in range(2):
            before.update(boxes(next(it)[1]))
    state = first[0].state_dict()
    assert state == first[1].state_dict() and state["position"] == 12
    after = Counter()
    for k in range(3):
        loader = npydask.Loader(ds, 5, sampler=sampler, seed=2, shuffle=True, with_index=True, interleave=8,
                                shard_id=k, num_shards=3)  # fmt: skip
        loader.load_state_dict(state)
        after.update(b for _, i in loader for b in boxes(i))
    assert sum((before + after - whole).values()) == 6  # positions 12-35 in 2 rounds of 15: 6 wrapped
    check_once_plus_wrap(before + after, whole, 5 * 3)
    with pytest.raises(ValueError, match=r"another interleave \(the state's 8, this loader's 4\)"):
        npydask.Loader(ds, 2, sampler=sampler, seed=2, shuffle=True, interleave=4).load_state_dict(state)
    with pytest.raises(ValueError, match="another interleave"):
        npydask.Loader(ds, 2, sampler=sampler, seed=2, shuffle=True).load_state_dict(state)


def test_interleave_through_the_adapter_and_its_refusals(ds):
    sampler = Uniform((4, 4), per_file=4)
    it = NpyIterableDataset(ds, sampler=sampler, batch_size=8, interleave=8, with_index=True)
    files = [ix["file"].tolist() for _, ix in torch.utils.data.DataLoader(it, batch_size=8, num_workers=0)]
    assert [len(set(f)) for f in files][:4] == [8, 8, 8, 8]
    assert Counter(f for b in files for f in b) == Counter({f: 4 for f in range(9)})
    assert it.state_dict(1)["interleave"] == 8
    resumed = npydask.Loader(ds, 5, sampler=sampler, interleave=8, with_index=True)
    resumed.load_state_dict(it.state_dict(2))  # the adapter's state resumes the Loader
    assert Counter(f for _, i in resumed for f in i["file"].tolist()) == Counter(f for b in files[2:] for f in b)
    with pytest.raises(ValueError, match="interleave=2 mixes the per_file patches of several files, but Grid"):
        npydask.Loader(ds, 2, sampler=Grid((4, 4)), interleave=2)
    with pytest.raises(ValueError, match="interleave=2 mixes the per_file patches of several files, but Grid"):
        NpyIterableDataset(ds, sampler=Grid((4, 4)), interleave=2)
    with pytest.raises(ValueError, match="applies only with sampler="):
        npydask.Loader(ds, 2, interleave=2)
    with pytest.raises(ValueError, match="interleave must be at least 1"):
        npydask.Loader(ds, 2, sampler=sampler, interleave=0)


def test_interleaved_files_are_read_once_per_window(ds):
    # per_file=4, batches of 8, interleave=8: a block of 8 files is 4 batches; a look-ahead window of 4 batches
    # (prefetch=8) reads each of its files once, as many reads as without interleave, where batch by batch each
    # file is read in each of the 4 batches
    sampler = Uniform((4, 4), per_file=4)

    def requests(interleave, prefetch):
        loader = npydask.Loader(ds[:8], 8, sampler=sampler, interleave=interleave, prefetch=prefetch)
        with npydask.config.set(patch_read="spans"):
            batches = list(loader)
        assert len(batches) == 4
        return loader.stats().requests

    windowed = requests(8, 8)
    assert windowed == requests(1, 8) and requests(8, 2) > windowed
