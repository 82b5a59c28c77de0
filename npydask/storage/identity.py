"""Which file a path named when it was opened, and the errors for a file that is no longer that one.

A :class:`FileIdentity` (size, mtime, inode) is what a lazily built task
expects to find; an :class:`InodeIdentity` is the lighter one a listing
records (``headers="first"``), checked by inode and status-change time; an
:class:`ObjectIdentity` (size, ETag) is an object's. A :class:`HeaderCheck`
carries the raw header bytes a task relies on.
:func:`differs` compares an identity with a ``stat``; :func:`check_unchanged`
re-checks an open descriptor once its bytes are in; :func:`file_changed` and
:func:`header_mismatch` build the errors.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from typing import Any, NamedTuple, TypeAlias, final

from npydask.errors import FileChangedError, NpyFormatError
from npydask.format.header import NpyHeader, parse_header

__all__ = [
    "CTIME_MARGIN_NS",
    "FileIdentity",
    "HeaderCheck",
    "Identity",
    "InodeIdentity",
    "ObjectIdentity",
    "Scanned",
    "changed_since_listing",
    "check_unchanged",
    "differs",
    "file_changed",
    "header_mismatch",
    "listing_began_ns",
]


class FileIdentity(NamedTuple):
    """What must stay the same for cached facts about a file to stay true.

    (A named tuple: built once per file when opening big folders, where a
    frozen dataclass costs four times as much.)
    """

    size: int
    mtime_ns: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        """The identity in a ``stat`` result."""
        return cls(st.st_size, st.st_mtime_ns, st.st_ino)

    def facts(self) -> str:
        """The text a task's token hashes: size, mtime and inode."""
        return f"{self.size}|{self.mtime_ns}|{self.ino}"


_CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5 if sys.platform.startswith("linux") else None)
"""The clock Linux file systems stamp ``st_ctime`` from (``CLOCK_REALTIME_COARSE``; Python 3.13 names it)."""

CTIME_MARGIN_NS = 20_000_000
"""Without the kernel's coarse clock (not Linux): how long before a listing a status change still counts as after it."""


def listing_began_ns() -> int:
    """The time a listing that starts now records: a ``st_ctime`` at or after it means changed after the call.

    File systems stamp a status change either from the kernel's coarse
    clock, which lags the wall clock by a tick or so (4 ms at ``HZ=250``), or
    (Linux 6.13 and later, once a file's times were read) from the fine
    wall clock. This waits until the coarse clock passes the wall-clock time
    of the call, and returns the coarse time it reads then. So a change
    made before the call carries a ctime before the returned time (the
    wall clock then was earlier still), and a change made after this
    returns carries one at or after it (both clocks have passed it). The
    wait lasts about a tick of the coarse clock. Without that clock, the
    wall-clock time less :data:`CTIME_MARGIN_NS` (a file changed within the
    margin before the listing is then refused too).

    Examples
    --------
    >>> import os, tempfile, time
    >>> fd, p = tempfile.mkstemp(); os.close(fd)
    >>> began = listing_began_ns()
    >>> os.stat(p).st_ctime_ns < began <= time.time_ns()
    True
    """
    now = time.time_ns()
    if _CLOCK_REALTIME_COARSE is None:
        return now - CTIME_MARGIN_NS
    while (coarse := time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)) <= now:
        time.sleep(0.0002)
    return coarse


@final  # (compared by exact type: ``type(identity) is InodeIdentity``)
class InodeIdentity(NamedTuple):
    """A file known only from its folder's listing: its inode, and when the listing began (``headers="first"``).

    The listing (``os.scandir``) gives the inode without a ``stat``; size
    and mtime stay unknown. A task, which ``fstat``s the file anyway,
    checks the inode (a file replaced by a rename usually has another) and
    that the file's status last changed (``st_ctime``) before ``listed_ns``,
    when the listing began (:func:`listing_began_ns`: after every change
    made before the listing was asked for, and at or before every change
    made after it began). Creating, renaming into place, writing or
    truncating a file sets its ctime, so a file replaced after opening
    fails even where the file system gave the replacement the old inode
    number back (ext4 does, for a file replaced twice by write-and-rename),
    and a file written just before opening never does. This relies on the
    clock of whoever stamps the ctime (the file server, for a network file
    system) agreeing with this machine's, and on fine timestamps (a file
    system with one- or two-second timestamps may stamp a change just
    after the listing as before it).
    Header bytes are checked against the dataset's :class:`HeaderCheck`,
    and the payload's presence, where the file is read. ``listed_ns`` of
    -1 means unknown: the inode alone is compared. Compared with
    :func:`differs`, never with ``==`` against a :class:`FileIdentity`;
    ``listed_ns`` does not enter tokens (two opens of the same files give
    the same graph names).
    """

    ino: int
    listed_ns: int = -1

    def facts(self) -> str:
        """The text a task's token hashes (the inode: when the listing ran does not change what is read)."""
        return f"ino {self.ino}"


