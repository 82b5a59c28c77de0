"""read_boxes: many boxes of one file read together equal numpy slicing, locally and from SeaweedFS."""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import warnings
from typing import NamedTuple

import numpy as np
import pytest
from _boxes import box_lists, expected_box
from hypothesis import given, settings
from hypothesis import strategies as st

import npydask
from npydask.errors import FileChangedError, NpyFormatError, NpzCrcError, RoiError
from npydask.plan.patch_runs import file_box, plan_boxes
from npydask.plan.region import Box
from npydask.reader import FileBoxes, FileRef, read_boxes, read_boxes_many
from npydask.storage import HeaderCheck
from npydask.storage.where import resolve
from npydask.testing import drop_page_cache
from npydask.testing.conformance import assert_same_array, sample_array

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)

DTYPES = ["?", "u1", "<i2", ">i4", "<f2", ">f4", "<f8", ">c16", "<M8[ms]", "S3", "<U2", "V5",
          np.dtype([("a", "<i2"), ("b", ">f8")], align=True)]  # fmt: skip


@pytest.fixture
def unique_path(tmp_path: pathlib.Path):
    """A fresh file name per call (hypothesis reuses the test's tmp_path across examples)."""
    counter = itertools.count()
    return lambda suffix=".npy": str(tmp_path / f"b{next(counter)}{suffix}")


def _saved(data, unique_path, shapes, dtypes):
    """A sample array of a drawn shape, dtype and order saved to a new file, and boxes of it."""
    shape = data.draw(shapes.map(tuple))
    a = sample_array(shape, np.dtype(data.draw(st.sampled_from(dtypes))), seed=data.draw(st.integers(0, 2**16)))
    if data.draw(st.booleans()):
        a = np.asfortranarray(a)
    path = unique_path()
    np.save(path, a)
    return a, path, data.draw(box_lists(shape, max_boxes=5))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_boxes_of_local_files_equal_numpy(unique_path, data):
    a, path, boxes = _saved(data, unique_path, st.lists(st.integers(0, 6), max_size=4), DTYPES)
    fill = 0 if a.dtype.kind in "VSUMmO" else 5
    got = read_boxes(FileRef.open(path), boxes, fill_value=fill, max_gap=data.draw(st.sampled_from([0, 8, None])))
    assert len(got.arrays) == len(boxes)
    for g, b in zip(got.arrays, boxes):
        assert g.flags.c_contiguous and g.flags.writeable
        assert_same_array(g, expected_box(a, b, fill))
    assert got.patch_bytes == sum(g.nbytes for g in got.arrays)


def test_npz_members_stored_and_deflated(unique_path):
    a = np.arange(5 * 6 * 7, dtype="<i4").reshape(5, 6, 7)
    b = np.asfortranarray(np.linspace(0, 1, 48).reshape(6, 8))
    boxes_a = [Box((1, 2), (4, 9)), Box((0, 0, 0), (5, 6, 7)), Box((-1, 5), (2, 7))]
    boxes_b = [Box((1, 1), (3, 9)), Box((2, 2), (5, 5))]
    for save in (np.savez, np.savez_compressed):
        path = unique_path(".npz")
        save(path, a=a, b=b)
        for key, arr, boxes in (("a", a, boxes_a), ("b", b, boxes_b)):
            got = read_boxes(FileRef.open(path, key=key), boxes, fill_value=-1)
            for g, box in zip(got.arrays, boxes):
                assert_same_array(g, expected_box(arr, box, -1))
            assert got.requests >= 1 and got.bytes_read > 0


@pytest.mark.parametrize("backend", ["pread", "mmap"])
def test_a_whole_stored_member_is_crc_checked_into_a_native_out(unique_path, backend):
    a = np.arange(24, dtype=">i4").reshape(4, 6)
    path = unique_path(".npz")
    np.savez(path, a=a)
    out = np.empty((4, 6), "=i4")
    got = read_boxes(FileRef.open(path, key="a", backend=backend), [Box((0, 0), (4, 6))], out=[out])
    assert got.arrays[0] is out and out.tolist() == a.tolist()


