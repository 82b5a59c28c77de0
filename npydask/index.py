"""A persistent header index for big folders: JSON, never pickle, written atomically.

Opening a dataset of many files costs one open, pread and close per file. An
index remembers, per file, its size, mtime and inode and which header it
has; while a file keeps that identity its header is taken from the index
after one ``stat``. Header texts are stored once however many files share
them, and each is parsed strictly from its stored bytes when the index is
loaded (the index is data, never trusted code). Files that changed or are
new are scanned and their entries refreshed; entries of files that no longer
exist are dropped.

Format (``version`` 2)::

    {"format": "npydask-header-index", "version": 2,
     "headers": ["<preamble and header bytes as latin-1 text>", ...],
     "files": {"<path relative to the index's folder>": [size, mtime_ns, inode, header_number], ...}}

An index of an older version is replaced silently. A missing one is built;
an unreadable or malformed one is rebuilt with a warning. The new index is
written to a temporary file in the same folder and renamed over the old one,
so readers never see half a file.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from npydask.backends._files import FileIdentity
from npydask.errors import NpyDaskWarning, NpyFormatError
from npydask.header import NpyHeader, parse_header

__all__ = ["FORMAT", "VERSION", "Entry", "load_index", "scan_with_index", "write_index"]

FORMAT = "npydask-header-index"
VERSION = 2


class Entry(NamedTuple):
    """One file's record: its identity then, and its raw header (parsed, or ``None`` if damaged)."""

    size: int
    mtime_ns: int
    ino: int
    raw: bytes
    header: NpyHeader | None


def _key(path: str, base: str) -> str:
    full = os.path.abspath(path)
    try:
        rel = os.path.relpath(full, base)
    except ValueError:
        return full
    return full if rel.startswith(os.pardir + os.sep) else rel


def load_index(index_path: str) -> dict[str, Entry]:
    """The entries of an index file; empty when it is missing or outdated, unusable ones warned about."""
    try:
        with open(index_path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"{index_path}: cannot read the header index ({e}); rebuilding it", NpyDaskWarning, stacklevel=3)
        return {}
    try:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"expected format {FORMAT!r}, found {found!r}")
        version = data.get("version")
        if type(version) is int and version < VERSION:
            return {}  # written by an older npydask: rebuilt in the current format
        if version != VERSION:
            raise ValueError(f"expected version {VERSION}, found {version!r}")
        headers = []
        for text in data["headers"]:
            raw = text.encode("latin1")
            headers.append((raw, _checked(raw, index_path)))
        entries: dict[str, Entry] = {}
        n_headers = len(headers)
        for rel, (size, mtime_ns, ino, number) in data["files"].items():
            if not (type(size) is int and type(mtime_ns) is int and type(ino) is int and type(number) is int
                    and 0 <= number < n_headers):
                raise ValueError(f"malformed entry for {rel!r}")
            raw, header = headers[number]
            entries[rel] = Entry(size, mtime_ns, ino, raw, header)
    except (AttributeError, KeyError, TypeError, ValueError, UnicodeEncodeError) as e:
        warnings.warn(f"{index_path}: not a usable npydask header index ({e}); rebuilding it", NpyDaskWarning, stacklevel=3)
        return {}
    return entries


def _checked(raw: bytes, index_path: str) -> NpyHeader | None:
    """The header in ``raw`` if it parses strictly and is exactly ``raw`` long, else ``None``."""
    try:
        header = parse_header(raw, source=f"{index_path} (an index entry)")
    except NpyFormatError:
        return None  # a damaged entry: its files are scanned themselves
    return header if header.data_offset == len(raw) else None


def write_index(index_path: str, entries: dict[str, Entry]) -> None:
    """Write ``entries`` atomically: a temporary file in the same folder, then a rename."""
    folder = os.path.dirname(os.path.abspath(index_path))
    numbers: dict[bytes, int] = {}
    files = {}
    for rel, e in sorted(entries.items()):
        files[rel] = [e.size, e.mtime_ns, e.ino, numbers.setdefault(e.raw, len(numbers))]
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "headers": [raw.decode("latin1") for raw in numbers],
        "files": files,
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
    entries = load_index(index_path)
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
    get, stat_, isreg = entries.get, os.stat, stat.S_ISREG
    for i, path in enumerate(paths):
        try:
            st = stat_(path)
        except OSError:
            missing.append(i)  # let the scan raise its own, path-naming error
            continue
        e = get(keys[i])
        if (
            e is not None
            and e.header is not None
            and st.st_size == e.size
            and st.st_mtime_ns == e.mtime_ns
            and st.st_ino == e.ino
            and isreg(st.st_mode)
            and e.header.data_offset + e.header.nbytes <= e.size
        ):
            results[i] = (FileIdentity(e.size, e.mtime_ns, e.ino), e.header, e.raw, False)
        else:
            missing.append(i)
    changed = False
    if missing:
        for i, result in zip(missing, scan([paths[i] for i in missing])):
            results[i] = result
            if not isinstance(result, BaseException):
                identity, header, raw, _ = result
                entries[keys[i]] = Entry(identity.size, identity.mtime_ns, identity.ino, raw, header)
                changed = True
            elif keys[i] in entries:
                del entries[keys[i]]
                changed = True
    wanted = set(keys)
    for key in [k for k in entries if k not in wanted]:
        if not os.path.isfile(key if os.path.isabs(key) else os.path.join(base, key)):
            del entries[key]  # removed from disk (entries of other shards stay)
            changed = True
    if changed or not os.path.exists(index_path):
        write_index(index_path, entries)
    return results
