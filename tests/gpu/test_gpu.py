"""device="gpu": refusals at call time, the device path with numpy standing in for CuPy, and GPU runs.

Three layers:

- always: what a machine without CuPy or a device gets (``ImportError`` with
  the install hint, ``GpuUnavailableError``, ``TypeError`` for dtypes CuPy
  cannot hold), before any graph exists;
- always: the whole device path (``DeviceArray``, plans, the reader, ROIs,
  groups, kvikio error handling through a fake kvikio) with numpy as ``xp``;
- ``@pytest.mark.gpu``: the same on CuPy with kvikio, its compatibility mode,
  and the pinned-host fallback; skipped without a usable CUDA device.
"""

from __future__ import annotations

import errno
import importlib
import importlib.abc
import importlib.util
import os
import pickle
import re
import subprocess
import sys
import time
import types
from typing import Any

import numpy as np
import pytest
from _gpu_fakes import KVIKIO_EOF, CupyLikeArray, FakeKvikio, cupy_like, install_kvikio, kvikio_system_error, same
from dask.core import flatten
from dask.local import get_sync

import npydask
from npydask.array import NpyFileArray
from npydask.errors import FileChangedError, GpuUnavailableError, NpyFormatError
from npydask.gpu import _kvikio as kvikio_backend
from npydask.gpu import _kvikio_runtime as kvikio_runtime
from npydask.gpu import device as gpu
from npydask.gpu import process as gpu_process
from npydask.gpu.plan import GpuReadOptions, plan_gpu_read
from npydask.plan.region import Box
from npydask.reader import FileRef
from npydask.storage.local import LocalSource

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = ["<f4", ">f4", ">f8", "<f2", ">c8", ">c16", "?", "|u1", ">i2", "<u4", ">i8"]
REFUSED = ["S3", "U2", "V4", "M8[s]", "m8[ms]", "g", "G", [("a", "<f4"), ("b", "<i4")], [("a", ">i8", (2,))]]


def random_array(shape, dtype, seed=0):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw = raw % 2
    return np.frombuffer(raw.tobytes(), dtype=dtype).reshape(shape)


def chunks(x):
    """Every chunk of ``x`` as its task returns it (both dask array engines; no ``.blocks`` in dask-expr)."""
    graph = dict(x.__dask_graph__())
    return get_sync(graph, list(flatten(x.__dask_keys__())))


# --------------------------------------------------------------------------
# Refused at call time, before any graph exists.


