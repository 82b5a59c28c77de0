"""Columnar per-file facts: a dataset's files as a few numpy columns, not an object per file.

A :class:`FileTable` holds what a dataset knows about each of its files
(path, identity, header, ROI) in columns, so a million files cost a few
tens of MB held and pickled, and no per-file objects the cyclic garbage
collector would walk:

================  ==========================================================  ===========
column            type                                                        B/file
================  ==========================================================  ===========
``root``          one ``str``, the longest common prefix ending at ``/``      0
``names``         one ``bytes`` buffer: the rest of each path, UTF-8 with     ~18 (bench)
                  ``surrogateescape`` (``os.fsencode`` on POSIX: non-UTF-8
                  file names round-trip)
``ends``          int64 end offset of each name in ``names``                  8
identity, local   ``size``, ``mtime_ns`` int64, ``ino`` uint64 (a size of     24
                  -1: ``headers="first"``, ``mtime_ns`` then holding when
                  the listing began, not hashed by :meth:`token`)
identity, object  ``size`` int64 + ``etag``/``modified`` :class:`Strings`     8 + text
``header_id``     int32 into :attr:`FileTable.headers`, distinct              4 (0 with
                  ``(NpyHeader, HeaderCheck | None)``; ``None``: all 0        one header)
``roi_id``        int32 into :attr:`FileTable.rois`, distinct                 4 (0 with one
                  ``FileRoi | None``; ``None``: all rows share ``rois[0]``    shared ROI)
``deflated``      bool (compressed ``.npz`` members); ``None``: none are      0 or 1
================  ==========================================================  ===========

``path(i)`` is ``root + name``, exactly the string the table was built from
(an absolute local path as ``ds.files`` gives it, or an object URL).
Slices ``t[a:b]`` are O(1) views sharing the buffers; :meth:`FileTable.take`
gathers (names re-packed); pickling compacts (a slice ships only its own
names, ends rebased, and only the headers and ROIs it uses, renumbered in
order of first use) and carries nothing but str, bytes, numpy arrays and
npydask's own frozen types. :meth:`FileTable.token` hashes that compact
form, so a slice, its pickle and a table built from the same lists agree.

:class:`npydask.dataset.views.FileViews` is the read-only sequence of
:class:`~npydask.array.NpyFileArray` views over a table, made on demand.

With one header and local identities the table holds about 50 bytes a
file: names (about 18 for the scale benchmark's ``dNNNN/sNNNNNNN.npy``) +
ends (8) + size, mtime_ns, ino (24), within the goals of 200 B/file held
and 100 B/file sent (figures on the performance page).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from npydask.dataset._strings import ENCODING, Strings, encode, gather, pack, starts_of, unpack
from npydask.format.header import NpyHeader
from npydask.plan.roi import FileRoi
from npydask.storage import FileIdentity, HeaderCheck, InodeIdentity
from npydask.storage.object import ObjectIdentity
from npydask.storage.urls import redact

__all__ = ["FileTable", "Layout", "Strings", "TableBuilder", "common_root"]

Entry = tuple[NpyHeader, "HeaderCheck | None"]


def _frozen(values: Any, dtype: Any, what: str, n: int | None = None) -> np.ndarray:
    """``values`` as a read-only 1-D array of ``dtype`` (a copy: the caller's accumulator stays its own)."""
    try:
        arr = np.array(values, dtype=dtype, copy=True)
    except (OverflowError, ValueError, TypeError) as e:
        raise ValueError(f"the {what} column must hold {np.dtype(dtype).name} values: {e}") from e
    if arr.ndim != 1:
        raise ValueError(f"the {what} column must be one-dimensional, found shape {arr.shape}")
    if n is not None and len(arr) != n:
        raise ValueError(f"the {what} column has {len(arr)} rows but the table has {n} names: lengths must agree")
    arr.flags.writeable = False
    return arr


def _check_ids(ids: np.ndarray | None, count: int, what: str) -> None:
    if ids is not None and len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= count):
        bad = int(ids[(ids < 0) | (ids >= count)][0])
        raise ValueError(
            f"{what} {bad} is out of range: the table has {count} {what.split('_')[0]} entries (ids 0..{count - 1})"
        )


