"""PyTorch adapters over an :class:`~npydask.dataset.npy_dataset.NpyDataset`: iterable and map-style.

``import npydask`` never imports torch; this module does (install the extra
with ``pip install 'npydask[torch]'``).

:class:`NpyIterableDataset` plans each epoch itself (shuffle, ranks,
workers); :class:`NpyMapDataset` leaves the order to DataLoader's samplers
(``shuffle=True``, ``WeightedRandomSampler``, ``DistributedSampler``) and
reads each batch of indices with one call (``__getitems__``). An
``NpyDataset`` itself yields lazy dask arrays and is refused by a
DataLoader with an error naming both adapters.

Work is split twice, both as contiguous ranges of each epoch's order (the
order :mod:`npydask.plan.sampling` gives: shuffled by ``(seed, epoch)`` only, so
every process agrees): first by ``torch.distributed`` rank and world size
when a process group is initialised (or by explicit ``rank``/``world_size``),
then by DataLoader worker. Every sample is read exactly once per epoch
across all ranks and workers.

With a patch ``sampler=`` (:mod:`npydask.samplers`) samples are boxes, and
:class:`NpyIterableDataset` deals whole batches instead: global batch ``g``
of ``batch_size`` positions goes to rank ``g mod S``, and a rank's batches
to its workers in turn, the order in which the DataLoader returns them; a
one-position state (``state_dict(batches_seen)``) resumes at another world
size, worker count or batch size. :class:`NpyMapDataset` draws index
``i``'s box from ``(seed, epoch, i)`` and leaves order and split to the
DataLoader's sampler. Both give each sample's ``"file"`` and TorchIO's
``"location"`` (start, then stop) with ``with_index=True``.

Tensors are made without extra copies: samples are read in small groups by
npydask's stacked reader into fresh, writable, native-order arrays and
handed over with ``torch.from_numpy`` (CuPy arrays through DLPack).

Forked DataLoader workers are safe for local files: reading uses plain
system calls in the worker process; no dask scheduler, thread pool or
client is created before or after the fork. (``multiprocessing_context="spawn"``
works too.) Over object-store URLs they are not: obstore, which reads them,
hangs in a child forked from a process that used it (opening the dataset
did), so a forked worker raises a ``RuntimeError`` before its first read,
naming ``multiprocessing_context="spawn"`` and ``"forkserver"``, which work.

With ``device="gpu"`` a forked worker can use CUDA only if the parent has
not (CUDA does not survive a fork; the adapters' own check at construction
initialises nothing). A worker forked after the parent used CUDA (through
npydask, or PyTorch: ``model.cuda()``, or receiving a worker's CUDA tensors)
raises :class:`~npydask.errors.GpuUnavailableError` before its first read,
naming ``num_workers=0`` (device reads are asynchronous on kvikio's threads
already) and ``multiprocessing_context="spawn"``. Use ``pin_memory=False``
with ``device="gpu"``: the tensors are on the device already, and pinning a
CUDA tensor raises. A CUDA tensor is made with ``torch.from_dlpack`` in the
thread that read it, which orders PyTorch's current stream after CuPy's.

Like ``DistributedSampler``, call :meth:`NpyIterableDataset.set_epoch`
before each epoch to get a new shuffle. The epoch lives in shared memory
(a ``multiprocessing`` value made with the dataset and inherited by every
worker, forked or spawned), so it reaches persistent workers
(``persistent_workers=True``) too. Without ``set_epoch`` every epoch reads
epoch 0's order.

Samples of every ndim (0 included: a scalar per file) and every dtype torch
holds come back as ``numpy.load`` gives them, in native byte order; dtypes
torch cannot hold (bytes, str, void and structured, datetime64,
timedelta64, longdouble) are refused with a ``TypeError`` when the adapter
is made.
"""

from __future__ import annotations

from npydask.errors import install_hint, missing

try:
    import torch  # noqa: F401 - (the check: the modules below import it)
    import torch.utils.data  # noqa: F401
except ImportError as e:  # (names the extra, as npydask.ray.datasource, to_zarr and device="gpu" do)
    if isinstance(e, ModuleNotFoundError) and (e.name or "torch").split(".")[0] == "torch":
        raise ModuleNotFoundError(
            missing("torch", "npydask.torch") + " (or see pytorch.org for a build matching your CUDA version)",
            name="torch",
        ) from e
    raise ImportError(f"npydask.torch: PyTorch is installed but fails to import ({e}); {install_hint('torch')}") from e

from npydask.torch._common import check_torch_dtype
from npydask.torch._iterable import NpyIterableDataset, split_for
from npydask.torch._map import NpyMapDataset

__all__ = ["NpyIterableDataset", "NpyMapDataset", "check_torch_dtype", "split_for"]
