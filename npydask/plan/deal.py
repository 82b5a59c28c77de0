"""Pure dealing of an epoch's sample positions to shards and DataLoader workers, and the resume position ``P``.

With a patch sampler an epoch is a sequence of ``N`` sample *positions*
``0 .. N-1``; the sampler maps each position to a file and a box from
``(seed, epoch, position)`` alone, so which process draws a position never
changes what it holds. This module decides only where each position goes,
with numbers in and numbers out (no files, no threads):

* **Global batches.** A *pass* over an epoch starts at position ``P0``
  (``0`` at the epoch's start, the saved ``P`` when resuming). Global batch
  ``g`` holds the positions ``[P0 + g*B, min(P0 + (g+1)*B, N))``: all are
  full but the last, which is short when ``N - P0`` is not a multiple of
  ``B``. A pass has ``G = ceil((N - P0) / B)`` global batches, or
  ``floor((N - P0) / B)`` with ``drop_last`` (the short one is dropped).
* **Shards.** Shard ``k`` of ``S`` takes global batches ``k, k+S, k+2S,
  ...``: its ``i``-th batch is global batch ``k + i*S``. Shards hold
  ``ceil((G - k) / S)`` batches, so counts differ by at most one, the
  short batch (if any) is the last batch of the shard that holds it, and
  near an epoch's end a shard may hold none. A data-parallel loop whose
  ranks must take equal steps (DDP's gradient all-reduce) stops them all
  after ``G // S`` batches (the last shard's count) or uses PyTorch's
  ``Join``; nothing is repeated to even the counts out.
* **Workers.** DataLoader worker ``w`` of ``W`` takes its shard's batches
  ``w, w+W, w+2W, ...``. PyTorch's DataLoader returns batches from its
  workers in turn (``in_order=True``, its default), so the training loop of
  a rank receives that rank's batches in order ``0, 1, 2, ...`` whatever
  ``W`` is; this needs the DataLoader's ``batch_size`` to equal ``B``.
* **The position P.** After ``b`` batches on every shard (a shard that
  holds fewer has consumed all of its own), exactly the first
  ``min(b*S, G)`` global batches are consumed, which are the positions
  ``[P0, P)`` with ``P = P0 + b*B*S`` while ``b*S < G``, and ``P = N``
  once ``b*S >= G`` (the pass is over) (:func:`position_after`). ``P``
  depends on ``b`` alone, not on the shard, so every rank records the same
  state after the same number of batches, also at the epoch's tail where
  shards hold unequal counts and finish at different ``b``.
* **drop_last.** The samples of a dropped short batch are never delivered
  in that pass, and ``P = N`` after the last full batch says the pass is
  over, so a resumed loader does not deliver them either: with
  ``drop_last`` an epoch delivers each position at most once, and every
  position of ``[P0, N)`` but the last ``(N - P0) mod B``.
* **Resume.** A pass that starts at ``P`` with any other number of shards
  ``S'``, workers ``W'`` or batch size ``B'`` deals ``[P, N)`` by the same
  rules: every remaining position exactly once across all ranks and
  workers (without ``drop_last``). The state that records ``P``, and what
  must agree to resume it, is :mod:`npydask.plan.resume`.

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
g=4       8 (short)       0 (i=2)              0
========  ==============  ===================  ==============

After ``b = 0, 1, 2, 3`` batches per shard, ``P = 0, 4, 8, 9``: at ``b=2``
shard 1 is done and shard 0 still holds position 8, which ``P = 8`` leaves
to come. Resumed at ``P=4`` with ``S'=3`` shards of ``B'=1``, the
remaining positions 4-8 are dealt once each.

>>> deals = [Deal(9, 2, shard_id=k, num_shards=2) for k in range(2)]
>>> [[b.tolist() for b in d.batches()] for d in deals]
[[[0, 1], [4, 5], [8]], [[2, 3], [6, 7]]]
>>> [[b.tolist() for b in deals[0].worker_batches(w, 2)] for w in range(2)]
[[[0, 1], [8]], [[4, 5]]]
>>> [deals[0].position_after(b) for b in range(4)]
[0, 4, 8, 9]
>>> [[b.tolist() for b in Deal(9, 1, shard_id=k, num_shards=3, start=4).batches()] for k in range(3)]
[[[4], [7]], [[5], [8]], [[6]]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npydask.plan.sampling import check_int

__all__ = [
    "Deal",
    "check_sampler_options",
    "global_batch_count",
    "position_after",
]


def global_batch_count(n: int, batch_size: int, *, start: int = 0, drop_last: bool = False) -> int:
    """Global batches of a pass over positions ``[start, n)``: ``ceil``, or ``floor`` with ``drop_last``.

    Examples
    --------
    >>> global_batch_count(9, 2), global_batch_count(9, 2, drop_last=True), global_batch_count(9, 2, start=9)
    (5, 4, 0)
    """
    n, batch_size, start = _pass(n, batch_size, start)
    full, rest = divmod(n - start, batch_size)
    return full if drop_last or not rest else full + 1


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
    remain, and ``n`` once every global batch has been dealt and consumed
    (a shard that holds fewer than ``batches`` has consumed all of its own):
    the same on every rank. This is also ``NpyIterableDataset``'s rule for
    ``state_dict(batches_seen)``, with the DataLoader's ``batch_size`` and
    ``batches_seen`` counted by the training loop since the pass began
    (since ``load_state_dict``, when it resumed one).

    Raises
    ------
    ValueError
        ``batches`` is more than the largest shard holds in this pass (the
        loop counted batches of another pass, or another ``batch_size`` or
        ``num_shards``).

    Examples
    --------
    >>> [position_after(9, 2, 2, b) for b in range(4)]
    [0, 4, 8, 9]
    >>> position_after(9, 2, 2, 2, drop_last=True)  # the short batch of position 8 is dropped: the pass is over
    9
    >>> position_after(9, 1, 3, 1, start=4)
    7
    """
    n, batch_size, start = _pass(n, batch_size, start)
    num_shards = check_int("num_shards", num_shards, 1)
    batches = check_int("batches (the batches consumed on every shard)", batches, 0)
    total = global_batch_count(n, batch_size, start=start, drop_last=drop_last)
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


