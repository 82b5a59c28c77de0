"""Which files a dataset reads, and which of them each shard holds (their order: :mod:`npydask.dataset.order`).

This is NVIDIA DALI's ``fn.readers.numpy`` file selection, so that the same
arguments give the same list, the same length and the same shard boundaries.
The rules below follow DALI's source (``dali/operators/reader/loader/``:
``filesystem.cc`` ``traverse_directories``/``list_files``/``list_subdirectories``,
``file_loader.h`` ``FileLoader::PrepareMetadataImpl`` and ``loader.cc``
``start_index``); where npydask differs, the rule says so.

Three sources, exactly one of them per call:

``file_root`` (+ ``file_filter``)
    Directory discovery. ``file_filter`` is a case-sensitive glob
    (:func:`fnmatch.fnmatchcase`, like DALI's ``fnmatch(3)`` without flags)
    matched against a file's *base name*. The files directly in ``file_root``
    come first, sorted byte-wise; then each *immediate* subdirectory, in
    byte-wise order, with its own files sorted byte-wise. Deeper folders are
    ignored. ``recursive=True`` (an npydask extension; DALI has no such
    option) walks every depth and sorts all relative paths byte-wise as whole
    strings (so ``"a.npy" < "a/b.npy" < "a0.npy"``).
``file_list``
    A text file, one path per line, relative to ``file_root`` or, without
    ``file_root``, to the folder of the list file as spelled (DALI takes the
    text before the list's last ``/``). Trailing whitespace (``\\r`` of CRLF
    files included) is stripped and blank lines are skipped. The rest of the
    line is the path: the numpy reader has no labels, so ``"a.npy 3"`` names
    a file called ``a.npy 3``.
``files``
    A list of paths relative to ``file_root`` (or to the working directory
    without one); order kept.

Every result is ``os.path.join(file_root, entry)`` as a ``str``, so an absolute
entry overrides ``file_root``. ``file_filter`` and ``recursive`` apply only to
discovery. Only discovery touches the file system (and ``file_root`` is
checked to be a directory); listed entries are not checked here, opening them
reports what is missing. The folder is listed by a
:class:`~npydask.storage.base.Lister` (the walk below is
:class:`~npydask.storage.local.LocalLister`'s); the ordering rules are pure
functions of the listing (:mod:`npydask.dataset.order`: :func:`~npydask.dataset.order.dali_order`,
byte-wise sorting).

What counts during discovery:

* Byte-wise order is the order of ``os.fsencode(name)``, never the locale
  (``"B" < "a"``, ``"a10" < "a2"``, non-ASCII after ASCII), as DALI's
  ``std::sort`` of ``std::string``. ``sort="natural"`` (an npydask
  extension) compares runs of ASCII digits by their value instead
  (``"a2" < "a10"``, :func:`~npydask.dataset.order.natural_key`), everywhere byte-wise order is used
  (file names, subfolder names, whole relative paths with ``recursive``);
  ``files`` and ``file_list`` keep their order whatever ``sort`` says.
* Hidden names are not special: ``*.npy`` matches ``.x.npy`` and a ``.cache/``
  subdirectory is listed like any other (DALI uses no ``FNM_PERIOD`` and skips
  only ``.`` and ``..``).
* A file is a regular file or a symlink to one. A directory whose name matches
  the filter is not a file. npydask differs from DALI here: DALI keeps every
  symlink whose *name* matches (dangling ones and links to directories too)
  and fails later when reading it, and fails discovery outright on a dangling
  symlink in ``file_root``; npydask skips dangling symlinks, symlink loops
  and links to non-files.
* Symlinked directories are followed, as DALI's ``stat`` does. Without
  ``recursive`` this is DALI's rule exactly, so an immediate subdirectory that
  is a symlink to ``file_root`` or to a sibling lists those files a second time
  under its own name, as DALI does. With ``recursive=True`` every directory
  (by ``(st_dev, st_ino)``) is walked once: first the real tree under
  ``file_root``, then symlinked directories that lead somewhere not yet walked,
  fewest symlinks first and byte-wise within a round. A link to ``file_root``,
  to an ancestor or into the tree adds nothing; a link out of the tree adds
  that tree once, under the link's name. Loops always end.
* An unreadable subdirectory raises the :class:`PermissionError` of
  :func:`os.scandir` (DALI fails too).

Sharding is contiguous, as DALI's ``start_index``: shard ``k`` of ``S`` over
``N`` files holds ``[N*k // S, N*(k+1) // S)`` (:func:`~npydask.plan.sampling.shard_range`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from typing import NamedTuple

from npydask.dataset.order import (
    InOrder,
    check_sort,
    dali_order,
    folder_order,
    fs_sorted,
    matcher,
    warn_if_natural_differs,
)  # fmt: skip
from npydask.storage import open_regular
from npydask.storage.base import Identity, Lister
from npydask.storage.local import LocalLister
from npydask.storage.urls import is_url, join_url, split_url

__all__ = [
    "DEFAULT_FILE_FILTER",
    "Selected",
    "select_files",
    "select_listed",
]

DEFAULT_FILE_FILTER = "*.npy"
"""DALI's default ``file_filter`` for ``fn.readers.numpy``."""

