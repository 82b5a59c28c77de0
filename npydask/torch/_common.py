"""What both PyTorch adapters share: dtype checks, tensors from read arrays, and the pass in shared memory."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from npydask.dataset.multikey import MultiKeyDataset, pick
from npydask.dataset.stacking import joined_dtype
from npydask.dataset.zipped import ZippedDataset
from npydask.loader import read_batch
from npydask.samplers import BoundSampler, Sampler

__all__ = [
    "SharedPass",
    "check_dataset",
    "check_torch_dtype",
    "file_samples",
    "first_views",
    "patch_samples",
    "shared_pass",
    "tensor",
]

_HINTS = {
    "M": 'batch.view("int64") (the ticks of its unit)',
    "m": 'batch.view("int64") (the ticks of its unit)',
    "f": 'batch.astype("float64")',
    "c": 'batch.astype("complex128")',
    "S": "a numeric encoding of the values (torch has no string tensors)",
    "U": "a numeric encoding of the values (torch has no string tensors)",
    "V": 'batch[name] for each field (or batch.view("uint8") for raw bytes)',
}


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


class SharedPass:
    """Where the next pass starts, in shared memory: set in the main process, read by every DataLoader worker.

    Three numbers: the epoch, the position ``P`` the pass starts at (0, or
    the state's after ``load_state_dict``), and whether that ``P`` is still
    pending (kept by the first ``set_epoch`` of the same epoch). Made with the dataset, so
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
            return (shared_pass, (self._values,))
        return (SharedPass, (self.epoch, self.start, int(self.pending)))


def shared_pass(values: Any) -> SharedPass:
    """A :class:`SharedPass` over ``values``, the shared memory of the one a DataLoader worker was started with."""
    shared = SharedPass.__new__(SharedPass)
    shared._values = values
    return shared


def file_samples(picked: Any, device: str) -> list[Any]:
    """Each picked sample as a tensor, or a dict of tensors per ``.npz`` member.

    ``picked`` is what :func:`npydask.dataset.multikey.pick` returns.
    """
    if isinstance(picked, dict):
        columns = {k: arrays(views, device) for k, views in picked.items()}
        n = len(next(iter(columns.values())))
        return [{k: tensor(c[j]) for k, c in columns.items()} for j in range(n)]
    return [tensor(a) for a in arrays(picked, device)]


def arrays(views: Sequence[Any], device: str) -> list[Any]:
    """Each view read in full by one call: native-order, writable arrays (0-d ones included)."""
    batch = read_batch(views, device)
    if isinstance(batch, list):
        return batch
    return [batch[j, ...] for j in range(len(views))]  # `...` keeps 0-d samples arrays, not scalars


def tensor(a: Any) -> torch.Tensor:
    """``a`` as a tensor sharing its memory: a NumPy array on the host, a CuPy one on its device."""
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)  # writable and native-order: no copy, no warning
    return torch.from_dlpack(a)  # CuPy, on the device


def check_dataset(dataset: Any, adapter: str, device: str, sampler: Any = None) -> BoundSampler | None:
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


def first_views(dataset: Any) -> Any:
    """One view of the dataset's first file (of its first member), for :func:`check_process`."""
    if isinstance(dataset, ZippedDataset):
        dataset = next(iter(dataset.members.values()))
    return pick(dataset, [0])


def patch_samples(got: Any, with_index: bool) -> list[Any]:
    """Each sample of a read batch of patches as a tensor (a dict of them per member), with its index when asked.

    The index of a sample is ``{"file": int64 (), "location": int64 (2 * ndim,)}``,
    ``location`` being the box's start, then its stop (TorchIO's layout).
    """
    batch = got.batch
    if isinstance(batch, dict):
        n = len(next(iter(batch.values())))
        samples: list[Any] = [{k: tensor(b[j, ...]) for k, b in batch.items()} for j in range(n)]
    else:
        samples = [tensor(batch[j, ...]) for j in range(len(batch))]
    if not with_index:
        return samples
    files = np.ascontiguousarray(got.index["file"], np.int64)
    location = np.concatenate([got.index["start"], got.index["stop"]], axis=1).astype(np.int64)
    return [
        (s, {"file": torch.from_numpy(files[j, ...]), "location": torch.from_numpy(location[j])})
        for j, s in enumerate(samples)
    ]
