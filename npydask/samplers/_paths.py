"""Where a sampler's own files go (a candidate index, stitched outputs): the dataset's store where it can."""

from __future__ import annotations

from npydask.storage.base import Source
from npydask.storage.urls import is_url, split_url
from npydask.storage.where import resolve

__all__ = ["source_for"]


def source_for(path: str, data_source: Source) -> tuple[Source, str]:
    """The source that reads and writes ``path``, and ``path`` as it takes it.

    A URL in the same bucket as the dataset's objects is reached through the
    dataset's own source (its ``storage_options``, credentials included);
    any other URL with the environment's credentials, and a local path as
    :func:`~npydask.storage.where.resolve` makes it (absolute).
    """
    if is_url(path) and not data_source.mappable:
        spec = getattr(data_source, "spec", None)
        if spec is not None and spec.base.rstrip("/") == split_url(path).base:
            return data_source, path
    where = resolve(path)
    return where.source, where.path
