"""A persistent header index for big folders: JSON, never pickle, written atomically.

Opening a dataset of many files costs one open, pread and close per file. An
index remembers, per file, its size, mtime and inode and which header it
has; while a file keeps that identity its header is taken from the index
after one ``stat``. Header texts are stored once however many files share
them, and each is parsed strictly from its stored bytes when the index is
loaded (the index is data, never trusted code). Files that changed or are
new are scanned and their entries refreshed; entries of files that no longer
exist are dropped.

Format (``version`` 3)::

    {"format": "npydask-header-index", "version": 3,
     "headers": ["<preamble and header bytes as latin-1 text>", ...],
     "names": ["<path relative to the index's folder>", ...],
     "table": "<base64: one little-endian row per name of
               int64 size, int64 mtime_ns, uint64 inode, int64 header_number>"}

The numbers are one binary table rather than JSON lists: parsing 20,000
entries as lists took 70 ms of JSON alone, the table about 2 ms. An index
of an older version is replaced silently. A missing one is built; an
unreadable or malformed one is rebuilt with a warning; a path that is not a
regular file (a FIFO, socket, device or folder) is refused at once with an
``OSError`` naming it, without blocking. The new index is
written to a temporary file in the same folder and renamed over the old one,
so readers never see half a file.
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import os
import stat
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from npydask.storage._handles import FileIdentity, open_regular
from npydask.errors import NpyDaskWarning, NpyFormatError
from npydask.header import NpyHeader, parse_header

__all__ = ["FORMAT", "VERSION", "Index", "load_index", "scan_with_index", "write_index"]

FORMAT = "npydask-header-index"
VERSION = 3

_ROW = np.dtype([("size", "<i8"), ("mtime_ns", "<i8"), ("ino", "<u8"), ("header", "<i8")])


class Index(NamedTuple):
    """A loaded index: per name a row of four columns, and the header texts.

    ``rows[name]`` is a position in ``sizes``, ``mtimes``, ``inodes`` and
    ``numbers`` (the header number); ``headers[n]`` is the parsed header of
    ``raws[n]``, or ``None`` where it is damaged (its files are then scanned).
    Columns of plain ints rather than a tuple per file: 20,000 tuples cost
    20 ms to build here.
    """

    rows: dict[str, int]
    sizes: list[int]
    mtimes: list[int]
    inodes: list[int]
    numbers: list[int]
    raws: list[bytes]
    headers: list[NpyHeader | None]

    @classmethod
    def empty(cls) -> Index:
        return cls({}, [], [], [], [], [], [])

    def add(self, name: str, identity: FileIdentity, number: int) -> None:
        """Record ``name`` (new or refreshed) as a new row."""
        self.rows[name] = len(self.sizes)
        self.sizes.append(identity.size)
        self.mtimes.append(identity.mtime_ns)
        self.inodes.append(identity.ino)
        self.numbers.append(number)


def _key(path: str, base: str) -> str:
    full = os.path.abspath(path)
    try:
        rel = os.path.relpath(full, base)
    except ValueError:
        return full
    return full if rel.startswith(os.pardir + os.sep) else rel


def load_index(index_path: str) -> Index:
    """The entries of an index file; empty when it is missing or outdated, unusable ones warned about."""
    try:
        f, _ = open_regular(index_path, what="a regular file (a header index)")
    except FileNotFoundError:
        return Index.empty()
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EISDIR):
            raise  # a FIFO, socket, device or folder: refused at once, never read or replaced
        warnings.warn(f"{index_path}: cannot read the header index ({e}); rebuilding it", NpyDaskWarning, stacklevel=3)
        return Index.empty()
    try:
        with f:
            data = json.loads(f.read())
    except (OSError, ValueError) as e:
        warnings.warn(f"{index_path}: cannot read the header index ({e}); rebuilding it", NpyDaskWarning, stacklevel=3)
        return Index.empty()
    try:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"expected format {FORMAT!r}, found {found!r}")
        version = data.get("version")
        if type(version) is int and version < VERSION:
            return Index.empty()  # written by an older npydask: rebuilt in the current format
        if version != VERSION:
            raise ValueError(f"expected version {VERSION}, found {version!r}")
        raws = [text.encode("latin1") for text in data["headers"]]
        headers = [_checked(raw, index_path) for raw in raws]
        names = data["names"]
        table = np.frombuffer(base64.b64decode(data["table"].encode("ascii"), validate=True), _ROW)
        if not isinstance(names, list) or len(names) != len(table) or not set(map(type, names)) <= {str}:
            raise ValueError(f"expected a name per table row, found {len(names)} names and {len(table)} rows")
        if len(table) and not (0 <= table["header"].min() and table["header"].max() < len(headers)):
            raise ValueError("a header number is out of range")
        columns = (table[field].tolist() for field in ("size", "mtime_ns", "ino", "header"))
        return Index(dict(zip(names, range(len(names)))), *columns, raws, headers)
    except (AttributeError, KeyError, TypeError, ValueError, UnicodeEncodeError, binascii.Error) as e:
        warnings.warn(f"{index_path}: not a usable npydask header index ({e}); rebuilding it", NpyDaskWarning, stacklevel=3)
        return Index.empty()


def _checked(raw: bytes, index_path: str) -> NpyHeader | None:
    """The header in ``raw`` if it parses strictly and is exactly ``raw`` long, else ``None``."""
    try:
        header = parse_header(raw, source=f"{index_path} (an index entry)")
    except NpyFormatError:
        return None  # a damaged entry: its files are scanned themselves
    return header if header.data_offset == len(raw) else None


def write_index(index_path: str, index: Index) -> None:
    """Write ``index`` atomically (a temporary file in the same folder, then a rename), unused headers left out."""
    folder = os.path.dirname(os.path.abspath(index_path))
    names = sorted(index.rows)
    at = [index.rows[name] for name in names]
    renumber: dict[int, int] = {}
    table = np.empty(len(names), _ROW)
    table["size"] = [index.sizes[j] for j in at]
    table["mtime_ns"] = [index.mtimes[j] for j in at]
    table["ino"] = [index.inodes[j] for j in at]
    table["header"] = [renumber.setdefault(index.numbers[j], len(renumber)) for j in at]
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "headers": [index.raws[n].decode("latin1") for n in renumber],
        "names": names,
        "table": base64.b64encode(table.tobytes()).decode("ascii"),
    }
    fd, tmp = tempfile.mkstemp(prefix=".npydask-index-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            json.dump(payload, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, index_path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def scan_with_index(
    index_path: str,
    paths: Sequence[str],
    scan: Callable[[Sequence[str]], list[Any]],
) -> list[Any]:
    """Headers of ``paths``, from the index where files are unchanged and by ``scan`` otherwise.

    Returns what ``scan`` returns (per path: ``(identity, header, raw, deflated)`` or an
    exception). The index is rewritten when an entry was added, refreshed or
    dropped.
    """
    base = os.path.dirname(os.path.abspath(index_path))
    index = load_index(index_path)
    rows, sizes, mtimes, inodes, numbers, raws, headers = index
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
    # per header number: the least size a file needs for it (damaged headers: none will do)
    need = [float("inf") if h is None else h.data_offset + h.nbytes for h in headers]
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
            if (size == sizes[j] and st.st_mtime_ns == mtimes[j] and st.st_ino == inodes[j]
                    and size >= need[numbers[j]] and isreg(st.st_mode)):
                n = numbers[j]
                results[i] = (new(FileIdentity, (size, mtimes[j], inodes[j])), headers[n], raws[n], False)
                continue
        missing.append(i)
    changed = False
    if missing:
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
    wanted = set(keys)
    for key in [k for k in rows if k not in wanted]:
        if not os.path.isfile(key if os.path.isabs(key) else os.path.join(base, key)):
            del rows[key]  # removed from disk (entries of other shards stay)
            changed = True
    if changed or not os.path.exists(index_path):
        write_index(index_path, index)
    return results
