"""Pure dealing of an epoch's sample positions to shards and DataLoader workers, and the resume position ``P``.

With a patch sampler an epoch is a sequence of ``N`` sample *positions*
``0 .. N-1``; the sampler maps each position to a file and a box from
``(seed, epoch, position)`` alone, so which process draws a position never
changes what it holds. This module decides only where each position goes,
with numbers in and numbers out (no files, no threads), one batch at a time
(nothing is built for the whole epoch):

* **Global batches.** A *pass* over an epoch starts at position ``P0``
  (``0`` at the epoch's start, the saved ``P`` when resuming). Global batch
  ``g`` holds the dealt positions ``[P0 + g*B, P0 + (g+1)*B)``.
* **One shard.** With ``S = 1`` the pass has ``G = ceil((N - P0) / B)``
  global batches, the last one short when ``N - P0`` is not a multiple of
  ``B``; ``drop_last`` drops that short batch (``G = floor((N - P0) / B)``).
* **Shards.** Shard ``k`` of ``S`` takes global batches ``k, k+S, k+2S,
  ...``: its ``i``-th batch is global batch ``k + i*S``. With ``S > 1`` a
  pass holds whole *rounds* of ``S`` global batches, so every shard holds
  the same number of batches and a data-parallel loop (DDP's gradient
  all-reduce) takes equal steps on every rank: ``G = ceil((N - P0) / (B*S))
  * S``, every batch full, the dealt positions past ``N - 1`` wrapping to
  the epoch's start (position ``p`` reads sample ``p mod N``, as PyTorch's
  ``DistributedSampler`` pads), so those samples are delivered twice in
  that epoch; with ``drop_last`` the incomplete last round is dropped
  instead, short batch included (``G = floor((N - P0) / (B*S)) * S``): no
  sample is repeated and every batch is full.
* **Workers.** DataLoader worker ``w`` of ``W`` takes its shard's batches
  ``w, w+W, w+2W, ...``. PyTorch's DataLoader returns batches from its
  workers in turn (``in_order=True``, its default), so the training loop of
  a rank receives that rank's batches in order ``0, 1, 2, ...`` whatever
  ``W`` is; this needs the DataLoader's ``batch_size`` to equal ``B``.
* **The position P.** After ``b`` batches on every shard, exactly the first
  ``b*S`` global batches are consumed: ``P = P0 + b*B*S`` while global
  batches remain, and ``P = N`` once all are (the pass is over)
  (:func:`position_after`). ``P`` depends on ``b`` alone, not on the
  shard, so every rank records the same state after the same number of
  batches. With ``S > 1``, ``P < N`` until the last round is consumed, so
  a state never points into the wrapped tail.
* **drop_last.** The samples of a dropped tail are never delivered in that
  pass, and ``P = N`` after the last batch says the pass is over, so a
  resumed loader does not deliver them either.
* **Interleaving.** Positions are read in *units* of ``per_file`` adjacent
  samples of one file. ``interleave=m`` reorders each block of ``m``
  consecutive units so that its positions take one sample of each unit in
  turn (:func:`interleaved`): ``m`` files in a row instead of ``per_file``
  samples of one. The reorder is a permutation of each block, fixed by the
  position alone, so ``P`` and the resume rules are unchanged.
* **Resume.** A pass that starts at ``P`` with any other number of shards
  ``S'``, workers ``W'`` or batch size ``B'`` deals ``[P, N)`` by the same
  rules: every remaining position exactly once across all ranks and
  workers (without ``drop_last``), plus the wrapped tail that ``S' > 1``
  needs for equal counts. The state that records ``P``, and what must agree
  to resume it, is :mod:`npydask.plan.resume`.

Examples
--------
``N=9`` positions, batches of ``B=2``, ``S=2`` shards, ``W=2`` workers each:

========  ==============  ===================  ==============
global    positions       shard (its batch i)  worker (w of 2)
========  ==============  ===================  ==============
g=0       0, 1            0 (i=0)              0
g=1       2, 3            1 (i=0)              0
g=2       4, 5            0 (i=1)              1
g=3       6, 7            1 (i=1)              1
g=4       8, 0 (wrapped)  0 (i=2)              0
g=5       1, 2 (wrapped)  1 (i=2)              0
========  ==============  ===================  ==============

After ``b = 0, 1, 2, 3`` batches per shard, ``P = 0, 4, 8, 9``. Resumed at
``P=4`` with ``S'=3`` shards of ``B'=1``, the remaining positions 4-8 are
dealt once each, and position 0 wraps in to fill the last round.

>>> deals = [Deal(9, 2, shard_id=k, num_shards=2) for k in range(2)]
>>> [[b.tolist() for b in d.batches()] for d in deals]
[[[0, 1], [4, 5], [8, 0]], [[2, 3], [6, 7], [1, 2]]]
>>> [[b.tolist() for b in deals[0].worker_batches(w, 2)] for w in range(2)]
[[[0, 1], [8, 0]], [[4, 5]]]
>>> [deals[0].position_after(b) for b in range(4)]
[0, 4, 8, 9]
>>> [[b.tolist() for b in Deal(9, 1, shard_id=k, num_shards=3, start=4).batches()] for k in range(3)]
[[[4], [7]], [[5], [8]], [[6], [0]]]
>>> [[b.tolist() for b in Deal(9, 2, shard_id=k, num_shards=2, drop_last=True).batches()] for k in range(2)]
[[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from npydask.plan.sampling import check_int

__all__ = [
    "Deal",
    "check_sampler_options",
    "global_batch_count",
    "interleaved",
    "position_after",
]


def global_batch_count(n: int, batch_size: int, *, start: int = 0, drop_last: bool = False, num_shards: int = 1) -> int:
    """Global batches of a pass over positions ``[start, n)`` dealt to ``num_shards`` shards (the module's rules).

    One shard: ``ceil((n - start) / batch_size)``, or ``floor`` with
    ``drop_last``. Several: whole rounds of ``num_shards`` batches, the last
    round completed by wrapping to the epoch's start, or dropped with
    ``drop_last``.

    Examples
    --------
    >>> global_batch_count(9, 2), global_batch_count(9, 2, drop_last=True), global_batch_count(9, 2, start=9)
    (5, 4, 0)
    >>> global_batch_count(9, 2, num_shards=2), global_batch_count(9, 2, num_shards=3, drop_last=True)
    (6, 3)
    """
    n, batch_size, start = _pass(n, batch_size, start)
    num_shards = check_int("num_shards", num_shards, 1)
    if num_shards == 1:
        full, rest = divmod(n - start, batch_size)
        return full if drop_last or not rest else full + 1
    per_round = batch_size * num_shards
    rounds = (n - start) // per_round if drop_last else -(-(n - start) // per_round)
    return rounds * num_shards


def _pass(n: int, batch_size: int, start: int) -> tuple[int, int, int]:
    """Checked ``(n, batch_size, start)`` of a pass, as Python ints."""
    n = check_int("n (the samples per epoch)", n, 0)
    batch_size = check_int("batch_size", batch_size, 1)
    start = check_int("start (the position P the pass starts at)", start, 0)
    if start > n:
        raise ValueError(f"start={start} is past the epoch's {n} samples: a position P is at most n")
    return n, batch_size, start


def position_after(
    n: int, batch_size: int, num_shards: int, batches: int, *, start: int = 0, drop_last: bool = False
) -> int:
    """The position ``P`` after ``batches`` batches on every shard of a pass that began at ``start``.

    ``P = start + batches * batch_size * num_shards`` while global batches
    remain, and ``n`` once every global batch has been dealt and consumed:
    the same on every rank. This is also ``NpyIterableDataset``'s rule for
    ``state_dict(batches_seen)``, with the DataLoader's ``batch_size`` and
    ``batches_seen`` counted by the training loop since the pass began
    (since ``load_state_dict``, when it resumed one).

    Raises
    ------
    ValueError
        ``batches`` is more than a shard holds in this pass (the loop
        counted batches of another pass, or another ``batch_size`` or
        ``num_shards``).

    Examples
    --------
    >>> [position_after(9, 2, 2, b) for b in range(4)]
    [0, 4, 8, 9]
    >>> position_after(9, 2, 2, 2, drop_last=True)  # the last round is dropped: the pass is over
    9
    >>> position_after(9, 1, 3, 1, start=4)
    7
    """
    n, batch_size, start = _pass(n, batch_size, start)
    num_shards = check_int("num_shards", num_shards, 1)
    batches = check_int("batches (the batches consumed on every shard)", batches, 0)
    total = global_batch_count(n, batch_size, start=start, drop_last=drop_last, num_shards=num_shards)
    most = -(-total // num_shards)
    if batches > most:
        raise ValueError(
            f"{batches} batches consumed, but a shard holds at most {most} in this pass ({total} global batches "
            f"of {batch_size} over positions [{start}, {n}) dealt to {num_shards} shards): count the batches "
            "taken since the pass began (since load_state_dict when resuming), with this batch_size and num_shards"
        )
    if batches * num_shards >= total:
        return n
    return start + batches * batch_size * num_shards


def interleaved(positions: np.ndarray, n: int, per_file: int, interleave: int) -> np.ndarray:
    """The sampler positions that dealt ``positions`` read when ``interleave`` units are interleaved (int64).

    The epoch's ``n`` positions form ``n // per_file`` units of ``per_file``
    adjacent positions (one file's samples). Each block of ``interleave``
    consecutive units (the last block may hold fewer) is read one sample of
    each unit in turn: dealt position ``r`` of a block of ``m`` units reads
    sample ``r // m`` of unit ``r % m``. A permutation of each block, so
    every position is still read once.

    Examples
    --------
    >>> interleaved(np.arange(12), 12, 3, 2).tolist()  # units [0 1 2] [3 4 5] | [6 7 8] [9 10 11]
    [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]
    >>> interleaved(np.arange(9), 9, 3, 2).tolist()  # a last block of one unit stays as it is
    [0, 3, 1, 4, 2, 5, 6, 7, 8]
    """
    pos = np.asarray(positions, np.int64)
    if interleave == 1 or per_file == 1:
        return pos
    units = n // per_file
    block, r = np.divmod(pos, interleave * per_file)
    m = np.minimum(interleave, units - block * interleave)
    out: np.ndarray = block * (interleave * per_file) + (r % m) * per_file + r // m
    return out


@dataclass(frozen=True)
class Deal:
    """The batches of positions one shard takes in a pass over an epoch (see the module's rules).

    Every batch is computed when asked for (:meth:`batch`, :meth:`each`),
    from a few integers: nothing grows with the epoch's size.

    Parameters
    ----------
    n : int
        Samples per epoch (``len`` of the bound sampler).
    batch_size : int
        ``B``: positions per global batch, as each rank's batch.
    shard_id, num_shards : int
        This shard ``k`` of ``S``: it takes global batches ``k, k+S, ...``.
    start : int
        ``P0``, the position the pass starts at: 0, or the ``P`` of a
        saved state (at most ``n``; ``n`` gives no batches).
    drop_last : bool
        One shard: drop the pass's short last batch. Several: drop the
        incomplete last round instead of wrapping it.
    per_file, interleave : int
        Read each block of ``interleave`` units of ``per_file`` positions
        one sample of each unit in turn (:func:`interleaved`); ``n`` must
        then be a multiple of ``per_file``. ``interleave=1`` keeps the order.

    Raises
    ------
    TypeError
        An argument that is not an integer.
    ValueError
        A negative value, ``batch_size < 1``, ``num_shards < 1``,
        ``shard_id >= num_shards``, ``start > n``, ``per_file`` or
        ``interleave`` below 1, or ``n`` not a multiple of ``per_file``.

    Examples
    --------
    >>> deal = Deal(10, 3, shard_id=1, num_shards=2)
    >>> len(deal), [b.tolist() for b in deal.batches()], deal.samples
    (2, [[3, 4, 5], [9, 0, 1]], 6)
    >>> Deal(10, 3, shard_id=1, num_shards=2, drop_last=True).positions().tolist()
    [3, 4, 5]
    >>> Deal(8, 4, per_file=2, interleave=4).batch(0).tolist()  # four files' first samples
    [0, 2, 4, 6]
    """

    n: int
    batch_size: int
    shard_id: int = 0
    num_shards: int = 1
    start: int = 0
    drop_last: bool = False
    per_file: int = 1
    interleave: int = 1

    def __post_init__(self) -> None:
        n, batch_size, start = _pass(self.n, self.batch_size, self.start)
        num_shards = check_int("num_shards", self.num_shards, 1)
        shard_id = check_int("shard_id", self.shard_id, 0)
        if shard_id >= num_shards:
            raise ValueError(f"shard_id must be in [0, num_shards), found shard_id={shard_id} num_shards={num_shards}")
        per_file = check_int("per_file", self.per_file, 1)
        interleave = check_int("interleave", self.interleave, 1)
        if interleave > 1 and n % per_file:
            raise ValueError(
                f"interleave={interleave} needs whole units: {n} samples are not a multiple of per_file={per_file}"
            )
        values = {"n": n, "batch_size": batch_size, "start": start, "num_shards": num_shards, "shard_id": shard_id}
        for name, value in {**values, "per_file": per_file, "interleave": interleave}.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "drop_last", bool(self.drop_last))

    @property
    def global_batches(self) -> int:
        """``G``, the global batches of this pass (over all shards)."""
        return global_batch_count(
            self.n, self.batch_size, start=self.start, drop_last=self.drop_last, num_shards=self.num_shards
        )

    def __len__(self) -> int:
        """This shard's batches in the pass: ``G / S`` with several shards, ``G`` with one."""
        return len(range(self.shard_id, self.global_batches, self.num_shards))

    def global_batch(self, g: int) -> np.ndarray:
        """The sample positions global batch ``g`` reads (any shard's; int64), wrapped and interleaved.

        Examples
        --------
        >>> Deal(9, 2, start=1).global_batch(3).tolist(), Deal(9, 2, num_shards=2, start=1).global_batch(3).tolist()
        ([7, 8], [7, 8])
        >>> Deal(9, 4, num_shards=2, start=1).global_batch(1).tolist()  # positions 9-12 wrap to 0-3
        [5, 6, 7, 8]
        """
        g = check_int("g", g, 0)
        if g >= self.global_batches:
            raise IndexError(f"global batch {g} out of range: the pass holds {self.global_batches}")
        lo = self.start + g * self.batch_size
        hi = lo + self.batch_size if self.num_shards > 1 else min(lo + self.batch_size, self.n)
        dealt = np.arange(lo, hi, dtype=np.int64)
        if hi > self.n:  # (several shards: the last round wraps to the epoch's start)
            dealt %= self.n
        return interleaved(dealt, self.n, self.per_file, self.interleave)

    def batch(self, i: int) -> np.ndarray:
        """This shard's ``i``-th batch: the positions of global batch ``shard_id + i * num_shards`` (int64)."""
        i = check_int("i", i, 0)
        if i >= len(self):
            raise IndexError(f"batch {i} out of range: shard {self.shard_id} of {self.num_shards} holds {len(self)}")
        return self.global_batch(self.shard_id + i * self.num_shards)

    def each(self, first: int = 0, step: int = 1) -> Iterator[np.ndarray]:
        """This shard's batches ``first, first+step, ...``, each made when the iteration reaches it.

        Examples
        --------
        >>> [b.tolist() for b in Deal(10**12, 2).each(first=1, step=10**10)][:2]
        [[2, 3], [20000000002, 20000000003]]
        """
        first = check_int("first", first, 0)
        step = check_int("step", step, 1)
        for i in range(first, len(self), step):
            yield self.batch(i)

    def batches(self) -> list[np.ndarray]:
        """This shard's batches in order (the order the rank's training loop receives them), all made at once."""
        return list(self.each())

    def worker_batches(self, worker: int, num_workers: int) -> list[np.ndarray]:
        """The batches DataLoader worker ``worker`` of ``num_workers`` yields: this shard's ``worker, worker+W, ...``.

        Workers beyond the shard's batches get none. :meth:`each` gives
        them one at a time.

        Examples
        --------
        >>> [[b.tolist() for b in Deal(8, 2).worker_batches(w, 3)] for w in range(3)]
        [[[0, 1], [6, 7]], [[2, 3]], [[4, 5]]]
        """
        num_workers = check_int("num_workers", num_workers, 1)
        worker = check_int("worker", worker, 0)
        if worker >= num_workers:
            raise ValueError(f"worker must be in [0, num_workers), found worker={worker} num_workers={num_workers}")
        return list(self.each(worker, num_workers))

    @property
    def samples(self) -> int:
        """The positions this shard delivers in the pass (its batches' total length, wrapped ones included)."""
        count = len(self)
        if not count:
            return 0
        last = self.global_batch(self.shard_id + (count - 1) * self.num_shards)
        return (count - 1) * self.batch_size + len(last)

    def positions(self) -> np.ndarray:
        """Every position this shard delivers, in order (int64)."""
        batches = self.batches()
        return np.concatenate(batches) if batches else np.empty(0, np.int64)

    def position_after(self, batches: int) -> int:
        """``P`` after ``batches`` batches on every shard (:func:`position_after`): the same on every shard."""
        return position_after(
            self.n, self.batch_size, self.num_shards, batches, start=self.start, drop_last=self.drop_last
        )


def check_sampler_options(*, pad_last_batch: bool, stick_to_shard: bool) -> None:
    """Refuse the Loader options that contiguous shards have and batch-strided shards cannot honour.

    With a sampler, shards take global batches in turn over the whole epoch
    (the module's rules), so there is no shard range to pad or to rotate.

    Raises
    ------
    ValueError
        ``pad_last_batch=True`` or ``stick_to_shard=False``.

    Examples
    --------
    >>> check_sampler_options(pad_last_batch=False, stick_to_shard=True)
    >>> check_sampler_options(pad_last_batch=True, stick_to_shard=True)
    Traceback (most recent call last):
    ...
    ValueError: pad_last_batch=True does not apply with a sampler: ...
    """
    if pad_last_batch:
        raise ValueError(
            "pad_last_batch=True does not apply with a sampler: shards take the epoch's global batches in turn, "
            "and with several shards the last round is already completed by wrapping to the epoch's start, so "
            "every shard holds as many full batches. Leave pad_last_batch=False, or pass drop_last=True to drop "
            "the incomplete last round (or, with one shard, the short last batch)"
        )
    if not stick_to_shard:
        raise ValueError(
            "stick_to_shard=False does not apply with a sampler: shards take global batches in turn over the "
            "whole epoch, so there is no shard range to rotate (every shard draws from every file). Leave "
            "stick_to_shard=True"
        )
