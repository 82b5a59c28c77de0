"""The servers every object-storage test and the remote benchmark run against.

``npydask.testing.seaweed`` (SeaweedFS's S3), ``npydask.testing.http_range`` (a
range-capable HTTP server) and ``npydask.testing.counting_proxy``, checked with
boto3 and obstore directly (nothing of npydask's object-storage reading code).

What these tests pin down about obstore 0.12 against SeaweedFS 4.x (the reading
code depends on it):

- missing key: builtin ``FileNotFoundError`` (obstore's ``NotFoundError`` is deprecated);
- denied GET/PUT (wrong identity, wrong secret, unknown key, anonymous on a
  private bucket): ``obstore.exceptions.PermissionDeniedError`` (HTTP 403);
  a denied LIST, though, is a ``GenericError`` whose text says ``403 Forbidden``;
- ``get(..., options={"range": (a, b), "if_match": etag})``: the bytes
  ``[a, b)`` when the ETag matches (quoted or not); ``PreconditionError`` (412)
  when it does not; a range starting past the end: ``GenericError`` (416); a
  range ending past the end: the bytes up to the end;
- ``put(mode="create")`` over an existing key: ``AlreadyExistsError`` (412), and
  the object is unchanged; SeaweedFS honours ``If-None-Match: *``;
- connection refused and timeouts: ``GenericError``; its text says
  ``kind: Connect`` (refused) or ``kind: Timeout``;
- against a plain HTTP server that ignores ``If-Match``, ``if_match`` with a
  wrong ETag returns the bytes: the caller must compare the response's ETag;
- multipart uploads, ``ListMultipartUploads`` and aborts work; a non-last part
  under 5 MiB fails the completion with ``EntityTooSmall``.
"""

from __future__ import annotations

import asyncio
import datetime
import http.client
import io
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("no_hedging")  # (counts requests: a hedge adds one)

obstore = pytest.importorskip("obstore")
boto3 = pytest.importorskip("boto3")
from botocore.exceptions import ClientError  # noqa: E402
from obstore.exceptions import (  # noqa: E402
    AlreadyExistsError,
    GenericError,
    PermissionDeniedError,
    PreconditionError,
)
from obstore.store import HTTPStore  # noqa: E402

from npydask.testing.counting_proxy import CountingProxy  # noqa: E402
from npydask.testing.http_range import RangeHTTPServer  # noqa: E402
from npydask.testing.seaweed import SeaweedServer, find_weed, free_ports  # noqa: E402

ARRAYS = [
    np.arange(1000, dtype="<f4").reshape(10, 100),
    np.arange(24, dtype=">i8").reshape(2, 3, 4),
    np.asfortranarray(np.linspace(0, 1, 300).reshape(15, 20)),
    np.zeros((0, 5), dtype="u1"),
    np.array(3.5),
]


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _store(server: SeaweedServer, identity: str = "admin", bucket: str | None = None, **extra):
    return server.obstore_store(identity, bucket, **extra)


