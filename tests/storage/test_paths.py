"""Relative paths are made absolute where an array or dataset is built, never where a task runs.

A task may run in another working directory (a cluster worker started
elsewhere, or this process after ``os.chdir``): it must read the file the
client named. Each test builds in one folder, moves to another that holds
decoys of the same names (other data) or nothing, and computes; numpy is the
oracle. (``tests/test_distributed.py`` does the same with a worker process.)
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import npydask
from npydask.storage.paths import absolute, absolute_all

DTYPES = ["<f4", ">i2", "<u8", "<c8", "|b1"]


def _save(path: Path, a: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, a)


@pytest.fixture
def places(tmp_path, monkeypatch):
    """``(data, elsewhere)``: the working directory is ``data``; ``elsewhere`` is where tasks will run."""
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(data)
    return data, elsewhere


# -- the helper ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("a.npy", "{cwd}/a.npy"),
        ("sub/a.npy", "{cwd}/sub/a.npy"),
        ("./sub/./a.npy", "{cwd}/sub/a.npy"),
        ("sub//a.npy", "{cwd}/sub/a.npy"),
        ("sub/", "{cwd}/sub"),
        (".", "{cwd}"),
        ("sub/../a.npy", "{cwd}/sub/../a.npy"),  # '..' after a possible symlink: not normalised away
        ("..", "{cwd}/.."),
        ("/abs/x.npy", "/abs/x.npy"),
        ("/abs//y/./x.npy", "/abs//y/./x.npy"),  # absolute paths are kept exactly as given
    ],
)
def test_absolute_prefixes_the_working_directory(given, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cwd = os.getcwd()
    assert absolute(given) == expected.format(cwd=cwd)
    assert absolute_all([given, given]) == [expected.format(cwd=cwd)] * 2


def test_absolute_all_agrees_with_absolute_on_mixed_lists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = ["a.npy", "s/b.npy", "s/c.npy", "/r/d.npy", "s/../e.npy", "t/./f.npy", "g", "s/.", "s/..", "s//h.npy"]
    assert absolute_all(paths) == [absolute(p) for p in paths]
    assert all(os.path.isabs(p) for p in absolute_all(paths))


def test_absolute_at_the_file_system_root(monkeypatch):
    monkeypatch.chdir("/")
    assert absolute("a.npy") == "/a.npy"
    assert absolute_all(["a.npy", "./b.npy"]) == ["/a.npy", "/b.npy"]


def test_dotdot_after_a_symlink_names_what_the_kernel_opens(tmp_path, monkeypatch):
    # link -> real/inner, so "link/../x.npy" is real/x.npy; lexical normalisation would say cwd/x.npy
    real_x, decoy = np.arange(6.0).reshape(2, 3), np.zeros((2, 3))
    _save(tmp_path / "real" / "x.npy", real_x)
    (tmp_path / "real" / "inner").mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _save(cwd / "x.npy", decoy)
    (cwd / "link").symlink_to(tmp_path / "real" / "inner")
    monkeypatch.chdir(cwd)
    assert np.array_equal(np.load("link/../x.npy"), real_x)
    x = npydask.from_npy("link/../x.npy")
    monkeypatch.chdir(tmp_path)
    np.testing.assert_array_equal(x.compute(), real_x)


# -- from_npy --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["auto", "pread", "mmap"])
def test_from_npy_reads_the_client_file_from_another_directory(places, monkeypatch, dtype, backend):
    data, elsewhere = places
    rng = np.random.default_rng(7)
    a = (rng.random((5, 7, 3)) * 100).astype(dtype)
    _save(data / "sub" / "a.npy", a)
    _save(elsewhere / "sub" / "a.npy", np.zeros_like(a))  # a decoy of the same size, other data
    x = npydask.from_npy("sub/a.npy", chunks=(2, 7, 3), backend=backend)
    y = npydask.from_npy("./sub/../sub/a.npy", chunks=(2, 7, 3), backend=backend)
    by_absolute_path = npydask.from_npy(str(data / "sub" / "a.npy"), chunks=(2, 7, 3), backend=backend)
    monkeypatch.chdir(elsewhere)
    for z in (x, y):
        got = z.compute(scheduler="threads")
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, a)
    np.testing.assert_array_equal(x[1:4, 2].compute(), a[1:4, 2])
    assert x.name == by_absolute_path.name  # deterministic in the absolute path


def test_from_npy_npz_member_from_another_directory(places, monkeypatch):
    data, elsewhere = places
    xs, ys = np.arange(24, dtype="<i4").reshape(4, 6), np.linspace(0, 1, 5)
    np.savez(data / "pair.npz", x=xs, y=ys)
    np.savez_compressed(data / "packed.npz", x=xs)
    arrays = [
        npydask.from_npy("pair.npz", key="x", chunks=(1, 6)),
        npydask.from_npy("pair.npz", key="y"),
        npydask.from_npy("packed.npz", key="x"),
    ]
    monkeypatch.chdir(elsewhere)
    for x, expected in zip(arrays, [xs, ys, xs]):
        np.testing.assert_array_equal(x.compute(), expected)


def test_from_npy_missing_relative_path_names_the_absolute_path(places):
    data, _ = places
    with pytest.raises(FileNotFoundError, match=re.escape(str(data / "nope.npy"))):
        npydask.from_npy("nope.npy")


# -- open_dataset ----------------------------------------------------------------------------


@pytest.fixture
def folder(places):
    """Six files of two shapes under ``data/vols`` (a subfolder too), and the oracle by relative name."""
    data, elsewhere = places
    rng = np.random.default_rng(3)
    arrays = {}
    for name in ["0.npy", "1.npy", "2.npy", "s/3.npy", "s/4.npy", "s/5.npy"]:
        a = rng.integers(-500, 500, size=(3, 4)).astype("<i2")
        _save(data / "vols" / name, a)
        arrays[name] = a
    _save(elsewhere / "vols" / "0.npy", np.zeros((3, 4), "<i2"))  # a decoy
    return data, elsewhere, arrays


def test_open_dataset_relative_root_reads_from_another_directory(folder, monkeypatch):
    data, elsewhere, arrays = folder
    for root in ("vols", "vols/", "./vols", Path("vols")):
        ds = npydask.open_dataset(root)
        assert ds.files == [os.path.join(str(data / "vols"), n) for n in arrays]
        stacked = ds.stack()
        assert stacked.name == npydask.open_dataset(str(data / "vols")).stack().name
        roi = npydask.open_dataset(root, roi_start=[1, 1], roi_shape=[2, 2])
        monkeypatch.chdir(elsewhere)
        np.testing.assert_array_equal(stacked.compute(), np.stack(list(arrays.values())))
        np.testing.assert_array_equal(ds[4].compute(), arrays["s/4.npy"])
        np.testing.assert_array_equal(roi.stack().compute(), np.stack([a[1:3, 1:3] for a in arrays.values()]))
        monkeypatch.chdir(data)


def test_open_dataset_relative_files_and_file_list(folder, monkeypatch):
    data, elsewhere, arrays = folder
    names = ["s/5.npy", "0.npy", "2.npy"]
    (data / "vols" / "list.txt").write_text("\n".join(names) + "\n")
    (data / "lists").mkdir()
    (data / "lists" / "l.txt").write_text("".join(f"../vols/{n}\n" for n in names))
    expected = np.stack([arrays[n] for n in names])
    cases = {
        "files": npydask.open_dataset(files=[f"vols/{n}" for n in names]),
        "files + root": npydask.open_dataset("vols", files=names),
        "file_list": npydask.open_dataset(file_list="vols/list.txt"),
        "file_list + root": npydask.open_dataset("vols", file_list="vols/list.txt"),
        "file_list, entries with ..": npydask.open_dataset(file_list="lists/l.txt"),
    }
    for what, ds in cases.items():
        assert all(os.path.isabs(p) for p in ds.files), what
        assert [os.path.realpath(p) for p in ds.files] == [str((data / "vols" / n).resolve()) for n in names], what
    monkeypatch.chdir(elsewhere)
    for what, ds in cases.items():
        np.testing.assert_array_equal(ds.stack().compute(), expected, err_msg=what)


def test_open_dataset_relative_index_and_to_npy_files_names(folder, monkeypatch):
    data, elsewhere, arrays = folder
    ds = npydask.open_dataset("vols", index="vols.index.json")
    assert (data / "vols.index.json").is_file()
    names = json.loads((data / "vols.index.json").read_text())["names"]
    assert sorted(names) == sorted(f"vols/{n}" for n in arrays)  # keys relative to the index's folder
    again = npydask.open_dataset("vols", index="vols.index.json")
    assert again.stack().name == ds.stack().name
    npydask.to_npy_files(ds, "copy")  # default names: relative to the files' common folder
    monkeypatch.chdir(elsewhere)
    for n, a in arrays.items():
        np.testing.assert_array_equal(np.load(data / "copy" / n), a)
    np.testing.assert_array_equal(again.stack().compute(), np.stack(list(arrays.values())))


# -- writers ---------------------------------------------------------------------------------


def test_to_zarr_relative_store_written_where_the_client_is(places, monkeypatch):
    zarr = pytest.importorskip("zarr")
    data, elsewhere = places
    a = np.arange(120, dtype="<f8").reshape(10, 12)
    _save(data / "a.npy", a)
    lazy = npydask.to_zarr(npydask.from_npy("a.npy", chunks=(5, 12)), "out.zarr", compute=False)
    monkeypatch.chdir(elsewhere)
    lazy.compute()
    assert not (elsewhere / "out.zarr").exists()
    np.testing.assert_array_equal(zarr.open_array(str(data / "out.zarr"), mode="r")[...], a)