PathArg = str | os.PathLike[str]

_UTF8_BOM = b"\xef\xbb\xbf"


def select_files(
    file_root: PathArg | None = None,
    *,
    file_filter: str = DEFAULT_FILE_FILTER,
    file_list: PathArg | None = None,
    files: Iterable[PathArg] | None = None,
    recursive: bool = False,
    lister: Lister | None = None,
    sort: str | None = "bytes",
) -> list[str]:
    """The paths a dataset reads, in read order, as DALI's numpy reader selects them.

    Parameters
    ----------
    file_root : str or os.PathLike, optional
        Folder to discover files in (when neither ``files`` nor ``file_list``
        is given), or the folder that listed entries are relative to.
    file_filter : str, default ``"*.npy"``
        Case-sensitive glob on a discovered file's base name. Ignored for
        ``files`` and ``file_list``.
    file_list : str or os.PathLike, optional
        Text file with one path per line; blank lines skipped, trailing
        whitespace stripped. Relative to ``file_root``, else to the list's
        folder.
    files : iterable of str or os.PathLike, optional
        Paths relative to ``file_root`` (or the working directory); order kept.
    recursive : bool, default False
        Discover files at every depth instead of the root and its immediate
        subdirectories. Ignored for ``files`` and ``file_list``.
    lister : Lister, optional
        Lists ``file_root`` (an object-store prefix's
        :class:`~npydask.storage.object_list.ObjectLister`); a local folder's by
        default. Its listing is ordered by the same rules, and entries join
        ``file_root`` with ``/``.
    sort : {"bytes", "natural"} or None, default ``"bytes"``
        Order of discovered files: DALI's byte-wise order, or ``"natural"``
        (runs of digits by value: ``slice_2`` before ``slice_10``, see
        :func:`~npydask.dataset.order.natural_key`). ``None`` is ``"bytes"`` with an
        :class:`~npydask.errors.NpyDaskWarning` naming two files when natural
        order would differ (:func:`~npydask.dataset.order.natural_swap`). ``files`` and
        ``file_list`` keep their order and never warn.

    Returns
    -------
    list of str
        ``os.path.join(file_root, entry)`` for each entry, in read order.

    Raises
    ------
    ValueError
        Neither ``file_root``, ``files`` nor ``file_list`` given; ``files`` and
        ``file_list`` both given; an empty ``files`` or ``file_list``; an empty
        path; no file found by discovery; an unknown ``sort``.
    TypeError
        A path given as ``bytes`` or as something that is not a path, or
        ``files`` given as a single path instead of a list.
    FileNotFoundError, NotADirectoryError
        ``file_root`` does not exist or is not a directory.

    Examples
    --------
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> for rel in ["b.npy", "a.npy", "notes.txt", "s1/c.npy", "s0/d.npy", "s0/deep/e.npy"]:
    ...     os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
    ...     open(os.path.join(root, rel), "wb").close()
    >>> [os.path.relpath(p, root) for p in select_files(root)]
    ['a.npy', 'b.npy', 's0/d.npy', 's1/c.npy']
    >>> [os.path.relpath(p, root) for p in select_files(root, recursive=True)]
    ['a.npy', 'b.npy', 's0/d.npy', 's0/deep/e.npy', 's1/c.npy']
    >>> select_files(root, files=["s1/c.npy", "/abs/x.npy"])[1]
    '/abs/x.npy'
    >>> for i in (1, 2, 10): open(os.path.join(root, f"slice_{i}.npy"), "wb").close()
    >>> [os.path.basename(p) for p in select_files(root, file_filter="slice_*")]
    ['slice_1.npy', 'slice_10.npy', 'slice_2.npy']
    >>> [os.path.basename(p) for p in select_files(root, file_filter="slice_*", sort="natural")]
    ['slice_1.npy', 'slice_2.npy', 'slice_10.npy']
    """
    return select_listed(
        file_root,
        file_filter=file_filter,
        file_list=file_list,
        files=files,
        recursive=recursive,
        sort=sort,
        lister=lister,
    ).paths


