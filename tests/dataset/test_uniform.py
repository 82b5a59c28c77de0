"""open_dataset(..., headers="first") (npydask.dataset.uniform): one header read at open.

Each file's header is checked where a task reads it.

numpy is the oracle on real files; every mode a dataset offers (stack,
concatenate, ``ds[i]``, ROIs of each policy, shards, the Loader, the PyTorch
adapters) is compared with ``numpy.load``, and every way a file can differ
from the first one (shape, dtype, header length, replaced, truncated) must
fail the task naming the file instead of returning other data.
"""

from __future__ import annotations

import os
import threading
import time

import dask
import numpy as np
import pytest

import npydask
from npydask.errors import FileChangedError, NpyFormatError
from npydask.storage import FileIdentity, InodeIdentity, clear_cache

N = 24


def _write(root, arrays, names=None):
    names = names or [f"{i:03d}.npy" for i in range(len(arrays))]
    for name, a in zip(names, arrays):
        np.save(os.path.join(root, name), a)
    return [os.path.join(root, n) for n in names]


def _arrays(shape, dtype, n=N, fortran=False, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a = (rng.standard_normal(shape) * 100).astype(dtype)
        out.append(np.asfortranarray(a) if fortran else a)
    return out


def _replace(path, array, **kw):
    """Atomically replace ``path`` (a new inode), as writers should."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.lib.format.write_array(f, array, **kw)
    os.replace(tmp, path)


@pytest.fixture(autouse=True)
def _fresh_handles():
    clear_cache()  # (a cached descriptor of a replaced file must not hide what a test sets up)
    yield
    clear_cache()


# -- values equal numpy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "dtype", "fortran"),
    [
        ((32, 32), "<f4", False),
        ((7, 5), ">i2", False),
        ((6, 9), "<f8", True),
        ((3,), "u1", False),
        ((4, 4), "<c8", False),
        ((300, 257), "<f4", False),
    ],  # (the last: files with chunks of their own)
)
def test_stack_concatenate_items_equal_numpy(tmp_path, shape, dtype, fortran):
    arrays = _arrays(shape, dtype, fortran=fortran)
    _write(tmp_path, arrays)
    ds = npydask.open_dataset(tmp_path, headers="first")
    assert len(ds) == N and ds.shapes == [shape] * N and ds.dtype == np.dtype(dtype)
    assert all(type(v.ref.identity) is InodeIdentity for v in ds.views)
    assert len({id(v.ref.header) for v in ds.views}) == 1 and len({id(v.ref.check) for v in ds.views}) == 1
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays))
    np.testing.assert_array_equal(ds.concatenate(axis=0).compute(), np.concatenate(arrays))
    for i in (0, 5, N - 1):
        np.testing.assert_array_equal(ds[i].compute(), arrays[i])
    np.testing.assert_array_equal(ds.stack(chunks=(5, *shape)).compute(), np.stack(arrays))
    part = ds.shard(1, 3)
    np.testing.assert_array_equal(part.stack().compute(), np.stack(arrays[8:16]))
    np.testing.assert_array_equal(ds[[3, 1]].stack().compute(), np.stack([arrays[3], arrays[1]]))


@pytest.mark.parametrize("backend", ["auto", "mmap", "pread"])
def test_every_backend(tmp_path, backend):
    arrays = _arrays((40, 33), "<f4", n=6)
    _write(tmp_path, arrays)
    ds = npydask.open_dataset(tmp_path, headers="first", backend=backend)
    np.testing.assert_array_equal(ds.stack(chunks=(1, 20, 33)).compute(), np.stack(arrays))
    np.testing.assert_array_equal(ds[2].compute(), arrays[2])


@pytest.mark.parametrize(
    ("kw", "cut"),
    [
        (dict(roi_start=[2, 3], roi_shape=[10, 7]), lambda a: a[2:12, 3:10]),
        (dict(roi_start=[5, 0], roi_end=[15, 30], out_of_bounds_policy="trim_to_shape"), lambda a: a[5:15, 0:20]),
        (dict(rel_roi_start=[0.5], roi_axes=[1]), lambda a: a[:, 10:]),
    ],
)
@pytest.mark.parametrize("fortran", [False, True])
def test_rois_equal_numpy(tmp_path, kw, cut, fortran):
    arrays = _arrays((16, 20), "<f4", fortran=fortran)
    _write(tmp_path, arrays)
    ds = npydask.open_dataset(tmp_path, headers="first", **kw)
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([cut(a) for a in arrays]))
    np.testing.assert_array_equal(ds[7].compute(), cut(arrays[7]))


def test_pad_roi_and_per_file_rois(tmp_path):
    arrays = _arrays((10, 12), "<i4")
    _write(tmp_path, arrays)
    ds = npydask.open_dataset(
        tmp_path, headers="first", roi_start=[-2, 4], roi_end=[12, 14], out_of_bounds_policy="pad", fill_value=7
    )
    padded = [np.pad(a, ((2, 2), (0, 2)), constant_values=7)[:, 4:14] for a in arrays]
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(padded))
    starts = [[i % 5, i % 3] for i in range(N)]  # one row per file: each resolved on the first file's shape
    ds = npydask.open_dataset(tmp_path, headers="first", roi_start=starts, roi_shape=[4, 6], shard_id=1, num_shards=2)
    expected = [arrays[i][s[0] : s[0] + 4, s[1] : s[1] + 6] for i, s in enumerate(starts)][N // 2 :]
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(expected))


def test_files_and_file_list_take_whole_identities(tmp_path):
    arrays = _arrays((8, 8), "<f4")
    paths = _write(tmp_path, arrays)
    order = list(range(N))[::-1]
    ds = npydask.open_dataset(files=[paths[i] for i in order], headers="first")
    assert all(type(v.ref.identity) is FileIdentity for v in ds.views)  # (one stat each: size, mtime, inode)
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([arrays[i] for i in order]))
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(os.path.basename(p) for p in paths[:5]))
    ds = npydask.open_dataset(file_list=listing, headers="first")
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays[:5]))
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        npydask.open_dataset(files=[paths[0], str(tmp_path / "missing.npy")], headers="first")
    os.mkfifo(tmp_path / "pipe.npy")  # refused by its stat, never opened (so never blocking)
    with pytest.raises(OSError, match="FIFO.*pipe.npy"):
        npydask.open_dataset(files=[paths[0], str(tmp_path / "pipe.npy")], headers="first")


def test_recursive_and_symlinked_files(tmp_path):
    arrays = _arrays((5, 5), "<f4", n=4)
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    _write(tmp_path, arrays[:2], ["a.npy", "sub/deep/b.npy"])
    _write(tmp_path / "sub", arrays[2:3], ["c.npy"])
    with open(tmp_path / "target.bin", "wb") as f:
        np.save(f, arrays[3])
    os.symlink(tmp_path / "target.bin", tmp_path / "z.npy")  # (a symlink: its target's inode is the identity)
    ds = npydask.open_dataset(tmp_path, headers="first", recursive=True)
    assert [os.path.relpath(f, tmp_path) for f in ds.files] == ["a.npy", "sub/c.npy", "sub/deep/b.npy", "z.npy"]
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([arrays[0], arrays[2], arrays[1], arrays[3]]))


def test_loader_and_torch_adapters(tmp_path):
    arrays = _arrays((6, 5), "<f4", n=11)
    _write(tmp_path, arrays)
    ds = npydask.open_dataset(tmp_path, headers="first")
    seen = []
    for batch, idx in npydask.Loader(ds, batch_size=4, shuffle=True, seed=3, with_index=True):
        np.testing.assert_array_equal(batch, np.stack([arrays[i] for i in idx]))
        seen += list(idx)
    assert sorted(seen) == list(range(11))
    torch = pytest.importorskip("torch")
    from npydask.torch import NpyIterableDataset, NpyMapDataset

    mapped = NpyMapDataset(ds)
    for i in (0, 10, 4):
        np.testing.assert_array_equal(torch.as_tensor(mapped[i]).numpy(), arrays[i])
    got = {}
    for i, sample in enumerate(NpyIterableDataset(ds)):
        got[i] = torch.as_tensor(sample).numpy()
    assert len(got) == 11
    for i, a in got.items():
        np.testing.assert_array_equal(a, arrays[i])


def test_names_are_deterministic_and_follow_the_inodes(tmp_path):
    arrays = _arrays((8, 8), "<f4")
    paths = _write(tmp_path, arrays)
    a = npydask.open_dataset(tmp_path, headers="first")
    b = npydask.open_dataset(tmp_path, headers="first")
    assert a.stack().name == b.stack().name and a[3].name == b[3].name
    assert a.stack().name != npydask.open_dataset(tmp_path).stack().name  # (another identity: another graph)
    _replace(paths[3], arrays[3])  # same bytes, new inode
    c = npydask.open_dataset(tmp_path, headers="first")
    assert c[3].name != a[3].name and c[4].name == a[4].name and c.stack().name != a.stack().name
    with pytest.raises(FileChangedError, match="003.npy"):
        a.stack().compute()
    np.testing.assert_array_equal(c.stack().compute(), np.stack(arrays))


# -- refusals ----------------------------------------------------------------------------------


def test_bad_headers_argument_and_refused_combinations(tmp_path):
    _write(tmp_path, _arrays((3,), "<f4", n=2))
    for bad in ("some", "FIRST", None, 1):
        with pytest.raises(ValueError, match="'all'.*'first'"):
            npydask.open_dataset(tmp_path, headers=bad)
    with pytest.raises(ValueError, match="index"):
        npydask.open_dataset(tmp_path, headers="first", index=tmp_path / "index.json")
    assert not (tmp_path / "index.json").exists()
    with pytest.raises(ValueError, match="npz"):
        npydask.open_dataset(tmp_path, headers="first", key="x")
    with pytest.raises(ValueError, match="npz"):
        npydask.open_dataset(tmp_path, headers="first", key=["x", "y"])


@pytest.mark.parametrize("n", [3, 300])
def test_opening_a_folder_opens_and_stats_one_file(tmp_path, monkeypatch, count_os_calls, n):
    arrays = _arrays((4, 4), "<f4", n=n)
    _write(tmp_path, arrays)
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub", arrays[:2], ["x.npy", "y.npy"])
    counts = count_os_calls(["open", "stat", "lstat", "fstat", "pread"])
    ds = npydask.open_dataset(tmp_path, headers="first")
    monkeypatch.undo()
    assert len(ds) == n + 2
    assert counts["open"] == 1 and counts["fstat"] == 1, counts  # the first file's header
    assert counts["pread"] <= 2, counts  # (a second one where the header memo has not seen its bytes yet)
    assert counts["stat"] + counts["lstat"] <= 2, counts  # the root folder only, whatever n
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays + arrays[:2]))


# -- files that differ from the first ----------------------------------------------------------


def _bad(kind, like):
    if kind == "shape":
        return np.zeros((like.shape[0], like.shape[1] + 1), like.dtype), {}
    if kind == "dtype":  # the same size, the same header length: only the header's bytes tell
        return np.zeros(like.shape, "<i4"), {}
    if kind == "order":
        return np.asfortranarray(like + 1), {}
    return like + 1, {"version": (2, 0)}  # "header length": a longer preamble, the payload elsewhere


SITES = ["stack", "item", "roi", "roi item", "loader", "large chunks"]


def _read(ds, site):
    if site == "stack":
        return ds.stack().compute()
    if site in ("item", "roi item"):
        return [ds[i].compute() for i in range(len(ds))]
    if site == "roi":
        return ds.stack().compute()
    if site == "loader":
        return [b for b in npydask.Loader(ds, batch_size=5)]
    return ds.stack(chunks=(1, 8, 16)).compute()  # (chunks far from byte 0: the handle cache's header check)


@pytest.mark.parametrize("kind", ["shape", "dtype", "order", "header length"])
@pytest.mark.parametrize("site", SITES)
@pytest.mark.parametrize("inplace", [False, True])
def test_a_file_with_another_header_fails_naming_it(tmp_path, kind, site, inplace):
    arrays = _arrays((16, 16), "<f4", n=12)
    paths = _write(tmp_path, arrays)
    roi = dict(roi_start=[2, 3], roi_shape=[9, 8]) if site.startswith("roi") else {}
    bad, kw = _bad(kind, arrays[7])
    if inplace:  # the same inode: only the header bytes can tell
        with open(paths[7], "r+b") as f:
            np.lib.format.write_array(f, bad, **kw)
            f.truncate()
    else:  # the listing has the new file's inode
        _replace(paths[7], bad, **kw)
    ds = npydask.open_dataset(tmp_path, headers="first", **roi)
    with pytest.raises(
        NpyFormatError, match=r"007\.npy.*first file's header.*\(16, 16\).*<f4.*but the file holds"
    ) as e:
        _read(ds, site)
    assert "headers='all'" in str(e.value)


@pytest.mark.parametrize("site", ["stack", "item", "roi", "large chunks"])
def test_a_replaced_file_fails_with_file_changed_error(tmp_path, site):
    arrays = _arrays((16, 16), "<f4", n=12)
    paths = _write(tmp_path, arrays)
    roi = dict(roi_start=[1, 1], roi_shape=[5, 5]) if site == "roi" else {}
    ds = npydask.open_dataset(tmp_path, headers="first", **roi)
    _replace(paths[4], arrays[4] + 1)  # the same header: only the inode tells
    with pytest.raises(FileChangedError, match=r"ino \d+ -> \d+.*004\.npy"):
        _read(ds, site)


def _replace_until_the_inode_comes_back(path, array):
    """Replace ``path`` by write-and-rename (as the README recommends) until it has its old inode number again."""
    ino = os.stat(path).st_ino
    for _ in range(20):  # (ext4 gives a freed inode number back at the second replacement)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            np.lib.format.write_array(f, array)
        os.replace(tmp, path)
        if os.stat(path).st_ino == ino:
            return
    pytest.skip("this file system did not give the inode number back in 20 replacements")


@pytest.mark.parametrize("site", ["stack", "item", "roi", "roi item", "loader", "large chunks"])
def test_a_file_replaced_with_its_inode_number_back_fails_with_file_changed_error(tmp_path, site):
    arrays = _arrays((16, 16), "<f4", n=8)
    paths = _write(tmp_path, arrays)
    roi = dict(roi_start=[2, 3], roi_shape=[9, 8]) if site.startswith("roi") else {}
    ds = npydask.open_dataset(tmp_path, headers="first", **roi)
    _replace_until_the_inode_comes_back(paths[5], arrays[5] + 1)  # the same header, the same inode number
    with pytest.raises(FileChangedError, match=r"renamed into place or modified at .*listing began.*005\.npy"):
        _read(ds, site)
    reopened = npydask.open_dataset(tmp_path, headers="first", **roi)
    want = [a + 1 if i == 5 else a for i, a in enumerate(arrays)]
    np.testing.assert_array_equal(reopened.stack().compute(), np.stack([a[2:11, 3:11] if roi else a for a in want]))


@pytest.mark.parametrize("site", ["stack", "roi", "large chunks"])
def test_a_file_rewritten_in_place_after_opening_fails_with_file_changed_error(tmp_path, site):
    arrays = _arrays((16, 16), "<f4", n=6)
    paths = _write(tmp_path, arrays)
    roi = dict(roi_start=[1, 1], roi_shape=[5, 5]) if site == "roi" else {}
    ds = npydask.open_dataset(tmp_path, headers="first", **roi)
    with open(paths[3], "r+b") as f:  # the same inode, size and header: only its ctime tells
        np.lib.format.write_array(f, arrays[3] * 2)
    with pytest.raises(FileChangedError, match=r"003\.npy"):
        _read(ds, site)


def test_a_file_written_just_before_opening_is_never_refused(tmp_path):
    # A script writes a file and opens the folder at once: the file was complete before the call, so it
    # is read, whichever clock stamped its ctime and however close the open came.
    path = str(tmp_path / "a.npy")
    for i in range(100):
        want = np.full((4, 4), i, "<f4")
        if i % 2:
            np.save(path, want)  # (rewritten in place: the same inode, a new ctime)
        else:
            _replace(path, want)  # (renamed into place: a new inode)
        np.testing.assert_array_equal(npydask.open_dataset(tmp_path, headers="first").stack().compute(), want[None])


def test_a_file_changed_right_after_opening_is_refused_saying_so(tmp_path):
    # However close after the open the change comes, its ctime tells (no window after the call).
    path = str(tmp_path / "a.npy")
    for i in range(20):
        np.save(path, np.zeros((4, 4), "<f4"))
        ds = npydask.open_dataset(tmp_path, headers="first")
        with open(path, "r+b") as f:  # the same inode, size and header
            np.lib.format.write_array(f, np.full((4, 4), 1 + i, "<f4"))
        with pytest.raises(FileChangedError) as e:
            ds.stack().compute()
        message = str(e.value)
        assert "a.npy" in message and "at or after the dataset's listing began" in message
        assert "Open the dataset again" in message and "clock" in message


@pytest.mark.parametrize("site", ["stack", "item", "roi", "large chunks"])
@pytest.mark.parametrize("cut", [8, 200, 1000])
def test_a_truncated_file_fails_clearly(tmp_path, site, cut):
    arrays = _arrays((16, 16), "<f4", n=12)
    paths = _write(tmp_path, arrays)
    size = os.path.getsize(paths[9])
    os.truncate(paths[9], size - cut)
    roi = dict(roi_start=[1, 1], roi_shape=[5, 5]) if site == "roi" else {}
    ds = npydask.open_dataset(tmp_path, headers="first", **roi)
    with pytest.raises(NpyFormatError, match=r"009\.npy.*truncated"):
        _read(ds, site)
    with pytest.raises(NpyFormatError, match=r"009\.npy.*truncated"):  # sizes known: refused at open
        npydask.open_dataset(files=paths, headers="first")


def test_a_short_file_of_another_header_is_named_as_such(tmp_path):
    arrays = _arrays((16, 16), "<f4", n=6)
    paths = _write(tmp_path, arrays)
    _replace(paths[2], np.zeros((2, 16), "<f4"))
    with pytest.raises(NpyFormatError, match=r"002\.npy.*but the file holds shape \(2, 16\)"):
        npydask.open_dataset(tmp_path, headers="first").stack().compute()
    with pytest.raises(NpyFormatError, match=r"002\.npy.*but the file holds shape \(2, 16\)"):
        npydask.open_dataset(files=paths, headers="first")


PAD_OUTSIDE = dict(roi_start=[5, 5], roi_shape=[2, 3], out_of_bounds_policy="pad", fill_value=-1)
"""A "pad" ROI wholly outside a (3, 4) first file: its tasks read nothing from it."""


def _read_padded(ds, site, root):
    if site == "xarray":
        xr = pytest.importorskip("xarray")
        if dask.config.get("array.query-planning", None):
            pytest.skip("xarray cannot compute dask-expr arrays")
        with xr.open_dataset(root, engine="npy", headers="first", chunks={}, **PAD_OUTSIDE) as opened:
            return opened["data"].values
    if site == "concatenate":
        return ds.concatenate().compute()
    return _read(ds, site)


@pytest.mark.parametrize("site", ["stack", "item", "loader", "large chunks", "concatenate", "xarray"])
def test_a_pad_roi_outside_the_first_file_still_checks_every_file(tmp_path, site):
    small = [np.full((3, 4), i, "<f4") for i in range(3)]
    paths = _write(tmp_path, small)
    ds = npydask.open_dataset(tmp_path, headers="first", **PAD_OUTSIDE)
    got = _read_padded(ds, site, tmp_path)  # every file like the first: all padding, as numpy pads them
    got = np.concatenate(got) if site == "loader" else np.asarray(got)
    np.testing.assert_array_equal(got.reshape(3, 2, 3), np.full((3, 2, 3), -1, "<f4"))
    _replace(paths[1], np.arange(80, dtype="<f4").reshape(10, 8))  # larger: its ROI holds data
    ds = npydask.open_dataset(tmp_path, headers="first", **PAD_OUTSIDE)
    differs = r"001\.npy.*first file's header.*\(3, 4\).*but the file holds shape \(10, 8\)"
    with pytest.raises(NpyFormatError, match=differs):
        _read_padded(ds, site, tmp_path)


@pytest.mark.parametrize("how", ["empty first file", "trimmed to nothing"])
def test_a_first_file_with_no_elements_does_not_stand_for_the_others(tmp_path, how):
    if how == "empty first file":  # (0, 10): its header promises no rows for any file
        first, roi = np.zeros((0, 10), "<f4"), {}
    else:  # a ROI that leaves nothing of a (3, 10) first file, and rows 5..7 of the others
        first = np.zeros((3, 10), "<f4")
        roi = dict(roi_start=[5, 0], roi_shape=[2, 10], out_of_bounds_policy="trim_to_shape")
    arrays = [first] + [np.full((6, 10), i, "<f4") for i in range(1, 4)]
    _write(tmp_path, arrays)
    with pytest.raises(NpyFormatError, match=r"001\.npy.*first file's header.*but the file holds shape \(6, 10\)") as e:
        npydask.open_dataset(tmp_path, headers="first", **roi)  # read by no task: checked at open
    assert "headers='all'" in str(e.value)
    whole = npydask.open_dataset(tmp_path, **roi)  # what headers="all" gives
    cut = (slice(5, 7),) if roi else (slice(None),)
    np.testing.assert_array_equal(whole.concatenate().compute(), np.concatenate([a[cut] for a in arrays]))
    for i in range(1, 4):  # every file alike: all opened, all empty, as numpy has them
        _replace(os.path.join(tmp_path, f"{i:03d}.npy"), first)
    ds = npydask.open_dataset(tmp_path, headers="first", **roi)
    np.testing.assert_array_equal(ds.concatenate().compute(), np.concatenate([first[cut]] * 4))
    assert [b.shape for b in npydask.Loader(ds, batch_size=4)] == [(4, *first[cut].shape)]


def test_headers_that_differ_only_in_spacing_show_their_bytes(tmp_path):
    arrays = _arrays((4, 6), "<f4", n=4)
    paths = _write(tmp_path, arrays)
    with open(paths[2], "r+b") as f:  # the same array, its header spaced otherwise (the same length: it parses alike)
        raw = f.read(128)
        spaced = raw.replace(b"(4, 6), }", b"(4, 6),} ")
        assert spaced != raw and npydask.parse_header(spaced) == npydask.parse_header(raw)
        f.seek(0)
        f.write(spaced)
    ds = npydask.open_dataset(tmp_path, headers="first")
    with pytest.raises(NpyFormatError, match=r"002\.npy.*other header bytes") as e:
        ds.stack().compute()
    assert repr(raw) in str(e.value) and repr(spaced) in str(e.value)


# -- a writer replacing files while tasks read them ---------------------------------------------


@pytest.mark.parametrize("site", ["stack", "roi"])
def test_writer_replacing_files_never_gives_other_data(tmp_path, site):
    """Files replaced (atomically, with another header or the original one) while datasets open and read.

    Every read that succeeds must equal the original arrays: a version with
    another header, or any file replaced since the listing began (its ctime),
    reads as an error, never as data.
    """
    n = 16
    arrays = [np.full((8, 16), i, "<f4") for i in range(n)]
    paths = _write(tmp_path, arrays)
    others = [
        (np.full((8, 16), -1, "<i4"), {}),  # same size and header length
        (np.full((8, 17), -1, "<f4"), {}),  # longer payload
        (np.full((8, 16), -1, "<f4"), {"version": (2, 0)}),  # another header length
        (np.full((4, 16), -1, "<f4"), {}),  # shorter
    ]
    roi = dict(roi_start=[1, 2], roi_shape=[6, 9]) if site == "roi" else {}
    cut = (slice(1, 7), slice(2, 11)) if roi else (slice(None),)
    stop = threading.Event()
    rng = np.random.default_rng(1)
    picks = rng.integers(1, n, 100_000).tolist()  # (the first file stays: its header is the one relied on)
    kinds = rng.integers(0, len(others), 100_000).tolist()

    def writer():
        k = 0
        while not stop.is_set():  # a file replaced by another header for a moment, then by its own again
            i, kind = picks[k % len(picks)], kinds[k % len(kinds)]
            for array, kw in (others[kind], (arrays[i], {})):
                tmp = paths[i] + ".tmp"
                with open(tmp, "wb") as f:
                    np.lib.format.write_array(f, array, **kw)
                os.replace(tmp, paths[i])
                time.sleep(0.001 if array is not arrays[i] else 0.004 if k % 3 else 0.1)
            k += 1  # (every third file a quiet moment: a file changed since the listing began is refused)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    ok = failed = 0
    try:
        deadline = time.monotonic() + 30
        with dask.config.set(scheduler="threads"):
            while (ok < 100 or failed < 30) and time.monotonic() < deadline:
                try:
                    ds = npydask.open_dataset(tmp_path, headers="first", **roi)
                    got = ds.stack().compute()
                except (NpyFormatError, FileChangedError, FileNotFoundError):
                    failed += 1
                    continue
                for i in range(n):  # "never other data", checked after the read
                    np.testing.assert_array_equal(got[i], arrays[i][cut])
                ok += 1
    finally:
        stop.set()
        thread.join()
    assert ok >= 20 and failed >= 20, (ok, failed)  # (both outcomes seen: values were checked)


# -- integrations pass headers= through (Ray: tests/test_ray.py) -----------------------------------


def test_xarray_engine_passes_headers_through(tmp_path):
    arrays = _arrays((4, 6), "<f4", n=5)
    paths = _write(tmp_path, arrays)
    xr = pytest.importorskip("xarray")
    if dask.config.get("array.query-planning", None):
        pytest.skip("xarray cannot compute dask-expr arrays")
    with xr.open_dataset(tmp_path, engine="npy", headers="first") as opened:
        np.testing.assert_array_equal(opened["data"].values, np.stack(arrays))
    with pytest.raises(ValueError, match="'all'.*'first'"):
        xr.open_dataset(tmp_path, engine="npy", headers="bad")
    _replace(paths[3], np.zeros((4, 7), "<f4"))
    with xr.open_dataset(tmp_path, engine="npy", headers="first", chunks={}) as opened:
        with pytest.raises(NpyFormatError, match="003.npy"):
            opened["data"].values  # noqa: B018


def test_on_a_distributed_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    arrays = _arrays((16, 16), "<f4", n=40)
    paths = _write(tmp_path, arrays)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        ds = npydask.open_dataset(tmp_path, headers="first", roi_start=[1, 2], roi_shape=[8, 8])
        np.testing.assert_array_equal(client.compute(ds.stack()).result(), np.stack([a[1:9, 2:10] for a in arrays]))
        ds = npydask.open_dataset(tmp_path, headers="first")
        np.testing.assert_array_equal(client.compute(ds.stack()).result(), np.stack(arrays))
        with open(paths[33], "r+b") as f:  # another header, in place: seen on the worker
            np.lib.format.write_array(f, np.zeros((16, 16), "<i4"))
        with pytest.raises(FileChangedError, match=r"at or after the dataset's listing began.*033\.npy"):
            client.compute(ds.stack()).result()  # (opened before the rewrite: its ctime tells)
        ds = npydask.open_dataset(tmp_path, headers="first")
        with pytest.raises(NpyFormatError, match=r"033\.npy.*first file's header"):
            client.compute(ds.stack()).result()
