"""Listing a prefix of an object store, as DALI's traversal would find its files in folders.

obstore lists; a key it cannot represent (a control character) fails its
whole listing, so such a key is skipped where the selection would not take
it anyway (on S3, by listing the prefix again through boto3) and named in a
``ValueError`` otherwise.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

from npydask.storage._remote_errors import call, unlistable_key
from npydask.storage._stores import import_obstore, run_all
from npydask.storage.base import Identity, Lister, Listing
from npydask.storage.object import ObjectIdentity, ObjectSource
from npydask.storage.urls import ObjectUrl, join_url, prefix_of, redact, split_url, unlistable

__all__ = ["ObjectLister"]


class ObjectLister(Lister):
    """The objects under a prefix, as DALI's traversal would find them in folders.

    Without ``recursive``: the objects directly under the prefix, then those
    directly under each immediate "folder" (one LIST with a delimiter, then one
    per folder, in parallel); with it, every object at any depth (one paged
    LIST). Zero-byte ``folder/`` marker keys are skipped. Sizes and
    identities come with the listing.
    """

    def __init__(self, source: ObjectSource, url: str) -> None:
        if source.spec.kind == "http":
            raise ValueError(
                f"{redact(url)}: plain http(s):// servers have no listing; pass the objects' URLs with "
                "files=[...] or file_list=... (a text file of URLs, one per line)"
            )
        self.source = source
        self.url = url
        self.parsed: ObjectUrl = split_url(url)
        self.prefix = prefix_of(self.parsed)

    def list(self, recursive: bool = False, match: Callable[[str], object] | None = None) -> Listing:
        """See :meth:`Lister.list` (relative paths joined with ``/``).

        obstore fails a whole listing on a key holding a control character
        (a tab, a newline): such a key is skipped where ``match`` refuses its
        name anyway (S3: the prefix is listed again through boto3), and named
        in a ``ValueError`` otherwise.
        """
        paths: list[str] = []
        sizes: list[int] = []
        idents: list[Identity] = []
        cut = len(self.prefix)
        mode = self.source.identity_mode

        def take(metas: Sequence[Any]) -> None:
            for meta in metas:
                key = meta["path"]
                rel = key[cut:]
                if not rel or rel.endswith("/"):
                    continue  # (a "folder/" marker)
                if match is not None and not match(rel.rpartition("/")[2]):
                    continue
                identity = ObjectIdentity.of(meta, mode)
                if identity.etag is None and mode != "none":
                    identity = self.source.opened(self.join(rel), meta)  # (refused without one)
                paths.append(rel)
                sizes.append(int(meta["size"]))
                idents.append(identity)

        pages, bad = call(self.url, "listing the prefix", self._pages, recursive)
        if bad is not None:
            pages = [self._pages_around(bad, recursive, match)]
        for page in pages:
            take(page)
        return Listing(paths, sizes, idents)

    # (builtins.list: in this class's scope, ``list`` is the method)
    def _pages(self, recursive: bool) -> tuple[builtins.list[Sequence[Any]], str | None]:
        """obstore's listing pages, or the key it failed on (one it cannot represent)."""
        obstore = import_obstore()
        store = self.source.store(self.url)
        try:
            if recursive:
                return list(obstore.list(store, self.prefix or None, chunk_size=1000)), None
            top = obstore.list_with_delimiter(store, self.prefix or None)
            folders = sorted(top["common_prefixes"])
            pages = run_all(
                lambda p: obstore.list_with_delimiter(store, p)["objects"],
                folders,
                self.source.spec.settings.concurrency,
            )
            return [top["objects"], *pages], None
        except Exception as e:
            bad = unlistable_key(e)
            if bad is None:
                raise
        return [], bad

    def _pages_around(self, bad: str, recursive: bool, match: Callable[[str], object] | None) -> builtins.list[Any]:
        """The listing without the keys obstore cannot represent, where the selection skips them (S3 only)."""
        wanted = match is None or match(bad[len(self.prefix) :].rpartition("/")[2])
        where = redact(self.url)
        if not wanted and self.source.spec.kind == "s3" and _has_boto3():
            from npydask.storage.s3_upload import list_objects

            metas = []
            for meta in list_objects(self.source.spec, self.url, self.prefix):
                rel = meta["path"][len(self.prefix) :]
                if not recursive and rel.count("/") > 1:
                    continue
                if unlistable(rel):
                    if match is None or match(rel.rpartition("/")[2]):
                        raise _unreadable(where, meta["path"], "the selection takes it")
                    continue
                metas.append(meta)
            return metas
        why = "the selection takes it" if wanted else "the listing fails on it although the selection skips it"
        raise _unreadable(where, bad, why)

    def join(self, rel: str) -> str:
        """The URL of a listed relative path."""
        return join_url(self.url, rel)


def _unreadable(where: str, key: str, why: str) -> ValueError:
    return ValueError(
        f"{where}: the key {key!r} holds a control character (a tab, a newline, ...), which the object store "
        f"client (obstore) cannot list or read, and {why}: rename the object or move it out of the prefix"
    )


def _has_boto3() -> bool:
    import importlib.util

    return importlib.util.find_spec("boto3") is not None
