"""Foreground on real files: numpy is the oracle, the index file is reused without reading labels again."""

from __future__ import annotations

import math
import os
import pickle

import numpy as np
import pytest

import npydask
from npydask.array import NpyFileArray
from npydask.errors import NpyDaskWarning, RoiError
from npydask.samplers import Foreground

SHAPE = (24, 30, 28)


def make(tmp_path, labels, image_dtype="f4"):
    """A zipped dataset of images and the given label arrays, one file each."""
    for name in ("img", "lab"):
        (tmp_path / name).mkdir(exist_ok=True)
    for i, label in enumerate(labels):
        np.save(tmp_path / "img" / f"{i:02d}.npy", np.zeros(label.shape[-3:], image_dtype))
        np.save(tmp_path / "lab" / f"{i:02d}.npy", label)
    return opened(tmp_path)


def opened(tmp_path):
    return npydask.zip_datasets(
        {"image": npydask.open_dataset(str(tmp_path / "img")), "label": npydask.open_dataset(str(tmp_path / "lab"))}
    )


def labels_with_blobs(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lab = np.zeros(SHAPE, np.uint8)
        z, y, x = (int(rng.integers(0, s - 4)) for s in SHAPE)
        lab[z : z + 3, y : y + 4, x : x + 2] = 1
        z, y, x = (int(rng.integers(0, s)) for s in SHAPE)
        lab[z, y, x] = 2
        out.append(lab)
    return out


@pytest.fixture
def reads(monkeypatch):
    """Counts the label and image boxes read through NpyFileArray.read."""
    calls = []
    original = NpyFileArray.read

    def counted(self, box, out=None):
        calls.append(os.path.basename(self.ref.path))
        return original(self, box, out)

    monkeypatch.setattr(NpyFileArray, "read", counted)
    return calls


def box_of(patch):
    return tuple(slice(a, b) for a, b in zip(patch.start, patch.stop))


def test_every_foreground_draw_holds_a_voxel_of_its_class_and_the_share_is_p(tmp_path):
    labels = labels_with_blobs(5)
    bound = Foreground((8, 8, 8), p=0.33, per_file=40).bind(make(tmp_path, labels))
    assert len(bound) == 200
    hits = 0
    for epoch in range(3):
        for i in range(len(bound)):
            file, d = bound.draw(epoch, i, seed=11, shuffle=True)
            patch = bound.patch(epoch, i, seed=11, shuffle=True)
            assert (patch.file, patch.start) == (file, d.start)
            assert all(0 <= a and b <= e for a, b, e in zip(patch.start, patch.stop, SHAPE))
            if d.class_index is not None:
                hits += 1
                value = (1, 2)[d.class_index]
                assert labels[file][d.center] == value
                assert np.any(labels[file][box_of(patch)] == value)
    n, p = 600, 0.33
    assert abs(hits - n * p) <= 3 * math.sqrt(n * p * (1 - p))


def test_ratios_choose_classes_in_proportion(tmp_path):
    bound = Foreground((6, 6, 6), p=1.0, classes=[1, 2], ratios=[3, 1], per_file=500).bind(
        make(tmp_path, labels_with_blobs(2, seed=1))
    )
    labels = [bound.draw(0, i, seed=0)[1].class_index for i in range(len(bound))]
    share = labels.count(0) / len(labels)
    assert abs(share - 0.75) <= 3 * math.sqrt(0.75 * 0.25 / len(labels))


def test_a_class_a_file_lacks_drops_out_and_a_file_without_foreground_draws_uniformly(tmp_path):
    one = np.zeros(SHAPE, np.uint8)
    one[3, 4, 5] = 2
    bound = Foreground((4, 4, 4), p=1.0, classes=[1, 2], ratios=[0.9, 0.1], per_file=50).bind(
        make(tmp_path, [one, np.zeros(SHAPE, np.uint8)])
    )
    draws = [bound.draw(0, i, seed=0) for i in range(len(bound))]
    assert {d.class_index for f, d in draws if f == 0} == {1}
    assert {d.class_index for f, d in draws if f == 1} == {None}


def test_labels_are_read_once_per_file_over_epochs(tmp_path, reads):
    bound = Foreground((8, 8, 8), per_file=3).bind(make(tmp_path, labels_with_blobs(4)))
    for epoch in range(3):
        bound.patches(epoch, range(len(bound)), seed=1, shuffle=True)
    assert sorted(reads) == ["00.npy", "01.npy", "02.npy", "03.npy"]  # one slab each (small labels)


def test_the_index_file_is_reused_without_reading_labels_again(tmp_path, reads):
    ds = make(tmp_path, labels_with_blobs(4))
    index = str(tmp_path / "fg.npz")
    first = Foreground((8, 8, 8), per_file=2, index=index).bind(ds)
    want = first.patches(0, range(len(first)), seed=5)
    assert len(reads) == 4 and os.path.exists(index)
    with np.load(index, allow_pickle=False) as archive:  # a plain .npz: no pickled member
        assert all(archive[k].dtype != object for k in archive.files)
    reads.clear()
    again = Foreground((8, 8, 8), per_file=2, index=index).bind(opened(tmp_path))
    assert again.patches(0, range(len(again)), seed=5) == want
    assert reads == []
    unpickled = pickle.loads(pickle.dumps(again))
    assert unpickled.patches(0, range(len(again)), seed=5) == want
    assert reads == []


def test_a_changed_label_file_is_scanned_again_and_its_entry_replaced(tmp_path, reads):
    labels = labels_with_blobs(3)
    make(tmp_path, labels)
    index = str(tmp_path / "fg.npz")
    Foreground((8, 8, 8), p=1.0, index=index).bind(opened(tmp_path)).patches(0, range(3))
    moved = np.zeros(SHAPE, np.uint8)
    moved[20:22, 25:27, 0:2] = 7
    np.save(tmp_path / "lab" / "01.npy", moved)
    os.utime(tmp_path / "lab" / "01.npy", ns=(1, 1))  # a new mtime even on a coarse clock
    reads.clear()
    bound = Foreground((8, 8, 8), p=1.0, index=index).bind(opened(tmp_path))
    file, d = bound.draw(0, 1)
    assert reads == ["01.npy"]
    assert file == 1 and moved[d.center] == 7
    reads.clear()
    Foreground((8, 8, 8), p=1.0, index=index).bind(opened(tmp_path)).patches(0, range(3))
    assert reads == []


def test_an_index_made_with_other_parameters_is_rebuilt(tmp_path, reads):
    make(tmp_path, labels_with_blobs(2))
    index = str(tmp_path / "fg.npz")
    Foreground((8, 8, 8), index=index).bind(opened(tmp_path)).patch(0, 0)
    reads.clear()
    bound = Foreground((8, 8, 8), classes=[2], index=index).bind(opened(tmp_path))
    bound.patch(0, 0)
    assert len(reads) == 2
    assert bound.candidates(0).classes == (2,)


def test_a_damaged_index_is_rebuilt_with_a_warning(tmp_path, reads):
    make(tmp_path, labels_with_blobs(2))
    index = tmp_path / "fg.npz"
    index.write_bytes(b"not a zip archive")
    bound = Foreground((8, 8, 8), index=str(index)).bind(opened(tmp_path))
    with pytest.warns(NpyDaskWarning, match="not a usable foreground index"):
        bound.patch(0, 0)
    assert len(reads) == 2
    reads.clear()
    Foreground((8, 8, 8), index=str(index)).bind(opened(tmp_path)).patch(0, 1)
    assert reads == []


def test_an_index_with_positions_outside_the_label_is_refused(tmp_path):
    make(tmp_path, labels_with_blobs(1))
    index = str(tmp_path / "fg.npz")
    Foreground((8, 8, 8), index=index).bind(opened(tmp_path)).patch(0, 0)
    with np.load(index, allow_pickle=False) as archive:
        members = {k: archive[k] for k in archive.files}
    members["f0_0"] = members["f0_0"] + 10**9
    np.savez(index, **members)
    with pytest.warns(NpyDaskWarning, match="outside the label"):
        Foreground((8, 8, 8), index=index).bind(opened(tmp_path)).patch(0, 0)


def test_channel_labels_and_images_with_leading_axes(tmp_path):
    lab = np.zeros((2, *SHAPE), np.int16)
    lab[1, 10, 11, 12] = 5
    bound = Foreground((4, 4, 4), p=1.0).bind(make(tmp_path, [lab], image_dtype="f4"))
    file, d = bound.draw(0, 0)
    assert d.center == (10, 11, 12)
    assert bound.candidates(0).classes == (5,)


def test_binding_needs_a_zipped_dataset_with_the_label_key(tmp_path):
    ds = make(tmp_path, labels_with_blobs(1))
    with pytest.raises(TypeError, match="zipped dataset"):
        Foreground((4, 4, 4)).bind(ds.members["image"])
    with pytest.raises(KeyError, match="'mask'"):
        Foreground((4, 4, 4), label_key="mask").bind(ds)
    with pytest.raises(RoiError, match="smaller than the patch"):
        Foreground((4, 40, 4)).bind(ds)


def test_complex_labels_are_refused(tmp_path):
    ds = make(tmp_path, [np.zeros(SHAPE, np.complex64)])
    with pytest.raises(TypeError, match="labels must be"):
        Foreground((4, 4, 4)).bind(ds)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"p": 1.5}, ValueError, "probability"),
        ({"p": True}, ValueError, "probability"),
        ({"ratios": [1, 2]}, ValueError, "needs classes"),
        ({"classes": [1, 2], "ratios": [1]}, ValueError, "one value per class"),
        ({"classes": [1, 1]}, ValueError, "distinct"),
        ({"classes": []}, TypeError, "non-empty"),
        ({"classes": ["a"]}, TypeError, "real numbers"),
        ({"candidates": 0}, ValueError, "candidates"),
        ({"label_key": 3}, TypeError, "label_key"),
        ({"index": 3}, TypeError, "index"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        Foreground((4, 4), **kwargs)


def test_samplers_are_values():
    a = Foreground((4, 4), classes=np.array([1, 2]), ratios=[1, 1])
    assert a == Foreground([4, 4], classes=[1, 2], ratios=(1.0, 1.0))
    assert a != Foreground((4, 4), classes=[1, 2])
    assert a.fingerprint() == pickle.loads(pickle.dumps(a)).fingerprint()
    assert "Foreground((4, 4), label_key='label'" in repr(a)


def test_an_index_in_the_labels_bucket_serves_objects(s3, reads):
    space = s3.space()
    labels = labels_with_blobs(2)
    for i, lab in enumerate(labels):
        s3.put_npy(f"{space}/img/{i}.npy", np.zeros(SHAPE, "f4"))
        s3.put_npy(f"{space}/lab/{i}.npy", lab)

    def remote():
        return npydask.zip_datasets(
            {
                k: npydask.open_dataset(f"s3://{space}/{d}", storage_options=s3.options)
                for k, d in (("image", "img"), ("label", "lab"))
            }
        )

    index = f"s3://{space}/fg.npz"
    first = Foreground((8, 8, 8), p=1.0, index=index).bind(remote())
    want = first.patches(0, range(2), seed=2)
    assert sorted(reads) == ["0.npy", "1.npy"]
    for p in want:
        assert labels[p.file][box_of(p)].any()
    reads.clear()
    again = Foreground((8, 8, 8), p=1.0, index=index).bind(remote())
    assert again.patches(0, range(2), seed=2) == want
    assert reads == []


def test_writers_of_one_index_keep_each_others_entries_and_never_leave_a_partial_file(tmp_path, reads):
    import threading
    import warnings

    index = str(tmp_path / "fg.npz")
    parts = []
    for k in range(4):
        (tmp_path / f"p{k}").mkdir()
        parts.append(make(tmp_path / f"p{k}", labels_with_blobs(2, seed=k)))
    Foreground((8, 8, 8), index=index).bind(parts[0]).patch(0, 0)
    Foreground((8, 8, 8), index=index).bind(parts[1]).patch(0, 0)
    reads.clear()
    Foreground((8, 8, 8), index=index).bind(parts[0]).patch(0, 0)  # part 1's write kept part 0's entries
    assert reads == []
    errors = []

    def build(ds):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                Foreground((8, 8, 8), index=index).bind(ds).patches(0, range(2))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=build, args=(ds,)) for ds in parts for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with np.load(index, allow_pickle=False) as archive:  # whole, whoever renamed last
        assert "meta" in archive.files


