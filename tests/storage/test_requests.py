"""The request scheduler: hedged range GETs (the loser cancelled), the limit of requests in flight.

The first tests run the scheduler against stand-ins for obstore's coroutines (their timing set per
request); the last reads from SeaweedFS behind a proxy whose slow tail holds one GET back, and
compares with numpy.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time

import numpy as np
import pytest

import npydask
from npydask.plan.hedging import MIN_KNOWN
from npydask.storage.requests import Policy, Scheduler

scheduler_module = importlib.import_module("npydask.storage.requests.scheduler")  # (the module, not the function)

AUTO = Policy.of("auto", 0.03, "auto")


class _Result:
    def __init__(self, data: bytes) -> None:
        self.meta = {"size": 100, "e_tag": '"x"'}
        self.range = (0, len(data))
        self._data = data

    def bytes(self) -> bytes:
        return self._data

    def bytes_async(self) -> asyncio.Future:
        found: asyncio.Future = asyncio.get_running_loop().create_future()
        found.set_result(self._data)
        return found


class _Store:
    """obstore's ``get_async``/``head_async`` for the scheduler: each request's delay and outcome from a list."""

    def __init__(self, plans: list[tuple[float, object]]) -> None:
        self.plans = list(plans)
        self.sent = 0
        self.cancelled: list[int] = []
        self.finished: list[int] = []
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()

    def get_async(self, store: object, key: str, options: dict | None = None) -> asyncio.Future:
        return asyncio.ensure_future(self._get(store, key, options))  # (obstore's: a future, cancellable)

    async def _get(self, store: object, key: str, options: dict | None = None) -> _Result:
        with self._lock:
            n = self.sent
            self.sent += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        delay, outcome = self.plans[n] if n < len(self.plans) else self.plans[-1]
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self.cancelled.append(n)
            raise
        finally:
            with self._lock:
                self.in_flight -= 1
        self.finished.append(n)
        if isinstance(outcome, BaseException):
            raise outcome
        return _Result(bytes([n]) * 4)

    def head_async(self, store: object, key: str) -> asyncio.Future:
        async def head() -> dict:
            return (await self._get(store, key)).meta

        return asyncio.ensure_future(head())


class ObstoreError(Exception):
    pass


ObstoreError.__module__ = "obstore.exceptions"


@pytest.fixture
def fake(monkeypatch):
    import obstore

    def install(plans: list[tuple[float, object]]) -> _Store:
        store = _Store(plans)
        monkeypatch.setattr(obstore, "get_async", store.get_async)
        monkeypatch.setattr(obstore, "head_async", store.head_async)
        return store

    return install


def _known(s: Scheduler, nbytes: int = 4, seconds: float = 0.001) -> Scheduler:
    for _ in range(MIN_KNOWN):
        s.history.add(nbytes, seconds)
    return s


def test_a_late_get_is_sent_again_and_the_first_answer_wins_the_other_cancelled(fake):
    store = fake([(5.0, None), (0.0, None)])
    s = _known(Scheduler())
    started = time.monotonic()
    answer = s.get(None, "k", {"range": (0, 4)}, 4, AUTO)
    took = time.monotonic() - started
    assert bytes(answer.data) == b"\x01" * 4  # (the hedge's)
    assert (answer.sent, answer.hedged, answer.hedge_won) == (2, True, True)
    assert 0.02 <= took < 2.0  # (after the 20 ms delay, not the 5 s)
    deadline = time.monotonic() + 2
    while store.cancelled != [0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.cancelled == [0] and store.finished == [1]  # (the first request was dropped, not awaited)
    assert s.in_flight == 0


def test_a_get_answered_in_time_is_not_hedged_and_none_before_50_are_known(fake):
    store = fake([(0.05, None)])
    s = Scheduler()
    for _ in range(MIN_KNOWN - 1):  # (49 known: no delay yet)
        s.history.add(4, 0.001)
    answer = s.get(None, "k", {}, 4, AUTO)
    assert (answer.sent, answer.hedged) == (1, False) and store.sent == 1
    store = fake([(0.001, None)])
    answer = _known(Scheduler()).get(None, "k", {}, 4, AUTO)  # (in time: within 20 ms)
    assert (answer.sent, answer.hedged) == (1, False)
    off = Policy.of("off", 0.03, "auto")
    store = fake([(0.1, None)])
    assert _known(Scheduler()).get(None, "k", {}, 4, off).sent == 1 and store.sent == 1


def test_a_fixed_delay_needs_no_history_and_the_bucket_bounds_the_hedges(fake):
    store = fake([(0.2, None)])
    s = Scheduler()
    fixed = Policy.of(0.01, 0.0, "auto")  # (no budget: the bucket's first token only)
    answers = [s.get(None, "k", {}, 4, fixed) for _ in range(3)]
    assert [a.hedged for a in answers] == [True, False, False]
    assert store.sent == 4


def test_when_one_fails_the_other_is_waited_for_and_when_both_fail_the_first_error_is_raised(fake):
    store = fake([(0.1, ObstoreError("first: status code: 500")), (0.3, None)])
    answer = _known(Scheduler()).get(None, "k", {}, 4, AUTO)
    assert answer.hedge_won and bytes(answer.data) == b"\x01" * 4 and store.cancelled == []
    store = fake([(0.2, None), (0.0, ObstoreError("hedge: status code: 500"))])
    answer = _known(Scheduler()).get(None, "k", {}, 4, AUTO)
    assert not answer.hedge_won and answer.hedged and bytes(answer.data) == b"\x00" * 4
    fake([(0.3, ObstoreError("first")), (0.0, ObstoreError("second"))])
    with pytest.raises(ObstoreError, match="first"):
        _known(Scheduler()).get(None, "k", {}, 4, AUTO)


def test_a_pinned_limit_holds_the_requests_in_flight(fake):
    store = fake([(0.02, None)])
    s = Scheduler()
    pinned = Policy.of("auto", 0.03, 3)  # (no latency known: no hedge)
    threads = [threading.Thread(target=lambda: [s.get(None, "k", {}, 4, pinned) for _ in range(5)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.sent == 40 and store.most_in_flight == 3 and s.in_flight == 0
    assert s.limit(pinned) == 3 and s.limit(AUTO) == 64


def test_a_throttled_failure_halves_the_auto_limit_not_a_pinned_one(fake):
    fake([(0.0, ObstoreError("GET ...: status code: 503 Service Unavailable <Code>SlowDown</Code>"))])
    s = Scheduler()
    with pytest.raises(ObstoreError):
        s.get(None, "k", {}, 4, Policy.of("auto", 0.03, 16))
    assert s.controller.limit == 64
    with pytest.raises(ObstoreError):
        s.head(None, "k", AUTO)
    assert s.controller.limit == 32
    fake([(0.0, ObstoreError("GET ...: status code: 404"))])
    with pytest.raises(ObstoreError):
        s.get(None, "k", {}, 4, AUTO)
    assert s.controller.limit == 32  # (not throttling)


def test_the_process_has_one_loop_and_one_scheduler():
    from npydask.storage.requests import _loop

    assert scheduler_module.scheduler() is scheduler_module.scheduler()
    assert _loop.loop() is _loop.loop()
    assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0, result=7), _loop.loop()).result() == 7


# -- end to end: SeaweedFS behind a proxy with a slow tail ----------------------------------------------------------


def test_a_late_get_of_a_real_store_is_hedged_the_hedge_wins_and_the_held_request_is_dropped(s3, monkeypatch):
    from npydask.testing.counting_proxy import CountingProxy

    monkeypatch.setattr(scheduler_module, "_schedulers", {})  # (this test's own histories and bucket)
    space = s3.space()
    a = np.arange(64 * 512, dtype="<f8").reshape(64, 512)  # (a row: 4 KiB, one GET)
    s3.put_npy(f"{space}/a.npy", a)
    with CountingProxy(s3.endpoint) as proxy:
        options = dict(s3.options, endpoint=proxy.endpoint)
        x = npydask.from_npy(f"s3://{space}/a.npy", chunks=(1, 512), storage_options=options)
        np.testing.assert_array_equal(x.compute(), a)  # (64 GETs of 4 KiB: the delay of their class is known)
        # (seed 1 draws 0.13 then 0.85: the next GET is 5 s late, its hedge is not)
        proxy.set_faults(tail_share=0.5, tail_delay=5.0, seed=1)
        started = time.monotonic()
        with npydask.io_stats() as s:
            row = x[37].compute()
        took = time.monotonic() - started
        proxy.set_faults(tail_share=0.0)
        np.testing.assert_array_equal(row, a[37])
        assert (s.hedges, s.hedges_won, s.requests, s.bytes_read) == (1, 1, 2, 4096)
        assert took < 2.5, took  # (the hedge's answer, not the held request's)
        deadline = time.monotonic() + 5
        while proxy.counts.cancelled < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        counts = proxy.counts
        assert counts.tail == 1 and counts.cancelled == 1, counts  # (the client closed the loser's connection)


def test_under_auto_a_refused_get_is_sent_again_after_the_halving_and_a_pinned_limit_raises(fake):
    slow_down = ObstoreError("GET ...: status code: 503 Service Unavailable <Code>SlowDown</Code>")
    store = fake([(0.0, slow_down), (0.0, slow_down), (0.0, None)])
    s = Scheduler()
    answer = s.get(None, "k", {}, 4, Policy.of("off", 0.03, "auto"))
    assert bytes(answer.data) == b"\x02" * 4 and answer.sent == 3 and store.sent == 3
    assert s.controller.limit == 32  # (halved once in the window)
    fake([(0.0, slow_down)])
    with pytest.raises(ObstoreError):
        s.get(None, "k", {}, 4, Policy.of("auto", 0.03, 16))  # (a pinned limit: obstore's retries only)
    store = fake([(0.0, slow_down)])
    with pytest.raises(ObstoreError):
        s.get(None, "k", {}, 4, Policy.of("off", 0.03, "auto"))
    assert store.sent == 4  # (sent again 3 times, then its error)


def test_hedging_off_with_a_fixed_limit_sends_blocking_calls_without_the_loop(monkeypatch):
    import obstore

    calls = []
    monkeypatch.setattr(obstore, "get", lambda store, key, options=None: calls.append(("get", key)) or _Result(b"abcd"))
    monkeypatch.setattr(obstore, "head", lambda store, key: calls.append(("head", key)) or {"size": 4})
    s = Scheduler()
    answer = s.get(None, "k", {"range": (0, 4)}, 4, Policy.of("off", 0.03, 8))
    assert bytes(answer.data) == b"abcd" and (answer.sent, answer.hedged) == (1, False)
    assert s.head(None, "h", Policy.of("off", 0.03, 8)) == {"size": 4}
    assert calls == [("get", "k"), ("head", "h")]
    assert Policy.of("off", 0.03, 8).blocking and not Policy.of("auto", 0.03, 8).blocking
    assert not Policy.of("off", 0.03, "auto").blocking  # (auto's limit is the loop's)


_EXITING = """
import sys
import obstore
from obstore.store import MemoryStore
from npydask.storage.requests import _loop
from npydask.storage.requests.scheduler import Policy, scheduler

