"""Device probes for ``ci/gpu_check.sh``: what a GPU run must show that no ``pytest -m gpu`` test covers yet.

Each probe writes its files under the work folder, reads them with ``device="gpu"``
and compares the result with ``numpy.load`` (the oracle), exactly. Each prints one
line, ``PASS|FAIL|XFAIL name: detail``, and a failure never stops the others. XFAIL
marks a failure the GPU review predicts and whose fix has not landed (it names the
finding); once fixed, the probe passes.

``--dry-run`` runs every probe at tiny size with numpy standing in for CuPy (the
same stand-in as the CPU tests in ``tests/test_gpu.py``: ``npydask.gpu`` reads into
numpy), so the probes themselves are checked on any machine; a dry PASS says the
probe's logic and the host side work, nothing about a GPU.

Usage::

    python ci/gpu_probes.py --work DIR [--dry-run] [--only NAME[,NAME]] [--scale N]

Exit status: 0 when every probe passed or XFAILed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

PROBE_SECONDS = 60
"""Each probe's limit (an alarm in the main thread); the stage has its own ``timeout`` too."""


class Context:
    """What every probe needs: the array module, the work folder, the size scale, dry or not."""

    def __init__(self, work: str, dry: bool, scale: int) -> None:
        self.work = work
        self.dry = dry
        self.scale = scale
        if dry:
            from npydask import gpu

            gpu.require_gpu = lambda: None  # numpy stands in for CuPy, as in tests/test_gpu.py
            gpu._array_module = lambda: np
            self.xp: Any = np
        else:
            import cupy

            self.xp = cupy

    def path(self, name: str) -> str:
        p = os.path.join(self.work, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def host(self, a: Any) -> np.ndarray:
        """A result brought to the host, after checking it lives on the device (``xp.ndarray``)."""
        if self.dry and isinstance(a, np.generic):  # numpy reduces to a scalar; CuPy to a 0-d array
            return np.asarray(a)
        if not isinstance(a, self.xp.ndarray):
            raise AssertionError(f"expected a {self.xp.__name__}.ndarray, got {type(a).__module__}.{type(a).__name__}")
        return a.get() if hasattr(a, "get") else np.asarray(a)

    def blocks_on_device(self, x: Any) -> None:
        """The array's meta and its first chunk are device arrays."""
        if not isinstance(x._meta, self.xp.ndarray):
            raise AssertionError(f"meta is {type(x._meta).__module__}.{type(x._meta).__name__}")
        first = x.blocks[(0,) * x.ndim].compute() if x.ndim and x.size else x.compute()
        self.host(first)


def same(got: np.ndarray, expected: np.ndarray, what: str) -> str:
    """Raise unless equal bytes, shape and (native) dtype; a short description when equal."""
    expected = np.asarray(expected)
    want = expected.dtype.newbyteorder("=")
    if got.shape != expected.shape or got.dtype != want:
        raise AssertionError(f"{what}: got {got.dtype}{got.shape}, expected {want}{expected.shape}")
    if got.tobytes() != np.ascontiguousarray(expected.astype(want)).tobytes():
        raise AssertionError(f"{what}: values differ from numpy.load")
    return f"{what} {got.dtype}{got.shape} equal"


def data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Values that are never all zeros (a read of nothing is not equal by chance)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(1, 1000, size=shape) if np.dtype(dtype).kind in "iu" else rng.random(shape) + 1).astype(dtype)


# --------------------------------------------------------------------------
# The probes, most valuable first.


def probe_from_npy_c(c: Context) -> str:
    import npydask

    a = data((64 * c.scale, 1024), "<i4", 1)
    np.save(c.path("c.npy"), a)
    x = npydask.from_npy(c.path("c.npy"), device="gpu", chunks=(16 * c.scale, 1024))
    c.blocks_on_device(x)
    total = int(c.host(x.sum(dtype="int64").compute()))
    if total != int(np.load(c.path("c.npy")).sum(dtype="int64")):
        raise AssertionError(f"sum {total} differs from numpy's")
    return same(c.host(x.compute()), a, "C-order int32") + f", sum {total} equal"


def probe_from_npy_fortran(c: Context) -> str:
    import npydask

    a = np.asfortranarray(data((48 * c.scale, 300), "<f8", 2))
    np.save(c.path("f.npy"), a)
    x = npydask.from_npy(c.path("f.npy"), device="gpu", chunks=(20 * c.scale, 128))
    c.blocks_on_device(x)
    got = float(c.host(x.sum().compute()))
    if not np.isclose(got, float(np.load(c.path("f.npy")).sum())):
        raise AssertionError(f"sum {got} differs from numpy's")
    return same(c.host(x.compute()), a, "Fortran float64")


