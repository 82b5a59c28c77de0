"""to_zarr: zarr v3 round trips equal numpy, and every task writes whole shards.

The layout planner is pure and tested without zarr; everything that writes
needs zarr (the ``zarr`` fixture skips without it).
"""

from __future__ import annotations

import collections
import math
import sys
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from dask.delayed import Delayed
from hypothesis import given
from hypothesis import strategies as st

import npydask
from npydask.write import zarr as zarr_writer
from npydask.write.zarr import ZarrLayout, covers_whole_units, plan_zarr_layout, to_zarr

MiB = 1 << 20


@pytest.fixture
def zarr():
    return pytest.importorskip("zarr", minversion="3.0")


def random_array(shape, dtype, seed=0):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, math.prod(shape) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw = raw % 2
    return np.frombuffer(raw.tobytes(), dtype=dtype).reshape(shape)


def same(got, want):
    """Equal dtype, shape and bytes (so NaNs and NaTs compare).

    zarr v3 keeps byte order in the ``bytes`` codec, not in the data type: a
    big-endian array reads back in native order, with equal values.
    """
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype.names is None:
        want = want.astype(want.dtype.newbyteorder("="))
    assert got.dtype.str == want.dtype.str, (got.dtype, want.dtype)
    assert got.shape == want.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def assert_whole_units(layout: ZarrLayout):
    for sizes, unit, n in zip(layout.dask_chunks, layout.write_unit, layout.shape):
        assert sum(sizes) == n
        assert covers_whole_units(sizes, unit, n), (sizes, unit)


# ------------------------------------------------------------------------------------------
# The pure planner (no zarr needed)

PLANS = [
    # (shape, dask chunks, kwargs, zarr chunks, shards, dask chunks after)
    ((10, 6), ((4, 4, 2), (6,)), {}, (4, 6), None, ((4, 4, 2), (6,))),  # regular: kept
    ((10,), ((3, 5, 2),), {}, (5,), None, ((5, 5),)),  # irregular, gcd 1: rechunked
    ((350,), ((100, 50, 100, 100),), {}, (50,), None, ((100, 50, 100, 100),)),  # gcd 50 >= 100/2: kept
    ((17,), ((5, 5, 7),), {}, (5,), None, ((5, 5, 7),)),  # a longer last chunk still covers whole chunks
    ((100,), ((7,) * 14 + (2,),), {"chunks": (10,)}, (10,), None, ((10,) * 10,)),
    ((100,), ((20,) * 5,), {"chunks": (10,)}, (10,), None, ((20,) * 5,)),  # already whole chunks
    ((100,), ((30, 30, 30, 10),), {"shards": (20,), "chunks": (5,)}, (5,), (20,), ((40, 40, 20),)),
    ((100,), ((7,) * 14 + (2,),), {"shards": (20,), "chunks": (5,)}, (5,), (20,), ((20,) * 5,)),
    ((64,), ((16,) * 4,), {"shards": "auto", "chunks": (8,)}, (8,), (16,), ((16,) * 4,)),
    ((64,), ((12,) * 5 + (4,),), {"shards": "auto", "chunks": (8,)}, (8,), (16,), ((16,) * 4,)),
    ((64,), ((16,) * 4,), {"shards": {"shape": (32,), "index_location": "start"}}, (32,), (32,), ((32, 32),)),
    ((5, 7), ((5,), (7,)), {"chunks": 100}, (100, 100), None, ((5,), (7,))),  # chunks past the edge
    ((), (), {}, (), None, ()),
    ((0, 3), ((0,), (3,)), {}, (1, 3), None, ((0,), (3,))),
    ((4, 0), ((2, 2), (0,)), {"shards": (2, 4), "chunks": (1, 2)}, (1, 2), (2, 4), ((2, 2), (0,))),
]


@pytest.mark.parametrize(("shape", "dask_chunks", "kwargs", "chunks", "shards", "after"), PLANS)
def test_plan_table(shape, dask_chunks, kwargs, chunks, shards, after):
    lay = plan_zarr_layout(shape, dask_chunks, 8, **kwargs)
    assert (lay.chunks, lay.shards, lay.dask_chunks) == (chunks, shards, after)
    assert lay.rechunk == (after != dask_chunks)
    assert_whole_units(lay)


def test_plan_picks_inner_chunks_inside_given_shards():
    lay = plan_zarr_layout((4096, 4096), ((1024,) * 4, (1024,) * 4), 4, shards=(2048, 1024))
    assert lay.shards == (2048, 1024)
    assert all(s % c == 0 for s, c in zip(lay.shards, lay.chunks))
    assert math.prod(lay.chunks) * 4 <= MiB
    assert lay.dask_chunks == ((2048, 2048), (1024,) * 4)  # 1024 rounds up to one whole shard


