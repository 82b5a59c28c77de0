"""``npydask convert SRC DEST``: .npz to a folder of .npy, .npy or a folder to zarr, Fortran to C order.

==========================  ===========  ===============================================
SRC                         DEST         result
==========================  ===========  ===============================================
``a.npz``                   ``out/``     one ``out/<member>.npy`` per member
``a.npz``                   ``a.zarr``   one zarr array per member, named after it
``a.npy``                   ``b.npy``    a C-ordered copy (Fortran files are transposed)
``a.npy``                   ``a.zarr``   one zarr v3 array (``to_zarr``: chunks = shards)
``folder/``                 ``out/``     C-ordered copies, relative names and subfolders kept
``folder/``                 ``x.zarr``   one zarr array per file, named by its relative path
==========================  ===========  ===============================================

Every output is written by tasks on the cluster (``to_npy``, ``to_npy_files``,
``to_zarr``), in parallel, through a temporary file renamed at the end for
``.npy``. An existing DEST is refused unless ``--overwrite``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import npydask
from npydask.cli._common import (
    UsageError,
    add_cluster_options,
    add_quiet_option,
    compute,
    npz_members,
    on_threads,
    report_bad,
    say,
    select,
)

__all__ = ["add_parser", "run"]

HELP = """\
examples:
  npydask convert data.npz data/               every member to data/<member>.npy
  npydask convert fortran.npy c_order.npy      a C-ordered copy
  npydask convert volume.npy volume.zarr       zarr v3 (pip install 'npydask[zarr]')
  npydask convert scans/ scans.zarr --recursive
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "convert",
        help=".npz to .npy files, .npy or a folder to zarr, Fortran to C order (in parallel)",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="a .npy file, a .npz archive, or a folder of .npy files")
    p.add_argument("dest", metavar="DEST", help="a .npy file, a folder, or a .zarr store")
    p.add_argument("--filter", default="*.npy", help="glob on file names when SRC is a folder (default '*.npy')")
    p.add_argument("--recursive", action="store_true", help="look in every subfolder of SRC")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DEST")
    add_cluster_options(p)
    add_quiet_option(p)
    p.set_defaults(func=run)


def _plan(args: argparse.Namespace) -> tuple[list[Any], str, int, int]:
    """The lazy writes, a sentence saying what they do, and the bytes and files they read (no cluster yet)."""
    src, dest = args.src, args.dest
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file or folder")
    if os.path.lexists(dest) and not args.overwrite:
        raise UsageError(f"{dest} exists; pass --overwrite to replace it")
    to_zarr = dest.rstrip("/").endswith(".zarr")
    if to_zarr:
        _need_zarr()
    if os.path.isfile(src) and src.endswith(".npz"):
        members = npz_members(src)
        arrays = [npydask.from_npy(src, key=m) for m in members]
        nbytes = sum(x.nbytes for x in arrays)
        if to_zarr:
            return (_zarr_writes(arrays, members, dest, args.overwrite), f"{len(members)} members of {src} to {dest}",
                    nbytes, len(members))
        return ([npydask.to_npy_files(arrays, dest, members, compute=False)], f"{len(members)} members of {src} to {dest}/",
                nbytes, len(members))
    selection = select(src, file_filter=args.filter, recursive=args.recursive, quiet=args.quiet)
    status = report_bad(selection)
    if status and selection.root is not None:
        raise UsageError(f"{src}: {len(selection.bad)} files cannot be read (listed above); fix or remove them first")
    paths = [p for p, _ in selection.good]
    nbytes = sum(header.nbytes for _, (_, header, _, _) in selection.good)
    if selection.root is None:  # one file
        x = npydask.from_npy(src)
        if to_zarr:
            return _zarr_writes([x], None, dest, args.overwrite), f"{src} to zarr {dest}", nbytes, 1
        if os.path.isdir(dest):
            raise UsageError(f"{dest} is a folder; give a .npy file name for a single file")
        return [npydask.to_npy(x, dest, compute=False)], f"{src} to {dest} (C order)", nbytes, 1
    names = [selection.name(p) for p in paths]
    arrays = [npydask.from_npy(p) for p in paths]
    if to_zarr:
        stems = [n[: -len(".npy")] if n.endswith(".npy") else n for n in names]
        return (_zarr_writes(arrays, stems, dest, args.overwrite), f"{len(paths)} files of {src} to zarr {dest}",
                nbytes, len(paths))
    return ([npydask.to_npy_files(arrays, dest, names, compute=False)], f"{len(paths)} files of {src} to {dest}/ (C order)",
            nbytes, len(paths))


def _need_zarr() -> None:
    import importlib.util

    if importlib.util.find_spec("zarr") is None:
        raise UsageError("writing zarr needs zarr>=3: pip install 'npydask[zarr]'")


def _zarr_writes(arrays: list[Any], names: list[str] | None, dest: str, overwrite: bool) -> list[Any]:
    if names is None:
        return [npydask.to_zarr(arrays[0], dest, compute=False, overwrite=overwrite)]
    return [npydask.to_zarr(x, dest, name=n, compute=False, overwrite=overwrite) for x, n in zip(arrays, names)]


def run(args: argparse.Namespace) -> int:
    try:
        writes, what, nbytes, nfiles = _plan(args)
    except (ValueError, TypeError, FileExistsError) as e:
        raise UsageError(str(e)) from e
    if not args.quiet:
        say(f"converting {what}")
    compute(args, writes, threads=on_threads(args, nbytes=nbytes, nfiles=nfiles))
    print(f"wrote {args.dest}")
    return 0