_EPOCH = "1970-01-01T00:00:00+00:00"
"""The ``last_modified`` obstore reports for a response without ``Last-Modified``."""


class ObjectIdentity(NamedTuple):
    """An object's size and version tag: equal while its bytes are the ones planned for.

    (Sent and compared by :mod:`npydask.storage.object`; here beside the
    local kinds, as every kind of :data:`Identity` is.)
    """

    size: int
    etag: str | None
    """The ETag (sent as ``If-Match`` and compared with each response's), or ``None``."""
    modified: str | None = None
    """``Last-Modified`` (ISO 8601), compared only where the server sends no ETag."""

    @classmethod
    def of(cls, meta: Any, mode: str = "etag") -> ObjectIdentity:
        """The identity in an obstore ``ObjectMeta``, as the store's ``identity`` ``mode`` takes it."""
        size = int(meta["size"])
        if mode == "none":
            return cls(size, None)
        etag = meta.get("e_tag") or None
        modified = meta.get("last_modified")
        if etag is not None or modified is None or mode != "last-modified":
            return cls(size, etag)
        modified = modified.isoformat()
        return cls(size, None, None if modified == _EPOCH else modified)

    def facts(self) -> str:
        """The text a task's token hashes."""
        return f"{self.size}|{self.etag}|{self.modified}"


Identity: TypeAlias = FileIdentity | InodeIdentity | ObjectIdentity
"""What a source says a file is: equal (``==``, and hashable) while its bytes are the ones planned for.

Opaque to readers: each source gives its own kind of small named tuple,
which only that source looks inside (a local file's :class:`FileIdentity`,
or :class:`InodeIdentity` from a listed folder; an object's
:class:`ObjectIdentity`), and each says with ``facts()`` what a task's
token hashes. :mod:`npydask.storage.base` re-exports this name with the
interfaces."""

Scanned: TypeAlias = tuple[Identity, NpyHeader, bytes, bool]
"""(identity, header, raw header bytes, deflated) of one file, as ``Source.scan`` gives it.

A plain tuple, not a named one: the scan of a million files builds one per
file in its tightest loop, where building a named tuple instead measurably
slows ``open_dataset`` of page-cached files. It lives only between a scan
and the table made from it (unpacked at once, never pickled)."""


def differs(expected: FileIdentity | InodeIdentity, st: os.stat_result) -> bool:
    """Whether the file whose ``stat`` is ``st`` is not the one ``expected`` describes.

    An :class:`InodeIdentity` compares the inode, and the status change time
    against when the listing began.

    Examples
    --------
    >>> import os, tempfile, time
    >>> fd, p = tempfile.mkstemp(); os.close(fd); st = os.stat(p)
    >>> differs(InodeIdentity(st.st_ino), st), differs(FileIdentity(st.st_size, st.st_mtime_ns - 1, st.st_ino), st)
    (False, True)
    >>> differs(InodeIdentity(st.st_ino, st.st_ctime_ns), st)  # (changed when the listing began)
    True
    """
    if type(expected) is InodeIdentity:
        return expected.ino != st.st_ino or st.st_ctime_ns >= expected.listed_ns >= 0
    return expected != (st.st_size, st.st_mtime_ns, st.st_ino)


class HeaderCheck(NamedTuple):
    """The header bytes a task relies on, checked against the file wherever it reads them.

    A task's header may come from somewhere else than the file it reads: a
    persistent header index, or another file's header. Each read site
    compares ``raw`` with the bytes in the file (without a second read: the
    handle cache parsed them when it opened the file, and the grouped
    small-file loop reads them with the payload), so such a header can never
    change the data. Equal headers share one object, so a task carrying
    thousands of files carries each distinct header once.
    """

    raw: bytes
    """The preamble and header bytes, up to ``data_offset`` (of the member, for an ``.npz`` member)."""
    source: str
    """Where they came from, for the error (``"the header index '/data/index.json'"``)."""
    remedy: str
    """What to do when they differ (``"delete '/data/index.json' and open the dataset again"``)."""
    read_there: bool = False
    """Whether ``raw`` was read from this very file at the identity the task carries.

    Local files are compared wherever they are read anyway (the handle cache
    holds their header bytes). An object whose header came from its own GET,
    at the ETag every later range read is conditional on, cannot hold other
    bytes, so its tasks skip the header request; a header from anywhere else
    (an index, another file) costs one range GET of the header, checked
    against the ETag, where the object is first read in a process.
    """


