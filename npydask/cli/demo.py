"""``npydask demo``: the MRI tour of DALI's numpy-reader notebook, on an embedded cluster.

It writes a synthetic MRI-like set (a folder of 2-D slices, and a folder of
3-D volumes of different depths, some in Fortran order), then shows: the
``info`` table, lazy opening (with the bytes it read), a ROI read with
padding, per-volume statistics computed on the cluster, figures of what
npydask is for measured in the run on larger files beside their numpy
comparisons (:mod:`npydask.cli._figures`: the bytes a ROI reads, opening a
folder lazily, a ROI from every volume side by side, the memory of a sum over
a file larger than the chunk budget), and (when matplotlib is installed) a
PNG of a few slices. Every result is checked against numpy; the exit status
is 1 if one disagrees. The sample set and the figures' files are removed at
the end unless ``--out`` names a folder to keep them in.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

import npydask
from npydask.cli._common import add_cluster_options, add_quiet_option, compute, duration, number, say, size, table
from npydask.cli._figures import write_and_show
from npydask.cli._measure import measure
from npydask.errors import install_hint

__all__ = ["add_parser", "make_mri_set", "run"]

HELP = """\
examples:
  npydask demo                      write the sample set to a temporary folder, tour it, remove it
  npydask demo --out ./mri          keep the sample set, the figures' files (256 MiB) and the PNG in ./mri
  npydask demo --scheduler tcp://10.0.0.5:8786
