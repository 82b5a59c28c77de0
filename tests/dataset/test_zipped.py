"""zip_datasets: datasets paired by position, checked against numpy.load."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import npydask
from npydask.dataset.zipped import ZippedDataset


def folder(root, arrays):
    os.makedirs(root)
    for i, a in enumerate(arrays):
        np.save(os.path.join(root, f"{i:02d}.npy"), a)
    return npydask.open_dataset(str(root))


@pytest.fixture
def pair(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.random((2, 6, 7 + i), dtype="f4") for i in range(5)]
    labels = [(rng.random((6, 7 + i)) > 0.5).astype("u1") for i in range(5)]
    return images, labels, npydask.zip_datasets(
        {"image": folder(tmp_path / "i", images), "label": folder(tmp_path / "l", labels)})


def test_samples_are_dicts_of_each_members_file(pair):
    images, labels, z = pair
    assert isinstance(z, ZippedDataset) and len(z) == 5 and z.keys == ("image", "label")
    assert z.dtypes == {"image": np.dtype("f4"), "label": np.dtype("u1")}
    assert z.shapes["label"] == [(6, 7 + i) for i in range(5)]
    assert z.nbytes == sum(a.nbytes for a in images + labels)
    for i in (0, 3, -1):
        sample = z[i]
        np.testing.assert_array_equal(sample["image"].compute(), images[i])
        np.testing.assert_array_equal(sample["label"].compute(), labels[i])
    assert [s["label"].shape for s in z] == [(6, 7 + i) for i in range(5)]
    assert len(z.arrays()) == 5


def test_selections_and_shards_select_every_member_alike(pair):
    images, labels, z = pair
    for sub, picks in ((z[1:4], [1, 2, 3]), (z[[4, 0]], [4, 0]), (z[np.array([2])], [2]), (z.shard(1, 2), [2, 3, 4])):
        assert isinstance(sub, ZippedDataset) and len(sub) == len(picks)
        for j, i in enumerate(picks):
            np.testing.assert_array_equal(sub[j]["label"].compute(), labels[i])
            np.testing.assert_array_equal(sub["image"][j].compute(), images[i])


def test_members_by_key_pickling_and_repr(pair):
    _, labels, z = pair
    assert z["label"].files == z.members["label"].files and len(z["label"]) == 5
    with pytest.raises(KeyError, match=r"no member 'mask'.*\['image', 'label'\]"):
        z["mask"]
    again = pickle.loads(pickle.dumps(z))
    np.testing.assert_array_equal(again[4]["label"].compute(), labels[4])
    assert repr(z) == "ZippedDataset(5 samples, members {image: <f4 (2, 6, 7), label: |u1 (6, 7)})"
    with pytest.raises(AttributeError, match="immutable"):
        z.x = 1


def test_bad_input_is_refused_with_the_keys_and_lengths(pair, tmp_path):
    _, _, z = pair
    short = z["label"][:3]
    with pytest.raises(ValueError, match=r"same length; found 'image': 5, 'label': 3 files"):
        npydask.zip_datasets({"image": z["image"], "label": short})
    with pytest.raises(ValueError, match="at least one dataset"):
        npydask.zip_datasets({})
    with pytest.raises(TypeError, match="takes a dict of datasets"):
        npydask.zip_datasets([z["image"]])
    with pytest.raises(TypeError, match="keys must be str, found 0"):
        npydask.zip_datasets({0: z["image"]})
    with pytest.raises(TypeError, match="'x' must be an NpyDataset .*found ndarray"):
        npydask.zip_datasets({"x": np.zeros(3)})
    np.savez(tmp_path / "a.npz", x=np.zeros(2), y=np.ones(2))
    multi = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "y"])
    with pytest.raises(TypeError, match=r"spread its members into the dict"):
        npydask.zip_datasets({"m": multi})
    spread = npydask.zip_datasets({**multi.members, "z": multi.members["x"]})
    assert spread.keys == ("x", "y", "z") and float(spread[0]["y"].sum().compute()) == 2.0
