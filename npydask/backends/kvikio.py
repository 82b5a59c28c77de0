"""The device reader: runs :class:`~npydask.gpu_plan.GpuReadPlan` s into CuPy arrays.

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
    process logs it once (logger ``npydask.backends.kvikio``, level INFO).
    Reads under ``KVIKIO_GDS_THRESHOLD`` (16 KiB since kvikio 25.04, 1 MiB
    before) run synchronously through POSIX even with GDS.

pinned host memory (CuPy without kvikio)
    ``os.preadv`` into page-locked host memory
    (``cupy.cuda.alloc_pinned_memory``), one host-to-device copy, then the
    same device steps.

Either way the file's identity (size, mtime, inode) is checked before reading:
through the shared handle cache (:func:`~npydask.storage._handles.acquire`) on
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
import logging
import math
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from npydask.errors import GpuUnavailableError, NpyFormatError
from npydask.gpu_exec import Pending, aligned_empty, drain, finish, issue_reads, wait_reads
from npydask.gpu_plan import GpuReadPlan
from npydask.storage._handles import (
    FileIdentity,
    _changed,
    _nofile_soft,
    check_unchanged,
    clear_cache,
    differs,
    pread_exact,
)

if TYPE_CHECKING:  # (backends sit left of the reader: no import at run time)
    from npydask.reader import FileRef

__all__ = ["FILES_IN_FLIGHT", "IO_THREADS", "DeviceRead", "cufile_limit", "describe", "read_to_device", "translate"]

FILES_IN_FLIGHT = 64
"""Files whose reads are in flight together (kvikio holds two descriptors per open file)."""

IO_THREADS = 16
"""kvikio threads the first device read asks for where ``KVIKIO_NTHREADS``/``KVIKIO_NUM_THREADS`` are unset.

