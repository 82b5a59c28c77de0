"""The node cache with real processes: one fetch per extent, SIGKILLs, damage, restarts, a full disk.

The "object" is a local ``.npy`` file; ``fetch`` reads it (``(bytes, True)``) and logs each call,
so the tests count fetches across threads and processes. Processes are forked, on request, by
``node_worker.py``, a subprocess started once for the module that has imported the cache (a warm
start: a fresh interpreter would spend a second importing). Every read is checked after it
returned, against the file's bytes, which are numpy's (checked once).

The folder's own refusals (mode, owner, symlink, network file systems) are tested on
``open_cache_folder`` in ``test_folder.py``; here they are checked through ``node_cache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from npydask.cache.admin import cache_info
from npydask.cache.keys import EntryKey
from npydask.cache.node import node_cache
from npydask.cache.spec import Cache
from npydask.errors import CacheFolderError, NpyDaskWarning

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "node_worker.py"
STORE = "s3://bucket"
GIB = 1 << 30


@pytest.fixture(scope="module")
def worker():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env=env, text=True
    )
    assert proc.stdout is not None and proc.stdin is not None
    ready = proc.stdout.readline().split()
    assert ready[:1] == ["ready"] and ready[1].startswith(str(ROOT)), ready
    yield Forker(proc)
    proc.stdin.close()
    proc.wait(timeout=10)


class Forker:
    """Starts reader processes through the worker, waits for them, kills them."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lock = threading.Lock()

    def start(self, **job) -> int:
        with self.lock:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            return int(self.proc.stdout.readline())

    @staticmethod
    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def wait(self, pid: int, out: str, timeout: float = 20.0) -> dict:
        """The result of the process ``pid``, or a failure when it died without one or ran past ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(out):
                with open(out, encoding="utf-8") as f:
                    return json.load(f)
            if not self.alive(pid):
                time.sleep(0.05)  # (the result is published just before the process ends)
                if os.path.exists(out):
                    continue
                pytest.fail(f"the reader process {pid} died without a result")
            time.sleep(0.01)
        pytest.fail(f"the reader process {pid} did not finish within {timeout} s")

    def kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it had finished
            return
        while self.alive(pid):
            time.sleep(0.005)


class Obj:
    """A local .npy file standing for a remote object version, with numpy's bytes as the oracle."""

    def __init__(self, path: Path, seed: int, n: int = 1 << 18, etag: str = '"v1"') -> None:
        arr = np.random.default_rng(seed).integers(0, 2**31, size=n, dtype="<i4")
        np.save(path, arr)
        self.path = str(path)
        self.bytes = path.read_bytes()
        assert self.bytes[len(self.bytes) - arr.nbytes :] == arr.tobytes()  # the oracle is numpy's bytes
        self.size = len(self.bytes)
        self.etag = etag
        self.key = EntryKey.of(STORE, "data/x.npy", "", self.size, etag)

    def digest(self, lo: int, hi: int) -> str:
        return hashlib.sha256(self.bytes[lo:hi]).hexdigest()

    def job(self, tmp: Path, name: str, folder: str, extents, **kw) -> dict:
        job = dict(
            folder=folder,
            max_bytes=kw.pop("max_bytes", GIB),
            policy=kw.pop("policy", "pin"),
            object=self.path,
            store=STORE,
            key="data/x.npy",
            etag=self.etag,
            extents=[list(e) for e in extents],
            out=str(tmp / f"{name}.json"),
            log=str(tmp / "fetches.log"),
        )
        job.update(kw)
        return job


def check(result: dict, obj: Obj, expect: int | None = None) -> list[list]:
    """Every read of a process equals the oracle (checked after it returned); no error."""
    assert not result["errors"], result["errors"][0]
    for lo, hi, digest, *_ in result["reads"]:
        assert digest == obj.digest(lo, hi), f"[{lo}, {hi}) differs from the object's bytes"
    if expect is not None:
        assert len(result["reads"]) == expect
    return result["reads"]


def fetch_lines(tmp: Path) -> list[tuple[str, int, int, int]]:
    path = tmp / "fetches.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        what, pid, lo, hi = line.split()
        out.append((what, int(pid), int(lo), int(hi)))
    return out