def test_a_deflated_member_with_a_bad_crc_is_refused_when_a_box_is_whole(unique_path):
    path = unique_path(".npz")
    np.savez_compressed(path, a=np.arange(1000, dtype="<i8"))
    ref = FileRef.open(path, key="a")
    with open(path, "r+b") as f:  # the CRC-32 in the central directory, one bit flipped
        data = bytearray(f.read())
        at = data.rindex(b"PK\x01\x02") + 16
        data[at] ^= 1
        f.seek(0)
        f.write(data)
    os.utime(path, ns=(ref.identity.mtime_ns, ref.identity.mtime_ns))  # (the same identity)
    npydask.storage.clear_cache()
    read_boxes(FileRef.open(path, key="a"), [Box((3,), (9,))])  # a part: no CRC to check
    with pytest.raises(NpzCrcError):
        read_boxes(FileRef.open(path, key="a"), [Box((3,), (9,)), Box((0,), (1000,))])


def test_each_byte_is_read_once_and_counted(unique_path, monkeypatch):
    a = np.random.default_rng(0).standard_normal((8, 32, 64)).astype("<f4")
    path = unique_path()
    np.save(path, a)
    boxes = [Box((1, 2, 3), (5, 20, 40)), Box((3, 10, 20), (7, 30, 60)), Box((1, 2, 3), (5, 20, 40)),
             Box((6, 30, 60), (10, 34, 70))]  # fmt: skip
    ref = FileRef.open(path)
    calls: list[int] = []
    real = os.preadv

    def counting(fd, buffers, offset):
        got = real(fd, buffers, offset)
        calls.append(got)
        return got

    monkeypatch.setattr(os, "preadv", counting)
    got = read_boxes(ref, boxes, fill_value=0, max_gap=0)
    wanted = set()
    for box in boxes:
        full = file_box(a.shape, box)
        lo = [min(max(s, 0), n) for s, n in zip(full.start, a.shape)]
        hi = [min(max(s, 0), n) for s, n in zip(full.stop, a.shape)]
        elements = np.arange(a.size).reshape(a.shape)[tuple(slice(p, q) for p, q in zip(lo, hi))].ravel()
        wanted |= set((ref.header.data_offset + elements[:, None] * 4 + np.arange(4)).ravel().tolist())
    assert got.bytes_read == len(wanted) == sum(calls)  # the union: overlaps and the repeated box read once
    assert got.requests == len(calls) == len(plan_boxes(ref.header, boxes, max_gap=0).spans)
    for g, box in zip(got.arrays, boxes):
        assert_same_array(g, expected_box(a, box, 0))
    calls.clear()
    wide = read_boxes(ref, boxes)  # the gap_bytes setting (4 KiB): rows and planes merged
    assert wide.requests == len(calls) < got.requests and wide.bytes_read == sum(calls) >= got.bytes_read


def test_boxes_wholly_outside_read_nothing_but_still_check_the_file(unique_path):
    path = unique_path()
    np.save(path, np.zeros((3, 3), "u1"))
    ref = FileRef.open(path)
    got = read_boxes(ref, [Box((5, 5), (6, 7))], fill_value=9)
    assert got.arrays[0].tolist() == [[9, 9]] and got.bytes_read == got.requests == 0
    np.save(path, np.zeros((4, 4), "u1"))
    with pytest.raises(FileChangedError):
        read_boxes(ref, [Box((5, 5), (6, 7))], fill_value=9)


def test_a_file_changed_after_planning_raises(unique_path):
    path = unique_path()
    np.save(path, np.arange(100, dtype="<i4").reshape(10, 10))
    ref = FileRef.open(path)
    np.save(path, np.arange(100, 200, dtype="<i4").reshape(10, 10))  # same size: another inode or mtime
    st = os.stat(path)
    if (st.st_size, st.st_mtime_ns, st.st_ino) == tuple(ref.identity):
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(FileChangedError, match=os.path.basename(path)):
        read_boxes(ref, [Box((0, 0), (2, 2))])


def test_a_header_other_than_the_one_relied_on_is_refused(unique_path):
    path, other = unique_path(), unique_path()
    np.save(path, np.zeros((4, 4), "<f4"))
    np.save(other, np.zeros((4, 4), ">f4"))
    ref = FileRef.open(path)
    with open(other, "rb") as f:
        raw = f.read(ref.header.data_offset)
    ref = ref._replace(check=HeaderCheck(raw, "the first file's header", "open it with headers='all'"))
    with pytest.raises(NpyFormatError, match="first file's header"):
        read_boxes(ref, [Box((0, 0), (2, 2))])


