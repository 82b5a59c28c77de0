"""``npydask info PATH...``: what the files are, from their headers alone (no cluster, no payload read).

Each PATH is a ``.npy`` file, a ``.npz`` archive (every member is listed,
or only ``--key``) or a folder; shell patterns the shell left alone are
expanded. ``--summary`` prints the totals and the number of unreadable
files instead of one line per file.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import Any

from npydask.cli._common import (
    add_selection_options,
    emit_json,
    number,
    report_errors,
    say,
    size,
    table,
)
from npydask.cli._errors import UsageError
from npydask.cli._open import add_open_options, selection_for
from npydask.cli._remote import source_of, storage_options, url_or_none
from npydask.cli._select import Selection, expand_globs, is_npz, npz_members
from npydask.dataset.scan import scan_headers
from npydask.storage.local import LOCAL
from npydask.storage.urls import redact

__all__ = ["add_parser", "run"]

HELP = """\
examples:
  npydask info scan.npy
  npydask info scans/ --recursive
  npydask info slices/ --sort natural             slice_2 before slice_10 (default: DALI's byte-wise order)
  npydask info 'scans/*.npy' extra.npy          several paths; patterns expanded if the shell did not
  npydask info archive.npz                      every member: shape, dtype
  npydask info archive.npz --key x
  npydask info huge_folder/ --summary --json    totals and the count of unreadable files
  npydask info archive.npz --verify              check every member's CRC-32 (exit 1 if one is bad)
  npydask info s3://bucket/scans/ --storage-option region=eu-west-1     a prefix (credentials: environment)
  npydask info s3://bucket/pairs.npz --storage-option endpoint=http://127.0.0.1:8333
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "info",
        help="shape, dtype, order, NPY version and size of each file (headers only)",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_selection_options(p, several=True)
    add_open_options(p)
    p.add_argument("--json", action="store_true", help="print JSON on stdout instead of tables")
    p.add_argument(
        "--summary",
        action="store_true",
        help="totals and the count of unreadable files only (for folders of many files)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="check the CRC-32 of every member of each .npz archive (or of each .npz in a folder); "
        "bad members are listed on stderr and the exit status is 1",
    )
    p.set_defaults(func=run)


def _record(name: str, scanned: Any, key: str | None) -> dict[str, Any]:
    _, header, _, _ = scanned
    record = {
        "path": name,
        "shape": list(header.shape),
        "dtype": header.dtype.str,
        "fortran_order": header.fortran_order,
        "version": f"{header.version[0]}.{header.version[1]}",
        "nbytes": header.nbytes,
    }
    if key is not None:
        record["key"] = key
    return record


def _dtype_name(scanned: Any) -> str:
    """The dtype as tables show it: ``float32``, or the fields of a structured dtype."""
    dtype = scanned[1].dtype
    return dtype.name if dtype.fields is None else str(dtype.descr)


Found = tuple[list[dict[str, Any]], list[str], list[tuple[str, str]]]


def _members(path: str, name: str, options: dict[str, Any] | None) -> Found:
    """Records and dtype names of every member of the archive ``path`` (shown as ``name``), failures apart."""
    found: Found = ([], [], [])
    source = LOCAL if url_or_none(path) is None else source_of(path, options)
    for member in npz_members(path, options):
        (result,) = scan_headers([path], key=member, source=source)
        if isinstance(result, BaseException):
            found[2].append((f"{name}:{member}", f"{redact(path)}: member {member!r}: {result}"))
        else:
            found[0].append(_record(name, result, member))
            found[1].append(_dtype_name(result))
    return found


def _archive(path: str, name: str, options: dict[str, Any] | None, *, lenient: bool) -> Found:
    """:func:`_members`; with ``lenient``, an unreadable archive is one failure instead of an error."""
    try:
        return _members(path, name, options)
    except UsageError as e:
        if not lenient:
            raise
        return [], [], [(name, str(e))]


def _collect(args: argparse.Namespace) -> tuple[Found, int]:
    """Records, dtype names and failures (shown name, reason) of every file or member; how many files."""
    paths = expand_globs(args.paths)
    if args.index is not None and len(paths) > 1:
        raise UsageError(
            f"--index keeps the headers of one dataset; found {len(paths)} paths: give one folder or prefix"
        )
    options = storage_options(args)
    lenient = len(paths) > 1
    found: Found = ([], [], [])
    seen = 0
    for path in paths:
        if args.key is None and is_npz(path) and not os.path.isdir(path):
            parts = [_archive(path, redact(path), options, lenient=lenient)]
            seen += 1
        else:
            selection = selection_for(
                path,
                args,
                file_filter=args.filter,
                key=args.key,
                quiet=args.quiet,
                lenient=lenient,
                storage_options=options,
            )
            seen += len(selection.paths)
            parts = [_from_selection(selection, args.key)]
            # an archive in a folder, read without --key: list its members
            parts += [
                _archive(p, selection.name(p), options, lenient=True)
                for p, _ in selection.bad
                if args.key is None and is_npz(p)
            ]
        for part in parts:
            for mine, theirs in zip(found, part):
                mine += theirs  # type: ignore[operator]
    return found, seen


def _from_selection(selection: Selection, key: str | None) -> Found:
    return (
        [_record(selection.name(p), s, key) for p, s in selection.good],
        [_dtype_name(s) for _, s in selection.good],
        [(selection.name(p), reason) for p, reason in selection.bad if key is not None or not is_npz(p)],
    )


def _counted(files: int, archives: int, members: int) -> str:
    """``"5 files"``, ``"1 archive (2 members)"`` or ``"5 files and 1 archive (2 members)"``.

    Examples
    --------
    >>> _counted(5, 0, 0), _counted(0, 1, 2), _counted(1, 2, 2)
    ('5 files', '1 archive (2 members)', '1 file and 2 archives (2 members)')
    """

    def n(count: int, word: str) -> str:
        return f"{number(count)} {word}{'s' if count != 1 else ''}"

    parts = [n(files, "file")] if files or not archives else []
    if archives:
        parts.append(f"{n(archives, 'archive')} ({n(members, 'member')})")
    return " and ".join(parts)


def _shape(shape: list[int]) -> str:
    return "x".join(map(str, shape)) or "()"


def _verify(path: str, recursive: bool, sort: str = "bytes") -> int:
    """``--verify``: each archive's members against their CRC-32; 1 if any archive fails."""
    from npydask.dataset.select import select_files
    from npydask.storage.local import verify_npz

    if url_or_none(path) is not None:
        raise UsageError(f"{redact(path)}: --verify reads archives on local disk; download the object first")
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file or folder")
    try:
        if os.path.isdir(path):
            archives = select_files(path, file_filter="*.npz", recursive=recursive, sort=sort)
        else:
            archives = [path]
    except ValueError as e:  # no archive in the folder
        raise UsageError(f"{path}: {e}") from e
    failed = 0
    for archive in archives:
        try:
            names = verify_npz(archive)
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
        return max([_verify(p, args.recursive, args.sort) for p in expand_globs(args.paths)], default=0)
    (records, names, bad), seen = _collect(args)
    dtypes = Counter(names)
    shapes = Counter(tuple(r["shape"]) for r in records)
    plain = sum("key" not in r for r in records)
    archives = len({r["path"] for r in records if "key" in r})
    totals: dict[str, Any] = {
        "files": plain + archives,
        "unreadable": len(bad),
        "nbytes": sum(r["nbytes"] for r in records),
        "dtypes": dict(Counter(r["dtype"] for r in records)),
        "shapes": len(shapes),
    }
    if archives:  # (an archive is one file of several arrays, its members)
        totals.update(archives=archives, members=len(records) - plain)
    if args.json:
        payload: dict[str, Any] = {"totals": totals}
        if not args.summary:
            payload = {"files": records, **payload, "errors": [{"path": n, "error": r} for n, r in bad]}
        emit_json(payload)
    else:
        if not args.summary and records:
            rows = [
                [
                    r["path"] + (f":{r['key']}" if "key" in r else ""),
                    _shape(r["shape"]),
                    name,
                    "F" if r["fortran_order"] else "C",
                    r["version"],
                    size(r["nbytes"]),
                ]
                for r, name in zip(records, names)
            ]
            print(table(rows, ["path", "shape", "dtype", "order", "npy", "size"], right=(5,)))
        kinds = ", ".join(f"{d} ({number(n)})" for d, n in dtypes.most_common())
        common = ", ".join(_shape(list(s)) for s, _ in shapes.most_common(3))
        more = f" (most common: {common})" if len(shapes) > 1 else f" ({common})" if shapes else ""
        unreadable = f"; {number(len(bad))} unreadable" if bad else ""
        counted = _counted(plain, archives, len(records) - plain)
        print(
            f"{counted}, {size(totals['nbytes'])} of data; dtypes: {kinds or 'none'}; "
            f"{number(len(shapes))} distinct shape{'s' if len(shapes) != 1 else ''}{more}{unreadable}"
        )
    return report_errors(bad, max(seen, len(records) + len(bad)), summary=args.summary)
