"""Where a loader with a sampler stands: the epoch, the pass's start ``P0``, the batches taken, and the resume state.

A :class:`Schedule` is the bookkeeping of :class:`npydask.Loader` with
``sampler=``: pure numbers over a bound sampler, no files and no threads.
A *pass* over an epoch starts at position ``P0`` (0 at the epoch's start,
the saved ``P`` when resuming) and deals the positions ``[P0, N)`` to the
shards in global batches (:class:`~npydask.plan.deal.Deal`); the schedule
counts the batches taken in the pass, and its :meth:`state` is the one
position ``P`` after them (the same on every rank), with what must agree to
resume it (:class:`~npydask.plan.resume.ResumeState`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npydask.plan.deal import Deal, check_sampler_options
from npydask.plan.resume import ResumeState
from npydask.plan.sampling import check_int
from npydask.samplers.base import BoundSampler

__all__ = ["Schedule"]


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
        Drop the pass's short last global batch.
    pad_last_batch, stick_to_shard : bool
        Only ``False`` and ``True`` apply with a sampler
        (:func:`~npydask.plan.deal.check_sampler_options`).

    Raises
    ------
    ValueError
        ``pad_last_batch=True``, ``stick_to_shard=False``, or shard arguments out of range.

    Examples
    --------
    >>> import numpy as np, npydask, tempfile, os
    >>> from npydask.samplers import Uniform
    >>> root = tempfile.mkdtemp()
    >>> for i in range(5): np.save(os.path.join(root, f"{i}.npy"), np.zeros((8, 8)))
    >>> bound = Uniform((4, 4)).bind(npydask.open_dataset(root))
    >>> s = Schedule(bound, 2, shard_id=1, num_shards=2)
    >>> len(s), [b.tolist() for b in s.remaining()]
    (1, [[2, 3]])
    >>> s.took(); s.state("fp", {})["position"]
    4
    >>> s.took(); s.state("fp", {})["epoch"], s.state("fp", {})["position"]  # (the epoch is over)
    (1, 0)
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
    ) -> None:
        check_sampler_options(pad_last_batch=bool(pad_last_batch), stick_to_shard=bool(stick_to_shard))
        self.bound = bound
        self.seed = seed
        self.shuffle = bool(shuffle) and not bound.shuffle_ignored
        self._deal = Deal(len(bound), batch_size, shard_id, num_shards, 0, bool(drop_last))  # (checks them all)
        self.epoch = 0
        self.start = 0  # P0: where the current pass began
        self.done = 0  # batches taken in the current pass

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
    def samples(self) -> int:
        """``N``, the samples of an epoch."""
        return self._deal.n

    def __len__(self) -> int:
        """This shard's batches in a whole epoch (a pass from position 0)."""
        return len(self._deal)

    def deal(self) -> Deal:
        """The current pass: positions ``[start, N)`` dealt to the shards."""
        return Deal(self.samples, self.batch_size, self.shard_id, self.num_shards, self.start, self._deal.drop_last)

    def begin(self) -> tuple[int, list[np.ndarray]]:
        """Start iterating: the epoch and this shard's batches still to take in the current pass.

        A pass whose batches are all taken (a state saved after its last
        batch) rolls over to the next epoch first.
        """
        left = self.remaining()
        if not left and self.done:
            self.finish()
            left = self.remaining()
        return self.epoch, left

    def remaining(self) -> list[np.ndarray]:
        """This shard's batches of the current pass not taken yet, as positions (int64)."""
        return self.deal().batches()[self.done :]

    def took(self) -> None:
        """One more batch of the pass was taken (yielded)."""
        self.done += 1

    def finish(self) -> None:
        """The pass is over: the next one is the next epoch, from position 0."""
        self.epoch, self.start, self.done = self.epoch + 1, 0, 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` from its start."""
        self.epoch, self.start, self.done = check_int("epoch", epoch, 0), 0, 0

    def resume_state(self, sampler: str, dataset: Mapping[str, str]) -> ResumeState:
        """The state after the batches taken: ``P`` (:meth:`~npydask.plan.resume.ResumeState.after`).

        A pass whose global batches are all consumed is recorded as the next
        epoch at position 0, so a rank whose iterator reached the epoch's
        end and a rank that stopped after its last batch record the same state.
        """
        return self._begun(sampler, dataset).after(self.deal(), self.done)

    def _begun(self, sampler: str, dataset: Mapping[str, str]) -> ResumeState:
        """The current pass as a state at its start ``P0``, with what must agree to resume it."""
        return ResumeState(self.epoch, self.start, self.samples, self.seed, self.shuffle, sampler, dataset)

    def state(self, sampler: str, dataset: Mapping[str, str]) -> dict[str, Any]:
        """:meth:`resume_state` as plain values (what ``state_dict()`` returns)."""
        return self.resume_state(sampler, dataset).to_dict()

    def load(self, state: Mapping[str, Any], sampler: str, dataset: Mapping[str, str]) -> None:
        """Resume from :meth:`state`'s dict: the next pass deals ``[P, N)`` of its epoch (or starts the next).

        Raises
        ------
        ValueError
            Not such a state (one of a loader without a sampler is named as
            such), or one of another dataset, sampler, seed or shuffle
            (:meth:`~npydask.plan.resume.ResumeState.resume`).
        """
        if isinstance(state, Mapping) and "batches_done" in state and "position" not in state:
            raise ValueError(
                "this state was saved by a loader without a sampler (it counts batches, not a position P); "
                "it resumes only a loader without sampler=. Start this loader without load_state_dict"
            )
        start = ResumeState.resume(state, self._begun(sampler, dataset))
        self.epoch, self.start, self.done = start.epoch, start.position, 0