"""

SHAPE = (128, 128)  # in-plane size of slices and volumes
DEPTHS = (40, 48, 56, 64, 52, 44)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="write a synthetic MRI set and tour it: info, lazy reads, ROI with pad, stats on a cluster, "
        "measured figures against numpy",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", help="folder for the sample set (default: a temporary folder, removed)")
    add_cluster_options(p)
    add_quiet_option(p)
    p.set_defaults(func=run)


def _phantom(depth: int, seed: int) -> np.ndarray:
    """A smooth synthetic head: skull, brain, ventricles and noise, float32."""
    rng = np.random.default_rng(seed)
    z, y, x = np.meshgrid(
        np.linspace(-1, 1, depth, dtype=np.float32),
        *(np.linspace(-1, 1, n, dtype=np.float32) for n in SHAPE),
        indexing="ij",
    )
    head = (z / 0.95) ** 2 + (y / 0.85) ** 2 + (x / 0.75) ** 2 < 1
    brain = (z / 0.8) ** 2 + (y / 0.7) ** 2 + (x / 0.6) ** 2 < 1
    ventricles = (z / 0.3) ** 2 + (y / 0.15) ** 2 + ((abs(x) - 0.15) / 0.08) ** 2 < 1
    vol = 300 * head + 500 * brain - 400 * ventricles + rng.normal(0, 15, (depth, *SHAPE))
    return vol.astype(np.float32)


def make_mri_set(root: str) -> tuple[list[str], list[str]]:
    """Write ``slices/`` (2-D slices of one volume) and ``volumes/`` (3-D, ragged depths)."""
    slices_dir, volumes_dir = os.path.join(root, "slices"), os.path.join(root, "volumes")
    os.makedirs(slices_dir, exist_ok=True)
    os.makedirs(volumes_dir, exist_ok=True)
    base = _phantom(64, 0)
    slices = []
    for k in range(base.shape[0]):
        p = os.path.join(slices_dir, f"slice_{k:03d}.npy")
        np.save(p, base[k])
        slices.append(p)
    volumes = []
    for i, depth in enumerate(DEPTHS):
        p = os.path.join(volumes_dir, f"patient_{i:02d}.npy")
        vol = _phantom(depth, i + 1)
        np.save(p, np.asfortranarray(vol) if i % 3 == 2 else vol)  # a few Fortran-ordered files
        volumes.append(p)
    return slices, volumes


def run(args: argparse.Namespace) -> int:
    """Tour the sample set in ``--out`` (kept) or a temporary folder (removed), and leave nothing else.

    The embedded cluster's workers keep their scratch space in a temporary
    folder of the demo's own, removed at the end (dask's default,
    ``$TMPDIR/dask-scratch-space``, would outlive the demo).
    """
    import dask

    root = args.out or tempfile.mkdtemp(prefix="npydask-demo-")
    scratch = tempfile.mkdtemp(prefix="npydask-demo-dask-")
    try:
        with dask.config.set({"temporary-directory": scratch}):
            return _tour(args, root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)


def _tour(args: argparse.Namespace, root: str) -> int:
    ok = True
    t0 = time.perf_counter()
    slices, volumes = make_mri_set(root)
    total = sum(os.path.getsize(p) for p in slices + volumes)
    print(
        f"== wrote {len(slices)} slices and {len(volumes)} volumes ({size(total)}) under {root} "
        f"in {duration(time.perf_counter() - t0)}"
    )

    print("\n== npydask info volumes/  (headers only)")
    ds_rows = []
    for p in volumes:
        h = npydask.read_header(p)
        ds_rows.append(
            [
                os.path.basename(p),
                "x".join(map(str, h.shape)),
                h.dtype.name,
                "F" if h.fortran_order else "C",
                f"{h.version[0]}.{h.version[1]}",
                size(h.nbytes),
            ]
        )
    print(table(ds_rows, ["path", "shape", "dtype", "order", "npy", "size"], right=(5,)))

    print("\n== lazy opening: open_dataset(slices/).stack()")

    def open_slices() -> tuple[Any, Any]:
        ds = npydask.open_dataset(os.path.join(root, "slices"))
        return ds, ds.stack()

    opened = measure(open_slices, runs=1, warm_up=False)  # the first opening, as a user's
    slice_ds, stack = opened.value
    read = "n/a" if opened.bytes_read is None else number(opened.bytes_read)
    print(
        f"{slice_ds}\n-> {stack.shape} {stack.dtype}, {math.prod(stack.numblocks)} tasks, "
        f"opened and built in {duration(opened.seconds)}, reading {read} bytes (headers) "
        f"of {number(sum(h.nbytes for h in slice_ds.headers))} bytes of payload"
    )

    print(
        "\n== ROI with padding: a 16x64x64 window hanging over the corner of every volume (DALI's roi_start/roi_shape)"
    )
    roi = dict(roi_start=[20, 96, 96], roi_shape=[16, 64, 64], out_of_bounds_policy="pad", fill_value=-1)
    vol_ds = npydask.open_dataset(os.path.join(root, "volumes"), **roi)
    crops = vol_ds.stack().compute()
    expected = np.full((len(volumes), 16, 64, 64), -1, np.float32)
    for i, p in enumerate(volumes):
        expected[i, :, :32, :32] = np.load(p)[20:36, 96:128, 96:128]
    same = np.array_equal(crops, expected)
    ok &= same
    print(
        f"crops {crops.shape}: each reads only its 16x32x32 in-file box and pads the rest with -1; "
        f"equal to numpy: {same}"
    )

    print("\n== per-volume statistics on the cluster")
    from npydask.cli.stats import combine, partials

    full = npydask.open_dataset(os.path.join(root, "volumes"))
    parts = [partials(full[[i]].stack()) for i in range(len(full))]
    t = time.perf_counter()
    results = compute(args, parts, threads=False)  # the tour shows a cluster, small as its data is
    took = time.perf_counter() - t
    rows = []
    for p, r in zip(volumes, results):
        n, lo, hi, mean, std = combine(r)
        a = np.load(p).astype(np.float64)
        close = np.isclose(mean, a.mean(), rtol=1e-9) and np.isclose(std, a.std(), rtol=1e-9)
        good = close and lo == a.min() and hi == a.max()
        ok &= bool(good)
        rows.append(
            [
                os.path.basename(p),
                number(int(n)),
                number(lo),
                number(hi),
                number(mean),
                number(std),
                "yes" if good else "NO",
            ]
        )
    print(table(rows, ["volume", "count", "min", "max", "mean", "std", "= numpy"], right=(1, 2, 3, 4, 5)))
    print(f"({duration(took)} on the cluster, float64 accumulation)")

    ok &= write_and_show(os.path.join(root, "figures"))

    _png(root, slices)
    print(f"\nall results match numpy: {ok}")
    return 0 if ok else 1


def _png(root: str, slices: list[str]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say(f"(matplotlib is not installed: no PNG; {install_hint('matplotlib')} to get one)")
        return
    picks = [slices[k] for k in (16, 28, 40, 52)]
    fig, axes = plt.subplots(1, len(picks), figsize=(3 * len(picks), 3))
    for ax, p in zip(axes, picks):
        ax.imshow(npydask.read_region(p), cmap="gray")
        ax.set_title(os.path.basename(p))
        ax.axis("off")
    out = os.path.join(root, "slices.png")
    fig.savefig(out, dpi=80, bbox_inches="tight")
    plt.close(fig)
    print(f"\nsaved {out}")
