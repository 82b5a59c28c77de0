"""The file of one cached extent: a header of what it holds and its checksums, then the bytes.

Rules:

- One file holds one extent of one entry: the bytes ``[offset, offset + length)`` of one object
  version. Its layout, all integers little-endian::

      magic     8 bytes   b"NPDXEXT\\x00"
      version   u16       FORMAT_VERSION
      algorithm u8        1 = CRC32C, 2 = CRC-32 (zlib)
      reserved  u8        0
      block     u32       bytes per checksummed block, at most 1 MiB
      key hash  32 bytes  SHA-256 of the entry key (its entry_name)
      etag hash 32 bytes  SHA-256 of the strong ETag
      size      u64       the object's size
      offset    u64       the extent's first byte in the object
      length    u64       the extent's bytes
      blocks    u32       the number of block checksums that follow
      sums      u32 * blocks
      header    u32       CRC-32 of every header byte before it
      payload   length bytes

- The file is exactly the header plus ``length`` bytes; anything else is damage.
- :func:`write_extent` publishes atomically: it writes a temporary file in the same folder
  (through the folder's descriptor, a name that never equals a published one), ``fsync``\\ s it
  and renames it over the final name, then ``fsync``\\ s the folder. A reader sees the old file,
  the new one or none, never a part.
- :func:`read_extent` returns the extent's bytes or ``None``: a missing file, a short or long
  one, a bad magic or version, a torn header, another key, ETag, size, offset or length, and any
  block whose checksum differs are all a miss, never an error and never other bytes.

>>> import os, tempfile
>>> from npydask.cache.keys import EntryKey
>>> key = EntryKey.of("s3://b", "x.npy", "", 100, '"v1"')
>>> with tempfile.TemporaryDirectory() as d:
...     fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
...     write_extent(fd, "e0", key, 10, b"hello")
...     got = read_extent(fd, "e0", key, 10, 5), read_extent(fd, "e0", key, 11, 5)
...     os.close(fd)
>>> got
(b'hello', None)
"""

from __future__ import annotations

import os
import secrets
import stat
import struct
import zlib

import numpy as np

from .checksum import BLOCK_SIZE, ChecksumRecord, checksum_function, checksums, verify
from .keys import EntryKey

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "header_size",
    "read_extent",
    "read_extent_part",
    "read_open_extent",
    "write_extent",
]

MAGIC = b"NPDXEXT\x00"
FORMAT_VERSION = 1
_ALGORITHM_CODES = {"crc32c": 1, "crc32": 2}
_ALGORITHM_NAMES = {v: k for k, v in _ALGORITHM_CODES.items()}
_FIXED = struct.Struct("<8sHBBI32s32sQQQI")
_TEMP_PREFIX = ".tmp-"
_CHECKS = {code: fn for code, name in _ALGORITHM_NAMES.items() if (fn := checksum_function(name)) is not None}
_ONE_READ = 64 << 20  # (extents up to this size are read with one pread; larger ones after an fstat)