def test_threads_planning_together_read_each_label_once(tmp_path, reads):
    from concurrent.futures import ThreadPoolExecutor

    bound = Foreground((8, 8, 8), per_file=8).bind(make(tmp_path, labels_with_blobs(3)))
    with ThreadPoolExecutor(8) as pool:
        boxes = list(pool.map(lambda i: bound.patch(0, i, seed=4), range(len(bound))))
    assert boxes == bound.patches(0, range(len(bound)), seed=4)
    assert sorted(reads) == ["00.npy", "01.npy", "02.npy"]


def _npy_header(n):
    """The bytes of a .npy header claiming a 1-d int64 array of ``n`` elements."""
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<i8", "fortran_order": False, "shape": (n,)})
    return buffer.getvalue()


@pytest.mark.parametrize("tamper", ["stored-claims-2**33", "deflated-zeros"])
def test_a_tampered_index_member_costs_no_memory_and_is_rebuilt(tmp_path, reads, tamper):
    import tracemalloc
    import zipfile

    labels = labels_with_blobs(2)
    make(tmp_path, labels)
    index = tmp_path / "fg.npz"
    Foreground((8, 8, 8), p=1.0, index=str(index)).bind(opened(tmp_path)).patch(0, 0)
    with zipfile.ZipFile(index) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(index, "w") as archive:
        for name, data in members.items():
            if name != "f0_0.npy":
                archive.writestr(name, data)
            elif tamper == "deflated-zeros":  # (32 MiB of zeros in about 32 KiB)
                archive.writestr(name, _npy_header(1 << 22) + bytes(8 << 22), compress_type=zipfile.ZIP_DEFLATED)
            else:  # (a header claiming 64 GiB over a few bytes)
                archive.writestr(name, _npy_header(1 << 33) + data[-64:])
    assert index.stat().st_size < 1 << 20
    reads.clear()
    bound = Foreground((8, 8, 8), p=1.0, index=str(index)).bind(opened(tmp_path))
    tracemalloc.start()
    try:
        with pytest.warns(NpyDaskWarning, match="not a usable foreground index") as caught:
            patches = bound.patches(0, range(2))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # (far below what the member claims; the scans' slabs are small)
    assert len(caught) == 1  # (the index is parsed once, though read again before it is rewritten)
    assert sorted(reads) == ["00.npy", "01.npy"]  # (rebuilt: each label scanned once)
    for p in patches:
        box = tuple(slice(a, b) for a, b in zip(p.start, p.stop))
        assert labels[p.file][box].any()  # (centred on the label, as p=1 asks)
    reads.clear()
    Foreground((8, 8, 8), p=1.0, index=str(index)).bind(opened(tmp_path)).patch(0, 1)
    assert reads == []  # (the rebuilt index serves the next process)