def extents(n: int, length: int, gap: int = 4096, start: int = 128) -> list[tuple[int, int]]:
    """``n`` disjoint, non-touching extents of ``length`` bytes."""
    return [(start + k * (length + gap), start + k * (length + gap) + length) for k in range(n)]


def read(cache, obj: Obj, lo: int, hi: int, calls: list | None = None):
    """A read in this process; returns (bytes, CacheRead), checked against the oracle."""

    def fetch(a, b):
        if calls is not None:
            calls.append((a, b))
        return obj.bytes[a:b], True

    out = bytearray(hi - lo)
    got = cache.read(obj.key, lo, hi, memoryview(out), fetch, label="s3://bucket/data/x.npy", wait_s=30.0)
    assert bytes(out) == obj.bytes[lo:hi], f"[{lo}, {hi}) differs from the object's bytes"
    return got


# ------------------------------------------------------------------------------------------------
# one fetch per extent per node


def test_single_flight_8_threads_then_2_processes(worker, tmp_path):
    obj = Obj(tmp_path / "x.npy", 1)
    folder = str(tmp_path / "cache")
    wanted = extents(12, 20_000)
    job = obj.job(tmp_path, "threads", folder, wanted, threads=8, shuffle=True, sleep=0.03)
    reads = check(worker.wait(worker.start(**job), job["out"]), obj, expect=8 * 12)
    starts = [line for line in fetch_lines(tmp_path) if line[0] == "start"]
    assert sorted((lo, hi) for _, _, lo, hi in starts) == wanted  # one fetch per extent
    assert sum(r[5] for r in reads) == len(wanted)

    before = len(fetch_lines(tmp_path))
    wanted = extents(12, 20_000, start=400_000)
    jobs = [obj.job(tmp_path, f"p{k}", folder, wanted, threads=2, shuffle=True, sleep=0.03) for k in range(2)]
    pids = [worker.start(**j) for j in jobs]
    for pid, j in zip(pids, jobs):
        check(worker.wait(pid, j["out"]), obj, expect=2 * 12)
    starts = [line for line in fetch_lines(tmp_path)[before:] if line[0] == "start"]
    assert sorted((lo, hi) for _, _, lo, hi in starts) == wanted


def test_a_reader_that_missed_just_before_a_publish_fetches_nothing(tmp_path, monkeypatch):
    """A thread looks in the cache while another fetches the run, and takes the lock only after the other let it go.

    (A thread descheduled between its look and the lock, or a process slower to get there: a delay
    before the lock stands in.) It must look again and be served, not fetch the run a second time.
    """
    import npydask.cache.node as node_module

    real = node_module.acquire_range

    def late_acquire(*args, **kwargs):
        if threading.current_thread().name == "late":
            time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(node_module, "acquire_range", late_acquire)
    obj = Obj(tmp_path / "x.npy", 8)
    cache = node_cache(Cache(str(tmp_path / "cache")))
    calls: list = []

    def slow_fetch(lo, hi):
        calls.append((lo, hi))
        time.sleep(0.1)
        return obj.bytes[lo:hi], True

    def one():
        out = bytearray(50_000)
        cache.read(obj.key, 0, 50_000, memoryview(out), slow_fetch, label="s3://bucket/data/x.npy", wait_s=30.0)
        assert bytes(out) == obj.bytes[:50_000]

    early = threading.Thread(target=one, name="early")
    early.start()
    time.sleep(0.05)
    late = threading.Thread(target=one, name="late")
    late.start()
    early.join()
    late.join()
    assert calls == [(0, 50_000)]


# ------------------------------------------------------------------------------------------------
# SIGKILLs during a fill