def test_plan_keeps_tasks_near_their_size():
    # 1 MiB dask chunks straddling 384 KiB shards become the nearest multiple (3 shards), not one huge task.
    lay = plan_zarr_layout((1 << 20,), ((1 << 18,) * 4,), 4, shards=(96 << 10,), chunks=(1 << 10,))
    assert set(lay.dask_chunks[0][:-1]) == {3 * (96 << 10)}
    assert_whole_units(lay)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunks": (2,)}, "tuple of 2 positive ints"),
        ({"chunks": (2, 0)}, "positive ints"),
        ({"chunks": (True, 2)}, "positive ints"),
        ({"chunks": "big"}, "'auto' or None"),
        ({"shards": "many"}, "'auto' or None"),
        ({"shards": {"index_location": "end"}}, "'shape' entry"),
        ({"shards": (6, 4), "chunks": (4, 4)}, "multiple of chunks"),
    ],
)
def test_plan_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_zarr_layout((8, 8), ((4, 4), (8,)), 4, **kwargs)


def test_plan_refuses_unknown_or_inconsistent_chunks():
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        plan_zarr_layout((8,), ((math.nan, math.nan),), 4)
    with pytest.raises(ValueError, match="do not add up"):
        plan_zarr_layout((8,), ((4, 3),), 4)


@st.composite
def axis_plans(draw):
    sizes = tuple(draw(st.lists(st.integers(0, 40), min_size=1, max_size=8)))
    unit = draw(st.integers(1, 50))
    return sizes, unit


@given(st.lists(axis_plans(), min_size=1, max_size=3), st.sampled_from(["chunks", "shards", None]))
def test_plan_always_covers_whole_units(axes, kind):
    shape = tuple(sum(s) for s, _ in axes)
    chunks = tuple(s for s, _ in axes)
    units = tuple(u for _, u in axes)
    kwargs = {} if kind is None else {kind: units}
    if kind == "shards":
        kwargs["chunks"] = tuple(1 for _ in units)
    lay = plan_zarr_layout(shape, chunks, 8, **kwargs)
    assert_whole_units(lay)
    for before, after, unit, n in zip(chunks, lay.dask_chunks, lay.write_unit, shape):
        if covers_whole_units(before, unit, n):
            assert after == before  # aligned axes never move data
        else:  # regular, and the multiple of the unit nearest the largest chunk
            assert len(set(after[:-1])) <= 1 and abs(after[0] - max(before)) <= max(unit / 2, unit - max(before))


# ------------------------------------------------------------------------------------------
# Writing (needs zarr)

