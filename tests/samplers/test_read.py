"""read_patches: a batch of patches equal to numpy slicing (padding by hand), each file read once, zipped datasets."""

from __future__ import annotations

import os

import numpy as np
import pytest
from _boxes import expected_box as expected
from _boxes import save_npz_members

import npydask
from npydask.plan.patches import Patch
from npydask.samplers import Grid, PatchBatch, ReadStats, Uniform, read_patches
from npydask.testing import drop_page_cache

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)


def save(root, arrays, name="f"):
    os.makedirs(root, exist_ok=True)
    for i, a in enumerate(arrays):
        np.save(os.path.join(root, f"{name}{i:02d}.npy"), a)
    return npydask.open_dataset(str(root))


@pytest.fixture
def arrays():
    rng = np.random.default_rng(3)
    return [
        rng.standard_normal((2, 20, 30, 24)).astype(">f4"),
        np.asfortranarray(rng.standard_normal((2, 25, 31, 17)).astype(">f4")),  # Fortran and big-endian
        rng.standard_normal((2, 18, 16, 16)).astype(">f4"),
    ]


@pytest.mark.parametrize("route", ["auto", "mapped", "spans"])
def test_patches_equal_numpy_with_padding(tmp_path, arrays, route):
    ds = save(tmp_path / "v", arrays)
    bound = Uniform((8, 9, 10), per_file=3, policy="pad", fill_value=-7).bind(ds)
    patches = bound.patches(1, range(9), seed=4, shuffle=True)
    patches += [Patch(2, (-3, 10, 12), (5, 19, 22)), Patch(1, (30, 40, 50), (38, 49, 60))]  # edge, all outside
    with npydask.config.set(patch_read=route):
        got = read_patches(ds, patches, bound)
    assert isinstance(got, PatchBatch)
    assert got.batch.shape == (11, 2, 8, 9, 10) and got.batch.dtype == np.dtype("float32")
    assert got.batch.flags.c_contiguous and got.batch.flags.writeable
    for slot, p in zip(got.batch, patches):
        np.testing.assert_array_equal(slot, expected(arrays[p.file], p, -7))
    assert got.index["file"].tolist() == [p.file for p in patches]
    assert got.index["start"].tolist() == [list(p.start) for p in patches]
    assert got.index["stop"].dtype == np.int64 and got.index["stop"].shape == (11, 3)
    assert got.stats.patch_bytes == got.batch.nbytes and got.stats.bytes_read > 0 and got.stats.io_wait_s > 0
    assert (got.stats.requests == 0) == (route != "spans")


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="asking the page cache needs Linux's RWF_NOWAIT")
def test_auto_maps_what_the_page_cache_holds_and_reads_spans_otherwise(tmp_path):
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((48, 96, 128)).astype("<f4") for _ in range(3)]  # 2.25 MiB each
    ds = save(tmp_path / "v", arrays)
    bound = Uniform((16, 20, 24), per_file=3).bind(ds)
    patches = bound.patches(0, range(9), seed=1)

    def read():
        got = read_patches(ds, patches, bound)
        for slot, p in zip(got.batch, patches):
            np.testing.assert_array_equal(slot, expected(arrays[p.file], p, 0))
        return got.stats

    assert read().requests == 0  # (just written: copied from the mappings)
    if not all(drop_page_cache(f) for f in ds.files):
        pytest.skip("this file system keeps a file's pages in memory (tmpfs): nothing is ever cold")
    cold = read()
    assert cold.requests > 0 and cold.bytes_read > cold.patch_bytes  # the spans, several per box
    assert read().requests == 0  # the spans brought the pages in
    assert all(drop_page_cache(f) for f in ds.files)
    with npydask.config.set(patch_read="mapped"):
        assert read().requests == 0  # (mapped, cold or not)


def test_each_file_is_read_once_per_batch(tmp_path, arrays, monkeypatch):
    from npydask.samplers import read as module

    ds = save(tmp_path / "v", arrays)
    bound = Uniform((8, 8, 8), per_file=4).bind(ds)
    seen = []
    real = module.read_boxes_many

    def spy(files, **kw):
        seen.extend(f.ref.path for f in files)
        return real(files, **kw)

    monkeypatch.setattr(module, "read_boxes_many", spy)
    got = read_patches(ds, bound.patches(0, range(12)), bound)
    assert sorted(seen) == sorted(ds.files)  # three files, four patches each, each file listed once
    assert got.batch.shape == (12, 2, 8, 8, 8)


