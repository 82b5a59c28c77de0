"""URLs of objects: which strings are URLs, what store and key they name, and how to show them safely.

Pure string handling, no I/O and no obstore. ``s3://``, ``gs://``,
``az://`` (and ``abfs://``, ``abfss://``, ``azure://``), ``http://`` and
``https://`` name objects; ``file://`` names a local path and becomes one
when parsed; anything else without a scheme is a local path. A string with
another scheme (``ftp://``, ``hdfs://``) is refused with the list of known
ones, rather than read as a local folder named ``ftp:``.

The key of an ``s3://``, ``gs://`` or ``az://`` URL is taken as written,
``?`` and ``#`` included (``s3://b/a b/é.npy`` names the key ``a b/é.npy``,
as the AWS CLI reads it);
the path of an ``http(s)://`` URL is sent as written (:func:`http_target`):
percent-encoded octets unchanged (``%2F`` stays ``%2F``, ``%25`` stays
``%25``), characters not allowed in a request target (a space, non-ASCII)
percent-encoded, ``+`` as ``+``. Query strings and fragments (presigned and SAS URLs carry
credentials in them) and ``user:password@`` of ``http(s)://`` URLs never appear in what
:func:`redact` returns, which is what npydask shows in ``ds.files``, reprs
and messages.

Examples
--------
>>> split_url("s3://bucket/scans/a.npy")
ObjectUrl(scheme='s3', bucket='bucket', key='scans/a.npy', query='')
>>> redact("https://host/x.npy?X-Amz-Signature=secret")
'https://host/x.npy'
>>> local_path("file:///data/a%20b.npy")
'/data/a b.npy'
"""

from __future__ import annotations

import base64
import functools
import os
import re
from typing import NamedTuple
from urllib.parse import quote, unquote, unquote_to_bytes

__all__ = [
    "OBJECT_SCHEMES",
    "HttpTarget",
    "ObjectUrl",
    "http_target",
    "is_url",
    "join_url",
    "local_path",
    "prefix_of",
    "redact",
    "split_url",
    "to_local",
    "unlistable",
]

OBJECT_SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gs",
    "gcs": "gs",
    "az": "az",
    "abfs": "az",
    "abfss": "az",
    "azure": "az",
    "http": "http",
    "https": "http",
}
"""Object-store URL schemes and the kind of store each names (``"s3"``, ``"gs"``, ``"az"``, ``"http"``)."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


class ObjectUrl(NamedTuple):
    """An object URL taken apart: ``scheme://bucket/key?query``."""

    scheme: str
    """As written, lower-cased (``"s3"``, ``"https"``, ...)."""
    bucket: str
    """The bucket, container or ``host[:port]`` (for ``az://``, the container)."""
    key: str
    """The object's key (for ``http(s)``, its percent-decoded path), without a leading ``/``."""
    query: str
    """The query string, without ``?`` (empty when there is none); never shown (see :func:`redact`)."""

    @property
    def kind(self) -> str:
        """The kind of store: ``"s3"``, ``"gs"``, ``"az"`` or ``"http"``."""
        return OBJECT_SCHEMES[self.scheme]

    @property
    def base(self) -> str:
        """``scheme://bucket``: what a store is built for."""
        return f"{self.scheme}://{self.bucket}"


def _scheme(path: str) -> str | None:
    match = _SCHEME.match(path)
    return match.group(1).lower() if match else None


def is_url(path: object) -> bool:
    """Whether ``path`` is an object URL (``file://`` is not: it is a local path).

    Raises
    ------
    ValueError
        For a string with a scheme npydask does not know.

    Examples
    --------
    >>> is_url("s3://b/k.npy"), is_url("/data/k.npy"), is_url("file:///data/k.npy")
    (True, False, False)
    """
    if not isinstance(path, str):
        return False
    scheme = _scheme(path)
    if scheme is None or scheme == "file":
        return False
    if scheme not in OBJECT_SCHEMES:
        known = sorted({*OBJECT_SCHEMES, "file"})
        raise ValueError(
            f"{redact(path)}: unknown URL scheme {scheme + '://'!r}; npydask reads local paths and the "
            f"schemes {', '.join(s + '://' for s in known)}"
        )
    return True


def split_url(url: str) -> ObjectUrl:
    """Take an object URL apart (see :class:`ObjectUrl`).

    Raises
    ------
    ValueError
        If it is not an object URL or names no bucket.
    """
    scheme = _scheme(url)
    if scheme is None or scheme not in OBJECT_SCHEMES:
        raise ValueError(f"{redact(url)}: expected an object URL (s3://, gs://, az://, http(s)://)")
    rest = url[len(scheme) + 3 :]
    query = ""
    if OBJECT_SCHEMES[scheme] == "http":  # (only http(s) URLs have queries: an S3 key may hold "?" or "#")
        rest, _, query = rest.partition("#")[0].partition("?")
    bucket, _, key = rest.partition("/")
    if OBJECT_SCHEMES[scheme] == "http":
        bucket = bucket.rpartition("@")[2]
        key = unquote(key)
    if not bucket:
        raise ValueError(f"{redact(url)}: the URL names no bucket (or host): expected {scheme}://BUCKET/KEY")
    return ObjectUrl(scheme, bucket, key, query)


def redact(url: str) -> str:
    """``url`` without its query string, fragment and ``user:password@`` (safe to show and log).

    Examples
    --------
    >>> redact("https://user:pw@host/a.npy?sig=1#x")
    'https://host/a.npy'
    >>> redact("/local/path?.npy")
    '/local/path?.npy'
    """
    scheme = _scheme(url)
    if scheme is None or OBJECT_SCHEMES.get(scheme) != "http":
        return url  # (s3://, gs://, az:// keys may hold "?" and "#"; they carry no credentials)
    rest = url[len(scheme) + 3 :].partition("#")[0].partition("?")[0]
    host, sep, path = rest.partition("/")
    return f"{url[: len(scheme) + 3]}{host.rpartition('@')[2]}{sep}{path}"


