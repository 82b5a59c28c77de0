"""``npydask info PATH``: what the files are, from their headers alone (no cluster, no payload read)."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from npydask.cli._common import Selection, add_selection_options, emit_json, human, report_bad, select, table

__all__ = ["add_parser", "run"]

HELP = """\
examples:
  npydask info scan.npy
  npydask info scans/ --recursive
  npydask info archive.npz --key x
  npydask info huge_folder/ --summary --json
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


def run(args: argparse.Namespace) -> int:
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