def probe_big_endian(c: Context) -> str:
    import npydask

    out = []
    for i, dtype in enumerate((">i4", ">f8", ">c16", "<f2", "?")):
        a = np.asfortranarray(data((9 * c.scale, 17), dtype, 3 + i)) if i % 2 else data((9 * c.scale, 17), dtype, 3 + i)
        p = c.path(f"be/{i}.npy")
        np.save(p, a)
        out.append(same(c.host(npydask.from_npy(p, device="gpu", chunks=(4, 17)).compute()), np.load(p), dtype))
    return "; ".join(out)


def probe_roi(c: Context) -> str:
    import npydask

    vols = [data((16, 24, 20), "<f4", 10 + i) for i in range(6)]
    for i, v in enumerate(vols):
        np.save(c.path(f"vols/{i}.npy"), np.asfortranarray(v) if i == 2 else v)
    start, shape = [3, 5, 7], [8, 9, 10]
    ds = npydask.open_dataset(os.path.dirname(c.path("vols/0.npy")), roi_start=start, roi_shape=shape, device="gpu")
    roi = tuple(slice(s, s + n) for s, n in zip(start, shape))
    want = np.stack([np.load(c.path(f"vols/{i}.npy"))[roi] for i in range(6)])
    stacked = ds.stack()
    c.blocks_on_device(stacked)
    return same(c.host(stacked.compute()), want, "ROI stack of 6 volumes")


def probe_npz_members(c: Context) -> str:
    import npydask

    a, b = data((50 * c.scale, 6), ">f4", 20), data((33, 7), "<i8", 21)
    np.savez(c.path("npz/stored.npz"), a=a, b=b)
    np.savez_compressed(c.path("npz/deflated.npz"), a=a, b=b)
    out = []
    for name in ("stored", "deflated"):
        p = c.path(f"npz/{name}.npz")
        with np.load(p) as z:
            for key in ("a", "b"):
                got = c.host(npydask.from_npy(p, key=key, device="gpu", chunks=(10, -1)).compute())
                out.append(same(got, z[key], f"{name}[{key}]"))
    return "; ".join(out)


def probe_concatenate(c: Context) -> str:
    import npydask

    wide = [data((12, 3 + i % 2), "<f8", 30 + i) for i in range(8)]
    long = [data((3 + i % 3, 5), ">i2", 40 + i) for i in range(8)]
    for i, (w, g) in enumerate(zip(wide, long)):
        np.save(c.path(f"wide/{i}.npy"), np.asfortranarray(w) if i % 4 == 0 else w)
        np.save(c.path(f"long/{i}.npy"), np.asfortranarray(g) if i % 4 == 1 else g)
    out = [
        same(
            c.host(npydask.open_dataset(os.path.dirname(c.path("wide/0.npy")), device="gpu").concatenate(axis=1).compute()),
            np.concatenate(wide, 1),
            "axis 1",
        ),
        same(
            c.host(npydask.open_dataset(os.path.dirname(c.path("long/0.npy")), device="gpu").concatenate(axis=0).compute()),
            np.concatenate(long, 0),
            "axis 0",
        ),
    ]
    return "; ".join(out)


def probe_zero_d_and_empty(c: Context) -> str:
    import npydask

    out = []
    for name, a in (("zero_d", np.array(7.5, "<f8")), ("empty", np.zeros((0, 5), "<i4"))):
        p = c.path(f"edge/{name}.npy")
        np.save(p, a)
        x = npydask.from_npy(p, device="gpu")
        out.append(same(c.host(x.compute()), a, name))
    return "; ".join(out)


def probe_stats_gpu(c: Context) -> str:
    """``npydask stats --device gpu --json`` equals ``--device cpu`` (blocks reduced on the device, no host array mixed)."""
    from npydask.cli import main

    folder = os.path.dirname(c.path("stats/0.npy"))
    for i in range(4):
        np.save(c.path(f"stats/{i}.npy"), data((20, 30), "<f4", 50 + i))
    results = {}
    for device in ("cpu", "gpu"):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["stats", folder, "--device", device, "--json"])
        if rc != 0:
            raise AssertionError(f"stats --device {device} exited {rc}: {err.getvalue().strip()[-300:]}")
        results[device] = json.loads(out.getvalue())
    if results["gpu"] != results["cpu"]:
        raise AssertionError(f"--device gpu {results['gpu']} differs from --device cpu {results['cpu']}")
    return "stats --device gpu --json equals --device cpu"


