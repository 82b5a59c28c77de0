"""Object storage: npydask over ``s3://`` against the peers' ways, on a local SeaweedFS server.

The script starts its own SeaweedFS S3 server (``npydask.testing.seaweed``,
loopback only, stopped at exit), uploads the data once (untimed; the
``.npy`` files are kept in ``--data DIR`` and reused, or written to a temp
folder), and times every variant against that one server, warm: it is never
restarted between variants, while npydask's per-process caches (sources,
header memo) are cleared before every run, as a fresh process would have
them. Object stores and clients (connection pools) are built once, for
npydask and the peers alike.

=======  =======================================  ===========================
size     volumes (float32), ROI                   small objects (float32)
=======  =======================================  ===========================
tiny     4 of 16x64x64 (1 MiB), 16^3              200 of 32x32 (4 KiB each)
small    16 of 32x256x256 (128 MiB), 32^3         2,000 of 32x32
full     64 of 64x256x256 (1 GiB), 32^3           20,000 of 32x32
=======  =======================================  ===========================

Four groups (``ratio``: to the group's reference):

* ``R1 roi``: the same ROI of every volume,
  ``open_dataset(prefix, roi_start, roi_shape).stack().compute()`` (the
  opening included). Reference: the whole-object peers' way (what DALI and
  Ray do): each object downloaded with obstore, 64 in flight, ``np.load``,
  sliced. Also a sequential boto3 ``get_object`` + ``np.load`` loop. Bytes
  are counted once per variant at a :class:`CountingProxy` in front of the
  S3 port (untimed: a Python proxy would slow the timed runs) and compared
  with the per-plane spans (from the first to the last ROI byte within each
  plane of the outermost axis; computed from the geometry). Bytes goal:
  <= 1.5x the spans. Time goals: on loopback the server's CPU per request,
  not the bytes, sets the time, so there npydask is held to a raw obstore
  loop of the same per-plane range GETs (64 in flight): the compute of a
  dataset opened beforehand <= 1.3x it, opening included <= 1.5x it (the
  ratio to the whole-object way is printed as info). Against the whole-object
  way both run again over an emulated link of ``--link-mbit`` (default 1,000
  Mbit/s, a cloud VM's link; ``0`` skips it): the kernel's shaper on the S3
  port's responses where root and ``tc`` allow (:mod:`_link`), else a pacing
  proxy; no latency added. Goal there, at 1,000 Mbit/s: <= 0.25x the
  whole-object way (another speed prints it as info).
* ``R2 sum``: the volumes stacked and summed,
  ``open_dataset(prefix).stack().sum().compute()``. Reference (the floor):
  a raw concurrent range-GET loop with obstore over the same objects, 8 MiB
  parts, 64 in flight, bytes only. Also a sequential boto3 + ``np.load`` +
  sum loop. Goal: npydask's MiB/s >= 0.8x the floor's.
* ``R3 small``: every small object summed, open + stack + sum with a reused
  ``index=`` (one request per object) and with ``headers="all"`` (the
  default: a header GET at opening, then the object). Reference (the
  floor): a raw concurrent whole-object GET loop with obstore, 64 in flight.
  Also a sequential boto3 + ``np.load`` + sum loop (run once when one run
  takes over ``--slow-budget`` seconds). Goals: with the index <= 2x the
  floor, and >= 5x faster than the boto3 loop.
* ``R4 open``: opening the small objects alone, timed, and its requests
  counted at the proxy: with the index reused, the LIST pages and no header
  GET; with ``headers="all"``, the LIST pages plus one GET per object. Goal:
  no header requests with the index.

Where ``index=`` over URLs is not available, its variants and goals say
``n/a`` with the error. Ray Data's ``read_numpy`` is measured where Ray is
installed (it reads whole objects). Every result is checked against
``numpy.load`` of the local files: ROI stacks exactly, sums within a
relative 1e-3. Each time is the median of ``--repeat`` runs; ``cpu ms`` is
this process's CPU time (all threads) and ``server cpu ms`` the SeaweedFS
process's: on a shared 2-core machine they compete. The exit status is 1
only when results disagree; a FAIL goal is reported, not fatal. Where
SeaweedFS's ``weed`` is missing or cannot run here, the script says so,
writes ``{"skipped": reason}`` to ``--json`` and exits 0.

Usage::

    python benchmarks/bench_remote.py [--size tiny|small|full] [--repeat N] [--json out.json]
                                      [--data DIR] [--only roi,sum,small] [--link-mbit MBIT] [--link-via auto|tc|proxy]
                                      [--slow-budget S] [--case standard|cache] [--kills N]
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import io
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import _link  # noqa: E402
import _peers  # noqa: E402
import dask.array as da  # noqa: E402
from _datasets import DATASET_SIZES, clear_npydask_caches, make_data  # noqa: E402
from _datasets import DatasetSize as Size

import npydask  # noqa: E402
from npydask.testing.counting_proxy import CountingProxy, ProxyCounts  # noqa: E402
from npydask.testing.seaweed import SeaweedServer, find_weed  # noqa: E402

MiB = 1 << 20
DTYPE = np.dtype("<f4")
RTOL = 1e-3
IN_FLIGHT = 64
PART_BYTES = 8 * MiB
LIST_PAGE = 1000  # keys per S3 LIST page (the server's default max-keys)
GOAL_ROI_BYTES = 1.5
GOAL_ROI_LINK = 0.25  # over the emulated link, against the whole-object way
GOAL_ROI_LINK_MBIT = 1000.0  # the link speed that goal is defined at
GOAL_ROI_OPENED = 1.3  # loopback, a dataset opened beforehand, against the raw per-plane range GETs
GOAL_ROI_OPENING = 1.5  # loopback, opening included, against the same
GOAL_SUM_RATE = 0.8
GOAL_SMALL_FLOOR = 2.0
GOAL_SMALL_BOTO3 = 5.0
NOT_MERGED = "n/a (index= over URLs not merged)"


SIZES = {**DATASET_SIZES, "small": replace(DATASET_SIZES["small"], n_small=2_000)}
GROUPS = {"roi": "R1 ROI", "sum": "R2 throughput", "small": "R3 many small objects", "open": "R4 opening"}


@dataclass
class Row:
    """One variant: its times and CPU (this process, the server), what it computed, its traffic."""

    group: str
    variant: str
    times: list[float]
    cpu: list[float]
    server_cpu: list[float]
    nbytes: int
    value: Any = None
    note: str = ""
    traffic: ProxyCounts | None = None
    median: float = field(init=False)

    def __post_init__(self) -> None:
        self.median = _common.median(self.times)


# ---------------------------------------------------------------------------------------------
# geometry and data


def plane_spans(shape: Sequence[int], roi_shape: Sequence[int], itemsize: int) -> tuple[int, int]:
    """Bytes from the first to the last ROI byte within one plane of the outermost axis, and their sum.

    A C-order array: inside a plane the ROI's last element lies
    ``sum((n_k - 1) * stride_k)`` elements after its first (``k`` over the
    inner axes).

    >>> plane_spans((64, 256, 256), (32, 32, 32), 4)
    (31872, 1019904)
    """
    strides = [int(np.prod(shape[k + 1 :])) for k in range(len(shape))]
    span = (sum((n - 1) * s for n, s in zip(roi_shape[1:], strides[1:])) + 1) * itemsize
    return span, span * roi_shape[0]


def roi_plane_offsets(path: str, shape: Sequence[int], roi_start: Sequence[int], roi_shape: Sequence[int]) -> list[int]:
    """The byte offset of the ROI's first element in each of its planes of the outermost axis (C order)."""
    header = os.path.getsize(path) - int(np.prod(shape)) * DTYPE.itemsize
    strides = [int(np.prod(shape[k + 1 :])) for k in range(len(shape))]
    inner = sum(a * s for a, s in zip(roi_start[1:], strides[1:]))
    return [
        header + (z * strides[0] + inner) * DTYPE.itemsize for z in range(roi_start[0], roi_start[0] + roi_shape[0])
    ]


