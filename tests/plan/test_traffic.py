"""Traffic plans without a server: the counting over tables of geometries, the cache model, prices, the table,
and the loader's and dataset's plans over local files (planned as objects)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import npydask
from npydask.config import read_options
from npydask.dataset.traffic import objects_of
from npydask.format.header import NpyHeader
from npydask.plan.patch_runs import plan_boxes
from npydask.plan.region import Box, plan_read, split_span
from npydask.plan.traffic import (
    EpochTraffic,
    ObjectFacts,
    PinModel,
    Prices,
    RemoteSettings,
    Request,
    TrafficPlan,
    count_traffic,
    header_requests,
    region_requests,
    spans_requests,
)
from npydask.samplers import Foreground, Grid, Uniform
from npydask.storage import read_plan


class Recording:
    """A RangeReader (the protocol the region reader fills from) over a payload, recording each read."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads: list[tuple[int, int]] = []

    def read_into(self, dest: np.ndarray, offset: int) -> None:
        self.read_many([[dest.data]], len(dest), [offset])

    def read_many(self, iovecs, size, offsets) -> None:
        for bufs, offset in zip(iovecs, offsets):
            self.reads.append((offset, size))
            np.frombuffer(bufs[0].cast("B"), np.uint8)[:] = np.frombuffer(self.data, np.uint8, size, offset)


GEOMETRIES = [  # shape, dtype, fortran, start, stop, gap, part
    ((7, 9, 11), "<f4", False, (1, 2, 3), (6, 8, 9), 0, 4096),
    ((7, 9, 11), "<f4", False, (1, 2, 3), (6, 8, 9), 64, 64),
    ((7, 9, 11), ">i2", True, (0, 2, 0), (7, 3, 11), 10, 100),
    ((40, 50), "u1", False, (0, 0), (40, 50), 0, 333),
    ((40, 50), "u1", False, (3, 10), (30, 11), 1000, 7),
    ((5, 1, 300), "<f8", False, (2, 0, 0), (4, 1, 300), 0, 1000),
    ((3, 4, 5, 6), "<u2", True, (1, 1, 1, 1), (2, 3, 4, 5), 4, 50),
    ((10,), "<i8", False, (4,), (4,), 0, 10),  # empty: no request
]


@pytest.mark.parametrize(("shape", "dtype", "fortran", "start", "stop", "gap", "part"), GEOMETRIES)
def test_region_requests_are_the_spans_the_region_reader_reads_cut_in_parts(
    shape, dtype, fortran, start, stop, gap, part
):
    a = np.arange(np.prod(shape)).astype(dtype).reshape(shape)
    a = np.asfortranarray(a) if fortran else a
    offset = 128
    header = NpyHeader((1, 0), shape, np.dtype(dtype), fortran, offset, a.nbytes)
    data = b"\0" * offset + a.tobytes(order="F" if fortran else "C")
    plan = plan_read(header, Box(start, stop))
    reader = Recording(data)
    raw = np.empty(plan.nbytes, np.uint8)
    if plan.nbytes:
        read_plan(reader, plan, read_options(gap_bytes=gap), raw)
    settings = RemoteSettings(gap_bytes=gap, part_bytes=part, max_span_bytes=read_options().max_span_bytes)
    planned = region_requests("a", plan, settings)
    expected = [Request("a", o, o + n) for at, size in reader.reads for o, n in split_span(at, size, part)]
    assert planned == expected
    assert all(r.stop - r.start <= part for r in planned)
    # the requests hold every byte of the region (numpy's index arithmetic is the oracle)
    box = tuple(slice(a0, b0) for a0, b0 in zip(start, stop))
    idx = np.indices(shape)[(slice(None), *box)].reshape(len(shape), -1)
    strides = np.array(a.strides)[:, None]
    firsts = offset + (idx * strides).sum(axis=0)
    held = np.zeros(len(data), bool)
    for r in planned:
        held[r.start : r.stop] = True
    for k in range(a.itemsize):
        assert held[firsts + k].all()
    if plan.nbytes:  # and the reader's bytes give numpy's region
        got = raw.view(a.dtype).reshape(plan.file_shape)
        np.testing.assert_array_equal(got.T if fortran else got, a[box])


