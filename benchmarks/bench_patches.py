"""Training on random patches: ``npydask.Loader(sampler=Uniform)`` against MONAI, TorchIO and DALI.

Every variant delivers one epoch of random 3-D patches, ``per_file`` of
them from each volume, in batches of 8:

=====  ======================================  =======  ========
size   volumes (float32)                       patch    per file
=====  ======================================  =======  ========
tiny   4 of 32x64x64 (512 KiB each)            16^3     4
small  16 of 64x128x128 (4 MiB each)           32^3     4
full   16 of 256x512x512 (256 MiB each, 4 GiB) 64^3     4
=====  ======================================  =======  ========

Local group (``L``), page cache re-warmed before every timed run (``warm``)
or every file's pages dropped (``npydask.testing.drop_page_cache``) before it
(``cold``):

* raw floor: a numpy loop, ``np.load(mmap_mode="r")[box]`` copied per
  patch, batches stacked (one thread, boxes drawn with numpy);
* MONAI: ``LoadImaged`` of the ``.npy`` (NumpyReader), ``EnsureChannelFirstd``
  and ``RandSpatialCropSamplesd(num_samples=per_file)`` in a
  ``monai.data.DataLoader(num_workers=2, persistent_workers=True)`` with 2
  volumes a batch (8 patches);
* TorchIO: a ``Queue`` with a ``UniformSampler``,
  ``samples_per_volume=per_file``, ``num_workers=2``, under a
  ``DataLoader(batch_size=8)``;
* DALI: ``fn.readers.numpy`` on the CPU with
  ``roi_start=fn.random.uniform(...)`` per sample (each file listed
  ``per_file`` times), 2 threads, pipeline built before;
* npydask: ``Loader(ds, 8, sampler=Uniform(patch, per_file=4), shuffle=True)``.

Loaders are built once (untimed, as a training loop builds them) and one
epoch is timed per run; samples/s = samples / median epoch. Bytes per patch:
npydask's from ``loader.stats()`` (``bytes_read`` over the samples); MONAI's
and TorchIO's are the whole volume over the patches taken from it (they load
whole volumes); DALI's CPU reader maps the file and touches the per-plane
spans; the cold runs also report what the block devices delivered
(``pgpgin`` of ``/proc/vmstat``, system-wide). The cold goal compares the
speed-up with the byte ratio: at least 0.6x the ratio of the bytes the disk
delivered per epoch (the counted bytes per patch where a run measured none).
No cache is cleared between warm epochs: a loader keeps its open files and
connections from one epoch to the next, as a training loop does. Before a
cold epoch npydask's open files are closed and DALI's pipeline is built
anew (untimed): pages a mapping holds are not dropped.

Object-storage group (``S``), SeaweedFS started by the script (loopback
only, stopped at exit): the same Loader over ``s3://`` against MONAI's way
with whole-object downloads (obstore GET, ``np.load``, the same transforms,
``DataLoader(num_workers=2)``). Bytes transferred are counted once through a
:class:`~npydask.testing.counting_proxy.CountingProxy` and compared with the
per-plane spans of the epoch's patches (goal: at most 1.5x). Both run on
loopback (reported) and over an emulated 1 Gbit/s link (``--link-mbit``;
``_link``'s kernel shaper where root and ``tc`` allow, else a pacing proxy):
goal at least 0.6x the byte ratio against MONAI.

Foreground group (``F``): 600 ``Foreground(p=0.33)`` draws over 3 epochs
on labels holding one compact box of 1% of the volume: the share of
foreground-centred draws against ``p`` plus or minus 3 binomial standard
deviations, the label bytes the candidate scan read in each epoch (measured
from the process's read calls), nnU-Net's per-batch rule beside them. Grid
group (``G``): ``Loader(sampler=Grid)`` -> a two-channel predictor ->
``Stitcher(weights="gaussian")`` against MONAI's ``sliding_window_inference``
(equal within ``rtol=1e-5``), and the pipeline's peak memory against two
tile batches plus one slab. :mod:`_patch_goals` holds their data, runs and
goal lines.

The npydask rows are checked against numpy: one untimed epoch with
``with_index=True``, every sample equal to ``np.load(mmap_mode="r")`` sliced
by its box, locally and over ``s3://``. A peer that is not installed (or cannot run) prints why and its
rows and goals say ``n/a``. The exit status is 1 only when npydask's samples
disagree with numpy.

Usage::

    python benchmarks/bench_patches.py [--size tiny|small|full] [--repeat N] [--json out.json] [--data DIR]
                                       [--only local,remote,foreground,grid,lookahead] [--link-mbit MBIT]
                                       [--link-via auto|tc|proxy] [--slow-budget S]
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import _link  # noqa: E402
import _patch_goals  # noqa: E402
import _peers  # noqa: E402
from _datasets import clear_npydask_caches, make_set  # noqa: E402
from bench_remote import key_of, plane_spans, start_server, upload  # noqa: E402

import npydask  # noqa: E402
from npydask.samplers import Uniform  # noqa: E402
from npydask.testing import drop_page_cache  # noqa: E402
from npydask.testing.counting_proxy import CountingProxy  # noqa: E402

MiB = 1 << 20
DTYPE = np.dtype("<f4")
BATCH = 8
GOAL_WARM_MONAI = 3.0
GOAL_WARM_TORCHIO = 3.0
GOAL_WARM_DALI = 1.25
GOAL_COLD_OF_BYTES = 0.6
GOAL_REMOTE_BYTES = 1.5
GOAL_LINK_OF_BYTES = 0.6
GOAL_LINK_MBIT = 1000.0


class Size(NamedTuple):
    n_volumes: int
    volume_shape: tuple[int, int, int]
    patch: int
    per_file: int


SIZES = {
    "tiny": Size(4, (32, 64, 64), 16, 4),
    "small": Size(16, (64, 128, 128), 32, 4),
    "full": Size(16, (256, 512, 512), 64, 4),
}


@dataclass
class Row:
    """One variant's epochs: times, this process's CPU, bytes per patch and the disk bytes of cold runs."""

    group: str
    variant: str
    times: list[float]
    cpu: list[float]
    samples: int
    bytes_per_patch: float | None = None
    how_counted: str = ""
    disk_bytes: list[int] = field(default_factory=list)
    note: str = ""
    median: float = field(init=False)

    def __post_init__(self) -> None:
        self.median = _common.median(self.times)

    @property
    def rate(self) -> float:
        return self.samples / self.median if self.median else 0.0


# ---------------------------------------------------------------------------------------------
# data, cache control, checks


def make_volumes(folder: str, size: Size) -> list[str]:
    """The volumes of ``size`` under ``folder`` (written only where missing)."""
    shape = "x".join(map(str, (size.n_volumes, *size.volume_shape)))
    files, made = make_set(
        os.path.join(folder, f"patches-{shape}"),
        "vol",
        size.n_volumes,
        size.volume_shape,
        np.random.default_rng(20261127),
        DTYPE,
    )
    if made:
        os.sync()
    return files


def pgpgin_bytes() -> int:
    """Bytes the block devices delivered so far, system-wide (``pgpgin`` of ``/proc/vmstat``, KiB)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("pgpgin "):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def box_slices(start: Sequence[int], stop: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(int(a), int(b)) for a, b in zip(start, stop))