def header_size(length: int, block_size: int = BLOCK_SIZE) -> int:
    """The bytes of the header of an extent of ``length`` bytes.

    Examples
    --------
    >>> header_size(0), header_size(1), header_size(3 << 20)
    (112, 116, 124)
    """
    return _FIXED.size + 4 * (-(-length // block_size)) + 4


def _check_name(name: str) -> None:
    if not name or "/" in name or "\x00" in name or name.startswith(".") or name in ("..",):
        raise ValueError(f"an extent file name must be a plain name not starting with '.', not {name!r}")


def _encode(key: EntryKey, offset: int, record: ChecksumRecord) -> bytes:
    fixed = _FIXED.pack(
        MAGIC,
        FORMAT_VERSION,
        _ALGORITHM_CODES[record.algorithm],
        0,
        record.block_size,
        bytes.fromhex(key.entry_name()),
        key.etag_digest(),
        key.size,
        offset,
        record.length,
        len(record.sums),
    )
    head = fixed + struct.pack(f"<{len(record.sums)}I", *record.sums)
    return head + struct.pack("<I", zlib.crc32(head))


def write_extent(
    dir_fd: int,
    name: str,
    key: EntryKey,
    offset: int,
    data: bytes | bytearray | memoryview,
    *,
    algorithm: str | None = None,
) -> None:
    """Publish the bytes ``data`` at ``offset`` of ``key``'s object as the file ``name``, atomically.

    Parameters
    ----------
    dir_fd : int
        An open descriptor of the cache folder; ``name`` is relative to it.
    name : str
        The file name: plain, not starting with ``.`` (names starting with ``.`` are temporaries).
    key : EntryKey
        The object version the bytes are of.
    offset : int
        The extent's first byte in the object.
    data : bytes-like
        The extent's bytes, ending at most at the object's size.
    algorithm : {"crc32c", "crc32"}, optional
        The checksum algorithm; default the preferred one.

    Raises
    ------
    ValueError
        For a bad name or an extent outside the object.
    OSError
        Where the folder cannot be written (disk full, read-only...); no temporary is left behind.

    Examples
    --------
    >>> import tempfile
    >>> key = EntryKey.of("s3://b", "x.npy", "", 4, '"v1"')
    >>> with tempfile.TemporaryDirectory() as d:
    ...     fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    ...     write_extent(fd, "e", key, 0, b"abcd", algorithm="crc32")
    ...     names = os.listdir(d); os.close(fd)
    >>> names
    ['e']
    """
    _check_name(name)
    view = memoryview(data).cast("B")
    if offset < 0 or offset + len(view) > key.size:
        raise ValueError(f"the extent [{offset}, {offset + len(view)}) lies outside the object of {key.size} bytes")
    record = checksums(view, algorithm=algorithm)
    head = _encode(key, offset, record)
    temp = f"{_TEMP_PREFIX}{name}-{os.getpid()}-{secrets.token_hex(6)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        try:
            for chunk in (memoryview(head), view):
                while chunk:
                    chunk = chunk[os.write(fd, chunk) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.fsync(dir_fd)


def _fixed(buf: bytes | bytearray, key: EntryKey, offset: int, length: int) -> tuple[int, int, int] | None:
    """``(algorithm code, block size, blocks)`` of a header's fixed part when it is whole and names this extent."""
    if len(buf) < _FIXED.size:
        return None
    (magic, version, algo, reserved, block, key_hash, etag_hash, size, off, n, blocks) = _FIXED.unpack_from(buf)
    if (
        magic != MAGIC
        or version != FORMAT_VERSION
        or algo not in _ALGORITHM_NAMES
        or reserved != 0
        or not (0 < block <= BLOCK_SIZE)
        or n != length
        or blocks != -(-n // block)
        or off != offset
        or size != key.size
        or key_hash != key.entry_digest()
        or etag_hash != key.etag_digest()
    ):
        return None
    return algo, block, blocks


def read_extent(dir_fd: int, name: str, key: EntryKey, offset: int, length: int) -> bytes | None:
    """The bytes of the extent file ``name``, or ``None`` if it is missing, damaged or of another extent.

    Parameters
    ----------
    dir_fd : int
        An open descriptor of the cache folder.
    name : str
        The file name.
    key : EntryKey
        The object version asked for; a file of another key or ETag is a miss.
    offset, length : int
        The extent asked for; a file of another extent is a miss.

    Returns
    -------
    bytes or None
        Exactly ``length`` bytes that passed every check, or ``None``. Never raises for damage or
        for a file that cannot be read.

    Examples
    --------
    >>> import tempfile
    >>> key = EntryKey.of("s3://b", "x.npy", "", 4, '"v1"')
    >>> with tempfile.TemporaryDirectory() as d:
    ...     fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    ...     missing = read_extent(fd, "nothing", key, 0, 4); os.close(fd)
    >>> missing is None
    True
    """
    try:
        _check_name(name)
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except (OSError, ValueError):
        return None
    try:
        found = read_open_extent(fd, key, offset, length)
    finally:
        os.close(fd)
    return None if found is None else bytes(found)


def read_open_extent(fd: int, key: EntryKey, offset: int, length: int) -> memoryview | None:
    """:func:`read_extent` of an extent file the caller opened (and closes): a view of its bytes, or ``None``."""
    if length < 0:
        return None
    expect = header_size(length) + length
    try:
        # (one read of the size a file of this extent has, one byte more to see a longer one)
        blob: bytes | None = os.pread(fd, expect + 1, 0) if expect <= _ONE_READ else b""
        if blob is None or len(blob) != expect:
            st = os.fstat(fd)
            # no larger than the header of the smallest blocks allows: a damaged size is not read into memory
            if not stat.S_ISREG(st.st_mode) or st.st_size > header_size(length, 1) + length:
                return None
            blob = _read_at(fd, st.st_size, 0)
    except OSError:
        return None
    if blob is None or (fixed := _fixed(blob, key, offset, length)) is None:
        return None
    algo, block, blocks = fixed
    n = length
    end = _FIXED.size + 4 * blocks
    if len(blob) != end + 4 + n or struct.unpack_from("<I", blob, end)[0] != zlib.crc32(blob[:end]):
        return None
    check = _CHECKS.get(algo)
    if check is None:
        return None
    start = end + 4
    if blocks == 1:  # (the common case, without a loop; google-crc32c takes bytes, not views)
        payload = blob[start:]
        if check(payload) & 0xFFFFFFFF != struct.unpack_from("<I", blob, _FIXED.size)[0]:
            return None
        return memoryview(payload)
    sums = struct.unpack_from(f"<{blocks}I", blob, _FIXED.size)
    for i, expected in enumerate(sums):
        if check(blob[start + i * block : start + min((i + 1) * block, n)]) & 0xFFFFFFFF != expected:
            return None
    return memoryview(blob)[start:]


def read_extent_into(fd: int, key: EntryKey, offset: int, out: memoryview) -> bool:
    """Read the extent file ``fd`` (opened by the caller) of ``[offset, offset + len(out))`` into ``out``.

    One ``preadv`` puts the header in a small buffer and the bytes straight into ``out``, whose
    blocks are then checked in place. Returns whether all was valid: ``False`` for the damage
    :func:`read_extent` reports (``out`` then holds unspecified bytes). Never raises for damage.
    """
    length = len(out)
    head = bytearray(header_size(length))
    extra = bytearray(1)  # (a byte past the end: a longer file is damage too)
    try:
        got = os.preadv(fd, [head, out, extra], 0)
    except OSError:
        return False
    if got != len(head) + length:
        return False
    fixed = _fixed(head, key, offset, length)
    if fixed is None:
        return False
    algo, block, blocks = fixed
    end = _FIXED.size + 4 * blocks
    if end + 4 != len(head):
        return False
    check = _CHECKS.get(algo)
    if check is None or struct.unpack_from("<I", head, end)[0] != zlib.crc32(memoryview(head)[:end]):
        return False
    data = np.frombuffer(out, np.uint8)  # (google-crc32c reads arrays, not writable views)
    sums = struct.unpack_from(f"<{blocks}I", head, _FIXED.size)
    return all(check(data[i * block : (i + 1) * block]) & 0xFFFFFFFF == s for i, s in enumerate(sums))


def read_extent_part(dir_fd: int, name: str, key: EntryKey, offset: int, length: int, lo: int, hi: int) -> bytes | None:
    """Bytes ``[lo, hi)`` of the object from the extent file ``name`` (``[offset, offset + length)``), or ``None``.

    Reads the header and only the blocks covering ``[lo, hi)``, verifying those blocks'
    checksums; ``None`` on the same damage :func:`read_extent` reports (a damaged block outside
    ``[lo, hi)`` is found by the read that needs it).

    Examples
    --------
    >>> import tempfile
    >>> key = EntryKey.of("s3://b", "x.npy", "", 100, '"v1"')
    >>> with tempfile.TemporaryDirectory() as d:
    ...     fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    ...     write_extent(fd, "e0", key, 10, b"hello world")
    ...     got = read_extent_part(fd, "e0", key, 10, 11, 16, 21); os.close(fd)
    >>> got
    b'world'
    """
    if not (offset <= lo <= hi <= offset + length):
        return None
    try:
        _check_name(name)
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except (OSError, ValueError):
        return None
    try:
        return _read_part(fd, key, offset, length, lo, hi)
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)


def _read_part(fd: int, key: EntryKey, offset: int, length: int, lo: int, hi: int) -> bytes | None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size < _FIXED.size:
        return None
    fixed = os.pread(fd, _FIXED.size, 0)
    found = _fixed(fixed, key, offset, length)
    if found is None:
        return None
    algo, block, blocks = found
    n = length
    end = _FIXED.size + 4 * blocks
    if st.st_size != end + 4 + n:
        return None
    rest = _read_at(fd, end + 4 - _FIXED.size, _FIXED.size)
    if rest is None:
        return None
    head = fixed + rest[:-4]
    if struct.unpack("<I", rest[-4:])[0] != zlib.crc32(head):
        return None
    if hi == lo:
        return b""
    first, last = (lo - offset) // block, (hi - offset - 1) // block
    start = first * block
    payload = _read_at(fd, min(n, (last + 1) * block) - start, end + 4 + start)
    if payload is None:
        return None
    sums = struct.unpack_from(f"<{last - first + 1}I", head, _FIXED.size + 4 * first)
    record = ChecksumRecord(_ALGORITHM_NAMES[algo], block, len(payload), sums)
    if not verify(payload, record):
        return None
    return payload[lo - offset - start : hi - offset - start]


def _read_at(fd: int, n: int, at: int) -> bytes | None:
    parts = []
    got = 0
    while got < n:
        part = os.pread(fd, n - got, at + got)
        if not part:
            return None
        parts.append(part)
        got += len(part)
    return b"".join(parts)
