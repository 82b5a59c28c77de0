"""Pure patch planning: per-position draws, unit orders, box placement and MONAI's tile layout."""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npydask.errors import RoiError
from npydask.plan.patches import (
    Patch,
    Slot,
    axis_starts,
    draw_rng,
    draw_words,
    grid_starts,
    grid_step,
    patch_index,
    position_file,
    shift_inside,
    start_range,
    uniform_start,
    uniform_starts,
    unit_order,
)
from npydask.plan.sampling import DEFAULT_SEED, epoch_order

# -- MONAI's formulas, copied by hand (MONAI is not installed) ------------------------------------


def monai_scan_interval(image_size, roi_size, overlap):
    """monai.inferers.utils._get_scan_interval."""
    out = []
    for i in range(len(roi_size)):
        if roi_size[i] == image_size[i]:
            out.append(int(roi_size[i]))
        else:
            interval = int(roi_size[i] * (1 - overlap))
            out.append(interval if interval > 0 else 1)
    return tuple(out)


def monai_dense_patch_slices(image_size, roi_size, scan_interval):
    """monai.data.utils.dense_patch_slices: the starts of every tile, raster order."""
    scan_num = []
    for i in range(len(image_size)):
        if scan_interval[i] == 0:
            scan_num.append(1)
        else:
            num = int(math.ceil(float(image_size[i]) / scan_interval[i]))
            scan_dim = next((d for d in range(num) if d * scan_interval[i] + roi_size[i] >= image_size[i]), None)
            scan_num.append(scan_dim + 1 if scan_dim is not None else 1)
    starts = []
    for dim in range(len(image_size)):
        dim_starts = []
        for idx in range(scan_num[dim]):
            start_idx = idx * scan_interval[dim]
            start_idx -= max(start_idx + roi_size[dim] - image_size[dim], 0)
            dim_starts.append(start_idx)
        starts.append(dim_starts)
    out = np.asarray([x.flatten() for x in np.meshgrid(*starts, indexing="ij")]).T
    return [tuple(int(v) for v in row) for row in out]


def monai_sliding_window_starts(image_size, roi_size, overlap):
    """sliding_window_inference's tiles in the input's coordinates: pad small axes (half before), tile, shift back."""
    before = [max(r - s, 0) // 2 for s, r in zip(image_size, roi_size)]
    padded = [max(s, r) for s, r in zip(image_size, roi_size)]
    interval = monai_scan_interval(padded, roi_size, overlap)
    tiles = monai_dense_patch_slices(padded, roi_size, interval)
    return [tuple(a - b for a, b in zip(start, before)) for start in tiles]


shapes = st.integers(1, 3).flatmap(
    lambda nd: st.tuples(
        st.lists(st.integers(1, 70), min_size=nd, max_size=nd), st.lists(st.integers(1, 40), min_size=nd, max_size=nd)
    )
)


@given(shapes, st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.7, 0.9, 0.99]))
def test_grid_equals_monai_sliding_window(extent_patch, overlap):
    extent, patch = extent_patch
    step = grid_step(patch, overlap)
    assert grid_starts(extent, patch, step) == monai_sliding_window_starts(extent, patch, overlap)