def mismatches(paths: Sequence[str], batches: Sequence[tuple[np.ndarray, dict[str, np.ndarray]]]) -> int:
    """Samples of ``(batch, index)`` pairs that differ from numpy's slice of their file by their box."""
    maps = [np.load(p, mmap_mode="r") for p in paths]
    bad = 0
    for batch, index in batches:
        for b, f, a, z in zip(np.asarray(batch), index["file"], index["start"], index["stop"]):
            want = maps[int(f)][box_slices(a, z)]
            if b.shape != want.shape or b.dtype != want.dtype or not np.array_equal(b, want):
                bad += 1
    return bad


# ---------------------------------------------------------------------------------------------
# the ways of each library (each returns a function running one epoch and returning its sample count)


def npydask_loader(root: str, size: Size, *, check: bool = False, **open_kw: Any) -> Any:
    """``npydask.Loader(ds, 8, sampler=Uniform(patch, per_file), shuffle=True)`` over ``root``."""
    ds = npydask.open_dataset(root, **open_kw)
    sampler = Uniform((size.patch,) * 3, per_file=size.per_file)
    return npydask.Loader(ds, BATCH, sampler=sampler, shuffle=True, with_index=check)


def stats_of(loader: Any) -> dict[str, Any]:
    """``loader.stats()`` of the last epoch as a dict (a mapping, or an object with those attributes)."""
    s = loader.stats()
    if isinstance(s, Mapping):
        return dict(s)
    return {k: getattr(s, k) for k in ("bytes_read", "patch_bytes", "requests", "io_wait_s")}


def count_epoch(loader: Any) -> int:
    n = 0
    for b in loader:
        n += len(b[0] if isinstance(b, (tuple, list)) else b)
    return n


def raw_floor(paths: Sequence[str], size: Size) -> Callable[[], int]:
    """The floor: a numpy loop over memory maps, ``per_file`` random boxes of each volume, batches stacked.

    The files are mapped again each epoch: ``posix_fadvise(DONTNEED)`` does not drop pages a mapping holds.
    """
    rng = np.random.default_rng(0)
    hi = [n - size.patch + 1 for n in size.volume_shape]

    def run() -> int:
        maps = [np.load(p, mmap_mode="r") for p in paths]  # (mapped each epoch: mapped pages are not dropped)
        units = rng.permutation(len(maps))
        pending: list[np.ndarray] = []
        n = 0
        for i in units:
            for _ in range(size.per_file):
                a = [int(rng.integers(0, h)) for h in hi]
                pending.append(np.array(maps[i][box_slices(a, [x + size.patch for x in a])]))
                if len(pending) == BATCH:
                    n += len(np.stack(pending))
                    pending = []
        return n + (len(np.stack(pending)) if pending else 0)

    return run


def _monai_transforms(size: Size, load: Any) -> Any:
    from monai.transforms import Compose, EnsureChannelFirstd, RandSpatialCropSamplesd

    return Compose(
        [
            load,
            EnsureChannelFirstd(keys="image", channel_dim="no_channel"),
            RandSpatialCropSamplesd(
                keys="image", roi_size=(size.patch,) * 3, num_samples=size.per_file, random_size=False
            ),
        ]
    )


def monai_loader(paths: Sequence[str], size: Size, load: Any = None) -> Any:
    """MONAI's recipe: ``LoadImaged`` (or ``load``), channel first, ``RandSpatialCropSamplesd``, 2 workers."""
    from monai.data import DataLoader, Dataset
    from monai.transforms import LoadImaged

    load = load if load is not None else LoadImaged(keys="image", reader="NumpyReader", image_only=True)
    ds = Dataset([{"image": p} for p in paths], transform=_monai_transforms(size, load))
    # (the object-store way spawns its workers: obstore's runtime does not survive a fork of a process that used it)
    context = "spawn" if isinstance(load, ObjectLoad) else None
    return DataLoader(
        ds,
        batch_size=BATCH // size.per_file,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
    )


def monai_count(loader: Any) -> int:
    return sum(len(b["image"]) for b in loader)