def numpy_sum(paths: Sequence[str]) -> float:
    """The oracle: every local file loaded with ``np.load`` and summed in float64."""
    return float(sum(np.load(p).sum(dtype=np.float64) for p in paths))


def key_of(path: str) -> str:
    """The object key of a local data file: its folder and name."""
    return "/".join(path.split(os.sep)[-2:])


def upload(store: Any, paths: Sequence[str]) -> None:
    """PUT every file under :func:`key_of` its path, 32 at once (skipping none: the server is new)."""
    import obstore

    def put(path: str) -> None:
        with open(path, "rb") as f:
            obstore.put(store, key_of(path), f.read())

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(put, paths))


def start_server() -> tuple[SeaweedServer | None, str]:
    """A started server, or ``None`` and why not (only where ``weed`` is missing or cannot run here)."""
    try:
        find_weed()
    except FileNotFoundError as e:
        return None, str(e)
    server = SeaweedServer(volume_size_limit_mb=512)
    try:
        server.start()
    except OSError as e:
        if e.errno in (errno.ENOEXEC, errno.EACCES):  # a binary built for another platform
            return None, f"SeaweedFS's weed cannot run on this platform: {e}"
        raise
    return server, ""


def process_cpu(pid: int | None) -> float:
    """User plus system CPU seconds of process ``pid`` so far (0.0 where unknown)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# the run


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.split("\n", 1)[0], default_size="small", default_repeat=3)
    ap.add_argument("--data", metavar="DIR", help="keep the .npy files here and reuse them (default: a temp folder)")
    ap.add_argument(
        "--link-mbit",
        type=float,
        default=1000.0,
        metavar="MBIT",
        help="also time R1 over an emulated link of this many Mbit/s (a pacing proxy), 0 to skip (default 1000)",
    )
    ap.add_argument(
        "--only",
        default="roi,sum,small",
        metavar="GROUPS",
        help="comma-separated groups to run: roi (R1), sum (R2), small (R3 and R4); default all",
    )
    ap.add_argument(
        "--link-via",
        choices=["auto", "tc", "proxy"],
        default="auto",
        help="how the link is emulated: the kernel's shaper where it can (auto), only it, or the pacing proxy",
    )
    ap.add_argument(
        "--case",
        choices=["standard", "cache"],
        default="standard",
        help="standard: R1-R4 (default); cache: the node cache's goals (see _remote_cache.py)",
    )
    ap.add_argument(
        "--kills",
        type=int,
        default=10,
        metavar="N",
        help="--case cache: SIGKILLs of a process filling the cache beside another (default 10)",
    )
    ap.add_argument(
        "--slow-budget",
        type=float,
        default=30.0,
        metavar="S",
        help="run a sequential peer loop once only when its first run takes over S seconds (default 30)",
    )
    args = ap.parse_args(argv)
    size = SIZES[args.size]
    env = _common.environment()
    _common.print_environment(env)

    server, why = start_server()
    if server is None:
        print(f"# skipped: {why}", flush=True)
        _common.write_json(args.json, {"benchmark": "remote", "size": args.size, "skipped": why})
        return 0
    folder = args.data or tempfile.mkdtemp(prefix="npydask-bench-remote-")
    scratch = tempfile.mkdtemp(prefix="npydask-bench-remote-index-")
    try:
        with CountingProxy(server.endpoint) as proxy:
            t0 = time.perf_counter()
            volumes, small = make_data(folder, size, DTYPE)
            t1 = time.perf_counter()
            upload(_obstore_store(server.bucket, server.storage_options()), volumes + small)
            vbytes = size.n_volumes * int(np.prod(size.volume_shape)) * DTYPE.itemsize
            print(
                f"# size={args.size}: {len(volumes)} volumes of {size.volume_shape} ({vbytes / MiB:g} MiB), ROI "
                f"{size.roi_shape} at {size.roi_start}; {len(small)} objects of {size.small_shape}; files in "
                f"{folder} ({t1 - t0:.1f} s), uploaded to SeaweedFS {server.endpoint} in "
                f"{time.perf_counter() - t1:.1f} s (started in {server.startup_seconds:.1f} s); "
                f"median of {args.repeat} runs",
                flush=True,
            )
            bench = Bench(args, size, server, proxy, volumes, small, scratch)
            if args.case == "cache":
                return _run_cache_case(args, bench)
            bench.run_all()
        print(
            f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores",
            flush=True,
        )
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)
    return 0 if bench.report() else 1


def _run_cache_case(args: Any, bench: Bench) -> int:
    """``--case cache``: the node cache's goals (:mod:`_remote_cache`), their table, their JSON."""
    from _remote_cache import CacheCase

    case = CacheCase(bench, clear_npydask_caches)
    case.run()
    case.report()
    _common.table([[g["goal"], g["measured"], g["target"], g["verdict"]] for g in case.goals],
                  ["goal", "measured", "target", "verdict"])  # fmt: skip
    _common.write_json(args.json, {"benchmark": "remote", "case": "cache", "size": args.size, "goals": case.goals,
                                   "rows": [[str(v) for v in r] for r in case.rows]})  # fmt: skip
    return 0 if case.wrong == 0 else 1