def _prefix(request) -> str:
    """A key prefix of the test's own on the shared server (ASCII: see test_seaweed_key_rewriting)."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', request.node.name)}-{time.monotonic_ns()}/"


def _connect_refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# -- SeaweedFS ------------------------------------------------------------------------------


def test_boto3_admin_put_get_equals_numpy(s3_server, request, tmp_path):
    s3 = s3_server.boto3_client()
    prefix = _prefix(request)
    for i, array in enumerate(ARRAYS):
        path = tmp_path / f"a{i}.npy"
        np.save(path, array)
        s3.upload_file(str(path), s3_server.bucket, f"{prefix}a{i}.npy")
        body = s3.get_object(Bucket=s3_server.bucket, Key=f"{prefix}a{i}.npy")["Body"].read()
        assert body == path.read_bytes()
        got = np.load(io.BytesIO(body))
        np.testing.assert_array_equal(got, np.load(path))
        assert got.dtype == array.dtype


def test_obstore_ranges_and_meta(s3_server, request, tmp_path):
    """Range GETs return exactly [a, b) of the object; a range past the end is cut at the end."""
    prefix = _prefix(request)
    array = np.random.default_rng(0).standard_normal((64, 33)).astype(">f8")
    path = tmp_path / "v.npy"
    np.save(path, array)
    data = path.read_bytes()
    store = _store(s3_server)
    obstore.put(store, prefix + "v.npy", data)
    head = s3_server.boto3_client().head_object(Bucket=s3_server.bucket, Key=prefix + "v.npy")
    size = len(data)
    for a, b in [(0, 128), (128, size), (1, 2), (size - 1, size), (1000, 9000), (5, size + 500)]:
        result = obstore.get(store, prefix + "v.npy", options={"range": (a, b)})
        assert bytes(result.bytes()) == data[a:b]
        assert result.range == (a, min(b, size))
        assert result.meta["size"] == size
        assert result.meta["e_tag"] == head["ETag"]
    pieces = [
        bytes(obstore.get(store, prefix + "v.npy", options={"range": (a, min(a + 1000, size))}).bytes())
        for a in range(0, size, 1000)
    ]
    np.testing.assert_array_equal(np.load(io.BytesIO(b"".join(pieces))), array)
    with pytest.raises(GenericError, match="416"):
        obstore.get(store, prefix + "v.npy", options={"range": (size, size + 10)})
    with pytest.raises(FileNotFoundError):
        obstore.get(store, prefix + "missing.npy", options={"range": (0, 10)})
    with pytest.raises(FileNotFoundError):
        obstore.head(store, prefix + "missing.npy")


def test_obstore_if_match(s3_server, request):
    """SeaweedFS honours If-Match on GET: the right ETag reads, a wrong or stale one is 412."""
    prefix = _prefix(request)
    store = _store(s3_server)
    key = prefix + "x.npy"
    first, second = _npy_bytes(np.arange(100)), _npy_bytes(np.arange(100) * 2)
    etag = obstore.put(store, key, first)["e_tag"]
    for tag in (etag, etag.strip('"')):
        got = obstore.get(store, key, options={"range": (10, 50), "if_match": tag})
        assert bytes(got.bytes()) == first[10:50]
    with pytest.raises(PreconditionError):
        obstore.get(store, key, options={"range": (10, 50), "if_match": '"0123456789abcdef"'})
    new_etag = obstore.put(store, key, second)["e_tag"]  # replaced between open and read
    assert new_etag != etag
    with pytest.raises(PreconditionError):
        obstore.get(store, key, options={"range": (10, 50), "if_match": etag})
    got = obstore.get(store, key, options={"range": (0, len(second)), "if_match": new_etag})
    np.testing.assert_array_equal(np.load(io.BytesIO(bytes(got.bytes()))), np.arange(100) * 2)


def test_put_create_refuses_an_existing_key(s3_server, request):
    """put(mode="create") sends If-None-Match: *; SeaweedFS answers 412 -> AlreadyExistsError."""
    prefix = _prefix(request)
    store = _store(s3_server)
    obstore.put(store, prefix + "c", b"one", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, prefix + "c", b"two", mode="create")
    with pytest.raises(ClientError) as caught:
        s3_server.boto3_client().put_object(Bucket=s3_server.bucket, Key=prefix + "c", Body=b"three", IfNoneMatch="*")
    assert caught.value.response["Error"]["Code"] == "PreconditionFailed"
    assert bytes(obstore.get(store, prefix + "c").bytes()) == b"one"


def test_multipart_upload_list_and_abort(s3_server, request):
    s3 = s3_server.boto3_client()
    bucket, prefix = s3_server.bucket, _prefix(request)

    def uploads() -> set[str]:
        listed = s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        return {u["UploadId"] for u in listed.get("Uploads", [])}

    parts_data = [os.urandom(5 << 20), os.urandom(1234)]
    done = s3.create_multipart_upload(Bucket=bucket, Key=prefix + "done")["UploadId"]
    parts = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(Bucket=bucket, Key=prefix + "done", UploadId=done, PartNumber=n, Body=body)["ETag"],
        }
        for n, body in enumerate(parts_data, start=1)
    ]
    dropped = s3.create_multipart_upload(Bucket=bucket, Key=prefix + "dropped")["UploadId"]
    s3.upload_part(Bucket=bucket, Key=prefix + "dropped", UploadId=dropped, PartNumber=1, Body=b"x")
    assert uploads() == {done, dropped}
    s3.complete_multipart_upload(Bucket=bucket, Key=prefix + "done", UploadId=done, MultipartUpload={"Parts": parts})
    s3.abort_multipart_upload(Bucket=bucket, Key=prefix + "dropped", UploadId=dropped)
    assert uploads() == set()
    body = s3.get_object(Bucket=bucket, Key=prefix + "done")["Body"].read()
    assert body == b"".join(parts_data)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key=prefix + "dropped")


def test_multipart_parts_below_5_mib_are_refused(s3_server, request):
    """SeaweedFS, like S3, refuses to complete an upload whose non-last part is under 5 MiB."""
    s3 = s3_server.boto3_client()
    bucket, key = s3_server.bucket, _prefix(request) + "small"
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=n, Body=body)["ETag"],
        }
        for n, body in ((1, b"a" * ((5 << 20) - 1)), (2, b"b" * 10))
    ]
    with pytest.raises(ClientError) as caught:
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
    assert caught.value.response["Error"]["Code"] == "EntityTooSmall"
    s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)


def test_readonly_identity(s3_server, request):
    """Read and List on its one bucket; writes there and anything on another bucket are denied."""
    prefix = _prefix(request)
    data = _npy_bytes(np.arange(50, dtype="i2"))
    obstore.put(_store(s3_server), prefix + "r.npy", data)
    obstore.put(_store(s3_server, bucket=s3_server.private_bucket), prefix + "p", b"private")
    ro = _store(s3_server, "readonly")
    got = obstore.get(ro, prefix + "r.npy", options={"range": (0, len(data))})
    np.testing.assert_array_equal(np.load(io.BytesIO(bytes(got.bytes()))), np.arange(50, dtype="i2"))
    listed = [m["path"] for batch in obstore.list(ro, prefix=prefix) for m in batch]
    assert listed == [prefix + "r.npy"]
    with pytest.raises(PermissionDeniedError):
        obstore.put(ro, prefix + "w", b"x")
    other = _store(s3_server, "readonly", bucket=s3_server.private_bucket)
    with pytest.raises(PermissionDeniedError):
        obstore.get(other, prefix + "p")
    with pytest.raises(GenericError, match="403"):  # a denied LIST is not PermissionDeniedError
        list(obstore.list(other, prefix=prefix))
    s3 = s3_server.boto3_client("readonly")
    for call in (
        lambda: s3.put_object(Bucket=s3_server.bucket, Key=prefix + "w", Body=b"x"),
        lambda: s3.get_object(Bucket=s3_server.private_bucket, Key=prefix + "p"),
    ):
        with pytest.raises(ClientError) as caught:
            call()
        assert caught.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(FileNotFoundError):
        obstore.head(_store(s3_server), prefix + "w")


def test_wrong_credentials_are_denied(s3_server, request):
    prefix = _prefix(request)
    obstore.put(_store(s3_server), prefix + "k", b"data")
    options = s3_server.storage_options()
    for key_id, secret in [(options["access_key_id"], "wrong"), ("nobody", "wrong")]:
        store = s3_server.obstore_store(access_key_id=key_id, secret_access_key=secret)
        with pytest.raises(PermissionDeniedError):
            obstore.get(store, prefix + "k")


def test_anonymous_reads_the_public_bucket_only(s3_server, request):
    prefix = _prefix(request)
    array = np.arange(12, dtype="<u2").reshape(3, 4)
    obstore.put(_store(s3_server, bucket=s3_server.public_bucket), prefix + "p.npy", _npy_bytes(array))
    obstore.put(_store(s3_server), prefix + "d", b"not public")
    anon = _store(s3_server, "anonymous", bucket=s3_server.public_bucket)
    assert s3_server.storage_options("anonymous")["skip_signature"] is True
    got = obstore.get(anon, prefix + "p.npy")
    np.testing.assert_array_equal(np.load(io.BytesIO(bytes(got.bytes()))), array)
    assert [m["path"] for b in obstore.list(anon, prefix=prefix) for m in b] == [prefix + "p.npy"]
    with pytest.raises(PermissionDeniedError):
        obstore.put(anon, prefix + "q", b"x")
    with pytest.raises(PermissionDeniedError):
        obstore.get(_store(s3_server, "anonymous"), prefix + "d")
    body = (
        s3_server.boto3_client("anonymous")
        .get_object(Bucket=s3_server.public_bucket, Key=prefix + "p.npy")["Body"]
        .read()
    )
    assert body == _npy_bytes(array)


def test_listing_of_2500_keys_paginates(s3_server, request):
    prefix = _prefix(request)
    store = _store(s3_server)
    keys = [f"{prefix}{i:05d}.npy" for i in range(2500)]

    async def put_all() -> None:
        gate = asyncio.Semaphore(32)

        async def put(key: str) -> None:
            async with gate:
                await obstore.put_async(store, key, key.encode())

        await asyncio.gather(*(put(k) for k in keys))

    asyncio.run(put_all())
    first = s3_server.boto3_client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix)
    assert first["IsTruncated"] and first["KeyCount"] == 1000  # the server pages by 1,000
    listed = [(m["path"], m["size"]) for batch in obstore.list(store, prefix=prefix) for m in batch]
    assert sorted(listed) == [(k, len(k.encode())) for k in keys]
    paginator = s3_server.boto3_client().get_paginator("list_objects_v2")
    pages = list(paginator.paginate(Bucket=s3_server.bucket, Prefix=prefix))
    assert len(pages) == 3
    assert [o["Key"] for p in pages for o in p["Contents"]] == keys


@pytest.mark.parametrize("name", ["with space.npy", "ünïcödé ≈ 東京.npy", "a+b=c&d%20e.npy", "dir x/ß y.npy"])
def test_keys_with_spaces_and_non_ascii(s3_server, request, name):
    prefix = _prefix(request)
    array = np.arange(7, dtype="f8")
    data = _npy_bytes(array)
    store = _store(s3_server)
    obstore.put(store, prefix + name, data)
    s3 = s3_server.boto3_client()
    assert s3.get_object(Bucket=s3_server.bucket, Key=prefix + name)["Body"].read() == data
    listed = s3.list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix)["Contents"]
    assert [o["Key"] for o in listed] == [prefix + name]
    assert [m["path"] for b in obstore.list(store, prefix=prefix) for m in b] == [prefix + name]
    got = obstore.get(store, prefix + name, options={"range": (0, len(data))})
    np.testing.assert_array_equal(np.load(io.BytesIO(bytes(got.bytes()))), array)


def test_seaweed_key_rewriting(s3_server, request):
    """SeaweedFS stores keys as filer paths: what it rewrites and refuses (tests must avoid these).

    A backslash becomes "/", "//" collapses, a leading "/" goes, and "." or ".."
    segments are refused (InvalidRequest). GETs by the original key still work;
    listings show the rewritten keys. A "folder/" marker lists as "folder" in obstore.
    """
    prefix = _prefix(request)
    s3 = s3_server.boto3_client()
    rewritten = {"b\\c": "b/c", "d//e": "d/e", "f/\\g": "f/g"}
    for key in [*rewritten, "marker/"]:
        s3.put_object(Bucket=s3_server.bucket, Key=prefix + key, Body=b"")
        assert s3.get_object(Bucket=s3_server.bucket, Key=prefix + key)["Body"].read() == b""
    listed = s3.list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix)["Contents"]
    expected = sorted(prefix + k for k in [*rewritten.values(), "marker/"])
    assert [o["Key"] for o in listed] == expected
    store = _store(s3_server)
    assert sorted(m["path"] for b in obstore.list(store, prefix=prefix) for m in b) == sorted(
        prefix + k for k in [*rewritten.values(), "marker"]
    )
    for key in ("h/./i", "j/../k"):
        with pytest.raises(ClientError) as caught:
            s3.put_object(Bucket=s3_server.bucket, Key=prefix + key, Body=b"x")
        assert caught.value.response["Error"]["Code"] == "InvalidRequest"


def test_obstore_store_pickles_and_reads_in_another_process(s3_server, request):
    """What tasks carry: obstore_store() (allow_http as a client option) pickles and reads."""
    prefix = _prefix(request)
    data = _npy_bytes(np.arange(40, dtype="<f2"))
    store = _store(s3_server, "readonly")
    obstore.put(_store(s3_server), prefix + "t.npy", data)
    code = f"""if True:
        import pickle, sys, obstore
        store = pickle.loads(bytes.fromhex(sys.stdin.read()))
        got = obstore.get(store, {prefix + "t.npy"!r}, options={{"range": (0, {len(data)})}})
        sys.stdout.write(bytes(got.bytes()).hex())
    """
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(store).hex(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(io.BytesIO(bytes.fromhex(out.stdout))), np.arange(40, dtype="<f2"))
    assert store.client_options == {"allow_http": "true"}
    assert store.config["endpoint"] == s3_server.endpoint


def test_workers_find_the_server_through_their_environment(s3_server, request):
    """server.env(): obstore's S3Store(bucket) and boto3.client("s3") need nothing else."""
    prefix = _prefix(request)
    data = _npy_bytes(np.arange(30, dtype="i4"))
    obstore.put(_store(s3_server), prefix + "e.npy", data)
    code = f"""if True:
        import boto3, obstore, sys
        from obstore.store import S3Store
        got = bytes(obstore.get(S3Store({s3_server.bucket!r}), {prefix + "e.npy"!r}).bytes())
        s3 = boto3.client("s3")
        body = s3.get_object(Bucket={s3_server.bucket!r}, Key={prefix + "e.npy"!r})["Body"].read()
        sys.stdout.write(repr((got == body, got.hex())))
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3_server.env("readonly"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == repr((True, data.hex()))
    anon = s3_server.env("anonymous")
    assert "AWS_ACCESS_KEY_ID" not in anon and anon["AWS_SKIP_SIGNATURE"] == "true"


def _sockets_of(pid: int) -> list[tuple[str, str, int, bool]]:
    """(protocol, local address, local port, listening) of every TCP/UDP socket of ``pid``."""
    import ipaddress

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with open(f"/proc/net/{proto}") as f:
            next(f)
            for line in f:
                fields = line.split()
                address, port = fields[1].split(":")
                if int(fields[9]) not in inodes:
                    continue
                raw = bytes.fromhex(address)
                # /proc/net holds each 32-bit word of the address in host (little-endian) order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(raw)
                if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
                    ip = ip.ipv4_mapped
                found.append((proto, str(ip), int(port, 16), fields[3] == "0A" and "tcp" in proto))
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux's /proc/net")
def test_listens_on_loopback_only_on_the_ports_given(s3_server):
    sockets = _sockets_of(s3_server.pid)
    listening = {port for _, _, port, listens in sockets if listens}
    assert listening == set(s3_server.ports.values())
    assert len(s3_server.ports) == 8
    assert sockets and all(addr == "127.0.0.1" for _, addr, _, _ in sockets), sockets


def test_stop_kill_pause_restart(s3_server_disposable, tmp_path):
    """The drills' building blocks on a server of the test's own; stop() leaves nothing behind."""
    server = s3_server_disposable
    store = _store(server)
    obstore.put(store, "keep.npy", _npy_bytes(np.arange(9)))
    fast = {"timeout": "1s", "connect_timeout": "1s"}
    once = {"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=2)}

    server.pause()  # hung: the kernel accepts, nobody answers
    hung = server.obstore_store(client_options=fast, retry_config=once)
    start = time.monotonic()
    with pytest.raises(GenericError, match="kind: Timeout"):
        obstore.get(hung, "keep.npy")
    assert time.monotonic() - start < 10
    server.resume()
    assert bytes(obstore.get(store, "keep.npy").bytes()) == _npy_bytes(np.arange(9))

    server.kill()  # gone: connection refused
    assert _connect_refused(server.ports["s3.port"])
    with pytest.raises(GenericError, match="kind: Connect"):
        obstore.get(hung, "keep.npy")
    server.restart()  # back on the same ports, data kept
    assert bytes(obstore.get(store, "keep.npy").bytes()) == _npy_bytes(np.arange(9))

    pid, folder, ports = server.pid, server.folder, list(server.ports.values())
    server.stop()
    assert not server.running and server.pid is None
    assert not os.path.exists(f"/proc/{pid}")
    group = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(p) == pid]
    assert group == []
    assert not os.path.exists(folder)
    assert all(_connect_refused(port) for port in ports)
    assert not [
        p for p in Path("/tmp").glob("seaweedfs-*.sock") if any(p.name.endswith(f"-{port}.sock") for port in ports)
    ]
    server.stop()  # twice is fine


def _pgid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


@pytest.mark.parametrize("flag", ["s3.port", "master.port.grpc"])
def test_start_retries_when_another_process_took_a_port(monkeypatch, flag):
    """free_ports() chooses, another process binds one first: weed exits, start() retries."""
    import npydask.testing.seaweed as seaweed

    try:
        seaweed.find_weed()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    blocker = socket.create_server(("127.0.0.1", 0))
    taken = blocker.getsockname()[1]
    chosen: list[list[int]] = []

    def racing_free_ports(count: int) -> list[int]:
        ports = free_ports(count)
        if not chosen:
            ports[seaweed._PORT_FLAGS.index(flag)] = taken
        chosen.append(ports)
        return ports

    monkeypatch.setattr(seaweed, "free_ports", racing_free_ports)
    try:
        with SeaweedServer() as server:
            assert len(chosen) == 2 and taken not in server.ports.values()
            assert server.ports[flag] == chosen[1][seaweed._PORT_FLAGS.index(flag)]
            store = _store(server)
            obstore.put(store, "k", b"v")
            assert bytes(obstore.get(store, "k").bytes()) == b"v"
    finally:
        blocker.close()


def test_missing_binary_is_a_clear_error(tmp_path):
    server = SeaweedServer(binary=str(tmp_path / "no-weed"))
    with pytest.raises(FileNotFoundError, match="no-weed"):
        server.start()
    assert server.folder is None


def test_failed_start_names_the_log(tmp_path):
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'fake weed: cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="(?s)status 3.*fake weed: cannot start"):
        SeaweedServer(binary=str(fake)).start()


def test_a_disk_below_the_free_space_floor_is_named_in_the_error():
    """A full disk keeps weed's volumes read-only; the start fails naming the free space.

    CI's shared disk once had 0.9% free, under weed's default floor of 1%: every
    S3 test errored with "no write within 60 s". The floor is now 256 MiB; here a
    floor above any disk's size stands for the full disk.
    """
    pytest.importorskip("boto3")
    try:
        find_weed()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    server = SeaweedServer(startup_timeout=8.0, min_free_space="1000000GiB")
    with pytest.raises(RuntimeError, match=r"no write within 8.0 s.*its disk has \d+ MiB free"):
        server.start()
    assert not server.running


def test_identity_file_grants(s3_server):
    config = json.loads(Path(s3_server.folder, "identities.json").read_text())
    actions = {i["name"]: i["actions"] for i in config["identities"]}
    assert actions["readonly"] == [f"Read:{s3_server.bucket}", f"List:{s3_server.bucket}"]
    assert actions["anonymous"] == [f"Read:{s3_server.public_bucket}", f"List:{s3_server.public_bucket}"]
    with pytest.raises(KeyError, match="unknown identity 'root'"):
        s3_server.storage_options("root")


# -- the HTTP range server ------------------------------------------------------------------


def _request(server: RangeHTTPServer, method: str, path: str, **headers: str):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.fixture
def served(tmp_path, http_server):
    array = np.random.default_rng(1).integers(0, 1000, (40, 25)).astype("<i4")
    np.save(tmp_path / "v.npy", array)
    (tmp_path / "sub").mkdir()
    return tmp_path, (tmp_path / "v.npy").read_bytes(), array


def test_http_ranges(served, http_server):
    root, data, array = served
    server = http_server(root)
    size = len(data)
    cases = {
        "bytes=0-127": (0, 128),
        "bytes=128-": (128, size),
        "bytes=-100": (size - 100, size),
        f"bytes=10-{size + 50}": (10, size),
        f"bytes={size - 1}-{size - 1}": (size - 1, size),
        f"bytes=-{size * 2}": (0, size),
    }
    for header, (a, b) in cases.items():
        status, headers, body = _request(server, "GET", "/v.npy", Range=header)
        assert (status, body) == (206, data[a:b]), header
        assert headers["Content-Range"] == f"bytes {a}-{b - 1}/{size}"
        assert headers["Content-Length"] == str(b - a)
    status, headers, body = _request(server, "GET", "/v.npy")
    assert status == 200 and headers["Content-Length"] == str(size)
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), array)
    status, headers, body = _request(server, "GET", "/v.npy", Range="bytes=0-1,5-6")
    assert (status, body) == (200, data)  # a list of ranges: the whole file
    status, headers, body = _request(server, "HEAD", "/v.npy", Range="bytes=0-9")
    assert (status, body, headers["Content-Length"]) == (206, b"", "10")


def test_http_errors(served, http_server):
    root, data, _ = served
    server = http_server(root)
    for path in ("/missing.npy", "/sub", "/%2e%2e/etc/passwd"):
        assert _request(server, "GET", path)[0] == 404, path
    inner = http_server(root / "sub")
    assert _request(inner, "GET", "/../v.npy")[0] == 404  # outside its root
    assert _request(server, "GET", "/sub/../v.npy")[0] == 200  # inside it
    status, headers, body = _request(server, "GET", "/v.npy", Range=f"bytes={len(data)}-")
    assert (status, headers["Content-Range"], body) == (416, f"bytes */{len(data)}", b"")
    assert _request(server, "DELETE", "/v.npy")[0] == 501


def test_http_etag_and_if_match(served, http_server):
    root, data, _ = served
    for honour in (False, True):
        server = http_server(root, honour_if_match=honour)
        status, headers, _ = _request(server, "HEAD", "/v.npy")
        etag = headers["ETag"]
        assert etag == server.etag("v.npy") and headers["Last-Modified"].endswith("GMT")
        assert _request(server, "GET", "/v.npy", Range="bytes=0-9", **{"If-Match": etag})[0] == 206
        assert _request(server, "GET", "/v.npy", Range="bytes=0-9", **{"If-Match": "*"})[0] == 206
        status, _, body = _request(server, "GET", "/v.npy", Range="bytes=0-9", **{"If-Match": '"nope"'})
        assert (status, body) == ((412, b"") if honour else (206, data[:10]))
    replacement = root / "new.npy"
    np.save(replacement, np.zeros(3))
    os.replace(replacement, root / "v.npy")
    assert _request(server, "HEAD", "/v.npy")[1]["ETag"] != etag
    status, _, body = _request(server, "GET", "/v.npy", Range="bytes=0-9", **{"If-Match": etag})
    assert (status, body) == (412, b"")


def test_http_switches(served, http_server):
    root, data, _ = served
    server = http_server(root, ranges=False, send_etag=False)
    status, headers, body = _request(server, "GET", "/v.npy", Range="bytes=0-9")
    assert (status, body) == (200, data)
    assert "ETag" not in headers and "Last-Modified" in headers


def test_http_fault_modes_and_missing_versions(served, http_server):
    root, data, _ = served
    bare = http_server(root, send_etag=False, send_last_modified=False)
    status, headers, _ = _request(bare, "GET", "/v.npy", Range="bytes=0-9")
    assert status == 206 and "ETag" not in headers and "Last-Modified" not in headers
    wrong = http_server(root, fault="wrong-range")
    status, headers, body = _request(wrong, "GET", "/v.npy", Range="bytes=100-199")
    assert (status, headers["Content-Range"], body) == (206, f"bytes 0-99/{len(data)}", data[:100])
    short = http_server(root, fault="short-body")
    conn = http.client.HTTPConnection("127.0.0.1", short.port, timeout=10)
    conn.request("GET", "/v.npy", headers={"Range": "bytes=100-199"})
    response = conn.getresponse()
    assert response.status == 206 and response.getheader("Content-Length") == "100"
    with pytest.raises(http.client.IncompleteRead) as info:
        response.read()
    assert info.value.partial == data[100:150]
    conn.close()
    with pytest.raises(ValueError, match="fault"):
        RangeHTTPServer(root, fault="slow")


def test_http_basic_auth_and_raw_targets(served, http_server):
    import base64

    root, data, _ = served
    server = http_server(root, basic_auth=("ann", "p@ss:w"))
    status, headers, _ = _request(server, "GET", "/v.npy")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    good = "Basic " + base64.b64encode(b"ann:p@ss:w").decode()
    status, _, body = _request(server, "GET", "/v%2Enpy?x=1", Authorization=good)
    assert (status, body) == (200, data)
    assert [(r.status, r.target, r.authorization) for r in server.stats.log] == [
        (401, "/v.npy", None),
        (200, "/v%2Enpy?x=1", good),
    ]
    status, _, _ = _request(server, "GET", "/v.npy", Authorization="Basic " + base64.b64encode(b"ann:no").decode())
    assert status == 401


def test_http_counts_exactly_the_bytes_sent(served, http_server):
    root, data, _ = served
    server = http_server(root)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)  # one kept-alive connection
    spans = [(0, 128), (500, 1500), (3000, 3001)]
    for a, b in spans:
        conn.request("GET", "/v.npy", headers={"Range": f"bytes={a}-{b - 1}"})
        assert conn.getresponse().read() == data[a:b]
    conn.close()
    _request(server, "HEAD", "/v.npy")
    _request(server, "GET", "/missing")
    stats = server.reset_stats()
    assert stats.requests == 5 and stats.bytes_sent == sum(b - a for a, b in spans)
    assert [(r.method, r.status, r.bytes_sent) for r in stats.log] == [
        ("GET", 206, 128),
        ("GET", 206, 1000),
        ("GET", 206, 1),
        ("HEAD", 200, 0),
        ("GET", 404, 0),
    ]
    assert server.stats.requests == 0


def test_http_names_with_spaces_and_non_ascii(tmp_path, http_server):
    array = np.arange(5, dtype="u8")
    (tmp_path / "dir ü").mkdir()
    np.save(tmp_path / "dir ü" / "a b ≈.npy", array)
    server = http_server(tmp_path)
    import urllib.request

    with urllib.request.urlopen(server.url("dir ü/a b ≈.npy")) as response:
        np.testing.assert_array_equal(np.load(io.BytesIO(response.read())), array)


def test_obstore_over_http(served, http_server):
    """obstore's HTTPStore: ranges, 404, and If-Match as the server treats it."""
    root, data, array = served
    for honour in (False, True):
        server = http_server(root, honour_if_match=honour)
        store = HTTPStore.from_url(server.endpoint, client_options={"allow_http": True})
        got = obstore.get(store, "v.npy", options={"range": (16, 400)})
        assert bytes(got.bytes()) == data[16:400] and got.meta["e_tag"] == server.etag("v.npy")
        with pytest.raises(FileNotFoundError):
            obstore.get(store, "missing.npy", options={"range": (0, 10)})
        stale = {"range": (16, 400), "if_match": '"stale"'}
        if honour:
            with pytest.raises(PreconditionError):
                obstore.get(store, "v.npy", options=stale)
        else:  # plain servers ignore If-Match: the bytes come back, with the current ETag
            got = obstore.get(store, "v.npy", options=stale)
            assert bytes(got.bytes()) == data[16:400] and got.meta["e_tag"] != '"stale"'
        whole = bytes(obstore.get(store, "v.npy").bytes())
        np.testing.assert_array_equal(np.load(io.BytesIO(whole)), array)


