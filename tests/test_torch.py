"""The PyTorch adapter: every sample exactly once per epoch, across ranks and DataLoader workers."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import npydask  # noqa: E402
from npydask.torch import NpyIterableDataset, split_for  # noqa: E402


@pytest.fixture
def folder(tmp_path):
    for i in range(23):
        np.save(tmp_path / f"{i:02d}.npy", np.full((3, 2), i, ">f4" if i % 2 else "<f4").astype(">f4"))
    return tmp_path


def samples(loader):
    out = []
    for batch in loader:
        out += batch[:, 0, 0].to(torch.int64).tolist()
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(120)
def test_each_sample_once_per_epoch(folder, workers):
    ds = npydask.open_dataset(folder)
    it = NpyIterableDataset(ds, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(it, batch_size=4, num_workers=workers)
    epochs = []
    for e in range(2):
        it.set_epoch(e)
        got = samples(loader)
        assert sorted(got) == list(range(23))
        epochs.append(got)
    assert epochs[0] != epochs[1]


@pytest.mark.timeout(120)
def test_forked_workers_give_the_values_numpy_loads(folder):
    ds = npydask.open_dataset(folder)
    ctx = torch.multiprocessing.get_context("fork")
    loader = torch.utils.data.DataLoader(
        NpyIterableDataset(ds, with_index=True), batch_size=5, num_workers=2, multiprocessing_context=ctx
    )
    seen = 0
    for batch, idx in loader:
        expected = np.stack([np.load(ds.files[i]) for i in idx.tolist()]).astype("<f4")
        np.testing.assert_array_equal(batch.numpy(), expected)
        seen += len(idx)
    assert seen == 23


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_split_the_epoch_disjointly(folder, world):
    ds = npydask.open_dataset(folder)
    got = []
    for rank in range(world):
        it = NpyIterableDataset(ds, shuffle=True, rank=rank, world_size=world)
        part = [int(t[0, 0]) for t in it]
        assert len(part) == len(it)
        got += part
    assert sorted(got) == list(range(23))


def test_split_for_covers_every_position():
    for n in (0, 1, 7, 23):
        for world in (1, 2, 3):
            for workers in (1, 2, 5):
                parts = [list(split_for(n, r, world, w, workers)) for r in range(world) for w in range(workers)]
                assert sum(parts, []) == list(range(n))


def test_tensors_share_memory_and_raise_no_warning(folder):
    ds = npydask.open_dataset(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensors = list(NpyIterableDataset(ds, read_size=4))
    assert tensors[0].dtype == torch.float32 and tensors[0].shape == (3, 2)
    base = tensors[0].numpy()
    assert base.flags.writeable and not base.flags.owndata  # a view of the group read: no extra copy


def test_torch_distributed_rank_is_used(folder):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        it = NpyIterableDataset(npydask.open_dataset(folder))
        assert it._share() == (0, 1) and len(it) == 23
    finally:
        dist.destroy_process_group()


def test_bad_arguments(folder):
    ds = npydask.open_dataset(folder)
    with pytest.raises(TypeError, match="NpyDataset"):
        NpyIterableDataset([1])
    with pytest.raises(ValueError, match="together"):
        NpyIterableDataset(ds, rank=0)
    with pytest.raises(ValueError, match="rank"):
        NpyIterableDataset(ds, rank=2, world_size=2)