@pytest.fixture
def no_cupy(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cupy" else real(name, *a))


def test_without_cupy_every_entry_point_says_how_to_install(save, no_cupy, tmp_path):
    p = save(np.zeros(3))
    for call in (lambda: npydask.from_npy(p, device="gpu"), lambda: npydask.open_dataset(tmp_path, device="gpu")):
        with pytest.raises(ImportError, match=r"pip install 'npydask\[gpu-cu12\]' or 'npydask\[gpu-cu13\]'"):
            call()


def _fake_cupy(monkeypatch, tmp_path, nvml=None):
    """A CuPy whose CUDA calls fail the test, no device files, and ``nvml`` as pynvml (None: not installed)."""
    calls = []
    fake = types.ModuleType("cupy")  # no __spec__: find_spec raises ValueError for it
    fake.cuda = types.SimpleNamespace(
        is_available=lambda: calls.append("is_available"),
        runtime=types.SimpleNamespace(getDeviceCount=lambda: calls.append("count")),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(gpu_process, "DEV", str(tmp_path))
    monkeypatch.setattr(gpu, "_CHECKED", None)
    monkeypatch.setattr(gpu_process, "_CUDA_PID", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return calls


def test_cupy_without_a_device_is_a_runtime_error_with_the_hint(save, monkeypatch, tmp_path):
    calls = _fake_cupy(monkeypatch, tmp_path)
    with pytest.raises(GpuUnavailableError, match=r"no usable CUDA device.*npydask\[gpu-cu12\]"):
        npydask.from_npy(save(np.zeros(3)), device="gpu")
    assert issubclass(GpuUnavailableError, RuntimeError)
    assert calls == []  # CUDA is never initialised by the check


def test_a_broken_driver_is_a_runtime_error_too(save, monkeypatch, tmp_path):
    def boom():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    _fake_cupy(monkeypatch, tmp_path, types.SimpleNamespace(nvmlInit=boom))
    with pytest.raises(GpuUnavailableError, match="libnvidia-ml.so.1"):
        npydask.from_npy(save(np.zeros(3)), device="gpu")


@pytest.fixture
def numpy_device(monkeypatch):
    """numpy standing in for CuPy: the whole device path runs on the host.

    Small tasks would go the host route (``gpu_host_bytes``): these tests' files are
    small, so the route is turned off here to exercise the device plans; the
    ``host_route`` fixture turns it back on.
    """
    monkeypatch.setenv("NPYDASK_GPU_HOST_BYTES", "0")
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "array_module", lambda: np)


@pytest.mark.parametrize("dtype", REFUSED, ids=str)
def test_dtypes_cupy_cannot_hold_are_refused_at_call_time(save, numpy_device, dtype):
    p = save(np.zeros(4, dtype))
    with pytest.raises(TypeError, match=r"a\d\.npy: dtype .* cannot be held by CuPy.*device=\"cpu\""):
        npydask.from_npy(p, device="gpu")
    with pytest.raises(TypeError, match="cannot be held by CuPy"):
        npydask.open_dataset(files=[p], device="gpu")  # at open, before any array is built
    with pytest.raises(TypeError, match="cannot be held by CuPy"):
        npydask.open_dataset(files=[p], device="gpu", on_error="skip")  # (skipping reads headers its own way)


def test_check_gpu_dtype_table():
    for d in GOOD:
        assert gpu.check_gpu_dtype(d).str == np.dtype(d).newbyteorder("=").str
    for d in [*REFUSED, ("<f4", (2,))]:  # (a subarray dtype: numpy saves it as a wider shape)
        with pytest.raises(TypeError, match="use|convert|select|view|cupy.asarray"):
            gpu.check_gpu_dtype(d)


def test_modules_import_without_cupy_or_kvikio():
    code = (
        "import sys, npydask.gpu.device, npydask.gpu.plan, npydask.gpu._kvikio\n"
        "print(','.join(m for m in ('cupy', 'kvikio') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# --------------------------------------------------------------------------
# The device path, numpy standing in for CuPy.


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", GOOD)
def test_from_npy_gpu_equals_numpy_load(save, numpy_device, dtype, order):
    a = random_array((7, 9, 5), dtype, seed=3)
    p = save(a, order=order)
    x = npydask.from_npy(p, chunks=(3, 4, 5), device="gpu")
    assert x.dtype == np.dtype(dtype).newbyteorder("=") and x.dtype.isnative
    assert type(x._meta) is np.ndarray  # (cupy.ndarray on a GPU)
    blocks = chunks(x)
    assert len(blocks) == 9 and all(b.flags.c_contiguous and b.dtype.isnative for b in blocks)
    same(x.compute(), a)
    same(x[1:6:2, ::-3, 2].compute(), a[1:6:2, ::-3, 2])


def test_names_are_deterministic_and_differ_from_cpu(save, numpy_device):
    p = save(np.arange(20.0))
    a, b = npydask.from_npy(p, chunks=5, device="gpu"), npydask.from_npy(p, chunks=5, device="gpu")
    assert a.name == b.name != npydask.from_npy(p, chunks=5).name


def test_auto_chunks_on_the_device_follow_gpu_chunk_bytes_and_host_ones_dask(tmp_path, numpy_device):
    p = tmp_path / "a.npy"
    a = np.arange(6 * 1024 * 1024, dtype="<i4").reshape(6, 1024, 1024)  # 24 MiB, 4 MiB per plane
    np.save(p, a)
    assert npydask.from_npy(p, device="gpu").numblocks == (1, 1, 1)  # under the 1 GiB default: one chunk
    with npydask.config.set(gpu_chunk_bytes="8MiB"):
        x = npydask.from_npy(p, device="gpu")
        assert x.chunks == ((2, 2, 2), (1024,), (1024,))
        host = npydask.from_npy(p)  # host arrays keep dask's array.chunk-size
        ds = npydask.open_dataset(str(tmp_path), device="gpu")
        assert ds.array(0).chunks == x.chunks
    assert host.chunks == ((6,), (1024,), (1024,))
    same(x.compute(), a)
    with pytest.raises(ValueError, match="'gpu_chunk_bytes' = 0"):  # (refused where it is set)
        npydask.config.set(gpu_chunk_bytes=0)


def test_device_array_pickles_without_data(save, numpy_device):
    p = save(np.arange(10_000.0))
    source = gpu.on_device(NpyFileArray(FileRef.open(p)))
    assert isinstance(source, gpu.DeviceArray)
    blob = pickle.dumps(source)
    assert len(blob) < 2000
    again = pickle.loads(blob)
    assert again.__dask_tokenize__() == source.__dask_tokenize__()
    same(again[10:20], np.arange(10.0, 20.0))


def test_roi_with_padding_matches_the_host_path(tmp_path, numpy_device):
    arrays = [random_array((6, 7), ">i2", seed=s) for s in range(3)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if i == 1 else a)
    kwargs = dict(roi_start=[-2, 3], roi_end=[5, 10], out_of_bounds_policy="pad", fill_value=-9)
    host = npydask.open_dataset(tmp_path, **kwargs)
    dev = npydask.open_dataset(tmp_path, device="gpu", **kwargs)
    for i in range(3):
        same(dev[i].compute(), host[i].compute())
    same(dev.stack().compute(), host.stack().compute())
    same(dev.stack().compute()[1, 0], np.full(7, -9, "<i2"))


def test_a_pad_roi_outside_the_first_file_still_checks_each_file_on_the_device_path(tmp_path, numpy_device):
    for i in range(3):
        np.save(tmp_path / f"{i}.npy", np.full((3, 4), i, "<f4"))
    kwargs = dict(roi_start=[5, 5], roi_shape=[2, 3], out_of_bounds_policy="pad", fill_value=-1, headers="first")
    same(npydask.open_dataset(tmp_path, device="gpu", **kwargs).stack().compute(), np.full((3, 2, 3), -1, "<f4"))
    with open(tmp_path / "1.tmp", "wb") as f:
        np.save(f, np.arange(80, dtype="<f4").reshape(10, 8))  # larger: its ROI holds data
    os.replace(tmp_path / "1.tmp", tmp_path / "1.npy")
    dev = npydask.open_dataset(tmp_path, device="gpu", **kwargs)
    for read in (lambda: dev.stack().compute(), lambda: dev[1].compute()):
        with pytest.raises(NpyFormatError, match=r"1\.npy.*first file's header.*\(3, 4\).*holds shape \(10, 8\)"):
            read()


def test_stack_and_concatenate_of_grouped_files(tmp_path, numpy_device):
    wide = [random_array((4, 3 + (i % 2)), "<f8", seed=i) for i in range(12)]
    long = [random_array((3 + (i % 3), 5), ">i2", seed=i) for i in range(12)]
    for i, (w, g) in enumerate(zip(wide, long)):
        (tmp_path / "w").mkdir(exist_ok=True)
        (tmp_path / "g").mkdir(exist_ok=True)
        np.save(tmp_path / "w" / f"{i:02d}.npy", np.asfortranarray(w) if i % 4 == 0 else w)
        np.save(tmp_path / "g" / f"{i:02d}.npy", np.asfortranarray(g) if i % 4 == 1 else g)
    same(npydask.open_dataset(tmp_path / "w", device="gpu").concatenate(axis=1).compute(), np.concatenate(wide, 1))
    ds = npydask.open_dataset(tmp_path / "g", device="gpu")
    joined = ds.concatenate(axis=0)
    assert joined.dtype.str == "<i2"
    same(joined.compute(), np.concatenate(long))
    same(joined[5:30:3, 1:4].compute(), np.concatenate(long)[5:30:3, 1:4])
    same(ds[::3].stack().compute(), np.stack(long[::3]))
    same(ds[::3].stack()[:, 1:3, ::2].compute(), np.stack(long[::3])[:, 1:3, ::2])


def test_npz_members_stored_and_deflated(tmp_path, numpy_device):
    a, b = random_array((5, 6), ">f4", 1), random_array((40, 3), "<c8", 2)
    np.savez(tmp_path / "s.npz", a=a, b=b)
    np.savez_compressed(tmp_path / "c.npz", a=a, b=b)
    for name in ("s.npz", "c.npz"):
        same(npydask.from_npy(tmp_path / name, key="a", device="gpu").compute(), a)
        same(npydask.from_npy(tmp_path / name, key="b", chunks=(7, 3), device="gpu")[3:33].compute(), b[3:33])


def test_a_file_changed_after_building_fails_the_task(save, numpy_device):
    p = save(np.arange(100.0))
    x = npydask.from_npy(p, device="gpu")
    np.save(p, np.arange(101.0))
    with pytest.raises(FileChangedError, match=os.path.basename(p)):
        x.compute()


def test_reader_reports_host_path_without_kvikio(monkeypatch):
    monkeypatch.setitem(sys.modules, "kvikio", None)  # import kvikio -> ImportError
    assert kvikio_backend.describe().startswith("pinned host memory")


def test_device_array_indexing_roi_outside_and_groups(tmp_path, numpy_device):
    a = random_array((6, 8), ">f4", seed=4)
    np.save(tmp_path / "0.npy", a)
    np.save(tmp_path / "1.npy", np.asfortranarray(a[::-1]))
    ds = npydask.open_dataset(tmp_path)
    view = ds.views[0]
    dev = gpu.on_device(view)
    assert len(dev) == 6 and dev.nbytes == a.nbytes and dev.ndim == 2 and "DeviceArray" in repr(dev)
    same(dev[::2, 5], a[::2, 5])
    same(dev[-1, ::-3], a[-1, ::-3])
    same(dev[...], a)
    assert dev[3:5, 1:7:2].flags.c_contiguous and dev[::2, 5].flags.c_contiguous
    outside = npydask.open_dataset(tmp_path, roi_start=[7, 0], roi_end=[9, 3], out_of_bounds_policy="pad",
                                   fill_value=4, device="gpu")  # fmt: skip
    same(outside[0].compute(), np.full((2, 3), 4, "<f4"))
    from npydask.dataset.stacking import FileGroup

    joined = gpu.on_device(FileGroup(ds.views, 0, False))
    both = np.concatenate([a, a[::-1]])
    same(joined[7:11, 2:6], both[7:11, 2:6])  # touches only the second file
    same(joined[3:9:2], both[3:9:2])
    stacked = gpu.on_device(FileGroup(ds.views, 0, True))
    same(stacked[1, 2:4], a[::-1][2:4])
    with pytest.raises(TypeError, match="0-d"):
        len(gpu.on_device(NpyFileArray(FileRef.open(_scalar(tmp_path)))))


def _scalar(tmp_path):
    np.save(tmp_path / "s.npy", np.array(2.5))
    return tmp_path / "s.npy"


def test_device_branches_pinned_host_and_kvikio_with_a_cupy_like_module(save, monkeypatch):
    monkeypatch.setitem(sys.modules, "kvikio", None)
    xp = cupy_like()
    a = random_array((20, 30), ">c8", seed=8)
    paths = [save(a), save(a, order="F")]
    for how in ({}, {"kvikio": FakeKvikio()}):  # kvikio not installed -> pinned host memory; then kvikio
        got = kvikio_backend.read_to_device(_jobs(paths, Box((2, 3), (19, 28))), xp, **how)
        for g in got:
            assert isinstance(g, CupyLikeArray)
            same(g, a[2:19, 3:28])
        assert xp.synced or xp.events  # a stream sync before staging is reused / an event per pinned copy
        xp.synced.clear()


def test_from_npy_through_a_cupy_like_module(save, monkeypatch, tmp_path):
    xp = cupy_like()
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "array_module", lambda: xp)
    monkeypatch.setitem(sys.modules, "kvikio", None)
    a = random_array((9, 10), ">u2", seed=1)
    x = npydask.from_npy(save(a, order="F"), chunks=(4, 5), device="gpu")
    assert isinstance(x._meta, CupyLikeArray)
    same(x.compute(), a)
    np.savez_compressed(tmp_path / "c.npz", a=a)
    ds = npydask.open_dataset(files=[str(tmp_path / "c.npz")] * 3, key="a", device="gpu")
    same(ds.stack().compute(), np.stack([a] * 3))  # deflated members: inflated on the host, copied over


# --------------------------------------------------------------------------
# The kvikio branch, through a fake kvikio that reads into host buffers (as kvikio can).


def _jobs(paths, box=None, options=None):
    jobs = []
    for p in paths:
        ref = FileRef.open(p)
        b = box or Box.whole(ref.header.shape)
        jobs.append(kvikio_backend.DeviceRead(ref, plan_gpu_read(ref.header, b, file_size=ref.identity.size,
                                                                options=options)))  # fmt: skip
    return jobs


def test_kvikio_branch_reads_every_file_with_aligned_futures(save):
    arrays = [random_array((30, 50), ">f8", seed=i) for i in range(5)]
    paths = [save(a, order="F" if i % 2 else "C") for i, a in enumerate(arrays)]
    fake = FakeKvikio()
    box = Box((3, 7), (29, 41))
    got = kvikio_backend.read_to_device(_jobs(paths, box, GpuReadOptions(gap_bytes=0)), np, kvikio=fake)
    for g, a in zip(got, arrays):
        same(g, a[3:29, 7:41])
    assert fake.opened == fake.closed == 5
    assert all(off % 4096 == 0 for off, _ in fake.reads)


def test_kvikio_driver_errors_become_gpu_unavailable_naming_file_and_fix(save):
    p = save(np.arange(10.0))
    fake = FakeKvikio(open_error="Unable to load libcuda.so.1")
    with pytest.raises(GpuUnavailableError, match=r"a\d\.npy: kvikio could not open.*libcuda\.so\.1.*NVIDIA driver"):
        kvikio_backend.read_to_device(_jobs([p]), np, kvikio=fake)


def test_kvikio_read_errors_become_gpu_unavailable_and_close_the_files(save):
    paths = [save(np.arange(1000.0)) for _ in range(3)]
    fake = FakeKvikio(read_error="cuFile error: operation not supported")
    with pytest.raises(GpuUnavailableError, match=r"could not read bytes 0\.\.\d+ .*KVIKIO_COMPAT_MODE=ON"):
        kvikio_backend.read_to_device(_jobs(paths), np, kvikio=fake)
    assert fake.opened == fake.closed == 3


def test_kvikio_error_while_starting_reads_waits_for_the_started_ones(save):
    paths = [save(np.arange(3000.0)) for _ in range(3)]
    fake = FakeKvikio(start_error_at=2)
    with pytest.raises(GpuUnavailableError, match=r"could not start reading bytes"):
        kvikio_backend.read_to_device(_jobs(paths), np, kvikio=fake)
    assert fake.opened == fake.closed == 3 and len(fake.reads) == 2


def test_kvikio_opening_another_file_than_planned_is_a_changed_file(save):
    p, other = save(np.arange(10.0)), save(np.arange(10.0))
    fake = FakeKvikio(other_file=other)  # as if p were replaced between the check and the open
    with pytest.raises(FileChangedError, match="ino"):
        kvikio_backend.read_to_device(_jobs([p]), np, kvikio=fake)
    assert fake.closed == fake.opened == 1


def test_kvikio_branch_checks_the_path_before_opening(save):
    p, q = save(np.arange(10.0)), save(np.arange(10.0))
    jobs = _jobs([p, q])
    np.save(p, np.arange(11.0))
    fake = FakeKvikio()
    with pytest.raises(FileChangedError, match="size"):
        kvikio_backend.read_to_device(jobs, np, kvikio=fake)
    os.remove(q)
    with pytest.raises(FileNotFoundError):
        kvikio_backend.read_to_device(jobs[1:], np, kvikio=fake)
    assert fake.opened == fake.closed == 0


def test_many_files_are_read_in_windows(save, monkeypatch):
    monkeypatch.setattr(kvikio_backend, "FILES_IN_FLIGHT", 4)
    arrays = [np.full((3,), i, "<i4") for i in range(10)]
    paths = [save(a) for a in arrays]
    fake = FakeKvikio()
    got = kvikio_backend.read_to_device(_jobs(paths), np, kvikio=fake)
    assert [int(g[0]) for g in got] == list(range(10)) and fake.opened == fake.closed == 10


# --------------------------------------------------------------------------
# The example, run as a user would.


def test_gpu_workers_example_runs_or_skips_cleanly():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "gpu_workers.py"), "--check"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    usable = importlib.util.find_spec("dask_cuda") is not None and _cuda_available()
    if not usable:
        assert out.stdout.startswith("skipped: "), out.stdout
    else:
        assert "mean" in out.stdout


def _cuda_available() -> bool:
    try:
        gpu.require_gpu()
    except (ImportError, RuntimeError):
        return False
    return True


# --------------------------------------------------------------------------
# On a GPU.


@pytest.fixture
def cupy():
    cp = pytest.importorskip("cupy")
    try:
        ok = cp.cuda.is_available()
    except Exception:
        ok = False
    if not ok:
        pytest.skip("CuPy sees no usable CUDA device")
    return cp


def _compute_all(cp, x):
    blocks = chunks(x)
    assert all(isinstance(b, cp.ndarray) and b.flags.c_contiguous for b in blocks)
    return cp.asnumpy(x.compute())


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", GOOD)
def test_gpu_chunks_are_cupy_and_equal_numpy(cupy, save, dtype, order):
    a = random_array((33, 17, 9), dtype, seed=5)
    x = npydask.from_npy(save(a, order=order), chunks=(10, 8, 9), device="gpu")
    assert isinstance(x._meta, cupy.ndarray) and x.dtype.isnative
    same(_compute_all(cupy, x), a)
    same(cupy.asnumpy(x[3:30:4, ::-2, 4].compute()), a[3:30:4, ::-2, 4])


@pytest.mark.gpu
def test_gpu_big_endian_and_complex_come_back_native(cupy, save):
    f = np.linspace(-5, 5, 6000, dtype=">f4").reshape(60, 100)
    c = (np.arange(500) - 1j * np.arange(500)).astype(">c16")
    xf = npydask.from_npy(save(f), device="gpu")
    assert xf.dtype.str == "<f4"
    same(cupy.asnumpy(xf.compute()), f)
    same(cupy.asnumpy(npydask.from_npy(save(c), chunks=77, device="gpu").compute()), c)


@pytest.mark.gpu
def test_gpu_roi_pad_and_stack(cupy, tmp_path):
    arrays = [random_array((40, 50, 30), "<f4", seed=i) for i in range(4)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if i % 2 else a)
    kwargs = dict(roi_start=[-3, 10, 5], roi_shape=[20, 30, 40], out_of_bounds_policy="pad", fill_value=1.5)
    host = npydask.open_dataset(tmp_path, **kwargs)
    dev = npydask.open_dataset(tmp_path, device="gpu", **kwargs)
    same(_compute_all(cupy, dev[1]), host[1].compute())
    same(_compute_all(cupy, dev.stack()), host.stack().compute())
    plain = npydask.open_dataset(tmp_path, device="gpu")
    same(_compute_all(cupy, plain.stack()), np.stack(arrays))


@pytest.mark.gpu
def test_gpu_kvikio_compat_mode(cupy, save):
    kvikio = pytest.importorskip("kvikio")
    defaults = importlib.import_module("kvikio.defaults")  # (kvikio's __init__ does not import it)

    a = random_array((300, 400), ">i4", seed=9)
    p = save(a, order="F")
    if hasattr(defaults, "set"):
        mode = defaults.set("compat_mode", kvikio.CompatMode.ON)
    else:
        mode = defaults.set_compat_mode(True)
    with mode:
        x = npydask.from_npy(p, chunks=(100, 150), device="gpu")
        same(_compute_all(cupy, x), a)
        same(cupy.asnumpy(x[17:250, 33:301].compute()), a[17:250, 33:301])


@pytest.mark.gpu
def test_gpu_pinned_host_fallback_without_kvikio(cupy, save, monkeypatch):
    monkeypatch.setitem(sys.modules, "kvikio", None)  # import kvikio -> ImportError
    assert kvikio_backend.describe().startswith("pinned host memory")
    a = random_array((64, 64, 64), ">f8", seed=2)
    x = npydask.from_npy(save(a), chunks=(16, 64, 64), device="gpu")
    same(_compute_all(cupy, x), a)
    same(cupy.asnumpy(x[5:60, 7:50, 9:40].compute()), a[5:60, 7:50, 9:40])


# --------------------------------------------------------------------------
# Integrity on both device branches: the header a task relies on, and the file after the read.


def _rewrite_in_place(path):
    """Rewrite ``path``'s payload with other bytes, same size and inode, and move its mtime on."""
    st = os.stat(path)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\x7f" * 64, st.st_size - 64)
    finally:
        os.close(fd)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


@pytest.mark.parametrize("branch", ["host", "kvikio"])
def test_device_reads_check_the_file_after_the_read(save, monkeypatch, branch):
    paths = [save(np.arange(4000.0) + i) for i in range(3)]
    jobs = _jobs(paths)
    monkeypatch.setitem(sys.modules, "kvikio", None)
    if branch == "kvikio":
        fake = FakeKvikio()
        real_pread = fake.CuFile.pread

        def pread_then_rewrite(self, buf, size, file_offset, task_size=None):
            future = real_pread(self, buf, size, file_offset, task_size)
            if os.path.samefile(paths[1], f"/proc/self/fd/{self.fd}"):
                _rewrite_in_place(paths[1])  # lands while the window's reads are in flight
            return future

        fake.CuFile.pread = pread_then_rewrite
        how = {"kvikio": fake}
    else:
        real = LocalSource.read_spans

        def read_then_rewrite(self, f, spans, dest, options):
            requests = real(self, f, spans, dest, options)
            if f.path == paths[1]:
                _rewrite_in_place(f.path)
            return requests

        monkeypatch.setattr(LocalSource, "read_spans", read_then_rewrite)
        how = {}
    with pytest.raises(FileChangedError, match=re.escape(os.path.basename(paths[1]))):
        kvikio_backend.read_to_device(jobs, np, **how)


@pytest.mark.parametrize("branch", ["host", "kvikio"])
def test_device_reads_refuse_a_header_other_than_the_one_relied_on(save, monkeypatch, branch):
    from npydask.errors import NpyFormatError
    from npydask.storage import HeaderCheck, clear_cache

    p = save(np.arange(64.0).reshape(8, 8))
    q = save(np.arange(64, dtype="<i8").reshape(8, 8))  # same size, other dtype
    (job,) = _jobs([p])
    wrong = HeaderCheck(FileRef.open(q).check.raw, "a tampered header index", "delete the index")
    job = kvikio_backend.DeviceRead(job.ref._replace(check=wrong), job.plan)
    clear_cache()
    monkeypatch.setitem(sys.modules, "kvikio", None)
    how = {"kvikio": FakeKvikio()} if branch == "kvikio" else {}
    with pytest.raises(NpyFormatError, match="tampered header index"):
        kvikio_backend.read_to_device([job], np, **how)


# --------------------------------------------------------------------------
# The call-time check initialises no CUDA (a fork after it stays safe); a fork after CUDA was used is refused.


class _Nvml:
    def __init__(self, count):
        self.count, self.calls = count, []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlDeviceGetCount(self):
        self.calls.append("count")
        return self.count

    def nvmlShutdown(self):
        self.calls.append("shutdown")


@pytest.mark.parametrize(("spec", "ok"), [(None, True), ("0", True), ("GPU-0e2f", True), ("", False), ("-1", False),
                                      ("NoDevFiles", False), ("1", False)])  # fmt: skip
def test_require_gpu_counts_devices_by_nvml_without_initialising_cuda(monkeypatch, tmp_path, spec, ok):
    calls = _fake_cupy(monkeypatch, tmp_path, nvml := _Nvml(1))
    if spec is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    if ok:
        gpu.require_gpu()
        gpu.require_gpu()  # (counted once per process)
        assert nvml.calls == ["init", "count", "shutdown"]
    else:
        with pytest.raises(GpuUnavailableError, match=f"CUDA_VISIBLE_DEVICES={spec!r} names none"):
            gpu.require_gpu()
    assert calls == []  # neither cupy.cuda.is_available() nor getDeviceCount(): no cuInit in this process
    assert gpu_process._CUDA_PID is None  # nor counted as a use of CUDA


def test_require_gpu_falls_back_to_the_drivers_device_files(monkeypatch, tmp_path):
    calls = _fake_cupy(monkeypatch, tmp_path)
    with pytest.raises(GpuUnavailableError, match="nvidiactl"):
        gpu.require_gpu()
    (tmp_path / "nvidiactl").touch()
    (tmp_path / "nvidia0").touch()
    gpu.require_gpu()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")  # (another setting: counted again)
    with pytest.raises(GpuUnavailableError, match="'-1' names none"):
        gpu.require_gpu()
    assert calls == []


def test_a_client_without_cupy_or_a_gpu_is_told_to_build_the_graph_on_a_worker(save, no_cupy, monkeypatch, tmp_path):
    p = save(np.zeros(3))
    with pytest.raises(ImportError, match=r"client\.submit\(fn\)\.result\(\).*device=\"gpu\""):
        npydask.from_npy(p, device="gpu")
    monkeypatch.undo()
    _fake_cupy(monkeypatch, tmp_path)
    with pytest.raises(GpuUnavailableError, match=r"client\.submit\(fn\)\.result\(\).*device=\"gpu\""):
        npydask.from_npy(p, device="gpu")


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")  # (3.12+)
def test_first_device_use_is_recorded_and_a_forked_child_is_refused_before_cuda(save, monkeypatch, tmp_path):
    import multiprocessing

    _fake_cupy(monkeypatch, tmp_path, _Nvml(1))
    from npydask.gpu import toolkit as gpu_toolkit

    monkeypatch.setattr(gpu_toolkit, "_outcome", (os.getpid(), None))  # (the toolkit check is tested apart)
    gpu.require_gpu()
    assert gpu_process._CUDA_PID is None  # the check is no use of CUDA
    gpu.array_module()  # the first device use
    assert gpu_process._CUDA_PID == os.getpid()
    with multiprocessing.get_context("fork").Pool(1) as pool:
        said = pool.apply(_from_npy_in_child, (save(np.zeros(3)),))
    assert said.startswith("GpuUnavailableError") and "was forked from it" in said and "num_workers=0" in said


def _from_npy_in_child(path):
    try:
        npydask.from_npy(path, device="gpu")
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "built"


# kvikio as it is (26.10): its settings, its thread pool, its errors, its descriptors.


@pytest.fixture
def fresh_kvikio_state(monkeypatch):
    """Forget which kvikio this process saw to and what it logged (both are once per process)."""
    monkeypatch.setattr(kvikio_runtime, "_prepared_for", None)
    monkeypatch.setattr(kvikio_runtime, "_logged", set())
    for name in ("KVIKIO_NTHREADS", "KVIKIO_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("compat_mode", "gds", "path"),
    [(2, False, "kvikio POSIX compatibility mode"), (2, True, "GPUDirect Storage"),
     (1, True, "kvikio POSIX compatibility mode"), (0, True, "GPUDirect Storage")],
)  # fmt: skip
def test_describe_says_which_path_reads_on_kvikio_26_10(monkeypatch, fresh_kvikio_state, compat_mode, gds, path):
    install_kvikio(monkeypatch, FakeKvikio(lazy=True, compat_mode=compat_mode, gds=gds))  # no kvikio.defaults yet
    text = kvikio_backend.describe()
    mode = {0: "OFF", 1: "ON", 2: "AUTO"}[compat_mode]
    assert text.startswith(f"{path}: kvikio 26.10.00, compat_mode {mode}, GDS available: {'yes' if gds else 'no'}, ")
    cores = min(16, os.cpu_count())
    assert f"num_threads 1 (npydask raises it to at least {cores} at the first device read)" in text
    assert text.endswith("task_size 4 MiB, gds_threshold 16 KiB")


def test_describe_of_an_older_kvikio_without_get(monkeypatch, fresh_kvikio_state):
    fake = types.ModuleType("kvikio")
    fake.__version__ = "24.12.00"
    fake.defaults = types.SimpleNamespace(compat_mode=lambda: True, get_num_threads=lambda: 4,
                                          task_size=lambda: 1 << 22, gds_threshold=lambda: 1 << 20)  # fmt: skip
    monkeypatch.setitem(sys.modules, "kvikio", fake)
    text = kvikio_backend.describe()
    assert text.startswith("kvikio POSIX compatibility mode: kvikio 24.12.00, compat_mode ON, GDS available: unknown")
    assert "num_threads 4" in text and text.endswith("gds_threshold 1 MiB")


def test_the_first_device_read_raises_kvikio_threads_once_and_logs_the_path(save, fresh_kvikio_state, caplog):
    p = save(np.arange(1000.0))
    fake = FakeKvikio()
    caplog.set_level("INFO", logger="npydask.gpu._kvikio")
    for _ in range(2):
        same(kvikio_backend.read_to_device(_jobs([p]), np, kvikio=fake)[0], np.arange(1000.0))
    cores = min(16, os.cpu_count())
    assert fake.defaults.sets == [{"num_threads": cores}] and fake.defaults.get("num_threads") == cores
    logged = [r.getMessage() for r in caplog.records if r.name == "npydask.gpu._kvikio"]
    assert len(logged) == 1 and "kvikio POSIX compatibility mode" in logged[0], logged
    assert f"num_threads {cores} (raised from 1 by npydask" in logged[0]
    assert f"num_threads {cores} (raised from 1 by npydask" in kvikio_runtime._describe(fake)


@pytest.mark.parametrize("how", ["KVIKIO_NTHREADS", "KVIKIO_NUM_THREADS", "set before", "more already"])
def test_kvikio_threads_the_user_chose_are_left_alone(save, monkeypatch, fresh_kvikio_state, how):
    p = save(np.arange(100.0))
    fake = FakeKvikio(num_threads=64 if how == "more already" else 1)
    if how.startswith("KVIKIO"):
        monkeypatch.setenv(how, "1")  # (kvikio read it at start: its count is 1; npydask must not raise it)
    if how == "set before":  # (a count set with kvikio.defaults.set before, above IO_THREADS, is kept)
        fake.defaults.set("num_threads", 24)
        fake.defaults.sets.clear()
    before = fake.defaults.get("num_threads")
    kvikio_backend.read_to_device(_jobs([p]), np, kvikio=fake)
    assert fake.defaults.get("num_threads") == before and fake.defaults.sets == []
    if how.startswith("KVIKIO"):
        assert f"(from {how}=1)" in kvikio_runtime._describe(fake)


def test_the_pinned_path_is_logged_once(save, monkeypatch, fresh_kvikio_state, caplog):
    monkeypatch.setitem(sys.modules, "kvikio", None)
    caplog.set_level("INFO", logger="npydask.gpu._kvikio")
    p = save(np.arange(50.0))
    for _ in range(2):
        kvikio_backend.read_to_device(_jobs([p]), cupy_like())
    logged = [r.getMessage() for r in caplog.records if r.name == "npydask.gpu._kvikio"]
    assert logged == ["npydask reads onto the device with " + kvikio_backend.describe()]
    assert "pinned host memory (kvikio not installed)" in logged[0]


def _truncate_once(path):
    """A ``before_read`` hook: the first read finds ``path`` cut to its header (after it was opened and checked)."""
    done = []

    def hook(cufile):
        if not done and os.path.samefile(path, f"/proc/self/fd/{cufile.fd}"):
            done.append(1)
            os.truncate(path, 200)

    return hook


@pytest.mark.parametrize("n", [100, 20_000])  # reads under kvikio's gds_threshold fail at once; larger ones in get()
@pytest.mark.parametrize("branch", ["host", "kvikio"])
def test_a_file_truncated_after_opening_is_a_changed_file_on_both_branches(save, monkeypatch, branch, n):
    p = save(np.arange(float(n)))
    jobs = _jobs([save(np.arange(10.0)), p])
    if branch == "kvikio":
        how = {"kvikio": FakeKvikio(before_read=_truncate_once(p))}
    else:
        real = LocalSource.read_spans

        def truncate_then_read(self: LocalSource, f: Any, spans: Any, dest: Any, options: Any) -> int:
            if f.path == p:
                os.truncate(p, 200)
            return real(self, f, spans, dest, options)

        monkeypatch.setattr(LocalSource, "read_spans", truncate_then_read)
        how = {}
    monkeypatch.setitem(sys.modules, "kvikio", None)
    with pytest.raises(FileChangedError, match=re.escape(os.path.basename(p))) as info:
        kvikio_backend.read_to_device(jobs, np, **how)
    assert info.value.filename == p
    if how:
        assert how["kvikio"].opened == how["kvikio"].closed == 2


def test_kvikio_end_of_file_in_an_unchanged_file_is_a_truncated_file(save):
    p = save(np.arange(10.0))
    fd = os.open(p, os.O_RDONLY)
    try:
        from npydask.storage import FileIdentity

        error = kvikio_backend.kvikio_error(
            p, RuntimeError(KVIKIO_EOF), "read bytes 0..4096", fd, FileIdentity.of(os.fstat(fd))
        )
    finally:
        os.close(fd)
    assert isinstance(error, NpyFormatError) and re.search(rf"{re.escape(p)}: truncated \.npy file.*EOF", str(error))


@pytest.mark.parametrize(
    ("code", "cls"),
    [(errno.EMFILE, OSError), (errno.ENFILE, OSError), (errno.ENOENT, FileNotFoundError), (errno.EIO, OSError)],
)
def test_kvikio_system_errors_come_out_as_the_host_path_gives_them(save, code, cls):
    p = save(np.arange(10.0))
    fake = FakeKvikio(open_error=kvikio_system_error(code))
    with pytest.raises(cls) as info:
        kvikio_backend.read_to_device(_jobs([p]), np, kvikio=fake)
    e = info.value
    assert type(e) is cls and e.errno == code and e.filename == p and not isinstance(e, GpuUnavailableError)
    assert os.strerror(code) in str(e)
    if code == errno.EMFILE:
        assert "RLIMIT_NOFILE" in str(e) and "raise it" in str(e)
    if code == errno.ENFILE:
        assert "fs.file-max" in str(e)


def test_kvikio_io_error_while_reading_is_an_eio_os_error(save):
    p = save(np.arange(5000.0))
    fake = FakeKvikio(read_error="KvikIO failure at: posix_io.hpp:90: POSIX error on pread: Input/output error")
    with pytest.raises(OSError, match=r"Input/output error: kvikio could not read bytes 0\.\.\d+") as info:
        kvikio_backend.read_to_device(_jobs([p]), np, kvikio=fake)
    assert info.value.errno == errno.EIO and info.value.filename == p
    assert not isinstance(info.value, GpuUnavailableError) and fake.opened == fake.closed == 1


def test_kvikio_files_open_at_once_stay_under_the_open_file_limit(tmp_path):
    import resource
    from concurrent.futures import ThreadPoolExecutor

    from npydask.storage import clear_cache

    arrays = [np.full((50,), i, "<i8") for i in range(150)]
    paths = []
    for i, a in enumerate(arrays):
        paths.append(str(tmp_path / f"{i:03d}.npy"))
        np.save(paths[-1], a)
    jobs = _jobs(paths)
    fake = FakeKvikio()
    clear_cache()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = len(os.listdir("/proc/self/fd")) + 200
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        bound = low * 3 // 16  # (kvikio_backend.cufile_limit(): 3/16 of the soft limit)
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda js: kvikio_backend.read_to_device(js, np, kvikio=fake), [jobs] * 8))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        clear_cache()
    for got in results:
        for g, a in zip(got, arrays):
            same(g, a)
    assert fake.opened == fake.closed == 8 * 150 and fake.open_now == 0
    assert 1 < fake.open_peak <= bound, (fake.open_peak, bound)


