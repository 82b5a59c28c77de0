"""Device probes for ``ci/gpu_check.sh``: what a GPU run must show that no ``pytest -m gpu`` test covers yet.

Each probe writes its files under the work folder, reads them with ``device="gpu"``
and compares the result with ``numpy.load`` (the oracle), exactly. Each prints one
line, ``PASS|FAIL|XFAIL|SKIP name: detail``, and a failure never stops the others. XFAIL
marks a failure the GPU review predicts and whose fix has not landed (it names the
finding); once fixed, the probe passes. SKIP is a probe whose optional package is
not installed (the torch probes without torch, as in the GPU kit): "skipped: torch
is not installed", neither a pass nor a failure.

``--dry-run`` runs every probe at tiny size with numpy standing in for CuPy (the
same stand-in as the CPU tests in ``tests/gpu/test_gpu.py``: ``npydask.gpu.device`` reads into
numpy), so the probes themselves are checked on any machine; a dry PASS says the
probe's logic and the host side work, nothing about a GPU.

Usage::

    python ci/gpu_probes.py --work DIR [--dry-run] [--only NAME[,NAME]] [--scale N]

Exit status: 0 when every probe passed, XFAILed or was skipped, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
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
            from npydask.gpu import device as gpu

            gpu.require_gpu = lambda: None  # numpy stands in for CuPy, as in tests/gpu/test_gpu.py
            gpu.array_module = lambda: np
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


class Skipped(Exception):
    """A probe that cannot run here because an optional package is missing: a SKIP line, not a FAIL."""


def need(package: str) -> None:
    """Raise :class:`Skipped` where ``package`` is not installed (an installed one that fails to import FAILs)."""
    if importlib.util.find_spec(package) is None:
        raise Skipped(f"{package} is not installed")


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
            c.host(
                npydask.open_dataset(os.path.dirname(c.path("wide/0.npy")), device="gpu").concatenate(axis=1).compute()
            ),
            np.concatenate(wide, 1),
            "axis 1",
        ),
        same(
            c.host(
                npydask.open_dataset(os.path.dirname(c.path("long/0.npy")), device="gpu").concatenate(axis=0).compute()
            ),
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
    """``npydask stats --device gpu --json`` equals ``--device cpu``.

    The blocks are reduced on the device, with no host array mixed in.
    """
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
    # count, min and max are exact; mean and std are float64 sums taken in another order on the device (an ulp)
    gpu_, cpu_ = results["gpu"], results["cpu"]
    exact = {k: v for k, v in gpu_.items() if k not in ("mean", "std")} == {
        k: v for k, v in cpu_.items() if k not in ("mean", "std")
    }
    close = all(np.isclose(gpu_[k], cpu_[k], rtol=1e-12, atol=0) for k in ("mean", "std"))
    if set(gpu_) != set(cpu_) or not exact or not close:
        raise AssertionError(f"--device gpu {gpu_} differs from --device cpu {cpu_}")
    ulps = ", ".join(f"{k} {gpu_[k]!r} vs {cpu_[k]!r}" for k in ("mean", "std") if gpu_[k] != cpu_[k])
    return "stats --device gpu --json equals --device cpu" + (f" (within 1e-12: {ulps})" if ulps else "")


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
    need("torch")
    import torch

    import npydask
    from npydask.errors import GpuUnavailableError
    from npydask.gpu import process as gpu_process
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
    for adapter in (
        NpyIterableDataset(ds, device="gpu", with_index=True),
        NpyMapDataset(ds, device="gpu", with_index=True),
    ):
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


def probe_torch_patches_gpu(c: Context) -> str:
    """Both torch adapters with a patch sampler and ``device="gpu"``: padded boxes of a zipped pair, CUDA tensors.

    ``NpyIterableDataset`` (batches dealt to the DataLoader, its ``location`` index) and
    ``NpyMapDataset`` under a shuffling DataLoader, ``num_workers=0``; every box of image and label
    equals ``numpy.load`` sliced and padded with the sampler's fill value.
    """
    need("torch")
    import torch

    import npydask
    from npydask.samplers import Uniform
    from npydask.torch import NpyIterableDataset, NpyMapDataset

    folder, arrays = _loader_files(c)
    ds = npydask.open_dataset(folder, device="gpu")
    pairs = npydask.zip_datasets({"image": ds, "label": ds})
    sampler = Uniform((5 * c.scale, 6), per_file=2, policy="pad", fill_value=-1.0)

    def box(a: np.ndarray, loc: list[int]) -> np.ndarray:
        r0, c0, r1, c1 = loc
        out = np.full((r1 - r0, c1 - c0), -1.0, a.dtype)
        lo, hi = (max(r0, 0), max(c0, 0)), (min(r1, a.shape[0]), min(c1, a.shape[1]))
        out[lo[0] - r0 : hi[0] - r0, lo[1] - c0 : hi[1] - c0] = a[lo[0] : hi[0], lo[1] : hi[1]]
        return out

    out = []
    for adapter, shuffle in ((NpyIterableDataset(pairs, sampler=sampler, batch_size=4, with_index=True), False),
                             (NpyMapDataset(pairs, sampler=sampler, seed=3, with_index=True), True)):  # fmt: skip
        seen = 0
        loader = torch.utils.data.DataLoader(adapter, batch_size=4, shuffle=shuffle, num_workers=0, pin_memory=False)
        for batch, index in loader:
            for key in ("image", "label"):
                if batch[key].is_cuda == c.dry:
                    raise AssertionError(f"{type(adapter).__name__} gave a {key} tensor on {batch[key].device}")
                want = [box(arrays[f], loc) for f, loc in zip(index["file"].tolist(), index["location"].tolist())]
                same(batch[key].cpu().numpy(), np.stack(want), f"{key} patches")
            seen += len(index["file"])
        if seen != 2 * len(arrays):
            raise AssertionError(f"{type(adapter).__name__} gave {seen} patches of {2 * len(arrays)}")
        out.append(f"{type(adapter).__name__}: {seen} padded patches equal" + ("" if c.dry else ", CUDA tensors"))
    return "; ".join(out)


_FRESH = """
import os, sys
import numpy as np, torch, npydask
from npydask.gpu import device as gpu
from npydask.gpu import process as gpu_process
from npydask.torch import NpyMapDataset
dry, folder = sys.argv[1] == "dry", sys.argv[2]
if dry:
    gpu.require_gpu = lambda: None
    gpu.array_module = lambda: np
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
    need("torch")  # (the fresh process imports it)
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
    """kvikio's errors, descriptors and settings.

    describe(), a file shrunk after opening, many files under a low ``ulimit -n``.

    Real kvikio raises at end of file (its POSIX reads never return short): a
    file truncated after kvikio opened it must give the CPU path's error class
    (``FileChangedError``), not ``GpuUnavailableError``. A stack of many small
    files read by 16 threads under a lowered soft ``RLIMIT_NOFILE`` (restored
    after) must equal numpy with no ``EMFILE``.
    """
    import resource

    import npydask
    from npydask.gpu import _kvikio as kb
    from npydask.gpu import _kvikio_runtime as kr
    from npydask.gpu import describe
    from npydask.storage import clear_cache
    from npydask.storage.local import LocalSource

    text = describe()  # (raises nothing; names the path, and kvikio's threads and GDS availability)
    paths = ("GPUDirect Storage:", "kvikio POSIX compatibility mode:", "pinned host memory (kvikio not installed)")
    if not text.startswith(paths) or (
        not text.startswith(paths[2]) and not ("num_threads" in text and "GDS available" in text)
    ):
        raise AssertionError(f"describe() says {text!r}")
    out = [f"describe(): {text}"]

    a = data((256 * c.scale, 64), "<i4", 70)
    p = c.path("kerr/shrinks.npy")
    np.save(p, a)
    errors = {}
    for device in ("cpu", "gpu"):
        np.save(p, a)
        with npydask.config.set(gpu_host_bytes=0):  # (through kvikio: small reads would take the host route)
            x = npydask.from_npy(p, device=device)
        done: list[int] = []
        real_open, real_read = kb._open_checked, LocalSource.read_spans

        # (both stand-ins are installed for this iteration's compute only: the finally below restores the real ones)
        def open_then_shrink(kvikio: Any, ref: Any, *, real_open: Any = real_open, done: list[int] = done) -> Any:
            # after kvikio opened and checked it
            opened = real_open(kvikio, ref)
            if not done:
                done.append(1)
                os.truncate(p, 256)
            return opened

        def shrink_then_read(
            source: Any,
            f: Any,
            spans: Any,
            dest: Any,
            options: Any,
            *,
            real_read: Any = real_read,
            done: list[int] = done,
        ) -> int:  # (pinned path, dry run)
            if not done and f.path == p:
                done.append(1)
                os.truncate(p, 256)
            return int(real_read(source, f, spans, dest, options))

        if device == "gpu":
            kb._open_checked, LocalSource.read_spans = open_then_shrink, shrink_then_read
        else:
            os.truncate(p, 256)  # (the CPU path: after the graph was built)
        try:
            x.compute()
        except Exception as e:  # noqa: BLE001 - the class is what is compared
            errors[device] = e
        finally:
            kb._open_checked, LocalSource.read_spans = real_open, real_read
    if set(errors) != {"cpu", "gpu"} or type(errors["gpu"]) is not type(errors["cpu"]):
        raise AssertionError(f"truncated after opening: cpu {errors.get('cpu')!r}, gpu {errors.get('gpu')!r}")
    if os.path.basename(p) not in str(errors["gpu"]):
        raise AssertionError(f"the error does not name the file: {errors['gpu']}")
    out.append(f"shrunk after opening: {type(errors['gpu']).__name__} on both paths")

    n = 40 * c.scale if c.scale > 1 else 300
    small = [data((8, 8), "<f4", 1000 + i) for i in range(n)]
    for i, s in enumerate(small):
        np.save(c.path(f"kerr/many/{i:05d}.npy"), s)
    with npydask.config.set(gpu_host_bytes=0):  # (every file through kvikio, not the host route for small reads)
        ds = npydask.open_dataset(os.path.dirname(c.path("kerr/many/0.npy")), device="gpu")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, len(os.listdir("/proc/self/fd")) + 400)
    clear_cache()
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        got = c.host(ds.stack().compute(scheduler="threads", num_workers=16))
        bound = kb.cufile_limit()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        clear_cache()
    out.append(
        same(
            got, np.stack(small), f"{n} files under ulimit -n {low} (CuFiles at once <= {bound}, peak {kr._open_peak})"
        )
    )
    return "; ".join(out)


