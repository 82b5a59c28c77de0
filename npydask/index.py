"""A persistent header index for big folders: JSON, never pickle, written atomically.

Opening a dataset of many files costs one open, pread and close per file. An
index remembers, per file, its size, mtime and inode and the raw bytes of its
header; while a file keeps that identity its header is taken from the index
after one ``stat`` (and re-parsed strictly from the stored bytes: the index is
data, never trusted code). Files that changed or are new are scanned and
their entries refreshed; entries of files that no longer exist are dropped.

Format (``version`` 1)::

    {"format": "npydask-header-index", "version": 1,
     "files": {"<path relative to the index's folder>":
               [size, mtime_ns, inode, "<header bytes as latin-1 text>"], ...}}

A missing, unreadable or malformed index is rebuilt (with a warning when it
existed but could not be used). The new index is written to a temporary file
in the same folder and renamed over the old one, so readers never see half a
file.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from npydask.backends._batch import Scanned
from npydask.backends._files import FileIdentity
from npydask.errors import NpyDaskWarning, NpyFormatError
from npydask.header import parse_header

__all__ = ["FORMAT", "VERSION", "load_index", "scan_with_index", "write_index"]

FORMAT = "npydask-header-index"
VERSION = 1

Entry = tuple[int, int, int, bytes]


def _key(path: str, base: str) -> str:
    full = os.path.abspath(path)
    try:
        rel = os.path.relpath(full, base)
    except ValueError:
        return full
    return full if rel.startswith(os.pardir + os.sep) else rel


def load_index(index_path: str) -> dict[str, Entry]:
    """The entries of an index file; empty when it is missing, unusable ones warned about."""
    try:
        with open(index_path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"{index_path}: cannot read the header index ({e}); rebuilding it", NpyDaskWarning, stacklevel=3)
        return {}
    try:
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(f"expected format {FORMAT!r} version {VERSION}, found {data.get('format')!r} {data.get('version')!r}")
        entries: dict[str, Entry] = {}
        for rel, (size, mtime_ns, ino, text) in data["files"].items():
            if not all(type(v) is int for v in (size, mtime_ns, ino)) or not isinstance(text, str):
                raise ValueError(f"malformed entry for {rel!r}")
            entries[rel] = (size, mtime_ns, ino, text.encode("latin1"))
    except (AttributeError, KeyError, TypeError, ValueError, UnicodeEncodeError) as e:
        warnings.warn(f"{index_path}: not a usable npydask header index ({e}); rebuilding it", NpyDaskWarning, stacklevel=3)
        return {}
    return entries


def write_index(index_path: str, entries: dict[str, Entry]) -> None:
    """Write ``entries`` atomically: a temporary file in the same folder, then a rename."""
    folder = os.path.dirname(os.path.abspath(index_path))
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "files": {k: [s, m, i, raw.decode("latin1")] for k, (s, m, i, raw) in sorted(entries.items())},
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


def _from_entry(path: str, st: os.stat_result, entry: Entry | None) -> Scanned | None:
    """The cached header of ``path`` if its entry still matches the file, else ``None``."""
    if entry is None or not stat.S_ISREG(st.st_mode):
        return None
    identity = FileIdentity.of(st)
    if (identity.size, identity.mtime_ns, identity.ino) != entry[:3]:
        return None
    try:
        header = parse_header(entry[3], source=path)
    except NpyFormatError:
        return None  # a damaged entry: scan the file itself
    if header.data_offset != len(entry[3]) or header.data_offset + header.nbytes > identity.size:
        return None
    return identity, header, entry[3], False


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
    folders: dict[str, str] = {}  # relpath once per folder, not per file

    def key_of(path: str) -> str:
        folder, name = os.path.split(path)
        rel = folders.get(folder)
        if rel is None:
            rel = folders[folder] = _key(folder or os.curdir, base)
        return name if rel == os.curdir else os.path.join(rel, name)

    keys = [key_of(p) for p in paths]
    for i, (path, key) in enumerate(zip(paths, keys)):
        try:
            st = os.stat(path)
        except OSError:
            missing.append(i)  # let the scan raise its own, path-naming error
            continue
        results[i] = _from_entry(path, st, entries.get(key))
        if results[i] is None:
            missing.append(i)
    changed = False
    if missing:
        for i, result in zip(missing, scan([paths[i] for i in missing])):
            results[i] = result
            if not isinstance(result, BaseException):
                identity, _, raw, _ = result
                entries[keys[i]] = (identity.size, identity.mtime_ns, identity.ino, raw)
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
