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

import multiprocessing
import multiprocessing.context
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from npydask.errors import install_hint, missing

try:
    import torch
    import torch.utils.data
except ImportError as e:  # (names the extra, as npydask.ray.datasource, to_zarr and device="gpu" do)
    if isinstance(e, ModuleNotFoundError) and (e.name or "torch").split(".")[0] == "torch":
        raise ModuleNotFoundError(
            missing("torch", "npydask.torch") + " (or see pytorch.org for a build matching your CUDA version)",
            name="torch",
        ) from e
    raise ImportError(
        f"npydask.torch: PyTorch is installed but fails to import ({e}); {install_hint('torch')}"
    ) from e

from npydask.dataset.multikey import MultiKeyDataset, pick
from npydask.dataset.npy_dataset import file_index
from npydask.dataset.stacking import joined_dtype
from npydask.gpu import check_cuda_fork
from npydask.loader import check_process, read_batch, warn_if_resharded
from npydask.plan.sampling import check_int, epoch_order

__all__ = ["NpyIterableDataset", "NpyMapDataset", "check_torch_dtype", "split_for"]

_HINTS = {
    "M": 'batch.view("int64") (the ticks of its unit)',
    "m": 'batch.view("int64") (the ticks of its unit)',
    "f": 'batch.astype("float64")',
    "c": 'batch.astype("complex128")',
    "S": "a numeric encoding of the values (torch has no string tensors)",
    "U": "a numeric encoding of the values (torch has no string tensors)",
    "V": 'batch[name] for each field (or batch.view("uint8") for raw bytes)',
}


