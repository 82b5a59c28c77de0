"""``npydask cache info/clear/prune/fill`` on real cache folders, and their one-line errors (exit status 2).

A folder is filled through :class:`~npydask.cache.node.NodeCache` itself (objects of known bytes, fetched
by a function of the test), so what ``info`` reports is checked against what was put there; ``fill`` is
checked end to end on the session's SeaweedFS server: afterwards, reading the dataset sends no GET.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

import npydask
from npydask.cache.keys import EntryKey
from npydask.cache.ledger import ENTRIES
from npydask.cache.node import NodeCache
from npydask.cli import main

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _fill(folder: str, objects: dict[str, tuple[int, int]]) -> int:
    """Read ``[lo, hi)`` of each object URL through a NodeCache at ``folder``; the bytes fetched."""
    cache = NodeCache(folder, 1 << 30, "pin")
    data = bytes(range(256)) * 4096
    fetched = 0
    for url, (lo, hi) in objects.items():
        key = EntryKey.of("s3://bucket", url, "", 1 << 20, '"e1"')
        out = bytearray(hi - lo)
        got = cache.read(key, lo, hi, memoryview(out), lambda a, b: (data[a:b], True), label=url, wait_s=5)
        assert bytes(out) == data[lo:hi]
        fetched += got.fetched_bytes
    again = bytearray(100)  # (a hit, counted)
    url, (lo, _) = next(iter(objects.items()))
    key = EntryKey.of("s3://bucket", url, "", 1 << 20, '"e1"')
    assert cache.read(key, lo, lo + 100, memoryview(again), _no_fetch, label=url, wait_s=5).fetches == 0
    cache.flush()
    return fetched


def _no_fetch(lo: int, hi: int) -> tuple[bytes, bool]:
    raise AssertionError(f"fetched [{lo}, {hi}) of a cached run")


OBJECTS = {
    "s3://bucket/scans/a.npy": (0, 5000),
    "s3://bucket/scans/b.npy": (128, 70_000),
    "s3://bucket/labels/a.npy": (0, 3000),
}


@pytest.fixture
def filled(tmp_path):
    folder = str(tmp_path / "cache")
    return folder, _fill(folder, OBJECTS)


def test_info_json_and_table_say_what_the_folder_holds(filled, capsys):
    folder, fetched = filled
    status, out, err = run(capsys, "cache", "info", folder, "--json")
    assert status == 0, err
    info = json.loads(out)
    assert info["folder"] == folder and info["policy"] == "pin" and info["max_bytes"] == 1 << 30
    assert (info["entries"], info["extents"], info["bytes"]) == (3, 3, fetched) == (3, 3, 5000 + 69_872 + 3000)
    assert (info["hits"], info["misses"], info["hit_bytes"]) == (1, 3, 100)
    assert info["by_prefix"] == [
        {"prefix": "s3://bucket/scans", "entries": 2, "bytes": 74_872},
        {"prefix": "s3://bucket/labels", "entries": 1, "bytes": 3000},
    ]
    status, out, err = run(capsys, "cache", "info", folder)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["folder", folder] and lines[1].split() == ["policy", "pin"]
    assert "entries  3" in out and "held     76.0 KiB of 1.0 GiB (0.0%)" in out
    assert "hits     1 (100 B, 25.0% of reads)" in out
    assert [line.split() for line in lines[-2:]] == [
        ["s3://bucket/scans", "2", "73.1", "KiB"],
        ["s3://bucket/labels", "1", "2.9", "KiB"],
    ]


def test_info_reads_the_setting_when_no_folder_is_given(filled, capsys, monkeypatch):
    folder, _ = filled
    monkeypatch.setenv("NPYDASK_CACHE", folder)
    status, out, err = run(capsys, "cache", "info", "--json")
    assert status == 0, err
    assert json.loads(out)["entries"] == 3


def _age(folder: str, url: str, days: float) -> None:
    """Make the entry of ``url`` (as :func:`_fill` keyed it) last read ``days`` ago."""
    name = EntryKey.of("s3://bucket", url, "", 1 << 20, '"e1"').entry_name()
    entry = os.path.join(folder, ENTRIES, name[:2], name)
    then = time.time() - days * 86400
    for child in os.listdir(entry):
        os.utime(os.path.join(entry, child), (then, then), follow_symlinks=False)
    os.utime(entry, (then, then))


def test_prune_removes_the_entries_unread_for_so_many_days(filled, capsys):
    folder, _ = filled
    _age(folder, "s3://bucket/scans/b.npy", 10)
    status, out, err = run(capsys, "cache", "prune", "--older-than", "7", folder)
    assert status == 0, err
    assert "removed 1 entries (68.2 KiB) unread for 7 days" in out
    info = npydask.Cache(folder).info()
    assert (info.entries, info.bytes) == (2, 8000)
    status, out, err = run(capsys, "cache", "prune", "--older-than", "0", folder)
    assert status == 0 and "removed 2 entries (7.8 KiB)" in out
    assert npydask.Cache(folder).info().entries == 0


def test_clear_removes_everything_and_reports_the_bytes(filled, capsys):
    folder, fetched = filled
    status, out, err = run(capsys, "cache", "clear", folder)
    assert status == 0, err
    assert out.strip() == f"removed {npydask.cli._common.size(fetched)} from {folder}"
    info = npydask.Cache(folder).info()
    assert (info.entries, info.bytes, info.max_bytes, info.policy) == (0, 0, None, None)


def test_errors_are_one_line_and_exit_status_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NPYDASK_CACHE", raising=False)
    for argv in (["info"], ["clear"], ["prune", "--older-than", "1"]):
        status, out, err = run(capsys, "cache", *argv)
        assert status == 2 and out == ""
        assert "no cache folder: give FOLDER or set NPYDASK_CACHE" in err and err.count("\n") == 1
    missing = str(tmp_path / "nope")
    status, _, err = run(capsys, "cache", "info", missing)
    assert status == 2 and f"{missing}: no such folder" in err
    assert not os.path.exists(missing)  # (a mistyped folder is not made into a cache)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    status, _, err = run(capsys, "cache", "info", str(shared))
    assert status == 2 and str(shared) in err and err.count("\n") == 1  # (CacheFolderError: open to others)
    status, _, err = run(capsys, "cache", "prune", "--older-than", "-1", str(tmp_path))
    assert status == 2 and "--older-than takes a number of days of 0 or more" in err
    status, _, err = run(capsys, "cache", "fill", str(tmp_path))
    assert status == 2 and "local path" in err and "page cache" in err
    status, _, err = run(capsys, "cache", "fill", "s3://bucket/x/")
    assert status == 2 and "give --cache FOLDER or set NPYDASK_CACHE" in err


SHAPE = (16, 32, 32)  # 64 KiB: more than the header read, so opening does not read (and cache) it whole


def test_fill_stages_a_shard_then_reads_send_no_get(s3, tmp_path, capsys, monkeypatch):
    from npydask.testing.counting_proxy import CountingProxy

    space = s3.space()
    arrays = [np.random.default_rng(i).random(SHAPE, dtype="f4") for i in range(6)]
    for i, a in enumerate(arrays):
        s3.put_npy(f"{space}/v/{i}.npy", a)
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("NPYDASK_REMOTE_HEDGE", "off")
    folder = str(tmp_path / "cache")
    with CountingProxy(s3.endpoint) as proxy:
        options = ["--storage-option", f"endpoint={proxy.endpoint}", "--storage-option", "region=us-east-1"]
        url = f"s3://{space}/v/"
        status, out, err = run(
            capsys, "cache", "fill", url, "--shard-id", "1", "--num-shards", "2", "--roi-start", "2", "--roi-axes", "0",
            "--cache", folder, *options,
        )  # fmt: skip
        assert status == 0, err
        assert out.startswith("read 3 files, 168.0 KiB") and "the cache holds" in out and "warm_cache: 3 / 3" in err
        ds = npydask.open_dataset(
            url, storage_options={"endpoint": proxy.endpoint, "region": "us-east-1"}, cache=folder,
            shard_id=1, num_shards=2, roi_start=[2], roi_axes=[0],
        )  # fmt: skip
        proxy.reset()
        np.testing.assert_array_equal(ds.stack().compute(), np.stack([a[2:] for a in arrays[3:]]))
        assert proxy.counts.count("GET") == 0, proxy.counts
    status, out, _ = run(capsys, "cache", "info", folder, "--json")
    assert status == 0 and json.loads(out)["entries"] == 3


def test_the_cache_methods_are_the_commands_in_python(filled):
    folder, fetched = filled
    cache = npydask.Cache(folder)
    assert (cache.info().entries, cache.info().bytes) == (3, fetched)
    for days in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="number of days of 0 or more"):
            cache.prune(days)
    with pytest.raises(TypeError, match="number of days"):
        cache.prune("7")  # type: ignore[arg-type]
    assert cache.prune(1) == (0, 0)
    assert cache.clear() == fetched and cache.info().entries == 0