def test_ten_sigkills_during_a_fill_by_two_processes(worker, tmp_path):
    """Kill one of two processes filling the cache at a random point, ten times, restarting it each time.

    Even rounds kill the first process during one of its fetches (the other waits on that extent
    and must fetch it itself, not wait for ``wait_s``); odd rounds at a random time. A round whose
    process finished before the kill does not count.
    """
    obj = Obj(tmp_path / "x.npy", 2)
    folder = str(tmp_path / "cache")
    rng = random.Random(33)
    done: list[tuple[int, int]] = []
    took_over = kills = 0
    for rnd in range(30):
        if kills == 10:
            break
        wanted = extents(3, 16_000, start=128 + rnd * 60_000)
        a = obj.job(tmp_path, f"a{rnd}", folder, done + wanted, sleep=0.08)
        b = obj.job(tmp_path, f"b{rnd}", folder, done + wanted, sleep=0.08)
        before = len(fetch_lines(tmp_path))
        pa = worker.start(**a)
        pb = worker.start(**b)
        if rnd % 2 == 0:
            deadline = time.monotonic() + 10
            while not any(w == "start" and p == pa for w, p, *_ in fetch_lines(tmp_path)[before:]):
                assert time.monotonic() < deadline, "the first process never fetched"
                if os.path.exists(a["out"]):
                    break
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.07))
        else:
            time.sleep(rng.uniform(0.0, 0.2))
        worker.kill(pa)
        if os.path.exists(a["out"]):
            with open(a["out"], encoding="utf-8") as f:
                check(json.load(f), obj, expect=len(done) + 3)
        else:
            kills += 1
        t0 = time.monotonic()
        check(worker.wait(pb, b["out"], timeout=10.0), obj, expect=len(done) + 3)
        assert time.monotonic() - t0 < 10.0
        lines = fetch_lines(tmp_path)[before:]
        killed = {(lo, hi) for w, p, lo, hi in lines if p == pa and w == "start"} - {
            (lo, hi) for w, p, lo, hi in lines if p == pa and w == "end"
        }
        took_over += bool(killed & {(lo, hi) for w, p, lo, hi in lines if p == pb and w == "end"})
        # the killed one restarted: everything is read correctly
        again = obj.job(tmp_path, f"r{rnd}", folder, done + wanted)
        check(worker.wait(worker.start(**again), again["out"]), obj, expect=len(done) + 3)
        done += wanted
    assert kills == 10
    assert took_over >= 1, "no kill landed on a fetch another process waited for"
    # the cache is usable: a fresh process is served from it wholly
    before = len(fetch_lines(tmp_path))
    last = obj.job(tmp_path, "last", folder, done)
    reads = check(worker.wait(worker.start(**last), last["out"]), obj, expect=len(done))
    assert [r[5] for r in reads] == [0] * len(done)
    assert len(fetch_lines(tmp_path)) == before
    assert cache_info(folder).bytes == sum(hi - lo for lo, hi in done)


# ------------------------------------------------------------------------------------------------
# damage


def _files(folder: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs)


def test_a_byte_flipped_every_4_kib_of_every_file_is_a_miss_then_repaired(worker, tmp_path):
    obj = Obj(tmp_path / "x.npy", 3)
    folder = str(tmp_path / "cache")
    wanted = extents(6, 30_000)
    fill = obj.job(tmp_path, "fill", folder, wanted)
    check(worker.wait(worker.start(**fill), fill["out"]), obj, expect=6)
    flipped = 0
    for path in _files(folder):
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            for k in range(0, len(data), 4096):
                data[k] ^= 0x5A
                flipped += 1
            f.seek(0)
            f.write(data)
    assert flipped >= 6
    before = len(fetch_lines(tmp_path))
    after = obj.job(tmp_path, "after", folder, wanted)
    check(worker.wait(worker.start(**after), after["out"]), obj, expect=6)
    refetched = {(lo, hi) for w, _, lo, hi in fetch_lines(tmp_path)[before:] if w == "start"}
    assert refetched == set(wanted)  # every extent file was damaged: every one a miss
    again = obj.job(tmp_path, "again", folder, wanted)
    reads = check(worker.wait(worker.start(**again), again["out"]), obj, expect=6)
    assert [r[5] for r in reads] == [0] * 6  # repaired: hits
    assert cache_info(folder).bytes == sum(hi - lo for lo, hi in wanted)