def _loader_files(c: Context) -> tuple[str, list[np.ndarray]]:
    """Ten files of one shape (some Fortran) for the loader probes; the folder and the arrays."""
    arrays = [data((8 * c.scale, 16), "<f4", 70 + i) for i in range(10)]
    for i, a in enumerate(arrays):
        np.save(c.path(f"loader/{i}.npy"), np.asfortranarray(a) if i % 3 == 0 else a)
    return os.path.dirname(c.path("loader/0.npy")), arrays


def probe_loader_torch_gpu(c: Context) -> str:
    """``Loader`` and both torch adapters with ``device="gpu"``: values, device, hand-off, forked workers.

    The Loader is consumed on a non-blocking stream (the hand-off's event must order it after the
    prefetch thread's copies: a pass proves little, a failure proves the race); the adapters run under
    a DataLoader with ``num_workers=0``; a worker forked after this process used CUDA must raise
    npydask's ``GpuUnavailableError`` naming ``num_workers=0``, not CUDA's "initialization error".
    """
    import torch

    import npydask
    from npydask import gpu_process
    from npydask.errors import GpuUnavailableError
    from npydask.torch import NpyIterableDataset, NpyMapDataset

    folder, arrays = _loader_files(c)
    ds = npydask.open_dataset(folder, device="gpu")
    xp, out = c.xp, []
    stream = contextlib.nullcontext() if c.dry else xp.cuda.Stream(non_blocking=True)
    seen = 0
    with stream:  # (the consumer's current stream while the loader hands batches over)
        for batch, idx in npydask.Loader(ds, 3, device="gpu", prefetch=2, with_index=True):
            if not c.dry and batch.device.id != xp.cuda.runtime.getDevice():
                current = xp.cuda.runtime.getDevice()
                raise AssertionError(f"a batch on device {batch.device.id}, the current is {current}")
            same(c.host(batch * 1), np.stack([arrays[i] for i in idx]), "batch")
            seen += len(idx)
    if seen != len(arrays):
        raise AssertionError(f"the Loader gave {seen} samples of {len(arrays)}")
    where = "" if c.dry else ", on the current device, consumed on a non-blocking stream"
    out.append(f"Loader: {seen} samples equal{where}")
    if not c.dry and gpu_process._CUDA_PID != os.getpid():
        raise AssertionError(f"the first device use recorded pid {gpu_process._CUDA_PID}, not {os.getpid()}")
    for adapter in (NpyIterableDataset(ds, device="gpu", with_index=True),
                    NpyMapDataset(ds, device="gpu", with_index=True)):
        seen = 0
        for batch, idx in torch.utils.data.DataLoader(adapter, batch_size=4, num_workers=0, pin_memory=False):
            if batch.is_cuda == c.dry:
                raise AssertionError(f"{type(adapter).__name__} gave a tensor on {batch.device}")
            same(batch.cpu().numpy(), np.stack([arrays[i] for i in idx.tolist()]), "tensor batch")
            seen += len(idx)
        if seen != len(arrays):
            raise AssertionError(f"{type(adapter).__name__} gave {seen} samples of {len(arrays)}")
    out.append("both adapters (num_workers=0) equal" + ("" if c.dry else ", CUDA tensors"))
    recorded = gpu_process._CUDA_PID
    if c.dry:
        gpu_process._CUDA_PID = os.getpid()  # (what the first device read records on a GPU)
    try:
        forked = torch.utils.data.DataLoader(NpyMapDataset(ds, device="gpu"), batch_size=4, num_workers=1,
                                             multiprocessing_context=torch.multiprocessing.get_context("fork"),
                                             pin_memory=False)  # fmt: skip
        next(iter(forked))
    except GpuUnavailableError as e:
        if "num_workers=0" not in str(e) or "spawn" not in str(e):
            raise AssertionError(f"the forked worker's error names neither num_workers=0 nor spawn: {e}") from e
    else:
        raise AssertionError("a DataLoader worker forked after CUDA was used read without npydask's error")
    finally:
        gpu_process._CUDA_PID = recorded
    out.append("a worker forked after CUDA was used: GpuUnavailableError naming num_workers=0 and spawn")
    return "; ".join(out)


