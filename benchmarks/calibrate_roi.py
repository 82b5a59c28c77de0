"""Measure the coefficients of npydask's ROI cost model (:mod:`npydask.plan.read_strategy`) on this machine.

Prints each coefficient, how it was measured, a ``Costs(...)`` literal to
paste into ``npydask/plan/read_strategy.py`` as ``MEASURED``, and then the
model's prediction beside the measured time of every strategy for a few ROI
shapes (each strategy forced with the ``roi_strategy`` setting), so a wrong
coefficient shows.

Every figure is the calling thread's CPU time (``time.thread_time_ns``:
system time included, time spent descheduled excluded), a low quantile
(``--quantile``, default the 25th percentile) of many timed repetitions, so
other processes on a shared machine disturb it little. Files are written
once into a temporary folder (or ``--data DIR``), then dropped from the page
cache (``POSIX_FADV_DONTNEED``, these files only) and read back with
``pread`` as the benchmarks warm theirs: page faults on pages just written
cost a tenth of those on pages read back here (the page cache's folios
differ), and datasets are read back.

=================  ==========================================================================
coefficient        measured as
=================  ==========================================================================
``syscall``        ``preadv`` loop (npydask's span reader) of N reads: the intercept per read
``kernel_byte``    the same, slope per byte over read sizes 64 B .. 128 KiB
``iovec``          one ``preadv`` of 64 KiB in k iovecs (built as the ``runs`` strategy
                   builds them): slope per iovec
``copy_*``         ``numpy.copyto`` of a strided uint8 grid out of a scratch buffer:
                   least squares over calls, rows and bytes
``mapped_byte``    the same copy out of a mapping whose pages are already mapped
``map``            ``mmap`` + ``munmap`` of a file
``fault, page``    a fresh mapping touched once every 4 KiB and once every 64/256 KiB:
                   per fault-around window and per page
=================  ==========================================================================

Usage::

    python benchmarks/calibrate_roi.py [--data DIR] [--repeat N] [--quantile Q] [--files N]
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import npydask  # noqa: E402
from npydask import config  # noqa: E402
from npydask.plan.read_strategy import MEASURED, STRATEGIES, Costs, choose  # noqa: E402
from npydask.plan.region import Box, plan_read  # noqa: E402
from npydask.storage import (  # noqa: E402
    FdReader,  # noqa: E402
    acquire,
    clear_cache,
)
from npydask.testing import drop_page_cache  # noqa: E402

SHAPE = (64, 256, 256)
DTYPE = np.dtype("<f4")
MIB = 1 << 20


def quantile_ns(fn: Callable[[], object], repeat: int, q: float, per: int = 1) -> float:
    """The ``q`` quantile of ``repeat`` timings of ``fn``, in nanoseconds per ``per`` operations."""
    fn()  # (first call: imports, allocations)
    times = []
    clock = time.thread_time_ns
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return float(np.quantile(times, q)) / per


def fit(x: list[list[float]], y: list[float]) -> np.ndarray:
    """Non-negative least squares of ``y ~ x`` (coefficients clipped at 0 and refitted)."""
    a, b = np.asarray(x, float), np.asarray(y, float)
    keep = np.ones(a.shape[1], bool)
    while True:
        coef = np.zeros(a.shape[1])
        coef[keep] = np.linalg.lstsq(a[:, keep], b, rcond=None)[0]
        if (coef >= 0).all():
            return coef
        keep &= coef > 0


def make_files(folder: str, n: int) -> list[str]:
    rng = np.random.default_rng(7)
    paths = []
    for i in range(n):
        p = os.path.join(folder, f"cal-{i:03d}.npy")
        if not os.path.exists(p) or os.path.getsize(p) != 128 + int(np.prod(SHAPE)) * DTYPE.itemsize:
            np.save(p, rng.random(SHAPE, dtype=DTYPE))
        paths.append(p)
    return paths


def read_back(paths: list[str]) -> None:
    """Drop these files from the page cache and read them back (as a dataset written earlier is read)."""
    for p in paths:
        drop_page_cache(p)
    _common.warm_page_cache(paths)


def measure(paths: list[str], repeat: int, q: float) -> tuple[Costs, dict[str, str]]:
    notes: dict[str, str] = {}
    read_back(paths)
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        f = acquire(paths[0])
        reader = FdReader(f.fd, f.path)
        size = f.identity.size

        # -- syscall + kernel_byte: npydask's span loop, N reads of s bytes spread over the file
        rows_x, rows_y = [], []
        n = 64
        for s in (64, 4096, 32768, 131072):
            offsets = [128 + k * (size // n - s) // 1 for k in range(n)]
            offsets = [min(o, size - s) for o in offsets]
            buf = np.empty(n * s, np.uint8)
            parts = [[buf.data[j * s : (j + 1) * s]] for j in range(n)]  # (os.preadv's buffer lists)
            t = quantile_ns(partial(reader.read_many, parts, s, offsets), repeat, q, per=n)  # (runs here)
            rows_x.append([1.0, s])
            rows_y.append(t)
        syscall, kernel_byte = fit(rows_x, rows_y)
        notes["syscall"] = "per read: " + ", ".join(f"{int(x[1])} B {y:.0f} ns" for x, y in zip(rows_x, rows_y))

        # -- iovec: one preadv of 64 KiB in k pieces, the pieces made per call as the runs strategy makes them
        total = 64 * 1024
        xs, ys = [], []
        fd = fds[0]
        for k in (1, 16, 64, 256, 512):
            run = total // (2 * k)
            dest = np.empty(k * run, np.uint8)
            gap = memoryview(bytearray(run))
            gaps = [gap] * (k - 1)

            def one(dest=dest, k=k, run=run, gaps=gaps) -> None:
                rows = list(dest.reshape(k, run))
                bufs: list[object] = [None] * (2 * k - 1)
                bufs[0::2] = rows
                bufs[1::2] = gaps
                os.preadv(fd, bufs, 4096)

            xs.append([1.0, 2 * k - 1])
            ys.append(quantile_ns(one, repeat, q))
        _, iovec = fit(xs, ys)
        notes["iovec"] = "per preadv of 64 KiB: " + ", ".join(f"{int(x[1])} iovecs {y:.0f} ns" for x, y in zip(xs, ys))

        # -- copy_call, copy_row, copy_byte: numpy strided copies out of a hot scratch buffer
        xs, ys = [], []
        for run in (16, 128, 1024, 8192):
            for rows in (16, 256, 2048):
                if run * rows > 4 * MIB:
                    continue
                stride = run * 4
                src = np.zeros(rows * stride, np.uint8)
                dst = np.empty((rows, run), np.uint8)
                grid = np.ndarray((rows, run), np.uint8, src, 0, (stride, 1))
                xs.append([1.0, rows, rows * run])
                ys.append(quantile_ns(lambda d=dst, g=grid: np.copyto(d, g), repeat, q))
        copy_call, copy_row, copy_byte = fit(xs, ys)
        notes["copy"] = f"{len(xs)} grids of 16..2048 rows of 16 B..8 KiB"

        # -- mapped_byte: the same copies out of a warm mapping (pages mapped before)
        m = mmap.mmap(fds[1], 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        whole = np.frombuffer(m, np.uint8)
        int(whole[::4096].sum())  # fault every page in
        xs2, ys2 = [], []
        for run in (128, 1024, 8192):
            for rows in (256, 2048):
                stride = SHAPE[2] * 4 * (1 if run <= 1024 else 16)
                if rows * stride > len(whole) - 4096:
                    continue
                grid = np.ndarray((rows, run), np.uint8, whole, 4096, (stride, 1))
                dst = np.empty((rows, run), np.uint8)
                t = quantile_ns(lambda d=dst, g=grid: np.copyto(d, g), repeat, q)
                xs2.append([rows * run])
                ys2.append(max(t - copy_call - rows * copy_row, 0.0))
        (mapped_byte,) = fit(xs2, ys2)
        del grid, whole
        m.close()

        # -- map: mmap + munmap of a file, as the mmap backend maps one
        def map_once() -> None:
            mm = mmap.mmap(fds[2], 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            np.frombuffer(mm, np.uint8)
            mm.close()

        map_cost = quantile_ns(map_once, repeat, q)

        # -- fault + page: fresh mappings, one byte touched every `step` bytes over 8 MiB
        span = 8 * MIB
        per_touch = {}
        for step in (4096, 65536, 262144):
            touches = span // step

            def touch(step=step, fd=fds[3]) -> None:
                mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
                a = np.frombuffer(mm, np.uint8)
                int(a[4096 : 4096 + span : step].sum())
                del a
                mm.close()

            per_touch[step] = (quantile_ns(touch, repeat, q) - map_cost) / touches
        window = MEASURED.window_bytes
        big = min(per_touch[65536], per_touch[262144])
        fault = max((big - per_touch[4096]) * (window // 4096) / (window // 4096 - 1), 0.0)
        page = max(big - fault, 0.0)
        notes["fault"] = "per touch: " + ", ".join(f"every {s // 1024} KiB {t:.0f} ns" for s, t in per_touch.items())
    finally:
        for fd in fds:
            os.close(fd)
    costs = Costs(
        syscall=round(float(syscall), 1),
        kernel_byte=round(float(kernel_byte), 4),
        iovec=round(float(iovec), 1),
        copy_call=round(float(copy_call), 1),
        copy_row=round(float(copy_row), 2),
        copy_byte=round(float(copy_byte), 4),
        mapped_byte=round(float(mapped_byte), 4),
        map=round(float(map_cost), 1),
        fault=round(float(fault), 1),
        page=round(float(page), 1),
        window_bytes=window,
    )
    return costs, notes


ROIS = {
    "32^3 ROI of 64x256x256 f4 (P3)": ((16, 100, 100), (48, 132, 132)),
    "32x32x256 rows (whole x)": ((16, 100, 0), (48, 132, 256)),
    "32x256x64 (long rows)": ((16, 0, 64), (48, 256, 128)),
    "8 planes 8x8 (tiny, far apart)": ((0, 0, 0), (64, 8, 8)),
    "64x64x1 (a column)": ((0, 0, 7), (64, 64, 8)),
}


def validate(paths: list[str], costs: Costs, repeat: int, q: float) -> list[list[str]]:
    """Per ROI: the model's estimate and the measured time of each forced strategy, per file."""
    rows = []
    n = len(paths)
    header = npydask.read_header(paths[0])
    opts = config.read_options()
    for name, (start, stop) in ROIS.items():
        plan = plan_read(header, Box(start, stop))
        choice = choose(plan, opts.gap_bytes, opts.max_span_bytes, STRATEGIES, "auto", costs)

        def opened_only() -> None:
            clear_cache()
            for p in paths:
                npydask.read_region(p, (0, 0, 0), (1, 1, 1), backend="auto")

        base = quantile_ns(opened_only, max(3, repeat // 4), q, per=n)
        measured = {}
        for strategy in STRATEGIES:
            with config.set(roi_strategy=strategy):
                # (timed here, in this iteration: the defaults bind this ROI)
                def fresh(start: tuple[int, ...] = start, stop: tuple[int, ...] = stop) -> None:
                    clear_cache()  # every file opened and mapped afresh, as a dataset larger than the cache
                    for p in paths:
                        npydask.read_region(p, start, stop, backend="auto")

                measured[strategy] = quantile_ns(fresh, max(3, repeat // 4), q, per=n) - base
        best = min(measured, key=measured.__getitem__)
        rows.append(
            [
                name,
                f"{plan.n_runs}x{plan.run_nbytes} B",
                choice.strategy,
                best,
                *(f"{choice.estimates_ns[s] / 1e3:.1f} / {measured[s] / 1e3:.1f}" for s in STRATEGIES),
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--data", metavar="DIR", help="keep the calibration files here (default: a temp folder)")
    ap.add_argument("--repeat", type=int, default=200, help="timed repetitions per point (default 200)")
    ap.add_argument("--quantile", type=float, default=0.25, help="quantile of the timings kept (default 0.25)")
    ap.add_argument("--files", type=int, default=16, help="files of 64x256x256 float32 to read (default 16)")
    args = ap.parse_args(argv)
    _common.print_environment(_common.environment())
    folder = args.data or tempfile.mkdtemp(prefix="npydask-calibrate-")
    try:
        paths = make_files(folder, max(args.files, 4))
        os.sync()
        costs, notes = measure(paths, args.repeat, args.quantile)
        print(f"# coefficients, ns (quantile {args.quantile} of {args.repeat} runs each)")
        for field in costs.__dataclass_fields__:
            now, before = getattr(costs, field), getattr(MEASURED, field)
            print(f"  {field:12s} {now:12g}   (in npydask: {before:g})")
        for k, v in notes.items():
            print(f"  # {k}: {v}")
        print("\n# paste into npydask/plan/read_strategy.py:")
        print("MEASURED = Costs(")
        for field in costs.__dataclass_fields__:
            if field != "window_bytes":
                print(f"    {field}={getattr(costs, field)!r},")
        print(")\n")
        _common.warm_page_cache(paths)
        print(
            f"# per file, us: model (these coefficients) / measured (fresh open file each; {len(paths)} files, "
            "open cost subtracted)"
        )
        _common.table(
            validate(paths, costs, args.repeat, args.quantile), ["ROI", "runs", "model picks", "fastest", *STRATEGIES]
        )
    finally:
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
