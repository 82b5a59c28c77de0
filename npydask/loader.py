"""The training loader: DALI-style batches from an :class:`~npydask.dataset.npy_dataset.NpyDataset`.

Which batches an epoch holds is planned purely in :mod:`npydask.plan.sampling`
(shuffle, shards, padding); this module fetches them. A batch is read by
one call that reads its files back to back (the tight per-file loop of a
stacked task): in up to ``prefetch`` threads of this process, or as tasks
on a ``dask.distributed`` client's workers, where the files are read and
the batch is gathered once. Batches come out in plan order.

With ``sampler=`` (:mod:`npydask.samplers`) each sample is a box of a file:
the epoch's positions are dealt to shards in global batches
(:class:`~npydask.samplers.schedule.Schedule`), each batch's boxes are read
by :func:`~npydask.samplers.read_patches` (each file once), and
:meth:`Loader.stats` sums what the reads cost.

Resuming: the loader counts the batches it has *yielded* in the current
epoch; :meth:`Loader.state_dict` records that count with the epoch, and a
loader given it with :meth:`Loader.load_state_dict` yields exactly the
remaining batches of that epoch, then goes on with the next. The state also
records a fingerprint of the dataset (:func:`dataset_fingerprint`), so a
state is refused by a loader over other files, even of the same number, or
over the same files read otherwise (another ROI, ``.npz`` key or fill value).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from npydask._keywords import suggest_keywords
from npydask.array import NpyFileArray, check_device
from npydask.dataset.multikey import MultiKeyDataset, pick
from npydask.dataset.stacking import FileGroup, joined_dtype
from npydask.dataset.zipped import ZippedDataset
from npydask.errors import NpyDaskWarning
from npydask.gpu import check_cuda_fork
from npydask.plan.region import Box
from npydask.plan.sampling import EpochPlan, check_int
from npydask.samplers import BoundSampler, PatchBatch, ReadStats, Sampler, read_patches
from npydask.samplers.base import dataset_members
from npydask.samplers.schedule import Schedule

__all__ = ["Loader", "check_process", "dataset_fingerprint", "read_batch", "warn_if_resharded"]

_STATE_KEYS = ("n", "batch_size", "shuffle", "seed", "shard_id", "num_shards", "pad_last_batch", "drop_last")
_LATER_KEYS = {"stick_to_shard": True}  # added after the first states were saved: their value then
_FINGERPRINT = "dataset_fingerprint"


def dataset_fingerprint(dataset: Any) -> dict[str, str]:
    """Short facts that tell a dataset's file list and what its samples hold from another's.

    ``"files"`` hashes the file names relative to their common folder, in
    order (so a dataset copied to another disk or node keeps it, while
    another selection, order or shard does not); ``"layout"`` hashes the
    dtype and each output shape (after ROI); ``"roi"`` hashes each file's
    ROI as resolved (start and end per axis, after the policy, so per-file
    ROIs and ROIs of equal shapes at other starts differ), described in
    ``"roi_shown"``; ``"key"`` is the ``.npz`` member(s) read; ``"fill"`` the
    fill value of the cells a ``"pad"`` ROI puts outside a file (``"none"``
    when no cell is outside). Sizes and mtimes are left out (a resumed job
    may run on a copy of its files), and so are ``device``, ``backend`` and
    ``headers``, which change where and how samples are read, not what they hold.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for i in range(3): np.save(os.path.join(root, f"{i}.npy"), np.zeros(4))
    >>> ds = npydask.open_dataset(root)
    >>> dataset_fingerprint(ds) == dataset_fingerprint(ds[:]), dataset_fingerprint(ds) == dataset_fingerprint(ds[::-1])
    (True, False)
    >>> moved = npydask.open_dataset(root, roi_start=1, roi_shape=2)
    >>> dataset_fingerprint(moved)["roi_shown"], dataset_fingerprint(ds)["roi_shown"]
    ('start (1,) end (3,) for every file', 'whole files')
    """
    if isinstance(dataset, ZippedDataset):  # (each member's files, dtype, shapes, ROIs and key)
        members = dataset.members
        names = b"\1".join(k.encode() + b"\1" + _names(d.files) for k, d in members.items())
        layout = "|".join(f"{k}|{d.dtype.str}|{d.dtype}|{d.shapes}" for k, d in members.items()).encode()
        key = repr({k: d.views.context.key for k, d in members.items()})
    elif isinstance(dataset, MultiKeyDataset):  # (every member's dtype, shapes and ROIs, in key order)
        members = dataset.members
        layout = "|".join(f"{k}|{d.dtype.str}|{d.dtype}|{d.shapes}" for k, d in members.items()).encode()
        key = repr(list(members))
        names = _names(dataset.files)
    else:
        names = _names(dataset.files)
        members = {"": dataset}
        layout = f"{dataset.dtype.str}|{dataset.dtype}|{dataset.shapes}".encode()
        key = repr(dataset.views.context.key)
    rois = [_rois(d.table) for d in members.values()]
    return {
        "files": _hash(names),
        "layout": _hash(layout),
        "roi": _hash(b"|".join(r[0] for r in rois)),
        "roi_shown": rois[0][1] if len(rois) == 1 else "; ".join(f"{k}: {r[1]}" for k, r in zip(members, rois)),
        "key": key,
        "fill": ", ".join(sorted({f for r in rois for f in r[2]})) or "none",
    }


def _names(files: Sequence[str]) -> bytes:
    """The file names relative to their common folder, in order, as bytes to hash."""
    prefix = os.path.commonprefix(list(files)) if len(files) > 1 else os.path.dirname(files[0]) + os.sep
    cut = max(prefix.rfind(os.sep), prefix.rfind("/")) + 1
    return "\0".join(f[cut:] for f in files).encode("utf-8", "surrogateescape")


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _rois(table: Any) -> tuple[bytes, str, set[str]]:
    """A table's per-file ROIs as bytes to hash, a description, and the fill values of padded ones.

    The bytes are the distinct resolved ROIs ``(start, end)`` (``None``: the
    whole file) in order of first use and each row's number among them, so
    equal datasets agree however their tables number their ROIs (a slice,
    a pickled copy, a table opened again).
    """
    ids = table.roi_ids()
    used, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    found = [table.rois[int(u)] for u in used.tolist()]
    facts = [None if r is None else (tuple(map(int, r.start)), tuple(map(int, r.end))) for r in found]
    number: dict[Any, int] = {}
    canon = np.empty(len(used), np.int64)
    for k in np.argsort(first, kind="stable").tolist():
        canon[k] = number.setdefault(facts[k], len(number))
    data = repr(list(number)).encode() + b"|" + canon[inverse.reshape(-1)].astype("<i8").tobytes()
    first_roi = next(iter(number))
    if len(number) > 1:
        shown = (
            f"{len(number)} different ROIs, the first file's {'whole' if first_roi is None else _roi_text(first_roi)}"
        )
    else:
        shown = "whole files" if first_roi is None else f"{_roi_text(first_roi)} for every file"
    fills = {repr(np.asarray(r.fill_value).tolist()) for r in found if r is not None and r.padded}
    return data, shown, fills


def _roi_text(roi: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    return f"start {roi[0]} end {roi[1]}"


def warn_if_resharded(dataset: Any, shard_id: int, num_shards: int, where: str) -> None:
    """Warn when ``where`` shards a dataset that ``open_dataset`` or ``ds.shard()`` already sharded.

    The shards compound (shard 0 of 2 of shard 0 of 2 is a quarter of the
    files), which is rarely meant: each process should be given one share.
    """
    sharding = getattr(dataset, "sharding", None)
    if num_shards <= 1 or sharding is None:
        return
    warnings.warn(
        f"{where} shards a dataset that is already shard {sharding[0]} of {sharding[1]} (open_dataset(shard_id=, "
        f"num_shards=) or ds.shard()): the shards compound, so this reads about 1/{num_shards} of the dataset's "
        f"{len(dataset)} files, 1/{sharding[1] * num_shards} of the whole list. Shard in one place: open the whole "
        f"dataset and shard here (shard_id={shard_id}, num_shards={num_shards}), or keep the dataset's shard and "
        "leave num_shards=1 here",
        NpyDaskWarning,
        stacklevel=3,
    )


def check_process(views: Sequence[NpyFileArray] | dict[str, Sequence[NpyFileArray]]) -> None:
    """Raise where this process cannot read the views (objects, in a child forked after obstore was used).

    ``views`` may be a dict of them per ``.npz`` member (:func:`npydask.dataset.multikey.pick`).

    The error names ``multiprocessing_context="spawn"`` and ``"forkserver"``:
    a request there would hang instead (obstore is not fork-safe). Local
    files are always readable. See :meth:`npydask.storage.base.Source.check_process`.
    """
    if isinstance(views, dict):
        views = next(iter(views.values()))  # (the members share their files)
    if views:
        ref = views[0].ref  # (a dataset reads one store)
        ref.source.check_process(ref.path)


def read_batch(views: Sequence[NpyFileArray] | dict[str, Sequence[NpyFileArray]], device: str = "cpu") -> Any:
    """Read every view in full: one stacked array when shapes agree, else a list.

    Stacked batches are in native byte order (as ``numpy.stack`` makes them)
    and writable; ``device="gpu"`` gives CuPy arrays. A dict of views per
    ``.npz`` member gives a dict of batches (the members of a file share its
    descriptor: one open per file).
    """
    if isinstance(views, dict):
        return {k: read_batch(v, device) for k, v in views.items()}
    shapes = {v.shape for v in views}
    if device == "gpu":
        from npydask.gpu import on_device

        if len(shapes) == 1:
            group = on_device(FileGroup(views, 0, True))
            return group[(slice(None),) * len(group.shape)]
        return [on_device(v)[(slice(None),) * v.ndim] for v in views]
    if len(shapes) == 1:
        group = FileGroup(views, 0, True)
        return _owned(group[(slice(None),) * len(group.shape)])
    return [_owned(v.read(Box.whole(v.shape))) for v in views]


def _owned(a: np.ndarray) -> np.ndarray:
    """``a`` as a writable, C-contiguous array in native byte order (a mapped view is copied).

    ``torch.from_numpy`` warns on read-only arrays and refuses swapped ones.
    """
    dtype = joined_dtype(a.dtype)
    if a.flags.writeable and a.flags.c_contiguous and a.dtype == dtype and a.dtype.str == dtype.str:
        return a
    return np.array(a, dtype=dtype, order="C")


class Loader:
    """Batches of an :class:`~npydask.dataset.npy_dataset.NpyDataset`, epoch after epoch, as DALI delivers them.

    Parameters
    ----------
    dataset : NpyDataset, MultiKeyDataset or ZippedDataset
        The files (after ROI); their order is the unshuffled order. A
        :class:`~npydask.dataset.multikey.MultiKeyDataset` (``key=["x", "y"]``)
        gives dict batches, one batch per member; so does a
        :class:`~npydask.dataset.zipped.ZippedDataset` (:func:`~npydask.zip_datasets`),
        which needs ``sampler=``.
    batch_size : int
        Samples per batch.
    sampler : Sampler, optional
        Read a box of a file per sample (:mod:`npydask.samplers`:
        ``Uniform``, ``Foreground``, ``Grid``) instead of whole files (or the
        dataset's ROI). An epoch then holds ``len(sampler.bind(dataset))``
        samples, and its *global batch* ``g`` holds positions ``[g*B,
        (g+1)*B)``: shard ``k`` of ``S`` takes global batches ``k, k+S,
        ...`` (not a contiguous range), so ``pad_last_batch=True`` and
        ``stick_to_shard=False`` raise ``ValueError``. Batches are arrays
        ``(B, *leading axes, *patch_shape)`` in native byte order (dicts of
        them for a zipped or multi-key dataset), each file read once per
        batch with all its patches (:func:`~npydask.samplers.read_patches`).
        ``state_dict()`` records one position ``P`` and resumes at another
        ``num_shards`` or ``batch_size``; :meth:`stats` sums the reads.
    shuffle : bool
        Permute the whole list each epoch with a generator seeded only by
        ``(seed, epoch)``, the same on every shard, before sharding. With a
        sampler, the sampler's units (a file's ``per_file`` patches) are
        permuted instead (ignored by ``Grid``).
    seed : int, optional
        ``None`` is a fixed default, so separate processes agree.
    shard_id, num_shards : int
        This loader's contiguous range of each epoch's order. Sharding a
        dataset that ``open_dataset`` already sharded warns
        (:class:`~npydask.errors.NpyDaskWarning`): the shards compound.
    stick_to_shard : bool
        ``True`` (the default, as SPEC section 5): every epoch reads this
        shard's own range. ``False`` (DALI's default): every epoch moves on
        to the next shard's range, ``(shard_id + epoch) % num_shards``, so
        over ``num_shards`` epochs each loader sees the whole list (shards
        stay disjoint within an epoch). Without padding, shards of unequal
        size then give ``len(loader)`` that varies by one between epochs.
    pad_last_batch : bool
        Repeat the shard's last sample up to ``ceil(N / num_shards)``
        samples, then up to a full batch (DALI).
    drop_last : bool
        Without padding, drop a short last batch instead of yielding it.
    prefetch : int
        Batches read ahead: threads of this process, or tasks on ``client``'s
        workers. 0 reads each batch when it is asked for.
    client : distributed.Client, optional
        Read batches on the cluster's workers (each batch is one task that
        reads its files where it runs; the result is gathered once). With a
        sampler the dataset and bound sampler are sent to the workers once
        per epoch and each task reads one batch's patches.
    device : {"cpu", "gpu"}
        NumPy or CuPy batches (the dataset's own device is not used: a
        loader on a GPU host may read a CPU dataset to the device). CuPy
        batches are read on the device current when iteration starts and
        handed over complete on the consumer's stream (a CUDA event).
    with_index : bool
        Yield ``(batch, indices)``, the indices into ``dataset``. With a
        sampler, ``(batch, index)``: ``index`` a dict of ``"file"`` (int64,
        B), ``"start"`` and ``"stop"`` (int64, B x patch ndim), the boxes in
        the dataset's coordinates (what :class:`~npydask.samplers.Stitcher`
        takes).

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> for i in range(10): np.save(os.path.join(root, f"{i}.npy"), np.full((2,), i))
    >>> loader = npydask.Loader(npydask.open_dataset(root), 3, shard_id=2, num_shards=3, pad_last_batch=True)
    >>> [batch[:, 0].tolist() for batch in loader], loader.epoch
    ([[6, 7, 8], [9, 9, 9]], 1)

    With a sampler, two random one-voxel boxes per file each epoch:

    >>> from npydask.samplers import Uniform
    >>> loader = npydask.Loader(npydask.open_dataset(root), 4, sampler=Uniform((1,), per_file=2), with_index=True)
    >>> [(batch.shape, index["file"].tolist()) for batch, index in loader][:2]
    [((4, 1), [0, 0, 1, 1]), ((4, 1), [2, 2, 3, 3])]
    >>> len(loader), loader.stats().patch_bytes
    (5, 160)
    """

    @suggest_keywords
    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        sampler: Sampler | None = None,
        shuffle: bool = False,
        seed: int | None = None,
        shard_id: int = 0,
        num_shards: int = 1,
        pad_last_batch: bool = False,
        drop_last: bool = False,
        prefetch: int = 2,
        client: Any = None,
        device: str = "cpu",
        with_index: bool = False,
        stick_to_shard: bool = True,
    ) -> None:
        from npydask.dataset.npy_dataset import NpyDataset

        if isinstance(dataset, ZippedDataset) and sampler is None:
            raise TypeError(
                "Loader reads a ZippedDataset (zip_datasets) only with sampler=: its members pair files whose "
                "samples are boxes read alike (npydask.samplers.Uniform, Foreground or Grid)"
            )
        if not isinstance(dataset, (NpyDataset, MultiKeyDataset, ZippedDataset)):
            raise TypeError(f"Loader reads an NpyDataset (from npydask.open_dataset), found {type(dataset).__name__}")
        if sampler is not None and not isinstance(sampler, Sampler):
            raise TypeError(
                f"sampler must be a patch sampler of npydask.samplers (Uniform, Foreground, Grid), found {sampler!r}"
            )
        if len(dataset) == 0:
            raise ValueError("Loader: the dataset holds no files")
        batch_size = check_int("batch_size", batch_size, 1)
        self.prefetch = check_int("prefetch", prefetch, 0)
        if seed is not None:
            seed = check_int("seed", seed, 0)
        check_device(device)
        self.sampler = sampler
        self.bound: BoundSampler | None = None
        self.schedule: Schedule | None = None
        self.plan: EpochPlan | None = None
        if sampler is not None:
            self.bound = sampler.bind(dataset)
            self.schedule = Schedule(
                self.bound,
                batch_size,
                seed=seed,
                shuffle=bool(shuffle),
                shard_id=shard_id,
                num_shards=num_shards,
                drop_last=bool(drop_last),
                pad_last_batch=bool(pad_last_batch),
                stick_to_shard=bool(stick_to_shard),
            )
        else:
            self.plan = EpochPlan(
                len(dataset),
                batch_size,
                bool(shuffle),
                seed,
                shard_id,
                num_shards,
                bool(pad_last_batch),
                bool(drop_last),
                bool(stick_to_shard),
            )
            len(self.plan)  # checks the shard arguments now
        warn_if_resharded(dataset, shard_id, num_shards, f"Loader(shard_id={shard_id}, num_shards={num_shards})")
        self._fingerprint: dict[str, str] | None = None  # computed once, when a state is first asked for
        self.dataset = dataset
        self.client = client
        self.device = device
        self.with_index = bool(with_index)
        self._epoch = 0
        self._done = 0  # batches yielded so far in this epoch
        self._stats = ReadStats()

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to (0 at first)."""
        return self._epoch if self.schedule is None else self.schedule.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        if self.schedule is None:
            self._epoch = value
        else:
            self.schedule.epoch = value

    def __len__(self) -> int:
        """Batches per epoch (of the current epoch: see ``stick_to_shard``; with a sampler, of a whole epoch)."""
        if self.schedule is not None:
            return len(self.schedule)
        assert self.plan is not None
        return self.plan.count(self.epoch)

    def __repr__(self) -> str:
        s = self.schedule
        if s is not None:
            return (
                f"Loader({s.samples} samples of {self.sampler!r}, batch_size={s.batch_size}, shard "
                f"{s.shard_id}/{s.num_shards}, {len(self)} batches per epoch, epoch={self.epoch}, "
                f"shuffle={s.shuffle}, device={self.device!r})"
            )
        p = self.plan
        assert p is not None
        return (
            f"Loader({p.n} files, batch_size={p.batch_size}, shard {p.shard_id}/{p.num_shards}, "
            f"{len(self)} batches per epoch, epoch={self.epoch}, shuffle={p.shuffle}, device={self.device!r})"
        )

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration yield epoch ``epoch`` from its start."""
        if self.schedule is not None:
            self.schedule.set_epoch(epoch)
            return
        self.epoch = check_int("epoch", epoch, 0)
        self._done = 0

    def fingerprint(self) -> dict[str, str]:
        """The dataset's :func:`dataset_fingerprint`, computed once."""
        if self._fingerprint is None:
            self._fingerprint = dataset_fingerprint(self.dataset)
        return self._fingerprint

    def stats(self) -> ReadStats:
        """What reading the last epoch's patches cost: ``bytes_read``, ``patch_bytes``, ``requests``, ``io_wait_s``.

        The sums over the batches yielded by the latest pass (the epoch in
        progress while iterating, the whole epoch once it is over; a resumed
        pass counts from where it resumed). ``bytes_read / patch_bytes`` is
        the read amplification; ``io_wait_s`` sums the batches' read times
        (with prefetch threads they overlap the training step).

        Raises
        ------
        ValueError
            For a loader without ``sampler=`` (its batches are whole files or ROIs).
        """
        if self.schedule is None:
            raise ValueError("Loader.stats() counts a sampler's patch reads; this loader has no sampler=")
        return self._stats

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: its epoch, batches yielded in it, the plan and the dataset they depend on.

        With a sampler: ``epoch``, the position ``position`` (``P``: the
        samples ``[0, P)`` of the epoch are consumed), the epoch's
        ``samples``, ``seed``, ``shuffle``, the ``sampler``'s fingerprint and
        the ``dataset_fingerprint``; the same on every rank after the same
        number of batches.
        """
        if self.schedule is not None:
            assert self.sampler is not None
            return self.schedule.state(self.sampler.fingerprint(), self.fingerprint())
        assert self.plan is not None
        state = {k: getattr(self.plan, k) for k in (*_STATE_KEYS, *_LATER_KEYS)}
        state.update(epoch=self.epoch, batches_done=self._done)
        state[_FINGERPRINT] = dict(self.fingerprint())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration yields the rest of that epoch.

        A state saved before npydask recorded ``stick_to_shard`` is taken as
        ``stick_to_shard=True`` (the only behaviour then). A state saved
        before it recorded the dataset's fingerprint is accepted with an
        :class:`~npydask.errors.NpyDaskWarning`, since it cannot be checked;
        one saved before the fingerprint held ROIs, keys and fill values is
        checked for the rest, with a warning.

        With a sampler, the state may come from a loader with another
        ``num_shards``, ``shard_id``, ``batch_size`` or ``drop_last``: the next
        pass deals the epoch's remaining positions ``[P, N)`` by this
        loader's settings, each exactly once across the shards (a state at
        the end of an epoch goes on with the next epoch).

        Raises
        ------
        ValueError
            If the state was taken from a loader with another plan (dataset
            length, batch size, shuffling, seed, shards or padding) or over
            another dataset (other files, order, shapes or dtype, even of the
            same length, or the same files at other ROIs, with another
            ``.npz`` key or fill value), whose remaining batches would differ.
            With a sampler: another dataset, sampler, seed or shuffle (the
            message names each). A state of a loader with a sampler given to
            one without (or the reverse) is refused, naming it.
        """
        if self.schedule is not None:
            assert self.sampler is not None
            self.schedule.load(state, self.sampler.fingerprint(), self.fingerprint())
            return
        assert self.plan is not None
        if isinstance(state, dict) and "position" in state and "sampler" in state and "batches_done" not in state:
            raise ValueError(
                "this state was saved by a loader with sampler= (it records a position P and the sampler "
                f"{state.get('sampler')!r}); it resumes only a loader with that sampler"
            )
        missing = [k for k in (*_STATE_KEYS, "epoch", "batches_done") if k not in state]
        if missing:
            raise ValueError(f"not a Loader state: missing {missing}; pass what Loader.state_dict() returned")
        saved = {**_LATER_KEYS, **state}
        keys = (*_STATE_KEYS, *_LATER_KEYS)
        differ = [f"{k}: {saved[k]!r} != {getattr(self.plan, k)!r}" for k in keys if saved[k] != getattr(self.plan, k)]
        if differ:
            raise ValueError(f"the state belongs to a loader with another plan ({'; '.join(differ)})")
        self._check_fingerprint(state.get(_FINGERPRINT))
        epoch = check_int("epoch", state["epoch"], 0)
        done = check_int("batches_done", state["batches_done"], 0)
        if done > self.plan.count(epoch):
            raise ValueError(f"batches_done={done} exceeds the {self.plan.count(epoch)} batches of epoch {epoch}")
        self.epoch, self._done = epoch, done

    def _check_fingerprint(self, saved: Any) -> None:
        if saved is None:
            warnings.warn(
                "this Loader state has no dataset fingerprint (saved by an npydask that did not record one), "
                "so npydask cannot check that it belongs to this dataset; resuming anyway. Save a new state "
                "with Loader.state_dict() to get the check",
                NpyDaskWarning,
                stacklevel=3,
            )
            return
        mine = self.fingerprint()
        saved = saved if isinstance(saved, dict) else {}
        if "roi" not in saved and "files" in saved:
            warnings.warn(
                "this Loader state records no ROI, .npz key or fill value (saved by an npydask that did not record "
                "them), so npydask checks only its files, dtype and shapes; resuming anyway. Save a new state with "
                "Loader.state_dict() to get the whole check",
                NpyDaskWarning,
                stacklevel=3,
            )
            saved = {**mine, "files": saved["files"], "layout": saved.get("layout")}
        differ = [_differs(k, saved, mine) for k in _CHECKED if saved.get(k) != mine[k]]
        if differ:
            raise ValueError(
                f"the state was saved for another dataset of {len(self.dataset)} files: {' and '.join(differ)}. "
                "Resume with the dataset the state was saved over (same files, filter, order, shard, ROI, "
                "out_of_bounds_policy, fill_value and key), or start without load_state_dict"
            )

    def __iter__(self) -> Iterator[Any]:
        if self.schedule is not None:
            yield from self._patch_batches()
            return
        assert self.plan is not None
        epoch, start = self.epoch, self._done
        if start >= self.plan.count(epoch):  # a finished epoch recorded by a state: go on with the next
            epoch, start = epoch + 1, 0
            self.epoch, self._done = epoch, 0
        batches = self.plan.batches(epoch)[start:]
        dataset = self.dataset
        if self.client is None:
            check_process(pick(dataset, [0]))  # (before a thread starts: in a forked child, a clear error, not a hang)
            if self.device == "gpu":
                check_cuda_fork()  # (a child forked after CUDA was used: a clear error, not CUDA's)
        fetch = self._fetch(read_batch)
        ahead = max(1, self.prefetch)
        pending: deque[tuple[np.ndarray, Future[Any] | Any]] = deque()
        try:
            position = 0
            while position < len(batches) or pending:
                while position < len(batches) and len(pending) < ahead:
                    indices = batches[position]
                    pending.append((indices, fetch.submit(pick(dataset, indices.tolist()))))
                    position += 1
                indices, future = pending.popleft()
                batch = fetch.result(future)
                self._done += 1
                yield (batch, indices.copy()) if self.with_index else batch
            self.epoch, self._done = epoch + 1, 0
        finally:
            for _, future in pending:
                fetch.cancel(future)
            fetch.close()

    def _fetch(self, read: Any) -> Any:
        """Where ``read(payload, device)`` runs: the client's workers, or prefetch threads."""
        if self.client is not None:
            return _ClusterFetch(self.client, self.device, read)
        return _LocalFetch(self.prefetch, self.device, read)

    def _patch_batches(self) -> Iterator[Any]:
        """One pass of a sampler loader: the remaining batches of the schedule's pass, read ahead in order."""
        schedule, bound = self.schedule, self.bound
        assert schedule is not None and bound is not None
        epoch, batches = schedule.begin()
        if self.client is None:
            first = next(iter(dataset_members(self.dataset).values()))
            check_process(pick(first, [0]))
            if self.device == "gpu":
                check_cuda_fork()
        fetch = self._fetch(_PatchReader(self.dataset, bound, schedule.seed, schedule.shuffle))
        ahead = max(1, self.prefetch)
        pending: deque[Any] = deque()
        self._stats = ReadStats()
        try:
            position = 0
            while position < len(batches) or pending:
                while position < len(batches) and len(pending) < ahead:
                    pending.append(fetch.submit((epoch, batches[position])))
                    position += 1
                got: PatchBatch = fetch.result(pending.popleft())
                schedule.took()
                self._stats += got.stats
                yield (got.batch, got.index) if self.with_index else got.batch
            schedule.finish()
        finally:
            for future in pending:
                fetch.cancel(future)
            fetch.close()


