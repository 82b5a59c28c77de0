"""Reading every file's header, and the table of files it becomes.

:func:`scan_headers` reads the headers of a dataset's files through their
source (one ``open``, ``fstat``, ``pread`` and ``close`` per local file; a
request per object), in this thread or on threads when files show latency;
:func:`scan_table` turns the results into the dataset's
:class:`~npydask.dataset.table.FileTable`: one dtype and ndim checked, each distinct
header and ROI numbered once, per file only its identity and two ids.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from npydask.dataset.table import FileTable
from npydask.format.header import NpyHeader
from npydask.plan.roi import RoiArgs, cutting_roi
from npydask.storage import HeaderCheck, header_mismatch
from npydask.storage.base import Scanned, Source
from npydask.storage.local import LOCAL
from npydask.storage.urls import redact

__all__ = ["check_unread", "scan_headers", "scan_members_of", "scan_table"]

_BATCH = 256
_STEP = 4096
_SLOW_FILE = 40e-6
"""Seconds a file over which :func:`scan_headers` moves to threads: several times a page-cached file's
scan in one thread, well under a cold file's (the figures are on the performance page)."""
_FAST_THREADED = 25e-6
"""Seconds a file under which :func:`scan_headers` moves back from threads to this one: just over a
page-cached file's scan on 8 threads (they take turns holding the GIL), under a cold file's there."""


def scan_headers(
    paths: Sequence[str],
    *,
    threads: int | None = None,
    key: str | None = None,
    progress: Callable[[int], None] | None = None,
    source: Source = LOCAL,
) -> list[Scanned | BaseException]:
    """Identity, header and raw header bytes of every path; failures come back as exceptions.

    Batches of files go to ``source``'s scan (:meth:`Source.scan
    <npydask.storage.base.Source.scan>`): for local files, one ``open``,
    one ``fstat``, one ``pread`` and one ``close`` each; header texts shared
    by many files are parsed once. Files in
    the page cache are scanned in this thread (threads only fight over the
    GIL there); when a batch shows latency (over ``_SLOW_FILE`` seconds a
    file: a network or cold file system, or a cold part of a big folder),
    the next files are scanned by ``threads`` threads (default 8), whose
    reads overlap, and back in this thread once a round of them runs at
    page-cache speed (under ``_FAST_THREADED`` a file): threads shorten a
    cold scan about threefold and lengthen a page-cached one about twofold.
    ``threads=1`` never starts threads; another number keeps them from the
    first batch on.

    ``progress``, when given, is called in this thread with the number of
    files scanned so far after each batch of ``_BATCH`` files (never per
    file), and once with ``len(paths)`` at the end; it cannot change the
    results.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy"); np.save(p, np.zeros(3))
    >>> seen = []
    >>> [s[1].shape for s in scan_headers([p] * 600, progress=seen.append)][:1], seen
    ([(3,)], [256, 512, 600])
    """
    report = progress if progress is not None else _ignore
    scan_files = source.scan
    if len(paths) <= _BATCH or source.concurrent:  # (an object store's scan has its own requests in flight)
        if source.concurrent and progress is not None:
            results = []
            for i in range(0, len(paths), _BATCH * 8):
                results += scan_files(paths[i : i + _BATCH * 8], key)
                report(len(results))
            return results
        results = scan_files(paths, key)
        report(len(paths))
        return results
    step = _BATCH if progress is not None else _STEP  # (a few calls when nobody is watching)
    results = []
    done = 0
    on_threads = False
    pool: ThreadPoolExecutor | None = None
    try:
        while done < len(paths):
            t0 = time.perf_counter()
            if not on_threads:
                batch = paths[done : done + (_BATCH if done == 0 else step)]
                results += scan_files(batch, key)
                report(done + len(batch))
                on_threads = threads != 1 and (
                    threads is not None or time.perf_counter() - t0 > _SLOW_FILE * len(batch)
                )
            else:  # a round of batches on the threads, then a look at what they cost
                if pool is None:
                    pool = ThreadPoolExecutor(threads or 8, thread_name_prefix="npydask-scan")
                batch = paths[done : done + _STEP]
                parts = [batch[i : i + _BATCH] for i in range(0, len(batch), _BATCH)]
                for part in pool.map(scan_files, parts, [key] * len(parts)):
                    results += part
                    report(len(results))
                on_threads = threads is not None or time.perf_counter() - t0 > _FAST_THREADED * len(batch)
            done += len(batch)
    finally:
        if pool is not None:
            pool.shutdown()
    return results


def _ignore(done: int) -> None:
    """The progress callback of nobody watching."""


def scan_members_of(paths: Sequence[str], keys: Sequence[str], source: Source) -> list[list[Scanned]]:
    """Per key, each path's scan of that ``.npz`` member (:meth:`Source.scan_members`); the first failure raised."""
    columns: list[list[Scanned]] = [[] for _ in keys]
    for result in source.scan_members(paths, keys):
        if isinstance(result, BaseException):
            raise result
        for column, scanned in zip(columns, result):
            column.append(scanned)
    return columns


