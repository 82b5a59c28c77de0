"""Per-block checksums with CRC32C and with zlib's CRC-32, and their verification."""

from __future__ import annotations

import importlib.util
import zlib

import pytest

from npydask.cache.checksum import BLOCK_SIZE, ChecksumRecord, checksums, preferred_algorithm, verify

HAVE_CRC32C = importlib.util.find_spec("google_crc32c") is not None
ALGORITHMS = [
    "crc32",
    pytest.param("crc32c", marks=pytest.mark.skipif(not HAVE_CRC32C, reason="CRC32C needs google-crc32c")),
]

DATA = bytes(range(256)) * (BLOCK_SIZE // 256 * 2 + 3)  # two full blocks and a short one


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_blocks_of_at_most_1_mib_each_with_its_checksum(algorithm):
    rec = checksums(DATA, algorithm=algorithm)
    if algorithm == "crc32":
        fn = zlib.crc32
    else:
        import google_crc32c

        fn = google_crc32c.value
    blocks = [DATA[k : k + BLOCK_SIZE] for k in range(0, len(DATA), BLOCK_SIZE)]
    assert len(blocks) == 3 and len(blocks[-1]) == 768
    assert rec == ChecksumRecord(algorithm, BLOCK_SIZE, len(DATA), tuple(fn(b) for b in blocks))
    assert verify(DATA, rec) and verify(memoryview(bytearray(DATA)), rec)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_any_change_fails_verification(algorithm):
    rec = checksums(DATA, algorithm=algorithm)
    for k in (0, BLOCK_SIZE - 1, BLOCK_SIZE, len(DATA) - 1):
        bad = bytearray(DATA)
        bad[k] ^= 0x10
        assert not verify(bad, rec)
    assert not verify(DATA[:-1], rec)
    assert not verify(DATA + b"\x00", rec)
    other = "crc32c" if algorithm == "crc32" else "crc32"
    assert not verify(DATA, ChecksumRecord(other, rec.block_size, rec.length, rec.sums))
    assert not verify(DATA, ChecksumRecord("md5", rec.block_size, rec.length, rec.sums))
    assert not verify(DATA, ChecksumRecord(algorithm, 0, rec.length, rec.sums))


def test_the_preferred_algorithm_is_crc32c_where_installed_and_bad_arguments_are_refused():
    expected = "crc32c" if HAVE_CRC32C else "crc32"
    assert preferred_algorithm() == expected
    assert checksums(b"abc").algorithm == expected
    if not HAVE_CRC32C:  # a record made elsewhere with CRC32C is a miss here, not an error
        assert not verify(b"abc", ChecksumRecord("crc32c", BLOCK_SIZE, 3, (0,)))
    with pytest.raises(ValueError, match="unknown checksum algorithm 'md5'"):
        checksums(b"abc", algorithm="md5")
    with pytest.raises(ValueError, match="block_size"):
        checksums(b"abc", block_size=BLOCK_SIZE + 1)