class _PatchReader:
    """Reads a batch of a sampler loader: ``(epoch, positions)`` to a :class:`~npydask.samplers.PatchBatch`.

    Carries the dataset and the bound sampler (pure numbers): a prefetch
    thread or a cluster worker plans the boxes and reads them.
    """

    def __init__(self, dataset: Any, bound: BoundSampler, seed: int | None, shuffle: bool) -> None:
        self.dataset, self.bound, self.seed, self.shuffle = dataset, bound, seed, shuffle

    def __call__(self, job: tuple[int, np.ndarray], device: str) -> PatchBatch:
        epoch, positions = job
        patches = self.bound.patches(epoch, positions.tolist(), seed=self.seed, shuffle=self.shuffle)
        return read_patches(self.dataset, patches, self.bound, device=device)


def _call(read: Any, payload: Any, device: str) -> Any:
    """On a cluster worker: ``read(payload, device)`` (``read`` sent once, as a scattered future)."""
    return read(payload, device)


_CHECKED = ("files", "layout", "roi", "key", "fill")


def _differs(what: str, saved: dict[str, Any], mine: dict[str, str]) -> str:
    """How the saved fingerprint's ``what`` differs from this dataset's, for a message."""
    if what == "files":
        return "its file names (relative to their common folder, in order) differ"
    if what == "layout":
        return "its samples' dtype or shapes (after ROI) differ"
    if what == "roi":
        return f"its ROIs differ (the state's: {saved.get('roi_shown')}; this dataset's: {mine['roi_shown']})"
    if what == "key":
        return f"it reads another .npz key (the state's: {saved.get('key')}; this dataset's: {mine['key']})"
    return (
        f"its fill value for cells outside the files differs (the state's: {saved.get('fill')}; "
        f"this dataset's: {mine['fill']})"
    )