_FRESH = """
import os, sys
import numpy as np, torch, npydask
from npydask import gpu, gpu_process
from npydask.torch import NpyMapDataset
dry, folder = sys.argv[1] == "dry", sys.argv[2]
if dry:
    gpu.require_gpu = lambda: None
    gpu._array_module = lambda: np
adapter = NpyMapDataset(npydask.open_dataset(folder, device="gpu"), device="gpu", with_index=True)
assert gpu_process._CUDA_PID is None and not torch.cuda.is_initialized(), "the checks initialised CUDA"
ctx = torch.multiprocessing.get_context("fork")
seen = 0
for batch, idx in torch.utils.data.DataLoader(adapter, batch_size=4, num_workers=2, multiprocessing_context=ctx,
                                              pin_memory=False):
    assert batch.is_cuda != dry, batch.device
    want = np.stack([np.load(adapter.dataset.files[i]) for i in idx.tolist()])
    assert np.array_equal(batch.cpu().numpy(), want), "values differ from numpy.load"
    seen += len(idx)
assert seen == len(adapter), (seen, len(adapter))
print(seen)
"""


def probe_torch_fork_before_cuda(c: Context) -> str:
    """In a fresh process: making the adapter initialises no CUDA, so DataLoader workers forked after it read.

    The workers create their own CUDA contexts and hand their collated batches to the parent
    through CUDA IPC; values must equal ``numpy.load``.
    """
    import subprocess

    folder, _ = _loader_files(c)
    run = subprocess.run([sys.executable, "-c", _FRESH, "dry" if c.dry else "gpu", folder], capture_output=True,
                         text=True, timeout=PROBE_SECONDS - 10)  # fmt: skip
    if run.returncode != 0:
        raise AssertionError(f"exit {run.returncode}: {run.stderr.strip()[-600:]}")
    return f"fresh process, 2 forked workers: {run.stdout.strip()} samples equal" + ("" if c.dry else ", CUDA tensors")


def probe_to_npy_of_device_array(c: Context) -> str:
    import npydask

    a = data((40 * c.scale, 33), "<f4", 60)
    np.save(c.path("w/src.npy"), a)
    x = npydask.from_npy(c.path("w/src.npy"), device="gpu", chunks=(7, 11))
    npydask.to_npy(x, c.path("w/out.npy"))
    return same(np.load(c.path("w/out.npy")), a, "to_npy round trip")


def probe_kvikio_errors(c: Context) -> str:
    """kvikio's errors, descriptors and settings: describe(), a file shrunk after opening, many files under a low ``ulimit -n``.

    Real kvikio raises at end of file (its POSIX reads never return short): a
    file truncated after kvikio opened it must give the CPU path's error class
    (``FileChangedError``), not ``GpuUnavailableError``. A stack of many small
    files read by 16 threads under a lowered soft ``RLIMIT_NOFILE`` (restored
    after) must equal numpy with no ``EMFILE``.
    """
    import resource

    import npydask
    from npydask.backends import _kvikio_runtime as kr
    from npydask.backends import kvikio as kb
    from npydask.storage import _handles

    text = kb.describe()  # (raises nothing; names the path, and kvikio's threads and GDS availability)
    paths = ("GPUDirect Storage:", "kvikio POSIX compatibility mode:", "pinned host memory (kvikio not installed)")
    if not text.startswith(paths) or (not text.startswith(paths[2]) and not ("num_threads" in text and "GDS available" in text)):
        raise AssertionError(f"describe() says {text!r}")
    out = [f"describe(): {text}"]

    a = data((256 * c.scale, 64), "<i4", 70)
    p = c.path("kerr/shrinks.npy")
    np.save(p, a)
    errors = {}
    for device in ("cpu", "gpu"):
        np.save(p, a)
        x = npydask.from_npy(p, device=device)
        done: list[int] = []
        real_open, real_pread = kb._open_checked, kb.pread_exact

        def open_then_shrink(kvikio: Any, ref: Any) -> Any:  # after kvikio opened and checked it
            opened = real_open(kvikio, ref)
            if not done:
                done.append(1)
                os.truncate(p, 256)
            return opened

        def shrink_then_pread(fd: int, dest: Any, offset: int, path: str) -> None:  # (pinned path, dry run)
            if not done and path == p:
                done.append(1)
                os.truncate(p, 256)
            real_pread(fd, dest, offset, path)

        if device == "gpu":
            kb._open_checked, kb.pread_exact = open_then_shrink, shrink_then_pread
        else:
            os.truncate(p, 256)  # (the CPU path: after the graph was built)
        try:
            x.compute()
        except Exception as e:  # noqa: BLE001 - the class is what is compared
            errors[device] = e
        finally:
            kb._open_checked, kb.pread_exact = real_open, real_pread
    if set(errors) != {"cpu", "gpu"} or type(errors["gpu"]) is not type(errors["cpu"]):
        raise AssertionError(f"truncated after opening: cpu {errors.get('cpu')!r}, gpu {errors.get('gpu')!r}")
    if os.path.basename(p) not in str(errors["gpu"]):
        raise AssertionError(f"the error does not name the file: {errors['gpu']}")
    out.append(f"shrunk after opening: {type(errors['gpu']).__name__} on both paths")

    n = 40 * c.scale if c.scale > 1 else 300
    small = [data((8, 8), "<f4", 1000 + i) for i in range(n)]
    for i, s in enumerate(small):
        np.save(c.path(f"kerr/many/{i:05d}.npy"), s)
    ds = npydask.open_dataset(os.path.dirname(c.path("kerr/many/0.npy")), device="gpu")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, len(os.listdir("/proc/self/fd")) + 400)
    _handles.clear_cache()
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        with npydask.config.set(gpu_host_bytes=0):  # (every file through kvikio, not the host route for small reads)
            got = c.host(ds.stack().compute(scheduler="threads", num_workers=16))
        bound = kb.cufile_limit()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        _handles.clear_cache()
    out.append(same(got, np.stack(small), f"{n} files under ulimit -n {low} (CuFiles at once <= {bound}, peak {kr._open_peak})"))
    return "; ".join(out)


