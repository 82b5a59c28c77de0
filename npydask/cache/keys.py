"""Which object version a cache entry holds, and the hashed name it is filed under.

Rules:

- An entry is keyed by the store (scheme, endpoint, region, bucket or account, as one string the
  caller gives), the object key, the query string without its credential parameters, the object's
  size and its **strong** ETag. Two reads of one object version share an entry whatever signature,
  token or expiry their URLs carry; any other difference makes another entry.
- Credential parameters are dropped by name, case-insensitively: every name beginning ``x-amz-``,
  ``x-goog-`` or ``x-ms-`` (S3, GCS and Azure signing), and the names in :data:`CREDENTIAL_PARAMETERS`
  (Azure SAS fields such as ``sig``, ``se``, ``sp``, ``sv``; CloudFront's ``Signature``, ``Policy``,
  ``Key-Pair-Id``, ``Expires``; and generic ``token``, ``key``, ``credential``, ``access_token``...).
  The list errs on the generous side: dropping a parameter that selects content would share an entry
  between versions only if their size and strong ETag also agree.
- The remaining parameters are sorted, so their order does not matter, and only their SHA-256 enters
  the key: a key holds no credential and no query text.
- A weak ETag (``W/"..."``) or none at all is not cacheable (:func:`cacheable`); :class:`EntryKey`
  refuses one with ``ValueError``.
- :meth:`EntryKey.entry_name` is the SHA-256 of the key's fields in hex: file names in the cache
  never carry URL text.

>>> k = EntryKey.of("s3://bucket", "a/x.npy", "X-Amz-Signature=ab&versionId=3", 80, '"e1"')
>>> k == EntryKey.of("s3://bucket", "a/x.npy", "versionId=3&X-Amz-Signature=cd", 80, '"e1"')
True
>>> len(k.entry_name()), cacheable('W/"e1"')
(64, False)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

__all__ = ["CREDENTIAL_PARAMETERS", "CREDENTIAL_PREFIXES", "EntryKey", "cacheable", "query_digest"]

# Parameter name prefixes that carry request signing (lower case).
CREDENTIAL_PREFIXES: tuple[str, ...] = ("x-amz-", "x-goog-", "x-ms-", "x-oss-", "x-obs-")

# Parameter names that carry credentials, signatures or their expiry (lower case).
CREDENTIAL_PARAMETERS: frozenset[str] = frozenset(
    {
        # Azure shared access signatures
        "sig", "se", "st", "sp", "sv", "sr", "spr", "srt", "ss", "si", "sip", "sdd",
        "skoid", "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid",
        # CloudFront and legacy S3 / GCS query authentication
        "signature", "policy", "key-pair-id", "expires", "awsaccesskeyid", "googleaccessid",
        # generic tokens and keys
        "token", "key", "apikey", "api_key", "access_token", "id_token", "auth", "authorization",
        "credential", "credentials", "security-token", "securitytoken", "session_token",
        "sessiontoken", "password", "secret", "client_secret",
    }
)  # fmt: skip


def _is_credential(name: str) -> bool:
    low = name.lower()
    return low in CREDENTIAL_PARAMETERS or low.startswith(CREDENTIAL_PREFIXES)


def query_digest(query: str) -> str:
    """The SHA-256 (hex) of a query string without its credential parameters, in sorted order.

    Parameters
    ----------
    query : str
        The query string, with or without the leading ``?``.

    Returns
    -------
    str
        64 hex digits; the same for queries that differ only in credentials or parameter order.

    Examples
    --------
    >>> query_digest("versionId=3&sig=abc") == query_digest("?versionId=3")
    True
    >>> query_digest("versionId=3") == query_digest("versionId=4")
    False
    """
    if query in ("", "?"):
        return _EMPTY_QUERY
    pairs = parse_qsl(query.removeprefix("?"), keep_blank_values=True)
    kept = sorted((k, v) for k, v in pairs if not _is_credential(k))
    return hashlib.sha256(urlencode(kept).encode("utf-8")).hexdigest()


_EMPTY_QUERY = hashlib.sha256(b"").hexdigest()


def cacheable(etag: str | None) -> bool:
    """Whether an object with this ETag may be cached: a strong ETag only.

    Parameters
    ----------
    etag : str or None
        The ETag as the store gave it.

    Returns
    -------
    bool
        ``False`` for ``None``, an empty ETag and a weak one (``W/...``).

    Examples
    --------
    >>> cacheable('"abc"'), cacheable('W/"abc"'), cacheable(None)
    (True, False, False)
    """
    return etag is not None and etag != "" and not etag.startswith(("W/", "w/"))


@dataclass(frozen=True)
class EntryKey:
    """The object version one cache entry holds.

    Build one with :meth:`of`, which hashes the query; the fields hold no credential.

    Parameters
    ----------
    store : str
        The store's identity: scheme, endpoint, region, bucket or account.
    key : str
        The object key within the store.
    query : str
        :func:`query_digest` of the URL's query string.
    size : int
        The object's size in bytes.
    etag : str
        The object's strong ETag.

    Raises
    ------
    ValueError
        For a weak or empty ETag, a negative size or a ``query`` that is not a digest.

    Examples
    --------
    >>> EntryKey.of("s3://b", "x.npy", "", 10, 'W/"1"')
    Traceback (most recent call last):
    ...
    ValueError: the ETag 'W/"1"' of 'x.npy' is weak or empty: only objects with a strong ETag are cached
    """

    store: str
    key: str
    query: str
    size: int
    etag: str

    def __post_init__(self) -> None:
        if not cacheable(self.etag):
            raise ValueError(
                f"the ETag {self.etag!r} of {self.key!r} is weak or empty: only objects with a strong ETag are cached"
            )
        if not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"the size of {self.key!r} must be a non-negative int, not {self.size!r}")
        if len(self.query) != 64 or any(c not in "0123456789abcdef" for c in self.query):
            raise ValueError(f"query must be a query_digest (64 hex digits), not {self.query!r}")

    @classmethod
    def of(cls, store: str, key: str, query: str, size: int, etag: str) -> EntryKey:
        """The key of an object version, from the URL's raw query string.

        Examples
        --------
        >>> EntryKey.of("s3://b", "x.npy", "sig=1", 10, '"1"') == EntryKey.of("s3://b", "x.npy", "", 10, '"1"')
        True
        """
        return cls(store, key, query_digest(query), size, etag)

    def entry_name(self) -> str:
        """The entry's name in the cache folder: SHA-256 of every field, 64 hex digits.

        Examples
        --------
        >>> name = EntryKey.of("s3://b", "x.npy", "", 10, '"1"').entry_name()
        >>> len(name), set(name) <= set("0123456789abcdef")
        (64, True)
        """
        found: str | None = self.__dict__.get("_entry_name")
        if found is None:  # (computed once: a read asks for it several times)
            fields = ["npydask-cache-entry-1", self.store, self.key, self.query, self.size, self.etag]
            found = hashlib.sha256(json.dumps(fields).encode("utf-8")).hexdigest()
            object.__setattr__(self, "_entry_name", found)
        return found

    def entry_digest(self) -> bytes:
        """:meth:`entry_name` as 32 bytes, recorded in each extent file's header.

        Examples
        --------
        >>> k = EntryKey.of("s3://b", "x.npy", "", 10, '"1"')
        >>> k.entry_digest().hex() == k.entry_name()
        True
        """
        found: bytes | None = self.__dict__.get("_entry_digest")
        if found is None:
            found = bytes.fromhex(self.entry_name())
            object.__setattr__(self, "_entry_digest", found)
        return found

    def etag_digest(self) -> bytes:
        """SHA-256 of the ETag alone (32 bytes), recorded in each extent file's header.

        Examples
        --------
        >>> len(EntryKey.of("s3://b", "x.npy", "", 10, '"1"').etag_digest())
        32
        """
        found: bytes | None = self.__dict__.get("_etag_digest")
        if found is None:
            found = hashlib.sha256(self.etag.encode("utf-8")).digest()
            object.__setattr__(self, "_etag_digest", found)
        return found