class _DeviceHandOff:
    """Device batches read on prefetch threads for the thread that iterates (``device="gpu"``).

    A new thread's current CUDA device is 0 and its current stream its own:
    each read runs under the device current in the iterating thread when
    iteration started (under DDP, ``torch.cuda.set_device(rank)``'s), and
    the batch is handed over with an event recorded after its last kernel on
    the reading thread's stream, which the consumer's current stream waits
    on (no host synchronisation). With numpy standing in for CuPy (the CPU
    tests) there is nothing to order.
    """

    def __init__(self) -> None:
        from npydask.gpu import array_module

        xp = array_module()
        self.cuda = None if xp is np else xp.cuda
        self.device_id = None if self.cuda is None else int(self.cuda.runtime.getDevice())

    def read(self, read: Any, payload: Any, device: str) -> tuple[Any, Any]:
        """On a prefetch thread: ``read(payload, device)``, run on the caller's device, and the event that ends it."""
        if self.cuda is None:
            return read(payload, device), None
        with self.cuda.Device(self.device_id):
            batch = read(payload, device)
            event = self.cuda.Event(disable_timing=True)
            event.record()  # (on this thread's current stream, after the batch's copy kernels)
        return batch, event

    def receive(self, done: tuple[Any, Any]) -> Any:
        """On the consumer thread: its current stream waits for the batch's kernels; the batch."""
        batch, event = done
        if event is not None and self.cuda is not None:  # (an event comes only from a device)
            self.cuda.get_current_stream().wait_event(event)
        return batch


