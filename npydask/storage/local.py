"""Local files (and network file systems mounted as local): the :mod:`~npydask.storage.base` interfaces.

The work is done where it always was: safe opening and the per-process
handle cache in :mod:`npydask.storage._handles`, the tight loops over many
small files in :mod:`npydask.storage._batch`, the run grid of a region in
:func:`npydask.storage.read_grid`. These classes only give them one
interface, so readers pick a source once per dataset (:data:`LOCAL`, one
shared object) and never test what kind of storage they read.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, cast

import numpy as np

from npydask import config
from npydask.config import ReadOptions
from npydask.format import npz
from npydask.format.header import NpyHeader
from npydask.plan.patch_runs import Spans
from npydask.plan.region import ReadPlan
from npydask.storage import _local_write
from npydask.storage._batch import read_files, scan_files
from npydask.storage._handles import OpenFile, acquire, check_regular, open_regular, reader, scan_file, scan_members
from npydask.storage._local_read import pages_cached, read_grid, read_local, read_local_spans
from npydask.storage._rois import read_rois
from npydask.storage.base import Identity, Item, Lister, Listing, OpenedFile, Scanned, Source, Target
from npydask.storage.identity import FileIdentity, HeaderCheck, InodeIdentity, listing_began_ns

__all__ = ["LOCAL", "LocalLister", "LocalSource", "LocalTarget", "verify_npz"]


class LocalSource(Source):
    """Files of the local file system (one stateless object, :data:`LOCAL`, serves every dataset).

    Identities are :class:`~npydask.storage.identity.FileIdentity` values
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
        gap: int = config.get("gap_bytes")
        return gap

    def identity(self, path: str) -> FileIdentity:
        """One ``stat``, symlinks followed."""
        return FileIdentity.of(os.stat(path))

    def identities(self, paths: Sequence[str]) -> list[Identity]:
        """One ``stat`` per path (symlinks followed), in a tight loop; a path that is not a regular file is refused."""
        out: list[Identity] = []
        append, stat_, isreg, new = out.append, os.stat, stat.S_ISREG, FileIdentity
        for p in paths:
            st = stat_(p)
            if not isreg(st.st_mode):
                check_regular(st, p)
            append(new(st.st_size, st.st_mtime_ns, st.st_ino))
        return out

    def scan(self, paths: Sequence[str], key: str | None = None) -> list[Scanned | BaseException]:
        """:func:`~npydask.storage._batch.scan_files`: one open, fstat, pread and close per file."""
        return scan_files(paths, key)

    def scan_members(self, paths: Sequence[str], keys: Sequence[str]) -> list[list[Scanned] | BaseException]:
        """:func:`~npydask.storage.scan_members` of each path: one open, fstat and directory read per file."""
        out: list[list[Scanned] | BaseException] = []
        for p in paths:
            try:
                out.append(scan_members(p, keys))
            except (OSError, ValueError, KeyError) as e:
                out.append(e)
        return out

    def header(self, path: str, key: str | None = None) -> NpyHeader:
        """:func:`~npydask.storage.scan_file`'s header: one open, fstat, pread and close."""
        return scan_file(path, key)[1]

    def open(
        self, path: str, expected: Any = None, *, key: str | None = None, check: HeaderCheck | None = None
    ) -> OpenFile:
        """The cached open file (:func:`~npydask.storage.acquire`)."""
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
        """:func:`~npydask.storage.read_grid` through the handle cache (``O_DIRECT`` with ``direct_io``)."""
        read_grid(path, identity, plan, options, dest, check)

    def read_opened(self, f: OpenedFile, plan: ReadPlan, dest: np.ndarray, options: ReadOptions) -> None:
        """:func:`~npydask.storage.read_local` on ``f``'s descriptor: the reads alone, no ``stat`` or ``fstat``."""
        read_local(cast(OpenFile, f), plan, options, dest)  # (a file this source opened: the handle cache's)

    def read_spans(self, f: OpenedFile, spans: Spans, dest: np.ndarray, options: ReadOptions) -> int:
        """One ``preadv`` per span on ``f``'s cached descriptor (``O_DIRECT`` with ``direct_io``); a short read
        is completed by more, not counted."""
        return read_local_spans(cast(OpenFile, f), spans, dest, options)  # (a file this source opened)

    def in_memory(self, f: OpenedFile, offsets: Sequence[int]) -> bool:
        """:func:`~npydask.storage._local_read.pages_cached`: a one-byte ``RWF_NOWAIT`` read per offset."""
        return pages_cached(cast(OpenFile, f), offsets)

    def read_runs_many(self, jobs: Sequence[tuple[Any, ...]]) -> None:
        """:func:`~npydask.storage._rois.read_rois`: one uncached open, the reads, one fstat, one close per file."""
        read_rois(jobs)

    def read_many(self, items: Sequence[Item], dest: memoryview, nbytes: int) -> None:
        """:func:`~npydask.storage._batch.read_files`: one open, preadv, fstat and close per file."""
        # (the items carry identities this source made: FileIdentity or InodeIdentity)
        local_items = cast(Sequence[tuple[str, FileIdentity | InodeIdentity, int, HeaderCheck | None]], items)
        read_files(local_items, dest, nbytes)

    def read_bytes(self, path: str, limit: int | None = None, *, what: str = "file") -> bytes:
        """One ``read`` of a regular file (``open_regular``: no FIFO, socket or device is waited on)."""
        f, _ = open_regular(path, what=f"a regular file (a {what})")
        with f:
            return f.read() if limit is None else f.read(limit)

    def write_bytes(self, path: str, data: bytes, *, what: str = "file") -> None:
        """A hidden temporary file in ``path``'s folder, ``fsync``, then ``os.replace`` over ``path``."""
        fd, tmp = tempfile.mkstemp(prefix=".npydask-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def __repr__(self) -> str:
        return "LocalSource()"

    def __reduce__(self) -> str:
        return "LOCAL"  # (pickled by reference: every task shares the one object)


LOCAL = LocalSource()
"""The local file system's source."""


class LocalLister(Lister):
    """The files under a local folder, as DALI's ``traverse_directories`` finds them.

    (See :mod:`npydask.dataset.select`.)

    A file is a regular file or a symlink to one (dangling symlinks, symlink
    loops and links to anything else are skipped). Symlinked folders are
    followed. Without ``recursive``, the immediate subfolders are listed as
    DALI does, so a subfolder that links to the root or a sibling lists those
    files again under its own name. With it, every folder (by device and
    inode) is walked once: first the real tree, then symlinked folders that
    lead somewhere not yet walked, fewest symlinks first and byte-wise within
    a round. An unreadable folder raises :func:`os.scandir`'s
    ``PermissionError``. No file is ``stat``-ed (``os.DirEntry`` answers from
    the directory), so sizes and identities are ``None``; with ``inodes``,
    the identities are each file's
    :class:`~npydask.storage.identity.InodeIdentity`, which the directory
    gives too (``DirEntry.inode()``; a symlink's target costs a ``stat``),
    with when the listing began
    (:func:`~npydask.storage.identity.listing_began_ns`, which waits about a
    tick of the kernel's coarse clock): a file whose status changes after
    that is refused where a task reads it, one changed before the call
    never is.

    Examples
    --------
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp(); os.mkdir(os.path.join(root, "sub"))
    >>> for rel in ["a.npy", "b.txt", "sub/c.npy"]: open(os.path.join(root, rel), "wb").close()
    >>> listed = LocalLister(root).list(match=lambda name: name.endswith(".npy"))
    >>> sorted(listed.paths) == ["a.npy", os.path.join("sub", "c.npy")]
    True
    """

    def __init__(self, root: str, *, inodes: bool = False) -> None:
        self.root = root
        self.inodes = inodes

    def list(self, recursive: bool = False, match: Callable[[str], object] | None = None) -> Listing:
        """See :meth:`Lister.list` (paths joined with ``os.sep``)."""
        match = match or _any
        listed = listing_began_ns()  # (files whose status changes from here on are refused)
        inos: list[int] | None = [] if self.inodes else None
        folders: list[tuple[str, int]] | None = None
        if recursive:
            paths = self._recursive(match, inos)
        else:
            folders = []
            paths = self._flat(match, inos, folders)
        # (tuple.__new__ over (inode, listed) pairs: the named tuples built in C, not by one Python call each)
        identities: list[Identity] | None = (
            None if inos is None else list(map(tuple.__new__, repeat(InodeIdentity), zip(inos, repeat(listed))))
        )
        return Listing(paths, None, identities, folders)

    # (builtins.list: in this class's scope, ``list`` is the method)
    def _flat(
        self,
        match: Callable[[str], object],
        inos: builtins.list[int] | None,
        folders: builtins.list[tuple[str, int]],
    ) -> builtins.list[str]:
        dirs, found = _scan(self.root, match, inos)
        folders.append(("", len(found)))
        for d in dirs:
            _, names = _scan(d.path, match, inos)
            prefix = d.name + os.sep
            found.extend(prefix + name for name in names)
            folders.append((d.name, len(names)))
        return found

    def _recursive(self, match: Callable[[str], object], inos: builtins.list[int] | None = None) -> builtins.list[str]:
        root_stat = os.stat(self.root)
        visited = {(root_stat.st_dev, root_stat.st_ino)}
        found: list[str] = []

        def walk_real(rel: str, path: str, links: list[tuple[str, str]]) -> None:
            # Depth-first through real directories; symlinked ones wait for a later round.
            stack = [(rel, path)]
            while stack:
                rel_dir, dir_path = stack.pop()
                dirs, names = _scan(dir_path, match, inos)
                found.extend(rel_dir + os.sep + name if rel_dir else name for name in names)
                for d in dirs:
                    child = rel_dir + os.sep + d.name if rel_dir else d.name
                    if d.is_symlink():
                        links.append((child, d.path))
                        continue
                    st = d.stat(follow_symlinks=False)
                    key = (st.st_dev, st.st_ino)
                    if key not in visited:  # a bind mount can loop without symlinks
                        visited.add(key)
                        stack.append((child, d.path))

        links: list[tuple[str, str]] = []
        walk_real("", self.root, links)
        while links:
            links.sort(key=lambda link: fs_bytes(link[0]))
            next_links: list[tuple[str, str]] = []
            for rel, path in links:
                try:
                    st = os.stat(path)
                except OSError:  # vanished or became dangling since it was listed
                    continue
                key = (st.st_dev, st.st_ino)
                if key in visited or not stat.S_ISDIR(st.st_mode):
                    continue
                visited.add(key)
                walk_real(rel, path, next_links)
            links = next_links
        return found


def _any(name: str) -> bool:
    return True


_FS_ENCODING = sys.getfilesystemencoding()
_FS_ERRORS = sys.getfilesystemencodeerrors()


def fs_bytes(name: str) -> bytes:
    """``os.fsencode(name)`` without its Python-level overhead (it is a sort key)."""
    return name.encode(_FS_ENCODING, _FS_ERRORS)


def _scan(
    path: str, match: Callable[[str], object], inos: list[int] | None = None
) -> tuple[list[os.DirEntry[str]], list[str]]:
    """One directory: its subdirectories (symlinks followed) and matching files, unsorted.

    With ``inos``, each matching file's inode is appended to it (a symlink's
    target's: one ``stat``).
    """
    dirs: list[os.DirEntry[str]] = []
    names: list[str] = []
    with os.scandir(path) as it:
        for entry in it:
            # DirEntry answers from d_type without a stat, except for symlinks
            # (followed) and file systems that report DT_UNKNOWN. Files first:
            # most entries are files, so one call each.
            try:
                if entry.is_file():
                    name = entry.name
                    if match(name):
                        names.append(name)
                        if inos is not None:
                            inos.append(entry.stat().st_ino if entry.is_symlink() else entry.inode())
                    continue
                is_dir = entry.is_dir()
            except OSError:  # a symlink loop (ELOOP): not a file, not a folder
                if not entry.is_symlink():
                    raise
                continue
            if is_dir:
                dirs.append(entry)
    return dirs, names


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
        self.tmp = _local_write.temporary_name(path, _local_write.new_run())  # (cut by bytes: always a legal name)
        self._fd: int | None = None

    def write_block(self, offset: int, data: Any) -> None:
        """``pwrite`` ``data`` at ``offset`` of the temporary file (created on the first call)."""
        if self._fd is None:
            if not self.overwrite and os.path.lexists(self.path):
                raise _local_write.exists_error(self.path)
            self._fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        _local_write.pwrite_all(self._fd, memoryview(data).cast("B"), offset, self.path)

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
            _local_write.publish(self.tmp, self.path, overwrite=self.overwrite)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Close and remove the temporary file; the target is left as it was."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        _local_write.remove_quietly(self.tmp)


def verify_npz(path: str | os.PathLike[str]) -> list[str]:
    """Check every member of the ``.npz`` archive at ``path`` against its CRC-32 (:func:`npydask.format.npz.verify`).

    Returns the names of the members checked, in the archive's order; raises
    what :func:`~npydask.format.npz.verify` raises, and ``OSError`` where
    ``path`` cannot be opened as a regular file.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npz"); np.savez_compressed(p, x=np.arange(3), y=np.ones(2))
    >>> verify_npz(p)
    ['x.npy', 'y.npy']
    """
    path = os.fspath(path)
    f, st = open_regular(path)
    with f:
        return npz.verify(reader(f.fileno()), st.st_size, path)
