"""Cluster-sharded preprocessing: open a folder, normalise every volume, write a folder.

The end of a typical preprocessing job: each of ``--num-shards`` jobs (here
run one after another; on a cluster, one per node or per SLURM array task)
opens its shard of the input folder with ``open_dataset(shard_id=k,
num_shards=S)``, maps a function over each volume lazily (z-scoring with the
volume's own mean and standard deviation), and writes the results with
``to_npy_files``, mirroring the input's relative names and subfolders. Every
file is read and written by tasks on the cluster's workers: nothing is
gathered on the client, and a failed job leaves no half-written ``.npy``.

Run::

    python examples/preprocessing.py [--size tiny|small] [--out DIR] [--num-shards S] [--scheduler ADDRESS]

At the end every output is compared with the same computation in numpy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import numpy as np

import npydask

SIZES = {"tiny": (6, (16, 32, 32)), "small": (24, (64, 128, 128))}


def write_inputs(folder: str, n: int, shape: tuple[int, ...]) -> None:
    """``n`` volumes of ragged depths in two subfolders (sites), some in Fortran order, int16 as scanners write."""
    rng = np.random.default_rng(7)
    for i in range(n):
        site = os.path.join(folder, f"site_{i % 2}")
        os.makedirs(site, exist_ok=True)
        depth = shape[0] + int(rng.integers(0, 5))
        vol = rng.normal(1000 + 100 * i, 50 + 5 * i, (depth, *shape[1:])).astype(np.int16)
        np.save(os.path.join(site, f"scan_{i:03d}.npy"), np.asfortranarray(vol) if i % 3 == 0 else vol)


def zscore(x):
    """The preprocessing step, on a lazy array: ``(x - mean) / std`` in float32."""
    x = x.astype(np.float32)
    mean = x.mean()
    std = ((x - mean) ** 2).mean() ** 0.5  # (x.std() raises under dask's query-planning engine)
    return ((x - mean) / std).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--out", help="working folder (default: a temporary folder, removed)")
    p.add_argument("--num-shards", type=int, default=2)
    p.add_argument("--scheduler", help="an existing dask scheduler (default: an embedded LocalCluster)")
    args = p.parse_args(argv)
    root = args.out or tempfile.mkdtemp(prefix="npydask-prep-")
    try:
        return run(args, root)
    finally:
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace, root: str) -> int:
    from distributed import Client, LocalCluster

    n, shape = SIZES[args.size]
    src, dst = os.path.join(root, "raw"), os.path.join(root, "normalised")
    write_inputs(src, n, shape)
    if args.scheduler:
        client = Client(args.scheduler)
        cluster = None
    else:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        for k in range(args.num_shards):  # on a real cluster: one job per shard, run at the same time
            ds = npydask.open_dataset(src, shard_id=k, num_shards=args.num_shards)
            names = [os.path.relpath(f, src) for f in ds.files]
            outputs = [zscore(x) for x in ds.arrays()]
            write = npydask.to_npy_files(outputs, dst, names, compute=False)
            client.compute(write, sync=True)
            print(f"shard {k}/{args.num_shards}: {len(ds)} volumes -> {dst} ({', '.join(names)})")
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

    ok = True
    for dirpath, _, files in sorted(os.walk(src)):
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            a = np.load(os.path.join(src, rel)).astype(np.float32)
            expected = (a - a.mean(dtype=np.float64)) / a.std(dtype=np.float64)
            got = np.load(os.path.join(dst, rel))
            good = got.dtype == np.float32 and got.shape == a.shape and np.allclose(got, expected, atol=1e-4)
            ok &= bool(good)
            print(
                f"  {rel}: {got.shape} {got.dtype}, mean {got.mean():+.4f}, std {got.std():.4f}"
                f"{'' if good else '  DIFFERS from numpy'}"
            )
    strays = [f for _, _, fs in os.walk(dst) for f in fs if not f.endswith(".npy")]
    print(f"all outputs match numpy: {ok}; stray temporary files: {len(strays)}")
    return 0 if ok and not strays else 1


if __name__ == "__main__":
    raise SystemExit(main())
