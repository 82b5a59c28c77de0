"""Pure epoch plans for the training loader: shuffles, shards, padding and batches (DALI semantics).

Everything here maps numbers to numbers, with no files and no threads, so
the DALI tables are tested directly:

* **Order.** Without shuffling an epoch visits the files in dataset order.
  With it, the whole list is permuted by a generator seeded only with
  ``(seed, epoch)`` (``seed=None`` is the fixed :data:`DEFAULT_SEED`): every
  shard computes the same permutation, so shards stay disjoint within an
  epoch, and each epoch differs. With ``shuffle="shard"`` only each shard's
  own range is permuted, by a generator seeded with ``(seed, epoch,
  range)`` (:func:`shard_permutation`): a shard reads the same files every
  epoch, in a new order.
* **Shards** are contiguous ranges of that order: shard ``k`` of ``S``
  holds positions ``[floor(N*k/S), floor(N*(k+1)/S))``. With
  ``stick_to_shard=True`` (npydask's default) a shard reads its own range
  every epoch; with ``stick_to_shard=False`` (DALI's default) it moves on to
  the next shard's range every epoch, ``(k + epoch) mod S``, so over ``S``
  epochs every shard reads the whole list (:func:`epoch_shard`).
* **Padding** (``pad_last_batch``) repeats the shard's last sample until the
  shard holds ``ceil(N/S)`` samples (so every shard has as many), then up to
  a whole number of batches. Without it the last batch is short, or dropped
  with ``drop_last``.

Examples
--------
N=10 files, S=3 shards, batches of 3, padded (DALI's table):

>>> [[b.tolist() for b in epoch_batches(10, 3, shard_id=k, num_shards=3, pad_last_batch=True)] for k in range(3)]
[[[0, 1, 2], [2, 2, 2]], [[3, 4, 5], [5, 5, 5]], [[6, 7, 8], [9, 9, 9]]]
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_SEED",
    "EpochPlan",
    "SHUFFLES",
    "batch_count",
    "check_int",
    "check_shuffle",
    "epoch_batches",
    "epoch_order",
    "epoch_shard",
    "shard_permutation",
    "shard_range",
    "shard_samples",
]

DEFAULT_SEED = 0
"""The seed ``seed=None`` stands for: fixed, so that separate shard processes agree."""

SHUFFLES = (False, True, "shard")
"""The values of ``shuffle``: dataset order, the whole list permuted, or each shard's own range permuted."""


def check_shuffle(
    shuffle: object, *, what: str = "Loader", sampler: bool = False, stick_to_shard: bool = True
) -> bool | str:
    """``shuffle`` as ``False``, ``True`` or ``"shard"``, for ``what`` (with a ``sampler`` or not).

    Raises
    ------
    ValueError
        Any other value, naming the choices; ``"shard"`` with a sampler (it
        deals batches across the whole dataset) or with
        ``stick_to_shard=False`` (the shard's range moves every epoch).

    Examples
    --------
    >>> check_shuffle(np.bool_(True)), check_shuffle("shard")
    (True, 'shard')
    >>> check_shuffle("shards", what="NpyIterableDataset")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: NpyIterableDataset: shuffle must be one of (False, True, 'shard'): ...
    """
    if isinstance(shuffle, (bool, np.bool_)) or (type(shuffle) is int and shuffle in (0, 1)):
        return bool(shuffle)
    if not (isinstance(shuffle, str) and shuffle == "shard"):
        raise ValueError(
            f"{what}: shuffle must be one of {SHUFFLES}: False (dataset order), True (the whole list permuted "
            "every epoch, then sharded) or 'shard' (each shard's own range permuted, so a shard reads the same "
            f"files every epoch); found {shuffle!r}"
        )
    if sampler:
        raise ValueError(
            f"{what}: shuffle='shard' applies only without sampler=: a sampler deals global batches across the "
            "whole dataset, so every shard reads from all of it. To give a node its own files, open its share "
            "with npydask.open_dataset(..., shard_id=, num_shards=) and use shuffle=True over it"
        )
    if not stick_to_shard:
        raise ValueError(
            f"{what}: shuffle='shard' permutes inside the shard's own range so that it reads the same files every "
            "epoch, but stick_to_shard=False moves the shard to another range each epoch; use "
            "stick_to_shard=True with shuffle='shard', or shuffle=True"
        )
    return "shard"


def shard_permutation(r: range, epoch: int, seed: int | None = None) -> np.ndarray:
    """The indices of range ``r`` in epoch ``epoch``'s order under ``shuffle="shard"``.

    The generator is seeded with ``(seed, epoch, r.start, r.stop)`` only
    (``seed=None`` is :data:`DEFAULT_SEED`), so the order depends on the
    seed, the epoch and the range, the same in every process that reads it.

    Examples
    --------
    >>> a, b = shard_permutation(range(3, 9), 0), shard_permutation(range(3, 9), 1)
    >>> sorted(a.tolist()) == list(range(3, 9)) and a.tolist() != b.tolist()
    True
    >>> shard_permutation(range(3, 9), 4, 7).tolist() == shard_permutation(range(3, 9), 4, 7).tolist()
    True
    """
    epoch = check_int("epoch", epoch, 0)
    seed = DEFAULT_SEED if seed is None else check_int("seed", seed, 0)
    rng = np.random.default_rng([seed, epoch, r.start, r.stop])
    return (r.start + rng.permutation(len(r))).astype(np.int64)


