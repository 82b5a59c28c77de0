"""The iterable adapter: :class:`NpyIterableDataset` plans each epoch itself (shuffle, ranks, workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from npydask.dataset.multikey import pick
from npydask.gpu import check_cuda_fork
from npydask.loader import check_process, dataset_fingerprint, warn_if_resharded
from npydask.plan.deal import Deal
from npydask.plan.resume import ResumeState
from npydask.plan.sampling import check_int, check_shuffle, epoch_order
from npydask.samplers import Sampler, read_patches
from npydask.samplers.schedule import unit_size
from npydask.torch._common import SharedPass, check_dataset, file_samples, first_views, patch_samples

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
    """Samples of an :class:`~npydask.dataset.npy_dataset.NpyDataset` as tensors, split by rank and DataLoader worker.

    Parameters
    ----------
    dataset : NpyDataset, MultiKeyDataset or ZippedDataset
        The files (after ROI); with ``key=[...]`` members, each sample is a
        dict of tensors (DataLoader's default collate batches it to a dict).
        A :func:`~npydask.zip_datasets` pair (``{"image": ..., "label": ...}``)
        is read with a ``sampler``, the same box of every member, each
        sample a dict of tensors.
    sampler : npydask.samplers.Sampler, optional
        Read patches instead of whole files: each epoch's samples are the
        sampler's boxes (``Uniform``, ``Foreground``, ``Grid``), dealt as
        whole batches to ranks and workers (see below).
    batch_size : int
        With a ``sampler``: the DataLoader's ``batch_size``, which this
        dataset must know to deal whole batches (give both the same value).
        Without one it must stay 1 (give the DataLoader its ``batch_size``).
    drop_last : bool
        With a ``sampler``: drop the epoch's short last batch (the same
        value as the DataLoader's ``drop_last``).
    shuffle : bool or "shard"
        ``True``: permute the whole list each epoch with a generator seeded
        only by ``(seed, epoch)``; with a ``sampler``, permute its units (a
        file's ``per_file`` patches stay adjacent; ``Grid`` ignores it).
        ``"shard"`` (without a sampler): permute only inside the rank's own
        range, as :class:`~npydask.Loader`'s ``shuffle="shard"``, so a rank
        reads the same files every epoch, in a new order.
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
        Yield ``(sample, index)`` pairs: the index into ``dataset``, or with a
        ``sampler`` a dict ``{"file": int64, "location": int64 (2 * ndim,)}``
        (the box's start, then its stop, as TorchIO's ``"location"``), which
        the DataLoader collates to ``(B,)`` and ``(B, 2 * ndim)`` tensors and
        :meth:`Stitcher.add <npydask.samplers.Stitcher.add>` takes as it is.
    read_size : int
        Samples read together by one call (one tight loop over their files);
        with a ``sampler`` each batch is read together instead.
    interleave : int
        With a ``sampler`` of ``per_file`` patches: mix each block of
        ``interleave`` files' patches, one of each file in turn (see Notes).

    Raises
    ------
    TypeError
        A dtype torch cannot hold (see :func:`check_torch_dtype`), or a
        ``sampler`` that is not one of :mod:`npydask.samplers`.
    ValueError
        ``batch_size`` or ``drop_last`` without a ``sampler``.
    RoiError
        A file the sampler's patch does not fit (``policy="inside"``).

    Notes
    -----
    **With a sampler** an epoch is ``len(sampler.bind(dataset))`` positions,
    each a ``(file, box)`` drawn from ``(seed, epoch, position)`` alone.
    Global batch ``g`` holds positions ``[g*B, (g+1)*B)``; rank ``k`` of
    ``S`` takes global batches ``k, k+S, ...`` and its DataLoader worker
    ``w`` of ``W`` that rank's batches ``w, w+W, ...``, which the DataLoader
    (``in_order=True``, its default) returns in order: each rank's training
    loop receives its batches ``0, 1, 2, ...`` whatever ``W``. A worker reads
    each batch's patches together and yields its samples one by one, so the
    DataLoader's collation rebuilds that batch; ``len()`` is this rank's
    samples per epoch, so ``len(DataLoader(ds, batch_size=B))`` is the
    rank's batches per epoch. With one rank only the epoch's last batch is
    short (dropped with ``drop_last``). With ``world_size > 1`` every rank
    gets the same number of full batches, so a DDP loop never waits for a
    rank that ran out: the last round of global batches is completed with
    positions from the epoch's start (those samples are delivered twice in
    that epoch, as ``DistributedSampler`` pads), or dropped with
    ``drop_last=True``.

    ``interleave=m`` (with ``Uniform`` or ``Foreground`` of ``per_file``
    patches) reads each block of ``m`` files' patches one patch of each file
    in turn, so a batch mixes up to ``m`` files; as the Loader's keyword.

    A :class:`~npydask.samplers.Foreground` sampler finds each label file's
    candidates once per process; DataLoader workers are processes, started
    again each epoch unless ``persistent_workers=True``. Give it ``index=``
    (a file that every worker and rank reuses) or keep the workers
    persistent, so labels are not read again each epoch.

    :meth:`state_dict` ``(batches_seen)`` gives the resume state after the
    training loop took ``batches_seen`` batches of the current pass (the
    same on every rank); :meth:`load_state_dict` accepts another world
    size, worker count or batch size and delivers each remaining sample of
    the epoch once. Call ``set_epoch(e)`` before each epoch as usual: after
    ``load_state_dict`` the first ``set_epoch`` of the state's epoch keeps
    its position, so ``for e in range(state["epoch"], epochs):
    ds.set_epoch(e)`` resumes where the state was taken.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os, torch
    >>> from npydask.torch import NpyIterableDataset
    >>> root = tempfile.mkdtemp()
    >>> for i in range(6): np.save(os.path.join(root, f"{i}.npy"), np.full((2,), i, "f4"))
    >>> loader = torch.utils.data.DataLoader(NpyIterableDataset(npydask.open_dataset(root)), batch_size=4)
    >>> [b[:, 0].tolist() for b in loader]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]

    Random 4 x 4 patches, two per file, in batches of 3, with their boxes:

    >>> from npydask.samplers import Uniform
    >>> root = tempfile.mkdtemp()
    >>> for i in range(2): np.save(os.path.join(root, f"{i}.npy"), np.arange(64.0).reshape(8, 8) + i)
    >>> ds = NpyIterableDataset(npydask.open_dataset(root), sampler=Uniform((4, 4), per_file=2),
    ...                         batch_size=3, with_index=True)
    >>> [(tuple(b.shape), ix["location"].shape) for b, ix in torch.utils.data.DataLoader(ds, batch_size=3)]
    [((3, 4, 4), torch.Size([3, 4])), ((1, 4, 4), torch.Size([1, 4]))]
    """

    def __init__(
        self,
        dataset: Any,
        *,
        sampler: Sampler | None = None,
        batch_size: int = 1,
        drop_last: bool = False,
        shuffle: bool | str = False,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        device: str = "cpu",
        with_index: bool = False,
        read_size: int = 16,
        interleave: int = 1,
    ) -> None:
        bound = check_dataset(dataset, "NpyIterableDataset", device, sampler)
        batch_size = check_int("batch_size", batch_size, 1)
        if bound is None and (batch_size != 1 or drop_last):
            raise ValueError(
                f"NpyIterableDataset takes batch_size={batch_size} and drop_last={drop_last!r} only with a sampler "
                "(it deals whole batches of patches to workers then); without one give them to the DataLoader"
            )
        if (rank is None) != (world_size is None):
            raise ValueError("give rank and world_size together, or neither (to use torch.distributed's)")
        if rank is not None:
            world_size = check_int("world_size", world_size, 1)
            rank = check_int("rank", rank, 0)
            if rank >= world_size:
                raise ValueError(f"rank must be in [0, world_size), found rank={rank} world_size={world_size}")
        if seed is not None:
            seed = check_int("seed", seed, 0)
        shuffle = check_shuffle(shuffle, what="NpyIterableDataset", sampler=bound is not None)
        if bound is None and check_int("interleave", interleave, 1) > 1:
            raise ValueError(
                f"NpyIterableDataset takes interleave={interleave} only with a sampler (it mixes the patches of "
                "several files); leave interleave=1 without one"
            )
        self.per_file, self.interleave = (1, 1) if bound is None else unit_size(bound, interleave)
        self.dataset = dataset
        self.sampler = sampler
        self.bound = bound
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.with_index = bool(with_index)
        self.read_size = check_int("read_size", read_size, 1)
        self._pass = SharedPass()
        self._fingerprint: dict[str, str] | None = None  # the dataset's, computed once, when a state is first asked for
        share = self._share()
        warn_if_resharded(dataset, share[0], share[1], f"NpyIterableDataset (rank {share[0]} of {share[1]})")

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration reads (in every DataLoader worker)."""
        return self._pass.epoch

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s shuffle (and draws) in the next iteration (call it before each epoch).

        The number is kept in shared memory, so DataLoader workers started
        before the call (``persistent_workers=True``) read it too. After
        :meth:`load_state_dict`, the first call with the state's epoch keeps
        the state's position; any other epoch starts at its beginning.
        """
        self._pass.set_epoch(check_int("epoch", epoch, 0))

    def _share(self) -> tuple[int, int]:
        if self.rank is not None:
            return self.rank, int(self.world_size)  # type: ignore[arg-type]
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        # a spawned (or forkserver) DataLoader worker has no process group: the share its parent saw
        return self.__dict__.get("_parent_share", (0, 1))

    def __getstate__(self) -> dict[str, Any]:
        """The attributes, with this process's rank and world size when ``torch.distributed`` gives them.

        A spawned DataLoader worker unpickles the dataset in a process that
        has no process group; without them it would read rank 0 of 1's share.
        """
        state = self.__dict__.copy()
        if self.rank is None:
            state["_parent_share"] = self._share()
        return state

    @staticmethod
    def _worker() -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)

    def indices(self) -> np.ndarray:
        """The dataset indices (with a sampler: the positions) this process and DataLoader worker read this epoch."""
        if self.bound is not None:
            batches = self._deal(self._pass.start).worker_batches(*self._worker())
            return np.concatenate(batches) if batches else np.empty(0, np.int64)
        n = len(self.dataset)
        rank, world = self._share()
        within = split_for(n, rank, world, 0, 1)  # the rank's range: "shard" permutes only inside it
        order = epoch_order(n, self.epoch, shuffle=self.shuffle, seed=self.seed, within=within)
        share = split_for(n, rank, world, *self._worker())
        return order[share.start : share.stop]

    def _deal(self, start: int) -> Deal:
        rank, world = self._share()
        assert self.bound is not None
        return Deal(
            len(self.bound), self.batch_size, rank, world, start, self.drop_last, self.per_file, self.interleave
        )

    def __len__(self) -> int:
        """Samples this rank yields per epoch, all its DataLoader workers together (a whole epoch with a sampler).

        What PyTorch's DataLoader asks of an iterable dataset: it reports
        ``len(dataset) / batch_size`` batches (rounded by its ``drop_last``),
        whatever its ``num_workers``. With a sampler and the same
        ``batch_size``, ``len(DataLoader)`` is then the batches this rank's
        loop receives per epoch, the same on every rank when ``world_size >
        1`` (each rank's batches are full, the last round wrapped).
        """
        if self.bound is not None:
            return self._deal(0).samples
        rank, world = self._share()
        return len(split_for(len(self.dataset), rank, world, 0, 1))

    def __iter__(self) -> Iterator[Any]:
        dataset = self.dataset
        check_process(first_views(dataset))  # (a forked DataLoader worker over URLs: a clear error, not a hang)
        if self.device == "gpu":
            check_cuda_fork()  # (a worker forked after the parent used CUDA: a clear error, not CUDA's)
        if self.bound is not None:
            yield from self._patches()
            return
        mine = self.indices().tolist()
        for at in range(0, len(mine), self.read_size):
            part = mine[at : at + self.read_size]
            for i, sample in zip(part, file_samples(pick(dataset, part), self.device)):
                yield (sample, i) if self.with_index else sample

    def _patches(self) -> Iterator[Any]:
        """This worker's samples, read batch by batch (no look-ahead window: the DataLoader's workers read ahead)."""
        bound = self.bound
        assert bound is not None
        epoch = self._pass.epoch
        for positions in self._deal(self._pass.start).each(*self._worker()):
            patches = bound.patches(epoch, positions.tolist(), seed=self.seed, shuffle=bool(self.shuffle))
            got = read_patches(self.dataset, patches, bound, device=self.device)
            yield from patch_samples(got, self.with_index)

    def _begun(self) -> ResumeState:
        """The current pass as a state at its start ``P0``, with what must agree to resume it."""
        bound = self.bound
        if bound is None:
            raise ValueError(
                "NpyIterableDataset keeps a resume state only with a sampler (sampler=...); without one, restart "
                "the epoch, or use npydask.Loader, whose state_dict() resumes whole-file epochs"
            )
        return ResumeState(
            self._pass.epoch,
            self._pass.start,
            len(bound),
            self.seed,
            bool(self.shuffle) and not bound.shuffle_ignored,
            bound.sampler.fingerprint(),
            self._dataset_fingerprint(),
            self.interleave,
        )

    def _dataset_fingerprint(self) -> dict[str, str]:
        if self._fingerprint is None:
            self._fingerprint = dataset_fingerprint(self.dataset)
        return self._fingerprint

    def state_dict(self, batches_seen: int) -> dict[str, Any]:
        """The resume state after the training loop took ``batches_seen`` batches of the current pass.

        Count the batches this rank's loop received since the pass began
        (since the epoch's ``set_epoch``, or since :meth:`load_state_dict`
        when it resumed one); every rank then records the same state. It
        holds the epoch, the position ``P`` (the positions before it are
        consumed; a state taken after an epoch's last batch is the next
        epoch at position 0), and the seed, shuffle, sampler and dataset
        fingerprints that must agree to resume it: the state
        :meth:`npydask.Loader.state_dict` gives with the same sampler, so
        either resumes the other.

        Raises
        ------
        ValueError
            No ``sampler``, or more batches than this pass holds on a rank.
        """
        begun = self._begun()
        return begun.after(self._deal(begun.position), batches_seen).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s state, with any world size, worker count or ``batch_size``.

        The next pass reads the state's epoch from its position (the next
        epoch from 0 when the state was taken at an epoch's end); the first
        :meth:`set_epoch` of that epoch keeps the position.

        Raises
        ------
        ValueError
            No ``sampler``; not a sampler state; or another dataset,
            sampler, seed or shuffle than the state's (named).
        """
        start = ResumeState.resume(state, self._begun())
        self._pass.set(start.epoch, start.position, pending=True)
