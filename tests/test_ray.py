"""Ray: the Ray Data datasource (``npydask.ray.read_npy``) and npydask graphs under ``ray_dask_get``.

Ray is the ``ray`` extra (and in the ``test`` extra, so CI runs these); they
skip, saying why, where Ray is not installed. One local Ray instance serves
the module (2 CPUs, no dashboard). Ray's dask integration imports
``dask.dataframe`` (pandas and pyarrow), and importing it replaces
``dask.persist``; the fixture puts that back.
"""

from __future__ import annotations

import os
import threading
import warnings

import dask
import dask.array as da
import numpy as np
import pytest

import npydask

pytestmark = pytest.mark.slow  # Ray starts its own cluster of processes (~10-15 s)


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance for the module."""
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'npydask[ray]')")
    import ray

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        import ray.data

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # (Ray's own, about settings we do not touch)
            ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_get(ray_session):
    persist, mixin_persist = dask.persist, dask.base.DaskMethodsMixin.persist
    ray = ray_session

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from ray.util.dask import ray_dask_get
    except Exception as e:  # an incompatible dask breaks Ray's import of its dask internals
        dask.persist, dask.base.DaskMethodsMixin.persist = persist, mixin_persist
        pytest.skip(f"Ray {ray.__version__} cannot import its dask scheduler with dask {dask.__version__}: {e!r}")
    try:
        try:
            probe = da.ones(4, chunks=2).sum().compute(scheduler=ray_dask_get)
        except Exception as e:
            pytest.skip(f"Ray {ray.__version__} cannot run a trivial dask {dask.__version__} graph: {e!r}")
        if probe != 4:
            pytest.skip(f"Ray {ray.__version__} with dask {dask.__version__} computes da.ones(4).sum() as {probe!r}")
        yield ray_dask_get
    finally:
        dask.persist, dask.base.DaskMethodsMixin.persist = persist, mixin_persist


def test_from_npy_under_ray(ray_get, tmp_path):
    a = np.random.default_rng(0).standard_normal((40, 30)).astype(">f8")
    np.save(tmp_path / "a.npy", a)
    x = npydask.from_npy(tmp_path / "a.npy", chunks=(7, 30))
    assert np.isclose(x.sum().compute(scheduler=ray_get), a.sum())
    np.testing.assert_array_equal(x[3:33:2].compute(scheduler=ray_get), a[3:33:2])


def test_open_dataset_stack_under_ray(ray_get, tmp_path):
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 1000, (5, 6), dtype="<i4") for _ in range(9)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"f{i}.npy", a)
    stacked = npydask.open_dataset(str(tmp_path)).stack()
    np.testing.assert_array_equal(stacked.compute(scheduler=ray_get), np.stack(arrays))


def test_to_zarr_under_ray(ray_get, tmp_path):
    zarr = pytest.importorskip("zarr", minversion="3.0")
    from npydask.write.zarr import to_zarr

    a = np.arange(300, dtype="<f4").reshape(30, 10)
    np.save(tmp_path / "a.npy", a)
    lazy = to_zarr(
        npydask.from_npy(tmp_path / "a.npy", chunks=(7, 10)),
        str(tmp_path / "a.zarr"),
        shards=(10, 10),
        chunks=(5, 5),
        compute=False,
    )
    assert lazy.compute(scheduler=ray_get) is None
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...], a)


# -- the Ray Data datasource: npydask.ray.read_npy ---------------------------------------------------


def _rows(ds, column="data", index="index"):
    """Every row of a Ray dataset, ordered by its index column: (indices, list of arrays)."""
    rows = sorted(ds.take_all(), key=lambda r: r[index])
    return [r[index] for r in rows], [r[column] for r in rows], rows


def _save_all(root, arrays, fmt="f{:02d}.npy"):
    for i, a in enumerate(arrays):
        np.save(os.path.join(root, fmt.format(i)), a)


@pytest.mark.parametrize("dtype", ["<f4", ">i2", "u1", "?", "<f2", "<U3"])
def test_read_npy_rows_equal_numpy_load(ray_session, tmp_path, dtype):
    import npydask.ray

    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 100, (3, 5)).astype(dtype) for _ in range(7)]
    arrays[2] = np.asfortranarray(arrays[2])
    _save_all(tmp_path, arrays)
    ds = npydask.ray.read_npy(tmp_path, path_column="path", block_size=2 * arrays[0].nbytes)
    ids, got, rows = _rows(ds)
    assert ids == list(range(7))
    want = [np.load(tmp_path / f"f{i:02d}.npy") for i in range(7)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype.newbyteorder("=") and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    assert [r["path"] for r in rows] == npydask.open_dataset(tmp_path).files


def test_read_npy_passes_headers_first_through(ray_session, tmp_path):
    import npydask.ray
    from npydask.errors import FileChangedError, NpyFormatError

    arrays = [np.full((3, 5), i, "<f4") for i in range(6)]
    _save_all(tmp_path, arrays)
    with pytest.raises(ValueError, match="'all'.*'first'"):
        npydask.ray.read_npy(tmp_path, headers="bad")
    ids, got, _ = _rows(npydask.ray.read_npy(tmp_path, headers="first", block_size=2 * arrays[0].nbytes))
    assert ids == list(range(6))
    np.testing.assert_array_equal(np.stack(got), np.stack(arrays))
    ds = npydask.ray.read_npy(tmp_path, headers="first")
    np.save(tmp_path / "f04.npy", np.zeros((3, 6), "<f4"))  # another header, in place: seen where it is read
    with pytest.raises(Exception, match="f04.npy") as e:
        ds.take_all()  # (the file changed since the listing began: its ctime tells first)
    assert FileChangedError.__name__ in str(e.value) or isinstance(e.value, FileChangedError)
    ds = npydask.ray.read_npy(tmp_path, headers="first")
    with pytest.raises(Exception, match="f04.npy") as e:
        ds.take_all()
    assert NpyFormatError.__name__ in str(e.value) or isinstance(e.value, NpyFormatError)


def test_read_tasks_follow_block_size_and_carry_their_files_only(tmp_path):
    """Pure planning (no Ray cluster): groups as plan_groups makes them; metadata from the headers."""
    pytest.importorskip("ray.data")
    import npydask.ray

    _save_all(tmp_path, [np.full((4, 8), i, "<f8") for i in range(10)])  # 256 bytes each
    ds = npydask.open_dataset(tmp_path)
    source_class = npydask.ray.NpyDatasource
    for block_size, n_tasks in [(100, 10), (1 << 20, 1), ("1KiB", 3), ("600B", 5)]:
        tasks = source_class(
            ds,
            column="data",
            index_column="index",
            path_column=None,
            concatenate=False,
            axis=0,
            block_size=block_size,
            override_num_blocks=None,
        ).get_read_tasks(200)
        assert len(tasks) == n_tasks, block_size
        assert sum(t.metadata.num_rows for t in tasks) == 10
        files = [f for t in tasks for f in t.metadata.input_files]
        assert files == ds.files  # each task names only its own files, in order, once
        assert all(len(t.read_fn.group.views) == t.metadata.num_rows for t in tasks)
        assert sum(t.metadata.size_bytes for t in tasks) == 10 * (256 + 8)
    tasks = source_class(
        ds,
        column="data",
        index_column=None,
        path_column=None,
        concatenate=False,
        axis=0,
        block_size="128MiB",
        override_num_blocks=3,
    ).get_read_tasks(3)
    assert [t.metadata.num_rows for t in tasks] == [3, 4, 3]  # override_num_blocks wins over block_size
    table = tasks[1].read_fn()[0]
    assert table.column_names == ["data"]
    np.testing.assert_array_equal(table.column("data").combine_chunks().to_numpy(), ds.stack()[3:7].compute())


def test_blocks_share_the_read_buffer(tmp_path):
    """The tensor column is built on the C-contiguous block without a copy."""
    pytest.importorskip("ray.data")
    from npydask.ray._columns import tensor_column

    block = np.arange(2 * 3 * 4, dtype="<i4").reshape(2, 3, 4)
    column = tensor_column(block)
    assert column.buffers()[-1].address == block.ctypes.data
    np.testing.assert_array_equal(column.to_numpy(), block)


def test_count_and_schema_read_no_payload(ray_session, tmp_path):
    """After opening, every file loses its payload: count() and schema() still answer; a read names the file."""
    import npydask.ray

    _save_all(tmp_path, [np.full((16, 16), i, "<f4") for i in range(6)])
    ds = npydask.ray.read_npy(tmp_path, concatenate=False)
    for name in os.listdir(tmp_path):
        with open(tmp_path / name, "r+b") as f:
            f.truncate(200)  # the header stays, the payload is gone
    assert ds.count() == 6
    schema = ds.schema()
    assert schema.names == ["data", "index"]
    with pytest.raises(Exception, match="f00.npy|f0[0-5].npy"):
        ds.take_all()


def test_concatenate_splits_one_file_across_read_tasks(ray_session, tmp_path):
    import npydask.ray

    a = np.random.default_rng(4).standard_normal((1001, 3, 5)).astype("<f4")
    np.save(tmp_path / "big.npy", a)
    ds = npydask.ray.read_npy(tmp_path, concatenate=True, override_num_blocks=8, path_column="path")
    source = npydask.ray.NpyDatasource(
        npydask.open_dataset(tmp_path),
        column="data",
        index_column="index",
        path_column=None,
        concatenate=True,
        axis=0,
        block_size="128MiB",
        override_num_blocks=8,
    )
    tasks = source.get_read_tasks(8)
    assert len(tasks) == 8 and sum(t.metadata.num_rows for t in tasks) == 1001
    boxes = [(t.read_fn.box.start[0], t.read_fn.box.stop[0]) for t in tasks]
    assert boxes[0][0] == 0 and boxes[-1][1] == 1001 and all(b[1] == c[0] for b, c in zip(boxes, boxes[1:]))
    ids, got, rows = _rows(ds)
    assert ids == list(range(1001)) and {r["path"] for r in rows} == {str(tmp_path / "big.npy")}
    np.testing.assert_array_equal(np.stack(got), a)
    # block_size plans by bytes: 60 bytes a row, 6 KiB a task
    tasks = npydask.ray.NpyDatasource(
        npydask.open_dataset(tmp_path),
        column="data",
        index_column="index",
        path_column=None,
        concatenate=True,
        axis=0,
        block_size=6000,
        override_num_blocks=None,
    ).get_read_tasks(200)
    assert len(tasks) == 11 and max(t.metadata.num_rows for t in tasks) * 60 <= 6000


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate_joins_files_of_different_lengths(ray_session, tmp_path, axis):
    import npydask.ray

    rng = np.random.default_rng(5)
    arrays = []
    for n in (3, 0, 5, 2):
        shape = [4, 4, 4]
        shape[axis] = n
        arrays.append(rng.integers(-9, 9, shape).astype(">i4"))
    _save_all(tmp_path, arrays)
    joined = np.concatenate(arrays, axis=axis)
    for blocks in (1, 3, 10):
        ds = npydask.ray.read_npy(tmp_path, concatenate=True, axis=axis, override_num_blocks=blocks, path_column="p")
        ids, got, rows = _rows(ds)
        assert ids == list(range(joined.shape[axis]))
        np.testing.assert_array_equal(np.stack(got, axis=axis), joined)
        sources = [os.path.basename(r["p"]) for r in rows]
        assert sources == ["f00.npy"] * 3 + ["f02.npy"] * 5 + ["f03.npy"] * 2


def _numbered(root):
    """23 small files, each telling its number; and their dataset through Ray, a file a task."""
    import npydask.ray

    arrays = [np.full((2, 3), i, "<f4") + np.arange(6, dtype="<f4").reshape(2, 3) for i in range(23)]
    _save_all(root, arrays)
    return arrays, npydask.ray.read_npy(root, block_size=100)


def test_iter_torch_batches_delivers_every_sample_once(ray_session, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip(
        "pydantic", reason="Ray's iter_torch_batches imports ray.train, which needs pydantic (in npydask's test extra)"
    )
    arrays, ds = _numbered(tmp_path)
    seen = []
    for batch in ds.iter_torch_batches(batch_size=4):
        assert isinstance(batch["data"], torch.Tensor) and batch["data"].dtype == torch.float32
        for i, x in zip(batch["index"].tolist(), batch["data"].numpy()):
            np.testing.assert_array_equal(x, arrays[i])
            seen.append(i)
    assert sorted(seen) == list(range(23))


def test_streaming_split_delivers_every_sample_once(ray_session, tmp_path):
    arrays, ds = _numbered(tmp_path)
    splits = ds.streaming_split(2, equal=False)
    taken: list[list[int]] = [[], []]

    def consume(k):
        for batch in splits[k].iter_batches(batch_size=3):
            for i, x in zip(batch["index"].tolist(), batch["data"]):
                np.testing.assert_array_equal(x, arrays[i])
                taken[k].append(i)

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(taken[0] + taken[1]) == list(range(23))


def test_roi_shards_and_npz_key(ray_session, tmp_path):
    import npydask.ray

    rng = np.random.default_rng(6)
    arrays = [rng.integers(0, 1000, (6, 7)).astype("<i2") for _ in range(9)]
    _save_all(tmp_path, arrays)
    ds = npydask.ray.read_npy(tmp_path, roi_start=[1, 2], roi_shape=[3, 4], shard_id=1, num_shards=3)
    ids, got, _ = _rows(ds)
    assert ids == [3, 4, 5]  # (global ids: the shard's files are files 3..5 of the folder)
    for g, a in zip(got, arrays[3:6]):
        np.testing.assert_array_equal(g, a[1:4, 2:6])
    # a "pad" ROI reaching outside the files, with a fill value
    ids, got, _ = _rows(
        npydask.ray.read_npy(tmp_path, roi_start=[4, 5], roi_shape=[4, 4], out_of_bounds_policy="pad", fill_value=-1)
    )
    for g, a in zip(got, arrays):
        want = np.full((4, 4), -1, "<i2")
        want[:2, :2] = a[4:, 5:]
        np.testing.assert_array_equal(g, want)

    npz = tmp_path / "z"
    npz.mkdir()
    for i in range(4):
        np.savez(npz / f"s{i}.npz", x=np.full((2, 2), i, "<f8"), y=np.arange(i + 1))
    ids, got, _ = _rows(npydask.ray.read_npy(npz, file_filter="*.npz", key="x"))
    np.testing.assert_array_equal(np.stack(got), np.stack([np.full((2, 2), i, "<f8") for i in range(4)]))
    # members of different lengths: variable-shaped tensor rows
    ids, got, _ = _rows(npydask.ray.read_npy(npz, file_filter="*.npz", key="y", block_size=1))
    assert [g.tolist() for g in got] == [list(range(i + 1)) for i in range(4)]


def test_files_of_different_shapes_are_variable_shaped_rows(ray_session, tmp_path):
    import npydask.ray

    arrays = [np.arange(n * 3, dtype="<f8").reshape(n, 3) for n in (2, 5, 1, 4)]
    _save_all(tmp_path, arrays)
    ds = npydask.ray.read_npy(tmp_path, block_size=1 << 20)
    ids, got, _ = _rows(ds)
    for g, a in zip(got, arrays):
        np.testing.assert_array_equal(g, a)


def test_remote_urls_read_through_ray(ray_session, tmp_path, http_server):
    import npydask.ray

    arrays = [np.full((3, 3), i, "<u2") for i in range(5)]
    _save_all(tmp_path, arrays)
    server = http_server(tmp_path)
    ds = npydask.ray.read_npy(files=[server.url(f"f{i:02d}.npy") for i in range(5)], path_column="url")
    ids, got, rows = _rows(ds)
    np.testing.assert_array_equal(np.stack(got), np.stack(arrays))
    assert rows[0]["url"] == server.url("f00.npy")


@pytest.mark.parametrize(
    ("dtype", "hint"),
    [
        ("<c8", "a.view('float32').reshape(*a.shape, 2)"),
        ("<c16", "a.view('float64')"),
        ("<M8[s]", "a.view('int64')"),
        ("<m8[ms]", "a.view('int64')"),
        ([("a", "<i4"), ("b", "<f8")], "a['field']"),
        ("|V6", "a.view('uint8').reshape(*a.shape, 6)"),
        ("|S4", "a.view('uint8').reshape(*a.shape, 4)"),
        (np.longdouble, "a.astype('float64')"),
    ],
)
def test_dtypes_arrow_cannot_hold_are_refused_naming_a_view(tmp_path, dtype, hint):
    pytest.importorskip("ray.data")
    import npydask.ray

    dt = np.dtype(dtype)
    if dt.kind == "f" and dt.itemsize <= 8:
        pytest.skip("longdouble is float64 on this platform")
    np.save(tmp_path / "a.npy", np.zeros(3, dt))
    with pytest.raises(TypeError) as info:
        npydask.ray.read_npy(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "a.npy") in message and hint in message and "no tensor type" in message
    assert (dt.name if dt.fields is None else "('a', '<i4')") in message


def test_gpu_and_bad_arguments_are_refused(tmp_path):
    pytest.importorskip("ray.data")
    import npydask.ray

    np.save(tmp_path / "a.npy", np.zeros((2, 2)))
    with pytest.raises(ValueError, match="device='gpu'.*iter_torch_batches"):
        npydask.ray.read_npy(tmp_path, device="gpu")
    ds = npydask.open_dataset(tmp_path)
    for kwargs, match in [
        ({"block_size": 0}, "block_size must be"),
        ({"block_size": "lots"}, "lots"),
        ({"override_num_blocks": 0}, "override_num_blocks must be"),
        ({"concatenate": True, "axis": 2}, "axis 2 is out of range"),
        ({"index_column": "data"}, "must differ"),
    ]:
        with pytest.raises(ValueError, match=match):
            ds.to_ray(**kwargs)
    np.save(tmp_path / "b.npy", np.zeros((2, 3)))
    with pytest.raises(ValueError, match="cannot concatenate along axis 0"):
        npydask.open_dataset(tmp_path).to_ray(concatenate=True)


def test_ray_remote_args_reach_read_tasks_without_ray_deprecation_warnings(ray_session, tmp_path):
    import npydask.ray

    _save_all(tmp_path, [np.full(4, i, "<i8") for i in range(3)])
    ds = npydask.ray.read_npy(tmp_path, ray_remote_args={"num_cpus": 0.5, "memory": 1 << 20})
    ids, got, _ = _rows(ds)  # (pytest turns Ray's RayDeprecationWarning into an error)
    np.testing.assert_array_equal(np.stack(got), np.stack([np.full(4, i, "<i8") for i in range(3)]))


@pytest.mark.parametrize(
    ("shapes", "dtype", "options"),
    [
        ([(3, 4)] * 3, ">f8", {}),  # fixed-shape tensors, from big-endian files
        ([(5,)] * 3, "<i2", {"concatenate": True}),  # rows of one element: a plain Arrow column
        ([(2, 3), (4, 3)], "?", {}),  # rows of different shapes: variable-shaped tensors
        ([(2, 3), (4, 3)], "<u4", {"concatenate": True, "axis": 0, "path_column": "p"}),
        ([()] * 4, "<f4", {}),  # 0-d files
    ],
)
def test_schema_from_headers_is_the_blocks_schema(ray_session, tmp_path, shapes, dtype, options):
    import npydask.ray

    arrays = [np.arange(int(np.prod(s)), dtype="i8").reshape(s).astype(dtype) for s in shapes]
    _save_all(tmp_path, arrays)
    ds = npydask.ray.read_npy(tmp_path, block_size=1, **options)
    planned = ds.schema()
    materialized = ds.materialize()
    assert materialized.schema() == planned
    ids, got, _ = _rows(materialized)
    if options.get("concatenate"):
        np.testing.assert_array_equal(np.stack(got), np.concatenate(arrays))
    else:
        for g, a in zip(got, arrays):
            np.testing.assert_array_equal(g, a)


def test_blocks_are_the_plans_tasks_not_split_further_by_ray(ray_session, tmp_path):
    """Without override_num_blocks Ray would cut each task's block to reach its guessed parallelism."""
    import npydask.ray

    a = np.arange(4096 * 1024, dtype="<f4").reshape(4096, 1024)  # 16 MiB: Ray would aim at 1 MiB blocks
    np.save(tmp_path / "a.npy", a)
    ds = npydask.ray.read_npy(tmp_path, concatenate=True, block_size="8MiB")
    done = ds.materialize()
    tasks = npydask.ray.NpyDatasource(
        npydask.open_dataset(tmp_path),
        column="data",
        index_column="index",
        path_column=None,
        concatenate=True,
        axis=0,
        block_size="8MiB",
        override_num_blocks=None,
    ).get_read_tasks(1)
    assert 2 <= len(tasks) <= 4 and done.num_blocks() == len(tasks)
    ids, got, _ = _rows(done)
    np.testing.assert_array_equal(np.stack(got), a)
    assert npydask.ray.read_npy(tmp_path, concatenate=True, override_num_blocks=7).materialize().num_blocks() == 7


