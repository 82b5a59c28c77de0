"""The persistent header index: reused while files are unchanged, refreshed, atomic, never pickle."""

from __future__ import annotations

import base64
import errno
import json
import os
import struct

import numpy as np
import pytest

import npydask
from npydask.dataset import index as index_mod
from npydask.errors import NpyDaskWarning

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)


@pytest.fixture
def folder(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(20):
        np.save(data / f"{i:02d}.npy", np.full((3, 4), i, "<i4"))
    return data


def count_scans(monkeypatch):
    calls = []
    from npydask.dataset import open as opening

    real = opening.scan_headers

    def counting(paths, **kw):
        calls.append(list(paths))
        return real(paths, **kw)

    monkeypatch.setattr(opening, "scan_headers", counting)
    return calls


def test_index_is_built_then_reused(folder, tmp_path, monkeypatch):
    idx = tmp_path / "index.json"
    calls = count_scans(monkeypatch)
    ds = npydask.open_dataset(folder, index=idx)
    assert len(calls) == 1 and len(calls[0]) == 20
    data = json.loads(idx.read_text())
    assert data["format"] == "npydask-header-index" and len(data["names"]) == 20
    calls.clear()
    again = npydask.open_dataset(folder, index=idx)
    assert calls == []  # every header came from the index
    assert again.headers == ds.headers and again.files == ds.files
    np.testing.assert_array_equal(again.stack().compute(), np.stack([np.full((3, 4), i, "<i4") for i in range(20)]))


def test_changed_added_and_removed_files_are_noticed(folder, tmp_path, monkeypatch):
    idx = tmp_path / "index.json"
    npydask.open_dataset(folder, index=idx)
    calls = count_scans(monkeypatch)
    np.save(folder / "05.npy", np.zeros((3, 4, 1), "<i4").reshape(3, 4))  # rewritten
    st = os.stat(folder / "05.npy")
    os.utime(folder / "05.npy", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    np.save(folder / "20.npy", np.zeros((3, 4), "<i4"))  # added
    os.remove(folder / "00.npy")  # removed
    ds = npydask.open_dataset(folder, index=idx)
    assert sorted(os.path.basename(p) for p in calls[0]) == ["05.npy", "20.npy"]
    assert len(ds) == 20
    files = json.loads(idx.read_text())["names"]
    assert not any(k.endswith("00.npy") for k in files) and any(k.endswith("20.npy") for k in files)
    np.testing.assert_array_equal(ds[4].compute(), np.zeros((3, 4), "<i4"))  # 05.npy is now index 4


def test_index_never_trusts_a_tampered_entry(folder, tmp_path):
    idx = tmp_path / "index.json"
    npydask.open_dataset(folder, index=idx)
    data = json.loads(idx.read_text())
    assert len(data["headers"]) == 1  # twenty files, one header text
    data["headers"][0] = data["headers"][0].replace("'<i4'", "'|O'")
    idx.write_text(json.dumps(data))
    ds = npydask.open_dataset(folder, index=idx)  # the damaged entry is rescanned from the files
    assert ds.dtype == np.dtype("<i4")
    assert "<i4" in json.loads(idx.read_text())["headers"][0]  # and the index is mended


def test_header_texts_are_stored_once(folder, tmp_path):
    np.save(folder / "odd.npy", np.zeros((5,), "<i4"))
    idx = tmp_path / "index.json"
    with pytest.raises(ValueError, match="ndim"):
        npydask.open_dataset(folder, index=idx)
    ds = npydask.open_dataset(folder, index=idx, file_filter="[0-9]*.npy")
    data = json.loads(idx.read_text())
    table = np.frombuffer(base64.b64decode(data["table"]), index_mod._ROW)
    assert len(data["names"]) == len(table) == 21 and sorted(set(table["header"].tolist())) == [0, 1]
    assert len(data["headers"]) == 2 and len(ds) == 20


@pytest.mark.parametrize(
    "older",
    [
        '{"format": "npydask-header-index", "version": 1, "files": {"00.npy": [1, 2, 3, "x"]}}',
        '{"format": "npydask-header-index", "version": 2, "headers": [], "files": {"00.npy": [1, 2, 3, 0]}}',
    ],
)
def test_an_older_index_is_replaced_silently(folder, tmp_path, older):
    idx = tmp_path / "index.json"
    idx.write_text(older)
    ds = npydask.open_dataset(folder, index=idx)  # warnings are errors here: none is raised
    assert len(ds) == 20 and json.loads(idx.read_text())["version"] == index_mod.VERSION


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[1, 2]",
        '{"format": "other", "version": 2, "files": {}}',
        '{"format": "npydask-header-index", "version": 99, "headers": [], "files": {}}',
        '{"format": "npydask-header-index", "version": 3, "headers": [], "names": ["a"], "table": ""}',
        '{"format": "npydask-header-index", "version": 3, "headers": [], "names": [], "table": "!!"}',
        '{"format": "npydask-header-index", "version": 3, "headers": [], "names": [], "table": "AAAA"}',
        '{"format": "npydask-header-index", "version": 3, "headers": [], "names": ["a"], "table": "'
        + base64.b64encode(np.zeros(1, "<i8,<i8,<u8,<i8").tobytes()).decode()
        + '"}',
        '{"format": "npydask-header-index", "version": 3, "headers": [7], "names": [], "table": ""}',
        '{"format": "npydask-header-index", "version": 3, "headers": [], "names": [1], "table": "'
        + base64.b64encode(np.zeros(1, "<i8,<i8,<u8,<i8").tobytes()).decode()
        + '"}',
        '{"format": "npydask-header-index", "version": 3, "headers": [], "names": {}, "table": ""}',
    ],
)
def test_unusable_index_is_rebuilt_with_a_warning(folder, tmp_path, content):
    idx = tmp_path / "index.json"
    idx.write_text(content)
    with pytest.warns(NpyDaskWarning, match="index"):
        ds = npydask.open_dataset(folder, index=idx)
    assert len(ds) == 20
    assert json.loads(idx.read_text())["format"] == "npydask-header-index"