def common_root(paths: Sequence[str]) -> str:
    """The longest common prefix of ``paths`` that ends with ``/`` (``""`` when none does).

    Examples
    --------
    >>> common_root(["/data/a/x.npy", "/data/b/y.npy"]), common_root(["s3://b/p/1.npy"]), common_root([])
    ('/data/', 's3://b/p/', '')
    """
    if not paths:
        return ""
    prefix = os.path.commonprefix([min(paths), max(paths)])
    return prefix[: prefix.rfind("/") + 1]


class Layout(NamedTuple):
    """Rows' output shapes, bytes and file order (:meth:`FileTable.layout`)."""

    shapes: tuple[tuple[int, ...], ...]
    """The distinct output shapes, sorted."""
    shape_id: np.ndarray
    """int32 per row: its shape's index in :attr:`shapes` (one shape: all rows can stack)."""
    nbytes: np.ndarray
    """int64 per row: output bytes after the ROI."""
    fortran: np.ndarray
    """bool per row: whether the file is in Fortran order."""


class FileTable:
    """Per-file facts as columns (see the module docs); immutable, O(1) to slice, compact to pickle.

    Build with :meth:`from_lists` (what the open path produces today) or
    :meth:`from_columns` / :class:`TableBuilder` (accumulators); the
    constructor takes the columns of :meth:`from_columns` after validation.

    Examples
    --------
    >>> from npydask.storage import FileIdentity
    >>> h = NpyHeader((1, 0), (3,), np.dtype("<f4"), False, 128, 12)
    >>> t = FileTable.from_lists(["/d/a.npy", "/d/b.npy"], [FileIdentity(140, 7, 1), FileIdentity(140, 8, 2)], [h, h])
    >>> len(t), t.root, t.path(1), t.identity(1), t[1:].paths()
    (2, '/d/', '/d/b.npy', FileIdentity(size=140, mtime_ns=8, ino=2), ['/d/b.npy'])
    """

    __slots__ = (
        "_base",
        "deflated",
        "ends",
        "etag",
        "header_id",
        "headers",
        "ino",
        "modified",
        "mtime_ns",
        "names",
        "roi_id",
        "rois",
        "root",
        "size",
    )

    root: str
    names: bytes
    ends: np.ndarray
    size: np.ndarray
    mtime_ns: np.ndarray | None
    ino: np.ndarray | None
    etag: Strings | None
    modified: Strings | None
    headers: tuple[Entry, ...]
    header_id: np.ndarray | None
    rois: tuple[FileRoi | None, ...]
    roi_id: np.ndarray | None
    deflated: np.ndarray | None
    _base: int

    def __init__(self, **columns: Any) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, columns.pop(name))
        if columns:
            raise TypeError(f"FileTable has no column(s) {sorted(columns)}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"FileTable is immutable: cannot set {name!r}; slice, take or build a new one")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"FileTable is immutable: cannot delete {name!r}")

    @classmethod
    def from_columns(
        cls,
        root: str,
        names: bytes | bytearray,
        ends: Any,
        *,
        size: Any,
        mtime_ns: Any = None,
        ino: Any = None,
        etag: Strings | None = None,
        modified: Strings | None = None,
        headers: Sequence[Entry] = (),
        header_id: Any = None,
        rois: Sequence[FileRoi | None] = (None,),
        roi_id: Any = None,
        deflated: Any = None,
    ) -> FileTable:
        """A table from columns (``array('q')``, lists or arrays: copied), validated.

        Local identities take ``mtime_ns`` and ``ino``; object identities
        ``etag`` (and optionally ``modified``).

        Raises
        ------
        ValueError
            Columns of different lengths, ends that decrease or do not end at
            ``len(names)``, ids out of range, a mix of local and object identity
            columns, an empty header table for a non-empty table.
        """
        if not isinstance(root, str):
            raise ValueError(f"root must be a str (a folder ending with '/' or a store prefix), found {root!r}")
        names = bytes(names)
        ends = _frozen(ends, np.int64, "ends")
        n = len(ends)
        if n and (int(ends[0]) < 0 or bool((np.diff(ends) < 0).any()) or int(ends[-1]) != len(names)):
            raise ValueError(
                f"ends must rise from 0 to len(names) = {len(names)}, found {ends[:3].tolist()}.."
                f"{ends[-1:].tolist()}: each is the end offset of one name in the names buffer"
            )
        if not n and names:
            raise ValueError(f"a table with no ends has no names, found {len(names)} bytes of names")
        local = mtime_ns is not None or ino is not None
        if local == (etag is not None):
            raise ValueError(
                "give either local identity columns (mtime_ns and ino) or object ones (etag), "
                f"found mtime_ns={mtime_ns is not None}, ino={ino is not None}, etag={etag is not None}"
            )
        if local and (mtime_ns is None or ino is None):
            raise ValueError("local identities need both mtime_ns and ino columns (-1 for an unknown mtime)")
        for what, strings in (("etag", etag), ("modified", modified)):
            if strings is not None and (
                len(strings.ends) != n
                or int(strings.base) != 0
                or int(strings.ends[-1] if n else 0) != len(strings.data)
                or (strings.missing is not None and len(strings.missing) != n)
            ):
                raise ValueError(
                    f"the {what} column has {len(strings.ends)} rows but the table has {n} names: lengths must agree"
                )
        etag, modified = (
            None
            if v is None
            else Strings(
                bytes(v.data),
                _frozen(v.ends, np.int64, "string ends"),
                None if v.missing is None else _frozen(v.missing, bool, "missing"),
                int(v.base),
            )
            for v in (etag, modified)
        )
        size = _frozen(size, np.int64, "size", n)
        if n and int(size.min()) < -1:
            raise ValueError(f"sizes are bytes, or -1 when unknown; found {int(size.min())}")
        return cls(
            root=root,
            names=names,
            ends=ends,
            size=size,
            mtime_ns=None if mtime_ns is None else _frozen(mtime_ns, np.int64, "mtime_ns", n),
            ino=None if ino is None else _frozen(ino, np.uint64, "ino", n),
            etag=etag,
            modified=modified,
            _base=0,
            **_entries(headers, header_id, rois, roi_id, deflated, n),
        )

    def with_entries(
        self,
        headers: Sequence[Entry],
        header_id: Any = None,
        rois: Sequence[FileRoi | None] = (None,),
        roi_id: Any = None,
        deflated: Any = None,
    ) -> FileTable:
        """The same files (names and identity columns shared, not copied) with other headers, ROIs and flags.

        For the members of a multi-key dataset: one archive's members share
        its path and identity, each has its own header (and ROI).

        Raises
        ------
        ValueError
            As :meth:`from_columns`, for the columns given here.
        """
        columns = {name: getattr(self, name) for name in self.__slots__}
        columns.update(_entries(headers, header_id, rois, roi_id, deflated, len(self)))
        return FileTable(**columns)

    @classmethod
    def from_lists(
        cls,
        paths: Sequence[str],
        identities: Sequence[FileIdentity] | Sequence[ObjectIdentity],
        headers: Sequence[NpyHeader],
        checks: Sequence[HeaderCheck | None] | None = None,
        rois: Sequence[FileRoi | None] | FileRoi | None = None,
        *,
        deflated: Sequence[bool] | None = None,
        root: str | None = None,
    ) -> FileTable:
        """A table from per-file lists, as the open path has them today.

        ``rois`` is one list per file, or one :class:`FileRoi` (or ``None``)
        shared by all. Distinct header/check and ROI objects become the
        entry tables (by identity: equal headers are one memoised object).
        ``root`` defaults to :func:`common_root`.

        Raises
        ------
        ValueError
            Lists of different lengths, identities of mixed kinds, a root that
            does not prefix every path, a path that cannot be encoded.
        """
        n = len(paths)
        for what, values in (
            ("identities", identities),
            ("headers", headers),
            ("checks", checks),
            ("rois", None if rois is None or isinstance(rois, FileRoi) else rois),
            ("deflated", deflated),
        ):
            if values is not None and len(values) != n:
                raise ValueError(f"{what} has {len(values)} entries but there are {n} paths: one per path")
        checks_ = [None] * n if checks is None else checks
        entries, ids = _distinct(list(zip(map(id, headers), map(id, checks_))), zip(headers, checks_))
        if rois is None or isinstance(rois, FileRoi):
            roi_table, roi_id = [rois], None
        else:
            roi_table, roi_id = _distinct(list(map(id, rois)), rois)
        return cls.from_rows(paths, identities, entries, ids, roi_table, roi_id, deflated=deflated, root=root)

    @classmethod
    def from_rows(
        cls,
        paths: Sequence[str],
        identities: Sequence[Any],
        headers: Sequence[Entry],
        header_id: Any = None,
        rois: Sequence[FileRoi | None] = (None,),
        roi_id: Any = None,
        *,
        deflated: Sequence[bool] | Sequence[int] | None = None,
        root: str | None = None,
    ) -> FileTable:
        """A table from paths and identities (one per row) and the entry columns (as :meth:`from_columns`).

        What the open path builds: it numbers distinct headers and ROIs as it
        scans, so no per-file header list is made. Identities are all
        ``FileIdentity``, all ``InodeIdentity`` (stored as size and mtime -1)
        or all ``ObjectIdentity``.

        Raises
        ------
        ValueError
            As :meth:`from_lists`.
        """
        n = len(paths)
        if len(identities) != n:
            raise ValueError(f"identities has {len(identities)} entries but there are {n} paths: one per path")
        if root is None:
            root = common_root(paths)  # (a prefix of every path by construction)
        elif not all(map(str.startswith, paths, repeat(root))):
            bad = next(p for p in paths if not p.startswith(root))
            raise ValueError(f"the root {root!r} does not prefix the path {bad!r}: give a root every path starts with")
        cut = len(root)
        names, ends = pack([p[cut:] for p in paths], "the path")
        kinds = set(map(type, identities))
        if len(kinds) > 1 or (kinds and kinds.pop() not in (FileIdentity, InodeIdentity, ObjectIdentity)):
            raise ValueError(
                f"identities must all be FileIdentity, all InodeIdentity or all ObjectIdentity, found "
                f"{sorted(k.__name__ for k in {type(i) for i in identities})}"
            )
        columns: dict[str, Any] = {}
        field = (
            []
            if n and type(identities[0]) is InodeIdentity
            else [list(map(itemgetter(k), identities)) for k in range(3)]
        )  # (not zip(*rows): slower)
        if not field:  # (headers="first": the listing's inode, size unknown, mtime_ns holding when it was listed)
            columns.update(
                size=np.full(n, -1, np.int64),
                mtime_ns=list(map(itemgetter(1), identities)),
                ino=list(map(itemgetter(0), identities)),
            )
        elif n and isinstance(identities[0], ObjectIdentity):
            columns.update(size=field[0], etag=Strings.of(field[1], "the ETag"))
            if any(m is not None for m in field[2]):
                columns["modified"] = Strings.of(field[2], "the Last-Modified value")
        else:
            columns.update(size=field[0], mtime_ns=field[1], ino=field[2])
        return cls.from_columns(
            root,
            names,
            ends,
            headers=headers,
            header_id=header_id,
            rois=rois,
            roi_id=roi_id,
            deflated=deflated if deflated is not None and any(deflated) else None,
            **columns,
        )

    # -- rows ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ends)

    def _index(self, i: Any) -> int:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TypeError(f"table rows are indexed by integers, found {i!r}")
        n = len(self.ends)
        k = i.__index__()
        if not -n <= k < n:
            raise IndexError(f"row {k} is out of range for a table of {n} files")
        return k % n

    def _starts(self) -> np.ndarray:
        return starts_of(self.ends, self._base)

    def path(self, i: int) -> str:
        """Row ``i``'s path: ``root`` + its name."""
        i = self._index(i)
        a = self._base if i == 0 else int(self.ends[i - 1])
        return self.root + self.names[a : int(self.ends[i])].decode(*ENCODING)

    def paths(self) -> list[str]:
        """Every row's path (O(n): a list of new strings)."""
        root = self.root
        return [root + name for name in unpack(self.names, self._starts(), self.ends)]

    def identity(self, i: int) -> FileIdentity | InodeIdentity | ObjectIdentity:
        """Row ``i``'s identity, as the readers expect it.

        A local row of unknown size (-1: ``headers="first"`` over a listing)
        is an :class:`~npydask.storage.identity.InodeIdentity`, its
        ``mtime_ns`` column holding when the listing began (or -1), which
        the readers compare by inode and status change time.
        """
        i = self._index(i)
        if self.etag is None:
            size, mtime, ino = int(self.size[i]), int(self.mtime_ns[i]), int(self.ino[i])  # type: ignore[index]
            return InodeIdentity(ino, mtime) if size == -1 else FileIdentity(size, mtime, ino)
        return self._objects(i, i + 1)[0]

    def identities(self, a: int = 0, b: int | None = None) -> list[Any]:
        """The identities of rows ``a..b``, made in one pass (as :meth:`identity` gives them)."""
        b = len(self) if b is None else b
        if self.etag is None:
            size, mtime, ino = self.size[a:b], self.mtime_ns[a:b], self.ino[a:b]  # type: ignore[index]
            inode_only = size == -1
            if not inode_only.any():
                return list(map(FileIdentity, size.tolist(), mtime.tolist(), ino.tolist()))
            if inode_only.all():
                return list(map(InodeIdentity, ino.tolist(), mtime.tolist()))
            return [
                InodeIdentity(k, m) if only else FileIdentity(s, m, k)
                for s, m, k, only in zip(size.tolist(), mtime.tolist(), ino.tolist(), inode_only.tolist())
            ]
        return self._objects(a, b)

    def _objects(self, a: int, b: int) -> list[ObjectIdentity]:
        etags = self.etag.values(a, b)  # type: ignore[union-attr]
        modified = [None] * (b - a) if self.modified is None else self.modified.values(a, b)
        return list(map(ObjectIdentity, self.size[a:b].tolist(), etags, modified))

    def header_ids(self) -> np.ndarray:
        """Each row's index into :attr:`headers` (zeros when the table has one)."""
        return np.zeros(len(self), np.int32) if self.header_id is None else self.header_id

    def roi_ids(self) -> np.ndarray:
        """Each row's index into :attr:`rois` (zeros when all rows share one)."""
        return np.zeros(len(self), np.int32) if self.roi_id is None else self.roi_id

    def header(self, i: int) -> NpyHeader:
        """Row ``i``'s header."""
        return self.headers[0 if self.header_id is None else int(self.header_id[self._index(i)])][0]

    def check(self, i: int) -> HeaderCheck | None:
        """The header bytes row ``i``'s reads rely on."""
        return self.headers[0 if self.header_id is None else int(self.header_id[self._index(i)])][1]

    def roi(self, i: int) -> FileRoi | None:
        """Row ``i``'s ROI (``None``: the whole file)."""
        return self.rois[0 if self.roi_id is None else int(self.roi_id[self._index(i)])]

    def is_deflated(self, i: int) -> bool:
        """Whether row ``i`` is a compressed ``.npz`` member."""
        return False if self.deflated is None else bool(self.deflated[self._index(i)])

    def layout(self) -> Layout:
        """Each row's output shape (after its ROI), bytes and file order, computed per distinct (header, ROI).

        What stacking plans from (:func:`~npydask.dataset.views.view_layout` for views), without a
        loop over rows: a table of one header and one shared ROI costs O(1)
        Python work.
        """
        n = len(self)
        if self.header_id is None and self.roi_id is None:
            pair = np.zeros(n, np.int64)
            pairs = [(0, 0)] if n else []
        else:
            key = self.header_ids().astype(np.int64) * len(self.rois) + self.roi_ids()
            used, inverse = np.unique(key, return_inverse=True)
            pair = inverse.reshape(-1).astype(np.int64)
            pairs = [divmod(int(k), len(self.rois)) for k in used]
        shapes, nbytes, fortran = [], [], []
        for h, r in pairs:
            header, roi = self.headers[h][0], self.rois[r]
            shape = header.shape if roi is None else roi.shape
            shapes.append(shape)
            nbytes.append(header.nbytes if roi is None else math.prod(shape) * header.dtype.itemsize)
            fortran.append(header.fortran_order)
        distinct = sorted(set(shapes))
        shape_of = np.array([distinct.index(s) for s in shapes], np.int32)
        return Layout(
            tuple(distinct),
            shape_of[pair] if pairs else np.zeros(0, np.int32),
            np.array(nbytes, np.int64)[pair] if pairs else np.zeros(0, np.int64),
            np.array(fortran, bool)[pair] if pairs else np.zeros(0, bool),
        )

    def rows(self, a: int = 0, b: int | None = None) -> Iterator[tuple[str, Any, int, int]]:
        """``(path, identity, header id, ROI id)`` of rows ``a..b``, made from ``tolist()`` batches.

        For a read loop: look up what depends only on the header and ROI (a
        plan, an offset, the :class:`HeaderCheck`) per id, once.
        """
        b = len(self) if b is None else b
        step = 4096
        for lo in range(a, b, step):
            hi = min(b, lo + step)
            part = self[lo:hi]
            yield from zip(part.paths(), part.identities(), part.header_ids().tolist(), part.roi_ids().tolist())

    def items(self, offsets: Sequence[int], a: int = 0, b: int | None = None) -> list[tuple[str, Any, int, Any]]:
        """``(path, identity, offset, check)`` of rows ``a..b`` (``storage._batch.read_files`` items).

        ``offsets[k]`` is where the read of a file with header entry ``k`` starts.
        """
        checks = [c for _, c in self.headers]
        return [(p, ident, offsets[h], checks[h]) for p, ident, h, _ in self.rows(a, b)]

    # -- selections ----------------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> FileTable:
        if not isinstance(index, slice):
            raise TypeError(
                f"a FileTable is sliced (t[a:b]) or gathered (t.take(idx)), found t[{index!r}]: "
                "use t.path(i), t.identity(i), t.header(i) for one row"
            )
        a, b, step = index.indices(len(self))
        if step != 1:
            return self.take(np.arange(a, b, step))
        b = max(a, b)
        base = self._base if a == 0 else int(self.ends[a - 1])

        def cut(col: np.ndarray | None) -> np.ndarray | None:
            return None if col is None else col[a:b]

        return FileTable(
            root=self.root,
            names=self.names,
            ends=self.ends[a:b],
            size=self.size[a:b],
            mtime_ns=cut(self.mtime_ns),
            ino=cut(self.ino),
            etag=None if self.etag is None else self.etag[a:b],
            modified=None if self.modified is None else self.modified[a:b],
            headers=self.headers,
            header_id=cut(self.header_id),
            rois=self.rois,
            roi_id=cut(self.roi_id),
            deflated=cut(self.deflated),
            _base=base,
        )

    def take(self, idx: Any) -> FileTable:
        """Rows ``idx`` (negative counts from the end; repeats allowed), names re-packed: O(rows + their bytes)."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(idx) and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise IndexError(f"row {int(idx[(idx < -n) | (idx >= n)][0])} is out of range for a table of {n} files")
        idx = idx % n if n else idx
        names, ends = gather(self.names, self._starts()[idx], self.ends[idx])
        return self._with(names, ends, idx)

    def _with(self, names: bytes, ends: np.ndarray, idx: np.ndarray | slice, root: str | None = None) -> FileTable:
        """A new validated table of ``names``/``ends`` and the other columns at ``idx``, entries compacted."""

        def pick(col: Any) -> Any:
            return (
                None
                if col is None
                else col[idx]
                if isinstance(col, np.ndarray)
                else col.take(np.arange(len(self))[idx])
            )

        headers, header_id = _compact(self.headers, pick(self.header_id), len(ends))
        rois, roi_id = _compact(self.rois, pick(self.roi_id), len(ends))
        deflated = pick(self.deflated)
        return FileTable.from_columns(
            self.root if root is None else root,
            names,
            ends,
            size=pick(self.size),
            mtime_ns=pick(self.mtime_ns),
            ino=pick(self.ino),
            etag=pick(self.etag),
            modified=pick(self.modified),
            headers=headers,
            header_id=header_id,
            rois=rois,
            roi_id=roi_id,
            deflated=None if deflated is None or not deflated.any() else deflated,
        )

    def map_paths(self, fn: Callable[[str], str]) -> FileTable:
        """The same rows with every path replaced by ``fn(path)`` (root recomputed; O(rows)).

        For hashing an object URL's public part only (``fn`` =
        :func:`npydask.storage.urls.redact`).
        """
        paths = list(map(fn, self.paths()))
        root = common_root(paths)
        cut = len(root)
        names, ends = pack([p[cut:] for p in paths], "the path")
        return self._with(names, ends, slice(None), root)

    def compact(self) -> FileTable:
        """This table holding only its own bytes and entries (what it pickles as)."""
        return self._with(
            self.names[self._base : int(self.ends[-1])] if len(self) else b"", self.ends - self._base, slice(None)
        )

    def __reduce__(self) -> tuple[Any, ...]:
        t = self.compact()
        return (
            _rebuild,
            (
                t.root,
                t.names,
                t.ends,
                t.size,
                t.mtime_ns,
                t.ino,
                t.etag,
                t.modified,
                t.headers,
                t.header_id,
                t.rois,
                t.roi_id,
                t.deflated,
            ),
        )

    def token(self) -> str:
        """A deterministic hash of every row's path, identity, header entry and ROI (of the compact form).

        Equal for a slice, its pickle and a table built from the same lists
        with the same ``root``; different when any path, identity, header,
        check or ROI differs (and when the root does: a table of one folder
        built with another root hashes differently, though its paths agree).
        """
        h = hashlib.blake2b(digest_size=16)
        if not len(self):
            h.update(b"npydask.FileTable: no rows")  # (whatever its root and identity kind)
            return h.hexdigest()
        t = self.compact()
        h.update(t.root.encode(*ENCODING) + b"\0")
        h.update(t.names)
        mtime_ns = t.mtime_ns
        if mtime_ns is not None and bool((t.size == -1).any()):  # (when a listing ran changes no data read)
            mtime_ns = np.where(t.size == -1, -1, mtime_ns)
        for col in (t.ends, t.size, mtime_ns, t.ino, t.header_id, t.roi_id, t.deflated):
            h.update(b"-" if col is None else np.ascontiguousarray(col).tobytes())
        for strings in (t.etag, t.modified):
            if strings is None or (strings.missing is not None and bool(strings.missing.all())):
                h.update(b"-")  # (a column of no values hashes as none: rows taken from a table that had some)
            else:
                strings.digest(h)
        heads = [
            (
                hd.version,
                hd.shape,
                hd.dtype.str,
                hd.dtype.descr,
                hd.fortran_order,
                hd.data_offset,
                None if c is None else tuple(c),
            )
            for hd, c in t.headers
        ]
        h.update(repr((heads, t.rois)).encode(*ENCODING))
        return h.hexdigest()

    def __dask_tokenize__(self) -> Any:
        return ("npydask.FileTable", self.token())

    def __repr__(self) -> str:
        shown = ""
        if len(self):
            shown = f": {redact(self.path(0))}" + (f" .. {redact(self.path(-1))}" if len(self) > 1 else "")
        return f"FileTable({len(self)} files, {len(self.headers)} header(s), {len(self.rois)} ROI(s){shown})"


def _entries(
    headers: Sequence[Entry], header_id: Any, rois: Sequence[FileRoi | None], roi_id: Any, deflated: Any, n: int
) -> dict[str, Any]:
    """The header, ROI and deflated columns of a table of ``n`` rows, validated (see :meth:`FileTable.from_columns`)."""
    headers = tuple(headers)
    if n and not headers:
        raise ValueError(f"a table of {n} files needs at least one header entry, found none")
    for entry in headers:
        if not (
            isinstance(entry, tuple)
            and len(entry) == 2
            and isinstance(entry[0], NpyHeader)
            and (entry[1] is None or isinstance(entry[1], HeaderCheck))
        ):
            raise ValueError(f"header entries are (NpyHeader, HeaderCheck or None) pairs, found {entry!r}")
    rois = tuple(rois) or (None,)
    for roi in rois:
        if roi is not None and not isinstance(roi, FileRoi):
            raise ValueError(f"ROI entries are FileRoi or None, found {roi!r}")
    header_id = None if header_id is None else _frozen(header_id, np.int32, "header_id", n)
    roi_id = None if roi_id is None else _frozen(roi_id, np.int32, "roi_id", n)
    _check_ids(header_id, len(headers), "header_id")
    _check_ids(roi_id, len(rois), "roi_id")
    return {
        "headers": headers,
        "header_id": header_id,
        "rois": rois,
        "roi_id": roi_id,
        "deflated": None if deflated is None else _frozen(deflated, bool, "deflated", n),
    }


def _compact(table: tuple[Any, ...], ids: np.ndarray | None, n: int) -> tuple[tuple[Any, ...], np.ndarray | None]:
    """Only the entries ``ids`` uses, renumbered in order of first use; ``None`` ids when one entry remains."""
    if ids is None or n == 0:
        return table[:1], None
    used, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(used), np.int32)
    rank[order] = np.arange(len(used), dtype=np.int32)
    entries = tuple(table[int(used[k])] for k in order)
    return entries, (None if len(entries) == 1 else rank[inverse.reshape(-1)])


def _distinct(keys: list[Any], objects: Iterable[Any]) -> tuple[list[Any], np.ndarray | None]:
    """The distinct objects (by ``keys``, in order of first appearance) and each row's index, ``None`` if one."""
    by_key = dict(zip(keys, objects))  # (equal keys are ids of the same live object)
    if len(by_key) <= 1:
        return list(by_key.values()), None
    number = {k: i for i, k in enumerate(by_key)}
    return list(by_key.values()), np.fromiter(map(number.__getitem__, keys), np.int32, len(keys))


