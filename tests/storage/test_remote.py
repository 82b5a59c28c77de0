"""Object storage (npydask.storage.object) against a real S3 server (SeaweedFS): reads equal numpy.load.

Every check compares with ``numpy.load`` of the same object's bytes (fetched
with boto3, around npydask). The server is the session's ``s3_server``
(tests/conftest.py): ``weed server -s3`` on 127.0.0.1 with free ports.
"""

from __future__ import annotations

import io
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import npydask
from npydask.errors import FileChangedError, NpyDaskWarning, NpyFormatError, RoiError
from npydask.storage._stores import StoreSpec
from npydask.storage.base import Source
from npydask.storage.object import ObjectIdentity, ObjectSource, source_for
from npydask.testing.source_conformance import SourceConformance

pytest.importorskip("obstore")
boto3 = pytest.importorskip("boto3")


class Bucket:
    """One test's corner of a bucket: put arrays and bytes by name, get them back, replace and delete them."""

    def __init__(self, server: Any, bucket: str, prefix: str) -> None:
        self.server = server
        self.bucket = bucket
        self.prefix = prefix
        self.client = server.boto3_client()
        self.options = server.storage_options()

    def url(self, name: str = "") -> str:
        return f"s3://{self.bucket}/{self.prefix}{name}"

    def put_bytes(self, name: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data)
        return self.url(name)

    def put(self, name: str, array: np.ndarray) -> str:
        return self.put_bytes(name, npy_bytes(array))

    def get_bytes(self, url: str) -> bytes:
        key = url[len(f"s3://{self.bucket}/") :]
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def load(self, url: str) -> np.ndarray:
        return np.load(io.BytesIO(self.get_bytes(url)))

    def remove(self, url: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=url[len(f"s3://{self.bucket}/") :])


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.fixture
def bucket(s3_server: Any) -> Bucket:
    """A fresh prefix of the server's data bucket for one test."""
    return Bucket(s3_server, s3_server.bucket, f"t-{uuid.uuid4().hex[:12]}/")


class TestObjectSource(SourceConformance):
    """The conformance checks every source passes, on objects."""

    @pytest.fixture
    def source(self, bucket: Bucket) -> Source:
        self.b = bucket
        return source_for(StoreSpec.of(f"s3://{bucket.bucket}", bucket.options))

    @pytest.fixture
    def short_reads(self, source: ObjectSource, monkeypatch: pytest.MonkeyPatch) -> None:
        """Tiny parts and header reads: every region and header arrives in many 7-byte requests."""
        spec = source.spec._replace(settings=source.spec.settings._replace(part_bytes=7, header_bytes=64))
        monkeypatch.setattr(source, "spec", spec)

    def put(self, where: Path, name: str, array: np.ndarray) -> str:
        return self.b.put(name, array)

    def put_bytes(self, where: Path, name: str, data: bytes) -> str:
        return self.b.put_bytes(name, data)

    def remove(self, path: str) -> None:
        self.b.remove(path)

    def get_bytes(self, path: str) -> bytes:
        return self.b.get_bytes(path)

    def test_source_pickles_as_its_spec_and_is_shared(self, source: ObjectSource) -> None:
        again = pickle.loads(pickle.dumps(source))
        assert again is source
        assert source.mappable is False and source.concurrent is True
        assert source.gap_bytes == npydask.config.get("remote_gap_bytes") == 64 * 1024
        assert "secret" not in repr(source).lower()

    def test_clear_sources_forgets_the_sources_and_their_headers(self, source: ObjectSource) -> None:
        from npydask.storage.object import clear_sources

        url = self.b.put("a.npy", np.arange(5))
        source.open(url, source.identity(url))
        clear_sources()
        again = source_for(source.spec)
        assert again is not source and again == source and not again._files
        assert again.header(url).shape == (5,)


# -- public functions --------------------------------------------------------------------------

