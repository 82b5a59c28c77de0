"""The request scheduler: every range GET and HEAD of an object store goes through it.

One :class:`Scheduler` per process runs requests as obstore coroutines on
the process's request loop (:mod:`._loop`); the calling thread blocks on
each one's answer. It keeps, for the whole process:

* the requests in flight under a limit: the ``remote_concurrency`` number,
  or with ``"auto"`` the limit of a closed-loop
  :class:`~npydask.plan.concurrency.Controller` fed with windows of
  completed requests and with the requests that finally failed with 503,
  ``SlowDown`` or a timeout (a 503 or ``SlowDown`` is then sent again, up to
  :data:`REQUEUES` times, once the limit has halved);
* latency histories per size class and a token bucket
  (:mod:`npydask.plan.hedging`): a range GET not answered after its class's
  hedge delay is sent again, the same conditional request, if the bucket
  holds a token; the first successful answer wins and the other request
  is cancelled (its Rust future dropped, its connection closed). When one
  fails while the other still runs, the other is waited for; when both
  fail, the first's error is raised.

Hedges do not wait for the limit (the bucket bounds them). With hedging
off and a fixed limit there is nothing to cancel or control: requests are
then blocking obstore calls in the calling thread, as cheap as before the
scheduler (:attr:`Policy.blocking`). Each call
returns an :class:`Answer` that says what was sent, and the caller records
the figures (:func:`npydask.storage.io_counts.record`) in its own context.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any

from npydask.plan.concurrency import Controller, Meter
from npydask.plan.hedging import HedgeMode, LatencyHistory, TokenBucket, parse_hedge
from npydask.storage._remote_errors import throttled, translate
from npydask.storage.requests import _loop
from npydask.storage.requests._attempt import Attempt

__all__ = ["REQUEUES", "Answer", "Policy", "Scheduler", "scheduler"]

REQUEUES = 3
"""Under ``remote_concurrency="auto"``: times a request refused with 503 or ``SlowDown`` (after obstore's own
retries) is sent again, after the limit halved."""


@dataclass(frozen=True)
class Policy:
    """How one store's requests are scheduled: its hedging, hedge budget and limit of requests in flight."""

    hedge: HedgeMode = HedgeMode()
    budget: float = 0.03
    limit: int | None = None
    """A fixed number of requests in flight per process, or ``None`` for ``"auto"``."""

    @classmethod
    def of(cls, hedge: str | float, budget: float, concurrency: str | int) -> Policy:
        """The policy of the ``remote_hedge``, ``remote_hedge_budget`` and ``remote_concurrency`` settings."""
        return cls(parse_hedge(hedge), float(budget), None if concurrency == "auto" else int(concurrency))

    @property
    def blocking(self) -> bool:
        """Hedging off and a fixed limit: nothing to cancel or control, so requests are blocking obstore calls
        in the calling thread (the request pool's width is the limit), without the loop's cost per request."""
        return not self.hedge.on and self.limit is not None


@dataclass(frozen=True)
class Answer:
    """A range GET's answer and what it cost."""

    data: Any
    """The body (a buffer)."""
    meta: Any
    """obstore's ``ObjectMeta`` of the object."""
    range: tuple[int, int]
    """The byte range the response holds."""
    sent: int = 1
    """GETs sent (2 when hedged)."""
    hedged: bool = False
    """Whether a hedge was sent."""
    hedge_won: bool = False
    """Whether the hedge's answer is the one returned."""


