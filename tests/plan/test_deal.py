"""Batch-strided shards, DataLoader workers and the resume position P: every position once, also across resumes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npydask.plan.deal import Deal, check_sampler_options, global_batch_count, interleaved, position_after


def dataloader_order(worker_lists):
    """The order PyTorch's DataLoader returns its workers' batches: in turn, skipping exhausted workers."""
    out, at = [], [0] * len(worker_lists)
    while any(a < len(w) for a, w in zip(at, worker_lists)):
        for k, w in enumerate(worker_lists):
            if at[k] < len(w):
                out.append(w[at[k]])
                at[k] += 1
    return out


def rank_stream(deal, workers):
    """The batches one rank's training loop receives from a DataLoader of ``workers`` workers (0: in-process)."""
    if workers == 0:
        return deal.batches()
    return dataloader_order([deal.worker_batches(w, workers) for w in range(workers)])


def run(n, start, shards, workers, batch_size, steps=None, drop_last=False):
    """Train ``steps`` batches on every rank (None: to the end); the positions delivered and the state's P."""
    deals = [Deal(n, batch_size, k, shards, start, drop_last) for k in range(shards)]
    most = max(len(d) for d in deals)
    steps = most if steps is None else steps
    got = [p for d in deals for batch in rank_stream(d, workers)[:steps] for p in batch.tolist()]
    positions = {d.position_after(steps) for d in deals}
    assert len(positions) == 1  # the same state on every rank
    return got, positions.pop()


@st.composite
def passes(draw, most_n=120, most_b=9, most_s=7):
    """A pass: (n, batch_size, num_shards, start, drop_last), start anywhere in [0, n]."""
    n = draw(st.integers(0, most_n))
    return n, draw(st.integers(1, most_b)), draw(st.integers(1, most_s)), draw(st.integers(0, n)), draw(st.booleans())


def dealt(n, start, b, s, drop_last, rounds=None):
    """The positions a pass reads in its first ``rounds`` rounds of ``s`` global batches (all if None), by the rules.

    One shard: ``[start, n)`` in batches of ``b`` (a short last one, or dropped). Several: whole rounds, the dealt
    positions past the end wrapping to the epoch's start (or the incomplete round dropped).
    """
    left = n - start
    if s == 1:
        total = left // b if drop_last else -(-left // b)
    else:
        total = (left // (b * s) if drop_last else -(-left // (b * s))) * s
    g = total if rounds is None else min(total, rounds * s)
    end = start + g * b if s > 1 else min(start + g * b, n)
    return [p % n for p in range(start, end)]


def check_once_plus_wrap(got, n, start, end, b, s):
    """``got`` holds each position of ``[start, end)`` once, and beyond them only a wrapped tail of under a round."""
    extra = Counter(got) - Counter(range(start, end))
    assert Counter(got) - extra == Counter(range(start, end))  # every position of [start, end) delivered once...
    assert not extra or (s > 1 and end == n and sum(extra.values()) < b * s)  # ...and only the last round wraps


def test_the_worked_table():
    # N=9, B=2, S=2: global batches [0,1] [2,3] [4,5] [6,7] [8,0] [1,2]: the last round wraps to the epoch's start
    assert [[b.tolist() for b in Deal(9, 2, k, 2).batches()] for k in range(2)] == [
        [[0, 1], [4, 5], [8, 0]],
        [[2, 3], [6, 7], [1, 2]],
    ]
    assert [len(Deal(9, 2, k, 2)) for k in range(2)] == [3, 3]
    assert [Deal(9, 2, k, 2).samples for k in range(2)] == [6, 6]
    # one shard: no wrap, the last batch short
    assert [b.tolist() for b in Deal(9, 2).batches()] == [[0, 1], [2, 3], [4, 5], [6, 7], [8]]
    # with drop_last the incomplete round goes: both shards hold 2 and P jumps to N after them
    assert [[b.tolist() for b in Deal(9, 2, k, 2, drop_last=True).batches()] for k in range(2)] == [
        [[0, 1], [4, 5]],
        [[2, 3], [6, 7]],
    ]
    assert [position_after(9, 2, 2, b, drop_last=True) for b in range(3)] == [0, 4, 9]
    # more shards than global batches: every shard holds one, most of them wrapped
    assert [Deal(9, 4, k, 5).batches()[0].tolist() for k in range(5)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 0, 1, 2],
        [3, 4, 5, 6],
        [7, 8, 0, 1],
    ]
    assert [len(Deal(9, 4, k, 5, drop_last=True)) for k in range(5)] == [0] * 5


