"""How the object source uses the node cache (:mod:`npydask.cache`): which reads may, and under which key.

A read of an object goes through the node cache when the store's
``identity`` option is ``"etag"`` (the default) and the object was opened
with a strong ETag (:func:`~npydask.cache.keys.cacheable`): the entry is
keyed by the store's public part (scheme, bucket, endpoint and region, what
enters ``x.name``), the URL without query or user info, the query's digest
without credential parameters, the size and that ETag. Objects opened with
``identity="last-modified"`` or ``"none"``, weak ETags (``W/``) and
``http(s)`` servers that send no strong ETag are read without it, and a
dataset whose cache is on says so once (:func:`uncached_warning`). Local
files never use it: the operating system's page cache keeps them.

The cache itself is asked for lazily (:func:`cache_for`): a process whose
reads have the cache off never imports its runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from npydask import config
from npydask.cache.keys import EntryKey, cacheable
from npydask.cache.spec import Cache, CacheChoice
from npydask.storage.urls import OBJECT_SCHEMES, redact

if TYPE_CHECKING:
    from npydask.cache.node import NodeCache

__all__ = ["cache_for", "cache_on", "entry_key", "uncached_warning"]


def cache_on(choice: CacheChoice) -> bool:
    """Whether reads with ``choice`` use a node cache in this process (a :class:`Cache`, or the setting).

    Examples
    --------
    >>> cache_on(False), cache_on(Cache("/tmp/c"))
    (False, True)
    >>> with config.set(cache=""):
    ...     cache_on(None)
    False
    """
    if choice is None:
        return bool(config.get("cache"))
    return isinstance(choice, Cache)


def cache_for(choice: CacheChoice) -> NodeCache | None:
    """This process's node cache for a task's ``choice``; ``None`` when it is off here.

    Raises
    ------
    OSError
        For a cache folder the node cache refuses (naming it and why).
    ValueError
        For a folder that records another ``max_bytes`` or ``policy``.
    """
    spec = choice if isinstance(choice, Cache) else Cache.from_settings() if choice is None else None
    if spec is None:
        return None  # (the cache's runtime is not imported where it is off)
    from npydask.cache.node import node_cache

    return node_cache(spec)  # (the setting read once here, not again by node_cache)


def entry_key(store: str, url: str, size: int, etag: str) -> EntryKey:
    """The cache key of object ``url`` (of the store whose public text is ``store``) at ``size`` and ``etag``.

    An ``http(s)`` URL's query string (a presigned or SAS URL's signature
    and expiry) is not part of the key: only its digest without credential
    parameters is (:func:`~npydask.cache.keys.query_digest`). In ``s3://``,
    ``gs://`` and ``az://`` URLs ``?`` belongs to the key.

    Examples
    --------
    >>> a = entry_key("https://h", "https://h/x.npy?X-Amz-Signature=1&versionId=3", 80, '"e"')
    >>> a == entry_key("https://h", "https://h/x.npy?versionId=3&X-Amz-Signature=2", 80, '"e"'), a.key
    (True, 'https://h/x.npy')
    >>> entry_key("s3://b", "s3://b/x.npy?v=1", 80, '"e"').key
    's3://b/x.npy?v=1'
    """
    http = OBJECT_SCHEMES.get(url.partition("://")[0].lower()) == "http"
    return EntryKey.of(store, redact(url), urlsplit(url).query if http else "", size, etag)


def uncached_warning(mode: str, paths: Sequence[str], identities: Sequence[Any]) -> str | None:
    """What a dataset whose cache is on says about objects it reads without the cache; ``None`` when all may use it.

    ``mode`` is the store's ``identity`` option; ``identities`` are the
    objects' (with an ``etag`` attribute), in ``paths``' order.

    Examples
    --------
    >>> from npydask.storage.identity import ObjectIdentity
    >>> print(uncached_warning("etag", ["s3://b/a.npy"], [ObjectIdentity(8, '"e"')]))
    None
    >>> uncached_warning("none", ["s3://b/a.npy"], [ObjectIdentity(8, None)]).startswith("s3://b/a.npy (and every")
    True
    """
    if not paths:
        return None
    if mode != "etag":
        return (
            f"{redact(paths[0])} (and every object of this store): the node cache is on, but the store is opened "
            f"with storage_options={{'identity': {mode!r}}}, which does not tell an object from its replacement "
            "by a strong ETag, so cached bytes could be another version's: these objects are read without the "
            "cache (the default identity='etag' caches objects whose server sends strong ETags)"
        )
    bad = [i for i, ident in enumerate(identities) if not cacheable(getattr(ident, "etag", None))]
    if not bad:
        return None
    first = bad[0]
    etag = getattr(identities[first], "etag", None)
    why = "has no ETag" if not etag else f"has a weak ETag {etag!r} (W/: the server does not promise equal bytes)"
    http = " (an http(s) server that sends no strong ETag)" if paths[first].lower().startswith("http") else ""
    return (
        f"{redact(paths[first])}{http}: the node cache is on, but this object {why}, so cached bytes could not be "
        f"told from a replacement's; {len(bad)} of the dataset's {len(paths)} objects are read without the cache"
    )
