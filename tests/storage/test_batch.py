"""The tight per-file loops agree with the general path, file by file, error by error."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from npydask.errors import FileChangedError, NpyFormatError
from npydask.storage import FileIdentity, HeaderCheck, _batch, scan_file
from npydask.storage._batch import SCAN_READ, read_files, scan_files


def _outcome(result):
    return type(result) if isinstance(result, BaseException) else result


@pytest.fixture
def mixed(tmp_path):
    """Plain files, repeated headers, a long header, a truncated file, a directory, a missing path."""
    paths = []
    for i in range(6):
        p = tmp_path / f"plain{i}.npy"
        np.save(p, np.full((4, 5), i, "<f4"))
        paths.append(str(p))
    wide = np.zeros((2,), dtype=[(f"field_with_a_long_name_{i:04d}", "<i2") for i in range(200)])
    np.save(tmp_path / "long.npy", wide)  # a header over 4 KiB: the general path
    paths.append(str(tmp_path / "long.npy"))
    medium = np.zeros((3,), dtype=[(f"f{i:02d}", "<u2") for i in range(30)])
    for name in ("medium1.npy", "medium2.npy"):  # headers past scan_files' first read (SCAN_READ), under 4 KiB
        np.save(tmp_path / name, medium)
        paths.append(str(tmp_path / name))
    np.save(tmp_path / "short.npy", np.zeros((4, 5), "<f4"))
    raw = (tmp_path / "short.npy").read_bytes()
    (tmp_path / "short.npy").write_bytes(raw[:-3])
    paths.append(str(tmp_path / "short.npy"))
    os.mkdir(tmp_path / "dir.npy")
    paths += [str(tmp_path / "dir.npy"), str(tmp_path / "missing.npy")]
    return paths


def _scan_or_error(path: str) -> object:
    """What ``scan_file`` gives for ``path``: its result, or the error it raised."""
    try:
        return scan_file(path)
    except (OSError, ValueError) as e:
        return e


def _same_outcome(result: object, expected: object) -> bool:
    """``scan_files``'s entry matches ``scan_file``: an equal result, or an error of the same type and message."""
    if isinstance(expected, (OSError, ValueError)):
        return type(result) is type(expected) and str(result) == str(expected)
    return result == expected


def test_scan_files_matches_scan_file(mixed):
    got = scan_files(mixed)
    for path, result in zip(mixed, got):
        assert _same_outcome(result, _scan_or_error(path))
    kinds = [_outcome(r) for r in got[-3:]]
    assert kinds == [NpyFormatError, IsADirectoryError, FileNotFoundError]
    assert got[6][1].dtype == np.load(mixed[6]).dtype
    assert got[8][1].data_offset > SCAN_READ and got[8][1].dtype == np.load(mixed[8]).dtype


def test_scan_files_repeated_header_shortcut_agrees_with_the_general_path(tmp_path):
    """Files right after one with a header they start with, or nearly: each result equals scan_file's."""
    a = np.arange(20, dtype="<f4").reshape(4, 5)
    paths = []

    def put(name: str, data: bytes) -> None:
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))

    np.save(tmp_path / "a.npy", a)
    whole = (tmp_path / "a.npy").read_bytes()
    np.save(tmp_path / "b.npy", np.zeros((4, 6), "<f4"))  # the same header length, another shape
    np.save(tmp_path / "c.npy", np.zeros((4, 5), ">f4"))  # another byte order
    put("a1.npy", whole)
    put("a2.npy", whole[:-1])  # the previous file's header, one payload byte short: truncated
    put("a3.npy", whole)
    put("b.npy", (tmp_path / "b.npy").read_bytes())
    put("a4.npy", whole[:128] + b"\x00" * 80)  # the same header, other payload bytes
    put("c.npy", (tmp_path / "c.npy").read_bytes())
    put("a5.npy", whole[:100])  # inside the header: truncated
    put("a6.npy", whole + b"extra")  # longer than its header says (accepted as the general path does)
    got = scan_files(paths)
    for path, result in zip(paths, got):
        assert _same_outcome(result, _scan_or_error(path)), path
    assert [type(r).__name__ for r in got].count("NpyFormatError") == 2
    assert got[0][1] is got[2][1] and got[3][1].shape == (4, 6) and got[5][1].dtype == np.dtype(">f4")


def test_scan_files_twice_gives_the_same_header_object(mixed):
    first, second = scan_files(mixed[:2]), scan_files(mixed[:2])
    assert first[0][1] is second[1][1]  # the memo serves equal headers


def _item(p: str, skip: int = 0, checked: bool = True) -> tuple:
    identity, header, raw, _ = scan_file(p)
    return (p, identity, header.data_offset + skip, HeaderCheck(raw, "a test", "none") if checked else None)


