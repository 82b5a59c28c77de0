"""The tail and throttling: hedged range GETs and ``remote_concurrency="auto"`` on SeaweedFS behind a faulty proxy.

The script starts its own SeaweedFS S3 server (``npydask.testing.seaweed``,
loopback only), uploads small ``.npy`` objects (float32 32x32, 4 KiB each)
and reads them through a :class:`~npydask.testing.counting_proxy.CountingProxy`
whose faults it sets per case. A batch is ``ds[16 objects].stack().compute()``:
16 GETs. ``--loops`` threads run batches side by side (each batch timed
alone). Every batch is compared with ``numpy.load`` of the local files.

=======  =======  ========  ===========================
size     objects  batches   throttled reads (objects)
=======  =======  ========  ===========================
tiny     48       16        48
small    256      300       800
full     512      1,000     2,000
=======  =======  ========  ===========================

Cases (one process, one scheduler: latency histories carry over, as they
would in a training job):

* ``control``: no fault, hedging off: the machine's own p99/median (info).
* ``tail, hedging off`` and ``tail, hedging auto``: 1% of GETs 2 s late
  (the proxy's seeded slow tail, the same draws in both). Goals: the hedged
  p99 batch time <= 0.2x the unhedged one, the unhedged p99 >= 10x its
  median (the tail is there to cut), hedges <= 3% of GETs, bytes at the
  proxy <= 1.03x.
* ``every GET 200 ms late``, hedging auto. Goal: hedges <= 1% of GETs (a
  uniformly slow store is not a tail).
* ``503 above a rate``: a 20 ms round trip and S3's ``503 Slow Down`` above
  ``--rate`` requests a second; every object read at once with
  ``remote_concurrency`` fixed at 4 to 128 (tiny: 4 and 32) and ``"auto"``. Goals: auto's
  throughput >= 0.8x the best fixed one, and no read fails under auto.

Usage::

    python benchmarks/bench_tail.py [--size tiny|small|full] [--loops N] [--rate R] [--tail-delay S]
                                    [--json out.json]

``--repeat`` is accepted for the house pattern and ignored (each case is
one long run of many batches). Where SeaweedFS's ``weed`` is missing or
cannot run here, the script says so, writes ``{"skipped": reason}`` to
``--json`` and exits 0; the exit status is 1 only when a batch disagrees
with numpy.
"""

from __future__ import annotations

import errno
import io
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

import npydask  # noqa: E402
from npydask.testing.counting_proxy import CountingProxy  # noqa: E402
from npydask.testing.seaweed import SeaweedServer, find_weed  # noqa: E402

BATCH = 16
TAIL_SHARE = 0.01
TAIL_DELAY = 2.0
SLOWDOWN = 0.2
ROUND_TRIP = 0.02
GOAL_P99 = 0.2
GOAL_TAIL = 10.0
GOAL_HEDGES = 0.03
GOAL_BYTES = 1.03
GOAL_SLOW_HEDGES = 0.01
GOAL_AUTO = 0.8
SWEEP = (4, 8, 16, 32, 64, 128)

SIZES = {"tiny": (48, 16, 48), "small": (256, 300, 800), "full": (512, 1000, 2000)}
"""Objects, batches, objects read at once under throttling."""


@dataclass
class Case:
    """One case's batches: their times, the figures of their reads, the proxy's counts."""

    name: str
    times: list[float] = field(default_factory=list)
    requests: int = 0
    hedges: int = 0
    hedges_won: int = 0
    throttled: int = 0
    downstream: int = 0
    gets: int = 0
    wrong: int = 0

    def p(self, q: float) -> float:
        return float(np.percentile(self.times, q)) if self.times else 0.0

    def row(self) -> list[Any]:
        return [
            self.name,
            len(self.times),
            f"{self.p(50) * 1e3:.1f}",
            f"{self.p(99) * 1e3:.1f}",
            f"{self.p(99) / max(self.p(50), 1e-9):.1f}",
            self.gets,
            self.hedges,
            self.hedges_won,
            f"{self.downstream / 2**20:.2f}",
        ]


def start_server() -> tuple[SeaweedServer | None, str]:
    """A started server, or ``None`` and why not (only where ``weed`` is missing or cannot run here)."""
    try:
        find_weed()
    except FileNotFoundError as e:
        return None, str(e)
    server = SeaweedServer()
    try:
        server.start()
    except OSError as e:
        if e.errno in (errno.ENOEXEC, errno.EACCES):
            return None, f"SeaweedFS's weed cannot run on this platform: {e}"
        raise
    return server, ""


