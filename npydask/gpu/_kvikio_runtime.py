"""kvikio as the device reader meets it: importing it, its settings, its errors, and its descriptors.

- :func:`import_kvikio` imports kvikio with ``kvikio.defaults`` and
  ``kvikio.cufile_driver`` (kvikio's ``__init__`` imports neither).
- :func:`describe` says which path reads (GPUDirect Storage, kvikio's POSIX
  compatibility mode, pinned host memory) with kvikio's settings, and
  :func:`posix_reads` whether kvikio reads through POSIX (the reader's choice
  of staging follows it);
  :func:`first_read` raises kvikio's thread count once per process (unless
  the user chose it) and logs the path.
- :func:`kvikio_error` turns kvikio's ``RuntimeError`` s into the errors the
  host path gives for the same cause.
- :func:`reserve_cufiles` / :func:`release_cufiles` bound the ``CuFile`` s
  open at once in the process by :func:`cufile_limit`.

This module imports neither kvikio nor CuPy at import time.
"""

from __future__ import annotations

import errno
import importlib
import logging
import os
import sys
import threading
from typing import Any

from npydask.errors import GpuUnavailableError, NpyFormatError
from npydask.storage import FileIdentity, differs, file_changed, nofile_soft

__all__ = [
    "IO_THREADS",
    "OBJECTS",
    "PINNED",
    "cufile_limit",
    "describe",
    "first_read",
    "import_kvikio",
    "kvikio_error",
    "log_once",
    "posix_reads",
    "release_cufiles",
    "reserve_cufiles",
    "unavailable",
]

IO_THREADS = 16
"""kvikio threads the first device read asks for where ``KVIKIO_NTHREADS``/``KVIKIO_NUM_THREADS`` are unset.

At most one per CPU core, and never fewer than kvikio already has. kvikio's
own default is one thread, which reads a file from the page cache several
times slower than 16 threads do; beyond 16 raw ``CuFile.pread`` gained nothing
(``benchmarks/bench_gpu.py``; the measured table is on the performance page).
"""

_THREAD_VARS = ("KVIKIO_NTHREADS", "KVIKIO_NUM_THREADS")
"""kvikio's environment variables for its thread count: when one is set, npydask leaves the count alone."""

_DRIVER_WORDS = ("libcuda", "cuInit", "CUDA driver", "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_NOT_INITIALIZED",
                 "no CUDA-capable")  # fmt: skip
"""Words in a kvikio error that mean the driver or device is missing, not GDS."""

_EOF_WORDS = ("pread: EOF", "unexpected EOF")
"""Words in kvikio's error where the file ended before the bytes asked for (its POSIX reads never return short)."""

_SYSTEM_ERRORS = (errno.ENFILE, errno.EMFILE, errno.ENOENT, errno.EIO)
"""System errors found in kvikio's messages by their ``strerror`` text (``ENFILE``'s holds ``EMFILE``'s: first)."""

_COMPAT_MODES = {0: "OFF", 1: "ON", 2: "AUTO"}
"""kvikio's ``CompatMode`` values, as ``kvikio.defaults.get("compat_mode")`` may give them."""

log = logging.getLogger("npydask.gpu._kvikio")
"""The device reader's logger (it logs the path that reads, once per process, at INFO)."""


def import_kvikio(path: str) -> Any:
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


def kvikio_error(
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
    >>> e = kvikio_error("a.npy", RuntimeError("Unable to open file. Linux system/library function call "
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
                return file_changed(path, identity, st, during=True)
        return NpyFormatError(
            f"{path}: truncated .npy file: it ended before the bytes its header promises ({said}); "
            "rewrite the file, or open it again if it is being replaced"
        )
    for code in _SYSTEM_ERRORS:
        if os.strerror(code) in text:
            if code == errno.EMFILE:
                advice = (
                    f"the process's open-file limit (RLIMIT_NOFILE, `ulimit -n`, soft {nofile_soft()}) is used "
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
        if defaults is not None and hasattr(defaults, "get"):
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


def first_read(kvikio: Any) -> None:
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


def _mode_name(kvikio: Any) -> str:
    """kvikio's compat mode by name: ``ON``, ``OFF`` or ``AUTO``."""
    mode = _setting(kvikio, "compat_mode")
    if isinstance(mode, bool):  # (kvikio before 24.12)
        return "ON" if mode else "OFF"
    return getattr(mode, "name", None) or _COMPAT_MODES.get(mode, str(mode))  # type: ignore[arg-type]


def posix_reads(kvikio: Any) -> bool | None:
    """Whether kvikio reads through POSIX (its compatibility mode), where aligned reads buy nothing.

    ``None`` where it cannot tell (an ``AUTO`` mode of a kvikio too old to say which it prefers).
    """
    defaults = getattr(kvikio, "defaults", None)
    if defaults is None and sys.modules.get("kvikio") is kvikio:
        try:  # (kvikio 26.10's __init__ does not import its defaults module)
            defaults = importlib.import_module("kvikio.defaults")
        except ImportError:
            pass
    try:
        return bool(defaults.is_compat_mode_preferred())  # type: ignore[union-attr]  # kvikio >= 25.04
    except Exception:  # noqa: BLE001 - older kvikio: from the mode alone
        return {"ON": True, "OFF": False}.get(_mode_name(kvikio))


def _path(kvikio: Any) -> tuple[str, str]:
    """Which path kvikio reads by, and the compat mode's name (``ON``/``OFF``/``AUTO``)."""
    preferred = posix_reads(kvikio)
    name = _mode_name(kvikio)
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
    kvikio = import_kvikio("<describe>")
    return PINNED if kvikio is None else _describe(kvikio)


PINNED = "pinned host memory (kvikio not installed): os.preadv, then one host-to-device copy"
OBJECTS = "pinned host memory for objects (kvikio reads local files only): range requests, one host-to-device copy"


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


def log_once(key: str, message: str) -> None:
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
    (see :func:`npydask.storage.cache_limit`); each ``CuFile``
    holds two (buffered and ``O_DIRECT``), and takes half of what is left,
    leaving the rest to the process (sockets, libraries, reads in flight).
    Read at every window, so a limit lowered at run time is followed.

    Examples
    --------
    >>> import resource
    >>> cufile_limit() == max(1, resource.getrlimit(resource.RLIMIT_NOFILE)[0] * 3 // 16)
    True
    """
    soft = nofile_soft()
    return 1 << 30 if soft < 0 else max(1, soft * 3 // 16)


def reserve_cufiles(n: int) -> int:
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


def release_cufiles(n: int) -> None:
    global _open_now
    with _open_cond:
        _open_now -= n
        _open_cond.notify_all()