class Scheduler:
    """This process's requests in flight, latency histories, hedge bucket and concurrency controller.

    Requests are driven by callbacks on the loop (no task or coroutine per request): a request
    waits for a slot, its GET is sent (an :class:`~npydask.storage.requests._attempt.Attempt`), a
    timer may send its hedge, and the attempts' done-callbacks settle it.
    """

    def __init__(self, budget: float = 0.03) -> None:
        self.history = LatencyHistory()
        self.bucket = TokenBucket(budget)
        self.controller = Controller()
        self.in_flight = 0
        self._waiters: deque[_Request] = deque()
        self._meter = Meter(time.monotonic())
        self._saturated = False
        self._inbox: deque[_Request] = deque()
        self._inbox_lock = threading.Lock()
        self._draining = False

    # -- what the request threads call ------------------------------------------------------------

    def get(self, store: Any, key: str, options: dict[str, Any], nbytes: int, policy: Policy) -> Answer:
        """One range GET (``options`` as obstore's ``get`` takes them), hedged by ``policy``; blocks."""
        if policy.blocking:
            import obstore

            result = obstore.get(store, key, options=options)  # type: ignore[arg-type]
            start, stop = result.range
            return Answer(result.bytes(), result.meta, (start, stop))
        answer: Answer = self._run(_Request(self, store, key, options, nbytes, policy))
        return answer

    def head(self, store: Any, key: str, policy: Policy) -> Any:
        """One HEAD: obstore's ``ObjectMeta``; blocks."""
        if policy.blocking:
            import obstore

            return obstore.head(store, key)
        return self._run(_Request(self, store, key, None, 0, policy))

    def limit(self, policy: Policy) -> int:
        """The limit of requests in flight ``policy`` runs under now."""
        return policy.limit if policy.limit is not None else self.controller.limit

    def _run(self, request: _Request) -> Any:
        """Hand ``request`` to the loop (one wake-up for a burst of them) and wait for its answer."""
        ev = _loop.loop()
        with self._inbox_lock:
            self._inbox.append(request)
            wake, self._draining = not self._draining, True
        if wake:
            ev.call_soon_threadsafe(self._drain)
        try:
            return request.wait()
        except BaseException:
            if not request.settled:  # (this thread was interrupted: the request is dropped)
                ev.call_soon_threadsafe(request.abandon)
            raise

    # -- on the loop ---------------------------------------------------------------------------------

    def _drain(self) -> None:
        with self._inbox_lock:
            requests = list(self._inbox)
            self._inbox.clear()
            self._draining = False
        for request in requests:
            self._admit(request)

    def _admit(self, request: _Request) -> None:
        """Start ``request`` if a slot is free, else queue it (first come, first served)."""
        if self.in_flight < self.limit(request.policy) and not self._waiters:
            self.in_flight += 1
            request.start()
        else:
            self._saturated = True
            self._waiters.append(request)

    def _release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        """Hand free slots to waiters, first come first served."""
        while self._waiters:
            request = self._waiters[0]
            if request.settled:
                self._waiters.popleft()
                continue
            if self.in_flight >= self.limit(request.policy):
                break
            self._waiters.popleft()
            self.in_flight += 1
            request.start()

    def _done(self, nbytes: int, seconds: float, policy: Policy) -> None:
        """A request completed: into the controller's window (``"auto"`` only)."""
        if policy.limit is not None:
            return
        w = self._meter.done(
            nbytes, seconds, saturated=self._saturated, now=time.monotonic(), limit=self.controller.limit
        )
        if w is not None:
            self._saturated = False
            self.controller.window(w)
            self._wake()  # (the limit may have grown)

    def _failed(self, e: BaseException, policy: Policy) -> bool:
        """A request finally failed: a throttled one halves an ``"auto"`` limit; whether to send it again.

        Under ``"auto"``, a request refused with 503 or ``SlowDown`` (not a timeout: it took its
        time already) is sent again after the halving, up to :data:`REQUEUES` times: the limit that
        caused it is gone.
        """
        if policy.limit is not None or not isinstance(e, Exception):
            return False
        try:
            error = translate(e, "", "")
            hit = throttled(e, error)
        except Exception:  # (a message translate cannot read: not throttling)
            return False
        if hit:
            self.controller.throttled()
        return hit and not isinstance(error, TimeoutError)