class Bench:
    def __init__(self, server: SeaweedServer, proxy: CountingProxy, n: int, loops: int) -> None:
        self.server, self.proxy, self.loops = server, proxy, loops
        rng = np.random.default_rng(0)
        self.arrays = [rng.random((32, 32), dtype=np.float32) for _ in range(n)]
        self.prefix = f"s3://{server.bucket}/tail/"
        self.options = dict(server.storage_options(), endpoint=proxy.endpoint)
        self.cases: list[Case] = []

    def upload(self) -> None:
        import obstore
        from obstore.store import S3Store

        store = S3Store(self.server.bucket, **self.server.storage_options())

        def put(i: int) -> None:
            buf = io.BytesIO()
            np.save(buf, self.arrays[i])
            obstore.put(store, f"tail/{i:05d}.npy", buf.getvalue())

        with ThreadPoolExecutor(32) as pool:
            list(pool.map(put, range(len(self.arrays))))

    def open(self, **settings: Any) -> Any:
        """The dataset, opened with ``settings`` (captured by its tasks), without faults."""
        faults = self.proxy.faults
        self.proxy.set_faults(delay=0.0, slowdown=0.0, tail_share=0.0, max_request_rate=None)
        with npydask.config.set(**settings):
            ds = npydask.open_dataset(self.prefix, storage_options=self.options)
        self.proxy.set_faults(
            delay=faults.delay,
            slowdown=faults.slowdown,
            tail_share=faults.tail_share,
            tail_delay=faults.tail_delay,
            max_request_rate=faults.max_request_rate,
        )
        return ds

    def batches(self, name: str, ds: Any, n_batches: int, seed: int = 1) -> Case:
        """``n_batches`` batches of 16 objects over ``self.loops`` threads, each timed; checked against numpy."""
        case = Case(name)
        lock = threading.Lock()
        per = [n_batches // self.loops + (k < n_batches % self.loops) for k in range(self.loops)]
        before = self.proxy.counts

        def loop(k: int) -> None:
            rng = np.random.default_rng(seed * 1000 + k)
            times, wrong = [], 0
            with npydask.io_stats() as s:
                for _ in range(per[k]):
                    idx = rng.choice(len(self.arrays), BATCH, replace=False).tolist()
                    t0 = time.perf_counter()
                    got = ds[idx].stack().compute()
                    times.append(time.perf_counter() - t0)
                    wrong += not np.array_equal(got, np.stack([self.arrays[i] for i in idx]))
            with lock:
                case.times += times
                case.wrong += wrong
                case.requests += s.requests
                case.hedges += s.hedges
                case.hedges_won += s.hedges_won

        threads = [threading.Thread(target=loop, args=(k,)) for k in range(self.loops)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = self.proxy.counts
        case.downstream = after.downstream - before.downstream
        case.gets = after.count("GET") - before.count("GET")
        self.cases.append(case)
        return case

    def throttled(self, concurrency: Any, n: int) -> tuple[float, int, int, int]:
        """Every one of ``n`` objects read at once under ``remote_concurrency``: objects/s, failures, throttled,
        wrong."""
        ds = self.open(remote_concurrency=concurrency)
        idx = [i % len(self.arrays) for i in range(n)]  # (an object may come again: its own GET)
        t0 = time.perf_counter()
        failed: OSError | None = None
        with npydask.io_stats() as s:
            try:
                got = ds[idx].stack().compute()
            except OSError as e:
                failed = e
        if failed is not None:  # (s is filled once the block has exited)
            print(f"# remote_concurrency={concurrency!r}: failed: {failed}", flush=True)
            return 0.0, 1, s.throttled, 0
        took = time.perf_counter() - t0
        wrong = int(not np.array_equal(got, np.stack([self.arrays[i] for i in idx])))
        return n / took, 0, s.throttled, wrong


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.split("\n", 1)[0], default_size="small", default_repeat=1)
    ap.add_argument("--loops", type=int, default=4, help="batch loops side by side (default 4)")
    ap.add_argument(
        "--tail-delay", type=float, default=TAIL_DELAY, help=f"seconds a late GET is late (default {TAIL_DELAY:g})"
    )
    ap.add_argument(
        "--rate", type=float, default=0.0, help="requests a second above which the proxy answers 503 (default: by size)"
    )
    args = ap.parse_args(argv)
    n_objects, n_batches, n_throttled = SIZES[args.size]
    rate = args.rate or {"tiny": 200.0, "small": 300.0, "full": 400.0}[args.size]
    _common.print_environment(_common.environment())
    server, why = start_server()
    if server is None:
        print(f"# skipped: {why}", flush=True)
        _common.write_json(args.json, {"benchmark": "tail", "size": args.size, "skipped": why})
        return 0
    goals: list[dict[str, Any]] = []
    sweep_rows: list[list[Any]] = []
    sweep_wrong = 0
    try:
        with CountingProxy(server.endpoint) as proxy:
            bench = Bench(server, proxy, n_objects, args.loops)
            bench.upload()
            print(
                f"# size={args.size}: {n_objects} objects of 32x32 float32, {n_batches} batches of {BATCH} GETs per "
                f"case over {args.loops} loops; SeaweedFS {server.endpoint} behind the proxy {proxy.endpoint}",
                flush=True,
            )
            ds_off = bench.open(remote_hedge="off")
            ds_auto = bench.open(remote_hedge="auto")
            bench.batches("warm-up (hedging auto)", ds_auto, max(8, n_batches // 10), seed=9)
            control = bench.batches("control: no fault, hedging off", ds_off, n_batches)
            proxy.set_faults(tail_share=TAIL_SHARE, tail_delay=args.tail_delay, seed=7)
            late = f"tail 1% x {args.tail_delay:g} s"
            off = bench.batches(f"{late}, hedging off", ds_off, n_batches)
            proxy.set_faults(seed=8)
            proxy.set_faults(seed=7)  # (the same draws again)
            auto = bench.batches(f"{late}, hedging auto", ds_auto, n_batches)
            proxy.set_faults(tail_share=0.0, slowdown=SLOWDOWN)
            slow = bench.batches("every GET 200 ms late, hedging auto", ds_auto, max(8, n_batches // 4))
            proxy.set_faults(slowdown=0.0, delay=ROUND_TRIP, max_request_rate=rate)
            for c in (*(SWEEP if args.size != "tiny" else SWEEP[::3]), "auto"):  # (tiny: 4 and 32)
                rate_s, failed, throttled, wrong = bench.throttled(c, n_throttled)
                sweep_rows.append([repr(c), f"{rate_s:.0f}", failed, throttled])
                sweep_wrong += wrong
            proxy.set_faults(delay=0.0, max_request_rate=None)
    finally:
        server.stop()

    print("\n# batches (times in ms; GETs, hedges and bytes at the proxy)")
    _common.table(
        [c.row() for c in bench.cases],
        ["case", "batches", "p50", "p99", "p99/p50", "GETs", "hedges", "won", "MiB down"],
    )
    print(f"\n# {n_throttled} objects read at once; 503 above {rate:g} requests/s, {ROUND_TRIP * 1e3:g} ms round trip")
    _common.table(sweep_rows, ["remote_concurrency", "objects/s", "failed", "throttled"])

    def goal(name: str, measured: float, target: str, ok: bool | None) -> None:
        verdict = "info" if ok is None else ("PASS" if ok else "FAIL")
        goals.append({"goal": name, "measured": round(measured, 4), "target": target, "verdict": verdict})

    goal("control p99 / p50 (no tail, no hedging)", control.p(99) / max(control.p(50), 1e-9), "info", None)
    goal("tail: p99 hedged / p99 unhedged", auto.p(99) / max(off.p(99), 1e-9), f"<= {GOAL_P99}", None)
    goals[-1]["verdict"] = "PASS" if auto.p(99) <= GOAL_P99 * off.p(99) else "FAIL"
    goal("tail: unhedged p99 / its p50", off.p(99) / max(off.p(50), 1e-9), f">= {GOAL_TAIL}", None)
    goals[-1]["verdict"] = "PASS" if off.p(99) >= GOAL_TAIL * off.p(50) else "FAIL"
    share = auto.hedges / max(auto.requests, 1)  # (requests: every GET sent, hedges included)
    goal("tail: hedges / GETs", share, f"<= {GOAL_HEDGES}", share <= GOAL_HEDGES)
    ratio = auto.downstream / max(off.downstream, 1)
    goal("tail: bytes hedged / unhedged", ratio, f"<= {GOAL_BYTES}", ratio <= GOAL_BYTES)
    slow_share = slow.hedges / max(slow.requests, 1)
    goal("every GET 200 ms late: hedges / GETs", slow_share, f"<= {GOAL_SLOW_HEDGES}", slow_share <= GOAL_SLOW_HEDGES)
    fixed = [float(r[1]) for r in sweep_rows[:-1] if r[2] == 0]
    best = max(fixed, default=0.0)
    auto_rate, auto_failed = float(sweep_rows[-1][1]), sweep_rows[-1][2]
    goal("503: auto / best fixed throughput", auto_rate / max(best, 1e-9), f">= {GOAL_AUTO}", None)
    goals[-1]["verdict"] = "PASS" if auto_rate >= GOAL_AUTO * best and best > 0 else "FAIL"
    goal("503: reads failed under auto", auto_failed, "0", auto_failed == 0)
    print()
    _common.table([[g["goal"], g["measured"], g["target"], g["verdict"]] for g in goals],
                  ["goal", "measured", "target", "verdict"])  # fmt: skip
    wrong = sum(c.wrong for c in bench.cases) + sweep_wrong
    print(f"# batches that disagree with numpy: {wrong}", flush=True)
    _common.write_json(
        args.json,
        {
            "benchmark": "tail",
            "size": args.size,
            "goals": goals,
            "cases": [
                dict(
                    zip(
                        ["case", "batches", "p50 ms", "p99 ms", "p99/p50", "GETs", "hedges", "won", "MiB down"], c.row()
                    )
                )
                for c in bench.cases
            ],  # fmt: skip
            "sweep": sweep_rows,
            "results_agree": wrong == 0,
        },
    )
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
