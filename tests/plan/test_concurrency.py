"""The closed-loop limit of requests in flight, with synthetic windows."""

from __future__ import annotations

import pytest

from npydask.plan.concurrency import HIGHEST, LOWEST, PROBE_AFTER, START, Controller, Meter, Window


def _w(throughput: float, latency: float, saturated: bool = True) -> Window:
    return Window(work=throughput, seconds=1.0, latency=latency, saturated=saturated)


def test_it_starts_at_64_and_grows_while_throughput_grows_up_to_256():
    c = Controller()
    assert c.limit == START == 64
    limits = [c.window(_w(100 * 1.1**k, 0.01)) for k in range(30)]
    assert limits[:4] == [64, 80, 100, 125]  # (the first window is the mark to compare with)
    assert all(b >= a for a, b in zip(limits, limits[1:]))
    assert limits[-1] == HIGHEST == 256


def test_it_halves_when_throughput_stops_growing_while_latency_rises():
    c = Controller()
    c.window(_w(100, 0.010))
    assert c.window(_w(200, 0.010)) == 80
    assert c.window(_w(201, 0.012)) == 40  # (flat throughput, latency +20%: the store is saturated)
    assert c.window(_w(200, 0.008)) == 40  # (flat, latency fell: held)
    for _ in range(10):
        c.window(_w(100, 0.1 * 1.5**_))
    assert c.limit == LOWEST == 4  # (never below 4)


def test_an_unreached_limit_says_nothing():
    c = Controller()
    for k in range(20):
        assert c.window(_w(100 * 2**k, 0.01 * 2**k, saturated=False)) == 64


def test_a_throttled_failure_halves_once_per_window():
    c = Controller()
    assert c.throttled() == 32
    assert c.throttled() == 32  # (a burst of failures in one window: one halving)
    assert c.window(_w(100, 0.01)) == 32  # (the window of the halving holds it)
    assert c.throttled() == 16
    c.window(_w(100, 0.01))
    for _ in range(10):
        c.throttled()
        c.window(_w(100, 0.01))
    assert c.limit == LOWEST


def test_it_probes_after_holding_a_while():
    c = Controller(start=16)
    c.window(_w(100, 0.01))  # (the first window: the mark)
    limits = [c.window(_w(100, 0.01)) for _ in range(PROBE_AFTER)]
    assert limits[:-1] == [16] * (PROBE_AFTER - 1) and limits[-1] == 20


def test_bounds_and_a_start_outside_them():
    assert Controller(start=1000).limit == HIGHEST
    assert Controller(start=1).limit == LOWEST
    c = Controller(start=5, lowest=4)
    c.window(_w(1, 1))
    c.window(_w(2, 1))
    assert c.limit == 7  # (ceil(5 * 1.25): grows by at least one)


def test_the_meter_closes_windows_of_enough_requests_and_time():
    m = Meter(0.0)
    closed = [m.done(1000, 0.002, saturated=k == 5, now=k * 0.001) for k in range(100)]
    windows = [(k, w) for k, w in enumerate(closed) if w is not None]
    assert [k for k, _ in windows] == [50]  # (32 requests, but 50 ms)
    w = windows[0][1]
    assert w.saturated and w.latency == pytest.approx(0.002) and w.seconds == 0.05
    assert m.done(1000, 0.002, saturated=False, now=10.0, limit=64) is None  # (a window holds the limit at least)