def probe_read_routes(c: Context) -> str:
    """Each read route on the device against numpy: straight into the stack's slabs (kvikio), the host route
    for small files and a padded ROI of short rows, and the device plans for the same with the route off."""
    import npydask

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
                                       roi_shape=[4 * c.scale, 40], out_of_bounds_policy="pad",
                                       device="gpu")  # fmt: skip
            want = np.zeros((4, 4 * c.scale, 40), "<f4")
            rows = min(4 * c.scale, 8 * c.scale - 3)
            want[:, :rows, :24] = np.stack([a[3 : 3 + rows, 1000:] for a in big])
            out.append(same(c.host(roi.stack().compute()), want, f"padded ROI of short rows ({host_bytes})"))
    from npydask.gpu import _kvikio_runtime

    kvikio = None if c.dry else _kvikio_runtime.import_kvikio("<probe>")
    mode = "no kvikio" if kvikio is None else f"kvikio posix={_kvikio_runtime.posix_reads(kvikio)}"
    return f"{mode}; " + "; ".join(out)


def probe_pinned_ring(c: Context) -> str:
    """Without kvikio: reads through the pinned ring (pieces of 8 MiB, more than its two slots) equal numpy."""
    import npydask
    from npydask.gpu import _pinned as gpu_pinned

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
    return (
        "; ".join(out) + f"; ring: {slots} slots of {gpu_pinned.SLOT_BYTES >> 20} MiB, pinned pool free blocks {free}"
    )