At most one per CPU core, and never fewer than kvikio already has. kvikio's
own default is one thread. Raw ``CuFile.pread`` of a 1 GiB file (page cache
warm, kvikio's POSIX compatibility mode, an H200) into a device buffer:
1 thread 5.5 GB/s, 4 threads 21, 8 threads 37, 16 threads 44, 32 threads 42.
"""

_THREAD_VARS = ("KVIKIO_NTHREADS", "KVIKIO_NUM_THREADS")
"""kvikio's environment variables for its thread count: when one is set, npydask leaves the count alone."""

_AUTO: Any = object()

_DRIVER_WORDS = ("libcuda", "cuInit", "CUDA driver", "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_NOT_INITIALIZED",
                 "no CUDA-capable")  # fmt: skip
"""Words in a kvikio error that mean the driver or device is missing, not GDS."""

_EOF_WORDS = ("pread: EOF", "unexpected EOF")
"""Words in kvikio's error where the file ended before the bytes asked for (its POSIX reads never return short)."""

_SYSTEM_ERRORS = (errno.ENFILE, errno.EMFILE, errno.ENOENT, errno.EIO)
"""System errors found in kvikio's messages by their ``strerror`` text (``ENFILE``'s holds ``EMFILE``'s: first)."""

_COMPAT_MODES = {0: "OFF", 1: "ON", 2: "AUTO"}
"""kvikio's ``CompatMode`` values, as ``kvikio.defaults.get("compat_mode")`` may give them."""

log = logging.getLogger(__name__)


class DeviceRead(NamedTuple):
    """One file's part of a task: where, how, and optionally into which C-contiguous ``out``."""

    ref: FileRef
    plan: GpuReadPlan
    out: Any = None


def _import_kvikio(path: str) -> Any:
    """kvikio with ``defaults`` (and ``cufile_driver``, where it has one) imported; ``None`` where not installed.

    kvikio's ``__init__`` imports neither submodule, so ``kvikio.defaults``
    is an ``AttributeError`` until something imports it.
    """
    try:
        import kvikio
    except ImportError:
        return None
    except RuntimeError as e:  # its C++ library failing to load
        raise unavailable(path, e, "load") from e
    if not hasattr(kvikio, "defaults"):
        try:
            import kvikio.defaults
        except (ImportError, RuntimeError) as e:
            raise unavailable(path, e, "load its settings (kvikio.defaults)") from e
    if not hasattr(kvikio, "cufile_driver"):
        try:
            import kvikio.cufile_driver  # noqa: F401  (kvikio 24.12 and later)
        except (ImportError, RuntimeError):
            pass  # (describe() then reports GDS availability as unknown)
    return kvikio


def unavailable(path: str, error: BaseException, what: str) -> GpuUnavailableError:
    """A kvikio failure as a :class:`GpuUnavailableError` naming the file, the cause and the fix."""
    text = str(error)
    if any(word in text for word in _DRIVER_WORDS):
        fix = "run on a machine with an NVIDIA driver (libcuda.so.1) and a CUDA device, or use device='cpu'"
    else:
        fix = (
            "set KVIKIO_COMPAT_MODE=ON to read with POSIX I/O instead of GPUDirect Storage, "
            "uninstall kvikio to read through pinned host memory, or use device='cpu'"
        )
    return GpuUnavailableError(f"{path}: kvikio could not {what} ({type(error).__name__}: {text}); {fix}")


def translate(
    path: str, error: BaseException, what: str, fd: int = -1, identity: FileIdentity | None = None
) -> Exception:
    """A kvikio ``RuntimeError`` as the error the host path gives for the same cause, naming the file.

    kvikio's C++ errors carry the system error as its ``strerror`` text:
    ``EMFILE``/``ENFILE`` become ``OSError`` naming the open-file limit,
    ``ENOENT`` ``FileNotFoundError``, ``EIO`` ``OSError``. kvikio's end of
    file (raised, never a short count) becomes
    :class:`~npydask.errors.FileChangedError` when the open file ``fd``
    no longer has ``identity`` (it shrank after opening), else
    :class:`~npydask.errors.NpyFormatError` (the file is shorter than its
    header says). Anything else is :func:`unavailable`.

    Examples
    --------
    >>> e = translate("a.npy", RuntimeError("Unable to open file. Linux system/library function call "
    ...                                     "error at: file_utils.cpp:160: No such file or directory"), "open the file")
    >>> type(e).__name__, e.filename
    ('FileNotFoundError', 'a.npy')
    """
    text = str(error)
    said = f"kvikio could not {what} ({type(error).__name__}: {text})"
    if any(word in text for word in _EOF_WORDS):
        if fd >= 0 and identity is not None:
            st = os.fstat(fd)
            if differs(identity, st):
                return _changed(path, identity, st, during=True)
        return NpyFormatError(
            f"{path}: truncated .npy file: it ended before the bytes its header promises ({said}); "
            "rewrite the file, or open it again if it is being replaced"
        )
    for code in _SYSTEM_ERRORS:
        if os.strerror(code) in text:
            if code == errno.EMFILE:
                advice = (
                    f"the process's open-file limit (RLIMIT_NOFILE, `ulimit -n`, soft {_nofile_soft()}) is used "
                    "up; raise it, or read fewer files at once (fewer scheduler threads)"
                )
            elif code == errno.ENFILE:
                advice = "the system's open-file table is full (fs.file-max); raise it, or close other programs' files"
            elif code == errno.ENOENT:
                advice = "the file was removed or renamed after the dataset was opened; open it again"
            else:
                advice = "the storage failed to deliver the bytes; check the disk or file system"
            cls = FileNotFoundError if code == errno.ENOENT else OSError
            return cls(code, f"{os.strerror(code)}: {said}; {advice}", path)
    return unavailable(path, error, what)


# --------------------------------------------------------------------------
# kvikio's settings: read for describe(), the thread count raised once per process.

_lock = threading.Lock()
_prepared_for: Any = None
"""The kvikio module whose thread count this process has seen to (at its first device read)."""
_threads_note = ""
"""What npydask did to kvikio's thread count, for :func:`describe`."""
_logged: set[str] = set()
"""The paths already logged in this process (``"kvikio"``, ``"pinned"``, ``"objects"``)."""


def _setting(kvikio: Any, name: str) -> Any:
    """``kvikio.defaults.get(name)`` (kvikio >= 25.04), else the older ``defaults.<name>()``; ``None`` if neither."""
    defaults = getattr(kvikio, "defaults", None)
    try:
        if hasattr(defaults, "get"):
            return defaults.get(name)
        old = {"num_threads": "get_num_threads"}.get(name, name)
        getter = getattr(defaults, old, None) or getattr(defaults, name, None)
        return getter() if callable(getter) else None
    except Exception:  # noqa: BLE001 - a setting kvikio cannot tell is reported as unknown
        return None


def _set_threads(kvikio: Any, n: int) -> None:
    defaults = kvikio.defaults
    if hasattr(defaults, "set"):
        defaults.set("num_threads", n)  # (its context manager unused: the setting stays)
    else:
        defaults.num_threads_reset(n)


def _first_read(kvikio: Any) -> None:
    """Before this process's first kvikio read: raise kvikio's threads (unless the user chose), then log the path once.

    Once per kvikio module (a process has one). kvikio's thread count is
    raised to :data:`IO_THREADS` (at most one per CPU core) where neither
    ``KVIKIO_NTHREADS`` nor ``KVIKIO_NUM_THREADS`` is set and it has fewer;
    every thread arriving meanwhile waits, so no read starts before.
    """
    global _prepared_for, _threads_note
    if _prepared_for is kvikio:
        return
    with _lock:
        if _prepared_for is kvikio:
            return
        target = min(IO_THREADS, os.cpu_count() or 1)
        current = _setting(kvikio, "num_threads")
        named = [f"{v}={os.environ[v]}" for v in _THREAD_VARS if os.environ.get(v)]
        if named:
            _threads_note = f"from {named[0]}"
        elif isinstance(current, int) and current < target:
            try:
                _set_threads(kvikio, target)
            except Exception as e:  # noqa: BLE001 - fewer threads only reads slower
                _threads_note = f"npydask could not raise it to {target}: {type(e).__name__}: {e}"
            else:
                _threads_note = f"raised from {current} by npydask; KVIKIO_NTHREADS sets it"
        else:
            _threads_note = "left as set"
        _prepared_for = kvikio
        _logged.add("kvikio")
        log.info("npydask reads onto the device with %s", _describe(kvikio))


def _path(kvikio: Any) -> tuple[str, str]:
    """Which path kvikio reads by, and the compat mode's name (``ON``/``OFF``/``AUTO``)."""
    mode = _setting(kvikio, "compat_mode")
    if isinstance(mode, bool):  # (kvikio before 24.12)
        name = "ON" if mode else "OFF"
    else:
        name = getattr(mode, "name", None) or _COMPAT_MODES.get(mode, str(mode))  # type: ignore[arg-type]
    preferred: bool | None
    try:
        preferred = bool(kvikio.defaults.is_compat_mode_preferred())  # kvikio >= 25.04
    except Exception:  # noqa: BLE001 - older kvikio: from the mode alone
        preferred = {"ON": True, "OFF": False}.get(name)
    if preferred is None:
        return "kvikio (GPUDirect Storage or its POSIX compatibility mode, decided per file)", name
    return ("kvikio POSIX compatibility mode" if preferred else "GPUDirect Storage"), name


def _gds_available(kvikio: Any) -> str:
    try:
        return "yes" if kvikio.cufile_driver.get("is_gds_available") else "no"
    except Exception:  # noqa: BLE001 - no cufile_driver (kvikio < 25.04), or its driver refused
        return "unknown"


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return str(n)
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def describe() -> str:
    """How this process reads onto the device, in words (for logs, examples and bug reports).

    It starts with the path: ``GPUDirect Storage``, ``kvikio POSIX
    compatibility mode`` or ``pinned host memory (kvikio not installed)``,
    then kvikio's version, compat mode, whether GDS is available, its
    thread count (and who set it), task size and GDS threshold.

    Examples
    --------
    >>> describe().split(":")[0] in ("GPUDirect Storage", "kvikio POSIX compatibility mode",
    ...                              "pinned host memory (kvikio not installed)") or describe().startswith("kvikio")
    True
    """
    kvikio = _import_kvikio("<describe>")
    return _PINNED if kvikio is None else _describe(kvikio)


_PINNED = "pinned host memory (kvikio not installed): os.preadv, then one host-to-device copy"
_OBJECTS = "pinned host memory for objects (kvikio reads local files only): range requests, one host-to-device copy"


def _describe(kvikio: Any) -> str:
    """:func:`describe` of this kvikio module."""
    path, mode = _path(kvikio)
    threads = _setting(kvikio, "num_threads")
    if _prepared_for is kvikio:
        who = _threads_note
    elif any(os.environ.get(v) for v in _THREAD_VARS):
        who = "from " + next(f"{v}={os.environ[v]}" for v in _THREAD_VARS if os.environ.get(v))
    else:
        who = f"npydask raises it to at least {min(IO_THREADS, os.cpu_count() or 1)} at the first device read"
    return (
        f"{path}: kvikio {getattr(kvikio, '__version__', '?')}, compat_mode {mode}, "
        f"GDS available: {_gds_available(kvikio)}, num_threads {threads} ({who}), "
        f"task_size {_size(_setting(kvikio, 'task_size'))}, gds_threshold {_size(_setting(kvikio, 'gds_threshold'))}"
    )


def _log_once(key: str, message: str) -> None:
    """Log ``message`` at INFO the first time ``key`` comes up in this process."""
    if key in _logged:
        return
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    log.info("npydask reads onto the device with %s", message)


# --------------------------------------------------------------------------
# A process-wide bound on open CuFiles (two descriptors each).

_open_cond = threading.Condition()
_open_now = 0
"""``CuFile`` s open (or reserved for a window) in this process now."""
_open_peak = 0
"""The most ``CuFile`` s reserved at once in this process (for tests and probes)."""


def cufile_limit() -> int:
    """How many ``CuFile`` s the process may hold open at once: 3/16 of the soft ``RLIMIT_NOFILE``.

    The host handle cache takes at most a quarter of the limit's descriptors
    (see :func:`npydask.storage._handles.cache_limit`); each ``CuFile``
    holds two (buffered and ``O_DIRECT``), and takes half of what is left,
    leaving the rest to the process (sockets, libraries, reads in flight).
    Read at every window, so a limit lowered at run time is followed.

    Examples
    --------
    >>> import resource
    >>> cufile_limit() == max(1, resource.getrlimit(resource.RLIMIT_NOFILE)[0] * 3 // 16)
    True
    """
    soft = _nofile_soft()
    return 1 << 30 if soft < 0 else max(1, soft * 3 // 16)


def _reserve(n: int) -> int:
    """Wait until ``n`` more ``CuFile`` s fit under :func:`cufile_limit` (``n`` at most the limit), then take them.

    A window takes all its room at once, so no window holds part of it while
    waiting for the rest (which could deadlock).
    """
    global _open_now, _open_peak
    with _open_cond:
        while _open_now and _open_now + n > cufile_limit():
            _open_cond.wait()
        _open_now += n
        _open_peak = max(_open_peak, _open_now)
    return n


def _release(n: int) -> None:
    global _open_now
    with _open_cond:
        _open_now -= n
        _open_cond.notify_all()


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
        kvikio = None if xp is np else _import_kvikio(jobs[todo[0]].ref.path)
    step = FILES_IN_FLIGHT
    if kvikio is not None:
        _first_read(kvikio)  # (threads and log, once per process)
        step = min(step, cufile_limit())  # (a window takes room for all its CuFiles at once)
    elif xp is not np:
        _log_once("pinned", _PINNED)
    for first in range(0, len(todo), step):
        window = [jobs[k] for k in todo[first : first + step]]
        if kvikio is not None and all(job.ref.source.mappable for job in window):
            done = _read_window_kvikio(window, xp, kvikio)
        else:
            if kvikio is not None and xp is not np:
                _log_once("objects", _OBJECTS)
            done = _read_window_host(window, xp)
        for k, block in zip(todo[first : first + step], done):
            results[k] = block
    return results


def _layout(window: Sequence[DeviceRead]) -> tuple[list[int], int, int]:
    """Each job's staging offset in one shared buffer (aligned), the total, and the alignment."""
    alignment = math.lcm(*(job.plan.alignment for job in window))
    offsets, total = [], 0
    for job in window:
        offsets.append(total)
        total += -(-job.plan.staging_nbytes // alignment) * alignment
    return offsets, total, alignment


def _finish_all(window: Sequence[DeviceRead], staging: Any, offsets: list[int], xp: Any) -> list[Any]:
    return [
        finish(job.plan, staging[at : at + job.plan.staging_nbytes], xp, job.out) for job, at in zip(window, offsets)
    ]


def _read_window_host(window: Sequence[DeviceRead], xp: Any) -> list[Any]:
    """``os.preadv`` into (pinned) host memory, one copy to the device, then the device steps."""
    offsets, total, alignment = _layout(window)
    on_device = xp is not np
    if on_device:
        pinned = xp.cuda.alloc_pinned_memory(total + alignment)
        host = np.frombuffer(pinned, np.uint8, total + alignment)
        shift = -host.ctypes.data % alignment
        host = host[shift : shift + total]
    else:
        host = aligned_empty(np, total, alignment)
    for job, at in zip(window, offsets):
        f = job.ref.source.open(job.ref.path, job.ref.identity, key=job.ref.key, check=job.ref.check)
        if not job.ref.source.mappable:  # an object: range requests into the pinned buffer (each checked)
            reader = f.range_reader()

            def read_remote(offset: int, size: int, dest: np.ndarray, reader: Any = reader) -> int:
                reader.read_into(dest, offset)
                return size

            wait_reads(issue_reads(job.plan, read_remote, host[at : at + job.plan.staging_nbytes]), f.path)
            continue
        fd, path = f.fd, f.path

        def read_span(offset: int, size: int, dest: np.ndarray, fd: int = fd, path: str = path) -> int:
            pread_exact(fd, memoryview(dest), offset, path)  # (a short read there: FileChangedError)
            return size

        wait_reads(issue_reads(job.plan, read_span, host[at : at + job.plan.staging_nbytes]), path)
        check_unchanged(fd, f.identity, path)  # a rewrite during the read: never other data
    if not on_device:
        return _finish_all(window, host, offsets, xp)
    staging = aligned_empty(xp, total, alignment)
    staging.set(host)
    xp.cuda.get_current_stream().synchronize()  # the pinned buffer is reused once released
    return _finish_all(window, staging, offsets, xp)


class _KvikioRead:
    """A kvikio ``IOFuture`` whose C++ errors come out as the host path's errors (:func:`translate`)."""

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
            raise translate(self.path, e, what, self.fd, self.identity) from e


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
        error = translate(ref.path, e, "open the file")
        if getattr(error, "errno", None) not in (errno.EMFILE, errno.ENFILE):
            raise error from e
        clear_cache()  # past the open-file limit: the host cache's descriptors go first, as on the host path
        try:
            handle = kvikio.CuFile(ref.path, "r")
        except RuntimeError as again:
            raise translate(ref.path, again, "open the file") from again
    try:
        st = os.fstat(handle.fileno())
        found = FileIdentity.of(st)
        if differs(ref.identity, st):  # replaced between the check and the open
            raise _changed(ref.path, ref.identity, st)
    except BaseException:
        handle.close()
        raise
    return handle, found


def _read_window_kvikio(window: Sequence[DeviceRead], xp: Any, kvikio: Any) -> list[Any]:
    """kvikio ``pread`` futures for every read of the window, then one wait, then the device steps."""
    offsets, total, alignment = _layout(window)
    staging = aligned_empty(xp, total, alignment)
    if xp is not np:
        # The staging block may come from a pool that handed it over while kernels queued on
        # this or another stream still read it (RMM orders that on the device only); kvikio's
        # threads write outside any stream order, so let those finish first, after allocating.
        xp.cuda.get_current_stream().synchronize()
    handles: list[Any] = []
    found: list[FileIdentity] = []  # (each file's whole identity: an inode-only one says too little after the read)
    issued: list[tuple[Pending, str]] = []
    room = _reserve(len(window))  # (waits while other windows hold the process's CuFile bound)
    try:
        try:
            for job, at in zip(window, offsets):
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
                        raise translate(path, e, what, handle.fileno(), found) from e

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
            _release(room)
    return _finish_all(window, staging, offsets, xp)
