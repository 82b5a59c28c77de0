"""The datasets a command reads: built from the headers its selection scanned, or opened as ``open_dataset`` does.

By default a command scans every file's header once (:func:`npydask.cli._select.select`,
which keeps unreadable files apart to list them) and builds its datasets
from those headers (:func:`dataset_of`), so no header is read twice: over
object storage one GET per object opens the selection, as
``open_dataset(headers="all")`` costs.

``--headers first`` and ``--index PATH`` open the selection with
``open_dataset`` instead (:func:`selection_for`), with its meaning: the first
reads only the first file's header and gives every file that header
(checked where each file is read: a file that differs fails the command,
exit status 2); the second keeps a persistent header index, reused while
files keep their identity (over a listed prefix, reusing it costs the LIST
pages and no GET). Either way the first file that cannot be read fails
the command instead of being listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from npydask.cli._common import number, say
from npydask.cli._errors import UsageError
from npydask.cli._remote import source_of, url_or_none
from npydask.cli._select import Selection, root_of, select
from npydask.config import read_options
from npydask.dataset.npy_dataset import NpyDataset
from npydask.dataset.scan import scan_table
from npydask.dataset.views import Context
from npydask.plan.roi import RoiArgs
from npydask.storage.identity import Scanned
from npydask.storage.local import LOCAL
from npydask.storage.paths import absolute_all
from npydask.storage.urls import redact

__all__ = ["add_open_options", "dataset_of", "kinds_of", "lazy", "read_whole", "selection_for", "views_of"]

_ORIGIN = ("the header read when the command started", "run the command again", True)
"""What a task names when a file's header no longer matches the one scanned (see ``HeaderCheck``)."""


def add_open_options(parser: Any) -> None:
    """``--headers {all,first}`` and ``--index PATH``: ``open_dataset``'s ``headers=`` and ``index=``."""
    parser.add_argument(
        "--headers",
        choices=("all", "first"),
        default="all",
        help="'all' (default) reads every file's header and lists unreadable files; 'first' reads only the first "
        "file's and gives every file that header (open_dataset's headers='first': one LIST for a prefix, "
        "each file checked where it is read; a file that differs is an error)",
    )
    parser.add_argument(
        "--index",
        metavar="PATH",
        help="a persistent header index (JSON; a local path or a URL), reused while files keep their size and "
        "mtime or ETag and rebuilt for those that changed (open_dataset's index=)",
    )


def opens_dataset(args: Any) -> bool:
    """Whether ``args`` ask for ``open_dataset``'s own opening (``--headers first`` or ``--index``)."""
    return getattr(args, "headers", "all") == "first" or getattr(args, "index", None) is not None


def selection_for(
    path: str,
    args: Any,
    *,
    file_filter: str,
    key: str | None,
    storage_options: dict[str, Any] | None,
    lenient: bool = False,
    quiet: bool = False,
    roi: dict[str, Any] | None = None,
    device: str = "cpu",
) -> Selection:
    """The files under ``path`` with their headers: scanned once (:func:`select`), or opened by ``open_dataset``.

    With ``--headers first`` or ``--index`` the selection carries the opened
    dataset (``Selection.dataset``, its ROI ``roi`` applied), whose headers
    are the selection's; otherwise :func:`dataset_of` builds datasets from
    the scan.

    Raises
    ------
    UsageError
        As :func:`select`; or what ``open_dataset`` refuses (a ``ValueError``
        or ``TypeError``: ``--headers first`` with ``--key``, mixed dtypes
        with ``--index``, a malformed file, ...), in one line.
    """
    if not opens_dataset(args):
        return select(
            path,
            file_filter=file_filter,
            recursive=args.recursive,
            sort=args.sort,
            key=key,
            quiet=quiet,
            lenient=lenient,
            storage_options=storage_options,
        )
    import npydask

    root = root_of(path, file_filter, storage_options)
    options = dict(
        key=key,
        headers=args.headers,
        index=args.index,
        storage_options=storage_options,
        device=device,
        sort=args.sort,
        **(roi or {}),
    )
    try:
        if root is None:
            ds = npydask.open_dataset(files=[path], **options)
        else:
            ds = npydask.open_dataset(root, file_filter=file_filter, recursive=args.recursive, **options)
    except (ValueError, TypeError) as e:  # (NpyFormatError and RoiError are ValueErrors)
        raise UsageError(f"{redact(path)}: {e}" if redact(path) not in str(e) else str(e)) from None
    if not isinstance(ds, NpyDataset):
        raise UsageError(f"{redact(path)}: --key takes one member name here, found {key!r}")
    t = ds.table
    flags = [False] * len(t) if t.deflated is None else t.deflated.tolist()
    good = []
    for (p, identity, h, _), deflated in zip(t.rows(), flags):
        header, check = t.headers[h]
        good.append((p, (identity, header, None if check is None else check.raw, deflated)))
    if args.headers == "first" and len(ds) > 1 and not quiet:
        say(f"--headers first: {number(len(ds))} files given the first file's header, each checked where it is read")
    return Selection(
        root, [p for p, _ in good], good, [], storage_options if ds._context.source is not LOCAL else None, dataset=ds
    )


