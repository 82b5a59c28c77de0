"""The faults a :class:`~npydask.testing.counting_proxy.CountingProxy` injects.

:class:`Faults` is the configuration (a frozen value, replaced whole while the
proxy runs); :class:`Admission` draws the slow tail and keeps the request-rate
window; :func:`slow_down` is the proxy's own answer above the rate (S3's
``503 Slow Down``).
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

__all__ = ["Admission", "Faults", "slow_down"]


@dataclass(frozen=True)
class Faults:
    """Faults a :class:`~npydask.testing.counting_proxy.CountingProxy` applies to each request.

    A request is held back, before it is forwarded, by ``delay + slowdown``
    seconds, plus ``tail_delay`` for the ``tail_share`` of object GETs drawn
    (seeded); it is then admitted, or answered ``503 Slow Down`` by the proxy
    itself (never forwarded) when ``max_request_rate`` requests a second were
    already admitted in the last ``rate_window`` seconds.

    Parameters
    ----------
    delay
        Seconds every request is held (a link's round trip, e.g. 0.02).
    slowdown
        Seconds more for every request (a uniformly slow store, e.g. 0.2);
        separate from ``delay`` so that one can change while the other stays.
    tail_share, tail_delay
        The share of object GETs (kind ``"GET"``, not ``LIST``) held
        ``tail_delay`` seconds more, drawn from a generator seeded with ``seed``.
    max_request_rate
        Requests a second admitted over the sliding ``rate_window``; ``None``:
        no limit.
    rate_window
        Seconds of the sliding window (``max_request_rate * rate_window``
        requests fit in it).
    seed
        Seed of the tail's draws.

    Examples
    --------
    >>> Faults(delay=0.02, tail_share=0.01, tail_delay=2.0).hold_base
    0.02
    >>> Faults(tail_share=2.0)
    Traceback (most recent call last):
    ...
    ValueError: Faults: tail_share must be a share between 0 and 1, got 2.0
    """

    delay: float = 0.0
    slowdown: float = 0.0
    tail_share: float = 0.0
    tail_delay: float = 0.0
    max_request_rate: float | None = None
    rate_window: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("delay", "slowdown", "tail_delay"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Faults: {name} must be a number of seconds >= 0, got {value!r}")
        if not (isinstance(self.tail_share, (int, float)) and 0 <= self.tail_share <= 1):
            raise ValueError(f"Faults: tail_share must be a share between 0 and 1, got {self.tail_share!r}")
        rate = self.max_request_rate
        if rate is not None and not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise ValueError(
                f"Faults: max_request_rate must be a positive number of requests a second or None, got {rate!r}"
            )
        window = self.rate_window
        if not (isinstance(window, (int, float)) and math.isfinite(window) and window > 0):
            raise ValueError(f"Faults: rate_window must be a positive number of seconds, got {window!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"Faults: seed must be an int, got {self.seed!r}")

    @property
    def hold_base(self) -> float:
        """Seconds every request is held (``delay + slowdown``)."""
        return self.delay + self.slowdown


class Admission:
    """The proxy-wide state of the faults: the tail's generator and the rate window (thread-safe).

    Examples
    --------
    >>> a = Admission(Faults(max_request_rate=2, rate_window=1.0))
    >>> [a.admit(now=t) for t in (0.0, 0.1, 0.2, 1.05, 1.2)]
    [True, True, False, True, True]
    """

    def __init__(self, faults: Faults) -> None:
        self._lock = threading.Lock()
        self._admitted: deque[float] = deque()
        self.faults = faults
        self._rng = random.Random(faults.seed)

    def replace(self, faults: Faults) -> None:
        """Use ``faults`` from the next request on (a new seed restarts the tail's draws)."""
        with self._lock:
            if faults.seed != self.faults.seed:
                self._rng = random.Random(faults.seed)
            self.faults = faults

    def hold(self, kind: str) -> tuple[float, bool]:
        """Seconds to hold a request of ``kind``, and whether it was drawn into the slow tail."""
        with self._lock:
            f = self.faults
            tail = kind == "GET" and f.tail_share > 0 and self._rng.random() < f.tail_share
        return f.hold_base + (f.tail_delay if tail else 0.0), tail

    def admit(self, now: float | None = None) -> bool:
        """Whether a request may be forwarded now (and count it in the window), or must be answered 503."""
        now = time.monotonic() if now is None else now
        with self._lock:
            f = self.faults
            window = self._admitted
            while window and window[0] <= now - f.rate_window:
                window.popleft()
            if f.max_request_rate is not None and len(window) >= f.max_request_rate * f.rate_window:
                return False
            window.append(now)
            return True


def slow_down(target: str, *, head: bool, close: bool) -> bytes:
    r"""S3's ``503 Slow Down`` answer to a request for ``target`` (no body for a ``HEAD``).

    Examples
    --------
    >>> answer = slow_down("/b/k", head=False, close=False)
    >>> answer.split(b"\r\n")[0], b"<Code>SlowDown</Code>" in answer, b"Connection: keep-alive" in answer
    (b'HTTP/1.1 503 Slow Down', True, True)
    """
    request_id = uuid.uuid4().hex[:16].upper()
    resource = target.partition("?")[0].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
        f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()
    head_lines = (
        "HTTP/1.1 503 Slow Down\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-amz-request-id: {request_id}\r\n"
        f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
    ).encode()
    return head_lines if head else head_lines + body
