"""The device reader: runs :class:`~npydask.gpu.plan.GpuReadPlan` s into CuPy arrays.

Two ways to get the bytes onto the device, picked per call:

``kvikio`` (installed with ``pip install 'npydask[gpu]'``)
    ``kvikio.CuFile(path, "r").pread(buf, size, file_offset)`` futures straight
    into an aligned device staging buffer, all issued before any is waited on
    (kvikio runs them on its process-wide thread pool). kvikio's pool has one
    thread unless ``KVIKIO_NTHREADS`` (or ``KVIKIO_NUM_THREADS``) says
    otherwise; where neither is set, the first device read of the process
    raises it to :data:`IO_THREADS` (at most one per CPU core), and never
    lowers a count set before. With GPUDirect Storage the bytes go from the
    disk to the GPU by DMA; without it (no ``nvidia-fs`` kernel module, no
    ``libcufile``, an unsupported file system, a container without
    ``/run/udev``) kvikio's *compatibility mode* reads with POSIX ``pread``
    through its own pinned bounce buffers. kvikio decides that itself
    (``compat_mode`` ``AUTO``); ``KVIKIO_COMPAT_MODE=ON`` forces POSIX reads.
    :func:`describe` says which path reads, and the first device read of a
    process logs it once (logger ``npydask.gpu._kvikio``, level INFO).
    Reads under ``KVIKIO_GDS_THRESHOLD`` (16 KiB since kvikio 25.04, 1 MiB
    before) run synchronously through POSIX even with GDS.

pinned host memory (CuPy without kvikio)
    ``os.preadv`` piece by piece through the thread's small ring of
    page-locked buffers (:mod:`npydask.gpu._pinned`), each piece copied to the
    device while the next is read, then the same device steps.

A region that is the file's bytes as they are (contiguous, native, C order,
unpadded) with an ``out`` slab goes straight into it either way: one
``pread`` (at any offset in kvikio's compatibility mode), no staging buffer
and no copy kernel.

Either way the file's identity (size, mtime, inode) is checked before reading:
through the shared handle cache (:func:`~npydask.storage.acquire`) on
the host path; on the path and then on kvikio's own descriptor with kvikio. A
file replaced after the graph was built fails with
:class:`~npydask.errors.FileChangedError` instead of returning other data.
kvikio's C++ errors (bare ``RuntimeError`` s) are translated by the system
error their text carries, as the host path reports them: too many open files
is ``OSError`` (``EMFILE``/``ENFILE``), a missing file ``FileNotFoundError``,
an I/O error ``OSError`` (``EIO``), each naming the file; kvikio's end of file
(its POSIX reads raise there instead of returning short) is
:class:`~npydask.errors.FileChangedError` when the file changed after it was
opened and :class:`~npydask.errors.NpyFormatError` (truncated) otherwise. Only
driver, device and cuFile failures are
:class:`~npydask.errors.GpuUnavailableError`, naming the file and the fix.

Files are read in windows of :data:`FILES_IN_FLIGHT`: one staging buffer and
every read of the window issued at once, then one wait, then the device steps.
Each ``CuFile`` holds two descriptors, so the ``CuFile`` s open at once in
the whole process are bounded by :func:`cufile_limit` (derived from
``RLIMIT_NOFILE`` beside the host handle cache's share): a window waits for
room rather than failing with ``EMFILE``.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from npydask.gpu._exec import (
    Pending,
    ReadSpan,
    address,
    aligned_empty,
    as_bytes,
    drain,
    finish,
    issue_direct,
    issue_reads,
    wait_reads,
)
from npydask.gpu._kvikio_runtime import (
    IO_THREADS,
    OBJECTS,
    PINNED,
    cufile_limit,
    describe,
    first_read,
    import_kvikio,
    kvikio_error,
    log_once,
    posix_reads,
    release_cufiles,
    reserve_cufiles,
    unavailable,
)
from npydask.gpu.plan import GpuReadPlan
from npydask.plan.patch_runs import Spans
from npydask.storage import (
    FileIdentity,
    InodeIdentity,
    check_unchanged,
    clear_cache,
    differs,
    file_changed,
)
from npydask.storage.base import OpenedFile, Source

if TYPE_CHECKING:  # (backends sit left of the reader: no import at run time)
    from npydask.reader import FileRef

__all__ = [
    "DeviceRead",
    "FILES_IN_FLIGHT",
    "IO_THREADS",
    "cufile_limit",
    "describe",
    "kvikio_error",
    "read_to_device",
    "unavailable",
]

FILES_IN_FLIGHT = 64
"""Files whose reads are in flight together (kvikio holds two descriptors per open file)."""

_AUTO: Any = object()


class DeviceRead(NamedTuple):
    """One file's part of a task: where, how, and optionally into which C-contiguous ``out``."""

    ref: FileRef
    plan: GpuReadPlan
    out: Any = None


