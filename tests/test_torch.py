"""The PyTorch adapter: every sample exactly once per epoch, across ranks and DataLoader workers."""

from __future__ import annotations

import re
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


# -- every ndim and every dtype torch holds (issue 13, item 2) -----------------------------------

TORCH_DTYPES = ["|b1", "|u1", "|i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "c8", "c16"]


def _values(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype.newbyteorder("="), endpoint=True).astype(dtype)
    real = rng.normal(0, 1e3, shape)
    if dtype.kind == "c":
        real = real + 1j * rng.normal(0, 1e3, shape)
    return np.asarray(real).astype(dtype)


def _write_samples(root, dtype, shape, n=7):
    root.mkdir(exist_ok=True)
    for i in range(n):
        np.save(root / f"{i}.npy", _values(dtype, shape, i))
    return npydask.open_dataset(root)


def _assert_sample(tensor, path):
    expected = np.load(path)
    got = tensor.numpy()
    assert got.shape == expected.shape and got.dtype == expected.dtype.newbyteorder("=")
    np.testing.assert_array_equal(got, expected)


BOTH_ORDERS = [
    c if c.startswith("|") else o + c for c in TORCH_DTYPES for o in "<>" if o == "<" or not c.startswith("|")
]


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 1, 3)])
@pytest.mark.parametrize("code", BOTH_ORDERS)
def test_every_dtype_and_ndim_comes_back_as_numpy_loads_it(tmp_path, code, shape):
    dtype = np.dtype(code)
    ds = _write_samples(tmp_path / "d", dtype, shape)
    from npydask.torch import NpyMapDataset

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        iterated = list(NpyIterableDataset(ds, with_index=True, read_size=3))
        mapped = NpyMapDataset(ds, with_index=True)
        picked = [mapped[i] for i in range(len(ds))] + mapped.__getitems__([6, 0, 3])
    assert [i for _, i in iterated] == list(range(7))
    for tensor, i in iterated + picked:
        _assert_sample(tensor, ds.files[i])


def test_zero_d_samples_through_a_dataloader(tmp_path):
    """The reported case: a scalar label per file, batched by a DataLoader."""
    ds = _write_samples(tmp_path / "y", np.dtype("<i8"), ())
    from npydask.torch import NpyMapDataset

    for dataset in (NpyIterableDataset(ds), NpyMapDataset(ds)):
        (batch,) = list(torch.utils.data.DataLoader(dataset, batch_size=7))
        assert batch.shape == (7,) and batch.dtype == torch.int64
        np.testing.assert_array_equal(batch.numpy(), [np.load(f) for f in ds.files])


@pytest.mark.parametrize(
    ("code", "name"),
    [("S3", "bytes"), ("U2", "str"), ("V4", "void"), ("i4,f4", "structured"), ("M8[s]", "datetime64"),
     ("m8[ms]", "timedelta64"), ("g", "float128"), ("G", "complex256")],
)  # fmt: skip
def test_dtypes_torch_cannot_hold_are_refused_by_name(tmp_path, code, name):
    dtype = np.dtype(code)
    if name in ("float128", "complex256") and dtype.itemsize <= 8:
        pytest.skip("longdouble is double on this platform")
    root = tmp_path / "d"
    root.mkdir()
    for i in range(2):
        np.save(root / f"{i}.npy", np.zeros((2,), dtype))
    ds = npydask.open_dataset(root)
    from npydask.torch import NpyMapDataset

    for adapter in (NpyIterableDataset, NpyMapDataset):
        with pytest.raises(TypeError, match=rf"(?s){name}.*{re.escape(ds.files[0])}.*Loader"):
            adapter(ds)


