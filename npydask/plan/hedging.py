"""When to send a range GET again: latency histories per size class, the hedge delay and the token bucket.

A request not answered after its hedge delay is sent again, and the first
answer wins (the scheduler in :mod:`npydask.storage.requests` does the
sending). The rule, in pure code here:

* **Size classes.** A request for ``n`` bytes is in class
  ``floor(log4(n))`` (:func:`size_class`): 4 KiB headers, 64 KiB blocks and
  8 MiB parts are timed apart, since a larger request takes longer.
* **The delay.** Each class keeps the last :data:`HISTORY` latencies
  (:class:`LatencyHistory`); once :data:`MIN_KNOWN` are known the delay is
  ``max(20 ms, 2 x p90)`` (:func:`hedge_delay`); before that, no hedge.
* **The budget.** Hedges come from a :class:`TokenBucket` that gains
  ``budget`` tokens per request (the ``remote_hedge_budget`` setting, 0.03),
  starts with 1 and holds at most 5: over many requests, at most ``budget``
  hedges per request; in an outage (every request slow) at most 5 hedges
  before the budget's rate, never twice the traffic.

Examples
--------
>>> size_class(4096), size_class(65536), size_class(8 << 20)
(6, 8, 11)
>>> history = LatencyHistory()
>>> for i in range(100):
...     history.add(4096, 0.010 + i * 0.0001)
>>> round(history.delay(4096), 4)
0.0378
>>> bucket = TokenBucket(0.5)
>>> bucket.take(), bucket.take()
(True, False)
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "HEDGE_MODES",
    "HISTORY",
    "MIN_DELAY",
    "MIN_KNOWN",
    "HedgeMode",
    "LatencyHistory",
    "TokenBucket",
    "hedge_delay",
    "parse_hedge",
    "size_class",
]

HISTORY = 1000
"""Latencies kept per size class (the most recent)."""

MIN_KNOWN = 50
"""Latencies a size class needs before its requests are hedged."""

MIN_DELAY = 0.020
"""The shortest hedge delay, in seconds."""

BUCKET_START = 1.0
"""Tokens a bucket starts with."""

BUCKET_MAX = 5.0
"""Tokens a bucket holds at most."""

REFRESH = 25
"""New latencies of a class after which its delay is computed again."""

HEDGE_MODES = ("auto", "off")
"""The ``remote_hedge`` setting's words (else a number of seconds: a fixed delay)."""


def size_class(nbytes: int) -> int:
    """The size class of a request for ``nbytes`` bytes: ``floor(log4(nbytes))`` (0 for at most 3 bytes).

    Examples
    --------
    >>> [size_class(n) for n in (0, 1, 3, 4, 15, 16, 1 << 20)]
    [0, 0, 0, 1, 1, 2, 10]
    """
    if nbytes < 4:
        return 0
    return (int(nbytes).bit_length() - 1) // 2  # (exact for every int, unlike math.log)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, by linear interpolation (numpy's default).

    Examples
    --------
    >>> percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90)
    4.6
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the percentile of no values")
    at = (len(ordered) - 1) * q / 100
    lo = math.floor(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def hedge_delay(latencies: Sequence[float]) -> float | None:
    """``max(20 ms, 2 x p90)`` of ``latencies`` (seconds), or ``None`` (no hedge) while fewer than 50 are known.

    Examples
    --------
    >>> hedge_delay([0.001] * 49) is None, hedge_delay([0.001] * 50), hedge_delay([0.1] * 60)
    (True, 0.02, 0.2)
    """
    if len(latencies) < MIN_KNOWN:
        return None
    return max(MIN_DELAY, 2 * percentile(latencies, 90))


class LatencyHistory:
    """The last :data:`HISTORY` latencies of each size class, and each class's hedge delay (thread-safe).

    The delay is computed again after every :data:`REFRESH` new latencies of a class (a
    percentile sorts the history), so recording and asking are cheap.
    """

    def __init__(self, keep: int = HISTORY) -> None:
        self._keep = keep
        self._classes: dict[int, deque[float]] = {}
        self._delays: dict[int, float | None] = {}
        self._fresh: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, nbytes: int, seconds: float) -> None:
        """Record one request's latency (``seconds``) for a request of ``nbytes``."""
        c = size_class(nbytes)
        with self._lock:
            found = self._classes.get(c)
            if found is None:
                found = self._classes[c] = deque(maxlen=self._keep)
            found.append(float(seconds))
            self._fresh[c] = self._fresh.get(c, 0) + 1
            if self._fresh[c] >= REFRESH or len(found) == MIN_KNOWN:
                self._fresh[c] = 0
                self._delays[c] = hedge_delay(found)

    def delay(self, nbytes: int) -> float | None:
        """The hedge delay of a request for ``nbytes`` (seconds), or ``None`` while its class knows too few."""
        c = size_class(nbytes)
        with self._lock:
            return self._delays.get(c)

    def known(self, nbytes: int) -> int:
        """How many latencies the class of ``nbytes`` holds."""
        with self._lock:
            return len(self._classes.get(size_class(nbytes), ()))


class TokenBucket:
    """Hedges allowed: gains ``budget`` tokens per request, starts with 1, holds at most 5; a hedge spends 1.

    Examples
    --------
    >>> bucket = TokenBucket(0.25)
    >>> bucket.take(), bucket.tokens
    (True, 0.0)
    >>> for _ in range(4):
    ...     bucket.gain()
    >>> bucket.take(), bucket.take()
    (True, False)
    """

    def __init__(self, budget: float, start: float = BUCKET_START, most: float = BUCKET_MAX) -> None:
        self.tokens = min(start, most)
        self.most = most
        self.budget = budget
        self._lock = threading.Lock()

    def gain(self, budget: float | None = None) -> None:
        """One request sent: ``budget`` (else the bucket's own) more tokens, up to the most it holds."""
        with self._lock:
            self.tokens = min(self.most, self.tokens + (self.budget if budget is None else budget))

    def take(self) -> bool:
        """Spend one token for a hedge; ``False`` (no hedge) when fewer than one is left."""
        with self._lock:
            if self.tokens < 1:
                return False
            self.tokens -= 1
            return True


@dataclass(frozen=True)
class HedgeMode:
    """The ``remote_hedge`` setting as the scheduler uses it: off, by observed latency, or a fixed delay."""

    fixed: float | None = None
    """Seconds: every request not answered by then is hedged (the budget still applies)."""
    on: bool = True
    """``False``: never hedge."""

    def delay(self, history: LatencyHistory, nbytes: int) -> float | None:
        """The delay after which a request for ``nbytes`` is hedged, or ``None`` (not hedged)."""
        if not self.on:
            return None
        if self.fixed is not None:
            return self.fixed
        return history.delay(nbytes)


def parse_hedge(value: str | float) -> HedgeMode:
    """A :class:`HedgeMode` from the ``remote_hedge`` setting (``"auto"``, ``"off"`` or seconds).

    Examples
    --------
    >>> parse_hedge("auto"), parse_hedge("off").on, parse_hedge(0.05).fixed
    (HedgeMode(fixed=None, on=True), False, 0.05)
    """
    if value == "auto":
        return HedgeMode()
    if value == "off":
        return HedgeMode(on=False)
    return HedgeMode(fixed=float(value))
