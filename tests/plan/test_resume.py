"""The resume state of a sampler loader: plain values, a finished epoch rolling over, refusals naming what differs."""

from __future__ import annotations

import json

import pytest

from npydask.plan.deal import Deal, position_after
from npydask.plan.resume import STATE_KEYS, ResumeState, check_resumable
from npydask.plan.sampling import DEFAULT_SEED

FINGERPRINT = {"files": "f1", "layout": "l1", "roi": "r1", "roi_shown": "whole files"}


# a saved state as state_dict() has returned it (the format old checkpoints hold)
SAVED = {
    "epoch": 2,
    "position": 48,
    "samples": 100,
    "seed": 5,
    "shuffle": True,
    "sampler": "Uniform(patch_shape=(8, 8))",
    "dataset_fingerprint": FINGERPRINT,
}
VALUES = {**{k: v for k, v in SAVED.items() if k != "dataset_fingerprint"}, "dataset": FINGERPRINT}


def state(**changes):
    return ResumeState(**{**VALUES, **changes})


def test_state_round_trip_through_plain_values():
    saved = state()
    d = saved.to_dict()
    assert tuple(d) == STATE_KEYS
    assert d == SAVED
    assert ResumeState.from_dict(d) == saved
    assert ResumeState.from_dict(json.loads(json.dumps(d))) == saved  # plain values: JSON keeps them
    assert state(seed=None).seed == DEFAULT_SEED  # recorded as the generator it stands for
    assert state(seed=None) == state(seed=DEFAULT_SEED)


def test_a_state_accepts_other_shards_workers_and_batch_sizes():
    # nothing about shards, workers or batch size is in a state: the same P comes from (4 x 8) and (2 x 16)
    assert position_after(100, 8, 4, 1) == position_after(100, 16, 2, 1) == 32
    check_resumable(state(position=32), state(epoch=0, position=0))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"seed": 6}, r"another seed \(the state's 5, this loader's 6\)"),
        ({"shuffle": False}, r"another shuffle \(the state's True, this loader's False\)"),
        (
            {"sampler": "Uniform(patch_shape=(4, 4))"},
            r"another sampler \(the state's 'Uniform\(patch_shape=\(8, 8\)\)'",
        ),
        ({"dataset": {**FINGERPRINT, "files": "f2"}}, r"another dataset \(its fingerprint differs in files\)"),
        (
            {"dataset": {**FINGERPRINT, "roi": "r2", "roi_shown": "start (1,) end (3,)"}},
            r"differs in roi; roi: the state's whole files, this loader's start \(1,\) end \(3,\)\)",
        ),
        ({"dataset": {"files": "f1"}}, r"differs in layout, roi\)"),
        ({"samples": 99}, r"another number of samples per epoch \(the state's 100, this loader's 99\)"),
    ],
)
def test_check_resumable_names_what_differs(changes, match):
    with pytest.raises(ValueError, match=match) as e:
        check_resumable(state(), state(epoch=0, position=0, **changes))
    assert "num_shards, the number of workers and batch_size may differ" in str(e.value)


def test_check_resumable_names_every_difference():
    with pytest.raises(ValueError, match="another sampler .*; another seed .*; another shuffle"):
        check_resumable(state(), state(sampler="Grid", seed=1, shuffle=False))


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ([1, 2], "a loader state is a dict from state_dict.., found list"),
        ({"epoch": 0, "batches_done": 3}, r"not the state of a loader with a sampler: missing \['position'"),
        ({**state().to_dict(), "epoch": "2"}, "not a valid loader state: epoch must be an integer"),
        ({**state().to_dict(), "shuffle": 1}, "not a valid loader state: shuffle must be True or False"),
        ({**state().to_dict(), "sampler": None}, "not a valid loader state: sampler must be the sampler's fingerprint"),
        ({**state().to_dict(), "dataset_fingerprint": "f1"}, "dataset must be the dataset's fingerprint"),
        ({**state().to_dict(), "position": 101}, "position=101 is past the epoch's 100 samples"),
        ({**state().to_dict(), "seed": -1}, "seed must be at least 0"),
    ],
)
def test_bad_states_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        ResumeState.from_dict(bad)


def test_a_finished_epoch_rolls_over_to_the_next():
    done = state(position=100)
    assert done.rolled_over() == state(epoch=3, position=0)
    assert state().rolled_over() == state()
    # the state after the last batch of an epoch, whatever the shards hold at the tail
    assert ResumeState(2, position_after(100, 8, 3, 5), 100, 5, True, "s").rolled_over().position == 0


def test_after_records_p_of_the_pass_and_rolls_over_at_its_end():
    begun = state(position=4)  # a pass of epoch 2 resumed at P0 = 4: 96 positions, 12 global batches of 8
    deal = Deal(100, 8, shard_id=1, num_shards=5, start=4)
    assert [begun.after(deal, b) for b in range(4)] == [
        state(position=4),
        state(position=44),
        state(position=84),
        state(epoch=3, position=0),  # shards 0 and 1 hold 3 batches, the rest 2: all 12 consumed
    ]
    assert begun.after(Deal(100, 8, num_shards=5, start=4), 2) == begun.after(deal, 2)  # any shard: the same P
    with pytest.raises(ValueError, match="4 batches consumed, but a shard holds at most 3 in this pass"):
        begun.after(deal, 4)
    with pytest.raises(ValueError, match=r"deals positions \[0, 100\), but the state begins at position 4"):
        begun.after(Deal(100, 8), 1)


def test_resume_checks_a_saved_state_and_gives_where_the_next_pass_starts():
    current = state(epoch=0, position=0)
    assert ResumeState.resume(SAVED, current) == state()
    assert ResumeState.resume({**SAVED, "position": 100}, current) == state(epoch=3, position=0)
    with pytest.raises(ValueError, match=r"another seed \(the state's 5, this loader's 6\)"):
        ResumeState.resume(SAVED, state(seed=6))
    with pytest.raises(ValueError, match=r"not the state of a loader with a sampler: missing \['position'"):
        ResumeState.resume({"epoch": 0, "batches_done": 3}, current)