def check_int(name: str, value: object, low: int) -> int:
    """``value`` as a Python int of at least ``low``, for an argument called ``name``.

    Raises
    ------
    TypeError
        ``value`` is not an integer (``bool`` included).
    ValueError
        ``value`` is below ``low``.

    Examples
    --------
    >>> check_int("epoch", np.int64(3), 0)
    3
    >>> check_int("batch_size", 0, 1)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be at least 1, found 0
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an integer, found {value!r}")
    v: int = value.__index__()
    if v < low:
        raise ValueError(f"{name} must be at least {low}, found {v}")
    return v


def shard_range(n: int, shard_id: int, num_shards: int) -> range:
    """Indices of the files shard ``shard_id`` of ``num_shards`` holds, as DALI splits them.

    Shard ``k`` of ``S`` over ``N`` files is ``range(N*k // S, N*(k+1) // S)``:
    contiguous, in order, sizes differing by at most one (DALI's
    ``start_index``).

    Raises
    ------
    ValueError
        A value that is not an integer or is negative, ``num_shards < 1``,
        ``shard_id >= num_shards``, or more shards than files (DALI refuses
        that too).

    Examples
    --------
    >>> [shard_range(10, k, 3) for k in range(3)]
    [range(0, 3), range(3, 6), range(6, 10)]
    """
    n = _count(n, "n (the number of files)")
    shard_id = _count(shard_id, "shard_id")
    num_shards = _count(num_shards, "num_shards")
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    if shard_id >= num_shards:
        raise ValueError(f"shard_id must be in [0, num_shards); got shard_id={shard_id} with num_shards={num_shards}")
    if num_shards > n:
        raise ValueError(
            f"num_shards={num_shards} is more than the {n} files; every shard needs at least one "
            "file: use fewer shards or more files"
        )
    return range(n * shard_id // num_shards, n * (shard_id + 1) // num_shards)


def _count(value: object, name: str) -> int:
    """A non-negative Python int from an int-like value (``bool`` refused)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError as e:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}") from e
    if number < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {number}")
    return number


def epoch_order(
    n: int, epoch: int, *, shuffle: bool | str = False, seed: int | None = None, within: range | None = None
) -> np.ndarray:
    """The order of all ``n`` dataset indices in ``epoch`` (before sharding).

    With ``shuffle="shard"`` only the positions ``within`` (the range of
    the shard that reads them) are permuted (:func:`shard_permutation`);
    the rest stay in dataset order.

    Examples
    --------
    >>> epoch_order(5, 0).tolist()
    [0, 1, 2, 3, 4]
    >>> a, b = epoch_order(8, 0, shuffle=True), epoch_order(8, 1, shuffle=True)
    >>> sorted(a.tolist()) == list(range(8)) and a.tolist() != b.tolist()
    True
    >>> epoch_order(8, 3, shuffle=True, seed=7).tolist() == epoch_order(8, 3, shuffle=True, seed=7).tolist()
    True
    >>> sorted(epoch_order(8, 0, shuffle="shard", within=range(2, 5))[2:5].tolist())
    [2, 3, 4]
    """
    n = check_int("the dataset length", n, 0)
    epoch = check_int("epoch", epoch, 0)
    if shuffle == "shard":
        order = np.arange(n, dtype=np.int64)
        if within is not None:
            order[within.start : within.stop] = shard_permutation(within, epoch, seed)
        return order
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    seed = DEFAULT_SEED if seed is None else check_int("seed", seed, 0)
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


def epoch_shard(shard_id: int, num_shards: int, epoch: int, *, stick_to_shard: bool = True) -> int:
    """The shard whose range shard ``shard_id`` reads in ``epoch``.

    Its own with ``stick_to_shard=True``; the next one every epoch with
    ``stick_to_shard=False``, as DALI's readers advance after each epoch.

    Examples
    --------
    >>> [epoch_shard(1, 3, e) for e in range(4)], [epoch_shard(1, 3, e, stick_to_shard=False) for e in range(4)]
    ([1, 1, 1, 1], [1, 2, 0, 1])
    """
    epoch = check_int("epoch", epoch, 0)
    num_shards = check_int("num_shards", num_shards, 1)
    shard_id = check_int("shard_id", shard_id, 0)
    if shard_id >= num_shards:
        raise ValueError(f"shard_id must be in [0, num_shards), found shard_id={shard_id} num_shards={num_shards}")
    return shard_id if stick_to_shard else (shard_id + epoch) % num_shards