def test_http_server_stops_cleanly(tmp_path):
    server = RangeHTTPServer(tmp_path).start()
    port = server.port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # an idle kept-alive client
    conn.request("HEAD", "/x")
    conn.getresponse().read()
    start = time.monotonic()
    server.stop()
    assert time.monotonic() - start < 5
    assert _connect_refused(port)
    conn.close()
    server.stop()


# -- the counting proxy ---------------------------------------------------------------------


def test_proxy_counts_http_bytes(served, http_server):
    root, data, _ = served
    server = http_server(root)
    with CountingProxy(server.endpoint) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        for a, b in [(0, 100), (200, 4200)]:
            conn.request("GET", "/v.npy", headers={"Range": f"bytes={a}-{b - 1}"})
            assert conn.getresponse().read() == data[a:b]
        conn.close()
        counts = proxy.reset()
    body = server.stats.bytes_sent
    assert body == 100 + len(data) - 200 and counts.connections == 1
    assert body < counts.downstream < body + 2 * 400  # plus two response headers
    assert 0 < counts.upstream < 2 * 400
    assert proxy.counts.downstream == 0


def test_proxy_counts_s3_range_reads(s3_server, request):
    """S3 signatures survive the proxy; a 32 KiB range costs 32 KiB and a response header."""
    prefix = _prefix(request)
    data = os.urandom(1 << 20)
    obstore.put(_store(s3_server), prefix + "big", data)
    with CountingProxy(s3_server.endpoint) as proxy:
        store = s3_server.obstore_store(endpoint=proxy.endpoint)
        got = obstore.get(store, prefix + "big", options={"range": (4096, 4096 + 32768)})
        assert bytes(got.bytes()) == data[4096 : 4096 + 32768]
        counts = proxy.counts
    assert 32768 < counts.downstream < 32768 + 2048, counts
    assert counts.upstream < 4096