def test_spans_requests_cut_each_merged_span_in_parts():
    header = NpyHeader((1, 0), (8, 100), np.dtype("u1"), False, 128, 800)
    runs = plan_boxes(header, [Box((0, 0), (2, 100)), Box((1, 50), (4, 60)), Box((7, 0), (8, 10))], max_gap=0)
    assert spans_requests("x", runs.spans, RemoteSettings(part_bytes=150)) == [
        Request("x", 128, 278),
        Request("x", 278, 328),
        Request("x", 378, 388),
        Request("x", 478, 488),
        Request("x", 828, 838),
    ]
    assert sum(r.stop - r.start for r in spans_requests("x", runs.spans, RemoteSettings())) == runs.bytes_read


@pytest.mark.parametrize(
    ("size", "data_offset", "first", "expected"),
    [(100, 80, 4096, (1, 100)), (10**6, 128, 4096, (1, 4096)), (10**6, 70_000, 4096, (3, 4096 + 2 * 65536)),
     (70_000, 70_000, 4096, (3, 4096 + 65536 + 70_000 - 65536)), (0, 0, 4096, (1, 0))],
)  # fmt: skip
def test_header_requests(size, data_offset, first, expected):
    assert header_requests(size, data_offset, first) == expected


@pytest.mark.parametrize(
    ("reads", "capacity", "missing", "held"),
    [
        ([(0, 10), (0, 10)], 100, [[(0, 10)], []], 10),  # a re-read is a hit
        ([(0, 10), (5, 20)], 100, [[(0, 10)], [(10, 20)]], 20),  # only the missing run is fetched
        ([(10, 20), (0, 30)], 100, [[(10, 20)], [(0, 10), (20, 30)]], 30),
        ([(0, 60), (60, 120), (0, 60), (60, 120)], 100, [[(0, 60)], [(60, 120)], [], [(60, 120)]], 60),  # pin: full
        ([(0, 200), (0, 200)], 100, [[(0, 200)], [(0, 200)]], 0),  # larger than the cache: never admitted
        ([(0, 10), (20, 30), (40, 50), (0, 50)], 100, [[(0, 10)], [(20, 30)], [(40, 50)], [(10, 20), (30, 40)]], 50),
    ],
)
def test_the_pin_model_fetches_what_is_missing_and_admits_until_full(reads, capacity, missing, held):
    m = PinModel(capacity)
    assert [m.read("o", a, b) for a, b in reads] == missing
    assert m.held == held


def test_a_cache_that_holds_the_epoch_serves_every_later_epoch_and_a_smaller_one_a_share():
    objects = [ObjectFacts(f"o{i}", 10_000, 128) for i in range(10)]
    epoch = [Request(f"o{i}", 128, 10_000) for i in range(10)]
    settings = RemoteSettings()
    none = count_traffic(objects, [epoch] * 3, settings)
    assert [(e.range_gets, e.cache_hits) for e in none.epochs] == [(10, 0)] * 3
    full = count_traffic(objects, [epoch] * 3, settings, cache_bytes=10**6)
    assert [(e.range_gets, e.bytes, e.cache_hits) for e in full.epochs] == [(10, 98_720, 0), (0, 0, 10), (0, 0, 10)]
    assert full.cache_hit_bytes == 2 * 98_720
    share = count_traffic(objects, [epoch] * 3, settings, cache_bytes=4 * 9_872)  # four objects' reads fit
    assert [(e.range_gets, e.cache_hits) for e in share.epochs] == [(10, 0), (6, 4), (6, 4)]
    # objects no larger than the header read are read whole when opened, and kept
    small = [ObjectFacts(f"s{i}", 1000, 128) for i in range(3)]
    whole = [Request(f"s{i}", 0, 1000, True) for i in range(3)]
    plan = count_traffic(small, [whole], settings, cache_bytes=2500)
    assert (plan.epochs[0].whole_object_gets, plan.epochs[0].cache_hits) == (1, 2)
    assert count_traffic(small, [whole], settings).epochs[0].whole_object_gets == 3