def test_write_is_atomic_and_leaves_no_temporary(folder, tmp_path, monkeypatch):
    idx = tmp_path / "index.json"
    npydask.open_dataset(folder, index=idx)
    before = idx.read_bytes()

    def broken_fsync(fd):
        raise OSError(errno.ENOSPC, "disk full")

    np.save(folder / "21.npy", np.zeros((3, 4), "<i4"))
    monkeypatch.setattr(os, "fsync", broken_fsync)  # (the index is written, then synced, then renamed)
    with pytest.raises(OSError, match="disk full"):
        npydask.open_dataset(folder, index=idx)
    assert idx.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".npydask")] == []


def test_bad_file_still_raises_with_an_index(folder, tmp_path):
    idx = tmp_path / "index.json"
    (folder / "zz.npy").write_bytes(b"garbage")
    with pytest.raises(npydask.NpyFormatError, match="zz.npy"):
        npydask.open_dataset(folder, index=idx)


# --------------------------------------------------------------------------
# A tampered or stale entry whose file still has the recorded (size, mtime, inode): every read site
# compares the header bytes it relies on with the file's, so the data never disagrees with the file.


def _raw_header(descr: str, fortran: bool, shape: tuple[int, ...], total: int) -> str:
    """A v1.0 preamble and header of exactly ``total`` bytes, as latin-1 text (an index stores that)."""
    text = f"{{'descr': {descr!r}, 'fortran_order': {fortran!r}, 'shape': {shape!r}, }}"
    body = text + " " * (total - 10 - len(text) - 1) + "\n"
    return (b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body.encode("latin1")).decode("latin1")


# (how, header given to every entry): each parses, and its payload fits the file, so the index keeps it
_TAMPERS = {
    "dtype": lambda: _raw_header("<i4", False, (8, 6), 128),  # the float bits as int32
    "byte-order": lambda: _raw_header(">f4", False, (8, 6), 128),  # the same values byte-swapped
    "shape": lambda: _raw_header("<f4", False, (6, 8), 128),  # the same bytes in another shape
    "dtype-and-shape": lambda: _raw_header("<i2", False, (8, 12), 128),
    "fortran-order": lambda: _raw_header("<f4", True, (8, 6), 128),  # transposed
    "offset": lambda: _raw_header("<f4", False, (8, 4), 192),  # payload 64 bytes further on, fewer rows
}


@pytest.fixture
def floats(tmp_path):
    data = tmp_path / "floats"
    data.mkdir()
    arrays = [np.random.default_rng(i).standard_normal((8, 6)).astype("<f4") for i in range(12)]
    for i, a in enumerate(arrays):
        np.save(data / f"{i:02d}.npy", a)
    return data, arrays