store = MemoryStore()
obstore.put(store, "k", b"x" * 4096)
policy = Policy.of("auto", 0.03, "auto")
for _ in range(20):
    assert bytes(scheduler().get(store, "k", {"range": (0, 4096)}, 4096, policy).data) == b"x" * 4096
if sys.argv[1] == "unsettled":
    import atexit

    atexit.unregister(_loop._settle)
"""


def exits(tmp_path, how: str, runs: int = 24, at_once: int = 4) -> list[tuple[int, str]]:
    """Run the script above ``runs`` times, ``at_once`` at a time; each run's exit status and stderr."""
    import os
    import subprocess
    import sys

    script = tmp_path / "exiting.py"
    script.write_text(_EXITING)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    found = []
    for _ in range(0, runs, at_once):
        procs = [
            subprocess.Popen([sys.executable, str(script), how], stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(at_once)
        ]
        for p in procs:
            _, err = p.communicate(timeout=120)
            found.append((p.returncode, err))
    return found


def test_a_process_that_sent_async_requests_exits_cleanly(tmp_path):
    """obstore's runtime threads re-take the GIL just after each answer; one still waiting when the interpreter
    finalizes aborted the process (SIGABRT, about one exit in ten under load): the loop is settled at exit."""
    found = exits(tmp_path, "settled")
    assert [rc for rc, _ in found] == [0] * len(found), [err[-300:] for _, err in found if err]