def test_bad_arguments(unique_path):
    path = unique_path()
    np.save(path, np.zeros((4, 4), "<i2"))
    ref = FileRef.open(path)
    with pytest.raises(RoiError, match=os.path.basename(path)):
        read_boxes(ref, [Box((0, 0, 0), (1, 1, 1))])
    with pytest.raises(ValueError, match="nan"):
        read_boxes(ref, [Box((0,), (1,))], fill_value=math.nan)
    with pytest.raises(ValueError, match="max_gap"):
        read_boxes(ref, [], max_gap=-1)
    assert read_boxes(ref, []) == ([], 0, 0, 0)


def test_direct_io_reads_the_same_values(unique_path):
    a = np.arange(64 * 64, dtype="<u2").reshape(64, 64)
    path = unique_path()
    np.save(path, a)
    boxes = [Box((3, 5), (40, 9)), Box((30, 60), (70, 70))]
    with npydask.config.set(direct_io=True), warnings.catch_warnings():
        # (a file system that refuses O_DIRECT, tmpfs, warns once and reads through the page cache)
        warnings.filterwarnings("ignore", "the file system refuses O_DIRECT", npydask.NpyDaskWarning)
        got = read_boxes(FileRef.open(path), boxes, fill_value=1)
    for g, box in zip(got.arrays, boxes):
        assert_same_array(g, expected_box(a, box, 1))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_boxes_written_into_out_arrays(unique_path, data):
    dtypes = ["u1", ">i4", "<f8", ">c8", np.dtype([("a", ">i2"), ("b", "u1")])]
    a, path, boxes = _saved(data, unique_path, st.lists(st.integers(0, 5), min_size=1, max_size=3), dtypes)
    shape, dtype = a.shape, a.dtype
    backend = data.draw(st.sampled_from(["pread", "mmap"]))
    kinds = [data.draw(st.sampled_from(["none", "file", "native"])) for _ in boxes]
    native = dtype.newbyteorder("=")
    out = [None if k == "none" else np.empty(file_box(shape, b).shape, dtype if k == "file" else native)
           for k, b in zip(kinds, boxes)]  # fmt: skip
    got = read_boxes(FileRef.open(path, backend=backend), boxes, out=out)
    for g, o, b, k in zip(got.arrays, out, boxes, kinds):
        want = expected_box(a, b, 0)
        if k == "none":
            assert_same_array(g, want)
            continue
        assert g is o
        assert_same_array(g, want if k == "file" else want.astype(native))


def test_out_arrays_that_do_not_fit_are_refused(unique_path):
    path = unique_path()
    np.save(path, np.zeros((4, 6), ">i2"))
    ref = FileRef.open(path)
    boxes = [Box((0, 0), (2, 3))]
    with pytest.raises(ValueError, match=r"one array \(or None\) per box: 1 boxes, 2 found"):
        read_boxes(ref, boxes, out=[None, None])
    with pytest.raises(TypeError, match="out\\[0\\] must be a numpy.ndarray"):
        read_boxes(ref, boxes, out=[[0] * 6])
    bad = [np.empty((3, 2), ">i2"), np.empty((2, 3), "<i4"), np.empty((3, 2), ">i2").T, np.empty((2, 3), ">i2")]
    bad[3].flags.writeable = False
    for o in bad:
        with pytest.raises(ValueError, match=r"out\[0\] must be a writeable C-contiguous array of shape \(2, 3\)"):
            read_boxes(ref, boxes, out=[o])


class Patch(NamedTuple):
    """A sampler's patch: a file index and a box over the trailing axes."""

    file: int
    start: tuple[int, ...]
    stop: tuple[int, ...]


def test_many_files_each_with_its_boxes(unique_path):
    arrays = [np.arange(60, dtype="<i2").reshape(3, 4, 5) * (i + 1) for i in range(3)]
    paths = [unique_path() for _ in arrays]
    for p, a in zip(paths, arrays):
        np.save(p, a)
    patches = [Patch(0, (0, 0), (2, 2)), Patch(2, (3, 4), (5, 6)), Patch(0, (1, 1), (3, 3)), Patch(1, (0, 0), (4, 5))]
    files = [FileBoxes(FileRef.open(paths[i]), [q for q in patches if q.file == i]) for i in range(3)]
    slot = np.empty((3, 2, 2), "<i2")
    files[2] = files[2]._replace(out=[slot])
    got = read_boxes_many(files, fill_value=-1)
    assert got[2].arrays[0] is slot
    for f, r in zip(files, got):
        a = arrays[paths.index(f.ref.path)]
        for q, g in zip(f.boxes, r.arrays):
            assert_same_array(g, expected_box(a, q, -1))
    assert read_boxes_many([]) == []


