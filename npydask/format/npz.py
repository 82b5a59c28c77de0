"""Members of ``.npz`` archives: where a member's ``.npy`` bytes lie in the zip file.

An ``.npz`` file is a zip archive of ``.npy`` files; ``numpy.savez`` stores
them uncompressed, ``numpy.savez_compressed`` deflates them. A *stored*
member is an ``.npy`` file at a fixed offset inside the zip file, so npydask
reads it in place like any ``.npy`` file (headers' ``data_offset`` is then
absolute in the zip file). A *deflated* member has to be decompressed: the
task that reads it inflates the member up to the last byte its region needs.

Keys follow numpy: ``"x"`` names the member ``"x.npy"`` (``"x.npy"`` works
too). A missing key raises ``KeyError`` listing the members. The central
directory is read with :mod:`zipfile` (which never executes anything);
encrypted members and other compression methods are refused.

Integrity: every member carries the CRC-32 of its ``.npy`` bytes (header,
payload and anything after it). A read of a whole member checks it, as
``numpy.load`` does, and raises :class:`~npydask.errors.NpzCrcError` on a
mismatch: a deflated member is inflated to its end and checksummed on the way
(:func:`inflate_into`), a stored one is checksummed over the bytes the read
brought in (:func:`check_stored`). A read of *part* of a stored member
cannot check it (that would mean reading the whole member); :func:`verify`
checks a whole archive once.
"""

from __future__ import annotations

import errno
import io
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from npydask._buffers import raw_copy
from npydask.errors import FileChangedError, NpyFormatError, NpzCrcError

__all__ = [
    "Member",
    "RangeFile",
    "Read",
    "arrays_in",
    "check_stored",
    "directory",
    "find",
    "inflate",
    "inflate_into",
    "locate",
    "locate_all",
    "verify",
    "without_key",
]

Read = Callable[[int, int], bytes]
"""``read(offset, n)``: up to ``n`` bytes of the archive from ``offset`` (fewer only at its end).

Everything here reads the archive through such a callable, so it does not
care where the bytes come from (a local descriptor, an object store).
"""

_LOCAL_HEADER = struct.Struct("<4s5H3I2H")
_LOCAL_MAGIC = b"PK\x03\x04"
_INFLATE_PIECE = 1 << 20
"""Bytes of compressed input read, and of output inflated, per step (what a task holds besides its result)."""
_SHOWN_MEMBERS = 10