class _Request:
    """One range GET (or HEAD: ``options`` is ``None``) in the scheduler: its attempts, its hedge, its answer.

    The calling thread waits in :meth:`wait`; everything else runs on the request loop.
    """

    def __init__(
        self, owner: Scheduler, store: Any, key: str, options: dict[str, Any] | None, nbytes: int, policy: Policy
    ) -> None:
        self.owner, self.policy = owner, policy
        self.store, self.key, self.options, self.nbytes = store, key, options, nbytes
        self.attempts: list[Attempt] = []
        self.timer: asyncio.TimerHandle | None = None
        self.sent = self.tries = 0
        self.holding = self.settled = False
        self.value: Any = None
        self.error: BaseException | None = None
        self._answered = threading.Lock()
        self._answered.acquire()  # (released once answered: the cheapest wake-up between threads)

    def wait(self) -> Any:
        """Block until answered; the answer, or its error raised."""
        self._answered.acquire()
        if self.error is not None:
            raise self.error
        return self.value

    def start(self) -> None:
        """Send the request (a slot is held for it); a GET's hedge timer set."""
        self.holding = True
        self.tries += 1
        try:
            if self.options is not None:
                owner = self.owner
                owner.bucket.gain(self.policy.budget)
                delay = self.policy.hedge.delay(owner.history, self.nbytes)
                if delay is not None:
                    self.timer = asyncio.get_running_loop().call_later(delay, self._hedge)
            self._send()
        except BaseException as e:  # (never leave the caller waiting)
            self._settle(None, e)

    def _send(self) -> None:
        self.sent += 1
        self.attempts.append(Attempt(self.store, self.key, self.options, self._finished))

    def _hedge(self) -> None:
        """The delay passed: send the same request again if the first is still out and the bucket allows."""
        self.timer = None
        if self.settled or len(self.attempts) != 1 or self.attempts[0].done:
            return
        if self.owner.bucket.take():
            try:
                self._send()
            except BaseException as e:  # (never leave the caller waiting)
                self._settle(None, e)

    def _finished(self, attempt: Attempt) -> None:
        if self.settled or attempt not in self.attempts:
            return
        try:
            if attempt.error is None:
                self._won(attempt)
                return
            if any(not a.done for a in self.attempts):
                return  # (the other may still answer)
            error = self.attempts[0].error or attempt.error
            self._free()
            if self.owner._failed(error, self.policy) and self.tries <= REQUEUES:
                self.attempts = []
                self.owner._admit(self)  # (sent again once a slot of the halved limit is free)
                return
            self._settle(None, error)
        except BaseException as e:  # (never leave the caller waiting)
            self._settle(None, e)

    def _won(self, attempt: Attempt) -> None:
        owner, now = self.owner, time.monotonic()
        seconds = attempt.value[-1]
        if self.options is not None:
            owner.history.add(self.nbytes, seconds)
            for other in self.attempts:
                if other is not attempt and not other.done:  # (a loser's latency: at least this long)
                    owner.history.add(self.nbytes, now - other.start)
        owner._done(self.nbytes, seconds, self.policy)
        if self.options is None:
            self._settle(attempt.value[0], None)
            return
        data, meta, got, _ = attempt.value
        won = attempt is not self.attempts[0]
        self._settle(Answer(data, meta, tuple(got), self.sent, len(self.attempts) > 1, won), None)

    def _free(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.holding:
            self.holding = False
            self.owner._release()

    def _settle(self, value: Any, error: BaseException | None) -> None:
        """Answer the caller, cancel what is still out (drops obstore's Rust future: its connection closes)."""
        self._free()
        for attempt in self.attempts:
            attempt.cancel()
        if self.settled:
            return
        self.settled = True
        self.value, self.error = value, error
        self._answered.release()

    def abandon(self) -> None:
        """The caller gave up: cancel everything."""
        with contextlib.suppress(ValueError):
            self.owner._waiters.remove(self)
        self._settle(None, CancelledError())


_lock = threading.Lock()
_schedulers: dict[int, Scheduler] = {}


def scheduler() -> Scheduler:
    """This process's scheduler (a forked child gets its own)."""
    pid = os.getpid()
    found = _schedulers.get(pid)
    if found is None:
        with _lock:
            found = _schedulers.get(pid)
            if found is None:
                _schedulers.clear()
                found = _schedulers[pid] = Scheduler()
    return found
