"""The byte runs held for one cache entry, and what a read still needs.

Rules:

- A run is a half-open byte range ``[start, stop)`` of the object, ``0 <= start < stop``; an
  empty run is never held.
- :class:`ExtentMap` holds disjoint runs in order; adding a run merges it with every run it
  overlaps or touches, so ``[0, 4)`` and ``[4, 8)`` are held as ``[0, 8)``.
- :meth:`ExtentMap.missing` gives the runs of a request not held, in order, and
  :meth:`ExtentMap.covers` whether none is; an empty request is always covered.

>>> m = ExtentMap()
>>> m.add(0, 4); m.add(4, 8); m.add(20, 30)
>>> m.runs
(Extent(start=0, stop=8), Extent(start=20, stop=30))
>>> m.missing(6, 25)
(Extent(start=8, stop=20),)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

__all__ = ["Extent", "ExtentMap"]


@dataclass(frozen=True, order=True)
class Extent:
    """A half-open byte range ``[start, stop)`` of an object.

    Examples
    --------
    >>> Extent(3, 7).length
    4
    >>> Extent(5, 5)
    Traceback (most recent call last):
    ...
    ValueError: an extent needs 0 <= start < stop, not [5, 5)
    """

    start: int
    stop: int

    def __post_init__(self) -> None:
        if not (0 <= self.start < self.stop):
            raise ValueError(f"an extent needs 0 <= start < stop, not [{self.start}, {self.stop})")

    @property
    def length(self) -> int:
        """The number of bytes, ``stop - start``."""
        return self.stop - self.start


def _check(start: int, stop: int) -> None:
    if start < 0 or stop < start:
        raise ValueError(f"a byte range needs 0 <= start <= stop, not [{start}, {stop})")


class ExtentMap:
    """The disjoint byte runs held for one entry, merged as they are added.

    Examples
    --------
    >>> m = ExtentMap([Extent(10, 20)])
    >>> m.covers(12, 18), m.covers(5, 12), m.held
    (True, False, 10)
    """

    def __init__(self, runs: tuple[Extent, ...] | list[Extent] = ()) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []
        for run in runs:
            self.add(run.start, run.stop)

    @property
    def runs(self) -> tuple[Extent, ...]:
        """The runs held, disjoint, not touching, in order."""
        return tuple(Extent(a, b) for a, b in zip(self._starts, self._stops))

    @property
    def held(self) -> int:
        """The bytes held, the sum of the runs' lengths."""
        return sum(b - a for a, b in zip(self._starts, self._stops))

    def add(self, start: int, stop: int) -> None:
        """Hold ``[start, stop)``, merged with the runs it overlaps or touches; an empty range is ignored.

        Examples
        --------
        >>> m = ExtentMap(); m.add(0, 2); m.add(5, 9); m.add(1, 6); m.runs
        (Extent(start=0, stop=9),)
        """
        _check(start, stop)
        if start == stop:
            return
        # runs whose stop >= start and whose start <= stop touch or overlap the new one
        lo = bisect.bisect_left(self._stops, start)
        hi = bisect.bisect_right(self._starts, stop)
        if lo < hi:
            start = min(start, self._starts[lo])
            stop = max(stop, self._stops[hi - 1])
        self._starts[lo:hi] = [start]
        self._stops[lo:hi] = [stop]

    def missing(self, start: int, stop: int) -> tuple[Extent, ...]:
        """The runs of ``[start, stop)`` not held, in order.

        Examples
        --------
        >>> ExtentMap([Extent(2, 4)]).missing(0, 6)
        (Extent(start=0, stop=2), Extent(start=4, stop=6))
        """
        _check(start, stop)
        out: list[Extent] = []
        pos = start
        k = bisect.bisect_right(self._stops, start)
        while pos < stop and k < len(self._starts):
            a, b = self._starts[k], self._stops[k]
            if a >= stop:
                break
            if a > pos:
                out.append(Extent(pos, a))
            pos = max(pos, b)
            k += 1
        if pos < stop:
            out.append(Extent(pos, stop))
        return tuple(out)

    def covers(self, start: int, stop: int) -> bool:
        """Whether every byte of ``[start, stop)`` is held.

        Examples
        --------
        >>> ExtentMap([Extent(0, 8)]).covers(2, 8), ExtentMap().covers(3, 3)
        (True, True)
        """
        _check(start, stop)
        if start == stop:
            return True
        k = bisect.bisect_right(self._starts, start) - 1
        return k >= 0 and self._stops[k] >= stop

    def __repr__(self) -> str:
        return f"ExtentMap({list(self.runs)!r})"