@dataclass(frozen=True)
class Member:
    """One archive member: its name, where its bytes start, and how they are stored."""

    name: str
    data_start: int
    compress_type: int
    compress_size: int
    file_size: int
    crc: int = 0
    """The CRC-32 the zip directory records for the member's (uncompressed) bytes."""
    header_bytes: bytes = b""
    """The member's ``.npy`` preamble and header, once read: where a whole read's CRC starts."""

    @property
    def stored(self) -> bool:
        """Whether the member is uncompressed (readable in place)."""
        return self.compress_type == zipfile.ZIP_STORED


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over a :data:`Read` callable of ``size`` bytes (for :mod:`zipfile`).

    Examples
    --------
    >>> data = b"0123456789"
    >>> f = RangeFile(lambda offset, n: data[offset : offset + n], len(data))
    >>> f.seek(-3, os.SEEK_END), f.read(2), f.tell()
    (7, b'78', 9)
    """

    def __init__(self, read: Read, size: int) -> None:
        self._read, self._size, self._pos = read, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, f"seek to {base + offset}, before the start of the archive")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._read(self._pos, len(buffer))
        n = len(data)
        memoryview(buffer).cast("B")[:n] = data
        self._pos += n
        return n


def _members(zf: zipfile.ZipFile) -> list[str]:
    return sorted(n[:-4] if n.endswith(".npy") else n for n in zf.namelist())


def arrays_in(read: Read, size: int, path: str) -> list[str]:
    """The keys of the archive's ``.npy`` members (``"x"`` for ``x.npy``), in archive order.

    These are the arrays ``numpy.load(path).files`` names; other members
    (which ``numpy.load`` would return as raw bytes) are left out.

    Raises
    ------
    NpyFormatError
        The bytes are not a zip archive, or it holds no ``.npy`` member.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "pair.npz"); np.savez(p, y=np.zeros(2), x=np.ones(3))
    >>> data = open(p, "rb").read()
    >>> arrays_in(lambda offset, n: data[offset : offset + n], len(data), p)
    ['y', 'x']
    """
    try:
        with zipfile.ZipFile(RangeFile(read, size)) as zf:  # the central directory only
            names = zf.namelist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as e:
        raise NpyFormatError(f"{path}: expected an .npz (zip) archive of .npy files, found something else ({e})") from e
    arrays = [n[:-4] for n in names if n.endswith(".npy")]
    if not arrays:
        shown = names[:_SHOWN_MEMBERS]
        raise NpyFormatError(
            f"{path}: expected an .npz archive of .npy members (numpy.savez), found {len(names)} members "
            f"{shown}{' ...' if len(names) > _SHOWN_MEMBERS else ''} and no .npy among them"
        )
    return arrays


def locate(read: Read, size: int, path: str, key: str) -> Member:
    """Find member ``key`` of the archive of ``size`` bytes that ``read`` reads (see :data:`Read`).

    Raises
    ------
    KeyError
        The archive has no such member (the message lists the members).
    NpyFormatError
        ``f`` is not a zip archive, or the member is encrypted or compressed
        other than stored/deflated.
    """
    return _locate(read, size, path, [key], repr(key))[0]


def locate_all(read: Read, size: int, path: str, keys: Sequence[str]) -> list[Member]:
    """:func:`locate` of each of ``keys``, reading the central directory once.

    Raises
    ------
    KeyError
        For the first key the archive lacks (the message lists the members).
    NpyFormatError
        As :func:`locate`.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "pair.npz"); np.savez(p, x=np.zeros(2), y=np.ones(3))
    >>> data = open(p, "rb").read()
    >>> [m.name for m in locate_all(lambda offset, n: data[offset : offset + n], len(data), p, ["y", "x"])]
    ['y.npy', 'x.npy']
    """
    return _locate(read, size, path, keys, repr(list(keys)))


def _locate(read: Read, size: int, path: str, keys: Sequence[str], shown: str) -> list[Member]:
    zf = directory(read, size, path, shown)
    return [find(read, path, zf, key) for key in keys]


def directory(read: Read, size: int, path: str, shown: str) -> zipfile.ZipFile:
    """The archive's central directory (read once; ``shown`` is the ``key=`` named in the error).

    Raises
    ------
    NpyFormatError
        The bytes are not a zip archive.
    """
    try:
        return zipfile.ZipFile(RangeFile(read, size))  # reads the central directory only
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as e:
        raise NpyFormatError(
            f"{path}: key={shown} was given, so a .npz (zip) archive was expected, found something else ({e})"
        ) from e


def find(read: Read, path: str, zf: zipfile.ZipFile, key: str) -> Member:
    """Member ``key`` of the archive whose :func:`directory` is ``zf`` (``"x"`` or ``"x.npy"``).

    Raises
    ------
    KeyError
        The archive has no such member (the message lists the members).
    """
    names = zf.namelist()
    name = key if key in names else f"{key}.npy" if f"{key}.npy" in names else None
    if name is None:
        raise KeyError(f"{path}: no member {key!r} in the archive; its members are {_members(zf)}")
    return _member(read, path, zf.getinfo(name))


def _member(read: Read, path: str, info: zipfile.ZipInfo) -> Member:
    """Where ``info``'s bytes start (past its local header), and how they are stored."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise NpyFormatError(f"{path}: member {name!r} is encrypted; npydask reads only unencrypted .npz members")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise NpyFormatError(
            f"{path}: member {name!r} uses zip compression method {info.compress_type}; expected stored (0) or "
            "deflated (8), as numpy.savez and numpy.savez_compressed write"
        )
    local = read(info.header_offset, _LOCAL_HEADER.size)
    if len(local) < _LOCAL_HEADER.size or local[:4] != _LOCAL_MAGIC:
        raise NpyFormatError(f"{path}: member {name!r}: expected a zip local header at byte {info.header_offset}")
    fields = _LOCAL_HEADER.unpack(local)
    start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
    return Member(name, start, info.compress_type, info.compress_size, info.file_size, info.CRC)


