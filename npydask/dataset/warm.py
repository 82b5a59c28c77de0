"""Staging a dataset in the node cache before training: ``ds.warm_cache()``.

Every selected file's output (its ROI, or the whole file) is read once through
the dataset's own read path, so its byte runs pass through the node cache of
the dataset's ``cache=`` choice, and the arrays are dropped as soon as they are
read. A plain file is read from byte 0, header included, as stacks of small
files and Loader batches read it, so that every later read finds its bytes
held. Memory stays bounded: each worker thread holds one file at a time (a
whole file larger than :data:`SLAB_BYTES` in slabs along its slowest axis,
whose byte ranges are contiguous, so the slabs' extents cover the file's
payload exactly), and there are as many threads as fit
:data:`IN_FLIGHT_BYTES` (between 1 and :data:`MAX_THREADS`). A file cut to a
ROI is read whole, so that its byte runs are the ones a read of the ROI asks
for, and so is a deflated ``.npz`` member (it inflates from its start).

Only objects are cached (local files have the page cache), and only where the
dataset's cache is on: a dataset of local files, or one whose ``cache=`` is
``False`` (or ``None`` with the ``cache`` setting empty in this process),
raises ``ValueError`` before any read.
"""

from __future__ import annotations

import contextvars
import math
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import IO, Any

from npydask import config
from npydask.array import NpyFileArray
from npydask.cache.spec import Cache, CacheChoice
from npydask.dataset._strings import human_bytes
from npydask.plan.region import Box
from npydask.storage.io_counts import collect
from npydask.storage.local import LOCAL

__all__ = ["IN_FLIGHT_BYTES", "MAX_THREADS", "SLAB_BYTES", "WarmSummary", "cache_folder_of", "slabs", "warm"]

IN_FLIGHT_BYTES = 512 * 2**20
"""Bytes of files read at once, at most (one file a thread; a single larger file is read alone)."""
MAX_THREADS = 16
"""Files read at once, at most."""
SLAB_BYTES = 64 * 2**20
"""A whole file larger than this is read in slabs of at most this many bytes (one plane at least)."""
LINE_EVERY = 5.0
"""Seconds between progress lines when stderr is not a terminal (a terminal redraws 10 times a second)."""


@dataclass(frozen=True)
class WarmSummary:
    """What :meth:`NpyDataset.warm_cache <npydask.dataset.npy_dataset.NpyDataset.warm_cache>` read.

    Attributes
    ----------
    files : int
        Files read (each member of a dict dataset counts once per file).
    bytes : int
        Bytes of the arrays read (the files' outputs, after ROI).
    seconds : float
        Wall time of the reads.
    folder : str
        The cache folder the reads went through.
    requests : int
        Range GETs the reads sent (0 when everything was held already).
    cache_hits, cache_misses : int
        Reads served wholly from the cache, and reads that fetched at least one byte run.
    """

    files: int
    bytes: int
    seconds: float
    folder: str
    requests: int = 0
    cache_hits: int = 0
    cache_misses: int = 0

    def __str__(self) -> str:
        rate = f", {human_bytes(int(self.bytes / self.seconds))}/s" if self.seconds > 0 else ""
        return (
            f"read {self.files:,} file{'' if self.files == 1 else 's'}, {human_bytes(self.bytes)} in "
            f"{self.seconds:.2f} s{rate} "
            f"through the cache at {self.folder}: {self.requests:,} GETs, "
            f"{self.cache_hits:,} reads held already, {self.cache_misses:,} fetched"
        )


def cache_choice_of(source: Any) -> CacheChoice:
    """The ``cache=`` choice a dataset's object source was opened with (``None``: the setting where it reads)."""
    spec = getattr(source, "spec", None)
    return getattr(spec, "cache", None)


def cache_folder_of(source: Any, shown: str) -> str:
    """The folder of the node cache the reads of ``source`` go through in this process.

    Raises
    ------
    ValueError
        The files are local (nothing to cache), or no cache is on for them here.
    """
    if source is LOCAL:
        raise ValueError(
            f"warm_cache: the dataset's files are local ({shown}); the node cache holds bytes of objects only "
            "(local files have the operating system's page cache): open an object-store URL to stage it"
        )
    choice = cache_choice_of(source)
    if choice is False:
        raise ValueError(
            f"warm_cache: the dataset of {shown} was opened with cache=False; open it with cache=True, a folder "
            "or an npydask.Cache to stage it"
        )
    if isinstance(choice, Cache):
        return choice.folder
    folder: str = config.get("cache")
    if not folder:
        raise ValueError(
            f"warm_cache: no node cache is on for {shown}: set NPYDASK_CACHE (or npydask.config.set(cache=...)) to "
            "an absolute folder on the node's local disk, or open the dataset with cache='/local/folder'"
        )
    return folder