def shard_samples(
    order: np.ndarray, *, shard_id: int = 0, num_shards: int = 1, batch_size: int = 1, pad_last_batch: bool = False
) -> np.ndarray:
    """The samples of shard ``shard_id`` in epoch ``order``, padded as DALI pads them.

    Examples
    --------
    >>> shard_samples(np.arange(10), shard_id=0, num_shards=3, batch_size=3, pad_last_batch=True).tolist()
    [0, 1, 2, 2, 2, 2]
    >>> shard_samples(np.arange(10), shard_id=2, num_shards=3).tolist()
    [6, 7, 8, 9]
    """
    batch_size = check_int("batch_size", batch_size, 1)
    n = len(order)
    r = shard_range(n, shard_id, num_shards)
    mine = np.asarray(order[r.start : r.stop], dtype=np.int64)
    if not pad_last_batch or len(mine) == 0:
        return mine
    target = math.ceil(n / num_shards)
    target = math.ceil(target / batch_size) * batch_size
    return np.concatenate([mine, np.full(target - len(mine), mine[-1], np.int64)])


def epoch_batches(
    n: int,
    batch_size: int,
    *,
    epoch: int = 0,
    shuffle: bool | str = False,
    seed: int | None = None,
    shard_id: int = 0,
    num_shards: int = 1,
    pad_last_batch: bool = False,
    drop_last: bool = False,
    stick_to_shard: bool = True,
) -> list[np.ndarray]:
    """The batches (arrays of dataset indices) shard ``shard_id`` reads in ``epoch``.

    Examples
    --------
    >>> [b.tolist() for b in epoch_batches(7, 3)]
    [[0, 1, 2], [3, 4, 5], [6]]
    >>> [b.tolist() for b in epoch_batches(7, 3, drop_last=True)]
    [[0, 1, 2], [3, 4, 5]]
    >>> [b.tolist() for e in range(3) for b in epoch_batches(6, 2, epoch=e, num_shards=3, stick_to_shard=False)]
    [[0, 1], [2, 3], [4, 5]]
    """
    shard_id = epoch_shard(shard_id, num_shards, epoch, stick_to_shard=stick_to_shard)
    within = shard_range(n, shard_id, num_shards) if shuffle == "shard" else None
    order = epoch_order(n, epoch, shuffle=shuffle, seed=seed, within=within)
    samples = shard_samples(
        order, shard_id=shard_id, num_shards=num_shards, batch_size=batch_size, pad_last_batch=pad_last_batch
    )
    count = batch_count(
        n, batch_size, shard_id=shard_id, num_shards=num_shards, pad_last_batch=pad_last_batch, drop_last=drop_last
    )
    return [samples[i * batch_size : (i + 1) * batch_size] for i in range(count)]


def batch_count(
    n: int,
    batch_size: int,
    *,
    shard_id: int = 0,
    num_shards: int = 1,
    pad_last_batch: bool = False,
    drop_last: bool = False,
) -> int:
    """Batches per epoch for a shard: the same every epoch (shards are ranges of positions).

    Examples
    --------
    >>> batch_count(10, 3, num_shards=3, pad_last_batch=True), batch_count(10, 3, num_shards=3, shard_id=2)
    (2, 2)
    >>> batch_count(10, 3, num_shards=3, shard_id=2, drop_last=True)
    1
    """
    n = check_int("the dataset length", n, 0)
    batch_size = check_int("batch_size", batch_size, 1)
    r = shard_range(n, shard_id, num_shards)
    size = len(r)
    if size == 0:
        return 0
    if pad_last_batch:
        return math.ceil(math.ceil(n / num_shards) / batch_size)
    return size // batch_size if drop_last else math.ceil(size / batch_size)


@dataclass(frozen=True)
class EpochPlan:
    """Everything that decides which batches a loader yields, and in which order."""

    n: int
    batch_size: int
    shuffle: bool | str
    seed: int | None
    shard_id: int
    num_shards: int
    pad_last_batch: bool
    drop_last: bool
    stick_to_shard: bool = True

    def batches(self, epoch: int) -> list[np.ndarray]:
        """Epoch ``epoch``'s batches of dataset indices for this shard."""
        return epoch_batches(
            self.n,
            self.batch_size,
            epoch=epoch,
            shuffle=self.shuffle,
            seed=self.seed,
            shard_id=self.shard_id,
            num_shards=self.num_shards,
            pad_last_batch=self.pad_last_batch,
            drop_last=self.drop_last,
            stick_to_shard=self.stick_to_shard,
        )

    def count(self, epoch: int) -> int:
        """Batches in epoch ``epoch``: the same every epoch, except that without padding a rotating
        shard (``stick_to_shard=False``) of unequal ranges may hold one batch more or less."""
        shard = epoch_shard(self.shard_id, self.num_shards, epoch, stick_to_shard=self.stick_to_shard)
        return batch_count(
            self.n,
            self.batch_size,
            shard_id=shard,
            num_shards=self.num_shards,
            pad_last_batch=self.pad_last_batch,
            drop_last=self.drop_last,
        )

    def __len__(self) -> int:
        """Batches of the shard's own range (epoch 0)."""
        return self.count(0)
