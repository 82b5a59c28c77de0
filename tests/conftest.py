"""Shared fixtures: numpy is the oracle, files are real, nothing hangs."""

from __future__ import annotations

import os

import numpy as np
import pytest
from _s3 import S3
from hypothesis import HealthCheck, settings

from npydask.storage import _handles

# Before any test imports Ray (nothing above does): Ray posts usage statistics to an outside host
# about a minute after ray.init unless this is 0, and no test may send traffic beyond 127.0.0.1.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=int(os.environ.get("NPYDASK_HYPOTHESIS_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
    print_blob=True,
)
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _fresh_handle_cache():
    """Each test starts and ends with an empty per-process handle cache."""
    _handles.clear_cache()
    yield
    _handles.clear_cache()


@pytest.fixture
def save(tmp_path):
    """Write an array with numpy.save (C or Fortran order) and return its path."""
    counter = iter(range(1_000_000))

    def _save(array: np.ndarray, name: str | None = None, *, order: str = "C") -> str:
        path = tmp_path / (name or f"a{next(counter)}.npy")
        np.save(path, np.array(array, order=order, copy=True))
        return str(path)

    return _save


@pytest.fixture
def count_os_calls(monkeypatch):
    """``count_os_calls(names)``: count each named ``os`` function's calls from now (the test's monkeypatch undoes it).

    Returns the dict of counts, updated as calls are made (every module calls them through ``os``).
    """

    def _count(names):
        counts = dict.fromkeys(names, 0)
        for name in names:
            real = getattr(os, name)

            def wrapper(*args, _real=real, _name=name, **kw):
                counts[_name] += 1
                return _real(*args, **kw)

            monkeypatch.setattr(os, name, wrapper)
        return counts

    return _count


# -- object-storage servers (npydask.testing): SeaweedFS's S3, a range-capable HTTP server ----------


def _seaweed_or_skip():
    """A started SeaweedServer; skips only where SeaweedFS's weed is missing or cannot run here."""
    import errno

    from npydask.testing.seaweed import SeaweedServer, find_weed

    try:
        find_weed()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    server = SeaweedServer()
    try:
        server.start()
    except OSError as e:
        if e.errno in (errno.ENOEXEC, errno.EACCES):  # a binary built for another platform
            pytest.skip(f"SeaweedFS's weed cannot run on this platform: {e}")
        raise
    return server


@pytest.fixture(scope="session")
def s3_server():
    """One SeaweedFS S3 server for the session (``npydask.testing.seaweed.SeaweedServer``).

    Shared: write under a key prefix of the test's own, and never stop or pause it
    (use ``s3_server_disposable`` for that).
    """
    server = _seaweed_or_skip()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3(s3_server):
    """The session's S3 server with the object-storage tests' helpers (``_s3.S3``)."""
    return S3(s3_server)


@pytest.fixture
def s3_server_disposable():
    """A SeaweedFS S3 server of this test's own, to stop, kill, pause or restart (about 4 s to start)."""
    server = _seaweed_or_skip()
    yield server
    server.stop()


@pytest.fixture
def http_server():
    """Factory: ``http_server(root, **options)`` starts a ``RangeHTTPServer`` over ``root``.

    Options are ``RangeHTTPServer``'s (``honour_if_match``, ``ranges``, ``send_etag``,
    ``send_last_modified``, ``fault``, ``basic_auth``);
    every server started is stopped after the test.
    """
    from npydask.testing.http_range import RangeHTTPServer

    servers = []

    def _start(root, **options):
        server = RangeHTTPServer(root, **options).start()
        servers.append(server)
        return server

    yield _start
    for server in servers:
        server.stop()


def pytest_collection_modifyitems(config, items):
    """Under dask's array query planning, skip the xarray doctests: xarray 2026.9 cannot compute those arrays.

    (``xr.DataArray(da.ones(2)).values`` is an object array of dask arrays there, with or without
    npydask; tests/test_xarray.py skips itself for the same reason.)
    """
    if os.environ.get("DASK_ARRAY__QUERY_PLANNING", "").lower() not in ("1", "true", "yes", "on"):
        return
    skip = pytest.mark.skip(reason="xarray 2026.9 cannot compute dask's query-planning arrays")
    for item in items:
        if isinstance(item, pytest.DoctestItem) and ("xarray" in item.name or "npydask/xarray" in str(item.fspath)):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def no_hedging():
    """Hedging off (``NPYDASK_REMOTE_HEDGE=off``) for a module that counts requests or bytes: a hedge adds a request.

    Module-scoped, so the module's own datasets, opened by module fixtures, are opened without it too
    (``pytestmark = pytest.mark.usefixtures("no_hedging")``).
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NPYDASK_REMOTE_HEDGE", "off")
        yield