def _obstore_store(bucket: str, options: dict[str, Any]) -> Any:
    from obstore.store import S3Store

    return S3Store(bucket, **options)


class Bench:
    """The variants of R1-R4 against one server, their results and the report."""

    def __init__(
        self,
        args: Any,
        size: Size,
        server: SeaweedServer,
        proxy: CountingProxy,
        volumes: list[str],
        small: list[str],
        scratch: str,
    ) -> None:
        self.args, self.size, self.server, self.proxy = args, size, server, proxy
        self.volumes, self.small, self.scratch = volumes, small, scratch
        self.rows: list[Row] = []
        self.facts: dict[str, Any] = {}
        self.notes: list[str] = []
        self.proxy_mismatch = False
        self.direct = server.storage_options()
        self.proxied = {**self.direct, "endpoint": proxy.endpoint}
        self.store = _obstore_store(server.bucket, self.direct)
        self.proxied_store = _obstore_store(server.bucket, self.proxied)
        self.pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="bench-get")
        self.boto3 = server.boto3_client()
        self.vprefix = server.url(key_of(volumes[0]).rpartition("/")[0] + "/")
        self.sprefix = server.url(key_of(small[0]).rpartition("/")[0] + "/")
        params = inspect.signature(npydask.open_dataset).parameters
        self.headers_all: dict[str, Any] = {"headers": "all"} if "headers" in params else {}

    # -- timing ---------------------------------------------------------------------------------

    def time(
        self,
        group: str,
        name: str,
        fn: Callable[[], Any],
        nbytes: int,
        *,
        check: Callable[[Any], Any] | None = None,
        budget: float | None = None,
        note: str = "",
    ) -> Row:
        """Median of ``--repeat`` runs of ``fn`` (npydask's caches cleared before each), direct to the server."""
        times: list[float] = []
        cpu: list[float] = []
        server_cpu: list[float] = []
        value = None
        for i in range(max(1, self.args.repeat)):
            if i == 1 and budget is not None and times[0] * self.args.repeat > budget:
                note = (note + "; " if note else "") + f"run once ({times[0]:.1f} s)"
                break
            s0 = process_cpu(self.server.pid)
            t, value = _common.measure(fn, 1, setup=clear_npydask_caches, cpu=cpu)
            server_cpu.append(process_cpu(self.server.pid) - s0)
            times += t
        row = Row(group, name, times, cpu, server_cpu, nbytes, check(value) if check else None, note)
        self.rows.append(row)
        print(
            f"  {group:5s} {name:62s} {_common.fmt_seconds(row.median):>10s}  "
            f"cpu {_common.fmt_seconds(_common.median(cpu)):>10s}",
            flush=True,
        )
        return row

    def count(self, row: Row, fn: Callable[[], Any]) -> ProxyCounts:
        """Run ``fn`` once through the proxy (caches cleared) and keep its traffic on ``row``.

        A stack it returns must equal the one ``row``'s timed runs returned
        (which the report compares with numpy's).
        """
        clear_npydask_caches()
        self.proxy.reset()
        value = fn()
        row.traffic = self.proxy.reset()
        if isinstance(row.value, np.ndarray) and not np.array_equal(np.asarray(value), row.value):
            row.note = (row.note + "; " if row.note else "") + "MISMATCH: the run through the proxy read other data"
            self.proxy_mismatch = True
        return row.traffic

    # -- the peers' loops -----------------------------------------------------------------------

    def get_all(self, jobs: Sequence[tuple[str, int, int] | str], store: Any = None) -> list[Any]:
        """obstore GETs, :data:`IN_FLIGHT` at once: a key (whole object) or ``(key, start, stop)``.

        ``store`` defaults to the one straight to the server.
        """
        import obstore

        store = self.store if store is None else store

        def one(job: tuple[str, int, int] | str) -> Any:
            if isinstance(job, str):
                return obstore.get(store, job).bytes()
            key, start, stop = job
            return obstore.get(store, key, options={"range": (start, stop)}).bytes()

        return list(self.pool.map(one, jobs))

    def fetch(self, jobs: Sequence[tuple[str, int, int] | str], paths: Sequence[str]) -> Callable[[], int]:
        """A floor: :meth:`get_all` of ``jobs``, bytes only, checked to add up to the files at ``paths``."""
        expected = sum(os.path.getsize(p) for p in paths)

        def run() -> int:
            got = sum(len(b) for b in self.get_all(jobs))
            if got != expected:
                raise RuntimeError(f"the GET loop got {got} bytes, expected {expected}")
            return got

        return run

    def boto3_sum(self, paths: Sequence[str]) -> float:
        """The sequential peer: ``get_object``, ``np.load``, sum, one object after another."""
        return float(sum(self.boto3_load(p).sum(dtype=np.float64) for p in paths))

    def boto3_load(self, path: str) -> np.ndarray:
        body = self.boto3.get_object(Bucket=self.server.bucket, Key=key_of(path))["Body"].read()
        return np.load(io.BytesIO(body))

    # -- the groups -----------------------------------------------------------------------------

    def run_all(self) -> None:
        da.ones((4, 4), chunks=2).sum().compute()  # (dask's first compute pays for its pool)
        for options in (self.direct, self.proxied):  # (npydask's stores built once, as the peers' are)
            npydask.open_dataset(self.vprefix, storage_options=options)
        for store in (self.store, self.proxied_store):
            self.get_all([key_of(p) for p in self.volumes[:2]], store)
        self.boto3_load(self.volumes[0])
        only = set(self.args.only.split(","))
        for name, run in (("roi", self.roi), ("sum", self.throughput), ("small", self.many_small)):
            if name in only:
                run()
        if _peers.has("ray"):
            self.notes.append("Ray installed, but its read_numpy over s3:// is not wired in here yet")
        else:
            self.notes.append("Ray Data read_numpy: not installed here, skipped (it downloads whole objects)")
        self.pool.shutdown()

    def roi(self) -> None:
        size = self.size
        roi = tuple(slice(a, a + n) for a, n in zip(size.roi_start, size.roi_shape))
        kw = dict(roi_start=list(size.roi_start), roi_shape=list(size.roi_shape))
        nbytes = len(self.volumes) * int(np.prod(size.roi_shape)) * DTYPE.itemsize
        self.oracle_roi = np.stack([np.array(np.load(p, mmap_mode="r")[roi]) for p in self.volumes])
        span, per_volume = plane_spans(size.volume_shape, size.roi_shape, DTYPE.itemsize)
        self.facts["roi per-plane span bytes"] = span
        self.facts["roi spans bytes (all volumes)"] = per_volume * len(self.volumes)
        keys = [key_of(p) for p in self.volumes]

        def peers_way(store: Any = None) -> np.ndarray:
            return np.stack([np.array(np.load(io.BytesIO(b))[roi]) for b in self.get_all(keys, store)])

        def npydask_roi(options: dict[str, Any]) -> np.ndarray:
            return npydask.open_dataset(self.vprefix, storage_options=options, **kw).stack().compute()

        ref = self.time(
            "roi",
            "peers' way: obstore whole GETs (64 in flight), np.load, slice",
            peers_way,
            nbytes,
            check=np.asarray,
            note="reference; what DALI and Ray do",
        )
        self.count(ref, lambda: peers_way(self.proxied_store))
        row = self.time(
            "roi",
            "npydask: open_dataset(roi).stack().compute()",
            lambda: npydask_roi(self.direct),
            nbytes,
            check=np.asarray,
        )
        self.count(row, lambda: npydask_roi(self.proxied))
        plane_gets = [
            (key, start, start + span)
            for p, key in zip(self.volumes, keys)
            for start in roi_plane_offsets(p, size.volume_shape, size.roi_start, size.roi_shape)
        ]

        for (key, start, stop), got in zip(plane_gets, self.get_all(plane_gets)):  # (the offsets, checked once)
            with open(os.path.join(os.path.dirname(self.volumes[0]), key.rpartition("/")[2]), "rb") as f:
                if os.pread(f.fileno(), stop - start, start) != bytes(got):
                    raise RuntimeError(f"{key}: the per-plane span at byte {start} differs from the local file's")

        def raw_spans() -> int:
            return sum(len(b) for b in self.get_all(plane_gets))

        row = self.time(
            "roi",
            "raw: obstore range GETs of the per-plane spans (64 in flight)",
            raw_spans,
            nbytes,
            note="npydask's requests without npydask",
        )
        self.count(row, lambda: self.get_all(plane_gets, self.proxied_store))
        ds = npydask.open_dataset(self.vprefix, storage_options=self.direct, **kw)
        self.time(
            "roi", "npydask: stack().compute() (opened before)", lambda: ds.stack().compute(), nbytes, check=np.asarray
        )
        self.time(
            "roi",
            "boto3 get_object + np.load + slice, sequential",
            lambda: np.stack([np.array(self.boto3_load(p)[roi]) for p in self.volumes]),
            nbytes,
            check=np.asarray,
            budget=self.args.slow_budget,
        )
        if self.args.link_mbit > 0:
            self.roi_over_link(peers_way, npydask_roi, nbytes)

    def roi_over_link(
        self, peers_way: Callable[[Any], np.ndarray], npydask_roi: Callable[[dict[str, Any]], np.ndarray], nbytes: int
    ) -> None:
        """R1's two ways again over an emulated link of ``--link-mbit`` (:mod:`_link`; no latency added).

        On loopback the server's CPU per request sets R1's time; over a link
        of a cloud VM's bandwidth the bytes do. The kernel's shaper paces the
        S3 port's responses where it can (root, ``tc``); elsewhere a pacing
        proxy does, whose own CPU per request makes npydask's many small
        reads look slower than they are.
        """
        mbit = self.args.link_mbit
        port = int(self.server.endpoint.rsplit(":", 1)[1])
        why = "--link-via proxy" if self.args.link_via == "proxy" else _link.cannot_shape()
        if why and self.args.link_via == "tc":
            raise SystemExit(f"--link-via tc: cannot shape loopback here: {why}")
        with contextlib.ExitStack() as stack:
            if why is None:
                how = stack.enter_context(_link.shaped_port(port, mbit))
                options = self.direct
                store = self.store
            else:
                proxy = stack.enter_context(CountingProxy(self.server.endpoint, rate=mbit * 1e6 / 8))
                how = f"{mbit:g} Mbit/s by a pacing proxy (tc shaping unavailable: {why})"
                options = {**self.direct, "endpoint": proxy.endpoint}
                store = _obstore_store(self.server.bucket, options)
                self.get_all([key_of(self.volumes[0])], store)  # (connections and stores built, as elsewhere)
                npydask.open_dataset(self.vprefix, storage_options=options)
            self.facts["R1 link"] = how
            self.time(
                "roi",
                f"link {mbit:g} Mbit/s: peers' way (whole GETs, np.load, slice)",
                lambda: peers_way(store),
                nbytes,
                check=np.asarray,
                note="the whole-object way over the link",
            )
            self.time(
                "roi",
                f"link {mbit:g} Mbit/s: npydask open_dataset(roi).stack().compute()",
                lambda: npydask_roi(options),
                nbytes,
                check=np.asarray,
            )

    def throughput(self) -> None:
        nbytes = sum(int(np.prod(self.size.volume_shape)) * DTYPE.itemsize for _ in self.volumes)
        self.oracle_sum = numpy_sum(self.volumes)
        parts = [
            (key_of(p), a, min(a + PART_BYTES, n))
            for p in self.volumes
            for n in [os.path.getsize(p)]
            for a in range(0, n, PART_BYTES)
        ]
        self.time(
            "sum",
            "floor: obstore range GETs of 8 MiB (64 in flight), bytes only",
            self.fetch(parts, self.volumes),
            nbytes,
            note="reference",
        )
        self.time(
            "sum",
            "npydask: open_dataset().stack().sum().compute()",
            lambda: float(npydask.open_dataset(self.vprefix, storage_options=self.direct).stack().sum().compute()),
            nbytes,
            check=float,
        )
        self.time(
            "sum",
            "boto3 get_object + np.load + sum, sequential",
            lambda: self.boto3_sum(self.volumes),
            nbytes,
            check=float,
            budget=self.args.slow_budget,
        )

    def many_small(self) -> None:
        n = len(self.small)
        nbytes = n * int(np.prod(self.size.small_shape)) * DTYPE.itemsize
        self.oracle_small = numpy_sum(self.small)

        def opened(options: dict[str, Any], **kw: Any) -> Any:
            return npydask.open_dataset(self.sprefix, storage_options=options, **kw)

        self.time(
            "small",
            "floor: obstore whole GETs (64 in flight), bytes only",
            self.fetch([key_of(p) for p in self.small], self.small),
            nbytes,
            note="reference",
        )
        index = os.path.join(self.scratch, "index.json")
        try:
            opened(self.direct, index=index)  # built once, untimed
            with_index: dict[str, Any] | None = {"index": index}
        except Exception as e:  # noqa: BLE001 - reported in the table, not fatal
            with_index = None
            first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
            self.facts["index= over URLs"] = (
                f"n/a (index= over URLs not merged): opening with index= raised {type(e).__name__}: {first}"
            )
        all_kw = self.headers_all
        all_name = 'headers="all"' + ("" if all_kw else " (the default)")
        variants = [("open(index=)", with_index), (all_name, all_kw)]
        for label, kw in variants:
            if kw is None:
                self.rows.append(Row("small", f"npydask {label}: open+stack+sum", [], [], [], nbytes, note=NOT_MERGED))
                continue
            self.time(
                "small",
                f"npydask {label}: open+stack+sum",
                lambda kw=kw: float(opened(self.direct, **kw).stack().sum().compute()),
                nbytes,
                check=float,
            )
        self.time(
            "small",
            "boto3 get_object + np.load + sum, sequential",
            lambda: self.boto3_sum(self.small),
            nbytes,
            check=float,
            budget=self.args.slow_budget,
        )
        self.facts["small LIST pages expected"] = math.ceil(n / LIST_PAGE)
        for label, kw in variants:
            if kw is None:
                self.rows.append(
                    Row("open", f"npydask {label}: open_dataset alone", [], [], [], nbytes, note=NOT_MERGED)
                )
                continue
            row = self.time(
                "open", f"npydask {label}: open_dataset alone", lambda kw=kw: opened(self.direct, **kw), nbytes
            )
            self.count(row, lambda kw=kw: opened(self.proxied, **kw))

    # -- the report -----------------------------------------------------------------------------

    def reference(self, group: str) -> Row | None:
        return next((r for r in self.rows if r.group == group and "reference" in r.note), None)

    def find(self, group: str, start: str) -> Row | None:
        return next((r for r in self.rows if r.group == group and r.variant.startswith(start)), None)

    def report(self) -> bool:
        oracle = {
            "roi": getattr(self, "oracle_roi", None),
            "sum": getattr(self, "oracle_sum", None),
            "small": getattr(self, "oracle_small", None),
        }
        sane = not self.proxy_mismatch
        for r in self.rows:
            want = oracle.get(r.group)
            if r.value is None or want is None:
                continue
            if isinstance(want, np.ndarray):
                ok = r.value.shape == want.shape and r.value.dtype == want.dtype and np.array_equal(r.value, want)
                bad = f"MISMATCH: not equal to the numpy stack ({r.value.shape}, {r.value.dtype})"
            else:
                ok = bool(np.isclose(r.value, want, rtol=RTOL, atol=0))
                bad = f"MISMATCH {r.value!r} vs numpy's {want!r}"
            if not ok:
                sane = False
                r.note = (r.note + "; " if r.note else "") + bad

        rows = []
        for r in self.rows:
            if not r.times:
                rows.append([GROUPS[r.group].split()[0], r.variant, "n/a", "", "", "", "", "", r.note])
                continue
            ref = self.reference(r.group)
            ratio = f"{r.median / ref.median:.2f}x" if ref is not None and ref.median and r.group != "open" else ""
            rate = f"{r.nbytes / r.median / MiB:.0f}" if r.median and r.group != "open" else ""
            rows.append(
                [
                    GROUPS[r.group].split()[0],
                    r.variant,
                    f"{r.median * 1e3:.1f}",
                    rate,
                    ratio,
                    f"{min(r.times) * 1e3:.0f}-{max(r.times) * 1e3:.0f}",
                    f"{_common.median(r.cpu) * 1e3:.0f}",
                    f"{_common.median(r.server_cpu) * 1e3:.0f}",
                    r.note,
                ]
            )
        print()
        print(
            f"# ratio: to the group's reference; MiB/s: payload (or ROI) bytes / median; size={self.args.size}; "
            f"timed runs go straight to the server"
        )
        _common.table(
            rows, ["grp", "variant", "median ms", "MiB/s", "ratio", "min-max ms", "cpu ms", "server cpu ms", "note"]
        )

        spans = self.facts.get("roi spans bytes (all volumes)")
        traffic = []
        for r in self.rows:
            if r.traffic is None:
                continue
            t = r.traffic
            header_gets = t.count("GET") if r.group == "open" else ""
            vs = f"{t.downstream / spans:.2f}x" if r.group == "roi" and spans else ""
            traffic.append(
                [
                    GROUPS[r.group].split()[0],
                    r.variant,
                    f"{t.downstream:,}",
                    f"{t.upstream:,}",
                    vs,
                    t.count("LIST"),
                    t.count("GET"),
                    t.count("HEAD"),
                    header_gets,
                    sum(t.requests.values()) - t.count("LIST") - t.count("GET") - t.count("HEAD"),
                ]
            )
            if t.unframed:
                self.notes.append(f"{r.variant}: {t.unframed} connections not counted request by request")
        print()
        print(
            "# traffic: one run through the counting proxy; "
            f"per-plane span {self.facts.get('roi per-plane span bytes'):,}"
            f" bytes, all ROI spans {spans:,} bytes (from the first to the last ROI byte in each plane)"
        )
        _common.table(
            traffic,
            ["grp", "variant", "bytes down", "bytes up", "/ spans", "LIST", "GET", "HEAD", "header GETs", "other"],
        )

        goals = self.goals()
        print()
        _common.table(
            [[g["goal"], g["measured"], g["target"], g["verdict"]] for g in goals],
            ["goal", "measured", "target", "verdict"],
        )
        for k, v in self.facts.items():
            if isinstance(v, str):
                print(f"# {k}: {v}")
        for note in self.notes:
            print(f"# note: {note}")
        print(f"# ROI stacks equal numpy and sums agree within rtol {RTOL}: {'yes' if sane else 'NO'}")
        _common.write_json(
            self.args.json,
            {
                "benchmark": "remote",
                "size": self.args.size,
                "repeat": self.args.repeat,
                "facts": self.facts,
                "results": [
                    {
                        "group": r.group,
                        "variant": r.variant,
                        "median_s": r.median,
                        "times_s": r.times,
                        "cpu_s": r.cpu,
                        "server_cpu_s": r.server_cpu,
                        "nbytes": r.nbytes,
                        "note": r.note,
                        "value": r.value if isinstance(r.value, float) else None,
                        "traffic": None
                        if r.traffic is None
                        else {
                            "downstream": r.traffic.downstream,
                            "upstream": r.traffic.upstream,
                            "connections": r.traffic.connections,
                            "requests": r.traffic.requests,
                        },
                    }
                    for r in self.rows
                ],
                "goals": goals,
                "notes": self.notes,
                "results_agree": sane,
            },
        )
        return sane

    def goals(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def goal(
            text: str, measured: float | None, limit: float, *, at_least: bool = False, unit: str = "x", why: str = ""
        ) -> None:
            if measured is None:
                out.append(
                    {
                        "goal": text,
                        "measured": "n/a",
                        "why": why,
                        "target": "",
                        "verdict": "n/a",
                        "value": None,
                        "limit": limit,
                        "pass": None,
                    }
                )
                return
            ok = measured >= limit if at_least else measured <= limit
            out.append(
                {
                    "goal": text,
                    "measured": f"{measured:.2f}{unit}",
                    "target": f"{'>=' if at_least else '<='} {limit:g}{unit}",
                    "verdict": "PASS" if ok else "FAIL",
                    "value": measured,
                    "limit": limit,
                    "pass": ok,
                }
            )

        def ratio(a: Row | None, b: Row | None) -> float | None:
            return a.median / b.median if a and b and a.times and b.times and b.median else None

        index_na = self.facts.get("index= over URLs", "")
        roi, roi_ref = self.find("roi", "npydask: open_dataset"), self.reference("roi")
        spans = self.facts.get("roi spans bytes (all volumes)")
        goal(
            "R1 roi: bytes down / per-plane spans",
            roi.traffic.downstream / spans if roi and roi.traffic and spans else None,
            GOAL_ROI_BYTES,
        )
        mbit = self.args.link_mbit
        link_ratio = ratio(
            self.find("roi", f"link {mbit:g} Mbit/s: npydask"), self.find("roi", f"link {mbit:g} Mbit/s: peers' way")
        )
        goal(
            f"R1 roi over an emulated {GOAL_ROI_LINK_MBIT:g} Mbit/s link: npydask open+stack+compute / "
            "whole-object way",
            link_ratio if mbit == GOAL_ROI_LINK_MBIT else None,
            GOAL_ROI_LINK,
            why=f"run with --link-mbit {mbit:g}",
        )
        raw = self.find("roi", "raw: obstore range GETs")
        goal(
            "R1 roi, loopback: stack().compute() of a dataset opened before / raw per-plane range GETs",
            ratio(self.find("roi", "npydask: stack().compute() (opened before)"), raw),
            GOAL_ROI_OPENED,
        )
        goal(
            "R1 roi, loopback: npydask open+stack+compute / raw per-plane range GETs", ratio(roi, raw), GOAL_ROI_OPENING
        )
        s, s_ref = self.find("sum", "npydask"), self.reference("sum")
        goal("R2 sum: npydask MiB/s / range-GET floor MiB/s", ratio(s_ref, s), GOAL_SUM_RATE, at_least=True)
        ix, floor = self.find("small", "npydask open(index=)"), self.reference("small")
        boto3 = self.find("small", "boto3")
        goal("R3 small: npydask open(index=)+stack+sum / GET floor", ratio(ix, floor), GOAL_SMALL_FLOOR, why=index_na)
        goal(
            "R3 small: boto3 loop / npydask open(index=)+stack+sum (speed-up)",
            ratio(boto3, ix),
            GOAL_SMALL_BOTO3,
            at_least=True,
            why=index_na,
        )
        opened = self.find("open", "npydask open(index=)")
        goal(
            "R4 open: header GETs opening with index= reused",
            float(opened.traffic.count("GET") + opened.traffic.count("HEAD")) if opened and opened.traffic else None,
            0,
            unit="",
            why=index_na,
        )
        if opened and opened.traffic:
            goal(
                "R4 open: LIST pages opening with index= reused",
                float(opened.traffic.count("LIST")),
                self.facts["small LIST pages expected"],
                unit="",
            )
        hall = self.find("small", "npydask headers")
        for text, value in (
            ('(info) R3 small: npydask headers="all" / GET floor', ratio(hall, floor)),
            ('(info) R3 small: boto3 loop / npydask headers="all" (speed-up)', ratio(boto3, hall)),
            ("(info) R1 roi, loopback: npydask open+stack+compute / whole-object peers' way", ratio(roi, roi_ref)),
            ("(info) R1 roi: boto3 loop / npydask (speed-up)", ratio(self.find("roi", "boto3"), roi)),
            (
                f"(info) R1 roi over an emulated {mbit:g} Mbit/s link: npydask / whole-object way",
                link_ratio if mbit != GOAL_ROI_LINK_MBIT else None,
            ),
            ("(info) R2 sum: boto3 loop / npydask", ratio(self.find("sum", "boto3"), s)),
        ):
            if value is not None:
                out.append(
                    {
                        "goal": text,
                        "measured": f"{value:.2f}x",
                        "target": "",
                        "verdict": "info",
                        "value": value,
                        "limit": None,
                        "pass": None,
                    }
                )
        return out


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# total {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