@pytest.mark.timeout(600)
def test_ray_gives_one_column_per_member(ray_session, tmp_path):
    from _multikey import load_member, open_archives, write_archives

    import npydask.ray

    paths = write_archives(str(tmp_path), compressed=False)
    rds = npydask.ray.read_npy(
        str(tmp_path), file_filter="*.npz", key=["x", "m"], path_column="path", override_num_blocks=3
    )
    assert rds.schema().names == ["x", "m", "index", "path"]
    n = len(paths)
    assert rds.count() == n
    rows = sorted(rds.take_all(), key=lambda r: r["index"])
    assert [r["index"] for r in rows] == list(range(n))
    for i, row in enumerate(rows):
        assert row["path"] == paths[i]
        np.testing.assert_array_equal(row["x"], load_member(paths[i], "x"))
        np.testing.assert_array_equal(row["m"], load_member(paths[i], "m"))
    ds = open_archives(paths)
    batches = list(ds.to_ray(block_size="1KiB").iter_batches(batch_size=4, batch_format="numpy"))
    got = {k: np.concatenate([b[k] for b in batches]) for k in ("x", "y", "m")}
    order = np.argsort(np.concatenate([b["index"] for b in batches]))
    for k in ("x", "y", "m"):
        np.testing.assert_array_equal(got[k][order], np.stack([load_member(p, k) for p in paths]))
    with pytest.raises(ValueError, match="concatenate=True joins the files of one array"):
        ds.to_ray(concatenate=True)
    with pytest.raises(ValueError, match="must differ"):
        ds.to_ray(index_column="x")