# --------------------------------------------------------------------------
# Object storage (SeaweedFS)


def _object_ref(s3, url: str, key: str | None = None) -> FileRef:
    where = resolve(url, s3.options)
    return FileRef.open(where.path, key=key, source=where.source)


def test_boxes_of_an_object_equal_numpy_with_each_byte_requested_once(s3, monkeypatch):
    import obstore

    a = np.asfortranarray(np.random.default_rng(1).standard_normal((16, 40, 50)).astype(">f8"))
    url = f"s3://{s3.space()}/v.npy"
    s3.put_npy(url[5:], a)
    ref = _object_ref(s3, url)
    boxes = [Box((2, 3), (30, 20)), Box((10, 10), (35, 45)), Box((-4, 40), (8, 60)), Box((0, 0, 0), (16, 40, 50))]
    ranges: list[tuple[int, int]] = []
    real, real_async = obstore.get, obstore.get_async

    def get(store, key, options=None):
        ranges.append(tuple(options["range"]))
        return real(store, key, options=options)

    def get_async(store, key, options=None):  # (the request scheduler's)
        ranges.append(tuple(options["range"]))
        return real_async(store, key, options=options)

    monkeypatch.setattr(obstore, "get", get)
    monkeypatch.setattr(obstore, "get_async", get_async)
    got = read_boxes(ref, boxes[:3], fill_value=-2.5, max_gap=0)
    for g, box in zip(got.arrays, boxes):
        assert_same_array(g, expected_box(a, box, -2.5))
    assert got.requests == len(ranges) and got.bytes_read == sum(b - a for a, b in ranges)
    spans = plan_boxes(ref.header, boxes[:3], max_gap=0).spans
    assert sorted(ranges) == sorted(zip(spans.offsets.tolist(), (spans.offsets + spans.lengths).tolist()))
    ranges.clear()
    with npydask.config.set(remote_part_bytes=4096):  # (captured with the store: a new source)
        ref = _object_ref(s3, url)
    ranges.clear()
    got = read_boxes(ref, boxes)
    assert got.requests > len(plan_boxes(ref.header, boxes, max_gap=ref.options.gap_bytes).spans)
    assert got.bytes_read == sum(b - a for a, b in ranges) and got.requests == len(ranges)
    for g, box in zip(got.arrays, boxes):
        assert_same_array(g, expected_box(a, box, 0))


def test_a_replaced_object_raises_file_changed(s3):
    a = np.arange(1000, dtype="<i4").reshape(10, 100)
    space = s3.space()
    s3.put_npy(f"{space}/v.npy", a)
    ref = _object_ref(s3, f"s3://{space}/v.npy")
    s3.put_npy(f"{space}/v.npy", a + 1)  # the same size, another ETag
    with pytest.raises(FileChangedError, match="v.npy"):
        read_boxes(ref, [Box((1, 1), (3, 30)), Box((5, 50), (9, 90))])


def test_a_stored_npz_member_of_an_object(s3):
    import io

    a = np.arange(6 * 7 * 8, dtype="<u2").reshape(6, 7, 8)
    buf = io.BytesIO()
    np.savez(buf, x=a)
    space = s3.space()
    s3.put(f"{space}/v.npz", buf.getvalue())
    ref = _object_ref(s3, f"s3://{space}/v.npz", key="x")
    boxes = [Box((1, 2), (5, 9)), Box((-1, 0, 0), (7, 7, 8))]
    got = read_boxes(ref, boxes)
    for g, box in zip(got.arrays, boxes):
        assert_same_array(g, expected_box(a, box, 0))