DTYPES = ["<f4", ">f8", "<i2", "|u1", "|b1", "<c16", ">i8", "<m8[s]"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_from_npy_and_read_region_equal_numpy(bucket: Bucket, dtype: str, order: str) -> None:
    rng = np.random.default_rng(3)
    values = np.asarray(rng.integers(0, 100, (9, 10, 11)), order=order).astype(dtype, order=order)
    url = bucket.put("v.npy", values)
    expected = bucket.load(url)
    x = npydask.from_npy(url, chunks=(4, 5, 11), storage_options=bucket.options)
    assert x.dtype == expected.dtype
    np.testing.assert_array_equal(x.compute(), expected)
    region = npydask.read_region(url, (2, 3, 1), (7, 9, 10), storage_options=bucket.options)
    np.testing.assert_array_equal(region, expected[2:7, 3:9, 1:10])
    assert region.flags.c_contiguous
    assert npydask.read_header(url, storage_options=bucket.options).shape == (9, 10, 11)


def test_structured_zero_d_and_empty(bucket: Bucket) -> None:
    cases = {
        "s.npy": np.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i4"), ("b", ">f8")]),
        "z.npy": np.array(7.5),
        "e.npy": np.zeros((0, 5), "<f4"),
    }
    for name, values in cases.items():
        url = bucket.put(name, values)
        x = npydask.from_npy(url, storage_options=bucket.options)
        np.testing.assert_array_equal(x.compute(), values)


def test_a_long_header_takes_a_second_request(bucket: Bucket) -> None:
    values = np.zeros(3, dtype=[(f"field_{i:04d}", "<i1") for i in range(400)])  # a header over 4 KiB
    url = bucket.put("long.npy", values)
    assert npydask.read_header(url, storage_options=bucket.options).data_offset > 4096
    np.testing.assert_array_equal(npydask.from_npy(url, storage_options=bucket.options).compute(), values)


def test_name_holds_bucket_endpoint_region_never_credentials(bucket: Bucket) -> None:
    url = bucket.put("a.npy", np.arange(10))
    x = npydask.from_npy(url, storage_options=bucket.options)
    graph = pickle.dumps(dict(x.__dask_graph__()))
    secret = bucket.options["secret_access_key"].encode()
    assert secret not in x.name.encode()
    assert x.name == npydask.from_npy(url, storage_options=bucket.options).name
    other = dict(bucket.options, region="eu-west-1")
    assert npydask.from_npy(url, storage_options={**bucket.options}).name == x.name
    assert pickle.loads(graph)  # (the tasks carry the options: workers need the endpoint)
    assert other["region"] != bucket.options.get("region")


def test_backends_other_than_auto_are_refused_for_urls(bucket: Bucket) -> None:
    url = bucket.put("a.npy", np.arange(10))
    with pytest.raises(ValueError, match="backend='auto'"):
        npydask.from_npy(url, backend="mmap", storage_options=bucket.options)
    with pytest.raises(ValueError, match="maps local files only"):
        npydask.read_region(url, backend="mmap", storage_options=bucket.options)


def test_replaced_object_fails_with_file_changed_error(bucket: Bucket) -> None:
    url = bucket.put("a.npy", np.arange(1000.0))
    x = npydask.from_npy(url, chunks=100, storage_options=bucket.options)
    bucket.put("a.npy", np.arange(1000.0) + 1)  # same size, new ETag
    with pytest.raises(FileChangedError, match="a.npy"):
        x.compute()


def test_deleted_object_fails_with_file_not_found(bucket: Bucket) -> None:
    url = bucket.put("a.npy", np.arange(1000.0))
    x = npydask.from_npy(url, chunks=100, storage_options=bucket.options)
    bucket.remove(url)
    with pytest.raises(FileNotFoundError, match="a.npy"):
        x.compute()
    with pytest.raises(FileNotFoundError, match="no such object"):
        npydask.read_header(url, storage_options=bucket.options)


def test_npz_members_stored_and_deflated(bucket: Bucket) -> None:
    a = np.arange(60, dtype="<f8").reshape(6, 10)
    b = np.asfortranarray(np.arange(24, dtype=">i4").reshape(4, 6))
    for name, save in (("s.npz", np.savez), ("d.npz", np.savez_compressed)):
        buffer = io.BytesIO()
        save(buffer, a=a, b=b)
        url = bucket.put_bytes(name, buffer.getvalue())
        for key, values in (("a", a), ("b", b)):
            x = npydask.from_npy(url, key=key, chunks=2, storage_options=bucket.options)
            np.testing.assert_array_equal(x.compute(), values)
            region = npydask.read_region(url, (1, 2), (3, 5), key=key, storage_options=bucket.options)
            np.testing.assert_array_equal(region, values[1:3, 2:5])
        with pytest.raises(KeyError, match="'a'"):
            npydask.read_header(url, key="missing", storage_options=bucket.options)
        with pytest.raises(NpyFormatError, match="members"):
            npydask.read_header(url, storage_options=bucket.options)


def test_empty_and_truncated_objects(bucket: Bucket) -> None:
    empty = bucket.put_bytes("empty.npy", b"")
    with pytest.raises(NpyFormatError, match="empty.npy"):
        npydask.read_header(empty, storage_options=bucket.options)
    whole = npy_bytes(np.arange(100.0))
    cut = bucket.put_bytes("cut.npy", whole[:-8])
    with pytest.raises(NpyFormatError, match="truncated"):
        npydask.from_npy(cut, storage_options=bucket.options)


# -- datasets ----------------------------------------------------------------------------------


def _folder(bucket: Bucket) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    names = ["b.npy", "a.npy", "s1/c.npy", "s0/d.npy", "s0/deep/e.npy", "x y/é 1.npy", "notes.txt"]
    arrays = {}
    for name in names:
        if name.endswith(".npy"):
            arrays[name] = rng.standard_normal((6, 7)).astype("<f4")
            bucket.put(name, arrays[name])
        else:
            bucket.put_bytes(name, b"not an array")
    bucket.put_bytes("s2/", b"")  # a zero-byte "folder" marker
    return arrays


@pytest.mark.parametrize("slash", ["", "/"])
def test_open_dataset_lists_in_dali_order(bucket: Bucket, slash: str) -> None:
    arrays = _folder(bucket)
    root = bucket.url().rstrip("/") + slash
    ds = npydask.open_dataset(root, storage_options=bucket.options)
    rel = [f[len(bucket.url()) :] for f in ds.files]
    assert rel == ["a.npy", "b.npy", "s0/d.npy", "s1/c.npy", "x y/é 1.npy"]
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([arrays[r] for r in rel]))
    deep = npydask.open_dataset(root, recursive=True, storage_options=bucket.options)
    assert [f[len(bucket.url()) :] for f in deep.files] == [
        "a.npy",
        "b.npy",
        "s0/d.npy",
        "s0/deep/e.npy",
        "s1/c.npy",
        "x y/é 1.npy",
    ]
    np.testing.assert_array_equal(
        deep.concatenate().compute(), np.concatenate([arrays[r] for r in deep_rel(deep, bucket)])
    )


