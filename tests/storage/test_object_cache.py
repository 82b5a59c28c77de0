"""Reads of objects through the node cache, end to end on SeaweedFS behind a request-counting proxy.

numpy is the oracle; the proxy counts the GETs that reach the server. A warm read sends no
request and returns the version opened; a partly cached read requests only the missing runs; an
object replaced after opening fails every read that makes a request for it.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

import npydask
from npydask.cache.spec import Cache
from npydask.errors import FileChangedError, NpyDaskWarning
from npydask.storage._stores import StoreSpec, store_for
from npydask.storage.identity import ObjectIdentity
from npydask.storage.io_counts import collect, record
from npydask.storage.object import source_for
from npydask.storage.object_cache import uncached_warning

pytestmark = [
    pytest.mark.filterwarnings("error"),
    pytest.mark.usefixtures("no_hedging"),
]  # (counts requests: a hedge adds one)

ROWS, COLS = 64, 256  # float32: 64 KiB of payload, beyond the 4 KiB header GET


@pytest.fixture
def proxied(s3, monkeypatch):
    """``(proxy, storage_options, space)``: the session's server behind a counting proxy, a fresh prefix."""
    from npydask.testing.counting_proxy import CountingProxy

    monkeypatch.setenv("NPYDASK_REMOTE_HEDGE", "off")
    with CountingProxy(s3.endpoint) as proxy:
        yield proxy, {**s3.options, "endpoint": proxy.endpoint}, s3.space()


def gets(proxy) -> int:
    """The object GETs the proxy forwarded since its last reset (every request framed)."""
    counts = proxy.counts
    assert counts.unframed == 0
    return counts.count("GET")


def stored(s3, space: str, name: str = "a.npy", seed: int = 0) -> tuple[str, np.ndarray]:
    a = np.random.default_rng(seed).standard_normal((ROWS, COLS)).astype("f4")
    s3.put_npy(f"{space}/{name}", a)
    return f"s3://{space}/{name}", a


_WARM = """
import json, pickle, sys
import numpy as np, npydask
with open(sys.argv[1], "rb") as f:
    x = pickle.load(f)
with npydask.io_stats() as s:
    got = x.compute()
np.save(sys.argv[2], got)
print(json.dumps({"hits": s.cache_hits, "misses": s.cache_misses, "requests": s.requests}))
"""


