"""The hedge rule in pure code: size classes, the delay from latency histories, the token bucket."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from npydask.plan.hedging import (
    HISTORY,
    MIN_KNOWN,
    HedgeMode,
    LatencyHistory,
    TokenBucket,
    hedge_delay,
    parse_hedge,
    percentile,
    size_class,
)


def test_size_classes_are_powers_of_four_of_the_bytes_requested():
    for n in [4, 5, 15, 16, 63, 64, 4096, 4097, 65535, 65536, 8 << 20, (1 << 40) + 3, (1 << 62) - 1]:
        k = max(k for k in range(40) if 4**k <= n)  # (exact: a float log4 of 2**62 - 1 is 31.0)
        assert size_class(n) == k, n
    assert [size_class(n) for n in (0, 1, 2, 3)] == [0, 0, 0, 0]
    assert size_class(4**6 - 1) == 5 and size_class(4**6) == 6  # (the edge is exact)


def test_the_percentile_is_numpys():
    rng = np.random.default_rng(1)
    for n in (1, 2, 7, 50, 1000):
        values = rng.exponential(0.01, n).tolist()
        for q in (0, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    with pytest.raises(ValueError, match="no values"):
        percentile([], 90)


def test_the_delay_is_twice_the_p90_at_least_20_ms_once_50_are_known():
    rng = np.random.default_rng(2)
    slow = rng.uniform(0.05, 0.15, 200).tolist()
    assert hedge_delay(slow[: MIN_KNOWN - 1]) is None  # (no hedge before 50 are known)
    assert hedge_delay(slow[:MIN_KNOWN]) == pytest.approx(2 * np.percentile(slow[:MIN_KNOWN], 90))
    assert hedge_delay(slow) == pytest.approx(2 * np.percentile(slow, 90))
    assert hedge_delay([0.001] * 100) == 0.020  # (fast stores: the floor)


def test_a_history_keeps_the_last_1000_latencies_of_each_class_apart():
    history = LatencyHistory()
    for _ in range(MIN_KNOWN - 1):
        history.add(4096, 0.001)
    assert history.delay(4096) is None and history.known(4096) == MIN_KNOWN - 1
    history.add(5000, 0.001)  # (the same class: 4096 <= n < 16384)
    assert history.delay(4096) == 0.020
    assert history.delay(65536) is None  # (another class knows nothing yet)
    for _ in range(HISTORY):
        history.add(65536, 0.5)
    for _ in range(HISTORY):
        history.add(65536, 0.010)  # (the slow ones age out)
    assert history.known(65536) == HISTORY
    assert history.delay(65536) == pytest.approx(0.020)
    for _ in range(200):
        history.add(8 << 20, 0.3)
    assert history.delay(8 << 20) == pytest.approx(0.6)
    assert history.delay(4096) == 0.020  # (unchanged by the others)


def test_a_history_is_safe_across_threads():
    history = LatencyHistory()

    def add():
        for i in range(2000):
            history.add(1 << 20, 0.01 * (i % 10))

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert history.known(1 << 20) == HISTORY
    assert 0.14 <= history.delay(1 << 20) <= 0.18  # (2 x p90 of 0, 10, ..., 90 ms)


def test_the_bucket_starts_with_one_gains_the_budget_per_request_and_holds_five():
    bucket = TokenBucket(0.03)
    assert bucket.take() and not bucket.take()  # (one to start with)
    for _ in range(33):
        bucket.gain()
    assert not bucket.take()  # (0.99 tokens)
    bucket.gain()
    assert bucket.take() and not bucket.take()  # (34 requests: one hedge)
    for _ in range(10_000):
        bucket.gain()
    assert bucket.tokens == 5
    assert sum(bucket.take() for _ in range(10)) == 5  # (at most 5 in a burst, however long the quiet)
    hedges = 0
    for _ in range(10_000):  # (every request late: the budget's rate, not twice the traffic)
        bucket.gain()
        hedges += bucket.take()
    assert hedges == pytest.approx(300, abs=1)
    zero = TokenBucket(0.0)
    assert zero.take() and not any(zero.take() for _ in range(100))


def test_hedge_modes():
    history = LatencyHistory()
    for _ in range(60):
        history.add(100, 0.05)
    assert parse_hedge("auto").delay(history, 100) == pytest.approx(0.1)
    assert parse_hedge("auto").delay(history, 1 << 20) is None
    assert parse_hedge("off").delay(history, 100) is None
    assert parse_hedge(0.25).delay(history, 1 << 20) == 0.25  # (a fixed delay needs no history)
    assert parse_hedge("auto") == HedgeMode()