def test_ranks_hold_equal_counts_when_n_is_not_a_multiple_of_the_round():
    # 2 ranks, N=5, B=1: 3 batches each (position 0 wraps in); P after 2 each is 4 on both
    assert [Deal(5, 1, k, 2).positions().tolist() for k in range(2)] == [[0, 2, 4], [1, 3, 0]]
    got, p = run(5, 0, 2, 1, 1, steps=2)
    assert p == 4 and sorted(got) == [0, 1, 2, 3]
    rest, end = run(5, p, 3, 2, 4)  # resumed at 3 ranks of 4: position 4, then wrapped ones
    assert end == 5 and 4 in rest and len(rest) == 12


def test_a_finished_pass_resumes_to_nothing():
    deal = Deal(9, 2, start=9)
    assert len(deal) == 0 and deal.batches() == [] and deal.positions().tolist() == [] and deal.samples == 0
    assert deal.position_after(0) == 9 and global_batch_count(9, 2, start=9) == 0
    assert Deal(0, 3).batches() == [] and position_after(0, 3, 2, 0) == 0
    assert len(Deal(9, 2, 0, 3, start=9)) == 0


@given(passes())
def test_shards_partition_the_rest_of_the_epoch(pass_):
    n, b, s, start, drop_last = pass_
    deals = [Deal(n, b, k, s, start, drop_last) for k in range(s)]
    total = deals[0].global_batches
    assert total == len(dealt(n, start, b, s, drop_last)) // b + (s == 1 and not drop_last and (n - start) % b > 0)
    got = []
    for k, deal in enumerate(deals):
        assert len(deal) == len(range(k, total, s))
        for i, batch in enumerate(deal.batches()):
            g = k + i * s
            assert batch.dtype == np.int64
            assert batch.tolist() == deal.global_batch(g).tolist()
            assert len(batch) == b or (s == 1 and g == total - 1 and not drop_last)  # one shard: the last is short
        assert deal.samples == len(deal.positions())
        got += deal.positions().tolist()
    assert len({len(d) for d in deals}) == 1 or s == 1  # several shards: equal counts, whatever n
    assert Counter(got) == Counter(dealt(n, start, b, s, drop_last))
    end = start + total * b if drop_last else n
    check_once_plus_wrap(got, n, start, min(end, n), b, s)


@given(passes(80, 6, 4), st.integers(1, 5))
def test_workers_in_turn_give_the_ranks_batches_in_order(pass_, w):
    n, b, s, start, drop_last = pass_
    for k in range(s):
        deal = Deal(n, b, k, s, start, drop_last)
        parts = [deal.worker_batches(x, w) for x in range(w)]
        assert [len(p) for p in parts] == [len(range(x, len(deal), w)) for x in range(w)]
        assert [x.tolist() for x in dataloader_order(parts)] == [x.tolist() for x in deal.batches()]