DTYPES = ["<f4", ">f8", "i1", "<u2", ">i8", "?", "c8", ">c16", "f2", "<M8[ns]", ">m8[s]"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_dtypes(zarr, tmp_path, dtype):
    a = random_array((13, 7), dtype, seed=len(dtype))
    to_zarr(da.from_array(a, chunks=(4, 3)), str(tmp_path / "a.zarr"))
    z = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    assert z.metadata.zarr_format == 3 and z.chunks == (4, 3) and z.shards is None
    same(z[...], a)


@pytest.mark.parametrize(
    ("shape", "chunks", "kwargs"),
    [
        ((100,), ((3, 5, 2, 40, 50),), {}),
        ((30, 20), ((7, 7, 7, 9), (20,)), {"chunks": (5, 10)}),
        ((30, 20), ((7, 7, 7, 9), (3, 17)), {"shards": (10, 10), "chunks": (5, 5)}),
        ((9, 8, 7), ((2, 7), (3, 5), (7,)), {"shards": "auto"}),
        ((25, 4), ((6, 6, 6, 7), (4,)), {"shards": {"shape": (10, 4), "index_location": "start"}, "chunks": (5, 2)}),
        ((), (), {}),
        ((0, 5), ((0,), (5,)), {"shards": (2, 4), "chunks": (1, 2)}),
    ],
)
def test_round_trip_layouts(zarr, shape, chunks, kwargs):
    a = random_array(shape, "<i4", seed=1)
    store = zarr.storage.MemoryStore()
    to_zarr(da.from_array(a, chunks=chunks), store, name="grp/arr", **kwargs)
    z = zarr.open_array(store, path="grp/arr", mode="r")
    same(z[...], a)
    lay = plan_zarr_layout(shape, chunks, 4, chunks=kwargs.get("chunks"), shards=kwargs.get("shards"))
    assert z.chunks == lay.chunks and z.shards == lay.shards
    if isinstance(kwargs.get("shards"), dict):
        assert z.metadata.codecs[0].index_location.value == "start"


def test_numpy_input_and_keyword_passthrough(zarr):
    a = np.arange(60, dtype="<f8").reshape(6, 10)
    store = zarr.storage.MemoryStore()
    to_zarr(a, store, compressors=None, fill_value=-1.0, attributes={"units": "m"}, dimension_names=("y", "x"))
    z = zarr.open_array(store, mode="r")
    same(z[...], a)
    assert z.attrs["units"] == "m" and z.metadata.dimension_names == ("y", "x") and z.compressors == ()


class CountingStore:
    """A MemoryStore that counts how often each key is written."""

    @staticmethod
    def make(zarr):
        class _Counting(zarr.storage.MemoryStore):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.writes = collections.Counter()

            async def set(self, key, value, byte_range=None):
                self.writes[key] += 1
                await super().set(key, value, byte_range)

        return _Counting()


def shard_writes(store):
    return {k: n for k, n in store.writes.items() if not k.endswith("zarr.json")}


def test_straddling_chunks_are_rechunked_so_each_shard_is_written_once(zarr):
    a = random_array((60, 24), "<f4", seed=3)
    x = da.from_array(a, chunks=(7, 5))  # straddles every (10, 12) shard
    store = CountingStore.make(zarr)
    to_zarr(x, store, shards=(10, 12), chunks=(5, 4), compressors=None)
    z = zarr.open_array(store, mode="r")
    same(z[...], a)
    writes = shard_writes(store)
    assert len(writes) == 6 * 2 and set(writes.values()) == {1}, writes


def test_the_counting_store_sees_the_race_that_alignment_prevents(zarr):
    # The hazard itself: writing the same straddling blocks unaligned sets some shards several times
    # (each a read-modify-write that a concurrent task can undo).
    a = random_array((60, 24), "<f4", seed=3)
    store = CountingStore.make(zarr)
    z = zarr.create_array(store, shape=a.shape, dtype=a.dtype, chunks=(5, 4), shards=(10, 12), compressors=None)
    for i in range(0, 60, 7):
        for j in range(0, 24, 5):
            z[i : i + 7, j : j + 5] = a[i : i + 7, j : j + 5]
    assert max(shard_writes(store).values()) > 1


def test_every_task_writes_whole_shards(zarr, monkeypatch):
    regions = []
    write = zarr_writer._write_block

    def spy(block, target, unit, block_info=None):
        regions.append(tuple(block_info[0]["array-location"]))
        return write(block, target, unit, block_info)

    monkeypatch.setattr(zarr_writer, "_write_block", spy)
    a = random_array((50, 33), "<i2", seed=4)
    store = zarr.storage.MemoryStore()
    to_zarr(da.from_array(a, chunks=(9, 13)), store, shards=(10, 11), chunks=(5, 11))
    same(zarr.open_array(store, mode="r")[...], a)
    assert sum(math.prod(b - s for s, b in r) for r in regions) == a.size  # a partition, no overlap
    for r in regions:
        for (start, stop), unit, n in zip(r, (10, 11), a.shape):
            assert start % unit == 0 and (stop % unit == 0 or stop == n), r


def test_from_npy_source(zarr, tmp_path):
    a = random_array((40, 30, 6), ">f4", seed=5)
    np.save(tmp_path / "v.npy", a)
    x = npydask.from_npy(tmp_path / "v.npy", chunks=(7, 30, 6))
    to_zarr(x, tmp_path / "v.zarr", shards=(10, 30, 6), chunks=(5, 15, 6))
    z = zarr.open_array(str(tmp_path / "v.zarr"), mode="r")
    assert z.shards == (10, 30, 6)
    same(z[...], np.load(tmp_path / "v.npy"))


def test_compute_false_is_lazy(zarr, tmp_path):
    a = np.arange(1, 101, dtype="<i8")
    path = str(tmp_path / "lazy.zarr")
    d = to_zarr(da.from_array(a, chunks=25), path, compute=False)
    assert isinstance(d, Delayed)
    z = zarr.open_array(path, mode="r")  # the metadata exists at call time, the data not yet
    assert z.shape == (100,) and not z[...].any()
    assert dask.compute(d) == (None,)
    same(zarr.open_array(path, mode="r")[...], a)


def test_existing_array_needs_overwrite(zarr, tmp_path):
    path = str(tmp_path / "a.zarr")
    to_zarr(np.zeros(4), path)
    with pytest.raises(zarr.errors.ContainsArrayError):
        to_zarr(np.ones(4), path)
    to_zarr(np.ones(4), path, overwrite=True)
    same(zarr.open_array(path, mode="r")[...], np.ones(4))


@pytest.mark.parametrize("dtype", ["S4", "<U3", "V3", [("a", "<i4"), ("b", "<f8"), ("c", "S2")]])
def test_unstable_dtypes_are_written_with_zarrs_warning(zarr, dtype):
    a = random_array((12,), dtype, seed=6)
    if a.dtype.kind == "U":
        a = np.array(["ab", "", "xyz", "é"] * 3, dtype=dtype)
    store = zarr.storage.MemoryStore()
    with pytest.warns(zarr.errors.UnstableSpecificationWarning):
        to_zarr(da.from_array(a, chunks=5), store)
    same(zarr.open_array(store, mode="r")[...], a)


@pytest.mark.parametrize(
    ("dtype", "match"),
    [
        ("O", "object"),
        ("g", "no zarr v3 data type"),
        ("G", "no zarr v3 data type"),
        ([("a", "<i4", (2,)), ("b", "f4")], "would store it as"),
        ([("a", "<i4"), ("b", ">f8")], "byte order of structured fields"),
    ],
)
def test_refused_dtypes(zarr, dtype, match):
    x = da.from_array(np.zeros(4, dtype=dtype), chunks=2)
    store = zarr.storage.MemoryStore()
    with pytest.raises(TypeError, match=match) as info:
        to_zarr(x, store)
    assert repr(np.dtype(dtype)) in str(info.value)
    assert not store._store_dict  # refused before anything was created


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dtype": "f8"}, TypeError, "x.astype"),
        ({"shape": (4,)}, TypeError, "from x"),
        ({"zarr_format": 2}, ValueError, "zarr_format=3"),
    ],
)
def test_refused_keywords(zarr, kwargs, error, match):
    with pytest.raises(error, match=match):
        to_zarr(np.zeros(4), zarr.storage.MemoryStore(), **kwargs)