def _tamper(idx, how: str) -> None:
    data = json.loads(idx.read_text())
    assert len(data["headers"]) == 1
    data["headers"][0] = _TAMPERS[how]()
    idx.write_text(json.dumps(data))


_READS = {
    "stack": lambda ds: ds.stack().compute(),
    "stack-threads": lambda ds: ds.stack(chunks=(3, -1, -1)).compute(scheduler="threads"),
    "ds[i]": lambda ds: ds[5].compute(),
    "ds[i]-pread": lambda ds: ds[5].compute(),
    "ds[i]-mmap": lambda ds: ds[5].compute(),
    "slice-inside-files": lambda ds: ds.stack()[:, 1:3].compute(),
    "loader": lambda ds: [b for b in npydask.Loader(ds, batch_size=5)],
    "loader-no-prefetch": lambda ds: [b for b in npydask.Loader(ds, batch_size=4, prefetch=0)],
}


@pytest.mark.parametrize("how", list(_TAMPERS))
@pytest.mark.parametrize("read", list(_READS))
def test_a_tampered_index_entry_never_changes_the_data(floats, tmp_path, how, read):
    folder, arrays = floats
    idx = tmp_path / "index.json"
    backend = read.split("-")[-1] if read.startswith("ds[i]-") else "auto"
    clean = npydask.open_dataset(folder, index=idx, backend=backend)
    np.testing.assert_array_equal(clean.stack().compute(), np.stack(arrays))  # untampered: unchanged
    _tamper(idx, how)
    ds = npydask.open_dataset(folder, index=idx, backend=backend)  # identities match: the index is used
    assert ds.headers[0] != clean.headers[0]
    with pytest.raises(npydask.NpyFormatError) as info:
        _READS[read](ds)
    message = str(info.value)
    assert str(folder) in message and str(idx) in message, message
    assert "rebuild" in message or "delete" in message, message


@pytest.mark.parametrize("how", ["dtype", "shape", "fortran-order", "offset"])
@pytest.mark.parametrize("policy", ["error", "pad"])
@pytest.mark.parametrize("backend", ["auto", "pread", "mmap"])
def test_a_tampered_index_entry_is_caught_by_roi_reads(floats, tmp_path, how, policy, backend):
    folder, arrays = floats
    idx = tmp_path / "index.json"
    roi = dict(roi_start=[1, 1], roi_shape=[4, 3] if policy == "error" else [9, 3], out_of_bounds_policy=policy)
    clean = npydask.open_dataset(folder, index=idx, backend=backend, **roi)
    want = np.stack([np.pad(a, ((0, 2), (0, 0)))[1:10, 1:4] if policy == "pad" else a[1:5, 1:4] for a in arrays])
    np.testing.assert_array_equal(clean.stack().compute(), want)
    _tamper(idx, how)
    ds = npydask.open_dataset(folder, index=idx, backend=backend, **roi)
    for read in (lambda: ds.stack().compute(), lambda: ds[3].compute(), lambda: list(npydask.Loader(ds, 6))):
        with pytest.raises(npydask.NpyFormatError, match=str(idx)):
            read()


def test_an_entry_edited_smaller_is_caught_where_a_pad_roi_reads_none_of_it(floats, tmp_path):
    folder, arrays = floats
    idx = tmp_path / "index.json"
    roi = dict(roi_start=[4, 0], roi_shape=[2, 6], out_of_bounds_policy="pad", fill_value=-1)
    clean = npydask.open_dataset(folder, index=idx, **roi)
    np.testing.assert_array_equal(clean.stack().compute(), np.stack([a[4:6] for a in arrays]))
    data = json.loads(idx.read_text())
    data["headers"][0] = _raw_header("<f4", False, (2, 6), 128)  # rows 4..6 now lie outside every "file"
    idx.write_text(json.dumps(data))
    ds = npydask.open_dataset(folder, index=idx, **roi)
    assert ds.headers[0].shape == (2, 6)
    reads = (
        lambda: ds.stack().compute(),
        lambda: ds[3].compute(),
        lambda: list(npydask.Loader(ds, 6)),
        lambda: ds.concatenate().compute(),
    )
    for read in reads:
        with pytest.raises(npydask.NpyFormatError, match=r"\(2, 6\).*but the file holds shape \(8, 6\)") as info:
            read()
        assert str(idx) in str(info.value)


