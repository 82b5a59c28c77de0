"""The demo's measured figures: what npydask is for, each beside its comparison, measured in this run.

:func:`write_figure_data` writes a folder of :data:`VOLUMES` volumes of
:data:`VOLUME_SHAPE` float32 (16 MiB each) and one file of :data:`BIG_SHAPE`
float32 (128 MiB); :func:`show` prints four tables:

1. the bytes a 32x32x32 ROI of one volume reads (``npydask.read_region``)
   against the file's size and what ``np.load`` reads to give the same ROI;
2. opening the folder lazily (``npydask.open_dataset``) against loading
   every file with ``np.load``: time and bytes read;
3. the ROI from every volume, opening included, against ``np.load`` and
   ``np.load(mmap_mode="r")`` loops: time and bytes read;
4. the peak memory of a sum over the 128 MiB file with a
   :data:`CHUNK_BUDGET` chunk budget, against ``np.load(p).sum()``.

Times are the median of :data:`RUNS` runs after one unmeasured warm-up;
npydask's cache of open files is emptied before each of its runs, so every
run opens and parses what it reads. npydask computes on dask's threads, at
most :data:`MAX_THREADS` of them, so that the chunks in flight stay a
fraction of the big file on any machine. Bytes read and memory are counted as
:mod:`npydask.cli._measure` says. Every result is compared with numpy's;
ratios are printed as measured, whichever way they go.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask.utils import parse_bytes

import npydask
from npydask._buffers import pool
from npydask.cli._common import duration, number, size, table
from npydask.cli._measure import Measured, measure
from npydask.storage import clear_cache

__all__ = [
    "BIG_SHAPE",
    "CHUNK_BUDGET",
    "MAX_THREADS",
    "ROI_SHAPE",
    "ROI_START",
    "RUNS",
    "VOLUMES",
    "VOLUME_SHAPE",
    "FigureData",
    "show",
    "versus",
    "write_and_show",
    "write_figure_data",
]

VOLUMES = 8
VOLUME_SHAPE = (64, 256, 256)  # 16 MiB of float32
ROI_START = (16, 112, 112)
ROI_SHAPE = (32, 32, 32)  # 128 KiB of float32
BIG_SHAPE = (512, 256, 256)  # 128 MiB of float32
CHUNK_BUDGET = "16MiB"
MAX_THREADS = 4  # the big file is 8 chunks: at most half of them in flight at once
RUNS = 3
NOT_COUNTED = "n/a"
MAPPED = "mapped"


@dataclass(frozen=True)
class FigureData:
    """The files the figures read: ``volumes`` in ``folder``, and ``big``."""

    folder: str
    volumes: list[str]
    big: str

    @property
    def folder_bytes(self) -> int:
        """The folder's files' sizes on disk, headers included."""
        return sum(os.path.getsize(p) for p in self.volumes)


def _volume(base: np.ndarray, i: int) -> np.ndarray:
    return base + np.float32(i)


def write_figure_data(root: str) -> FigureData:
    """Write ``root/volumes/vol_NN.npy`` and ``root/big.npy`` (float32, cheap distinct values)."""
    root = os.path.abspath(root)
    folder = os.path.join(root, "volumes")
    os.makedirs(folder, exist_ok=True)
    base = np.random.default_rng(7).standard_normal(VOLUME_SHAPE, dtype=np.float32)
    volumes = []
    for i in range(VOLUMES):
        p = os.path.join(folder, f"vol_{i:02d}.npy")
        np.save(p, _volume(base, i))
        volumes.append(p)
    big = os.path.join(root, "big.npy")
    out = np.lib.format.open_memmap(big, mode="w+", dtype=np.float32, shape=BIG_SHAPE)
    step = VOLUME_SHAPE[0]
    for k in range(0, BIG_SHAPE[0], step):
        out[k : k + step] = _volume(base, 100 + k)
    out.flush()
    del out
    return FigureData(folder, volumes, big)


def _fresh_npydask() -> None:
    """Empty npydask's cache of open files, so a run opens and parses every file it reads."""
    clear_cache()


def _release_memory() -> None:
    """Give back what earlier steps left allocated: garbage, npydask's idle buffers, malloc's free pages."""
    gc.collect()
    pool().trim(0)
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass  # (not glibc: nothing to trim this way)


def _read_cell(m: Measured, delivered: int = 0) -> str:
    """The bytes read, or ``"mapped"`` where read calls returned fewer bytes than the result holds.

    Those bytes can only have come through a memory mapping, whose pages are
    faulted in, not read: the kernel's count does not see them.
    """
    if m.bytes_read is None:
        return NOT_COUNTED
    return MAPPED if m.bytes_read < delivered else number(m.bytes_read)


