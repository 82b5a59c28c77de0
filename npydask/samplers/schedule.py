"""Where a loader with a sampler stands: the epoch, the pass's start ``P0``, the batches taken, and the resume state.

A :class:`Schedule` is the bookkeeping of :class:`npydask.Loader` with
``sampler=``: pure numbers over a bound sampler, no files and no threads.
A *pass* over an epoch starts at position ``P0`` (0 at the epoch's start,
the saved ``P`` when resuming) and deals the positions ``[P0, N)`` to the
shards in global batches (:class:`~npydask.plan.deal.Deal`); the schedule
counts the batches taken in the pass, and its :meth:`state` is the one
position ``P`` after them (the same on every rank), with what must agree to
resume it (:class:`~npydask.plan.resume.ResumeState`).

The schedule depends only on the batches taken: a loop that stops after
its last batch and one whose iterator ran out record the same state, and
the next pass (the next epoch once every global batch is consumed) follows
from them. Batches are dealt one at a time (:meth:`Schedule.begin` gives an
iterator), so nothing grows with the epoch's size before the first batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from npydask.plan.deal import Deal, check_sampler_options
from npydask.plan.resume import ResumeState
from npydask.plan.sampling import check_int
from npydask.samplers.base import BoundSampler

__all__ = ["Schedule", "unit_size"]


def unit_size(bound: BoundSampler, interleave: int) -> tuple[int, int]:
    """``(per_file, interleave)`` for dealing ``bound``'s positions: its unit size and ``interleave``, checked.

    Raises
    ------
    TypeError, ValueError
        ``interleave`` not an integer of at least 1, or above 1 for a
        sampler without ``per_file`` units (``Grid``).

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.samplers import Grid, Uniform
    >>> root = tempfile.mkdtemp(); np.save(os.path.join(root, "a.npy"), np.zeros((8, 8)))
    >>> unit_size(Uniform((4, 4), per_file=3).bind(npydask.open_dataset(root)), 2)
    (3, 2)
    >>> unit_size(Grid((4, 4)).bind(npydask.open_dataset(root)), 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: interleave=2 mixes the per_file patches of several files, but Grid(...) draws ...
    """
    interleave = check_int("interleave", interleave, 1)
    per_file = getattr(bound, "per_file", None)
    if not isinstance(per_file, int):
        if interleave > 1:
            raise ValueError(
                f"interleave={interleave} mixes the per_file patches of several files, but {bound.sampler!r} draws "
                "no fixed number of patches per file (Grid tiles are read file by file for stitching). Leave "
                "interleave=1 with this sampler"
            )
        return 1, interleave
    return per_file, interleave


class Schedule:
    """The passes of a sampler loader over its epochs, and their resume state.

    Parameters
    ----------
    bound : BoundSampler
        The sampler bound to the dataset (``len(bound)`` samples per epoch).
    batch_size : int
        ``B``, positions per global batch.
    seed : int or None
        The sampler's seed (``None``: the fixed default).
    shuffle : bool
        Permute the units each epoch (ignored, and recorded as ``False``,
        where the sampler's order is fixed, as :class:`~npydask.samplers.Grid`'s).
    shard_id, num_shards : int
        This shard ``k`` of ``S``: it takes global batches ``k, k+S, ...``.
    drop_last : bool
        Drop the short last batch (one shard) or the incomplete last round (several).
    pad_last_batch, stick_to_shard : bool
        Only ``False`` and ``True`` apply with a sampler
        (:func:`~npydask.plan.deal.check_sampler_options`).
    interleave : int
        Read each block of ``interleave`` units one sample of each in turn
        (:func:`~npydask.plan.deal.interleaved`); above 1 only for a sampler
        of ``per_file`` units (not ``Grid``).

    Raises
    ------
    ValueError
        ``pad_last_batch=True``, ``stick_to_shard=False``, shard arguments
        out of range, or ``interleave`` above 1 for a sampler without units.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.samplers import Uniform
    >>> root = tempfile.mkdtemp()
    >>> for i in range(5): np.save(os.path.join(root, f"{i}.npy"), np.zeros((8, 8)))
    >>> bound = Uniform((4, 4)).bind(npydask.open_dataset(root))
    >>> s = Schedule(bound, 2, shard_id=1, num_shards=2)
    >>> epoch, batches = s.begin()
    >>> len(s), [b.tolist() for b in batches]  # (the last round wraps to the epoch's start)
    (2, [[2, 3], [1, 2]])
    >>> s.took(); s.state("fp", {})["position"]
    4
    >>> s.took(); s.state("fp", {})["epoch"], s.state("fp", {})["position"], s.epoch  # (the epoch is over)
    (1, 0, 1)
    """

    def __init__(
        self,
        bound: BoundSampler,
        batch_size: int,
        *,
        seed: int | None = None,
        shuffle: bool = False,
        shard_id: int = 0,
        num_shards: int = 1,
        drop_last: bool = False,
        pad_last_batch: bool = False,
        stick_to_shard: bool = True,
        interleave: int = 1,
    ) -> None:
        check_sampler_options(pad_last_batch=bool(pad_last_batch), stick_to_shard=bool(stick_to_shard))
        per_file, interleave = unit_size(bound, interleave)
        self.bound = bound
        self.seed = seed
        self.shuffle = bool(shuffle) and not bound.shuffle_ignored
        self._deal = Deal(
            len(bound), batch_size, shard_id, num_shards, 0, bool(drop_last), per_file, interleave
        )  # (checks them all)
        self._epoch = 0
        self.start = 0  # P0: where the current pass began
        self.done = 0  # batches taken in the current pass
        self._pending: tuple[int, int] | None = None  # (epoch, P) of a loaded state, until the next set_epoch

    @property
    def batch_size(self) -> int:
        return self._deal.batch_size

    @property
    def shard_id(self) -> int:
        return self._deal.shard_id

    @property
    def num_shards(self) -> int:
        return self._deal.num_shards

    @property
    def interleave(self) -> int:
        return self._deal.interleave

    @property
    def samples(self) -> int:
        """``N``, the samples of an epoch."""
        return self._deal.n

    @property
    def epoch(self) -> int:
        """The epoch of the next batch: the next epoch once every global batch of the pass is consumed."""
        self._settle()
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch, self.start, self.done = check_int("epoch", value, 0), 0, 0

    def __len__(self) -> int:
        """This shard's batches in a whole epoch (a pass from position 0): the same on every shard when ``S > 1``."""
        return len(self._deal)

    def deal(self) -> Deal:
        """The current pass: positions ``[start, N)`` dealt to the shards."""
        d = self._deal
        return Deal(d.n, d.batch_size, d.shard_id, d.num_shards, self.start, d.drop_last, d.per_file, d.interleave)

    def _settle(self) -> None:
        """Roll a pass whose global batches are all consumed over to the next epoch, from position 0."""
        if self.done and self.deal().position_after(self.done) == self.samples:
            self._epoch, self.start, self.done = self._epoch + 1, 0, 0

    def begin(self) -> tuple[int, Iterator[np.ndarray]]:
        """Start iterating: the epoch and this shard's batches still to take in the current pass, one at a time.

        A pass whose batches are all taken rolls over to the next epoch first.
        """
        self._settle()
        return self._epoch, self.deal().each(self.done)

    def epoch_batches(self) -> list[np.ndarray]:
        """This shard's batches of a whole epoch (a pass from position 0), as positions (int64)."""
        return self._deal.batches()

    def remaining(self) -> list[np.ndarray]:
        """This shard's batches of the current pass not taken yet, as positions (int64), all made at once."""
        return list(self.begin()[1])

    def took(self) -> None:
        """One more batch of the pass was taken (yielded)."""
        self.done += 1

    def ran_out(self) -> None:
        """The pass's iteration ended: a pass that held no batch at all (``drop_last``) is over, the next epoch next.

        A pass that held batches needs nothing: the batches taken decide.
        """
        if not self.done and not len(self.deal()):
            self._epoch, self.start = self._epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` from its start, or from the loaded state's ``P`` if it is that epoch.

        After :meth:`load`, the first call keeps the state's position when it
        names the state's epoch; any other call starts its epoch at position 0.
        """
        epoch = check_int("epoch", epoch, 0)
        pending, self._pending = self._pending, None
        start = pending[1] if pending is not None and pending[0] == epoch else 0
        self._epoch, self.start, self.done = epoch, start, 0

    def resume_state(self, sampler: str, dataset: Mapping[str, str]) -> ResumeState:
        """The state after the batches taken: ``P`` (:meth:`~npydask.plan.resume.ResumeState.after`).

        It depends only on the batches taken: a pass whose global batches are
        all consumed is recorded as the next epoch at position 0.
        """
        return self._begun(sampler, dataset).after(self.deal(), self.done)

    def _begun(self, sampler: str, dataset: Mapping[str, str]) -> ResumeState:
        """The current pass as a state at its start ``P0``, with what must agree to resume it."""
        return ResumeState(
            self._epoch, self.start, self.samples, self.seed, self.shuffle, sampler, dataset, self.interleave
        )

    def state(self, sampler: str, dataset: Mapping[str, str]) -> dict[str, Any]:
        """:meth:`resume_state` as plain values (what ``state_dict()`` returns)."""
        return self.resume_state(sampler, dataset).to_dict()

    def load(self, state: Mapping[str, Any], sampler: str, dataset: Mapping[str, str]) -> None:
        """Resume from :meth:`state`'s dict: the next pass deals ``[P, N)`` of its epoch (or starts the next).

        The first :meth:`set_epoch` after it keeps that position when it
        names the state's epoch.

        Raises
        ------
        ValueError
            Not such a state (one of a loader without a sampler is named as
            such), or one of another dataset, sampler, seed, shuffle or
            interleave (:meth:`~npydask.plan.resume.ResumeState.resume`).
        """
        if isinstance(state, Mapping) and "batches_done" in state and "position" not in state:
            raise ValueError(
                "this state was saved by a loader without a sampler (it counts batches, not a position P); "
                "it resumes only a loader without sampler=. Start this loader without load_state_dict"
            )
        start = ResumeState.resume(state, self._begun(sampler, dataset))
        self._epoch, self.start, self.done = start.epoch, start.position, 0
        self._pending = (start.epoch, start.position)