def test_many_objects_at_once_and_a_replaced_one_raises(s3):
    space = s3.space()
    arrays = [np.random.default_rng(i).standard_normal((6, 20, 30)).astype("<f4") for i in range(20)]
    urls = [f"s3://{space}/{i:02d}.npy" for i in range(20)]
    for url, a in zip(urls, arrays):
        s3.put_npy(url[5:], a)
    refs = [_object_ref(s3, url) for url in urls]
    boxes = [Box((2, 3), (9, 40)), Box((1, 0, 0), (4, 20, 10))]
    got = read_boxes_many([FileBoxes(ref, boxes) for ref in refs], fill_value=7)
    for a, r in zip(arrays, got):
        for g, box in zip(r.arrays, boxes):
            assert_same_array(g, expected_box(a, box, 7))
    s3.put_npy(urls[13][5:], arrays[13] + 1)
    with pytest.raises(FileChangedError, match="13.npy"):
        read_boxes_many([FileBoxes(ref, boxes) for ref in refs])


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize(("backend", "strategy"), [("mmap", None), ("auto", "mapped")])
def test_boxes_copied_from_the_mapping(unique_path, backend, strategy, order):
    a = np.asarray(np.arange(6 * 10 * 12, dtype=">i4").reshape(6, 10, 12), order=order)
    path = unique_path()
    np.save(path, a)
    boxes = [Box((1, 2), (7, 9)), Box((0, 0, 0), (6, 10, 12)), Box((-2, 8, 10), (3, 12, 14)), Box((9, 9), (9, 11))]
    with npydask.config.set(roi_strategy=strategy or "auto"):
        ref = FileRef.open(path, backend=backend)
    got = read_boxes(ref, boxes, fill_value=-3)
    for g, box in zip(got.arrays, boxes):
        assert g.flags.writeable and g.flags.c_contiguous
        assert_same_array(g, expected_box(a, box, -3))
    assert got.requests == 0
    assert got.bytes_read == sum(np.count_nonzero(expected_box(np.ones(a.shape, bool), b, 0)) for b in boxes) * 4
    got.arrays[1][...] = 0  # a copy, not a view of the file
    assert np.load(path)[0, 0, 1] == 1
    np.save(path, a + 1)
    with pytest.raises(FileChangedError):
        read_boxes(ref, boxes)


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="asking the page cache needs Linux's RWF_NOWAIT")
def test_probe_cache_maps_warm_boxes_and_reads_cold_ones_as_spans(tmp_path):
    a = np.random.default_rng(0).random((40, 128, 256), dtype=np.float32)  # 5 MiB: several pages a plane
    path = str(tmp_path / "v.npy")
    np.save(path, a)
    boxes = [Box((3, 10, 20), (30, 60, 90)), Box((-4, 100, 200), (8, 140, 270)), Box((20, 0, 0), (40, 128, 256))]
    with npydask.config.set(roi_strategy="mapped"):
        ref = FileRef.open(path)

    def read(probe):
        got = read_boxes(ref, boxes, fill_value=-1, probe_cache=probe)
        for g, box in zip(got.arrays, boxes):
            assert_same_array(g, expected_box(a, box, -1))
        return got

    assert read(True).requests == 0  # just written: copied from the mapping
    if not drop_page_cache(path):
        pytest.skip("this file system keeps a file's pages in memory (tmpfs): nothing is ever cold")
    cold = read(True)
    assert cold.requests > 0 and cold.bytes_read >= cold.patch_bytes // 2  # the spans, not the mapping
    assert read(True).requests == 0  # the spans read brought the pages in: mapped again
    assert drop_page_cache(path)
    assert read(False).requests == 0  # without probing: the mapping, cold or not


@pytest.mark.parametrize("honour_if_match", [True, False])
def test_boxes_over_http_and_a_replaced_file(tmp_path, http_server, honour_if_match):
    a = np.arange(8 * 30 * 40, dtype="<f4").reshape(8, 30, 40)
    np.save(tmp_path / "v.npy", a)
    server = http_server(tmp_path, honour_if_match=honour_if_match)
    where = resolve(server.url("v.npy"), None)
    ref = FileRef.open(where.path, source=where.source)
    boxes = [Box((2, 5), (20, 30)), Box((4, 25, 35), (12, 35, 45))]
    got = read_boxes(ref, boxes, fill_value=-1)
    for g, box in zip(got.arrays, boxes):
        assert_same_array(g, expected_box(a, box, -1))
    np.save(tmp_path / "v.npy", a + 1)  # same size; the server's ETag changes with the file
    with pytest.raises(FileChangedError, match="v.npy"):
        read_boxes(ref, boxes)
