"""Which node cache a read uses: :class:`Cache`, the value a task carries, and the ``cache=`` argument's rules.

Rules for ``cache=`` (of ``open_dataset``, ``from_npy`` and the readers below them):

- ``None`` (the default): the ``cache`` setting (``NPYDASK_CACHE``) is read where each task runs, so
  a cluster turns the cache on for every worker by the environment;
- ``False``: off, wherever the task runs;
- ``True``: the ``cache`` setting, read now; an empty one raises ``ValueError`` saying to set it;
- a folder (``str`` or path-like) or a :class:`Cache`: that folder, wherever the task runs.

A :class:`Cache` whose ``max_bytes`` or ``policy`` is ``None`` takes the ``cache_max_bytes`` and
``cache_policy`` settings where it is used.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass
from typing import Any, Union

from npydask import config

__all__ = ["Cache", "CacheChoice", "cache_choice"]


def _size(value: Any) -> int:
    if isinstance(value, str):
        with config.set(cache_max_bytes=value):  # (the setting's own parser and bounds)
            size: int = config.get("cache_max_bytes")
        return size
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Cache max_bytes takes an int or a size such as '10GiB', found {value!r}")
    if value < 1:
        raise ValueError(f"Cache max_bytes must be at least 1 byte, found {value!r}")
    return value


@dataclass(frozen=True)
class Cache:
    """A node cache: a folder on the node's local disk that keeps the bytes read from objects.

    Every thread and process that names the same folder shares it. Bytes of an
    object are kept per object version (its size and strong ETag), as the byte
    runs reads asked for, each block checksummed; a damaged file is a miss,
    never other data.

    Parameters
    ----------
    folder : str or path-like
        An absolute folder on a local file system (created with mode 0700).
    max_bytes : int or str, optional
        Bytes of cached data to hold (``10GiB``...); default the ``cache_max_bytes`` setting where
        it is used.
    policy : {"pin", "lru"}, optional
        ``pin`` admits until full and keeps what it holds; ``lru`` evicts the least recently used;
        default the ``cache_policy`` setting where it is used.

    Raises
    ------
    ValueError
        For a relative folder, a size that is not positive, or another policy.

    Examples
    --------
    >>> import npydask
    >>> npydask.Cache("/local_nvme/npydask-cache", max_bytes="200GiB")
    Cache(folder='/local_nvme/npydask-cache', max_bytes=214748364800, policy=None)
    """

    folder: str
    max_bytes: int | None = None
    policy: str | None = None

    def __init__(
        self, folder: str | os.PathLike[str], *, max_bytes: int | str | None = None, policy: str | None = None
    ) -> None:
        raw = os.fspath(folder)
        if not isinstance(raw, str):
            raise TypeError(f"Cache folder takes a str or path-like, found {folder!r}")
        path = os.path.expanduser(raw)
        if not os.path.isabs(path):
            raise ValueError(
                f"Cache folder must be an absolute path on a local disk (such as /local_nvme/npydask-cache), "
                f"found {raw!r}"
            )
        if policy is not None and policy not in config.CACHE_POLICIES:
            raise ValueError(f"Cache policy must be one of {list(config.CACHE_POLICIES)}, found {policy!r}")
        object.__setattr__(self, "folder", os.path.normpath(path))
        object.__setattr__(self, "max_bytes", None if max_bytes is None else _size(max_bytes))
        object.__setattr__(self, "policy", policy)

    @classmethod
    def from_settings(cls) -> Cache | None:
        """The ``cache`` setting's folder as read here (size and policy unset), or ``None`` when off."""
        folder: str = config.get("cache")
        return cls(folder) if folder else None

    def resolved(self) -> tuple[str, int, str]:
        """``(folder, max_bytes, policy)`` with the settings read here for what is ``None``."""
        max_bytes: int = config.get("cache_max_bytes") if self.max_bytes is None else self.max_bytes
        policy: str = config.get("cache_policy") if self.policy is None else self.policy
        return self.folder, max_bytes, policy

    # -- the folder's upkeep: what ``npydask cache info/clear/prune`` do ------------------------

    def info(self) -> Any:
        """What the folder holds, as ``npydask cache info`` prints it: a frozen ``npydask.cache.admin.CacheInfo``.

        Entries, extents, bytes held against the folder's recorded ``max_bytes``,
        its policy, hits and misses, and entries and bytes per dataset prefix.

        Raises
        ------
        OSError
            :class:`~npydask.errors.CacheFolderError` for a folder refused as a cache (see the class).
        """
        return _admin("cache_info")(self.folder)

    def clear(self) -> int:
        """Remove every entry; returns the bytes removed. The folder's recorded ``max_bytes`` and policy are reset.

        Safe while other processes read through the folder: their reads fetch again.
        """
        removed: int = _admin("cache_clear")(self.folder)
        return removed

    def prune(self, older_than_days: float) -> tuple[int, int]:
        """Remove the entries unread for ``older_than_days`` days; returns ``(entries, bytes)`` removed.

        Raises
        ------
        TypeError
            ``older_than_days`` is not a number.
        ValueError
            ``older_than_days`` is negative or not finite.
        """
        if isinstance(older_than_days, bool) or not isinstance(older_than_days, (int, float)):
            raise TypeError(f"Cache.prune takes a number of days, found {older_than_days!r}")
        if not math.isfinite(older_than_days) or older_than_days < 0:
            raise ValueError(f"Cache.prune takes a number of days of 0 or more, found {older_than_days!r}")
        entries, removed = _admin("cache_prune")(self.folder, older_than_days * 86400.0)
        return int(entries), int(removed)


def _admin(name: str) -> Any:
    """The folder function ``name`` of :mod:`npydask.cache.admin`, imported on first use.

    ``admin`` builds on this module (a task's :class:`Cache`), so this module names it only here,
    by its dotted path: no import cycle, and ``import npydask`` does not load the cache's runtime.
    """
    return getattr(importlib.import_module("npydask.cache.admin"), name)


CacheChoice = Union[Cache, bool, None]
"""What a task carries: a :class:`Cache`, ``False`` (off) or ``None`` (the setting where it runs)."""


def cache_choice(cache: Any) -> CacheChoice:
    """The ``cache=`` argument as a task carries it (see the module's rules).

    Raises
    ------
    ValueError
        For ``True`` while the ``cache`` setting is empty, or a relative folder.
    TypeError
        For anything else.

    Examples
    --------
    >>> cache_choice(None) is None, cache_choice(False)
    (True, False)
    >>> cache_choice("/tmp/c")
    Cache(folder='/tmp/c', max_bytes=None, policy=None)
    """
    if cache is None or cache is False or isinstance(cache, Cache):
        return cache
    if cache is True:
        found = Cache.from_settings()
        if found is None:
            raise ValueError(
                "cache=True needs the cache setting: set NPYDASK_CACHE (or npydask.config.set(cache=...)) to an "
                "absolute folder on the node's local disk, or pass cache='/local/folder'"
            )
        return found
    if isinstance(cache, (str, os.PathLike)):
        return Cache(cache)
    raise TypeError(
        f"cache= takes None (the NPYDASK_CACHE setting where a task runs), False, True, a folder or an "
        f"npydask.Cache, found {cache!r}"
    )
