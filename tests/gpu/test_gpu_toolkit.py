"""The toolkit check (npydask.gpu.toolkit): one tiny kernel at the first device read of a process.

A fake ``cupy`` module in ``sys.modules`` stands in: its ``ElementwiseKernel``
either fails as CuPy does without NVRTC (a ``CompileException`` or the
"failed to load libnvrtc" ``RuntimeError``, raised when the kernel is first
called, as CuPy compiles lazily) or computes on the host and counts its
compilations. What a real NVRTC does (compile time, CuPy's exception types) is
checked on a device by ``ci/gpu_probes.py``'s ``nvrtc_check`` probe.
"""

from __future__ import annotations

import os
import sys
import threading
import types
import warnings

import numpy as np
import pytest

import npydask
from npydask.errors import GpuUnavailableError
from npydask.gpu import device as gpu
from npydask.gpu import toolkit as gpu_toolkit


class CompileException(Exception):
    """Shaped like ``cupy.cuda.compiler.CompileException``."""


class _DeviceLike(np.ndarray):
    """A host array posing as a device array (``.get()``, ``.set()``)."""

    def get(self):
        return np.asarray(self)

    def set(self, host):
        self[...] = host


def _fake_cupy(error: BaseException | None = None, result=None) -> types.ModuleType:
    """A module shaped like CuPy over host memory; ``compiled`` counts kernel compilations.

    ``error`` is raised when a kernel is first launched (CuPy compiles then);
    ``result`` replaces what the kernel computes.
    """
    cupy = types.ModuleType("cupy")  # (no __spec__: find_spec raises ValueError for it, as for any stand-in)
    cupy.compiled = []

    class ElementwiseKernel:
        def __init__(self, in_params, out_params, operation, name):
            self.name, self.ready = name, False

        def __call__(self, x):
            if not self.ready:  # the first launch compiles
                cupy.compiled.append(self.name)
                if error is not None:
                    raise error
                self.ready = True
            out = np.asarray(x) * 2 + 1 if result is None else np.asarray(result)
            return out.view(_DeviceLike)

    synced: list[int] = []
    stream = types.SimpleNamespace(synchronize=lambda: synced.append(1))
    cupy.ElementwiseKernel = ElementwiseKernel
    cupy.ndarray = _DeviceLike
    cupy.uint8 = np.uint8
    cupy.empty = lambda shape, dtype=float: np.empty(shape, dtype).view(_DeviceLike)
    cupy.asarray = lambda a: np.asarray(a).view(_DeviceLike)
    cupy.cuda = types.SimpleNamespace(alloc_pinned_memory=bytearray, get_current_stream=lambda: stream,
                                      compiler=types.SimpleNamespace(CompileException=CompileException))  # fmt: skip
    return cupy


@pytest.fixture
def fresh(monkeypatch):
    """A process that has not checked its toolkit yet, whose device check passes."""
    monkeypatch.setattr(gpu_toolkit, "_outcome", None)
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)  # (the device check is tested in test_gpu.py)
    monkeypatch.setitem(sys.modules, "kvikio", None)  # import kvikio -> ImportError: the pinned host path

    def install(cupy):
        monkeypatch.setitem(sys.modules, "cupy", cupy)
        return cupy

    return install


NO_NVRTC = [
    CompileException(
        "nvrtc: error: failed to open libnvrtc-builtins.so.12.8. Make sure that libnvrtc-builtins.so "
        "is installed correctly."
    ),  # fmt: skip
    RuntimeError(
        "CuPy failed to load libnvrtc.so.12: OSError: libnvrtc.so.12: cannot open shared object file: "
        "No such file or directory"
    ),  # fmt: skip
]


