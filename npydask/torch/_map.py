"""The map-style adapter: :class:`NpyMapDataset` leaves the order to DataLoader's samplers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from npydask.dataset.multikey import pick
from npydask.dataset.npy_dataset import file_index
from npydask.gpu import check_cuda_fork
from npydask.loader import check_process
from npydask.plan.sampling import check_int
from npydask.samplers import Sampler, read_patches
from npydask.torch._common import SharedPass, check_dataset, file_samples, first_views, patch_samples

__all__ = ["NpyMapDataset"]


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

    With a patch ``sampler`` index ``i`` is position ``i`` of the epoch: the
    box the sampler draws from ``(seed, epoch, i)`` (without its own
    shuffle: the DataLoader's sampler orders and splits the positions), so
    call :meth:`set_epoch` before each epoch for new draws. There is no
    resume state: the order and the rank split come from the DataLoader's
    sampler, so exactly-once resume (:meth:`NpyIterableDataset.state_dict`)
    does not apply.

    Parameters
    ----------
    dataset : NpyDataset, MultiKeyDataset or ZippedDataset
        The files (after ROI); with ``key=[...]`` members, each sample is a
        dict of tensors; a :func:`~npydask.zip_datasets` pair needs a
        ``sampler`` (each sample a dict of the same box of every member).
    sampler : npydask.samplers.Sampler, optional
        Read patches instead of whole files; ``len()`` is then the sampler's
        samples per epoch.
    seed : int, optional
        The sampler's seed (``None`` is a fixed default, so all ranks agree).
    device : {"cpu", "gpu"}
        CPU tensors, or CUDA tensors read through CuPy (``npydask[gpu-cu12]``
        or ``npydask[gpu-cu13]``); then use ``num_workers=0`` (or spawned
        workers) and ``pin_memory=False``.
    with_index : bool
        Give ``(sample, index)`` pairs (a DataLoader batches them into a
        batch and a tensor of indices); with a ``sampler`` the index is
        ``{"file": int64, "location": int64 (2 * ndim,)}`` as
        :class:`NpyIterableDataset` gives it.

    Raises
    ------
    TypeError
        A dtype torch cannot hold (see :func:`check_torch_dtype`), or a
        ``sampler`` that is not one of :mod:`npydask.samplers`.
    ValueError
        A ``seed`` without a ``sampler``.
    RoiError
        A file the sampler's patch does not fit (``policy="inside"``).

    Notes
    -----
    A :class:`~npydask.samplers.Foreground` sampler finds each label file's
    candidates once per process; DataLoader workers are processes, started
    again each epoch unless ``persistent_workers=True``. Give it ``index=``
    (a file that every worker and rank reuses) or keep the workers
    persistent, so labels are not read again each epoch.

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

    Patches, three per file, shuffled by the DataLoader:

    >>> from npydask.samplers import Uniform
    >>> root = tempfile.mkdtemp(); np.save(os.path.join(root, "v.npy"), np.zeros((2, 16, 16), "f4"))
    >>> patches = NpyMapDataset(npydask.open_dataset(root), sampler=Uniform((8, 8), per_file=3))
    >>> len(patches), [tuple(b.shape) for b in torch.utils.data.DataLoader(patches, batch_size=2, shuffle=True)]
    (3, [(2, 2, 8, 8), (1, 2, 8, 8)])
    """

    def __init__(
        self,
        dataset: Any,
        *,
        sampler: Sampler | None = None,
        seed: int | None = None,
        device: str = "cpu",
        with_index: bool = False,
    ) -> None:
        self.bound = check_dataset(dataset, "NpyMapDataset", device, sampler)
        if self.bound is None and seed is not None:
            raise ValueError(
                "NpyMapDataset takes a seed only with a sampler (it seeds the boxes drawn); without one the "
                "DataLoader's sampler (its generator=) decides the order"
            )
        self.dataset = dataset
        self.sampler = sampler
        self.seed = None if seed is None else check_int("seed", seed, 0)
        self.device = device
        self.with_index = bool(with_index)
        self._pass = SharedPass()

    @property
    def epoch(self) -> int:
        """The epoch whose draws the sampler gives (in every DataLoader worker)."""
        return self._pass.epoch

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s boxes from now on (call it before each epoch; shared with DataLoader workers).

        Without a sampler the samples are whole files and do not change.
        """
        self._pass.set(check_int("epoch", epoch, 0))

    def __len__(self) -> int:
        return len(self.dataset) if self.bound is None else len(self.bound)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, read by one call (DataLoader calls this once per batch)."""
        picks = [self._index(i) for i in indices]
        check_process(first_views(self.dataset))
        if self.device == "gpu":
            check_cuda_fork()
        if not picks:
            return []
        if self.bound is not None:
            patches = self.bound.patches(self.epoch, picks, seed=self.seed)
            got = read_patches(self.dataset, patches, self.bound, device=self.device)
            return patch_samples(got, self.with_index)
        tensors = file_samples(pick(self.dataset, picks), self.device)
        return list(zip(tensors, picks)) if self.with_index else tensors

    def _index(self, i: Any) -> int:
        return file_index(i, len(self), "NpyMapDataset indices are integers")