def without_key(read: Read, size: int, path: str) -> NpyFormatError:
    """The error for an archive (of ``size`` bytes, read by ``read``) read as an ``.npy`` file: its members and the key.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "pair.npz"); np.savez(p, x=np.zeros(2), y=np.ones(3))
    >>> data = open(p, "rb").read()
    >>> message = str(without_key(lambda offset, n: data[offset : offset + n], len(data), p)).replace(p, "pair.npz")
    >>> print(message)  # doctest: +NORMALIZE_WHITESPACE
    pair.npz: an .npz (zip) archive, not an .npy file: it holds 2 members ['x', 'y'];
    pass key='x' (or another member) to read one
    """
    try:
        with zipfile.ZipFile(RangeFile(read, size)) as zf:  # the central directory only
            names = zf.namelist()
            members = _members(zf)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as e:
        return NpyFormatError(
            f"{path}: starts as a zip archive (an .npz?) but its member list cannot be read ({e}); "
            "expected an .npy file, or an .npz archive with key='member'"
        )
    shown = repr(members) if len(members) <= _SHOWN_MEMBERS else repr(members[:_SHOWN_MEMBERS])[:-1] + ", ...]"
    arrays = sorted(n[:-4] for n in names if n.endswith(".npy"))
    if not arrays:
        return NpyFormatError(
            f"{path}: a zip archive, not an .npy file, and it holds no .npy members ({len(members)} members "
            f"{shown}); npydask reads .npy files and .npz archives of them (numpy.savez)"
        )
    return NpyFormatError(
        f"{path}: an .npz (zip) archive, not an .npy file: it holds {len(members)} members {shown}; "
        f"pass key={arrays[0]!r} (or another member) to read one"
    )


def inflate(read: Read, member: Member, upto: int, path: str) -> bytes:
    """The first ``upto`` bytes of a deflated member, decompressing no further than needed."""
    out = bytearray(upto)
    inflate_into(read, member, path, memoryview(out), 0)
    return bytes(out)


def inflate_into(read: Read, member: Member, path: str, dest: memoryview, start: int, *, verify: bool = False) -> None:
    """Inflate bytes ``[start, start + len(dest))`` of a deflated member (of the archive ``read`` reads) into ``dest``.

    The member is inflated from its beginning in pieces of at most 1 MiB;
    each piece is copied into ``dest`` where it overlaps the wanted range and
    dropped otherwise, so no more than one piece is held besides ``dest``.
    With ``verify``, inflation goes on to the member's end and its CRC-32 is
    checked against the zip directory's (``dest`` is filled either way).

    Raises
    ------
    NpyFormatError
        The compressed bytes are not valid deflate data.
    NpzCrcError
        With ``verify``: the member's bytes do not match its CRC-32, or it
        inflates to another size than the directory records.
    FileChangedError
        The member ends before ``start + len(dest)`` bytes (the archive was
        truncated or changed after opening).
    """
    dest = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
    need = start + len(dest)
    stop = max(member.file_size, need) if verify else need
    d = zlib.decompressobj(-zlib.MAX_WBITS)
    crc, done = 0, 0
    pos, end = member.data_start, member.data_start + member.compress_size
    pending = b""
    try:
        while done < stop:
            if not pending and pos < end:
                pending = read(pos, min(_INFLATE_PIECE, end - pos))
                if not pending:
                    break  # the file ends before the member does
                pos += len(pending)
            piece = d.decompress(pending, min(_INFLATE_PIECE, stop - done))
            pending = d.unconsumed_tail  # (input left over when the output limit was reached)
            if not piece:
                if d.eof or (pos >= end and not pending):
                    break
                continue
            if verify:
                crc = zlib.crc32(piece, crc)
            lo, hi = max(start, done), min(need, done + len(piece))
            if lo < hi:
                dest[lo - start : hi - start] = piece[lo - done : hi - done]
            done += len(piece)
        while verify and done == stop and not d.eof:  # the end-of-stream marker may still be unread
            if not pending and pos < end:
                pending = read(pos, min(_INFLATE_PIECE, end - pos))
                pos = pos + len(pending) if pending else end  # (a shorter file: nothing more to read)
            extra = d.decompress(pending, 1)
            pending = d.unconsumed_tail
            done += len(extra)
            if not (pending or extra) and pos >= end:
                break
    except zlib.error as e:
        raise NpyFormatError(f"{path}: member {member.name!r} is not valid deflate data ({e})") from e
    if done < need and d.eof:  # the stream says it is complete: a corrupt member, not a shorter file
        raise _crc_error(path, member, f"inflate to {done} bytes, not the {member.file_size} its zip directory records")
    if done < need:
        raise FileChangedError(
            errno.EIO,
            f"member {member.name!r} inflated to {done} bytes, expected at least {need}: the archive is "
            "truncated or changed after opening",
            path,
        )
    if verify:
        if done != member.file_size or not d.eof:
            raise _crc_error(path, member, f"inflate to {done}{'' if d.eof else '+'} bytes, "
                             f"not the {member.file_size} its zip directory records")  # fmt: skip
        _check_crc(path, member, crc)


