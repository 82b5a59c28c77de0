"""``bench_remote.py --case cache``: the node cache against the same server, its goals as same-run ratios.

Run by :mod:`bench_remote` after its data is uploaded (the R1 volumes and the R3 small objects):

* **bytes**: a cold epoch with the cache on against the same reads with it off (R1's ROI stack and
  R3's objects), bytes at the counting proxy, hedging off in both. Goal: <= 1.05x.
* **hit rate**: a ``Loader`` with ``shuffle=True`` (a seeded whole-list shuffle) over the small
  objects, a cache of half their bytes, two epochs: epoch 2's bytes served from the cache against
  the optimum (bytes held / bytes of the epoch), for ``pin`` and ``lru``. Goals: pin >= 0.98x the
  optimum and >= 3x lru. Then ``shuffle="shard"`` on 4 "nodes" (a cache folder each, its share
  fitting): GETs of epoch 2 at the proxy. Goal: 0.
* **sharing**: 8 threads of one process, and a ``LocalCluster`` of 2 worker processes (the cache
  named by ``NPYDASK_CACHE`` in their environment), reading the same objects at once: GETs at the
  proxy against the distinct extents. Goal: equal.
* **speed**: epoch 2 (from the cache) of R1's ROI stack and of R3's objects against the same reads
  from the local ``.npy`` files. Goal: <= 1.3x. Over the emulated link (``--link-mbit``), epoch 1
  against epoch 2. Goal: >= 10x at 1,000 Mbit/s.
* **correctness**, with real processes: an object replaced after opening, a byte flipped every
  4 KiB of every file in the folder, 10 SIGKILLs of 2 processes filling the cache, a restart over
  what they left, a full file system (a 4 MiB tmpfs, where root can mount one), folders refused
  (group/world-writable, another owner, a symlink). Every read is compared with numpy's after it
  returns. Goal: 0 wrong bytes, nothing refused that should pass, the folders refused.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import npydask

GOAL_BYTES = 1.05
GOAL_PIN_OPTIMUM = 0.98
GOAL_PIN_LRU = 3.0
GOAL_SPEED_LOCAL = 1.3
GOAL_LINK = 10.0
KILLS = 10

_FILL = r"""
import json, sys, numpy as np, npydask
url, folder, n, opts = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
ds = npydask.open_dataset(url, storage_options=opts, cache=npydask.Cache(folder))
print("opened", flush=True)
order = np.random.default_rng(int(sys.argv[5])).permutation(len(ds.files))[:n]
for part in np.array_split(order, max(1, n // 64)):  # (64 objects a read: many points to be killed at)
    ds[part.tolist()].stack().compute(scheduler="sync")
print("done", flush=True)
"""


@contextlib.contextmanager
def hedging_off() -> Iterator[None]:
    """``NPYDASK_REMOTE_HEDGE=off`` for the block (a hedge would add a request to the counts)."""
    old = os.environ.get("NPYDASK_REMOTE_HEDGE")
    os.environ["NPYDASK_REMOTE_HEDGE"] = "off"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("NPYDASK_REMOTE_HEDGE", None)
        else:
            os.environ["NPYDASK_REMOTE_HEDGE"] = old


class CacheCase:
    """The cache goals against one :class:`bench_remote.Bench`'s server, proxy and data."""

    def __init__(self, bench: Any, clear: Callable[[], None]) -> None:
        self.b = bench
        self.clear = clear
        self.root = tempfile.mkdtemp(prefix="npydask-bench-cache-")
        self.rows: list[list[Any]] = []
        self.goals: list[dict[str, Any]] = []
        self.wrong = 0
        self.made = 0
        self.roi = {"roi_start": bench.size.roi_start, "roi_shape": bench.size.roi_shape}

    def folder(self, name: str) -> str:
        """A fresh cache folder (never one removed and named again: this process keeps caches it opened open)."""
        self.made += 1
        return os.path.join(self.root, f"{name}-{self.made}")

    def goal(self, text: str, value: float | None, limit: float, *, at_least: bool = False, unit: str = "x") -> None:
        ok = None if value is None else (value >= limit if at_least else value <= limit)
        self.goals.append(
            {
                "goal": text,
                "measured": "n/a" if value is None else f"{value:.3g}{unit}",
                "target": f"{'>=' if at_least else '<='} {limit:g}{unit}",
                "verdict": "n/a" if ok is None else ("PASS" if ok else "FAIL"),
                "value": value,
                "limit": limit,
                "pass": ok,
            }
        )
        print(f"  cache {text:70s} {self.goals[-1]['measured']:>10s}  {self.goals[-1]['verdict']}", flush=True)

    def check(self, got: Any, expected: np.ndarray, what: str) -> None:
        got = np.asarray(got)
        if got.shape != expected.shape or not np.array_equal(got, expected):
            self.wrong += 1
            print(f"  cache WRONG DATA: {what}", flush=True)

    # -- the expected arrays ------------------------------------------------------------------------

    def roi_expected(self) -> np.ndarray:
        start, shape = self.b.size.roi_start, self.b.size.roi_shape
        box = tuple(slice(s, s + n) for s, n in zip(start, shape))
        return np.stack([np.load(p, mmap_mode="r")[box] for p in self.b.volumes])

    def small_expected(self) -> np.ndarray:
        return np.stack([np.load(p) for p in self.b.small])

    def roi_stack(self, options: dict[str, Any], cache: Any) -> np.ndarray:
        return npydask.open_dataset(self.b.vprefix, storage_options=options, cache=cache, **self.roi).stack().compute()

    def small_stack(self, options: dict[str, Any], cache: Any) -> np.ndarray:
        return npydask.open_dataset(self.b.sprefix, storage_options=options, cache=cache).stack().compute()

    def timed(self, fn: Callable[[], Any]) -> float:
        """The median seconds of ``--repeat`` runs (npydask's per-process caches cleared before each)."""
        import _common

        times, _ = _common.measure(fn, max(3, self.b.args.repeat), setup=self.clear)
        return _common.median(times)

    def counted(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        self.clear()
        self.b.proxy.reset()
        value = fn()
        return value, self.b.proxy.reset()

    # -- the groups ---------------------------------------------------------------------------------

    def run(self) -> None:
        with hedging_off():
            self.bytes_cold()
            self.hit_rate()
            self.sharing()
            self.speed()
            self.correctness()
        shutil.rmtree(self.root, ignore_errors=True)

    def bytes_cold(self) -> None:
        proxied = self.b.proxied
        for name, fn, expected in (
            ("R1 ROI stack", self.roi_stack, self.roi_expected()),
            ("R3 small objects", self.small_stack, self.small_expected()),
        ):
            off_value, off = self.counted(lambda fn=fn: fn(proxied, False))
            folder = self.folder("cold")
            on_value, on = self.counted(lambda fn=fn, folder=folder: fn(proxied, npydask.Cache(folder)))
            self.check(off_value, expected, f"{name}, cache off")
            self.check(on_value, expected, f"{name}, cold cache")
            ratio = on.downstream / off.downstream if off.downstream else None
            self.rows.append([f"{name}: cold epoch bytes, cache on / off", on.downstream, off.downstream, ratio])
            self.goal(f"bytes of a cold epoch, cache on / off ({name})", ratio, GOAL_BYTES)

    def _epochs(self, loader: Any, epochs: int) -> list[tuple[Any, Any]]:
        out = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            self.b.proxy.reset()
            with npydask.io_stats() as s:
                for _ in loader:
                    pass
            out.append((s, self.b.proxy.reset()))
        return out

    def hit_rate(self) -> None:
        objects = sum(os.path.getsize(p) for p in self.b.small)
        shares: dict[str, float] = {}
        optimum = None
        for policy in ("pin", "lru"):
            cache = npydask.Cache(self.folder(f"hit-{policy}"), max_bytes=objects // 2, policy=policy)
            self.clear()
            ds = npydask.open_dataset(self.b.sprefix, storage_options=self.b.proxied, cache=cache)
            loader = npydask.Loader(ds, batch_size=64, shuffle=True, seed=7)
            (_, _), (second, _) = self._epochs(loader, 2)
            payload = second.cache_hit_bytes + second.bytes_read
            shares[policy] = second.cache_hit_bytes / payload if payload else 0.0
            if policy == "pin":  # (the most a cache of this size serves: what pin holds, over the epoch's bytes)
                optimum = cache.info().bytes / payload if payload else None
            self.rows.append(
                [
                    f"hit rate, seeded whole-list shuffle, {policy}: epoch 2 share from the cache",
                    second.cache_hit_bytes,
                    payload,
                    shares[policy],
                ]
            )
        pin, lru = shares["pin"], shares["lru"]
        self.goal(
            "hit rate: pin's epoch-2 share / the optimum (bytes held / epoch)",
            pin / optimum if optimum else None,
            GOAL_PIN_OPTIMUM,
            at_least=True,
        )
        self.goal(
            "hit rate: pin's share / lru's share", pin / lru if lru else float("inf"), GOAL_PIN_LRU, at_least=True
        )
        gets = 0
        for node in range(4):
            self.clear()
            cache = npydask.Cache(self.folder(f"shard-{node}"), max_bytes=objects, policy="pin")
            ds = npydask.open_dataset(self.b.sprefix, storage_options=self.b.proxied, cache=cache)
            loader = npydask.Loader(ds, batch_size=16, shuffle="shard", seed=7, num_shards=4, shard_id=node)
            (_, _), (_, counts) = self._epochs(loader, 2)
            gets += counts.count("GET")
        self.rows.append(['shuffle="shard", 4 nodes: GETs of epoch 2', gets, "", ""])
        self.goal('shuffle="shard", each share fitting: GETs in epoch 2', gets, 0, unit="")

    def sharing(self) -> None:
        ds_kw = {"storage_options": self.b.proxied}
        n = len(self.b.small)
        expected = self.small_expected()
        folder = self.folder("share-threads")
        self.clear()
        ds = npydask.open_dataset(self.b.sprefix, cache=npydask.Cache(folder), **ds_kw)
        self.b.proxy.reset()

        def one(seed: int) -> None:
            order = np.random.default_rng(seed).permutation(n)
            for part in np.array_split(order, max(1, n // 64)):  # (64 objects a read, each thread its order)
                got = ds[part.tolist()].stack().compute(scheduler="sync")
                self.check(got, expected[part], "8 threads sharing")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(8)))
        gets = self.b.proxy.reset().count("GET")
        self.rows.append(["8 threads, the same objects: GETs / distinct extents", gets, n, gets / n])
        self.goal("sharing, 8 threads of one process: GETs / distinct extents", gets / n, 1.0)
        self.goal("sharing, 2 worker processes: GETs / distinct extents", self._cluster(expected), 1.0)

    def _cluster(self, expected: np.ndarray) -> float | None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            return None
        folder = self.folder("share-cluster")
        os.environ["NPYDASK_CACHE"] = folder
        try:
            with (
                LocalCluster(n_workers=2, threads_per_worker=4, processes=True, dashboard_address=None) as cluster,
                Client(cluster) as client,
            ):
                self.clear()
                ds = npydask.open_dataset(self.b.sprefix, storage_options=self.b.proxied)
                self.b.proxy.reset()
                workers = list(client.scheduler_info()["workers"])
                n = len(self.b.small)
                futures = [
                    client.submit(_read_all, ds, seed, workers=[w], pure=False) for seed, w in enumerate(workers)
                ]
                for got in client.gather(futures):
                    self.check(got, expected, "2 workers sharing")
                gets = self.b.proxy.reset().count("GET")
        finally:
            os.environ.pop("NPYDASK_CACHE", None)
        self.rows.append(["LocalCluster of 2 processes: GETs / distinct extents", gets, n, gets / n])
        return gets / n

    def speed(self) -> None:
        """Epoch 2 of datasets opened beforehand (an epoch reads; opening asks the store what is there)."""
        local_v = os.path.dirname(self.b.volumes[0])
        local_s = os.path.dirname(self.b.small[0])
        for name, prefix, local, kw in (
            ("R1 ROI stack", self.b.vprefix, local_v, self.roi),
            ("R3 small objects", self.b.sprefix, local_s, {}),
        ):
            cache = npydask.Cache(self.folder("speed"))
            remote = npydask.open_dataset(prefix, storage_options=self.b.direct, cache=cache, **kw)
            here = npydask.open_dataset(local, **kw)
            first = remote.stack().compute()  # (epoch 1 fills the cache)
            self.check(first, here.stack().compute(), f"{name}: epoch 1")
            warm = self.timed(lambda r=remote: r.stack().compute())
            ref = self.timed(lambda h=here: h.stack().compute())
            ratio = warm / ref if ref else None
            self.rows.append([f"{name}: epoch 2 from the cache / local .npy (s)", warm, ref, ratio])
            self.goal(f"speed: {name} epoch 2 from the cache / local .npy", ratio, GOAL_SPEED_LOCAL)
        self._link()

    def _link(self) -> None:
        mbit = self.b.args.link_mbit
        if not mbit:
            return
        import _link

        port = int(self.b.server.endpoint.rsplit(":", 1)[1])
        why = _link.cannot_shape()
        with contextlib.ExitStack() as stack:
            if why is None:
                stack.enter_context(_link.shaped_port(port, mbit))
                options = self.b.direct
            else:
                from npydask.testing.counting_proxy import CountingProxy

                proxy = stack.enter_context(CountingProxy(self.b.server.endpoint, rate=mbit * 1e6 / 8))
                options = {**self.b.direct, "endpoint": proxy.endpoint}
            cache = npydask.Cache(self.folder("link"))
            self.clear()
            ds = npydask.open_dataset(self.b.vprefix, storage_options=options, cache=cache, **self.roi)
            t0 = time.perf_counter()
            first = ds.stack().compute()
            t1 = time.perf_counter()
            self.clear()
            second = ds.stack().compute()
            t2 = time.perf_counter()
        expected = self.roi_expected()
        self.check(first, expected, "link epoch 1")
        self.check(second, expected, "link epoch 2")
        ratio = (t1 - t0) / (t2 - t1)
        self.rows.append([f"R1 over {mbit:g} Mbit/s: epoch 1 / epoch 2 (s)", t1 - t0, t2 - t1, ratio])
        self.goal(f"link {mbit:g} Mbit/s: epoch 1 / epoch 2 (R1 ROI stack)", ratio, GOAL_LINK, at_least=True)

    # -- correctness --------------------------------------------------------------------------------

    def correctness(self) -> None:
        self._replaced()
        self._flipped()
        self._killed()
        self._full()
        refused = self._refused()
        self.rows.append(["correctness: wrong reads over every scenario", self.wrong, "", ""])
        self.goal("correctness: wrong bytes served (replaced, flipped, killed, full disk)", self.wrong, 0, unit="")
        self.goal("correctness: bad folders refused (of 3)", refused, 3, at_least=True, unit="")

    def _replaced(self) -> None:
        import obstore

        path = self.b.small[0]
        url = self.b.server.url(_key(path))
        original = np.load(path)
        cache = npydask.Cache(self.folder("replaced"))
        x = npydask.from_npy(url, storage_options=self.b.direct, cache=cache)
        self.check(x.compute(), original, "replaced: the first read")
        store = self.b.store
        data = open(path, "rb").read()
        replacement = bytearray(data)
        replacement[-1] ^= 0xFF
        obstore.put(store, _key(path), bytes(replacement))
        try:
            self.clear()
            self.check(x.compute(), original, "replaced: every byte cached, the opened version")
            y = npydask.from_npy(url, storage_options=self.b.direct, cache=cache)
            new = np.load(io.BytesIO(bytes(replacement)))
            self.check(y.compute(), new, "replaced: opened again, the new version")
        finally:
            obstore.put(store, _key(path), data)

    def _flipped(self) -> None:
        folder = self.folder("flipped")
        expected = self.small_expected()
        self.small_stack(self.b.direct, npydask.Cache(folder))
        for dirpath, _, names in os.walk(folder):
            for name in names:
                full = os.path.join(dirpath, name)
                with open(full, "r+b") as f:
                    raw = bytearray(f.read())
                    for k in range(0, len(raw), 4096):
                        raw[k] ^= 0xFF
                    f.seek(0)
                    f.write(raw)
        self.clear()
        self.check(self.small_stack(self.b.direct, npydask.Cache(folder)), expected, "flipped: the first read")
        self.clear()
        self.b.proxy.reset()
        self.check(self.small_stack(self.b.proxied, npydask.Cache(folder)), expected, "flipped: repaired")

    def _killed(self) -> None:
        folder = self.folder("killed")
        n = len(self.b.small)
        expected = self.small_expected()
        rng = random.Random(5)
        env = {**os.environ, "NPYDASK_REMOTE_HEDGE": "off"}
        kills = getattr(self.b.args, "kills", KILLS)
        for k in range(kills):
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _FILL,
                        self.b.sprefix,
                        folder,
                        str(n),
                        json.dumps(self.b.direct),
                        str(k * 2 + j),
                    ],
                    stdout=subprocess.PIPE,
                    env=env,
                )
                for j in range(2)
            ]
            victim = procs[0]
            assert victim.stdout is not None
            victim.stdout.readline()  # ("opened")
            time.sleep(rng.uniform(0.0, 0.5))
            victim.send_signal(signal.SIGKILL)
            for p in procs:
                p.wait(timeout=600)
            if procs[1].returncode != 0:
                self.wrong += 1
                print(f"  cache the surviving filler failed ({procs[1].returncode})", flush=True)
        self.clear()
        self.check(self.small_stack(self.b.direct, npydask.Cache(folder)), expected, f"killed: after {kills} kills")
        info = npydask.Cache(folder).info()
        self.rows.append([f"after {kills} SIGKILLs: entries / objects", info.entries, n, info.entries / n])

    def _full(self) -> None:
        if os.geteuid() != 0 or shutil.which("mount") is None:
            self.rows.append(["full file system", "skipped: needs root to mount a tmpfs", "", ""])
            return
        mount = tempfile.mkdtemp(prefix="npydask-bench-tmpfs-")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount], capture_output=True)
        if done.returncode != 0:
            self.rows.append(["full file system", f"skipped: mount failed ({done.stderr.decode().strip()})", "", ""])
            os.rmdir(mount)
            return
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cache = npydask.Cache(os.path.join(mount, "cache"), max_bytes="1GiB")
                self.clear()
                self.check(self.roi_stack(self.b.direct, cache), self.roi_expected(), "full file system")
            said = [w for w in caught if "stopped admitting" in str(w.message)]
            self.rows.append(["full file system: warnings saying why", len(said), "", ""])
        finally:
            subprocess.run(["umount", "-l", mount], capture_output=True)  # (lazily: this process's cache holds it)
            with contextlib.suppress(OSError):
                os.rmdir(mount)

    def _refused(self) -> int:
        refused = 0
        for how in ("mode", "owner", "symlink"):
            path = self.folder(f"bad-{how}")
            if how == "symlink":
                real = self.folder("bad-real")
                os.mkdir(real, 0o700)
                os.symlink(real, path)
            else:
                os.mkdir(path, 0o700)
                if how == "mode":
                    os.chmod(path, 0o777)
                elif os.geteuid() == 0:
                    os.chown(path, 12345, 12345)
                else:
                    refused += 1  # (only root can give a folder away; the mode case stands in)
                    continue
            try:
                self.small_stack(self.b.direct, npydask.Cache(path))
            except OSError:
                refused += 1
        return refused

    # -- the table ----------------------------------------------------------------------------------

    def report(self) -> str:
        import _common

        rows = [[r[0], *(_fmt(v) for v in r[1:])] for r in self.rows]
        return _common.table(rows, ["cache: measurement", "value", "against", "ratio"])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _key(path: str) -> str:
    from bench_remote import key_of

    return str(key_of(path))


def _read_all(ds: Any, seed: int) -> np.ndarray:
    """Every object of ``ds`` read 64 at a time in a seeded order on a worker; returned in file order."""
    n = len(ds.files)
    out: list[Any] = [None] * n
    order = np.random.default_rng(seed).permutation(n)
    for part in np.array_split(order, max(1, n // 64)):  # (64 objects a read)
        for k, got in zip(part.tolist(), ds[part.tolist()].stack().compute(scheduler="sync")):
            out[k] = got
    return np.stack(out)


def stacked(paths: Sequence[str]) -> np.ndarray:
    """numpy's stack of the files (the oracle)."""
    return np.stack([np.load(p) for p in paths])
