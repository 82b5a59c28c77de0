"""The :class:`Loader`: batches of a dataset, epoch after epoch (see :mod:`npydask.loader`)."""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np

from npydask._keywords import suggest_keywords
from npydask.array import check_device
from npydask.dataset.multikey import MultiKeyDataset, pick
from npydask.dataset.zipped import ZippedDataset
from npydask.errors import NpyDaskWarning
from npydask.gpu import check_cuda_fork
from npydask.loader.fetch import ClusterFetch, Counted, LocalFetch, PatchReader, check_process, read_counted
from npydask.loader.fingerprint import CHECKED, dataset_fingerprint, describe_difference, warn_if_resharded
from npydask.loader.traffic import plan_loader
from npydask.loader.window import READING, WindowReader, window_jobs, window_size
from npydask.plan.sampling import EpochPlan, check_int, check_shuffle
from npydask.samplers import BoundSampler, PatchBatch, ReadStats, Sampler
from npydask.samplers.base import dataset_members
from npydask.samplers.read import reads_spans
from npydask.samplers.schedule import Schedule

__all__ = ["Loader"]

_STATE_KEYS = ("n", "batch_size", "shuffle", "seed", "shard_id", "num_shards", "pad_last_batch", "drop_last")
_LATER_KEYS = {"stick_to_shard": True}  # added after the first states were saved: their value then
_FINGERPRINT = "dataset_fingerprint"


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
        With ``num_shards > 1`` every shard gets the same number of full
        batches: the epoch's last round is completed with samples from the
        epoch's start (delivered twice in that epoch, as PyTorch's
        ``DistributedSampler`` pads), or dropped with ``drop_last=True``.
    shuffle : bool or "shard"
        ``True``: permute the whole list each epoch with a generator seeded
        only by ``(seed, epoch)``, the same on every shard, before sharding.
        With a sampler, the sampler's units (a file's ``per_file`` patches)
        are permuted instead (ignored by ``Grid``). ``"shard"`` (without a
        sampler, with ``stick_to_shard=True``): permute only inside the
        shard's own range, by a generator seeded with ``(seed, epoch)`` and
        the range, so a shard reads the same files every epoch, in a new
        order (DALI's ``random_shuffle`` with ``stick_to_shard``); a node
        whose processes read one shard keeps the same files in its cache.
    seed : int, optional
        ``None`` is a fixed default, so separate processes agree.
    shard_id, num_shards : int
        This loader's contiguous range of each epoch's order. Sharding a
        dataset that ``open_dataset`` already sharded warns
        (:class:`~npydask.errors.NpyDaskWarning`): the shards compound.
    stick_to_shard : bool
        ``True`` (the default): every epoch reads this
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
        With a sampler and ``num_shards > 1``, drop the epoch's incomplete
        last round of batches (the short batch with it) instead of wrapping it.
    prefetch : int
        Batches read ahead: threads of this process, or tasks on ``client``'s
        workers. 0 reads each batch when it is asked for. The look-ahead
        opens one batch at a time: an epoch's first batch is read alone (over
        a link it would otherwise share the bandwidth with the others and
        arrive when they all do), then each batch taken lets one more be
        read, up to ``prefetch``. Whole files of objects in a batch are read
        at once (each member's stack, or each file where shapes differ). With a sampler,
        no ``client`` and patches read as byte spans (objects, the
        ``patch_read="spans"`` setting, ``backend="pread"``), ``prefetch >= 4``
        reads batches in windows of ``prefetch // 2``, each file once with
        all the window's boxes (grid tiles of consecutive batches share
        their spans), two windows in flight, delivered one by one in order
        (:mod:`npydask.loader.window`); boxes copied from a local file's
        mapping (the default) and ``client=`` tasks are read batch by batch.
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
    interleave : int
        With a sampler of ``per_file`` patches (``Uniform``, ``Foreground``):
        read each block of ``interleave`` consecutive files' patches one
        patch of each file in turn, so a batch mixes up to ``interleave``
        files instead of ``batch_size / per_file``. Reads stay grouped per
        file within a batch and a look-ahead window; the order depends only
        on the position, so resume stays exact (the state records it).
        ``1`` (the default) keeps each file's patches adjacent.

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
        shuffle: bool | str = False,
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
        interleave: int = 1,
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
        shuffle = check_shuffle(shuffle, sampler=sampler is not None, stick_to_shard=bool(stick_to_shard))
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
                interleave=interleave,
            )
        else:
            if check_int("interleave", interleave, 1) > 1:
                raise ValueError(
                    f"interleave={interleave} mixes the patches of several files and applies only with sampler= "
                    "(Uniform or Foreground with per_file > 1); leave interleave=1 for whole-file batches"
                )
            self.plan = EpochPlan(
                len(dataset),
                batch_size,
                shuffle,
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
        """Batches per epoch (of the current epoch: see ``stick_to_shard``; with a sampler, of a whole epoch).

        With a sampler and several shards, every shard has the same number.
        """
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
        """Make the next iteration yield epoch ``epoch`` from its start.

        With a sampler, after :meth:`load_state_dict` the first call keeps the
        state's position when it names the state's epoch, so
        ``for e in range(state["epoch"], epochs): loader.set_epoch(e)``
        resumes where the state was taken (as ``NpyIterableDataset`` does);
        any other epoch starts at its beginning.
        """
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
        """What reading the latest pass cost: bytes, requests, read time, node-cache hits, throttled requests, hedges.

        The sums over the batches yielded by the latest pass (the epoch in
        progress while iterating, the whole epoch once it is over; a resumed
        pass counts from where it resumed), counted where the batches are
        read (prefetch threads, or a cluster's workers: each task returns
        its figures with its batch). ``io_wait_s`` sums the batches' read
        times (with prefetch threads they overlap the training step).

        With a sampler, ``bytes_read``, ``patch_bytes`` and ``requests`` are
        the patch reads' (``bytes_read / patch_bytes`` is the read
        amplification; batches read together, see ``prefetch``, count their
        reads once, with the first of them). Without one, ``patch_bytes`` is
        the bytes of the samples delivered, and ``bytes_read`` and
        ``requests`` count the object-store range GETs sent (local files
        count none: the operating system reads them). Either way
        ``cache_hits``, ``cache_misses`` and ``cache_hit_bytes`` count reads
        of objects through the node cache (see ``cache=`` of
        :func:`~npydask.open_dataset`), ``throttled`` the requests that
        finally failed with HTTP 503, ``SlowDown`` or a timeout, ``hedges`` the
        range GETs sent again because the first was late (the ``remote_hedge``
        setting; without a sampler they are in ``requests`` too) and
        ``hedges_won`` those whose answer was used.
        """
        return self._stats

    def traffic_plan(self, epochs: int = 1, *, cache_bytes: int | str | None = None, prices: Any = None) -> Any:
        """What opening the dataset and the next ``epochs`` epochs of this loader (its shard) send to the store.

        Counted now, from the headers the dataset holds, the batches' order
        (the sampler's seeded draws, the shards, the look-ahead windows) and
        the remote settings, by the planners the reads use; nothing is read
        but a ``Foreground`` sampler's label index, which must exist.
        Epochs are whole, from :attr:`epoch`. ``cache_bytes`` models a node
        cache of that size under ``pin``; ``prices`` is
        ``{"get": P, "list": P, "gb": P}`` (per 1,000 requests, per 10^9
        bytes). Local files are planned as if they were objects. Returns a
        :class:`~npydask.TrafficPlan` (see :mod:`npydask.loader.traffic`).

        Raises
        ------
        ValueError
            A ``Foreground`` sampler whose label index is missing or stale
            (the message says how to build it), or a bad argument.

        Examples
        --------
        >>> import numpy as np, npydask, tempfile, os
        >>> from npydask.samplers import Uniform
        >>> root = tempfile.mkdtemp()
        >>> for i in range(4): np.save(os.path.join(root, f"{i}.npy"), np.zeros((64, 64), "u1"))
        >>> loader = npydask.Loader(npydask.open_dataset(root), 2, sampler=Uniform((8, 64)))
        >>> plan = loader.traffic_plan(2)
        >>> [(e.range_gets, e.bytes) for e in plan.epochs]
        [(4, 2048), (4, 2048)]
        """
        return plan_loader(self, epochs, cache_bytes=cache_bytes, prices=prices)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: its epoch, batches yielded in it, the plan and the dataset they depend on.

        With a sampler: ``epoch``, the position ``position`` (``P``: the
        samples ``[0, P)`` of the epoch are consumed), the epoch's
        ``samples``, ``seed``, ``shuffle``, the ``sampler``'s fingerprint and
        the ``dataset_fingerprint`` (and ``interleave`` when above 1); the
        same on every rank after the same number of batches, whether a
        rank's loop stopped after its last batch or its iterator ran out.
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
        loader's settings, each exactly once across the shards (plus the
        wrapped last round several shards need), and a state at the end of
        an epoch goes on with the next epoch. A following
        :meth:`set_epoch` of the state's epoch keeps the position.

        Raises
        ------
        ValueError
            If the state was taken from a loader with another plan (dataset
            length, batch size, shuffling, seed, shards or padding) or over
            another dataset (other files, order, shapes or dtype, even of the
            same length, or the same files at other ROIs, with another
            ``.npz`` key or fill value), whose remaining batches would differ.
            With ``shuffle="shard"``, another ``num_shards`` (it changes each
            shard's range). With a sampler: another dataset, sampler, seed or
            shuffle (the message names each). A state of a loader with a sampler given to
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
        if self.plan.shuffle == "shard" and saved["shuffle"] == "shard" and saved["num_shards"] != self.plan.num_shards:
            raise ValueError(
                f"the state was saved with shuffle='shard' and num_shards={saved['num_shards']!r}, this loader has "
                f"num_shards={self.plan.num_shards}: another num_shards changes each shard's range, so the files a "
                "shard reads would change in the middle of the epoch. Resume with "
                f"num_shards={saved['num_shards']!r}, or start the next epoch without load_state_dict"
            )
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
        differ = [describe_difference(k, saved, mine) for k in CHECKED if saved.get(k) != mine[k]]
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
        fetch = self._fetch(read_counted)
        ahead = max(1, self.prefetch)
        pending: deque[tuple[np.ndarray, Future[Any] | Any]] = deque()
        self._stats = ReadStats()
        try:
            position = 0
            opened = 1  # (the look-ahead opens a batch at a time: the first one is read alone, so it comes first)
            while position < len(batches) or pending:
                while position < len(batches) and len(pending) < opened:
                    indices = batches[position]
                    pending.append((indices, fetch.submit(pick(dataset, indices.tolist()))))
                    position += 1
                opened = min(ahead, opened + 1)
                indices, future = pending.popleft()
                got: Counted = fetch.result(future)
                batch = got.batch
                self._stats += got.stats
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
            return ClusterFetch(self.client, self.device, read)
        return LocalFetch(self.prefetch, self.device, read)

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
        self._stats = ReadStats()
        if self.client is None and window_size(self.prefetch) >= 2 and reads_spans(self.dataset):
            yield from self._window_batches(epoch, batches)
            return
        fetch = self._fetch(PatchReader(self.dataset, bound, schedule.seed, schedule.shuffle))
        ahead = max(1, self.prefetch)
        pending: deque[Any] = deque()
        opened = 1  # (as in __iter__: the first batch read alone)
        try:
            while True:
                while len(pending) < opened and (positions := next(batches, None)) is not None:
                    pending.append(fetch.submit((epoch, positions)))
                opened = min(ahead, opened + 1)
                if not pending:
                    break
                got: PatchBatch = fetch.result(pending.popleft())
                schedule.took()
                self._stats += got.stats
                yield (got.batch, got.index) if self.with_index else got.batch
            schedule.ran_out()
        finally:
            for future in pending:
                fetch.cancel(future)
            fetch.close()

    def _window_batches(self, epoch: int, batches: Iterator[np.ndarray]) -> Iterator[Any]:
        """A sampler pass read in windows of ``prefetch // 2`` batches (:mod:`npydask.loader.window`), one by one."""
        schedule, bound = self.schedule, self.bound
        assert schedule is not None and bound is not None
        fetch = LocalFetch(READING, self.device, WindowReader(self.dataset, bound, schedule.seed, schedule.shuffle))
        try:
            for got in window_jobs(fetch, epoch, batches, window_size(self.prefetch)):
                schedule.took()
                self._stats += got.stats
                yield (got.batch, got.index) if self.with_index else got.batch
            schedule.ran_out()
        finally:
            fetch.close()