def _share(part: int | None, whole: int) -> str:
    return NOT_COUNTED if part is None else f"{100 * part / whole:.3g}%"


def versus(ours: float, theirs: float) -> str:
    """How npydask's time compares with another's: ``"12.5x faster"`` or ``"2.1x slower"``, as measured.

    Examples
    --------
    >>> versus(0.010, 0.125), versus(0.021, 0.010), versus(0.01, 0.01), versus(0.0001, 0.4873)
    ('12.5x faster', '2.1x slower', '1x faster', '4,873x faster')
    """
    ours, theirs = max(ours, 1e-9), max(theirs, 1e-9)  # (a clock that saw no time pass)
    if ours <= theirs:
        return f"{_ratio(theirs / ours)}x faster"
    return f"{_ratio(ours / theirs)}x slower"


def _ratio(r: float) -> str:
    """Three significant digits, without an exponent: ``12.5``, ``4,873``."""
    return f"{r:,.0f}" if r >= 100 else f"{r:.3g}"


def _roi_slices() -> tuple[slice, ...]:
    return tuple(slice(a, a + n) for a, n in zip(ROI_START, ROI_SHAPE))


def _slice_text() -> str:
    return "[" + ", ".join(f"{s.start}:{s.stop}" for s in _roi_slices()) + "]"


def show(data: FigureData) -> bool:
    """Print the four figures; return whether every result equalled numpy's."""
    ok = _roi_bytes(data)
    ok &= _lazy_open(data)
    ok &= _roi_from_every_volume(data)
    ok &= _sum_memory(data)
    return ok


def _roi_bytes(data: FigureData) -> bool:
    p = data.volumes[-1]
    file_bytes = os.path.getsize(p)
    roi_bytes = int(np.prod(ROI_SHAPE)) * 4
    stop = tuple(a + n for a, n in zip(ROI_START, ROI_SHAPE))
    ours = measure(lambda: npydask.read_region(p, ROI_START, stop), runs=RUNS, before=_fresh_npydask)
    theirs = measure(lambda: np.load(p)[_roi_slices()], runs=RUNS)
    same = bool(np.array_equal(ours.value, theirs.value))
    print(
        f"\n-- bytes read for a {'x'.join(map(str, ROI_SHAPE))} ROI ({number(roi_bytes)} bytes of float32) "
        f"of one {size(file_bytes)} volume ({number(file_bytes)} bytes)"
    )
    rows = []
    for how, m in ((f"npydask.read_region(p, {ROI_START}, {stop})", ours), (f"np.load(p){_slice_text()}", theirs)):
        read = _read_cell(m, roi_bytes)
        rows.append([how, read, NOT_COUNTED if read == MAPPED else _share(m.bytes_read, file_bytes)])
    print(table(rows, ["how", "bytes read", "of the file"], right=(1, 2)))
    print(f"equal: {same}")
    return same


def _compare(rows: list[tuple[str, Measured]], *, delivered: int = 0) -> str:
    """A table of time and bytes read, each row after the first compared with npydask's (the first).

    ``delivered``: the payload bytes each row's result holds (see :func:`_read_cell`).
    """
    ours = rows[0][1]
    cells = []
    for i, (how, m) in enumerate(rows):
        cells.append(
            [how, duration(m.seconds), _read_cell(m, delivered), "" if i == 0 else versus(ours.seconds, m.seconds)]
        )
    return table(cells, ["how", "time", "bytes read", "npydask is"], right=(1, 2))


def _lazy_open(data: FigureData) -> bool:
    folder, paths = data.folder, data.volumes

    def load_all() -> list[np.ndarray]:
        return [np.load(p) for p in paths]

    ours = measure(lambda: npydask.open_dataset(folder), runs=RUNS, before=_fresh_npydask)
    theirs = measure(load_all, runs=RUNS)
    ds = ours.value
    same = ds.files == paths and [tuple(h.shape) for h in ds.headers] == [a.shape for a in theirs.value]
    print(
        f"\n-- opening the folder of {len(paths)} volumes ({size(data.folder_bytes)}, "
        f"{number(data.folder_bytes)} bytes): lazily, or loading every file"
    )
    print(_compare([("npydask.open_dataset(folder)", ours), ("[np.load(p) for p in files]", theirs)]))
    print(f"same files and shapes: {same}")
    return same


