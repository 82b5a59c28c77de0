"""Stand-ins for the GPU tests on a CPU: a CuPy-shaped module over host memory and a fake kvikio.

:func:`cupy_like` is shaped like CuPy as far as npydask uses it (arrays are numpy
arrays of :class:`CupyLikeArray`); :class:`FakeKvikio` is kvikio 26.10 over ``os.pread``
(:func:`install_kvikio` makes ``import kvikio`` give one for a test); :func:`same`
compares what a read gave with numpy's array, byte for byte. Used by ``tests/gpu/`` and by
the object-storage test of ``device="gpu"`` in ``tests/storage/test_remote.py``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
import time
import types

import numpy as np


def same(got, expected):
    got = np.asarray(got)
    expected = np.asarray(expected)
    assert got.dtype.str == expected.dtype.newbyteorder("=").str, (got.dtype, expected.dtype)
    assert got.shape == expected.shape
    assert got.tobytes() == expected.astype(got.dtype).tobytes()


class CupyLikeArray(np.ndarray):
    def set(self, host):
        self[...] = host


def cupy_like(log=None):
    """A module shaped like CuPy over host memory: exercises the device-only branches here.

    ``log``, when given, records ``"alloc"`` for each ``empty`` and ``"sync"`` for each stream synchronisation.
    """
    log = [] if log is None else log

    def empty(shape, dtype=float):
        log.append("alloc")
        return np.empty(shape, dtype).view(CupyLikeArray)

    synced, events = [], []

    def synchronize():
        synced.append(1)
        log.append("sync")

    stream = types.SimpleNamespace(synchronize=synchronize)

    class Event:  # (copies are synchronous here: recording and waiting are only counted)
        def __init__(self, **flags):
            self.waited = 0

        def record(self, stream=None):
            events.append(self)

        def synchronize(self):
            self.waited += 1

    cuda = types.SimpleNamespace(alloc_pinned_memory=bytearray, get_current_stream=lambda: stream, Event=Event)
    return types.SimpleNamespace(__name__="cupy", empty=empty, uint8=np.uint8, cuda=cuda, synced=synced,
                                 events=events, asarray=lambda a: np.asarray(a).view(CupyLikeArray))  # fmt: skip


class FakeFuture:
    def __init__(self, n, error=None):
        self.n, self.error = n, error

    def get(self):
        if self.error:
            raise RuntimeError(self.error)
        return self.n


KVIKIO_EOF = "KvikIO failure at: /kvikio/cpp/include/kvikio/detail/posix_io.hpp:173: POSIX error on pread: EOF"
"""What kvikio's POSIX reads raise where the file ends before the bytes asked for (they never return short)."""


def kvikio_system_error(code):
    """kvikio's text for a failed system call (``KVIKIO_SYSCALL_CHECK``: a ``std::system_error``)."""
    return (
        "Unable to open file. Linux system/library function call error at: "
        f"/kvikio/cpp/src/file_utils.cpp:160: {os.strerror(code)}"
    )


class FakeDefaults(types.ModuleType):
    """``kvikio.defaults`` of kvikio 26.10: ``get``/``set`` (a context manager too), ``is_compat_mode_preferred``."""

    def __init__(self, compat_mode, num_threads, gds):
        super().__init__("kvikio.defaults")
        self.values = {"compat_mode": compat_mode, "num_threads": num_threads, "task_size": 4 << 20,
                       "gds_threshold": 16384}  # fmt: skip
        self.gds, self.sets = gds, []

    def get(self, name):
        return self.values[name]

    def set(self, *config):
        items = config[0] if len(config) == 1 else {config[0]: config[1]}
        old = {k: self.values[k] for k in items}
        self.values.update(items)
        self.sets.append(dict(items))
        defaults = self

        class Restore:
            def __enter__(self):
                return None

            def __exit__(self, *exc):
                defaults.values.update(old)

        return Restore()

    def is_compat_mode_preferred(self):
        mode = self.values["compat_mode"]  # 0 OFF, 1 ON, 2 AUTO (kvikio's default)
        return mode == 1 or (mode == 2 and not self.gds)


class FakeCufileDriver(types.ModuleType):
    def __init__(self, gds):
        super().__init__("kvikio.cufile_driver")
        self.gds = gds

    def get(self, name):
        return {"is_gds_available": self.gds, "major_version": 1, "minor_version": 16}[name]