def test_open_dataset_natural_sort_over_a_prefix(bucket: Bucket) -> None:
    names = ["s_10.npy", "s_2.npy", "s_1.npy", "d2/t_10.npy", "d2/t_9.npy", "d10/t_1.npy"]
    arrays = {name: np.full((2, 3), i, "<i4") for i, name in enumerate(names)}
    for name, a in arrays.items():
        bucket.put(name, a)
    root = bucket.url()
    flat = npydask.open_dataset(root, sort="natural", storage_options=bucket.options)
    want = ["s_1.npy", "s_2.npy", "s_10.npy", "d2/t_9.npy", "d2/t_10.npy", "d10/t_1.npy"]
    assert deep_rel(flat, bucket) == want
    np.testing.assert_array_equal(flat.concatenate().compute(), np.concatenate([arrays[r] for r in want]))
    deep = npydask.open_dataset(root, recursive=True, sort="natural", storage_options=bucket.options)
    assert deep_rel(deep, bucket) == ["d2/t_9.npy", "d2/t_10.npy", "d10/t_1.npy", "s_1.npy", "s_2.npy", "s_10.npy"]
    with pytest.warns(NpyDaskWarning, match=r"puts 's_10.npy' before 's_2.npy'.*sort='natural'.*sort='bytes'"):
        default = npydask.open_dataset(root, storage_options=bucket.options)  # DALI's order, and a word about it
    assert deep_rel(default, bucket) == ["s_1.npy", "s_10.npy", "s_2.npy", "d10/t_1.npy", "d2/t_10.npy", "d2/t_9.npy"]


def deep_rel(ds: Any, bucket: Bucket) -> list[str]:
    return [f[len(bucket.url()) :] for f in ds.files]


@pytest.mark.parametrize("policy", ["error", "trim_to_shape", "pad"])
def test_rois_and_shards_over_objects(bucket: Bucket, policy: str) -> None:
    arrays = [np.arange(i, i + 8 * 9 * 10, dtype="<i4").reshape(8, 9, 10) for i in range(6)]
    for i, a in enumerate(arrays):
        bucket.put(f"v{i}.npy", a)
    start, shape = ([1, 2, 3], [4, 5, 6]) if policy == "error" else ([5, 6, 7], [6, 6, 6])
    for shard in range(2):
        ds = npydask.open_dataset(
            bucket.url(),
            roi_start=start,
            roi_shape=shape,
            out_of_bounds_policy=policy,
            fill_value=-1,
            shard_id=shard,
            num_shards=2,
            storage_options=bucket.options,
        )
        got = ds.stack().compute()
        local = []
        for a in arrays[shard * 3 : shard * 3 + 3]:
            box = np.full(shape, -1, a.dtype) if policy == "pad" else None
            sl = tuple(slice(s, min(s + n, d)) for s, n, d in zip(start, shape, a.shape))
            piece = a[sl]
            if box is not None:
                box[tuple(slice(0, p) for p in piece.shape)] = piece
                piece = box
            local.append(piece)
        np.testing.assert_array_equal(got, np.stack(local))


def test_roi_out_of_bounds_error_names_the_object(bucket: Bucket) -> None:
    bucket.put("v.npy", np.zeros((4, 4)))
    with pytest.raises(RoiError, match="v.npy"):
        npydask.open_dataset(bucket.url(), roi_start=[3, 3], roi_shape=[3, 3], storage_options=bucket.options)


def test_files_list_of_urls_and_one_store_only(bucket: Bucket, tmp_path: Path) -> None:
    a = bucket.put("a.npy", np.arange(4))
    b = bucket.put("b.npy", np.arange(4) * 2)
    ds = npydask.open_dataset(files=[b, a], storage_options=bucket.options)
    assert ds.files == [b, a]
    np.testing.assert_array_equal(ds.stack().compute(), [np.arange(4) * 2, np.arange(4)])
    rel = npydask.open_dataset(bucket.url(), files=["b.npy", "a.npy"], storage_options=bucket.options)
    assert rel.files == [b, a]
    np.save(tmp_path / "local.npy", np.arange(4))
    with pytest.raises(ValueError, match="one store"):
        npydask.open_dataset(files=[a, str(tmp_path / "local.npy")], storage_options=bucket.options)


def test_empty_prefix_says_nothing_was_found(bucket: Bucket) -> None:
    with pytest.raises(ValueError, match="no file found"):
        npydask.open_dataset(bucket.url("nothing-here/"), storage_options=bucket.options)


def test_small_objects_grouped_in_tasks(bucket: Bucket) -> None:
    arrays = [np.full((32, 32), i, "<f4") for i in range(300)]
    for i, a in enumerate(arrays):
        bucket.put(f"s/{i:04d}.npy", a)
    ds = npydask.open_dataset(bucket.url("s"), storage_options=bucket.options)
    x = ds.stack()
    assert x.numblocks[0] < 300  # (grouped: many objects a task)
    np.testing.assert_array_equal(x.compute(), np.stack(arrays))
    assert float(x.sum().compute()) == float(sum(a.sum() for a in arrays))