def read_to_device(jobs: Sequence[DeviceRead], xp: Any, kvikio: Any = _AUTO) -> list[Any]:
    """Run every job's plan; return one array per job (its ``out`` when given).

    Parameters
    ----------
    jobs : sequence of DeviceRead
        The files and their plans.
    xp : module
        ``cupy`` (or ``numpy``, which the CPU tests use to run this same code).
    kvikio : module or None, optional
        The kvikio module to read with; by default imported when ``xp`` is not
        numpy, and ``None`` (reads through host memory) where not installed.

    Raises
    ------
    FileChangedError
        A file's size, mtime or inode differs from when the graph was built,
        or it shrank while being read.
    OSError
        Too many open files (``EMFILE``/``ENFILE``), a missing file
        (``FileNotFoundError``), an I/O error (``EIO``): named as on the host path.
    GpuUnavailableError
        kvikio failed (no driver, GDS refused): the message names the file and the fix.
    """
    results: list[Any] = [None] * len(jobs)
    todo = []
    for k, job in enumerate(jobs):
        if job.plan.cut is None:  # no byte of the file needed: as the CPU reader, the file is only checked
            job.ref.verify()  # (a box wholly outside it, a pad ROI: a header relied on may not be its own)
            results[k] = finish(job.plan, None, xp, job.out)
        else:
            todo.append(k)
    if not todo:
        return results
    if kvikio is _AUTO:
        kvikio = None if xp is np else import_kvikio(jobs[todo[0]].ref.path)
    step = FILES_IN_FLIGHT
    if kvikio is not None:
        first_read(kvikio)  # (threads and log, once per process)
        step = min(step, cufile_limit())  # (a window takes room for all its CuFiles at once)
    elif xp is not np:
        log_once("pinned", PINNED)
    for first in range(0, len(todo), step):
        window = [jobs[k] for k in todo[first : first + step]]
        if kvikio is not None and all(job.ref.source.mappable for job in window):
            done = _read_window_kvikio(window, xp, kvikio)
        else:
            if kvikio is not None and xp is not np:
                log_once("objects", OBJECTS)
            done = _read_window_host(window, xp)
        for k, block in zip(todo[first : first + step], done):
            results[k] = block
    return results