class Selected(NamedTuple):
    """The paths a dataset reads, in read order, with the identities their listing gave (if any).

    ``identities[i]`` belongs to ``paths[i]``; it is ``None`` (the whole
    column) when the paths did not come from a listing that knows them:
    ``files``, ``file_list``, or a local folder (whose header scan's
    ``fstat`` gives them anyway; listed for ``headers="first"``, its
    inodes). An object store's listing gives each object's size and ETag,
    so a header index can be checked without a request per object.
    """

    paths: list[str]
    identities: list[Identity] | None = None


def select_listed(
    file_root: PathArg | None = None,
    *,
    file_filter: str = DEFAULT_FILE_FILTER,
    file_list: PathArg | None = None,
    files: Iterable[PathArg] | None = None,
    recursive: bool = False,
    lister: Lister | None = None,
    sort: str | None = "bytes",
) -> Selected:
    """:func:`select_files`, with the listing's identities kept beside the ordered paths.

    Examples
    --------
    >>> from npydask.storage.base import Listing
    >>> class Fake(Lister):
    ...     def list(self, recursive=False, match=None):
    ...         return Listing(["s/b.npy", "a.npy"], [2, 1], [(2, "e2"), (1, "e1")])
    >>> select_listed("s3://b/p", lister=Fake())
    Selected(paths=['s3://b/p/a.npy', 's3://b/p/s/b.npy'], identities=[(1, 'e1'), (2, 'e2')])
    """
    root = None if file_root is None else _path_str(file_root, "file_root")
    if not isinstance(file_filter, str):
        raise TypeError(f"file_filter must be a str glob such as '*.npy', got {file_filter!r}")
    if sort is not None:
        check_sort(sort)
    if files is not None and file_list is not None:
        raise ValueError(
            "files and file_list were both given; pass the paths through one of them (DALI accepts only one)"
        )
    if root is None and files is None and file_list is None:
        raise ValueError(
            "no files to select: pass file_root (a folder to discover files in), files=[...] or file_list=PATH"
        )
    remote = root is not None and is_url(root)
    if root is not None and not remote:
        _stat_root(root)  # (a folder, or a clear error)

    join = _join_url if remote else os.path.join
    if files is not None:
        entries = _entries_from_files(files)
        return Selected([join(root, e) if root is not None else e for e in entries])
    if file_list is not None:
        list_path = _path_str(file_list, "file_list")
        entries = _entries_from_list(list_path)
        base = root if root is not None else os.path.dirname(list_path)
        return Selected([join(base, e) for e in entries])

    assert root is not None
    listing = (lister or LocalLister(root)).list(recursive, matcher(file_filter))
    # Discovered names are relative and non-empty, so one prefix joins them all
    # exactly as os.path.join(root, rel) would, without 20,000 calls to it.
    prefix = root.rstrip("/") + "/" if remote else os.path.join(root, "")
    sep = "/" if remote else os.sep
    by = sort or "bytes"
    order = None if recursive or listing.folders is None else folder_order(listing.paths, listing.folders, by)
    if order is not None and order:  # (a local folder: each folder sorted apart, identities by index)
        paths, ids = listing.paths, listing.identities
        if sort is None:
            warn_if_natural_differs(root, InOrder(paths, order), sep, paths)
        return Selected([prefix + paths[i] for i in order], None if ids is None else [ids[i] for i in order])
    # (before ordering: sorting a recursive listing sorts its paths in place)
    of = None if listing.identities is None else dict(zip(listing.paths, listing.identities))
    found = fs_sorted(listing.paths, by) if recursive else dali_order(listing.paths, sep, by)
    if sort is None:
        warn_if_natural_differs(root, found, None if recursive else sep)
    if not found:
        where = "at any depth under" if recursive else "directly in or one folder below"
        hint = "" if recursive else "; pass recursive=True to search deeper folders"
        raise ValueError(
            f"no file found {where} file_root {root!r} matching file_filter {file_filter!r} "
            f"(a case-sensitive glob on the base name){hint}"
        )
    return Selected([prefix + rel for rel in found], None if of is None else [of[rel] for rel in found])


