"""Reading a batch of a sampler's patches: :func:`read_patches`.

A batch's patches are grouped by file, and each file is read once with all
its patches together (:func:`npydask.reader.read_boxes_many`: their byte runs
merged, then each box cut straight into its slot of the batch). A zipped or
multi-key dataset reads the same box from each member. What the reads cost
comes back as :class:`ReadStats`, which add up over an epoch.
:func:`read_window` reads several batches the same way, each file once for
all of them (a loader's look-ahead, :mod:`npydask.loader.window`).

Local files are read by the ``patch_read`` setting (environment variable
``NPYDASK_PATCH_READ``): ``"mapped"`` copies each box from the file's
mapping, ``"spans"`` reads the merged byte spans with ``preadv`` (several
at once), and ``"auto"`` (the default) maps a file's boxes where the page
cache holds them and reads spans otherwise (asked without reading,
:meth:`~npydask.storage.base.Source.in_memory`). A 64^3 float32 patch of a
256x512x512 volume lies on 64 planes: the mapping copies its 1 MiB, while
the spans of whole rows per plane are 8 MiB, so mapped reads are several
times faster from the page cache; from the disk, a page fault reads ahead
around it (the device's ``read_ahead_kb``), several times the spans' bytes.
``"spans"`` keeps every read an explicit request (``O_DIRECT`` with
``direct_io``, which always reads spans). A file opened
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
from npydask.plan.lookahead import FileWindow, group_window
from npydask.plan.patches import Patch, patch_index
from npydask.plan.region import Box
from npydask.reader import FileBoxes, FileRef, maps_boxes, read_boxes_many
from npydask.samplers.base import BoundSampler, dataset_members
from npydask.storage.io_counts import IoStats, collect

__all__ = ["PATCH_READS", "PatchBatch", "ReadStats", "read_patches", "read_window", "reads_spans"]


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
    cache_hits : int
        Reads of objects served wholly from the node cache (no request sent).
    cache_misses : int
        Reads of objects through the node cache that fetched at least one byte run.
    cache_hit_bytes : int
        Bytes served from the node cache.
    throttled : int
        Requests that finally failed (after retries) with HTTP 503, ``SlowDown`` or a timeout.
    hedges : int
        Range GETs sent again because the first was not answered within the hedge delay (the
        ``remote_hedge`` setting).
    hedges_won : int
        Hedges whose answer was the one used (the first request was cancelled).

    Examples
    --------
    >>> ReadStats(10, 8, 1, 0.5) + ReadStats(6, 4, 2, 0.25, cache_hits=1, cache_hit_bytes=6)
    ReadStats(bytes_read=16, patch_bytes=12, requests=3, io_wait_s=0.75, cache_hits=1, cache_misses=0, \
cache_hit_bytes=6, throttled=0, hedges=0, hedges_won=0)
    """

    bytes_read: int = 0
    patch_bytes: int = 0
    requests: int = 0
    io_wait_s: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_hit_bytes: int = 0
    throttled: int = 0
    hedges: int = 0
    hedges_won: int = 0

    def __add__(self, other: ReadStats) -> ReadStats:
        if not isinstance(other, ReadStats):
            return NotImplemented
        return ReadStats(
            self.bytes_read + other.bytes_read,
            self.patch_bytes + other.patch_bytes,
            self.requests + other.requests,
            self.io_wait_s + other.io_wait_s,
            self.cache_hits + other.cache_hits,
            self.cache_misses + other.cache_misses,
            self.cache_hit_bytes + other.cache_hit_bytes,
            self.throttled + other.throttled,
            self.hedges + other.hedges,
            self.hedges_won + other.hedges_won,
        )

    def with_io(self, counts: IoStats) -> ReadStats:
        """These stats with the node-cache, throttling and hedging figures of ``counts`` (a collector's) added.

        Examples
        --------
        >>> from npydask.storage.io_counts import IoStats
        >>> ReadStats(4, 4, 1).with_io(IoStats(cache_hits=2, cache_hit_bytes=8)).cache_hit_bytes
        8
        """
        return dataclasses.replace(
            self,
            cache_hits=self.cache_hits + counts.cache_hits,
            cache_misses=self.cache_misses + counts.cache_misses,
            cache_hit_bytes=self.cache_hit_bytes + counts.cache_hit_bytes,
            throttled=self.throttled + counts.throttled,
            hedges=self.hedges + counts.hedges,
            hedges_won=self.hedges_won + counts.hedges_won,
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


def read_patches(
    dataset: Any, patches: Sequence[Patch], bound: BoundSampler, *, device: str = "cpu", route: str | None = None
) -> PatchBatch:
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
    route : {"auto", "mapped", "spans"}, optional
        How local files are read; the ``patch_read`` setting by default (a
        loader passes the value in force where it iterates, so tasks on a
        cluster's workers read as the client says).

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
    return read_window(dataset, [patches], bound, device=device, route=route)[0]


def read_window(
    dataset: Any,
    batches: Sequence[Sequence[Patch]],
    bound: BoundSampler,
    *,
    device: str = "cpu",
    route: str | None = None,
) -> list[PatchBatch]:
    """Read several batches of patches together: each file once with every box the batches ask of it.

    The look-ahead of a sampler :class:`~npydask.loader.Loader`: the boxes
    of all the batches are grouped per file (:func:`~npydask.plan.lookahead.group_window`)
    and each file's boxes are read as one set of merged spans, each box cut
    straight into its batch's slot. Tiles of a grid that share per-plane
    spans across batches are then read once. Batch ``i`` of the result
    equals ``read_patches(dataset, batches[i], bound)``; the reads' cost
    (``bytes_read``, ``requests``, ``io_wait_s``) is counted once, in the
    first batch's :class:`ReadStats`, and each batch counts its own
    ``patch_bytes``, so the stats of the batches add up to what was read.
    ``route`` is as in :func:`read_patches`. Objects read through the node
    cache count as planned in ``bytes_read`` and ``requests`` (the reads
    asked for); ``cache_hits`` and ``cache_hit_bytes`` say how much of them
    the cache served without a request.

    Raises
    ------
    ValueError
        No batches, an empty batch, a patch naming a file the dataset does not hold, or an unknown ``route``.
    FileChangedError
        A file changed since the dataset was opened.
    """
    lists = [list(b) for b in batches]
    if not lists or not all(lists):
        raise ValueError("read_window needs at least one batch, each of at least one patch")
    members = dataset_members(dataset)
    n = len(dataset)
    for patches in lists:
        for p in patches:
            if not 0 <= p.file < n:
                raise ValueError(f"patch {p} names file {p.file}, but the dataset holds {n} files")
    route = _route() if route is None else _check_route(route)
    groups = group_window(lists)
    started = time.perf_counter()
    reads = ReadStats()
    out: list[dict[str, Any]] = [{} for _ in lists]
    sizes = [0] * len(lists)
    with collect() as counts:  # (the node cache's and throttling figures, where the reads run)
        for key, member in members.items():
            arrays, cost = _read_member(member, lists, groups, bound.fill_value, route)
            reads += cost
            for b, (batch, size) in enumerate(arrays):
                out[b][key] = batch
                sizes[b] += size
    reads = reads.with_io(counts)
    waited = time.perf_counter() - started
    done = []
    for b, (patches, members_out) in enumerate(zip(lists, out)):
        batch = members_out[""] if list(members_out) == [""] else members_out
        if device == "gpu":
            batch = _to_device(batch)
        first = dataclasses.replace(reads, patch_bytes=sizes[b], io_wait_s=waited)
        cost = first if b == 0 else ReadStats(0, sizes[b])
        done.append(PatchBatch(batch, patch_index(patches), cost))
    return done


def reads_spans(dataset: Any) -> bool:
    """Whether ``dataset``'s patches are read as merged spans (objects, ``"spans"``, ``backend="pread"``).

    ``False`` where each box is copied from a local file's mapping (the
    default for local files): there are no spans to merge across batches.
    """
    view = next(iter(dataset_members(dataset).values())).views[0]
    return not maps_boxes(_routed(view.ref, _route()))


def _route() -> str:
    """The ``patch_read`` setting: ``"auto"``, ``"mapped"`` or ``"spans"``."""
    return str(config.get("patch_read"))


def _check_route(route: str) -> str:
    if route not in PATCH_READS:
        raise ValueError(f"route must be one of {list(PATCH_READS)} (the patch_read setting's values), found {route!r}")
    return route


def _routed(ref: FileRef, route: str) -> FileRef:
    """``ref`` set to read patches by ``route`` where its backend leaves the choice (``"auto"``).

    ``"auto"`` sets the mapping, which :func:`~npydask.reader.read_boxes_many`
    (``probe_cache=True``) takes only where the page cache holds the boxes.
    """
    strategy = "spans" if route == "spans" else "mapped"
    if ref.backend != "auto" or ref.options.roi_strategy == strategy:
        return ref
    return ref._replace(options=dataclasses.replace(ref.options, roi_strategy=strategy))


def _read_member(
    member: Any, batches: list[list[Patch]], groups: tuple[FileWindow, ...], fill_value: Any, route: str
) -> tuple[list[tuple[Any, int]], ReadStats]:
    """One member's patches of each batch: per batch a stacked array (or a list) and its bytes; the reads' cost."""
    views = member.views
    nd = len(batches[0][0].start)
    shapes = {g.file: views[g.file].shape[: views[g.file].ndim - nd] for g in groups}
    dtypes = {g.file: _read_dtype(views[g.file].dtype) for g in groups}
    arrays: list[tuple[Any, int]] = []
    slots: list[list[np.ndarray]] = []
    for patches in batches:
        files = {p.file for p in patches}  # (each batch stacked where its own files agree, as read alone)
        if len({shapes[f] for f in files}) == 1 and len({dtypes[f] for f in files}) == 1:
            f0 = patches[0].file
            batch: Any = _buffers.empty((len(patches), *shapes[f0], *patches[0].shape), dtypes[f0])
            slots.append(list(batch))
            arrays.append((batch, batch.nbytes))
        else:
            mine = [np.empty((*shapes[p.file], *p.shape), dtypes[p.file]) for p in patches]
            slots.append(mine)
            arrays.append((mine, sum(a.nbytes for a in mine)))
    todo: list[FileBoxes] = []
    stats = ReadStats()
    for g in groups:
        view = views[g.file]
        dests = [slots[b][s] for b, s in g.slots]
        if view.roi is None:
            todo.append(FileBoxes(_routed(view.ref, route), g.boxes, dests))
        else:
            for box, dest in zip(g.boxes, dests):
                stats += _read_in_roi(view, box, fill_value, dest)
    for got in read_boxes_many(todo, fill_value=fill_value, probe_cache=route == "auto"):
        stats += ReadStats(got.bytes_read, got.patch_bytes, got.requests)
    return [_joined(batch, size) for batch, size in arrays], stats


def _read_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a file's boxes are read into: the file's own layout, in native byte order.

    The same as :func:`~npydask.dataset.stacking.joined_dtype` except for a
    structured dtype with padding (``align=True`` or explicit offsets):
    ``numpy.stack`` packs its fields, but the bytes are read in the file's layout.
    """
    return dtype.newbyteorder("=")


def _joined(batch: Any, size: int) -> tuple[Any, int]:
    """A batch read in :func:`_read_dtype` as ``numpy.stack`` gives it (padded structured dtypes packed)."""
    if isinstance(batch, list):
        packed = [_joined(a, a.nbytes)[0] for a in batch]
        return packed, sum(a.nbytes for a in packed)
    dtype = joined_dtype(batch.dtype)
    if dtype == batch.dtype and dtype.itemsize == batch.dtype.itemsize:
        return batch, size
    packed = batch.astype(dtype)
    return packed, packed.nbytes


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
