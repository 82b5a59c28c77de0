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
    return (
        images,
        labels,
        npydask.zip_datasets({"image": folder(tmp_path / "i", images), "label": folder(tmp_path / "l", labels)}),
    )


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
    assert repr(z) == (
        "ZippedDataset(5 samples, members {image: <f4 5 shapes, e.g. (2, 6, 7)..(2, 6, 11), "
        "label: |u1 5 shapes, e.g. (6, 7)..(6, 11)})"
    )
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


# -- pairing by name ---------------------------------------------------------------------------------------------


def cases(root, names, value_of, shape=(3, 4), dtype="f4"):
    """Save one file per name in ``root``, each filled with ``value_of(name)`` (its case number)."""
    os.makedirs(root)
    for name in names:
        np.save(os.path.join(root, f"{name}.npy"), np.full(shape, value_of(name), dtype))
    return str(root)


def case_number(name):
    return int("".join(c for c in name.split("_")[1]))


def opened(root, **kwargs):
    return npydask.open_dataset(root, sort=kwargs.pop("sort", "bytes"), **kwargs)


def assert_cases_agree(z):
    """Every sample's image and label hold the same case number (as numpy.load reads them)."""
    for i in range(len(z)):
        image = np.load(z["image"].files[i])
        label = np.load(z["label"].files[i])
        assert image.flat[0] == label.flat[0], (z["image"].files[i], z["label"].files[i])
        np.testing.assert_array_equal(z[i]["image"].compute(), image)
        np.testing.assert_array_equal(z[i]["label"].compute(), label)


@pytest.fixture
def ct(tmp_path):
    images = cases(tmp_path / "img", [f"ct_{i}" for i in range(1, 13)], case_number)
    labels = cases(tmp_path / "lab", [f"ct_{i}_seg" for i in range(1, 13)], case_number, dtype="u1")
    return images, labels


def test_folders_that_sort_apart_are_refused_naming_the_first_pair_and_the_fix(ct):
    images, labels = ct
    im, lab = opened(images), opened(labels)
    wrong = [i for i in range(12) if np.load(im.files[i]).flat[0] != np.load(lab.files[i]).flat[0]]
    assert len(wrong) == 4  # (what pairing by position alone would have done)
    with pytest.raises(ValueError, match="pairs files by position and their names differ") as e:
        npydask.zip_datasets({"image": im, "label": lab})
    text = str(e.value)
    assert "sample 0 pairs 'image' file" in text and "ct_1.npy' (name '1')" in text
    assert "ct_10_seg.npy' (name '10')" in text and "4 of 12 samples" in text
    assert "sort='natural'" in text and "pair_by='name'" in text and "key=" in text
    z = npydask.zip_datasets({"image": opened(images, sort="natural"), "label": opened(labels, sort="natural")})
    assert_cases_agree(z)
    unchecked = npydask.zip_datasets({"image": im, "label": lab}, pair_by="position")
    assert unchecked["label"].files == lab.files


def test_pair_by_name_joins_the_files_in_the_first_members_order_and_pickles(ct):
    images, labels = ct
    im, lab = opened(images), opened(labels)
    z = npydask.zip_datasets({"image": im, "label": lab}, pair_by="name")
    assert z["image"].files == im.files and z["label"].files != lab.files
    assert_cases_agree(z)
    again = pickle.loads(pickle.dumps(z))  # (a zipped dataset travels to workers)
    assert again["label"].files == z["label"].files
    assert_cases_agree(again)
    assert_cases_agree(z[3:7])


def test_nnunet_names_pair_and_a_missing_case_is_reported(tmp_path):
    images = cases(tmp_path / "imagesTr", [f"case_{i:03d}_0000" for i in (1, 2, 11, 3)], case_number)
    labels = cases(tmp_path / "labelsTr", [f"case_{i:03d}" for i in (1, 2, 11, 3)], case_number, dtype="u1")
    assert_cases_agree(npydask.zip_datasets({"image": opened(images), "label": opened(labels)}))
    os.remove(os.path.join(labels, "case_011.npy"))
    np.save(os.path.join(labels, "case_012.npy"), np.zeros((3, 4), "u1"))
    with pytest.raises(ValueError, match=r"sample 3 pairs .*case_011_0000.npy' \(name '011'\).*case_012.npy"):
        npydask.zip_datasets({"image": opened(images), "label": opened(labels)})
    with pytest.raises(ValueError, match=r"1 of 'image'.s names missing from 'label' \('011'\); 1 of 'label'.s"):
        npydask.zip_datasets({"image": opened(images), "label": opened(labels)}, pair_by="name")


