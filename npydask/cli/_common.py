"""What every command shares: one-line errors, file selection, tolerant scans, a cluster, tables.

Results go to stdout; progress and messages go to stderr. Input is checked
before any cluster starts: a problem with the command line or a single
input file raises :class:`UsageError` (one line, exit status 2); files of a
folder that cannot be read are listed with their reasons (exit status 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from npydask.backends._batch import Scanned
from npydask.dataset import _human as human
from npydask.dataset import scan_headers
from npydask.discovery import select_files

__all__ = ["Selection", "UsageError", "client", "human", "parse_list", "say", "select", "table"]

T = TypeVar("T")


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2."""


def say(*parts: object) -> None:
    """A message for the user, on stderr."""
    print(*parts, file=sys.stderr, flush=True)


def emit_json(payload: Any) -> None:
    """A JSON result on stdout (and nothing else there)."""
    json.dump(payload, sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()


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


@dataclass(frozen=True)
class Selection:
    """The files a command reads: ``root`` is the folder given (``None`` for a single file)."""

    root: str | None
    paths: list[str]
    good: list[tuple[str, Scanned]]
    bad: list[tuple[str, str]]

    def name(self, path: str) -> str:
        """``path`` as shown: relative to the folder given, else as given."""
        return os.path.relpath(path, self.root) if self.root is not None else path


def select(path: str, *, file_filter: str = "*.npy", recursive: bool = False, key: str | None = None) -> Selection:
    """The files under ``path`` (a file or a folder) with their headers; unreadable ones listed apart.

    Raises
    ------
    UsageError
        ``path`` does not exist, holds no matching file, or is a single file
        that cannot be read as ``.npy`` (or as the ``.npz`` member ``key``).
    """
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file or folder")
    root = path if os.path.isdir(path) else None
    if root is None:
        paths = [path]
    else:
        try:
            paths = select_files(root, file_filter=file_filter, recursive=recursive)
        except (ValueError, OSError) as e:
            raise UsageError(str(e)) from e
    good: list[tuple[str, Scanned]] = []
    bad: list[tuple[str, str]] = []
    for p, result in zip(paths, scan_headers(paths, key=key)):
        if isinstance(result, BaseException):
            reason = result.args[0] if isinstance(result, KeyError) and result.args else result
            bad.append((p, _reason(p, reason)))
        else:
            good.append((p, result))
    if root is None and bad:
        raise UsageError(bad[0][1] + _npz_hint(path, key))
    return Selection(root, paths, good, bad)


def _reason(path: str, error: object) -> str:
    text = str(error.strerror if isinstance(error, OSError) and error.strerror else error)
    return text if path in text else f"{path}: {text}"


def _npz_hint(path: str, key: str | None) -> str:
    if key is None and path.endswith(".npz"):
        return " (an .npz archive: name a member with --key)"
    return ""


def report_bad(selection: Selection) -> int:
    """List the files that could not be read on stderr; the exit status they call for."""
    if not selection.bad:
        return 0
    say(f"{len(selection.bad)} of {len(selection.paths)} files could not be read:")
    for _, reason in selection.bad:
        say(f"  {reason}")
    return 1


@contextlib.contextmanager
def client(scheduler: str | None, workers: int) -> Iterator[Any]:
    """A distributed client on ``scheduler``, or on an embedded local cluster (no dashboard)."""
    import logging

    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    if scheduler:
        try:
            c = Client(scheduler, timeout="5s")
        except OSError as e:
            raise UsageError(f"cannot reach the scheduler at {scheduler}: {e}") from e
        with c:
            yield c
        return
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, found {workers}")
    say(f"starting an embedded local cluster ({workers} workers, 1 thread each)")
    with LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, Client(cluster) as c:
        yield c


def compute(c: Any, values: list[Any]) -> list[Any]:
    """Compute on the client with a progress bar on stderr (distributed's writes to stdout)."""
    futures = c.compute(values)
    if sys.stderr.isatty():
        from distributed import progress

        with contextlib.redirect_stdout(sys.stderr):
            progress(futures)
    return c.gather(futures)


def add_cluster_options(parser: Any) -> None:
    """``--scheduler`` and ``--workers``."""
    parser.add_argument("--scheduler", metavar="ADDRESS", help="use this dask scheduler instead of an embedded cluster")
    parser.add_argument("--workers", type=int, default=2, help="workers of the embedded cluster (default 2, 1 thread each)")


def add_selection_options(parser: Any) -> None:
    """``PATH``, ``--filter``, ``--recursive`` and ``--key``."""
    parser.add_argument("path", metavar="PATH", help="a .npy file, or a folder of them")
    parser.add_argument("--filter", default="*.npy", help="glob on file names in a folder (default '*.npy')")
    parser.add_argument("--recursive", action="store_true", help="look in every subfolder, not only the first level")
    parser.add_argument("--key", help="member of .npz archives to read (e.g. 'x')")