def test_kvikio_staging_is_synchronised_after_it_is_allocated(save):
    events = []
    xp = cupy_like(events)
    p = save(random_array((20, 30), ">f4", seed=3))
    fake = FakeKvikio(events=events)
    same(kvikio_backend.read_to_device(_jobs([p]), xp, kvikio=fake)[0], np.load(p))
    first_read = events.index("pread")
    last_alloc = max(i for i, e in enumerate(events[:first_read]) if e == "alloc")
    assert "sync" in events[last_alloc:first_read], events


def test_kvikio_open_past_the_limit_empties_the_host_cache_and_tries_again(save, monkeypatch):
    from npydask.storage import _handles

    p = save(np.arange(30.0))
    fake = FakeKvikio()
    real, calls = fake.CuFile.__init__, []

    def once_too_many(self, path, flags="r"):
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError(kvikio_system_error(errno.EMFILE))
        real(self, path, flags)

    fake.CuFile.__init__ = once_too_many
    cleared = []
    monkeypatch.setattr(kvikio_backend, "clear_cache", lambda: (cleared.append(1), _handles.clear_cache()))
    same(kvikio_backend.read_to_device(_jobs([p]), np, kvikio=fake)[0], np.arange(30.0))
    assert calls == [p, p] and cleared == [1] and fake.opened == fake.closed == 1