def test_a_restart_over_a_half_written_cache(worker, tmp_path):
    """A process killed as it publishes leaves a temporary; the next process removes it and recounts."""
    obj = Obj(tmp_path / "x.npy", 4)
    folder = str(tmp_path / "cache")
    held = extents(4, 10_000)
    fill = obj.job(tmp_path, "fill", folder, held)
    check(worker.wait(worker.start(**fill), fill["out"]), obj, expect=4)
    listing = set(_files(folder))
    dying = obj.job(tmp_path, "dying", folder, extents(2, 50_000, start=200_000), die_on_rename=True)
    pid = worker.start(**dying)
    deadline = time.monotonic() + 20
    while worker.alive(pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not os.path.exists(dying["out"]), "the process was to die publishing"
    with open(dying["out"] + ".temp", encoding="utf-8") as f:
        temps = {os.path.realpath(f.read())}
    assert temps <= set(map(os.path.realpath, _files(folder))) - set(map(os.path.realpath, listing)), temps
    nxt = obj.job(tmp_path, "next", folder, held)
    reads = check(worker.wait(worker.start(**nxt), nxt["out"]), obj, expect=4)
    assert [r[5] for r in reads] == [0] * 4
    left = temps & set(map(os.path.realpath, _files(folder)))
    assert not left, f"temporaries of a dead process left: {sorted(left)}"
    assert cache_info(folder).bytes == sum(hi - lo for lo, hi in held)


# ------------------------------------------------------------------------------------------------
# a full file system


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_file_system_never_fails_a_read(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed: {done.stderr.decode(errors='replace').strip()}")
    try:
        obj = Obj(tmp_path / "x.npy", 5, n=1 << 20)  # 4 MiB, twice the file system
        cache = node_cache(Cache(str(mnt / "cache"), max_bytes=GIB))
        wanted = extents(40, 100_000, gap=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = [read(cache, obj, lo, hi) for lo, hi in wanted]
            second = [read(cache, obj, lo, hi) for lo, hi in wanted]
        ours = [w for w in caught if issubclass(w.category, NpyDaskWarning)]
        assert len(ours) == 1, [str(w.message) for w in caught]
        assert not [w for w in caught if not issubclass(w.category, NpyDaskWarning)]
        text = str(ours[0].message)
        assert str(mnt / "cache") in text or "space" in text or "full" in text, text
        assert sum(r.fetches for r in first) == len(wanted)
        assert 0 < sum(r.hit_bytes for r in second) < obj.size  # admitted until full, then kept
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ------------------------------------------------------------------------------------------------
# the folder


def _refuse(path: Path) -> None:
    with pytest.raises(CacheFolderError) as info:
        node_cache(Cache(str(path)))
    assert isinstance(info.value, OSError) and str(path) in str(info.value)


@pytest.mark.parametrize("mode", [0o707, 0o770, 0o702, 0o720])
def test_a_group_or_world_writable_folder_is_refused(tmp_path, mode):
    d = tmp_path / "c"
    d.mkdir()
    os.chmod(d, mode)
    _refuse(d)
    assert os.listdir(d) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_a_folder_of_another_user_is_refused(tmp_path):
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    os.chown(d, 12345, 12345)
    _refuse(d)
    assert os.listdir(d) == []


def test_a_symlinked_folder_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    _refuse(tmp_path / "link")
    assert os.listdir(real) == []


# ------------------------------------------------------------------------------------------------
# an object replaced


def test_entries_of_another_etag_never_serve_each_others_bytes(tmp_path):
    v1 = Obj(tmp_path / "v1.npy", 6, etag='"v1"')
    v2 = Obj(tmp_path / "v2.npy", 7, etag='"v2"')
    assert v1.size == v2.size and v1.key.entry_name() != v2.key.entry_name()
    cache = node_cache(Cache(str(tmp_path / "cache")))
    wanted = extents(4, 30_000)
    calls: list = []
    for lo, hi in wanted:
        read(cache, v1, lo, hi, calls)
    assert len(calls) == 4
    calls.clear()
    for lo, hi in wanted:
        read(cache, v2, lo, hi, calls)  # the replaced object: fetched, never v1's bytes
    assert sorted(calls) == wanted
    calls.clear()
    for obj in (v1, v2):
        for lo, hi in wanted:
            assert read(cache, obj, lo, hi, calls).fetches == 0  # both versions kept
    assert calls == []