def split_for(n: int, rank: int, world_size: int, worker: int, num_workers: int) -> range:
    """Positions of an epoch's order that worker ``worker`` of rank ``rank`` reads.

    The rank's contiguous range (as DALI shards), then the worker's
    contiguous part of it; ranks or workers beyond the samples get none.

    Examples
    --------
    >>> [list(split_for(10, r, 2, w, 2)) for r in range(2) for w in range(2)]
    [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    >>> list(split_for(3, 0, 1, 0, 4))  # more workers than samples: some get none
    []
    """
    mine = range(n * rank // world_size, n * (rank + 1) // world_size)
    k = len(mine)
    return mine[k * worker // num_workers : k * (worker + 1) // num_workers]


def check_torch_dtype(dataset: Any) -> None:
    """Refuse a dataset whose dtype torch tensors cannot hold, naming the dtype and a way around.

    torch holds bool, signed and unsigned 8-64 bit integers, float16/32/64
    and complex64/128 (asked of torch itself, so a newer torch may hold
    more); samples come back in native byte order, so either byte order
    works.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> np.save(os.path.join(root, "a.npy"), np.array(["x"]))
    >>> check_torch_dtype(npydask.open_dataset(root))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: torch tensors cannot hold dtype str32 (<U1) of .../a.npy: ...
    """
    if not len(dataset):
        return
    dtype = dataset.dtype
    try:
        torch.from_numpy(np.empty((0,), joined_dtype(dtype)))
    except TypeError:
        pass
    else:
        return
    name = f"structured {dtype}" if dtype.fields is not None else f"{dtype.name} ({dtype.str})"
    hint = _HINTS.get(dtype.kind, "a dtype torch holds")
    raise TypeError(
        f"torch tensors cannot hold dtype {name} of {dataset.files[0]}: they hold bool, (u)int8-64, "
        f"float16/32/64 and complex64/128. Read NumPy batches with npydask.Loader(ds, batch_size) and "
        f"convert each, e.g. {hint}, or save the files in a dtype torch holds"
    )


class _SharedEpoch:
    """An epoch number in shared memory: set in the main process, read by every DataLoader worker.

    Made with the dataset, so forked workers inherit it and spawned ones
    receive it while they start (``multiprocessing`` shares the memory then).
    A copy pickled at any other time (``pickle``, ``copy.deepcopy``) carries
    the current number in a memory of its own.
    """

    __slots__ = ("_value",)

    def __init__(self, epoch: int = 0) -> None:
        self._value = multiprocessing.RawValue("q", epoch)

    @property
    def value(self) -> int:
        return int(self._value.value)

    @value.setter
    def value(self, epoch: int) -> None:
        self._value.value = epoch

    def __reduce__(self) -> tuple[Any, ...]:
        if multiprocessing.context.get_spawning_popen() is not None:  # a worker starting: share
            return (_shared_epoch, (self._value,))
        return (_SharedEpoch, (self.value,))


def _shared_epoch(value: Any) -> _SharedEpoch:
    shared = _SharedEpoch.__new__(_SharedEpoch)
    shared._value = value
    return shared


def _samples(picked: Any, device: str) -> list[Any]:
    """Each picked sample as a tensor, or a dict of tensors per ``.npz`` member.

    ``picked`` is what :func:`npydask.dataset.multikey.pick` returns.
    """
    if isinstance(picked, dict):
        columns = {k: _arrays(views, device) for k, views in picked.items()}
        n = len(next(iter(columns.values())))
        return [{k: _tensor(c[j]) for k, c in columns.items()} for j in range(n)]
    return [_tensor(a) for a in _arrays(picked, device)]


def _arrays(views: Sequence[Any], device: str) -> list[Any]:
    """Each view read in full by one call: native-order, writable arrays (0-d ones included)."""
    batch = read_batch(views, device)
    if isinstance(batch, list):
        return batch
    return [batch[j, ...] for j in range(len(views))]  # `...` keeps 0-d samples arrays, not scalars


def _tensor(a: Any) -> torch.Tensor:
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)  # writable and native-order: no copy, no warning
    return torch.from_dlpack(a)  # CuPy, on the device


def _check_dataset(dataset: Any, adapter: str, device: str) -> None:
    from npydask.array import check_device
    from npydask.dataset.npy_dataset import NpyDataset

    if isinstance(dataset, MultiKeyDataset):
        check_device(device)
        for member in dataset.members.values():
            check_torch_dtype(member)
        return
    if not isinstance(dataset, NpyDataset):
        raise TypeError(f"{adapter} reads an NpyDataset (npydask.open_dataset), found {type(dataset).__name__}")
    check_device(device)
    check_torch_dtype(dataset)


class NpyIterableDataset(torch.utils.data.IterableDataset):
    """Samples of an :class:`~npydask.dataset.npy_dataset.NpyDataset` as tensors, split by rank and DataLoader worker.

    Parameters
    ----------
    dataset : NpyDataset or MultiKeyDataset
        The files (after ROI); with ``key=[...]`` members, each sample is a
        dict of tensors (DataLoader's default collate batches it to a dict).
    shuffle : bool
        Permute the whole list each epoch with a generator seeded only by
        ``(seed, epoch)``.
    seed : int, optional
        ``None`` is a fixed default, so all ranks agree.
    rank, world_size : int, optional
        This process's share; by default ``torch.distributed``'s rank and
        world size when a process group is initialised, else 0 and 1.
    device : {"cpu", "gpu"}
        CPU tensors, or CUDA tensors read through CuPy (``npydask[gpu-cu12]``
        or ``npydask[gpu-cu13]``); then use ``num_workers=0`` (or spawned
        workers) and ``pin_memory=False``.
    with_index : bool
        Yield ``(tensor, index)`` pairs, the index into ``dataset``.
    read_size : int
        Samples read together by one call (one tight loop over their files).

    Raises
    ------
    TypeError
        A dtype torch cannot hold (see :func:`check_torch_dtype`).

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os, torch
    >>> from npydask.torch import NpyIterableDataset
    >>> root = tempfile.mkdtemp()
    >>> for i in range(6): np.save(os.path.join(root, f"{i}.npy"), np.full((2,), i, "f4"))
    >>> loader = torch.utils.data.DataLoader(NpyIterableDataset(npydask.open_dataset(root)), batch_size=4)
    >>> [b[:, 0].tolist() for b in loader]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    """

    def __init__(
        self,
        dataset: Any,
        *,
        shuffle: bool = False,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        device: str = "cpu",
        with_index: bool = False,
        read_size: int = 16,
    ) -> None:
        _check_dataset(dataset, "NpyIterableDataset", device)
        if (rank is None) != (world_size is None):
            raise ValueError("give rank and world_size together, or neither (to use torch.distributed's)")
        if rank is not None:
            world_size = check_int("world_size", world_size, 1)
            rank = check_int("rank", rank, 0)
            if rank >= world_size:
                raise ValueError(f"rank must be in [0, world_size), found rank={rank} world_size={world_size}")
        if seed is not None:
            seed = check_int("seed", seed, 0)
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.with_index = bool(with_index)
        self.read_size = check_int("read_size", read_size, 1)
        self._epoch = _SharedEpoch()
        share = self._share()
        warn_if_resharded(dataset, share[0], share[1], f"NpyIterableDataset (rank {share[0]} of {share[1]})")

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration reads (in every DataLoader worker)."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s shuffle in the next iteration (call it before each epoch).

        The number is kept in shared memory, so DataLoader workers started
        before the call (``persistent_workers=True``) read it too.
        """
        self._epoch.value = check_int("epoch", epoch, 0)

    def _share(self) -> tuple[int, int]:
        if self.rank is not None:
            return self.rank, int(self.world_size)  # type: ignore[arg-type]
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def indices(self) -> np.ndarray:
        """The dataset indices this process (and DataLoader worker, when in one) reads this epoch."""
        n = len(self.dataset)
        order = epoch_order(n, self.epoch, shuffle=self.shuffle, seed=self.seed)
        rank, world = self._share()
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        share = split_for(n, rank, world, worker, workers)
        return order[share.start : share.stop]

    def __len__(self) -> int:
        """Samples this rank reads per epoch (all its DataLoader workers together)."""
        rank, world = self._share()
        return len(split_for(len(self.dataset), rank, world, 0, 1))

    def __iter__(self) -> Iterator[Any]:
        dataset = self.dataset
        check_process(pick(dataset, [0]))  # (a forked DataLoader worker over URLs: a clear error, not a hang)
        if self.device == "gpu":
            check_cuda_fork()  # (a worker forked after the parent used CUDA: a clear error, not CUDA's)
        mine = self.indices().tolist()
        for at in range(0, len(mine), self.read_size):
            part = mine[at : at + self.read_size]
            for i, sample in zip(part, _samples(pick(dataset, part), self.device)):
                yield (sample, i) if self.with_index else sample


class NpyMapDataset(torch.utils.data.Dataset):
    """Samples of an :class:`~npydask.dataset.npy_dataset.NpyDataset` by index, for DataLoader's samplers.

    ``shuffle=True``, ``WeightedRandomSampler`` and ``DistributedSampler``
    pick the indices; a DataLoader with a ``batch_size`` hands each batch's
    indices to :meth:`__getitems__`, which reads them with one call (the
    loader's tight per-file loop), in the main process or a worker. As with
    :class:`NpyIterableDataset`, reading uses plain system calls, so forked
    workers are safe for local files (over URLs use ``"spawn"`` or
    ``"forkserver"`` workers, and with ``device="gpu"`` ``num_workers=0``
    or ``"spawn"``, as for :class:`NpyIterableDataset`).

    Parameters
    ----------
    dataset : NpyDataset or MultiKeyDataset
        The files (after ROI); with ``key=[...]`` members, each sample is a
        dict of tensors.
    device : {"cpu", "gpu"}
        CPU tensors, or CUDA tensors read through CuPy (``npydask[gpu-cu12]``
        or ``npydask[gpu-cu13]``); then use ``num_workers=0`` (or spawned
        workers) and ``pin_memory=False``.
    with_index : bool
        Give ``(tensor, index)`` pairs (a DataLoader batches them into a
        batch and a tensor of indices).

    Raises
    ------
    TypeError
        A dtype torch cannot hold (see :func:`check_torch_dtype`).

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os, torch
    >>> from npydask.torch import NpyMapDataset
    >>> root = tempfile.mkdtemp()
    >>> for i in range(6): np.save(os.path.join(root, f"{i}.npy"), np.float32(i))
    >>> ds = NpyMapDataset(npydask.open_dataset(root))
    >>> len(ds), ds[4]
    (6, tensor(4.))
    >>> sorted(torch.cat(list(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True))).tolist())
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    """

    def __init__(self, dataset: Any, *, device: str = "cpu", with_index: bool = False) -> None:
        _check_dataset(dataset, "NpyMapDataset", device)
        self.dataset = dataset
        self.device = device
        self.with_index = bool(with_index)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, read by one call (DataLoader calls this once per batch)."""
        picks = [self._index(i) for i in indices]
        check_process(pick(self.dataset, picks[:1]))
        if self.device == "gpu":
            check_cuda_fork()
        tensors = _samples(pick(self.dataset, picks), self.device) if picks else []
        return list(zip(tensors, picks)) if self.with_index else tensors

    def _index(self, i: Any) -> int:
        return file_index(i, len(self.dataset), "NpyMapDataset indices are integers")
