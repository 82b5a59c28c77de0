"""The node cache at work in one process: reads, single flight across threads, damage, bounds, administration."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from npydask import Cache
from npydask.cache.admin import cache_clear, cache_info, cache_prune
from npydask.cache.keys import EntryKey
from npydask.cache.ledger import walk_extents
from npydask.cache.node import NodeCache, node_cache
from npydask.errors import NpyDaskWarning

SIZE = 1 << 20


class Obj:
    """A fake object: deterministic bytes, a count of fetches per run."""

    def __init__(self, size: int = SIZE, seed: int = 0, etag: str = '"v1"', key: str = "data/x.npy") -> None:
        self.data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
        self.key = EntryKey.of("s3://bucket", key, "", size, etag)
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.delay = 0.0
        self.exact = True

    def fetch(self, lo: int, hi: int) -> tuple[bytes, bool]:
        with self.lock:
            self.calls.append((lo, hi))
        if self.delay:
            time.sleep(self.delay)
        return self.data[lo:hi], self.exact

    def read(self, cache: NodeCache, lo: int, hi: int):
        out = bytearray(hi - lo)
        got = cache.read(self.key, lo, hi, memoryview(out), self.fetch, label="s3://bucket/" + self.key.key, wait_s=5)
        assert bytes(out) == self.data[lo:hi]  # (checked after the read)
        return got


@pytest.fixture
def folder(tmp_path):
    return str(tmp_path / "cache")


def test_a_warm_read_fetches_nothing_and_a_partial_one_only_the_missing_runs(folder):
    cache = NodeCache(folder, 1 << 30, "pin")
    obj = Obj()
    first = obj.read(cache, 1000, 5000)
    assert (first.fetches, first.fetched_bytes, first.hit_bytes) == (1, 4000, 0)
    again = obj.read(cache, 1000, 5000)
    assert (again.fetches, again.hit_bytes) == (0, 4000)
    inner = obj.read(cache, 2000, 3000)  # (a part of an extent)
    assert inner.fetches == 0
    wider = obj.read(cache, 0, 9000)  # (held in the middle: only the two ends fetched)
    assert obj.calls[-2:] == [(0, 1000), (5000, 9000)]
    assert (wider.hit_bytes, wider.fetched_bytes, wider.fetches) == (4000, 5000, 2)
    assert obj.read(cache, 0, 9000).fetches == 0  # (served from three extents)


def test_a_response_not_exact_is_returned_but_not_admitted(folder):
    cache = NodeCache(folder, 1 << 30, "pin")
    obj = Obj()
    obj.exact = False
    obj.read(cache, 0, 100)
    assert obj.read(cache, 0, 100).fetches == 1
    assert cache_info(folder).extents == 0


def test_eight_threads_fetch_each_run_once(folder):
    cache = NodeCache(folder, 1 << 30, "pin")
    obj = Obj()
    obj.delay = 0.05
    runs = [(k * 10_000, k * 10_000 + 7_000) for k in range(6)]
    errors = []

    def work(seed):
        try:
            for lo, hi in np.random.default_rng(seed).permutation(runs):
                obj.read(cache, int(lo), int(hi))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(obj.calls) == sorted(runs)


def test_a_waiter_gives_up_after_its_wait_and_fetches_itself(folder):
    from npydask.cache.locks import acquire_range, lock_span

    cache = NodeCache(folder, 1 << 30, "pin")
    obj = Obj()
    held, _ = acquire_range(cache.dir_fd, "lock", *lock_span(obj.key.entry_name(), 0, 100), 0)
    assert held is not None
    try:
        out = bytearray(100)
        t0 = time.monotonic()
        got = cache.read(obj.key, 0, 100, memoryview(out), obj.fetch, label="x", wait_s=0.3)
        assert 0.25 < time.monotonic() - t0 < 3
        assert got.fetches == 1 and bytes(out) == obj.data[:100]
    finally:
        held.release()


def test_damaged_files_are_misses_and_repaired(folder):
    cache = NodeCache(folder, 1 << 30, "pin")
    obj = Obj()
    obj.read(cache, 0, 300_000)
    for path, _, _ in walk_extents(cache.dir_fd):
        full = os.path.join(folder, path)
        raw = bytearray(open(full, "rb").read())
        for k in range(0, len(raw), 4096):
            raw[k] ^= 0xFF
        open(full, "wb").write(raw)
    assert obj.read(cache, 0, 300_000).fetches == 1  # (the damaged file: a miss, removed)
    assert obj.read(cache, 0, 300_000).fetches == 0  # (repaired)
    assert cache_info(folder).bytes == 300_000


def test_other_etags_are_other_entries(folder):
    cache = NodeCache(folder, 1 << 30, "pin")
    old, new = Obj(seed=1, etag='"v1"'), Obj(seed=2, etag='"v2"')
    old.read(cache, 0, 1000)
    assert new.read(cache, 0, 1000).fetches == 1  # (never the old version's bytes)
    assert old.read(cache, 0, 1000).fetches == 0  # (left alone)


def test_pin_admits_until_full_and_keeps(folder):
    cache = NodeCache(folder, 50_000, "pin")
    objs = [Obj(size=10_000, seed=k, key=f"d/{k}.npy") for k in range(10)]
    for o in objs:
        o.read(cache, 0, 10_000)
    assert cache_info(folder).bytes == 50_000
    hits = [o.read(cache, 0, 10_000).fetches == 0 for o in objs]
    assert hits == [True] * 5 + [False] * 5


def test_pin_drops_superseded_versions_first(folder):
    cache = NodeCache(folder, 20_000, "pin")
    old = Obj(size=10_000, seed=1, etag='"v1"')
    other = Obj(size=10_000, seed=3, key="d/other.npy")
    old.read(cache, 0, 10_000)
    other.read(cache, 0, 10_000)
    new = Obj(size=10_000, seed=2, etag='"v2"')
    new.read(cache, 0, 10_000)  # (full; the object's older version goes)
    assert new.read(cache, 0, 10_000).fetches == 0
    assert other.read(cache, 0, 10_000).fetches == 0
    assert old.read(cache, 0, 10_000).fetches == 1


def test_lru_evicts_the_least_recently_used(folder):
    cache = NodeCache(folder, 40_000, "lru")
    objs = [Obj(size=10_000, seed=k, key=f"d/{k}.npy") for k in range(5)]
    for o in objs[:4]:
        o.read(cache, 0, 10_000)
        time.sleep(0.01)
    objs[0].read(cache, 0, 10_000)  # (used again: now the most recent)
    time.sleep(0.01)
    objs[4].read(cache, 0, 10_000)
    assert cache_info(folder).bytes <= 40_000
    assert objs[0].read(cache, 0, 10_000).fetches == 0
    assert objs[1].read(cache, 0, 10_000).fetches == 1


def test_bounds_are_recorded_and_checked(folder):
    NodeCache(folder, 1000, "pin")
    with pytest.raises(ValueError, match=r"max_bytes=1000 and policy='pin'.*max_bytes=2000"):
        NodeCache(folder, 2000, "pin")
    cache_clear(folder)
    NodeCache(folder, 2000, "lru")  # (clear resets them)


def test_an_unwritable_cache_never_fails_a_read(folder, monkeypatch):
    cache = NodeCache(folder, 1 << 30, "pin")
    obj = Obj()
    monkeypatch.setattr("npydask.cache.node.write_extent", _full_disk)
    with pytest.warns(NpyDaskWarning, match="stopped admitting bytes: writing to it failed"):
        obj.read(cache, 0, 100)
    obj.read(cache, 100, 200)  # (no second warning: warnings are errors here)
    assert cache_info(folder).bytes == 0


def _full_disk(*args, **kwargs):
    raise OSError(28, os.strerror(28))


def test_low_space_stops_admission_with_one_warning(folder, monkeypatch):
    cache = NodeCache(folder, 1 << 30, "pin")
    obj = Obj()
    real = os.statvfs

    class Low:
        def __init__(self, st):
            self.f_blocks, self.f_bavail, self.f_frsize = 1000, 10, st.f_frsize

    monkeypatch.setattr("npydask.cache.node.os.statvfs", lambda p: Low(real(p)))
    with pytest.warns(NpyDaskWarning, match="less than 5%"):
        obj.read(cache, 0, 100)
    assert obj.read(cache, 0, 100).fetches == 1


def test_info_prune_and_clear(folder):
    cache = NodeCache(folder, 1 << 30, "pin")
    a, b = Obj(size=1000, key="ds1/a.npy"), Obj(size=2000, seed=1, key="ds2/b.npy")
    a.read(cache, 0, 1000)
    a.read(cache, 0, 1000)
    b.read(cache, 0, 500)
    info = cache_info(folder)
    assert (info.entries, info.extents, info.bytes, info.max_bytes, info.policy) == (2, 2, 1500, 1 << 30, "pin")
    assert (info.hits, info.misses, info.hit_bytes) == (1, 2, 1000)
    assert info.by_prefix == {"s3://bucket/ds1": (1, 1000), "s3://bucket/ds2": (1, 500)}
    assert cache_prune(folder, 3600) == (0, 0)
    old = time.time() - 10 * 86400
    for path, _, _ in walk_extents(cache.dir_fd):
        os.utime(os.path.join(folder, path), (old, old))
        os.utime(os.path.join(folder, os.path.dirname(path)), (old, old))
    assert cache_prune(folder, 86400) == (2, 1500)
    a.read(cache, 0, 1000)
    assert cache_clear(folder) == 1000
    assert cache_info(folder).bytes == 0


def test_node_cache_follows_the_choice(folder):
    import npydask

    assert node_cache(False) is None
    with npydask.config.set(cache=""):
        assert node_cache(None) is None
    with npydask.config.set(cache=folder, cache_max_bytes="1MiB", cache_policy="lru"):
        found = node_cache(None)
        assert found is not None and (found.folder, found.max_bytes, found.policy) == (folder, 1 << 20, "lru")
        assert node_cache(Cache(folder, max_bytes=1 << 20, policy="lru")) is found