def test_sharding_twice_warns(folder):
    ds = npydask.open_dataset(folder, shard_id=1, num_shards=2)
    with pytest.warns(npydask.NpyDaskWarning, match=r"already shard 1 of 2.*1/4"):
        NpyIterableDataset(ds, rank=0, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NpyIterableDataset(ds)  # one share: nothing compounds
        NpyIterableDataset(npydask.open_dataset(folder), rank=0, world_size=2)


# -- set_epoch reaches DataLoader workers, persistent ones included (issue 13, item 3) ------------


@pytest.mark.parametrize(
    ("workers", "persistent", "context"),
    [(0, False, None), (1, True, "fork"), (3, True, "fork"), (3, False, "fork"), (1, True, "spawn")],
)
@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on a 2-core machine
def test_set_epoch_reaches_persistent_workers(folder, workers, persistent, context):
    from npydask.plan.sampling import epoch_order

    ds = npydask.open_dataset(folder)
    it = NpyIterableDataset(ds, shuffle=True, seed=3)
    ctx = torch.multiprocessing.get_context(context) if context else None
    loader = torch.utils.data.DataLoader(
        it, batch_size=4, num_workers=workers, persistent_workers=persistent, multiprocessing_context=ctx
    )
    orders = []
    for e in range(3):
        it.set_epoch(e)
        got = samples(loader)
        assert sorted(got) == list(range(23)), f"epoch {e}: {got}"
        if workers <= 1:
            assert got == epoch_order(23, e, shuffle=True, seed=3).tolist()
        orders.append(got)
    assert len({tuple(o) for o in orders}) == 3, orders  # every epoch a different order
    it.set_epoch(1)
    assert samples(loader) == orders[1]  # set_epoch(e) is reproducible
    assert it.epoch == 1


def test_the_epoch_survives_pickling_outside_process_start(folder):
    import copy
    import pickle

    it = NpyIterableDataset(npydask.open_dataset(folder), shuffle=True)
    it.set_epoch(5)
    for clone in (pickle.loads(pickle.dumps(it)), copy.deepcopy(it)):
        assert clone.epoch == 5
        clone.set_epoch(6)  # a copy made outside process start has its own epoch
    assert it.epoch == 5


# -- a map-style dataset for samplers (issue 13, item 5) ----------------------------------------


@pytest.fixture
def folder24(tmp_path):
    for i in range(24):
        np.save(tmp_path / f"{i:02d}.npy", np.full((2, 3), i, ">i4"))
    return tmp_path


def _check_batches(loader, ds):
    seen = []
    for batch, idx in loader:
        expected = np.stack([np.load(ds.files[i]) for i in idx.tolist()])
        np.testing.assert_array_equal(batch.numpy(), expected)
        assert batch.dtype == torch.int32
        seen += idx.tolist()
    return seen


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(180)
def test_map_dataset_with_shuffle(folder24, workers):
    from npydask.torch import NpyMapDataset

    ds = npydask.open_dataset(folder24)
    mapped = NpyMapDataset(ds, with_index=True)
    assert len(mapped) == 24
    loader = torch.utils.data.DataLoader(mapped, batch_size=5, shuffle=True, num_workers=workers)
    first, second = _check_batches(loader, ds), _check_batches(loader, ds)
    assert sorted(first) == sorted(second) == list(range(24)) and first != second


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(180)
def test_map_dataset_with_weighted_random_sampler(folder24, workers):
    from npydask.torch import NpyMapDataset

    ds = npydask.open_dataset(folder24)
    weights = [0.0 if i % 3 else 1.0 for i in range(24)]  # only every third file can be drawn
    sampler = torch.utils.data.WeightedRandomSampler(weights, num_samples=40, replacement=True)
    loader = torch.utils.data.DataLoader(
        NpyMapDataset(ds, with_index=True), batch_size=8, sampler=sampler, num_workers=workers
    )
    seen = _check_batches(loader, ds)
    assert len(seen) == 40 and {i % 3 for i in seen} == {0}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(240)
def test_map_dataset_with_distributed_sampler(folder24, workers):
    from npydask.torch import NpyMapDataset

    ds = npydask.open_dataset(folder24)
    mapped = NpyMapDataset(ds, with_index=True)
    for epoch in range(2):
        seen = []
        for rank in range(3):
            sampler = torch.utils.data.distributed.DistributedSampler(mapped, num_replicas=3, rank=rank, seed=4)
            sampler.set_epoch(epoch)
            part = _check_batches(
                torch.utils.data.DataLoader(mapped, batch_size=3, sampler=sampler, num_workers=workers), ds
            )
            assert len(part) == 8
            seen += part
        assert sorted(seen) == list(range(24))  # every sample once across the three ranks


def test_map_dataset_reads_each_batch_with_one_call(folder24, monkeypatch):
    import npydask.torch as adapter
    import npydask.torch._common as common  # (where the adapters read whole files)

    calls = []
    real = common.read_batch
    monkeypatch.setattr(
        common, "read_batch", lambda views, device="cpu": calls.append(len(views)) or real(views, device)
    )
    ds = npydask.open_dataset(folder24)
    loader = torch.utils.data.DataLoader(adapter.NpyMapDataset(ds), batch_size=10)
    got = [b[:, 0, 0].tolist() for b in loader]
    assert got == [list(range(10)), list(range(10, 20)), list(range(20, 24))]
    assert calls == [10, 10, 4]


def test_map_dataset_indices(folder24):
    from npydask.torch import NpyMapDataset

    mapped = NpyMapDataset(npydask.open_dataset(folder24))
    assert int(mapped[-1][0, 0]) == 23 and int(mapped[np.int64(2)][0, 0]) == 2
    with pytest.raises(IndexError, match="24"):
        mapped[24]
    with pytest.raises(TypeError, match="integer"):
        mapped[1.5]
    with pytest.raises(TypeError, match="NpyDataset"):
        NpyMapDataset([1, 2])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(120)
def test_an_npydataset_given_straight_to_a_dataloader_names_both_adapters(folder24, workers):
    ds = npydask.open_dataset(folder24)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers)
    with pytest.raises(TypeError, match=r"(?s)NpyMapDataset.*NpyIterableDataset"):
        next(iter(loader))