def slabs(shape: tuple[int, ...], itemsize: int, fortran: bool, limit: int) -> list[Box]:
    """Boxes that cut an array of ``shape`` along its slowest axis into contiguous slabs of at most ``limit`` bytes.

    The slowest axis is the first in C order, the last in Fortran order; a slab
    holds one index of it at least.

    Examples
    --------
    >>> [(b.start, b.stop) for b in slabs((5, 4), 4, False, 40)]
    [((0, 0), (2, 4)), ((2, 0), (4, 4)), ((4, 0), (5, 4))]
    >>> [(b.start, b.stop) for b in slabs((5, 4), 4, True, 40)]
    [((0, 0), (5, 2)), ((0, 2), (5, 4))]
    >>> slabs((5, 4), 4, False, 80) == [Box.whole((5, 4))]
    True
    """
    nbytes = math.prod(shape) * itemsize
    if nbytes <= limit or not shape:
        return [Box.whole(shape)]
    axis = len(shape) - 1 if fortran else 0
    per = max(1, limit // (nbytes // shape[axis]))
    boxes = []
    for lo in range(0, shape[axis], per):
        start = tuple(lo if k == axis else 0 for k in range(len(shape)))
        stop = tuple(min(lo + per, n) if k == axis else n for k, n in enumerate(shape))
        boxes.append(Box(start, stop))
    return boxes


def warm(views: Sequence[NpyFileArray], folder: str, *, progress: bool = True) -> WarmSummary:
    """Read every view once (its bytes pass through the node cache), dropping the arrays.

    Files are read by up to :data:`MAX_THREADS` threads, as many as hold at most
    :data:`IN_FLIGHT_BYTES` of the largest read each (a whole file, or a slab of
    one larger than :data:`SLAB_BYTES`), each read in a copy of the caller's
    context. The first error stops the reads not yet started and is raised.

    A plain file (no ROI, not an ``.npz`` member) is read from byte 0, header
    and payload, as a group of small files is read (stacks, Loader batches),
    so that reads of either kind find every byte held; one read in slabs gets
    its header bytes read apart.
    """
    jobs: list[tuple[int, str, Box]] = []
    for i, v in enumerate(views):
        whole = Box.whole(v.shape)
        if v.roi is not None or v.ref.compressed:  # (a deflated member inflates from its start: read it once)
            jobs.append((i, "region", whole))
        elif v.ref.key is None and v.nbytes <= SLAB_BYTES:
            jobs.append((i, "object", whole))
        else:
            if v.ref.key is None:
                jobs.append((i, "header", Box.whole((0,))))
            cut = slabs(v.shape, v.dtype.itemsize, v.ref.header.fortran_order, SLAB_BYTES)
            jobs += [(i, "region", box) for box in cut]
    left = [0] * len(views)
    for i, _, _ in jobs:
        left[i] += 1
    total = sum(v.nbytes for v in views)
    largest = max((box.size * views[i].dtype.itemsize for i, _, box in jobs), default=0)
    threads = max(1, min(MAX_THREADS, len(jobs), IN_FLIGHT_BYTES // max(largest, 1)))
    line = _Progress(sys.stderr, len(views), total) if progress else None
    lock = threading.Lock()
    done = [0, 0]
    start = time.perf_counter()

    def read(i: int, kind: str, box: Box) -> None:
        view = views[i]
        if kind == "region":
            view.read(box)  # (dropped here: only its passage through the cache counts)
        else:  # the object from byte 0, header and all, as a group of files reads it ("header": the header only)
            ref = view.ref
            buf = bytearray(box.size * view.dtype.itemsize)
            item = (ref.path, ref.identity, ref.header.data_offset, ref.check)
            ref.source.read_many([item], memoryview(buf), len(buf))
        with lock:
            left[i] -= 1
            done[0] += left[i] == 0
            done[1] += box.size * view.dtype.itemsize
            if line is not None:
                line.update(done[0], done[1], time.perf_counter() - start)

    with collect() as counts:  # (the reads' requests and cache hits, for the summary)
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="npydask-warm")
        try:
            # each read runs in a copy of the caller's context, as dask's threads do, so what the caller
            # collects there (figures of the reads) sees these reads too
            futures = [pool.submit(contextvars.copy_context().run, read, i, kind, box) for i, kind, box in jobs]
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for f in finished:
                error = f.exception()
                if error is not None:
                    raise error
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            if line is not None:
                line.finish(done[0], done[1], time.perf_counter() - start)
    seconds = time.perf_counter() - start
    return WarmSummary(len(views), total, seconds, folder, counts.requests, counts.cache_hits, counts.cache_misses)


class _Progress:
    """``warm_cache: N / M files, X of Y, T s`` on one line of ``stream``: in place on a terminal, else now and then."""

    def __init__(self, stream: IO[str], files: int, nbytes: int) -> None:
        self._stream = stream
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self._every = 0.1 if self._tty else LINE_EVERY
        self._files = files
        self._bytes = nbytes
        self._last = -math.inf
        self._shown = ""

    def _text(self, files: int, nbytes: int, seconds: float) -> str:
        return (
            f"warm_cache: {files:,} / {self._files:,} files, {human_bytes(nbytes)} of {human_bytes(self._bytes)}, "
            f"{seconds:.1f} s"
        )

    def update(self, files: int, nbytes: int, seconds: float) -> None:
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            self._show(self._text(files, nbytes, seconds))

    def finish(self, files: int, nbytes: int, seconds: float) -> None:
        text = self._text(files, nbytes, seconds)
        if text != self._shown:
            self._show(text)
        if self._tty:
            self._stream.write("\n")
        self._stream.flush()

    def _show(self, text: str) -> None:
        self._stream.write(f"\r{text}\x1b[K" if self._tty else text + "\n")
        self._stream.flush()
        self._shown = text
