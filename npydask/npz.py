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
"""

from __future__ import annotations

import errno
import io
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass

from npydask.errors import FileChangedError, NpyFormatError

__all__ = ["Member", "inflate", "locate", "without_key"]

_LOCAL_HEADER = struct.Struct("<4s5H3I2H")
_LOCAL_MAGIC = b"PK\x03\x04"
_INFLATE_PIECE = 1 << 20
_SHOWN_MEMBERS = 10


@dataclass(frozen=True)
class Member:
    """One archive member: its name, where its bytes start, and how they are stored."""

    name: str
    data_start: int
    compress_type: int
    compress_size: int
    file_size: int

    @property
    def stored(self) -> bool:
        """Whether the member is uncompressed (readable in place)."""
        return self.compress_type == zipfile.ZIP_STORED


def _members(zf: zipfile.ZipFile) -> list[str]:
    return sorted(n[:-4] if n.endswith(".npy") else n for n in zf.namelist())


def locate(f: io.FileIO, path: str, key: str) -> Member:
    """Find member ``key`` of the archive open as ``f``.

    Raises
    ------
    KeyError
        The archive has no such member (the message lists the members).
    NpyFormatError
        ``f`` is not a zip archive, or the member is encrypted or compressed
        other than stored/deflated.
    """
    try:
        zf = zipfile.ZipFile(f)  # reads the central directory only; does not close f
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as e:
        raise NpyFormatError(
            f"{path}: key={key!r} was given, so a .npz (zip) archive was expected, found something else ({e})"
        ) from e
    names = zf.namelist()
    name = key if key in names else f"{key}.npy" if f"{key}.npy" in names else None
    if name is None:
        raise KeyError(f"{path}: no member {key!r} in the archive; its members are {_members(zf)}")
    info = zf.getinfo(name)
    if info.flag_bits & 0x1:
        raise NpyFormatError(f"{path}: member {name!r} is encrypted; npydask reads only unencrypted .npz members")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise NpyFormatError(
            f"{path}: member {name!r} uses zip compression method {info.compress_type}; expected stored (0) or "
            "deflated (8), as numpy.savez and numpy.savez_compressed write"
        )
    local = os.pread(f.fileno(), _LOCAL_HEADER.size, info.header_offset)
    if len(local) < _LOCAL_HEADER.size or local[:4] != _LOCAL_MAGIC:
        raise NpyFormatError(f"{path}: member {name!r}: expected a zip local header at byte {info.header_offset}")
    fields = _LOCAL_HEADER.unpack(local)
    start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
    return Member(name, start, info.compress_type, info.compress_size, info.file_size)


def without_key(fd: int, path: str) -> NpyFormatError:
    """The error for an archive (open as ``fd``) read as an ``.npy`` file: its members and the key to pass.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "pair.npz"); np.savez(p, x=np.zeros(2), y=np.ones(3))
    >>> fd = os.open(p, os.O_RDONLY)
    >>> print(str(without_key(fd, p)).replace(p, "pair.npz"))
    pair.npz: an .npz (zip) archive, not an .npy file: it holds 2 members ['x', 'y']; pass key='x' (or another member) to read one
    >>> os.close(fd)
    """
    try:
        with zipfile.ZipFile(io.FileIO(fd, closefd=False)) as zf:  # the central directory only
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


def inflate(fd: int, member: Member, upto: int, path: str) -> bytes:
    """The first ``upto`` bytes of a deflated member, decompressing no further than needed."""
    d = zlib.decompressobj(-zlib.MAX_WBITS)
    out = bytearray()
    pos, end = member.data_start, member.data_start + member.compress_size
    try:
        while len(out) < upto and pos < end:
            piece = os.pread(fd, min(_INFLATE_PIECE, end - pos), pos)
            if not piece:
                break
            pos += len(piece)
            out += d.decompress(piece, upto - len(out))
            while d.unconsumed_tail and len(out) < upto:
                out += d.decompress(d.unconsumed_tail, upto - len(out))
    except zlib.error as e:
        raise NpyFormatError(f"{path}: member {member.name!r} is not valid deflate data ({e})") from e
    if len(out) < upto:
        raise FileChangedError(
            errno.EIO,
            f"member {member.name!r} inflated to {len(out)} bytes, expected at least {upto}: the archive is "
            "truncated or changed after opening",
            path,
        )
    return bytes(out)