class _LocalFetch:
    """Batches read by threads of this process (or inline with ``prefetch=0``)."""

    def __init__(self, prefetch: int, device: str, read: Any = read_batch) -> None:
        self.device = device
        self.read = read
        self.handoff = _DeviceHandOff() if prefetch and device == "gpu" else None  # (the caller's device: now)
        self.pool = ThreadPoolExecutor(prefetch, thread_name_prefix="npydask-loader") if prefetch else None

    def submit(self, payload: Any) -> Any:
        if self.pool is None:
            return payload  # read in result(), when asked for
        if self.handoff is not None:
            return self.pool.submit(self.handoff.read, self.read, payload, self.device)
        return self.pool.submit(self.read, payload, self.device)

    def result(self, future: Any) -> Any:
        if self.pool is None:
            return self.read(future, self.device)
        if self.handoff is not None:
            return self.handoff.receive(future.result())
        return future.result()

    def cancel(self, future: Any) -> None:
        if self.pool is not None:
            future.cancel()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


class _ClusterFetch:
    """Batches read as tasks on a distributed client's workers, gathered once each.

    A ``read`` that is an object (a sampler loader's :class:`_PatchReader`,
    which carries the dataset) is scattered to the workers once; each task
    then carries only its payload.
    """

    def __init__(self, client: Any, device: str, read: Any = read_batch) -> None:
        self.client = client
        self.device = device
        self.read = read if read is read_batch else client.scatter(read, broadcast=True, hash=False)

    def submit(self, payload: Any) -> Any:
        if self.read is read_batch:
            return self.client.submit(read_batch, payload, self.device, pure=False)
        return self.client.submit(_call, self.read, payload, self.device, pure=False)

    def result(self, future: Any) -> Any:
        return future.result()

    def cancel(self, future: Any) -> None:
        future.cancel()

    def close(self) -> None:
        pass
