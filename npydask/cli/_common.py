"""What every command shares: one-line errors, numbers, progress, compute, tables, options.

Choosing the files (and scanning their headers) is :mod:`npydask.cli._select`'s.

Results go to stdout; progress and messages go to stderr. Input is checked
before any cluster starts: a problem with the command line or a single
input file raises :class:`UsageError` (one line, exit status 2); files of a
folder that cannot be read are listed with their reasons (exit status 1).

Progress (off with ``--quiet``) is one line on stderr
(:mod:`npydask.cli._progress`). Scanning more than ``SCAN_COUNT_FROM`` files
shows a running count; computing shows dask's progress bar (the local
scheduler's ``ProgressBar`` or ``distributed.progress``). A job under
``TINY_BYTES`` and ``TINY_FILES`` runs on local threads; a larger one, or
any job given ``--workers`` or ``--scheduler``, on a cluster.

Numbers are printed by :func:`number` (and byte counts by :func:`size`), the
same way in every command. Messages of the library name Python arguments
(``recursive=True``); :func:`cli_words` says them as the flags of the
command line (``--recursive``).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from npydask.cli._errors import UsageError
from npydask.cli._progress import progress_line
from npydask.cli._remote import add_storage_option
from npydask.dataset.npy_dataset import human_bytes
from npydask.dataset.order import SORTS

__all__ = [
    "SCAN_COUNT_FROM",
    "TINY_BYTES",
    "TINY_FILES",
    "add_roi_options",
    "add_shard_options",
    "check_scheduler",
    "cli_words",
    "compute",
    "duration",
    "number",
    "on_threads",
    "parse_list",
    "roi_kwargs",
    "say",
    "size",
    "table",
]

T = TypeVar("T")

SCAN_COUNT_FROM = 2000  # scanning more files than this shows "scanned N / M files"
TINY_BYTES = 64 * 2**20  # a job under TINY_BYTES and TINY_FILES runs on threads, not a LocalCluster
TINY_FILES = 256
DEFAULT_WORKERS = 2


def say(*parts: object) -> None:
    """A message for the user, on stderr."""
    print(*parts, file=sys.stderr, flush=True)


# -- numbers: one way throughout ----------------------------------------------------------------


def number(x: float | int) -> str:
    """Every number the command line prints: integers with thousands separators, floats to 6 digits.

    Examples
    --------
    >>> number(50000), number(2.5), number(1234567.0), number(float("-inf")), number(float("nan"))
    ('50,000', '2.5', '1.23457e+06', '-inf', 'nan')
    """
    if isinstance(x, int):
        return f"{x:,}"
    if not math.isfinite(x):
        return str(x)
    return f"{x:,.6g}"


def size(nbytes: int) -> str:
    """A byte count in binary units (``512 B``, ``1.5 KiB``), as the dataset's repr shows it."""
    return human_bytes(nbytes)


def duration(seconds: float) -> str:
    """A time span: milliseconds below a second, seconds above (``12.3 ms``, ``4.56 s``)."""
    return f"{number(round(seconds * 1e3, 1))} ms" if seconds < 1 else f"{number(round(seconds, 2))} s"


def json_number(x: float | int) -> float | int | str:
    """``x`` for strict JSON: ``"nan"``, ``"inf"`` and ``"-inf"`` as strings (``float()`` reads them back)."""
    return x if isinstance(x, int) or math.isfinite(x) else str(x)