def test_proxy_paces_downstream_bytes_at_its_rate(tmp_path, http_server):
    """``rate`` is one link shared by every connection: two 1 MB downloads at 8 MB/s take about 0.25 s together."""
    data = os.urandom(1_000_000)
    (tmp_path / "a.bin").write_bytes(data)
    server = http_server(tmp_path)
    with CountingProxy(server.endpoint, rate=8e6) as proxy:

        def download() -> bytes:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
            conn.request("GET", "/a.bin")
            body = conn.getresponse().read()
            conn.close()
            return body

        start = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            bodies = list(pool.map(lambda _: download(), range(2)))
        took = time.monotonic() - start
        counts = proxy.counts
    assert bodies == [data, data]
    assert counts.downstream > 2_000_000
    assert 0.24 <= took < 5, took  # 2 MB at 8 MB/s, whatever the loopback's speed
    with pytest.raises(ValueError, match="rate"):
        CountingProxy(server.endpoint, rate=0)


def test_proxy_stop_closes_connections_and_port(tmp_path, http_server):
    server = http_server(tmp_path)
    proxy = CountingProxy(server.endpoint).start()
    port = proxy.port
    idle = socket.create_connection(("127.0.0.1", port), timeout=10)  # kept alive after a request
    idle.sendall(b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert idle.recv(1000).startswith(b"HTTP/1.1 404")
    start = time.monotonic()
    proxy.stop()
    assert time.monotonic() - start < 5
    assert idle.recv(10) == b""  # closed by the proxy
    idle.close()
    assert _connect_refused(port)
    with pytest.raises(ValueError, match="host:port"):
        CountingProxy("no-port-here")


def test_proxy_to_a_stopped_server_drops_the_connection(tmp_path):
    (port,) = free_ports(1)
    with CountingProxy(f"http://127.0.0.1:{port}") as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        assert client.recv(10) == b""
        client.close()


def test_proxy_counts_s3_requests_by_kind(s3_server, request):
    """LIST pages, GETs, HEADs and PUTs are told apart; a PUT body holding a request line is not a request."""
    prefix = _prefix(request)
    admin = _store(s3_server)
    for i in range(5):
        obstore.put(admin, f"{prefix}k{i}", b"x" * (100 + i))
    with CountingProxy(s3_server.endpoint) as proxy:
        store = _store(s3_server, endpoint=proxy.endpoint)
        pages = list(obstore.list(store, prefix, chunk_size=2))
        assert sum(len(p) for p in pages) == 5
        listed = proxy.counts
        for i in range(5):
            assert bytes(obstore.get(store, f"{prefix}k{i}", options={"range": (0, 10)}).bytes()) == b"x" * 10
        obstore.head(store, f"{prefix}k0")
        sneaky = b"GET /npydask/not-a-request HTTP/1.1\r\nHost: x\r\n\r\n" * 100
        obstore.put(store, f"{prefix}body", sneaky)
        assert bytes(obstore.get(store, f"{prefix}body").bytes()) == sneaky
        counts = proxy.reset()
    assert listed.requests == {"LIST": 1}  # (5 keys: one page of up to 1,000)
    assert counts.requests == {"LIST": 1, "GET": 6, "HEAD": 1, "PUT": 1}, counts
    assert counts.unframed == 0
    assert proxy.counts.requests == {}


@pytest.mark.parametrize("piece", [1, 3, 7, 4096])
def test_request_counter_frames_any_split(piece):
    """Requests split anywhere (the blank line across pieces too) are counted once; bodies are skipped."""
    from npydask.testing.counting_proxy import RequestCounter

    body = b"HEAD /b/k HTTP/1.1\r\n\r\n" * 3
    stream = (
        b"GET /b/a.npy HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\n\r\n"
        b"GET /b?list-type=2&prefix=p%2F HTTP/1.1\r\nHost: h\r\n\r\n"
        + b"PUT /b/c HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
        + b"HEAD /b/c HTTP/1.1\r\nHost: h\r\n\r\n"
        b"GET /b/ HTTP/1.1\r\n\r\n"
    )
    counter = RequestCounter()
    for i in range(0, len(stream), piece):
        counter.feed(stream[i : i + piece])
    assert dict(counter.kinds) == {"GET": 1, "LIST": 2, "PUT": 1, "HEAD": 1}
    assert not counter.lost


@pytest.mark.parametrize("header", [b"Transfer-Encoding: chunked", b"Content-Length: nine"])
def test_request_counter_stops_on_framing_it_cannot_follow(header):
    from npydask.testing.counting_proxy import RequestCounter

    counter = RequestCounter()
    counter.feed(b"PUT /b/k HTTP/1.1\r\n" + header + b"\r\n\r\n5\r\nGET /\r\n0\r\n\r\nGET /b/k HTTP/1.1\r\n\r\n")
    assert counter.lost and dict(counter.kinds) == {"PUT": 1}
    counter = RequestCounter()
    counter.feed(b"GET /b/k HTTP/1.1\r\nX: " + b"y" * 70_000)
    assert counter.lost and not counter.kinds
