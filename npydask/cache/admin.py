"""Looking after a node cache folder: what it holds, pruning, clearing (``npydask cache info/prune/clear``)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from .folder import open_cache_folder
from .ledger import Counts, Ledger, forget_settings, read_settings, walk_entries
from .node import flush_open
from .scan import remove_empty_fans, remove_entry, scan

__all__ = ["CacheInfo", "cache_clear", "cache_info", "cache_prune"]


@dataclass(frozen=True)
class CacheInfo:
    """What a cache folder holds (``npydask cache info``)."""

    folder: str
    entries: int
    extents: int
    bytes: int
    """Bytes of extents held (their files' names summed)."""
    max_bytes: int | None
    """As recorded in the folder (``None`` before a process used it)."""
    policy: str | None
    hits: int
    misses: int
    hit_bytes: int
    by_prefix: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Per dataset prefix (the objects' URLs up to their last ``/``): ``(entries, bytes)``."""


def _open_admin(folder: str) -> tuple[int, Ledger]:
    flush_open(folder)
    dir_fd = open_cache_folder(folder)
    return dir_fd, Ledger(dir_fd)


def cache_info(folder: str) -> CacheInfo:
    """What the cache folder ``folder`` holds: entries, extents and bytes (per dataset prefix), bounds, hits."""
    dir_fd, ledger = _open_admin(folder)
    try:
        recorded = read_settings(dir_fd)
        entries = scan(dir_fd)
        with ledger.lock:
            counts = ledger.read() or Counts()
        by_prefix: dict[str, tuple[int, int]] = {}
        for e in entries:
            prefix = e.label.rsplit("/", 1)[0] if "/" in e.label else (e.label or "(unknown)")
            k, b = by_prefix.get(prefix, (0, 0))
            by_prefix[prefix] = (k + 1, b + e.held)
        return CacheInfo(
            folder,
            len(entries),
            sum(len(e.extents) for e in entries),
            sum(e.held for e in entries),
            None if recorded is None else recorded.max_bytes,
            None if recorded is None else recorded.policy,
            counts.hits,
            counts.misses,
            counts.hit_bytes,
            dict(sorted(by_prefix.items())),
        )
    finally:
        ledger.close()
        os.close(dir_fd)


def cache_clear(folder: str) -> int:
    """Remove every entry of the cache folder and its recorded bounds; the bytes of extents removed."""
    dir_fd, ledger = _open_admin(folder)
    try:
        freed = sum(remove_entry(dir_fd, path, ledger) for path in list(walk_entries(dir_fd)))
        remove_empty_fans(dir_fd)
        with ledger.lock:
            ledger.write(Counts())
            forget_settings(dir_fd)
        return freed
    finally:
        ledger.close()
        os.close(dir_fd)


def cache_prune(folder: str, older_than_s: float) -> tuple[int, int]:
    """Remove the entries unused for ``older_than_s`` seconds; ``(entries, bytes)`` removed."""
    if older_than_s < 0:
        raise ValueError(f"older_than must be 0 or more, found {older_than_s!r}")
    dir_fd, ledger = _open_admin(folder)
    try:
        cutoff = time.time() - older_than_s
        removed = freed = 0
        for e in scan(dir_fd):
            if max([e.mtime, *(m for _, _, m in e.extents)]) < cutoff:
                freed += remove_entry(dir_fd, e.path, ledger)
                removed += 1
        return removed, freed
    finally:
        ledger.close()
        os.close(dir_fd)
