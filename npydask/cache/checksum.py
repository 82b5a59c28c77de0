"""Per-block checksums over the bytes of one cached extent.

Rules:

- The bytes are cut into blocks of at most :data:`BLOCK_SIZE` (1 MiB) from the extent's first
  byte; each block has its own checksum, so damage is found without trusting any other block.
- The algorithm is CRC32C (``"crc32c"``) where ``google_crc32c`` can be imported, else zlib's
  CRC-32 (``"crc32"``); the name is recorded with the checksums (:class:`ChecksumRecord`), so a
  record is verified with the algorithm that made it.
- :func:`verify` answers ``False`` for anything that does not match: another length, another
  block size, a changed byte, or an algorithm that is not available here. It never raises for
  damage.

>>> rec = checksums(b"abc" * 1000, algorithm="crc32")
>>> verify(b"abc" * 1000, rec), verify(b"abd" * 1000, rec)
(True, False)
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALGORITHMS",
    "BLOCK_SIZE",
    "ChecksumRecord",
    "checksum_function",
    "checksums",
    "preferred_algorithm",
    "verify",
]

BLOCK_SIZE = 1 << 20
ALGORITHMS: tuple[str, ...] = ("crc32c", "crc32")


def _crc32c() -> Callable[[bytes], int] | None:
    try:
        import google_crc32c
    except ImportError:
        return None
    return google_crc32c.value  # type: ignore[no-any-return]


def _function(algorithm: str) -> Callable[[bytes], int] | None:
    if algorithm == "crc32":
        return zlib.crc32
    if algorithm == "crc32c":
        return _crc32c()
    raise ValueError(f"unknown checksum algorithm {algorithm!r}: expected one of {', '.join(ALGORITHMS)}")


def checksum_function(algorithm: str) -> Callable[[Any], int] | None:
    """The function computing ``algorithm``'s checksum of a bytes-like value, or ``None`` where it is missing here.

    Examples
    --------
    >>> checksum_function("crc32")(b"a") == zlib.crc32(b"a")
    True
    """
    return _function(algorithm)


def preferred_algorithm() -> str:
    """``"crc32c"`` where ``google_crc32c`` can be imported, else ``"crc32"``.

    Examples
    --------
    >>> preferred_algorithm() in ALGORITHMS
    True
    """
    return "crc32c" if _crc32c() is not None else "crc32"


@dataclass(frozen=True)
class ChecksumRecord:
    """The checksums of an extent's bytes, block by block.

    Attributes
    ----------
    algorithm : str
        ``"crc32c"`` or ``"crc32"``.
    block_size : int
        Bytes per block (the last block may be shorter).
    length : int
        Bytes covered.
    sums : tuple of int
        One unsigned 32-bit checksum per block, ``ceil(length / block_size)`` of them.

    Examples
    --------
    >>> checksums(b"x" * 10, algorithm="crc32", block_size=4).sums == tuple(
    ...     zlib.crc32(b"x" * n) for n in (4, 4, 2))
    True
    """

    algorithm: str
    block_size: int
    length: int
    sums: tuple[int, ...]


def checksums(
    data: bytes | bytearray | memoryview, *, algorithm: str | None = None, block_size: int = BLOCK_SIZE
) -> ChecksumRecord:
    """The per-block checksums of ``data``.

    Parameters
    ----------
    data : bytes-like
        The extent's bytes.
    algorithm : {"crc32c", "crc32"}, optional
        Default: :func:`preferred_algorithm`. ``"crc32c"`` needs ``google-crc32c``.
    block_size : int
        Bytes per block, between 1 and :data:`BLOCK_SIZE`.

    Returns
    -------
    ChecksumRecord

    Raises
    ------
    ValueError
        For an unknown algorithm or a block size out of range.
    ImportError
        For ``"crc32c"`` without ``google-crc32c``.

    Examples
    --------
    >>> checksums(b"", algorithm="crc32").sums
    ()
    """
    if not (0 < block_size <= BLOCK_SIZE):
        raise ValueError(f"block_size must be between 1 and {BLOCK_SIZE}, not {block_size}")
    algorithm = preferred_algorithm() if algorithm is None else algorithm
    fn = _function(algorithm)
    if fn is None:
        raise ImportError("checksum algorithm 'crc32c' needs google-crc32c: pip install google-crc32c")
    view = memoryview(data).cast("B")
    sums = tuple(fn(bytes(view[k : k + block_size])) & 0xFFFFFFFF for k in range(0, len(view), block_size))
    return ChecksumRecord(algorithm, block_size, len(view), sums)


def verify(data: bytes | bytearray | memoryview, record: ChecksumRecord) -> bool:
    """Whether ``data`` has exactly the checksums ``record`` holds.

    ``False`` for another length or block count, any mismatching block, an unknown algorithm or
    one not available here; never raises for damage.

    Examples
    --------
    >>> rec = checksums(b"abcdef", algorithm="crc32", block_size=4)
    >>> verify(b"abcdef", rec), verify(b"abcde", rec), verify(b"abcdeX", rec)
    (True, False, False)
    """
    view = memoryview(data).cast("B")
    bs = record.block_size
    if record.length != len(view) or not (0 < bs <= BLOCK_SIZE) or len(record.sums) != -(-len(view) // bs):
        return False
    try:
        fn = _function(record.algorithm)
    except ValueError:
        return False
    if fn is None:
        return False
    return all(fn(bytes(view[i * bs : (i + 1) * bs])) & 0xFFFFFFFF == s for i, s in enumerate(record.sums))
