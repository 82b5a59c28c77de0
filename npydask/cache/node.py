"""A node cache at work: reads served from cached extents, missing runs fetched once per node, bounds kept.

Rules:

- :func:`node_cache` gives one :class:`NodeCache` per process and folder. Opening one checks the
  folder (:func:`~.folder.open_cache_folder`), records or checks its bounds
  (:func:`~.ledger.record_settings`), registers the process and cleans up after dead ones
  (:func:`~.ledger.register`).
- :meth:`NodeCache.read` fills a buffer with bytes ``[start, stop)`` of an object version: each
  part held in an extent file is read and its blocks' checksums verified; each missing run is
  fetched by the caller's ``fetch`` under a range lock (:mod:`.locks`), after looking again once
  the lock is held, so a run is fetched once per node. A fetch whose response the caller calls
  exact is admitted as an extent (the run as asked, never widened).
- Any damaged or vanished extent file is a miss: it is removed (by whoever removes it first, who
  also gives its bytes back to the ledger) and the run fetched again.
- **Bounds.** Bytes are reserved in the ledger before an extent is written. ``pin`` admits until
  full; then entries of an object superseded by a newer version, and entries unused for 7 days, are
  removed to make room, and otherwise the extent is not admitted. ``lru`` removes the least
  recently used extents (a read touches the files it uses) down to 90% of ``max_bytes``.
- **A cache that cannot be written never fails a read.** A full disk, a quota, a read-only file
  system, a refused write, or less than 5% of the file system free stop admission for this
  process with one :class:`~npydask.errors.NpyDaskWarning` saying why (low space is looked at
  again after a minute); the fetched bytes are returned.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import json
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from npydask.errors import NpyDaskWarning

from .entry import read_extent_into, read_extent_part, write_extent
from .folder import open_cache_folder
from .handles import OpenExtents
from .keys import EntryKey
from .ledger import (
    ENTRIES,
    Counts,
    Ledger,
    RecordedSettings,
    extent_name,
    parse_extent_name,
    record_settings,
    register,
)
from .locks import acquire_range, lock_span
from .scan import Entry, pin_index, remove_entry, remove_extent, scan, write_meta
from .spec import Cache, CacheChoice

__all__ = ["CacheRead", "NodeCache", "flush_open", "node_cache"]

Fetch = Callable[[int, int], "tuple[bytes | bytearray | memoryview, bool]"]
"""``fetch(lo, hi)``: exactly ``hi - lo`` bytes of the object, and whether they may be admitted."""

LOW_SPACE = 0.05
"""Admission stops while less than this share of the file system is free."""
_SCAN_EVERY_S = 60.0
_TOUCH_EVERY_S = 3600.0
_LOCK = "lock"
_STOP_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG))


@dataclass(frozen=True)
class CacheRead:
    """What one :meth:`NodeCache.read` took from where."""

    hit_bytes: int
    """Bytes served from the cache."""
    fetched_bytes: int
    """Bytes fetched by ``fetch``."""
    fetches: int
    """Calls of ``fetch`` (0: the read was served wholly from the cache)."""


def object_name(key: EntryKey) -> str:
    """The hash of the object an entry is a version of (its store, key and query; not size or ETag)."""
    return hashlib.sha256(json.dumps(["npydask-cache-object-1", key.store, key.key, key.query]).encode()).hexdigest()


class NodeCache:
    """One process's open node cache folder (use :func:`node_cache`)."""

    def __init__(self, folder: str, max_bytes: int, policy: str) -> None:
        self.folder, self.max_bytes, self.policy = folder, max_bytes, policy
        self.dir_fd = open_cache_folder(folder)
        try:
            record_settings(self.dir_fd, folder, RecordedSettings(max_bytes, policy))
            self.ledger = Ledger(self.dir_fd)
            self._registration = register(self.dir_fd, self.ledger)
        except BaseException:
            os.close(self.dir_fd)
            raise
        self._lock = threading.Lock()
        self._extents = OpenExtents(self.dir_fd)
        self._pending = [0, 0, 0]  # hits, misses, hit bytes not yet in the ledger
        self._touched: dict[str, float] = {}
        self._stopped: str | None = None
        self._warned: set[str] = set()
        self._low_space_until = 0.0
        self._space_checked = 0.0
        self._pin_scanned = 0.0
        self._pin_index: tuple[dict[str, list[Entry]], list[Entry]] | None = None
        self._room = threading.Lock()
        atexit.register(self.flush)
        _open.add(self)

    # -- reading -----------------------------------------------------------------------------------

    def read(
        self,
        key: EntryKey,
        start: int,
        stop: int,
        out: memoryview,
        fetch: Fetch,
        *,
        label: str,
        wait_s: float,
    ) -> CacheRead:
        """Fill ``out`` with bytes ``[start, stop)`` of ``key``'s object: cached extents, then ``fetch`` for the rest.

        Parameters
        ----------
        key : EntryKey
            The object version.
        start, stop : int
            The byte range; ``out`` holds ``stop - start`` bytes (format ``"B"``).
        fetch : callable
            ``fetch(lo, hi) -> (data, exact)`` for each missing run; its exceptions propagate
            (nothing of that run is admitted).
        label : str
            The object's URL without query or user info, kept in the entry for ``cache info``.
        wait_s : float
            Longest wait for a run another thread or process is fetching; then this one fetches it.
        """
        n = stop - start
        if not 0 <= start <= stop <= key.size or len(out) != n:
            raise ValueError(
                f"a node cache read of bytes [{start}, {stop}) of {label} into a buffer of {len(out)} bytes: expected "
                f"0 <= start <= stop <= the object's size {key.size} and a buffer of stop - start bytes"
            )
        if n == 0:
            return CacheRead(0, 0, 0)
        entry = _entry_path(key)
        missing = self._serve(entry, key, start, stop, out)
        if not missing:
            self._count(hits=1, hit_bytes=n)
            self._touch(entry)
            return CacheRead(n, 0, 0)
        fetched = calls = 0
        for lo, hi in missing:
            got, made = self._fetch_run(entry, key, lo, hi, out[lo - start : hi - start], fetch, label, wait_s)
            fetched += got
            calls += made
        self._count(hits=int(calls == 0), misses=int(calls > 0), hit_bytes=n - fetched)
        return CacheRead(n - fetched, fetched, calls)

    def serve(self, key: EntryKey, start: int, stop: int, out: memoryview) -> bool:
        """Fill ``out`` with bytes ``[start, stop)`` of ``key``'s object if the cache holds all of them; whether it did.

        No lock, no fetch: a caller serves what is held in its own thread and sends the rest to
        :meth:`read` (``out``'s bytes are unspecified when this returns ``False``).
        """
        n = stop - start
        if not 0 <= start <= stop <= key.size or len(out) != n:
            return False
        entry = _entry_path(key)
        if n and not self._exact_into(f"{entry}/{extent_name(start, n)}", key, start, out):
            if self._serve(entry, key, start, stop, out, tried=True):
                return False
        self._count(hits=1, hit_bytes=n)
        self._touch(entry)
        return True

    def serve_many(self, requests: Sequence[tuple[EntryKey | None, int, int]]) -> list[memoryview | None]:
        """Each ``(key, start, stop)`` held as one extent asked for before: a view of its bytes, else ``None``.

        The batch form of :meth:`serve` for many small reads (one open and one read each, no
        lock, no listing); a ``None`` key is skipped. A request answered ``None`` goes to
        :meth:`read`, which also finds bytes held in other extents.
        """
        found: list[memoryview | None] = []
        hits = hit_bytes = 0
        for key, start, stop in requests:
            data = None
            if key is not None and 0 <= start < stop <= key.size:
                entry = _entry_path(key)
                buf = memoryview(bytearray(stop - start))
                if self._exact_into(f"{entry}/{extent_name(start, stop - start)}", key, start, buf):
                    data = buf
                    hits += 1
                    hit_bytes += stop - start
                    self._touch(entry)
            found.append(data)
        if hits:
            self._count(hits=hits, hit_bytes=hit_bytes)
        return found

    def _fetch_run(
        self, entry: str, key: EntryKey, lo: int, hi: int, view: memoryview, fetch: Fetch, label: str, wait_s: float
    ) -> tuple[int, int]:
        try:
            lock, _ = acquire_range(self.dir_fd, _LOCK, *lock_span(key.entry_name(), lo, hi), wait_s)
        except OSError:
            lock = None
        try:
            # (look again once the lock is held: another may have published since this read missed)
            todo = self._serve(entry, key, lo, hi, view, offset=lo) if lock is not None else [(lo, hi)]
            fetched = 0
            for a, b in todo:
                data, exact = fetch(a, b)
                if len(memoryview(data).cast("B")) != b - a:
                    raise ValueError(f"fetching bytes [{a}, {b}) of {label} gave {len(data)} bytes, expected {b - a}")
                view[a - lo : b - lo] = data
                fetched += b - a
                if exact:
                    self._admit(entry, key, a, data, label)
            return fetched, len(todo)
        finally:
            if lock is not None:
                lock.release()

    def _serve(
        self,
        entry: str,
        key: EntryKey,
        start: int,
        stop: int,
        out: memoryview,
        offset: int | None = None,
        tried: bool = False,
    ) -> list[tuple[int, int]]:
        """Copy what the entry holds of ``[start, stop)`` into ``out`` (first byte ``offset``); the runs missing."""
        base = start if offset is None else offset
        whole = out[start - base : stop - base]
        if not tried and self._exact_into(f"{entry}/{extent_name(start, stop - start)}", key, start, whole):
            return []  # (the extent asked for before: one read)
        try:
            efd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=self.dir_fd)
        except OSError:
            return [(start, stop)]
        try:
            held = sorted(
                (found[0], found[0] + found[1], name)
                for name in os.listdir(efd)
                if (found := parse_extent_name(name)) is not None and found[0] < stop and found[0] + found[1] > start
            )
            missing: list[tuple[int, int]] = []
            pos = start
            while pos < stop:
                best = max((h for h in held if h[0] <= pos < h[1]), key=lambda h: h[1], default=None)
                if best is None:
                    nxt = min((h[0] for h in held if h[0] > pos), default=stop)
                    _add_run(missing, pos, min(nxt, stop))
                    pos = min(nxt, stop)
                    continue
                end = min(best[1], stop)
                part = read_extent_part(efd, best[2], key, best[0], best[1] - best[0], pos, end)
                if part is None:  # (damaged or gone: a miss, and the file removed)
                    held.remove(best)
                    self._discard(efd, entry, best[2], best[1] - best[0])
                    continue
                out[pos - base : end - base] = part
                self._used(efd, best[2])
                pos = end
            return missing
        except OSError:
            return [(start, stop)]
        finally:
            os.close(efd)

    def _exact_into(self, path: str, key: EntryKey, offset: int, out: memoryview) -> bool:
        """Read the extent file ``path`` of exactly ``[offset, offset + len(out))`` into ``out``; whether valid."""
        lru = self.policy == "lru"

        def read(fd: int) -> bool:
            ok = read_extent_into(fd, key, offset, out)
            if ok and lru:
                os.utime(fd)
            return ok

        try:
            return self._extents.use(path, read)
        except OSError:
            return False

    def _used(self, efd: int, name: str) -> None:
        if self.policy == "lru":
            try:
                os.utime(name, dir_fd=efd, follow_symlinks=False)
            except OSError:
                pass

    def _touch(self, entry: str) -> None:
        """Mark the entry used (its folder's time: what ``prune`` and the 7-day rule look at), hourly at most."""
        now = time.time()
        if now - self._touched.get(entry, 0.0) < _TOUCH_EVERY_S:
            return
        if len(self._touched) > 100_000:
            self._touched.clear()
        self._touched[entry] = now
        try:
            os.utime(entry, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            pass

    def _discard(self, efd: int, entry: str, name: str, length: int) -> None:
        """Remove an extent file; whoever removes it gives its bytes back."""
        self._extents.forget(f"{entry}/{name}")
        try:
            os.unlink(name, dir_fd=efd)
        except OSError:
            return
        self.ledger.give_back(length)

    # -- admitting ---------------------------------------------------------------------------------

    def _admit(self, entry: str, key: EntryKey, offset: int, data: bytes | bytearray | memoryview, label: str) -> None:
        n = len(memoryview(data).cast("B"))
        if self._stopped is not None or n == 0 or n > self.max_bytes or not self._space_ok():
            return
        if not self._reserve(n) and not (self._make_room(n, entry, key) and self._reserve(n)):
            return
        try:
            efd = self._entry_fd(entry, key, label)
            try:
                name = extent_name(offset, n)
                try:
                    os.stat(name, dir_fd=efd, follow_symlinks=False)
                    exists = True
                except FileNotFoundError:
                    exists = False
                if exists:
                    self.ledger.give_back(n)
                    return
                write_extent(efd, name, key, offset, data)
            finally:
                os.close(efd)
        except (OSError, ValueError) as e:
            self.ledger.give_back(n)
            if isinstance(e, OSError) and e.errno in _STOP_ERRNOS:
                self._stop(f"writing to it failed ({os.strerror(e.errno or 0)})")

    def _reserve(self, n: int) -> bool:
        with self.ledger.lock:
            found = self.ledger.current()
            hits, misses, hit_bytes = self._take_pending()
            fits = found.held + n <= self.max_bytes
            self.ledger.write(
                Counts(
                    found.held + (n if fits else 0),
                    found.hits + hits,
                    found.misses + misses,
                    found.hit_bytes + hit_bytes,
                )
            )
            return fits

    def _entry_fd(self, entry: str, key: EntryKey, label: str) -> int:
        parts = entry.split("/")
        for k in range(1, len(parts) + 1):
            try:
                os.mkdir("/".join(parts[:k]), 0o700, dir_fd=self.dir_fd)
            except FileExistsError:
                pass
        efd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=self.dir_fd)
        try:
            write_meta(efd, label, object_name(key), key.size)
        except BaseException:
            os.close(efd)
            raise
        return efd

    def _space_ok(self) -> bool:
        now = time.monotonic()
        if now < self._low_space_until:
            return False
        if now - self._space_checked < 1.0:
            return True
        self._space_checked = now
        try:
            st = os.statvfs(self.folder)
        except OSError:
            return True
        if st.f_blocks and st.f_bavail / st.f_blocks < LOW_SPACE:
            self._low_space_until = now + _SCAN_EVERY_S
            self._warn(
                f"less than {LOW_SPACE:.0%} of its file system is free ({st.f_bavail * st.f_frsize:,} bytes)",
                "low-space",
            )
            return False
        return True

    def _stop(self, why: str) -> None:
        self._stopped = why
        self._warn(why, "stopped")

    def _warn(self, why: str, kind: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        warnings.warn(
            f"the node cache {self.folder!r} stopped admitting bytes: {why}; reads go on from the store and "
            f"from what the cache holds (free space on that disk, or give another folder)",
            NpyDaskWarning,
            stacklevel=4,
        )

    # -- room --------------------------------------------------------------------------------------

    def _make_room(self, n: int, entry: str, key: EntryKey) -> bool:
        """Remove what the policy lets go until ``n`` more bytes fit; whether they do."""
        with self._room:
            with self.ledger.lock:
                held = self.ledger.current().held
            if held + n <= self.max_bytes:
                return True
            if self.policy == "pin":
                return self._pin_room(held, n, entry, object_name(key))
            goal = max(0, self.max_bytes - max(n, self.max_bytes // 10))
            entries = scan(self.dir_fd)
            extents = sorted((mtime, e.path, name, length) for e in entries for name, length, mtime in e.extents)
            for _, path, name, length in extents:
                if held <= goal:
                    break
                held -= remove_extent(self.dir_fd, path, name, length, self.ledger)
            return held + n <= self.max_bytes

    def _pin_room(self, held: int, n: int, entry: str, mine: str) -> bool:
        """Under ``pin``: remove superseded versions, then entries unused for 7 days (scanned once a minute)."""
        now = time.monotonic()
        if self._pin_index is None or now - self._pin_scanned >= _SCAN_EVERY_S:
            self._pin_index, self._pin_scanned = pin_index(scan(self.dir_fd)), now
        by_object, stale = self._pin_index
        victims = [e for e in by_object.get(mine, ()) if e.path != entry] + [e for e in stale if e.path != entry]
        if not victims:
            return False  # (the common case of a full cache: nothing to let go, known without a scan)
        goal = self.max_bytes - n
        gone = set()
        for e in victims:
            if held <= goal:
                break
            held -= remove_entry(self.dir_fd, e.path, self.ledger)
            gone.add(e.path)
        if gone:
            by_object[mine] = [e for e in by_object.get(mine, ()) if e.path not in gone]
            stale[:] = [e for e in stale if e.path not in gone]
        return held <= goal

    # -- figures -----------------------------------------------------------------------------------

    def _count(self, *, hits: int = 0, misses: int = 0, hit_bytes: int = 0) -> None:
        """Add reads' hit figures to this process's pending ones (the ledger gets them every 1,000 reads)."""
        with self._lock:
            self._pending[0] += hits
            self._pending[1] += misses
            self._pending[2] += hit_bytes
            due = self._pending[0] + self._pending[1] >= 1000
        if due:
            self.flush()

    def _take_pending(self) -> tuple[int, int, int]:
        with self._lock:
            hits, misses, hit_bytes = self._pending
            self._pending = [0, 0, 0]
        return hits, misses, hit_bytes

    def forget_open(self) -> None:
        """Close the extent files this process keeps open."""
        self._extents.forget_all()

    def flush(self) -> None:
        """Add this process's hit figures to the folder's ledger."""
        try:
            with self.ledger.lock:
                found = self.ledger.current()
                hits, misses, hit_bytes = self._take_pending()
                if hits or misses:
                    self.ledger.write(
                        Counts(found.held, found.hits + hits, found.misses + misses, found.hit_bytes + hit_bytes)
                    )
        except OSError:
            pass

    def __repr__(self) -> str:
        return f"NodeCache({self.folder!r}, max_bytes={self.max_bytes}, policy={self.policy!r})"


def _add_run(runs: list[tuple[int, int]], lo: int, hi: int) -> None:
    if runs and runs[-1][1] == lo:
        runs[-1] = (runs[-1][0], hi)
    else:
        runs.append((lo, hi))


def _entry_path(key: EntryKey) -> str:
    name = key.entry_name()
    return f"{ENTRIES}/{name[:2]}/{name}"


_caches: dict[tuple[int, str, int, str], NodeCache] = {}
_caches_lock = threading.Lock()
_open: weakref.WeakSet[NodeCache] = weakref.WeakSet()


def node_cache(choice: CacheChoice) -> NodeCache | None:
    """This process's open :class:`NodeCache` for a task's cache choice, or ``None`` when off.

    ``None`` reads the ``cache`` setting here, ``False`` is off, a :class:`~.spec.Cache` names
    its folder (its unset bounds read from the settings here).

    Raises
    ------
    CacheFolderError
        For a folder refused (see :func:`~.folder.open_cache_folder`).
    ValueError
        When the folder records another ``max_bytes`` or ``policy`` (naming both).
    """
    if choice is False:
        return None
    spec = choice if isinstance(choice, Cache) else Cache.from_settings()
    if spec is None:
        return None
    folder, max_bytes, policy = spec.resolved()
    key = (os.getpid(), folder, max_bytes, policy)
    found = _caches.get(key)
    if found is None:
        with _caches_lock:
            found = _caches.get(key)
            if found is None:
                found = _caches[key] = NodeCache(folder, max_bytes, policy)
    return found


def flush_open(folder: str) -> None:
    """Settle this process's caches of ``folder`` before it is looked after: hit figures to its ledger, files closed.

    The extent files they keep open are closed, so entries removed next (``clear``, ``prune``)
    are not read on through descriptors opened before.
    """
    for cache in list(_open):
        if cache.folder == os.path.normpath(folder):
            cache.flush()
            cache.forget_open()