def _rebuild(
    root: str,
    names: bytes,
    ends: np.ndarray,
    size: np.ndarray,
    mtime_ns: np.ndarray | None,
    ino: np.ndarray | None,
    etag: Strings | None,
    modified: Strings | None,
    headers: tuple[Entry, ...],
    header_id: np.ndarray | None,
    rois: tuple[FileRoi | None, ...],
    roi_id: np.ndarray | None,
    deflated: np.ndarray | None,
) -> FileTable:
    """Unpickle a :class:`FileTable` (validated as if built anew: a tampered pickle fails with ``ValueError``)."""
    return FileTable.from_columns(
        root,
        names,
        ends,
        size=size,
        mtime_ns=mtime_ns,
        ino=ino,
        etag=etag,
        modified=modified,
        headers=headers,
        header_id=header_id,
        rois=rois,
        roi_id=roi_id,
        deflated=deflated,
    )


class TableBuilder:
    """Accumulate a table row by row with C-level appends (``array('q')`` columns), then :meth:`build` it once.

    Examples
    --------
    >>> h = NpyHeader((1, 0), (3,), np.dtype("<f4"), False, 128, 12)
    >>> b = TableBuilder("/data/", [(h, None)])
    >>> b.add("a.npy", 140, 1, 10); b.add("b.npy", -1, -1, 11)
    >>> t = b.build(); t.paths(), t.identity(1)
    (['/data/a.npy', '/data/b.npy'], InodeIdentity(ino=11, listed_ns=-1))
    """

    def __init__(self, root: str, headers: Sequence[Entry]) -> None:
        from array import array

        self.root = root
        self.headers = list(headers)
        self.names = bytearray()
        self.ends, self.size, self.mtime_ns = array("q"), array("q"), array("q")
        self.ino, self.header_id = array("Q"), array("i")

    def add(self, name: str | bytes, size: int, mtime_ns: int, ino: int, header_id: int = 0) -> None:
        """One local file: its name relative to the root (``str`` or the listing's ``bytes``) and facts."""
        self.names += name if isinstance(name, bytes) else encode(name, "the name")
        self.ends.append(len(self.names))
        self.size.append(size)
        self.mtime_ns.append(mtime_ns)
        self.ino.append(ino)
        self.header_id.append(header_id)

    def build(self, rois: Sequence[FileRoi | None] = (None,), roi_id: Any = None) -> FileTable:
        """The table (validated; the accumulators are copied, so the builder may go on)."""
        ids = np.frombuffer(self.header_id, np.int32) if len(self.header_id) else None
        one = ids is None or not ids.any()
        return FileTable.from_columns(
            self.root,
            self.names,
            self.ends,
            size=self.size,
            mtime_ns=self.mtime_ns,
            ino=self.ino,
            headers=self.headers,
            header_id=None if one else ids,
            rois=rois,
            roi_id=roi_id,
        )
