"""``npydask stats PATH``: min, max, mean, std and count over every file, on threads or a cluster.

Each task reduces its block to one row per file, ``(count, min, max, mean,
M2)`` in float64 (M2: the sum of squared deviations from the block's mean);
the client combines the rows exactly (Chan et al.'s pairwise formula), so
the standard deviation does not suffer the cancellation of ``E[x^2] -
E[x]^2``. Files of one shape are stacked, so many small files are few tasks.

``--json`` is strict JSON: a value that is not finite (data holding NaN or
infinities) is the string ``"nan"``, ``"inf"`` or ``"-inf"``; a statistic
of no values (``count`` 0: empty files) is ``null``.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from npydask.cli._common import (
    add_cluster_options,
    add_roi_options,
    add_selection_options,
    compute,
    emit_json,
    json_number,
    number,
    on_threads,
    report_bad,
    roi_kwargs,
    table,
)
from npydask.cli._errors import UsageError
from npydask.cli._open import add_open_options, dataset_of, kinds_of, selection_for
from npydask.cli._remote import storage_options

__all__ = ["add_parser", "block_partials", "combine", "extreme", "partials", "run"]

HELP = """\
examples:
  npydask stats scan.npy
  npydask stats scans/ --per-file
  npydask stats scans/ --roi-start 1,2 --roi-end 8,9 --roi-axes 0,1 --oob pad --json
  npydask stats scans/ --scheduler tcp://10.0.0.5:8786
  npydask stats s3://bucket/scans/ --storage-option region=eu-west-1      credentials from the environment
