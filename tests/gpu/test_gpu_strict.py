"""device="gpu" under the strict CuPy stand-in and fake kvikio (npydask.testing.strict_cupy).

Every scenario runs the real device path (``require_gpu``, the dask meta, the
plans, the kvikio and pinned readers, the device steps) on a CuPy stand-in that
is not a numpy array and refuses host/device mixtures as CuPy does, with a fake
kvikio 26.10 that reads on its own threads, raises at end of file and counts
descriptors, and compares exactly with numpy.

What this cannot simulate, and where a GPU run checks it (``ci/gpu_check.sh``; the
probes are functions of ``ci/gpu_probes.py``):

- that the stand-in itself still behaves as CuPy and kvikio do (the errors of host/device
  mixing, EOF, the small synchronous reads, two descriptors per ``CuFile``, pinned
  rounding): ``probe_strict_cupy_agrees``;
- the order of work on real CUDA streams (kernels still queued when a batch is
  handed over, a staging block reused across streams): the stand-in runs every
  kernel at once and only records syncs, events and waits: ``probe_loader_torch_gpu``
  (the Loader's batches consumed on a non-blocking stream);
- the device prefetch threads really allocate on, beyond the ``Device`` context the
  stand-in tracks per thread: ``probe_loader_torch_gpu`` (a second GPU is needed to
  see it for real);
- NVRTC and kernel compilation: the stand-in only pretends NVRTC is missing
  (``State.nvrtc_broken``): ``probe_nvrtc_check``;
- GPUDirect Storage, the cuFile driver, ``O_DIRECT`` and kvikio's real thread pool:
  the ``env`` stage of ``ci/gpu_check.sh`` and ``probe_read_routes``;
- what CUDA does in a forked child beyond "the first CUDA call after the parent
  initialised CUDA fails": ``probe_torch_fork_before_cuda``;
- speed: the ``bench`` stage (``benchmarks/bench_gpu.py``).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import npydask
from npydask.testing import strict_cupy


@pytest.fixture
def sim():
    """The stand-in CuPy, a fresh fake kvikio and pynvml in ``sys.modules``."""
    with strict_cupy.installed() as s:
        yield s


@pytest.fixture
def sim_pinned():
    """The stand-in CuPy without kvikio: the pinned-host-memory path."""
    with strict_cupy.installed(kvikio=False) as s:
        yield s


def random_array(shape, dtype, seed=0):
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw = raw % 2
    return np.frombuffer(raw.tobytes(), dtype=dtype).reshape(shape)


def host(x):
    """A computed stand-in array back on the host; anything else is a failure of the device path."""
    assert isinstance(x, strict_cupy.ndarray), type(x)
    return x.get()


def same(got, expected):
    got = host(got)
    expected = np.asarray(expected)
    assert got.dtype.str == expected.dtype.newbyteorder("=").str, (got.dtype, expected.dtype)
    assert got.shape == expected.shape
    assert got.tobytes() == expected.astype(got.dtype).tobytes()


def every_chunk_on_device(x):
    from dask.core import flatten
    from dask.local import get_sync

    blocks = get_sync(dict(x.__dask_graph__()), list(flatten(x.__dask_keys__())))
    assert all(isinstance(b, strict_cupy.ndarray) and b.flags.c_contiguous for b in blocks)


# --------------------------------------------------------------------------
# Single files.


@pytest.mark.parametrize("path", ["kvikio", "pinned"])
@pytest.mark.parametrize(("dtype", "order"), [("<f4", "C"), ("<f4", "F"), (">f8", "C"), (">i2", "F"), ("?", "C"),
                                         ("<c8", "F")])  # fmt: skip
def test_from_npy_equals_numpy(request, save, dtype, order, path):
    s = request.getfixturevalue("sim" if path == "kvikio" else "sim_pinned")
    a = random_array((33, 17, 9), dtype, seed=5)
    x = npydask.from_npy(save(a, order=order), chunks=(10, 8, 9), device="gpu")
    assert isinstance(x._meta, strict_cupy.ndarray) and x.dtype.isnative
    every_chunk_on_device(x)
    same(x.compute(), a)
    same(x[3:30:4, ::-2, 4].compute(), a[3:30:4, ::-2, 4])
    assert s.kvikio is None or s.kvikio.open_descriptors == 0


def test_reductions_stay_on_the_device(sim, save):
    a = random_array((40, 30), "<i4", seed=1)
    x = npydask.from_npy(save(a), chunks=(7, 11), device="gpu")
    assert int(host(x.sum(dtype="int64").compute())) == int(a.sum(dtype="int64"))
    same(x.max(axis=0).compute(), a.max(axis=0))
    same(x.mean(axis=1).compute(), a.mean(axis=1))


def test_roi_pad_and_stack(sim, tmp_path):
    arrays = [random_array((20, 25, 15), ">f4", seed=i) for i in range(4)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if i % 2 else a)
    kwargs = dict(roi_start=[-3, 10, 5], roi_shape=[12, 20, 14], out_of_bounds_policy="pad", fill_value=1.5)
    cpu = npydask.open_dataset(tmp_path, **kwargs)
    dev = npydask.open_dataset(tmp_path, device="gpu", **kwargs)
    same(dev[1].compute(), cpu[1].compute())
    same(dev.stack().compute(), cpu.stack().compute())


@pytest.mark.parametrize("axis", [0, 1])
def test_concatenate(sim, tmp_path, axis):
    arrays = [random_array((4 + (i % 3), 5) if axis == 0 else (5, 3 + (i % 2)), ">i2", seed=i) for i in range(9)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", np.asfortranarray(a) if i % 4 == 1 else a)
    joined = npydask.open_dataset(tmp_path, device="gpu").concatenate(axis=axis)
    same(joined.compute(), np.concatenate(arrays, axis))
    same(joined[1:9:2, 1:4].compute(), np.concatenate(arrays, axis)[1:9:2, 1:4])


def test_npz_members_stored_and_deflated(sim, tmp_path):
    a, b = random_array((5, 6), ">f4", 1), random_array((40, 3), "<c8", 2)
    np.savez(tmp_path / "s.npz", a=a, b=b)
    np.savez_compressed(tmp_path / "c.npz", a=a, b=b)
    for name in ("s.npz", "c.npz"):
        same(npydask.from_npy(tmp_path / name, key="a", device="gpu").compute(), a)
        same(npydask.from_npy(tmp_path / name, key="b", chunks=(7, 3), device="gpu")[3:33].compute(), b[3:33])
    ds = npydask.open_dataset(files=[str(tmp_path / "c.npz")] * 3, key="a", device="gpu")
    same(ds.stack().compute(), np.stack([a] * 3))


def test_zero_d_and_empty_files(sim, save):
    same(npydask.from_npy(save(np.array(2.5, ">f8")), device="gpu").compute(), np.array(2.5))
    same(npydask.from_npy(save(np.zeros((0, 5), "<i4")), device="gpu").compute(), np.zeros((0, 5), "<i4"))


def test_many_small_files(sim, tmp_path):
    arrays = [np.full((4, 3), i, "<f4") + np.arange(12, dtype="<f4").reshape(4, 3) for i in range(300)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i:04d}.npy", a)
    x = npydask.open_dataset(tmp_path, device="gpu").stack()
    same(x.compute(), np.stack(arrays))
    assert sim.kvikio.open_descriptors == 0  # every CuFile closed (kvikio or the host route may read them)
    assert all(kind == "device" for *_, kind in sim.kvikio.reads)


BIG = (512, 1024)
"""4 MiB of float64: read by kvikio on its pool whatever the route for small reads."""


def test_big_reads_go_through_the_kvikio_pool(sim, save):
    a = random_array(BIG, "<f8", seed=3)
    same(npydask.from_npy(save(a), device="gpu").compute(), a)
    threads = {thread for *_, how, thread, _ in sim.kvikio.reads if how == "pool"}
    assert sim.kvikio.reads and threads and all(not t.startswith("kvikio") for t in threads)  # issued by the task
    assert sim.kvikio.open_descriptors == 0


def test_a_truncated_file_is_a_changed_file_not_gpu_unavailable(sim, save):
    """kvikio raises at end of file; a file cut short after the graph was built must still say it changed."""
    from npydask.errors import FileChangedError

    p = save(np.arange(50_000.0))
    x = npydask.from_npy(p, device="gpu")
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 8192)
    with pytest.raises(FileChangedError, match=os.path.basename(p)):
        x.compute()


# --------------------------------------------------------------------------
# Object storage.


def test_urls_read_through_pinned_memory_not_kvikio(sim, http_server, tmp_path):
    root = tmp_path / "www"
    (root / "gs").mkdir(parents=True)
    a = np.asfortranarray(np.arange(9 * 10 * 11, dtype=">f4").reshape(9, 10, 11))
    np.save(root / "g.npy", a)
    for i in range(3):
        np.save(root / "gs" / f"{i}.npy", a + i)
    server = http_server(root)
    x = npydask.from_npy(server.url("g.npy"), chunks=(4, 5, 11), device="gpu")
    same(x.compute(), a)
    ds = npydask.open_dataset(
        files=[server.url(f"gs/{i}.npy") for i in range(3)], roi_start=[1, 2, 3], roi_shape=[4, 5, 6], device="gpu"
    )
    same(ds.stack().compute(), np.stack([(a + i)[1:5, 2:7, 3:9] for i in range(3)]))
    assert not sim.kvikio.reads  # (objects go through pinned host memory)


# --------------------------------------------------------------------------
# The stats CLI, the Loader, the torch adapters, the writers.


def test_stats_cli_on_the_device(sim, tmp_path, capsys):
    from npydask.cli import main

    arrays = [random_array((6, 7), "<f4", seed=i) for i in range(5)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", a)
    assert main(["stats", str(tmp_path), "--json"]) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert main(["stats", str(tmp_path), "--json", "--device", "gpu"]) == 0
    assert json.loads(capsys.readouterr().out) == cpu


def test_loader_batches_on_the_device(sim, tmp_path):
    arrays = [random_array((3, 4), ">i4", seed=i) for i in range(10)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", a)
    ds = npydask.open_dataset(tmp_path)
    loader = npydask.Loader(ds, 4, device="gpu", shuffle=False)
    got = [host(b) for b in loader]
    assert np.array_equal(np.concatenate(got), np.stack(arrays))


def test_loader_reads_on_the_callers_device(tmp_path):
    for i in range(6):
        np.save(tmp_path / f"{i}.npy", np.full((2, 2), i, "<f4"))
    with strict_cupy.installed(devices=2):
        import cupy

        loader = npydask.Loader(npydask.open_dataset(tmp_path), 3, device="gpu", shuffle=False)
        with cupy.cuda.Device(1):
            devices = [b.device.id for b in loader]
    assert devices == [1, 1]


def test_torch_adapters_on_the_device(sim, tmp_path):
    torch = pytest.importorskip("torch")
    from npydask.torch import NpyIterableDataset, NpyMapDataset

    arrays = [random_array((3, 4), "<f4", seed=i) for i in range(6)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", a)
    ds = npydask.open_dataset(tmp_path)
    for adapter in (NpyMapDataset(ds, device="gpu"), NpyIterableDataset(ds, device="gpu")):
        loader = torch.utils.data.DataLoader(adapter, batch_size=2, num_workers=0)
        got = torch.cat(list(loader)).numpy()
        assert np.array_equal(got, np.stack(arrays))
    assert sim.state.events("dlpack")  # (each sample went through DLPack from a device array)


def test_torch_adapter_check_does_not_initialise_cuda(sim, tmp_path):
    pytest.importorskip("torch")
    from npydask.torch import NpyMapDataset

    np.save(tmp_path / "0.npy", np.zeros(3, "<f4"))
    NpyMapDataset(npydask.open_dataset(tmp_path), device="gpu")
    assert sim.state.cuda_pid is None


def test_to_npy_of_device_arrays(sim, save, tmp_path):
    a = random_array((20, 30), ">f8", seed=6)
    x = npydask.from_npy(save(a, order="F"), chunks=(7, 9), device="gpu")
    npydask.to_npy(x, tmp_path / "out.npy")
    assert np.array_equal(np.load(tmp_path / "out.npy"), a)


# --------------------------------------------------------------------------
# What the review predicted from kvikio, streams and the toolkit: each of these failed before its fix.


def _truncate_at_first_read(kvikio, path):
    def truncate(at, offset, nbytes):
        if at == path:
            os.truncate(path, 64)  # (after the identity check, before kvikio reads)

    kvikio.on_pread = truncate


def test_a_file_cut_short_during_a_pool_read_is_a_changed_file(sim, save):
    from npydask.errors import FileChangedError

    p = save(random_array(BIG, "<f8"))
    x = npydask.from_npy(p, device="gpu")
    _truncate_at_first_read(sim.kvikio, p)
    with pytest.raises(FileChangedError, match=os.path.basename(p)):
        x.compute()
    assert sim.kvikio.reads


def test_a_file_cut_short_during_a_small_synchronous_read_is_a_changed_file(sim, save):
    from npydask.errors import FileChangedError
    from npydask.gpu._kvikio import DeviceRead, read_to_device
    from npydask.gpu.plan import plan_gpu_read
    from npydask.plan.region import Box
    from npydask.reader import FileRef

    p = save(np.arange(1000.0))
    ref = FileRef.open(p)
    plan = plan_gpu_read(ref.header, Box.whole(ref.header.shape), file_size=ref.identity.size)
    _truncate_at_first_read(sim.kvikio, p)
    with pytest.raises(FileChangedError, match=os.path.basename(p)):
        read_to_device([DeviceRead(ref, plan)], sim.cupy, kvikio=sim.kvikio)  # (kvikio chosen: no route decides)
    assert [how for _, _, _, how, _, _ in sim.kvikio.reads] == ["sync"]


def test_many_files_stay_under_the_descriptor_limit(sim, tmp_path):
    import resource

    arrays = [np.full((2, 2), i, "<i2") for i in range(200)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i:03d}.npy", a)
    x = npydask.open_dataset(tmp_path, device="gpu").stack()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 100, hard))  # a 64-file window wants 128 more
    try:
        got = x.compute(scheduler="sync")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    same(got, np.stack(arrays))


def test_describe_names_the_posix_path_under_kvikio_26_10(sim):
    from npydask.gpu._kvikio import describe

    text = describe()
    assert "POSIX" in text and "thread" in text


def test_kvikio_threads_are_raised_from_one(save, monkeypatch):
    monkeypatch.delenv("KVIKIO_NTHREADS", raising=False)
    monkeypatch.delenv("KVIKIO_NUM_THREADS", raising=False)
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: one kvikio thread is right")
    with strict_cupy.installed():
        import kvikio.defaults

        a = random_array(BIG, "<f8")
        same(npydask.from_npy(save(a), device="gpu").compute(), a)
        assert kvikio.defaults.get("num_threads") > 1


def test_device_memory_is_synchronised_after_allocation_before_kvikio_writes(sim, save):
    p = save(random_array(BIG, ">f8", seed=2))  # byte-swapped: staged, then copied
    npydask.from_npy(p, device="gpu").compute()
    log = [event for event, *_ in sim.state.log]
    first = log.index("pread")
    last_alloc = max(k for k in range(first) if log[k] == "alloc")
    assert "synchronize" in log[last_alloc:first], log[: first + 1]


def test_loader_hands_batches_over_with_an_event_the_consumer_waits_on(sim, tmp_path):
    import threading

    for i in range(6):
        np.save(tmp_path / f"{i}.npy", np.full((2, 3), i, ">f4"))
    loader = npydask.Loader(npydask.open_dataset(tmp_path), 2, device="gpu", shuffle=False)
    batches = list(loader)
    main = threading.current_thread().name
    recorded = {detail[1] for _, detail, thread, _ in sim.state.events("record") if thread != main}
    waited = [detail[1] for _, detail, thread, _ in sim.state.events("wait_event") if thread == main]
    assert len(batches) == 3 and len(waited) >= 3 and set(waited) <= recorded


def test_a_toolkit_without_nvrtc_is_a_clear_error(sim, save, monkeypatch):
    from npydask.errors import GpuUnavailableError

    try:  # (the check runs once per process: forget an earlier pass)
        import npydask.gpu.toolkit as toolkit

        monkeypatch.setattr(toolkit, "_outcome", None)
    except (ImportError, AttributeError):
        pass
    sim.state.nvrtc_broken = True
    with pytest.raises(GpuUnavailableError, match="NVRTC|nvrtc"):
        npydask.from_npy(save(np.arange(10, dtype=">i4")), device="gpu").compute()


def test_to_zarr_of_device_arrays(sim, save, tmp_path):
    zarr = pytest.importorskip("zarr")
    a = random_array((20, 30), ">f8", seed=7)
    x = npydask.from_npy(save(a), chunks=(7, 9), device="gpu")
    npydask.to_zarr(x, tmp_path / "out.zarr")
    assert np.array_equal(zarr.open_array(tmp_path / "out.zarr", mode="r")[...], a)


def test_to_npy_files_of_device_arrays(sim, tmp_path):
    arrays = [random_array((4, 5), "<i2", seed=i) for i in range(3)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", a)
    ds = npydask.open_dataset(tmp_path, device="gpu")
    npydask.to_npy_files(ds, tmp_path / "out")
    npydask.to_npy_files(list(ds.stack()), tmp_path / "rows")
    for folder in ("out", "rows"):
        got = sorted(os.listdir(tmp_path / folder))
        assert [np.load(tmp_path / folder / name).tolist() for name in got] == [a.tolist() for a in arrays]


def test_device_arrays_read_from_and_written_to_s3(sim, s3_server, save):
    """SeaweedFS's S3 (127.0.0.1): a device array read from one object and written to another."""
    import io
    import uuid

    options, prefix = s3_server.storage_options(), f"s3://{s3_server.bucket}/strict-{uuid.uuid4().hex[:12]}/"
    a = np.arange(1200, dtype=">f4").reshape(30, 40)
    npydask.to_npy(npydask.from_npy(save(a)), prefix + "src.npy", storage_options=options)
    x = npydask.from_npy(prefix + "src.npy", chunks=(7, 40), device="gpu", storage_options=options)
    same(x.compute(), a)
    npydask.to_npy(x, prefix + "out.npy", storage_options=options)
    key = f"{prefix}out.npy"[len(f"s3://{s3_server.bucket}/") :]
    body = s3_server.boto3_client().get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
    assert np.array_equal(np.load(io.BytesIO(body)), a)
    assert not sim.kvikio.reads