def scan_table(
    picked: Sequence[int],
    chosen: Sequence[str],
    scanned: Sequence[Scanned | BaseException],
    origin: tuple[str, str, bool],
    roi_args: RoiArgs,
    key: str | None,
    *,
    member: bool = False,
) -> FileTable:
    """The scanned files as a table: one dtype and ndim checked, ROIs resolved (``member``: errors name the member).

    ``picked`` holds each file's place in the whole selected list (the row
    of a per-file ROI): a shard's range, or the files kept by
    ``on_error="skip"``.

    Distinct headers (with their :class:`HeaderCheck`) and ROIs are numbered
    as the loop meets them; per file it keeps only the identity and two ids.
    """
    checks: dict[int, HeaderCheck] = {}  # per header object: the bytes every read site compares
    entries: dict[tuple[int, int], int] = {}  # per (header, check): its number in the table
    entry_table: list[tuple[NpyHeader, HeaderCheck]] = []
    identities: list[Any] = []
    header_id = array("i")
    roi_id = array("i")
    deflated = array("b")
    first: tuple[str, np.dtype, int] | None = None
    checked: NpyHeader | None = None  # headers are memoised objects: equal files share one
    shown_as = partial(_member_path, key) if member else _same
    with_roi = roi_args.has_roi or roi_args.out_of_bounds_policy != "error"
    rois: dict[tuple[tuple[int, ...], np.dtype], Any] = {}
    roi_numbers: dict[int, int] = {}  # per ROI object: its number in the table
    roi_table: list[Any] = []
    shared_roi = with_roi and not roi_args.per_file
    last: tuple[Any, Any, int] = (None, None, -1)  # (header, raw bytes, entry) of the previous file
    for global_i, path, result in zip(picked, chosen, scanned):
        if isinstance(result, BaseException):
            raise result
        identity, header, raw, compressed = result
        identities.append(identity)
        deflated.append(compressed)
        if header is last[0] and raw is last[1] and not with_roi:  # (the scan shares a bytes object per header text)
            header_id.append(last[2])
            continue
        check = checks.get(id(header))
        if check is None or (check.raw is not raw and check.raw != raw):
            check = checks[id(header)] = HeaderCheck(raw, *origin)
        if header is checked:
            pass
        elif first is None:
            first = (shown_as(path), header.dtype, header.ndim)
        elif header.dtype != first[1] or header.dtype.str != first[1].str:
            raise ValueError(
                f"all files of a dataset must share one dtype: {first[0]} holds {dtype_name(first[1])} "
                f"but {shown_as(path)} holds {dtype_name(header.dtype)}"
            )
        elif header.ndim != first[2]:
            raise ValueError(
                f"all files of a dataset must share one ndim: {first[0]} has {first[2]} dimensions "
                f"but {shown_as(path)} has {header.ndim} (shape {header.shape})"
            )
        checked = header
        entry = entries.setdefault((id(header), id(check)), len(entry_table))
        if entry == len(entry_table):
            entry_table.append((header, check))
        header_id.append(entry)
        last = (header, raw, entry)
        if with_roi:
            memo_key = (header.shape, header.dtype)
            if shared_roi and memo_key in rois:
                roi = rois[memo_key]  # the same arguments on the same shape resolve the same
            else:
                roi = cutting_roi(roi_args, header.shape, header.dtype, index=global_i, source=shown_as(path))
                if shared_roi:
                    rois[memo_key] = roi
            number = roi_numbers.setdefault(id(roi), len(roi_table))
            if number == len(roi_table):
                roi_table.append(roi)
            roi_id.append(number)
    return FileTable.from_rows(
        chosen,
        identities,
        entry_table,
        None if len(entry_table) <= 1 else header_id,
        roi_table or (None,),
        None if len(roi_table) <= 1 else roi_id,
        deflated=deflated if any(deflated) else None,
    )


def check_unread(table: FileTable, source: Source) -> None:
    """Read now the header of each file no task will read, where it was relied on from elsewhere.

    A task compares a file's header bytes with the ones it relies on where
    it reads the file (or, for a box wholly outside it, where it would). A
    file whose output holds no element (a zero-size header, or a ROI that
    leaves nothing of it) may be in no task at all: dask drops empty
    chunks, and joining files skips them. Where such a file's header came
    from somewhere else than the file (the first file's with
    ``headers="first"``, an index entry), its own header is read here, so
    an empty first file cannot stand for larger ones, nor an index entry
    edited to an empty shape for its file. Files with their own checked
    headers (``read_there``) and files with elements cost nothing (a
    look at the table's distinct headers and ROIs).

    Raises
    ------
    NpyFormatError
        Naming the first such file whose header bytes differ: what was
        relied on, what the file holds, and what to do.
    OSError
        A file that cannot be read (the builtin subclass, naming it).
    """
    if not len(table) or not (
        any(h.nbytes == 0 for h, _ in table.headers) or any(r is not None and 0 in r.shape for r in table.rois)
    ):
        return  # (the common case: no header or ROI of zero size, no pass over the rows)
    empty = np.flatnonzero(table.layout().nbytes == 0).tolist()
    rows = [k for k in empty if (check := table.check(k)) is not None and not check.read_there]
    for k, found in zip(rows, scan_headers([table.path(k) for k in rows], source=source)):
        if isinstance(found, BaseException):
            raise found
        check = table.check(k)
        if found[2] != check.raw:  # type: ignore[union-attr]
            raise header_mismatch(redact(table.path(k)), check, found[2])  # type: ignore[arg-type]


def _member_path(key: str | None, path: str) -> str:
    return f"{path} (member {key!r})"


def _same(path: str) -> str:
    return path


def dtype_name(dtype: np.dtype) -> str:
    return f"{dtype.name} ({dtype.str})" if dtype.fields is None else str(dtype)
