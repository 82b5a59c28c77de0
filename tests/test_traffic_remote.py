"""Traffic plans against what reading sends: SeaweedFS behind a request-counting proxy, hedging off.

For each kind of read (a ROI stack over volumes, a ``Uniform`` epoch with look-ahead windows,
a ``Foreground`` epoch, a folder of small objects) the plan is made first, then the same reads
run through :class:`~npydask.testing.counting_proxy.CountingProxy`: the GETs it forwards and the
payload bytes the reads record (``npydask.io_stats``) must agree with the plan within 10%
(whole-object GETs exactly), and the data must equal numpy's.
"""

from __future__ import annotations

import numpy as np
import pytest

import npydask
from npydask.samplers import Foreground, Uniform

SETTINGS = dict(remote_gap_bytes=1024, remote_part_bytes=4096)  # small: many spans and parts per read
VOLUME = (24, 40, 48)


@pytest.fixture
def proxy(s3, monkeypatch):
    from npydask.testing.counting_proxy import CountingProxy

    monkeypatch.setenv("NPYDASK_REMOTE_HEDGE", "off")  # (a hedge is one more request)
    monkeypatch.delenv("NPYDASK_CACHE", raising=False)
    with CountingProxy(s3.endpoint) as p:
        yield p, {**s3.options, "endpoint": p.endpoint}


@pytest.fixture(scope="module")
def volumes(s3):
    """``bucket/prefix/`` with ``img/`` (float32 volumes) and ``seg/`` (uint8 labels), and the arrays."""
    space = s3.space()
    images, labels = [], []
    for i in range(5):
        rng = np.random.default_rng(i)
        img = rng.random(VOLUME, dtype="f4")
        seg = np.zeros(VOLUME, "u1")
        seg[4 + i : 12 + i, 10:20, 30:40] = 1
        s3.put_npy(f"{space}/img/c{i}.npy", img)
        s3.put_npy(f"{space}/seg/c{i}.npy", seg)
        images.append(img)
        labels.append(seg)
    return f"s3://{space}", images, labels


def _near(planned: int, found: int) -> bool:
    return abs(planned - found) <= 0.1 * max(found, 1)


def _check(plan_epoch, counter, counts):
    gets = counter.counts.count("GET")
    assert _near(plan_epoch.requests, gets), (plan_epoch, counter.counts)
    assert _near(plan_epoch.transferred, counts.bytes_read), (plan_epoch, counts)
    assert counts.requests == gets  # (what the reads recorded is what the proxy saw: no hedge, no retry)


def test_opening_and_a_roi_stack_send_what_the_plan_says(volumes, proxy):
    root, images, _ = volumes
    counter, options = proxy
    with npydask.config.set(**SETTINGS):
        ds = npydask.open_dataset(f"{root}/img/", storage_options=options, roi_start=[2, 3, 5], roi_shape=[17, 30, 20])
    opened = counter.counts
    plan = ds.traffic_plan()
    assert (plan.open_list_pages, plan.open_header_requests) == (opened.count("LIST"), opened.count("GET"))
    counter.reset()
    with npydask.io_stats() as counts:
        got = ds.stack().compute(scheduler="threads")
    np.testing.assert_array_equal(got, np.stack([a[2:19, 3:33, 5:25] for a in images]))
    assert plan.whole_object_gets == 0 and plan.range_gets > 5 * 17  # (a span per plane at least, cut in parts)
    _check(plan.epochs[0], counter, counts)


def test_a_uniform_epoch_with_lookahead_windows_sends_what_the_plan_says(volumes, proxy):
    root, images, _ = volumes
    counter, options = proxy
    with npydask.config.set(**SETTINGS):
        ds = npydask.open_dataset(f"{root}/img/", storage_options=options)
    loader = npydask.Loader(ds, 4, sampler=Uniform((6, 12, 16), per_file=3), shuffle=True, seed=7, prefetch=6,
                            with_index=True)  # fmt: skip
    plan = loader.traffic_plan(2)
    assert plan.epochs[0] != plan.epochs[1]  # (another seeded order, other boxes)
    counter.reset()
    with npydask.io_stats() as counts:
        for batch, index in loader:
            for patch, f, a in zip(batch, index["file"], index["start"]):
                np.testing.assert_array_equal(patch, images[f][tuple(slice(s, s + n) for s, n in zip(a, (6, 12, 16)))])
    _check(plan.epochs[0], counter, counts)