def emit_json(payload: Any) -> None:
    """A JSON result on stdout (and nothing else there); strict JSON, no bare ``NaN`` or ``Infinity``."""
    text = json.dumps(payload, indent=2, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


Replacement = str | Callable[[re.Match[str]], str]
"""What ``re.Pattern.sub`` puts in: a template, or a function of the match."""

_CLI_WORDS: tuple[tuple[re.Pattern[str], Replacement], ...] = tuple(
    (re.compile(pattern), flag)
    for pattern, flag in (
        (r"\brecursive=True\b", "--recursive"),
        (r"\bout_of_bounds_policy='(\w+)' or '(\w+)'", r"--oob \1 or --oob \2"),
        (r"\bout_of_bounds_policy='?(\w+)'?", r"--oob \1"),
        (r"\bkey=(['\"]?)([^'\" ]+)\1", r"--key \2"),
        (r"\bfile_filter\b", "--filter"),
        (r"\bheaders='(\w+)'", r"--headers \1"),
        (r"\bfile_root\b", "PATH"),
        (r"\bfill_value\b", "--fill-value"),
        (r"\b(rel_)?roi_(start|end|shape|axes)\b", lambda m: "--" + m.group(0).replace("_", "-")),
    )
)


def cli_words(message: str) -> str:
    """A library message with its Python arguments said as command-line flags.

    Examples
    --------
    >>> cli_words("no file found under file_root 'x'; pass recursive=True to search deeper folders")
    "no file found under PATH 'x'; pass --recursive to search deeper folders"
    >>> cli_words("use out_of_bounds_policy='trim_to_shape' or 'pad'; roi_axes=[0] key='x'")
    'use --oob trim_to_shape or --oob pad; --roi-axes=[0] --key x'
    """
    for pattern, flag in _CLI_WORDS:
        message = pattern.sub(flag, message)
    return message


def parse_list(text: str | None, kind: Callable[[str], T], option: str) -> list[T] | None:
    """``"1,2,3"`` as ``[1, 2, 3]`` (``None`` stays ``None``); a bad item is a :class:`UsageError`."""
    if text is None:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError as e:
        raise UsageError(f"{option} {text!r}: expected comma-separated {kind.__name__} values ({e})") from e


def table(rows: Sequence[Sequence[object]], headers: Sequence[str], *, right: Sequence[int] = ()) -> str:
    """An aligned plain-text table (columns in ``right`` right-aligned)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def report_bad(selection: Any, *, summary: bool = False) -> int:
    """List on stderr the files a :class:`~npydask.cli._select.Selection` could not read.

    Returns the exit status they call for.
    """
    return report_errors(selection.bad, len(selection.paths), summary=summary)


def report_errors(bad: Sequence[tuple[str, str]], total: int, *, summary: bool = False) -> int:
    """``bad`` (path, reason) of ``total`` files on stderr (only their count when ``summary``); 1 if any."""
    if not bad:
        return 0
    if summary:
        say(f"{number(len(bad))} of {number(total)} files could not be read (run without --summary to list them)")
        return 1
    say(f"{number(len(bad))} of {number(total)} files could not be read:")
    for _, reason in bad:
        say(f"  {reason}")
    return 1


# -- computing ----------------------------------------------------------------------------------


def on_threads(args: Any, *, nbytes: int, nfiles: int) -> bool:
    """Whether a job of ``nfiles`` files and ``nbytes`` bytes runs on local threads (no cluster).

    Tiny jobs (under ``TINY_BYTES`` and ``TINY_FILES``) do, unless
    ``--scheduler`` or ``--workers`` asks for a cluster: starting a
    ``LocalCluster`` takes about a second, more than such a job.
    """
    return args.scheduler is None and args.workers is None and nbytes < TINY_BYTES and nfiles < TINY_FILES


def compute(args: Any, values: list[Any], *, threads: bool) -> list[Any]:
    """Compute ``values`` on local threads or on a cluster, with a progress bar on stderr."""
    if threads:
        import dask
        from dask.diagnostics import ProgressBar

        with progress_line(args.quiet) as line:
            bar = ProgressBar(out=line) if line is not None else contextlib.nullcontext()
            with bar:
                return list(dask.compute(*values, scheduler="threads"))
    with client(args.scheduler, args.workers, quiet=args.quiet) as c:
        return cluster_compute(c, values, quiet=args.quiet)


def cluster_compute(c: Any, values: list[Any], *, quiet: bool = False) -> list[Any]:
    """Compute on the client with ``distributed.progress`` on stderr (it draws on stdout)."""
    futures = c.compute(values)
    with progress_line(quiet) as line:
        if line is not None:
            from distributed import progress

            with contextlib.redirect_stdout(line):
                progress(futures)
    return c.gather(futures)


def check_scheduler(address: str) -> None:
    """Refuse a scheduler address that no scheduler can have, before any work (one line, exit 2).

    Raises
    ------
    UsageError
        An unknown scheme (``foo://bar``), a malformed host (``tcp://[::1``),
        a host name that does not resolve, or an ``inproc://`` address
        (a scheduler inside another process's memory, unreachable from here).
    """
    from distributed.comm import parse_address, resolve_address

    expected = "expected the address of a running dask scheduler, such as tcp://HOST:8786"
    try:
        scheme, _ = parse_address(address)
        if scheme == "inproc":
            raise ValueError(
                "an inproc:// scheduler lives inside one process and cannot be reached from the command line"
            )
        resolve_address(address)
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"cannot reach the scheduler at {address!r} ({expected}): {e}") from e


@contextlib.contextmanager
def client(scheduler: str | None, workers: int | None, *, quiet: bool = False) -> Iterator[Any]:
    """A distributed client on ``scheduler``, or on an embedded local cluster (no dashboard).

    Raises
    ------
    UsageError
        The scheduler address is malformed (``foo://bar``, ``tcp://[::1``)
        or nothing answers there within 5 s; ``workers`` is below 1.
    """
    import logging

    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    if scheduler:
        try:
            c = Client(scheduler, timeout="5s")
        except (OSError, ValueError, TypeError) as e:
            raise UsageError(
                f"cannot reach the scheduler at {scheduler!r} (is a dask scheduler running there?): {e}"
            ) from e
        with c:
            yield c
        return
    workers = DEFAULT_WORKERS if workers is None else workers
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, found {workers}")
    if not quiet:
        say(f"starting an embedded local cluster ({workers} worker{'s' if workers != 1 else ''}, 1 thread each)")
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            scheduler_kwargs={"dashboard": False},  # any free port: no "port in use" warning
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


# -- options ------------------------------------------------------------------------------------


def add_cluster_options(parser: Any) -> None:
    """``--scheduler`` and ``--workers``."""
    parser.add_argument("--scheduler", metavar="ADDRESS", help="use this dask scheduler instead of an embedded cluster")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"run on an embedded cluster of this many workers, 1 thread each (default: local threads for "
        f"jobs under {size(TINY_BYTES)} and {TINY_FILES} files, else {DEFAULT_WORKERS} workers)",
    )


def add_quiet_option(parser: Any) -> None:
    """``--quiet``."""
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress or messages on stderr (errors still)")


def add_sort_option(parser: Any) -> None:
    """``--sort {bytes,natural}``: the order of a folder's files."""
    parser.add_argument(
        "--sort",
        choices=SORTS,
        default="bytes",
        help="order of a folder's files: 'bytes' (DALI's byte-wise order, the default: slice_10 "
        "before slice_2) or 'natural' (runs of digits by value: slice_2 before slice_10)",
    )


def add_selection_options(parser: Any, *, several: bool = False) -> None:
    """``PATH`` (``PATH...`` when ``several``), ``--filter``, ``--recursive``, ``--sort`` and ``--key``."""
    if several:
        parser.add_argument(
            "paths",
            metavar="PATH",
            nargs="+",
            help=".npy or .npz files or folders of them, or object URLs (s3://bucket/prefix/, "
            "https://host/a.npy); shell patterns such as 'scans/*.npy' too",
        )
    else:
        parser.add_argument(
            "path",
            metavar="PATH",
            help="a .npy file, or a folder of them; or an object URL (s3://bucket/a.npy) or prefix "
            "(s3://bucket/scans/)",
        )
    parser.add_argument("--filter", default="*.npy", help="glob on file names in a folder (default '*.npy')")
    parser.add_argument("--recursive", action="store_true", help="look in every subfolder, not only the first level")
    add_sort_option(parser)
    parser.add_argument("--key", help="member of .npz archives to read (e.g. 'x')")
    add_storage_option(parser)
    add_quiet_option(parser)


_ROI_FLAGS: tuple[tuple[str, Callable[[str], Any]], ...] = (
    ("roi_start", int),
    ("roi_end", int),
    ("roi_shape", int),
    ("rel_roi_start", float),
    ("rel_roi_end", float),
    ("rel_roi_shape", float),
    ("roi_axes", int),
)
"""DALI's ROI arguments, as ``--roi-start`` ... flags take them (comma-separated)."""


def add_roi_options(parser: Any) -> None:
    """DALI's ROI arguments (``--roi-start 1,2`` ...), ``--oob`` and ``--fill-value``."""
    roi = parser.add_argument_group("region of interest (DALI fn.readers.numpy arguments, comma-separated)")
    for name, kind in _ROI_FLAGS:
        word = kind.__name__
        roi.add_argument("--" + name.replace("_", "-"), metavar=word.upper() + "S", help=f"{word}s, e.g. 1,2")
    roi.add_argument(
        "--oob", choices=("error", "trim_to_shape", "pad"), default="error", help="out-of-bounds policy (default error)"
    )
    roi.add_argument("--fill-value", type=float, default=0.0, help="value of padded cells (default 0)")


def roi_kwargs(args: Any) -> dict[str, Any]:
    """The ROI flags as ``open_dataset``'s keyword arguments (a bad list is a :class:`UsageError`)."""
    kw: dict[str, Any] = {}
    for name, kind in _ROI_FLAGS:
        value = parse_list(getattr(args, name), kind, "--" + name.replace("_", "-"))
        if value is not None:
            kw[name] = value
    kw["out_of_bounds_policy"] = args.oob
    kw["fill_value"] = args.fill_value
    return kw


def add_shard_options(parser: Any) -> None:
    """``--shard-id`` and ``--num-shards``: DALI's contiguous shards of the file list, as ``open_dataset`` cuts them."""
    group = parser.add_argument_group("shard (DALI's shard_id and num_shards: a contiguous part of the file list)")
    group.add_argument("--shard-id", type=int, default=0, metavar="K", help="the shard to take, from 0 (default 0)")
    group.add_argument("--num-shards", type=int, default=1, metavar="N", help="shards of the list (default 1)")