def _toolkit_child(cache_dir: str, path: str) -> dict[str, Any]:
    """In a fresh process: time the toolkit check (NVRTC compiling into an empty kernel cache), count it."""
    before = os.environ.get("CUPY_CACHE_DIR")
    os.environ["CUPY_CACHE_DIR"] = cache_dir  # (an empty kernel cache: a real NVRTC compile, not a cache hit)
    import cupy

    import npydask
    from npydask.gpu import device as gpu
    from npydask.gpu import toolkit as gpu_toolkit

    made: list[str] = []
    real = cupy.ElementwiseKernel

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(kwargs.get("name", args[3] if len(args) > 3 else ""))
        return real(*args, **kwargs)

    cupy.ElementwiseKernel = counting
    t0 = time.perf_counter()
    cupy.empty(1)  # the CUDA context, apart from the check
    t1 = time.perf_counter()
    gpu.array_module()
    t2 = time.perf_counter()
    gpu.array_module()
    t3 = time.perf_counter()
    if before is None:  # (the read below may use kernels other probes compiled already)
        del os.environ["CUPY_CACHE_DIR"]
    else:
        os.environ["CUPY_CACHE_DIR"] = before
    x = npydask.from_npy(path, device="gpu", chunks=(16, 256))
    total = int(x.sum(dtype="int64").compute(scheduler="threads", num_workers=8))
    checks = made.count(gpu_toolkit.KERNEL_NAME)
    broken = real("int32 x", "int32 y", "y = x +* ;", "npydask_broken_on_purpose")
    try:
        broken(cupy.arange(2, dtype=cupy.int32))
        translated = "a broken kernel compiled?"
    except Exception as e:  # CuPy's own exception for a compile error: what the check translates
        message = str(gpu_toolkit.toolkit_error(e))
        ok = "NVRTC (libnvrtc) failed to compile" in message and "npydask[gpu-cu13]" in message
        translated = f"{type(e).__module__}.{type(e).__name__} -> {'NVRTC message' if ok else message[:200]}"
    return {"context_ms": (t1 - t0) * 1e3, "check_ms": (t2 - t1) * 1e3, "again_ms": (t3 - t2) * 1e3,
            "checks": checks, "tasks": x.npartitions, "sum": total, "translated": translated,
            "nvrtc": _nvrtc_version(cupy)}  # fmt: skip