def test_a_foreground_epoch_sends_what_the_plan_says(volumes, proxy, tmp_path):
    root, images, labels = volumes
    counter, options = proxy
    with npydask.config.set(**SETTINGS):
        img = npydask.open_dataset(f"{root}/img/", storage_options=options)
        seg = npydask.open_dataset(f"{root}/seg/", storage_options=options)
    pair = npydask.zip_datasets({"image": img, "label": seg})
    sampler = Foreground((6, 8, 8), p=0.9, per_file=2, index=str(tmp_path / "fg.npz"))
    loader = npydask.Loader(pair, 2, sampler=sampler, shuffle=True, seed=3, prefetch=2)
    with pytest.raises(ValueError, match=r"fg\.npz.*no foreground index there.*index=.*bind\(dataset\)"):
        loader.traffic_plan()
    sampler.bind(pair).patch(0, 0)  # (builds the index: every label scanned once)
    plan = loader.traffic_plan()
    counter.reset()
    with npydask.io_stats() as counts:
        batches = list(loader)
    assert sum(b["image"].shape[0] for b in batches) == 10
    assert all(b["label"].any() for b in batches)  # (most draws are centred on the labelled block)
    _check(plan.epochs[0], counter, counts)


def test_small_objects_are_planned_as_whole_object_gets_exactly(s3, proxy):
    counter, options = proxy
    space = s3.space()
    arrays = [np.arange(600, dtype="i4") * i for i in range(12)]  # 2.5 KiB: under the header read
    for i, a in enumerate(arrays):
        s3.put_npy(f"{space}/s/{i:02d}.npy", a)
    ds = npydask.open_dataset(f"s3://{space}/s/", storage_options=options)
    plan = ds.traffic_plan()
    counter.reset()
    with npydask.io_stats() as counts:
        np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays))
    e = plan.epochs[0]
    assert (e.whole_object_gets, e.range_gets) == (counter.counts.count("GET"), 0) == (12, 0)
    assert e.whole_object_bytes == counts.bytes_read == sum(a.nbytes + 128 for a in arrays)

    loader = npydask.Loader(ds, 5, shuffle=True, seed=1)
    plan = loader.traffic_plan(cache_bytes=10**6)  # (a cache that holds them all: opening read them whole)
    assert (plan.epochs[0].requests, plan.cache_hits) == (0, 12)
    plan = loader.traffic_plan()
    counter.reset()
    with npydask.io_stats() as counts:
        assert sum(len(b) for b in loader) == 12
    e = plan.epochs[0]
    assert (e.whole_object_gets, e.range_gets) == (counter.counts.count("GET"), 0) == (12, 0)  # (5 + 5 + 2 files)
    assert e.whole_object_bytes == counts.bytes_read


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_a_node_cache_serves_what_the_plan_says(volumes, proxy, tmp_path, share):
    """Two epochs through a node cache holding ``share`` of an epoch's bytes (pin): what is sent and served."""
    root, _, _ = volumes
    counter, options = proxy
    with npydask.config.set(**SETTINGS):
        probe = npydask.open_dataset(f"{root}/img/", storage_options=options)
    loader = npydask.Loader(probe, 4, sampler=Uniform((6, 12, 16), per_file=3), shuffle=True, seed=7, prefetch=0)
    epoch_bytes = loader.traffic_plan().bytes
    size = int(epoch_bytes * share) + 1
    cache = npydask.Cache(str(tmp_path / "cache"), max_bytes=size)
    with npydask.config.set(**SETTINGS):
        ds = npydask.open_dataset(f"{root}/img/", storage_options=options, cache=cache)
    loader = npydask.Loader(ds, 4, sampler=Uniform((6, 12, 16), per_file=3), shuffle=True, seed=7, prefetch=0)
    plan = loader.traffic_plan(2, cache_bytes=size)
    for e in plan.epochs:
        counter.reset()
        with npydask.io_stats() as counts:
            assert len(list(loader)) == 4
        _check(e, counter, counts)
        # (near a full cache, which extents get in depends on the order concurrent reads finish)
        assert abs(e.cache_hit_bytes - counts.cache_hit_bytes) <= 0.1 * counts.bytes_read, (e, counts)
    assert plan.cache_hit_bytes > 0


def test_reading_npz_members_after_opening_sends_no_zip_directory_or_header_requests(s3, proxy):
    """Opening reads each archive's directory and member headers once; the reads then ask only for member bytes."""
    import io

    counter, options = proxy
    space = s3.space()
    arrays = []
    for i in range(6):
        x, y = np.arange(300, dtype="<f4") + i, np.full((7, 5), i, np.uint8)
        buf = io.BytesIO()
        np.savez(buf, x=x, y=y)
        s3.put(f"{space}/z/{i}.npz", buf.getvalue())
        arrays.append((x, y))
    ds = npydask.open_dataset(f"s3://{space}/z", file_filter="*.npz", key=["x", "y"], storage_options=options)
    counter.reset()
    for _ in range(2):
        for batch in npydask.Loader(ds, 3, prefetch=0):
            assert set(batch) == {"x", "y"}
    assert counter.counts.count("GET") == 2 * 6 * 2  # (two epochs, one GET per member read: its bytes)
    got = ds.stack()
    np.testing.assert_array_equal(got["x"].compute(), np.stack([x for x, _ in arrays]))
