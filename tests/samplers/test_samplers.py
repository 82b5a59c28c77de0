"""Uniform and Grid samplers over real datasets: binding from headers, deterministic boxes, clear errors."""

from __future__ import annotations

import os
import pickle
import warnings

import numpy as np
import pytest

import npydask
from npydask.errors import RoiError
from npydask.plan.patches import Patch, grid_starts, grid_step
from npydask.samplers import BoundSampler, Grid, Sampler, Uniform


def write(root, shapes, dtype="f4", name="f"):
    os.makedirs(root, exist_ok=True)
    for i, shape in enumerate(shapes):
        np.save(os.path.join(root, f"{name}{i:02d}.npy"), np.zeros(shape, dtype))
    return npydask.open_dataset(str(root))


@pytest.fixture
def volumes(tmp_path):
    return write(tmp_path / "v", [(2, 20, 30, 40), (2, 25, 31, 17), (2, 40, 40, 40), (2, 16, 16, 16)])


def test_uniform_plans_per_file_units_inside_each_file(volumes):
    bound = Uniform((16, 16, 16), per_file=3).bind(volumes)
    assert isinstance(bound, BoundSampler) and len(bound) == 12 and bound.n_files == 4
    assert bound.policy == "inside" and bound.fill_value == 0 and not bound.shuffle_ignored
    shapes = [s[1:] for s in volumes.shapes]
    for shuffle in (False, True):
        patches = bound.patches(2, range(12), seed=9, shuffle=shuffle)
        files = [p.file for p in patches]
        assert sorted(files) == [f for f in range(4) for _ in range(3)]
        assert all(files[3 * u] == files[3 * u + 1] == files[3 * u + 2] for u in range(4))  # units adjacent
        if not shuffle:
            assert files == [f for f in range(4) for _ in range(3)]
        for p in patches:
            assert p.shape == (16, 16, 16)
            assert all(0 <= a and b <= e for a, b, e in zip(p.start, p.stop, shapes[p.file]))
        # the same boxes one at a time, in any order, and from a pickled copy
        again = pickle.loads(pickle.dumps(bound))
        assert [again.patch(2, q, seed=9, shuffle=shuffle) for q in reversed(range(12))] == patches[::-1]


def test_uniform_draws_change_with_epoch_and_seed_and_default_to_seed_zero(volumes):
    bound = Uniform((8, 8, 8), per_file=4).bind(volumes)
    a = bound.patches(0, range(16), seed=1)
    assert a != bound.patches(1, range(16), seed=1)
    assert a != bound.patches(0, range(16), seed=2)
    assert bound.patches(0, range(16)) == bound.patches(0, range(16), seed=0)
    assert len({p.start for p in a}) > 10  # boxes differ within a file too
    # a file exactly the patch's size has one box inside, at 0
    exact = Uniform((16, 16, 16), per_file=5).bind(volumes)
    assert {p.start for p in exact.patches(0, range(20), seed=4) if p.file == 3} == {(0, 0, 0)}


def test_uniform_pad_hangs_over_axes_shorter_than_the_patch(tmp_path):
    ds = write(tmp_path, [(5, 40), (50, 3)])
    with pytest.raises(RoiError, match=r"file 0 \(.*f00.npy\) has shape \(5, 40\), smaller than the patch \(8, 8\)"):
        Uniform((8, 8)).bind(ds)
    bound = Uniform((8, 8), per_file=50, policy="pad", fill_value=-1.5).bind(ds)
    assert bound.fill_value == -1.5 and bound.policy == "pad"
    for p in bound.patches(0, range(100), seed=3):
        extent = ds.shapes[p.file]
        for a, b, e in zip(p.start, p.stop, extent):
            if e < 8:
                assert a <= 0 and b >= e  # the whole short axis, padded around
            else:
                assert 0 <= a and b <= e


def test_grid_tiles_every_file_in_order_ignoring_seed_and_shuffle(volumes):
    grid = Grid((16, 16, 16), overlap=0.5)
    bound = grid.bind(volumes)
    assert bound.shuffle_ignored and bound.policy == "pad" and grid.per_file is None
    shapes = [s[1:] for s in volumes.shapes]
    expected = [
        Patch(f, s, tuple(a + 16 for a in s))
        for f, shape in enumerate(shapes)
        for s in grid_starts(shape, (16,) * 3, grid_step((16,) * 3, 0.5))
    ]
    assert len(bound) == len(expected)
    assert bound.patches(0, range(len(bound))) == expected
    assert bound.patches(5, range(len(bound)), seed=3, shuffle=True) == expected
    assert sum((bound.tiles(f) for f in range(4)), []) == expected
    assert [bound.first_position(f) for f in range(4)] == [0, *np.cumsum([bound.tile_count(f) for f in range(3)])]
    assert pickle.loads(pickle.dumps(bound)).patches(0, range(len(bound))) == expected
    with pytest.raises(IndexError, match="file 4 is out of range"):
        bound.tiles(4)


