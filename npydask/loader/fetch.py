"""How a loader's batches are read: in prefetch threads of this process or as tasks on a cluster's workers.

:func:`read_batch` reads a batch of whole files (one stacked array when
their shapes agree); :class:`PatchReader` reads a sampler loader's batch of
boxes; :class:`LocalFetch` and :class:`ClusterFetch` run either, in order,
and :class:`DeviceHandOff` hands device batches from prefetch threads to the
iterating thread's CUDA stream.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from types import FunctionType
from typing import Any, NamedTuple

import numpy as np

from npydask import config
from npydask.array import NpyFileArray
from npydask.dataset.stacking import FileGroup, joined_dtype
from npydask.plan.region import Box
from npydask.samplers import BoundSampler, PatchBatch, ReadStats, read_patches
from npydask.storage import run_on
from npydask.storage.io_counts import collect

__all__ = [
    "ClusterFetch",
    "Counted",
    "DeviceHandOff",
    "LocalFetch",
    "PatchReader",
    "call_read",
    "check_process",
    "read_batch",
    "read_counted",
]


def check_process(views: Sequence[NpyFileArray] | dict[str, Sequence[NpyFileArray]]) -> None:
    """Raise where this process cannot read the views (objects, in a child forked after obstore was used).

    ``views`` may be a dict of them per ``.npz`` member (:func:`npydask.dataset.multikey.pick`).

    The error names ``multiprocessing_context="spawn"`` and ``"forkserver"``:
    a request there would hang instead (obstore is not fork-safe). Local
    files are always readable. See :meth:`npydask.storage.base.Source.check_process`.
    """
    if isinstance(views, dict):
        views = next(iter(views.values()))  # (the members share their files)
    if views:
        ref = views[0].ref  # (a dataset reads one store)
        ref.source.check_process(ref.path)


def read_batch(views: Sequence[NpyFileArray] | dict[str, Sequence[NpyFileArray]], device: str = "cpu") -> Any:
    """Read every view in full: one stacked array when shapes agree, else a list.

    Stacked batches are in native byte order (as ``numpy.stack`` makes them)
    and writable; ``device="gpu"`` gives CuPy arrays. A dict of views per
    ``.npz`` member gives a dict of batches (the members of a file share its
    descriptor: one open per file). Objects (a source whose requests wait on
    the network) are read at once: each member's stack, or each file of a
    member whose shapes differ, is one job of up to ``_READS_AT_ONCE`` in flight.
    """
    members = views if isinstance(views, dict) else {"": views}
    if device == "gpu" or not _concurrent(members):
        read = {k: _read_member(v, device) for k, v in members.items()}
    else:
        read = _read_at_once(members)
    return read if isinstance(views, dict) else read[""]


def _read_member(views: Sequence[NpyFileArray], device: str) -> Any:
    """One member's batch (see :func:`read_batch`), its files read one after another."""
    shapes = {v.shape for v in views}
    if device == "gpu":
        from npydask.gpu import on_device

        if len(shapes) == 1:
            group = on_device(FileGroup(views, 0, True))
            return group[(slice(None),) * len(group.shape)]
        return [on_device(v)[(slice(None),) * v.ndim] for v in views]
    if len(shapes) == 1:
        return _stacked(views)
    return [_whole(v) for v in views]


def _stacked(views: Sequence[NpyFileArray]) -> np.ndarray:
    group = FileGroup(views, 0, True)
    return _owned(group[(slice(None),) * len(group.shape)])


def _whole(view: NpyFileArray) -> np.ndarray:
    return _owned(view.read(Box.whole(view.shape)))


def _concurrent(members: dict[str, Sequence[NpyFileArray]]) -> bool:
    """Whether the files are read by requests that wait on the network (objects), so reading them at once pays."""
    first = next((v for v in members.values() if v), None)
    return first is not None and bool(first[0].ref.source.concurrent) and sum(map(len, members.values())) > 1


_READS_AT_ONCE = 8
"""Jobs of one batch of objects read at once (each sends its own range GETs: the request pool bounds those)."""


def _read_at_once(members: dict[str, Sequence[NpyFileArray]]) -> dict[str, Any]:
    """Each member's batch, every stack (or file, where shapes differ) a job; all jobs at once, in order.

    On an error the jobs not started are cancelled and the running ones waited for; the first error is raised.
    """
    jobs: list[tuple[str, bool, Any]] = []  # (member, whether a whole stack, what to read)
    for k, views in members.items():
        if len({v.shape for v in views}) == 1:
            jobs.append((k, True, views))
        else:
            jobs.extend((k, False, v) for v in views)
    read = run_on("npydask-batch", _READS_AT_ONCE, lambda job: (_stacked if job[1] else _whole)(job[2]), jobs)
    out: dict[str, Any] = {k: [] for k in members}
    for (k, stack, _), got in zip(jobs, read):
        if stack:
            out[k] = got
        else:
            out[k].append(got)
    return out


class Counted(NamedTuple):
    """A batch of whole files and what reading it cost (:func:`read_counted`)."""

    batch: Any
    stats: ReadStats


def read_counted(views: Sequence[NpyFileArray] | dict[str, Sequence[NpyFileArray]], device: str = "cpu") -> Counted:
    """:func:`read_batch`, with its cost counted where it runs (a prefetch thread or a cluster's worker).

    ``patch_bytes`` is the bytes of the batch delivered, ``io_wait_s`` the
    read's wall time; the other figures are the object-store requests the
    read made (:mod:`npydask.storage.io_counts`): local files count none.
    """
    started = time.perf_counter()
    with collect() as counts:
        batch = read_batch(views, device)
    stats = ReadStats(counts.bytes_read, _nbytes(batch), counts.requests, time.perf_counter() - started)
    return Counted(batch, stats.with_io(counts))