@given(shapes, st.data())
def test_grid_covers_every_voxel_and_ends_at_the_extent(extent_patch, data):
    extent, patch = extent_patch
    voxels = [data.draw(st.integers(0, p - 1)) for p in patch]
    step = grid_step(patch, overlap_voxels=voxels)
    assert step == tuple(p - v for p, v in zip(patch, voxels))
    starts = grid_starts(extent, patch, step)
    axes = [axis_starts(e, p, s) for e, p, s in zip(extent, patch, step)]
    # the tiles are the product of the axes' starts in raster order (last axis fastest), so a voxel is
    # covered exactly when each of its coordinates is covered along its axis
    assert starts == list(itertools.product(*axes))
    for along, e, p, s in zip(axes, extent, patch, step):
        covered = np.zeros(e, np.int32)
        for a in along:
            covered[max(a, 0) : a + p] += 1
        assert covered.min() >= 1
        if e >= p:
            assert along[0] == 0 and along[-1] + p == e and all(0 <= a <= e - p for a in along)
            assert len(along) == math.ceil((e - p) / s) + 1
            assert all(b - a <= s for a, b in zip(along, along[1:]))
        else:
            assert along == [-((p - e) // 2)]
    assert len(starts) == math.prod(len(a) for a in axes)


def test_grid_covers_every_voxel_of_small_volumes():
    """The same, voxel by voxel, for a few whole volumes."""
    for extent, patch, overlap in [((7, 9, 5), (3, 4, 5), 0.25), ((30, 2), (8, 5), 0.5), ((16,), (16,), 0.9)]:
        step = grid_step(patch, overlap)
        covered = np.zeros(extent, np.int32)
        for start in grid_starts(extent, patch, step):
            covered[tuple(slice(max(a, 0), a + p) for a, p in zip(start, patch))] += 1
        assert covered.min() >= 1


def test_grid_step_and_its_errors():
    assert grid_step((128, 128, 128)) == (96, 96, 96)
    assert grid_step((10, 3), (0.5, 0.9)) == (5, 1)
    assert grid_step((10,), 0.0) == (10,)
    assert grid_step((10, 4), overlap_voxels=2) == (8, 2)
    with pytest.raises(ValueError, match=r"overlap must be in \[0, 1\), found 1.0"):
        grid_step((4,), 1.0)
    with pytest.raises(ValueError, match="overlap must be in"):
        grid_step((4,), -0.1)
    with pytest.raises(TypeError, match="overlap must be a number"):
        grid_step((4,), "0.5")
    with pytest.raises(ValueError, match="overlap_voxels must be below the patch.*found 4 for a patch of 4"):
        grid_step((4,), overlap_voxels=4)
    with pytest.raises(ValueError, match="overlap_voxels must be at least 0"):
        grid_step((4,), overlap_voxels=-1)
    with pytest.raises(ValueError, match=r"one entry per patch axis \(2\)"):
        grid_step((4, 4), (0.1, 0.2, 0.3))
    with pytest.raises(ValueError, match="longer than the patch"):
        axis_starts(10, 4, 5)


def test_grid_of_the_goal_volume():
    assert axis_starts(512, 128, 96) == [0, 96, 192, 288, 384]
    assert len(grid_starts((512,) * 3, (128,) * 3, (96,) * 3)) == 125
    assert axis_starts(3, 6, 1) == [-1]  # centred as MONAI pads: 1 before, 2 after


def test_draws_depend_only_on_seed_epoch_and_position():
    def draw(s, e, p):
        return draw_rng(s, e, p).integers(0, 2**62, size=4).tolist()

    assert draw(1, 2, 3) == draw(1, 2, 3)
    seen = {tuple(draw(s, e, p)) for s in range(3) for e in range(3) for p in range(20)}
    assert len(seen) == 3 * 3 * 20
    # position 0's stream is not the epoch order's generator (numpy pads short entropy with zeros)
    assert np.random.default_rng([1, 2]).integers(0, 2**62, size=4).tolist() != draw(1, 2, 0)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises((TypeError, ValueError)):
            draw_rng(0, 0, bad)


@given(st.integers(1, 30), st.integers(1, 5), st.integers(0, 2**31), st.integers(0, 50), st.booleans())
def test_units_keep_a_files_patches_adjacent(n, per_file, seed, epoch, shuffle):
    order = unit_order(n, per_file, seed, epoch, shuffle)
    assert order.tolist() == epoch_order(n, epoch, shuffle=shuffle, seed=seed).tolist()
    slots = [position_file(order, per_file, p) for p in range(n * per_file)]
    assert [s.file for s in slots] == [int(f) for f in order for _ in range(per_file)]
    assert [s.k for s in slots] == list(range(per_file)) * n
    assert sorted(order.tolist()) == list(range(n))
    if not shuffle:
        assert order.tolist() == list(range(n))


def test_unit_order_seed_none_is_the_default_seed_and_bad_positions_fail():
    assert unit_order(9, 1, None, 2, True).tolist() == unit_order(9, 1, DEFAULT_SEED, 2, True).tolist()
    assert position_file(np.array([2, 0]), 3, 5) == Slot(0, 2)
    with pytest.raises(ValueError, match="position 6 is past the epoch's end: it has 6 samples"):
        position_file(np.array([2, 0]), 3, 6)
    with pytest.raises(ValueError, match="per_file must be at least 1"):
        unit_order(3, 0, 0, 0, False)


@given(shapes, st.integers(0, 10**6), st.sampled_from(["inside", "pad"]))
def test_uniform_starts_lie_where_the_policy_allows(extent_patch, position, policy):
    extent, patch = extent_patch
    fits = all(e >= p for e, p in zip(extent, patch))
    rng = draw_rng(5, 1, position)
    if policy == "inside" and not fits:
        with pytest.raises(RoiError, match="does not fit inside"):
            uniform_start(rng, extent, patch, policy)
        return
    start = uniform_start(rng, extent, patch, policy)
    assert start == uniform_start(draw_rng(5, 1, position), extent, patch, policy)
    for s, e, p in zip(start, extent, patch):
        if e >= p:
            assert 0 <= s <= e - p
        else:  # the box covers the whole axis and overlaps it
            assert e - p <= s <= 0 and s + p >= e


def test_uniform_starts_cover_the_range_uniformly():
    starts = [uniform_start(draw_rng(0, 0, p), (13,), (4,), "inside")[0] for p in range(5000)]
    counts = np.bincount(starts, minlength=10)
    assert len(counts) == 10 and counts.min() > 400  # every start 0..9 drawn, about 500 times each
    pads = [uniform_start(draw_rng(0, 0, p), (3,), (6,), "pad")[0] for p in range(600)]
    assert set(pads) == {-3, -2, -1, 0}


def test_draw_words_depend_only_on_seed_epoch_position_and_word():
    words = draw_words(3, 2, np.arange(200), 4)
    assert words.shape == (200, 4) and words.dtype == np.uint64
    # a batch's words are each position's own, whatever the batch and its order
    for p in (0, 7, 199):
        assert draw_words(3, 2, [p], 4)[0].tolist() == words[p].tolist()
    assert draw_words(3, 2, [9, 1], 4).tolist() == words[[9, 1]].tolist()
    assert draw_words(3, 2, np.arange(200), 2).tolist() == words[:, :2].tolist()  # word j does not depend on n
    seen = {tuple(draw_words(s, e, [p], 4)[0].tolist()) for s in range(3) for e in range(3) for p in range(20)}
    assert len(seen) == 3 * 3 * 20
    big = draw_words(2**64 + 3, 2, [0], 1)  # (the seed is taken modulo 2**64)
    assert big.tolist() == draw_words(3, 2, [0], 1).tolist()
    assert draw_words(0, 0, [], 3).shape == (0, 3)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises((TypeError, ValueError)):
            draw_words(0, 0, [bad], 1)
        with pytest.raises((TypeError, ValueError)):
            draw_words(bad, 0, [0], 1)


def test_draw_words_bits_are_balanced():
    words = draw_words(0, 0, np.arange(20_000), 3)
    bits = np.unpackbits(words.view(np.uint8)).reshape(-1, 64 * 3 // 8 * 8)
    ones = bits.mean(axis=0)  # each of the 192 bits set half the time: 20,000 draws give sd 0.0035
    assert abs(ones - 0.5).max() < 0.02
    # neighbouring positions and words are not correlated
    u = (words >> np.uint64(11)).astype(np.float64) / 2.0**53
    assert abs(np.corrcoef(u[:-1, 0], u[1:, 0])[0, 1]) < 0.03
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.03


def test_batch_uniform_starts_cover_the_range_uniformly_and_match_the_policy():
    n = 6000
    starts = uniform_starts(0, 0, np.arange(n), np.zeros((n, 1), np.int64), np.full((n, 1), 9))[:, 0]
    counts = np.bincount(starts, minlength=10)
    assert len(counts) == 10
    expected = n / 10  # chi-square with 9 degrees of freedom: 27.9 is its 0.999 quantile
    assert ((counts - expected) ** 2 / expected).sum() < 27.9
    lo, hi = np.array([[-3, 0]] * 600), np.array([[0, 90]] * 600)
    got = uniform_starts(1, 4, range(600), lo, hi)
    assert set(got[:, 0].tolist()) == {-3, -2, -1, 0} and got[:, 1].min() >= 0 and got[:, 1].max() <= 90
    assert uniform_starts(0, 0, [5], [[4]], [[4]]).tolist() == [[4]]
    with pytest.raises(ValueError, match="must be at least its lo"):
        uniform_starts(0, 0, [5], [[4]], [[3]])
    with pytest.raises(ValueError, match="must both be"):
        uniform_starts(0, 0, [5, 6], [[0]], [[3]])


def test_start_range_and_its_errors():
    assert start_range(10, 10, "inside") == (0, 0)
    assert start_range(2, 5, "pad") == (-3, 0)
    with pytest.raises(ValueError, match="policy must be one of"):
        start_range(4, 2, "reflect")
    with pytest.raises(RoiError, match="holds no voxel"):
        start_range(0, 2, "pad")


@given(shapes, st.data())
def test_shift_inside_keeps_the_centre_in_the_box(extent_patch, data):
    extent, patch = extent_patch
    center = tuple(data.draw(st.integers(0, e - 1)) for e in extent)
    start = shift_inside(center, extent, patch)
    for c, s, e, p in zip(center, start, extent, patch):
        assert s <= c < s + p
        if e >= p:
            assert 0 <= s <= e - p
            # shifted the least: centred when it fits (MONAI's correct_crop_centers)
            if p // 2 <= c <= e - p + p // 2:
                assert s == c - p // 2
        else:
            assert e - p <= s <= 0


def test_shift_inside_refuses_a_centre_outside():
    with pytest.raises(ValueError, match="lies outside"):
        shift_inside((10,), (10,), (4,))


def test_patch_is_a_small_frozen_value():
    p = Patch(2, (-1, 0), (3, 5))
    assert p.shape == (4, 5) and pickle.loads(pickle.dumps(p)) == p and hash(p) == hash(Patch(2, (-1, 0), (3, 5)))
    with pytest.raises(ValueError, match="as many axes"):
        Patch(0, (0,), (1, 1))
    with pytest.raises(ValueError, match="at least one voxel"):
        Patch(0, (3,), (3,))
    ix = patch_index([p, Patch(5, (1, 1), (5, 6))])
    assert ix["file"].dtype == np.int64 and ix["start"].tolist() == [[-1, 0], [1, 1]]
    assert ix["stop"].tolist() == [[3, 5], [5, 6]]
    assert patch_index([])["start"].shape == (0, 0)