def test_prices_give_costs_per_epoch_and_in_all():
    objects = [ObjectFacts(f"o{i}", 10**6, 128) for i in range(2000)]
    epoch = [Request(f"o{i}", 128, 10**6) for i in range(2000)]
    prices = Prices(get=0.4, list=5.0, gb=90.0)
    plan = count_traffic(objects, [epoch, epoch], RemoteSettings(), prices=prices)
    assert plan.open_list_pages == 2 and plan.open_header_requests == 2000
    assert plan.open_cost == pytest.approx(2000 * 0.4 / 1000 + 2 * 5.0 / 1000 + 2000 * 4096 * 90 / 1e9)
    per_epoch = 2000 * 0.4 / 1000 + 2000 * (10**6 - 128) * 90 / 1e9
    assert [e.cost for e in plan.epochs] == [pytest.approx(per_epoch)] * 2
    assert plan.cost == pytest.approx(plan.open_cost + 2 * per_epoch)
    assert count_traffic(objects, [epoch], RemoteSettings()).cost is None  # (none built in)
    assert Prices.of({"gb": 0.09}) == Prices(gb=0.09)
    for bad in (dict(get=-1.0), dict(gb=float("nan")), dict(list="1")):
        with pytest.raises(ValueError, match="price must be a finite number >= 0"):
            Prices(**bad)
    with pytest.raises(ValueError, match=r"'get' and 'list'.*'gb'.*\['egress'\]"):
        Prices.of({"egress": 0.1})
    with pytest.raises(ValueError, match="cache_bytes must be >= 0"):
        count_traffic(objects, [], RemoteSettings(), cache_bytes=-1)


def test_the_plan_prints_a_table_and_gives_plain_values():
    plan = TrafficPlan(3, 1, 3, 12_288, (EpochTraffic(0, 5, 5 << 20, 2, 2048, 1, 100, 0.25),), 1 << 30,
                       Prices(get=0.4), 0.125)  # fmt: skip
    text = str(plan)
    lines = text.splitlines()
    assert lines[0] == "traffic plan: 3 objects, 1 epochs, node cache 1.0 GiB (pin)"
    assert lines[1] == "opening: 1 LIST page(s), 3 header GET(s), 12.0 KiB, cost 0.125"
    assert lines[2].split("  ")[0] == "epoch" and "range GETs" in lines[2] and "cost" in lines[2]
    assert lines[3].split() == ["0", "5", "5.0", "MiB", "2", "2.0", "KiB", "1", "0.25"]
    assert lines[4].split() == ["total", "5", "5.0", "MiB", "2", "2.0", "KiB", "1", "0.375"]
    d = json.loads(plan.to_json())
    assert d["epochs"][0]["range_gets"] == 5 and d["total"]["cost"] == 0.375 and d["prices"]["get"] == 0.4


# -- over local files (planned as if they were objects) --------------------------------------------------------


@pytest.fixture
def volumes(tmp_path):
    os.makedirs(tmp_path / "img")
    os.makedirs(tmp_path / "seg")
    for i in range(4):
        np.save(tmp_path / "img" / f"v{i}.npy", np.zeros((12, 20, 24), "f4"))
        seg = np.zeros((12, 20, 24), "u1")
        seg[2:5, 3:9, 4:10] = 1
        np.save(tmp_path / "seg" / f"v{i}.npy", seg)
    return tmp_path


def test_lookahead_windows_read_grid_tiles_of_consecutive_batches_once(volumes):
    ds = npydask.open_dataset(str(volumes / "img"))
    with npydask.config.set(remote_gap_bytes=0):
        alone = npydask.Loader(ds, 1, sampler=Grid((12, 10, 24), overlap=0), prefetch=2).traffic_plan()
        windows = npydask.Loader(ds, 1, sampler=Grid((12, 10, 24), overlap=0), prefetch=8).traffic_plan()
    assert alone.bytes == windows.bytes == ds.nbytes
    # a tile alone is a span per plane; a file's two tiles in one window are the whole file, one span
    assert (alone.range_gets, windows.range_gets) == (4 * 2 * 12, 4)