class _ObjectLike:
    """A source read by range requests (not mappable), as object stores are: over a local file here."""

    mappable = False
    concurrent = True

    def open(self, path, identity, key=None, check=None):
        return types.SimpleNamespace(path=path, check_unchanged=lambda: None)

    def read_spans(self, f, spans, dest, options):
        with open(f.path, "rb") as file:
            for offset, n, at in zip(spans.offsets.tolist(), spans.lengths.tolist(), spans.positions.tolist()):
                file.seek(offset)
                dest[at : at + n] = np.frombuffer(file.read(n), np.uint8)
        return len(spans)


def test_objects_read_through_pinned_memory_beside_kvikio_are_logged_once(save, fresh_kvikio_state, caplog):
    a = random_array((12, 9), ">i4", seed=6)
    jobs = [job._replace(ref=job.ref._replace(source=_ObjectLike())) for job in _jobs([save(a), save(a)])]
    fake = FakeKvikio()
    caplog.set_level("INFO", logger="npydask.gpu._kvikio")
    for _ in range(2):
        for got in kvikio_backend.read_to_device(jobs, cupy_like(), kvikio=fake):
            same(got, a)
    logged = [r.getMessage() for r in caplog.records if r.name == "npydask.gpu._kvikio"]
    assert len(logged) == 2 and "kvikio POSIX compatibility mode" in logged[0], logged
    assert logged[1] == "npydask reads onto the device with " + kvikio_runtime.OBJECTS
    assert fake.opened == 0