def test_unknown_chunk_sizes_are_refused(zarr):
    x = da.from_array(np.arange(10), chunks=5).map_blocks(lambda b: b[b > 3], chunks=((np.nan, np.nan),))
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        to_zarr(x, zarr.storage.MemoryStore())


def test_missing_zarr_gives_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "zarr", None)
    with pytest.raises(ImportError, match=r"pip install 'npydask\[zarr\]'"):
        to_zarr(np.zeros(4), "/nonexistent/never-written.zarr")


# ------------------------------------------------------------------------------------------
# A cluster of processes, writing to a LocalStore on the shared file system


@pytest.fixture(scope="module")
def client():
    pytest.importorskip("zarr", minversion="3.0")
    distributed = pytest.importorskip("distributed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cluster = distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0", silence_logs=50
        )
    with cluster, distributed.Client(cluster, set_as_default=False) as c:
        yield c


def test_cluster_writes_a_local_store(zarr, client, tmp_path):
    a = random_array((64, 20), ">f8", seed=7)
    np.save(tmp_path / "c.npy", a)
    x = npydask.from_npy(tmp_path / "c.npy", chunks=(9, 20))
    store = zarr.storage.LocalStore(str(tmp_path / "c.zarr"))
    with dask.config.set(scheduler=client):
        to_zarr(x, store, shards=(16, 20), chunks=(4, 10))
    same(zarr.open_array(str(tmp_path / "c.zarr"), mode="r")[...], a)
    lazy = to_zarr(x * 2, str(tmp_path / "d.zarr"), compute=False)
    assert client.compute(lazy, sync=True) is None
    same(zarr.open_array(str(tmp_path / "d.zarr"), mode="r")[...], a * 2)


@pytest.mark.parametrize("kind", ["memory", "zip"])
def test_cluster_refuses_a_store_it_cannot_share(zarr, client, tmp_path, kind):
    store = zarr.storage.MemoryStore() if kind == "memory" else zarr.storage.ZipStore(tmp_path / "a.zip", mode="w")
    d = to_zarr(da.ones(8, chunks=4), store, compute=False)
    with pytest.raises(RuntimeError, match="can only be written from process"):
        client.compute(d, sync=True)
    store.close()


def test_zip_store_on_threads(zarr, tmp_path):
    a = random_array((30, 8), "<u4", seed=8)
    store = zarr.storage.ZipStore(tmp_path / "a.zip", mode="w")
    to_zarr(da.from_array(a, chunks=(7, 8)), store, shards=(10, 8), chunks=(5, 4))
    store.close()
    same(zarr.open_array(zarr.storage.ZipStore(tmp_path / "a.zip", mode="r"), mode="r")[...], a)
