"""``npydask info PATH``: what the files are, from their headers alone (no cluster, no payload read)."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import Any

from npydask.cli._common import (
    Selection,
    UsageError,
    add_selection_options,
    emit_json,
    human,
    report_bad,
    say,
    select,
    table,
)

__all__ = ["add_parser", "run"]

HELP = """\
examples:
  npydask info scan.npy
  npydask info scans/ --recursive
  npydask info archive.npz --key x
  npydask info huge_folder/ --summary --json
  npydask info archive.npz --verify          check every member's CRC-32 (exit 1 if one is bad)
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "info",
        help="shape, dtype, order, NPY version and size of each file (headers only)",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_selection_options(p)
    p.add_argument("--json", action="store_true", help="print JSON on stdout instead of tables")
    p.add_argument("--summary", action="store_true", help="totals only (for folders of many files)")
    p.add_argument(
        "--verify",
        action="store_true",
        help="check the CRC-32 of every member of the .npz archive (or of each .npz in the folder); "
        "bad members are listed on stderr and the exit status is 1",
    )
    p.set_defaults(func=run)


def _record(selection: Selection, path: str, scanned: Any) -> dict[str, Any]:
    _, header, _, _ = scanned
    return {
        "path": selection.name(path),
        "shape": list(header.shape),
        "dtype": header.dtype.str,
        "fortran_order": header.fortran_order,
        "version": f"{header.version[0]}.{header.version[1]}",
        "nbytes": header.nbytes,
    }


def _dtype_name(text: str) -> str:
    import numpy as np

    dtype = np.dtype(text) if not text.startswith("[") else None
    return dtype.name if dtype is not None and dtype.fields is None else text


def _verify(path: str, recursive: bool) -> int:
    """``--verify``: each archive's members against their CRC-32; 1 if any archive fails."""
    from npydask.discovery import select_files
    from npydask.npz import verify

    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file or folder")
    archives = select_files(path, file_filter="*.npz", recursive=recursive) if os.path.isdir(path) else [path]
    failed = 0
    for archive in archives:
        try:
            names = verify(archive)
        except (ValueError, OSError) as e:  # NpzCrcError, NpyFormatError, OSError: each names the archive
            failed += 1
            say(f"  {e}")
        else:
            print(f"{archive}: {len(names)} members, CRC-32 ok")
    if failed:
        say(f"{failed} of {len(archives)} archives failed verification")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    if args.verify:
        return _verify(args.path, args.recursive)
    selection = select(args.path, file_filter=args.filter, recursive=args.recursive, key=args.key)
    records = [_record(selection, p, s) for p, s in selection.good]
    dtypes = Counter(h.dtype.str if h.dtype.fields is None else str(h.dtype.descr) for _, (_, h, _, _) in selection.good)
    shapes = Counter(tuple(r["shape"]) for r in records)
    totals = {
        "files": len(records),
        "unreadable": len(selection.bad),
        "nbytes": sum(r["nbytes"] for r in records),
        "dtypes": dict(dtypes),
        "shapes": len(shapes),
    }
    if args.json:
        payload: dict[str, Any] = {"totals": totals, "errors": [{"path": selection.name(p), "error": r} for p, r in selection.bad]}
        if not args.summary:
            payload = {"files": records, **payload}
        emit_json(payload)
    else:
        if not args.summary and records:
            rows = [
                [r["path"], "x".join(map(str, r["shape"])) or "()", _dtype_name(r["dtype"]),
                 "F" if r["fortran_order"] else "C", r["version"], human(r["nbytes"])]
                for r in records
            ]
            print(table(rows, ["path", "shape", "dtype", "order", "npy", "size"], right=(5,)))
        kinds = ", ".join(f"{_dtype_name(d)} ({n})" for d, n in dtypes.most_common())
        common = ", ".join("x".join(map(str, s)) or "()" for s, _ in shapes.most_common(3))
        more = f" (most common: {common})" if len(shapes) > 1 else f" ({common})" if shapes else ""
        print(f"{len(records)} files, {human(totals['nbytes'])} of data; dtypes: {kinds or 'none'}; "
              f"{len(shapes)} distinct shape{'s' if len(shapes) != 1 else ''}{more}")
    return report_bad(selection)
