"""``ds.warm_cache()``: a dataset (its shard and ROI) read once through the node cache, then read with no GET.

Objects live on the session's SeaweedFS server, reached through a request-counting proxy; numpy is the
oracle for what the reads return afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest

import npydask
from npydask.dataset.warm import WarmSummary

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)

SHAPE = (16, 32, 32)  # 64 KiB: more than the header read, so opening does not read (and cache) it whole


@pytest.fixture(scope="module")
def objects(s3):
    """``bucket/prefix/v/`` with eight float32 volumes of ``SHAPE``, and the arrays by index."""
    space = s3.space()
    arrays = []
    for i in range(8):
        a = np.random.default_rng(i).random(SHAPE, dtype="f4")
        s3.put_npy(f"{space}/v/{i}.npy", a)
        arrays.append(a)
    return f"s3://{space}/v/", arrays


@pytest.fixture
def proxy(s3, monkeypatch):
    from npydask.testing.counting_proxy import CountingProxy

    monkeypatch.setenv("NPYDASK_REMOTE_HEDGE", "off")
    with CountingProxy(s3.endpoint) as p:
        yield p, {**s3.options, "endpoint": p.endpoint}


def test_local_files_are_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(4))
    ds = npydask.open_dataset(str(tmp_path))
    with pytest.raises(ValueError, match="files are local .*page cache"):
        ds.warm_cache()


def test_a_dataset_with_no_cache_on_is_refused(objects, s3, monkeypatch):
    url, _ = objects
    monkeypatch.delenv("NPYDASK_CACHE", raising=False)
    ds = npydask.open_dataset(url, storage_options=s3.options)  # cache=None, and the setting empty here
    with pytest.raises(ValueError, match="no node cache is on .*NPYDASK_CACHE"):
        ds.warm_cache()


def test_a_warmed_shard_and_roi_are_then_read_with_no_get(objects, proxy, tmp_path, capsys):
    url, arrays = objects
    counter, options = proxy
    cache = npydask.Cache(str(tmp_path / "cache"))
    roi = dict(roi_start=[1, 2, 3], roi_shape=[4, 5, 6])
    ds = npydask.open_dataset(url, storage_options=options, cache=cache, shard_id=1, num_shards=2, **roi)
    off = npydask.open_dataset(url, storage_options=options, cache=False)
    with npydask.config.set(cache=cache.folder), pytest.raises(ValueError, match="cache=False"):
        off.warm_cache()
    with npydask.io_stats() as cold:  # (the warm's threads read in the caller's context: counted here)
        summary = ds.warm_cache()
    assert isinstance(summary, WarmSummary)
    assert (summary.files, summary.bytes, summary.folder) == (4, ds.nbytes, cache.folder)
    assert "warm_cache: 4 / 4 files" in capsys.readouterr().err  # (the progress line, on stderr)
    assert cold.requests >= 4 and cold.cache_misses >= 4 and cold.cache_hits == 0, cold
    assert (summary.requests, summary.cache_misses, summary.cache_hits) == (cold.requests, cold.cache_misses, 0)
    with npydask.io_stats() as warm:
        again = ds.warm_cache(progress=False)
    assert (warm.requests, warm.cache_misses) == (0, 0) and warm.cache_hits >= 4, warm
    assert (again.requests, again.cache_misses, again.cache_hits) == (0, 0, warm.cache_hits)
    assert str(again).endswith(f": 0 GETs, {warm.cache_hits} reads held already, 0 fetched")
    assert capsys.readouterr().err == ""

    counter.reset()
    got = ds.stack().compute()
    expected = np.stack([a[1:5, 2:7, 3:9] for a in arrays[4:]])
    np.testing.assert_array_equal(got, expected)
    assert counter.counts.count("GET") == 0, counter.counts

    # the other shard was not staged: reading it fetches
    other = npydask.open_dataset(url, storage_options=options, cache=cache, shard_id=0, num_shards=2, **roi)
    counter.reset()
    np.testing.assert_array_equal(other.stack().compute(), np.stack([a[1:5, 2:7, 3:9] for a in arrays[:4]]))
    assert counter.counts.count("GET") > 0


def test_dict_datasets_warm_every_member_and_refuse_local_files(s3, proxy, tmp_path):
    import io

    counter, options = proxy
    space = s3.space()
    members = []
    for i in range(3):
        x, y = np.random.default_rng(i).random(SHAPE, dtype="f4"), np.arange(20_000, dtype="i4") * i
        buf = io.BytesIO()
        np.savez(buf, x=x, y=y)
        s3.put(f"{space}/p/{i}.npz", buf.getvalue())
        members.append((x, y))
        np.savez(tmp_path / f"{i}.npz", x=x, y=y)
    with pytest.raises(ValueError, match="files are local"):
        npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "y"]).warm_cache()
    cache = npydask.Cache(str(tmp_path / "cache"))
    ds = npydask.open_dataset(f"s3://{space}/p/", file_filter="*.npz", key=["x", "y"], storage_options=options,
                              cache=cache)  # fmt: skip
    summary = ds.warm_cache(progress=False)
    assert (summary.files, summary.bytes) == (6, ds.nbytes)
    counter.reset()
    got = ds.stack()
    np.testing.assert_array_equal(got["x"].compute(), np.stack([x for x, _ in members]))
    np.testing.assert_array_equal(got["y"].compute(), np.stack([y for _, y in members]))
    assert counter.counts.count("GET") == 0, counter.counts


def test_large_files_are_warmed_in_slabs_that_cover_them(s3, proxy, tmp_path, monkeypatch):
    from npydask.dataset import warm

    counter, options = proxy
    space = s3.space()
    c_order = np.random.default_rng(0).random(SHAPE, dtype="f4")
    f_order = np.asfortranarray(np.random.default_rng(1).random(SHAPE, dtype="f4"))
    s3.put_npy(f"{space}/c.npy", c_order)
    s3.put_npy(f"{space}/f.npy", f_order)
    ds = npydask.open_dataset(files=[f"s3://{space}/c.npy", f"s3://{space}/f.npy"], storage_options=options,
                              cache=str(tmp_path / "cache"))  # fmt: skip
    monkeypatch.setattr(warm, "SLAB_BYTES", 8 * 1024)  # (64 KiB files: 8 slabs each, planes in C, columns in F)
    counter.reset()
    assert ds.warm_cache(progress=False).files == 2
    assert counter.counts.count("GET") >= 16  # (a request per slab at least)
    counter.reset()
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([c_order, f_order]))
    assert counter.counts.count("GET") == 0, counter.counts


def test_plain_files_are_warmed_whole_so_stacks_loaders_and_single_reads_send_no_get(objects, proxy, tmp_path):
    url, arrays = objects
    counter, options = proxy
    ds = npydask.open_dataset(url, storage_options=options, cache=str(tmp_path / "cache"))
    ds.warm_cache(progress=False)
    counter.reset()
    batches = [b for b in npydask.Loader(ds, batch_size=3)]  # (batches of several files: each from byte 0)
    np.testing.assert_array_equal(np.concatenate(batches), np.stack(arrays))
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays))
    np.testing.assert_array_equal(ds[5][2:9].compute(), arrays[5][2:9])  # (one file: its payload only)
    assert counter.counts.count("GET") == 0, counter.counts
