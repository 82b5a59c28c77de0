"""Choosing the files a command reads: paths, patterns, folders and prefixes, each header scanned once.

:func:`select` lists a folder or prefix (or takes one file or object),
scans every header once, and keeps the files that cannot be read apart, with
their reasons, so a command can list them (exit status 1) and go on with the
others. Where ``--filter`` matches nothing, the message says what the folder
does hold. :mod:`npydask.cli._open` builds datasets from what was scanned.
"""

from __future__ import annotations

import glob
import os
import re
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from npydask.cli import _common
from npydask.cli._common import number
from npydask.cli._errors import UsageError
from npydask.cli._progress import progress_line
from npydask.cli._remote import is_prefix, npz_members_at, source_of, url_or_none
from npydask.dataset.scan import scan_headers
from npydask.dataset.select import select_files
from npydask.format.header import NpyHeader
from npydask.storage.base import Source
from npydask.storage.identity import Identity, Scanned
from npydask.storage.local import LOCAL
from npydask.storage.urls import redact
from npydask.storage.where import lister_for

Row = tuple[Identity, NpyHeader, bytes | None, bool]
"""A selected file's identity, header, header bytes (``None`` where no header check applies) and deflated flag."""

__all__ = ["Row", "Selection", "expand_globs", "is_npz", "npz_members", "root_of", "select"]


@dataclass(frozen=True)
class Selection:
    """The files a command reads: ``root`` is the folder (or prefix URL) given, ``None`` for files given one by one.

    ``storage_options`` are those the objects were read with (``None`` for local files);
    ``dataset`` the dataset ``open_dataset`` opened them as, when a command asked it to
    (``--headers first``, ``--index``: :mod:`npydask.cli._open`), whose rows are ``good``.
    """

    root: str | None
    paths: list[str]
    good: list[tuple[str, Row]]
    bad: list[tuple[str, str]]
    storage_options: dict[str, Any] | None = None
    dataset: Any = None

    def name(self, path: str) -> str:
        """``path`` as shown: relative to the folder or prefix given, else as given (URLs without query strings)."""
        if self.root is None:
            return redact(path)
        if url_or_none(self.root) is not None:
            return path[len(self.root.rstrip("/")) + 1 :]
        return os.path.relpath(path, self.root)


_MAGIC = re.compile(r"[*?[]")


def expand_globs(patterns: Sequence[str]) -> list[str]:
    """The paths given, with shell patterns the shell did not expand (quoted, or on Windows) expanded.

    A path that exists is taken as it is, even with ``*`` in its name; a
    pattern (``*``, ``?``, ``[...]``; ``**`` spans folders) that matches
    nothing is a :class:`UsageError`.
    """
    out: list[str] = []
    for p in patterns:
        if url_or_none(p) is not None or os.path.lexists(p) or not _MAGIC.search(p):  # (URLs: keys may hold '*')
            out.append(p)
            continue
        found = sorted(glob.glob(p, recursive=True))
        if not found:
            raise UsageError(f"{p}: no file or folder matches this pattern")
        out += found
    return out


def select(
    path: str,
    *,
    file_filter: str = "*.npy",
    recursive: bool = False,
    key: str | None = None,
    quiet: bool = False,
    lenient: bool = False,
    storage_options: dict[str, Any] | None = None,
    sort: str = "bytes",
) -> Selection:
    """The files under ``path`` (a file or a folder, an object or a prefix URL) with their headers.

    Unreadable ones are kept apart.

    Scanning more than ``SCAN_COUNT_FROM`` files shows a running count on
    stderr (unless ``quiet``). With ``lenient``, a single file that cannot
    be read is listed in ``bad`` like a folder's files instead of raising.
    ``storage_options`` reach the store of a URL (and are refused for a
    local path). ``sort`` orders a folder's files (``"bytes"``, DALI's; or
    ``"natural"``).

    Raises
    ------
    UsageError
        ``path`` does not exist, holds no matching file, or is a single file
        that cannot be read as ``.npy`` (or as the ``.npz`` member ``key``).
    """
    shown = redact(path)
    root = root_of(path, file_filter, storage_options)
    source: Source = LOCAL if url_or_none(path) is None else source_of(path, storage_options)
    if root is None:
        paths = [path]
    else:
        lister = None if source is LOCAL else lister_for(root, source)
        try:
            paths = select_files(root, file_filter=file_filter, recursive=recursive, lister=lister, sort=sort)
        except ValueError as e:
            where = "at any depth" if recursive else "directly in it or one folder below (--recursive looks deeper)"
            seen = _what_is_there(root, recursive, lister, storage_options)
            raise UsageError(f"{shown}: no file matching --filter {file_filter!r} {where}{seen}") from e
        except OSError as e:
            raise UsageError(str(e)) from e
    good: list[tuple[str, Row]] = []
    bad: list[tuple[str, str]] = []
    for p, result in zip(paths, _scan(paths, key, quiet, source)):
        if isinstance(result, BaseException):
            reason = result.args[0] if isinstance(result, KeyError) and result.args else result
            bad.append((p, _reason(redact(p), reason)))
        else:
            good.append((p, result))
    if root is None and bad and not lenient:
        raise UsageError(bad[0][1] + _npz_hint(path, key))
    return Selection(root, paths, good, bad, storage_options if source is not LOCAL else None)