# Speed: what the device path reads, and where (counted here; timed on a GPU by benchmarks/bench_gpu.py).


def _fake_kvikio(compat):
    fake = FakeKvikio()
    fake.defaults = types.SimpleNamespace(is_compat_mode_preferred=lambda: compat)
    return fake


def _staging_sizes(monkeypatch):
    sizes = []
    real = kvikio_backend.aligned_empty

    def counted(xp, nbytes, alignment=4096):
        sizes.append(nbytes)
        return real(xp, nbytes, alignment)

    monkeypatch.setattr(kvikio_backend, "aligned_empty", counted)
    return sizes


@pytest.mark.parametrize("compat", [True, False])
def test_contiguous_native_regions_are_read_straight_into_out(save, monkeypatch, compat):
    arrays = [random_array((7, 33), "<i4", seed=i) for i in range(4)]
    paths = [save(a) for a in arrays]
    jobs = _jobs(paths, Box((2, 0), (6, 33)))
    out = np.empty((4, 4, 33), "<i4")
    jobs = [job._replace(out=out[k]) for k, job in enumerate(jobs)]
    sizes = _staging_sizes(monkeypatch)
    fake = _fake_kvikio(compat)
    got = kvikio_backend.read_to_device(jobs, np, kvikio=fake)
    assert all(g is job.out for g, job in zip(got, jobs))
    same(out, np.stack([a[2:6] for a in arrays]))
    if compat:  # POSIX reads: one pread per file at its (unaligned) offset into out, no staging
        assert fake.reads == [(128 + 2 * 33 * 4, 4 * 33 * 4)] * 4 and sizes == []
    else:  # GPUDirect Storage: an unaligned offset is staged as before
        assert all(off % 4096 == 0 for off, _ in fake.reads) and sizes and sum(sizes) > 0
    assert fake.opened == fake.closed == 4


