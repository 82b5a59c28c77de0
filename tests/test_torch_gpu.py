"""The PyTorch adapters with ``device="gpu"`` in DataLoader workers, on the CPU (numpy stands in for CuPy).

A worker forked after its parent used CUDA (through npydask, or through
PyTorch) must fail with npydask's error naming what works, before its first
read, instead of CUDA's "initialization error"; one forked from a parent that
never touched CUDA reads. Real CUDA tensors, ``torch.from_dlpack`` and the
error CUDA itself gives in a forked child only a GPU shows: the device probe
``loader_torch_gpu`` in ``ci/gpu_probes.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import npydask
from npydask.errors import GpuUnavailableError
from npydask.gpu import device as gpu
from npydask.gpu import process as gpu_process
from npydask.torch import NpyIterableDataset, NpyMapDataset  # (imports torch lazily)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings(  # (Python 3.12+ warns on a fork while other threads run)
    "ignore:This process .* is multi-threaded, use of fork:DeprecationWarning"
)


@pytest.fixture
def folder(tmp_path):
    for i in range(12):
        np.save(tmp_path / f"{i:02d}.npy", np.arange(6, dtype="<f4").reshape(2, 3) + 10 * i)
    return tmp_path


@pytest.fixture
def numpy_device(monkeypatch):
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "array_module", lambda: np)
    monkeypatch.setattr(gpu_process, "_CUDA_PID", None)


def _adapters(ds):
    return {"iterable": NpyIterableDataset(ds, device="gpu"), "map": NpyMapDataset(ds, device="gpu")}


def _load(adapter, workers):
    ctx = torch.multiprocessing.get_context("fork") if workers else None
    loader = torch.utils.data.DataLoader(adapter, batch_size=4, num_workers=workers, multiprocessing_context=ctx,
                                         pin_memory=False)  # fmt: skip
    return torch.cat([b.reshape(-1, 6) for b in loader])


@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(120)
def test_workers_forked_from_a_parent_that_never_used_cuda_read(folder, numpy_device, kind, workers):
    ds = npydask.open_dataset(folder)
    got = _load(_adapters(ds)[kind], workers)
    want = np.stack([np.load(f).reshape(-1) for f in ds.files])
    np.testing.assert_array_equal(np.sort(got.numpy(), axis=0), want)


@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("who", ["npydask", "PyTorch"])
@pytest.mark.timeout(120)
def test_a_worker_forked_after_the_parent_used_cuda_names_what_works(folder, numpy_device, monkeypatch, kind, who):
    ds = npydask.open_dataset(folder)
    adapter = _adapters(ds)[kind]
    parent = os.getpid()
    if who == "npydask":
        monkeypatch.setattr(gpu_process, "_CUDA_PID", parent)  # as the parent's first device read records it
    else:
        monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: os.getpid() != parent)
    said = rf"{who} initialised CUDA.*num_workers=0.*multiprocessing_context=\"spawn\""
    with pytest.raises(GpuUnavailableError, match=said):
        _load(adapter, 2)
    assert _load(adapter, 0).shape == (12, 6)  # the parent itself reads on


@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(120)
def test_patches_on_the_device_through_workers(folder, numpy_device, kind, workers):
    from npydask.samplers import Uniform

    ds = npydask.open_dataset(folder)
    sampler = Uniform((2, 2), per_file=2)
    adapter = (
        NpyIterableDataset(ds, sampler=sampler, batch_size=4, device="gpu", with_index=True)
        if kind == "iterable"
        else NpyMapDataset(ds, sampler=sampler, device="gpu", with_index=True)
    )
    ctx = torch.multiprocessing.get_context("fork") if workers else None
    loader = torch.utils.data.DataLoader(adapter, batch_size=4, num_workers=workers, multiprocessing_context=ctx)
    seen = 0
    for batch, index in loader:
        for sample, f, (r0, c0, r1, c1) in zip(batch.numpy(), index["file"].tolist(), index["location"].tolist()):
            np.testing.assert_array_equal(sample, np.load(ds.files[f])[r0:r1, c0:c1])
        seen += len(batch)
    assert seen == 24
    if workers:  # a worker forked after the parent used CUDA names what works, as without a sampler
        gpu_process._CUDA_PID = os.getpid()
        with pytest.raises(GpuUnavailableError, match="num_workers=0"):
            next(iter(loader))