_PATH_SAFE = "/%!$&'()*+,;=:@"
"""What a request target's path keeps as written (besides letters, digits and ``-._~``): RFC 3986's pchar."""
_SEGMENT_SAFE = "!$&'()*+,;=:@[]^|"
"""What the store client keeps as written in one segment of a key (the URL standard's path-segment set:
it encodes the rest of ASCII's punctuation, ``/`` and ``%`` included)."""
_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class HttpTarget(NamedTuple):
    """How an ``http(s)://`` URL is requested: the store's base URL, the key asked of it, and Basic auth."""

    base: str
    """``scheme://host[:port]`` (a store shared by the host's URLs), or the whole URL, query included,
    when the key form would change the request target (a store of its own)."""
    key: str
    """The key the store is asked for (``""`` for a store of its own)."""
    authorization: str | None
    """The ``Authorization`` header for the URL's ``user:password@`` (HTTP Basic), or ``None``."""


@functools.lru_cache(maxsize=4096)  # (asked for each request: a store and a key)
def http_target(url: str) -> HttpTarget:
    """The store base, key and authorization that send ``url``'s request target as written.

    The store client percent-encodes each segment of a key it is given,
    ``%`` included, so a path is handed over as a key only where decoding
    and that encoding give back the path as written; otherwise (``%2F`` in a
    segment, lower-case or needless escapes, a query string) the URL itself
    is the store's base, and the client sends its path unchanged. Characters
    not allowed in a request target (a space, non-ASCII, a ``%`` that starts
    no escape) are percent-encoded first.

    Examples
    --------
    >>> http_target("https://host/d/a b+c.npy")
    HttpTarget(base='https://host', key='d/a b+c.npy', authorization=None)
    >>> http_target("https://u:p%40ss@host:8/d/a%2Fb.npy")
    HttpTarget(base='https://host:8/d/a%2Fb.npy', key='', authorization='Basic dTpwQHNz')

    Raises
    ------
    ValueError
        For a path holding an empty segment, a control character or percent-encoded bytes that are
        not UTF-8 (the client cannot send them).
    """
    scheme = _scheme(url) or ""
    rest = url[len(scheme) + 3 :].partition("#")[0]
    rest, qmark, query = rest.partition("?")
    authority, _, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    authorization = None
    if at:
        user, _, password = userinfo.partition(":")
        token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    target = quote(_LONE_PERCENT.sub("%25", path), safe=_PATH_SAFE)
    root = f"{scheme}://{host}"
    segments = target.split("/")
    decoded = [unquote(seg) for seg in segments]
    try:
        for seg in segments:
            unquote_to_bytes(seg).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"{redact(url)}: the URL's path holds percent-encoded bytes that are not UTF-8, which the object "
            "store client (obstore) cannot request: rename the file"
        ) from None
    if path and "" in segments:
        raise ValueError(
            f"{redact(url)}: the URL's path has an empty segment ('//', or a trailing '/'), which the object "
            "store client (obstore) cannot request: remove it"
        )
    if any(_CONTROL.search(d) for d in decoded):
        raise ValueError(
            f"{redact(url)}: the URL's path holds a control character (e.g. a tab or newline, written or "
            "percent-encoded), which the object store client (obstore) cannot request: rename the file"
        )
    keyed = not qmark and all(
        d not in (".", "..") and "/" not in d and quote(d, safe=_SEGMENT_SAFE) == seg
        for seg, d in zip(segments, decoded)
    )
    if keyed:
        return HttpTarget(root, "/".join(decoded), authorization)
    return HttpTarget(f"{root}/{target}{qmark}{query}", "", authorization)


def unlistable(key: str) -> bool:
    """Whether obstore may not represent ``key``: it holds a control character (a tab, a newline, DEL).

    Examples
    --------
    >>> unlistable("a/b.npy"), unlistable("a/b\\tc.txt")
    (False, True)
    """
    return _CONTROL.search(key) is not None


def local_path(url: str) -> str:
    """The local path a ``file://`` URL names (percent-decoded; ``file://localhost/`` allowed).

    Raises
    ------
    ValueError
        For a ``file://`` URL naming another host.
    """
    rest = url[len("file://") :]
    host, sep, path = rest.partition("/")
    if host not in ("", "localhost"):
        raise ValueError(f"{url}: file:// URLs name local paths; found host {host!r} (use file:///path)")
    return unquote(sep + path)


def to_local(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``path`` with a ``file://`` URL turned into its local path; anything else unchanged."""
    if isinstance(path, str) and _scheme(path) == "file":
        return local_path(path)
    return path


def prefix_of(url: ObjectUrl) -> str:
    """The listing prefix a folder URL names: ``s3://b/p`` and ``s3://b/p/`` both give ``"p/"`` (root: ``""``)."""
    key = url.key.strip("/")
    return key + "/" if key else ""


def join_url(base: str, rel: str) -> str:
    """``base`` (a folder URL, with or without ``/``) joined with a relative key ``rel`` (``/``-separated).

    Examples
    --------
    >>> join_url("s3://b/p", "x/a.npy"), join_url("s3://b/p/", "a.npy"), join_url("s3://b", "a.npy")
    ('s3://b/p/x/a.npy', 's3://b/p/a.npy', 's3://b/a.npy')
    """
    return base.rstrip("/") + "/" + rel