def probe_read_routes(c: Context) -> str:
    """Each read route on the device against numpy: straight into the stack's slabs (kvikio), the host route
    for small files and a padded ROI of short rows, and the device plans for the same with the route off."""
    import npydask
    from npydask.backends import kvikio as kvikio_backend

    out = []
    big = [data((8 * c.scale, 1024), "<f4", 70 + i) for i in range(4)]  # 2 MiB files on a GPU: straight reads
    for i, a in enumerate(big):
        np.save(c.path(f"routes/big/{i}.npy"), a)
    ds = npydask.open_dataset(os.path.dirname(c.path("routes/big/0.npy")), device="gpu")
    out.append(same(c.host(ds.stack().compute()), np.stack(big), "stack read straight into slabs"))
    small = [data((16, 16), ">f4", 80 + i) for i in range(50 * c.scale)]
    for i, a in enumerate(small):
        np.save(c.path(f"routes/small/{i:05d}.npy"), a)
    folder = os.path.dirname(c.path("routes/small/00000.npy"))
    for host_bytes in ("1MiB", 0):  # the host route, then every file planned on the device
        with npydask.config.set(gpu_host_bytes=host_bytes):
            ds = npydask.open_dataset(folder, device="gpu")
            out.append(same(c.host(ds.stack().compute()), np.stack(small), f"{len(small)} small files ({host_bytes})"))
            roi = npydask.open_dataset(os.path.dirname(c.path("routes/big/0.npy")), roi_start=[3, 1000],
                                       roi_shape=[4 * c.scale, 40], out_of_bounds_policy="pad", device="gpu")  # fmt: skip
            want = np.zeros((4, 4 * c.scale, 40), "<f4")
            rows = min(4 * c.scale, 8 * c.scale - 3)
            want[:, :rows, :24] = np.stack([a[3 : 3 + rows, 1000:] for a in big])
            out.append(same(c.host(roi.stack().compute()), want, f"padded ROI of short rows ({host_bytes})"))
    kvikio = None if c.dry else kvikio_backend._import_kvikio("<probe>")
    mode = "no kvikio" if kvikio is None else f"kvikio posix={kvikio_backend._posix_reads(kvikio)}"
    return f"{mode}; " + "; ".join(out)


