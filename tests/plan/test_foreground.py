"""Foreground candidates and draws: numpy is the oracle (np.flatnonzero of each class), slabs of any size agree."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npydask.plan.foreground import (
    CandidateBuilder,
    Candidates,
    choose_class,
    draw,
    normalized_ratios,
    slab_planes,
)


def build(label, patch_ndim, planes=None, **kw):
    b = CandidateBuilder(label.shape, patch_ndim, **kw)
    lead = label.ndim - patch_ndim
    depth = label.shape[lead]
    planes = planes or slab_planes(label.shape, patch_ndim)
    for first in range(0, depth, planes):
        b.add(label[(slice(None),) * lead + (slice(first, first + planes),)], first)
    return b.result()


def oracle(label, patch_ndim, value):
    """Flat positions (over the trailing axes) where any leading element equals ``value``."""
    lead = label.ndim - patch_ndim
    hit = (label == value).any(axis=tuple(range(lead))) if lead else label == value
    return np.flatnonzero(hit)


def test_every_class_voxel_is_a_candidate_when_under_the_limit():
    rng = np.random.default_rng(1)
    label = rng.choice([0, 0, 0, 1, 2, 5], size=(9, 7, 6)).astype(np.int16)
    c = build(label, 3, planes=2)
    assert c.classes == (1, 2, 5)
    assert c.extent == (9, 7, 6)
    for value, pos, count in zip(c.classes, c.positions, c.counts):
        want = oracle(label, 3, value)
        assert pos.dtype == np.int64
        np.testing.assert_array_equal(pos, want)
        assert count == len(want)
    np.testing.assert_array_equal(c.coordinates(0), np.argwhere(label == 1))


def test_given_classes_keep_their_order_and_absent_ones_are_empty():
    label = np.zeros((4, 4), np.uint8)
    label[0, 1] = 3
    label[2, 2] = 1
    c = build(label, 2, classes=[3, 7, 1])
    assert c.classes == (3, 7, 1)
    assert [p.tolist() for p in c.positions] == [[1], [], [10]]
    assert c.present == (True, False, True)
    assert c.counts == (1, 0, 1)


@pytest.mark.parametrize("planes", [1, 2, 3, 16])
def test_the_bounded_sample_depends_on_neither_slab_size_nor_order_of_arrival(planes):
    rng = np.random.default_rng(2)
    label = (rng.random((16, 20, 20)) < 0.3).astype(np.uint8) * rng.integers(1, 3, (16, 20, 20)).astype(np.uint8)
    whole = build(label, 3, planes=16, limit=50)
    part = build(label, 3, planes=planes, limit=50)
    for a, b, value in zip(whole.positions, part.positions, whole.classes):
        np.testing.assert_array_equal(a, b)
        assert len(a) == 50
        assert set(a.tolist()) <= set(oracle(label, 3, value).tolist())
        assert np.all(np.diff(a) > 0)
    assert whole.counts == tuple(len(oracle(label, 3, v)) for v in whole.classes)


def test_another_seed_keeps_another_sample_and_the_sample_spreads_over_the_volume():
    label = np.ones((64, 64), np.uint8)
    a = build(label, 2, limit=400, seed=0).positions[0]
    b = build(label, 2, limit=400, seed=1).positions[0]
    assert len(a) == len(b) == 400
    assert not np.array_equal(a, b)
    rows = a // 64
    counts = np.bincount(rows // 16, minlength=4)  # 100 expected per quarter of the rows
    assert counts.min() > 50


def test_leading_axes_count_a_voxel_once_per_class():
    label = np.zeros((2, 3, 4), np.int32)
    label[0, 1, 2] = 1
    label[1, 1, 2] = 1  # the same voxel and class in both channels: one candidate
    label[1, 0, 0] = 2
    c = build(label, 2, planes=1)
    assert c.classes == (1, 2)
    assert [p.tolist() for p in c.positions] == [[6], [0]]
    assert c.counts == (1, 1)


def test_float_labels_skip_nan_and_bool_labels_have_class_true():
    label = np.array([[0.0, np.nan], [2.5, 2.5]])
    c = build(label, 2)
    assert c.classes == (2.5,)
    assert c.positions[0].tolist() == [2, 3]
    c = build(np.array([[False, True]]), 2)
    assert c.classes == (True,)


def test_an_empty_label_has_no_classes():
    c = build(np.zeros((3, 3), np.uint8), 2)
    assert c.classes == () and c.present == ()


def test_slab_planes_aims_at_the_voxel_budget():
    assert slab_planes((512, 512, 512), 3) == 8
    assert slab_planes((4, 512, 512), 3, voxels=1 << 30) == 4
    assert slab_planes((3, 100, 100, 100), 3, voxels=30_000) == 1
    assert slab_planes((100, 10), 2, voxels=100) == 10


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: CandidateBuilder((4, 4), 3), "no 3 trailing"),
        (lambda: CandidateBuilder((4, 4), 2, limit=0), "at least 1"),
        (lambda: CandidateBuilder((4, 4), 2, classes=[1, 1]), "distinct"),
    ],
)
def test_bad_builder_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_slabs_out_of_order_or_of_the_wrong_shape_or_missing_raise():
    b = CandidateBuilder((4, 5), 2)
    with pytest.raises(ValueError, match="starting at plane 0"):
        b.add(np.zeros((1, 5)), 1)
    with pytest.raises(ValueError, match="found shape"):
        b.add(np.zeros((1, 4)), 0)
    with pytest.raises(ValueError, match="found shape"):
        b.add(np.zeros((5, 5)), 0)
    b.add(np.zeros((2, 5)), 0)
    with pytest.raises(ValueError, match="all 4 planes"):
        b.result()


def test_normalized_ratios_check_their_values():
    assert normalized_ratios([2, 2], 2) == (0.5, 0.5)
    for bad in ([1], [1, -1], [0, 0], [1, float("nan")]):
        with pytest.raises(ValueError, match="ratios"):
            normalized_ratios(bad, 2)


def test_choose_class_renormalises_ratios_over_the_present_classes():
    rng = np.random.default_rng(3)
    picks = [choose_class(rng, [True, False, True], [0.2, 0.7, 0.1]) for _ in range(3000)]
    assert set(picks) == {0, 2}
    share = picks.count(0) / len(picks)  # 0.2 / 0.3
    assert abs(share - 2 / 3) < 4 * math.sqrt(2 / 9 / len(picks))
    assert choose_class(rng, [False, True], [1.0, 0.0]) is None  # the one present class has ratio 0
    assert choose_class(rng, []) is None


def candidates_of(label, **kw):
    return build(label, label.ndim, **kw)


def test_a_foreground_draw_contains_a_voxel_of_its_class_inside_the_volume():
    label = np.zeros((30, 40, 20), np.uint8)
    label[2:5, 30:38, 1:3] = 1
    label[25, 5, 18] = 2
    c = candidates_of(label)
    patch = (8, 10, 6)
    for i in range(200):
        d = draw(np.random.default_rng(i), c, patch, p=1.0)
        assert d.class_index is not None
        box = tuple(slice(s, s + n) for s, n in zip(d.start, patch))
        assert all(0 <= s and s + n <= e for s, n, e in zip(d.start, patch, label.shape))
        assert np.any(label[box] == c.classes[d.class_index])
        assert label[d.center] == c.classes[d.class_index]
        assert all(s <= x < s + n for s, x, n in zip(d.start, d.center, patch))


def test_a_draw_gives_its_class_value_beside_the_class_index_and_label_is_a_deprecated_alias():
    label = np.zeros((12, 12), np.int16)
    label[2, 3] = 7
    label[9, 9] = -4
    c = candidates_of(label)
    assert c.classes == (-4, 7)
    seen = set()
    for i in range(40):
        d = draw(np.random.default_rng(i), c, (4, 4), p=1.0)
        assert d.class_value == c.classes[d.class_index] == label[d.center]  # (the value, as MONAI names labels)
        seen.add(d.class_value)
        with pytest.warns(DeprecationWarning, match="class_index"):
            assert d.label == d.class_index
    assert seen == {-4, 7}
    uniform = draw(np.random.default_rng(0), c, (4, 4), p=0.0)
    assert uniform.class_index is None and uniform.class_value is None and uniform.center is None


def test_draws_are_a_function_of_the_generator_seed():
    label = np.zeros((50, 50), np.uint8)
    label[10:20, 30:40] = 1
    c = candidates_of(label)
    a = [draw(np.random.default_rng(k), c, (8, 8), p=0.5) for k in range(50)]
    b = [draw(np.random.default_rng(k), c, (8, 8), p=0.5) for k in range(50)]
    assert a == b
    assert {d.class_index for d in a} == {0, None}


def test_the_foreground_share_is_p_within_binomial_bounds():
    label = np.zeros((40, 40, 40), np.uint8)
    label[5:9, 5:9, 5:9] = 1
    c = candidates_of(label)
    n, p = 2000, 0.33
    hits = sum(draw(np.random.default_rng(k), c, (16, 16, 16), p=p).class_index is not None for k in range(n))
    assert abs(hits - n * p) <= 4 * math.sqrt(n * p * (1 - p))


def test_ratios_pick_classes_in_proportion():
    label = np.zeros((20, 20), np.uint8)
    label[2, 2] = 1
    label[15, 15] = 2
    c = candidates_of(label)
    n = 2000
    labels = [draw(np.random.default_rng(k), c, (4, 4), p=1.0, ratios=(0.8, 0.2)).class_index for k in range(n)]
    share = labels.count(0) / n
    assert abs(share - 0.8) <= 4 * math.sqrt(0.8 * 0.2 / n)


def test_a_file_without_foreground_falls_back_to_uniform_draws():
    c = candidates_of(np.zeros((10, 10), np.uint8))
    d = draw(np.random.default_rng(0), c, (4, 4), p=1.0)
    assert d.class_index is None and d.center is None
    assert all(0 <= s <= 6 for s in d.start)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    data=st.data(),
)
def test_any_label_any_patch(shape, data):
    shape = tuple(shape)
    patch = tuple(data.draw(st.integers(1, n)) for n in shape)
    seed = data.draw(st.integers(0, 2**32))
    label = np.random.default_rng(seed).integers(0, 3, shape).astype(np.uint8)
    limit = data.draw(st.integers(1, 20))
    c = build(label, len(shape), planes=data.draw(st.integers(1, shape[0])), limit=limit)
    assert isinstance(c, Candidates)
    for value, pos in zip(c.classes, c.positions):
        want = oracle(label, len(shape), value)
        assert len(pos) == min(limit, len(want))
        assert set(pos.tolist()) <= set(want.tolist())
    d = draw(np.random.default_rng(seed), c, patch, p=1.0)
    assert all(0 <= s and s + n <= e for s, n, e in zip(d.start, patch, shape))
    if d.class_index is not None:
        box = tuple(slice(s, s + n) for s, n in zip(d.start, patch))
        assert np.any(label[box] == c.classes[d.class_index])