@given(passes(100, 7, 5), st.integers(0, 3))
def test_after_b_batches_on_every_rank_exactly_the_positions_before_p_are_consumed(pass_, w):
    n, b, s, start, drop_last = pass_
    most = len(Deal(n, b, 0, s, start, drop_last))
    for steps in range(most + 1):
        got, p = run(n, start, s, w, b, steps, drop_last)
        assert start <= p <= n
        assert Counter(got) == Counter(dealt(n, start, b, s, drop_last, steps))
        if steps == most:  # every rank has taken all of its batches: the pass is over, with drop_last too
            assert p == n
        if p < n:
            assert p == start + steps * b * s
            assert sorted(got) == list(range(start, p))  # (no wrapped sample before the last round)
        else:  # the pass is over: all but a dropped tail, and a wrapped one
            assert steps == most
            kept = start + Deal(n, b, 0, s, start, drop_last).global_batches * b if drop_last else n
            check_once_plus_wrap(got, n, start, kept, b, s)


stages = st.tuples(st.integers(1, 5), st.integers(0, 3), st.integers(1, 6), st.floats(0, 1))


@given(n=st.integers(0, 90), plan=st.lists(stages, min_size=1, max_size=4))
def test_resumes_at_other_shards_workers_and_batch_sizes_deliver_each_position_once(n, plan):
    # each stage trains a fraction of its pass at (shards, workers, batch_size), saves P and the next resumes there;
    # the last stage runs to the end of the epoch: every position once, bar the last stage's wrapped round
    got, p = [], 0
    for i, (s, w, b, fraction) in enumerate(plan):
        most = len(Deal(n, b, 0, s, p))
        steps = most if i == len(plan) - 1 else int(fraction * most)
        part, after = run(n, p, s, w, b, steps)
        check_once_plus_wrap(part, n, p, after, b, s)
        got, p = got + part, after
        last = (s, b)
    assert p == n
    check_once_plus_wrap(got, n, 0, n, last[1], last[0])


@pytest.mark.parametrize("n", [1, 7, 23, 48, 50, 61])
@pytest.mark.parametrize("later", [(2, 1), (3, 2)])
def test_save_at_every_step_at_4x2_resume_at_later_then_at_1x1(n, later):
    b = 3
    first = len(Deal(n, b, 0, 4))
    for steps in range(first + 1):
        got, p = run(n, 0, 4, 2, b, steps)
        if p == n:  # the 4-rank pass ran to its end, its last round wrapped
            check_once_plus_wrap(got, n, 0, n, b, 4)
            continue
        second = len(Deal(n, b, 0, later[0], p))
        for steps2 in range(second + 1):
            part, p2 = run(n, p, *later, b, steps2)
            rest, end = run(n, p2, 1, 1, b)
            assert end == n
            if p2 == n:
                check_once_plus_wrap(got + part, n, 0, n, b, later[0])
            else:  # (only the 1x1 pass ends the epoch: nothing wraps)
                assert sorted(got + part + rest) == list(range(n)), (steps, steps2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n": -1, "batch_size": 2}, ValueError, "n .the samples per epoch. must be at least 0"),
        ({"n": 4, "batch_size": 0}, ValueError, "batch_size must be at least 1"),
        ({"n": 4, "batch_size": 2.0}, TypeError, "batch_size must be an integer"),
        ({"n": 4, "batch_size": 2, "num_shards": 0}, ValueError, "num_shards must be at least 1"),
        ({"n": 4, "batch_size": 2, "shard_id": 2, "num_shards": 2}, ValueError, r"shard_id must be in \[0, num_shards"),
        ({"n": 4, "batch_size": 2, "shard_id": True}, TypeError, "shard_id must be an integer"),
        ({"n": 4, "batch_size": 2, "start": 5}, ValueError, "start=5 is past the epoch's 4 samples"),
    ],
)
def test_bad_deals_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        Deal(**kwargs)


def test_deal_values_are_plain_ints_and_compare_equal():
    deal = Deal(np.int64(9), np.int32(2), np.int8(1), 2, np.uint8(3), np.bool_(True))
    assert deal == Deal(9, 2, 1, 2, 3, True)
    assert all(type(v) is int for v in (deal.n, deal.batch_size, deal.shard_id, deal.num_shards, deal.start))
    assert deal.drop_last is True


