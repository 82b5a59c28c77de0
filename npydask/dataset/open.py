"""Opening a dataset: :func:`open_dataset` selects files as DALI does, reads their headers, shards.

Files are selected by :mod:`npydask.dataset.select` (local folders, lists, or
object-store prefixes through :mod:`npydask.storage`), their headers read
by :mod:`npydask.dataset.scan` (or from a persistent index, :mod:`npydask.dataset.index`;
or only the first file's, ``headers="first"``: :mod:`npydask.dataset.uniform`), ROI
arguments resolved per file (:mod:`npydask.plan.roi`), and the files of one shard
kept in an :class:`~npydask.dataset.npy_dataset.NpyDataset`.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from npydask._keywords import suggest_keywords
from npydask.array import check_device
from npydask.cache.spec import CacheChoice, cache_choice
from npydask.config import read_options
from npydask.dataset.dali_args import refuse_dali_arguments
from npydask.dataset.npy_dataset import NpyDataset, Skipped
from npydask.dataset.scan import check_unread, scan_headers, scan_members_of, scan_table
from npydask.dataset.select import Selected, select_listed
from npydask.dataset.table import FileTable
from npydask.dataset.uniform import check_headers, first_table
from npydask.dataset.views import Context
from npydask.errors import NpyFormatError, warn
from npydask.plan.roi import RoiArgs
from npydask.plan.sampling import shard_range
from npydask.reader import BACKENDS, check_key
from npydask.storage.base import Source
from npydask.storage.local import LOCAL, LocalLister
from npydask.storage.paths import absolute_all
from npydask.storage.urls import is_url, redact, split_url
from npydask.storage.where import fspath, lister_for, resolve

if TYPE_CHECKING:
    from npydask.dataset.multikey import MultiKeyDataset

__all__ = ["open_dataset", "select_paths"]

_T = TypeVar("_T")


def _gc_paused(fn: Callable[..., _T]) -> Callable[..., _T]:
    """``fn`` with Python's cyclic garbage collector paused while it runs (turned on again only if it was on).

    Opening a folder builds a few transient objects per file (paths, the
    scan's results and identities, before they become the table's
    columns), none in a cycle; every 700 new ones start a collection, which
    walks the ones still young, and every tenth of those a larger one:
    opening is faster with it paused (figures on the performance page).
    Another thread (or the caller) may have turned the collector off: it is
    then left as found.
    """

    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> _T:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return paused


@suggest_keywords
@_gc_paused
def open_dataset(
    file_root: str | os.PathLike[str] | None = None,
    *,
    file_filter: str = "*.npy",
    file_list: str | os.PathLike[str] | None = None,
    files: Sequence[str | os.PathLike[str]] | None = None,
    recursive: bool = False,
    key: str | Sequence[str] | None = None,
    index: str | os.PathLike[str] | None = None,
    roi_start: Any = None,
    rel_roi_start: Any = None,
    roi_end: Any = None,
    rel_roi_end: Any = None,
    roi_shape: Any = None,
    rel_roi_shape: Any = None,
    roi_axes: Any = None,
    out_of_bounds_policy: str = "error",
    fill_value: Any = 0,
    shard_id: int = 0,
    num_shards: int = 1,
    device: str = "cpu",
    backend: str = "auto",
    headers: str = "all",
    sort: str | None = None,
    on_error: str = "raise",
    storage_options: dict[str, Any] | None = None,
    cache: Any = None,
    **dali_only: Any,
) -> NpyDataset | MultiKeyDataset:
    """Open a dataset of ``.npy`` files with DALI ``fn.readers.numpy`` semantics.

    Returns an :class:`NpyDataset`, or a :class:`~npydask.dataset.multikey.MultiKeyDataset`
    when ``key`` is a list of ``.npz`` members.

    Parameters
    ----------
    file_root, file_filter, file_list, files, recursive
        Which files, in which order (see :mod:`npydask.dataset.select`). Relative
        paths are made absolute against the current working directory now
        (:mod:`npydask.storage.paths`), so tasks read the same files on any worker.
        ``file_root`` may be an object-store prefix (``s3://bucket/prefix``,
        with or without the trailing ``/``), listed once; ``files`` and
        ``file_list`` may hold URLs of one store (``http(s)://`` servers
        have no listing: only these two work there).
    key : str or list of str, optional
        Member name inside ``.npz`` archives. A list of names makes each
        sample a dict of those members (a
        :class:`~npydask.dataset.multikey.MultiKeyDataset`): members may differ in
        dtype and shape, ROI arguments apply to each, and each archive's
        zip directory is read once for all of them (``index`` is not used).
    index : path or URL, optional
        A persistent header index (JSON, never pickle, see
        :mod:`npydask.dataset.index`), reused while files keep their identity (a
        local file's size, mtime and inode; an object's size and ETag) and
        refreshed for the others. Over a listed prefix, reusing it costs the
        LIST pages and no header request; over ``files``/``file_list`` URLs,
        one HEAD per object. For objects the index may itself be a URL
        (one GET to read, one PUT to write, with ``storage_options``).
    roi_start, rel_roi_start, roi_end, rel_roi_end, roi_shape, rel_roi_shape, roi_axes
        DALI's ROI arguments (see :mod:`npydask.plan.roi`); a 2-D value gives one
        row per file of the whole list, before sharding.
    out_of_bounds_policy : {"error", "trim_to_shape", "pad"}
    fill_value : scalar
        Value of padded cells (``"pad"``).
    shard_id, num_shards : int
        Keep shard ``shard_id`` of ``num_shards`` (contiguous, as DALI).
    device : {"cpu", "gpu"}
    backend : {"auto", "mmap", "pread"}
        Object URLs take ``"auto"`` or ``"pread"`` (range requests).
    headers : {"all", "first"}, default ``"all"``
        ``"all"`` reads and checks every file's header now (one ``open``,
        ``fstat``, ``pread`` and ``close`` per local file; one GET per
        object). ``"first"`` reads only the first file's (of the shard) and
        gives every file that header: a folder is listed keeping each
        file's inode (``os.scandir`` gives it without a ``stat``) or each
        object's size and ETag (the LIST gives them), so opening costs the
        listing and one header; ``files``/``file_list`` cost one ``stat``
        per file (the whole identity) or one HEAD per object. Each task
        then compares each file's header bytes where it reads them (no
        extra read; a ROI wholly outside a file still reads its header)
        and raises ``NpyFormatError`` naming the file, the header expected
        and the one found when they differ (their bytes where both parse
        alike); a file too short for the payload raises ``NpyFormatError``.
        A listed local file whose status changed (``st_ctime``, from the
        ``fstat`` the task makes anyway) after ``open_dataset`` was called
        raises ``FileChangedError``: created, renamed into place (even with
        its old inode number back), written, truncated, or touched by
        ``chmod``/``touch``/a new hard link after opening; so does a file
        with another inode, an object with another ETag, and a file named
        by ``files``/``file_list`` whose size, mtime or inode changed. A
        file completely written before the call is never refused, however
        close the call came (the open waits for the kernel's coarse clock,
        which stamps ctimes, to pass the time of the call: about one tick,
        4 ms at ``HZ=250``). This relies on the clock that stamps the ctime
        (the file server's, on a network file system) agreeing with this
        machine's, and on fine timestamps (a file system with 1 or 2 s
        timestamps may stamp a change just after opening as before it). A
        file whose output would hold no element
        (an empty first file, a ROI that leaves nothing of it) cannot stand
        for the others: those files' headers are read at open. Not with
        ``index`` (which keeps per-file headers) nor ``key`` (``.npz``
        members sit at a different offset in each archive).
    sort : {"bytes", "natural"} or None, default None
        Order of discovered files (every discovery mode: flat, ``recursive``,
        object-store prefixes): DALI's byte-wise order (``slice_10`` before
        ``slice_2``), or ``"natural"``, runs of digits by value (``slice_2``
        before ``slice_10``; :func:`npydask.dataset.order.natural_key`).
        ``None`` is ``"bytes"`` and, when natural order would differ, warns
        once (an :class:`~npydask.errors.NpyDaskWarning` naming two files
        that swap); passing either value silences it. The check compares
        adjacent names only, and only those whose digits sit differently,
        sampling them in very long lists
        (:func:`npydask.dataset.order.natural_swap`): a few percent of opening
        a million files. ``files`` and ``file_list`` keep their order
        either way and never warn.
    on_error : {"raise", "skip"}, default ``"raise"``
        What a file whose header cannot be read at open does: ``"raise"``
        its error, or ``"skip"``: the file is left out, all the skipped
        files are named with their reasons in one
        :class:`~npydask.errors.NpyDaskWarning`, and ``ds.skipped`` lists
        them (:class:`~npydask.dataset.npy_dataset.Skipped`). Files are skipped before
        sharding, so shards split the files kept, and a 2-D (per-file) ROI
        keeps the rows of the files kept. With ``key`` (or a list of
        members), an archive missing a member is skipped. Not with
        ``headers="first"`` nor ``index`` (their headers are checked in
        tasks, not at open).
    storage_options : dict, optional
        For an object-store ``file_root`` or URLs in ``files``/``file_list``:
        obstore's store and client options (see :func:`npydask.from_npy`).
    cache : None, bool, str or npydask.Cache, optional
        The node cache the objects' reads use, carried by every task of the
        dataset (and used by a :class:`~npydask.Loader` over it). ``None``:
        the ``cache`` setting (``NPYDASK_CACHE``) read where each task runs;
        ``False``: off; ``True``: the setting read now (``ValueError`` when
        it is empty); a folder or :class:`~npydask.Cache`: that one. Local
        files ignore it (the operating system's page cache keeps them).
        Where the cache is on, objects that cannot use it (a store opened
        with ``identity="last-modified"`` or ``"none"``, weak or missing
        ETags) are read without it, with one
        :class:`~npydask.errors.NpyDaskWarning` naming the first. It does
        not enter the names of the dataset's arrays.
    **dali_only
        Taken only to explain them: DALI reader arguments that live
        elsewhere in npydask (``random_shuffle``, ``stick_to_shard``,
        ``dont_use_mmap``, ...) raise a ``TypeError`` saying where
        (:data:`npydask.dataset.dali_args.DALI_ONLY`).

    Raises
    ------
    TypeError
        A DALI reader argument npydask has elsewhere, an unknown keyword, a ``key`` that is not a str or list of str.
    ValueError
        Bad ROI or shard arguments, no files, mixed dtypes or ndims, an unknown ``sort``,
        ``headers`` or ``on_error``, ``headers="first"`` with ``index`` or ``key``,
        ``on_error="skip"`` with ``headers="first"`` or ``index``, every file skipped, an empty ``key``
        list or one naming a member twice.
    KeyError
        An archive without a ``key`` member (the message lists its members).
    NpyFormatError
        A file that is not a valid ``.npy`` file.
    OSError
        A file that cannot be opened (the builtin subclass, naming it).
    RoiError
        A ROI outside a file with ``out_of_bounds_policy="error"``, or ending before it starts.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for i in range(4): np.save(os.path.join(root, f"{i}.npy"), np.full((3, 5), i, "i2"))
    >>> ds = npydask.open_dataset(root, roi_start=[1, 1], roi_shape=[2, 3])
    >>> len(ds), ds.shapes[0], int(ds.stack().sum().compute())
    (4, (2, 3), 36)
    """
    refuse_dali_arguments(dali_only)
    choice = cache_choice(cache)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, found {backend!r}")
    check_device(device)
    first = check_headers(headers, index, key)
    skip = _check_on_error(on_error, first, index)
    keys = None
    if key is not None and not isinstance(key, str):
        from npydask.dataset.multikey import member_keys

        keys, key = member_keys(key), None
    (paths, listed), source = select_paths(
        file_root, file_filter, file_list, files, recursive, storage_options, sort, inodes=first, cache=choice
    )
    check_key(key)
    roi_args = RoiArgs.from_user(
        roi_start=roi_start,
        rel_roi_start=rel_roi_start,
        roi_end=roi_end,
        rel_roi_end=rel_roi_end,
        roi_shape=roi_shape,
        rel_roi_shape=rel_roi_shape,
        roi_axes=roi_axes,
        out_of_bounds_policy=out_of_bounds_policy,
        fill_value=fill_value,
        n_files=len(paths),
    )
    sharding = (shard_id, num_shards) if num_shards > 1 else None
    origin = ("the header read when the dataset was opened", "open the dataset again", True)
    kept: list[Any] | None = None  # (on_error="skip": the shard's scans of the files kept)
    skipped: tuple[Skipped, ...] = ()
    if skip:  # every header read before sharding, so that shards split the files kept
        scans = scan_headers(paths, key=key, source=source) if keys is None else source.scan_members(paths, keys)
        rows, skipped = _kept_rows(paths, scans, source)
        cut = shard_range(len(rows), shard_id, num_shards)
        picked: Sequence[int] = rows[cut.start : cut.stop]  # (each file's place in the whole list: its ROI row)
        chosen = [paths[i] for i in picked]
        kept, start = [scans[i] for i in picked], cut.start
    else:
        picked = shard_range(len(paths), shard_id, num_shards)
        chosen = paths[picked.start : picked.stop]  # (a range of step 1)
        start = picked.start
    if keys is not None:  # several members: each archive's zip directory read once for all of them
        from npydask.dataset.multikey import MultiKeyDataset

        columns = scan_members_of(chosen, keys, source) if kept is None else [list(c) for c in zip(*kept)]
        if not columns:
            columns = [[] for _ in keys]
        members: dict[str, NpyDataset] = {}
        shared: FileTable | None = None  # (the first member's names and identities, shared by the others)
        for k, column in zip(keys, columns):
            t = scan_table(picked, chosen, column, origin, roi_args, k, member=True)
            shared = t if shared is None else shared.with_entries(t.headers, t.header_id, t.rois, t.roi_id, t.deflated)
            members[k] = NpyDataset(
                shared, _context(backend, k, source), device=device, sharding=sharding, start=start, skipped=skipped
            )
        if shared is not None and source.cache_in_use:
            source.warn_uncached(shared.paths(), shared.identities())
        return MultiKeyDataset(members)
    if kept is not None:
        table = scan_table(picked, chosen, kept, origin, roi_args, key)
    elif first:
        assert isinstance(picked, range)
        identities = listed[picked.start : picked.stop] if listed is not None else source.identities(chosen)
        table = first_table(picked, chosen, identities, roi_args, source)
    else:
        assert isinstance(picked, range)
        table = _scanned_table(
            picked,
            chosen,
            None if listed is None else listed[picked.start : picked.stop],
            roi_args,
            key,
            source,
            index,
            storage_options,
        )
    if first or index is not None:  # (headers relied on from elsewhere: files no task reads are checked now)
        check_unread(table, source)
    if device == "gpu" and len(table):
        from npydask.gpu import check_gpu_dtype

        check_gpu_dtype(table.header(0).dtype, table.path(0))  # refused at open, not at the first read
    if source.cache_in_use:
        source.warn_uncached(table.paths(), table.identities())
    return NpyDataset(
        table, _context(backend, key, source), device=device, sharding=sharding, start=start, skipped=skipped
    )


def select_paths(
    file_root: Any,
    file_filter: str,
    file_list: Any,
    files: Any,
    recursive: bool,
    storage_options: dict[str, Any] | None,
    sort: str | None = None,
    inodes: bool = False,
    cache: CacheChoice = None,
) -> tuple[Selected, Source]:
    """The dataset's paths in read order (with their listing's identities, for a listed prefix), and their source.

    ``cache`` is the node-cache choice an object store's source carries (local files ignore it).

    With ``inodes``, a local folder's listing keeps each file's
    :class:`~npydask.storage.identity.InodeIdentity` (``headers="first"``).
    """
    first = file_root
    if first is None and files is not None and not isinstance(files, str | bytes | os.PathLike):
        files = list(files)
        first = files[0] if files else None
    probe = fspath(first) if isinstance(first, str | os.PathLike) else None
    if probe is None or not is_url(probe):
        if storage_options:
            raise ValueError(
                "storage_options apply to object-store URLs (s3://, gs://, az://, http(s)://); "
                f"the dataset's files are local ({probe!r}): drop storage_options"
            )
        root = None if file_root is None else fspath(file_root)
        by_inode = None
        if inodes and root is not None and files is None and file_list is None:
            by_inode = LocalLister(root, inodes=True)
        paths, identities = select_listed(
            root,
            file_filter=file_filter,
            file_list=file_list,
            files=files,
            recursive=recursive,
            sort=sort,
            lister=by_inode,
        )
        for p in paths[:1] + paths[-1:]:
            if is_url(p):
                raise ValueError(f"{redact(p)}: a dataset reads one store; found local paths and URLs together")
        # (tasks may run in another working directory: npydask.storage.paths; a listing under an absolute
        # root is absolute)
        listed_absolute = root is not None and files is None and file_list is None and os.path.isabs(root)
        return Selected(paths if listed_absolute else absolute_all(paths), identities), LOCAL
    where = resolve(probe, storage_options, cache)
    probe, source = where.path, where.source
    root = probe if file_root is not None else None
    lister = lister_for(root, source) if root is not None and files is None and file_list is None else None
    selected = select_listed(
        root, file_filter=file_filter, file_list=file_list, files=files, recursive=recursive, lister=lister, sort=sort
    )
    base = source.spec.base + "/"  # type: ignore[attr-defined]
    for p in selected.paths:
        if not p.startswith(base) and not (is_url(p) and split_url(p).base == source.spec.base):  # type: ignore[attr-defined]
            raise ValueError(
                f"a dataset reads objects of one store ({source.spec.public()}); found {redact(p)}: "  # type: ignore[attr-defined]
                "open a dataset per store"
            )
    return selected, source


ON_ERROR = ("raise", "skip")
"""What ``open_dataset`` does with a file whose header cannot be read: raise its error, or leave it out."""

_SKIPPABLE = (NpyFormatError, OSError, KeyError)
"""Errors of one file's header that ``on_error="skip"`` leaves the file out for: not a valid ``.npy`` file (or
member), missing or unreadable, an archive without the ``key`` member."""

_SHOWN_SKIPS = 20
"""Skipped files the warning names one by one; ``ds.skipped`` lists them all."""


def _check_on_error(on_error: object, first: bool, index: object) -> bool:
    """Whether files whose header fails are skipped; an unknown ``on_error``, or one npydask cannot keep, refused."""
    if not isinstance(on_error, str) or on_error not in ON_ERROR:
        raise ValueError(
            f"on_error must be 'raise' (a file whose header cannot be read fails the open) or 'skip' (such "
            f"files are left out, named in a warning and in ds.skipped), found {on_error!r}"
        )
    if on_error == "raise":
        return False
    if first:
        raise ValueError(
            "on_error='skip' with headers='first': only the first file's header is read at open (the others "
            "are checked where tasks read them), so there is nothing to skip at open; use headers='all'"
        )
    if index is not None:
        raise ValueError(
            "on_error='skip' with index=: a reused index's headers are checked where tasks read the files, "
            "not at open; drop index= to read and check every header now"
        )
    return True


def _kept_rows(paths: Sequence[str], scans: Sequence[Any], source: Source) -> tuple[list[int], tuple[Skipped, ...]]:
    """``on_error="skip"``: the places of the files whose headers read, and the files left out (warned of once).

    Every file's header is read (not only the shard's), so each shard of
    the same list splits the same kept files; a per-file ROI keeps the rows
    of the files kept (rows stand for the whole list).
    """
    kept: list[int] = []
    skipped: list[Skipped] = []
    shown = source.display
    for i, result in enumerate(scans):
        if not isinstance(result, BaseException):
            kept.append(i)
        elif isinstance(result, _SKIPPABLE):
            path = shown(paths[i])
            text = str(result)
            text = text[len(path) + 2 :] if text.startswith(path + ": ") else text  # (the path is said once)
            skipped.append(Skipped(path, f"{type(result).__name__}: {text}"))
        else:
            raise result
    if not kept:
        raise ValueError(
            f"on_error='skip' left no file: the header of each of the {len(paths)} files failed to read "
            f"({_skip_list(skipped)})"
        )
    if skipped:
        warn(
            f"on_error='skip': left out {len(skipped)} of {len(paths)} files whose header could not be read "
            f"(ds.skipped lists them): {_skip_list(skipped)}"
        )
    return kept, tuple(skipped)


def _skip_list(skipped: Sequence[Skipped]) -> str:
    """The first :data:`_SHOWN_SKIPS` skipped files with their reasons, and how many more."""
    shown = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:_SHOWN_SKIPS])
    more = len(skipped) - _SHOWN_SKIPS
    return shown + (f"; and {more} more" if more > 0 else "")


def _context(backend: str, key: str | None, source: Source) -> Context:
    """What every file of a dataset is read with (the source's default coalescing gap)."""
    return Context(read_options(gap_bytes=source.gap_bytes), backend, key, source)


def _scanned_table(
    picked: range,
    chosen: Sequence[str],
    listed: Sequence[Any] | None,
    roi_args: RoiArgs,
    key: str | None,
    source: Source,
    index: Any,
    storage_options: dict[str, Any] | None,
) -> FileTable:
    """``headers="all"``: every file's header, scanned or from the ``index`` (``listed``: the listing's identities)."""
    if index is not None and key is None:
        from npydask.dataset.index import scan_with_index

        index_path = fspath(index)
        shown = redact(index_path)
        scanned = scan_with_index(
            index_path,
            chosen,
            partial(scan_headers, source=source),
            source=source,
            identities=listed,
            storage_options=storage_options,
        )
        origin = (
            f"the header index {shown!r}",
            f"the index is stale or was edited: delete {shown!r} and open the dataset again to rebuild it",
            False,
        )  # (an entry's header is the index's: each object's is compared where it is read)
    else:  # (.npz members are not indexed: their headers sit at offsets the index does not record)
        scanned = scan_headers(chosen, key=key, source=source)
        origin = ("the header read when the dataset was opened", "open the dataset again", True)
    return scan_table(picked, chosen, scanned, origin, roi_args, key)