def dataset_of(
    selection: Selection,
    indices: Sequence[int],
    *,
    key: str | None,
    device: str = "cpu",
    roi: dict[str, Any] | None = None,
) -> NpyDataset:
    """The dataset of ``selection.good[i] for i in indices`` (one dtype and ndim), from the headers already read.

    No file is read again: the scan's identities, headers and header bytes
    become the dataset's table, and each task compares the header bytes it
    relies on where it reads the file, as ``open_dataset`` arranges. A
    selection opened by ``open_dataset`` (``--headers first``, ``--index``)
    gives a slice of its dataset (``roi`` was applied when it was opened).

    Raises
    ------
    UsageError
        Bad ROI arguments, or a ROI outside a file (``--oob error``).
    """
    if selection.dataset is not None:
        return selection.dataset[list(indices)]
    from npydask.array import check_device

    check_device(device)
    chosen = [selection.good[i][0] for i in indices]
    url = bool(chosen) and url_or_none(chosen[0]) is not None
    source = source_of(chosen[0], selection.storage_options) if url else LOCAL
    paths = chosen if url else absolute_all(chosen)
    try:
        roi_args = RoiArgs.from_user(**(roi or {}), n_files=len(paths))
        # (a selection without a dataset comes from a plain scan: every row has its header bytes)
        rows = [cast(Scanned, selection.good[i][1]) for i in indices]
        table = scan_table(range(len(paths)), paths, rows, _ORIGIN, roi_args, key)
    except (ValueError, TypeError) as e:  # (RoiError is a ValueError)
        raise UsageError(str(e)) from None
    if device == "gpu" and len(table):
        from npydask.gpu import check_gpu_dtype

        check_gpu_dtype(table.header(0).dtype, table.path(0))
    return NpyDataset(table, Context(read_options(gap_bytes=source.gap_bytes), "auto", key, source), device=device)


def kinds_of(selection: Selection) -> list[list[int]]:
    """Indices into ``selection.good`` grouped by (dtype, ndim), in order of first appearance (one dataset each)."""
    kinds: dict[tuple[str, int], list[int]] = {}
    for i, (_, (_, header, _, _)) in enumerate(selection.good):
        kinds.setdefault((header.dtype.str, header.ndim), []).append(i)
    return list(kinds.values())


def views_of(selection: Selection, *, key: str | None) -> list[Any]:
    """Each readable file as an :class:`~npydask.array.NpyFileArray` (whole, C order) from the headers already read.

    Files may differ in dtype and ndim (each kind is a dataset of its own).
    A view read in a task checks its file against the scan, as a dataset's.
    """
    views: list[Any] = [None] * len(selection.good)
    for members in kinds_of(selection):
        for i, view in zip(members, dataset_of(selection, members, key=key).views):
            views[i] = view
    return views


def read_whole(view: Any) -> Any:
    """A view's whole array, read now (in a task: one request for a small object, header checked)."""
    from npydask.plan.region import Box

    return view.read(Box((0,) * view.ndim, tuple(view.shape)))


def lazy(view: Any) -> Any:
    """A view as a lazy dask array with npydask's default chunks (as ``ds[i]``)."""
    from npydask.array import resolve_chunks, wrap

    return wrap(view, resolve_chunks("auto", view))
