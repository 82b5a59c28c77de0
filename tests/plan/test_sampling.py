"""Epoch plans: DALI's shard and padding tables, shuffles seeded by (seed, epoch), batch counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npydask.plan.sampling import (
    DEFAULT_SEED,
    EpochPlan,
    batch_count,
    epoch_batches,
    epoch_order,
    epoch_shard,
    shard_samples,
)


def table(n, s, b, **kw):
    return [[batch.tolist() for batch in epoch_batches(n, b, shard_id=k, num_shards=s, **kw)] for k in range(s)]


def test_dali_padding_table():
    # N=10, S=3, batch 3: every shard pads to ceil(10/3)=4 samples, then to 6 (two full batches)
    assert table(10, 3, 3, pad_last_batch=True) == [
        [[0, 1, 2], [2, 2, 2]],
        [[3, 4, 5], [5, 5, 5]],
        [[6, 7, 8], [9, 9, 9]],
    ]


def test_without_padding_the_last_batch_is_short_or_dropped():
    assert table(10, 3, 3) == [[[0, 1, 2]], [[3, 4, 5]], [[6, 7, 8], [9]]]
    assert table(10, 3, 3, drop_last=True) == [[[0, 1, 2]], [[3, 4, 5]], [[6, 7, 8]]]
    assert table(7, 1, 3) == [[[0, 1, 2], [3, 4, 5], [6]]]
    assert table(6, 1, 3, drop_last=True) == [[[0, 1, 2], [3, 4, 5]]]


@pytest.mark.parametrize(("n", "s", "b"), [(10, 3, 3), (10, 3, 4), (7, 2, 5), (9, 4, 2), (5, 5, 1), (100, 3, 7)])
def test_padded_shards_all_have_ceil_n_over_s_rounded_to_batches(n, s, b):
    per = math.ceil(math.ceil(n / s) / b)
    for k, batches in enumerate(table(n, s, b, pad_last_batch=True)):
        assert len(batches) == per == batch_count(n, b, shard_id=k, num_shards=s, pad_last_batch=True)
        assert all(len(x) == b for x in batches)
        flat = [i for x in batches for i in x]
        lo, hi = n * k // s, n * (k + 1) // s
        assert flat[: hi - lo] == list(range(lo, hi))
        assert set(flat[hi - lo :]) <= {hi - 1}


@given(
    n=st.integers(1, 200),
    s=st.integers(1, 6),
    b=st.integers(1, 17),
    epoch=st.integers(0, 5),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_shards_are_disjoint_and_cover_the_epoch(n, s, b, epoch, shuffle, drop_last):
    if s > n:
        return
    seen = []
    for k in range(s):
        batches = epoch_batches(n, b, epoch=epoch, shuffle=shuffle, shard_id=k, num_shards=s, drop_last=drop_last)
        assert len(batches) == batch_count(n, b, shard_id=k, num_shards=s, drop_last=drop_last)
        assert all(0 < len(x) <= b for x in batches)
        if drop_last:
            assert all(len(x) == b for x in batches)
        seen += [i for x in batches for i in x.tolist()]
    assert len(seen) == len(set(seen))  # disjoint within an epoch
    if not drop_last:
        assert sorted(seen) == list(range(n))


def test_shuffle_is_seeded_by_seed_and_epoch_only():
    a = epoch_order(50, 3, shuffle=True, seed=11)
    assert a.tolist() == epoch_order(50, 3, shuffle=True, seed=11).tolist()
    assert a.tolist() != epoch_order(50, 4, shuffle=True, seed=11).tolist()
    assert a.tolist() != epoch_order(50, 3, shuffle=True, seed=12).tolist()
    assert sorted(a.tolist()) == list(range(50))
    assert epoch_order(50, 3, shuffle=True).tolist() == epoch_order(50, 3, shuffle=True, seed=DEFAULT_SEED).tolist()
    expected = np.random.default_rng([11, 3]).permutation(50)
    np.testing.assert_array_equal(a, expected)


def test_every_epoch_differs():
    orders = {tuple(epoch_order(30, e, shuffle=True).tolist()) for e in range(10)}
    assert len(orders) == 10


def test_shuffled_shards_split_the_same_permutation():
    perm = epoch_order(10, 2, shuffle=True, seed=5)
    parts = [shard_samples(perm, shard_id=k, num_shards=3).tolist() for k in range(3)]
    assert parts == [perm[0:3].tolist(), perm[3:6].tolist(), perm[6:10].tolist()]


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        (dict(n=10, batch_size=0), ValueError),
        (dict(n=10, batch_size=2.5), TypeError),
        (dict(n=10, batch_size=2, shard_id=3, num_shards=3), ValueError),
        (dict(n=10, batch_size=2, num_shards=0), ValueError),
        (dict(n=2, batch_size=2, num_shards=3), ValueError),
        (dict(n=10, batch_size=2, epoch=-1), ValueError),
        (dict(n=10, batch_size=2, shuffle=True, seed=-1), ValueError),
        (dict(n=10, batch_size=2, shuffle=True, seed="x"), TypeError),
    ],
)
def test_bad_arguments(kw, error):
    n = kw.pop("n")
    b = kw.pop("batch_size")
    with pytest.raises(error):
        epoch_batches(n, b, **kw)


def test_epoch_plan_is_the_functions():
    plan = EpochPlan(10, 3, True, 4, 1, 3, True, False)
    assert len(plan) == 2
    assert [b.tolist() for b in plan.batches(7)] == [
        b.tolist()
        for b in epoch_batches(10, 3, epoch=7, shuffle=True, seed=4, shard_id=1, num_shards=3, pad_last_batch=True)
    ]


@given(n=st.integers(1, 60), s=st.integers(1, 5), b=st.integers(1, 7), epoch=st.integers(0, 9), pad=st.booleans())
def test_without_stick_to_shard_epoch_e_reads_shard_k_plus_e(n, s, b, epoch, pad):
    if s > n:
        return
    for k in range(s):
        rotating = epoch_batches(
            n, b, epoch=epoch, shuffle=True, shard_id=k, num_shards=s, pad_last_batch=pad, stick_to_shard=False
        )
        own = epoch_batches(n, b, epoch=epoch, shuffle=True, shard_id=(k + epoch) % s, num_shards=s, pad_last_batch=pad)
        assert [x.tolist() for x in rotating] == [x.tolist() for x in own]
        plan = EpochPlan(n, b, True, None, k, s, pad, False, False)
        assert plan.count(epoch) == len(rotating) == len(plan.batches(epoch))
    assert [epoch_shard(1, 3, e, stick_to_shard=False) for e in range(6)] == [1, 2, 0, 1, 2, 0]
    assert {epoch_shard(1, 3, e) for e in range(6)} == {1}


def test_epoch_shard_checks_its_arguments_before_rotating():
    with pytest.raises(ValueError, match="shard_id"):
        epoch_shard(3, 3, 1, stick_to_shard=False)  # (3 + 1) % 3 would hide the bad shard_id
    with pytest.raises(ValueError, match="num_shards"):
        epoch_shard(0, 0, 1, stick_to_shard=False)