class ObjectLoad:
    """MONAI's load step for an object store: the whole object downloaded with obstore, then ``np.load``.

    The store is made in each process on first use (a DataLoader worker does
    not share its parent's connections).
    """

    def __init__(self, bucket: str, options: dict[str, Any]) -> None:
        self.bucket, self.options = bucket, options
        self._store: Any = None
        self._pid = -1

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        import obstore

        if self._pid != os.getpid():
            self._store, self._pid = s3_store(self.bucket, self.options), os.getpid()
        body = obstore.get(self._store, data["image"]).bytes()
        return {**data, "image": np.load(io.BytesIO(bytes(body)))}

    def __getstate__(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "options": self.options, "_store": None, "_pid": -1}


def s3_store(bucket: str, options: dict[str, Any]) -> Any:
    """An obstore ``S3Store`` of ``bucket`` with the server's ``storage_options``."""
    from obstore.store import S3Store

    return S3Store(bucket, **options)


def torchio_image(path: str) -> tuple[Any, np.ndarray]:
    """TorchIO's reader for a ``.npy`` volume: a channel axis in front, an identity affine."""
    import torch

    return torch.from_numpy(np.load(path))[None], np.eye(4)


def torchio_loader(paths: Sequence[str], size: Size) -> Any:
    """TorchIO's patch ``Queue`` with a ``UniformSampler``, ``samples_per_volume=per_file``, 2 workers."""
    import torchio as tio
    from torch.utils.data import DataLoader

    subjects = tio.SubjectsDataset([tio.Subject(image=tio.ScalarImage(p, reader=torchio_image)) for p in paths])
    queue = tio.Queue(
        subjects,
        max_length=4 * size.per_file,
        samples_per_volume=size.per_file,
        sampler=tio.UniformSampler(size.patch),
        num_workers=2,
        shuffle_subjects=True,
        shuffle_patches=True,
    )
    return DataLoader(queue, batch_size=BATCH, num_workers=0)


def torchio_count(loader: Any) -> int:
    return sum(len(b["image"]["data"]) for b in loader)


def dali_epoch(paths: Sequence[str], size: Size) -> Callable[[], int]:
    """DALI's CPU numpy reader with ``roi_start=fn.random.uniform(...)`` per sample; one call is one epoch."""
    from nvidia.dali import fn, pipeline_def, types

    files = [p for p in paths for _ in range(size.per_file)]
    n_batches = -(-len(files) // BATCH)

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None, seed=0)
    def pipe() -> Any:
        # (a discrete uniform draw per axis: every valid start equally likely, as the other peers draw)
        start = fn.cat(
            *[
                fn.cast(
                    fn.random.uniform(values=[float(v) for v in range(n - size.patch + 1)], shape=[1]),
                    dtype=types.INT32,
                )
                for n in size.volume_shape
            ]
        )
        return fn.readers.numpy(
            files=files, roi_start=start, roi_shape=[size.patch] * 3, pad_last_batch=True, name="reader"
        )

    pipes = [pipe()]
    pipes[0].build()

    def run() -> int:
        n = 0
        for _ in range(n_batches):
            (tl,) = pipes[0].run()
            n += len(np.stack([np.asarray(tl[i]) for i in range(len(tl))]))
        return min(n, len(files))

    def fresh() -> None:
        """A new pipeline, the old one freed (its reader may keep the files mapped)."""
        pipes.clear()
        gc.collect()
        pipes.append(pipe())
        pipes[0].build()

    run.fresh = fresh  # type: ignore[attr-defined]
    return run


# ---------------------------------------------------------------------------------------------
# the run