def _nbytes(batch: Any) -> int:
    """Bytes of a batch: an array, a list of arrays or a dict of either."""
    if isinstance(batch, dict):
        return sum(_nbytes(v) for v in batch.values())
    if isinstance(batch, list):
        return sum(_nbytes(v) for v in batch)
    return int(batch.nbytes)


def _owned(a: np.ndarray) -> np.ndarray:
    """``a`` as a writable, C-contiguous array in native byte order (a mapped view is copied).

    ``torch.from_numpy`` warns on read-only arrays and refuses swapped ones.
    """
    dtype = joined_dtype(a.dtype)
    if a.flags.writeable and a.flags.c_contiguous and a.dtype == dtype and a.dtype.str == dtype.str:
        return a
    return np.array(a, dtype=dtype, order="C")


class PatchReader:
    """Reads a batch of a sampler loader: ``(epoch, positions)`` to a :class:`~npydask.samplers.PatchBatch`.

    Carries the dataset and the bound sampler (pure numbers): a prefetch
    thread or a cluster worker plans the boxes and reads them. The
    ``patch_read`` setting in force where it is made travels with it (a
    worker does not see the client's settings).
    """

    def __init__(self, dataset: Any, bound: BoundSampler, seed: int | None, shuffle: bool) -> None:
        self.dataset, self.bound, self.seed, self.shuffle = dataset, bound, seed, shuffle
        self.route = str(config.get("patch_read"))

    def __call__(self, job: tuple[int, np.ndarray], device: str) -> PatchBatch:
        epoch, positions = job
        patches = self.bound.patches(epoch, positions.tolist(), seed=self.seed, shuffle=self.shuffle)
        return read_patches(self.dataset, patches, self.bound, device=device, route=self.route)


def call_read(read: Any, payload: Any, device: str) -> Any:
    """On a cluster worker: ``read(payload, device)`` (``read`` sent once, as a scattered future)."""
    return read(payload, device)


class DeviceHandOff:
    """Device batches read on prefetch threads for the thread that iterates (``device="gpu"``).

    A new thread's current CUDA device is 0 and its current stream its own:
    each read runs under the device current in the iterating thread when
    iteration started (under DDP, ``torch.cuda.set_device(rank)``'s), and
    the batch is handed over with an event recorded after its last kernel on
    the reading thread's stream, which the consumer's current stream waits
    on (no host synchronisation). With numpy standing in for CuPy (the CPU
    tests) there is nothing to order.
    """

    def __init__(self) -> None:
        from npydask.gpu import array_module

        xp = array_module()
        self.cuda = None if xp is np else xp.cuda
        self.device_id = None if self.cuda is None else int(self.cuda.runtime.getDevice())

    def read(self, read: Any, payload: Any, device: str) -> tuple[Any, Any]:
        """On a prefetch thread: ``read(payload, device)``, run on the caller's device, and the event that ends it."""
        if self.cuda is None:
            return read(payload, device), None
        with self.cuda.Device(self.device_id):
            batch = read(payload, device)
            event = self.cuda.Event(disable_timing=True)
            event.record()  # (on this thread's current stream, after the batch's copy kernels)
        return batch, event

    def receive(self, done: tuple[Any, Any]) -> Any:
        """On the consumer thread: its current stream waits for the batch's kernels; the batch."""
        batch, event = done
        if event is not None and self.cuda is not None:  # (an event comes only from a device)
            self.cuda.get_current_stream().wait_event(event)
        return batch


class LocalFetch:
    """Batches read by threads of this process (or inline with ``prefetch=0``)."""

    def __init__(self, prefetch: int, device: str, read: Any = read_batch) -> None:
        self.device = device
        self.read = read
        self.handoff = DeviceHandOff() if prefetch and device == "gpu" else None  # (the caller's device: now)
        self.pool = ThreadPoolExecutor(prefetch, thread_name_prefix="npydask-loader") if prefetch else None

    def submit(self, payload: Any) -> Any:
        if self.pool is None:
            return payload  # read in result(), when asked for
        run = contextvars.copy_context().run  # (reads counted in the iterating context's collectors too)
        if self.handoff is not None:
            return self.pool.submit(run, self.handoff.read, self.read, payload, self.device)
        return self.pool.submit(run, self.read, payload, self.device)

    def result(self, future: Any) -> Any:
        if self.pool is None:
            return self.read(future, self.device)
        if self.handoff is not None:
            return self.handoff.receive(future.result())
        return future.result()

    def cancel(self, future: Any) -> None:
        if self.pool is not None:
            future.cancel()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


class ClusterFetch:
    """Batches read as tasks on a distributed client's workers, gathered once each.

    A ``read`` that is an object (a sampler loader's :class:`PatchReader`,
    which carries the dataset) is scattered to the workers once; each task
    then carries only its payload. A function (:func:`read_batch`,
    :func:`read_counted`) is sent by reference with each task.
    """

    def __init__(self, client: Any, device: str, read: Any = read_batch) -> None:
        self.client = client
        self.device = device
        self.plain = isinstance(read, FunctionType)
        self.read = read if self.plain else client.scatter(read, broadcast=True, hash=False)

    def submit(self, payload: Any) -> Any:
        if self.plain:
            return self.client.submit(self.read, payload, self.device, pure=False)
        return self.client.submit(call_read, self.read, payload, self.device, pure=False)

    def result(self, future: Any) -> Any:
        return future.result()

    def cancel(self, future: Any) -> None:
        future.cancel()

    def close(self) -> None:
        pass
