"""A persistent header index for big folders and prefixes: JSON, never pickle, written atomically.

Opening a dataset of many files costs one open, pread and close per file
(one range GET per object in object storage). An index remembers, per file,
its identity (a local file's size, mtime and inode; an object's size and
ETag) and which header it has; while a file keeps that identity its header
is taken from the index. Header texts are stored once however many files
share them, and each is parsed strictly from its stored bytes when the index
is loaded (the index is data, never trusted code). Files that changed or are
new are scanned and their entries refreshed; entries of files that failed to
scan are dropped, and so are those of local files no longer on disk.

What checking an entry costs:

* a local file: one ``stat``;
* objects listed from a prefix (``file_root="s3://bucket/prefix"``):
  nothing more than the LIST pages, whose entries carry each object's size
  and ETag, so reusing an index costs no request per object;
* objects named by ``files=`` or ``file_list=`` (no listing): one HEAD per
  object, ``remote_concurrency`` in flight.

Format (``version`` 4)::

    {"format": "npydask-header-index", "version": 4, "kind": "files" or "objects",
     "headers": ["<preamble and header bytes as latin-1 text>", ...],
     "names": ["<path relative to the index's folder, or URL relative to root>", ...],
     "table": "<base64: one little-endian row per name of
               int64 size, int64 mtime_ns, uint64 inode, int64 header_number>",
     # "objects" only:
     "root": "<URL prefix of every name, e.g. s3://bucket/scans/>",
     "etags": ["<ETag>" or null, ...],
     "modified": ["<Last-Modified, ISO 8601, where there is no ETag>" or null, ...]}

An index of objects leaves ``mtime_ns`` and ``inode`` 0; its identity
column is ``etags`` (``modified`` only where a server sends no ETag). Names
of objects are their URLs without query strings (presigned URLs carry
credentials; they never enter the index). The numbers are one binary table
rather than JSON lists, which parse many times slower (figures on the
performance page).

Version 3 indexes (local files only, the same columns) are read as they are;
older ones are replaced silently. A missing index is built; an unreadable or
malformed one is rebuilt with a warning; a path that is not a regular file
(a FIFO, socket, device or folder) is refused at once with an ``OSError``
naming it, without blocking. An index of local files given for a dataset of
objects (or the other way round) is refused with a ``ValueError``: one index
serves one kind, so neither is overwritten by the other.

The index file itself may be local (written to a temporary file in the same
folder and renamed over the old one, so readers never see half a file) or a
URL (read with one GET, written with one PUT, which object stores publish
whole; ``storage_options`` reach it as they reach the data). An index URL
for a dataset of local files is refused: keep it beside them.
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import os
import stat
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from npydask.dataset.table import common_root
from npydask.errors import NpyDaskWarning, NpyFormatError
from npydask.format.header import NpyHeader, parse_header
from npydask.storage import FileIdentity
from npydask.storage.base import Identity, Source
from npydask.storage.urls import is_url, redact
from npydask.storage.where import StoragePath, resolve

if TYPE_CHECKING:
    from npydask.storage.object import ObjectIdentity

__all__ = ["FORMAT", "VERSION", "Index", "load_index", "scan_with_index", "write_index"]

FORMAT = "npydask-header-index"
VERSION = 4
_READ_AS_IS = 3
"""The oldest version read as it is (version 3 held local files in the same columns)."""
FILES, OBJECTS = "files", "objects"

_ROW = np.dtype([("size", "<i8"), ("mtime_ns", "<i8"), ("ino", "<u8"), ("header", "<i8")])

Scan = Callable[[Sequence[str]], list[Any]]


class Index(NamedTuple):
    """A loaded index: per name a row of columns, and the header texts.

    ``rows[name]`` is a position in ``sizes``, ``mtimes``, ``inodes`` and
    ``numbers`` (the header number), and in ``etags`` and ``modified`` for
    objects (both ``None`` in an index of local files); ``headers[n]`` is the
    parsed header of ``raws[n]``, or ``None`` where it is damaged (its files
    are then scanned). Names of objects are whole URLs here (the file stores
    them relative to a root). Columns of plain values rather than a tuple per
    file, which would cost a Python object per file to build.
    """

    rows: dict[str, int]
    sizes: list[int]
    mtimes: list[int]
    inodes: list[int]
    numbers: list[int]
    raws: list[bytes]
    headers: list[NpyHeader | None]
    etags: list[str | None] | None = None
    modified: list[str | None] | None = None

    @classmethod
    def empty(cls, kind: str = FILES) -> Index:
        """An index holding nothing, of local files or of objects."""
        if kind == OBJECTS:
            return cls({}, [], [], [], [], [], [], [], [])
        return cls({}, [], [], [], [], [], [])

    @property
    def kind(self) -> str:
        """``"files"`` or ``"objects"``."""
        return FILES if self.etags is None else OBJECTS

    def add(self, name: str, identity: Any, number: int) -> None:
        """Record ``name`` (new or refreshed) as a new row (``identity``: a ``FileIdentity`` or ``ObjectIdentity``)."""
        self.rows[name] = len(self.sizes)
        self.sizes.append(identity.size)
        self.numbers.append(number)
        if self.etags is None:
            self.mtimes.append(identity.mtime_ns)
            self.inodes.append(identity.ino)
            return
        self.mtimes.append(0)
        self.inodes.append(0)
        self.etags.append(identity.etag)
        self.modified.append(identity.modified)  # type: ignore[union-attr]


def _key(path: str, base: str) -> str:
    full = os.path.abspath(path)
    try:
        rel = os.path.relpath(full, base)
    except ValueError:
        return full
    return full if rel.startswith(os.pardir + os.sep) else rel


def _warn(index_path: str, why: str) -> None:
    warnings.warn(f"{redact(index_path)}: {why}; rebuilding it", NpyDaskWarning, stacklevel=4)


def load_index(index_path: str, kind: str = FILES, storage_options: dict[str, Any] | None = None) -> Index:
    """The entries of an index file (a path or URL); empty when it is missing or outdated, unusable ones warned about.

    Raises
    ------
    ValueError
        If the index holds the other ``kind`` (local files for objects, or objects for local files).
    OSError
        If ``index_path`` is a FIFO, socket, device or folder.
    """
    return _load(index_path, kind, storage_options)[0]


def _load(index_path: str, kind: str, storage_options: dict[str, Any] | None) -> tuple[Index, bool]:
    """The index and whether its file exists."""
    try:
        where = _where(index_path, storage_options)
        text = where.source.read_bytes(where.path, what="header index")
    except FileNotFoundError:
        return Index.empty(kind), False
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EISDIR) or not where.local:
            raise  # a FIFO, socket, device or folder, or a store that failed: refused at once, never replaced
        _warn(index_path, f"cannot read the header index ({e})")
        return Index.empty(kind), True
    try:
        data = json.loads(text)
    except ValueError as e:
        _warn(index_path, f"cannot read the header index ({e})")
        return Index.empty(kind), True
    try:
        return _parse(data, index_path, kind), True
    except (AttributeError, KeyError, TypeError, ValueError, UnicodeEncodeError, binascii.Error) as e:
        if isinstance(e, _WrongKind):
            raise ValueError(str(e)) from None
        _warn(index_path, f"not a usable npydask header index ({e})")
        return Index.empty(kind), True


class _WrongKind(ValueError):
    """An index of local files given for objects, or the other way round (refused, never rebuilt)."""


def _parse(data: Any, index_path: str, kind: str) -> Index:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"expected format {FORMAT!r}, found {found!r}")
    version = data.get("version")
    if type(version) is int and version < _READ_AS_IS:
        return Index.empty(kind)  # written by an older npydask: rebuilt in the current format
    if version not in (_READ_AS_IS, VERSION):
        raise ValueError(f"expected version {VERSION}, found {version!r}")
    found_kind = data.get("kind", FILES)
    if found_kind != kind:
        what = {FILES: "local files", OBJECTS: "objects (URLs)"}
        raise _WrongKind(
            f"{redact(index_path)}: this header index holds the headers of {what.get(found_kind, repr(found_kind))}, "
            f"but the dataset's files are {what[kind]}: give each kind of dataset an index of its own "
            "(another index= path)"
        )
    raws = [text.encode("latin1") for text in data["headers"]]
    headers = [_checked(raw, index_path) for raw in raws]
    names = data["names"]
    table = np.frombuffer(base64.b64decode(data["table"].encode("ascii"), validate=True), _ROW)
    if not isinstance(names, list) or len(names) != len(table) or not set(map(type, names)) <= {str}:
        raise ValueError(f"expected a name per table row, found {len(names)} names and {len(table)} rows")
    if len(table) and not (0 <= table["header"].min() and table["header"].max() < len(headers)):
        raise ValueError("a header number is out of range")
    sizes, mtimes, inodes, numbers = (table[field].tolist() for field in ("size", "mtime_ns", "ino", "header"))
    if kind == FILES:
        return Index(dict(zip(names, range(len(names)))), sizes, mtimes, inodes, numbers, raws, headers)
    root, etags, modified = data["root"], data["etags"], data["modified"]
    if not isinstance(root, str) or (names and not is_url(root)):
        raise ValueError(f"expected the URL prefix of the names as 'root', found {root!r}")
    for column, name in ((etags, "etags"), (modified, "modified")):
        if not isinstance(column, list) or len(column) != len(names) or not set(map(type, column)) <= {str, type(None)}:
            raise ValueError(f"expected a string or null per name in {name!r}")
    rows = {root + n: i for i, n in enumerate(names)}
    return Index(rows, sizes, mtimes, inodes, numbers, raws, headers, etags, modified)


def _checked(raw: bytes, index_path: str) -> NpyHeader | None:
    """The header in ``raw`` if it parses strictly and is exactly ``raw`` long, else ``None``."""
    try:
        header = parse_header(raw, source=f"{redact(index_path)} (an index entry)")
    except NpyFormatError:
        return None  # a damaged entry: its files are scanned themselves
    return header if header.data_offset == len(raw) else None


def write_index(index_path: str, index: Index, storage_options: dict[str, Any] | None = None) -> None:
    """Write ``index``, unused headers left out.

    A local file is written atomically (a temporary file, then a rename), a URL with one PUT.
    """
    names = sorted(index.rows)
    at = [index.rows[name] for name in names]
    renumber: dict[int, int] = {}
    table = np.empty(len(names), _ROW)
    table["size"] = [index.sizes[j] for j in at]
    table["mtime_ns"] = [index.mtimes[j] for j in at]
    table["ino"] = [index.inodes[j] for j in at]
    table["header"] = [renumber.setdefault(index.numbers[j], len(renumber)) for j in at]
    payload: dict[str, Any] = {"format": FORMAT, "version": VERSION, "kind": index.kind}
    payload["headers"] = [index.raws[n].decode("latin1") for n in renumber]
    if index.etags is None:
        payload["names"] = names
    else:
        root = common_root(names)
        payload["root"] = root
        payload["names"] = [name[len(root) :] for name in names]
        payload["etags"] = [index.etags[j] for j in at]
        payload["modified"] = [index.modified[j] for j in at]  # type: ignore[index]
    payload["table"] = base64.b64encode(table.tobytes()).decode("ascii")
    where = _where(index_path, storage_options)
    text = json.dumps(payload, separators=(",", ":"))
    where.source.write_bytes(where.path, text.encode("ascii"), what="header index")


def _where(index_path: str, storage_options: dict[str, Any] | None) -> StoragePath:
    """The index file and its source (``storage_options`` are an index URL's own)."""
    return resolve(index_path, storage_options if is_url(index_path) else None)


def scan_with_index(
    index_path: str,
    paths: Sequence[str],
    scan: Scan,
    *,
    source: Source | None = None,
    identities: Sequence[Identity] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[Any]:
    """Headers of ``paths``, from the index where files are unchanged and by ``scan`` otherwise.

    Returns what ``scan`` returns (per path: ``(identity, header, raw, deflated)`` or an
    exception). The index is rewritten when an entry was added, refreshed or
    dropped.

    Parameters
    ----------
    index_path : str
        The index file: a local path, or a URL for a dataset of objects.
    paths : sequence of str
        Local paths, or URLs of one store (``source``'s).
    scan : callable
        Scans the paths the index cannot answer for.
    source : Source, optional
        What reads ``paths``: local files by default. For objects, their
        current identities come from ``identities`` (the listing's) or, when
        not given, one HEAD per object.
    identities : sequence, optional
        Each object's identity as its listing gave it.
    storage_options : dict, optional
        For an index URL (the dataset's own).

    Raises
    ------
    ValueError
        An index URL for local files, or an index of the other kind.
    """
    if source is None or source.mappable:
        if is_url(index_path):
            raise ValueError(
                f"{redact(index_path)}: a header index of local files is kept on local disk; "
                "give index= a local path (an index URL serves datasets of objects)"
            )
        return _scan_files(index_path, paths, scan)
    return _scan_objects(index_path, paths, scan, source, identities, storage_options)


def _scan_files(index_path: str, paths: Sequence[str], scan: Scan) -> list[Any]:
    base = os.path.dirname(os.path.abspath(index_path))
    index, existed = _load(index_path, FILES, None)
    rows, sizes, mtimes, inodes, numbers, raws, headers = index[:7]
    results: list[Any] = [None] * len(paths)
    missing: list[int] = []
    prefixes: dict[str, str] = {}  # relpath once per folder, not per file
    keys = []
    for path in paths:
        folder, _, name = path.rpartition(os.sep)
        prefix = prefixes.get(folder)
        if prefix is None:
            rel = _key(folder or (os.sep if path.startswith(os.sep) else os.curdir), base)
            prefix = prefixes[folder] = "" if rel == os.curdir else rel.rstrip(os.sep) + os.sep
        keys.append(prefix + name)
    need = _needs(headers)
    get, stat_, isreg, new = rows.get, os.stat, stat.S_ISREG, tuple.__new__
    for i, path in enumerate(paths):
        try:
            st = stat_(path)
        except OSError:
            missing.append(i)  # let the scan raise its own, path-naming error
            continue
        j = get(keys[i])
        if j is not None:
            size = st.st_size
            if (
                size == sizes[j]
                and st.st_mtime_ns == mtimes[j]
                and st.st_ino == inodes[j]
                and size >= need[numbers[j]]
                and isreg(st.st_mode)
            ):
                n = numbers[j]
                results[i] = (new(FileIdentity, (size, mtimes[j], inodes[j])), headers[n], raws[n], False)
                continue
        missing.append(i)
    changed = _refresh(index, keys, paths, missing, results, scan)
    wanted = set(keys)
    for key in [k for k in rows if k not in wanted]:
        if not os.path.isfile(key if os.path.isabs(key) else os.path.join(base, key)):
            del rows[key]  # removed from disk (entries of other shards stay)
            changed = True
    if changed or not existed:
        write_index(index_path, index)
    return results


def _needs(headers: Sequence[NpyHeader | None]) -> list[float]:
    """Per header number: the least size a file needs for it (damaged headers: none will do)."""
    return [float("inf") if h is None else h.data_offset + h.nbytes for h in headers]


def _refresh(
    index: Index, keys: Sequence[str], paths: Sequence[str], missing: Sequence[int], results: list[Any], scan: Scan
) -> bool:
    """Scan the ``missing`` positions into ``results`` and record them in ``index``; whether it changed."""
    if not missing:
        return False
    rows, raws, headers = index.rows, index.raws, index.headers
    changed = False
    known = {raw: n for n, raw in enumerate(raws)}
    for i, result in zip(missing, scan([paths[i] for i in missing])):
        results[i] = result
        if not isinstance(result, BaseException):
            identity, header, raw, _ = result
            n = known.get(raw)
            if n is None or headers[n] is None:  # a new text, or one whose stored copy was damaged
                n = known[raw] = len(raws)
                raws.append(raw)
                headers.append(header)
            index.add(keys[i], identity, n)
            changed = True
        elif keys[i] in rows:
            del rows[keys[i]]
            changed = True
    return changed


def _scan_objects(
    index_path: str,
    paths: Sequence[str],
    scan: Scan,
    source: Source,
    identities: Sequence[Identity] | None,
    storage_options: dict[str, Any] | None,
) -> list[Any]:
    """:func:`scan_with_index` for objects: identities from the listing (or one HEAD each), no header request on a hit.

    An entry is used when the object's size and ETag (Last-Modified where it
    has no ETag) are the recorded ones; its identity is then the one the
    listing gave, which every later range read is conditional on. Entries of
    objects not selected this time are kept (other shards, other filters);
    they cost index space, never data.
    """
    from npydask.storage import run_each

    index, existed = _load(index_path, OBJECTS, storage_options)
    rows, sizes, numbers, raws, headers = index.rows, index.sizes, index.numbers, index.raws, index.headers
    etags, modified = index.etags, index.modified
    assert etags is not None and modified is not None
    # An object source's identities are ObjectIdentity (Source.identity promises only an opaque tuple).
    listed: Sequence[ObjectIdentity | BaseException]
    if identities is None:  # (files= or file_list=: no listing, so one HEAD per object)
        heads = run_each(source.identity, paths, source.spec.settings.concurrency)  # type: ignore[attr-defined]
        listed = cast("list[ObjectIdentity | BaseException]", heads)
    else:
        listed = cast("Sequence[ObjectIdentity]", identities)
    keys = [redact(p) for p in paths] if source.spec.kind == "http" else list(paths)  # type: ignore[attr-defined]
    results: list[Any] = [None] * len(paths)
    missing: list[int] = []
    need = _needs(headers)
    get = rows.get
    for i, found in enumerate(listed):
        j = get(keys[i])
        if (
            j is not None
            and not isinstance(found, BaseException)
            and found.size == sizes[j]
            and found.etag == etags[j]
            and (found.etag is not None or found.modified == modified[j])
            and found.size >= need[numbers[j]]
        ):
            n = numbers[j]
            results[i] = (found, headers[n], raws[n], False)
        else:
            missing.append(i)  # (a failed HEAD too: the scan raises its own, URL-naming error)
    changed = _refresh(index, keys, paths, missing, results, scan)
    if changed or not existed:
        write_index(index_path, index, storage_options)
    return results