@dataclass(frozen=True)
class Deal:
    """The batches of positions one shard takes in a pass over an epoch (see the module's rules).

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
        Drop the pass's short last global batch instead of dealing it.

    Raises
    ------
    TypeError
        An argument that is not an integer.
    ValueError
        A negative value, ``batch_size < 1``, ``num_shards < 1``,
        ``shard_id >= num_shards`` or ``start > n``.

    Examples
    --------
    >>> deal = Deal(10, 3, shard_id=1, num_shards=2)
    >>> len(deal), [b.tolist() for b in deal.batches()], deal.samples
    (2, [[3, 4, 5], [9]], 4)
    >>> Deal(10, 3, shard_id=1, num_shards=2, drop_last=True).positions().tolist()
    [3, 4, 5]
    """

    n: int
    batch_size: int
    shard_id: int = 0
    num_shards: int = 1
    start: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        n, batch_size, start = _pass(self.n, self.batch_size, self.start)
        num_shards = check_int("num_shards", self.num_shards, 1)
        shard_id = check_int("shard_id", self.shard_id, 0)
        if shard_id >= num_shards:
            raise ValueError(f"shard_id must be in [0, num_shards), found shard_id={shard_id} num_shards={num_shards}")
        for name, value in (("n", n), ("batch_size", batch_size), ("start", start)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "num_shards", num_shards)
        object.__setattr__(self, "shard_id", shard_id)
        object.__setattr__(self, "drop_last", bool(self.drop_last))

    @property
    def global_batches(self) -> int:
        """``G``, the global batches of this pass (over all shards)."""
        return global_batch_count(self.n, self.batch_size, start=self.start, drop_last=self.drop_last)

    def __len__(self) -> int:
        """This shard's batches in the pass: ``ceil((G - shard_id) / num_shards)``, 0 when negative."""
        return len(range(self.shard_id, self.global_batches, self.num_shards))

    def global_batch(self, g: int) -> range:
        """The positions of global batch ``g`` (any shard's).

        Examples
        --------
        >>> Deal(9, 2, start=1).global_batch(3)
        range(7, 9)
        """
        g = check_int("g", g, 0)
        if g >= self.global_batches:
            raise IndexError(f"global batch {g} out of range: the pass holds {self.global_batches}")
        lo = self.start + g * self.batch_size
        return range(lo, min(lo + self.batch_size, self.n))

    def batch(self, i: int) -> np.ndarray:
        """This shard's ``i``-th batch: the positions of global batch ``shard_id + i * num_shards`` (int64)."""
        i = check_int("i", i, 0)
        if i >= len(self):
            raise IndexError(f"batch {i} out of range: shard {self.shard_id} of {self.num_shards} holds {len(self)}")
        r = self.global_batch(self.shard_id + i * self.num_shards)
        return np.arange(r.start, r.stop, dtype=np.int64)

    def batches(self) -> list[np.ndarray]:
        """This shard's batches in order (the order the rank's training loop receives them)."""
        return [self.batch(i) for i in range(len(self))]

    def worker_batches(self, worker: int, num_workers: int) -> list[np.ndarray]:
        """The batches DataLoader worker ``worker`` of ``num_workers`` yields: this shard's ``worker, worker+W, ...``.

        Workers beyond the shard's batches get none.

        Examples
        --------
        >>> [[b.tolist() for b in Deal(8, 2).worker_batches(w, 3)] for w in range(3)]
        [[[0, 1], [6, 7]], [[2, 3]], [[4, 5]]]
        """
        num_workers = check_int("num_workers", num_workers, 1)
        worker = check_int("worker", worker, 0)
        if worker >= num_workers:
            raise ValueError(f"worker must be in [0, num_workers), found worker={worker} num_workers={num_workers}")
        return [self.batch(i) for i in range(worker, len(self), num_workers)]

    @property
    def samples(self) -> int:
        """The positions this shard delivers in the pass (its batches' total length)."""
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
            "so only the epoch's last batch is short and no sample is repeated. Leave pad_last_batch=False (a "
            "shard may then hold one batch fewer than another), or pass drop_last=True to drop the short batch"
        )
    if not stick_to_shard:
        raise ValueError(
            "stick_to_shard=False does not apply with a sampler: shards take global batches in turn over the "
            "whole epoch, so there is no shard range to rotate (every shard draws from every file). Leave "
            "stick_to_shard=True"
        )
