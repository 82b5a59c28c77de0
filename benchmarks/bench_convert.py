"""``npydask convert`` of a folder of many small files against ``to_npy_files`` on threads.

Data: a folder of ``(16, 16)`` float32 files (1 KiB of payload each):

=======  ============
size     files
=======  ============
tiny     200
small    5,000
full     50,000
=======  ============

Variants (the outputs are deleted before every run, untimed):

- ``to_npy_files(open_dataset(src), out)`` on dask's threaded scheduler: the
  reference (the Python API doing the same work in one process);
- ``convert src out/`` (a folder of ``.npy`` files), ``convert src out.zarr``
  (one stacked array, the default) and ``convert src out.zarr --layout
  per-file``, each through the command line's ``main()`` in this process,
  with its embedded ``LocalCluster`` (2 workers, 1 thread each) started and
  closed inside the timed run, as a user pays for it;
- the cluster's start and close alone, so its share of each ``convert`` can
  be read off.

The goal (issue 13): every ``convert`` variant runs at least at half the
reference's speed (ratio at most 2). After the timed runs every output is
compared with ``numpy.load`` of its source; the exit status is 1 if any
differs.

Usage::

    python benchmarks/bench_convert.py [--size tiny|small|full] [--repeat N] [--json out.json] [--out DIR]
"""

from __future__ import annotations

import contextlib
import io
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

import npydask  # noqa: E402
from npydask.cli import main as cli_main  # noqa: E402

SIZES = {"tiny": 200, "small": 5000, "full": 50000}
SHAPE = (16, 16)
GOAL = 2.0


@dataclass
class Result(_common.Result):
    ok: bool = True  # the written output equals its source


def make_folder(root: str, n: int) -> list[str]:
    """``n`` files of ``SHAPE`` float32 (values differ per file); their names in order."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    names = [f"f{i:06d}.npy" for i in range(n)]
    for name in names:
        np.save(os.path.join(root, name), rng.standard_normal(SHAPE, dtype=np.float32))
    return names


def clear(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def convert(*argv: str) -> None:
    """The command line in this process; its messages are swallowed, a failure raises."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        status = cli_main(list(argv))
    if status != 0:
        raise RuntimeError(f"npydask convert {' '.join(argv)} exited with {status}: {err.getvalue()}")


def cluster_alone() -> None:
    """Start and close the cluster ``convert --workers 2`` starts (2 worker processes, 1 thread each)."""
    import logging

    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)  # (as the command line quiets it)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            scheduler_kwargs={"dashboard": False},
        ) as cluster,
        Client(cluster),
    ):
        pass


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.splitlines()[0], default_size="small", default_repeat=3)
    ap.add_argument("--out", metavar="DIR", help="work in this folder (default: a temp folder)")
    args = ap.parse_args(argv)
    n = SIZES[args.size]
    _common.print_environment(_common.environment())
    folder = tempfile.mkdtemp(prefix="npydask-bench-convert-", dir=args.out)
    try:
        src = os.path.join(folder, "src")
        names = make_folder(src, n)
        print(f"# size={args.size}: {n} files of {SHAPE} float32 in {src}; median of {args.repeat} runs", flush=True)
        results = run_all(args.repeat, src, names, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if report(results, args, n) else 1


def run_all(repeat: int, src: str, names: list[str], folder: str) -> list[Result]:
    import zarr

    n = len(names)
    nbytes = n * int(np.prod(SHAPE)) * 4
    sources = [np.load(os.path.join(src, name)) for name in names]
    results: list[Result] = []

    def run(variant: str, fn: Callable[[], Any], out: str | None, check: Callable[[], bool], note: str) -> None:
        cpu: list[float] = []
        setup = (lambda: clear(out)) if out else None
        times, _ = _common.measure(fn, repeat, setup=setup, cpu=cpu)
        r = Result("convert", variant, times, nbytes, note=note, cpu=cpu, ok=check())
        if out:
            clear(out)
        results.append(r)
        print(f"  {variant:44s} {_common.fmt_seconds(r.median):>10s}{'' if r.ok else '  MISMATCH'}", flush=True)

    out_dir = os.path.join(folder, "out")
    out_zarr = os.path.join(folder, "out.zarr")

    def npy_ok() -> bool:
        return all(np.array_equal(np.load(os.path.join(out_dir, m)), a) for m, a in zip(names, sources))

    def stacked_ok() -> bool:
        z = zarr.open_array(out_zarr, mode="r")
        return list(z.attrs["files"]) == names and bool(np.array_equal(z[...], np.stack(sources)))

    def per_file_ok() -> bool:
        g = zarr.open_group(out_zarr, mode="r")
        return list(g.attrs["files"]) == names and all(
            np.array_equal(g[m[: -len(".npy")]][...], a) for m, a in zip(names, sources)
        )

    def reference() -> None:
        with dask.config.set(scheduler="threads"):
            npydask.to_npy_files(npydask.open_dataset(src), out_dir)

    dask.compute(dask.delayed(sum)([1, 2]), scheduler="threads")  # thread pool up: not part of any variant
    run("to_npy_files(open_dataset) on threads", reference, out_dir, npy_ok, "reference")
    run("convert src out/ (.npy files)", lambda: convert("convert", src, out_dir), out_dir, npy_ok, "embedded cluster")
    run(
        "convert src out.zarr (stacked)",
        lambda: convert("convert", src, out_zarr),
        out_zarr,
        stacked_ok,
        "embedded cluster",
    )
    run(
        "convert src out.zarr --layout per-file",
        lambda: convert("convert", src, out_zarr, "--layout", "per-file"),
        out_zarr,
        per_file_ok,
        "embedded cluster",
    )
    run("LocalCluster start + close alone", cluster_alone, None, lambda: True, "part of each convert")
    return results


def report(results: list[Result], args: Any, n: int) -> bool:
    ref = results[0]
    rows = []
    for r in results:
        rows.append(
            [
                r.variant,
                f"{r.median:.2f}",
                f"{r.median / ref.median:.2f}x" if ref.median else "",
                f"{n / r.median:.0f}",
                f"{min(r.times):.2f}-{max(r.times):.2f}",
                f"{r.cpu_median:.2f}",
                r.note + ("" if r.ok else "; MISMATCH"),
            ]
        )
    print()
    print(f"# ratio: time over the reference; files/s over {n} files; size={args.size}")
    _common.table(rows, ["variant", "median s", "ratio", "files/s", "min-max s", "cpu s", "note"])
    converts = [r for r in results if r.variant.startswith("convert")]
    met = all(r.median <= GOAL * ref.median for r in converts)
    print(
        f"# goal: every convert at least at half the reference's speed (ratio <= {GOAL:g}): "
        f"{'met' if met else 'NOT met'}"
    )
    ok = all(r.ok for r in results)
    print(f"# every output equals its source (numpy.load): {'yes' if ok else 'NO'}")
    print(f"# load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    _common.write_json(
        args.json,
        {
            "benchmark": "convert",
            "size": args.size,
            "files": n,
            "repeat": args.repeat,
            "results": [
                {
                    "variant": r.variant,
                    "median_s": r.median,
                    "times_s": r.times,
                    "cpu_median_s": r.cpu_median,
                    "ratio": r.median / ref.median if ref.median else None,
                    "ok": r.ok,
                    "note": r.note,
                }
                for r in results
            ],
            "goal_met": met,
            "outputs_agree": ok,
        },
    )
    return ok


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# total {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