def test_a_zipped_dataset_reads_the_same_box_of_each_member(tmp_path, arrays):
    images = save(tmp_path / "img", arrays)
    labels = [(a[0] > 0).astype("u1") for a in arrays]  # no channel axis
    z = npydask.zip_datasets({"image": images, "label": save(tmp_path / "lab", labels)})
    bound = Uniform((6, 6, 6), per_file=2, policy="pad", fill_value=0).bind(z)
    patches = bound.patches(0, range(6), seed=1) + [Patch(0, (-2, -2, -2), (4, 4, 4))]
    got = read_patches(z, patches, bound)
    assert set(got.batch) == {"image", "label"}
    assert got.batch["image"].shape == (7, 2, 6, 6, 6) and got.batch["label"].shape == (7, 6, 6, 6)
    assert got.batch["label"].dtype == np.uint8
    for i, p in enumerate(patches):
        np.testing.assert_array_equal(got.batch["image"][i], expected(arrays[p.file], p, 0))
        np.testing.assert_array_equal(got.batch["label"][i], expected(labels[p.file], p, 0))
    one = read_patches(images, patches, bound)
    assert got.stats.patch_bytes == one.stats.patch_bytes + got.batch["label"].nbytes


def test_files_of_other_leading_shapes_give_a_list(tmp_path):
    a = [np.arange(2 * 10 * 10, dtype="i2").reshape(2, 10, 10), np.arange(3 * 10 * 10, dtype="i2").reshape(3, 10, 10)]
    ds = save(tmp_path / "v", a)
    bound = Uniform((4, 4), per_file=1).bind(ds)
    patches = bound.patches(0, range(2))
    got = read_patches(ds, patches, bound)
    assert isinstance(got.batch, list) and [x.shape for x in got.batch] == [(2, 4, 4), (3, 4, 4)]
    for x, p in zip(got.batch, patches):
        np.testing.assert_array_equal(x, expected(a[p.file], p, 0))


def test_a_dataset_roi_is_the_patches_frame(tmp_path):
    a = np.arange(30 * 30, dtype="f8").reshape(30, 30)
    save(tmp_path / "v", [a])
    ds = npydask.open_dataset(str(tmp_path / "v"), roi_start=(5, 6), roi_shape=(10, 12))
    bound = Uniform((4, 4), policy="pad", fill_value=-1).bind(ds)
    patches = [Patch(0, (0, 0), (4, 4)), Patch(0, (8, 10), (12, 14)), Patch(0, (20, 20), (24, 24))]
    got = read_patches(ds, patches, bound)
    cut = a[5:15, 6:18]
    for slot, p in zip(got.batch, patches):
        np.testing.assert_array_equal(slot, expected(cut, p, -1))


def test_grid_tiles_of_a_small_file_are_padded(tmp_path):
    a = np.arange(5 * 7, dtype="u2").reshape(5, 7)
    ds = save(tmp_path / "v", [a, a + 1])
    bound = Grid((4, 4), fill_value=9).bind(ds)
    got = read_patches(ds, bound.patches(0, range(len(bound))), bound)
    for slot, p in zip(got.batch, bound.patches(0, range(len(bound)))):
        np.testing.assert_array_equal(slot, expected([a, a + 1][p.file], p, 9))


def test_refusals(tmp_path, arrays):
    ds = save(tmp_path / "v", arrays)
    bound = Uniform((4, 4, 4)).bind(ds)
    with pytest.raises(ValueError, match="at least one patch"):
        read_patches(ds, [], bound)
    with pytest.raises(ValueError, match="names file 3, but the dataset holds 3 files"):
        read_patches(ds, [Patch(3, (0, 0, 0), (4, 4, 4))], bound)
    with pytest.raises(ValueError, match="patch_read"):
        with npydask.config.set(patch_read="fast"):
            pass


def test_stats_add_up():
    total = sum([ReadStats(1, 2, 3, 0.5), ReadStats(4, 5, 6, 0.25)], ReadStats())
    assert total == ReadStats(5, 7, 9, 0.75)