def test_common_affixes_never_cut_a_case_number(tmp_path):
    images = cases(tmp_path / "i", [f"ct_{i}" for i in range(10, 20)], case_number)
    labels = cases(
        tmp_path / "l", [f"ct_{i}_seg" for i in (10, 11, 12, 13, 14, 15, 16, 17, 19, 18)], case_number, dtype="u1"
    )
    files = npydask.open_dataset(labels, files=[f"ct_{i}_seg.npy" for i in (10, 11, 12, 13, 14, 15, 16, 17, 19, 18)])
    with pytest.raises(ValueError, match=r"sample 8 pairs .*\(name '18'\).*\(name '19'\)"):
        npydask.zip_datasets({"image": opened(images), "label": files})
    assert_cases_agree(npydask.zip_datasets({"image": opened(images), "label": files}, pair_by="name"))


def test_a_key_says_which_name_each_file_pairs_on(tmp_path):
    images = cases(tmp_path / "i", ["ct_1", "ct_2", "ct_10"], case_number)
    labels = cases(tmp_path / "l", ["seg_ct_1", "seg_ct_2", "seg_ct_10"], lambda n: int(n.split("_")[2]), dtype="u1")
    unmarked = lambda name: name.removeprefix("seg_")  # noqa: E731
    im, lab = opened(images, sort="natural"), opened(labels, sort="natural")
    assert_cases_agree(npydask.zip_datasets({"image": im, "label": lab}, key=unmarked))
    z = npydask.zip_datasets({"image": im, "label": lab[::-1]}, pair_by="name", key=unmarked)
    assert_cases_agree(z)
    with pytest.raises(ValueError, match=r"names compared as key= gives them"):
        npydask.zip_datasets({"image": im, "label": lab[::-1]}, key=unmarked)
    with pytest.raises(TypeError, match=r"key\('ct_1'\) must return a str"):
        npydask.zip_datasets({"image": im, "label": lab}, key=len)
    with pytest.raises(ValueError, match=r"two files named 'ct'"):
        npydask.zip_datasets({"image": im, "label": lab}, pair_by="name", key=lambda n: n[-4:-2])


def test_single_files_and_bad_pair_by(tmp_path):
    one = opened(cases(tmp_path / "i", ["anything_7"], lambda n: 7))
    other = opened(cases(tmp_path / "l", ["else"], lambda n: 7, dtype="u1"))
    z = npydask.zip_datasets({"image": one, "label": other})  # (one file each: nothing to pair wrongly)
    assert_cases_agree(z)
    with pytest.raises(ValueError, match=r"pair_by must be one of \('checked', 'name', 'position'\).*'names'"):
        npydask.zip_datasets({"image": one, "label": other}, pair_by="names")
    with pytest.raises(TypeError, match="key must be a callable"):
        npydask.zip_datasets({"image": one, "label": other}, key="x")
    with pytest.raises(TypeError, match="Did you mean 'pair_by'"):
        npydask.zip_datasets({"image": one, "label": other}, pairby="name")


def test_repr_shows_a_members_varying_shapes(tmp_path):
    rng = np.random.default_rng(0)
    z = npydask.zip_datasets(
        {
            "image": folder(tmp_path / "i", [rng.random((4, n)) for n in (5, 6, 7)]),
            "label": folder(tmp_path / "l", [np.zeros((4, 5), "u1")] * 3),
        }
    )
    assert repr(z) == "ZippedDataset(3 samples, members {image: <f8 3 shapes, e.g. (4, 5)..(4, 7), label: |u1 (4, 5)})"


def test_the_natural_order_warning_says_paired_folders_would_pair_wrongly(ct):
    images, _ = ct
    with pytest.warns(npydask.NpyDaskWarning, match=r"sort='natural'.*zip_datasets.*'ct_10_seg.npy' before"):
        npydask.open_dataset(images)