class Bench:
    def __init__(self, args: Any, size: Size, paths: list[str]) -> None:
        self.args, self.size, self.paths = args, size, paths
        self.rows: list[Row] = []
        self.facts: dict[str, Any] = {}
        self.notes: list[str] = []
        self.bad = 0
        self.samples = size.n_volumes * size.per_file
        self.volume_bytes = os.path.getsize(paths[0])
        self.patch_bytes = size.patch**3 * DTYPE.itemsize
        self.spans_per_patch = plane_spans(size.volume_shape, (size.patch,) * 3, DTYPE.itemsize)[1]
        self.facts["patch bytes"] = self.patch_bytes
        self.facts["per-plane spans per patch (bytes)"] = self.spans_per_patch
        self.facts["volume file bytes"] = self.volume_bytes

    def time(
        self,
        group: str,
        variant: str,
        epoch: Callable[[], int],
        *,
        cold: bool = False,
        bytes_per_patch: float | None = None,
        how: str = "",
        note: str = "",
        budget: float | None = None,
    ) -> Row:
        """Median of ``--repeat`` epochs, the page cache re-warmed (or dropped) before each."""
        times: list[float] = []
        cpu: list[float] = []
        disk: list[int] = []
        n = 0
        for i in range(max(1, self.args.repeat)):
            if i == 1 and budget is not None and times[0] * self.args.repeat > budget:
                note = (note + "; " if note else "") + f"run once ({times[0]:.1f} s)"
                break
            if group == "L" and cold:
                # a mapping keeps its pages in the cache: npydask's handles closed, DALI's pipeline built anew
                clear_npydask_caches()
                getattr(epoch, "fresh", lambda: None)()
                gc.collect()
                for p in self.paths:
                    drop_page_cache(p)
            elif group == "L":
                _common.warm_page_cache(self.paths)
            d0 = pgpgin_bytes()
            t, n = _common.measure(epoch, 1, cpu=cpu)
            disk.append(pgpgin_bytes() - d0)
            times += t
        if n != self.samples:
            note = (note + "; " if note else "") + f"{n} samples, expected {self.samples}"
        row = Row(
            group,
            variant + (" [cold]" if cold else ""),
            times,
            cpu,
            n,
            bytes_per_patch,
            how,
            disk if cold else [],
            note,
        )
        self.rows.append(row)
        print(
            f"  {group} {row.variant:66s} {_common.fmt_seconds(row.median):>10s}  {row.rate:10.1f} samples/s",
            flush=True,
        )
        return row

    def skipped(self, group: str, variant: str, why: str) -> None:
        self.rows.append(Row(group, variant, [], [], 0, note=f"n/a: {why}"))
        print(f"  {group} {variant}: n/a: {why}", flush=True)

    def check_npydask(self, make: Callable[[], Any], what: str) -> None:
        """One untimed epoch with ``with_index=True``, every sample compared with numpy."""
        got = list(make())
        bad = mismatches(self.paths, got)
        n = sum(len(b) for b, _ in got)
        self.facts[f"{what}: samples checked against numpy"] = f"{n}, {bad} differ"
        self.bad += bad + (n != self.samples)

    # -- local ----------------------------------------------------------------------------------

    def local(self) -> None:
        size, paths = self.size, self.paths
        root = os.path.dirname(paths[0])
        whole = self.volume_bytes / size.per_file
        self.check_npydask(lambda: npydask_loader(root, size, check=True), "L npydask")
        loader = npydask_loader(root, size)
        count_epoch(loader)  # (threads and handles made, as a training loop's first epoch makes them)
        stats = stats_of(loader)
        nd_bytes = stats["bytes_read"] / max(1, self.samples)
        self.facts["L npydask stats() of an epoch"] = stats
        ways: list[tuple[str, Callable[[], Callable[[], int]] | None, str, float | None, str]] = [
            (
                "raw floor: numpy mmap patch loop",
                lambda: raw_floor(paths, size),
                "",
                self.patch_bytes,
                "patch bytes copied (mmap)",
            ),
            (
                "MONAI LoadImaged + RandSpatialCropSamplesd, DataLoader(2 workers)",
                self._monai_way(),
                "monai",
                whole,
                "whole volume / patches",
            ),
            (
                "TorchIO Queue(UniformSampler), 2 workers",
                self._torchio_way(),
                "torchio",
                whole,
                "whole volume / patches",
            ),
            (
                "DALI fn.readers.numpy CPU, roi_start=fn.random.uniform",
                self._dali_way(),
                "nvidia.dali",
                self.spans_per_patch,
                "per-plane spans (mapped)",
            ),
            (
                "npydask Loader(sampler=Uniform, shuffle=True)",
                lambda: lambda: count_epoch(loader),
                "",
                nd_bytes,
                "loader.stats() bytes_read",
            ),
        ]
        # each way built once (its workers, its pipeline), timed warm then cold, then let go before the next
        for variant, make, module, bpp, how in ways:
            if make is None:
                self.skipped("L", variant, f"{module} is not installed here")
                continue
            try:
                epoch = make()
                epoch()  # (untimed: workers started, pipeline warmed)
            except Exception as e:  # noqa: BLE001 - a peer that cannot run here is reported, not fatal
                self.skipped("L", variant, f"{type(e).__name__}: {e}"[:200])
                continue
            for cold in (False, True):
                self.time(
                    "L",
                    variant,
                    epoch,
                    cold=cold,
                    bytes_per_patch=bpp,
                    how=how,
                    budget=self.args.slow_budget if module else None,
                )
            del epoch
            gc.collect()

    def _monai_way(self) -> Callable[[], Callable[[], int]] | None:
        if not _peers.has("monai"):
            return None
        return lambda: (lambda loader: lambda: monai_count(loader))(monai_loader(self.paths, self.size))

    def _torchio_way(self) -> Callable[[], Callable[[], int]] | None:
        if not _peers.has("torchio"):
            return None
        return lambda: (lambda loader: lambda: torchio_count(loader))(torchio_loader(self.paths, self.size))

    def _dali_way(self) -> Callable[[], Callable[[], int]] | None:
        if not _peers.has("nvidia.dali"):
            return None
        return lambda: dali_epoch(self.paths, self.size)

    # -- object storage -------------------------------------------------------------------------

    def remote(self) -> None:
        server, why = start_server()
        if server is None:
            self.skipped("S", "object storage (SeaweedFS)", why)
            return
        try:
            with CountingProxy(server.endpoint) as proxy:
                t0 = time.perf_counter()
                upload(s3_store(server.bucket, server.storage_options()), self.paths)
                self.facts["S upload seconds"] = round(time.perf_counter() - t0, 1)
                self._remote(server, proxy)
        finally:
            server.stop()

    def _remote(self, server: Any, proxy: CountingProxy) -> None:
        size = self.size
        direct = server.storage_options()
        proxied = {**direct, "endpoint": proxy.endpoint}
        prefix = server.url(key_of(self.paths[0]).rpartition("/")[0] + "/")
        keys = [key_of(p) for p in self.paths]
        self.check_npydask(lambda: npydask_loader(prefix, size, check=True, storage_options=direct), "S npydask")
        counted = npydask_loader(prefix, size, storage_options=proxied)
        count_epoch(counted)  # (stores and connections made; the epoch counted is a later one, as in training)
        proxy.reset()
        count_epoch(counted)
        traffic = proxy.reset()
        spans = self.spans_per_patch * self.samples
        self.facts["S npydask epoch through the proxy"] = {
            "bytes down": traffic.downstream,
            "requests": dict(traffic.requests),
            "spans": spans,
            "stats()": stats_of(counted),
        }
        nd_bytes = traffic.downstream / self.samples
        whole = self.volume_bytes / size.per_file
        loader = npydask_loader(prefix, size, storage_options=direct)
        count_epoch(loader)
        self.time(
            "S",
            "npydask Loader(sampler=Uniform) over s3://, loopback",
            lambda: count_epoch(loader),
            bytes_per_patch=nd_bytes,
            how="counting proxy",
        )
        monai = None
        if _peers.has("monai"):
            monai = monai_loader(keys, size, ObjectLoad(server.bucket, direct))
            monai_count(monai)
            self.time(
                "S",
                "MONAI whole-object GETs + RandSpatialCropSamplesd, loopback",
                lambda: monai_count(monai),
                bytes_per_patch=whole,
                how="whole object / patches",
                budget=self.args.slow_budget,
            )
        else:
            self.skipped("S", "MONAI whole-object GETs", "monai is not installed here")
        if self.args.link_mbit > 0:
            self._link(server, size, prefix, keys, nd_bytes, whole)

    def _link(self, server: Any, size: Size, prefix: str, keys: list[str], nd_bytes: float, whole: float) -> None:
        mbit = self.args.link_mbit
        port = int(server.endpoint.rsplit(":", 1)[1])
        why = "--link-via proxy" if self.args.link_via == "proxy" else _link.cannot_shape()
        if why and self.args.link_via == "tc":
            raise SystemExit(f"--link-via tc: cannot shape loopback here: {why}")
        with contextlib.ExitStack() as stack:
            if why is None:
                self.facts["S link"] = stack.enter_context(_link.shaped_port(port, mbit))
                options = server.storage_options()
            else:
                paced = stack.enter_context(CountingProxy(server.endpoint, rate=mbit * 1e6 / 8))
                self.facts["S link"] = f"{mbit:g} Mbit/s by a pacing proxy (tc shaping unavailable: {why})"
                options = {**server.storage_options(), "endpoint": paced.endpoint}
            loader = npydask_loader(prefix, size, storage_options=options)
            count_epoch(loader)
            self.time(
                "S",
                f"npydask Loader(sampler=Uniform), link {mbit:g} Mbit/s",
                lambda: count_epoch(loader),
                bytes_per_patch=nd_bytes,
                how="counting proxy",
            )
            if _peers.has("monai"):
                monai = monai_loader(keys, size, ObjectLoad(server.bucket, options))
                monai_count(monai)
                self.time(
                    "S",
                    f"MONAI whole-object GETs, link {mbit:g} Mbit/s",
                    lambda: monai_count(monai),
                    bytes_per_patch=whole,
                    how="whole object / patches",
                    budget=self.args.slow_budget,
                )

    # -- foreground oversampling and grid inference (see _patch_goals) ------------------------

    def foreground(self) -> None:
        """600 Foreground draws over 3 epochs: the foreground-centred share, the label reads, nnU-Net's rule."""
        fsize = _patch_goals.FOREGROUND_SIZES[self.args.size]
        folder = os.path.join(
            os.path.dirname(os.path.dirname(self.paths[0])),
            f"foreground-{fsize.n_files}x{'x'.join(map(str, self.size.volume_shape))}",
        )
        images, labels, share = _patch_goals.make_foreground_set(folder, self.paths[: fsize.n_files])
        fg = _patch_goals.run_foreground(images, labels, self.size.patch, fsize, BATCH)
        self.bad += fg["bad"]
        self.rows.append(
            Row(
                "F",
                f"npydask Loader(sampler=Foreground(p={_patch_goals.F_P:g}, per_file="
                f"{fsize.per_file}), shuffle=True), pread",
                fg["times"],
                [],
                fg["per_epoch"],
                note=f"{len(fg['times'])} epochs: the first scans the labels",
            )
        )
        self.facts["F foreground"] = {
            "files": fsize.n_files,
            "per_file": fsize.per_file,
            "draws": fg["draws"],
            "centred": fg["centred"],
            "with foreground": fg["with_foreground"],
            "label foreground share": round(share, 5),
            "label payload bytes": fg["label_bytes"],
            "scan bytes by epoch": fg["scan_bytes"],
            "checked against numpy and the draws": f"{fg['draws']}, {fg['bad']} differ",
        }
        print(
            f"  F foreground-centred {fg['centred']} of {fg['draws']}; scan bytes by epoch {fg['scan_bytes']}",
            flush=True,
        )

    def grid(self) -> None:
        """Sliding-window inference: npydask's Loader -> predictor -> Stitcher against MONAI; values and memory."""
        gsize = _patch_goals.GRID_SIZES[self.args.size]
        shape = (gsize.side,) * 3
        folder = os.path.join(os.path.dirname(os.path.dirname(self.paths[0])), f"grid-{'x'.join(map(str, shape))}")
        (path,), made = make_set(folder, "vol", 1, shape, np.random.default_rng(20261128), DTYPE)
        if made:
            os.sync()
        tiles = _patch_goals.npydask_grid(folder, gsize)[1]
        facts: dict[str, Any] = {"tiles": tiles}
        cpu: list[float] = []
        times, (result, _) = _common.measure(
            lambda: _patch_goals.npydask_grid(folder, gsize), self.args.repeat, cpu=cpu
        )
        self.rows.append(
            Row(
                "G",
                f"npydask Loader(Grid, B={gsize.batch}) -> predictor -> Stitcher(gaussian)",
                times,
                cpu,
                tiles,
                note="tiles/s",
            )
        )
        facts["vs numpy"] = _patch_goals.compare(result[0], _patch_goals.numpy_oracle(path))
        self.bad += not facts["vs numpy"]["allclose"]
        with tempfile.TemporaryDirectory(prefix="npydask-bench-grid-") as out:
            facts["peak traced"] = _patch_goals.traced_peak(lambda: _patch_goals.npydask_grid(folder, gsize, out=out))
        facts["peak RSS rise"] = _patch_goals.peak_in_child("npydask", path, gsize)
        facts["bound"], facts["bound formula"] = _patch_goals.memory_bound(gsize)
        if _peers.has("monai"):
            run = _patch_goals.monai_grid(path, gsize)
            cpu = []
            times, want = _common.measure(run, self.args.repeat, cpu=cpu)
            self.rows.append(
                Row(
                    "G",
                    f"MONAI sliding_window_inference(gaussian, sw_batch_size={gsize.batch})",
                    times,
                    cpu,
                    tiles,
                    note="tiles/s; np.load of the volume included",
                )
            )
            facts["vs MONAI"] = _patch_goals.compare(result[0], want)
            del want
            facts["MONAI peak RSS rise"] = _patch_goals.peak_in_child("monai", path, gsize)
        else:
            facts["MONAI n/a"] = "monai is not installed here"
            self.skipped("G", "MONAI sliding_window_inference(gaussian)", "monai is not installed here")
        self.facts["G grid"] = facts
        print(
            f"  G grid: {tiles} tiles; peak traced {facts['peak traced'] / MiB:.1f} MiB, bound "
            f"{facts['bound'] / MiB:.1f} MiB; vs MONAI {facts.get('vs MONAI', 'n/a')}",
            flush=True,
        )

    # -- the report -----------------------------------------------------------------------------

    def find(self, start: str) -> Row | None:
        return next((r for r in self.rows if r.variant.startswith(start) and r.times), None)

    def report(self) -> list[dict[str, Any]]:
        rows = []
        for r in sorted(self.rows, key=lambda r: (r.group, "[cold]" in r.variant)):
            if not r.times:
                rows.append([r.group, r.variant, "n/a", "", "", "", "", "", r.note])
                continue
            floor = self.find("raw floor" + (": numpy mmap patch loop [cold]" if "[cold]" in r.variant else ""))
            nd = next(
                (
                    x
                    for x in self.rows
                    if x.group == r.group
                    and x.times
                    and x.variant.startswith("npydask")
                    and ("[cold]" in x.variant) == ("[cold]" in r.variant)
                    and ("link" in x.variant) == ("link" in r.variant)
                ),
                None,
            )
            rows.append(
                [
                    r.group,
                    r.variant,
                    f"{r.median * 1e3:.1f}",
                    f"{r.rate:,.1f}",
                    f"{nd.rate / r.rate:.2f}x" if nd and r.rate else "",
                    f"{floor.rate and r.rate / floor.rate:.2f}x" if floor and r.group == "L" else "",
                    f"{r.bytes_per_patch / MiB:.2f}" if r.bytes_per_patch is not None else "",
                    f"{_common.median(r.disk_bytes) / self.samples / MiB:.2f}" if r.disk_bytes else "",
                    "; ".join(x for x in (r.how_counted, r.note) if x),
                ]
            )
        print()
        print(
            f"# size={self.args.size}: {self.size.n_volumes} volumes of {self.size.volume_shape} float32, "
            f"{self.size.patch}^3 patches, {self.size.per_file} per volume, batches of {BATCH}, "
            f"{self.samples} samples an epoch; median of {self.args.repeat} epochs; npydask x: npydask's "
            f"samples/s over the row's (same group and cache state); floor x: the row over the raw floor"
        )
        _common.table(
            rows,
            [
                "grp",
                "variant",
                "epoch ms",
                "samples/s",
                "npydask x",
                "floor x",
                "MiB/patch",
                "disk MiB/patch",
                "bytes counted as; note",
            ],
        )
        goals = self.goals()
        print()
        _common.table(
            [[g["goal"], g["measured"], g["target"], g["verdict"]] for g in goals],
            ["goal", "measured", "target", "verdict"],
        )
        for k, v in self.facts.items():
            print(f"# {k}: {v}")
        for note in self.notes:
            print(f"# note: {note}")
        print(f"# npydask's samples equal numpy's slices of their boxes: {'yes' if not self.bad else 'NO'}")
        return goals

    def goals(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def goal(
            text: str, measured: float | None, limit: float | None, *, at_least: bool = True, why: str = ""
        ) -> None:
            if measured is None or limit is None:
                out.append(
                    {
                        "goal": text,
                        "measured": "n/a",
                        "target": "",
                        "verdict": "n/a",
                        "why": why,
                        "value": None,
                        "limit": limit,
                        "pass": None,
                    }
                )
                return
            ok = measured >= limit if at_least else measured <= limit
            out.append(
                {
                    "goal": text,
                    "measured": f"{measured:.2f}x",
                    "target": f"{'>=' if at_least else '<='} {limit:.2f}x",
                    "verdict": "PASS" if ok else "FAIL",
                    "value": measured,
                    "limit": limit,
                    "pass": ok,
                }
            )

        def speedup(a: Row | None, b: Row | None) -> float | None:
            return a.rate / b.rate if a and b and a.rate and b.rate else None

        def byte_ratio(peer: Row | None, nd: Row | None) -> float | None:
            if peer is None or nd is None or not peer.bytes_per_patch or not nd.bytes_per_patch:
                return None
            return peer.bytes_per_patch / nd.bytes_per_patch

        nd, nd_cold = self.find("npydask Loader(sampler=Uniform, shuffle=True)"), None
        nd_cold = self.find("npydask Loader(sampler=Uniform, shuffle=True) [cold]")
        peers = (
            ("MONAI", "MONAI LoadImaged", GOAL_WARM_MONAI),
            ("TorchIO", "TorchIO Queue", GOAL_WARM_TORCHIO),
            ("DALI", "DALI fn.readers", GOAL_WARM_DALI),
        )
        for name, start, limit in peers:
            goal(f"P-patches local warm: npydask samples/s / {name}'s", speedup(nd, self.find(start)), limit)
        for name, start, _ in peers:
            cold = next(
                (r for r in self.rows if r.variant.startswith(start) and "[cold]" in r.variant and r.times), None
            )
            # the byte ratio: what the disk delivered (pgpgin) where both cold runs measured it, else as counted
            ratio, basis = byte_ratio(self.find(start), nd), "counted"
            if cold and nd_cold and _common.median(cold.disk_bytes) > 0 and _common.median(nd_cold.disk_bytes) > 0:
                ratio, basis = _common.median(cold.disk_bytes) / _common.median(nd_cold.disk_bytes), "disk"
            goal(
                f"P-patches local cold: npydask samples/s / {name}'s (byte ratio {ratio:.2f}x, {basis})"
                if ratio
                else f"P-patches local cold: npydask samples/s / {name}'s",
                speedup(nd_cold, cold),
                GOAL_COLD_OF_BYTES * ratio if ratio else None,
            )
        remote = self.facts.get("S npydask epoch through the proxy")
        goal(
            "P-patches s3: bytes transferred / per-plane spans",
            remote["bytes down"] / remote["spans"] if remote else None,
            GOAL_REMOTE_BYTES,
            at_least=False,
        )
        mbit = self.args.link_mbit
        link_nd = self.find(f"npydask Loader(sampler=Uniform), link {mbit:g}")
        link_monai = self.find(f"MONAI whole-object GETs, link {mbit:g}")
        ratio = byte_ratio(link_monai, link_nd)
        text = f"P-patches s3 over an emulated {GOAL_LINK_MBIT:g} Mbit/s link: npydask samples/s / MONAI's"
        if mbit == GOAL_LINK_MBIT:
            goal(
                text + (f" (byte ratio {ratio:.2f}x)" if ratio else ""),
                speedup(link_nd, link_monai),
                GOAL_LINK_OF_BYTES * ratio if ratio else None,
            )
        else:
            goal(text, None, None, why=f"run with --link-mbit {GOAL_LINK_MBIT:g}")
        loop = speedup(self.find("npydask Loader(sampler=Uniform) over s3://"), self.find("MONAI whole-object GETs +"))
        if loop is not None:
            out.append(
                {
                    "goal": "(info) P-patches s3 loopback: npydask samples/s / MONAI's",
                    "measured": f"{loop:.2f}x",
                    "target": "",
                    "verdict": "info",
                    "value": loop,
                    "limit": None,
                    "pass": None,
                }
            )
        out += _patch_goals.foreground_goals(self.facts.get("F foreground"), BATCH)
        out += _patch_goals.grid_goals(self.facts.get("G grid"), _patch_goals.GRID_SIZES[self.args.size])
        ahead = self.facts.get("K look-ahead rows", {})  # (the lookahead group: window of 2 over batch by batch)
        for name, where in (
            ("Grid", "local spans warm"),
            ("Grid", "s3 loopback"),
            ("Uniform", "local spans warm"),
            ("Uniform", "s3 loopback"),
        ):
            a, b = ahead.get(f"{name} {where}, window of 2"), ahead.get(f"{name} {where}, batch by batch")
            if a and b and b["median_s"]:
                moved = "bytes_down" if "bytes_down" in a else "bytes_read"
                bytes_x = a[moved] / b[moved] if b[moved] else 1.0
                req_x = a["requests"] / b["requests"] if b["requests"] else 1.0
                time_x = a["median_s"] / b["median_s"]
                out.append(
                    {
                        "goal": f"(info) look-ahead {name} {where}: window of 2 / batch by batch, bytes "
                        f"(requests {req_x:.2f}x, epoch time {time_x:.2f}x)",
                        "measured": f"{bytes_x:.2f}x",
                        "target": "",
                        "verdict": "info",
                        "value": bytes_x,
                        "limit": None,
                        "pass": None,
                    }
                )
        return out

    # -- look-ahead: the Loader's next prefetch batches read together -----------------------------

    def lookahead(self) -> None:
        """Group ``K``: grid tiles and random patches of 2 volumes, read batch by batch against look-ahead windows.

        ``Grid((2*patch,)*3, overlap=0.25)`` tiles of 2 volumes in raster order, and random patches (locally
        the local group's ``Uniform(patch, per_file)`` over every volume, shuffled; over SeaweedFS
        ``per_file=4*per_file`` of the 2 volumes, so a volume's patches span two batches), batches of 8:
        batch by batch (``prefetch=2``: two batches read ahead, one per thread) against windows of 2 batches
        (``prefetch=4``; and windows of 4, ``prefetch=8``, for the grid), locally by the ``"spans"`` route (warm)
        and over SeaweedFS through a counting proxy (bytes down, GETs). Every variant is checked against numpy
        once. The default local route copies boxes from the mapping, batch by batch: nothing to merge.
        """
        from npydask.samplers import Grid

        size, paths = self.size, self.paths[:2]
        grid = Grid((2 * size.patch,) * 3, overlap=0.25)
        uniform = Uniform((size.patch,) * 3, per_file=size.per_file)
        uniform_s3 = Uniform((size.patch,) * 3, per_file=4 * size.per_file)
        found: dict[str, dict[str, Any]] = {}

        def rows(where: str, cases: Any, proxy: CountingProxy | None) -> None:
            for name, sampler, ks, files, open_ds in cases:
                for k in ks:
                    how = "batch by batch" if k == 1 else f"window of {k}"
                    variant = f"{name} {where}, {how}"
                    kw = dict(sampler=sampler, shuffle=name == "Uniform", seed=0, prefetch=2 * k)
                    bad = mismatches(files, list(npydask.Loader(open_ds(), BATCH, with_index=True, **kw)))
                    self.bad += bad
                    loader = npydask.Loader(open_ds(), BATCH, **kw)

                    def run(loader: Any = loader) -> int:
                        return count_epoch(loader)

                    run()  # (threads, handles and connections made)
                    if proxy is not None:
                        proxy.reset()
                    if proxy is None:
                        _common.warm_page_cache(files)
                    cpu: list[float] = []
                    times, n = _common.measure(run, self.args.repeat, cpu=cpu)
                    traffic = proxy.reset() if proxy is not None else None
                    stats = stats_of(loader)
                    got = {
                        "bytes_read": stats["bytes_read"],
                        "requests": stats["requests"],
                        "patch_bytes": stats["patch_bytes"],
                        "median_s": _common.median(times),
                        "differ": bad,
                    }
                    if traffic is not None:
                        got.update(
                            bytes_down=traffic.downstream // self.args.repeat,
                            gets=traffic.count("GET") // self.args.repeat,
                        )
                    found[variant] = got
                    moved = got.get("bytes_down", got["bytes_read"])
                    note = f"{got['requests']} requests" + (f", {got['gets']} GETs" if traffic else "")
                    row = Row(
                        "K",
                        variant,
                        times,
                        cpu,
                        n,
                        moved / max(1, n),
                        "proxy bytes down" if traffic else "stats() bytes_read",
                        [],
                        note,
                    )
                    self.rows.append(row)
                    print(
                        f"  K {variant:66s} {_common.fmt_seconds(row.median):>10s}  {row.rate:10.1f} samples/s  "
                        f"{moved / MiB:9.1f} MiB  {note}",
                        flush=True,
                    )

        def local(files: list[str]) -> Callable[[], Any]:
            return lambda: npydask.open_dataset(files=files)

        with npydask.config.set(patch_read="spans"):
            rows(
                "local spans warm",
                [
                    ("Grid", grid, (1, 2, 4), paths, local(paths)),
                    ("Uniform", uniform, (1, 2), self.paths, local(self.paths)),
                ],
                None,
            )
        server, why = start_server()
        if server is None:
            self.skipped("K", "look-ahead over object storage (SeaweedFS)", why)
        else:
            try:
                with CountingProxy(server.endpoint) as proxy:
                    upload(s3_store(server.bucket, server.storage_options()), paths)
                    options = {**server.storage_options(), "endpoint": proxy.endpoint}
                    prefix = server.url(key_of(paths[0]).rpartition("/")[0] + "/")

                    def remote() -> Any:
                        return npydask.open_dataset(prefix, storage_options=options)

                    rows(
                        "s3 loopback",
                        [("Grid", grid, (1, 2, 4), paths, remote), ("Uniform", uniform_s3, (1, 2), paths, remote)],
                        proxy,
                    )
            finally:
                server.stop()
        self.facts["K look-ahead rows"] = found


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.split("\n", 1)[0], default_size="small", default_repeat=3)
    ap.add_argument("--data", metavar="DIR", help="keep the .npy files here and reuse them (default: a temp folder)")
    ap.add_argument(
        "--only",
        default="local,remote,foreground,grid,lookahead",
        metavar="GROUPS",
        help="comma-separated groups: local, remote, foreground, grid, lookahead (default all)",
    )
    ap.add_argument(
        "--link-mbit",
        type=float,
        default=GOAL_LINK_MBIT,
        metavar="MBIT",
        help=f"the emulated link's speed for the remote group, 0 to skip (default {GOAL_LINK_MBIT:g})",
    )
    ap.add_argument(
        "--link-via",
        choices=["auto", "tc", "proxy"],
        default="auto",
        help="how the link is emulated: the kernel's shaper where it can (auto), only it, or a proxy",
    )
    ap.add_argument(
        "--slow-budget",
        type=float,
        default=60.0,
        metavar="S",
        help="time a slow peer once when its first epoch x --repeat exceeds S seconds (default 60)",
    )
    args = ap.parse_args(argv)
    size = SIZES[args.size]
    # a timeout's SIGTERM unwinds like an error: SeaweedFS stopped, the link's qdisc removed from lo
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    _common.print_environment(_common.environment())
    folder = args.data or tempfile.mkdtemp(prefix="npydask-bench-patches-")
    t0 = time.perf_counter()
    try:
        paths = make_volumes(folder, size)
        print(
            f"# data: {len(paths)} volumes in {os.path.dirname(paths[0])} ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
        bench = Bench(args, size, paths)
        only = set(args.only.split(","))
        if "local" in only:
            bench.local()
        if "remote" in only:
            bench.remote()
        if "foreground" in only:
            bench.foreground()
        if "grid" in only:
            bench.grid()
        if "lookahead" in only:
            bench.lookahead()
        goals = bench.report()
        _common.write_json(
            args.json,
            {
                "benchmark": "patches",
                "size": args.size,
                "repeat": args.repeat,
                "facts": bench.facts,
                "results": [
                    {
                        "group": r.group,
                        "variant": r.variant,
                        "median_s": r.median,
                        "times_s": r.times,
                        "cpu_s": r.cpu,
                        "samples": r.samples,
                        "samples_per_s": r.rate,
                        "bytes_per_patch": r.bytes_per_patch,
                        "bytes_counted_as": r.how_counted,
                        "disk_bytes": r.disk_bytes,
                        "note": r.note,
                    }
                    for r in bench.rows
                ],
                "goals": goals,
                "notes": bench.notes,
                "results_agree": not bench.bad,
            },
        )
        return 0 if not bench.bad else 1
    finally:
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# total {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
