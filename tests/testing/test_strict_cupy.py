"""The strict CuPy stand-in and fake kvikio themselves (npydask.testing.strict_cupy).

They fail where CuPy and kvikio do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from npydask.testing import strict_cupy


@pytest.fixture
def sim():
    with strict_cupy.installed() as s:
        yield s


def test_not_a_numpy_array_and_no_implicit_conversion(sim):
    cp = sim.cupy
    x = cp.asarray(np.arange(6.0).reshape(2, 3))
    assert not isinstance(x, np.ndarray) and type(x).__module__ == "cupy" and type(x).__name__ == "ndarray"
    for convert in (np.asarray, np.array, lambda a: np.ascontiguousarray(a), memoryview):
        with pytest.raises(TypeError):
            convert(x)
    with pytest.raises(TypeError, match=r"Implicit conversion to a NumPy array is not allowed.*\.get\(\)"):
        np.asarray(x)
    assert isinstance(x.get(), np.ndarray) and x.get().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_host_device_mixing_raises_as_in_cupy(sim):
    cp = sim.cupy
    x, h = cp.asarray(np.ones((2, 3))), np.ones((2, 3))
    for call in (lambda: np.concatenate([h, x]), lambda: cp.concatenate([x, h])):
        with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
            call()
    for call in (lambda: np.stack([x, h]), lambda: cp.stack([x, h])):  # (CuPy 14.2's words, seen on a device)
        with pytest.raises(TypeError, match=r"Argument 'a' has incorrect type \(expected cupy.*got numpy.ndarray\)"):
            call()
    for call in (lambda: x + h, lambda: h + x, lambda: np.add(x, h), lambda: x * np.ones(3), lambda: x + np.array(1.0)):
        with pytest.raises(TypeError, match="Unsupported type"):
            call()
    with pytest.raises(TypeError, match="Unsupported type"):
        np.sum(x, out=np.empty(()))  # (a host out)
    # scalars mix freely, 0-d host arrays in comparisons too (as in CuPy)
    assert float((x + 1 + np.float32(2) + 0.5).sum()) == 6 * 4.5
    assert bool((x == np.array(1.0)).all())
    assert isinstance(x.sum(), strict_cupy.ndarray) and x.sum().ndim == 0  # reductions give 0-d arrays
    # a basic-index assignment of a host array is CuPy's fill, which takes scalars only (CuPy 14.2
    # on a device raised exactly this); 0-d host arrays fill, and advanced indexes copy host values
    for key in (Ellipsis, slice(None), (0, slice(1, None))):
        with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
            x[key] = np.full((2, 3), 7.0)[key]
    x[...] = np.array(7.0)
    assert x.get().sum() == 42
    x[np.array([0])] = np.zeros((1, 3))
    assert x.get().sum() == 21


def test_set_checks_dtype_shape_and_contiguity_as_cupy(sim):
    cp = sim.cupy
    x = cp.empty((2, 3), dtype=np.float32)
    with pytest.raises(TypeError, match="float64 array cannot be set to float32 array"):
        x.set(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="Shape mismatch"):
        x.set(np.zeros(6, np.float32))
    with pytest.raises(TypeError, match="Only numpy.ndarray"):
        x.set(cp.zeros((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="non-contiguous"):
        x[:, ::2].set(np.zeros((2, 2), np.float32))
    x.set(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert x.get().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_memptr_views_with_negative_strides(sim):
    cp = sim.cupy
    buf = cp.asarray(np.arange(16, dtype=np.uint8))
    v = cp.ndarray((4,), np.uint8, memptr=buf.data + 7, strides=(-1,))
    assert v.get().tolist() == [7, 6, 5, 4]
    assert buf.data.ptr + 3 == (buf.data + 3).ptr == buf[3:].data.ptr


def test_dask_dispatch_meta_reductions_concatenate_stack(sim):
    import dask.array as da

    cp = sim.cupy
    a = np.arange(48.0).reshape(6, 8)
    x = da.from_array(cp.asarray(a), chunks=(4, 3), asarray=False, meta=cp.empty((0, 0)))
    assert isinstance(x._meta, strict_cupy.ndarray)
    for got, expected in [(x.sum(), a.sum()), (x.mean(axis=0), a.mean(axis=0)), (x.max(axis=1), a.max(axis=1)),
                          (da.stack([x, x]), np.stack([a, a])), (da.concatenate([x, x], axis=1), np.hstack([a, a])),
                          (x.T @ x, a.T @ a), (da.einsum("ij,ij->i", x, x), np.einsum("ij,ij->i", a, a))]:  # fmt: skip
        assert isinstance(got._meta, strict_cupy.ndarray)
        value = got.compute()
        assert isinstance(value, strict_cupy.ndarray), type(value)
        np.testing.assert_allclose(value.get(), expected)


def test_installed_restores_modules_and_dask():
    from dask.array.chunk_types import _HANDLED_CHUNK_TYPES
    from dask.array.dispatch import concatenate_lookup
    from dask.sizeof import sizeof

    before = {name: sys.modules.get(name) for name in ("cupy", "kvikio", "pynvml")}
    with strict_cupy.installed():
        import cupy

        assert cupy is strict_cupy.cupy
        assert sizeof(cupy.zeros(10)) == 80
    assert {name: sys.modules.get(name) for name in before} == before
    assert strict_cupy.ndarray not in concatenate_lookup._lookup
    assert strict_cupy.ndarray not in _HANDLED_CHUNK_TYPES
    assert "cupy" in sizeof._lazy  # (left for a real CuPy later in the process)


def test_devices_are_per_thread_and_arrays_remember_theirs():
    with strict_cupy.installed(devices=2) as s:
        cp = s.cupy
        with cp.cuda.Device(1):
            x = cp.zeros(3)
            seen = []
            t = threading.Thread(target=lambda: seen.append(cp.cuda.Device().id))
            t.start()
            t.join()
            assert cp.cuda.runtime.getDevice() == 1
        assert x.device.id == 1 and seen == [0] and cp.cuda.Device().id == 0
        with pytest.raises(ValueError, match="different from the current device"):
            x + 1  # (no peer access)
        with pytest.raises(strict_cupy.CUDARuntimeError, match="invalid device ordinal"):
            cp.cuda.Device(2).use()


def test_streams_and_events_are_logged(sim):
    cp = sim.cupy
    s = cp.cuda.Stream(non_blocking=True)
    e = cp.cuda.Event()
    e.record()
    s.wait_event(e)
    cp.cuda.get_current_stream().synchronize()
    assert [k for k, *_ in sim.state.log if k in ("record", "wait_event", "synchronize")] == [
        "record", "wait_event", "synchronize"]  # fmt: skip
    assert sim.state.events("wait_event")[0][1] == (s.ptr, e.id)


def test_pinned_memory_rounds_up_to_a_power_of_two(sim):
    p = sim.cupy.cuda.alloc_pinned_memory((128 << 20) + 4096)
    assert len(np.frombuffer(p, np.uint8)) == 256 << 20
    assert sim.state.pinned_allocs == 1 and sim.state.pinned_bytes == 256 << 20
    assert len(sim.cupy.cuda.alloc_pinned_memory(1)) == 512 and len(sim.cupy.cuda.alloc_pinned_memory(513)) == 1024


def test_nvrtc_failure_breaks_kernels_not_transfers(sim):
    cp = sim.cupy
    x = cp.asarray(np.arange(4.0))
    sim.state.nvrtc_broken = True
    assert x.get().tolist() == [0, 1, 2, 3] and cp.empty(3).shape == (3,)
    for kernel in (
        lambda: x + 1,
        lambda: x.sum(),
        lambda: x.copy(),
        lambda: cp.ElementwiseKernel("T x", "T y", "y = x", "k")(x),
    ):
        with pytest.raises(RuntimeError, match="libnvrtc"):
            kernel()
    sim.state.nvrtc_broken = False
    y = cp.ElementwiseKernel("int32 x", "int32 y", "y = x * 2 + 1", "check")(cp.asarray(np.arange(8, dtype=np.int32)))
    assert y.dtype == np.int32 and y.get().tolist() == [1, 3, 5, 7, 9, 11, 13, 15]
    with pytest.raises(NotImplementedError, match="kernels"):
        cp.ElementwiseKernel("T x", "T y", "y = sin(x)", "sine")(x)
    sim.state.kernels["twice"] = lambda a: a * 2
    assert cp.ElementwiseKernel("T x", "T y", "y = 2 * x", "twice")(x).get().tolist() == [0, 2, 4, 6]


def test_a_child_forked_after_cuda_was_used_fails_its_first_cuda_call(sim):
    sim.cupy.zeros(1)  # initialises CUDA here
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            sim.cupy.zeros(1)
        except strict_cupy.CUDARuntimeError:
            os._exit(7)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7


# --------------------------------------------------------------------------
# The fake kvikio.


def test_kvikio_defaults_need_their_own_import(sim):
    import kvikio

    assert not hasattr(kvikio, "defaults") and not hasattr(kvikio, "cufile_driver")
    import kvikio.cufile_driver
    import kvikio.defaults

    assert kvikio.defaults.get("compat_mode") == kvikio.CompatMode.AUTO == 2
    assert kvikio.defaults.is_compat_mode_preferred() is True
    assert kvikio.cufile_driver.get("is_gds_available") is False
    defaults = kvikio.defaults
    got = (defaults.get("num_threads"), defaults.get("task_size"), defaults.get("gds_threshold"))
    assert got == (1, 4 << 20, 16384)
    with kvikio.defaults.set("num_threads", 4):
        assert kvikio.defaults.get("num_threads") == 4
    assert kvikio.defaults.get("num_threads") == 1


def _file(tmp_path, n):
    p = tmp_path / "data.bin"
    data = (np.arange(n) % 251).astype(np.uint8)
    p.write_bytes(data.tobytes())
    return str(p), data


def test_kvikio_raises_at_end_of_file(sim, tmp_path):
    path, data = _file(tmp_path, 100_000)
    cp = sim.cupy
    buf = cp.empty(50_000, np.uint8)
    with sim.kvikio.CuFile(path) as f:
        assert f.pread(buf, 50_000, 50_000).get() == 50_000
        assert np.array_equal(buf.get(), data[50_000:])
        with pytest.raises(RuntimeError, match="POSIX error on pread: EOF"):
            f.pread(buf, 50_000, 60_000).get()  # (a pool read: at get())
        with pytest.raises(RuntimeError, match="POSIX error on pread: EOF"):
            f.pread(buf, 1000, 99_500)  # (under gds_threshold: raised by pread itself)


def test_kvikio_reads_on_its_pool_and_small_reads_on_the_caller(sim, tmp_path):
    import kvikio.defaults

    path, data = _file(tmp_path, 1 << 20)
    buf = sim.cupy.empty(1 << 20, np.uint8)
    kvikio.defaults.set("num_threads", 3)
    with sim.kvikio.CuFile(path) as f:
        future = f.pread(buf, 1 << 20, 0, task_size=1 << 18)
        assert future.get() == 1 << 20
        with pytest.raises(RuntimeError, match="future"):
            future.get()  # (once only, as a std::future)
        small = f.pread(buf[:100], 100, 5)
        assert small.done() and small.get() == 100
    assert np.array_equal(buf.get()[:100], data[5:105])
    (big, tiny) = sim.kvikio.reads
    assert big[3] == "pool" and tiny[3] == "sync" and tiny[4] == threading.current_thread().name
    assert len(sim.kvikio.pool()._threads) <= 3


def test_kvikio_descriptors_are_counted_and_limited(sim, tmp_path):
    path, _ = _file(tmp_path, 10)
    kv = sim.kvikio
    files = [kv.CuFile(path) for _ in range(3)]
    assert kv.open_descriptors == 6
    for f in files:
        f.close()
    assert kv.open_descriptors == 0 and kv.max_descriptors == 6
    kv.descriptor_limit = 4
    with kv.CuFile(path), kv.CuFile(path):
        with pytest.raises(RuntimeError, match="Unable to open file.*Too many open files"):
            kv.CuFile(path)
    with pytest.raises(RuntimeError, match="Unable to open file.*No such file"):
        kv.CuFile(tmp_path / "missing")
    assert kv.open_descriptors == 0


def test_kvikio_buffers_as_kvikio_takes_them(sim, tmp_path):
    path, data = _file(tmp_path, 4096)
    host = np.zeros(4096, np.uint8)
    with sim.kvikio.CuFile(path) as f:
        assert f.pread(host, 4096, 0).get() == 4096  # (pread takes host memory too)
        with pytest.raises(ValueError, match="Non-CUDA buffers not supported"):
            f.read(host)
        with pytest.raises(ValueError, match="contiguous"):
            f.pread(sim.cupy.empty((64, 64), np.uint8)[:, ::2], 100, 0)
        with pytest.raises(ValueError, match="greater than the size"):
            f.pread(sim.cupy.empty(10, np.uint8), 20, 0)
    assert np.array_equal(host, data) and sim.kvikio.reads[0][-1] == "host"


def test_importing_npydask_does_not_import_the_stand_in():
    code = "import sys, npydask; print('npydask.testing.strict_cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_importable_without_cupy_or_kvikio():
    code = "import sys, npydask.testing.strict_cupy; print(sorted(m for m in ('cupy', 'kvikio') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_modules_imported_under_the_stand_in_keep_the_real_pynvml():
    pytest.importorskip("distributed")
    code = (
        "import importlib.util\n"
        "from npydask.testing import strict_cupy\n"
        "with strict_cupy.installed():\n"
        "    import distributed.diagnostics.nvml as nvml\n"
        "print(getattr(nvml.pynvml, 'nvmlInit', None) is None or importlib.util.find_spec('pynvml') is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
