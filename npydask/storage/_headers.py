"""Reading a checked header through any ``read(offset, n)``: local descriptors and object stores alike.

One implementation of the order numpy reads a file in: the first few KiB,
more only for a long header, the preamble and header parsed strictly
(:func:`npydask.format.header.parse_header`), then the payload's presence checked
against the file's size. An ``.npz`` member is found through the archive's
central directory (:func:`npydask.format.npz.locate`) and its header read from the
member's bytes (inflated for a deflated member). The source of bytes is a
:data:`npydask.format.npz.Read` callable, so local files (one ``pread`` per call)
and object stores (one range request per call) share it.
"""

from __future__ import annotations

import dataclasses
import zipfile
from collections.abc import Sequence

from npydask.errors import NpyFormatError
from npydask.format.header import MAX_HEADER_BYTES, MAX_PREAMBLE, NpyHeader, header_end, parse_header
from npydask.format.npz import Member, Read, find, inflate, locate, locate_all, without_key

__all__ = [
    "FIRST_READ",
    "member_header",
    "member_header_in",
    "member_headers",
    "npy_header",
    "read_upto",
    "truncated",
]

FIRST_READ = 4096
"""Bytes read first for a header (numpy's own headers are at most a few hundred bytes)."""


def read_upto(read: Read, length: int, offset: int) -> bytes:
    """Up to ``length`` bytes at ``offset``: fewer only at the end of the file (short reads looped)."""
    chunks = []
    while length > 0:
        chunk = read(offset, length)
        if not chunk:
            break
        chunks.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def npy_header(
    read: Read, size: int, path: str, member: Member | None = None, first_read: int = FIRST_READ
) -> tuple[NpyHeader, bytes]:
    """Header and raw header bytes of a file of ``size`` bytes, or of a member's bytes (offsets relative to it).

    Raises
    ------
    NpyFormatError
        A malformed header, an ``.npz`` archive read without a key (naming
        its members), or a payload shorter than the header promises.
    """

    def get(length: int, offset: int) -> bytes:
        if member is None:
            return read_upto(read, length, offset)
        if member.stored:
            return read_upto(read, min(length, max(size - offset, 0)), member.data_start + offset)
        return inflate(read, member, min(offset + length, size), path)[offset:]

    first = get(min(max(size, MAX_PREAMBLE), first_read), 0)
    need = header_end(first)
    if need > len(first) and size > len(first):
        # (parse_header refuses a length over the cap: read no further than it)
        first += get(min(need, size, MAX_PREAMBLE + MAX_HEADER_BYTES) - len(first), len(first))
    if member is not None:
        path = f"{path} (member {member.name!r})"
    elif first[:4] == b"PK\x03\x04":  # an .npz read without key: name its members
        raise without_key(read, size, path)
    header = parse_header(first, source=path)
    if size < header.data_offset + header.nbytes:
        raise truncated(path, header, size)
    return header, first[: header.data_offset]


def truncated(path: str, header: NpyHeader, size: int) -> NpyFormatError:
    """The error for a file of ``size`` bytes that ends before the payload ``header`` promises."""
    return NpyFormatError(
        f"{path}: truncated .npy file: expected {header.nbytes} bytes of payload after offset "
        f"{header.data_offset} (shape {header.shape}, dtype {header.dtype.str}), "
        f"found {max(size - header.data_offset, 0)}; the file is incomplete or still being written"
    )


def member_header(read: Read, size: int, path: str, key: str) -> tuple[NpyHeader, bytes, Member]:
    """Header of ``.npz`` member ``key`` of the archive of ``size`` bytes that ``read`` reads.

    ``data_offset`` is absolute in the zip file when the member is stored,
    relative to the inflated member when deflated.
    """
    return _header_of(read, path, locate(read, size, path, key))


def member_headers(read: Read, size: int, path: str, keys: Sequence[str]) -> list[tuple[NpyHeader, bytes, Member]]:
    """:func:`member_header` of each of ``keys``, the archive's central directory read once for all."""
    return [_header_of(read, path, member) for member in locate_all(read, size, path, keys)]


def member_header_in(read: Read, zf: zipfile.ZipFile, path: str, key: str) -> tuple[NpyHeader, bytes, Member]:
    """:func:`member_header` of an archive whose central directory ``zf`` was read already.

    (By :func:`npydask.format.npz.directory`.)
    """
    return _header_of(read, path, find(read, path, zf, key))


def _header_of(read: Read, path: str, member: Member) -> tuple[NpyHeader, bytes, Member]:
    header, raw = npy_header(read, member.file_size, path, member)
    member = dataclasses.replace(member, header_bytes=raw)  # (where a whole read's CRC-32 starts)
    if member.stored:
        header = header.with_offset(member.data_start)
    return header, raw, member
