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

Hedges do not wait for the limit (the bucket bounds them). Each call
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
from dataclasses import dataclass, replace
from typing import Any

from npydask.plan.concurrency import Controller, Meter
from npydask.plan.hedging import HedgeMode, LatencyHistory, TokenBucket, parse_hedge
from npydask.storage._remote_errors import throttled, translate
from npydask.storage.requests import _loop

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
    """This process's requests in flight, latency histories, hedge bucket and concurrency controller."""

    def __init__(self, budget: float = 0.03) -> None:
        self.history = LatencyHistory()
        self.bucket = TokenBucket(budget)
        self.controller = Controller()
        self.in_flight = 0
        self._waiters: deque[tuple[asyncio.Future[None], int]] = deque()
        self._meter = Meter(time.monotonic())
        self._saturated = False

    # -- what the request threads call ------------------------------------------------------------

    def get(self, store: Any, key: str, options: dict[str, Any], nbytes: int, policy: Policy) -> Answer:
        """One range GET (``options`` as obstore's ``get`` takes them), hedged by ``policy``; blocks."""
        return _loop.run(self._get(store, key, options, nbytes, policy))

    def head(self, store: Any, key: str, policy: Policy) -> Any:
        """One HEAD: obstore's ``ObjectMeta``; blocks."""
        return _loop.run(self._head(store, key, policy))

    def limit(self, policy: Policy) -> int:
        """The limit of requests in flight ``policy`` runs under now."""
        return policy.limit if policy.limit is not None else self.controller.limit

    # -- on the loop ---------------------------------------------------------------------------------

    async def _acquire(self, limit: int) -> None:
        if self.in_flight >= limit or self._waiters:
            self._saturated = True
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((waiter, limit))
            try:
                await waiter  # (the slot is handed over: in_flight already counts it)
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._release()
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove((waiter, limit))
                raise
            return
        self.in_flight += 1

    def _release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        """Hand free slots to waiters, first come first served."""
        while self._waiters:
            waiter, limit = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if self.in_flight >= self._limit_now(limit):
                break
            self._waiters.popleft()
            self.in_flight += 1
            waiter.set_result(None)

    def _limit_now(self, pinned: int) -> int:
        return pinned if pinned > 0 else self.controller.limit

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

    async def _head(self, store: Any, key: str, policy: Policy) -> Any:
        import obstore

        pinned = policy.limit if policy.limit is not None else 0
        for attempt in range(REQUEUES + 1):
            await self._acquire(self._limit_now(pinned))
            try:
                start = time.monotonic()
                meta = await obstore.head_async(store, key)
                self._done(0, time.monotonic() - start, policy)
                return meta
            except Exception as e:
                if not self._failed(e, policy) or attempt == REQUEUES:
                    raise
            finally:
                self._release()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _get(self, store: Any, key: str, options: dict[str, Any], nbytes: int, policy: Policy) -> Answer:
        pinned = policy.limit if policy.limit is not None else 0
        sent = [0]
        for attempt in range(REQUEUES + 1):
            await self._acquire(self._limit_now(pinned))
            try:
                self.bucket.gain(policy.budget)
                answer = await self._hedged(store, key, options, nbytes, policy, sent)
                return replace(answer, sent=sent[0])
            except Exception as e:
                if not self._failed(e, policy) or attempt == REQUEUES:
                    raise
            finally:
                self._release()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _hedged(
        self, store: Any, key: str, options: dict[str, Any], nbytes: int, policy: Policy, sent: list[int]
    ) -> Answer:
        """One GET, and its hedge if it is late; ``sent[0]`` counts the GETs sent."""
        sent[0] += 1
        first = asyncio.ensure_future(_one(store, key, options))
        tasks = [first]
        starts = {first: time.monotonic()}
        try:
            delay = policy.hedge.delay(self.history, nbytes)
            if delay is not None:
                await asyncio.wait(tasks, timeout=delay)
                if not first.done() and self.bucket.take():
                    sent[0] += 1
                    hedge = asyncio.ensure_future(_one(store, key, options))
                    tasks.append(hedge)
                    starts[hedge] = time.monotonic()
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in tasks:  # (in order: the first's answer wins a tie)
                    if task in done and task.exception() is None:
                        data, meta, got, seconds = task.result()
                        self.history.add(nbytes, seconds)
                        self._done(nbytes, seconds, policy)
                        for other in pending:  # (a loser's latency: at least this long)
                            self.history.add(nbytes, time.monotonic() - starts[other])
                        won = task is not first
                        return Answer(data, meta, tuple(got), len(tasks), len(tasks) > 1, won)
            error = first.exception()
            assert error is not None
            raise error
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()  # (drops obstore's Rust future: its connection is closed)


async def _one(store: Any, key: str, options: dict[str, Any]) -> tuple[Any, Any, Any, float]:
    """One GET: the body, the meta, the range and the seconds it took."""
    import obstore

    start = time.monotonic()
    result = await obstore.get_async(store, key, options=options)  # type: ignore[arg-type]
    data = await result.bytes_async()
    return data, result.meta, result.range, time.monotonic() - start


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