def probe_pinned_ring(c: Context) -> str:
    """Without kvikio: reads through the pinned ring (pieces of 8 MiB, more than its two slots) equal numpy."""
    import npydask
    from npydask import gpu_pinned

    a = data((256 * c.scale, 1024), ">i4", 90)  # 64 MiB on a GPU: eight pieces per chunk
    np.save(c.path("ring/be.npy"), a)
    b = [data((64 * c.scale, 512), "<i2", 91 + i) for i in range(3)]
    for i, x in enumerate(b):
        np.save(c.path(f"ring/s/{i}.npy"), x)
    real = sys.modules.get("kvikio", False)
    sys.modules["kvikio"] = None  # type: ignore[assignment]  # as where kvikio is not installed
    try:
        with npydask.config.set(gpu_host_bytes=0):
            x = npydask.from_npy(c.path("ring/be.npy"), device="gpu", chunks=(128 * c.scale, 1024))
            out = [same(c.host(x.compute(scheduler="sync")), a, "big-endian through the ring")]
            ds = npydask.open_dataset(os.path.dirname(c.path("ring/s/0.npy")), device="gpu")
            got = ds.stack().compute(scheduler="sync")  # (in this thread: its ring is the one counted below)
            out.append(same(c.host(got), np.stack(b), "stack straight from the ring"))
    finally:
        if real is False:
            del sys.modules["kvikio"]
        else:
            sys.modules["kvikio"] = real
    slots = len(getattr(gpu_pinned._local, "ring", ()))
    if not c.dry and slots != gpu_pinned.SLOTS:
        raise AssertionError(f"{slots} pinned slots in this thread, expected {gpu_pinned.SLOTS}")
    pool = None if c.dry else c.xp.get_default_pinned_memory_pool()
    free = getattr(pool, "n_free_blocks", lambda: "?")() if pool is not None else "-"
    return "; ".join(out) + f"; ring: {slots} slots of {gpu_pinned.SLOT_BYTES >> 20} MiB, pinned pool free blocks {free}"


PROBES: dict[str, Callable[[Context], str]] = {
    "from_npy_c": probe_from_npy_c,
    "from_npy_fortran": probe_from_npy_fortran,
    "big_endian": probe_big_endian,
    "roi": probe_roi,
    "npz_members": probe_npz_members,
    "concatenate": probe_concatenate,
    "zero_d_and_empty": probe_zero_d_and_empty,
    "stats_gpu": probe_stats_gpu,
    "loader_torch_gpu": probe_loader_torch_gpu,
    "torch_fork_before_cuda": probe_torch_fork_before_cuda,
    "to_npy_device": probe_to_npy_of_device_array,
    "kvikio_errors": probe_kvikio_errors,
    "read_routes": probe_read_routes,
    "pinned_ring": probe_pinned_ring,
}

KNOWN: dict[str, tuple[str, str]] = {}
"""Probe name -> (text in the error, finding): a failure matching it is XFAIL until the fix lands."""


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError(f"probe still running after {PROBE_SECONDS} s")


def run(names: list[str], ctx: Context) -> int:
    """Run the probes; print one line each; return how many FAILed."""
    failed = 0
    tag = " (dry: numpy stands in for CuPy)" if ctx.dry else ""
    signal.signal(signal.SIGALRM, _alarm)
    for name in names:
        t0 = time.perf_counter()
        signal.alarm(PROBE_SECONDS)
        try:
            detail = PROBES[name](ctx)
            status = "PASS"
        except Exception as e:  # a probe's failure is reported, never stops the others
            detail = f"{type(e).__name__}: {str(e).strip()[:400]}"
            known = KNOWN.get(name)
            status = "XFAIL" if known and known[0] in detail and not ctx.dry else "FAIL"
            if status == "XFAIL":
                detail = f"{known[1]}; {detail}"
            traceback.print_exc(file=sys.stderr)
        finally:
            signal.alarm(0)
        failed += status == "FAIL"
        print(f"{status} {name}{tag}: {detail} ({time.perf_counter() - t0:.2f} s)", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    """Command line: run the chosen probes (all by default) and exit 1 if one FAILed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--work", required=True, help="a folder on disk for the probes' files")
    ap.add_argument("--dry-run", action="store_true", help="numpy stands in for CuPy, tiny sizes")
    ap.add_argument("--only", default="", help="comma-separated probe names")
    ap.add_argument("--scale", type=int, default=None, help="size multiplier (default 64 on a GPU, 1 dry)")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(PROBES)
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        print(f"gpu_probes: unknown probe(s) {', '.join(unknown)}; known: {', '.join(PROBES)}", file=sys.stderr)
        return 2
    os.makedirs(args.work, exist_ok=True)
    ctx = Context(args.work, args.dry_run, args.scale or (1 if args.dry_run else 64))
    failed = run(names, ctx)
    print(f"{'FAIL' if failed else 'PASS'} probes: {len(names) - failed} of {len(names)} passed or XFAIL", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