def _join_url(base: str, entry: str) -> str:
    """A listed entry under an object-store root.

    URLs and ``/``-rooted keys are kept (as ``os.path.join`` keeps absolute paths).
    """
    if is_url(entry):
        return entry
    if entry.startswith("/"):
        return join_url(split_url(base).base, entry[1:])
    return join_url(base, entry)


# -- arguments ---------------------------------------------------------------------------------


def _path_str(value: object, name: str) -> str:
    """``os.fspath(value)`` as a non-empty ``str``; bytes and non-paths refused."""
    refused = f"{name} must be a str or os.PathLike path, got {value!r}"
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(refused)
    try:
        path = os.fspath(value)
    except TypeError as e:  # (a __fspath__ that returns neither str nor bytes)
        raise TypeError(refused) from e
    if isinstance(path, bytes):
        raise TypeError(f"{name} must be a str path, got bytes {path!r}; decode it with os.fsdecode() first")
    if not path:
        raise ValueError(f"{name} is an empty path; pass '.' for the current directory")
    return path


def _stat_root(root: str) -> os.stat_result:
    """Stat ``file_root`` (following symlinks) and insist that it is a directory."""
    try:
        st = os.stat(root)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            errno.ENOENT,
            "file_root does not exist (or is a dangling symlink); pass the folder holding the files",
            root,
        ) from e
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(
            errno.ENOTDIR,
            "file_root is not a directory; pass its folder as file_root, or the file itself through files=[...]",
            root,
        )
    return st


def _entries_from_files(files: Iterable[PathArg]) -> list[str]:
    if isinstance(files, (str, bytes, os.PathLike)):
        raise TypeError(f"files must be a list of paths, got the single path {files!r}; wrap it in a list")
    entries = [_path_str(f, f"files[{i}]") for i, f in enumerate(files)]
    if not entries:
        raise ValueError("files is an empty list; give at least one path, or use file_root to discover files")
    return entries


def _entries_from_list(list_path: str) -> list[str]:
    """Paths in a list file, decoded as file names are; trailing space cut, blanks skipped.

    A FIFO, socket or device is refused at once (opened without blocking, then checked).
    """
    f, _ = open_regular(list_path, what="a regular file (a file list)")
    with f:
        data = f.read()
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    entries = [os.fsdecode(line) for line in (raw.rstrip() for raw in data.split(b"\n")) if line]
    if not entries:
        raise ValueError(
            f"file_list {list_path!r} names no files (it is empty or holds only blank lines); write one path per line"
        )
    return entries