def test_storage_options_refused_for_local_paths(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(3))
    with pytest.raises(ValueError, match="drop storage_options"):
        npydask.from_npy(tmp_path / "a.npy", storage_options={"region": "x"})
    with pytest.raises(ValueError, match="drop storage_options"):
        npydask.open_dataset(tmp_path, storage_options={"region": "x"})


def test_file_urls_read_local_files(tmp_path: Path) -> None:
    values = np.arange(20.0).reshape(4, 5)
    np.save(tmp_path / "a b.npy", values)
    url = f"file://{tmp_path}/a%20b.npy"
    np.testing.assert_array_equal(npydask.from_npy(url).compute(), values)
    np.testing.assert_array_equal(npydask.read_region(url, (1, 1), (3, 4)), values[1:3, 1:4])
    ds = npydask.open_dataset(f"file://{tmp_path}")
    assert ds.files == [str(tmp_path / "a b.npy")]


def test_identity_of_a_listing_matches_a_head(bucket: Bucket) -> None:
    url = bucket.put("a.npy", np.arange(5))
    source = source_for(StoreSpec.of(f"s3://{bucket.bucket}", bucket.options))
    identity = source.identity(url)
    assert isinstance(identity, ObjectIdentity) and identity.size == len(bucket.get_bytes(url))
    assert identity.etag


# -- on a cluster ------------------------------------------------------------------------------


@pytest.mark.slow
def test_local_cluster_workers_take_credentials_from_their_environment(
    bucket: Bucket, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented set-up: credentials and endpoint in the workers' environment, nothing secret in the tasks."""
    from distributed import Client, LocalCluster

    arrays = [np.arange(i, i + 5 * 6 * 7, dtype="<f4").reshape(5, 6, 7) for i in range(8)]
    for i, a in enumerate(arrays):
        bucket.put(f"c/{i}.npy", a)
    env = s3_server.env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # (the client opens the dataset with the same environment)
    ds = npydask.open_dataset(bucket.url("c"), roi_start=[1, 1, 1], roi_shape=[3, 4, 5])
    graph = pickle.dumps(dict(ds.stack().__dask_graph__()))
    assert env["AWS_SECRET_ACCESS_KEY"].encode() not in graph
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            worker_class="distributed.Nanny",
            env=env,
        ) as cluster,
        Client(cluster) as client,
    ):
        got = client.compute(ds.stack()).result()
        whole = client.compute(npydask.from_npy(bucket.url("c/3.npy"), chunks=(2, 6, 7))).result()
    np.testing.assert_array_equal(got, np.stack([a[1:4, 1:5, 1:6] for a in arrays]))
    np.testing.assert_array_equal(whole, arrays[3])


# -- processes ---------------------------------------------------------------------------------


def _child_read(url: str, options: dict[str, Any], queue: Any) -> None:
    try:
        values = npydask.read_region(url, storage_options=options)
        queue.put(("ok", values.tolist()))
    except BaseException as e:  # reported to the parent
        queue.put((type(e).__name__, str(e)))


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_forked_children_refuse_instead_of_hanging(bucket: Bucket, method: str) -> None:
    """obstore hangs in a child forked after the parent used it: npydask raises there instead."""
    import multiprocessing

    url = bucket.put("a.npy", np.arange(6.0))
    npydask.read_region(url, storage_options=bucket.options)  # the parent uses obstore first
    ctx = multiprocessing.get_context(method)
    queue = ctx.Queue()
    child = ctx.Process(target=_child_read, args=(url, bucket.options, queue))
    child.start()
    child.join(120)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    assert not hung, f"a {method} child hung reading {url}"
    kind, found = queue.get(timeout=10)
    if method == "fork":
        assert kind == "RuntimeError"
        assert "spawn" in found and "forkserver" in found and "a.npy" in found
    else:
        assert (kind, found) == ("ok", list(np.arange(6.0)))


def test_loader_epochs_over_objects(bucket: Bucket) -> None:
    arrays = [np.full((4, 6, 6), i, "<i4") + np.arange(36, dtype="<i4").reshape(6, 6) for i in range(10)]
    for i, a in enumerate(arrays):
        bucket.put(f"l/{i:02d}.npy", a)
    ds = npydask.open_dataset(bucket.url("l"), roi_start=[1, 1, 1], roi_shape=[2, 4, 4], storage_options=bucket.options)
    for shard in range(2):
        loader = npydask.Loader(ds, batch_size=3, shuffle=True, seed=5, shard_id=shard, num_shards=2, with_index=True)
        for _ in range(2):
            seen = []
            for batch, idx in loader:
                np.testing.assert_array_equal(batch, np.stack([arrays[i][1:3, 1:5, 1:5] for i in idx]))
                seen += list(idx)
            assert len(seen) == 5 and len(set(seen)) == 5


def test_loader_and_torch_dataset_of_whole_objects(bucket: Bucket) -> None:
    arrays = [np.arange(i, i + 20, dtype="<f4").reshape(4, 5) for i in range(7)]
    for i, a in enumerate(arrays):
        bucket.put(f"w/{i}.npy", a)
    ds = npydask.open_dataset(bucket.url("w"), storage_options=bucket.options)
    loader = npydask.Loader(ds, batch_size=4, with_index=True)
    for batch, idx in loader:
        np.testing.assert_array_equal(batch, np.stack([arrays[i] for i in idx]))
    torch = pytest.importorskip("torch")
    from npydask.torch import NpyMapDataset

    mapped = NpyMapDataset(ds)
    for i in (0, 6, 3):
        np.testing.assert_array_equal(torch.as_tensor(mapped[i]).numpy(), arrays[i])