def test_an_entry_edited_to_an_empty_shape_is_checked_at_open(floats, tmp_path):
    folder, arrays = floats
    idx = tmp_path / "index.json"
    npydask.open_dataset(folder, index=idx)
    data = json.loads(idx.read_text())
    data["headers"][0] = _raw_header("<f4", False, (0, 6), 128)  # no rows: no task would ever read a file
    idx.write_text(json.dumps(data))
    with pytest.raises(npydask.NpyFormatError, match=r"00\.npy.*\(0, 6\).*but the file holds shape \(8, 6\)") as info:
        npydask.open_dataset(folder, index=idx)
    assert str(idx) in str(info.value) and "delete" in str(info.value)
    idx.unlink()
    np.save(folder / "12.npy", np.zeros((0, 6), "<f4"))  # a file that is empty: its entry is reused
    npydask.open_dataset(folder, index=idx)
    ds = npydask.open_dataset(folder, index=idx)
    np.testing.assert_array_equal(ds.concatenate().compute(), np.concatenate(arrays))


def test_one_tampered_entry_among_good_ones_names_its_file(floats, tmp_path):
    folder, arrays = floats
    idx = tmp_path / "index.json"
    npydask.open_dataset(folder, index=idx)
    data = json.loads(idx.read_text())
    data["headers"].append(_raw_header("<f4", False, (4, 6), 128))  # the first half of the payload only
    table = np.frombuffer(base64.b64decode(data["table"]), index_mod._ROW).copy()
    row = data["names"].index("floats/07.npy")
    table["header"][row] = 1
    data["table"] = base64.b64encode(table.tobytes()).decode()
    idx.write_text(json.dumps(data))
    ds = npydask.open_dataset(folder, index=idx)
    assert ds.headers[7].shape == (4, 6)
    for i in (0, 6, 8, 11):
        np.testing.assert_array_equal(ds[i].compute(), arrays[i])
    with pytest.raises(npydask.NpyFormatError, match="07.npy") as info:
        ds[7].compute()
    assert "(4, 6)" in str(info.value) and "(8, 6)" in str(info.value)  # expected and found
    with pytest.raises(npydask.NpyFormatError, match="07.npy"):
        ds[6:9].concatenate().compute()


# --------------------------------------------------------------------------
# Version 4: an identity column, so one index format serves local files and objects.


def test_a_version_3_index_is_read_as_it_is(folder, tmp_path, monkeypatch):
    idx = tmp_path / "index.json"
    npydask.open_dataset(folder, index=idx)
    data = json.loads(idx.read_text())
    assert data["version"] == 4 and data["kind"] == "files"
    del data["kind"]
    data["version"] = 3
    idx.write_text(json.dumps(data))
    before = idx.read_bytes()
    calls = count_scans(monkeypatch)
    ds = npydask.open_dataset(folder, index=idx)
    assert calls == [] and idx.read_bytes() == before  # every header from it, nothing rewritten
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([np.full((3, 4), i, "<i4") for i in range(20)]))


def test_an_index_url_for_local_files_is_refused(folder):
    with pytest.raises(ValueError, match="local disk"):
        npydask.open_dataset(folder, index="s3://bucket/index.json")


def test_an_index_of_objects_is_refused_for_local_files(folder, tmp_path):
    idx = tmp_path / "index.json"
    idx.write_text(
        json.dumps(
            {
                "format": "npydask-header-index",
                "version": 4,
                "kind": "objects",
                "root": "",
                "headers": [],
                "names": [],
                "table": "",
                "etags": [],
                "modified": [],
            }
        )
    )
    before = idx.read_bytes()
    with pytest.raises(ValueError, match=r"index\.json.*objects.*another index= path"):
        npydask.open_dataset(folder, index=idx)
    assert idx.read_bytes() == before  # never overwritten by the other kind


@pytest.mark.parametrize(
    ("urls", "root"),
    [
        (["s3://b/p/x/a.npy", "s3://b/p/y.npy"], "s3://b/p/"),
        (["s3://b/pa/a.npy", "s3://b/pb/a.npy"], "s3://b/"),
        (["s3://b/a.npy"], "s3://b/"),
        (["https://host:8080/d/a b.npy", "https://host:8080/d/é.npy"], "https://host:8080/d/"),
    ],
)
def test_object_names_are_stored_after_their_common_root(urls, root):
    assert index_mod.common_root(sorted(urls)) == root  # (the one the index stores names after)


# --------------------------------------------------------------------------
# index= over object storage (a real S3 server): identities from the LIST, no header request on reuse.