def header_mismatch(path: str, check: HeaderCheck, found: bytes) -> NpyFormatError:
    """The error for a file whose header bytes are not the ones ``check`` expects.

    Headers are described by what they parse to; where those descriptions
    agree (headers that differ only in spacing, key order or quoting), the
    raw bytes are shown instead, so the message always shows a difference.

    Examples
    --------
    >>> import io, numpy as np
    >>> f = io.BytesIO(); np.save(f, np.zeros(3, "<f4")); a = f.getvalue()[:128]
    >>> b = a.replace(b"(3,), }", b"(3,),} ")  # (the same length, and it parses alike)
    >>> msg = str(header_mismatch("/d/b.npy", HeaderCheck(a, "the first file's header", "open it again"), b))
    >>> "'shape': (3,),}" in msg and "'shape': (3,), }" in msg
    True
    """
    expected, found_text = _describe(check.raw), _describe(found)
    if expected == found_text:  # (they parse alike: only the bytes differ)
        expected = f"{expected}, in {_raw_bytes(check.raw)}"
        found_text = f"the same array in other header bytes, {_raw_bytes(found)} (headers are compared byte for byte)"
    return NpyFormatError(
        f"{path}: the header this read relies on, from {check.source}, is {expected}, "
        f"but the file holds {found_text}; npydask refuses to read it as something else: {check.remedy}"
    )


def _raw_bytes(raw: bytes) -> str:
    """Header bytes as a reader can compare them: their length and ``repr`` (long ones cut in the middle)."""
    shown = repr(raw) if len(raw) <= 600 else f"{raw[:300]!r}...{raw[-200:]!r}"
    return f"the {len(raw)} bytes {shown}"


def _describe(raw: bytes) -> str:
    """Shape, dtype, order and payload offset of header bytes, or why they do not parse (short)."""
    try:
        h = parse_header(raw, source="<header>")
    except NpyFormatError:
        return f"header bytes that do not parse ({raw[:80]!r}...)"
    order = "Fortran" if h.fortran_order else "C"
    return f"shape {h.shape}, dtype {h.dtype.str}, {order} order, payload at byte {h.data_offset}"


def check_unchanged(fd: int, expected: FileIdentity, path: str) -> None:
    """After a read: the open file ``fd`` still has the identity the read relied on.

    One ``fstat`` on the descriptor. A rewrite in place updates the mtime
    before its bytes land, so any byte of another version in the result
    shows here (unless the rewrite kept size and inode and fell in the same
    mtime tick: the documented window).

    Raises
    ------
    FileChangedError
        If its size, mtime or inode differ from ``expected``.
    """
    st = os.fstat(fd)
    if st.st_size != expected[0] or st.st_mtime_ns != expected[1] or st.st_ino != expected[2]:
        raise file_changed(path, expected, FileIdentity.of(st), during=True)


def file_changed(
    path: str, expected: FileIdentity | InodeIdentity, found: FileIdentity | os.stat_result, *, during: bool = False
) -> FileChangedError:
    """The error for a file that is not the one ``expected`` describes (``found``: its identity, or its ``stat``)."""
    if type(expected) is InodeIdentity and isinstance(found, os.stat_result) and found.st_ino == expected.ino:
        return changed_since_listing(path, expected, found.st_ctime_ns)
    if isinstance(found, os.stat_result):
        found = FileIdentity.of(found)
    what = [
        f"{name} {getattr(expected, name)} -> {getattr(found, name)}"
        for name in FileIdentity._fields
        if name in expected._fields and getattr(expected, name) != getattr(found, name)
    ]
    when = "while it was being read" if during else "after it was opened lazily"
    return FileChangedError(
        errno.ESTALE,
        f"file changed {when} ({', '.join(what)}); npydask refuses to return other data: open it again "
        "(rewrite files by writing a new file and renaming it over the old one)",
        path,
    )


def changed_since_listing(path: str, expected: InodeIdentity, ctime_ns: int) -> FileChangedError:
    """The error for a listed file (``headers="first"``) whose status changed at or after the listing began."""
    return FileChangedError(
        errno.ESTALE,
        f"file created, renamed into place or modified at {_utc(ctime_ns)} (its ctime), at or after the "
        f"dataset's listing began at {_utc(expected.listed_ns)}: it may hold other data than the file listed "
        "(the same inode number can come back for a replacement), and npydask refuses to return other data. "
        "Open the dataset again (the check relies on the file server's clock agreeing with this machine's)",
        path,
    )


def _utc(ns: int) -> str:
    """``ns`` since the epoch as ISO 8601 UTC with microseconds."""
    seconds, rest = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:06d}Z"