def test_direct_reads_skip_staging_on_the_host_paths_too(save, monkeypatch):
    monkeypatch.setitem(sys.modules, "kvikio", None)
    arrays = [random_array((5, 9), "<f8", seed=i) for i in range(3)] + [random_array((5, 9), ">f8", seed=9)]
    paths = [save(a) for a in arrays]
    for xp in (np, cupy_like()):
        sizes = _staging_sizes(monkeypatch)
        out = xp.empty((3, 5, 9), np.float64)
        jobs = [j._replace(out=out[k]) for k, j in enumerate(_jobs(paths[:3]))]
        got = kvikio_backend.read_to_device(jobs, xp)
        same(out, np.stack(arrays[:3]))
        assert all(g is job.out for g, job in zip(got, jobs))
        assert not any(sizes)  # numpy: file -> out; pinned: host -> out; no staging bytes either way
        mixed = _jobs(paths[2:])  # a big-endian file needs its device step: staged, the other is not
        out = xp.empty((2, 5, 9), np.float64)
        kvikio_backend.read_to_device([j._replace(out=out[k]) for k, j in enumerate(mixed)], xp)
        same(out, np.stack([arrays[2], arrays[3].astype("<f8")]))


class _CountingViews:
    """A group's views that count how many are made (a view per file over a table costs a construction)."""

    def __init__(self, views):
        self.views, self.made = list(views), 0

    def __len__(self):
        return len(self.views)

    def __getitem__(self, k):
        self.made += 1
        return self.views[k]

    def __iter__(self):
        for k in range(len(self.views)):
            yield self[k]