from _s3 import Requests  # noqa: E402


def _objects(s3, n_top=60, n_sub=(120, 120), shape=(4, 3), dtype="<f4"):
    """A new ``bucket/prefix`` holding ``data/``: ``n_top`` objects directly, then folders ``s0/``, ``s1/``.

    Returns the ``bucket/prefix`` and each object's array by its key relative to it.
    """
    from concurrent.futures import ThreadPoolExecutor

    space = s3.space()
    keys = [f"data/{i:03d}.npy" for i in range(n_top)]
    for k, n in enumerate(n_sub):
        keys += [f"data/s{k}/{i:03d}.npy" for i in range(n)]

    def put(key):
        a = np.random.default_rng(abs(hash(key)) % 2**32).standard_normal(shape).astype(dtype)
        s3.put_npy(f"{space}/{key}", a)
        return key, a

    with ThreadPoolExecutor(8) as pool:
        arrays = dict(pool.map(put, keys))
    return space, arrays


@pytest.fixture(scope="module")
def listed(s3):
    return _objects(s3)


@pytest.mark.parametrize("remote_index", [False, True])
@pytest.mark.parametrize("recursive", [False, True])
def test_reusing_an_index_over_a_prefix_costs_the_list_pages_and_no_header_request(
    s3, listed, tmp_path, monkeypatch, remote_index, recursive
):
    space, arrays = listed
    idx = f"s3://{space}/indexes/{recursive}.json" if remote_index else str(tmp_path / "index.json")
    root = f"s3://{space}/data"
    requests = Requests(monkeypatch)
    first = npydask.open_dataset(root, index=idx, recursive=recursive, storage_options=s3.options)
    assert len(first) == 300
    assert requests.counts["get"] == 300 + remote_index  # the headers (and the missing index's GET)
    assert requests.counts["put"] == remote_index  # the new index: one PUT
    requests.clear()
    ds = npydask.open_dataset(root, index=idx, recursive=recursive, storage_options=s3.options)
    listing = requests.counts["list"] + requests.counts["list_with_delimiter"]
    assert listing == (1 if recursive else 3)  # one paged LIST, or the prefix and its two folders
    assert requests.listed_pages == (1 if recursive else 0)  # (300 keys: one page of up to 1,000)
    assert requests.counts["get"] == int(remote_index) and requests.counts["head"] == 0 and requests.counts["put"] == 0
    assert ds.files == first.files and ds.headers == first.headers
    want = np.stack([arrays[u[len(f"s3://{space}/") :]] for u in ds.files])
    np.testing.assert_array_equal(ds.stack().compute(), want)


def test_a_replaced_object_is_read_again_and_its_entry_refreshed(s3, tmp_path, monkeypatch):
    space, arrays = _objects(s3, n_top=12, n_sub=())
    idx = tmp_path / "index.json"
    root = f"s3://{space}/data"
    npydask.open_dataset(root, index=idx, storage_options=s3.options)
    new = {
        "data/003.npy": np.arange(12, dtype="<f4").reshape(4, 3),  # same header, new bytes (a new ETag)
        "data/007.npy": np.arange(6, dtype="<f4").reshape(2, 3),
    }  # another shape
    for key, a in new.items():
        s3.put_npy(f"{space}/{key}", a)
    arrays.update(new)
    requests = Requests(monkeypatch)
    ds = npydask.open_dataset(root, index=idx, storage_options=s3.options)
    assert requests.counts["get"] == 2 and requests.counts["head"] == 0  # the two stale entries' headers
    assert ds.shapes[7] == (2, 3) and ds.shapes[3] == (4, 3)
    for i, url in enumerate(ds.files):
        np.testing.assert_array_equal(ds[i].compute(), arrays[url[len(f"s3://{space}/") :]])
    requests.clear()
    npydask.open_dataset(root, index=idx, storage_options=s3.options)
    assert requests.counts["get"] == 0  # refreshed: reused as they are now


def test_files_given_as_urls_cost_one_head_each_and_no_header_get(s3, listed, tmp_path, monkeypatch):
    space, arrays = listed
    idx = tmp_path / "index.json"
    keys = sorted(arrays)[::7]
    files = [f"s3://{space}/{k}" for k in keys]
    npydask.open_dataset(files=files, index=idx, storage_options=s3.options)
    requests = Requests(monkeypatch)
    ds = npydask.open_dataset(files=files, index=idx, storage_options=s3.options, shard_id=1, num_shards=2)
    assert requests.counts["head"] == len(ds) and requests.counts["get"] == 0
    mine = keys[len(keys) // 2 :]
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([arrays[k] for k in mine]))