def test_gpu_batches_are_copied_once_from_the_host(tmp_path, arrays, monkeypatch):
    from _gpu_fakes import cupy_like

    from npydask.gpu import device as gpu

    xp = cupy_like()
    copies = []
    real = xp.asarray
    monkeypatch.setattr(xp, "asarray", lambda a: copies.append(a.shape) or real(a))
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "array_module", lambda: xp)
    ds = save(tmp_path / "v", arrays)
    bound = Uniform((8, 8, 8), per_file=2).bind(ds)
    patches = bound.patches(0, range(6))
    got = read_patches(npydask.zip_datasets({"a": ds, "b": ds}), patches, bound, device="gpu")
    assert copies == [(6, 2, 8, 8, 8)] * 2
    for i, p in enumerate(patches):
        np.testing.assert_array_equal(got.batch["b"][i], expected(arrays[p.file], p, 0))


def test_patches_of_objects(s3, arrays):
    space = s3.space()
    for i, a in enumerate(arrays):
        s3.put_npy(f"{space}/f{i:02d}.npy", a)
    ds = npydask.open_dataset(f"s3://{space}", storage_options=s3.options)
    bound = Uniform((8, 9, 10), per_file=2, policy="pad", fill_value=3).bind(ds)
    patches = bound.patches(0, range(6), seed=2) + [Patch(0, (15, -4, 20), (23, 5, 30))]
    got = read_patches(ds, patches, bound)
    for slot, p in zip(got.batch, patches):
        np.testing.assert_array_equal(slot, expected(arrays[p.file], p, 3))
    assert got.stats.requests >= 3 and got.stats.bytes_read >= got.stats.patch_bytes // 2


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_members_of_a_multi_key_dataset(tmp_path, compressed):
    members = save_npz_members(tmp_path, compressed)
    ds = npydask.open_dataset(str(tmp_path), file_filter="*.npz", key=["x", "m"])
    bound = Uniform((3, 4), per_file=2, policy="pad", fill_value=5).bind(ds)
    patches = bound.patches(0, range(6), seed=3) + [Patch(1, (7, -1), (10, 3))]
    got = read_patches(ds, patches, bound)
    assert got.batch["x"].shape == (7, 2, 3, 4) and got.batch["m"].shape == (7, 3, 4)
    for i, p in enumerate(patches):
        for key in ("x", "m"):
            np.testing.assert_array_equal(got.batch[key][i], expected(members[p.file][key], p, 5))


PADDED = [
    np.dtype([("a", "u1"), ("b", "<f8")], align=True),
    np.dtype({"names": ["x", "y"], "formats": [">i2", ">f4"], "offsets": [4, 12], "itemsize": 20}),
]


@pytest.mark.parametrize("dtype", PADDED, ids=["aligned", "offsets-big-endian"])
@pytest.mark.parametrize("route", ["mapped", "spans"])
def test_every_sampler_reads_padded_structured_dtypes_as_numpy_stacks_them(tmp_path, dtype, route):
    from npydask.samplers import Foreground

    rng = np.random.default_rng(8)
    images = []
    for shape in ((12, 10), (9, 11)):
        a = np.zeros(shape, dtype)
        for name in dtype.names:
            a[name] = rng.integers(0, 100, shape)
        images.append(a)
    ds = save(tmp_path / "v", images)
    labels = save(tmp_path / "l", [(rng.random(a.shape) > 0.7).astype("u1") for a in images], name="f")
    images = [np.load(f) for f in ds.files]  # (the oracle: numpy reading the files)
    np.testing.assert_array_equal(ds.array(1).compute(), images[1])
    zipped = npydask.zip_datasets({"image": ds, "label": labels})
    samplers = [(ds, Uniform((4, 5), per_file=2)), (ds, Grid((6, 6))), (zipped, Foreground((4, 5), p=1.0, per_file=2))]
    for dataset, sampler in samplers:
        bound = sampler.bind(dataset)
        patches = bound.patches(0, range(len(bound)), seed=1)
        with npydask.config.set(patch_read=route):
            got = read_patches(dataset, patches, bound).batch
        batch = got["image"] if isinstance(got, dict) else got
        want = np.stack([images[p.file][tuple(slice(a, b) for a, b in zip(p.start, p.stop))] for p in patches])
        assert batch.dtype == want.dtype and batch.shape == want.shape, sampler
        np.testing.assert_array_equal(batch, want)