# -- plain HTTP servers ------------------------------------------------------------------------


@pytest.fixture
def http_folder(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    from npydask.testing.http_range import RangeHTTPServer

    root = tmp_path / "www"
    root.mkdir()
    with RangeHTTPServer(root) as server:
        yield server, root


@pytest.mark.parametrize("order", ["C", "F"])
def test_http_reads_exactly_the_region_bytes(http_folder: tuple[Any, Path], order: str) -> None:
    server, root = http_folder
    values = np.asarray(np.arange(40 * 50 * 30, dtype="<f4").reshape(40, 50, 30), order=order)
    (root / "sub dir").mkdir()
    np.save(root / "sub dir" / "v é.npy", values)
    url = server.url("sub dir/v é.npy")
    server.reset_stats()
    header = npydask.read_header(url)
    assert header.shape == values.shape
    region = npydask.read_region(url, (3, 4, 5), (9, 20, 25))
    np.testing.assert_array_equal(region, values[3:9, 4:20, 5:25])
    np.testing.assert_array_equal(npydask.from_npy(url, chunks=(7, 50, 30)).compute(), values)
    ds = npydask.open_dataset(files=[url, url], roi_start=[1, 2, 3], roi_shape=[4, 5, 6])
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([values[1:5, 2:7, 3:9]] * 2))
    assert all(r.method == "GET" and r.range for r in server.stats.log)  # (ranges only, never a whole object)


def test_http_has_no_listing(http_folder: tuple[Any, Path]) -> None:
    server, _ = http_folder
    with pytest.raises(ValueError, match="no listing.*files="):
        npydask.open_dataset(server.endpoint + "/")


@pytest.mark.parametrize("honour", [False, True])
def test_http_rewrite_is_caught_whether_or_not_the_server_honours_if_match(tmp_path: Path, honour: bool) -> None:
    from npydask.testing.http_range import RangeHTTPServer

    np.save(tmp_path / "a.npy", np.arange(1000.0))
    with RangeHTTPServer(tmp_path, honour_if_match=honour) as server:
        x = npydask.from_npy(server.url("a.npy"), chunks=100)
        np.save(tmp_path / "a.npy", np.arange(1000.0) + 1)  # same size, new ETag
        with pytest.raises(FileChangedError, match="a.npy"):
            x.compute()


def test_http_without_etag_compares_last_modified_when_opted_in(tmp_path: Path) -> None:
    import os

    from npydask.testing.http_range import RangeHTTPServer

    np.save(tmp_path / "a.npy", np.arange(1000.0))
    with RangeHTTPServer(tmp_path, send_etag=False) as server:
        x = npydask.from_npy(server.url("a.npy"), chunks=100, storage_options={"identity": "last-modified"})
        np.testing.assert_array_equal(x.compute(), np.arange(1000.0))
        np.save(tmp_path / "a.npy", np.arange(1000.0) + 1)
        os.utime(tmp_path / "a.npy", (1, 1))  # (Last-Modified has one-second resolution)
        with pytest.raises(FileChangedError, match="a.npy"):
            x.compute()