class FakeKvikio(types.ModuleType):
    """kvikio 26.10 as far as npydask uses it: ``CuFile`` over ``os.pread``; ``defaults``; ``cufile_driver``.

    Each ``CuFile`` holds two descriptors (kvikio opens the file buffered and
    with ``O_DIRECT``) and the fake counts the ``CuFile`` s open at once; an
    ``OSError`` opening one comes out as kvikio's ``RuntimeError`` text. As
    kvikio's POSIX reads, a read past the end of the file raises
    (:data:`KVIKIO_EOF`), never returns short: at once for reads under
    ``gds_threshold`` (kvikio runs those synchronously), from ``get()``
    otherwise. Records opens, closes, reads and, in ``events``, the order
    of its reads among what else appends there. ``lazy``: ``defaults`` and
    ``cufile_driver`` appear only once imported (``import kvikio.defaults``),
    as with kvikio's own ``__init__`` (install it with :func:`install_kvikio`).
    """

    def __init__(self, open_error=None, read_error=None, other_file=None, start_error_at=None, *, lazy=False,
                 compat_mode=2, num_threads=1, gds=False, before_read=None, events=None):  # fmt: skip
        super().__init__("kvikio")
        self.__path__ = []  # a package: its submodules import through install_kvikio's finder
        self.__version__ = "26.10.00"
        self.open_error, self.read_error, self.other_file = open_error, read_error, other_file
        self.start_error_at, self.before_read = start_error_at, before_read
        self.opened, self.closed, self.reads = 0, 0, []
        self.open_now = self.open_peak = 0
        self.events = [] if events is None else events
        self.submodules = {
            "defaults": FakeDefaults(compat_mode, num_threads, gds),
            "cufile_driver": FakeCufileDriver(gds),
        }
        if not lazy:
            self.defaults, self.cufile_driver = self.submodules["defaults"], self.submodules["cufile_driver"]
        lock = threading.Lock()
        fake = self

        class CuFile:
            def __init__(self, path, flags="r"):
                assert flags == "r"
                if fake.open_error:
                    raise RuntimeError(fake.open_error)
                time.sleep(0.0002)  # (lets other threads run, as kvikio's open does: opens of threads interleave)
                try:
                    self.fd = os.open(fake.other_file or path, os.O_RDONLY)
                    try:
                        self.fd_direct = os.open(fake.other_file or path, os.O_RDONLY)
                    except OSError:
                        os.close(self.fd)
                        raise
                except OSError as e:
                    raise RuntimeError(kvikio_system_error(e.errno)) from None
                with lock:
                    fake.opened += 1
                    fake.open_now += 1
                    fake.open_peak = max(fake.open_peak, fake.open_now)

            def fileno(self):
                return self.fd

            def close(self):
                os.close(self.fd)
                os.close(self.fd_direct)
                with lock:
                    fake.closed += 1
                    fake.open_now -= 1

            def pread(self, buf, size, file_offset, task_size=None):
                if len(fake.reads) == fake.start_error_at:
                    raise RuntimeError("cuFileRead: invalid device pointer")
                fake.reads.append((file_offset, size))
                fake.events.append("pread")
                if fake.before_read:
                    fake.before_read(self)
                data = os.pread(self.fd, size, file_offset)
                buf[: len(data)] = np.frombuffer(data, np.uint8)
                if len(data) < size:
                    if size < fake.submodules["defaults"].values["gds_threshold"]:
                        raise RuntimeError(KVIKIO_EOF)
                    return FakeFuture(0, KVIKIO_EOF)
                return FakeFuture(size, fake.read_error)

        self.CuFile = CuFile


class _FakeSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``kvikio.defaults`` and ``kvikio.cufile_driver`` of the :class:`FakeKvikio` in ``sys.modules``."""

    def find_spec(self, name, path=None, target=None):
        parent = sys.modules.get("kvikio")
        if isinstance(parent, FakeKvikio) and name.startswith("kvikio.") and name[7:] in parent.submodules:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return sys.modules["kvikio"].submodules[spec.name[7:]]

    def exec_module(self, module):
        pass


def install_kvikio(monkeypatch, fake):
    """Make ``import kvikio`` give ``fake``, and ``import kvikio.defaults`` its submodule (for this test)."""
    monkeypatch.setitem(sys.modules, "kvikio", fake)
    for name in ("kvikio.defaults", "kvikio.cufile_driver"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", [_FakeSubmodules(), *sys.meta_path])
    return fake