def root_of(path: str, file_filter: str, storage_options: dict[str, Any] | None) -> str | None:
    """``path`` when it names a folder or an object-store prefix; ``None`` when it names one file or object.

    Raises
    ------
    UsageError
        ``path`` does not exist, or ``storage_options`` were given for a local path.
    """
    if url_or_none(path) is not None:
        return path if is_prefix(path, file_filter, storage_options) else None
    if storage_options:
        raise UsageError(f"{path}: --storage-option applies to object-store URLs (s3://, gs://, az://, http(s)://)")
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file or folder")
    return path if os.path.isdir(path) else None


def _what_is_there(root: str, recursive: bool, lister: Any, options: dict[str, Any] | None) -> str:
    """What a folder or prefix holds where the filter matched nothing: counts by extension, and a hint for archives."""
    try:
        found = select_files(root, file_filter="*", recursive=recursive, lister=lister)
    except (ValueError, OSError):
        return "; it holds no file at all" if recursive else "; no other file is there either"
    counts = Counter(os.path.splitext(redact(p).rpartition("/")[2])[1] or "(no extension)" for p in found)
    seen = ", ".join(f"{number(n)} {ext}" for ext, n in counts.most_common(6))
    more = f" and {number(len(counts) - 6)} other extensions" if len(counts) > 6 else ""
    hint = ""
    archive = next((p for p in found if is_npz(p)), None)
    if archive is not None:
        try:
            members = ", ".join(npz_members(archive, options)[:5])
        except UsageError:
            members = ""
        example = f" (e.g. {members})" if members else ""
        hint = f"; for .npz archives pass --filter '*.npz' --key NAME, NAME a member{example}"
    return f"; found {seen}{more}{hint}"


def _scan(paths: list[str], key: str | None, quiet: bool, source: Source = LOCAL) -> list[Scanned | BaseException]:
    if len(paths) <= _common.SCAN_COUNT_FROM:  # (read now: a setting tests change)
        return scan_headers(paths, key=key, source=source)
    with progress_line(quiet) as line:
        if line is None:
            return scan_headers(paths, key=key, source=source)
        total = number(len(paths))
        return scan_headers(
            paths, key=key, source=source, progress=lambda n: line.update(f"scanned {number(n)} / {total} files")
        )


def _reason(path: str, error: object) -> str:
    text = str(error.strerror if isinstance(error, OSError) and error.strerror else error)
    return text if path in text else f"{path}: {text}"


def is_npz(path: str) -> bool:
    """Whether ``path`` names an ``.npz`` archive (a URL's query string, which presigned URLs carry, aside).

    Examples
    --------
    >>> is_npz("a.npz"), is_npz("https://host/a.npz?X-Amz-Signature=s"), is_npz("a.npy")
    (True, True, False)
    """
    return redact(path).endswith(".npz")


def _npz_hint(path: str, key: str | None) -> str:
    if key is None and is_npz(path):
        return " (an .npz archive: name a member with --key)"
    return ""


def npz_members(path: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The member names of the ``.npz`` archive ``path``, in archive order.

    ``path`` is a file or an object URL; a member ``x.npy`` is named ``"x"``.

    Raises
    ------
    UsageError
        ``path`` is not a readable zip archive, or holds no member.
    """
    if url_or_none(path) is not None:
        return npz_members_at(path, storage_options)
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n[: -len(".npy")] if n.endswith(".npy") else n for n in zf.namelist()]
    except (zipfile.BadZipFile, OSError) as e:
        raise UsageError(f"{path}: not a readable .npz archive ({e})") from e
    if not names:
        raise UsageError(f"{path}: the archive holds no arrays")
    return names