@pytest.mark.parametrize("checked", [True, False], ids=["header checked", "unchecked"])
@pytest.mark.parametrize("skip", [0, 20], ids=["whole payload", "a run inside the payload"])
def test_read_files_fills_each_slot(tmp_path, checked, skip):
    arrays = [np.arange(20, dtype="<f4").reshape(4, 5) + 100 * i for i in range(5)]
    items = []
    for i, a in enumerate(arrays):
        p = str(tmp_path / f"{i}.npy")
        if i == 3:  # a version 2.0 header of another length, between 1.0 ones
            with open(p, "wb") as f:
                np.lib.format.write_array(f, a, version=(2, 0))
        else:
            np.save(p, a)
        items.append(_item(p, skip, checked))
    out = np.empty((5, 4 * 5 - skip // 4), "<f4")
    read_files(items, memoryview(out.reshape(-1).view(np.uint8)), out[0].nbytes)
    np.testing.assert_array_equal(out, np.stack(arrays).reshape(5, -1)[:, skip // 4 :])


@pytest.mark.parametrize("skip", [0, 8])
def test_read_files_refuses_other_header_bytes(tmp_path, skip):
    """The header bytes read with the payload must be the expected ones (a stale index, another file's header)."""
    p, q = str(tmp_path / "a.npy"), str(tmp_path / "b.npy")
    np.save(p, np.zeros(8, "<f8"))
    np.save(q, np.zeros(8, "<i8"))
    path, identity, offset, _ = _item(p, skip)
    other = HeaderCheck(scan_file(q)[2], "the index 'x.json'", "delete 'x.json'")
    with pytest.raises(NpyFormatError, match=r"a.npy.*index 'x.json'.*<i8.*<f8.*delete 'x.json'"):
        read_files([(path, identity, offset, other)], memoryview(bytearray(64 - skip)), 64 - skip)


def test_read_files_finishes_short_reads(tmp_path, monkeypatch):
    """``preadv`` may return fewer bytes than asked, even inside the header: the rest is read, checked alike."""
    arrays = [np.arange(64, dtype="<i2") * (i + 1) for i in range(4)]
    items = []
    for i, a in enumerate(arrays):
        p = str(tmp_path / f"{i}.npy")
        np.save(p, a)
        items.append(_item(p))
    real = os.preadv
    cut = iter([5, 100, 130, 200] * 10)

    def short(fd, bufs, offset):
        room = sum(len(b) for b in bufs)
        n = min(room, next(cut))
        data = os.pread(fd, n, offset)
        at = 0
        for b in bufs:
            take = min(len(b), len(data) - at)
            memoryview(b).cast("B")[:take] = data[at : at + take]
            at += take
        return len(data)

    monkeypatch.setattr(os, "preadv", short)
    out = np.empty((4, 64), "<i2")
    read_files(items, memoryview(out.reshape(-1).view(np.uint8)), 128)
    monkeypatch.setattr(os, "preadv", real)
    np.testing.assert_array_equal(out, np.stack(arrays))


@pytest.mark.parametrize("fast_file", [1.0, 0.0], ids=["page-cache speed: one loop at a time", "slow: all at once"])
def test_read_files_from_many_threads(tmp_path, monkeypatch, fast_file):
    """Loops serialise while files come fast, and run side by side once they come slowly: same bytes."""
    monkeypatch.setattr(_batch, "FAST_FILE", fast_file)
    monkeypatch.setattr(_batch, "_fast", True)  # (restored after the test, whatever the loops measure)
    items = []
    for i in range(40):
        p = str(tmp_path / f"{i}.npy")
        np.save(p, np.full((8, 8), i, "<i4"))
        items.append(_item(p))
    outs = [np.empty((40, 8, 8), "<i4") for _ in range(6)]
    errors = []

    def work(out):
        try:
            for _ in range(10):
                read_files(items, memoryview(out.reshape(-1).view(np.uint8)), 256)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(out,)) for out in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for out in outs:
        np.testing.assert_array_equal(out, np.arange(40, dtype="<i4")[:, None, None] * np.ones((8, 8), "<i4"))
    assert _batch._fast is (fast_file > 0)
    assert not _batch._SERIAL.locked()


def test_read_files_refuses_a_changed_file(tmp_path):
    p = str(tmp_path / "a.npy")
    np.save(p, np.zeros(8, "<f8"))
    identity, header, _, _ = scan_file(p)
    stale = FileIdentity(identity.size, identity.mtime_ns - 1, identity.ino)
    with pytest.raises(FileChangedError, match="a.npy"):
        read_files([(p, stale, header.data_offset, None)], memoryview(bytearray(64)), 64)


def test_read_files_refuses_a_short_file(tmp_path):
    p = str(tmp_path / "a.npy")
    np.save(p, np.zeros(8, "<f8"))
    identity, header, _, _ = scan_file(p)
    # the identity matches, but the payload asked for runs past the end (as after a truncation race)
    with pytest.raises(FileChangedError, match="truncated"):
        read_files([(p, identity, header.data_offset + 8, None)], memoryview(bytearray(64)), 64)