def _layout(window: Sequence[DeviceRead], direct: Sequence[bool] = ()) -> tuple[list[int], int, int]:
    """Each job's staging offset in one shared buffer (aligned), the total, and the alignment.

    Jobs marked ``direct`` (read straight into their ``out``) take no room.
    """
    alignment = math.lcm(*(job.plan.alignment for job in window))
    offsets, total = [], 0
    for k, job in enumerate(window):
        offsets.append(total)
        if not (direct and direct[k]):
            total += -(-job.plan.staging_nbytes // alignment) * alignment
    return offsets, total, alignment


def _finish_all(
    window: Sequence[DeviceRead], staging: Any, offsets: list[int], xp: Any, direct: Sequence[bool] = ()
) -> list[Any]:
    return [
        job.out if direct and direct[k] else finish(job.plan, staging[at : at + job.plan.staging_nbytes], xp, job.out)
        for k, (job, at) in enumerate(zip(window, offsets))
    ]


def _direct(job: DeviceRead, posix: bool, xp: Any) -> bool:
    """Whether ``job`` reads straight into its ``out``: a contiguous native region, and (with GPUDirect
    Storage) its file offset and destination both aligned; through POSIX any offset will do."""
    span = job.plan.direct
    if job.out is None or span is None:  # (without out, the staging buffer is the result: no copy either)
        return False
    if posix:
        return True
    a = job.plan.alignment
    try:
        where = address(as_bytes(job.out))
    except (AttributeError, KeyError, TypeError):  # (an array that does not say where it lives: staged)
        return False
    return span[0] % a == 0 and where % a == 0


def _read_window_host(window: Sequence[DeviceRead], xp: Any) -> list[Any]:
    """Each source's own reads into host memory (:meth:`~npydask.storage.base.Source.read_spans`), copies to the
    device, then the device steps.

    On a device every read goes piece by piece through the thread's ring of
    pinned buffers (:func:`~npydask.gpu._pinned.upload`: a piece is read while
    the one before is copied) into a device staging buffer. A job whose region
    is the file's bytes as they are (:attr:`~npydask.gpu.plan.GpuReadPlan.direct`)
    with an ``out`` skips staging: its bytes go straight into ``out`` (with numpy
    standing in for CuPy, from the file straight into ``out``).
    """
    on_device = xp is not np
    direct = [_direct(job, True, xp) for job in window]
    offsets, total, alignment = _layout(window, direct)
    staging = aligned_empty(xp, total, alignment) if not all(direct) else None
    for k, (job, at) in enumerate(zip(window, offsets)):
        source = job.ref.source
        f = source.open(job.ref.path, job.ref.identity, key=job.ref.key, check=job.ref.check)

        def read_host(
            offset: int, size: int, dest: np.ndarray, f: OpenedFile = f, source: Source = source, job: DeviceRead = job
        ) -> int:
            # the source reads its own way: a local file by pread (a short read: FileChangedError), an
            # object by range requests, each conditional on its identity
            one = np.ones(1, np.int64)
            source.read_spans(f, Spans(one * offset, one * size, one * 0), dest, job.ref.options)
            return size

        read_span: ReadSpan = _through_ring(read_host, xp) if on_device else read_host
        if direct[k]:
            wait_reads(issue_direct(job.plan, read_span, job.out), f.path)
        else:
            assert staging is not None  # (allocated unless every job is direct)
            wait_reads(issue_reads(job.plan, read_span, staging[at : at + job.plan.staging_nbytes]), f.path)
        f.check_unchanged()  # a rewrite during the read: never other data (an object's reads were each checked)
    return _finish_all(window, staging, offsets, xp, direct)


def _through_ring(read_span: ReadSpan, xp: Any) -> ReadSpan:
    """``read_span`` into host memory made a reader into device memory, through the pinned ring."""
    from npydask.gpu._pinned import upload

    def read_to_device_bytes(offset: int, size: int, dest: Any) -> int:
        upload(xp, dest, lambda buf, at: read_span(offset + at, buf.size, buf))
        return size

    return read_to_device_bytes


class _KvikioRead:
    """A kvikio ``IOFuture`` whose C++ errors come out as the host path's errors (:func:`kvikio_error`)."""

    __slots__ = ("fd", "future", "identity", "offset", "path", "size")

    def __init__(
        self, future: Any, path: str, offset: int, size: int, fd: int = -1, identity: FileIdentity | None = None
    ) -> None:
        self.future, self.path, self.offset, self.size = future, path, offset, size
        self.fd, self.identity = fd, identity

    def get(self) -> int:
        try:
            return int(self.future.get())
        except RuntimeError as e:
            what = f"read bytes {self.offset}..{self.offset + self.size}"
            raise kvikio_error(self.path, e, what, self.fd, self.identity) from e


def _open_checked(kvikio: Any, ref: FileRef) -> tuple[Any, FileIdentity]:
    """A ``kvikio.CuFile`` for ``ref`` and its whole identity, after checking the file is the one planned for.

    The path goes through the host handle cache first, which checks its
    identity and that its header bytes are the ones the task relies on (a
    missing file is the builtin ``FileNotFoundError``, as on the host path);
    then kvikio's own descriptor is checked with ``fstat``.
    """
    ref.source.open(ref.path, ref.identity, key=ref.key, check=ref.check)
    try:
        handle = kvikio.CuFile(ref.path, "r")
    except RuntimeError as e:
        error = kvikio_error(ref.path, e, "open the file")
        if getattr(error, "errno", None) not in (errno.EMFILE, errno.ENFILE):
            raise error from e
        clear_cache()  # past the open-file limit: the host cache's descriptors go first, as on the host path
        try:
            handle = kvikio.CuFile(ref.path, "r")
        except RuntimeError as again:
            raise kvikio_error(ref.path, again, "open the file") from again
    try:
        st = os.fstat(handle.fileno())
        found = FileIdentity.of(st)
        expected = cast(FileIdentity | InodeIdentity, ref.identity)  # (a local file's identity)
        if differs(expected, st):  # replaced between the check and the open
            raise file_changed(ref.path, expected, st)
    except BaseException:
        handle.close()
        raise
    return handle, found


def _read_window_kvikio(window: Sequence[DeviceRead], xp: Any, kvikio: Any) -> list[Any]:
    """kvikio ``pread`` futures for every read of the window, then one wait, then the device steps.

    A job whose region is the file's bytes as they are (:attr:`~npydask.gpu.plan.GpuReadPlan.direct`)
    with an ``out`` is read straight into ``out`` (one ``pread``, at any offset in
    compatibility mode, where alignment buys nothing): no staging, no copy.
    """
    posix = posix_reads(kvikio) is True  # (unknown: GPUDirect Storage assumed, aligned reads staged)
    direct = [_direct(job, posix, xp) for job in window]
    offsets, total, alignment = _layout(window, direct)
    staging = aligned_empty(xp, total, alignment) if not all(direct) else None
    if xp is not np:
        # The staging block (or an ``out`` allocated before this window) may come from a pool that
        # handed it over while kernels queued on this or another stream still read it (RMM orders
        # that on the device only); kvikio's threads write outside any stream order, so let those
        # finish first, after allocating.
        xp.cuda.get_current_stream().synchronize()
    handles: list[Any] = []
    found: list[FileIdentity] = []  # (each file's whole identity: an inode-only one says too little after the read)
    issued: list[tuple[Pending, str]] = []
    room = reserve_cufiles(len(window))  # (waits while other windows hold the process's CuFile bound)
    try:
        try:
            for job, at, straight in zip(window, offsets, direct):
                handle, identity = _open_checked(kvikio, job.ref)
                handles.append(handle)
                found.append(identity)
                path = job.ref.path

                def read_span(
                    offset: int, size: int, dest: Any, handle: Any = handle, path: str = path, found: Any = identity
                ) -> _KvikioRead:
                    try:  # (kvikio reads under its gds_threshold here, synchronously: errors come at once)
                        return _KvikioRead(handle.pread(dest, size, offset), path, offset, size, handle.fileno(), found)
                    except RuntimeError as e:
                        what = f"start reading bytes {offset}..{offset + size}"
                        raise kvikio_error(path, e, what, handle.fileno(), found) from e

                if straight:
                    issued.append((issue_direct(job.plan, read_span, job.out), path))
                else:
                    assert staging is not None  # (allocated unless every job is direct)
                    issued.append((issue_reads(job.plan, read_span, staging[at : at + job.plan.staging_nbytes]), path))
        except BaseException:
            for pending, _ in issued:
                drain(pending)
            raise
        for k, (pending, path) in enumerate(issued):
            try:
                wait_reads(pending, path)
                check_unchanged(handles[k].fileno(), found[k], path)  # no torn data
            except BaseException:
                for rest, _ in issued[k + 1 :]:
                    drain(rest)
                raise
    finally:
        try:
            for handle in handles:
                handle.close()
        finally:
            release_cufiles(room)
    return _finish_all(window, staging, offsets, xp, direct)
