"""The object-storage tests' view of the shared S3 server, and a counter of the requests npydask makes.

:class:`S3` (the ``s3`` fixture of tests/conftest.py) wraps the session's ``s3_server``
(SeaweedFS on 127.0.0.1, ``npydask.testing.seaweed``) with the few helpers these modules
use: a fresh ``bucket/prefix`` per test, puts and gets by ``bucket/key``, and
the admin's ``storage_options`` and environment.
"""

from __future__ import annotations

import io
import threading
import uuid
from collections import Counter
from typing import Any

import numpy as np
import pytest


class S3:
    """The server: its endpoint, the storage_options that reach it as admin, and a boto3 client."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.endpoint = server.endpoint
        self.options = server.storage_options()
        self.client = server.boto3_client()
        self.bucket = server.bucket

    def space(self) -> str:
        """A new, empty ``bucket/prefix`` for one test (objects go under it)."""
        return f"{self.bucket}/p{uuid.uuid4().hex[:16]}"

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
        return self.server.env()


class Requests:
    """Counts the obstore calls npydask makes (by function name), in this process."""

    NAMES = ("get", "head", "list", "list_with_delimiter", "put")
    ASYNC = {"get_async": "get", "head_async": "head"}
    """obstore's coroutines the request scheduler sends range GETs and HEADs with, counted as their blocking twins."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import obstore

        self.counts: Counter[str] = Counter()
        self.listed_pages = 0
        self._lock = threading.Lock()  # (calls come from npydask's request threads)
        for name in self.NAMES:
            monkeypatch.setattr(obstore, name, self._counting(name, getattr(obstore, name)))
        for name, counted in self.ASYNC.items():
            monkeypatch.setattr(obstore, name, self._counting(counted, getattr(obstore, name)))

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
