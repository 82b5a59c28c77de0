"""PyTorch adapter: an ``IterableDataset`` over an :class:`~npydask.dataset.NpyDataset`.

``import npydask`` never imports torch; this module does (install the extra
with ``pip install 'npydask[torch]'``).

Work is split twice, both as contiguous ranges of each epoch's order (the
order :mod:`npydask.sampling` gives: shuffled by ``(seed, epoch)`` only, so
every process agrees): first by ``torch.distributed`` rank and world size
when a process group is initialised (or by explicit ``rank``/``world_size``),
then by DataLoader worker. Every sample is read exactly once per epoch
across all ranks and workers.

Tensors are made without extra copies: samples are read in small groups by
npydask's stacked reader into fresh, writable, native-order arrays and
handed over with ``torch.from_numpy`` (CuPy arrays through DLPack).

Forked DataLoader workers are safe: reading uses plain system calls in the
worker process; no dask scheduler, thread pool or client is created before
or after the fork. (``multiprocessing_context="spawn"`` works too.)

Like ``DistributedSampler``, call :meth:`NpyIterableDataset.set_epoch`
before each epoch to get a new shuffle: DataLoader workers iterate copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data

from npydask.loader import read_batch
from npydask.sampling import _check_int, epoch_order

__all__ = ["NpyIterableDataset", "split_for"]


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


class NpyIterableDataset(torch.utils.data.IterableDataset):
    """Samples of an :class:`~npydask.dataset.NpyDataset` as tensors, split by rank and DataLoader worker.

    Parameters
    ----------
    dataset : NpyDataset
        The files (after ROI).
    shuffle : bool
        Permute the whole list each epoch with a generator seeded only by
        ``(seed, epoch)``.
    seed : int, optional
        ``None`` is a fixed default, so all ranks agree.
    rank, world_size : int, optional
        This process's share; by default ``torch.distributed``'s rank and
        world size when a process group is initialised, else 0 and 1.
    device : {"cpu", "gpu"}
        CPU tensors, or CUDA tensors read through CuPy (``npydask[gpu]``).
    with_index : bool
        Yield ``(tensor, index)`` pairs, the index into ``dataset``.
    read_size : int
        Samples read together by one call (one tight loop over their files).

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
        from npydask.array import check_device
        from npydask.dataset import NpyDataset

        if not isinstance(dataset, NpyDataset):
            raise TypeError(f"NpyIterableDataset reads an NpyDataset (npydask.open_dataset), found {type(dataset).__name__}")
        check_device(device)
        if (rank is None) != (world_size is None):
            raise ValueError("give rank and world_size together, or neither (to use torch.distributed's)")
        if rank is not None:
            world_size = _check_int("world_size", world_size, 1)
            rank = _check_int("rank", rank, 0)
            if rank >= world_size:
                raise ValueError(f"rank must be in [0, world_size), found rank={rank} world_size={world_size}")
        if seed is not None:
            seed = _check_int("seed", seed, 0)
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.with_index = bool(with_index)
        self.read_size = _check_int("read_size", read_size, 1)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s shuffle in the next iteration (call it before each epoch)."""
        self.epoch = _check_int("epoch", epoch, 0)

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
        views = self.dataset.views
        mine = self.indices().tolist()
        for at in range(0, len(mine), self.read_size):
            part = mine[at : at + self.read_size]
            batch = read_batch([views[i] for i in part], self.device)
            items = batch if isinstance(batch, list) else [batch[j] for j in range(len(part))]
            for i, item in zip(part, items):
                tensor = self._tensor(item)
                yield (tensor, i) if self.with_index else tensor

    def _tensor(self, a: Any) -> torch.Tensor:
        if isinstance(a, np.ndarray):
            return torch.from_numpy(a)  # writable and native-order: no copy, no warning
        return torch.from_dlpack(a)  # CuPy, on the device
