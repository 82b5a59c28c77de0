"""``npydask convert SRC DEST``: .npz to .npy files, .npy files or folders to zarr, Fortran to C order.

What is written depends on SRC and on DEST's ending: ``.zarr`` is a zarr v3
store, ``.npy`` one ``.npy`` file, and a name without an extension (or an
existing folder, or one ending in ``/``) a folder of ``.npy`` files. Any other
extension (``out.h5``) is refused.

==========================  ===========  ===============================================
SRC                         DEST         result
==========================  ===========  ===============================================
``a.npz``                   ``out/``     one ``out/<member>.npy`` per member
``a.npz``                   ``a.zarr``   one zarr array per member, named after it
``a.npz --key x``           any          member ``x`` alone, as a ``.npy`` file below
``a.npy``                   ``b.npy``    a C-ordered copy (Fortran files are transposed)
``a.npy``                   ``out/``     ``out/a.npy``, a C-ordered copy
``a.npy``                   ``a.zarr``   one zarr v3 array (``to_zarr``: chunks = shards)
``folder/``                 ``out/``     C-ordered copies, relative names and subfolders kept
``folder/``                 ``x.zarr``   one array ``(n_files, *shape)``; ``attrs["files"]``
                                         holds the relative names in order (``--layout
                                         stacked``, the default)
``folder/``                 ``x.npy``    the same stack as one ``.npy`` file
``folder/ --layout          ``x.zarr``   one zarr array per file, named by its relative
per-file``                               path without ``.npy``; the group's ``attrs["files"]``
                                         holds the relative names in order
==========================  ===========  ===============================================

A folder of ``.npz`` archives converts one member of each (``--key``). The
stacked layout needs every file to have one shape and dtype; otherwise it is
refused (exit status 2) with the two files that differ and the hint to pass
``--layout per-file``, so the output's layout never depends on the data.

At scale: the stack is ``open_dataset(...).stack()``, which reads many small
files per task, so 50,000 files of 1 KiB are a handful of tasks. Per-file
outputs group small files (under :data:`SMALL_BYTES`) up to
:data:`GROUP_FILES` per task: each task reads its files with
:func:`npydask.read_region` and writes them with :func:`npydask.to_npy_files`
(temporary file, ``fsync``, rename) or, for zarr, creates each array's
metadata and writes its one chunk, many arrays concurrently. Larger files
keep chunked parallel writes of their own. The graph is built once the
cluster is up; inputs, names and dtypes are checked before it starts. An
existing DEST is refused unless ``--overwrite`` (which replaces a zarr store
whole).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

import npydask
from npydask.cli._common import (
    add_cluster_options,
    add_quiet_option,
    add_sort_option,
    client,
    cluster_compute,
    compute,
    on_threads,
    report_bad,
    say,
)
from npydask.cli._errors import UsageError
from npydask.cli._open import add_open_options, dataset_of, lazy, read_whole, selection_for, views_of
from npydask.cli._remote import add_storage_option, is_prefix, storage_options, url_or_none
from npydask.cli._select import is_npz, npz_members, select
from npydask.errors import install_hint
from npydask.storage.urls import redact
from npydask.write.npy import check_names

__all__ = ["GROUP_FILES", "SMALL_BYTES", "add_parser", "destination_kind", "plan_batches", "run"]

HELP = """\
examples:
  npydask convert data.npz data/               every member to data/<member>.npy
  npydask convert fortran.npy c_order.npy      a C-ordered copy
  npydask convert volume.npy volume.zarr       zarr v3 (pip install 'npydask[zarr]')
  npydask convert scans/ scans.zarr --recursive            one stacked array, names in attrs["files"]
  npydask convert slices/ volume.npy --sort natural        slices stacked as slice_1, slice_2, ..., slice_10
  npydask convert scans/ scans.zarr --layout per-file      one zarr array per file
  npydask convert pairs/ x/ --key x            member x of every .npz in pairs/ to x/<name>.npy
  npydask convert s3://bucket/scans/ scans.zarr --storage-option region=eu-west-1   from object storage
  npydask convert scans/ s3://bucket/out/ --storage-option endpoint=http://127.0.0.1:8333   to object storage