def test_grid_pads_only_a_file_smaller_than_the_patch(tmp_path):
    bound = Grid((8, 8), overlap_voxels=2, fill_value=7).bind(write(tmp_path, [(5, 20)]))
    assert [(t.start, t.stop) for t in bound.tiles(0)] == [((-1, 0), (7, 8)), ((-1, 6), (7, 14)), ((-1, 12), (7, 20))]
    assert Grid((8, 8), overlap_voxels=2).step == (6, 6)


def test_positions_past_the_epoch_and_bad_values_fail_clearly(volumes):
    bound = Uniform((4, 4, 4)).bind(volumes)
    with pytest.raises(ValueError, match="position 4 is past the epoch's end"):
        bound.patch(0, 4)
    with pytest.raises(ValueError, match="epoch must be at least 0"):
        bound.patch(-1, 0)
    with pytest.raises(TypeError, match="seed must be an integer"):
        bound.patch(0, 0, seed=1.5)
    with pytest.raises(ValueError, match="position 1000000 is past"):
        Grid((4, 4, 4)).bind(volumes).patch(0, 10**6)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Uniform(16), TypeError, "patch_shape must be a tuple of ints"),
        (lambda: Uniform(()), ValueError, "at least one axis"),
        (lambda: Uniform((4, 0)), ValueError, r"positive along every axis, found \(4, 0\)"),
        (lambda: Uniform((4, 2.0)), TypeError, "patch_shape must hold ints, found 2.0"),
        (lambda: Uniform((4,), per_file=0), ValueError, "per_file must be at least 1, found 0"),
        (lambda: Uniform((4,), per_file="2"), TypeError, "per_file must be an integer"),
        (lambda: Uniform((4,), policy="reflect"), ValueError, "policy must be one of .*'reflect'"),
        (lambda: Uniform((4,), fill_value="x"), TypeError, "fill_value must be a number, found 'x'"),
        (lambda: Grid((4,), overlap=1), ValueError, r"overlap must be in \[0, 1\)"),
        (lambda: Grid((4,), overlap_voxels=4), ValueError, "overlap_voxels must be below the patch"),
        (lambda: Grid((4, 4), overlap=(0.1,)), ValueError, "one entry per patch axis"),
    ],
)
def test_bad_arguments_name_themselves(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bind_checks_axes_and_dataset_type(tmp_path, volumes):
    with pytest.raises(RoiError, match=r"file 0 \(.*\) has shape \(2, 20, 30, 40\): too few axes for a patch"):
        Uniform((2, 2, 2, 2, 2)).bind(volumes)
    with pytest.raises(TypeError, match="a sampler binds to an NpyDataset"):
        Uniform((2,)).bind([np.zeros(3)])
    with pytest.raises(ValueError, match="at least one file"):
        Uniform((2,)).bind(volumes[[]])
    empty = write(tmp_path / "e", [(0, 4)])
    with pytest.raises(RoiError, match="an empty patch axis"):
        Uniform((1, 1), policy="pad").bind(empty)


def test_samplers_are_values():
    a, b = Uniform([8, 8], per_file=2), Uniform((8, 8), per_file=2)
    assert a == b and hash(a) == hash(b) and a.fingerprint() == b.fingerprint()
    assert a != Uniform((8, 8)) and a != Grid((8, 8)) and isinstance(a, Sampler)
    assert repr(a) == "Uniform((8, 8), per_file=2, policy='inside', fill_value=0)"
    shown = "Grid((4, 4), overlap=(0.5, 0.25), overlap_voxels=None, fill_value=0)"
    assert repr(Grid((4, 4), overlap=(0.5, 0.25))) == shown
    assert pickle.loads(pickle.dumps(a)) == a and pickle.loads(pickle.dumps(Grid((4,)))) == Grid((4,))
    assert Grid((4,)).fingerprint() != Grid((4,), overlap=0.5).fingerprint()
    assert Uniform((8,), fill_value=np.float32(2)).fill_value == 2.0
    nan = Uniform((8,), policy="pad", fill_value=float("nan"))
    again = pickle.loads(pickle.dumps(nan))
    assert nan == again and hash(nan) == hash(again) and nan.fingerprint() == again.fingerprint()
    assert Uniform((8,), fill_value=0) != Uniform((8,), fill_value=0.0)  # as their fingerprints differ
    with pytest.raises(AttributeError, match="immutable"):
        a.per_file = 3  # type: ignore[misc]
    assert len(a.fingerprint()) == 32


def test_zipped_and_multikey_members_share_one_box(tmp_path):
    images = write(tmp_path / "i", [(2, 20, 30), (2, 12, 12)])
    labels = write(tmp_path / "l", [(20, 30), (12, 12)], dtype="u1")
    z = npydask.zip_datasets({"image": images, "label": labels})
    bound = Uniform((10, 10), per_file=2).bind(z)
    assert len(bound) == 4 and bound.extents == ((20, 30), (12, 12))
    wrong = write(tmp_path / "w", [(20, 30), (13, 12)], dtype="u1")
    with pytest.raises(RoiError, match=r"file 1 of 'label' \(.*f01.npy\) has shape \(13, 12\) but file 1 of 'image'"):
        Uniform((10, 10)).bind(npydask.zip_datasets({"image": images, "label": wrong}))
    # one trailing axis agrees even where the other does not: a 1-D patch binds
    with pytest.warns(npydask.NpyDaskWarning, match=r"leading axes \(2, 20\) are kept whole"):  # (20 looks spatial)
        assert Uniform((5,)).bind(npydask.zip_datasets({"image": images, "label": wrong})).extents == ((30,), (12,))
    for i in range(2):
        np.savez(tmp_path / f"m{i}.npz", x=np.zeros((3, 9, 9), "f4"), y=np.zeros((9, 9), "u1"))
    multi = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "y"])
    assert Grid((9, 9)).bind(multi).patches(0, range(2)) == [Patch(0, (0, 0), (9, 9)), Patch(1, (0, 0), (9, 9))]


