"""URL parsing, redaction and resolution (npydask.storage.urls, npydask.storage.where): pure, no server."""

from __future__ import annotations

import os
import pathlib

import pytest

from npydask.storage.local import LOCAL
from npydask.storage.urls import ObjectUrl, is_url, join_url, local_path, prefix_of, redact, split_url, to_local
from npydask.storage.where import StoragePath, fspath, resolve


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://b/k.npy", ObjectUrl("s3", "b", "k.npy", "")),
        ("s3a://b/p/q/k.npy", ObjectUrl("s3a", "b", "p/q/k.npy", "")),
        ("S3://b/k.npy", ObjectUrl("s3", "b", "k.npy", "")),
        ("gs://b/a b/é.npy", ObjectUrl("gs", "b", "a b/é.npy", "")),
        ("s3://b/odd?name#1.npy", ObjectUrl("s3", "b", "odd?name#1.npy", "")),  # S3 keys may hold ? and #
        ("az://container/x.npy", ObjectUrl("az", "container", "x.npy", "")),
        ("abfs://container/x.npy", ObjectUrl("abfs", "container", "x.npy", "")),
        ("https://h:8080/d/a%20b.npy?sig=s#f", ObjectUrl("https", "h:8080", "d/a b.npy", "sig=s")),
        ("http://user:pw@h/x.npy", ObjectUrl("http", "h", "x.npy", "")),
        ("s3://b", ObjectUrl("s3", "b", "", "")),
    ],
)
def test_split_url(url: str, expected: ObjectUrl) -> None:
    assert split_url(url) == expected
    assert is_url(url)


@pytest.mark.parametrize("path", ["/data/a.npy", "a.npy", "file:///data/a.npy", "C:/x", "", "s3:/b/k"])
def test_not_urls(path: str) -> None:
    assert not is_url(path)
    assert not is_url(pathlib.Path("/x"))


@pytest.mark.parametrize("url", ["ftp://h/x.npy", "hdfs://nn/x.npy", "memory:///x"])
def test_unknown_scheme_is_refused_with_the_known_ones(url: str) -> None:
    with pytest.raises(ValueError, match=r"unknown URL scheme .*file://.*s3://"):
        is_url(url)