def test_presigned_query_is_sent_but_never_shown() -> None:
    """A presigned URL's query goes with every request, and appears in no path, name or message."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    data = npy_bytes(np.arange(50.0))
    seen: list[str] = []

    class Signed(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            if "X-Amz-Signature=s1gn" not in self.path:
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            lo, hi = (int(v) for v in self.headers["Range"].split("=")[1].split("-"))
            hi = min(hi, len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(data)}")
            self.send_header("Content-Length", str(hi - lo + 1))
            self.send_header("ETag", '"v1"')
            self.send_header("Last-Modified", "Mon, 23 Nov 2026 12:00:00 GMT")
            self.end_headers()
            self.wfile.write(data[lo : hi + 1])

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Signed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/d/v.npy?X-Amz-Signature=s1gn&X-Amz-Credential=AKIA"
        x = npydask.from_npy(url, chunks=10)
        assert float(x.sum().compute()) == float(np.arange(50.0).sum())
        assert all("X-Amz-Signature=s1gn" in p for p in seen)
        ds = npydask.open_dataset(files=[url])
        assert ds.files == [url.partition("?")[0]]
        assert "s1gn" not in x.name and "s1gn" not in repr(ds)
        with pytest.raises(PermissionError) as info:
            npydask.read_header(url.replace("s1gn", "wrong"))
        assert "wrong" not in str(info.value) and "AKIA" not in str(info.value)
    finally:
        server.shutdown()


# -- identities, listings, failures --------------------------------------------------------------


def test_wrong_credentials_are_a_permission_error(bucket: Bucket) -> None:
    url = bucket.put("a.npy", np.arange(4))
    wrong = dict(bucket.options, secret_access_key="not-the-secret")
    with pytest.raises(PermissionError, match="access denied") as info:
        npydask.read_header(url, storage_options=wrong)
    assert "not-the-secret" not in str(info.value) and info.value.filename == url


def test_read_only_identity_reads_its_bucket_only(bucket: Bucket, s3_server: Any) -> None:
    url = bucket.put("a.npy", np.arange(4))
    reader = s3_server.storage_options("readonly")
    np.testing.assert_array_equal(npydask.from_npy(url, storage_options=reader).compute(), np.arange(4))
    assert len(npydask.open_dataset(bucket.url(), storage_options=reader)) == 1
    s3_server.boto3_client().put_object(Bucket=s3_server.private_bucket, Key="p.npy", Body=npy_bytes(np.arange(3)))
    with pytest.raises(PermissionError, match="p.npy"):
        npydask.read_header(f"s3://{s3_server.private_bucket}/p.npy", storage_options=reader)


def test_anonymous_reads_of_a_public_bucket(s3_server: Any) -> None:
    s3_server.boto3_client().put_object(
        Bucket=s3_server.public_bucket, Key="open/a.npy", Body=npy_bytes(np.arange(5.0))
    )
    anonymous = s3_server.storage_options("anonymous")
    assert anonymous.get("skip_signature") is True
    url = f"s3://{s3_server.public_bucket}/open/a.npy"
    np.testing.assert_array_equal(npydask.from_npy(url, storage_options=anonymous).compute(), np.arange(5.0))
    ds = npydask.open_dataset(f"s3://{s3_server.public_bucket}/open", storage_options=anonymous)
    assert ds.files == [url]
    with pytest.raises(PermissionError):
        npydask.read_header(s3_server.url("x.npy"), storage_options=anonymous)


@pytest.mark.slow
def test_listing_20000_keys_pages_through_them(bucket: Bucket) -> None:
    import obstore

    from npydask.storage._stores import run_all

    source = source_for(StoreSpec.of(f"s3://{bucket.bucket}", bucket.options))
    store = source.store(bucket.url())
    data = npy_bytes(np.zeros(2, "<u1"))
    names = [f"many/{i // 4000}/{i:05d}.npy" for i in range(20_000)]
    run_all(lambda n: obstore.put(store, bucket.prefix + n, data), names, 64)
    from npydask.storage.object_list import ObjectLister

    listing = ObjectLister(source, bucket.url("many")).list(recursive=True)
    assert sorted(listing.paths) == sorted(n[len("many/") :] for n in names)
    flat = ObjectLister(source, bucket.url("many")).list(recursive=False)  # (one folder level down)
    assert len(flat.paths) == 20_000
    ds = npydask.open_dataset(bucket.url("many"), storage_options=bucket.options)
    assert len(ds) == 20_000 and ds.files[0].endswith("many/0/00000.npy") and ds.files[-1].endswith("many/4/19999.npy")


def test_server_stopped_mid_compute_fails_fast_and_clearly(s3_server_disposable: Any) -> None:
    """A stopped server: a clear ConnectionError within seconds, not a hang (3 retries with backoff)."""
    import time

    server = s3_server_disposable
    client = server.boto3_client()
    values = np.arange(64 * 256 * 256, dtype="<f4").reshape(64, 256, 256)
    client.put_object(Bucket=server.bucket, Key="big.npy", Body=npy_bytes(values))
    url = server.url("big.npy")
    x = npydask.from_npy(url, chunks=(4, 256, 256), storage_options=server.storage_options())
    np.testing.assert_array_equal(x[:8].compute(), values[:8])
    server.stop()
    t0 = time.perf_counter()
    with pytest.raises(OSError, match="big.npy") as info:
        x.compute()
    assert isinstance(info.value, ConnectionError | TimeoutError), info.value
    assert time.perf_counter() - t0 < 60
    assert "endpoint" in str(info.value)


def test_device_gpu_over_urls_reads_into_pinned_host_memory_then_copies_once(
    bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kvikio has no conditional reads: objects go through the pinned host buffer even where kvikio is there."""
    import sys

    from _gpu_fakes import FakeKvikio, cupy_like, same

    from npydask.gpu import device as gpu

    xp = cupy_like()
    fake = FakeKvikio()
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "array_module", lambda: xp)
    monkeypatch.setitem(sys.modules, "kvikio", fake)
    a = np.asfortranarray(np.arange(9 * 10 * 11, dtype=">f4").reshape(9, 10, 11))
    url = bucket.put("g.npy", a)
    x = npydask.from_npy(url, chunks=(4, 5, 11), device="gpu", storage_options=bucket.options)
    same(x.compute(), a)
    for i in range(3):
        bucket.put(f"gs/{i}.npy", a + i)
    ds = npydask.open_dataset(
        bucket.url("gs"), roi_start=[1, 2, 3], roi_shape=[4, 5, 6], device="gpu", storage_options=bucket.options
    )
    same(ds.stack().compute(), np.stack([(a + i)[1:5, 2:7, 3:9] for i in range(3)]))
    assert fake.opened == 0 and not fake.reads, "kvikio must not read objects"
    bucket.put("g.npy", a + 1)
    with pytest.raises(FileChangedError, match="g.npy"):
        x.compute()


