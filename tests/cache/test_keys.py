"""Entry keys: credentials never split or name an entry; every other field does."""

from __future__ import annotations

import dataclasses
import re

import pytest

from npydask.cache.keys import EntryKey, cacheable, query_digest

BASE = dict(store="s3://bucket@eu-west-1", key="data/x.npy", query="versionId=7", size=1000, etag='"abc"')


def _key(**kw):
    args = {**BASE, **kw}
    return EntryKey.of(args["store"], args["key"], args["query"], args["size"], args["etag"])


@pytest.mark.parametrize(
    "credentials",
    [
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20260101&X-Amz-Signature=deadbeef&X-Amz-Expires=60",
        "x-amz-security-token=tok&x-amz-date=20260101T000000Z",
        "sig=abc%3D&se=2030-01-01&sp=r&sv=2022-11-02&sr=b&st=2026-01-01&spr=https",
        "Signature=s&Policy=p&Key-Pair-Id=k&Expires=123",
        "X-Goog-Signature=s&X-Goog-Credential=c&GoogleAccessId=g",
        "token=t&key=k&access_token=a&credential=c",
    ],
)
def test_credentials_in_the_query_do_not_change_the_key_or_name(credentials):
    plain = _key()
    signed = _key(query=f"{credentials}&versionId=7")
    assert signed == plain and signed.entry_name() == plain.entry_name()


def test_parameter_order_does_not_matter_but_values_do():
    assert _key(query="a=1&b=2") == _key(query="?b=2&a=1")
    assert _key(query="a=1&b=2").entry_name() != _key(query="a=1&b=3").entry_name()


@pytest.mark.parametrize(
    "change",
    [
        dict(store="s3://bucket@us-east-1"),
        dict(store="gs://bucket"),
        dict(key="data/y.npy"),
        dict(query="versionId=8"),
        dict(query=""),
        dict(size=1001),
        dict(etag='"abd"'),
    ],
)
def test_every_other_field_changes_the_name(change):
    assert _key(**change).entry_name() != _key().entry_name()


def test_names_are_hex_only_and_carry_no_url_text():
    k = _key(key="a dir/../secret?x=1", query="X-Amz-Signature=SECRET&versionId=7")
    name = k.entry_name()
    assert re.fullmatch(r"[0-9a-f]{64}", name)
    assert "SECRET" not in repr(k) and "SECRET" not in name
    # the key holds a digest of the query, never its text
    assert re.fullmatch(r"[0-9a-f]{64}", k.query)


@pytest.mark.parametrize("etag", [None, "", 'W/"abc"', 'w/"abc"'])
def test_weak_or_missing_etags_are_not_cacheable(etag):
    assert not cacheable(etag)
    if etag is not None:
        with pytest.raises(ValueError, match="strong ETag"):
            _key(etag=etag)


def test_strong_etags_are_cacheable_and_bad_fields_refused():
    assert cacheable('"abc"') and cacheable("abc-3")
    with pytest.raises(ValueError, match="non-negative"):
        _key(size=-1)
    with pytest.raises(ValueError, match="query_digest"):
        EntryKey("s3://b", "x", "versionId=7", 1, '"e"')
    with pytest.raises(dataclasses.FrozenInstanceError):
        _key().size = 3  # type: ignore[misc]
    assert query_digest("") == query_digest("sig=1&X-Amz-Date=2")
