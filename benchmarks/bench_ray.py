"""Ray Data: ``npydask.ray.read_npy`` against Ray's own ``ray.data.read_numpy``, on one local Ray instance.

=======  ==============================  =================================  ==========
size     volumes (float32)               one big file (float32)             ROI
=======  ==============================  =================================  ==========
tiny     4 of 16x64x64 (1 MiB)           64x64x256 (4 MiB)                  16^3
small    16 of 32x256x256 (128 MiB)      512x256x256 (128 MiB)              32^3
full     64 of 64x256x256 (1 GiB)        4096x256x256 (1 GiB)               32^3
=======  ==============================  =================================  ==========

Ray is started once (2 CPUs, no dashboard) and serves every variant, whose
dataset is built inside the timed run (planning included). The page cache is
warmed before every run. Three groups (``ratio``: speed over the group's
reference, ``ray.data.read_numpy``):

* ``volumes``: every volume through ``iter_batches(batch_size=8)``,
  samples/s. Goal: npydask >= 2x read_numpy.
* ``big``: the big file with ``concatenate=True, override_num_blocks=16``
  (one row per plane, the file split across 16 read tasks by byte range),
  summed over ``iter_batches``; read_numpy reads it whole in one task. Goal:
  >= 2x faster. Shown too: the read tasks and the bytes each reads (from the
  plan), and the bytes this process read (``/proc/self/io`` ``rchar``, every
  descriptor, Ray's sockets included) while planning and counting: the
  headers, not the payload. Also shown: the time of the same read tasks
  called in this process, and Ray's floor for as many tasks of one row
  (``range_tensor``): with few cores, Ray's per-task cost sets the time.
* ``roi``: the same ROI of every volume. npydask reads the ROI's rows only
  (rows closer than the coalescing gap are read as one run, so per plane
  the span from its first to its last ROI byte); read_numpy reads each file
  whole (``read_binary_files`` + ``np.load``, one row a file) and slices. The bytes a sample costs are measured
  by running one npydask read task in this process (``rchar``), against the
  ROI's bytes, its per-plane spans and the file's. Goal: <= 1.5x the spans
  (as ``bench_remote.py``'s R1).

Every variant's samples are checked against ``numpy.load`` (per-sample sums,
or the total within a relative 1e-4). Each time is the median of
``--repeat`` runs. The exit status is 1 only when results disagree; a FAIL
goal is reported. Without Ray Data the script says so, writes
``{"skipped": reason}`` to ``--json`` and exits 0.

Usage::

    python benchmarks/bench_ray.py [--size tiny|small|full] [--repeat N] [--data DIR] [--json out.json]
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _datasets import make_set  # noqa: E402

GOAL = 2.0
BATCH = 8
BLOCKS = 16


@dataclass(frozen=True)
class Size:
    n_volumes: int
    volume_shape: tuple[int, ...]
    big_shape: tuple[int, ...]
    roi_start: tuple[int, ...]
    roi_shape: tuple[int, ...]


SIZES = {
    "tiny": Size(4, (16, 64, 64), (64, 64, 256), (0, 20, 20), (16, 16, 16)),
    "small": Size(16, (32, 256, 256), (512, 256, 256), (0, 100, 100), (32, 32, 32)),
    "full": Size(64, (64, 256, 256), (4096, 256, 256), (16, 100, 100), (32, 32, 32)),
}


def rchar() -> int:
    """Bytes this process has read through read syscalls so far (``/proc/self/io``), or -1 where unknown."""
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def start_ray() -> Any:
    import ray
    import ray.data

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
    return ray


def check(ds: Any, rows_per_sample: int, want: list[float]) -> bool:
    """Whether ``ds`` holds the samples of ``want`` (sorted per-sample sums).

    One row a sample: every sample's sum is compared. Several rows a sample
    (read_numpy's rows are a file's first-axis elements): the row count and
    the total.
    """
    sums: list[float] = []
    for b in ds.iter_batches(batch_size=BATCH * rows_per_sample):
        d = b["data"]
        sums += d.reshape(len(d), -1).sum(axis=1, dtype=np.float64).tolist()
    if rows_per_sample == 1:
        return len(sums) == len(want) and np.allclose(sorted(sums), want, rtol=1e-6)
    return len(sums) == len(want) * rows_per_sample and np.isclose(sum(sums), sum(want), rtol=1e-6)


def count_rows(ds: Any, rows_per_sample: int = 1) -> int:
    """Samples through ``iter_batches`` (batches of ``BATCH`` samples' rows)."""
    n = sum(len(b["data"]) for b in ds.iter_batches(batch_size=BATCH * rows_per_sample))
    return n // rows_per_sample


def total(ds: Any) -> float:
    return float(sum(b["data"].sum(dtype=np.float64) for b in ds.iter_batches(batch_size=BATCH)))


def timed(fn: Callable[[], Any], files: list[str], repeat: int) -> tuple[float, Any]:
    _common.warm_page_cache(files)
    times, value = _common.measure(fn, repeat, setup=lambda: _common.warm_page_cache(files))
    return _common.median(times), value


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(__doc__.splitlines()[0], default_size="small", default_repeat=3)
    p.add_argument("--data", help="folder for the data sets (kept; default: a temporary folder)")
    args = p.parse_args(argv)
    try:
        import ray.data  # noqa: F401
    except ImportError as e:
        why = f"Ray Data is not installed ({e}): pip install 'npydask[ray]'"
        print(f"# skipped: {why}", flush=True)
        _common.write_json(args.json, {"benchmark": "ray", "size": args.size, "skipped": why})
        return 0
    import npydask.ray

    size = SIZES[args.size]
    folder = args.data or tempfile.mkdtemp(prefix="npydask-bench-ray-")
    ray = start_ray()
    try:
        rng = np.random.default_rng(20261123)
        f4 = np.dtype("<f4")
        vdir = os.path.join(folder, "volumes-" + "x".join(map(str, (size.n_volumes, *size.volume_shape))))
        volumes, _ = make_set(vdir, "vol", size.n_volumes, size.volume_shape, rng, f4)
        bdir = os.path.join(folder, "big-" + "x".join(map(str, size.big_shape)))
        (big,), _ = make_set(bdir, "big", 1, size.big_shape, rng, f4)
        rows, results, goals, facts, ok = [], [], [], {}, True

        def record(group: str, variant: str, t: float, n: int, ref: float | None, unit: str) -> float:
            ratio = 1.0 if ref is None else ref / t
            rows.append([group, variant, _common.fmt_seconds(t), f"{n / t:,.1f} {unit}", f"{ratio:.2f}x"])
            results.append({"group": group, "variant": variant, "median_s": t, "per_s": n / t, "ratio": ratio})
            return ratio

        def samples(group: str, peers: dict[str, tuple[Callable[[], Any], int]], want: list[float]) -> float:
            """Check then time each variant's samples/s through iter_batches; the last one's ratio."""
            nonlocal ok
            ref, r = None, float("nan")
            for variant, (make, rows_per_sample) in peers.items():
                if not check(make(), rows_per_sample, want):
                    print(f"MISMATCH: {group} / {variant} gives other samples than numpy", file=sys.stderr)
                    ok = False
                    continue
                t, n = timed(  # (the closure runs here, in this iteration)
                    lambda make=make, rows=rows_per_sample: count_rows(make(), rows), volumes, args.repeat
                )
                r = record(group, variant, t, n, ref, "samples/s")
                ref = ref or t
            return r

        # -- volumes: samples/s through iter_batches(batch_size=8) -------------------------------------
        # read_numpy makes a row of each element of a file's first axis: its batches hold as many rows as
        # 8 volumes have (the same bytes a batch), and its samples/s count volumes' worth of rows.
        planes = size.volume_shape[0]
        want = sorted(float(np.load(f).sum(dtype=np.float64)) for f in volumes)
        peers = {
            "ray.data.read_numpy(files)": (lambda: ray.data.read_numpy(volumes), planes),
            "npydask.ray.read_npy(root)": (lambda: npydask.ray.read_npy(vdir), 1),
        }
        r = samples("volumes", peers, want)
        goals.append(
            [
                "volumes: read_npy samples/s over read_numpy's",
                f"{r:.2f}x",
                f">= {GOAL:.1f}x",
                "PASS" if r >= GOAL else "FAIL",
            ]
        )

        # -- big: one file split across read tasks by byte range -----------------------------------------
        want_total = float(np.load(big, mmap_mode="r").sum(dtype=np.float64))
        c0 = rchar()
        planned = npydask.ray.read_npy(bdir, concatenate=True, override_num_blocks=BLOCKS)
        counted = planned.count()
        facts["big: bytes read by this process while planning and counting (rchar, all descriptors)"] = rchar() - c0
        facts["big: file bytes"] = os.path.getsize(big)
        assert counted == size.big_shape[0], counted
        source = npydask.ray.NpyDatasource(
            npydask.open_dataset(bdir),
            column="data",
            index_column="index",
            path_column=None,
            concatenate=True,
            axis=0,
            block_size="128MiB",
            override_num_blocks=BLOCKS,
        )
        tasks = source.get_read_tasks(BLOCKS)
        row = int(np.prod(size.big_shape[1:])) * 4
        per_task = [(t.read_fn.box.stop[0] - t.read_fn.box.start[0]) * row for t in tasks]
        facts["big: read tasks"] = len(tasks)
        facts["big: payload bytes each task reads"] = sorted(set(per_task))
        # what the tasks cost apart from Ray: all of them called in this process; and Ray's own floor for
        # as many tasks doing nothing (on a machine with few cores, it sets the time of the split read)
        t, _ = timed(lambda: [list(task()) for task in tasks], [big], args.repeat)
        facts[f"big: the {BLOCKS} read tasks called in this process, median ms"] = round(t * 1e3, 1)
        t, _ = timed(
            lambda: ray.data.range_tensor(BLOCKS, shape=(1,), override_num_blocks=BLOCKS).materialize(), [], args.repeat
        )
        facts[f"big: Ray's floor, {BLOCKS} tasks of one row materialized, median ms"] = round(t * 1e3, 1)
        peers = {
            "ray.data.read_numpy([file])": lambda: ray.data.read_numpy([big], override_num_blocks=BLOCKS),
            f"read_npy(concatenate=True, override_num_blocks={BLOCKS})": lambda: npydask.ray.read_npy(
                bdir, concatenate=True, override_num_blocks=BLOCKS
            ),
        }
        ref = None
        for variant, make in peers.items():
            got = total(make())
            if not np.isclose(got, want_total, rtol=1e-4):
                print(f"MISMATCH: big / {variant} sums to {got}, numpy to {want_total}", file=sys.stderr)
                ok = False
                continue
            t, _ = timed(lambda make=make: total(make()), [big], args.repeat)  # (runs here, in this iteration)
            r = record("big", variant, t, os.path.getsize(big) / 2**20, ref, "MiB/s")
            ref = ref or t
        goals.append(
            [
                f"big: sum over iter_batches, read_npy({BLOCKS} tasks) speed over read_numpy's",
                f"{r:.2f}x",
                f">= {GOAL:.1f}x",
                "PASS" if r >= GOAL else "FAIL",
            ]
        )

        # -- roi: the same ROI of every volume -----------------------------------------------------------
        start, shape = size.roi_start, size.roi_shape
        box = tuple(slice(a, a + n) for a, n in zip(start, shape))
        want = sorted(float(np.load(f)[box].sum(dtype=np.float64)) for f in volumes)

        def roi_of_whole(row: dict[str, Any]) -> dict[str, np.ndarray]:
            return {"data": np.load(io.BytesIO(row["bytes"]))[box]}

        peers = {
            # read_numpy's rows are planes, and a file's planes may land in several blocks: the whole-file
            # way to a ROI per sample in Ray is a row per file's bytes, loaded and sliced
            "read_binary_files(files).map(np.load, ROI)": (
                lambda: ray.data.read_binary_files(volumes).map(roi_of_whole),
                1,
            ),
            "read_npy(root, roi_start, roi_shape)": (
                lambda: npydask.ray.read_npy(vdir, roi_start=list(start), roi_shape=list(shape)),
                1,
            ),
        }
        samples("roi", peers, want)
        roi_ds = npydask.open_dataset(vdir, roi_start=list(start), roi_shape=list(shape))
        one = npydask.ray.NpyDatasource(
            roi_ds[:1],
            column="data",
            index_column="index",
            path_column=None,
            concatenate=False,
            axis=0,
            block_size="128MiB",
            override_num_blocks=None,
        ).get_read_tasks(1)[0]
        c0 = rchar()
        one.read_fn()
        read = rchar() - c0
        roi_bytes = int(np.prod(shape)) * 4
        strides = np.cumprod((1, *size.volume_shape[::-1]))[::-1][1:] * 4  # bytes between neighbours, per axis
        spans = shape[0] * int((shape[1] - 1) * strides[1] + shape[2] * 4)  # first to last ROI byte of each plane
        facts["roi: bytes one sample's read task read (rchar)"] = read
        facts["roi: the ROI's bytes"] = roi_bytes
        facts["roi: the ROI's per-plane spans (bytes)"] = spans
        facts["roi: the file's bytes"] = os.path.getsize(volumes[0])
        goals.append(
            [
                "roi: bytes read per sample over the ROI's per-plane spans",
                f"{read / spans:.2f}x",
                "<= 1.50x",
                "PASS" if read <= 1.5 * spans else "FAIL",
            ]
        )

        print(
            f"# size={args.size}: {size.n_volumes} volumes of {size.volume_shape}, one file of {size.big_shape}, "
            f"ROI {shape} at {start} (float32); batches of {BATCH}; median of {args.repeat}; "
            "ratio: speed over the group's first row"
        )
        _common.table(rows, ["group", "variant", "median", "rate", "ratio"])
        print()
        _common.table([[k, v] for k, v in facts.items()], ["fact", "value"])
        print()
        _common.table(goals, ["goal", "measured", "target", "verdict"])
        print(f"# samples equal numpy in every variant: {'yes' if ok else 'NO'}")
        _common.write_json(
            args.json,
            {
                "benchmark": "ray",
                "size": args.size,
                "results": results,
                "facts": facts,
                "goals": [dict(zip(("goal", "measured", "target", "verdict"), g)) for g in goals],
                "results_agree": ok,
            },
        )
        return 0 if ok else 1
    finally:
        ray.shutdown()
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