"""

GROUP_FILES = 256
"""Most small files one task converts (a progress step, and enough tasks to share out)."""
SMALL_BYTES = 16 << 20
"""Files under this many bytes are converted several per task; larger ones get chunked writes."""
_TASK_THREADS = 4
"""Files one task writes at once: each waits on its ``fsync``, so this is faster than one by one.

(Figures on the performance page.)
"""
_ZARR_CONCURRENCY = 16
"""Arrays one task creates and writes at once (zarr's I/O is asynchronous: waits overlap)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "convert",
        help=".npz to .npy files, .npy files or folders to zarr, Fortran to C order (in parallel)",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="a .npy file, a .npz archive, or a folder of them")
    p.add_argument(
        "dest", metavar="DEST", help="a .npy file, a .zarr store, or a folder (no extension, or ending in /)"
    )
    p.add_argument("--filter", help="glob on file names when SRC is a folder (default '*.npy', '*.npz' with --key)")
    p.add_argument("--recursive", action="store_true", help="look in every subfolder of SRC")
    add_sort_option(p)
    p.add_argument("--key", help="the .npz member to convert (of SRC, or of every archive in the folder SRC)")
    p.add_argument(
        "--layout",
        choices=("stacked", "per-file"),
        help="a folder to .zarr or .npy: one stacked array (default; files must agree in shape and dtype) "
        "or one zarr array per file",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing DEST")
    add_open_options(p)
    add_storage_option(p)
    add_cluster_options(p)
    add_quiet_option(p)
    p.set_defaults(func=run)


def destination_kind(dest: str) -> str:
    """``"zarr"``, ``"npy"`` (one file) or ``"folder"``, from how ``dest`` ends.

    Raises
    ------
    UsageError
        For any other extension: npydask would otherwise write something the
        name does not promise (a ``.npy`` file called ``out.h5``).

    Examples
    --------
    >>> [destination_kind(d) for d in ("a.zarr", "a.zarr/", "b.npy", "out", "out.v2/")]
    ['zarr', 'zarr', 'npy', 'folder', 'folder']
    >>> destination_kind("out.h5")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    npydask.cli._errors.UsageError: out.h5: unknown destination extension '.h5'; ...
    """
    stripped = dest.rstrip("/" + os.sep) or dest
    ext = os.path.splitext(os.path.basename(stripped))[1]
    if ext == ".zarr":
        return "zarr"
    if ext == ".npy" and stripped == dest:
        return "npy"
    if not ext or stripped != dest or os.path.isdir(dest):
        return "folder"
    raise UsageError(
        f"{dest}: unknown destination extension {ext!r}; expected a .npy file, a .zarr store or a folder "
        f"(a name without an extension, or ending in '/')"
    )


def plan_batches(
    sizes: Sequence[int], *, small: int = SMALL_BYTES, max_files: int = GROUP_FILES, max_bytes: int = 128 << 20
) -> tuple[list[list[int]], list[int]]:
    """Group the small files (indices, in order) for one task each; the large ones apart.

    A group holds at most ``max_files`` files and ``max_bytes`` bytes, and
    fewer files when there are few, so at least 16 tasks share the work.

    Examples
    --------
    >>> plan_batches([10] * 5 + [100] + [10] * 3, small=50, max_files=3)
    ([[0], [1], [2], [3], [4], [6], [7], [8]], [5])
    >>> plan_batches([10] * 100, small=50)[0][:2]
    [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13]]
    """
    small_ones = [i for i, s in enumerate(sizes) if s < small]
    large = [i for i, s in enumerate(sizes) if s >= small]
    per = max(1, min(max_files, math.ceil(len(small_ones) / 16)))
    groups: list[list[int]] = []
    acc = 0
    for i in small_ones:
        if groups and len(groups[-1]) < per and acc + sizes[i] <= max_bytes:
            groups[-1].append(i)
            acc += sizes[i]
        else:
            groups.append([i])
            acc = sizes[i]
    return groups, large


# ---------------------------------------------------------------------------------------------
# Task bodies: one task converts a group of small files.


def write_npy_group(items: Sequence[tuple[Any, str]], folder: str, dest_options: dict[str, Any] | None = None) -> int:
    """Read each ``(view, name)`` and write it to ``folder/name`` (``.npy`` appended); return the count.

    A view (:class:`~npydask.array.NpyFileArray`) carries its file's header as the command scanned
    it, so the file is not asked for its header again. ``dest_options`` are the destination's
    ``storage_options``.
    """
    import dask

    arrays = [read_whole(view) for view, _ in items]
    names = [name for _, name in items]
    writes = npydask.to_npy_files(arrays, folder, names, compute=False, **_so(folder, dest_options))
    # local threads, never the cluster's client: each file waits on its fsync, so waits overlap
    dask.compute(writes, scheduler="threads", num_workers=_TASK_THREADS)
    return len(items)


@dataclass(frozen=True)
class ZarrItem:
    """One small file to write as its own zarr array.

    Its view (:func:`views_of`), array name, shape, dtype and chunks.
    """

    view: Any
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]