"""

FIELDS = ("count", "min", "max", "mean", "std")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "stats",
        help="min, max, mean, std (ddof=0) and count over all files, on threads or a cluster",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_selection_options(p)
    add_open_options(p)
    p.add_argument("--per-file", action="store_true", help="also one row per file")
    p.add_argument("--json", action="store_true", help="print JSON on stdout instead of tables")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="read into NumPy or CuPy chunks")
    add_roi_options(p)
    add_cluster_options(p)
    p.set_defaults(func=run)


def block_partials(block: Any) -> np.ndarray:
    """Rows ``(count, min, max, mean, M2)`` per file of a stacked block, shaped ``(n, 1, ..., 1, 5)``.

    A device (CuPy) block is reduced on the device, without a host array in the
    mix; the rows are a host ``numpy.ndarray`` either way.

    Examples
    --------
    >>> block_partials(np.array([[1.0, 3.0], [2.0, 2.0]])).tolist()  # two files of two values each
    [[[2.0, 1.0, 3.0, 2.0, 2.0]], [[2.0, 2.0, 2.0, 2.0, 0.0]]]
    """
    n = block.shape[0]
    flat = block.reshape(n, -1).astype(np.float64)
    count = flat.shape[1]
    if count == 0:
        rows = np.tile(np.array([0.0, np.nan, np.nan, 0.0, 0.0]), (n, 1))
    else:
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as numpy's mean and std say
            mean = flat.mean(axis=1)
            m2 = ((flat - mean[:, None]) ** 2).sum(axis=1)
        # Every column on the block's own array module (full_like dispatches on ``mean``): CuPy refuses
        # a host array among device ones. The rows then come back to the host whole (5 numbers a file).
        rows = np.stack([np.full_like(mean, float(count)), flat.min(axis=1), flat.max(axis=1), mean, m2], axis=1)
        rows = rows.get() if hasattr(rows, "get") else rows
    return np.asarray(rows).reshape((n,) + (1,) * (block.ndim - 1) + (5,))


def partials(x: Any) -> Any:
    """The lazy ``(n_files, blocks..., 5)`` array of :func:`block_partials` rows of stacked files ``x``."""
    chunks = (x.chunks[0], *((1,) * len(c) for c in x.chunks[1:]), (5,))
    meta = np.empty((0,) * (x.ndim + 1), np.float64)
    return x.map_blocks(block_partials, chunks=chunks, new_axis=[x.ndim], dtype=np.float64, meta=meta)


def combine(rows: np.ndarray) -> tuple[float, float, float, float, float]:
    """Combine rows ``(count, min, max, mean, M2)`` into ``(count, min, max, mean, std)`` (ddof=0).

    Examples
    --------
    >>> combine(np.array([[2, 1, 3, 2, 2], [2, 2, 2, 2, 0]], float))
    (4.0, 1.0, 3.0, 2.0, 0.7071067811865476)
    """
    rows = np.asarray(rows, np.float64).reshape(-1, 5)
    rows = rows[rows[:, 0] > 0]
    if len(rows) == 0:
        return 0.0, math.nan, math.nan, math.nan, math.nan
    n = rows[:, 0].sum()
    with np.errstate(invalid="ignore", over="ignore"):  # infinities make NaN, as in numpy
        mean = float((rows[:, 0] * rows[:, 3]).sum() / n)
        m2 = float(rows[:, 4].sum() + (rows[:, 0] * (rows[:, 3] - mean) ** 2).sum())
    return float(n), float(rows[:, 1].min()), float(rows[:, 2].max()), mean, math.sqrt(max(m2, 0.0) / n)


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.kind not in "biuf":
        raise UsageError(f"stats needs real numbers; the files hold {dtype} ({dtype.str})")


def run(args: argparse.Namespace) -> int:
    roi = roi_kwargs(args)
    selection = selection_for(
        args.path,
        args,
        file_filter=args.filter,
        key=args.key,
        quiet=args.quiet,
        storage_options=storage_options(args),
        roi=roi,
        device=args.device,
    )
    status = report_bad(selection)
    if not selection.good:
        raise UsageError(f"{args.path}: no readable file")
    paths = [p for p, _ in selection.good]
    # A dataset holds one dtype and ndim: files of each (dtype, ndim) form their own, built from the
    # headers the selection read (no second read), and files of one shape within it are stacked
    # (one task for many small files).
    groups: list[list[int]] = []
    arrays = []
    for members in kinds_of(selection):
        ds = dataset_of(selection, members, key=args.key, device=args.device, roi=roi)
        _check_dtype(ds.dtype)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for j, shape in enumerate(ds.shapes):
            by_shape.setdefault(shape, []).append(j)
        for local in by_shape.values():
            arrays.append(partials(ds[local].stack()))
            groups.append([members[j] for j in local])
    nbytes = sum(header.nbytes for _, (_, header, _, _) in selection.good)
    results = compute(args, arrays, threads=on_threads(args, nbytes=nbytes, nfiles=len(paths)))
    per_file: list[np.ndarray] = [np.empty((0, 5))] * len(paths)
    for members, result in zip(groups, results):
        result = np.asarray(result).reshape(len(members), -1, 5)
        for i, rows in zip(members, result):
            per_file[i] = rows
    total = combine(np.concatenate(per_file))
    dtypes = [header.dtype for _, (_, header, _, _) in selection.good]
    files = [
        dict(zip(FIELDS, combine(rows)), path=selection.name(p), dtype=dtype)
        for p, rows, dtype in zip(paths, per_file, dtypes)
    ]
    _print(args, total, files, np.result_type(*set(dtypes)))
    return status


def _json(field: str, v: float, count: float) -> float | int | str | None:
    """A statistic as strict JSON: ``count`` an int; of no values ``null``; NaN and infinities as strings."""
    if field == "count":
        return int(v)
    return None if count == 0 else json_number(v)


def extreme(x: float, dtype: np.dtype) -> str:
    """A min or max as a table shows it: every digit that tells it apart in ``dtype``.

    (float32 ``0.99999994`` is not ``1``.)

    Whole numbers print whole, with thousands separators; other floats as numpy's shortest
    text that reads back as the same value of ``dtype`` (positional from 1e-4 to 1e16, else
    scientific).

    Examples
    --------
    >>> extreme(0.9999999403953552, np.dtype("f4")), extreme(0.1, np.dtype("f8")), extreme(3.0, np.dtype("f2"))
    ('0.99999994', '0.1', '3')
    >>> extreme(65504.0, np.dtype("f2")), extreme(3e38, np.dtype("f4")), extreme(-70000.0, np.dtype("i4"))
    ('65,504', '3e+38', '-70,000')
    """
    if not math.isfinite(x):
        return number(x)
    if dtype.kind in "biu" or (x.is_integer() and abs(x) < 1e16):  # (whole: every digit, 65504 not 65500)
        return number(int(x))
    value = dtype.type(x) if dtype.kind == "f" else np.float64(x)
    if x == 0 or 1e-4 <= abs(x) < 1e16:
        return np.format_float_positional(value, unique=True, trim="-")
    return np.format_float_scientific(value, unique=True, trim="-")


def _print(args: argparse.Namespace, total: tuple[float, ...], files: list[dict[str, Any]], dtype: np.dtype) -> None:
    totals = dict(zip(FIELDS, total))
    summary: dict[str, Any] = {**totals, "dtype": dtype}
    if args.json:
        payload: dict[str, Any] = {k: _json(k, totals[k], totals["count"]) for k in FIELDS}
        if args.per_file:
            payload["files"] = [{"path": f["path"], **{k: _json(k, f[k], f["count"]) for k in FIELDS}} for f in files]
        emit_json(payload)
        return

    def row(name: str, s: dict[str, Any]) -> list[str]:
        shown = [extreme(s["min"], s["dtype"]), extreme(s["max"], s["dtype"]), number(s["mean"]), number(s["std"])]
        return [name, number(int(s["count"])), *(shown if s["count"] else ["-"] * 4)]

    rows = [row(f["path"], f) for f in files] if args.per_file else []
    rows.append(row(f"all {number(len(files))} files", summary))
    print(table(rows, ["file", *FIELDS], right=(1, 2, 3, 4, 5)))
