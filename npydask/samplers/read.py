"""Reading a batch of a sampler's patches: :func:`read_patches`.

A batch's patches are grouped by file, and each file is read once with all
its patches together (:func:`npydask.reader.read_boxes_many`: their byte runs
merged, then each box cut straight into its slot of the batch). A zipped or
multi-key dataset reads the same box from each member. What the reads cost
comes back as :class:`ReadStats`, which add up over an epoch.

Local files are read by the ``patch_read`` setting (environment variable
``NPYDASK_PATCH_READ``): ``"auto"`` (the default) and ``"mapped"`` copy each
box from the file's mapping, ``"spans"`` reads the merged byte spans with
``preadv``. A 64^3 float32 patch of a 256x512x512 volume lies on 64 planes:
the mapping copies its 1 MiB, while the spans of whole rows per plane are
8 MiB, so mapped reads are several times faster from the page cache and no
slower from a cold one. ``"spans"`` keeps every read an explicit request
(``O_DIRECT`` with ``direct_io``, which always reads spans). A file opened
with ``backend="pread"`` reads spans and one opened with ``backend="mmap"``
maps, whatever the setting. Objects are always read as merged range requests.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from npydask import _buffers, config
from npydask.config import PATCH_READS
from npydask.dataset.stacking import joined_dtype
from npydask.plan.patches import Patch, patch_index
from npydask.plan.region import Box
from npydask.reader import FileBoxes, FileRef, read_boxes_many
from npydask.samplers.base import BoundSampler, dataset_members

__all__ = ["PATCH_READS", "PatchBatch", "ReadStats", "read_patches"]


@dataclass(frozen=True)
class ReadStats:
    """What reading patches cost: add them up (``a + b``, ``sum(stats, ReadStats())``) over an epoch.

    Attributes
    ----------
    bytes_read : int
        Payload bytes read (merged spans with their gaps, or the bytes copied
        from a mapping).
    patch_bytes : int
        Bytes of the patches delivered (padding included): ``bytes_read /
        patch_bytes`` is the read amplification.
    requests : int
        Reads issued: ``preadv`` calls, range GETs (0 for mapped copies).
    io_wait_s : float
        Seconds spent reading (wall time of the reads, summed over batches;
        with prefetch threads, reads overlap each other and the training step).

    Examples
    --------
    >>> ReadStats(10, 8, 1, 0.5) + ReadStats(6, 4, 2, 0.25)
    ReadStats(bytes_read=16, patch_bytes=12, requests=3, io_wait_s=0.75)
    """

    bytes_read: int = 0
    patch_bytes: int = 0
    requests: int = 0
    io_wait_s: float = 0.0

    def __add__(self, other: ReadStats) -> ReadStats:
        if not isinstance(other, ReadStats):
            return NotImplemented
        return ReadStats(
            self.bytes_read + other.bytes_read,
            self.patch_bytes + other.patch_bytes,
            self.requests + other.requests,
            self.io_wait_s + other.io_wait_s,
        )


@dataclass(frozen=True)
class PatchBatch:
    """A batch of patches read by :func:`read_patches`."""

    batch: Any
    """An array ``(B, *leading, *patch_shape)`` (a dict of them for a zipped or multi-key dataset; a list of
    arrays, one per patch, where the files' leading axes or dtypes differ)."""
    index: dict[str, np.ndarray]
    """The boxes (:func:`~npydask.plan.patches.patch_index`): ``"file"``, ``"start"`` and ``"stop"``."""
    stats: ReadStats
    """What reading the batch cost."""


def read_patches(dataset: Any, patches: Sequence[Patch], bound: BoundSampler, *, device: str = "cpu") -> PatchBatch:
    """Read a batch of patches of ``dataset``, each file once with all its patches.

    Parameters
    ----------
    dataset : NpyDataset, MultiKeyDataset or ZippedDataset
        The dataset ``bound`` was bound to.
    patches : sequence of Patch
        The boxes, in batch order (``bound.patches(epoch, positions, ...)``).
        Boxes are in the dataset's coordinates (after its ROI); leading axes
        of the files (channels) are read whole.
    bound : BoundSampler
        Gives the ``fill_value`` of the cells of a box outside its file.
    device : {"cpu", "gpu"}
        NumPy arrays, or CuPy arrays: read into host memory, then copied to
        the current device once per array.

    Returns
    -------
    PatchBatch
        ``batch`` in native byte order, C-contiguous and writeable (each
        patch equals ``numpy.load(f)[..., a0:b0, a1:b1, ...]`` with the cells
        outside the file filled); ``index``; ``stats``.

    Raises
    ------
    ValueError
        No patches, or a patch naming a file the dataset does not hold.
    FileChangedError
        A file changed since the dataset was opened.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.plan.patches import Patch
    >>> from npydask.samplers import Uniform
    >>> root = tempfile.mkdtemp(); np.save(os.path.join(root, "a.npy"), np.arange(16).reshape(4, 4))
    >>> ds = npydask.open_dataset(root)
    >>> bound = Uniform((2, 2), policy="pad", fill_value=-1).bind(ds)
    >>> got = read_patches(ds, [Patch(0, (0, 0), (2, 2)), Patch(0, (3, 3), (5, 5))], bound)
    >>> got.batch.tolist(), got.index["file"].tolist()
    ([[[0, 1], [4, 5]], [[15, -1], [-1, -1]]], [0, 0])
    """
    patches = list(patches)
    if not patches:
        raise ValueError("read_patches needs at least one patch")
    members = dataset_members(dataset)
    n = len(dataset)
    for p in patches:
        if not 0 <= p.file < n:
            raise ValueError(f"patch {p} names file {p.file}, but the dataset holds {n} files")
    route = _route()
    started = time.perf_counter()
    stats = ReadStats()
    out: dict[str, Any] = {}
    for key, member in members.items():
        out[key], got = _read_member(member, patches, bound.fill_value, route)
        stats += got
    stats = dataclasses.replace(stats, io_wait_s=time.perf_counter() - started)
    batch = out[""] if list(out) == [""] else out
    if device == "gpu":
        batch = _to_device(batch)
    return PatchBatch(batch, patch_index(patches), stats)


def _route() -> str:
    value = str(config.get("patch_read"))
    return "mapped" if value == "auto" else value


def _routed(ref: FileRef, route: str) -> FileRef:
    """``ref`` set to read patches by ``route`` where its backend leaves the choice (``"auto"``)."""
    if ref.backend != "auto" or ref.options.roi_strategy == route:
        return ref
    strategy = "mapped" if route == "mapped" else "spans"
    return ref._replace(options=dataclasses.replace(ref.options, roi_strategy=strategy))


def _read_member(member: Any, patches: list[Patch], fill_value: Any, route: str) -> tuple[Any, ReadStats]:
    """One member's patches: a stacked array (or a list), and what reading them cost."""
    views = member.views
    nd = len(patches[0].start)
    files = sorted({p.file for p in patches})
    shapes = {f: views[f].shape[: views[f].ndim - nd] for f in files}
    dtypes = {f: joined_dtype(views[f].dtype) for f in files}
    stacked = len(set(shapes.values())) == 1 and len({d.str for d in dtypes.values()}) == 1
    if stacked:
        f0 = files[0]
        batch: Any = _buffers.empty((len(patches), *shapes[f0], *patches[0].shape), dtypes[f0])
        slots = list(batch)
    else:
        slots = [np.empty((*shapes[p.file], *p.shape), dtypes[p.file]) for p in patches]
        batch = slots
    todo: list[FileBoxes] = []
    stats = ReadStats()
    for f in files:
        mine = [i for i, p in enumerate(patches) if p.file == f]
        view = views[f]
        if view.roi is None:
            boxes = [patches[i] for i in mine]
            todo.append(FileBoxes(_routed(view.ref, route), boxes, [slots[i] for i in mine]))
        else:
            for i in mine:
                stats += _read_in_roi(view, patches[i], fill_value, slots[i])
    for got in read_boxes_many(todo, fill_value=fill_value):
        stats += ReadStats(got.bytes_read, got.patch_bytes, got.requests)
    return batch, stats


def _read_in_roi(view: Any, patch: Patch, fill_value: Any, out: np.ndarray) -> ReadStats:
    """A patch of a file the dataset cuts to a ROI: the part inside the ROI read, the rest filled.

    Boxes are in the ROI's coordinates; the part of a box outside the ROI
    holds ``fill_value`` (the part of a ``"pad"`` ROI outside the file holds
    the ROI's own fill value, as the dataset gives it).
    """
    shape = view.shape
    lead = len(shape) - len(patch.start)
    lo = [min(max(a, 0), n) for a, n in zip(patch.start, shape[lead:])]
    hi = [max(min(b, n), a) for b, n, a in zip(patch.stop, shape[lead:], lo)]
    inside = all(b > a for a, b in zip(lo, hi))
    if list(patch.start) != lo or list(patch.stop) != hi:
        out[...] = fill_value
    if not inside:
        view.ref.verify()  # (all padding: the file is still checked, as read_boxes checks it)
        return ReadStats(0, out.nbytes, 1)
    box = Box((0,) * lead + tuple(lo), tuple(shape[:lead]) + tuple(hi))
    where: tuple[Any, ...] = (Ellipsis, *(slice(a - s, b - s) for a, b, s in zip(lo, hi, patch.start)))
    got = view.read(box)
    out[where] = got
    return ReadStats(got.nbytes, out.nbytes, 1)


def _to_device(batch: Any) -> Any:
    """The batch copied to the current device: one host-to-device copy per array."""
    from npydask.gpu import array_module

    xp = array_module()
    if isinstance(batch, dict):
        return {k: _to_device_one(xp, v) for k, v in batch.items()}
    return _to_device_one(xp, batch)


def _to_device_one(xp: Any, batch: Any) -> Any:
    if isinstance(batch, list):
        return [xp.asarray(a) for a in batch]
    return xp.asarray(batch)