@pytest.mark.parametrize("error", NO_NVRTC, ids=["CompileException", "no-libnvrtc"])
def test_the_first_device_read_without_nvrtc_is_a_clear_error(fresh, save, error):
    fresh(_fake_cupy(error))
    a = np.arange(24, dtype="<i4").reshape(4, 6)
    p = save(a)
    device_array = gpu.DeviceArray(_host_source(p))
    with pytest.raises(GpuUnavailableError, match="NVRTC") as caught:
        device_array[0:2]  # the first device read of this process
    message = str(caught.value)
    assert caught.value.__cause__ is error  # the original error, chained
    assert "libnvrtc" in message and type(error).__name__ in message  # what failed
    assert "npydask[gpu-cu12]" in message and "npydask[gpu-cu13]" in message and "nvidia-cuda-nvrtc" in message
    with pytest.raises(GpuUnavailableError, match="NVRTC"):  # and so does building a graph (its meta)
        npydask.from_npy(p, device="gpu")


def _host_source(path):
    from npydask.array import NpyFileArray
    from npydask.reader import FileRef

    return NpyFileArray(FileRef.open(path))


def test_a_failed_check_fails_every_later_read_without_compiling_again(fresh):
    cupy = fresh(_fake_cupy(NO_NVRTC[1]))
    for _ in range(3):
        with pytest.raises(GpuUnavailableError, match="could not be loaded"):
            gpu.array_module()
    assert cupy.compiled == [gpu_toolkit.KERNEL_NAME]


def test_wrong_values_from_the_kernel_are_an_error(fresh):
    fresh(_fake_cupy(result=np.zeros(8, np.int32)))
    with pytest.raises(GpuUnavailableError, match=r"NVRTC.*computed \[0, 0"):
        gpu.array_module()


def test_a_working_toolkit_compiles_once_per_process_not_per_task(fresh, save):
    cupy = fresh(_fake_cupy())
    a = np.arange(20 * 30, dtype=">i2").reshape(20, 30)
    x = npydask.from_npy(save(a, order="F"), chunks=(3, 7), device="gpu")  # 7 x 5 tasks
    assert x.npartitions == 35 and isinstance(x._meta, _DeviceLike)
    got = x.compute(scheduler="threads", num_workers=4)
    assert np.array_equal(np.asarray(got), a) and np.asarray(got).dtype == np.dtype("<i2")
    assert cupy.compiled == [gpu_toolkit.KERNEL_NAME]


def test_threads_starting_together_wait_for_one_check(fresh):
    cupy = fresh(_fake_cupy())
    start = threading.Barrier(8)
    errors = []

    def read():
        start.wait()
        try:
            for _ in range(20):
                assert gpu.array_module() is cupy
        except BaseException as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and cupy.compiled == [gpu_toolkit.KERNEL_NAME]


def test_a_forked_child_checks_again(fresh):
    cupy = fresh(_fake_cupy())
    gpu.array_module()
    assert cupy.compiled == [gpu_toolkit.KERNEL_NAME]
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (Python 3.12+: fork of a multi-threaded process)
        pid = os.fork()
    if pid == 0:  # the child: its own process, so its own check
        code = 1
        try:
            gpu.array_module()
            gpu.array_module()
            os.write(write, str(len(cupy.compiled)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        child_compiled = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_compiled == "2"  # the parent's compilation (inherited) and the child's own
    gpu.array_module()
    assert cupy.compiled == [gpu_toolkit.KERNEL_NAME]  # the parent checked once


@pytest.mark.parametrize(
    ("error", "what"),
    [
        (NO_NVRTC[0], "NVRTC (libnvrtc) failed to compile"),
        (NO_NVRTC[1], "NVRTC (libnvrtc), which CuPy compiles every kernel with, could not be loaded"),
        (type("DynamicLibNotFoundError", (RuntimeError,), {})('Failure finding "libnvrtc.so"'), "could not be loaded"),
        (RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient"), "driver may be older"),
    ],
)
def test_the_message_says_what_failed_and_what_to_do(error, what):
    message = str(gpu_toolkit.toolkit_error(error))
    assert message.startswith('device="gpu": the CUDA toolkit check failed') and what in message
    assert "NVRTC" in message and "pip install 'npydask[gpu-cu12]' or 'npydask[gpu-cu13]'" in message
    long = gpu_toolkit.toolkit_error(CompileException("x" * 5000 + "\n\nsource"))
    assert len(str(long)) < 1500  # (a compile log is cut short)