def test_indexing_errors():
    deal = Deal(9, 2, 1, 2)
    with pytest.raises(IndexError, match="batch 3 out of range: shard 1 of 2 holds 3"):
        deal.batch(3)
    with pytest.raises(IndexError, match="global batch 6 out of range"):
        deal.global_batch(6)
    with pytest.raises(ValueError, match=r"worker must be in \[0, num_workers\)"):
        deal.worker_batches(2, 2)
    with pytest.raises(ValueError, match="num_workers must be at least 1"):
        deal.worker_batches(0, 0)


def test_more_batches_than_a_shard_holds_is_refused():
    assert position_after(9, 2, 2, 3) == 9
    with pytest.raises(ValueError, match=r"4 batches consumed, but a shard holds at most 3 in this pass"):
        position_after(9, 2, 2, 4)
    with pytest.raises(ValueError, match=r"3 batches consumed, but a shard holds at most 2 in this pass"):
        position_after(9, 2, 2, 3, drop_last=True)
    with pytest.raises(ValueError, match="batches .the batches consumed on every shard. must be at least 0"):
        position_after(9, 2, 2, -1)


def test_sampler_options():
    check_sampler_options(pad_last_batch=False, stick_to_shard=True)
    with pytest.raises(ValueError, match="pad_last_batch=True does not apply with a sampler"):
        check_sampler_options(pad_last_batch=True, stick_to_shard=True)
    with pytest.raises(ValueError, match="stick_to_shard=False does not apply with a sampler"):
        check_sampler_options(pad_last_batch=False, stick_to_shard=False)


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.timeout(120)
def test_pytorch_returns_the_workers_batches_in_the_ranks_order(workers):
    # the rule the module leans on: a DataLoader of W workers over an iterable dataset whose worker w yields its
    # rank's batches w, w+W, ... (as single samples, batched by the DataLoader) returns them in order 0, 1, 2, ...
    torch = pytest.importorskip("torch")

    class Dealt(torch.utils.data.IterableDataset):
        def __init__(self, deal):
            self.deal = deal

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            w, count = (0, 1) if info is None else (info.id, info.num_workers)
            for batch in self.deal.worker_batches(w, count):
                yield from batch.tolist()

    context = {"multiprocessing_context": "fork"} if workers else {}
    for k, start in [(0, 0), (1, 0), (1, 3)]:  # 4, 3 and 3 batches: workers hold unequal counts
        deal = Deal(20, 3, k, 2, start=start)
        loader = torch.utils.data.DataLoader(Dealt(deal), batch_size=3, num_workers=workers, **context)
        assert [b.tolist() for b in loader] == [b.tolist() for b in deal.batches()]


@given(st.integers(1, 12), st.integers(1, 5), st.integers(1, 9), st.integers(1, 7), st.integers(1, 3))
def test_interleave_permutes_each_block_and_keeps_the_deal_exact(units, per_file, m, b, s):
    n = units * per_file
    order = interleaved(np.arange(n), n, per_file, m)
    assert sorted(order.tolist()) == list(range(n))  # a permutation of the epoch...
    block = m * per_file
    assert all(set(order[i : i + block].tolist()) == set(range(i, min(i + block, n))) for i in range(0, n, block))
    for i in range(0, n, block):  # ...in which consecutive positions of a block read distinct units
        window = (order[i : i + min(m, units - i // per_file)] // per_file).tolist()
        assert len(set(window)) == len(window)
    deals = [Deal(n, b, k, s, per_file=per_file, interleave=m) for k in range(s)]
    got = [p for d in deals for p in d.positions().tolist()]
    assert Counter(got) == Counter(order[p % n] for p in range(len(dealt(n, 0, b, s, False))))


def test_interleave_needs_whole_units():
    with pytest.raises(ValueError, match="interleave=2 needs whole units: 7 samples are not a multiple of per_file=2"):
        Deal(7, 2, per_file=2, interleave=2)
    assert Deal(8, 8, per_file=4, interleave=2).batch(0).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
