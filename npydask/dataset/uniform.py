"""``open_dataset(..., headers="first")``: one header read for a folder of uniform files.

Most training folders hold files of one shape and dtype. In this mode the
folder's listing gives each file's identity without a request per file (a
local file's inode, :class:`~npydask.storage.identity.InodeIdentity`, from
``os.scandir``; an object's size and ETag from the LIST), only the first
file's header is read, and every file gets that header and one shared
:class:`~npydask.storage.identity.HeaderCheck`. The reads compare each
file's header bytes where they read them anyway (the grouped loop's
``preadv`` of header and payload, the handle cache's header read, an
object's whole GET or its header GET), so a file unlike the first fails its
task with :class:`~npydask.errors.NpyFormatError` naming it, the header
expected and the one found; a task whose box lies wholly outside a file (a
``"pad"`` ROI) still checks its header. A listed local file carries the
time the listing began (:class:`~npydask.storage.identity.InodeIdentity`):
one whose ctime is later (created, renamed in, written or truncated after
opening, whatever its inode number) fails with
:class:`~npydask.errors.FileChangedError`. Files whose output holds no
element are in no task (dask drops empty chunks), so the opening reads
their own headers (:func:`npydask.dataset.scan.check_unread`): an empty first
file cannot stand for larger ones.

This module plans only: which header and check every file gets, and each
file's row of the dataset's table (:func:`first_table`); :func:`check_headers` validates the
argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from npydask.dataset.table import FileTable
from npydask.plan.roi import RoiArgs, cutting_roi
from npydask.storage import HeaderCheck, InodeIdentity, header_mismatch
from npydask.storage.base import Source
from npydask.storage.urls import redact

__all__ = ["HEADERS", "check_headers", "first_table"]

HEADERS = ("all", "first")
"""The values of ``open_dataset``'s ``headers``: every file's header read at open, or the first file's only."""


def check_headers(headers: object, index: object, key: object) -> bool:
    """Whether ``headers`` is ``"first"``; an unknown value, or ``"first"`` with ``index`` or ``key``, refused.

    Examples
    --------
    >>> check_headers("all", None, None), check_headers("first", None, None)
    (False, True)
    >>> check_headers("first", "index.json", None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: headers='first' and index= together: an index keeps each file's own header ...; pass one of them
    """
    if not isinstance(headers, str) or headers not in HEADERS:
        raise ValueError(
            f"headers must be 'all' (read and check every file's header when opening) or 'first' (read the "
            f"first file's only and check each file's where a task reads it), found {headers!r}"
        )
    if headers == "all":
        return False
    if index is not None:
        raise ValueError(
            "headers='first' and index= together: an index keeps each file's own header (checked by its "
            "size and mtime), headers='first' gives every file the first one's; pass one of them"
        )
    if key is not None:
        raise ValueError(
            f"headers='first' with key={key!r}: an .npz member's header sits at a different offset in each "
            "archive, so one header cannot stand for all; open archives with headers='all'"
        )
    return True


def first_table(
    picked: range,
    chosen: Sequence[str],
    identities: Sequence[Any],
    roi_args: RoiArgs,
    source: Source,
) -> FileTable:
    """The files of ``chosen`` as a table, every one with the first file's header and one shared check.

    ``picked`` are the files' positions in the whole list (per-file ROI rows
    are taken there and resolved on the first file's shape); ``identities``
    are the listing's (inodes, or objects' sizes and ETags) or whole ones
    (``files``/``file_list``: a ``stat`` or HEAD each); where they hold
    sizes, a file too small for the payload is refused now, with its own
    header's error (another header, or truncated). Local inode-only
    identities are kept as such (size and mtime -1 in the table).
    """
    found = source.scan([chosen[0]])[0]
    if isinstance(found, BaseException):
        raise found
    header, raw = found[1], found[2]
    shown = redact(chosen[0])
    check = HeaderCheck(
        raw,
        f"the first file's header ({shown}; the dataset was opened with headers='first')",
        "its files' headers differ: open the dataset with headers='all', or leave this file out",
        False,  # (an object's header GET is then compared where it is read: this header is another file's)
    )
    if type(identities[0]) is not InodeIdentity:  # sizes known: a short file now, by its own header's error
        need = header.data_offset + header.nbytes
        k = next((k for k, ident in enumerate(identities) if ident[0] < need), None)
        if k is not None:
            bad = source.scan([chosen[k]])[0]
            if isinstance(bad, BaseException):
                raise bad
            raise header_mismatch(redact(chosen[k]), check, bad[2])
    rois: list[Any] = [None]
    roi_id = None
    if roi_args.has_roi or roi_args.out_of_bounds_policy != "error":
        shape, dtype = header.shape, header.dtype
        if roi_args.per_file:
            per_file = [cutting_roi(roi_args, shape, dtype, index=i, source=redact(p)) for i, p in zip(picked, chosen)]
            rois, roi_id = per_file, list(range(len(per_file)))
        else:
            rois = [cutting_roi(roi_args, shape, dtype, index=picked.start, source=shown)]
    return FileTable.from_rows(chosen, identities, [(header, check)], None, rois, roi_id)