def test_index_column_holds_global_ids_across_shards(ray_session, tmp_path):
    """Rows of every shard of one folder carry the file's position in the whole list: ids never collide."""
    import npydask.ray

    arrays = [np.full((2, 3), i, "<f4") for i in range(7)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"{i}.npy", a)
    seen = {}
    for shard in range(3):
        rows = npydask.ray.read_npy(str(tmp_path), shard_id=shard, num_shards=3).take_all()
        for row in rows:
            assert int(row["index"]) not in seen
            seen[int(row["index"])] = row["data"]
    assert sorted(seen) == list(range(7))
    for i, data in seen.items():
        np.testing.assert_array_equal(data, arrays[i])
    ds = npydask.open_dataset(str(tmp_path))
    assert ds.start_index == 0 and ds.shard(1, 3).start_index == 2 and ds[3:5].start_index == 3
    assert ds[[4, 1]].start_index is None and ds.shard(2, 3)[1:].start_index == 5
    import pickle

    assert pickle.loads(pickle.dumps(ds.shard(1, 3))).start_index == 2


def test_read_npy_takes_a_single_file_local_or_remote(ray_session, tmp_path, http_server):
    import npydask.ray

    arrays = [np.arange(12, dtype="<i4").reshape(3, 4) + 100 * i for i in range(3)]
    _save_all(tmp_path, arrays)
    for one in (tmp_path / "f01.npy", http_server(tmp_path).url("f02.npy")):
        ids, got, rows = _rows(npydask.ray.read_npy(one, path_column="path"))
        want = np.load(tmp_path / os.path.basename(str(one)))
        assert ids == [0] and len(got) == 1 and rows[0]["path"].endswith(os.path.basename(str(one)))
        np.testing.assert_array_equal(got[0], want)
    with pytest.raises(ValueError, match="is a file, so it is the only one read"):
        npydask.ray.read_npy(tmp_path / "f01.npy", files=["f00.npy"])
