"""How many requests a process keeps in flight under ``remote_concurrency="auto"``: a closed-loop controller.

The scheduler (:mod:`npydask.storage.requests`) measures windows of
completed requests (:class:`Meter`: their work, wall time and mean latency,
and whether requests waited for the limit) and hands each to
:meth:`Controller.window`, which sets the next limit:

* it starts at :data:`START` (64) and stays between :data:`LOWEST` (4) and
  :data:`HIGHEST` (256);
* while requests wait for the limit and throughput grows (by 5% or more
  over the last window) the limit grows by a quarter (the first window
  only sets the mark to compare with);
* when throughput stops growing while latency rises (by 20% or more:
  obstore's retries and back-off show as latency, and so does a link
  whose bandwidth is spent, by Little's law) the limit halves;
* a request that finally failed with 503, ``SlowDown`` or a timeout halves
  it too (:meth:`Controller.throttled`, at most once per window);
* held for :data:`PROBE_AFTER` windows in a row while requests wait, it
  grows once more to probe.

Throughput counts work, not requests: a request's bytes plus
:data:`REQUEST_COST` (a round trip is worth about that many bytes), so small
header reads and 8 MiB parts weigh fairly in one figure.

Examples
--------
>>> c = Controller()
>>> c.limit
64
>>> c.window(Window(work=1e8, seconds=1.0, latency=0.01, saturated=True))
64
>>> c.window(Window(work=2e8, seconds=1.0, latency=0.01, saturated=True))
80
>>> c.window(Window(work=2e8, seconds=1.0, latency=0.02, saturated=True))
40
>>> c.throttled()
20
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

__all__ = ["HIGHEST", "LOWEST", "START", "Controller", "Meter", "Window"]

START = 64
"""The limit an ``"auto"`` process starts with (header reads of a large listing do not slow-start)."""

LOWEST = 4
"""The smallest limit."""

HIGHEST = 256
"""The largest limit (the request pools have this many threads)."""

GROW = 1.25
"""The factor the limit grows by."""

GAIN = 1.05
"""Throughput grown by this factor or more counts as growing."""

RISE = 1.20
"""Latency grown by this factor or more counts as rising."""

PROBE_AFTER = 8
"""Windows held in a row (requests waiting) after which the limit grows once to probe."""

REQUEST_COST = 64 * 1024
"""Bytes a request's round trip is counted as in throughput's work."""

WINDOW_REQUESTS = 32
"""A window holds at least this many completed requests (and at least the limit)."""

WINDOW_SECONDS = 0.05
"""A window lasts at least this long."""


@dataclass(frozen=True)
class Window:
    """What the requests completed in one window did."""

    work: float
    """Bytes, plus :data:`REQUEST_COST` per request."""
    seconds: float
    """The window's wall time."""
    latency: float
    """The requests' mean latency, in seconds."""
    saturated: bool
    """Whether a request found the limit reached (waited for it) during the window."""

    @property
    def throughput(self) -> float:
        """Work per second."""
        return self.work / max(self.seconds, 1e-9)


class Controller:
    """The limit of requests in flight, moved by each :class:`Window` and by throttled failures (thread-safe)."""

    def __init__(self, start: int = START, lowest: int = LOWEST, highest: int = HIGHEST) -> None:
        self.lowest, self.highest = lowest, highest
        self.limit = max(lowest, min(highest, start))
        self._last: Window | None = None
        self._held = 0
        self._cut = False  # (halved in this window already)
        self._lock = threading.Lock()

    def window(self, w: Window) -> int:
        """The next limit after window ``w``."""
        with self._lock:
            last, self._last = self._last, w
            cut, self._cut = self._cut, False
            if cut or not w.saturated or last is None:
                self._held = 0
                return self.limit  # (a throttled halving stands; an unreached limit says nothing)
            if w.throughput >= last.throughput * GAIN:
                return self._grow()
            if w.latency >= last.latency * RISE:
                self._held = 0
                self.limit = max(self.lowest, self.limit // 2)
                return self.limit
            self._held += 1
            if self._held >= PROBE_AFTER:
                return self._grow()
            return self.limit

    def throttled(self) -> int:
        """A request finally failed with 503, ``SlowDown`` or a timeout: halve the limit (once per window)."""
        with self._lock:
            if not self._cut:
                self._cut = True
                self.limit = max(self.lowest, self.limit // 2)
            return self.limit

    def _grow(self) -> int:
        self._held = 0
        self.limit = min(self.highest, max(self.limit + 1, math.ceil(self.limit * GROW)))
        return self.limit


class Meter:
    """Gathers completed requests into :class:`Window` s (not thread-safe: the scheduler's loop calls it).

    Examples
    --------
    >>> m = Meter(0.0)
    >>> for i in range(40):
    ...     _ = m.done(1000, 0.01, saturated=False, now=0.001 * i)
    >>> w = m.done(1000, 0.01, saturated=True, now=0.1)
    >>> w.work == 41 * (1000 + REQUEST_COST), w.seconds, w.saturated
    (True, 0.1, True)
    """

    def __init__(self, now: float) -> None:
        self._reset(now)

    def _reset(self, now: float) -> None:
        self.start = now
        self.count = 0
        self.work = 0.0
        self.latency = 0.0
        self.saturated = False

    def done(self, nbytes: int, seconds: float, *, saturated: bool, now: float, limit: int = 0) -> Window | None:
        """Record one completed request; the window it closes (enough requests and time), else ``None``."""
        self.count += 1
        self.work += nbytes + REQUEST_COST
        self.latency += seconds
        self.saturated = self.saturated or saturated
        if self.count < max(WINDOW_REQUESTS, limit) or now - self.start < WINDOW_SECONDS:
            return None
        w = Window(self.work, now - self.start, self.latency / self.count, self.saturated)
        self._reset(now)
        return w
