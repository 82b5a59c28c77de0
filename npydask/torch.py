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

from npydask._optional import install_hint, missing

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
from npydask.dataset.zipped import ZippedDataset
from npydask.gpu import check_cuda_fork
from npydask.loader import check_process, dataset_fingerprint, read_batch, warn_if_resharded
from npydask.plan.deal import Deal
from npydask.plan.resume import ResumeState, check_resumable
from npydask.plan.sampling import check_int, epoch_order
from npydask.samplers import BoundSampler, Sampler, read_patches

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


class _SharedPass:
    """Where the next pass starts, in shared memory: set in the main process, read by every DataLoader worker.

    Three numbers: the epoch, the position ``P`` the pass starts at (0 but
    after ``load_state_dict``), and whether that ``P`` is still pending (kept
    by the first ``set_epoch`` of the same epoch). Made with the dataset, so
    forked workers inherit it and spawned ones receive it while they start
    (``multiprocessing`` shares the memory then). A copy pickled at any other
    time (``pickle``, ``copy.deepcopy``) carries the current numbers in a
    memory of its own.
    """

    __slots__ = ("_values",)

    def __init__(self, epoch: int = 0, start: int = 0, pending: int = 0) -> None:
        self._values = multiprocessing.RawArray("q", [epoch, start, pending])

    @property
    def epoch(self) -> int:
        return int(self._values[0])

    @property
    def start(self) -> int:
        return int(self._values[1])

    @property
    def pending(self) -> bool:
        return bool(self._values[2])

    def set(self, epoch: int, start: int = 0, pending: bool = False) -> None:
        """Set all three (in the main process, between passes)."""
        self._values[0], self._values[1], self._values[2] = epoch, start, int(pending)

    def set_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` from its start, or from the pending ``P`` when it is the state's epoch."""
        keep = self.pending and epoch == self.epoch
        self.set(epoch, self.start if keep else 0)

    def __reduce__(self) -> tuple[Any, ...]:
        if multiprocessing.context.get_spawning_popen() is not None:  # a worker starting: share
            return (_shared_pass, (self._values,))
        return (_SharedPass, (self.epoch, self.start, int(self.pending)))


def _shared_pass(values: Any) -> _SharedPass:
    shared = _SharedPass.__new__(_SharedPass)
    shared._values = values
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


def _check_dataset(dataset: Any, adapter: str, device: str, sampler: Any = None) -> BoundSampler | None:
    """Check what an adapter reads; with a sampler, bind it (from the headers) and return the bound sampler."""
    from npydask.array import check_device
    from npydask.dataset.npy_dataset import NpyDataset

    if sampler is not None and not isinstance(sampler, Sampler):
        raise TypeError(
            f"{adapter}: sampler must be a patch sampler of npydask.samplers (Uniform, Foreground, Grid), found "
            f"{type(sampler).__name__}; to choose indices use a DataLoader sampler with NpyMapDataset instead"
        )
    if isinstance(dataset, ZippedDataset) and sampler is None:
        raise TypeError(
            f"{adapter} reads a ZippedDataset (zip_datasets) only with a sampler= (npydask.samplers), which reads "
            "the same box of every member; without one, give each NpyDataset its own adapter"
        )
    if isinstance(dataset, (MultiKeyDataset, ZippedDataset)):
        check_device(device)
        for member in dataset.members.values():
            check_torch_dtype(member)
    elif not isinstance(dataset, NpyDataset):
        raise TypeError(f"{adapter} reads an NpyDataset (npydask.open_dataset), found {type(dataset).__name__}")
    else:
        check_device(device)
        check_torch_dtype(dataset)
    if sampler is None:
        return None
    return sampler.bind(dataset)


def _first_views(dataset: Any) -> Any:
    """One view of the dataset's first file (of its first member), for :func:`check_process`."""
    if isinstance(dataset, ZippedDataset):
        dataset = next(iter(dataset.members.values()))
    return pick(dataset, [0])


def _patch_samples(got: Any, with_index: bool) -> list[Any]:
    """Each sample of a read batch of patches as a tensor (a dict of them per member), with its index when asked.

    The index of a sample is ``{"file": int64 (), "location": int64 (2 * ndim,)}``,
    ``location`` being the box's start, then its stop (TorchIO's layout).
    """
    batch = got.batch
    if isinstance(batch, dict):
        n = len(next(iter(batch.values())))
        samples: list[Any] = [{k: _tensor(b[j, ...]) for k, b in batch.items()} for j in range(n)]
    else:
        samples = [_tensor(batch[j, ...]) for j in range(len(batch))]
    if not with_index:
        return samples
    files = np.ascontiguousarray(got.index["file"], np.int64)
    location = np.concatenate([got.index["start"], got.index["stop"]], axis=1).astype(np.int64)
    return [
        (s, {"file": torch.from_numpy(files[j, ...]), "location": torch.from_numpy(location[j])})
        for j, s in enumerate(samples)
    ]


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
    shuffle : bool
        Permute the whole list each epoch with a generator seeded only by
        ``(seed, epoch)``; with a ``sampler``, permute its units (a file's
        ``per_file`` patches stay adjacent; ``Grid`` ignores it).
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
    samples per epoch. Only the epoch's last batch is short (dropped with
    ``drop_last``), and ranks may hold one batch fewer than others.

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
        shuffle: bool = False,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        device: str = "cpu",
        with_index: bool = False,
        read_size: int = 16,
    ) -> None:
        bound = _check_dataset(dataset, "NpyIterableDataset", device, sampler)
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
        self.dataset = dataset
        self.sampler = sampler
        self.bound = bound
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.with_index = bool(with_index)
        self.read_size = check_int("read_size", read_size, 1)
        self._pass = _SharedPass()
        share = self._share()
        if bound is None:
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
        return 0, 1

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
        order = epoch_order(n, self.epoch, shuffle=self.shuffle, seed=self.seed)
        rank, world = self._share()
        share = split_for(n, rank, world, *self._worker())
        return order[share.start : share.stop]

    def _deal(self, start: int) -> Deal:
        rank, world = self._share()
        assert self.bound is not None
        return Deal(len(self.bound), self.batch_size, rank, world, start=start, drop_last=self.drop_last)

    def __len__(self) -> int:
        """Samples this rank reads per epoch (all its DataLoader workers together; a whole epoch with a sampler)."""
        if self.bound is not None:
            return self._deal(0).samples
        rank, world = self._share()
        return len(split_for(len(self.dataset), rank, world, 0, 1))

    def __iter__(self) -> Iterator[Any]:
        dataset = self.dataset
        check_process(_first_views(dataset))  # (a forked DataLoader worker over URLs: a clear error, not a hang)
        if self.device == "gpu":
            check_cuda_fork()  # (a worker forked after the parent used CUDA: a clear error, not CUDA's)
        if self.bound is not None:
            yield from self._patches()
            return
        mine = self.indices().tolist()
        for at in range(0, len(mine), self.read_size):
            part = mine[at : at + self.read_size]
            for i, sample in zip(part, _samples(pick(dataset, part), self.device)):
                yield (sample, i) if self.with_index else sample

    def _patches(self) -> Iterator[Any]:
        bound = self.bound
        assert bound is not None
        epoch = self._pass.epoch
        for positions in self._deal(self._pass.start).worker_batches(*self._worker()):
            patches = bound.patches(epoch, positions.tolist(), seed=self.seed, shuffle=self.shuffle)
            yield from _patch_samples(read_patches(self.dataset, patches, bound, device=self.device), self.with_index)

    def _resume_state(self, epoch: int, position: int) -> ResumeState:
        bound = self.bound
        if bound is None:
            raise ValueError(
                "NpyIterableDataset keeps a resume state only with a sampler (sampler=...); without one, restart "
                "the epoch, or use npydask.Loader, whose state_dict() resumes whole-file epochs"
            )
        return ResumeState(
            epoch,
            position,
            len(bound),
            self.seed,
            self.shuffle and not bound.shuffle_ignored,
            bound.sampler.fingerprint(),
            dataset_fingerprint(self.dataset),
        )

    def state_dict(self, batches_seen: int) -> dict[str, Any]:
        """The resume state after the training loop took ``batches_seen`` batches of the current pass.

        Count the batches this rank's loop received since the pass began
        (since the epoch's ``set_epoch``, or since :meth:`load_state_dict`
        when it resumed one); every rank then records the same state. It
        holds the epoch, the position ``P`` (the positions before it are
        consumed), and the seed, shuffle, sampler and dataset fingerprints
        that must agree to resume it.

        Raises
        ------
        ValueError
            No ``sampler``, or more batches than this pass holds on a rank.
        """
        state = self._resume_state(self.epoch, 0)
        position = self._deal(self._pass.start).position_after(batches_seen)
        return ResumeState.from_dict({**state.to_dict(), "position": position}).to_dict()

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
        current = self._resume_state(0, 0)
        saved = ResumeState.from_dict(state)
        check_resumable(saved, current)
        rolled = saved.rolled_over()
        self._pass.set(rolled.epoch, rolled.position, pending=True)


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
        self.bound = _check_dataset(dataset, "NpyMapDataset", device, sampler)
        self.dataset = dataset
        self.sampler = sampler
        self.seed = None if seed is None else check_int("seed", seed, 0)
        self.device = device
        self.with_index = bool(with_index)
        self._pass = _SharedPass()

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
        check_process(_first_views(self.dataset))
        if self.device == "gpu":
            check_cuda_fork()
        if not picks:
            return []
        if self.bound is not None:
            patches = self.bound.patches(self.epoch, picks, seed=self.seed)
            return _patch_samples(read_patches(self.dataset, patches, self.bound, device=self.device), self.with_index)
        tensors = _samples(pick(self.dataset, picks), self.device)
        return list(zip(tensors, picks)) if self.with_index else tensors

    def _index(self, i: Any) -> int:
        return file_index(i, len(self), "NpyMapDataset indices are integers")
