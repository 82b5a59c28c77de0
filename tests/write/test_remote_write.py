"""Writing to object storage against a real S3 server (SeaweedFS): to_npy, to_npy_files, to_zarr.

Every object written is read back with boto3 and compared with ``numpy.load``
of its bytes against the source array.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any, NamedTuple

import dask
import dask.array as da
import numpy as np
import pytest

import npydask
from npydask.storage._stores import StoreSpec
from npydask.storage.base import Target
from npydask.storage.s3_upload import client_kwargs, translate_boto
from npydask.write._remote import plan_parts

boto3 = pytest.importorskip("boto3")
pytest.importorskip("obstore")

from npydask.testing.seaweed import REGION, SeaweedServer  # noqa: E402

ADMIN = (SeaweedServer.identities["admin"].access_key_id, SeaweedServer.identities["admin"].secret_access_key)
READER = (SeaweedServer.identities["readonly"].access_key_id, SeaweedServer.identities["readonly"].secret_access_key)


# --------------------------------------------------------------------------
# The session's SeaweedFS server (tests/conftest.py ``s3_server``): an admin, and a read-only identity
# (Read and List on the data bucket only).


@pytest.fixture(scope="module")
def s3(s3_server):
    """(server, admin boto3 client)."""
    return s3_server, s3_server.boto3_client()


def options(server: Any, identity: str = "admin") -> dict:
    return server.storage_options(identity)


class Place(NamedTuple):
    """A fresh prefix of the test bucket (one bucket: each bucket is a SeaweedFS collection taking volumes)."""

    bucket: str
    prefix: str
    so: dict
    client: Any

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def raw(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()

    def load(self, key: str) -> np.ndarray:
        return np.load(io.BytesIO(self.raw(key)))

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=body)

    def keys(self) -> set[str]:
        found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix).get("Contents", [])
        return {o["Key"][len(self.prefix) :] for o in found}

    def uploads(self) -> list:
        found = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix).get("Uploads", [])
        return [u for u in found if u["Key"].startswith(self.prefix)]

    def parts(self, key: str) -> int:
        """How many parts the object was uploaded in (its ETag's ``-N``; 1 for a plain PUT)."""
        etag = self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)["ETag"].strip('"')
        return int(etag.rpartition("-")[2]) if "-" in etag else 1


@pytest.fixture
def place(s3):
    server, client = s3
    return Place(server.bucket, "w" + uuid.uuid4().hex[:12] + "/", options(server), client)


def assert_same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    if expected.dtype.names is None:
        np.testing.assert_array_equal(got, expected)
    else:  # (numpy.load of a BytesIO copies structured items without their padding: compare values here)
        assert got.tolist() == expected.tolist()


def _arrays() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    padded = np.dtype({"names": ["a", "b"], "formats": ["u1", "<f8"], "offsets": [0, 8], "itemsize": 16})
    structured = np.zeros((5, 3), padded)
    structured["a"] = rng.integers(0, 255, (5, 3))
    structured["b"] = rng.random((5, 3))
    return [
        ("f4", rng.random((7, 5, 3)).astype("<f4")),
        ("big-endian", rng.integers(-1000, 1000, (9, 4)).astype(">i4")),
        ("big-f8", rng.random((6, 6)).astype(">f8")),
        ("bool", rng.random((4, 11)) > 0.5),
        ("complex", (rng.random((5, 3)) + 1j * rng.random((5, 3))).astype("<c16")),
        ("structured", structured),
        ("strings", np.array([["ab", "c"], ["déf", ""]], dtype="<U3")),
        ("0-d", np.array(3.5, dtype="<f8")),
        ("empty", np.zeros((0, 4), dtype="<i2")),
        ("empty-rows", np.zeros((3, 0), dtype="<f4")),
    ]


ARRAYS = _arrays()


# --------------------------------------------------------------------------
# Pure: the part plan and the boto3 client's options


