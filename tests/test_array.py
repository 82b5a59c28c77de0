"""from_npy: lazy arrays equal to numpy.load, tiny tasks, deterministic names, changed files."""

from __future__ import annotations

import os
import pickle
import time

import dask
import dask.array as da
import numpy as np
import pytest
from dask.array.utils import assert_eq
from hypothesis import given
from hypothesis import strategies as st

import npydask
from npydask.array import NpyFileArray
from npydask.plan.chunks import auto_chunks
from npydask.plan.region import split_index

DTYPES = ["<f4", ">f8", "<i2", ">u4", "?", "c8", ">c16", "M8[s]", "m8[us]", "S3", "U2", "f2"]
STRUCT = np.dtype([("a", "<f4", (2,)), ("b", ">i8"), ("c", "S3")])


def random_array(shape, dtype, seed=0):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw = raw % 2
    return np.frombuffer(raw.tobytes(), dtype=dtype).reshape(shape)


def same(a, b):
    """Equal values (bytewise, so NaNs compare), dtype incl. byte order, and shape."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.dtype.str == b.dtype.str, (a.dtype, b.dtype)
    assert a.shape == b.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", DTYPES + [STRUCT], ids=str)
def test_from_npy_equals_numpy(save, order, dtype):
    a = random_array((7, 5, 6), dtype)
    p = save(a, order=order)
    x = npydask.from_npy(p, chunks=(3, 2, 4))
    assert x.dtype == np.load(p).dtype
    same(x.compute(), np.load(p))
    same(x[1:6, ::2, 5].compute(), np.load(p)[1:6, ::2, 5])
    same(x[::-2, -1].compute(), np.load(p)[::-2, -1])


@pytest.mark.parametrize("backend", ["auto", "mmap", "pread"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_every_chunk_has_promised_shape_and_dtype(save, backend, order):
    a = np.arange(13 * 11 * 3, dtype=">f4").reshape(13, 11, 3)
    p = save(a, order=order)
    x = npydask.from_npy(p, chunks=(4, 5, 2), backend=backend)
    assert_eq(x, np.load(p), check_chunks=True)
    assert_eq(x.sum(axis=1), np.load(p).sum(axis=1), check_chunks=True)


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 3), (1,), (1, 1, 1)])
def test_zero_d_and_empty(save, shape):
    a = random_array(shape, "<i4")
    p = save(a)
    x = npydask.from_npy(p)
    assert x.shape == shape
    same(x.compute(), np.load(p))


def test_auto_chunks_are_contiguous_in_the_file():
    f4 = np.dtype("f4")
    assert auto_chunks((64, 256, 256), f4, False, 128 << 20) == (64, 256, 256)
    assert auto_chunks((64, 256, 256), f4, False, 1 << 20) == (4, 256, 256)
    # a single row over the limit: split the last axis, slower axes by one
    assert auto_chunks((3, 1000), np.dtype("f8"), False, 1000) == (1, 125)
    # Fortran files keep their leading (fastest) axes whole
    assert auto_chunks((256, 256, 64), f4, True, 1 << 20) == (256, 256, 4)
    # 10 rows in pieces of at most 4: three pieces of 4, 4 and 2
    assert auto_chunks((10, 100), np.dtype("u1"), False, 400) == (4, 100)
    assert auto_chunks((0, 5), f4, False, 10) == (0, 5)


def test_auto_chunks_follow_dask_chunk_size(save):
    p = save(np.zeros((64, 64, 64), "f4"))
    with dask.config.set({"array.chunk-size": "64KiB"}):
        x = npydask.from_npy(p)
    assert x.chunks[1:] == ((64,), (64,))
    assert set(x.chunks[0]) == {4}
    y = npydask.from_npy(p, chunks="256KiB")
    assert set(y.chunks[0]) == {16}
    f = save(np.zeros((64, 64, 64), "f4"), order="F")
    z = npydask.from_npy(f, chunks="256KiB")
    assert z.chunks[:2] == ((64,), (64,)) and set(z.chunks[2]) == {16}


@pytest.mark.parametrize("chunks", [5, (3, -1), ((2, 8), (4, 6)), "auto", "1KiB", ("auto", 5)])
def test_chunks_take_what_normalize_chunks_takes(save, chunks):
    a = random_array((10, 10), "<f8")
    p = save(a)
    x = npydask.from_npy(p, chunks=chunks)
    same(x.compute(), a)


def test_bad_arguments(save, tmp_path):
    p = save(np.zeros(3))
    with pytest.raises(ValueError, match="backend"):
        npydask.from_npy(p, backend="fast")
    with pytest.raises(ValueError, match="device"):
        npydask.from_npy(p, device="tpu")
    with pytest.raises(ValueError, match="chunks"):
        npydask.from_npy(p, chunks="lots")
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        npydask.from_npy(tmp_path / "nope.npy")
    with pytest.raises(IsADirectoryError):
        npydask.from_npy(tmp_path)
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not an npy file at all")
    with pytest.raises(npydask.NpyFormatError, match="bad.npy"):
        npydask.from_npy(bad)


def test_gpu_without_cupy_says_how_to_install(save, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cupy" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'npydask\[gpu-cu12\]'"):
        npydask.from_npy(save(np.zeros(3)), device="gpu")


def test_name_is_deterministic_and_tracks_the_file(save):
    p = save(np.arange(10.0))
    a, b = npydask.from_npy(p, chunks=5), npydask.from_npy(p, chunks=5)
    assert a.name == b.name
    assert npydask.from_npy(p, chunks=2).name != a.name
    assert npydask.from_npy(p, chunks=5, backend="pread").name != a.name
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert npydask.from_npy(p, chunks=5).name != a.name


def test_changed_file_fails_the_task_naming_the_file(save):
    p = save(np.arange(10.0))
    x = npydask.from_npy(p, chunks=5)
    np.save(p, np.arange(10.0) + 1)  # same size, new mtime (and maybe new inode)
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(npydask.FileChangedError, match=os.path.basename(p)):
        x.compute()
    # opening again reads the new contents
    same(npydask.from_npy(p, chunks=5).compute(), np.arange(10.0) + 1)


def test_truncated_file_fails_the_task(save):
    p = save(np.arange(1000.0))
    x = npydask.from_npy(p, chunks=100, backend="mmap")
    with open(p, "r+b") as f:
        f.truncate(500)
    with pytest.raises(npydask.FileChangedError, match=os.path.basename(p)):
        x.compute()


def test_tasks_are_tiny_and_carry_no_data(save):
    p = save(np.zeros((1000, 100), "f8"))
    x = npydask.from_npy(p, chunks=(10, 100))
    graph = dict(x.__dask_graph__())
    assert len(graph) == 100
    for key, task in graph.items():
        blob = pickle.dumps(task, protocol=5)
        assert len(blob) < 2048, (key, len(blob))
    # the array-like itself: path, identity, header, settings; no open file, no mapping
    source = NpyFileArray(npydask.reader.FileRef.open(p))
    assert len(pickle.dumps(source)) < 1024
    assert not hasattr(source, "copy")
    assert not isinstance(source, np.ndarray)


def test_build_reads_only_the_header(save, monkeypatch, tmp_path):
    """Building over a 4 GiB (sparse) file costs what it costs for a small one: no payload reads."""
    big = tmp_path / "big.npy"
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, "f4"))
    header["shape"] = (1 << 30,)
    with open(big, "wb") as f:
        np.lib.format.write_array_header_2_0(f, header)
        f.truncate(f.tell() + 4 * (1 << 30))
    calls = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: calls.append(n) or real(fd, n, off))
    t0 = time.perf_counter()
    x = npydask.from_npy(big, chunks="128MiB")
    assert time.perf_counter() - t0 < 1.0
    assert x.shape == (1 << 30,) and x.numblocks == (32,)
    assert sum(calls) <= 8192


@given(
    shape=st.lists(st.integers(0, 6), min_size=1, max_size=4).map(tuple),
    data=st.data(),
)
def test_split_index_matches_numpy(shape, data):
    a = np.arange(int(np.prod(shape))).reshape(shape)
    index = []
    for n in shape:
        kind = data.draw(st.sampled_from(["slice", "int", "full"]))
        if kind == "int" and n:
            index.append(data.draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            index.append(
                slice(
                    data.draw(st.none() | st.integers(-n - 2, n + 2)),
                    data.draw(st.none() | st.integers(-n - 2, n + 2)),
                    data.draw(st.none() | st.sampled_from([1, 2, 3, -1, -2])),
                )
            )
        else:
            index.append(slice(None))
    index = tuple(index)
    box, post = split_index(index, shape)
    block = a[tuple(slice(lo, hi) for lo, hi in zip(box.start, box.stop))]
    np.testing.assert_array_equal(block[post] if post else block, a[index])
    assert np.prod(box.shape) <= max(a.size, 1)


def test_split_index_refuses_fancy_and_out_of_range():
    with pytest.raises(IndexError):
        split_index(([0, 1],), (3,))
    with pytest.raises(IndexError):
        split_index((3,), (3,))
    with pytest.raises(IndexError):
        split_index((0, 0), (3,))
    box, post = split_index((Ellipsis, 1), (2, 3, 4))
    assert box.start == (0, 0, 1) and box.stop == (2, 3, 2)
    assert np.arange(24).reshape(2, 3, 4)[..., 1:2][post].shape == (2, 3)


def test_query_planning_engine_matches_config():
    """The suite runs twice in CI: once per engine; this records which one this run used."""
    expected = os.environ.get("DASK_ARRAY__QUERY_PLANNING", "").lower() in ("1", "true")
    assert da.array_expr_enabled() == expected


# -- what a dask user tries first: several files through from_npy ------------------------------


@pytest.mark.parametrize("several", [list, tuple])
def test_from_npy_of_a_list_points_to_open_dataset(tmp_path, several):
    paths = [str(tmp_path / f"{i}.npy") for i in range(3)]
    for i, p in enumerate(paths):
        np.save(p, np.full((2, 3), i, "<i4"))
    with pytest.raises(TypeError) as info:
        npydask.from_npy(several(paths))
    message = str(info.value)
    assert "one file" in message and "npydask.open_dataset(files=" in message and paths[0] in message
    assert ".stack()" in message
    # the advice, followed, gives what the user wanted
    stacked = npydask.open_dataset(files=paths).stack().compute()
    np.testing.assert_array_equal(stacked, np.stack([np.load(p) for p in paths]))


@pytest.mark.parametrize(
    ("pattern", "root", "file_filter", "recursive"),
    [
        ("data/*.npy", "data", "*.npy", False),
        ("data/scan_??.npy", "data", "scan_??.npy", False),
        ("data/[ab]*.npy", "data", "[ab]*.npy", False),
        ("*.npy", ".", "*.npy", False),
        ("data/*/*.npy", "data", "*.npy", True),
        ("data/**/*.npy", "data", "*.npy", True),
    ],
)
def test_from_npy_of_a_glob_points_to_open_dataset(tmp_path, monkeypatch, pattern, root, file_filter, recursive):
    (tmp_path / "data" / "sub").mkdir(parents=True)
    for name in ["a0.npy", "b1.npy", "sub/a2.npy"]:
        np.save(tmp_path / "data" / name, np.zeros(2))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        npydask.from_npy(pattern)
    message = str(info.value)
    call = f"npydask.open_dataset({root!r}, file_filter={file_filter!r}"
    assert (call + (", recursive=True)" if recursive else ")")) in message, message
    assert f"files=sorted(glob.glob({pattern!r}))" in message
    assert pattern in message


def test_from_npy_a_file_whose_name_looks_like_a_glob_is_read(tmp_path):
    a = np.arange(5.0)
    p = tmp_path / "weird[1]*?.npy"
    np.save(p, a)
    np.testing.assert_array_equal(npydask.from_npy(p).compute(), a)
    with pytest.raises(FileNotFoundError) as info:  # a plain missing file gets no glob advice
        npydask.from_npy(tmp_path / "missing.npy")
    assert "open_dataset" not in str(info.value)


# -- the graph: one layer built directly (npydask.graph.build), the same under both array engines --------


def test_from_npy_builds_its_graph_without_from_array(save, monkeypatch):
    """The graph is built directly (dask's from_array spent most of from_npy's time); values still equal numpy."""
    a = np.arange(60.0).reshape(6, 10)
    p = save(a)
    npydask.from_npy(p)  # (the one-time check against from_array runs before the patch)

    def refuse(*args, **kwargs):
        raise AssertionError("from_npy called dask.array.from_array")

    monkeypatch.setattr(da, "from_array", refuse)
    x = npydask.from_npy(p, chunks=(4, 5))
    assert_eq(x, a, check_chunks=True)


@pytest.mark.parametrize("backend", ["auto", "pread"])
def test_graph_is_one_layer_of_tiny_tasks(save, backend):
    a = np.arange(60.0).reshape(6, 10)
    p = save(a)
    x = npydask.from_npy(p, chunks=(4, 5), backend=backend)
    graph = dict(x.__dask_graph__())
    assert set(graph) == {(x.name, i, j) for i in range(2) for j in range(2)}
    if not da.array_expr_enabled():
        assert list(x.dask.layers) == [x.name] and x.dask.dependencies == {x.name: set()}
    task = graph[(x.name, 1, 1)]
    source, region = (arg.value for arg in task.args)
    assert isinstance(source, NpyFileArray) and source.ref.path == os.path.abspath(p)
    assert region == (slice(4, 6, None), slice(5, 10, None))
    assert_eq(x, a, check_chunks=True)  # (validates x.dask: keys, layers, chunk shapes and dtypes)


def test_name_is_the_same_rebuilt_and_under_either_engine(save):
    """Same file and arguments, same name: rebuilt in this process, and in processes running either engine."""
    import subprocess
    import sys

    p = save(np.arange(12.0).reshape(3, 4))
    x = npydask.from_npy(p, chunks=(2, 4))
    assert npydask.from_npy(p, chunks=(2, 4)).name == x.name
    code = "import sys, npydask; print(npydask.from_npy(sys.argv[1], chunks=(2, 4)).name)"
    names = set()
    for engine in ("False", "True"):
        env = dict(os.environ, DASK_ARRAY__QUERY_PLANNING=engine)
        run = subprocess.run([sys.executable, "-c", code, p], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        names.add(run.stdout.strip())
    assert names == {x.name}
    assert x.name.startswith("npy-")


@pytest.mark.parametrize("chunks", [(4, 5), (6, 10)])
def test_pickled_array_and_graph_compute_equal(save, chunks):
    a = np.arange(60, dtype=">i4").reshape(6, 10)
    p = save(a)
    x = npydask.from_npy(p, chunks=chunks)
    y = pickle.loads(pickle.dumps(x, protocol=5))
    assert y.name == x.name and y.chunks == x.chunks
    same(y.compute(), a)
    graph = pickle.loads(pickle.dumps(dict(x.__dask_graph__()), protocol=5))
    from dask.local import get_sync

    blocks = get_sync(graph, list(graph))
    assert sum(b.size for b in blocks) == a.size


def test_optimize_fuses_reads_with_what_follows(save):
    """dask.optimize treats the reads as from_array's: under the legacy engine they fuse into the next task."""
    a = np.arange(60.0).reshape(6, 10)
    p = save(a)
    x = npydask.from_npy(p, chunks=(3, 10))
    y = (2 * x + 1)[1:5]
    (optimized,) = dask.optimize(y)
    same(optimized.compute(), (2 * a + 1)[1:5])
    if not da.array_expr_enabled():
        graph = dict(optimized.__dask_graph__())
        assert not any(isinstance(k, tuple) and k[0] == x.name for k in graph)  # no read left on its own
        work = [task for task in graph.values() if type(task).__name__ != "Alias"]
        assert len(work) == 2  # one task per chunk of y: read, scale, shift and slice together
    with dask.config.set({"optimization.fuse.active": False}):
        same(dask.optimize(y)[0].compute(), (2 * a + 1)[1:5])


def test_stacked_files_graph_validates_and_pickles(tmp_path):
    """Many files: open_dataset's stack holds its source under one key (the same builder, inline=False)."""
    arrays = [np.full((4, 3), i, "<f4") for i in range(5)]
    paths = []
    for i, arr in enumerate(arrays):
        paths.append(str(tmp_path / f"{i}.npy"))
        np.save(paths[-1], arr)
    x = npydask.open_dataset(files=paths).stack()
    assert_eq(x, np.stack(arrays))
    y = pickle.loads(pickle.dumps(x))
    same(y.compute(), np.stack(arrays))
    per_file = da.stack([npydask.from_npy(p) for p in paths])
    assert_eq(per_file, np.stack(arrays))
    same(per_file.sum().compute(), np.stack(arrays).sum())
