"""Write throughput: ``npydask.to_npy`` / ``to_npy_files`` against ``numpy.save``.

Data (in memory, written to a temp folder or ``--out DIR``):

=======  ===================================  ==================================
size     big array (float32)                  file set
=======  ===================================  ==================================
tiny     (1024, 1024), 4 MiB, 1 MiB chunks    100 arrays of (16, 16) float32
small    (16384, 4096), 256 MiB, 32 MiB       2,000 arrays of (32, 32) float32
full     (65536, 4096), 1 GiB, 64 MiB         2,000 arrays of (64, 64) float32
=======  ===================================  ==================================

Big array: the reference is ``np.save`` of the array already in memory (what
``to_npy`` competes with once a dask array has been computed); then
``np.save`` followed by ``fsync`` (``to_npy`` fsyncs the file and its
folder before returning, so this is the like-for-like reference);
then ``to_npy`` of ``da.from_array(array, chunks=<row slabs>)`` on dask's
default threaded scheduler, and the same with chunks that split every row in
two (two byte runs per row, the pwrite-heavy case).

File set: a ``np.save`` loop (reference), the same loop with an ``fsync``
per file, and ``to_npy_files`` of the numpy arrays (one task per file).

Written files are deleted before every run (untimed); each time is the median
of ``--repeat`` runs. After the timed runs every output is read back with
``numpy.load`` and compared with the source; the exit status is 1 if any
differs (so ``--size tiny`` is a CI smoke test).

Usage::

    python benchmarks/bench_write.py [--size tiny|small|full] [--repeat N] [--json out.json] [--out DIR]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import dask  # noqa: E402
import dask.array as da  # noqa: E402

from npydask.write.npy import to_npy, to_npy_files  # noqa: E402

MiB = 1 << 20


@dataclass(frozen=True)
class Size:
    big_shape: tuple[int, int]
    chunk_bytes: int
    n_files: int
    file_shape: tuple[int, int]


SIZES = {
    "tiny": Size((1024, 1024), 1 * MiB, 100, (16, 16)),
    "small": Size((16384, 4096), 32 * MiB, 2000, (32, 32)),
    "full": Size((65536, 4096), 64 * MiB, 2000, (64, 64)),
}


@dataclass
class Result(_common.Result):
    ok: bool = True  # the written output equals its source


def save_fsync(path: str, array: np.ndarray) -> None:
    """``np.save`` then ``fsync`` of the file and its folder (what to_npy guarantees)."""
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def clear(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.splitlines()[0], default_size="small", default_repeat=3)
    ap.add_argument("--out", metavar="DIR", help="write into this folder (default: a temp folder)")
    args = ap.parse_args(argv)
    size = SIZES[args.size]

    env = _common.environment()
    env["dask_scheduler"] = dask.config.get("scheduler", None) or "threads (default)"
    _common.print_environment(env)

    folder = tempfile.mkdtemp(prefix="npydask-bench-write-", dir=args.out)
    try:
        rng = np.random.default_rng(0)
        big = rng.standard_normal(size.big_shape, dtype=np.float32)
        files = [rng.standard_normal(size.file_shape, dtype=np.float32) for _ in range(size.n_files)]
        print(
            f"# size={args.size}: big {size.big_shape} float32 ({big.nbytes / MiB:g} MiB, "
            f"{size.chunk_bytes // MiB} MiB chunks); {size.n_files} files of {size.file_shape}; "
            f"writing into {folder}; median of {args.repeat} runs",
            flush=True,
        )
        results = run_all(args.repeat, size, big, files, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if report(results, args) else 1


def run_all(repeat: int, size: Size, big: np.ndarray, files: list[np.ndarray], folder: str) -> list[Result]:
    results: list[Result] = []

    def run(
        group: str, name: str, fn: Callable[[], Any], out: str, nbytes: int, check: Callable[[], bool], note: str = ""
    ) -> None:
        cpu: list[float] = []
        times, _ = _common.measure(fn, repeat, setup=lambda: clear(out), cpu=cpu)
        r = Result(group, name, times, nbytes, note=note, cpu=cpu, ok=check())
        clear(out)
        results.append(r)
        if group == "files":
            r.note = (r.note + "; " if r.note else "") + f"{len(files) / r.median:.0f} files/s"
        print(
            f"  {group:5s} {name:44s} {_common.fmt_seconds(r.median):>10s}  {r.gbps:6.3g} GB/s"
            f"{'' if r.ok else '  MISMATCH'}",
            flush=True,
        )

    # first dask compute of a process pays for imports and the thread pool: not part of any variant
    da.ones((4, 4), chunks=2).sum().compute()

    # ---- one big array -----------------------------------------------------------------------
    path = os.path.join(folder, "big.npy")
    row_bytes = big.shape[1] * big.itemsize
    rows = max(1, size.chunk_bytes // row_bytes)

    def big_ok() -> bool:
        got = np.load(path, mmap_mode="r")
        return got.dtype == big.dtype and got.shape == big.shape and bool(np.array_equal(got, big))

    run("big", "np.save", lambda: np.save(path, big), path, big.nbytes, big_ok, "reference, no fsync")
    run("big", "np.save + fsync", lambda: save_fsync(path, big), path, big.nbytes, big_ok)
    x = da.from_array(big, chunks=(rows, big.shape[1]))
    n = x.numblocks[0] * x.numblocks[1]
    run("big", f"to_npy, {n} row-slab chunks", lambda: to_npy(x, path), path, big.nbytes, big_ok, "threads")
    y = da.from_array(big, chunks=(rows * 2, -(-big.shape[1] // 2)))  # same chunk size, half rows
    n = y.numblocks[0] * y.numblocks[1]
    run(
        "big", f"to_npy, {n} chunks splitting rows", lambda: to_npy(y, path), path, big.nbytes, big_ok, "2 runs per row"
    )

    # ---- many small arrays -------------------------------------------------------------------
    out = os.path.join(folder, "set")
    set_bytes = sum(a.nbytes for a in files)
    names = [f"{i:05d}.npy" for i in range(len(files))]

    def set_ok() -> bool:
        return all(np.array_equal(np.load(os.path.join(out, n)), a) for n, a in zip(names, files))

    def save_loop(sync: bool) -> None:
        os.makedirs(out, exist_ok=True)
        for n, a in zip(names, files):
            if sync:
                with open(os.path.join(out, n), "wb") as f:
                    np.save(f, a)
                    f.flush()
                    os.fsync(f.fileno())
            else:
                np.save(os.path.join(out, n), a)
        if sync:
            fd = os.open(out, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

    run("files", "np.save loop", lambda: save_loop(False), out, set_bytes, set_ok, "reference, no fsync")
    run("files", "np.save loop + fsync", lambda: save_loop(True), out, set_bytes, set_ok)
    run("files", "to_npy_files", lambda: to_npy_files(files, out), out, set_bytes, set_ok, "threads, 1 task/file")
    return results


def report(results: list[Result], args: Any) -> bool:
    refs = {g: next(r for r in results if r.group == g) for g in ("big", "files")}
    rows = []
    for r in results:
        ref = refs[r.group]
        rows.append(
            [
                r.group,
                r.variant,
                f"{r.median * 1e3:.1f}",
                f"{r.gbps:.3g}",
                f"{r.median / ref.median:.2f}x" if ref.median else "",
                f"{min(r.times) * 1e3:.1f}-{max(r.times) * 1e3:.1f}",
                f"{r.cpu_median * 1e3:.0f}",
                r.note + ("" if r.ok else "; MISMATCH"),
            ]
        )
    print()
    print(f"# ratio: time over np.save (big) or the np.save loop (files); GB = 1e9 bytes; size={args.size}")
    _common.table(rows, ["grp", "variant", "median ms", "GB/s", "ratio", "min-max ms", "cpu ms", "note"])
    ok = all(r.ok for r in results)
    print(f"# every output equals its source (numpy.load): {'yes' if ok else 'NO'}")
    print(f"# load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    _common.write_json(
        args.json,
        {
            "benchmark": "write",
            "size": args.size,
            "repeat": args.repeat,
            "results": [
                {
                    "group": r.group,
                    "variant": r.variant,
                    "median_s": r.median,
                    "times_s": r.times,
                    "nbytes": r.nbytes,
                    "gb_per_s": r.gbps,
                    "cpu_median_s": r.cpu_median,
                    "ok": r.ok,
                    "note": r.note,
                }
                for r in results
            ],
            "outputs_agree": ok,
        },
    )
    return ok


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# total {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