def test_plan_parts_keeps_valid_row_slabs_and_rechunks_the_rest():
    mib = 1 << 20
    # 12 MiB of f4 in 1 MiB slabs: rechunked to 5 MiB slabs (the last smaller)
    assert plan_parts((3 * mib,), ((mib // 4,) * 12,), 4, 128) == (5 * mib // 4, 5 * mib // 4, mib // 2)
    # exactly 5 MiB slabs are kept (part 1 is the header more)
    assert plan_parts((3 * mib,), ((5 * mib // 4,) * 2 + (mib // 2,),), 4, 128) is None
    # one byte short of 5 MiB in a middle part: rechunked
    rows = (5 * mib, 5 * mib - 1, 7)
    assert plan_parts((sum(rows),), (rows,), 1, 128) == (5 * mib, 5 * mib, 6)
    # a first part of 5 MiB counting its header is enough
    rows = (5 * mib - 128, 5 * mib, 3)
    assert plan_parts((sum(rows),), (rows,), 1, 128) is None
    # chunks split along axis 1 are not contiguous: rechunked to row slabs
    assert plan_parts((40, 1 << 18), ((40,), (1 << 17, 1 << 17)), 1, 128) == (20, 20)
    # big chunks keep their size: slabs as large as the largest chunk
    assert plan_parts((64, mib), ((32, 32), (mib // 2, mib // 2)), 1, 128) == (16, 16, 16, 16)  # 16 MiB chunks
    # 0-d, empty and zero-width arrays: one part
    assert plan_parts((), (), 8, 128) is None
    assert plan_parts((0, 4), ((0,), (4,)), 2, 128) is None
    assert plan_parts((5, 0), ((2, 3), (0,)), 4, 128) == (5,)
    # at most 10,000 parts
    slabs = plan_parts((30_000 * mib,), ((mib,) * 30_000,), 1, 128)
    assert len(slabs) <= 10_000 and sum(slabs) == 30_000 * mib and min(slabs[:-1]) >= 5 * mib


def test_plan_parts_refuses_rows_larger_than_a_part():
    with pytest.raises(ValueError, match="to_zarr or to_npy_files"):
        plan_parts((2, 6 << 30), ((1, 1), (6 << 30,)), 1, 128)


def test_client_kwargs_map_storage_options_and_their_aliases():
    spec = StoreSpec.of(
        "s3://b",
        {
            "aws_endpoint": "http://h:1",
            "aws_region": "eu-west-3",
            "aws_access_key_id": "A",
            "aws_secret_access_key": "S",
            "token": "T",
            "allow_http": "true",
        },
    )
    assert client_kwargs(spec) == {
        "endpoint_url": "http://h:1",
        "region_name": "eu-west-3",
        "aws_access_key_id": "A",
        "aws_secret_access_key": "S",
        "aws_session_token": "T",
    }
    assert client_kwargs(StoreSpec.of("s3://b", {})) == {}  # boto3's own chain


def test_skip_signature_makes_an_unsigned_client():
    from botocore import UNSIGNED

    from npydask.storage.s3_upload import client_for

    client = client_for(StoreSpec.of("s3://b", {"endpoint": "http://127.0.0.1:9", "skip_signature": "true"}))
    assert client.meta.config.signature_version is UNSIGNED
    assert client.meta.config.s3["addressing_style"] == "path"


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("AccessDenied", 403, PermissionError),
        ("InvalidAccessKeyId", 403, PermissionError),
        ("NoSuchBucket", 404, FileNotFoundError),
        ("NoSuchKey", 404, FileNotFoundError),
        ("InternalError", 500, OSError),
    ],
)
def test_boto_errors_become_builtin_errors_naming_the_url(code, status, kind):
    from botocore.exceptions import ClientError

    e = ClientError(
        {"Error": {"Code": code, "Message": "secret-bearing text"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "UploadPart",
    )
    err = translate_boto(e, "s3://b/k.npy", "uploading part 3")
    assert type(err) is kind
    assert err.filename == "s3://b/k.npy"
    assert code in str(err) and "secret-bearing" not in str(err)


def test_create_only_put_refused_is_file_exists_not_changed():
    """obstore's AlreadyExistsError carries HTTP 412 in its text: it is FileExistsError, not FileChangedError."""
    from npydask.storage._remote_errors import translate

    AlreadyExistsError = type("AlreadyExistsError", (Exception,), {"__module__": "obstore.exceptions"})
    e = AlreadyExistsError("Object at location k already exists: ... status code: 412 Precondition Failed ...")
    err = translate(e, "s3://b/k.npy", "writing the object (PUT)")
    assert type(err) is FileExistsError and err.filename == "s3://b/k.npy" and "overwrite=True" in str(err)


def test_to_npy_refuses_other_schemes_naming_the_alternatives():
    for url in ("gs://b/k.npy", "az://c/k.npy", "https://host/k.npy"):
        with pytest.raises(ValueError, match="to_npy_files.*to_zarr"):
            npydask.to_npy(np.arange(3), url)


# --------------------------------------------------------------------------
# to_npy: multipart upload


@pytest.mark.parametrize(("name", "array"), ARRAYS, ids=[n for n, _ in ARRAYS])
@pytest.mark.parametrize("order", ["C", "F"])
def test_to_npy_writes_what_numpy_loads(place, name, array, order):
    p, so = place, place.so
    a = np.asarray(array, order=order)
    npydask.to_npy(a, p.url(f"{name}.npy"), storage_options=so)
    assert_same(p.load(f"{name}.npy"), a)
    if order == "C":  # every payload byte, structured padding included (the source's is zero)
        assert p.raw(f"{name}.npy")[len(p.raw(f"{name}.npy")) - a.nbytes :] == a.tobytes()
    if a.ndim and a.dtype.names is None and a.size:
        x = da.from_array(a, chunks=tuple(max(1, n // 2) for n in a.shape))
        npydask.to_npy(x, p.url(f"{name}-dask.npy"), storage_options=so)
        assert_same(p.load(f"{name}-dask.npy"), a)
    assert p.uploads() == []


@pytest.mark.parametrize(
    ("shape", "chunks", "dtype", "parts"),
    [
        ((3 << 20,), 1 << 18, "<f4", 3),  # 12 MiB in 1 MiB chunks: rechunked to 5 + 5 + 2 MiB
        ((1 << 10, 3 << 10), (1 << 9, 1 << 10), ">f4", 3),  # 12 MiB, chunks split along axis 1
        ((10 << 20,), 5 << 20, "u1", 2),  # exactly 5 MiB chunks: kept, 2 parts
        ((10 << 20,), (((5 << 20) - 128, 5 << 20, 128),), "u1", 3),  # part 1: 128-byte header + rows = 5 MiB
        ((10 << 20,), (5 << 20) - 64, "u1", 2),  # part 2 is 64 bytes short: rechunked (5 MiB, 5 MiB)
        ((10 << 20,), (5 << 20) - 1, "u1", 2),  # 5 MiB less a byte: rechunked (5 MiB, 5 MiB)
    ],
)
def test_to_npy_multipart_parts(place, shape, chunks, dtype, parts):
    p, so = place, place.so
    a = np.random.default_rng(1).integers(0, 255, shape).astype(dtype)
    x = da.from_array(a, chunks=chunks)
    npydask.to_npy(x, p.url("big.npy"), storage_options=so)
    assert_same(p.load("big.npy"), a)
    assert p.parts("big.npy") == parts
    assert p.uploads() == []


def test_to_npy_fortran_dask_array_over_many_parts(place):
    p, so = place, place.so
    a = np.asfortranarray(np.random.default_rng(2).random((1500, 1100)))  # 12.6 MiB
    npydask.to_npy(da.from_array(a, chunks=(200, 300)), p.url("f.npy"), storage_options=so)
    assert_same(p.load("f.npy"), a)
    assert p.parts("f.npy") == 3


def test_to_npy_lazy_value(place):
    p, so = place, place.so
    a = np.arange(6 << 18, dtype="<i4").reshape(-1, 64)
    v = npydask.to_npy(da.from_array(a, chunks=(1 << 14, 64)), p.url("lazy.npy"), storage_options=so, compute=False)
    assert p.keys() == set() and p.uploads() == []
    dask.compute(v)
    assert_same(p.load("lazy.npy"), a)


def test_to_npy_overwrite_false_refuses_an_existing_object(place):
    p, so = place, place.so
    p.put("x.npy", b"old bytes")
    with pytest.raises(FileExistsError) as info:
        npydask.to_npy(np.arange(5), p.url("x.npy"), storage_options=so, overwrite=False)
    assert info.value.filename == p.url("x.npy")
    assert p.raw("x.npy") == b"old bytes" and p.uploads() == []
    # built lazily before the object appears: the first task's HEAD refuses it
    v = npydask.to_npy(np.arange(5), p.url("y.npy"), storage_options=so, overwrite=False, compute=False)
    p.put("y.npy", b"appeared")
    with pytest.raises(FileExistsError):
        dask.compute(v)
    assert p.raw("y.npy") == b"appeared" and p.uploads() == []


def test_to_npy_overwrite_false_never_replaces_an_object_that_appears_during_the_upload(place):
    """The object appears after the first task's HEAD: complete carries If-None-Match and is refused."""
    p, so = place, place.so
    bucket, key, endpoint = p.bucket, p.prefix + "z.npy", so["endpoint"]  # (plain values: dask tokenizes the function)

    def appear(block):
        client = boto3.client(
            "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ADMIN[0], aws_secret_access_key=ADMIN[1]
        )
        client.put_object(Bucket=bucket, Key=key, Body=b"the other writer")
        return block

    a = np.arange(3 << 20, dtype="<f4")
    x = da.from_array(a, chunks=5 << 18).map_blocks(appear, dtype=a.dtype)
    with pytest.raises(FileExistsError) as info:
        npydask.to_npy(x, p.url("z.npy"), storage_options=so, overwrite=False)
    assert info.value.filename == p.url("z.npy")
    assert p.raw("z.npy") == b"the other writer" and p.uploads() == []


def _failing(at: int):
    def fail(block, block_info=None):
        if block_info[0]["chunk-location"][0] == at:
            raise RuntimeError("chunk failed on purpose")
        return block

    return fail


@pytest.mark.parametrize("at", [0, 2])
def test_to_npy_failed_chunk_aborts_and_leaves_the_target_untouched(place, at):
    p, so = place, place.so
    p.put("t.npy", b"previous contents")
    a = np.arange(4 << 20, dtype="<f4")
    x = da.from_array(a, chunks=5 << 18).map_blocks(_failing(at), dtype=a.dtype)
    with pytest.raises(RuntimeError, match="on purpose"):
        npydask.to_npy(x, p.url("t.npy"), storage_options=so)
    assert p.raw("t.npy") == b"previous contents"
    assert p.uploads() == []


def test_to_npy_lazy_part_that_fails_aborts_the_upload(place):
    """With compute=False the part task aborts when its own upload fails (here: a chunk of another dtype)."""
    p, so = place, place.so
    p.put("t.npy", b"previous contents")
    a = np.arange(4 << 20, dtype="<f4")
    x = da.from_array(a, chunks=5 << 18)
    x = x.map_blocks(
        lambda blk, block_info=None: blk.astype("<c8") if block_info[0]["chunk-location"][0] == 1 else blk,
        dtype=a.dtype,
    )
    v = npydask.to_npy(x, p.url("t.npy"), storage_options=so, compute=False)
    with pytest.raises(TypeError, match="s3://.*t.npy.*complex64"):
        dask.compute(v)
    assert p.raw("t.npy") == b"previous contents"
    deadline = time.monotonic() + 10  # (parts still in flight when the abort lands fail too)
    while p.uploads() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert p.uploads() == []


_KILLED = textwrap.dedent(
    """
    import sys, time, numpy as np, dask, dask.array as da, npydask
    url, endpoint = sys.argv[1], sys.argv[2]
    so = {"endpoint": endpoint, "region": "us-east-1", "access_key_id": sys.argv[3],
          "secret_access_key": sys.argv[4]}
    def slow(block, block_info=None):
        if block_info[0]["chunk-location"][0] > 0:
            time.sleep(600)
        return block
    a = np.arange(6 << 20, dtype="<f4")
    x = da.from_array(a, chunks=5 << 18).map_blocks(slow, dtype=a.dtype)
    with dask.config.set(scheduler="threads", num_workers=2):
        npydask.to_npy(x, url, storage_options=so)
    """
)


def test_to_npy_killed_mid_upload_leaves_the_target_untouched(place, tmp_path):
    """SIGKILL mid-upload: no task can abort, so the upload stays listed (a lifecycle rule removes it)."""
    p, so = place, place.so
    p.put("k.npy", b"kept")
    script = tmp_path / "killed.py"
    script.write_text(_KILLED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, str(script), p.url("k.npy"), so["endpoint"], *ADMIN], env=env)
    try:
        deadline = time.monotonic() + 120
        while not p.uploads():
            assert proc.poll() is None, "the writer exited before its upload started"
            assert time.monotonic() < deadline, "no multipart upload started within 120 s"
            time.sleep(0.1)
        time.sleep(1.0)  # part 1 (not slowed) is uploading or uploaded
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert p.raw("k.npy") == b"kept"
    (pending,) = p.uploads()
    assert pending["Key"] == p.prefix + "k.npy"
    p.client.abort_multipart_upload(Bucket=p.bucket, Key=pending["Key"], UploadId=pending["UploadId"])
    assert p.uploads() == [] and p.raw("k.npy") == b"kept"


def test_to_npy_without_write_permission(s3):
    server, client = s3
    name = server.bucket
    key = f"ro{uuid.uuid4().hex[:12]}/a.npy"  # (the session's bucket is shared: look at this key only)
    with pytest.raises(PermissionError) as info:
        npydask.to_npy(np.arange(10), f"s3://{name}/{key}", storage_options=options(server, "readonly"))
    assert info.value.filename == f"s3://{name}/{key}"
    assert READER[1] not in str(info.value)
    assert client.list_objects_v2(Bucket=name, Prefix=key).get("KeyCount", 0) == 0
    assert client.list_multipart_uploads(Bucket=name, Prefix=key).get("Uploads", []) == []


def test_to_npy_credentials_from_the_environment(place, monkeypatch):
    p, so = place, place.so
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ADMIN[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ADMIN[1])
    a = np.arange(12.0).reshape(3, 4)
    plain = {"endpoint": so["endpoint"], "region": REGION}
    npydask.to_npy(a, p.url("env.npy"), storage_options=plain)
    npydask.to_npy_files([a], p.url("envfiles"), storage_options=plain)
    assert_same(p.load("env.npy"), a)
    assert_same(p.load("envfiles/00000.npy"), a)


def test_to_npy_on_processes(place):
    p, so = place, place.so
    a = np.random.default_rng(3).random((1 << 20,))
    x = da.from_array(a, chunks=5 << 17)
    npydask.to_npy(x, p.url("p.npy"), storage_options=so, compute=False).compute(scheduler="processes", num_workers=2)
    assert_same(p.load("p.npy"), a)


def test_on_a_cluster_with_credentials_only_in_the_workers_environment(place, monkeypatch):
    distributed = pytest.importorskip("distributed")
    p = place
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    plain = {"endpoint": p.so["endpoint"], "region": REGION}  # no credentials here
    env = {"AWS_ACCESS_KEY_ID": ADMIN[0], "AWS_SECRET_ACCESS_KEY": ADMIN[1]}
    a = np.random.default_rng(5).random((3 << 17, 4)).astype("<f4")  # 6 MiB
    p.put("t.npy", b"previous contents")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=50, env=env
        ) as lc,
        distributed.Client(lc),
    ):
        npydask.to_npy(da.from_array(a, chunks=(1 << 16, 4)), p.url("c.npy"), storage_options=plain)
        npydask.to_npy_files([a[:10], a[10:30]], p.url("files"), ["a", "b"], storage_options=plain)
        x = da.from_array(a, chunks=(5 << 16, 4)).map_blocks(_failing(1), dtype=a.dtype)
        with pytest.raises(RuntimeError, match="on purpose"):
            npydask.to_npy(x, p.url("t.npy"), storage_options=plain)
    assert_same(p.load("c.npy"), a)
    assert p.parts("c.npy") == 2
    assert_same(p.load("files/a.npy"), a[:10])
    assert_same(p.load("files/b.npy"), a[10:30])
    assert p.raw("t.npy") == b"previous contents" and p.uploads() == []


# --------------------------------------------------------------------------
# to_npy_files: one PUT per array


def test_to_npy_files_writes_what_numpy_loads(place):
    p, so = place, place.so
    arrays = [a for _, a in ARRAYS]
    arrays.append(da.from_array(np.arange(120.0).reshape(10, 12), chunks=(3, 5)))  # chunks splitting rows
    arrays.append(np.asfortranarray(np.arange(35, dtype=">i8").reshape(5, 7)))
    names = [f"sub/{n}" for n, _ in ARRAYS] + ["dask", "deep/er/fortran.npy"]
    npydask.to_npy_files(arrays, p.url("out/"), names, storage_options=so)
    for name, a in zip(names, arrays):
        key = "out/" + (name if name.endswith(".npy") else name + ".npy")
        assert_same(p.load(key), a.compute() if isinstance(a, da.Array) else a)
    assert len(p.keys()) == len(arrays)


def test_to_npy_files_default_names_and_prefix_without_slash(place):
    p, so = place, place.so
    arrays = [np.full((2, 2), i) for i in range(3)]
    v = npydask.to_npy_files(arrays, p.url("p"), storage_options=so, compute=False)
    assert p.keys() == set()
    dask.compute(v)
    for i, a in enumerate(arrays):
        assert_same(p.load(f"p/{i:05d}.npy"), a)


def test_object_target_sends_one_whole_object_or_nothing(place):
    from npydask.storage.object_write import ObjectTarget
    from npydask.storage.where import resolve

    p = place
    url, source = (where := resolve(p.url("t.bin"), p.so)).path, where.source
    with ObjectTarget(source, url, 6) as t:
        t.write_block(3, b"def")
        with pytest.raises(ValueError, match="does not fit"):
            t.write_block(4, b"xyz")
        t.write_block(0, b"abc")
        t.finish()
    assert p.raw("t.bin") == b"abcdef"
    t = ObjectTarget(source, url, 6)
    t.write_block(0, b"zzz")
    with pytest.raises(OSError, match="blocks are missing"):
        t.finish()
    with pytest.raises(RuntimeError, match="the block failed"):
        _write_then_fail(ObjectTarget(source, p.url("u.bin"), 3), b"abc", "the block failed")
    assert p.raw("t.bin") == b"abcdef" and p.keys() == {"t.bin"}


def _write_then_fail(target: Target, block: bytes, why: str) -> None:
    """Write ``block`` at offset 0 inside ``with target`` and fail, as a task that dies mid-write does."""
    with target:
        target.write_block(0, block)
        raise RuntimeError(why)


def test_to_npy_files_checks_names_as_local(place):
    p, so = place, place.so
    refusals = [
        (["../a"], "escapes the output folder"),
        (["/abs"], "must be a relative path"),
        (["a/"], "names no file"),
        (["a", "a.npy"], "both write"),
    ]
    for bad, why in refusals:
        with pytest.raises(ValueError, match=why):
            npydask.to_npy_files([np.arange(2)] * len(bad), p.url("p"), bad, storage_options=so)


def test_to_npy_files_overwrite_false(place):
    p, so = place, place.so
    p.put("p/b.npy", b"kept")
    with pytest.raises(FileExistsError) as info:
        npydask.to_npy_files([np.arange(2), np.arange(3)], p.url("p"), ["a", "b"], storage_options=so, overwrite=False)
    assert info.value.filename == p.url("p/b.npy")
    assert p.keys() == {"p/b.npy"}  # nothing written: checked before any work
    # appearing after the check: the create-only PUT refuses it
    v = npydask.to_npy_files([np.arange(2)], p.url("p"), ["c"], storage_options=so, overwrite=False, compute=False)
    p.put("p/c.npy", b"first")
    with pytest.raises(FileExistsError) as info:
        dask.compute(v)
    assert info.value.filename == p.url("p/c.npy")
    assert p.raw("p/c.npy") == b"first" and p.raw("p/b.npy") == b"kept"


def test_to_npy_files_without_write_permission(s3):
    server, client = s3
    name = server.bucket
    with pytest.raises(PermissionError) as info:
        npydask.to_npy_files([np.arange(3)], f"s3://{name}/p", ["a"], storage_options=options(server, "readonly"))
    assert info.value.filename == f"s3://{name}/p/a.npy"
    assert READER[1] not in str(info.value)


def test_to_npy_files_from_a_dataset_read_back_from_s3(place, tmp_path):
    p, so = place, place.so
    for i in range(3):
        os.makedirs(tmp_path / "in" / f"d{i % 2}", exist_ok=True)
        np.save(tmp_path / "in" / f"d{i % 2}" / f"s{i}.npy", np.full((4, 3), i, dtype="<u2"))
    ds = npydask.open_dataset(str(tmp_path / "in"))
    npydask.to_npy_files(ds, p.url("copy"), storage_options=so)
    for f in ds.files:
        rel = os.path.relpath(f, tmp_path / "in").replace(os.sep, "/")
        assert_same(p.load(f"copy/{rel}"), np.load(f))


# --------------------------------------------------------------------------
# to_zarr to a URL


def test_to_zarr_to_a_url_with_the_same_storage_options(place):
    zarr = pytest.importorskip("zarr")
    from npydask.storage.zarr_store import SpecObjectStore

    p, so = place, place.so
    a = np.random.default_rng(4).random((100, 60))
    npydask.to_zarr(da.from_array(a, chunks=(30, 20)), p.url("z/a.zarr"), storage_options=so)
    v = npydask.to_zarr(
        da.from_array(a, chunks=(25, 60)),
        p.url("z"),
        storage_options=so,
        name="b.zarr",
        compute=False,
        shards=(50, 60),
        chunks=(25, 30),
    )
    v.compute(scheduler="processes", num_workers=2)  # the store pickles as its spec
    store = SpecObjectStore(StoreSpec.of(f"s3://{p.bucket}", so), read_only=True)
    np.testing.assert_array_equal(zarr.open_array(store, path=p.prefix + "z/a.zarr", mode="r")[:], a)
    np.testing.assert_array_equal(zarr.open_array(store, path=p.prefix + "z/b.zarr", mode="r")[:], a)
    assert {"z/a.zarr/zarr.json", "z/b.zarr/zarr.json"} <= p.keys()
    # rooted at the URL, as zarr roots an fsspec URL: nothing above it (name= makes its parent a group)
    assert {k for k in p.keys() if not k.startswith(("z/a.zarr/", "z/b.zarr/"))} == {"z/zarr.json"}
    assert "Contents" not in p.client.list_objects_v2(Bucket=p.bucket, Prefix="zarr.json")


def test_to_zarr_without_write_permission(s3):
    pytest.importorskip("zarr")
    server, _ = s3
    with pytest.raises(PermissionError) as info:
        npydask.to_zarr(np.arange(10), f"s3://{server.bucket}/z.zarr", storage_options=options(server, "readonly"))
    assert info.value.filename == f"s3://{server.bucket}/z.zarr/zarr.json"
    assert READER[1] not in str(info.value) and "Error performing" not in str(info.value)


def test_local_paths_refuse_storage_options(tmp_path):
    with pytest.raises(ValueError, match="storage_options"):
        npydask.to_npy(np.arange(3), str(tmp_path / "a.npy"), storage_options={"region": "x"})
    with pytest.raises(ValueError, match="storage_options"):
        npydask.to_npy_files([np.arange(3)], str(tmp_path / "out"), storage_options={"region": "x"})
    assert not os.listdir(tmp_path)


def test_to_zarr_local_path_refuses_storage_options(tmp_path):
    pytest.importorskip("zarr")
    with pytest.raises(ValueError, match="storage_options"):
        npydask.to_zarr(np.arange(3), str(tmp_path / "a.zarr"), storage_options={"region": "x"})


def test_boto3_without_credentials_says_none_were_found() -> None:
    from botocore.exceptions import NoCredentialsError

    err = translate_boto(NoCredentialsError(), "s3://b/k.npy", "starting the multipart upload")
    assert isinstance(err, PermissionError) and "no credentials were found" in str(err)
    assert "Put rights" in str(err) and err.filename == "s3://b/k.npy"
