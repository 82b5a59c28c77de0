"""The resume state of a loader with a sampler: one position ``P`` per epoch, and what must agree to resume.

A pass over an epoch deals positions to shards and workers
(:mod:`npydask.plan.deal`); after the same number of batches on every rank
the positions ``[0, P)`` are consumed, the same ``P`` on every rank. A
:class:`ResumeState` records that ``P`` with what decides the samples at
each position: the dataset, the sampler, the seed and the shuffle. A
loader resumes a state when those agree (:func:`check_resumable`), with any
number of shards, workers or batch size, and deals ``[P, N)`` from there.

Both steps of a loader are here, for :class:`npydask.Loader` and the
PyTorch adapter alike: a loader describes its current pass as a state at
the pass's start ``P0``; :meth:`ResumeState.after` gives the state to save
after the batches taken, and :meth:`ResumeState.resume` the state a
loader's next pass starts at, from a saved one.

Examples
--------
>>> saved = ResumeState(epoch=1, position=64, samples=100, seed=None, shuffle=True, sampler="Uniform((8, 8))")
>>> saved.seed, ResumeState.from_dict(saved.to_dict()) == saved
(0, True)
>>> check_resumable(saved, ResumeState(0, 0, 100, 0, True, "Uniform((8, 8))"))  # epoch and P come from saved
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from npydask.plan.deal import Deal
from npydask.plan.sampling import DEFAULT_SEED, check_int

__all__ = ["STATE_KEYS", "ResumeState", "check_resumable"]


@dataclass(frozen=True)
class ResumeState:
    """Where a pass over an epoch stands, the same on every rank: what a sampler loader's ``state_dict`` holds.

    Parameters
    ----------
    epoch : int
        The epoch in progress.
    position : int
        ``P``: the positions ``[0, P)`` of the epoch are consumed (``P =
        samples``: the epoch is over; the next pass is epoch ``epoch + 1``).
    samples : int
        ``N``, the samples of the epoch (a check: ``P <= N``).
    seed : int
        The seed (``None`` is recorded as :data:`~npydask.plan.sampling.DEFAULT_SEED`,
        the generator it stands for).
    shuffle : bool
        Whether units are permuted each epoch.
    sampler : str
        The sampler's fingerprint (its parameters).
    dataset : dict of str to str
        The dataset's fingerprint (``npydask.loader.dataset_fingerprint``).
        Keys ending in ``_shown`` describe another key for messages and
        are not compared.
    interleave : int
        The units read in turn (:func:`~npydask.plan.deal.interleaved`);
        recorded only when above 1, so a state without it means 1.

    Examples
    --------
    >>> state = ResumeState(0, 8, 9, None, False, "Uniform((4,))", {"files": "ab"})
    >>> state.seed, ResumeState.from_dict(state.to_dict()) == state
    (0, True)
    """

    epoch: int
    position: int
    samples: int
    seed: int | None
    shuffle: bool
    sampler: str
    dataset: Mapping[str, str] = field(default_factory=dict)
    interleave: int = 1

    def __post_init__(self) -> None:
        epoch = check_int("epoch", self.epoch, 0)
        samples = check_int("samples", self.samples, 0)
        position = check_int("position", self.position, 0)
        if position > samples:
            raise ValueError(f"position={position} is past the epoch's {samples} samples: P is at most the samples")
        seed = DEFAULT_SEED if self.seed is None else check_int("seed", self.seed, 0)
        if not isinstance(self.shuffle, (bool, np.bool_)):
            raise TypeError(f"shuffle must be True or False, found {self.shuffle!r}")
        if not isinstance(self.sampler, str):
            raise TypeError(f"sampler must be the sampler's fingerprint (a str), found {self.sampler!r}")
        dataset = self.dataset
        if not isinstance(dataset, Mapping) or not all(isinstance(k, str) for k in dataset):
            raise TypeError(f"dataset must be the dataset's fingerprint (a dict of str), found {dataset!r}")
        interleave = check_int("interleave", self.interleave, 1)
        for name, value in (("epoch", epoch), ("samples", samples), ("position", position), ("seed", seed)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "interleave", interleave)
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        object.__setattr__(self, "dataset", dict(dataset))

    def rolled_over(self) -> ResumeState:
        """Where the next pass starts: this state, or the start of the next epoch when this one is over.

        A state taken after the last batch of an epoch records ``P = N``;
        resuming it goes on with epoch ``epoch + 1`` from position 0.

        Examples
        --------
        >>> over, midway = ResumeState(3, 9, 9, 0, False, "s"), ResumeState(3, 8, 9, 0, False, "s")
        >>> over.rolled_over().epoch, midway.rolled_over().epoch
        (4, 3)
        """
        if self.position < self.samples:
            return self
        return replace(self, epoch=self.epoch + 1, position=0)

    def after(self, deal: Deal, batches: int) -> ResumeState:
        """The state to save after ``batches`` batches on every shard of the pass ``deal``, which this state begins.

        ``self`` is a loader's current pass: its epoch, with ``position`` the
        pass's start ``P0`` (``deal.start``). The result holds ``P``
        (:meth:`~npydask.plan.deal.Deal.position_after`), rolled over
        (:meth:`rolled_over`): a pass whose global batches are all consumed
        is recorded as the next epoch at position 0, so a rank whose
        iterator reached the epoch's end and a rank that stopped after its
        last batch record the same state.

        Parameters
        ----------
        deal : Deal
            The pass: positions ``[self.position, self.samples)`` dealt in
            global batches to the shards (any shard of it: ``P`` does not
            depend on which).
        batches : int
            The batches taken on every shard since the pass began.

        Raises
        ------
        ValueError
            ``batches`` is more than a shard holds in the pass, or ``deal``
            is not a pass over this state's samples from its position.

        Examples
        --------
        >>> from npydask.plan.deal import Deal
        >>> begun = ResumeState(2, 0, 9, 0, False, "Uniform((4,))")
        >>> [(s.epoch, s.position) for s in (begun.after(Deal(9, 2, num_shards=2), b) for b in range(4))]
        [(2, 0), (2, 4), (2, 8), (3, 0)]
        """
        if (deal.n, deal.start) != (self.samples, self.position):
            raise ValueError(
                f"the pass deals positions [{deal.start}, {deal.n}), but the state begins at position "
                f"{self.position} of {self.samples} samples: describe the pass with the state at its start"
            )
        return replace(self, position=deal.position_after(batches)).rolled_over()

    @classmethod
    def resume(cls, saved: Mapping[str, Any], current: ResumeState) -> ResumeState:
        """Where a loader's next pass starts when it resumes ``saved``: that state, checked and rolled over.

        ``saved`` is a state's plain values (:meth:`to_dict`, what a
        ``state_dict()`` returned) and ``current`` the state of the loader
        that resumes it (its epoch and position are not compared). The
        result's epoch and position are the next pass's: the state's own,
        or the next epoch from position 0 when the state was taken at an
        epoch's end (:meth:`rolled_over`).

        Raises
        ------
        ValueError
            Not a state (:meth:`from_dict`), or one of another dataset,
            sampler, seed, shuffle or number of samples
            (:func:`check_resumable`, naming each difference).

        Examples
        --------
        >>> loader = ResumeState(0, 0, 9, 7, True, "Uniform((4,))", {"files": "ab"})
        >>> saved = {"epoch": 2, "position": 9, "samples": 9, "seed": 7, "shuffle": True,
        ...          "sampler": "Uniform((4,))", "dataset_fingerprint": {"files": "ab"}}
        >>> start = ResumeState.resume(saved, loader)
        >>> start.epoch, start.position
        (3, 0)
        """
        state = cls.from_dict(saved)
        check_resumable(state, current)
        return state.rolled_over()

    def to_dict(self) -> dict[str, Any]:
        """The state as plain values (for ``torch.save``, JSON or pickle): :data:`STATE_KEYS` as keys.

        ``"interleave"`` follows them when it is above 1.
        """
        state = {
            "epoch": self.epoch,
            "position": self.position,
            "samples": self.samples,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "sampler": self.sampler,
            "dataset_fingerprint": dict(self.dataset),
        }
        if self.interleave > 1:
            state["interleave"] = self.interleave
        return state

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ResumeState:
        """A state from :meth:`to_dict`'s dict, checked.

        Raises
        ------
        ValueError
            Not a mapping, a key missing, or a value of the wrong type or
            range (the message names it and says where a state comes from).
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"a loader state is a dict from state_dict(), found {type(state).__name__}")
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise ValueError(
                f"not the state of a loader with a sampler: missing {missing}; pass what state_dict() of a "
                "loader with sampler= returned (a state saved without a sampler resumes only without one)"
            )
        try:
            return cls(
                state["epoch"],
                state["position"],
                state["samples"],
                state["seed"],
                state["shuffle"],
                state["sampler"],
                state["dataset_fingerprint"],
                state.get("interleave", 1),
            )
        except TypeError as e:
            raise ValueError(f"not a valid loader state: {e}") from e