def test_binding_and_planning_read_no_file(tmp_path):
    """Headers only: with the files gone after open_dataset, binding and planning still work."""
    ds = write(tmp_path / "gone", [(3, 12, 12), (3, 20, 9)])
    for path in ds.files:
        os.remove(path)
    bound = Uniform((8, 8), per_file=2).bind(ds)
    assert len(bound.patches(0, range(4), shuffle=True)) == 4
    assert len(Grid((8, 8)).bind(npydask.zip_datasets({"a": ds, "b": ds}))) == 2 * 2 + 3 * 2


def test_a_misspelled_keyword_gets_a_close_match(volumes):
    from npydask.samplers import Foreground, Stitcher

    unexpected = "() got an unexpected keyword argument "
    cases = [
        (lambda: Uniform((4, 4), per_fle=2), "Uniform" + unexpected + "'per_fle'. Did you mean 'per_file'?"),
        (lambda: Grid((4, 4), overlapp=0.5), "Grid" + unexpected + "'overlapp'. Did you mean 'overlap'?"),
        (lambda: Foreground((4, 4), label_keys="seg"), "Did you mean 'label_key'?"),
        (lambda: Foreground((4, 4), candidate=5), "Did you mean 'candidates'?"),
        (lambda: Stitcher(Grid((4, 4)), volumes, weight="mean"), "Stitcher" + unexpected + "'weight'. Did you mean"),
        (lambda: npydask.Loader(volumes, 2, sampeler=Uniform((4, 4))), "Did you mean 'sampler'?"),
    ]
    for make, message in cases:
        with pytest.raises(TypeError) as e:
            make()
        assert message in str(e.value)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'colour'$"):
        Uniform((4, 4), colour=1)


def test_a_patch_leaving_a_spatial_looking_leading_axis_whole_warns(tmp_path):
    volumes = write(tmp_path / "v", [(128, 128, 128), (100, 96, 96)], dtype="u1")
    with pytest.warns(npydask.NpyDaskWarning) as caught:
        bound = Uniform((64, 64)).bind(volumes)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "f00.npy" in text and "each patch is (128, 64, 64)" in text
    assert "patch_shape=(64, 64, 64)" in text and "(1, 64, 64)" in text
    assert bound.patch(0, 0).shape == (64, 64)  # (the warning changes nothing: the leading axis is read whole)
    channels = write(tmp_path / "c", [(4, 128, 128, 128), (16, 40, 40, 40)])
    img = write(tmp_path / "i", [(2, 40, 40)] * 2)
    small = write(tmp_path / "s", [(20, 200, 200)] * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Uniform((32, 32, 32)).bind(channels)  # (channels: 16 at most)
        Uniform((32, 32)).bind(img)
        Uniform((32, 32)).bind(small)  # (20 long, but shorter than the patch's 32: a stack of a few planes)
        Uniform((64, 64, 64)).bind(volumes)
    with pytest.warns(npydask.NpyDaskWarning, match=r"'image'.*each patch is \(128, 64, 64\)"):
        Grid((64, 64)).bind(npydask.zip_datasets({"image": volumes, "label": volumes}))