def test_a_warm_read_in_a_fresh_process_sends_no_get_and_returns_the_same_data(s3, proxied, tmp_path):
    proxy, options, space = proxied
    url, a = stored(s3, space)
    folder = str(tmp_path / "cache")
    x = npydask.from_npy(url, chunks=(16, COLS), storage_options=options, cache=folder)
    proxy.reset()
    with npydask.io_stats() as cold:
        np.testing.assert_array_equal(x.compute(), a)
    assert gets(proxy) == 4
    assert (cold.requests, cold.cache_misses, cold.cache_hits, cold.cache_hit_bytes) == (4, 4, 0, 0)
    assert cold.bytes_read == a.nbytes
    graph, out = tmp_path / "x.pickle", tmp_path / "got.npy"
    graph.write_bytes(pickle.dumps(x))  # (a task pickles its source as its spec: the cache choice with it)
    proxy.reset()
    run = subprocess.run(
        [sys.executable, "-c", _WARM, str(graph), str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert gets(proxy) == 0
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"hits": 4, "misses": 0, "requests": 0}
    got = np.load(out)
    np.testing.assert_array_equal(got, a)
    assert got.dtype == a.dtype


def test_a_partly_cached_read_requests_only_the_missing_runs(s3, proxied, tmp_path):
    proxy, options, space = proxied
    url, a = stored(s3, space)
    folder = str(tmp_path / "cache")
    rows = npydask.from_npy(url, chunks=(16, COLS), storage_options=options, cache=folder)
    np.testing.assert_array_equal(rows.blocks[1].compute(), a[16:32])  # (one read of rows 16:32)
    x = npydask.from_npy(url, chunks=(ROWS, COLS), storage_options=options, cache=folder)  # (one read of all)
    proxy.reset()
    with npydask.io_stats() as s:
        np.testing.assert_array_equal(x.compute(), a)
    assert gets(proxy) == 2  # (rows 0:16 and 32:64; 16:32 from the cache)
    held = a[16:32].nbytes
    assert (s.requests, s.cache_misses, s.cache_hits, s.cache_hit_bytes) == (2, 1, 0, held)
    assert s.bytes_read == a.nbytes - held
    proxy.reset()
    np.testing.assert_array_equal(x.compute(), a)
    assert gets(proxy) == 0


def test_an_object_replaced_after_opening_fails_each_request_and_a_cached_read_keeps_the_version_opened(
    s3, proxied, tmp_path
):
    proxy, options, space = proxied
    url, a = stored(s3, space)
    x = npydask.from_npy(url, chunks=(16, COLS), storage_options=options, cache=str(tmp_path / "cache"))
    np.testing.assert_array_equal(x[:16].compute(), a[:16])
    s3.put_npy(f"{space}/a.npy", a + 1)  # (same size, another ETag)
    proxy.reset()
    np.testing.assert_array_equal(x[:16].compute(), a[:16])  # every byte cached: the version opened, no request
    assert gets(proxy) == 0
    for part in (x[8:24], x[16:32], x):  # (partly cached, not cached, the whole): each makes a request
        with pytest.raises(FileChangedError, match="a.npy"):
            part.compute(scheduler="sync")  # (no read left running after the error)
    assert gets(proxy) >= 3
    proxy.reset()
    np.testing.assert_array_equal(x[:16].compute(), a[:16])  # (nothing of the new version was admitted)
    assert gets(proxy) == 0


def test_cache_false_is_off_and_none_reads_the_setting(s3, proxied, tmp_path):
    proxy, options, space = proxied
    url, a = stored(s3, space)
    folder = str(tmp_path / "cache")
    with npydask.config.set(cache=folder):
        off = npydask.from_npy(url, chunks=(32, COLS), storage_options=options, cache=False)
        on = npydask.from_npy(url, chunks=(32, COLS), storage_options=options)
        for _ in range(2):
            proxy.reset()
            with npydask.io_stats() as s:
                np.testing.assert_array_equal(off.compute(), a)
            assert gets(proxy) == 2 and (s.cache_hits, s.cache_misses) == (0, 0)
        np.testing.assert_array_equal(on.compute(), a)
        proxy.reset()
        with npydask.io_stats() as s:
            np.testing.assert_array_equal(on.compute(), a)
        assert gets(proxy) == 0 and (s.cache_hits, s.cache_hit_bytes) == (2, a.nbytes)
    assert off.name == on.name == npydask.from_npy(url, chunks=(32, COLS), storage_options=options).name


def test_cache_true_with_the_setting_empty_raises_at_the_call():
    with npydask.config.set(cache=""):
        for call in (
            lambda: npydask.from_npy("s3://bucket/a.npy", cache=True),
            lambda: npydask.open_dataset("s3://bucket/p/", cache=True),
        ):
            with pytest.raises(ValueError, match="NPYDASK_CACHE"):
                call()


def test_a_store_without_etag_identities_warns_once_and_reads_without_the_cache(s3, proxied, tmp_path):
    proxy, options, space = proxied
    for i in range(3):
        stored(s3, space, f"{i}.npy", seed=i)
    with pytest.warns(NpyDaskWarning, match=r"0\.npy.*identity.*'none'.*read without the cache") as caught:
        ds = npydask.open_dataset(
            f"s3://{space}/", storage_options={**options, "identity": "none"}, cache=str(tmp_path / "cache")
        )
    assert len([w for w in caught if issubclass(w.category, NpyDaskWarning)]) == 1
    x = ds.stack()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            proxy.reset()
            with npydask.io_stats() as s:
                x.compute()
            assert gets(proxy) > 0 and (s.cache_hits, s.cache_misses) == (0, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the cache off: nothing to say)
        npydask.open_dataset(f"s3://{space}/", storage_options={**options, "identity": "none"}, cache=False)


def test_loader_without_a_sampler_counts_hits_and_misses(s3, proxied, tmp_path):
    proxy, options, space = proxied
    arrays = [stored(s3, space, f"{i}.npy", seed=i)[1] for i in range(4)]
    ds = npydask.open_dataset(f"s3://{space}/", storage_options=options, cache=str(tmp_path / "cache"))
    loader = npydask.Loader(ds, 2)
    epochs = []
    for _ in range(2):
        proxy.reset()
        batches = list(loader)
        np.testing.assert_array_equal(np.concatenate(batches), np.stack(arrays))
        epochs.append((loader.stats(), gets(proxy)))
    (cold, cold_gets), (warm, warm_gets) = epochs
    assert cold.patch_bytes == warm.patch_bytes == sum(a.nbytes for a in arrays)
    assert cold.cache_hits == 0 and cold.cache_misses >= 4 and cold.requests == cold_gets > 0
    assert cold.bytes_read >= sum(a.nbytes for a in arrays)
    assert (warm.cache_hits, warm.cache_misses, warm.requests, warm_gets) == (cold.cache_misses, 0, 0, 0)
    assert warm.cache_hit_bytes == cold.bytes_read


def test_small_objects_read_whole_while_opening_are_cached(s3, proxied, tmp_path):
    """An object whose header GET read it whole is admitted: its first read sends nothing."""
    proxy, options, space = proxied
    small = [np.arange(10 * (i + 1), dtype="i8") for i in range(3)]
    for i, a in enumerate(small):
        s3.put_npy(f"{space}/{i}.npy", a)
    ds = npydask.open_dataset(f"s3://{space}/", storage_options=options, cache=str(tmp_path / "cache"))
    proxy.reset()
    with npydask.io_stats() as s:
        got = ds.concatenate(0).compute()
    np.testing.assert_array_equal(got, np.concatenate(small))
    assert gets(proxy) == 0 and s.cache_hits > 0 and s.cache_misses == 0


def test_the_cache_choice_travels_in_the_spec_and_leaves_the_store_and_name_alone(s3, tmp_path):
    cache = Cache(str(tmp_path / "cache"))
    spec = StoreSpec.of(f"s3://{s3.bucket}", s3.options, cache)
    source = pickle.loads(pickle.dumps(source_for(spec)))
    assert source.spec.cache == cache and source is source_for(spec)
    assert store_for(spec) is store_for(spec._replace(cache=False)) is store_for(spec._replace(cache=None))
    assert spec.public() == spec._replace(cache=None).public()


def test_collectors_nest_and_follow_the_request_pool():
    from npydask.storage._stores import run_all

    with collect() as outer:
        with collect() as inner:
            run_all(lambda i: record(requests=1, bytes_read=i), range(8), 4)
        record(cache_hits=1)
    assert (inner.requests, inner.bytes_read, inner.cache_hits) == (8, 28, 0)
    assert (outer.requests, outer.bytes_read, outer.cache_hits) == (8, 28, 1)


def test_requests_that_finally_fail_throttled_are_counted():
    from npydask.storage._remote_errors import call

    class GenericError(Exception):
        pass

    GenericError.__module__ = "obstore.exceptions"

    def fail(text):
        def get():
            raise GenericError(text)

        return get

    with collect() as counts:
        for text in (
            "GET s3://b/k: status code: 503 Service Unavailable <Code>SlowDown</Code>",
            "Generic S3 error: request timed out after retries",
            "GET s3://b/k: status code: 500 Internal Server Error",
        ):
            with pytest.raises(OSError, match=r"k\.npy"):
                call("s3://b/k.npy", "reading", fail(text))
    assert counts.throttled == 2


def test_http_urls_that_differ_in_signature_share_an_entry_and_servers_without_etags_warn(http_server, tmp_path):
    a = np.arange(ROWS * COLS, dtype="f4").reshape(ROWS, COLS)
    (tmp_path / "www").mkdir()
    np.save(tmp_path / "www" / "a.npy", a)
    folder = str(tmp_path / "cache")
    server = http_server(tmp_path / "www")
    for signature, sent in ((1, 1), (2, 0)):  # (a presigned URL's signature: not part of the key)
        x = npydask.from_npy(f"{server.endpoint}/a.npy?X-Amz-Signature={signature}", chunks=(ROWS, COLS), cache=folder)
        with npydask.io_stats() as s:
            np.testing.assert_array_equal(x.compute(), a)
        assert (s.requests, s.cache_hits) == (sent, 1 - sent)
    plain = http_server(tmp_path / "www", send_etag=False)
    with pytest.warns(NpyDaskWarning, match=r"a\.npy \(and every object.*'last-modified'.*without the cache"):
        npydask.open_dataset(
            files=[f"{plain.endpoint}/a.npy"], storage_options={"identity": "last-modified"}, cache=folder
        )
    weak = uncached_warning(
        "etag", ["https://h/a.npy", "https://h/b.npy"], [ObjectIdentity(8, '"s"'), ObjectIdentity(8, 'W/"w"')]
    )
    assert weak is not None and weak.startswith("https://h/b.npy (an http(s) server that sends no strong ETag)")
    assert "weak ETag 'W/\"w\"'" in weak and "1 of the dataset's 2 objects are read without the cache" in weak


def _npz_bytes(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez_compressed(buf, x=a)
    return buf.getvalue()


def test_a_deflated_member_is_kept_only_once_its_crc_matched(s3, proxied, tmp_path):
    """Its compressed pieces are fetched unkept; a whole read that matched the CRC-32 keeps them."""
    proxy, options, space = proxied
    a = np.random.default_rng(3).standard_normal((ROWS, COLS)).astype("f4")  # (barely compressible: 64 KiB)
    s3.put(f"{space}/m.npz", _npz_bytes(a))
    folder = str(tmp_path / "cache")
    opened = {"file_filter": "*.npz", "key": "x", "storage_options": options, "cache": folder}
    ds = npydask.open_dataset(f"s3://{space}/", **opened)
    roi = npydask.open_dataset(f"s3://{space}/", roi_start=(0, 0), roi_shape=(4, COLS), **opened)
    part = roi[0]  # (a prefix of the member: inflated, never checked, so never kept)
    np.testing.assert_array_equal(part.compute(), a[:4])
    proxy.reset()
    np.testing.assert_array_equal(part.compute(), a[:4])
    assert gets(proxy) >= 1 and Cache(folder).info().extents == 0
    np.testing.assert_array_equal(ds[0].compute(), a)  # (whole: its CRC-32 checked, then kept)
    assert Cache(folder).info().extents >= 1
    proxy.reset()
    np.testing.assert_array_equal(ds[0].compute(), a)
    assert gets(proxy) == 0


def test_a_deflated_member_whose_crc_differs_is_never_kept(s3, proxied, tmp_path):
    import struct
    import zipfile

    proxy, options, space = proxied
    a = np.arange(ROWS * COLS, dtype="f4").reshape(ROWS, COLS)
    raw = bytearray(_npz_bytes(a))
    with zipfile.ZipFile(__import__("io").BytesIO(bytes(raw))) as z:
        info = z.getinfo("x.npy")
    # the CRC-32 the zip records, in the local header (offset 14) and the central directory, made wrong
    wrong = struct.pack("<I", info.CRC ^ 1)
    raw[info.header_offset + 14 : info.header_offset + 18] = wrong
    central = bytes(raw).rindex(b"PK\x01\x02")
    raw[central + 16 : central + 20] = wrong
    s3.put(f"{space}/bad.npz", bytes(raw))
    folder = str(tmp_path / "cache")
    ds = npydask.open_dataset(f"s3://{space}/", file_filter="*.npz", key="x", storage_options=options, cache=folder)
    for _ in range(2):
        with pytest.raises(npydask.errors.NpzCrcError, match="bad.npz"):
            ds[0].compute()
    assert Cache(folder).info().extents == 0