def test_concatenate_on_the_device_bisects_the_files_a_block_meets(tmp_path, numpy_device):
    from npydask.dataset.stacking import FileGroup

    arrays = [random_array((2 + k % 3, 4), "<f4", seed=k) for k in range(300)]
    for k, a in enumerate(arrays):
        np.save(tmp_path / f"f{k:03d}.npy", a)
    views = [NpyFileArray(FileRef.open(tmp_path / f"f{k:03d}.npy")) for k in range(300)]
    group = FileGroup(views, axis=0, stacked=False)
    counting = _CountingViews(views)
    source = types.SimpleNamespace(views=counting, axis=0, stacked=False, offsets=group.offsets, shape=group.shape,
                                   dtype=group.dtype)  # fmt: skip
    x = gpu.DeviceArray(source, GpuReadOptions(host_bytes=0))
    whole = np.concatenate(arrays)
    lo, hi = group.offsets[150] + 1, group.offsets[153] + 1  # meets files 150..153
    got = x.read(Box((lo, 0), (hi, 4)), np)
    same(got, whole[lo:hi])
    assert counting.made == 4  # the files the block meets, not all 300


@pytest.fixture
def host_route(monkeypatch):
    """numpy standing in for CuPy with the default ``gpu_host_bytes``; counts device reads and copies."""
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "array_module", lambda: np)
    seen = types.SimpleNamespace(device_reads=0, copies=[])
    real_read, real_copy = kvikio_backend.read_to_device, gpu.to_device

    def read_to_device(jobs, xp, *a, **k):
        seen.device_reads += len(jobs)
        return real_read(jobs, xp, *a, **k)

    def to_device(host, xp):
        assert host.flags.c_contiguous and host.dtype.isnative
        seen.copies.append(host.shape)
        return real_copy(host, xp)

    monkeypatch.setattr(kvikio_backend, "read_to_device", read_to_device)
    monkeypatch.setattr(gpu, "to_device", to_device)
    return seen


