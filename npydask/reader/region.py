"""Reading headers and regions of one file: a plan from :mod:`npydask.plan.region`, bytes from a backend.

:class:`FileRef` is what a lazy task carries: the path, the identity the file
had when the graph was built, the parsed header, the header bytes it relies
on (a :class:`~npydask.storage.identity.HeaderCheck`) and the read settings.
It pickles as those few fields and reopens the file (through the
per-process handle cache) wherever it lands; a file whose identity changed
meanwhile, or changes while it is read, fails the task with
:class:`~npydask.errors.FileChangedError`, and one whose header bytes are
not the ones relied on with :class:`~npydask.errors.NpyFormatError`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from npydask import backends
from npydask._keywords import suggest_keywords
from npydask.backends.mmap import MapError
from npydask.config import ReadOptions, read_options
from npydask.format.header import NpyHeader
from npydask.format.npz import check_stored
from npydask.plan.read_strategy import STRATEGIES, choose
from npydask.plan.region import Box, ReadPlan, normalize_box, plan_read, same_layout
from npydask.storage import FileIdentity, HeaderCheck
from npydask.storage.base import OpenedFile, Source
from npydask.storage.identity import Identity
from npydask.storage.local import LOCAL
from npydask.storage.paths import absolute
from npydask.storage.where import fspath, resolve

__all__ = [
    "BACKENDS",
    "FileRef",
    "check_backend_for",
    "check_key",
    "choose_backend",
    "read_header",
    "read_region",
    "shared_facts",
]

BACKENDS = ("auto", "mmap", "pread")


def check_key(key: str | None) -> None:
    """Refuse a ``key`` that is not ``None`` or a str (the name of an ``.npz`` member)."""
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key must be the name of an .npz member (a str), found {key!r}")


@suggest_keywords
def read_header(
    path: str | os.PathLike[str], *, key: str | None = None, storage_options: dict[str, Any] | None = None
) -> NpyHeader:
    """Read and check the header of an ``.npy`` file.

    Besides :func:`~npydask.parse_header`'s checks, the file must hold at least
    ``nbytes`` of payload after ``data_offset``.

    Parameters
    ----------
    path : str or os.PathLike
        The file, or an object URL (``s3://``, ``gs://``, ``az://``,
        ``http(s)://``; one range request) or ``file://`` URL.
    key : str, optional
        Member name inside an ``.npz`` archive.
    storage_options : dict, optional
        For URLs: obstore's store and client options (``endpoint``,
        ``region``, ``skip_signature``, ...), and npydask's ``identity``
        (``"etag"``, the default: a server without ETags is refused;
        ``"last-modified"``; ``"none"``).

    Raises
    ------
    NpyFormatError
        A malformed header, an object dtype, a truncated payload.
    OSError
        The builtin subclass when the path cannot be opened as a regular file.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.ones((3, 4), ">f8"))
    >>> h = npydask.read_header(p)
    >>> h.shape, h.dtype.str, h.fortran_order
    ((3, 4), '>f8', False)
    """
    check_key(key)
    where = resolve(path, storage_options)
    return where.source.header(where.path, key)


def _on_distributed_worker() -> bool:
    worker = sys.modules.get("distributed.worker")
    if worker is None:
        return False
    try:
        worker.get_worker()
    except ValueError:
        return False
    return True


def choose_backend(
    name: str,
    f: OpenedFile,
    plan: ReadPlan,
    out: np.ndarray | None,
    source: Source = LOCAL,
    options: ReadOptions | None = None,
) -> backends.Backend:
    """Resolve ``"auto"``: a mapping for whole contiguous regions, and for strided ones the model prices lowest.

    Mapping needs a source that can map (:attr:`Source.mappable
    <npydask.storage.base.Source.mappable>`) and a file on a local file
    system. A whole contiguous region is a zero-copy view (except on a
    distributed worker, which counts and may spill what it holds). A strided
    region (several runs) is copied by the strategy
    :func:`npydask.plan.read_strategy.choose` prices lowest for it under
    ``options`` (the current settings when ``None``): ``"mapped"`` is the
    mmap backend's strided copy, ``"spans"`` and ``"runs"`` the pread
    backend's. Anything else that is copied anyway (one contiguous run into
    a caller's ``out`` or transposed from a Fortran file), files on network
    file systems and ``O_DIRECT`` reads use pread.
    """
    if f.deflated:
        return backends.get("deflate")  # a compressed .npz member: nothing else can read it
    if name != "auto":
        return backends.get(name)
    if not (source.mappable and f.local):
        return backends.get("pread")
    if out is None and plan.is_contiguous and same_layout(plan) and not _on_distributed_worker():
        return backends.get("mmap")
    if plan.n_runs > 1:
        options = options or read_options()
        if not options.direct_io:
            choice = choose(plan, options.gap_bytes, options.max_span_bytes, STRATEGIES, options.roi_strategy)
            if choice.strategy == "mapped":
                return backends.get("mmap")
    return backends.get("pread")


def _read(
    name: str, f: OpenedFile, plan: ReadPlan, options: ReadOptions, out: np.ndarray | None, source: Source = LOCAL
) -> np.ndarray:
    """Read with the backend ``name`` resolves to, then check the file did not change meanwhile.

    ``"auto"`` falls back to pread where mapping fails. The check is one
    ``fstat`` once the bytes are in (for a zero-copy view: once it is made;
    a view shows later writes, the documented window). A read of a whole
    stored ``.npz`` member then checks the member's CRC-32 over what it read
    (the deflate backend checks deflated members itself).

    Raises
    ------
    FileChangedError
        If the file's identity changed while it was read.
    NpzCrcError
        If a whole stored member's bytes do not match its CRC-32.
    MemoryError
        If no buffer could be had for the region, naming the file and the bytes.
    """
    backend = choose_backend(name, f, plan, out, source, options)
    try:
        try:
            result = backend.read(f, plan, options, out, source=source)
        except MapError:
            if name != "auto" or (options.roi_strategy == "mapped" and plan.n_runs > 1):
                raise
            result = backends.get("pread").read(f, plan, options, out, source=source)
    except MemoryError as e:
        raise MemoryError(f"{f.path}: {e}; it was reading a region of {_mib(plan.nbytes)} (shape {plan.shape})") from e
    f.check_unchanged()
    member = f.member
    if member is not None and member.stored and plan.nbytes == f.header.nbytes:
        check_stored(f.read_at, member, f.path, result, f.header.fortran_order)
    return result


def _mib(nbytes: int) -> str:
    return f"{nbytes} bytes ({nbytes / (1 << 20):.1f} MiB)"


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, found {backend!r}")


def _check_out(out: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, path: str) -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{path}: out must be a numpy.ndarray, found {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(
            f"{path}: out must be a writeable C-contiguous array of shape {shape} and dtype {dtype.str}, "
            f"found shape {out.shape}, dtype {out.dtype.str}, "
            f"{'C-contiguous' if out.flags.c_contiguous else 'not C-contiguous'}"
        )


@suggest_keywords
def read_region(
    path: str | os.PathLike[str],
    start: Sequence[int] | None = None,
    stop: Sequence[int] | None = None,
    *,
    key: str | None = None,
    out: np.ndarray | None = None,
    backend: str = "pread",
    storage_options: dict[str, Any] | None = None,
) -> np.ndarray:
    """Read the box ``[start, stop)`` of an ``.npy`` file, touching only its bytes.

    Equals ``numpy.load(path)[tuple(slice(a, b) for a, b in zip(start, stop))]``
    in values, dtype and shape, and is C-contiguous, for C- and
    Fortran-ordered files.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    start, stop : sequence of int, optional
        Corners of the box in logical (C-order) coordinates. ``None`` is the
        whole range; a shorter sequence covers the leading axes. Must satisfy
        ``0 <= start <= stop <= shape``.
    key : str, optional
        Member name inside an ``.npz`` archive.
    out : numpy.ndarray, optional
        A writeable C-contiguous array of the region's shape and dtype to
        fill; it is returned.
    backend : {"pread", "mmap", "auto"}
        How to read. The default returns a fresh, writeable array; ``"auto"``
        may return a read-only zero-copy view of a mapping for a contiguous
        region. Object URLs are read by range requests (``"pread"`` or
        ``"auto"``; ``"mmap"`` is refused).
    storage_options : dict, optional
        For URLs: obstore's store and client options.

    Raises
    ------
    RoiError
        If the box does not fit the array.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(p, np.asfortranarray(np.arange(20).reshape(4, 5)))
    >>> npydask.read_region(p, (1, 2), (3, 4))
    array([[ 7,  8],
           [12, 13]])
    """
    check_key(key)
    _check_backend(backend)
    where = resolve(path, storage_options)
    path, source = where.path, where.source
    check_backend_for(backend, source, path)
    f = source.open(path, key=key)
    box = normalize_box(f.header.shape, start, stop, source=f.path)
    if out is not None:
        _check_out(out, box.shape, f.header.dtype, f.path)
    plan = plan_read(f.header, box)
    return _read(backend, f, plan, read_options(gap_bytes=source.gap_bytes), out, source)


def check_backend_for(backend: str, source: Source, path: str) -> None:
    """Refuse ``backend="mmap"`` for a source whose files cannot be mapped (object stores)."""
    if backend == "mmap" and not source.mappable:
        raise ValueError(
            f"{source.display(path)}: backend='mmap' maps local files only; objects are read by range requests "
            "(use backend='auto' or 'pread')"
        )


class FileRef(NamedTuple):
    """A file as a lazy task sees it: path, identity, header, read settings and the source it is read from.

    No open file, no mapping, no data: it pickles in a few hundred bytes and
    reopens the file where it is unpickled. The identity is opaque (the
    source's: size, mtime and inode for a local file); the source is one
    object shared by every file of a dataset (:data:`~npydask.storage.local.LOCAL`
    for local files, pickled by reference). (An immutable named tuple: a
    dataset makes one per file, and a frozen dataclass costs five times as
    much to build.)
    """

    path: str
    identity: Identity
    header: NpyHeader
    options: ReadOptions
    backend: str = "auto"
    key: str | None = None
    compressed: bool = False
    check: HeaderCheck | None = None
    """The header bytes the reads rely on (checked against the file where it is read)."""
    source: Source = LOCAL
    """Where the bytes come from (shared by a dataset's files)."""

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        backend: str = "auto",
        options: ReadOptions | None = None,
        key: str | None = None,
        source: Source = LOCAL,
    ) -> FileRef:
        """Open ``path`` (or its ``.npz`` member ``key``) now, parse and check its header, remember its identity.

        A relative ``path`` is made absolute here (:func:`npydask.storage.paths.absolute`):
        the tasks that carry this reference may run in another working directory.
        """
        name = absolute(fspath(path)) if source is LOCAL else fspath(path)
        _check_backend(backend)
        check_backend_for(backend, source, name)
        check_key(key)
        f = source.open(name, key=key)
        check = HeaderCheck(f.raw, "the header read when the array was opened", "call from_npy again", True)
        options = options or read_options(gap_bytes=source.gap_bytes)
        return cls(name, f.identity, f.header, options, backend, key, f.deflated, check, source)

    @property
    def token(self) -> str:
        """A deterministic hash of everything that decides what the file reads as."""
        return hashlib.blake2b(self.facts().encode("utf8", "surrogateescape"), digest_size=16).hexdigest()

    def facts(self) -> str:
        """The text the token hashes: path, identity, header, settings, backend, key."""
        i = self.identity
        shared = shared_facts(self.header, self.options, self.backend, self.key)
        if self.source is LOCAL:
            if type(i) is not FileIdentity:  # (headers="first": the inode alone)
                return f"{self.path!r}|{i.facts()}|{shared}"
            return f"{self.path!r}|{i.size}|{i.mtime_ns}|{i.ino}|{shared}"
        # (an object: its store's public part only, never storage_options' credentials)
        return f"{self.source.spec.public()}|{self.source.display(self.path)!r}|{i.facts()}|{shared}"  # type: ignore[attr-defined]

    def verify(self) -> None:
        """Check the file is the one this reference stands for, reading none of its payload.

        What a read checks before it reads: the identity, and the header
        bytes against :attr:`check` (one header request for an object whose
        header came from elsewhere). For a region that lies wholly outside
        the file (a ``"pad"`` ROI), whose values come from the header's
        shape alone: a header from the first file or an index must still be
        this file's.

        Raises
        ------
        FileChangedError
            If the file is no longer the one that was opened.
        NpyFormatError
            If the file's header bytes are not the ones in :attr:`check`, or
            it is shorter than its header promises.
        """
        self.source.open(self.path, self.identity, key=self.key, check=self.check)

    def read(self, box: Box, out: np.ndarray | None = None) -> np.ndarray:
        """Read ``box``, failing if the file is no longer the one that was opened.

        Raises
        ------
        RoiError
            If ``box`` does not fit the array.
        FileChangedError
            If the file's size, mtime or inode changed since :meth:`open`, or while it was read.
        NpyFormatError
            If the file's header bytes are not the ones in :attr:`check`.
        """
        box = normalize_box(self.header.shape, box.start, box.stop, source=self.path)
        if out is not None:
            _check_out(out, box.shape, self.header.dtype, self.path)
        f = self.source.open(self.path, self.identity, key=self.key, check=self.check)
        plan = plan_read(f.header, box)
        return _read(self.backend, f, plan, self.options, out, self.source)


@functools.lru_cache(maxsize=1024)
def shared_facts(header: NpyHeader, options: ReadOptions, backend: str, key: str | None) -> str:
    """What many files of a dataset share, rendered once (headers are memoised objects)."""
    h = header
    facts = (h.version, h.shape, h.dtype.str, h.dtype.descr, h.fortran_order, h.data_offset)
    return f"{facts!r}|{dataclasses.astuple(options)!r}|{backend}|{key!r}"
