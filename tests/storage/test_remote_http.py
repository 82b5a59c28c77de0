"""Plain HTTP servers (npydask.storage.object over http(s)://) against npydask.testing.http_range.

What the server really received is read from its request log: the request
target as sent, the ``Authorization`` header. Every read is compared with
``numpy.load`` of the same file.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import npydask
from npydask.errors import FileChangedError

pytest.importorskip("obstore")


def _save(root: Path, name: str, array: np.ndarray) -> np.ndarray:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, array)
    return array


# -- identity: servers without an ETag ----------------------------------------------------------


def test_a_server_without_etag_is_refused_at_open(tmp_path: Path, http_server: Any) -> None:
    _save(tmp_path, "a.npy", np.arange(100.0))
    server = http_server(tmp_path, send_etag=False)
    url = server.url("a.npy")
    for open_it in (
        lambda: npydask.read_header(url),
        lambda: npydask.from_npy(url),
        lambda: npydask.read_region(url, (0,), (5,)),
        lambda: npydask.open_dataset(files=[url]),
    ):
        with pytest.raises(OSError, match="no ETag") as info:
            open_it()
        assert "'identity': 'last-modified'" in str(info.value) and "'identity': 'none'" in str(info.value)
        assert info.value.filename == url


def test_last_modified_opt_in_still_needs_a_version(tmp_path: Path, http_server: Any) -> None:
    """A server with neither ETag nor Last-Modified is refused even with identity="last-modified"."""
    _save(tmp_path, "a.npy", np.arange(100.0))
    server = http_server(tmp_path, send_etag=False, send_last_modified=False)
    with pytest.raises(OSError, match="no ETag nor a Last-Modified"):
        npydask.read_header(server.url("a.npy"), storage_options={"identity": "last-modified"})


def test_identity_none_reads_a_same_size_replacement_and_sends_no_if_match(tmp_path: Path, http_server: Any) -> None:
    _save(tmp_path, "a.npy", np.arange(100.0))
    server = http_server(tmp_path, send_etag=False, send_last_modified=False)
    options = {"identity": "none"}
    x = npydask.from_npy(server.url("a.npy"), chunks=50, storage_options=options)
    np.testing.assert_array_equal(x.compute(), np.arange(100.0))
    _save(tmp_path, "a.npy", np.arange(100.0) + 1)  # same size: what the user opted out of catching
    np.testing.assert_array_equal(x.compute(), np.arange(100.0) + 1)
    _save(tmp_path, "a.npy", np.arange(101.0))  # the size is still compared
    with pytest.raises(FileChangedError):
        x.compute()
    with pytest.raises(ValueError, match="'identity'.*'etag', 'last-modified', 'none'"):
        npydask.read_header(server.url("a.npy"), storage_options={"identity": "mtime"})


def test_etag_servers_are_unaffected_by_the_identity_option(tmp_path: Path, http_server: Any) -> None:
    _save(tmp_path, "a.npy", np.arange(100.0))
    server = http_server(tmp_path)
    x = npydask.from_npy(server.url("a.npy"), chunks=50, storage_options={"identity": "last-modified"})
    _save(tmp_path, "a.npy", np.arange(100.0) + 1)
    with pytest.raises(FileChangedError):
        x.compute()


# -- request targets as written -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "target", "on_disk"),
    [
        ("d/a%2Fb.npy", "/d/a%2Fb.npy", "d/a/b.npy"),  # (the test server decodes %2F: what it received counts)
        ("d/x%25y.npy", "/d/x%25y.npy", "d/x%y.npy"),
        ("d/a b.npy", "/d/a%20b.npy", "d/a b.npy"),
        ("d/a%20b.npy", "/d/a%20b.npy", "d/a b.npy"),
        ("d/é.npy", "/d/%C3%A9.npy", "d/é.npy"),
        ("d/%C3%A9.npy", "/d/%C3%A9.npy", "d/é.npy"),
        ("d/a+b.npy", "/d/a+b.npy", "d/a+b.npy"),
        ("d/%41.npy", "/d/%41.npy", "d/A.npy"),
        ("d/a^b.npy", "/d/a%5Eb.npy", "d/a^b.npy"),
    ],
)
def test_request_targets_are_sent_as_written(
    tmp_path: Path, http_server: Any, written: str, target: str, on_disk: str
) -> None:
    values = _save(tmp_path, on_disk, np.arange(24.0).reshape(4, 6))
    server = http_server(tmp_path)
    url = f"{server.endpoint}/{written}"
    assert npydask.read_header(url).shape == (4, 6)
    np.testing.assert_array_equal(npydask.read_region(url, (1, 2), (3, 5)), values[1:3, 2:5])
    np.testing.assert_array_equal(npydask.from_npy(url, chunks=2).compute(), values)
    np.testing.assert_array_equal(npydask.open_dataset(files=[url]).stack().compute(), values[None])
    assert {r.target for r in server.stats.log} == {target}


def test_a_query_is_sent_after_the_path_as_written(tmp_path: Path, http_server: Any) -> None:
    _save(tmp_path, "d/a/b.npy", np.arange(6.0))
    server = http_server(tmp_path)
    np.testing.assert_array_equal(npydask.from_npy(f"{server.endpoint}/d/a%2Fb.npy?v=1+2").compute(), np.arange(6.0))
    assert {r.target for r in server.stats.log} == {"/d/a%2Fb.npy?v=1+2"}


# -- user:password@ (HTTP Basic) --------------------------------------------------------------------

USER, PASSWORD = "ann", "p@ss:w0rd"
SECRETS = ("p@ss", "p%40ss", "w0rd", "ann:")


def _shows_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


def test_basic_auth_urls_are_read_and_never_shown(tmp_path: Path, http_server: Any) -> None:
    import base64

    values = _save(tmp_path, "d/v.npy", np.arange(60.0).reshape(6, 10))
    _save(tmp_path, "d/w.npy", np.arange(60.0).reshape(6, 10) * 2)
    server = http_server(tmp_path, basic_auth=(USER, PASSWORD))
    host = server.endpoint.partition("://")[2]
    url, url2 = (f"http://{USER}:p%40ss%3Aw0rd@{host}/d/{n}.npy" for n in ("v", "w"))
    assert npydask.read_header(url).shape == (6, 10)
    np.testing.assert_array_equal(npydask.read_region(url, (1, 2), (4, 7)), values[1:4, 2:7])
    x = npydask.from_npy(url, chunks=(2, 10))
    np.testing.assert_array_equal(x.compute(), values)
    ds = npydask.open_dataset(files=[url, url2], roi_start=[1, 0], roi_shape=[2, 10])
    np.testing.assert_array_equal(ds.stack().compute(), np.stack([values[1:3], values[1:3] * 2]))
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert {r.authorization for r in server.stats.log} == {expected}
    assert {r.status for r in server.stats.log} <= {200, 206}
    assert ds.files == [f"http://{host}/d/v.npy", f"http://{host}/d/w.npy"]
    stacked = ds.stack()
    for shown in (repr(ds), repr(x), x.name, stacked.name, repr(dict(stacked.dask).keys()), str(x.dask)):
        _shows_no_secret(shown)


def test_basic_auth_failures_name_the_url_without_its_password(tmp_path: Path, http_server: Any) -> None:
    _save(tmp_path, "v.npy", np.arange(6.0))
    server = http_server(tmp_path, basic_auth=(USER, PASSWORD))
    host = server.endpoint.partition("://")[2]
    for url, kind in (
        (f"http://{USER}:wrong-p%40ss@{host}/v.npy", PermissionError),
        (f"http://{USER}:p%40ss%3Aw0rd@{host}/missing.npy", FileNotFoundError),
        (f"http://{host}/v.npy", PermissionError),
    ):
        with pytest.raises(kind) as info:
            npydask.read_header(url)
        assert info.value.filename == f"http://{host}/" + url.rpartition("/")[2]
        _shows_no_secret(str(info.value))
        _shows_no_secret(repr(pickle.dumps(info.value)))
        assert info.value.__context__ is None and info.value.__cause__ is None


# -- servers that mishandle ranges ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"ranges": False}, "ignored the Range header and sent the whole object"),
        ({"fault": "wrong-range"}, "sent bytes 0-"),
        ({"fault": "short-body"}, "fewer bytes than its response promised"),
    ],
)
def test_servers_that_mishandle_ranges_are_described(
    tmp_path: Path, http_server: Any, options: dict[str, Any], words: str
) -> None:
    _save(tmp_path, "a.npy", np.arange(5000.0))
    server = http_server(tmp_path, **options)
    url = server.url("a.npy")
    with npydask.config.set(remote_retries=0):
        with pytest.raises(OSError, match=words) as info:
            npydask.read_region(url, (1000,), (1100,)) if "fault" in options else npydask.read_header(url)
    assert info.value.filename == url
    if options == {"fault": "wrong-range"}:
        assert "for a request of bytes 8128-8927" in str(info.value)  # (a header of 128 bytes, 8 bytes a value)


def test_a_good_server_still_reads_with_retries_off(tmp_path: Path, http_server: Any) -> None:
    """The errors above come from the faults, not from turning retries off."""
    values = _save(tmp_path, "a.npy", np.arange(5000.0))
    server = http_server(tmp_path)
    with npydask.config.set(remote_retries=0):
        np.testing.assert_array_equal(npydask.read_region(server.url("a.npy"), (1000,), (1100,)), values[1000:1100])