def check_stored(read: Read, member: Member, path: str, payload: np.ndarray, fortran: bool) -> None:
    """Check the CRC-32 of a stored member whose whole payload a read just brought in.

    ``payload`` is the array as read (C order); for a Fortran-ordered member
    the file holds its transpose, checksummed in slabs of about 1 MiB rather
    than copied whole. The member's header bytes come from
    ``member.header_bytes``; bytes after the payload (none in what numpy
    writes) are read from the file.

    Raises
    ------
    NpzCrcError
        The bytes do not match the CRC-32 the zip directory records.
    """
    crc = zlib.crc32(member.header_bytes)
    if payload.nbytes:
        if not fortran or payload.ndim < 2:
            crc = zlib.crc32(payload.reshape(-1).view(np.uint8).data, crc)
        else:
            in_file = payload.T
            step = max(1, _INFLATE_PIECE // max(1, in_file[0].nbytes))
            for i in range(0, len(in_file), step):
                # (raw_copy: every byte, structured padding included; a plain copy leaves it uninitialised)
                crc = zlib.crc32(raw_copy(in_file[i : i + step]).reshape(-1).view(np.uint8).data, crc)
    crc, _ = _file_crc(read, member.data_start + len(member.header_bytes) + payload.nbytes,
                       member.data_start + member.file_size, crc)  # fmt: skip
    _check_crc(path, member, crc)


def _check_crc(path: str, member: Member, crc: int) -> None:
    if crc & 0xFFFFFFFF != member.crc:
        raise _crc_error(path, member, f"gives CRC-32 {crc & 0xFFFFFFFF:#010x}, its zip directory records "
                         f"{member.crc:#010x}")  # fmt: skip


def _crc_error(path: str, member: Member, found: str) -> NpzCrcError:
    return NpzCrcError(
        f"{path}: member {member.name!r} is corrupt: its bytes {found} (numpy.load refuses it too, "
        "'Bad CRC-32'); restore the archive from a good copy or write it again"
    )


def _file_crc(read: Read, pos: int, end: int, crc: int = 0) -> tuple[int, int]:
    """``crc`` carried over the file's bytes ``[pos, end)``, read in pieces; and where the file ended (``end``
    unless it is shorter)."""
    while pos < end:
        piece = read(pos, min(_INFLATE_PIECE, end - pos))
        if not piece:
            break
        crc = zlib.crc32(piece, crc)
        pos += len(piece)
    return crc, pos


def verify(read: Read, size: int, path: str) -> list[str]:
    """Check every member of an ``.npz`` archive against its CRC-32, as ``numpy.load`` would on reading it.

    Reads each member once, in pieces (a deflated one is inflated and
    dropped piece by piece), so memory stays small whatever the archive's
    size. Use it once on an archive whose members will be read in parts: a
    read of part of a stored member cannot check the CRC.

    Parameters
    ----------
    read : Read
        Reads the archive (see :data:`Read`).
    size : int
        The archive's size in bytes.
    path : str
        The archive's name in messages.

    Returns
    -------
    list of str
        The names of the members checked, in the archive's order.

    Raises
    ------
    NpzCrcError
        For the first member whose bytes do not match (the message names the
        archive, the member, the recorded and the computed CRC).
    NpyFormatError
        The file is not a zip archive, or a member is encrypted, compressed
        other than stored/deflated, or not valid deflate data.
    OSError
        A read fails.

    Examples
    --------
    >>> import io, numpy as np
    >>> buf = io.BytesIO(); np.savez_compressed(buf, x=np.arange(3), y=np.ones(2)); data = buf.getvalue()
    >>> verify(lambda offset, n: data[offset : offset + n], len(data), "a.npz")
    ['x.npy', 'y.npy']

    A file on disk: :func:`npydask.storage.local.verify_npz`.
    """
    try:
        infos = zipfile.ZipFile(RangeFile(read, size)).infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as e:
        raise NpyFormatError(f"{path}: expected a .npz (zip) archive, found something else ({e})") from e
    for info in infos:
        member = _member(read, path, info)
        if member.stored:
            crc, stop = _file_crc(read, member.data_start, member.data_start + member.file_size)
            got = stop - member.data_start
            if got != member.file_size:
                raise _crc_error(path, member, f"end after {got} of the {member.file_size} bytes its zip "
                                 "directory records")  # fmt: skip
            _check_crc(path, member, crc)
        else:
            inflate_into(read, member, path, memoryview(b""), 0, verify=True)
    return [info.filename for info in infos]
