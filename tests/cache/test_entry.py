"""Extent files: a round trip, every damage a miss (never other bytes), atomic publication."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from npydask.cache.checksum import BLOCK_SIZE
from npydask.cache.entry import header_size, read_extent, write_extent
from npydask.cache.keys import EntryKey

KEY = EntryKey.of("s3://bucket", "x.npy", "versionId=1", 4 << 20, '"v1"')
RNG = np.random.default_rng(7)
DATA = RNG.integers(0, 256, size=2 * BLOCK_SIZE + 5000, dtype=np.uint8).tobytes()
OFFSET = 12345


@pytest.fixture
def folder(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd, tmp_path
    os.close(fd)


@pytest.mark.parametrize("algorithm", ["crc32", None])
def test_round_trip(folder, algorithm):
    fd, path = folder
    write_extent(fd, "e", KEY, OFFSET, DATA, algorithm=algorithm)
    assert read_extent(fd, "e", KEY, OFFSET, len(DATA)) == DATA
    assert os.path.getsize(path / "e") == header_size(len(DATA)) + len(DATA)
    assert os.listdir(path) == ["e"]
    write_extent(fd, "empty", KEY, 0, b"")
    assert read_extent(fd, "empty", KEY, 0, 0) == b""


def test_a_byte_flipped_anywhere_is_a_miss(folder):
    fd, path = folder
    write_extent(fd, "e", KEY, OFFSET, DATA)
    good = (path / "e").read_bytes()
    head = header_size(len(DATA))
    positions = sorted(set(range(head)) | set(range(head, len(good), 4096)) | {len(good) - 1})
    f = os.open(path / "e", os.O_RDWR)
    try:
        for k in positions:  # flip one byte in place, read, flip it back
            os.pwrite(f, bytes([good[k] ^ 0x01]), k)
            assert read_extent(fd, "e", KEY, OFFSET, len(DATA)) is None, k
            os.pwrite(f, good[k : k + 1], k)
    finally:
        os.close(f)
    assert read_extent(fd, "e", KEY, OFFSET, len(DATA)) == DATA


def test_a_truncated_or_extended_file_is_a_miss(folder):
    fd, path = folder
    write_extent(fd, "e", KEY, OFFSET, DATA)
    good = (path / "e").read_bytes()
    head = header_size(len(DATA))
    cuts = {0, 1, 7, 8, 50, head - 4, head - 1, head} | {head + b for b in range(0, len(DATA), BLOCK_SIZE)}
    cuts |= {head + b - 1 for b in range(BLOCK_SIZE, len(DATA), BLOCK_SIZE)} | {len(good) - 1}
    for n in sorted(cuts):
        (path / "e").write_bytes(good[:n])
        assert read_extent(fd, "e", KEY, OFFSET, len(DATA)) is None, n
    (path / "e").write_bytes(good + b"\x00")
    assert read_extent(fd, "e", KEY, OFFSET, len(DATA)) is None
    os.truncate(path / "e", 1 << 33)  # a damaged size is refused before reading (sparse, no disk used)
    assert read_extent(fd, "e", KEY, OFFSET, len(DATA)) is None


@pytest.mark.parametrize(
    "other",
    [
        EntryKey.of("s3://bucket", "x.npy", "versionId=1", 4 << 20, '"v2"'),
        EntryKey.of("s3://bucket", "y.npy", "versionId=1", 4 << 20, '"v1"'),
        EntryKey.of("s3://bucket", "x.npy", "versionId=2", 4 << 20, '"v1"'),
        EntryKey.of("s3://bucket", "x.npy", "versionId=1", 5 << 20, '"v1"'),
    ],
)
def test_another_key_or_etag_is_a_miss(folder, other):
    fd, _ = folder
    write_extent(fd, "e", KEY, OFFSET, DATA)
    assert read_extent(fd, "e", other, OFFSET, len(DATA)) is None
    assert read_extent(fd, "e", KEY, OFFSET, len(DATA)) == DATA


def test_another_extent_a_missing_file_or_a_bad_name_is_a_miss(folder):
    fd, path = folder
    write_extent(fd, "e", KEY, OFFSET, DATA)
    assert read_extent(fd, "e", KEY, OFFSET + 1, len(DATA)) is None
    assert read_extent(fd, "e", KEY, OFFSET, len(DATA) - 1) is None
    assert read_extent(fd, "nothing", KEY, OFFSET, len(DATA)) is None
    assert read_extent(fd, "../e", KEY, OFFSET, len(DATA)) is None
    os.mkdir(path / "adir")
    assert read_extent(fd, "adir", KEY, 0, 0) is None
    os.symlink(path / "e", path / "link")
    assert read_extent(fd, "link", KEY, OFFSET, len(DATA)) is None


def test_bad_writes_are_refused_and_leave_no_temporary(folder):
    fd, path = folder
    with pytest.raises(ValueError, match="outside the object"):
        write_extent(fd, "e", KEY, KEY.size - 1, b"ab")
    with pytest.raises(ValueError, match="plain name"):
        write_extent(fd, ".hidden", KEY, 0, b"ab")
    os.mkdir(path / "taken")  # the rename fails: the temporary is removed, the directory untouched
    with pytest.raises(IsADirectoryError):
        write_extent(fd, "taken", KEY, 0, b"ab")
    assert sorted(os.listdir(path)) == ["taken"] and os.listdir(path / "taken") == []


def test_publication_is_atomic_readers_see_a_whole_version_or_none(folder):
    fd, path = folder
    versions = [bytes([v]) * (BLOCK_SIZE + 100) for v in range(4)]
    seen, wrong = set(), []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            got = read_extent(fd, "e", KEY, 0, BLOCK_SIZE + 100)
            if got is not None and got not in versions:
                wrong.append(got[:8])
            seen.add(None if got is None else got[0])

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for k in range(60):
            write_extent(fd, "e", KEY, 0, versions[k % 4], algorithm="crc32")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert wrong == []
    assert len(seen - {None}) >= 2  # the readers did overlap the writes
    assert os.listdir(path) == ["e"]
