"""Shared helpers for the npydask benchmark scripts.

Timing (median of repeats), one variant's result, page-cache warming, a
plain-text table, the common command-line arguments and a JSON dump. Standard library only, so the
scripts run anywhere npydask does.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

SIZES = ("tiny", "small", "full")
WARM_BLOCK = 16 * 1024 * 1024


def parser(description: str, *, default_size: str = "small", default_repeat: int = 5) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with ``--size``, ``--repeat`` and ``--json``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--size", choices=SIZES, default=default_size, help=f"problem size (default {default_size})")
    p.add_argument(
        "--repeat", type=int, default=default_repeat, help=f"timed runs per variant (default {default_repeat})"
    )
    p.add_argument("--json", metavar="OUT", help="also write the results to this JSON file")
    return p


def cpu_seconds() -> float:
    """User plus system CPU time of this process so far (all threads)."""
    return time.process_time()


def measure(
    fn: Callable[[], Any],
    repeat: int,
    *,
    setup: Callable[[], Any] | None = None,
    no_gc: bool = False,
    cpu: list[float] | None = None,
) -> tuple[list[float], Any]:
    """Run ``fn`` ``repeat`` times; return the wall times and the last result.

    ``setup`` runs untimed before every run. With ``no_gc`` the cyclic garbage
    collector is off while ``fn`` runs (as :mod:`timeit` does). If ``cpu`` is
    a list, the process CPU time (user + system, all threads) of each run is
    appended to it: on a shared machine it moves much less than wall time.
    """
    times: list[float] = []
    result = None
    for _ in range(max(1, repeat)):
        if setup is not None:
            setup()
        result = None
        enabled = gc.isenabled()
        if no_gc:
            gc.disable()
        try:
            c0 = cpu_seconds()
            t0 = time.perf_counter()
            result = fn()
            t1 = time.perf_counter()
            c1 = cpu_seconds()
        finally:
            if no_gc and enabled:
                gc.enable()
        times.append(t1 - t0)
        if cpu is not None:
            cpu.append(c1 - c0)
    return times, result


def median(xs: Sequence[float]) -> float:
    """The median (0.0 for an empty sequence)."""
    return statistics.median(xs) if xs else 0.0


@dataclass
class Result:
    """One variant's timings: ``group`` is the script's grouping (a set of files, a scheduler)."""

    group: str
    variant: str
    times: list[float]
    nbytes: int
    value: Any = None  # what the variant computed, checked against the reference (None: not checked)
    note: str = ""
    cpu: list[float] = field(default_factory=list)
    median: float = field(init=False)
    cpu_median: float = field(init=False)

    def __post_init__(self) -> None:
        self.median = median(self.times)
        self.cpu_median = median(self.cpu)

    @property
    def gbps(self) -> float:
        """Payload bytes per second of the median run, in GB/s (1e9)."""
        return self.nbytes / self.median / 1e9 if self.median else float("inf")


def warm_page_cache(paths: Iterable[str], block: int = WARM_BLOCK) -> int:
    """Read every file with ``os.pread`` in ``block``-byte pieces; returns the bytes read.

    The machine this was written on evicts idle page cache within minutes, so
    the read benchmarks call this right before each timed variant.
    """
    total = 0
    buf = bytearray(block)
    view = memoryview(buf)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            offset = 0
            while True:
                n = os.preadv(fd, [view], offset)
                if n <= 0:
                    break
                offset += n
                total += n
        finally:
            os.close(fd)
    return total


def fmt_seconds(s: float) -> str:
    """Seconds with a unit that keeps three significant digits readable."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], *, file: Any = None) -> str:
    """Format ``rows`` as an aligned plain-text table, print it, and return it."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        # first column left-aligned, the rest right-aligned
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    out = [line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]]
    text = "\n".join(out)
    print(text, file=file or sys.stdout, flush=True)
    return text


def environment() -> dict[str, Any]:
    """Versions and machine facts worth recording next to numbers."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    for mod in ("numpy", "dask", "npydask"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # pragma: no cover - report what is there
            info[mod] = None
    return info


def print_environment(info: dict[str, Any]) -> None:
    print("# " + ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` (plus the environment) to ``path`` if one was given."""
    if not path:
        return
    payload = {"environment": environment(), **payload}
    with open(path, "w", encoding="utf8") as f:
        json.dump(payload, f, indent=2, default=str)
        f.write("\n")
    print(f"# wrote {path}", flush=True)
