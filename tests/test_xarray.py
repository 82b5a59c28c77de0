"""The xarray engine ``npy`` and ``NpyDataset.to_xarray``, with real xarray, against ``numpy.load``."""

from __future__ import annotations

import math
import os
import pickle
import sys
import threading
import tomllib
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest

xr = pytest.importorskip("xarray", reason="xarray is not installed: pip install 'npydask[xarray]'")

import npydask  # noqa: E402
from npydask.array import NpyFileArray  # noqa: E402
from npydask.errors import FileChangedError, NpyDaskWarning, RoiError  # noqa: E402
from npydask.storage.local import LocalSource  # noqa: E402
from npydask.xarray import NpyBackendArray, NpyBackendEntrypoint  # noqa: E402


def _xarray_computes_dask_arrays() -> bool:
    """Whether this xarray recognises this dask's arrays (with dask's array query planning on, xarray
    2026.9 does not: ``xr.DataArray(da.ones(2)).values`` is then an object array of dask arrays)."""
    values = xr.DataArray(da.ones(2, chunks=1)).values  # (an object array of dask arrays where it fails)
    return isinstance(values, np.ndarray) and values.dtype == np.float64


if not _xarray_computes_dask_arrays():
    pytest.skip(
        "xarray does not compute dask's array-expr arrays (DASK_ARRAY__QUERY_PLANNING=True): "
        "xr.DataArray(da.ones(2)).values is an object array of dask arrays, with or without npydask",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parent.parent
ENGINE = NpyBackendEntrypoint  # (xarray takes the class itself; engine="npy" once installed: see below)


def open_npy(path, **kwargs):
    return xr.open_dataset(path, engine=ENGINE, **kwargs)


@pytest.fixture
def reads(monkeypatch):
    """Every read npydask makes: the boxes of single-file reads, and the batches of many-file reads."""
    seen = []
    file_read = NpyFileArray.read
    many = LocalSource.read_many
    runs_many = LocalSource.read_runs_many

    def read(self, box, out=None):
        seen.append(("box", box))
        return file_read(self, box, out)

    def read_many(self, items, dest, nbytes):
        seen.append(("many", len(items)))
        return many(self, items, dest, nbytes)

    def read_runs_many(self, jobs):
        seen.append(("runs", len(jobs)))
        return runs_many(self, jobs)

    monkeypatch.setattr(NpyFileArray, "read", read)
    monkeypatch.setattr(LocalSource, "read_many", read_many)
    monkeypatch.setattr(LocalSource, "read_runs_many", read_runs_many)
    return seen


# -- the entry point -------------------------------------------------------------------------------


def test_guess_can_open_takes_npy_and_npz_paths_and_urls_only(tmp_path):
    engine = NpyBackendEntrypoint()
    for yes in [
        "a.npy",
        "dir/b.npz",
        Path("c.npy"),
        "UPPER.NPY",
        "s3://bkt/k/x.npy",
        "https://host/x.npz?X-Amz-Signature=abc",
        "file:///data/x.npy",
    ]:
        assert engine.guess_can_open(yes), yes
    (tmp_path / "folder.npy").mkdir()  # a folder is opened only with engine="npy"; its name decides nothing here
    for no in ["a.nc", "a.zarr", "a.npy.gz", str(tmp_path), b"a.npy", 3, "ftp://host/x.npy", "s3://bkt/prefix/"]:
        assert not engine.guess_can_open(no), no
    with open(tmp_path / "f.npy", "wb") as f:  # a file object: the engine reads paths
        assert not engine.guess_can_open(f)


def test_open_dataset_parameters_name_what_open_dataset_takes():
    params = NpyBackendEntrypoint.open_dataset_parameters
    assert params[:7] == (
        "filename_or_obj",
        "drop_variables",
        "dims",
        "key",
        "storage_options",
        "file_coord",
        "coord_name",
    )
    import inspect

    taken = {n for n, p in inspect.signature(npydask.open_dataset).parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert set(params[7:]) == taken - {"key", "device", "storage_options"}
    assert {"sort", "on_error"} <= set(params)
    assert {"file_filter", "recursive", "roi_start", "roi_shape", "out_of_bounds_policy", "fill_value", "index"} <= set(
        params
    )
    assert NpyBackendEntrypoint.description
    assert "npy" in repr(NpyBackendEntrypoint())


def test_decode_cf_false_and_unknown_keywords(save):
    p = save(np.arange(6.0))
    ds = open_npy(p, decode_cf=False)  # xarray passes no decoder the engine does not name
    np.testing.assert_array_equal(ds["data"].values, np.arange(6.0))
    with pytest.raises(TypeError, match="no keyword 'chunk_size'.*file_filter"):
        open_npy(p, chunk_size=3)
    with pytest.raises(ValueError, match="device='gpu'.*host memory.*open_dataset"):
        open_npy(p, device="gpu")


def test_engine_npy_is_found_through_the_entry_point_pyproject_declares(tmp_path, save, monkeypatch):
    """The declared entry point, installed as a distribution's metadata, is what engine="npy" loads."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["xarray.backends"]
    assert declared == {"npy": "npydask.xarray:NpyBackendEntrypoint"}
    info = tmp_path / "site" / "npydask_entry_point_check-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: npydask-entry-point-check\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[xarray.backends]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    xr.backends.refresh_engines()
    try:
        assert isinstance(xr.backends.list_engines()["npy"], NpyBackendEntrypoint)
        a = np.arange(12, dtype="i2").reshape(3, 4)
        p = save(a, "guessed.npy")
        np.testing.assert_array_equal(xr.open_dataset(p, engine="npy")["data"].values, a)
        np.testing.assert_array_equal(xr.open_dataset(p)["data"].values, a)  # guessed from the name
    finally:
        monkeypatch.undo()
        xr.backends.refresh_engines()


# -- one file ---------------------------------------------------------------------------------------


DTYPES = ["<f4", ">f4", ">i8", "<u2", "|b1", "<c16", ">c8", "|i1", "<M8[s]", ">m8[ms]"]


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_file_values_dims_attrs_and_encoding_equal_numpy(tmp_path, order, dtype):
    rng = np.random.default_rng(abs(hash((order, dtype))) % 2**32)
    a = rng.integers(0, 100, (7, 5, 6)).astype(dtype)
    p = tmp_path / "vol.npy"
    np.save(p, np.array(a, order=order))
    ds = open_npy(p)
    var = ds["data"]
    assert list(ds.data_vars) == ["data"]
    assert var.dims == ("dim_0", "dim_1", "dim_2")
    assert var.dtype == np.load(p).dtype
    assert var.attrs == {"npy_version": "1.0", "order": order}
    assert var.encoding["source"] == ds.encoding["source"] == str(p)
    assert var.encoding["preferred_chunks"] == dict(zip(var.dims, npydask.from_npy(p).chunks))
    np.testing.assert_array_equal(var.values, np.load(p))
    np.testing.assert_array_equal(var.isel(dim_0=2, dim_2=slice(1, None, 2)).values, np.load(p)[2, :, 1::2])


def test_strings_bytes_structured_and_longdouble_files(save):
    for a in [
        np.array(["ab", "cde", "f"]),
        np.array([b"x", b"yz"]),
        np.asfortranarray(np.ones((2, 3), np.longdouble)),
        np.array([(1, (2.5, 3.5)), (4, (5.5, 6.5))], [("a", "<i4"), ("b", ">f8", (2,))]),
    ]:
        p = save(a)
        for chunks in (None, {}):
            ds = open_npy(p, chunks=chunks)
            got = ds["data"].values
            assert got.dtype == a.dtype and got.shape == a.shape
            np.testing.assert_array_equal(got, a)
            assert "data" in repr(ds)


def test_chunks_none_is_lazy_without_dask_and_reads_only_the_selection(save, reads):
    a = np.arange(40 * 30 * 20, dtype="f8").reshape(40, 30, 20)
    p = save(a)
    ds = open_npy(p, chunks=None)
    var = ds["data"]
    assert var.chunks is None and not isinstance(var.variable._data, da.Array)
    assert reads == [], "opening read data"
    part = var.isel(dim_0=slice(10, 20), dim_1=3)
    assert reads == [], "selecting read data"
    np.testing.assert_array_equal(part.values, a[10:20, 3])
    assert [r[1] for r in reads] == [npydask.plan.region.Box((10, 3, 0), (20, 4, 20))]  # that box, nothing else
    reads.clear()
    np.testing.assert_array_equal(var.values, a)
    assert len(reads) == 1 and reads[0][1].shape == a.shape


def test_nothing_is_read_at_open_so_a_changed_file_fails_at_values(tmp_path):
    p = tmp_path / "a.npy"
    np.save(p, np.zeros((50, 8)))
    for chunks in (None, {}):
        ds = open_npy(p, chunks=chunks)
        st = os.stat(p)
        np.save(p, np.ones((50, 8)))  # same header, other payload, new mtime
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with pytest.raises(FileChangedError, match="a.npy"):
            _ = ds["data"].values  # (the read happens on access)
        np.save(p, np.zeros((50, 8)))


def test_chunks_empty_dict_follows_npydask_chunking(save):
    a = np.arange(64 * 50 * 40, dtype="<i4").reshape(64, 50, 40)
    with dask.config.set({"array.chunk-size": "64KiB"}):
        for order in "CF":
            p = save(a, order=order)
            ds = open_npy(p, chunks={})
            x = ds["data"].data
            assert isinstance(x, da.Array)
            assert x.chunks == npydask.from_npy(p).chunks and math.prod(x.numblocks) > 1
            np.testing.assert_array_equal(ds["data"].compute().values, a)
            np.testing.assert_array_equal(ds["data"][5:60:7, ::-3, 4].compute().values, a[5:60:7, ::-3, 4])


def test_chunks_auto_aligns_with_npydask_chunks_and_computes_equal(save):
    a = np.random.default_rng(1).random((300, 64, 32)).astype(">f4")
    with dask.config.set({"array.chunk-size": "256KiB"}):
        p = save(a)
        own = npydask.from_npy(p).chunks
        ds = open_npy(p, chunks="auto")  # (a chunk that split npydask's would warn: warnings are errors here)
        x = ds["data"].data
        assert isinstance(x, da.Array)
        for mine, theirs in zip(own, x.chunks):  # every chunk boundary of xarray's is one of npydask's
            assert set(np.cumsum(theirs)) <= set(np.cumsum(mine))
        np.testing.assert_allclose(ds["data"].mean("dim_0").compute().values, a.mean(0), rtol=1e-5)  # (sum order)
        np.testing.assert_array_equal(ds["data"].values, a)


def test_selections_isel_sel_outer_and_vectorized_equal_numpy(save):
    a = np.arange(20 * 15 * 10, dtype="i8").reshape(20, 15, 10)
    p = save(a, order="F")
    for chunks in (None, {}, "auto"):
        var = open_npy(p, chunks=chunks)["data"]
        cases = [
            (var.isel(dim_0=-1), a[-1]),
            (var.isel(dim_0=slice(None, None, -4), dim_2=[0, 9, 3]), a[::-4][:, :, [0, 9, 3]]),
            (var[3:17:5, 2, ::3], a[3:17:5, 2, ::3]),
            (var.isel(dim_1=[14, 0, 7], dim_0=[1, 1, 19]), a[[1, 1, 19]][:, [14, 0, 7]]),
            (
                var.isel(dim_0=xr.DataArray([0, 19, 4], dims="p"), dim_1=xr.DataArray([1, 2, 14], dims="p")),
                a[[0, 19, 4], [1, 2, 14]],
            ),
            (var.isel(dim_0=5, dim_1=6, dim_2=7), a[5, 6, 7]),
            (var.isel(dim_0=slice(4, 4)), a[4:4]),
            (var.where(var > 1000).sum("dim_2"), np.nansum(np.where(a > 1000, a, np.nan), 2)),
        ]
        for got, want in cases:
            np.testing.assert_array_equal(np.asarray(got.values), want)


def test_index_lists_read_runs_of_the_picked_indices_only(save, reads):
    a = np.arange(200 * 30 * 4, dtype="<i2").reshape(200, 30, 4)
    p = save(a)
    var = open_npy(p, chunks=None)["data"]
    np.testing.assert_array_equal(var.isel(dim_0=[150, 3, 4, 5, 3]).values, a[[150, 3, 4, 5, 3]])
    assert sorted(r[1].start[0] for r in reads) == [3, 150]  # two runs, not the 148 rows between
    assert sorted(r[1].shape[0] for r in reads) == [1, 3]
    reads.clear()
    np.testing.assert_array_equal(var.isel(dim_0=7, dim_1=[0, 29], dim_2=slice(1, 3)).values, a[7, [0, 29], 1:3])
    assert [r[1].shape for r in reads] == [(1, 1, 2), (1, 1, 2)]


def test_random_outer_and_vectorized_selections_equal_numpy(save):
    rng = np.random.default_rng(7)
    a = rng.integers(-1000, 1000, (13, 11, 9)).astype(">i4")
    p = save(a, order="F")
    var = open_npy(p, chunks=None)["data"]
    for _ in range(60):
        key, want = {}, a
        for axis, n in enumerate(a.shape):
            kind = rng.integers(4)
            if kind == 0:
                pick = rng.integers(-n, n, rng.integers(0, 5)).tolist()
            elif kind == 1:
                start, stop = sorted(rng.integers(-n, n + 1, 2).tolist())
                step = int(rng.choice([1, 2, -1, -3]))
                pick = slice(start, stop, step) if step > 0 else slice(stop, start, step)
                if step < 0 and not len(range(n)[pick]):  # (xarray 2026.9's own _decompose_slice raises
                    pick = slice(None, None, step)  # IndexError on an empty slice of negative step)
            else:
                continue
            key[f"dim_{axis}"] = pick
            want = want[(slice(None),) * axis + (pick,)]
        np.testing.assert_array_equal(var.isel(key).values, want)
    points = [rng.integers(0, n, 6) for n in a.shape]
    got = var.isel({f"dim_{d}": xr.DataArray(points[d], dims="p") for d in range(3)}).values
    np.testing.assert_array_equal(got, a[tuple(points)])


def test_dims_are_given_names_and_are_checked(save):
    p = save(np.zeros((2, 3)))
    assert open_npy(p, dims=["y", "x"])["data"].dims == ("y", "x")
    with pytest.raises(ValueError, match=r"a0\.npy \(shape \(2, 3\)\): dims must name each of its 2 axes, found 1"):
        open_npy(p, dims=["y"])
    with pytest.raises(ValueError, match="distinct"):
        open_npy(p, dims=["y", "y"])
    with pytest.raises(TypeError, match="sequence of 2 names"):
        open_npy(p, dims="yx")


def test_zero_d_and_empty_files(save):
    for a in (np.array(3.5), np.zeros((0, 4), "u1"), np.zeros((3, 0))):
        p = save(a)
        for chunks in (None, {}):
            var = open_npy(p, chunks=chunks)["data"]
            assert var.shape == a.shape
            np.testing.assert_array_equal(var.values, a)


def test_a_single_file_refuses_folder_keywords_and_missing_files_name_the_path(tmp_path, save):
    p = save(np.zeros(3))
    with pytest.raises(ValueError, match="file_filter, recursive choose files in a folder; this is one file"):
        open_npy(p, file_filter="*.npy", recursive=True)
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        open_npy(tmp_path / "nope.npy")
    with pytest.raises(TypeError, match="paths and object URLs"):
        open_npy(np.zeros(3).tobytes())


def test_roi_arguments_apply_to_a_single_file(save):
    a = np.arange(100, dtype="f4").reshape(10, 10)
    p = save(a)
    var = open_npy(p, roi_start=[2, 3], roi_shape=[4, 5])["data"]
    np.testing.assert_array_equal(var.values, a[2:6, 3:8])
    with pytest.raises(RoiError, match="a0.npy"):
        open_npy(p, roi_start=[8, 0], roi_shape=[4, 4])
    padded = open_npy(p, roi_start=[8, 0], roi_shape=[4, 4], out_of_bounds_policy="pad", fill_value=-1)["data"]
    want = np.full((4, 4), -1, "f4")
    want[:2] = a[8:, :4]
    np.testing.assert_array_equal(padded.values, want)


# -- .npz archives --------------------------------------------------------------------------------


@pytest.mark.parametrize("savez", [np.savez, np.savez_compressed])
def test_npz_members_of_different_shapes_are_variables_with_their_own_dims(tmp_path, savez):
    members = {
        "x": np.arange(30, dtype=">f8").reshape(5, 6),
        "y": np.arange(7, dtype="u2"),
        "img": np.asfortranarray(np.arange(24, dtype="i4").reshape(2, 3, 4)),
    }
    p = tmp_path / "pair.npz"
    savez(p, **members)
    for chunks in (None, {}):
        ds = open_npy(p, chunks=chunks)
        assert list(ds.data_vars) == list(np.load(p).files)
        for name, want in members.items():
            var = ds[name]
            assert var.dims == tuple(f"{name}_dim_{i}" for i in range(want.ndim))
            assert var.dtype == want.dtype
            np.testing.assert_array_equal(var.values, want)
        assert ds["img"].attrs["order"] == "F" and ds["x"].attrs["order"] == "C"
        assert ds.encoding["source"] == str(p)
    assert list(open_npy(p, key="y").data_vars) == ["y"]
    assert list(open_npy(p, key=["img", "x"]).data_vars) == ["img", "x"]
    assert list(open_npy(p, drop_variables="x").data_vars) == ["y", "img"]
    assert open_npy(p, dims={"y": ["t"]})["y"].dims == ("t",)
    with pytest.raises(KeyError, match=r"no member 'z'.*\['img', 'x', 'y'\]"):
        open_npy(p, key="z")
    with pytest.raises(TypeError, match="dims as a dict"):
        open_npy(p, dims=["a", "b"])


def test_npz_without_arrays_and_a_non_archive_are_refused(tmp_path):
    import zipfile

    p = tmp_path / "notes.npz"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(npydask.NpyFormatError, match="notes.npz.*no .npy among them"):
        open_npy(p)
    q = tmp_path / "plain.npz"
    q.write_bytes(b"not a zip at all")
    with pytest.raises(npydask.NpyFormatError, match="plain.npz: expected an .npz"):
        open_npy(q)


# -- folders --------------------------------------------------------------------------------------


def make_folder(root: Path, shapes, dtype="<f4", order="C", names=None):
    arrays = {}
    for i, shape in enumerate(shapes):
        name = names[i] if names else f"s{i:02d}.npy"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        a = (np.arange(int(np.prod(shape))) + 1000 * i).astype(dtype).reshape(shape)
        np.save(root / name, np.array(a, order=order))
        arrays[name] = a
    return arrays


@pytest.mark.parametrize("order", ["C", "F"])
def test_folder_stacks_files_with_a_file_coordinate(tmp_path, order, reads):
    arrays = make_folder(tmp_path, [(4, 5)] * 6, dtype=">i2", order=order)
    ds = open_npy(tmp_path, chunks=None)
    assert reads == []
    var = ds["data"]
    assert var.dims == ("file", "dim_0", "dim_1")
    assert ds["file"].values.tolist() == list(arrays)
    assert var.attrs == {"npy_version": "1.0", "order": order}
    assert ds.encoding["source"] == var.encoding["source"] == str(tmp_path)
    np.testing.assert_array_equal(var.values, np.stack(list(arrays.values())))
    np.testing.assert_array_equal(var.sel(file="s03.npy").values, arrays["s03.npy"])
    np.testing.assert_array_equal(
        var.sel(file=["s05.npy", "s01.npy"])[:, 1].values, np.stack([arrays["s05.npy"][1], arrays["s01.npy"][1]])
    )
    dask_ds = open_npy(tmp_path, chunks={})
    own = npydask.open_dataset(tmp_path).stack()
    assert dask_ds["data"].data.chunks == own.chunks
    assert dask_ds["data"].encoding["preferred_chunks"] == dict(zip(var.dims, own.chunks))
    np.testing.assert_array_equal(
        dask_ds["data"].isel(dim_1=slice(None, None, -2)).compute().values, np.stack(list(arrays.values()))[:, :, ::-2]
    )


def test_folder_of_many_small_files_reads_them_in_batches(tmp_path, reads):
    arrays = make_folder(tmp_path, [(8, 8)] * 300, names=[f"{i:03d}.npy" for i in range(300)])
    ds = open_npy(tmp_path, chunks={})
    assert math.prod(ds["data"].data.numblocks) < 10  # grouped as npydask groups them
    np.testing.assert_array_equal(ds["data"].values, np.stack(list(arrays.values())))
    assert not [r for r in reads if r[0] == "box"] and sum(n for kind, n in reads if kind == "many") == 300


def test_picking_files_of_a_folder_reads_only_those_files(tmp_path, reads):
    arrays = make_folder(tmp_path, [(8, 8)] * 300, names=[f"{i:03d}.npy" for i in range(300)])
    var = open_npy(tmp_path, chunks=None)["data"]
    picked = ["250.npy", "002.npy", "003.npy"]
    np.testing.assert_array_equal(var.sel(file=picked).values, np.stack([arrays[n] for n in picked]))
    assert reads == [("many", 3)]  # one tight loop over the three files, not the 249 between
    reads.clear()
    np.testing.assert_array_equal(
        var.isel(file=[299, 0], dim_1=slice(2, 5)).values,
        np.stack([arrays["299.npy"][:, 2:5], arrays["000.npy"][:, 2:5]]),
    )
    assert len(reads) == 2 and all(kind == "box" for kind, _ in reads)  # (each a strided box of one file)


def test_folder_discovery_keywords_recursive_filter_and_files(tmp_path):
    names = ["a.npy", "sub/b.npy", "sub/deeper/c.npy", "z.npy"]
    arrays = make_folder(tmp_path, [(3,)] * 4, names=names)
    (tmp_path / "sub" / "skip.dat").write_bytes(b"not an array")
    ds = open_npy(tmp_path, recursive=True)
    assert ds["file"].values.tolist() == ["a.npy", "sub/b.npy", "sub/deeper/c.npy", "z.npy"]
    ds = open_npy(tmp_path, file_filter="[ab].npy")
    assert ds["file"].values.tolist() == ["a.npy", "sub/b.npy"]  # DALI: root, then immediate subfolders
    np.testing.assert_array_equal(ds["data"].values, np.stack([arrays["a.npy"], arrays["sub/b.npy"]]))
    ds = open_npy(tmp_path, files=["z.npy", "a.npy"], dims=["t", "x"])
    assert ds["data"].dims == ("t", "x") and ds["t"].values.tolist() == ["z.npy", "a.npy"]
    ds = open_npy(tmp_path, shard_id=1, num_shards=2, dims=["x"])
    assert ds["data"].dims == ("file", "x") and ds["file"].values.tolist() == ["z.npy", "sub/b.npy"]  # of a, z, sub/b
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:  # a relative folder: names relative to it, source absolute
        ds = open_npy("sub", recursive=True)
        assert ds["file"].values.tolist() == ["b.npy", "deeper/c.npy"]
        assert ds.encoding["source"] == str(tmp_path / "sub")
    finally:
        os.chdir(cwd)


def test_folder_roi_arguments_are_backend_keywords(tmp_path):
    arrays = make_folder(tmp_path, [(10, 12)] * 4, dtype="<i4", order="F")
    stacked = np.stack(list(arrays.values()))
    for chunks in (None, {}):
        var = open_npy(tmp_path, chunks=chunks, roi_start=[2, 3], roi_shape=[5, 4])["data"]
        np.testing.assert_array_equal(var.values, stacked[:, 2:7, 3:7])
        var = open_npy(tmp_path, chunks=chunks, rel_roi_start=[0.5], roi_axes=[1])["data"]
        np.testing.assert_array_equal(var.values, stacked[:, :, 6:])


def test_ragged_folder_names_two_files_and_the_pad_roi_that_fixes_it(tmp_path):
    arrays = make_folder(tmp_path, [(4, 5), (4, 5), (6, 3)])
    with pytest.raises(ValueError, match="s00.npy has shape") as err:
        open_npy(tmp_path)
    message = str(err.value)
    assert "s00.npy has shape (4, 5)" in message and "s02.npy has (6, 3)" in message
    assert "roi_shape=[6, 5], out_of_bounds_policy='pad'" in message
    var = open_npy(tmp_path, roi_shape=[6, 5], out_of_bounds_policy="pad", fill_value=-7)["data"]
    want = np.full((3, 6, 5), -7, "f4")
    want[0, :4], want[1, :4], want[2, :, :3] = arrays["s00.npy"], arrays["s01.npy"], arrays["s02.npy"]
    np.testing.assert_array_equal(var.values, want)
    with pytest.raises(ValueError, match="different shapes.*'pad'"):
        npydask.open_dataset(tmp_path).to_xarray()


def test_folder_dims_and_drop_variables(tmp_path):
    make_folder(tmp_path, [(2, 3)] * 2)
    assert open_npy(tmp_path, dims=["time", "y", "x"])["data"].dims == ("time", "y", "x")
    with pytest.raises(ValueError, match="2 axes .* or all 3 axes"):
        open_npy(tmp_path, dims=["x"])
    with pytest.raises(ValueError, match="distinct"):
        open_npy(tmp_path, dims=["file", "x"])
    ds = open_npy(tmp_path, drop_variables=["data"])
    assert list(ds.data_vars) == [] and ds["file"].size == 2


def test_folder_of_npz_archives_with_a_key(tmp_path):
    for i in range(3):
        np.savez(tmp_path / f"{i}.npz", x=np.full((2, 2), i), y=np.arange(i + 1))
    ds = open_npy(tmp_path, file_filter="*.npz", key="x")
    np.testing.assert_array_equal(ds["data"].values, np.stack([np.full((2, 2), i) for i in range(3)]))
    with pytest.raises(ValueError, match="different shapes"):
        open_npy(tmp_path, file_filter="*.npz", key="y")


def _days(root, n=12, shape=(2, 3)):
    """``day_1.npy .. day_n.npy`` holding their day number: byte-wise order would put day_10 before day_2."""
    for i in range(1, n + 1):
        np.save(root / f"day_{i}.npy", np.full(shape, i, "i4"))
    return np.stack([np.full(shape, i, "i4") for i in range(1, n + 1)])


def test_folder_files_are_in_natural_order_by_default(tmp_path):
    days = _days(tmp_path)
    ds = open_npy(tmp_path)  # (no warning: the engine's default is natural order)
    assert ds["file"].values.tolist() == [f"day_{i}.npy" for i in range(1, 13)]
    np.testing.assert_array_equal(ds["data"].values, days)
    dali = open_npy(tmp_path, sort="bytes")
    assert dali["file"].values.tolist() == sorted(f"day_{i}.npy" for i in range(1, 13))
    with pytest.warns(NpyDaskWarning, match="sort='natural'"):  # (None is open_dataset's default: it says so)
        open_npy(tmp_path, sort=None)
    with pytest.raises(ValueError, match="choose files in a folder"):
        open_npy(tmp_path / "day_1.npy", sort="natural")


def test_file_coord_from_a_named_group_a_plain_group_or_a_function(tmp_path):
    days = _days(tmp_path)
    ds = open_npy(tmp_path, file_coord=r"day_(?P<day>\d+)")
    assert ds["day"].dims == ("file",) and ds["day"].values.tolist() == list(range(1, 13))
    assert ds["day"].dtype == np.int64
    np.testing.assert_array_equal(ds.swap_dims(file="day").sel(day=10)["data"].values, days[9])
    indexed = open_npy(tmp_path, file_coord=r"day_(?P<day>\d+)", dims=["day", "y", "x"], chunks={})
    assert indexed["data"].dims == ("day", "y", "x") and "day" in indexed.indexes
    assert indexed["file"].dims == ("day",) and indexed["file"].values[0] == "day_1.npy"
    np.testing.assert_array_equal(indexed.sel(day=[2, 10])["data"].values, days[[1, 9]])
    plain = open_npy(tmp_path, file_coord=r"_(\d+)\.", coord_name="n")
    assert plain["n"].values.tolist() == list(range(1, 13))
    by_function = open_npy(tmp_path, file_coord=lambda name: name.upper(), coord_name="upper")
    assert by_function["upper"].values.tolist() == [f"DAY_{i}.NPY" for i in range(1, 13)]
    for bad, kwargs, match in [
        (r"day_(\d+)", {}, "coord_name"),
        (r"(day)_(\d+)", {"coord_name": "x"}, "2 groups"),
        (r"day_(?P<day>\d+)", {"coord_name": "x"}, "drop coord_name"),
        (lambda n: 1, {}, "coord_name"),
        (r"week_(?P<week>\d+)", {}, r"does not match the file 'day_1.npy'"),
        (r"day_(?P<file>\d+)", {}, "name it otherwise"),
        (r"(?P<dim_0>\d+)", {}, "names a variable or axis"),
    ]:
        with pytest.raises(ValueError, match=match):
            open_npy(tmp_path, file_coord=bad, **kwargs)
    with pytest.raises(TypeError, match="regular expression"):
        open_npy(tmp_path, file_coord=3)
    with pytest.raises(ValueError, match="file_coord.*choose files in a folder"):
        open_npy(tmp_path / "day_1.npy", file_coord=r"(?P<d>\d)")


def test_file_coord_values_are_typed(tmp_path):
    for name in ["t_2024-01-05_x1.5_a.npy", "t_2024-01-06_x-2_b.npy"]:
        np.save(tmp_path / name, np.zeros(2))
    ds = open_npy(tmp_path, file_coord=r"t_(?P<time>[\d-]+)_x(?P<x>[-\d.]+)_(?P<site>\w)")
    assert ds["time"].dtype.kind == "M"
    np.testing.assert_array_equal(ds["time"].values, np.array(["2024-01-05", "2024-01-06"], "datetime64[ns]"))
    assert ds["x"].values.tolist() == [1.5, -2.0] and ds["site"].values.tolist() == ["a", "b"]


def test_a_folder_of_npz_pairs_with_a_key_list_is_one_variable_per_member(tmp_path):
    xs = [np.full((2, 3), i, ">i2") for i in range(10)]
    ys = [np.arange(4.0) + i for i in range(10)]
    for i in range(10):
        np.savez(tmp_path / f"pair_{i}.npz", x=xs[i], y=ys[i], z=np.arange(i + 1))
    ds = open_npy(tmp_path, file_filter="*.npz", key=["x", "y"], chunks={})
    assert ds["x"].dims == ("file", "x_dim_0", "x_dim_1") and ds["y"].dims == ("file", "y_dim_0")
    assert ds["file"].values.tolist() == [f"pair_{i}.npz" for i in range(10)]
    np.testing.assert_array_equal(ds["x"].values, np.stack(xs))
    np.testing.assert_array_equal(ds["y"].values, np.stack(ys))
    named = open_npy(
        tmp_path,
        file_filter="*.npz",
        key=["x", "y"],
        dims={"x": ["t", "r", "c"], "y": ["t", "k"]},
        drop_variables=["x"],
    )
    assert list(named.data_vars) == ["y"] and named["y"].dims == ("t", "k")
    assert named["t"].values.tolist() == [f"pair_{i}.npz" for i in range(10)]
    with pytest.raises(ValueError, match="one name"):
        open_npy(tmp_path, file_filter="*.npz", key=["x", "y"], dims={"x": ["a", "r", "c"], "y": ["t", "k"]})
    with pytest.raises(TypeError, match="dims as a dict"):
        open_npy(tmp_path, file_filter="*.npz", key=["x", "y"], dims=["a", "b"])
    with pytest.raises(ValueError, match=r"member 'z': files of different shapes"):
        open_npy(tmp_path, file_filter="*.npz", key=["x", "z"])


@pytest.mark.parametrize("n", [10, 11, 13, 37])
def test_folder_file_chunks_are_balanced(tmp_path, n):
    """npydask groups these files (64 KiB each) 9 to a chunk at this chunk size: the engine evens them out."""
    arrays = make_folder(tmp_path, [(32, 256)] * n, dtype="f8", names=[f"{i:02d}.npy" for i in range(n)])
    with dask.config.set({"array.chunk-size": "576KiB"}):
        grouped = npydask.open_dataset(tmp_path).stack().chunks[0]
        ds = open_npy(tmp_path, chunks={})
    chunks = ds["data"].chunks[0]
    assert len(chunks) == len(grouped) and max(chunks) - min(chunks) <= 1 and sum(chunks) == n
    assert ds["data"].encoding["preferred_chunks"]["file"] == chunks
    np.testing.assert_array_equal(ds["data"].values, np.stack(list(arrays.values())))
    if n == 10:
        assert grouped == (9, 1) and chunks == (5, 5)


def test_a_presigned_urls_query_is_not_in_the_lazy_arrays_repr(tmp_path, http_server):
    np.save(tmp_path / "v.npy", np.arange(6.0).reshape(2, 3))
    server = http_server(tmp_path)
    url = server.url("v.npy") + "?X-Amz-Signature=s1gn&X-Amz-Credential=AKIA"
    ds = open_npy(url)
    lazy = ds["data"].variable._data  # (before the values are read: xarray then holds them in memory)
    shown = repr(lazy) + repr(ds) + repr(ds["data"]) + str(ds["data"].encoding) + str(ds.encoding)
    assert "NpyBackendArray('" + server.url("v.npy") + "', shape=(2, 3), dtype=<f8)" in repr(lazy)
    assert "s1gn" not in shown and "AKIA" not in shown
    np.testing.assert_array_equal(ds["data"].values, np.arange(6.0).reshape(2, 3))


# -- pickling, threads ------------------------------------------------------------------------------


def test_lazy_datasets_pickle_without_data_and_read_after(tmp_path):
    a = np.random.default_rng(2).random((256, 256))
    np.save(tmp_path / "big.npy", a)
    make_folder(tmp_path / "f", [(16, 16)] * 5)
    for chunks in (None, {}):
        ds = open_npy(tmp_path / "big.npy", chunks=chunks)
        blob = pickle.dumps(ds)
        assert len(blob) < a.nbytes // 20, "the pickle carries data"
        back = pickle.loads(blob)
        np.testing.assert_array_equal(back["data"].values, a)
        folder = pickle.loads(pickle.dumps(open_npy(tmp_path / "f", chunks=chunks)))
        assert folder["data"].shape == (5, 16, 16) and folder["file"].values[0] == "s00.npy"
        np.testing.assert_array_equal(folder["data"][4].values, np.arange(256).reshape(16, 16) + 4000)
    array = NpyBackendArray(npydask.open_dataset(files=[tmp_path / "big.npy"]).views[0])
    again = pickle.loads(pickle.dumps(array))
    assert again.shape == (256, 256) and again.dtype == a.dtype and "big.npy" in repr(again)


def test_threads_share_one_lazy_dataset(tmp_path):
    a = np.arange(64 * 64 * 16, dtype="u4").reshape(64, 64, 16)
    np.save(tmp_path / "v.npy", a)
    ds = open_npy(tmp_path / "v.npy", chunks=None, cache=False)
    errors = []

    def work(k):
        try:
            for i in range(40):
                j = (k * 7 + i) % 60
                got = ds["data"].isel(dim_0=slice(j, j + 4), dim_2=k % 16).values
                assert np.array_equal(got, a[j : j + 4, :, k % 16]), (k, i)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    with dask.config.set({"array.chunk-size": "16KiB", "scheduler": "threads", "num_workers": 8}):
        x = open_npy(tmp_path / "v.npy", chunks={})["data"]
        assert math.prod(x.data.numblocks) >= 16
        np.testing.assert_array_equal(x.compute().values, a)


# -- NpyDataset.to_xarray ---------------------------------------------------------------------------


def test_to_xarray_is_npydask_own_graph_with_a_file_coordinate(tmp_path):
    arrays = make_folder(
        tmp_path, [(3, 4)] * 5 + [(3, 4)], names=[f"slice_{i}.npy" for i in range(5)] + ["x/y.npy"], dtype=">u2"
    )
    ds = npydask.open_dataset(tmp_path)
    out = ds.to_xarray()
    assert isinstance(out, xr.DataArray) and out.name == "data"
    assert out.dims == ("file", "dim_0", "dim_1")
    assert out.data.name == ds.stack().name and out.data.chunks == ds.stack().chunks
    assert out["file"].values.tolist() == [f"slice_{i}.npy" for i in range(5)] + ["x/y.npy"]
    assert out.attrs == {"npy_version": "1.0", "order": "C"}
    np.testing.assert_array_equal(out.values, np.stack(list(arrays.values())))
    named = ds[1:3].to_xarray(dims=["y", "x"], name="scan")
    assert named.name == "scan" and named.dims == ("file", "y", "x")
    assert named["file"].values.tolist() == ["slice_1.npy", "slice_2.npy"]
    assert ds.to_xarray(dims=["n", "y", "x"]).dims == ("n", "y", "x")
    roi = npydask.open_dataset(tmp_path, roi_start=[1, 1]).to_xarray()
    np.testing.assert_array_equal(roi.values, np.stack(list(arrays.values()))[:, 1:, 1:])
    with pytest.raises(ValueError, match="empty dataset"):
        ds[[]].to_xarray()


def test_mixed_versions_and_orders_are_listed_in_attrs(tmp_path):
    import numpy.lib.format as fmt

    a = np.arange(6.0).reshape(2, 3)
    for name, version, order in [("a.npy", (1, 0), "C"), ("b.npy", (2, 0), "F"), ("c.npy", (3, 0), "C")]:
        with open(tmp_path / name, "wb") as f:
            fmt.write_array(f, np.array(a, order=order), version=version)
    ds = open_npy(tmp_path)
    assert ds["data"].attrs == {"npy_version": "1.0, 2.0, 3.0", "order": "C, F"}
    np.testing.assert_array_equal(ds["data"].values, np.stack([a, a, a]))


# -- object storage -------------------------------------------------------------------------------


def test_object_store_file_archive_and_prefix(s3, tmp_path):  # noqa: F811
    space = s3.space()
    a = np.arange(60, dtype=">f4").reshape(6, 10)
    s3.put_npy(f"{space}/one.npy", a)
    for i in range(3):
        s3.put_npy(f"{space}/dir/{i}.npy", (a + i).astype(a.dtype))
    import io

    buf = io.BytesIO()
    np.savez(buf, x=a, y=np.arange(4))
    s3.put(f"{space}/pair.npz", buf.getvalue())
    so = s3.options
    ds = open_npy(f"s3://{space}/one.npy", storage_options=so, chunks={})
    assert ds.encoding["source"] == f"s3://{space}/one.npy"
    np.testing.assert_array_equal(ds["data"].isel(dim_1=slice(2, 5)).compute().values, a[:, 2:5])
    pair = open_npy(f"s3://{space}/pair.npz", storage_options=so)
    np.testing.assert_array_equal(pair["x"].values, a)
    np.testing.assert_array_equal(pair["y"].values, np.arange(4))
    for prefix in (f"s3://{space}/dir/", f"s3://{space}/dir"):
        folder = open_npy(prefix, storage_options=so, roi_start=[1, 0], roi_shape=[2, 10])
        assert folder["file"].values.tolist() == ["0.npy", "1.npy", "2.npy"]
        np.testing.assert_array_equal(folder["data"].values, np.stack([a[1:3] + i for i in range(3)]))
    joined = npydask.open_dataset(f"s3://{space}/", recursive=True, storage_options=so).to_xarray()
    assert joined["file"].values.tolist() == ["dir/0.npy", "dir/1.npy", "dir/2.npy", "one.npy"]
    np.testing.assert_array_equal(joined.sel(file="one.npy").values, a)

    local = tmp_path / "local.npy"
    np.save(local, a)
    with pytest.raises(ValueError, match="storage_options apply to object-store URLs.*local.npy"):
        open_npy(local, storage_options=so)


@pytest.mark.slow
def test_datasets_compute_on_a_cluster_of_processes(tmp_path):
    """The lazy arrays travel to worker processes as paths and facts and are read there."""
    from distributed import Client, LocalCluster

    a = np.arange(40 * 16 * 8, dtype=">f8").reshape(40, 16, 8)
    np.save(tmp_path / "v.npy", np.asfortranarray(a))
    arrays = make_folder(tmp_path / "f", [(6, 5)] * 30)
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
        dask.config.set({"array.chunk-size": "8KiB"}),
    ):
        one = open_npy(tmp_path / "v.npy", chunks={})["data"]
        assert math.prod(one.data.numblocks) > 4
        np.testing.assert_array_equal(one.isel(dim_2=slice(1, 7, 2)).compute().values, a[:, :, 1:7:2])
        folder = open_npy(tmp_path / "f", chunks={}, roi_start=[1, 1])["data"]
        np.testing.assert_array_equal(folder.compute().values, np.stack(list(arrays.values()))[:, 1:, 1:])
        lazy = open_npy(tmp_path / "v.npy", chunks=None)["data"]  # no dask: xarray's lazy array, pickled to a worker
        got = client.submit(lambda v: v.isel(dim_0=3).values, lazy).result()
        np.testing.assert_array_equal(got, a[3])
        assert client.run(lambda: "npydask.xarray" in sys.modules) == {
            w: True for w in client.scheduler_info()["workers"]
        }