@pytest.mark.parametrize("url", ["s3:///k.npy", "https:///x"])
def test_url_without_bucket(url: str) -> None:
    with pytest.raises(ValueError, match="names no bucket"):
        split_url(url)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://h/x.npy?X-Amz-Signature=SECRET&X-Amz-Credential=AK", "https://h/x.npy"),
        ("https://user:SECRET@h/x.npy", "https://h/x.npy"),
        ("http://h/x.npy#frag", "http://h/x.npy"),
        ("https://acct.blob.core.windows.net/c/x.npy?sv=1&sig=SECRET", "https://acct.blob.core.windows.net/c/x.npy"),
        ("s3://b/odd?k.npy", "s3://b/odd?k.npy"),
        ("/local/x?.npy", "/local/x?.npy"),
    ],
)
def test_redact_drops_credentials(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert "SECRET" not in redact(url)


def test_file_urls_are_local_paths(tmp_path: pathlib.Path) -> None:
    assert local_path("file:///data/a%20b.npy") == "/data/a b.npy"
    assert local_path("file://localhost/data/x.npy") == "/data/x.npy"
    with pytest.raises(ValueError, match="other|host"):
        local_path("file://otherhost/data/x.npy")
    assert to_local("file:///x.npy") == "/x.npy"
    assert to_local(pathlib.Path("/x")) == pathlib.Path("/x")
    assert resolve(f"file://{tmp_path}/a.npy") == StoragePath(LOCAL, f"{tmp_path}/a.npy")
    assert fspath(f"file://{tmp_path}/a.npy") == f"{tmp_path}/a.npy"


def test_resolve_local_paths_and_refuse_storage_options_there() -> None:
    where = resolve("rel/a.npy")
    assert where == StoragePath(LOCAL, os.path.join(os.getcwd(), "rel", "a.npy"))
    assert where.local and where.shown == where.path and not where.source.concurrent
    with pytest.raises(AttributeError):
        where.path = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(ValueError, match="storage_options apply to object-store URLs"):
        resolve("/data/a.npy", {"region": "us-east-1"})
    with pytest.raises(TypeError, match="bytes"):
        fspath(b"/x.npy")  # type: ignore[arg-type]


def test_prefix_and_join() -> None:
    assert prefix_of(split_url("s3://b/p")) == prefix_of(split_url("s3://b/p/")) == "p/"
    assert prefix_of(split_url("s3://b")) == prefix_of(split_url("s3://b/")) == ""
    assert join_url("s3://b/p/", "x/a.npy") == join_url("s3://b/p", "x/a.npy") == "s3://b/p/x/a.npy"


def test_store_spec_public_part_hides_credentials() -> None:
    from npydask.storage._stores import StoreSpec

    spec = StoreSpec.of(
        "s3://b",
        {
            "endpoint": "http://127.0.0.1:9000",
            "region": "eu-west-1",
            "secret_access_key": "SECRET",
            "access_key_id": "AK",
        },
    )
    assert spec.public() == "s3://b|endpoint=http://127.0.0.1:9000|region=eu-west-1"
    assert "SECRET" not in spec.public() and "AK" not in spec.public()
    assert spec == StoreSpec.of("s3://b", dict(reversed(list(dict(spec.options).items()))))
    with pytest.raises(TypeError, match="storage_options must be a dict"):
        StoreSpec.of("s3://b", [("region", "x")])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "base", "key"),
    [
        ("https://h/d/a.npy", "https://h", "d/a.npy"),
        ("https://h/d/a b+c.npy", "https://h", "d/a b+c.npy"),  # (the client encodes the space, keeps "+")
        ("https://h/d/a%20b.npy", "https://h", "d/a b.npy"),
        ("https://h/d/%C3%A9.npy", "https://h", "d/é.npy"),
        ("https://h/d/x%25y.npy", "https://h", "d/x%y.npy"),
        ("https://h/d/a%2Fb.npy", "https://h/d/a%2Fb.npy", ""),  # (a key would split the segment)
        ("https://h/d/%c3%a9.npy", "https://h/d/%c3%a9.npy", ""),  # (lower-case escapes kept)
        ("https://h/d/%41.npy", "https://h/d/%41.npy", ""),  # (a needless escape kept)
        ("https://h/d/a^b.npy", "https://h/d/a%5Eb.npy", ""),
        ("https://h/d/a%zz.npy", "https://h", "d/a%zz.npy"),  # (a lone % is sent as %25)
        ("https://h/d/a.npy?X-Amz-Signature=s#frag", "https://h/d/a.npy?X-Amz-Signature=s", ""),
    ],
)
def test_http_targets(url: str, base: str, key: str) -> None:
    from npydask.storage.urls import http_target

    assert http_target(url)[:2] == (base, key)


def test_http_target_userinfo_is_basic_auth_and_never_in_the_base() -> None:
    import base64

    from npydask.storage.urls import http_target

    found = http_target("http://ann:p%40ss%3Aw@h:8/d/a.npy")
    assert found.base == "http://h:8" and found.key == "d/a.npy"
    assert found.authorization == "Basic " + base64.b64encode(b"ann:p@ss:w").decode()
    assert http_target("http://ann@h/a.npy").authorization == "Basic " + base64.b64encode(b"ann:").decode()
    assert redact("http://ann:p%40ss@h:8/d/a.npy") == "http://h:8/d/a.npy"


@pytest.mark.parametrize(
    "url",
    ["https://h/d/a%09b.npy", "https://h/d/a\nb.npy", "https://h/d/%FF.npy", "https://h/d//a.npy", "https://h/d/"],
)
def test_http_targets_the_client_cannot_send_are_refused(url: str) -> None:
    from npydask.storage.urls import http_target

    with pytest.raises(ValueError, match="rename the file|remove it"):
        http_target(url)


def test_an_object_url_resolves_once_to_a_source_that_redacts_it() -> None:
    pytest.importorskip("obstore")
    url = "https://user:pw@127.0.0.1:9/d/a.npy?X-Amz-Signature=s3cr3t"
    where = resolve(url)
    assert where.path == url and not where.local and where.source.concurrent
    assert where.shown == where.source.display(url) == "https://127.0.0.1:9/d/a.npy"
    assert where.source.display_all([url, url + "x"]) == ["https://127.0.0.1:9/d/a.npy"] * 2
    assert "s3cr3t" not in where.shown and "pw" not in where.shown
