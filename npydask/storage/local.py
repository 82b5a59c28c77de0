"""Local files (and network file systems mounted as local): the :mod:`~npydask.storage.base` interfaces.

The work is done where it always was: safe opening and the per-process
handle cache in :mod:`npydask.storage._handles`, the tight loops over many
small files in :mod:`npydask.storage._batch`, the run grid of a region in
:func:`npydask.backends.pread.read_grid`. These classes only give them one
interface, so readers pick a source once per dataset (:data:`LOCAL`, one
shared object) and never test what kind of storage they read.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from npydask import config
from npydask.backends import _write
from npydask.backends.pread import read_grid
from npydask.config import ReadOptions
from npydask.header import NpyHeader
from npydask.region import ReadPlan
from npydask.storage._batch import read_files, scan_files
from npydask.storage._handles import FileIdentity, HeaderCheck, OpenFile, acquire, scan_file
from npydask.storage.base import Entry, Item, Lister, Scanned, Source, Target

__all__ = ["LOCAL", "LocalLister", "LocalSource", "LocalTarget"]


class LocalSource(Source):
    """Files of the local file system (one stateless object, :data:`LOCAL`, serves every dataset).

    Identities are :class:`~npydask.storage._handles.FileIdentity` values
    (size, mtime, inode). It pickles as a reference to :data:`LOCAL`.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.arange(4))
    >>> LOCAL.header(p).shape, LOCAL.identity(p).size
    ((4,), 160)
    """

    @property
    def mappable(self) -> bool:
        """Local files can be mapped (``"auto"`` still checks each file's file system)."""
        return True

    @property
    def gap_bytes(self) -> int:
        """The ``gap_bytes`` setting (4 KiB by default: a page)."""
        return config.get("gap_bytes")

    def identity(self, path: str) -> FileIdentity:
        """One ``stat``, symlinks followed."""
        return FileIdentity.of(os.stat(path))

    def scan(self, paths: Sequence[str], key: str | None = None) -> list[Scanned | BaseException]:
        """:func:`~npydask.storage._batch.scan_files`: one open, fstat, pread and close per file."""
        return scan_files(paths, key)

    def header(self, path: str, key: str | None = None) -> NpyHeader:
        """:func:`~npydask.storage._handles.scan_file`'s header: one open, fstat, pread and close."""
        return scan_file(path, key)[1]

    def open(
        self, path: str, expected: Any = None, *, key: str | None = None, check: HeaderCheck | None = None
    ) -> OpenFile:
        """The cached open file (:func:`~npydask.storage._handles.acquire`)."""
        return acquire(path, expected, key=key, check=check)

    def read_runs(
        self,
        path: str,
        identity: Any,
        plan: ReadPlan,
        dest: np.ndarray,
        options: ReadOptions,
        check: HeaderCheck | None = None,
    ) -> None:
        """:func:`~npydask.backends.pread.read_grid` through the handle cache (``O_DIRECT`` with ``direct_io``)."""
        read_grid(path, identity, plan, options, dest, check)

    def read_many(self, items: Sequence[Item], dest: memoryview, nbytes: int) -> None:
        """:func:`~npydask.storage._batch.read_files`: one open, preadv, fstat and close per file."""
        read_files(items, dest, nbytes)

    def __repr__(self) -> str:
        return "LocalSource()"

    def __reduce__(self) -> str:
        return "LOCAL"  # (pickled by reference: every task shares the one object)


LOCAL = LocalSource()
"""The local file system's source."""


class LocalLister(Lister):
    """The files under a local folder, with symlinks to files and folders followed.

    Each folder (by device and inode) is listed once, so symlink and bind
    mount loops end. Entries whose symlink is dangling or loops are skipped,
    and so are FIFOs, sockets and devices. Sizes and identities come from
    one ``stat`` per file (``os.DirEntry.stat``).

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> root = tempfile.mkdtemp(); os.mkdir(os.path.join(root, "sub"))
    >>> np.save(os.path.join(root, "a.npy"), np.zeros(2)); np.save(os.path.join(root, "sub", "b.npy"), np.zeros(3))
    >>> sorted(e.path for e in LocalLister(root).entries(recursive=True)) == ["a.npy", os.path.join("sub", "b.npy")]
    True
    """

    def __init__(self, root: str) -> None:
        self.root = root

    def entries(self, recursive: bool = False) -> Iterator[Entry]:
        """See :meth:`Lister.entries` (relative paths joined with ``os.sep``)."""
        root_st = os.stat(self.root)
        if not stat.S_ISDIR(root_st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "expected a folder to list, found a file", self.root)
        seen = {(root_st.st_dev, root_st.st_ino)}
        stack = [("", self.root, 0)]
        while stack:
            rel, path, depth = stack.pop()
            with os.scandir(path) as it:
                listed = list(it)
            for entry in listed:
                try:
                    st = entry.stat()  # (symlinks followed)
                except OSError:  # dangling, looping or vanished since listed
                    continue
                child = rel + os.sep + entry.name if rel else entry.name
                if stat.S_ISREG(st.st_mode):
                    yield Entry(child, st.st_size, FileIdentity.of(st))
                elif stat.S_ISDIR(st.st_mode) and (recursive or depth == 0) and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    stack.append((child, entry.path, depth + 1))


class LocalTarget(Target):
    """A local file written into a temporary file beside it, then renamed over it.

    The temporary file is created (``O_EXCL``) on the first block, so an
    unused target leaves nothing. :meth:`finish` checks the size, syncs, and
    renames it over ``path`` (keeping a replaced file's permissions), or with
    ``overwrite=False`` links it there only if nothing is (``FileExistsError``
    otherwise), then syncs the folder.

    Examples
    --------
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with LocalTarget(p, 6) as t:
    ...     t.write_block(3, b"def"); t.write_block(0, b"abc"); t.finish()
    >>> open(p, "rb").read()
    b'abcdef'
    """

    def __init__(self, path: str, size: int, *, overwrite: bool = True) -> None:
        self.path = path
        self.size = size
        self.overwrite = overwrite
        name = f".{os.path.basename(path)}.{secrets.token_hex(8)}{_write.TMP_SUFFIX}"
        self.tmp = os.path.join(os.path.dirname(path), name)
        self._fd: int | None = None

    def write_block(self, offset: int, data: Any) -> None:
        """``pwrite`` ``data`` at ``offset`` of the temporary file (created on the first call)."""
        if self._fd is None:
            if not self.overwrite and os.path.lexists(self.path):
                raise _write.exists_error(self.path)
            self._fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        _write._pwrite_all(self._fd, memoryview(data).cast("B"), offset, self.path)

    def finish(self) -> None:
        """Check the size, ``fsync``, and publish under :attr:`path`; aborts on failure."""
        if self._fd is None:
            self.write_block(0, b"")
        fd = self._fd
        assert fd is not None
        try:
            found = os.fstat(fd).st_size
            if found != self.size:
                raise OSError(
                    errno.EIO,
                    f"expected {self.size} bytes written before publishing, found {found}: blocks are missing; "
                    "not publishing a partial file",
                    self.path,
                )
            os.fsync(fd)
            os.close(fd)
            self._fd = None
            _write.publish(self.tmp, self.path, overwrite=self.overwrite)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Close and remove the temporary file; the target is left as it was."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        _write._remove_quietly(self.tmp)