def test_an_object_replaced_after_opening_with_an_index_fails_its_task(s3, tmp_path):
    space, arrays = _objects(s3, n_top=4, n_sub=())
    idx = tmp_path / "index.json"
    root = f"s3://{space}/data"
    npydask.open_dataset(root, index=idx, storage_options=s3.options)
    ds = npydask.open_dataset(root, index=idx, storage_options=s3.options)  # from the index
    s3.put_npy(f"{space}/data/002.npy", np.ones((4, 3), "<f4"))
    with pytest.raises(npydask.FileChangedError, match="002.npy"):
        ds[2].compute()
    np.testing.assert_array_equal(ds[1].compute(), arrays["data/001.npy"])


def test_a_tampered_entry_of_an_object_never_changes_the_data(s3, tmp_path):
    space, arrays = _objects(s3, n_top=6, n_sub=(), shape=(8, 6))
    idx = tmp_path / "index.json"
    root = f"s3://{space}/data"
    npydask.open_dataset(root, index=idx, storage_options=s3.options)
    for how in ("dtype", "shape", "fortran-order", "offset"):
        _tamper(idx, how)
        ds = npydask.open_dataset(root, index=idx, storage_options=s3.options)  # ETags match: the entry is used
        reads = (
            lambda ds=ds: ds.stack().compute(),
            lambda ds=ds: ds[3].compute(),
            lambda ds=ds: list(npydask.Loader(ds, 4)),
        )
        for read in reads:
            with pytest.raises(npydask.NpyFormatError, match="index.json") as info:
                read()
            assert f"s3://{space}/data/" in str(info.value)
        idx.unlink()
        npydask.open_dataset(root, index=idx, storage_options=s3.options)  # rebuilt, clean


def test_a_damaged_index_object_is_rebuilt_with_a_warning(s3, listed, monkeypatch):
    space, arrays = listed
    idx = f"s3://{space}/indexes/damaged.json"
    s3.put(f"{space}/indexes/damaged.json", b"not json")
    with pytest.warns(NpyDaskWarning, match="damaged.json"):
        ds = npydask.open_dataset(f"s3://{space}/data", index=idx, storage_options=s3.options)
    stored = json.loads(s3.get(f"{space}/indexes/damaged.json"))
    assert stored["kind"] == "objects" and stored["root"] == f"s3://{space}/data/" and len(stored["names"]) == len(ds)
    bucket, _, prefix = space.partition("/")
    listed_tags = s3.client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/data/")["Contents"]
    assert set(stored["etags"]) == {o["ETag"] for o in listed_tags}


def test_a_local_index_is_refused_for_objects(s3, listed, folder, tmp_path):
    space, _ = listed
    idx = tmp_path / "index.json"
    npydask.open_dataset(folder, index=idx)
    before = idx.read_bytes()
    with pytest.raises(ValueError, match="local files.*objects"):
        npydask.open_dataset(f"s3://{space}/data", index=idx, storage_options=s3.options)
    assert idx.read_bytes() == before


def test_what_reading_through_an_index_costs(s3, tmp_path, monkeypatch):
    space, arrays = _objects(s3, n_top=8, n_sub=(), shape=(16, 8))
    root = f"s3://{space}/data"
    idx = tmp_path / "index.json"
    plain = npydask.open_dataset(root, storage_options=s3.options)
    npydask.open_dataset(root, index=idx, storage_options=s3.options)
    ds = npydask.open_dataset(root, index=idx, storage_options=s3.options)
    requests = Requests(monkeypatch)
    np.testing.assert_array_equal(plain[3].compute(), arrays["data/003.npy"])
    assert requests.counts["get"] == 1  # its header was read from it at open: the data GET only
    requests.clear()
    np.testing.assert_array_equal(ds[3].compute(), arrays["data/003.npy"])
    assert requests.counts["get"] == 2  # the index's header is compared first: one header GET, then the data
    requests.clear()
    np.testing.assert_array_equal(ds[3].compute(), arrays["data/003.npy"])
    assert requests.counts["get"] == 1  # compared once per object and process
    requests.clear()
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([arrays[f"data/{i:03d}.npy"] for i in range(8)]))
    assert requests.counts["get"] == 8 and requests.counts["head"] == 0  # small objects: one whole GET each
