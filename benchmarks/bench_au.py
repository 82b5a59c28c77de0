"""Accelerator utilisation (AU), as MLPerf Storage measures it: training loops fed from SeaweedFS over a link.

The workload is MLPerf Storage's 3D U-Net (DLIO's ``unet3d``) at a sixteenth of
its size: stored ``.npz`` samples with members ``x`` (float32) and ``y``
(uint8) of ``(D, H, W)`` voxels, their sizes drawn (seeded) from DLIO's
N(146.6, 68.3) MB, scaled and clipped below, batch 4. The script starts its
own SeaweedFS S3 server, uploads the samples (untimed), and puts the server
behind an emulated 1 Gbit/s link (the kernel's shaper on the S3 port's
responses where root and ``tc`` allow, :mod:`_link`; else the counting proxy's
``rate=``) and a 20 ms round trip (the counting proxy's ``delay``, added to
every request). Every client reads through that proxy, which counts the bytes.

=====  =======  =========================  =========  ==========================
size   samples  size of a sample           H x W      patch (D, H, W)
=====  =======  =========================  =========  ==========================
tiny   8        DLIO's / 1024, >= 50 KB    24 x 24    (8, 16, 16)
small  48       DLIO's / 64, >= 250 KB     48 x 48    (16, 32, 32)
full   168      DLIO's / 16, >= 1 MB       96 x 96    (16, 64, 64)
=====  =======  =========================  =========  ==========================

An *emulated accelerator* is a process running a training loop: it gets a
batch, then "computes" for ``c`` seconds (``time.sleep(c)``), for 3 epochs.
The compute time per batch is set once from the data, so that one
accelerator's whole-sample reads need 20% of the link:
``c = mean batch bytes / (0.2 x 125 MB/s)``; by bandwidth at most 5
accelerators fit. N accelerators split the dataset as MLPerf does (each its
own loader with ``shard_id = k, num_shards = N``, the order shuffled per
epoch with one seed) and share ONE node cache folder. AU of one accelerator
is its compute time over the wall time from its first ``next()`` to the end
of its last step; a run's AU is the mean over its accelerators (as DLIO
reports it; the minimum is printed too). Per run: AU over the 3 epochs (the
MLPerf figure), **cold** (epoch 1: the node cache empty and SeaweedFS's
volume files dropped from the page cache, :func:`npydask.testing.drop_page_cache`)
and **warm** (epochs 2-3, after epoch 1 filled the cache).

Rows, all in the same run against the same server:

* ``whole``: npydask, whole samples: ``open_dataset(prefix, file_filter="*.npz",
  key=["x", "y"], cache=Cache(folder))`` and ``Loader(ds, 4, shuffle=True,
  shard_id=k, num_shards=N, prefetch=4)``: 4 batches read ahead (about 6 s of
  compute at full size), deep enough to feed a step at a fifth of the link.
* ``patches``: the same with ``sampler=Uniform(patch, per_file=1)``: one
  random box of each sample per epoch (both members), read by range.
* ``baseline``: the usual PyTorch way: ``DataLoader(num_workers=2,
  persistent_workers=True)`` over a ``Dataset`` that GETs whole objects with
  obstore and ``np.load``\\ s them, ``DistributedSampler(num_replicas=N,
  rank=k, shuffle=True)``; no node cache. (DLIO's own reader is not used: the
  ``dlio-benchmark`` release on the package index has no S3 reader; its
  ``S3Storage`` only names ``s3://`` URIs and its NPZ reader ``np.load``\\ s
  local paths with ``allow_pickle=True``.)

For each row, AU cold and warm at one accelerator, then MLPerf's figure: the
most accelerators whose run keeps AU >= 90% over the 3 epochs, and the most
whose warm epochs keep AU >= 98%, found by bisection over
``1..--max-accelerators`` (AU falls as accelerators are added). Every batch
is checked: each sample's ``y`` holds its file's number (mod 251) and its
shape is the file's (or the patch's). Requests are npydask's defaults
(hedging and concurrency as configured by the settings).

Goals (PASS/FAIL; the exit status is 1 only on wrong data): npydask's whole
samples sustain >= 4 accelerators at AU >= 90% (80% of the bandwidth bound)
and more than the baseline; warm, >= 5 at AU >= 98%. Where SeaweedFS's
``weed`` is missing or cannot run, the script says so, writes
``{"skipped": reason}`` to ``--json`` and exits 0.

Usage::

    python benchmarks/bench_au.py [--size tiny|small|full] [--max-accelerators N] [--rows whole,patches,baseline]
                                  [--link-via auto|tc|proxy] [--prefetch N] [--json out.json]
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import _link  # noqa: E402

MB = 1_000_000
LINK_MBIT = 1000.0
LINK_BYTES = LINK_MBIT * 1e6 / 8  # 125 MB/s
ROUND_TRIP = 0.020
SHARE = 0.2  # of the link one accelerator's whole-sample reads need
DLIO_MEAN_MB, DLIO_SD_MB = 146.6, 68.3
EPOCHS = 3
BATCH = 4
AU_SUSTAINED = 0.90
AU_WARM = 0.98
GOAL_ACCELERATORS = 4
GOAL_WARM_ACCELERATORS = 5
LABELS = 251  # y holds the file's number modulo this
ROWS = {
    "whole": "npydask, whole samples",
    "patches": "npydask, Uniform patches",
    "baseline": "DataLoader(num_workers=2), obstore GET + np.load",
}


@dataclass(frozen=True)
class Size:
    samples: int
    scale: float  # of DLIO's sample sizes
    clip: int  # bytes: the smallest sample
    plane: tuple[int, int]  # H, W
    patch: tuple[int, int, int]


SIZES = {
    "tiny": Size(8, 1 / 1024, 50_000, (24, 24), (8, 16, 16)),
    "small": Size(48, 1 / 64, 250_000, (48, 48), (16, 32, 32)),
    "full": Size(168, 1 / 16, 1 * MB, (96, 96), (16, 64, 64)),
}


def depths(size: Size, seed: int = 0) -> list[int]:
    """Each sample's depth D: its bytes (x float32 and y uint8 over ``D x H x W``) drawn from DLIO's sizes."""
    rng = np.random.default_rng(seed)
    drawn = rng.normal(DLIO_MEAN_MB * MB * size.scale, DLIO_SD_MB * MB * size.scale, size.samples)
    per_plane = size.plane[0] * size.plane[1] * 5
    return [max(math.ceil(size.clip / per_plane), round(b / per_plane)) for b in np.maximum(drawn, size.clip)]


def payload_bytes(size: Size, d: list[int]) -> int:
    """The bytes of the samples' arrays (``x`` and ``y``), without the archives' headers and directories."""
    return sum(n * size.plane[0] * size.plane[1] * 5 for n in d)


def sample_bytes(index: int, depth: int, plane: tuple[int, int]) -> bytes:
    """One stored ``.npz``: ``x`` random float32, ``y`` the file's number (mod 251) everywhere."""
    rng = np.random.default_rng(1000 + index)
    x = rng.random((depth, *plane), dtype=np.float32)
    y = np.full((depth, *plane), index % LABELS, dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# the accelerators (run as child processes: ``bench_au.py --worker CONFIG``)


def _check(index: int, x: Any, y: Any, shape: tuple[int, ...]) -> int:
    """0 when the sample ``index`` read is its file's, else 1."""
    y = np.asarray(y)
    return int(tuple(np.shape(x)) != shape or y.shape != shape or not np.all(y == index % LABELS))


def _npydask_batches(cfg: dict[str, Any]) -> tuple[Callable[[int], Any], Callable[[], dict[str, Any]]]:
    import npydask
    from npydask.samplers import Uniform

    cache = npydask.Cache(cfg["cache"])
    ds = npydask.open_dataset(
        cfg["url"], file_filter="*.npz", key=["x", "y"], storage_options=cfg["options"], cache=cache
    )
    patch = tuple(cfg["patch"]) if cfg["row"] == "patches" else None
    loader = npydask.Loader(
        ds,
        BATCH,
        sampler=Uniform(patch, per_file=1) if patch else None,
        shuffle=True,
        seed=0,
        shard_id=cfg["rank"],
        num_shards=cfg["n"],
        prefetch=cfg["prefetch"],
        with_index=True,
    )
    depth = cfg["depths"]
    plane = tuple(cfg["plane"])

    def epoch(e: int) -> Any:
        loader.set_epoch(e)
        for batch, index in loader:
            files = index["file"] if patch else index
            bad = 0
            for i, f in enumerate(np.asarray(files).tolist()):
                shape = patch or (depth[f], *plane)
                bad += _check(f, batch["x"][i], batch["y"][i], shape)
            yield bad

    def stats() -> dict[str, Any]:
        s = loader.stats()  # (this epoch's)
        names = ("bytes_read", "requests", "cache_hits", "cache_misses", "cache_hit_bytes", "hedges")
        return {k: getattr(s, k) for k in names if hasattr(s, k)}

    return epoch, stats


class _Objects:
    """The baseline's ``Dataset``: GET a whole object with obstore, ``np.load`` it (no pickle)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.keys = cfg["keys"]
        self.store: Any = None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, np.ndarray]:
        import obstore
        from obstore.store import S3Store

        if self.store is None:
            options = dict(self.cfg["options"])
            client = {"allow_http": options.pop("allow_http", False)}
            self.store = S3Store(self.cfg["bucket"], **options, client_options=client)
        data = obstore.get(self.store, self.keys[i]).bytes()
        with np.load(io.BytesIO(data)) as z:
            return i, z["x"], z["y"]


def _as_list(samples: list[Any]) -> list[Any]:
    return samples


def _baseline_batches(cfg: dict[str, Any]) -> tuple[Callable[[int], Any], Callable[[], dict[str, Any]]]:
    from torch.utils.data import DataLoader, DistributedSampler

    objects: Any = _Objects(cfg)  # (a map-style dataset: __len__ and __getitem__)
    sampler: Any = DistributedSampler(objects, num_replicas=cfg["n"], rank=cfg["rank"], shuffle=True, seed=0)
    loader = DataLoader(
        objects, batch_size=BATCH, sampler=sampler, num_workers=2, persistent_workers=True, collate_fn=_as_list
    )
    depth = cfg["depths"]
    plane = tuple(cfg["plane"])

    def epoch(e: int) -> Any:
        sampler.set_epoch(e)
        for batch in loader:
            yield sum(_check(i, x, y, (depth[i], *plane)) for i, x, y in batch)

    return epoch, lambda: {}


def worker(cfg: dict[str, Any]) -> None:
    """One emulated accelerator: open, say ready, wait for go, 3 epochs of get a batch + sleep(c); print figures."""
    epoch, stats = (_baseline_batches if cfg["row"] == "baseline" else _npydask_batches)(cfg)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    c = cfg["compute"]
    epochs = []
    bad = 0
    for e in range(EPOCHS):
        start = time.perf_counter()
        waits = []
        it = iter(epoch(e))
        while True:
            t = time.perf_counter()
            try:
                bad += next(it)
            except StopIteration:
                break
            waits.append(round(time.perf_counter() - t, 4))
            time.sleep(c)
        epochs.append(
            {"start": start, "end": time.perf_counter(), "steps": len(waits), "waits": waits, "stats": stats()}
        )
    print(json.dumps({"epochs": epochs, "compute": c, "wrong": bad}), flush=True)


# ---------------------------------------------------------------------------------------------
# the runs


@dataclass
class Run:
    """One row at N accelerators: AU over the 3 epochs, cold (epoch 1) and warm (epochs 2-3), mean and min."""

    row: str
    n: int
    au: float
    au_min: float
    cold: float
    warm: float
    warm_min: float
    wall: float
    steps: int
    wrong: int
    bytes_down: int
    gets: int
    notes: str = ""
    waits: list[dict[str, float]] | None = None  # per epoch, mean over accelerators: the first batch's wait, the rest's
    by_epoch: list[dict[str, int]] | None = None  # per epoch, summed over accelerators: the loaders' stats()


def _au(results: list[dict[str, Any]], first: int, last: int) -> list[float]:
    """Each accelerator's AU over epochs ``first..last``: compute over the wall from their start to their end."""
    out = []
    for r in results:
        eps = r["epochs"][first : last + 1]
        compute = sum(e["steps"] for e in eps) * r["compute"]
        wall = eps[-1]["end"] - eps[0]["start"]
        out.append(compute / wall if wall > 0 else 0.0)
    return out


class Bench:
    def __init__(self, args: Any, size: Size, server: Any, proxy: Any, how: str, keys: list[str], d: list[int]) -> None:
        self.args, self.size, self.server, self.proxy = args, size, server, proxy
        self.how, self.keys, self.depths = how, keys, d
        self.root = tempfile.mkdtemp(prefix="npydask-bench-au-cache-")
        self.runs: dict[tuple[str, int], Run] = {}
        self.made = 0
        self.options = {**server.storage_options(), "endpoint": proxy.endpoint}
        self.dropped: list[bool] = []

    def drop_server_pages(self) -> bool:
        """Drop SeaweedFS's volume files from the page cache; whether every page went."""
        from npydask.testing import drop_page_cache

        ok = True
        for folder, _, names in os.walk(self.server.folder):
            for name in names:
                if name.endswith((".dat", ".idx")):
                    ok &= drop_page_cache(os.path.join(folder, name))
        self.dropped.append(ok)
        return ok

    def run(self, row: str, n: int, c: float) -> Run:
        if (row, n) in self.runs:
            return self.runs[row, n]
        self.made += 1
        cache = os.path.join(self.root, f"{row}-{n}-{self.made}")  # (a fresh, empty node cache per run)
        base = {
            "row": row,
            "n": n,
            "url": self.server.url("au/"),
            "bucket": self.server.bucket,
            "keys": self.keys,
            "options": self.options,
            "cache": cache,
            "patch": list(self.size.patch),
            "plane": list(self.size.plane),
            "depths": self.depths,
            "prefetch": self.args.prefetch,
            "compute": c,
        }
        procs = []
        for rank in range(n):
            cfg = json.dumps({**base, "rank": rank})
            procs.append(
                subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--worker", cfg],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        try:
            for p in procs:
                line = p.stdout.readline() if p.stdout else ""
                if line.strip() != "ready":
                    raise RuntimeError(f"{row} at {n}: an accelerator did not start: {line!r}")
            dropped = self.drop_server_pages()
            self.proxy.reset()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            results = []
            for p in procs:
                out, _ = p.communicate(timeout=3600)
                if p.returncode:
                    raise RuntimeError(f"{row} at {n}: an accelerator failed (exit {p.returncode})")
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        counts = self.proxy.reset()
        shutil.rmtree(cache, ignore_errors=True)
        every = _au(results, 0, EPOCHS - 1)
        warm = _au(results, 1, EPOCHS - 1)
        by_epoch = [
            {k: sum(r["epochs"][e]["stats"].get(k, 0) for r in results) for k in results[0]["epochs"][e]["stats"]}
            for e in range(EPOCHS)
        ]
        if row == "baseline":
            notes = "no node cache"
        else:
            notes = "MB from the store by epoch " + "/".join(f"{s['bytes_read'] / MB:.1f}" for s in by_epoch)
            notes += ", cache hits " + "/".join(str(s.get("cache_hits", 0)) for s in by_epoch)
        if not dropped:
            notes += "; page cache NOT dropped"
        run = Run(
            row,
            n,
            float(np.mean(every)),
            min(every),
            float(np.mean(_au(results, 0, 0))),
            float(np.mean(warm)),
            min(warm),
            max(r["epochs"][-1]["end"] for r in results) - min(r["epochs"][0]["start"] for r in results),
            sum(e["steps"] for r in results for e in r["epochs"]),
            sum(r["wrong"] for r in results),
            counts.downstream,
            counts.count("GET"),
            notes,
        )
        run.by_epoch = by_epoch
        run.waits = [
            {
                "first": float(np.mean([r["epochs"][e]["waits"][0] for r in results if r["epochs"][e]["waits"]])),
                "rest": float(np.mean([sum(r["epochs"][e]["waits"][1:]) for r in results])),
                "compute": float(np.mean([r["epochs"][e]["steps"] * c for r in results])),
            }
            for e in range(EPOCHS)
        ]
        self.runs[row, n] = run
        print(
            f"  {ROWS[row]:50s} N={n}: AU {run.au:6.1%} (min {run.au_min:6.1%}), cold {run.cold:6.1%}, "
            f"warm {run.warm:6.1%}; {run.wall:6.1f} s, {run.bytes_down / MB:8.1f} MB down, {run.gets} GETs"
            + (f"; {run.wrong} WRONG samples" if run.wrong else "")
            + "; waits (first batch + rest / compute) by epoch: "
            + ", ".join(f"{w['first']:.2f}+{w['rest']:.2f}/{w['compute']:.1f}" for w in run.waits),
            flush=True,
        )
        return run

    def most(self, row: str, c: float, ok: Callable[[Run], bool]) -> int:
        """The most accelerators (1..--max-accelerators) whose run is ``ok``, by bisection (0: not even one)."""
        if not ok(self.run(row, 1, c)):
            return 0
        lo, hi = 1, self.args.max_accelerators
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(self.run(row, mid, c)):
                lo = mid
            else:
                hi = mid - 1
        return lo


def upload(server: Any, size: Size, d: list[int]) -> tuple[list[str], int]:
    """PUT every sample (8 at once); their keys and total bytes."""
    import obstore

    store = server.obstore_store()
    keys = [f"au/sample_{i:04d}.npz" for i in range(size.samples)]

    def put(i: int) -> int:
        data = sample_bytes(i, d[i], size.plane)
        obstore.put(store, keys[i], data)
        return len(data)

    with ThreadPoolExecutor(8) as pool:
        total = sum(pool.map(put, range(size.samples)))
    return keys, total


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.split("\n", 1)[0], default_size="small", default_repeat=1)
    ap.add_argument("--max-accelerators", type=int, default=6, metavar="N", help="the sweep's top (default 6)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows (default {','.join(ROWS)})")
    ap.add_argument("--prefetch", type=int, default=4, metavar="N", help="npydask Loader prefetch (default 4)")
    ap.add_argument("--link-via", choices=["auto", "tc", "proxy"], default="auto", help="how the link is emulated")
    ap.add_argument(
        "--accelerators",
        metavar="N,N",
        help="run each row at these accelerator counts only (no search, no goals): to look into one figure",
    )
    ap.add_argument("--worker", help=argparse_hidden())
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        ap.error(f"--rows: unknown {unknown}; expected some of {','.join(ROWS)}")
    if args.max_accelerators < 1:
        ap.error("--max-accelerators must be >= 1")
    import importlib.util

    if "baseline" in rows and importlib.util.find_spec("torch") is None:
        rows.remove("baseline")
        print("# the baseline row needs PyTorch, not installed here: skipped", flush=True)
    size = SIZES[args.size]
    env = _common.environment()
    _common.print_environment(env)

    from bench_remote import start_server

    from npydask.testing.counting_proxy import CountingProxy

    server, why = start_server()
    if server is None:
        print(f"# skipped: {why}", flush=True)
        _common.write_json(args.json, {"benchmark": "au", "size": args.size, "skipped": why})
        return 0
    bench = None
    try:
        d = depths(size)
        t0 = time.perf_counter()
        keys, total = upload(server, size, d)
        mean_sample = total / size.samples
        c = BATCH * mean_sample / (SHARE * LINK_BYTES)
        print(
            f"# size={args.size}: {size.samples} samples of {size.plane} planes, {total / MB:.1f} MB "
            f"(mean {mean_sample / MB:.2f} MB, min {min(d)} planes, max {max(d)}), uploaded in "
            f"{time.perf_counter() - t0:.1f} s; batch {BATCH}, compute c = {c:.3f} s a step",
            flush=True,
        )
        port = int(server.endpoint.rsplit(":", 1)[1])
        cannot = "--link-via proxy" if args.link_via == "proxy" else _link.cannot_shape()
        if cannot and args.link_via == "tc":
            raise SystemExit(f"--link-via tc: cannot shape loopback here: {cannot}")
        with contextlib.ExitStack() as stack:
            if cannot is None:
                how = stack.enter_context(_link.shaped_port(port, LINK_MBIT))
                proxy = stack.enter_context(CountingProxy(server.endpoint, delay=ROUND_TRIP))
            else:
                how = f"{LINK_MBIT:g} Mbit/s by the counting proxy's rate= (tc shaping unavailable: {cannot})"
                proxy = stack.enter_context(CountingProxy(server.endpoint, rate=LINK_BYTES, delay=ROUND_TRIP))
            print(f"# link: {how}; round trip {ROUND_TRIP * 1e3:g} ms added by the counting proxy", flush=True)
            bench = Bench(args, size, server, proxy, how, keys, d)
            summary = []
            for row in rows:
                if args.accelerators:
                    for n in (int(v) for v in args.accelerators.split(",")):
                        bench.run(row, n, c)
                    continue
                one = bench.run(row, 1, c)
                most = bench.most(row, c, lambda r: r.au >= AU_SUSTAINED)
                warm = bench.most(row, c, lambda r: r.warm >= AU_WARM)
                summary.append({"row": row, "cold@1": one.cold, "warm@1": one.warm, "au@1": one.au,
                                "sustained": most, "sustained_warm": warm})  # fmt: skip
    finally:
        server.stop()
        if bench is not None:
            shutil.rmtree(bench.root, ignore_errors=True)
    return report(args, size, bench, summary, c, how, total)


def report(args: Any, size: Size, bench: Any, summary: list[dict[str, Any]], c: float, how: str, total: int) -> int:
    runs = sorted(bench.runs.values(), key=lambda r: (list(ROWS).index(r.row), r.n))
    print()
    _common.table(
        [
            [ROWS[r.row], r.n, f"{r.au:.1%}", f"{r.au_min:.1%}", f"{r.cold:.1%}", f"{r.warm:.1%}", f"{r.wall:.1f}",
             f"{r.bytes_down / MB:.0f}", r.gets, r.notes]
            for r in runs
        ],
        ["row", "N", "AU 3 epochs", "min", "cold (ep 1)", "warm (ep 2-3)", "wall s", "MB down", "GETs", "notes"],
    )  # fmt: skip
    print()
    _common.table(
        [[ROWS[s["row"]], f"{s['cold@1']:.1%}", f"{s['warm@1']:.1%}", s["sustained"], s["sustained_warm"]]
         for s in summary],
        ["row", "AU cold, 1 acc.", "AU warm, 1 acc.", f"most N at AU >= {AU_SUSTAINED:.0%}",
         f"most N warm at AU >= {AU_WARM:.0%}"],
    )  # fmt: skip
    by = {s["row"]: s for s in summary}
    goals = []

    def goal(text: str, measured: Any, target: str, ok: bool | None) -> None:
        verdict = "n/a" if ok is None else ("PASS" if ok else "FAIL")
        goals.append({"goal": text, "measured": measured, "target": target, "verdict": verdict})

    whole, base = by.get("whole"), by.get("baseline")
    top = args.max_accelerators
    goal(
        f"whole samples: most accelerators at AU >= {AU_SUSTAINED:.0%} (3 epochs from cold)",
        whole and whole["sustained"],
        f">= {GOAL_ACCELERATORS}",
        None if whole is None or top < GOAL_ACCELERATORS else whole["sustained"] >= GOAL_ACCELERATORS,
    )
    goal(
        "whole samples sustain more accelerators than the baseline",
        whole and base and f"{whole['sustained']} vs {base['sustained']}",
        "more",
        None if whole is None or base is None or (base["sustained"] == top) else whole["sustained"] > base["sustained"],
    )
    warm_ok = (
        None if whole is None or top < GOAL_WARM_ACCELERATORS else whole["sustained_warm"] >= GOAL_WARM_ACCELERATORS
    )
    goal(f"warm (epochs 2-3): most accelerators at AU >= {AU_WARM:.0%}", whole and whole["sustained_warm"],
         f">= {GOAL_WARM_ACCELERATORS}", warm_ok)  # fmt: skip
    print()
    _common.table([[g["goal"], g["measured"], g["target"], g["verdict"]] for g in goals],
                  ["goal", "measured", "target", "verdict"])  # fmt: skip
    wrong = sum(r.wrong for r in runs)
    print(f"# wrong samples: {wrong}; page cache of the volume files dropped before every run: {all(bench.dropped)}")
    print(f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    _common.write_json(
        args.json,
        {
            "benchmark": "au",
            "size": args.size,
            "facts": {"link": how, "round trip s": ROUND_TRIP, "compute s": c, "samples": size.samples,
                      "dataset bytes": total, "payload bytes": payload_bytes(size, bench.depths),
                      "prefetch": args.prefetch, "page cache dropped": all(bench.dropped)},
            "runs": [r.__dict__ for r in runs],
            "summary": summary,
            "goals": goals,
            "wrong": wrong,
        },
    )  # fmt: skip
    return 0 if wrong == 0 else 1


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
