"""The MRI tour of DALI's numpy-reader notebook, with npydask on Dask.

DALI's notebook reads a folder of 2-D MRI slices with ``fn.readers.numpy``
and shows its region-of-interest arguments. The same arguments work in
``npydask.open_dataset``, with the same files in the same order and the same
ROI shapes and values, but each file's ROI is a lazy task that reads only
the bytes inside it (and pads in memory what lies outside the file).

Run::

    python examples/mri_roi.py [--out DIR]

Every result is compared with numpy slicing; the exit status is 1 if one differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import numpy as np

import npydask


def write_slices(folder: str, n: int = 12, shape: tuple[int, int] = (96, 80)) -> list[str]:
    """``n`` synthetic axial slices (a bright ellipse, a dark ventricle, noise), some in Fortran order."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[-1 : 1 : shape[0] * 1j, -1 : 1 : shape[1] * 1j].astype(np.float32)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k in range(n):
        brain = (y / 0.8) ** 2 + (x / (0.6 + 0.01 * k)) ** 2 < 1
        ventricle = (y / 0.2) ** 2 + (x / 0.1) ** 2 < 1
        img = (800 * brain - 500 * ventricle + rng.normal(0, 20, shape)).astype(np.float32)
        p = os.path.join(folder, f"slice_{k:03d}.npy")
        np.save(p, np.asfortranarray(img) if k % 4 == 3 else img)
        paths.append(p)
    return paths


def check(name: str, got: np.ndarray, expected: np.ndarray) -> bool:
    same = got.shape == expected.shape and np.array_equal(got, expected)
    print(f"{name:58s} {str(got.shape):16s} {'equal to numpy' if same else 'DIFFERS from numpy'}")
    return same


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for the slices (default: a temporary folder, removed)")
    args = p.parse_args(argv)
    root = args.out or tempfile.mkdtemp(prefix="npydask-mri-")
    try:
        return tour(root)
    finally:
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)


def tour(root: str) -> int:
    paths = write_slices(os.path.join(root, "slices"))
    images = [np.load(p) for p in paths]
    folder = os.path.join(root, "slices")
    ok = True

    ds = npydask.open_dataset(folder)
    print(ds)
    ok &= check("whole slices, stacked", ds.stack().compute(), np.stack(images))

    # Absolute ROI: rows 30..70, columns 20..60 of every slice.
    ds = npydask.open_dataset(folder, roi_start=(30, 20), roi_end=(70, 60))
    ok &= check(
        "roi_start=(30, 20), roi_end=(70, 60)", ds.stack().compute(), np.stack([a[30:70, 20:60] for a in images])
    )

    # Relative ROI (DALI rounds start and end half away from zero, in float32).
    ds = npydask.open_dataset(folder, rel_roi_start=(0.25, 0.25), rel_roi_end=(0.75, 0.75))
    r0, r1 = round(96 * 0.25), round(96 * 0.75)
    c0, c1 = round(80 * 0.25), round(80 * 0.75)
    ok &= check(
        "rel_roi_start=(.25, .25), rel_roi_end=(.75, .75)",
        ds.stack().compute(),
        np.stack([a[r0:r1, c0:c1] for a in images]),
    )

    # One axis only: the other keeps its whole extent.
    ds = npydask.open_dataset(folder, roi_start=[10], roi_shape=[50], roi_axes=[1])
    ok &= check("roi_axes=[1]: columns 10..60, all rows", ds.stack().compute(), np.stack([a[:, 10:60] for a in images]))

    # Out of bounds: "pad" fills with fill_value, "trim_to_shape" cuts to the file.
    ds = npydask.open_dataset(folder, roi_start=(70, 60), roi_shape=(40, 40), out_of_bounds_policy="pad", fill_value=-1)
    padded = np.full((len(images), 40, 40), -1, np.float32)
    padded[:, :26, :20] = np.stack([a[70:, 60:] for a in images])
    ok &= check("out_of_bounds_policy='pad', fill_value=-1", ds.stack().compute(), padded)
    ds = npydask.open_dataset(folder, roi_start=(70, 60), roi_shape=(40, 40), out_of_bounds_policy="trim_to_shape")
    ok &= check("out_of_bounds_policy='trim_to_shape'", ds.stack().compute(), np.stack([a[70:, 60:] for a in images]))
    try:
        npydask.open_dataset(folder, roi_start=(70, 60), roi_shape=(40, 40))
        ok = False
        print("out_of_bounds_policy='error' accepted an ROI outside the slices")
    except npydask.RoiError as e:
        print(f"{'out_of_bounds_policy=error (the default)':58s} RoiError: {str(e)[:60]}...")

    # Shards: each process of a job opens its own contiguous part, as DALI's shard_id/num_shards.
    parts = [npydask.open_dataset(folder, shard_id=k, num_shards=3) for k in range(3)]
    print(f"{'3 shards of ' + str(len(images)) + ' files':58s} {[len(s) for s in parts]}")
    ok &= sum((s.files for s in parts), []) == sorted(paths)

    # Per-file ROIs: one row per file of the whole list (before sharding).
    starts = [[k, k] for k in range(len(images))]
    ds = npydask.open_dataset(folder, roi_start=starts, roi_shape=(16, 16))
    ok &= check(
        "per-file roi_start (row k: [k, k]), roi_shape=(16, 16)",
        ds.stack().compute(),
        np.stack([a[k : k + 16, k : k + 16] for k, a in enumerate(images)]),
    )

    print(f"\nall results match numpy: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