def _nvrtc_version(cupy: Any) -> str:
    try:
        return ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
    except Exception as e:  # (a version is information only)
        return f"version unknown ({type(e).__name__})"


def _in_fresh_process(function: str, *args: str, timeout: float = 50) -> dict[str, Any]:
    """``function(*args)`` of this file run by a new Python (killed after ``timeout`` s); its JSON result."""
    code = "import json, runpy, sys; f = runpy.run_path(sys.argv[1])[sys.argv[2]]; print(json.dumps(f(*sys.argv[3:])))"
    done = subprocess.run([sys.executable, "-c", code, os.path.abspath(__file__), function, *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"{function} exited {done.returncode}: {done.stderr.strip()[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_nvrtc_check(c: Context) -> str:
    """The first device read of a process compiles and runs one kernel, once, and passes (SPEC 2, C5).

    On a GPU a fresh process (an empty CuPy kernel cache, so NVRTC really
    compiles) times the check apart from the CUDA context, reads a file in
    many tasks on 8 threads and counts the check kernels made (1); a broken
    kernel's real CuPy exception is translated into the NVRTC message. Dry:
    the same logic on a numpy-backed fake CuPy in this process.
    """
    a = data((64 * max(c.scale // 8, 1), 256), "<i4", 70)
    np.save(c.path("nvrtc/a.npy"), a)
    if c.dry:
        return _toolkit_dry()
    got = _in_fresh_process("_toolkit_child", c.path("nvrtc/cupy-cache"), c.path("nvrtc/a.npy"))
    if got["sum"] != int(a.sum(dtype="int64")):
        raise AssertionError(f"sum {got['sum']} differs from numpy's {int(a.sum(dtype='int64'))}")
    if got["checks"] != 1:
        raise AssertionError(f"{got['checks']} toolkit checks in one process over {got['tasks']} tasks, expected 1")
    if "-> NVRTC message" not in got["translated"]:
        raise AssertionError(f"a compile error was not translated: {got['translated']}")
    return (f"NVRTC {got['nvrtc']}: check {got['check_ms']:.0f} ms (empty kernel cache; CUDA context "
            f"{got['context_ms']:.0f} ms apart), again {got['again_ms'] * 1e3:.0f} us, 1 check over "
            f"{got['tasks']} tasks on 8 threads, sum equal; {got['translated']}")  # fmt: skip


def _toolkit_dry() -> str:
    import types

    from npydask.errors import GpuUnavailableError
    from npydask.gpu import toolkit as gpu_toolkit

    made: list[str] = []

    class Kernel:
        def __init__(self, *args: Any) -> None:
            made.append(args[3])

        def __call__(self, x: Any) -> Any:
            return types.SimpleNamespace(get=lambda: np.asarray(x) * 2 + 1)

    fake = types.SimpleNamespace(ElementwiseKernel=Kernel, asarray=np.asarray)
    saved = gpu_toolkit._outcome
    gpu_toolkit._outcome = None
    try:
        for _ in range(3):
            gpu_toolkit.check_toolkit(fake)
    finally:
        gpu_toolkit._outcome = saved
    if made != [gpu_toolkit.KERNEL_NAME]:
        raise AssertionError(f"kernels made: {made}, expected one {gpu_toolkit.KERNEL_NAME}")
    message = str(gpu_toolkit.toolkit_error(RuntimeError("CuPy failed to load libnvrtc.so.13")))
    if not isinstance(gpu_toolkit.toolkit_error(RuntimeError()), GpuUnavailableError) or "NVRTC" not in message:
        raise AssertionError(f"not an NVRTC message: {message}")
    return "one check over 3 calls on a fake CuPy; a missing libnvrtc is a GpuUnavailableError naming NVRTC"


def _block_is(block: Any, module: str) -> str:
    """On a worker: the type of one chunk as it is there, checked against ``module.ndarray``."""
    import importlib

    ok = isinstance(block, importlib.import_module(module).ndarray)
    return f"{'ok' if ok else 'WRONG'} {type(block).__module__}.{type(block).__name__}"


def _worker_allocator() -> str:
    """On a worker: CuPy's allocator, RMM's (``rmm...``) or CuPy's own pool."""
    import cupy

    allocator = cupy.cuda.get_allocator()
    owner = getattr(allocator, "__self__", None)
    if type(owner).__name__.endswith("MemoryPool"):
        return f"cupy {type(owner).__name__}"
    return f"{getattr(allocator, '__module__', '?')}.{getattr(allocator, '__qualname__', '?')}"


def probe_dask_cuda(c: Context) -> str:
    """dask-cuda workers without and with RMM (CuPy routed to it): values equal numpy, chunks CuPy on the worker.

    One ``LocalCUDACluster`` worker (tcp, no dashboard) per configuration:
    ``open_dataset(device="gpu").stack().sum()`` and ``from_npy(device="gpu")``
    computed on it equal numpy; every chunk is a ``cupy.ndarray`` where the
    worker holds it; with ``rmm_pool_size`` + ``rmm_allocator_external_lib_list="cupy"``
    the worker's CuPy allocates from RMM, without it from CuPy's own pool.
    Dry: a ``LocalCluster`` with ``processes=False`` and numpy standing in.
    """
    import importlib.util

    import dask
    from distributed import Client, LocalCluster

    import npydask

    vols = [data((8, 24, 20), "<i4", 80 + i) for i in range(6)]
    for i, v in enumerate(vols):
        np.save(c.path(f"cuda/vols/{i}.npy"), np.asfortranarray(v) if i % 2 else v)
    big = data((32 * c.scale, 300), ">i4", 90)
    np.save(c.path("cuda/big.npy"), big)
    folder = os.path.dirname(c.path("cuda/vols/0.npy"))
    want_sum = int(np.stack(vols).sum(dtype="int64"))
    if __name__ != "__main__":  # (loaded from its path, as tests do: workers cannot import this file by name)
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if not c.dry and importlib.util.find_spec("dask_cuda") is None:
        raise AssertionError("dask_cuda is not installed (the kit's .whl/ brings it)")
    if not c.dry and importlib.util.find_spec("rmm") is None:
        raise AssertionError("rmm is not installed (the kit's .whl/ brings rmm-cu13)")
    configs = [("plain", {}), ("rmm+cupy", {"rmm_pool_size": "512MiB", "rmm_allocator_external_lib_list": "cupy"})]
    out = []
    for name, options in configs:
        t0 = time.perf_counter()
        if c.dry:  # (the RMM options have no CPU twin: both runs are the same here)
            cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
        else:
            from dask_cuda import LocalCUDACluster

            cluster = LocalCUDACluster(n_workers=1, threads_per_worker=2, protocol="tcp", dashboard_address=None,
                                       **options)  # fmt: skip
        with cluster, Client(cluster) as client:
            started = time.perf_counter() - t0
            allocator = "numpy (dry)" if c.dry else next(iter(client.run(_worker_allocator).values()))
            if name == "rmm+cupy" and not c.dry and not allocator.startswith("rmm"):
                raise AssertionError(f"{name}: the worker's CuPy allocates with {allocator}, not RMM")
            if name == "plain" and not c.dry and allocator.startswith("rmm"):
                raise AssertionError(f"{name}: the worker's CuPy allocates with {allocator} without RMM asked for")
            stacked = npydask.open_dataset(folder, device="gpu").stack()
            total = int(c.host(stacked.sum(dtype="int64").compute()))
            if total != want_sum:
                raise AssertionError(f"{name}: stack().sum() {total} differs from numpy's {want_sum}")
            x = npydask.from_npy(c.path("cuda/big.npy"), device="gpu", chunks=(8 * c.scale, 100))
            same(c.host(x.compute()), big, f"{name}: from_npy")
            blocks = [*x.to_delayed().ravel(), *stacked.to_delayed().ravel()]
            kinds = dask.compute(*[dask.delayed(_block_is)(b, c.xp.__name__) for b in blocks])
            wrong = [k for k in kinds if not k.startswith("ok")]
            if wrong:
                raise AssertionError(f"{name}: chunks on the worker are {sorted(set(wrong))}")
        out.append(f"{name}: sums and from_npy equal, {len(kinds)} chunks {kinds[0][3:]} on the worker, "
                   f"CuPy allocates with {allocator}, cluster up in {started:.1f} s")  # fmt: skip
    return "; ".join(out) + ("" if c.dry else "; clusters shut down")


def probe_gpu_examples(c: Context) -> str:
    """``examples/gpu_client_submit.py --check`` and ``examples/gpu_workers.py --check`` as a user runs them.

    On a GPU both start a one-worker ``LocalCUDACluster`` (the second with CuPy on
    an RMM pool) and check their means against numpy; ``pytest -m gpu`` runs
    neither. Dry: the submit example runs with ``device="cpu"``, the workers
    example prints its skip line.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    for script, want in (("gpu_client_submit.py", "the means equal numpy's: True"),
                         ("gpu_workers.py", "skipped: " if c.dry else "mean ")):  # fmt: skip
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, os.path.join(root, "examples", script), "--check"],
                              capture_output=True, text=True, timeout=28, cwd=root)  # fmt: skip
        if done.returncode != 0 or want not in done.stdout:
            raise AssertionError(f"{script} --check exited {done.returncode}: {(done.stdout + done.stderr)[-500:]}")
        lines = [ln for ln in done.stdout.splitlines() if "worker " in ln or "imported CuPy" in ln or "skipped" in ln]
        out.append(f"{script} {time.perf_counter() - t0:.1f} s ({'; '.join(lines)[:300]})")
    return "; ".join(out)


def _raises(call: Callable[[], Any], kind: type, text: str) -> str | None:
    """``None`` when ``call`` raises ``kind`` with ``text`` in its message; else what happened."""
    try:
        call()
    except kind as e:
        return None if text in str(e) else f"{type(e).__name__}: {str(e)[:120]}"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:120]}"
    return "no error"


def _agreement(cp: Any, kvikio: Any, work: str) -> tuple[list[str], int]:
    """Where ``cp``/``kvikio`` differ from what ``npydask.testing.strict_cupy`` claims of CuPy and kvikio."""
    import kvikio.defaults

    x, h = cp.zeros(3), np.zeros(3)
    claims: list[tuple[str, Callable[[], str | None]]] = [
        ("np.asarray raises", lambda: _raises(lambda: np.asarray(x), TypeError, "Implicit conversion")),
        ("np.stack host+device raises", lambda: _raises(lambda: np.stack([x, h]), TypeError, "incorrect type")),
        ("np.concatenate host+device raises",
         lambda: _raises(lambda: np.concatenate([h, x]), TypeError, "Unsupported type")),
        ("device + host raises", lambda: _raises(lambda: x + h, TypeError, "Unsupported type")),
        ("host + device raises", lambda: _raises(lambda: h + x, TypeError, "Unsupported type")),
        ("0-d host in a comparison is fine", lambda: None if bool((cp.zeros(3) == np.array(0.0)).all()) else "False"),
        ("reductions give 0-d device arrays",
         lambda: None if isinstance(x.sum(), cp.ndarray) and x.sum().ndim == 0 else repr(type(x.sum()))),
        ("set checks the dtype", lambda: _raises(lambda: x.set(np.zeros(3, np.float32)), TypeError, "cannot be set")),
        ("pinned memory rounds up to a power of two",
         lambda: None if len(np.frombuffer(cp.cuda.alloc_pinned_memory(5000), np.uint8)) == 8192
         else str(len(np.frombuffer(cp.cuda.alloc_pinned_memory(5000), np.uint8)))),
    ]  # fmt: skip
    claims += [
        ("x[...] = host raises (basic indexes fill)",
         lambda: _raises(lambda: x.__setitem__(Ellipsis, np.arange(3.0)), ValueError, "cannot be used for fill")),
        ("x[1:] = host raises too",
         lambda: _raises(lambda: x.__setitem__(slice(1, None), np.ones(2)), ValueError, "fill")),
        ("x[...] = 0-d host fills", lambda: None if (x.__setitem__(Ellipsis, np.array(2.0)), bool((x == 2.0).all()))[1]
         else "not filled"),
    ]  # fmt: skip
    differ: list[str] = []
    path = os.path.join(work, "eof.bin")
    with open(path, "wb") as f:
        f.write(bytes(40_000))
    buf = cp.empty(65_536, np.uint8)
    fds = len(os.listdir("/proc/self/fd"))
    with kvikio.CuFile(path, "r") as f:
        opened = len(os.listdir("/proc/self/fd")) - fds
        claims += [
            ("a small read is done at once", lambda: None if f.pread(buf, 100, 0).done() else "not done"),
            (
                "EOF raises in a small read",
                lambda: _raises(lambda: f.pread(buf, 8192, 36_000).get(), RuntimeError, "EOF"),
            ),
            ("EOF raises in a pool read", lambda: _raises(lambda: f.pread(buf, 65_536, 0).get(), RuntimeError, "EOF")),
            ("a CuFile holds two descriptors", lambda: None if opened == 2 else f"{opened}"),
            ("kvikio.defaults numbers", lambda: None if (kvikio.defaults.get("task_size"),
             kvikio.defaults.get("gds_threshold")) == (4 << 20, 16384) else "other defaults"),
        ]  # fmt: skip
        for what, check in claims:
            got = check()
            if got is not None:
                differ.append(f"{what}: {got}")
    return differ, len(claims)


def probe_strict_cupy_agrees(c: Context) -> str:
    """CuPy and kvikio here behave as the CPU stand-in (``npydask.testing.strict_cupy``) claims they do.

    A difference means the strict CPU tests simulate something other than the
    device: adjust the stand-in. Dry, the same checks run against the stand-in itself.
    """
    import subprocess

    if c.dry:
        from npydask.testing import strict_cupy

        with strict_cupy.installed() as sim:
            differ, n = _agreement(sim.cupy, sim.kvikio, c.work)
        separate = "False"
    else:
        import cupy
        import kvikio

        differ, n = _agreement(cupy, kvikio, c.work)
        code = "import sys, kvikio; print('kvikio.defaults' in sys.modules)"
        separate = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    if separate != "False":
        differ.append(f"import kvikio imports kvikio.defaults ({separate!r})")
    if differ:
        raise AssertionError("the stand-in differs: " + "; ".join(differ))
    return f"CuPy and kvikio agree with the strict stand-in on {n + 1} checks"


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
    "torch_patches_gpu": probe_torch_patches_gpu,
    "to_npy_device": probe_to_npy_of_device_array,
    "kvikio_errors": probe_kvikio_errors,
    "read_routes": probe_read_routes,
    "pinned_ring": probe_pinned_ring,
    "nvrtc_check": probe_nvrtc_check,
    "dask_cuda": probe_dask_cuda,
    "gpu_examples": probe_gpu_examples,
    "strict_cupy_agrees": probe_strict_cupy_agrees,
}

KNOWN: dict[str, tuple[str, str]] = {}
"""Probe name -> (text in the error, finding): a failure matching it is XFAIL until the fix lands."""


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError(f"probe still running after {PROBE_SECONDS} s")


def run(names: list[str], ctx: Context) -> tuple[int, int]:
    """Run the probes; print one line each; return how many FAILed and how many were skipped."""
    failed = skipped = 0
    tag = " (dry: numpy stands in for CuPy)" if ctx.dry else ""
    signal.signal(signal.SIGALRM, _alarm)
    for name in names:
        t0 = time.perf_counter()
        signal.alarm(PROBE_SECONDS)
        try:
            detail = PROBES[name](ctx)
            status = "PASS"
        except Skipped as e:
            detail, status = f"skipped: {e}", "SKIP"
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
        skipped += status == "SKIP"
        print(f"{status} {name}{tag}: {detail} ({time.perf_counter() - t0:.2f} s)", flush=True)
    return failed, skipped


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
    failed, skipped = run(names, ctx)
    ran = len(names) - skipped
    print(
        f"{'FAIL' if failed else 'PASS'} probes: {ran - failed} of {ran} passed or XFAIL"
        + (f", {skipped} skipped (an optional package is not installed)" if skipped else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
