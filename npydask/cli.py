"""The ``npydask`` command line: thin argument parsing over the public API.

Results go to stdout; progress and messages to stderr. Bad input prints one
line on stderr and exits with status 2, before any cluster starts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

import numpy as np

import npydask

__all__ = ["main"]

EXAMPLES = """\
examples:
  npydask demo                  write a sample volume, open it lazily, read a region
  npydask demo --out ./sample   keep the sample files in ./sample
"""


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2."""


def _say(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _client(scheduler: str | None, workers: int) -> Iterator[object]:
    """A distributed client on ``scheduler``, or on an embedded local cluster."""
    import logging

    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    if scheduler:
        try:
            client = Client(scheduler, timeout="5s")
        except OSError as e:
            raise UsageError(f"cannot reach the scheduler at {scheduler}: {e}") from e
        with client:
            yield client
        return
    _say(f"starting an embedded local cluster ({workers} workers, 1 thread each)")
    with LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        yield client


def _demo_volume(shape: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    """A smooth synthetic 'MRI' volume: an ellipsoid head with noise."""
    rng = np.random.default_rng(seed)
    z, y, x = np.meshgrid(*(np.linspace(-1, 1, n, dtype=np.float32) for n in shape), indexing="ij")
    head = (z / 0.9) ** 2 + (y / 0.8) ** 2 + (x / 0.7) ** 2 < 1
    brain = (z / 0.7) ** 2 + (y / 0.6) ** 2 + (x / 0.5) ** 2 < 1
    vol = 400 * head + 600 * brain + rng.normal(0, 20, shape)
    return vol.astype(np.float32)


def cmd_demo(args: argparse.Namespace) -> int:
    """Write a sample volume, open it lazily, read a region, compute on a cluster."""
    out_dir = args.out or tempfile.mkdtemp(prefix="npydask-demo-")
    os.makedirs(out_dir, exist_ok=True)
    shape = (96, 128, 128)
    c_path = os.path.join(out_dir, "volume_c.npy")
    f_path = os.path.join(out_dir, "volume_f.npy")
    vol = _demo_volume(shape)
    np.save(c_path, vol)
    np.save(f_path, np.asfortranarray(vol))
    print(f"wrote {c_path} and {f_path} ({vol.nbytes / 2**20:.1f} MiB each, float32 {shape})")

    for path in (c_path, f_path):
        h = npydask.read_header(path)
        order = "F" if h.fortran_order else "C"
        print(
            f"  {os.path.basename(path)}: NPY {h.version[0]}.{h.version[1]}, shape {h.shape}, "
            f"{h.dtype.name}, {order} order, payload at byte {h.data_offset}"
        )

    t0 = time.perf_counter()
    x = npydask.from_npy(c_path, chunks=(16, 128, 128))
    build_ms = (time.perf_counter() - t0) * 1e3
    print(f"from_npy: lazy array {x.shape} in {int(np.prod(x.numblocks))} chunks, built in {build_ms:.2f} ms, name {x.name}")

    start, stop = (40, 32, 32), (56, 96, 96)
    roi = npydask.read_region(f_path, start, stop)
    expected = np.load(f_path)[40:56, 32:96, 32:96]
    print(
        f"read_region {start}..{stop} from the Fortran file: {roi.shape}, "
        f"mean {roi.mean():.2f}, equal to numpy.load slicing: {np.array_equal(roi, expected)}"
    )

    with _client(args.scheduler, args.workers) as client:
        t0 = time.perf_counter()
        x64 = x.astype("f8")
        # std from sums: dask's query-planning engine (2026.8) raises in x.std()
        stats = [x.min(), x.max(), x64.mean(), (x64 * x64).mean()]
        lo, hi, mean, meansq = (float(v) for v in client.compute(stats, sync=True))
        std = max(meansq - mean * mean, 0.0) ** 0.5
        took = time.perf_counter() - t0
    print(f"on the cluster: min {lo:.2f}, max {hi:.2f}, mean {mean:.3f}, std {std:.3f} ({took:.2f} s)")
    ok = np.isclose(mean, vol.mean(dtype=np.float64), rtol=1e-4) and lo == vol.min() and hi == vol.max()
    print(f"matches numpy: {bool(ok)}")
    if not args.out:
        for p in (c_path, f_path):
            os.remove(p)
        os.rmdir(out_dir)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="npydask",
        description="NumPy .npy files as lazy Dask arrays.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"npydask {npydask.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="write a sample volume and show lazy reads on a local cluster")
    demo.add_argument("--out", help="folder for the sample files (default: a temporary folder, removed)")
    demo.add_argument("--scheduler", help="address of an existing dask scheduler")
    demo.add_argument("--workers", type=int, default=2, help="workers of the embedded cluster (default 2)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (UsageError, npydask.NpyFormatError, npydask.RoiError, OSError) as e:
        _say(f"npydask {args.command}: error: {e}")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