def test_a_loader_plan_follows_the_seeded_order_shards_and_epochs(volumes):
    ds = npydask.open_dataset(str(volumes / "img"))
    kwargs = dict(sampler=Uniform((4, 4, 4), per_file=2), shuffle=True, seed=5)
    a = npydask.Loader(ds, 2, **kwargs).traffic_plan(3)
    assert a == npydask.Loader(ds, 2, **kwargs).traffic_plan(3)  # (deterministic)
    assert [e.epoch for e in a.epochs] == [0, 1, 2] and len({e.bytes for e in a.epochs}) > 1
    shard = npydask.Loader(ds, 2, shard_id=1, num_shards=2, **kwargs).traffic_plan(1)
    assert shard.epochs[0].range_gets < a.epochs[0].range_gets
    later = npydask.Loader(ds, 2, **kwargs)
    later.set_epoch(2)
    assert later.traffic_plan().epochs == (a.epochs[2],)
    whole = npydask.Loader(ds, 3).traffic_plan()  # (batches of whole files: small objects, one GET each)
    assert (whole.whole_object_gets, whole.range_gets, whole.whole_object_bytes) == (3, 1, 3 * (128 + 5760 * 4))
    with pytest.raises(ValueError, match="epochs must be"):
        whole = npydask.Loader(ds, 3).traffic_plan(-1)


def test_a_foreground_plan_needs_the_label_index_and_reads_no_label(volumes, tmp_path, monkeypatch):
    pair = npydask.zip_datasets({"image": npydask.open_dataset(str(volumes / "img")),
                                 "label": npydask.open_dataset(str(volumes / "seg"))})  # fmt: skip
    with pytest.raises(ValueError, match="has none: pass index=PATH to Foreground.*bind"):
        npydask.Loader(pair, 2, sampler=Foreground((4, 4, 4))).traffic_plan()
    index = str(tmp_path / "fg.npz")
    sampler = Foreground((4, 4, 4), index=index)
    with pytest.raises(ValueError, match=r"fg\.npz: no foreground index there"):
        npydask.Loader(pair, 2, sampler=sampler).traffic_plan()
    sampler.bind(pair).patch(0, 0)

    def no_scan(*args):
        raise AssertionError("a traffic plan scanned a label file")

    with monkeypatch.context() as m:
        m.setattr("npydask.samplers.foreground.scan_label", no_scan)
        plan = npydask.Loader(pair, 2, sampler=sampler, seed=1).traffic_plan()
    assert plan.objects == 8 and plan.range_gets > 0
    np.save(volumes / "seg" / "v2.npy", np.ones((12, 20, 24), "u1"))  # (a label changed since: stale)
    pair = npydask.zip_datasets({"image": npydask.open_dataset(str(volumes / "img")),
                                 "label": npydask.open_dataset(str(volumes / "seg"))})  # fmt: skip
    with pytest.raises(ValueError, match=r"no entry for the label file .*v2\.npy as it is now"):
        npydask.Loader(pair, 2, sampler=Foreground((4, 4, 4), index=index)).traffic_plan()


def test_a_dataset_plan_is_its_stack_read_once_an_epoch(volumes):
    ds = npydask.open_dataset(str(volumes / "img"), roi_start=[1, 2, 3], roi_shape=[5, 6, 7])
    with npydask.config.set(remote_gap_bytes=0):
        plan = npydask.open_dataset(str(volumes / "img"), roi_start=[1, 2, 3], roi_shape=[5, 6, 7]).traffic_plan(2)
    assert [e.range_gets for e in plan.epochs] == [4 * 5 * 6] * 2  # (a run per row)
    assert plan.bytes == 2 * ds.nbytes
    wide = ds.traffic_plan()  # (64 KiB gaps: a span per file)
    assert (wide.range_gets, wide.whole_object_gets) == (4, 0)
    assert ds.traffic_plan(cache_bytes="1 MiB", epochs=2).epochs[1].range_gets == 0


def test_files_of_other_shapes_are_planned_as_their_own_arrays(tmp_path):
    for i, n in enumerate((1000, 3000, 500)):
        np.save(tmp_path / f"r{i}.npy", np.zeros(n, "<i8"))
    ds = npydask.open_dataset(str(tmp_path))
    with npydask.config.set(remote_part_bytes=10_000):
        plan = npydask.open_dataset(str(tmp_path)).traffic_plan()
    # each file alone (ds.arrays()): its payload by range GETs of at most 10,000 bytes, never whole objects
    assert (plan.range_gets, plan.bytes, plan.whole_object_gets) == (1 + 3 + 1, ds.nbytes, 0)
    assert plan.open_header_requests == 3 and [o.size for o in objects_of(ds)] == [8128, 24128, 4128]
    assert plan.open_bytes == 4096 * 3