def _roi_from_every_volume(data: FigureData) -> bool:
    folder, paths = data.folder, data.volumes
    slices = _roi_slices()
    threads = _threads()

    def ours() -> np.ndarray:
        ds = npydask.open_dataset(folder, roi_start=list(ROI_START), roi_shape=list(ROI_SHAPE))
        return ds.stack().compute(scheduler="threads", num_workers=threads)

    def loaded() -> np.ndarray:
        return np.stack([np.load(p)[slices] for p in paths])

    def mapped() -> np.ndarray:
        return np.stack([np.load(p, mmap_mode="r")[slices] for p in paths])

    rows = [
        (
            "npydask open_dataset(folder, roi_start, roi_shape).stack().compute()",
            measure(ours, runs=RUNS, before=_fresh_npydask),
        ),
        (f"np.stack([np.load(p){_slice_text()} for p in files])", measure(loaded, runs=RUNS)),
        (f"np.stack([np.load(p, mmap_mode='r'){_slice_text()} for p in files])", measure(mapped, runs=RUNS)),
    ]
    same = all(np.array_equal(rows[0][1].value, m.value) for _, m in rows[1:])
    print(
        f"\n-- a {'x'.join(map(str, ROI_SHAPE))} ROI from each of the {len(paths)} volumes, opening included "
        f"(median of {RUNS} runs; npydask on {threads} threads)"
    )
    print(_compare(rows, delivered=rows[0][1].value.nbytes))
    print(
        "(mapped: read calls returned fewer bytes than the ROIs hold, so the rest came through a memory "
        "mapping, whose pages are faulted in, not read: the kernel's count does not see them)"
    )
    print(f"all three equal: {same}")
    return same


def _threads() -> int:
    """dask's thread count, at most :data:`MAX_THREADS` (so chunks in flight stay a fraction of the big file)."""
    from dask.system import CPU_COUNT

    return max(1, min(int(CPU_COUNT), MAX_THREADS))


def _sum_memory(data: FigureData) -> bool:
    p = data.big
    file_bytes = os.path.getsize(p)
    threads = _threads()

    def ours(backend: str) -> Callable[[], Any]:
        def run() -> float:
            x = npydask.from_npy(p, chunks=CHUNK_BUDGET, backend=backend)
            return float(x.sum(dtype=np.float64).compute(scheduler="threads", num_workers=threads))

        return run

    def theirs() -> float:
        return float(np.load(p).sum(dtype=np.float64))

    def before() -> None:
        _fresh_npydask()
        _release_memory()

    rows = [
        (
            f'npydask.from_npy(p, chunks="{CHUNK_BUDGET}").sum()',
            measure(ours("auto"), runs=RUNS, before=before, memory=True),
        ),
        (
            f'npydask.from_npy(p, chunks="{CHUNK_BUDGET}", backend="pread").sum()',
            measure(ours("pread"), runs=RUNS, before=before, memory=True),
        ),
        ("np.load(p).sum()", measure(theirs, runs=RUNS, before=before, memory=True)),
    ]
    values = [m.value for _, m in rows]
    same = all(np.isclose(v, values[-1], rtol=1e-9) for v in values)
    n_chunks = len(npydask.from_npy(p, chunks=CHUNK_BUDGET).chunks[0])
    print(
        f"\n-- memory of a float64 sum over one {size(file_bytes)} file ({number(file_bytes)} bytes) "
        f"read in {n_chunks} chunks of {size(parse_bytes(CHUNK_BUDGET))} on {threads} threads"
    )
    cells = []
    for how, m in rows:
        peak = NOT_COUNTED if m.peak_anon is None else f"{m.peak_anon / 2**20:,.1f} MiB"
        cells.append([how, duration(m.seconds), peak, _share(m.peak_anon, file_bytes)])
    print(table(cells, ["how", "time", "peak memory", "of the file"], right=(1, 2, 3)))
    print(
        "(peak memory: the largest rise of the process's anonymous memory during a run; "
        "the default backend maps whole chunks, whose pages are page cache, not the process's memory)"
    )
    print(f"all three equal: {same}")
    return bool(same)


def write_and_show(root: str) -> bool:
    """Write the figures' files under ``root`` and print the figures; return whether all equalled numpy."""
    t0 = time.perf_counter()
    data = write_figure_data(root)
    print(
        f"\n== what npydask is for, measured in this run: wrote {len(data.volumes)} volumes of "
        f"{'x'.join(map(str, VOLUME_SHAPE))} float32 ({size(data.folder_bytes)}) and one "
        f"{'x'.join(map(str, BIG_SHAPE))} float32 file ({size(os.path.getsize(data.big))}) in "
        f"{duration(time.perf_counter() - t0)} (just written, so in the page cache)"
    )
    print(
        "(bytes read: the kernel's count of bytes read calls returned to this process, /proc/self/io rchar; "
        f"times: median of {RUNS} runs after a warm-up; npydask's open-file cache emptied before each)"
    )
    return show(data)