@pytest.mark.parametrize("compressed", [False, True])
def test_dataset_of_npz_members(bucket: Bucket, compressed: bool) -> None:
    arrays = [np.arange(i, i + 30, dtype="<i8").reshape(5, 6) for i in range(4)]
    for i, a in enumerate(arrays):
        buffer = io.BytesIO()
        (np.savez_compressed if compressed else np.savez)(buffer, x=a, y=a * 2)
        bucket.put_bytes(f"z/{i}.npz", buffer.getvalue())
    ds = npydask.open_dataset(bucket.url("z"), file_filter="*.npz", key="y", storage_options=bucket.options)
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays) * 2)
    roi = npydask.open_dataset(
        bucket.url("z"),
        file_filter="*.npz",
        key="x",
        roi_start=[1, 2],
        roi_shape=[3, 3],
        storage_options=bucket.options,
    )
    np.testing.assert_array_equal(roi.stack().compute(), np.stack([a[1:4, 2:5] for a in arrays]))


def test_a_server_that_stops_answering_times_out_by_the_settings(s3_server_disposable: Any) -> None:
    """A paused server (SIGSTOP): TimeoutError after the request timeout and its retries, never a hang."""
    import time

    server = s3_server_disposable
    server.boto3_client().put_object(Bucket=server.bucket, Key="p.npy", Body=npy_bytes(np.arange(100.0)))
    with npydask.config.set(remote_timeout=2, remote_connect_timeout=2, remote_retries=1, remote_retry_timeout=3):
        x = npydask.from_npy(server.url("p.npy"), chunks=10, storage_options=server.storage_options())
    server.pause()
    try:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError, match="p.npy.*did not answer|did not answer.*") as info:
            x.compute()
        elapsed = time.perf_counter() - t0
    finally:
        server.resume()
    assert elapsed < 20, elapsed
    assert "remote_timeout" in str(info.value)
    np.testing.assert_array_equal(x.compute(), np.arange(100.0))  # (and reads again once it answers)


# -- headers="first" over objects ------------------------------------------------------------------


def test_headers_first_over_a_prefix_equals_numpy_and_checks_each_object(bucket: Bucket) -> None:
    arrays = [np.random.default_rng(i).standard_normal((12, 10)).astype("<f4") for i in range(9)]
    urls = [bucket.put(f"f/{i:02d}.npy", a) for i, a in enumerate(arrays)]
    ds = npydask.open_dataset(bucket.url("f"), headers="first", storage_options=bucket.options)
    assert all(isinstance(v.ref.identity, ObjectIdentity) and v.ref.identity.etag for v in ds.views)
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays))
    np.testing.assert_array_equal(ds[4].compute(), arrays[4])
    np.testing.assert_array_equal(ds.stack(chunks=(1, 5, 10)).compute(), np.stack(arrays))  # (range reads)
    roi = npydask.open_dataset(
        bucket.url("f"), headers="first", roi_start=[2, 3], roi_shape=[5, 4], storage_options=bucket.options
    )
    np.testing.assert_array_equal(roi.stack().compute(), np.stack([a[2:7, 3:7] for a in arrays]))
    by_url = npydask.open_dataset(files=urls[::-1], headers="first", storage_options=bucket.options)  # (a HEAD each)
    np.testing.assert_array_equal(by_url.stack().compute(), np.stack(arrays[::-1]))
    # Another header listed with the same size: only the header bytes tell, where each object is read.
    bucket.put("f/05.npy", np.zeros((12, 10), "<i4"))
    ds = npydask.open_dataset(bucket.url("f"), headers="first", storage_options=bucket.options)
    for read in (lambda: ds.stack().compute(), lambda: ds[5].compute(), lambda: ds.stack(chunks=(1, 5, 10)).compute()):
        with pytest.raises(NpyFormatError, match=r"05\.npy.*first file's header.*<f4.*but the file holds.*<i4"):
            read()
    roi = npydask.open_dataset(
        bucket.url("f"), headers="first", roi_start=[2, 3], roi_shape=[5, 4], storage_options=bucket.options
    )
    for _ in range(2):  # the header GET beside the ROI's range GETs, then (this process read it) from the cache
        with pytest.raises(NpyFormatError, match=r"05\.npy.*first file's header.*<f4.*but the file holds.*<i4"):
            roi.stack().compute()
    # Replaced after opening (a new ETag): FileChangedError naming it.
    bucket.put("f/05.npy", arrays[5])
    ds = npydask.open_dataset(bucket.url("f"), headers="first", storage_options=bucket.options)
    np.testing.assert_array_equal(ds.stack().compute(), np.stack(arrays))
    bucket.put("f/05.npy", arrays[5] + 1)
    with pytest.raises(FileChangedError, match=r"05\.npy"):
        ds.stack().compute()


def test_headers_first_short_objects_are_refused_at_open(bucket: Bucket) -> None:
    arrays = [np.full((8, 8), i, "<f4") for i in range(4)]
    urls = [bucket.put(f"g/{i}.npy", a) for i, a in enumerate(arrays)]
    whole = npy_bytes(arrays[2])
    bucket.put_bytes("g/2.npy", whole[:-8])
    for kw in (dict(file_root=bucket.url("g")), dict(files=urls)):  # sizes known from the LIST or the HEADs
        with pytest.raises(NpyFormatError, match=r"2\.npy.*truncated"):
            npydask.open_dataset(headers="first", storage_options=bucket.options, **kw)
    bucket.put("g/2.npy", np.zeros((4, 8), "<f4"))
    with pytest.raises(NpyFormatError, match=r"2\.npy.*but the file holds shape \(4, 8\)"):
        npydask.open_dataset(bucket.url("g"), headers="first", storage_options=bucket.options)


