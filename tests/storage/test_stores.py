"""The store registry's checks of storage_options (npydask.storage._stores): pure, before obstore sees them."""

from __future__ import annotations

import pytest

from npydask.storage._stores import StoreSpec, check_options


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"key": "AKIA", "secret": "shh"}, ["'access_key_id' for 'key'", "'secret_access_key' for 'secret'"]),
        ({"endpoint_url": "http://127.0.0.1:8333"}, ["'endpoint' for 'endpoint_url'"]),
        ({"client_kwargs": {"endpoint_url": "http://x", "region_name": "r"}}, ["'endpoint' and 'region'"]),
        ({"anon": True}, ["'skip_signature': True for 'anon'"]),
    ],
)
def test_s3fs_names_are_translated(options: dict, words: list[str]) -> None:
    with pytest.raises(ValueError, match="not s3fs/fsspec's") as info:
        StoreSpec.of("s3://b", options)
    for w in words:
        assert w in str(info.value), str(info.value)
    assert "AKIA" not in str(info.value) and "shh" not in str(info.value)


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1: 8333",
        "http://exa mple.com",
        "http://127.0.0.1:8333 ",
        "127.0.0.1:8333",
        "http://h:port",
        "http://h\t:1",
        "",
        8333,
    ],
)
def test_malformed_endpoints_are_refused_before_obstore(endpoint: object) -> None:
    with pytest.raises(ValueError, match=r"storage_options\['endpoint'\] must be an endpoint URL"):
        StoreSpec.of("s3://b", {"endpoint": endpoint, "region": "us-east-1"})


@pytest.mark.parametrize(
    "endpoint", ["http://127.0.0.1:8333", "https://s3.example.com", "https://s3.example.com/", "http://[::1]:9000/path"]
)
def test_endpoints_that_are_urls_pass(endpoint: str) -> None:
    check_options("s3://b", {"endpoint": endpoint})
    check_options("s3://b", {"aws_endpoint": endpoint})


def test_an_endpoint_in_the_environment_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from npydask.storage._stores import store_for

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1: 1")
    spec = StoreSpec.of("s3://b-env-check", {"access_key_id": "a", "secret_access_key": "s", "region": "r"})
    with pytest.raises(ValueError, match="the environment variable AWS_ENDPOINT_URL must be an endpoint URL"):
        store_for(spec)


def test_identity_values() -> None:
    for mode in ("etag", "last-modified", "none"):
        check_options("https://h", {"identity": mode})
    with pytest.raises(ValueError, match="must be one of"):
        check_options("https://h", {"identity": "ETag"})


def test_an_endpoint_with_userinfo_passes_and_is_never_shown() -> None:
    check_options("s3://b", {"endpoint": "http://ann:pw@127.0.0.1:9000"})
    with pytest.raises(ValueError, match="must be an endpoint URL") as info:
        check_options("s3://b", {"endpoint": "http://ann:s3cret@exa mple.com"})
    assert "s3cret" not in str(info.value)


def test_a_store_that_cannot_be_built_names_the_bucket_and_no_secret() -> None:
    from npydask.storage._stores import store_for

    with pytest.raises(ValueError, match="could not build a store for this bucket or host.*port"):
        store_for(StoreSpec.of("http://127.0.0.1:99999", None))
    own = StoreSpec.of("https://h/d/a.npy?X-Amz-Signature=s3cret", None)
    assert own.public() == "https://h/d/a.npy"