def test_many_small_files_go_through_the_host_loop_and_one_copy_per_task(tmp_path, host_route):
    arrays = [random_array((8, 8), ">f4", seed=k) for k in range(300)]  # (big-endian: to native on the host)
    for k, a in enumerate(arrays):
        np.save(tmp_path / f"s{k:03d}.npy", a)
    ds = npydask.open_dataset(tmp_path, device="gpu")
    x = ds.stack()
    blocks = chunks(x)
    same(np.concatenate(blocks), np.stack(arrays))
    assert host_route.device_reads == 0  # no file planned and read one by one on the device
    assert len(host_route.copies) == len(blocks)  # one host-to-device copy per task
    same(ds.concatenate(axis=1).compute(), np.concatenate(arrays, axis=1))
    same(ds.concatenate(axis=0).compute(), np.concatenate(arrays, axis=0))


def test_a_roi_of_short_rows_goes_through_the_host_and_pads_as_numpy(tmp_path, host_route):
    vols = [random_array((16, 64, 64), "<f4", seed=k) for k in range(6)]
    for k, v in enumerate(vols):
        np.save(tmp_path / f"v{k}.npy", v)
    ds = npydask.open_dataset(tmp_path, roi_start=[4, 40, 8], roi_shape=[8, 32, 16], out_of_bounds_policy="pad",
                              device="gpu")  # fmt: skip
    expected = np.zeros((6, 8, 32, 16), "<f4")
    expected[:, :, :24] = np.stack([v[4:12, 40:64, 8:24] for v in vols])
    same(ds.stack().compute(), expected)
    assert host_route.device_reads == 0 and host_route.copies
    with npydask.config.set(gpu_host_bytes=0):  # the route off: the same values through the device plans
        host_route.copies.clear()
        ds = npydask.open_dataset(tmp_path, roi_start=[4, 40, 8], roi_shape=[8, 32, 16],
                                  out_of_bounds_policy="pad", device="gpu")  # fmt: skip
        same(ds.stack().compute(), expected)
        assert host_route.device_reads == 6 and not host_route.copies


def test_big_reads_stay_on_the_device_path(save, host_route):
    a = random_array((600, 512), "<f4")  # 1.2 MB: one read of 600 KiB per chunk of 300 rows
    p = save(a)
    x = npydask.from_npy(p, device="gpu", chunks=(300, 512))
    same(x.compute(), a)
    assert host_route.device_reads == 0 and len(host_route.copies) == 2  # 600 KiB reads: under 1 MiB
    with npydask.config.set(gpu_host_bytes="512KiB"):
        host_route.copies.clear()
        same(npydask.from_npy(p, device="gpu", chunks=(300, 512)).compute(), a)
        assert host_route.device_reads == 2 and not host_route.copies


def test_urls_on_the_device_keep_requests_in_flight_as_the_cpu_path(tmp_path, http_server, host_route, monkeypatch):
    from npydask.testing import http_range

    arrays = [random_array((64, 64), "<f4", seed=k) for k in range(24)]
    for k, a in enumerate(arrays):
        np.save(tmp_path / f"u{k:02d}.npy", a)
    server = http_server(tmp_path)
    urls = [f"{server.endpoint}/u{k:02d}.npy" for k in range(24)]
    with npydask.config.set(gpu_host_bytes=0):  # even with the small-read route off: objects never go one by one
        x = npydask.open_dataset(files=urls, device="gpu").stack(chunks=(24, 64, 64))  # (headers read here)
    flight = types.SimpleNamespace(now=0, most=0, lock=__import__("threading").Lock())
    real = http_range._Handler.do_GET

    def do_get(handler):
        with flight.lock:
            flight.now += 1
            flight.most = max(flight.most, flight.now)
        try:
            time.sleep(0.02)  # (long enough for a concurrent client's requests to overlap)
            real(handler)
        finally:
            with flight.lock:
                flight.now -= 1

    monkeypatch.setattr(http_range._Handler, "do_GET", do_get)
    same(x.compute(scheduler="sync"), np.stack(arrays))
    assert flight.most > 4, flight.most  # the CPU path's remote_concurrency, not one GET after another
    assert host_route.device_reads == 0 and len(host_route.copies) == 1


def test_pinned_memory_is_a_small_ring_reused_across_windows_and_sizes(save, monkeypatch):
    from npydask.gpu import _pinned as gpu_pinned

    monkeypatch.setitem(sys.modules, "kvikio", None)
    monkeypatch.setattr(gpu_pinned, "SLOT_BYTES", 4096)
    monkeypatch.setattr(gpu_pinned, "_local", __import__("threading").local())  # (a fresh ring for this test)
    xp = cupy_like()
    pinned = []
    xp.cuda.alloc_pinned_memory = lambda n: pinned.append(n) or bytearray(n)
    arrays = [random_array((50, 70 + 9 * k), ">f8" if k % 2 else "<f8", seed=k) for k in range(5)]
    paths = [save(a) for a in arrays]
    for _ in range(2):  # windows of every size: always the same two slots
        got = kvikio_backend.read_to_device(_jobs(paths, Box((3, 1), (47, 60))), xp)
        for g, a in zip(got, arrays):
            same(g, a[3:47, 1:60])
    block = gpu.to_device(np.arange(10_000, dtype="<i8"), xp)  # (the host route's one copy: the same ring)
    same(block, np.arange(10_000, dtype="<i8"))
    assert pinned == [4096] * gpu_pinned.SLOTS
    assert len(xp.events) > 2 * gpu_pinned.SLOTS  # one per piece copied
    assert all(e.waited <= 1 for e in xp.events) and sum(e.waited for e in xp.events) >= len(xp.events) - 2


def test_the_pinned_ring_waits_on_the_stream_without_events(monkeypatch):
    from npydask.gpu import _pinned as gpu_pinned

    monkeypatch.setattr(gpu_pinned, "SLOT_BYTES", 1024)
    monkeypatch.setattr(gpu_pinned, "_local", __import__("threading").local())
    xp = cupy_like()
    del xp.cuda.Event
    host = random_array((10, 300), ">u2", seed=3).astype("<u2")
    same(gpu.to_device(host, xp), host)
    assert len(xp.synced) == 6 and not xp.events  # one wait per 1 KiB piece of 6000 bytes