def test_headers_first_a_pad_roi_outside_the_first_object_still_checks_each_object(bucket: Bucket) -> None:
    for i in range(3):
        bucket.put(f"p/{i}.npy", np.full((3, 4), i, "<f4"))
    roi = dict(roi_start=[5, 5], roi_shape=[2, 3], out_of_bounds_policy="pad", fill_value=-1)
    ds = npydask.open_dataset(bucket.url("p"), headers="first", storage_options=bucket.options, **roi)
    np.testing.assert_array_equal(ds.stack().compute(), np.full((3, 2, 3), -1, "<f4"))  # all padding
    bucket.put("p/1.npy", np.arange(80, dtype="<f4").reshape(10, 8))  # larger: its ROI holds data
    ds = npydask.open_dataset(bucket.url("p"), headers="first", storage_options=bucket.options, **roi)
    reads = (lambda: ds.stack().compute(), lambda: ds[1].compute(), lambda: list(npydask.Loader(ds, 3)))
    for read in reads:
        with pytest.raises(NpyFormatError, match=r"1\.npy.*first file's header.*\(3, 4\).*holds shape \(10, 8\)"):
            read()


def test_headers_first_an_empty_first_object_does_not_stand_for_the_others(bucket: Bucket) -> None:
    bucket.put("e/0.npy", np.zeros((0, 10), "<f4"))
    for i in range(1, 4):
        bucket.put(f"e/{i}.npy", np.full((6, 10), i, "<f4"))
    with pytest.raises(NpyFormatError, match=r"1\.npy.*first file's header.*\(0, 10\).*holds shape \(6, 10\)"):
        npydask.open_dataset(bucket.url("e"), headers="first", storage_options=bucket.options)
    ds = npydask.open_dataset(bucket.url("e"), storage_options=bucket.options)
    assert ds.concatenate().compute().shape == (18, 10)


def test_run_beside_waits_for_both_and_raises_the_side_error_first() -> None:
    import threading
    import time

    from npydask.storage._stores import run_beside

    done = []

    def side() -> None:
        time.sleep(0.05)
        done.append(threading.current_thread().name)
        raise NpyFormatError("the header differs")

    def main() -> str:
        raise FileChangedError(5, "the runs failed too")

    with pytest.raises(NpyFormatError, match="differs") as e:
        run_beside(side, main, 4)
    assert done and done[0].startswith("npydask-remote") and isinstance(e.value.__context__, FileChangedError)
    with pytest.raises(NpyFormatError):  # main succeeded: the side's error still raised, after it finished
        run_beside(side, lambda: "ok", 4)
    assert len(done) == 2
    assert run_beside(lambda: None, lambda: "ok", 4) == "ok"


# -- keys obstore cannot represent, missing credentials, malformed endpoints ------------------------


def test_a_control_character_key_is_skipped_when_the_selection_skips_it(bucket: Bucket) -> None:
    arrays = {name: np.arange(i + 3.0) for i, name in enumerate(["a.npy", "sub/b.npy"])}
    for name, array in arrays.items():
        bucket.put(name, array)
    bucket.put_bytes("notes\twith a tab.txt", b"x")
    bucket.put_bytes("sub/more\nnotes.txt", b"y")
    for recursive in (False, True):
        ds = npydask.open_dataset(bucket.url(), storage_options=bucket.options, recursive=recursive)
        assert ds.files == [bucket.url("a.npy"), bucket.url("sub/b.npy")]
        np.testing.assert_array_equal(ds.concatenate().compute(), np.concatenate(list(arrays.values())))
    bucket.put("sub/c\r.npy", np.arange(2.0))
    with pytest.raises(ValueError, match="the key '.*sub/c\\\\r.npy' holds a control character.*selection takes it"):
        npydask.open_dataset(bucket.url(), storage_options=bucket.options)


def test_no_credentials_found_says_so(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    options = {"endpoint": s3_server.endpoint, "region": "us-east-1", "metadata_endpoint": "http://127.0.0.1:9"}
    with (
        npydask.config.set(remote_retries=0),
        pytest.raises(PermissionError, match="no credentials were found") as info,
    ):
        npydask.read_header(s3_server.url("x.npy"), storage_options=options)
    assert "skip_signature" in str(info.value) and "lists the prefix and reads every header" in str(info.value)
    assert info.value.__context__ is None


def test_a_panic_in_obstore_is_an_os_error(s3_server: Any) -> None:
    """A spec built around the checks (an endpoint with a space): obstore panics, npydask raises OSError."""
    from npydask.storage._stores import RemoteSettings

    options = dict(s3_server.storage_options(), endpoint="http://127.0.0.1: 1")
    spec = StoreSpec(f"s3://{s3_server.bucket}", tuple(sorted(options.items())), RemoteSettings.current())
    with pytest.raises(OSError, match="failed internally") as info:
        source_for(spec).identity(s3_server.url("x.npy"))
    assert info.value.__context__ is None
    with pytest.raises(ValueError, match="must be an endpoint URL"):
        npydask.read_header(s3_server.url("x.npy"), storage_options=options)


def test_s3fs_style_options_name_obstore_keys(bucket: Bucket) -> None:
    url = bucket.put("a.npy", np.arange(3))
    options = dict(bucket.options)
    options["endpoint_url"] = options.pop("endpoint")
    with pytest.raises(ValueError, match="'endpoint' for 'endpoint_url'"):
        npydask.read_header(url, storage_options=options)