def _so(path: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """``{"storage_options": options}`` for an object URL, nothing for a local path (the writers' keyword)."""
    return {"storage_options": options} if url_or_none(path) is not None else {}


def _abs(path: str) -> str:
    """A local path made absolute; a URL as it is."""
    return path if url_or_none(path) is not None else os.path.abspath(path)


def write_zarr_group(items: Sequence[ZarrItem], store: str) -> int:
    """Create each item's zarr array and write its file into it, several at once; return the count.

    The first array of each layout (shape, dtype, chunks) is created with
    ``zarr.api.asynchronous.create_array``; the others get a copy of its
    ``zarr.json`` (zarr v3 array metadata names no path, so arrays of one
    layout have the same document), which costs one store write instead of
    zarr's checks and encoding per array (faster per file: figures on the performance page).
    """
    return asyncio.run(_write_zarr_items(items, store))


async def _write_zarr_items(items: Sequence[ZarrItem], store: str) -> int:
    import zarr
    import zarr.api.asynchronous as za
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import LocalStore, StorePath

    local = LocalStore(store)
    gate = asyncio.Semaphore(_ZARR_CONCURRENCY)
    firsts: dict[tuple[Any, ...], ZarrItem] = {}
    for item in items:
        firsts.setdefault((item.shape, item.dtype, item.chunks), item)
    templates: dict[tuple[Any, ...], tuple[Any, Any]] = {}
    for layout, item in firsts.items():
        z = await za.create_array(
            local, name=item.name, shape=item.shape, dtype=item.dtype, chunks=item.chunks, zarr_format=3
        )
        document = await local.get(f"{item.name}/zarr.json", prototype=default_buffer_prototype())
        if document is None:
            raise RuntimeError(f"{store}: zarr wrote no {item.name}/zarr.json for a new array; please report this")
        templates[layout] = (z.metadata, document)
        await z.setitem(Ellipsis, read_whole(item.view))

    async def one(item: ZarrItem) -> None:
        metadata, document = templates[item.shape, item.dtype, item.chunks]
        async with gate:  # (read inside the gate: at most _ZARR_CONCURRENCY files held at once)
            data = read_whole(item.view)
            await local.set(f"{item.name}/zarr.json", document)
            z = zarr.AsyncArray(metadata=metadata, store_path=StorePath(local, item.name))
            await z.setitem(Ellipsis, data)

    chosen = {id(item) for item in firsts.values()}
    await asyncio.gather(*(one(item) for item in items if id(item) not in chosen))
    return len(items)


def _all_done(counts: Sequence[int], expected: int, dest: str) -> None:
    if sum(counts) != expected:
        raise RuntimeError(f"{dest}: {sum(counts)} of {expected} files were converted; the output is incomplete")


# ---------------------------------------------------------------------------------------------
# Planning: every input check happens here, before a cluster starts.


@dataclass(frozen=True)
class Plan:
    """What a conversion does (a sentence) and how to build its lazy writes once a cluster is up."""

    what: str
    build: Callable[[], list[Any]]
    nbytes: int = 0
    """Bytes the conversion reads (decides, with ``nfiles``, whether it runs on local threads)."""
    nfiles: int = 1


def _nbytes(x: Any) -> int:
    """Bytes of a lazy array (dask's array expressions have no ``nbytes``)."""
    return math.prod(x.shape) * x.dtype.itemsize


def _stem(name: str) -> str:
    for ext in (".npy", ".npz"):
        if name.endswith(ext) and len(name) > len(ext):
            return name[: -len(ext)]
    return name


def _plan(args: argparse.Namespace) -> Plan:
    """The conversion, with every input checked (no cluster yet).

    SRC and DEST may be object URLs (``s3://bucket/scans/``): SRC is read
    with ``--storage-option`` and the environment's credentials, DEST is
    written through the same public writers with the same options.
    """
    src, dest = args.src, args.dest
    kind = destination_kind(dest)
    options = storage_options(args)
    src_url, dest_url = url_or_none(src), url_or_none(dest)
    if options and src_url is None and dest_url is None:
        raise UsageError(
            "--storage-option applies to object-store URLs (s3://, gs://, az://, http(s)://); SRC and DEST are local"
        )
    if src_url is None and not os.path.exists(src):
        raise UsageError(f"{src}: no such file or folder")
    if dest_url is None and os.path.lexists(dest) and not args.overwrite:
        raise UsageError(f"{dest} exists; pass --overwrite to replace it")
    src_abs, dest_abs = _abs(src), _abs(dest)
    src_options = options if src_url is not None else None
    run = _Run(src_options, options if dest_url is not None else None)
    if kind == "zarr":
        _need_zarr()
    elif kind == "npy" and dest_url is None and not os.path.isdir(os.path.dirname(dest_abs)):
        raise UsageError(f"{dest}: its folder does not exist; create it first")
    file_filter = args.filter or ("*.npz" if args.key else "*.npy")
    if os.path.isdir(src) if src_url is None else is_prefix(src, file_filter, src_options):
        return _plan_folder(args, kind, src_abs, dest_abs, run)
    if args.layout is not None:
        raise UsageError(f"--layout applies to a folder SRC; {redact(src)} is a file")
    if is_npz(src) and args.key is None:
        return _plan_npz(redact(src), dest, kind, src_abs, dest_abs, args.overwrite, run)
    selection = select(src_abs, key=args.key, storage_options=src_options)  # one line naming a problem (not .npy, ...)
    x = lazy(views_of(selection, key=args.key)[0])  # (the header the selection read: not read again)
    shown = redact(src)
    if kind == "zarr":
        _check_zarr_dtypes([x.dtype], shown)
        return Plan(
            f"{shown} to zarr {dest}", lambda: _zarr_writes([x], None, dest_abs, args.overwrite, run), _nbytes(x)
        )
    if kind == "folder":
        name = args.key or _stem(redact(src_abs).rpartition("/")[2] if src_url else os.path.basename(src_abs))
        return Plan(
            f"{shown} to {dest}/{name}.npy (C order)",
            lambda: [npydask.to_npy_files([x], dest_abs, [name], compute=False, **run.dest)],
            _nbytes(x),
        )
    return Plan(
        f"{shown} to {dest} (C order)", lambda: [npydask.to_npy(x, dest_abs, compute=False, **run.dest)], _nbytes(x)
    )


@dataclass(frozen=True)
class _Run:
    """The ``storage_options`` of the source (``None`` when local) and of the destination (``None`` when local)."""

    src: dict[str, Any] | None
    dest_options: dict[str, Any] | None

    @property
    def dest(self) -> dict[str, Any]:
        """The writers' keyword for the destination: ``{"storage_options": ...}`` for a URL, else nothing."""
        return {} if self.dest_options is None else {"storage_options": self.dest_options}

    def source(self, path: str) -> dict[str, Any]:
        """The readers' keyword for a source path."""
        return _so(path, self.src)


def _plan_npz(src: str, dest: str, kind: str, src_abs: str, dest_abs: str, overwrite: bool, run: _Run) -> Plan:
    members = npz_members(src_abs, run.src)
    if kind == "npy":
        raise UsageError(
            f"{src} holds {len(members)} arrays ({', '.join(members[:5])}); pass --key MEMBER for one .npy "
            f"file, or give a folder or a .zarr store for all of them"
        )
    arrays = [npydask.from_npy(src_abs, key=m, **run.source(src_abs)) for m in members]
    nbytes = sum(_nbytes(a) for a in arrays)
    if kind == "zarr":
        _check_zarr_dtypes([a.dtype for a in arrays], src)
        return Plan(
            f"{len(members)} members of {src} to {dest}",
            lambda: _zarr_writes(arrays, members, dest_abs, overwrite, run),
            nbytes,
            len(members),
        )
    return Plan(
        f"{len(members)} members of {src} to {dest}/",
        lambda: [npydask.to_npy_files(arrays, dest_abs, members, compute=False, **run.dest)],
        nbytes,
        len(members),
    )


def _plan_folder(args: argparse.Namespace, kind: str, src_abs: str, dest_abs: str, run: _Run) -> Plan:
    src, key = redact(args.src), args.key
    file_filter = args.filter or ("*.npz" if key else "*.npy")
    selection = selection_for(
        src_abs, args, file_filter=file_filter, key=key, quiet=args.quiet, storage_options=run.src
    )
    if report_bad(selection):
        raise UsageError(f"{src}: {len(selection.bad)} files cannot be read (listed above); fix or remove them first")
    paths = [p for p, _ in selection.good]
    headers = [scanned[1] for _, scanned in selection.good]
    names = [selection.name(p) for p in paths]
    layout = args.layout or ("per-file" if kind == "folder" else "stacked")
    count = f"{len(paths)} files of {src}"
    total = sum(h.nbytes for h in headers)
    if kind == "folder":
        if layout == "stacked":
            raise UsageError(f"{args.dest}: --layout stacked writes one array: give a .zarr store or a .npy file")
        stems = [_stem(n) for n in names]  # ".npy" is appended as numpy.save does
        try:  # every name at once, before any cluster starts (tasks write groups of them)
            check_names(stems)
        except ValueError as e:
            raise UsageError(f"{src}: {e}") from e
        sizes = [h.nbytes for h in headers]
        return Plan(
            f"{count} to {args.dest.rstrip('/')}/ (C order)",
            lambda: _npy_folder_writes(list(zip(views_of(selection, key=key), stems)), sizes, dest_abs, run),
            total,
            len(paths),
        )
    if layout == "per-file":
        if kind == "npy":
            raise UsageError(
                f"{args.dest}: --layout per-file writes one array per file: give a .zarr store or a folder"
            )
        _check_zarr_dtypes([h.dtype for h in headers], src)
        if run.dest_options is not None:
            raise UsageError(
                f"{args.dest}: --layout per-file writes zarr to local disk only; write it locally and "
                "upload it, or use the stacked layout (the default) for a zarr URL"
            )
        stems = _zarr_names(names)
        return Plan(
            f"{count} to zarr {args.dest}, one array per file",
            lambda: _zarr_per_file_writes(
                views_of(selection, key=key), headers, stems, names, dest_abs, args.overwrite
            ),
            total,
            len(paths),
        )
    _check_uniform(paths, headers)
    if kind == "zarr":
        from npydask.dataset.stacking import joined_dtype

        _check_zarr_dtypes([joined_dtype(headers[0].dtype)], src)
    shape = (len(paths), *headers[0].shape)

    def build() -> list[Any]:
        x = dataset_of(selection, range(len(paths)), key=key).stack()  # (from the headers read: no second read)
        if kind == "zarr":
            return [
                npydask.to_zarr(
                    x, dest_abs, compute=False, overwrite=args.overwrite, attributes={"files": names}, **run.dest
                )
            ]
        return [npydask.to_npy(x, dest_abs, compute=False, **run.dest)]

    return Plan(f"{count} to {args.dest} as one array of shape {shape}", build, total, len(paths))


def _check_uniform(paths: Sequence[str], headers: Sequence[Any]) -> None:
    first = headers[0]
    for path, h in zip(paths, headers):
        if h.shape != first.shape or h.dtype != first.dtype or h.dtype.str != first.dtype.str:
            raise UsageError(
                f"cannot stack {path} ({h.dtype.name}, shape {h.shape}) onto {paths[0]} ({first.dtype.name}, "
                f"shape {first.shape}): a stacked layout needs one shape and dtype; pass --layout per-file "
                f"for one array per file"
            )


def _zarr_names(names: Sequence[str]) -> list[str]:
    """The zarr array names for relative file names: the names without ``.npy``/``.npz``, checked."""
    stems = [_stem(n).replace(os.sep, "/") for n in names]
    seen: dict[str, int] = {}
    for i, s in enumerate(stems):
        if s in seen:
            raise UsageError(f"{names[seen[s]]} and {names[i]} would both be the zarr array {s!r}; rename one")
        seen[s] = i
    for i, s in enumerate(stems):
        parts = s.split("/")
        for k in range(1, len(parts)):
            parent = "/".join(parts[:k])
            if parent in seen:
                raise UsageError(
                    f"{names[seen[parent]]} would be the zarr array {parent!r}, which {names[i]} needs as a "
                    f"group; rename one"
                )
    return stems


def _need_zarr() -> None:
    import importlib.util

    if importlib.util.find_spec("zarr") is None:
        raise UsageError(f"writing zarr needs zarr>=3: {install_hint('zarr')}")


def _check_zarr_dtypes(dtypes: Sequence[np.dtype], src: str) -> None:
    from npydask.write.zarr import check_zarr_dtype

    for dtype in set(dtypes):
        try:
            check_zarr_dtype(dtype)
        except TypeError as e:
            raise UsageError(f"{src}: {e}") from e


# ---------------------------------------------------------------------------------------------
# Building the lazy writes (the cluster is up: stack() groups files for it).


def _zarr_writes(arrays: list[Any], names: list[str] | None, dest: str, overwrite: bool, run: _Run) -> list[Any]:
    if names is None:
        return [npydask.to_zarr(arrays[0], dest, compute=False, overwrite=overwrite, **run.dest)]
    return [
        npydask.to_zarr(x, dest, name=n, compute=False, overwrite=overwrite, **run.dest) for x, n in zip(arrays, names)
    ]


def _npy_folder_writes(items: list[tuple[Any, str]], sizes: list[int], dest: str, run: _Run) -> list[Any]:
    import dask

    groups, large = plan_batches(sizes, small=SMALL_BYTES)
    task = dask.delayed(write_npy_group, pure=False)
    writes: list[Any] = [task([items[i] for i in g], dest, run.dest_options) for g in groups]
    done = dask.delayed(_all_done, pure=False)(writes, sum(map(len, groups)), dest)
    if not large:
        return [done]
    arrays = [lazy(items[i][0]) for i in large]
    return [done, npydask.to_npy_files(arrays, dest, [items[i][1] for i in large], compute=False, **run.dest)]


def _zarr_per_file_writes(
    views: list[Any],
    headers: list[Any],
    stems: list[str],
    names: list[str],
    dest: str,
    overwrite: bool,
) -> list[Any]:
    import dask
    import zarr

    from npydask.write.zarr import plan_zarr_layout

    root = zarr.open_group(dest, mode="w" if overwrite else "w-", zarr_format=3, attributes={"files": names})
    for group in sorted({s.rsplit("/", 1)[0] for s in stems if "/" in s}):
        root.require_group(group)  # the parents first, so concurrent arrays never race to make them
    groups, large = plan_batches([h.nbytes for h in headers], small=SMALL_BYTES)

    def item(i: int) -> ZarrItem:
        h = headers[i]
        chunks = plan_zarr_layout(h.shape, tuple((n,) for n in h.shape), h.dtype.itemsize).chunks
        return ZarrItem(views[i], stems[i], h.shape, h.dtype, chunks)

    task = dask.delayed(write_zarr_group, pure=False)
    writes: list[Any] = [task([item(i) for i in g], dest) for g in groups]
    out = [dask.delayed(_all_done, pure=False)(writes, sum(map(len, groups)), dest)]

    def big(i: int) -> Any:  # to_zarr creates the array's metadata now: concurrently
        return npydask.to_zarr(lazy(views[i]), dest, name=stems[i], compute=False)

    with ThreadPoolExecutor(8, thread_name_prefix="npydask-zarr-meta") as pool:
        out += list(pool.map(big, large))
    return out


def _build(plan: Plan) -> list[Any]:
    """The plan's lazy writes; a file that changed since it was checked is a usage error."""
    try:
        return plan.build()
    except (ValueError, TypeError, FileExistsError) as e:
        raise UsageError(str(e)) from e


def run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except (ValueError, TypeError, FileExistsError) as e:
        raise UsageError(str(e)) from e
    if not args.quiet:
        say(f"converting {plan.what}")
    if on_threads(args, nbytes=plan.nbytes, nfiles=plan.nfiles):
        compute(args, _build(plan), threads=True)
    else:
        with client(args.scheduler, args.workers, quiet=args.quiet) as c:
            cluster_compute(c, _build(plan), quiet=args.quiet)
    print(f"wrote {redact(args.dest)}")
    return 0
