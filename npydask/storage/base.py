"""The storage seam: where a dataset's bytes come from, and where written files go.

Three small interfaces, one implementation each per kind of storage (local
files in :mod:`npydask.storage.local`, objects in :mod:`npydask.storage.object`), all planned by
the same pure modules (:mod:`npydask.format.header`, :mod:`npydask.plan.region`,
:mod:`npydask.plan.roi`, the ordering rules of :mod:`npydask.dataset.order`):

* a :class:`Source` reads: a file's identity, headers of many files, a
  region's byte runs (a :class:`~npydask.plan.region.ReadPlan`) into a
  destination, and whole payloads of a group of small files in one loop;
* a :class:`Lister` lists a folder as a :class:`Listing` (relative paths,
  with sizes and identities where the listing gives them), which discovery
  then orders by DALI's rules;
* a :class:`Target` writes one file by blocks and publishes it at once, or
  leaves nothing behind.

Identities (:data:`~npydask.storage.identity.Identity`) are small named
tuples, opaque outside their source: whatever must stay the same for facts
read earlier to stay true (size, mtime and inode for a local file). A task built
for one identity that finds another fails with
:class:`~npydask.errors.FileChangedError` instead of returning other data.
A source is shared by every file of a dataset (one object, not one per
file) and pickles small, so tasks carry it cheaply.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

if TYPE_CHECKING:
    import numpy as np

    from npydask.config import ReadOptions
    from npydask.format.header import NpyHeader
    from npydask.format.npz import Member
    from npydask.plan.patch_runs import Spans
    from npydask.plan.region import ReadPlan
from npydask.storage.identity import HeaderCheck, Identity, Scanned

__all__ = ["Identity", "Item", "Lister", "Listing", "OpenedFile", "PieceReader", "Scanned", "Source", "Target"]

Item: TypeAlias = tuple[str, Identity, int, HeaderCheck | None]
"""(path, identity, payload offset, header check) of one file of a group, as :meth:`Source.read_many` reads it."""


class Listing(NamedTuple):
    """The files of a folder, in no particular order: relative paths, and sizes and identities if known.

    A frozen value of columns, not one object per file: listing 20,000 files
    builds three lists, not 20,000 records. ``sizes[i]`` and
    ``identities[i]`` belong to ``paths[i]``; both are ``None`` where the
    listing would need a request per file to know them (a local folder: the
    header scan's ``fstat`` gives them anyway), and come free with an object
    store's listing. A local folder listed for ``headers="first"`` gives
    each file's inode as its identity (the directory holds it), sizes still
    ``None``.

    Examples
    --------
    >>> from npydask.storage.identity import ObjectIdentity
    >>> Listing(["a/b.npy"], [128], [ObjectIdentity(128, "etag")]).sizes
    [128]
    """

    paths: list[str]
    """Relative to the listed folder, with the platform's separator between folders."""
    sizes: list[int] | None = None
    """Sizes in bytes, or ``None``."""
    identities: list[Identity] | None = None
    """What later reads must find (see :meth:`Source.identity`), or ``None``."""
    folders: list[tuple[str, int]] | None = None
    """For a listing one folder deep made folder by folder (a local one): each folder's name (``""``
    for the root's own files) and how many consecutive paths are its, in listing order; ``None``
    otherwise. Ordering can then sort each folder's paths apart instead of splitting every path."""


class OpenedFile(Protocol):
    """A file as :meth:`Source.open` opens it for the backends: what every source's opened files have.

    A local file (:class:`~npydask.storage.OpenFile`, from the handle cache)
    and an object (:class:`~npydask.storage.object.RemoteFile`) both are one;
    the source that opened it reads its byte runs
    (:meth:`Source.read_opened`), and only the backends that need more (a
    mapping needs a local descriptor) ask for the concrete kind.
    """

    @property
    def path(self) -> str:
        """The file as messages name it (an object URL redacted)."""

    @property
    def identity(self) -> Identity:
        """The identity it had when opened: every read of it is checked against this."""

    @property
    def header(self) -> NpyHeader:
        """Its parsed header (the member's, for an ``.npz`` member)."""

    @property
    def raw(self) -> bytes:
        """The header bytes as read from it."""

    @property
    def member(self) -> Member | None:
        """The ``.npz`` member read (stored or deflated), ``None`` for a plain ``.npy`` file."""

    @property
    def local(self) -> bool:
        """Whether it lives on a local file system (only then may ``backend="auto"`` map it)."""

    @property
    def deflated(self) -> bool:
        """Whether it is a deflated ``.npz`` member (only inflating reads it)."""

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``offset`` (fewer only at the end): one read or range request."""

    def check_unchanged(self) -> None:
        """Raise :class:`~npydask.errors.FileChangedError` if it is no longer the file opened (after a read)."""

    def piece_reader(self) -> PieceReader:
        """A :meth:`read_at` for reading a deflated member whole, whose fetched pieces are kept only once checked."""


class PieceReader:
    """``read(offset, n)`` as :meth:`OpenedFile.read_at`, and :meth:`keep` once what was read is known good.

    A deflated ``.npz`` member's compressed pieces cannot be checked one by one: only inflating
    the whole member checks its CRC-32. An object's reader holds the pieces it fetched and keeps
    them in the node cache when :meth:`keep` is called; a local file's has nothing to keep.
    """

    def __init__(self, read: Callable[[int, int], bytes]) -> None:
        self.read = read

    def __call__(self, offset: int, n: int) -> bytes:
        return self.read(offset, n)

    def keep(self) -> None:
        """Keep what was read (nothing for a local file)."""


class Source(abc.ABC):
    """Reads files of one storage: local files, or the objects behind one store.

    Every method names the failing file in its errors: ``FileNotFoundError``
    for a missing one, :class:`~npydask.errors.FileChangedError` for one whose
    identity is not the planned one (before or during a read, or ending
    early), :class:`~npydask.errors.NpyFormatError` for header bytes other
    than a :class:`~npydask.storage.identity.HeaderCheck` expects.
    """

    @property
    @abc.abstractmethod
    def mappable(self) -> bool:
        """Whether files here can be memory-mapped (``backend="auto"`` may then map a contiguous region)."""

    @property
    def concurrent(self) -> bool:
        """Whether reads here want many requests in flight at once (an object store's latency), not one by one."""
        return False

    def display(self, path: str) -> str:
        """``path`` as messages, reprs and listings show it (here as it is).

        Examples
        --------
        >>> from npydask.storage.local import LOCAL
        >>> LOCAL.display("/data/a.npy")
        '/data/a.npy'
        """
        return path

    def display_all(self, paths: list[str]) -> list[str]:
        """:meth:`display` of each path (``paths`` itself where a source shows paths as they are)."""
        return paths

    @abc.abstractmethod
    def read_bytes(self, path: str, limit: int | None = None, *, what: str = "file") -> bytes:
        """The bytes of a small whole file (or its first ``limit`` bytes), in one read or GET.

        ``what`` names the file in errors (``"header index"``). A missing file
        raises ``FileNotFoundError`` naming ``path`` (an object URL redacted);
        a local path that is not a regular file raises ``OSError``
        (``EINVAL``, or ``IsADirectoryError``).
        """

    @abc.abstractmethod
    def write_bytes(self, path: str, data: bytes, *, what: str = "file") -> None:
        """Replace ``path`` whole with ``data``: readers find the old bytes or the new ones, never a part.

        A local file is written beside ``path`` and renamed over it (after
        ``fsync``); an object is one PUT. ``what`` names the file in errors.
        """

    @property
    @abc.abstractmethod
    def gap_bytes(self) -> int:
        """The default coalescing gap: runs of a region closer than this are read as one span.

        Readers of this source's files take it as their ``ReadOptions.gap_bytes``
        (:func:`npydask.config.read_options`), so one region planner serves
        every source with the gap that suits it.
        """

    @abc.abstractmethod
    def identity(self, path: str) -> Identity:
        """The identity ``path`` has now (one metadata request: ``stat`` for a local file)."""

    def identities(self, paths: Sequence[str]) -> list[Identity]:
        """:meth:`identity` of each path (in turn here; an object store sends its requests at once).

        Raises the first failure (a missing file: ``FileNotFoundError`` naming it).
        """
        return [self.identity(p) for p in paths]

    @abc.abstractmethod
    def scan(self, paths: Sequence[str], key: str | None = None) -> list[Scanned | BaseException]:
        """Identity, checked header, raw header bytes and whether deflated, for each path.

        Failures come back in place as exceptions (``OSError``, ``ValueError``
        or ``KeyError`` subclasses), so one bad file does not stop a scan of
        thousands. With ``key``, the ``.npz`` member's header.
        """

    @abc.abstractmethod
    def open(
        self, path: str, expected: Identity | None = None, *, key: str | None = None, check: HeaderCheck | None = None
    ) -> OpenedFile:
        """The file opened for a backend (its header parsed), failing if it is not ``expected`` or ``check``."""

    @abc.abstractmethod
    def read_opened(self, f: OpenedFile, plan: ReadPlan, dest: np.ndarray, options: ReadOptions) -> None:
        """:meth:`read_runs` of a file this source's :meth:`open` returned: its runs, nothing else.

        No metadata request and no identity check of its own (the file was
        checked when opened): the caller checks afterwards with
        ``f.check_unchanged()``. An object's range requests are each
        conditional on its identity all the same. ``plan``'s offsets are
        the file's (an ``.npz`` member's header already places them).
        """

    @abc.abstractmethod
    def read_spans(self, f: OpenedFile, spans: Spans, dest: np.ndarray, options: ReadOptions) -> int:
        """Fill ``dest`` with ``spans`` of a file this source's :meth:`open` returned, back to back; the requests made.

        Span ``k`` (``spans.lengths[k]`` bytes at file offset
        ``spans.offsets[k]``) lands at ``spans.positions[k]`` of ``dest``
        (C-contiguous ``uint8``, ``spans.nbytes`` long). As for
        :meth:`read_opened`: no metadata request and no identity check of its
        own, the caller checks afterwards with ``f.check_unchanged()``; an
        object's range requests are each conditional on its identity.
        """

    def in_memory(self, f: OpenedFile, offsets: Sequence[int]) -> bool:
        """Whether the bytes at ``offsets`` of a file this source opened are in memory already, asked without
        reading them (a local file: in the page cache). ``False`` for a source whose files cannot be mapped."""
        return False

    @abc.abstractmethod
    def read_runs(
        self,
        path: str,
        identity: Identity,
        plan: ReadPlan,
        dest: np.ndarray,
        options: ReadOptions,
        check: HeaderCheck | None = None,
    ) -> None:
        """Fill ``dest`` (C-contiguous ``uint8``, ``plan.nbytes`` long) with ``plan``'s byte runs in file order.

        Raises ``FileChangedError`` if the file is not ``identity`` before
        or after the read, ``NpyFormatError`` if its header is not ``check``'s.
        """

    @abc.abstractmethod
    def scan_members(self, paths: Sequence[str], keys: Sequence[str]) -> list[list[Scanned] | BaseException]:
        """:meth:`scan` of several ``.npz`` members: per path, one result per key, the zip directory read once.

        A failure (a missing member, an unreadable file) comes back in place
        of the path's list, as in :meth:`scan`.
        """

    def read_runs_many(
        self, jobs: Sequence[tuple[str, Identity, ReadPlan, np.ndarray, ReadOptions, HeaderCheck | None]]
    ) -> None:
        """:meth:`read_runs` of each ``(path, identity, plan, dest, options, check)`` (the ROIs of a group).

        In turn here; a source with latency to hide (an object store) reads
        several files at once.
        """
        for job in jobs:
            self.read_runs(*job)

    @abc.abstractmethod
    def read_many(self, items: Sequence[Item], dest: memoryview, nbytes: int) -> None:
        """Fill ``dest`` with ``nbytes`` from each ``(path, identity, offset, check)`` in turn (a small-file group)."""

    @property
    def cache_in_use(self) -> bool:
        """Whether reads here use a node cache (never for local files: the page cache keeps them)."""
        return False

    def warn_uncached(self, paths: Sequence[str], identities: Sequence[Identity]) -> None:
        """Warn once where a node cache is on but some of these files cannot use it (nothing here).

        An object store's source warns, naming the first such object and
        why, for a store opened without ETag identities, or objects with a
        weak or no ETag: they are read without the cache.
        """
        return  # (deliberately nothing: local files are not cached)

    def check_process(self, path: str) -> None:
        """Raise where this process cannot read ``path`` (nothing to check for local files).

        An object store's client is not fork-safe: in a child forked from a
        process that used it, this raises :class:`RuntimeError` naming the
        ``spawn`` and ``forkserver`` start methods (a request would hang).
        Readers that run in worker processes (the Loader, the PyTorch
        adapters) call it before their first read.
        """
        return  # (deliberately nothing here: a source that must check overrides this)

    def header(self, path: str, key: str | None = None) -> NpyHeader:
        """The checked header of one file (the first of :meth:`scan`'s results, raised if it failed)."""
        found = self.scan([path], key)[0]
        if isinstance(found, BaseException):
            raise found
        return found[1]


class Lister(abc.ABC):
    """Lists the files under one folder (or prefix), unordered: discovery orders them."""

    @abc.abstractmethod
    def list(self, recursive: bool = False, match: Callable[[str], object] | None = None) -> Listing:
        """The files of the folder whose base name ``match`` accepts (all without it), in no particular order.

        Without ``recursive``, the files directly in the folder and in each
        of its immediate subfolders (DALI's non-recursive traversal); with
        it, files at every depth. Folders themselves are not listed.
        Ordering is the caller's (pure) business.
        """


class Target(abc.ABC):
    """One file being written: blocks at any offset, then published whole, or nothing.

    Readers never see a partial file under the target's name: :meth:`finish`
    makes it appear at once, :meth:`abort` removes what was written. As a
    context manager it aborts when the block raises.
    """

    @abc.abstractmethod
    def write_block(self, offset: int, data: Any) -> None:
        """Write the bytes of ``data`` (any buffer) at ``offset``."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Publish the written file under its name (replacing, or refusing to replace, an existing one)."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop what was written; the target's name is left as it was. Safe to call more than once."""

    def __enter__(self) -> Target:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            self.abort()