STATE_KEYS = ("epoch", "position", "samples", "seed", "shuffle", "sampler", "dataset_fingerprint")
"""The keys of :meth:`ResumeState.to_dict`."""


def check_resumable(saved: ResumeState, current: ResumeState) -> None:
    """Raise unless a pass described by ``current`` may resume from ``saved``.

    The dataset (its fingerprint), the sampler, the seed, the shuffle and
    the interleave must agree, and with them the epoch's samples; the epoch and position
    of ``current`` are not compared (``saved``'s are the ones to resume
    at), and neither is anything about shards, workers or batch size, which
    a resumed pass may change.

    Raises
    ------
    ValueError
        Naming each difference: another dataset (which fingerprint keys),
        sampler, seed, shuffle or number of samples.

    Examples
    --------
    >>> saved = ResumeState(1, 64, 128, 7, True, "Uniform((4, 4))", {"files": "ab"})
    >>> check_resumable(saved, ResumeState(0, 0, 128, 7, True, "Uniform((4, 4))", {"files": "ab"}))
    >>> check_resumable(saved, ResumeState(0, 0, 128, 8, False, "Uniform((4, 4))", {"files": "ab"}))
    Traceback (most recent call last):
    ...
    ValueError: the state cannot resume this loader: another seed (the state's 7, this loader's 8); ...
    """
    differ = []
    changed = sorted(
        k
        for k in set(saved.dataset) | set(current.dataset)
        if not k.endswith("_shown") and saved.dataset.get(k) != current.dataset.get(k)
    )
    if changed:
        shown = [
            f"{k}: the state's {saved.dataset.get(k + '_shown')}, this loader's {current.dataset.get(k + '_shown')}"
            for k in changed
            if k + "_shown" in saved.dataset and k + "_shown" in current.dataset
        ]
        differ.append(
            f"another dataset (its fingerprint differs in {', '.join(changed)}"
            + (f"; {'; '.join(shown)}" if shown else "")
            + ")"
        )
    if saved.sampler != current.sampler:
        differ.append(f"another sampler (the state's {saved.sampler!r}, this loader's {current.sampler!r})")
    if saved.seed != current.seed:
        differ.append(f"another seed (the state's {saved.seed}, this loader's {current.seed})")
    if saved.shuffle != current.shuffle:
        differ.append(f"another shuffle (the state's {saved.shuffle}, this loader's {current.shuffle})")
    if saved.interleave != current.interleave:
        differ.append(f"another interleave (the state's {saved.interleave}, this loader's {current.interleave})")
    if not differ and saved.samples != current.samples:
        differ.append(
            f"another number of samples per epoch (the state's {saved.samples}, this loader's {current.samples})"
        )
    if differ:
        raise ValueError(
            f"the state cannot resume this loader: {'; '.join(differ)}. Resume with the dataset, sampler, seed, "
            "shuffle and interleave the state was saved with (num_shards, the number of workers and batch_size may "
            "differ), or start without load_state_dict"
        )
