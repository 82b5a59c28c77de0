"""Scale: datasets of 10,000 to 1,000,000 small files, measured per file (issue 16's Scale goal).

For each file count ``N`` it measures what a dataset of ``N`` files costs the
client: ``open_dataset`` time, the memory held while the dataset is open,
``stack()``'s build time and the bytes of the graph a ``dask.distributed``
client sends, each divided by ``N`` too, so the table shows whether the
per-file cost stays flat as ``N`` grows.

Data: ``N`` files of 32x32 float32 (4,224 bytes each: a 128-byte version 1.0
header and 4 KiB of payload; element ``[0, 0]`` of file ``i`` is ``i``), made
once in ``--data DIR`` (default: a temp folder, removed at the end) under
``scale-N-32x32-f4/dNNNN/sNNNNNNN.npy``:

=======  ==============================  ==============================
size     file counts                     disk (about 8 KiB a file)
=======  ==============================  ==============================
tiny     500, 2,000                      20 MiB (the CI smoke test)
small    10,000, 100,000                 0.9 GiB
full     10,000, 100,000, 1,000,000      9 GiB
=======  ==============================  ==============================

The files sit in folders of 1,000: ``open_dataset(root)`` lists the files
directly in a root and in its immediate subfolders, as DALI's reader does,
so the set stays one DALI-readable dataset in DALI's order (zero-padded
names: byte-wise order is index order); no directory grows to a million
entries (a listing of 1,000 entries is one small ``getdents`` run, ext4's
hashed directories stay shallow, and a person can still ``ls`` a folder).
Each file is written with one ``os.open`` + ``os.write`` (header and payload
bytes built once, the index patched in) + ``os.close``: about 80 us a file on
the 2-core VM, against about 250 us for ``np.save``. A folder is marked done
(``.done``) once written and a set once complete (``.complete``), so an
interrupted run resumes where it stopped. Writing refuses to start unless
the disk keeps ``--min-free`` GiB (default 20) free after it, when the set is
over 1 GiB (otherwise twice its size).

Every measurement runs in a fresh child process (imports and a one-file
``open_dataset`` done before the baseline), so memory is the dataset's alone:

* ``open all`` / ``open first``: ``open_dataset(root)`` with
  ``headers="all"``, and with ``headers="first"`` where the installed
  npydask accepts it (checked with ``inspect.signature``; ``n/a``
  otherwise). Median of ``--repeat`` children (one child at 1,000,000 files).
  ``gc off``: ``"all"`` again with the cyclic garbage collector disabled
  during the open: the difference is what collecting the dataset's per-file
  objects costs (the collector walks every tracked tuple it has made so far).
* ``RSS B/file``: the child's resident set after the open, the dataset held,
  minus before it (after ``gc.collect()``), over ``N``; ``peak B/file`` the
  same with the kernel's high-water mark (``VmHWM``, the transient scan lists
  included).
* ``traced B/file``: the same held memory seen by ``tracemalloc`` (Python
  allocations only; in a child of its own, as tracing slows the open), with
  the allocation sites holding the most (printed for the largest ``N``).
* ``stack``: ``ds.stack()`` build time (median of ``--repeat`` builds in one
  child) with the threaded scheduler, and the local graph's pickle,
  ``len(pickle.dumps(dict(x.__dask_graph__()), protocol=5))``.
* ``stack (cluster)`` / ``sent B/file``: the same with a ``dask.distributed``
  client in the process (an in-process ``LocalCluster``, 1 worker, 2
  threads; npydask builds a different graph for a cluster), and the bytes
  ``Client.compute(x)`` sends the scheduler, computed as
  ``Client._graph_to_futures`` does: ``serialize(to_serialize(FinalizeCompute(
  collections_to_expr([x]))))``, header plus frames. That is the pickled
  graph of the goal.
* ``hdr floor``: a loop of ``os.open`` + ``os.fstat`` + ``os.pread(fd, 512,
  0)`` + ``os.close``, the system calls and pages an open with
  ``headers="all"`` reads, run right before each open until two passes
  agree within 10% (re-warming the pages: this VM pages out what is left
  unused for about a minute; see :func:`settled`); the last pass is timed,
  and the median over the opens is the open's floor. The whole-file floor
  settles the same way.
* ``floor``: a loop of ``os.open`` + ``os.pread(fd, 4224, 0)`` + ``os.close``
  over every file (this process; it also warms the page cache before the
  children run): what any reader of ``N`` files pays for the system calls.
  Its cost per file grows with ``N`` where the page cache and the kernel's
  inode and dentry caches no longer hold every file (1,000,000 files are
  about 8.5 GiB of page cache).

Three rows of every stacked array (first, middle, last file) are computed and
compared with ``numpy.load``; the exit status is 1 only when they disagree.

Goals (issue 16, at 1,000,000 files; at a smaller largest ``N`` the time
goals are scaled by ``N / 1,000,000`` and say so): open <= 15 s (``"all"``),
<= 3 s (``"first"``); <= 200 bytes of client memory per file; ``stack()``
< 1 s; the graph sent <= 100 bytes per file. A FAIL is reported, not fatal.

Usage::

    python benchmarks/bench_scale.py [--size tiny|small|full] [--repeat N] [--json out.json]
                                     [--data DIR] [--counts 10000,100000] [--min-free GIB]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

COUNTS = {"tiny": (500, 2_000), "small": (10_000, 100_000), "full": (10_000, 100_000, 1_000_000)}
SHAPE = (32, 32)
DTYPE = np.dtype("<f4")
PER_FOLDER = 1_000
GOAL_N = 1_000_000
GOAL_OPEN_ALL = 15.0  # seconds at GOAL_N files
GOAL_OPEN_FIRST = 3.0
GOAL_MEMORY = 200  # bytes per file
GOAL_STACK = 1.0  # seconds at GOAL_N files
GOAL_GRAPH = 100  # bytes per file
SITE_FRAMES = 3  # frames kept per traced allocation
ONCE_FROM = 1_000_000  # file counts from which each open is measured once
CHILD_TIMEOUT = 1800.0
GiB = 1 << 30
RESULT = "SCALE-PROBE-RESULT "


# ---------------------------------------------------------------------------------------------
# the data


@dataclass(frozen=True)
class FileSet:
    """``n`` files of ``SHAPE`` under ``root``, in folders of ``PER_FOLDER``, named so byte order is index order."""

    root: str
    n: int

    @property
    def folder_digits(self) -> int:
        return max(4, len(str(max(0, self.n - 1) // PER_FOLDER)))

    @property
    def file_digits(self) -> int:
        return max(7, len(str(max(0, self.n - 1))))

    def folder(self, f: int) -> str:
        return os.path.join(self.root, f"d{f:0{self.folder_digits}d}")

    def path(self, i: int) -> str:
        return os.path.join(self.folder(i // PER_FOLDER), f"s{i:0{self.file_digits}d}.npy")

    def paths(self) -> list[str]:
        return [self.path(i) for i in range(self.n)]


def file_set(data: str, n: int) -> FileSet:
    return FileSet(os.path.join(data, f"scale-{n}-{'x'.join(map(str, SHAPE))}-{DTYPE.str[1:]}"), n)


def npy_template() -> tuple[bytearray, int]:
    """The bytes of one file (version 1.0 header + payload) and where element ``[0, 0]`` starts."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": np.lib.format.dtype_to_descr(DTYPE), "fortran_order": False, "shape": SHAPE}
    )
    payload = np.random.default_rng(20261123).random(SHAPE, dtype=np.float32).astype(DTYPE)
    return bytearray(head.getvalue() + payload.tobytes()), len(head.getvalue())


def file_bytes() -> int:
    return len(npy_template()[0])


def check_disk(where: str, n_files: int, min_free_gib: float) -> None:
    """Refuse to write ``n_files`` files unless enough disk stays free (see the module docstring)."""
    need = n_files * (-(-file_bytes() // 4096) * 4096)
    free = shutil.disk_usage(where).free
    keep = min_free_gib * GiB if need > GiB else need
    if free - need < keep:
        raise SystemExit(
            f"{where}: writing {n_files} files needs about {need / GiB:.1f} GiB and {free / GiB:.1f} GiB are free; "
            f"this benchmark keeps {keep / GiB:.1f} GiB free: free some space, choose another --data "
            f"or lower --min-free"
        )


def make_files(fs: FileSet, min_free_gib: float) -> tuple[int, float]:
    """Write the files of ``fs`` that a previous run did not finish; (files written, seconds)."""
    marker = os.path.join(fs.root, ".complete")
    facts = {"n": fs.n, "shape": list(SHAPE), "dtype": DTYPE.str, "per_folder": PER_FOLDER}
    try:
        with open(marker, encoding="utf8") as f:
            if json.load(f) == facts:
                return 0, 0.0
    except (OSError, ValueError):
        pass
    os.makedirs(fs.root, exist_ok=True)
    folders = range(-(-fs.n // PER_FOLDER))
    todo = [f for f in folders if not os.path.exists(os.path.join(fs.folder(f), ".done"))]
    check_disk(fs.root, len(todo) * PER_FOLDER, min_free_gib)
    blob, at = npy_template()
    pack, open_, write, close = struct.pack_into, os.open, os.write, os.close
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    written = 0
    t0 = time.perf_counter()
    for f in todo:
        folder = fs.folder(f)
        os.makedirs(folder, exist_ok=True)
        for i in range(f * PER_FOLDER, min(fs.n, (f + 1) * PER_FOLDER)):
            pack("<f", blob, at, float(i))
            fd = open_(fs.path(i), flags, 0o644)
            try:
                if write(fd, blob) != len(blob):
                    raise OSError(f"{fs.path(i)}: short write")
            finally:
                close(fd)
            written += 1
        with open(os.path.join(folder, ".done"), "w", encoding="utf8") as out:
            out.write("written by benchmarks/bench_scale.py\n")
    with open(marker, "w", encoding="utf8") as out:
        json.dump(facts, out)
    return written, time.perf_counter() - t0


def raw_floor(paths: Sequence[str], nbytes: int) -> float:
    """Seconds of one ``os.open`` + ``os.pread(fd, nbytes, 0)`` + ``os.close`` loop over ``paths``."""
    open_, pread, close, flags = os.open, os.pread, os.close, os.O_RDONLY | os.O_CLOEXEC
    t0 = time.perf_counter()
    for p in paths:
        fd = open_(p, flags)
        try:
            if len(pread(fd, nbytes, 0)) != nbytes:
                raise OSError(f"{p}: short read")
        finally:
            close(fd)
    return time.perf_counter() - t0


HEADER_READ = 512  # bytes npydask's scan reads first (npydask.storage._batch.SCAN_READ)


def header_floor(paths: Sequence[str]) -> float:
    """Seconds of one ``os.open`` + ``os.fstat`` + ``os.pread(fd, 512, 0)`` + ``os.close`` loop over ``paths``.

    The system calls an open with ``headers="all"`` makes per file, and the
    pages it reads: run right before each open, it also re-warms them (at
    1,000,000 files this VM's page cache does not keep every file's two
    pages that the whole-file floor reads, but it keeps their first ones).
    """
    open_, fstat, pread, close, flags = os.open, os.fstat, os.pread, os.close, os.O_RDONLY | os.O_CLOEXEC
    t0 = time.perf_counter()
    for p in paths:
        fd = open_(p, flags)
        try:
            fstat(fd)
            pread(fd, HEADER_READ, 0)
        finally:
            close(fd)
    return time.perf_counter() - t0


SETTLE_PASSES = 6  # at most this many passes of a floor loop before a timed variant
SETTLE_WITHIN = 0.10  # until a pass is within 10% of the one before


def settled(loop: Callable[[], float]) -> tuple[float, int]:
    """Run ``loop`` (a floor pass; it returns its seconds) until two passes agree; the last time and the passes.

    This VM pages out memory left unused for about a minute (``kdamond``, a
    DAMON ``pageout`` scheme: regions aged 12 aggregation intervals of 5 s),
    page cache included. One pass over 1,000,000 files takes longer than
    that when the cache is cold, so its early files are gone again when it
    ends: passes repeat until the cache holds the set (each pass within 10%
    of the one before, or ``SETTLE_PASSES``).
    """
    last = loop()
    for passes in range(2, SETTLE_PASSES + 1):
        now = loop()
        if abs(now - last) <= SETTLE_WITHIN * last:
            return now, passes
        last = now
    return last, SETTLE_PASSES


# ---------------------------------------------------------------------------------------------
# the child processes


def _rss() -> int:
    """This process's resident set (bytes)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmHWM``), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    """Reset ``VmHWM`` to the current RSS (Linux 4.0+: write 5 to clear_refs); ignored where refused."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass


def accepts_headers() -> bool:
    """Whether the installed ``npydask.open_dataset`` takes ``headers=`` (issue 16's one-pass mode)."""
    import npydask

    return "headers" in inspect.signature(npydask.open_dataset).parameters


def _warm_npydask(fs: FileSet, kw: dict[str, Any]) -> None:
    """Import everything a first ``open_dataset`` imports, so the baseline holds it."""
    import npydask

    npydask.open_dataset(files=[fs.path(0)], **kw).stack().sum().compute()
    gc.collect()


def _site(tb: Any) -> str:
    """An allocation's place: its innermost frame in a file, after the generated code of named tuples (``<string>``)."""
    frames = [f for f in reversed(tb) if not f.filename.startswith("<")] or list(tb)
    inner = tb[-1] if tb[-1].filename.startswith("<") else None
    where = f"{_short(frames[0].filename)}:{frames[0].lineno}"
    return where + (" (a named tuple's __new__)" if inner is not None else "")


def _short(filename: str) -> str:
    parts = filename.split(os.sep)
    return os.sep.join(parts[-2:]) if "npydask" in parts else os.sep.join(parts[-3:])


def probe_open(fs: FileSet, headers: str | None, trace: bool, collect: bool = True) -> dict[str, Any]:
    """Open the dataset once; its time and the memory held while it is open (``collect=False``: no cyclic GC)."""
    import tracemalloc

    import npydask

    kw = {} if headers is None else {"headers": headers}
    _warm_npydask(fs, kw)
    rss0 = _rss()
    _reset_peak()
    if trace:
        tracemalloc.start(SITE_FRAMES)
        traced0 = tracemalloc.get_traced_memory()[0]
    if not collect:
        gc.disable()
    t0 = time.perf_counter()
    ds = npydask.open_dataset(fs.root, **kw)
    took = time.perf_counter() - t0
    gc.enable()
    gc.collect()
    out: dict[str, Any] = {"seconds": took, "files": len(ds)}
    if trace:
        out["traced"] = tracemalloc.get_traced_memory()[0] - traced0
        stats = tracemalloc.take_snapshot().statistics("traceback")
        tracemalloc.stop()
        out["sites"] = [(_site(s.traceback), s.size, s.count) for s in stats[:8]]
    else:
        out["rss"] = _rss() - rss0
        out["peak"] = max(0, _status("VmHWM") - rss0)
    del ds
    return out


def probe_stack(fs: FileSet, repeat: int, cluster: bool) -> dict[str, Any]:
    """Open (untimed), then build ``ds.stack()``; its time, graph bytes, and rows checked against numpy."""
    import dask

    import npydask

    client = None
    if cluster:
        from distributed import Client, LocalCluster

        client = Client(LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None))
    try:
        _warm_npydask(fs, {})
        ds = npydask.open_dataset(fs.root)
        gc.collect()
        rss0 = _rss()
        times = []
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            x = ds.stack()
            times.append(time.perf_counter() - t0)
        gc.collect()
        out: dict[str, Any] = {"seconds": times, "rss": _rss() - rss0, "chunks": len(x.chunks[0])}
        graph = dict(x.__dask_graph__())
        out["tasks"] = len(graph)
        out["pickled"] = len(pickle.dumps(graph, protocol=5))
        del graph
        out["sent"] = sent_bytes(x)
        bad = []
        for k in sorted({0, fs.n // 2, fs.n - 1}):
            got = x[k].compute(scheduler=None if cluster else dask.get)
            want = np.load(fs.path(k))
            if not (
                got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want) and got[0, 0] == k
            ):
                bad.append(k)
        out["mismatched_rows"] = bad
        return out
    finally:
        if client is not None:
            cluster_ = client.cluster
            client.close()
            cluster_.close()


def sent_bytes(x: Any) -> int:
    """The bytes ``Client.compute(x)`` sends the scheduler for ``x``'s graph (as ``Client._graph_to_futures``).

    The frames exactly; the small header dict (sent as msgpack) counted by its pickle.
    """
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr
    from distributed.protocol import serialize, to_serialize
    from distributed.utils import nbytes

    expr = FinalizeCompute(collections_to_expr([x], True))
    header, frames = serialize(to_serialize(expr), on_error="raise")
    return len(pickle.dumps(header, protocol=5)) + sum(nbytes(f) for f in frames)


def child_main(spec: dict[str, Any]) -> None:
    fs = FileSet(spec["root"], spec["n"])
    if spec["kind"] == "open":
        out = probe_open(fs, spec["headers"], spec["trace"], spec.get("gc", True))
    else:
        out = probe_stack(fs, spec["repeat"], spec["cluster"])
    print(RESULT + json.dumps(out), flush=True)


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one probe in a fresh interpreter; its result, or ``{"error": ...}``."""
    try:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"the child measuring {spec} ran over {CHILD_TIMEOUT:.0f} s and was stopped"}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-2000:]}"}


# ---------------------------------------------------------------------------------------------
# measuring and reporting


def measure_count(fs: FileSet, repeat: int, first_mode: bool) -> dict[str, Any]:
    """Every measurement of one file count (each probe in a child of its own)."""
    n = fs.n
    nbytes = file_bytes()
    paths = fs.paths()
    floor, floor_passes = settled(partial(raw_floor, paths, nbytes))  # (warms dentries, inodes and pages)
    opens = repeat if n < ONCE_FROM else 1
    row: dict[str, Any] = {"n": n, "root": fs.root, "floor_s": floor, "floor_passes": floor_passes, "open_runs": opens}
    modes = [("all", None, True), ("nogc", None, False)] + ([("first", "first", True)] if first_mode else [])
    header_floors: list[float] = []
    header_passes: list[int] = []
    for name, headers, collect in modes:
        runs = []
        for _ in range(opens):
            took, passes = settled(partial(header_floor, paths))  # the pages an open reads, re-read right before it
            header_floors.append(took)
            header_passes.append(passes)
            runs.append(
                run_child({"kind": "open", "root": fs.root, "n": n, "headers": headers, "trace": False, "gc": collect})
            )
        errors = [r["error"] for r in runs if "error" in r]
        if errors:
            row[f"open_{name}_error"] = errors[0]
            continue
        row[f"open_{name}_s"] = _common.median([r["seconds"] for r in runs])
        row[f"open_{name}_times"] = [r["seconds"] for r in runs]
        row[f"open_{name}_files"] = runs[0]["files"]
        row[f"rss_{name}"] = _common.median([r["rss"] for r in runs])
        row[f"peak_{name}"] = _common.median([r["peak"] for r in runs])
        print(
            f"  {n:>9,} files: open {name:5s} {_common.fmt_seconds(row[f'open_{name}_s']):>10s}  "
            f"held {row[f'rss_{name}'] / n:7.0f} B/file  (header floor just before: "
            f"{_common.fmt_seconds(header_floors[-1])} after {header_passes[-1]} passes)",
            flush=True,
        )
    row["header_floor_s"] = _common.median(header_floors)
    row["header_floor_passes"] = header_passes
    del paths
    traced = run_child({"kind": "open", "root": fs.root, "n": n, "headers": None, "trace": True})
    row["traced"] = traced.get("traced")
    row["sites"] = traced.get("sites", [])
    if "error" in traced:
        row["traced_error"] = traced["error"]
    for name, cluster in (("local", False), ("cluster", True)):
        got = run_child({"kind": "stack", "root": fs.root, "n": n, "repeat": repeat, "cluster": cluster})
        if "error" in got:
            row[f"stack_{name}_error"] = got["error"]
            continue
        row[f"stack_{name}_s"] = _common.median(got["seconds"])
        row[f"stack_{name}_times"] = got["seconds"]
        row[f"stack_{name}_rss"] = got["rss"]
        row[f"stack_{name}_tasks"] = got["tasks"]
        row[f"stack_{name}_chunks"] = got["chunks"]
        row[f"pickled_{name}"] = got["pickled"]
        row[f"sent_{name}"] = got["sent"]
        row[f"mismatched_{name}"] = got["mismatched_rows"]
        print(
            f"  {n:>9,} files: stack ({name}) {_common.fmt_seconds(row[f'stack_{name}_s']):>10s}  "
            f"graph {got['sent'] / n:7.1f} B/file through distributed's serialize ({got['tasks']} tasks)",
            flush=True,
        )
    return row


def _per(row: dict[str, Any], key: str, scale: float, fmt: str) -> str:
    v = row.get(key)
    return "n/a" if v is None else format(v / row["n"] * scale, fmt)


def report(rows: list[dict[str, Any]], first_mode: bool, args: Any) -> tuple[bool, list[dict[str, Any]]]:
    table = []
    for r in rows:
        table.append(
            [
                f"{r['n']:,}",
                f"{r['floor_s']:.2f}",
                _per(r, "floor_s", 1e6, ".1f"),
                f"{r['header_floor_s']:.2f}",
                _per(r, "header_floor_s", 1e6, ".1f"),
                "n/a" if "open_all_s" not in r else f"{r['open_all_s']:.2f}",
                _per(r, "open_all_s", 1e6, ".1f"),
                "n/a" if "open_all_s" not in r else f"{(r['open_all_s'] - r['header_floor_s']) / r['n'] * 1e6:.1f}",
                "n/a" if "open_nogc_s" not in r else f"{r['open_nogc_s']:.2f}",
                "n/a" if "open_first_s" not in r else f"{r['open_first_s']:.2f}",
                _per(r, "open_first_s", 1e6, ".1f"),
                _per(r, "rss_all", 1, ".0f"),
                _per(r, "peak_all", 1, ".0f"),
                _per(r, "traced", 1, ".0f"),
                "n/a" if "stack_local_s" not in r else f"{r['stack_local_s']:.3f}",
                _per(r, "stack_local_s", 1e6, ".2f"),
                "n/a" if "stack_cluster_s" not in r else f"{r['stack_cluster_s']:.3f}",
                _per(r, "pickled_local", 1, ".1f"),
                _per(r, "sent_cluster", 1, ".1f"),
                r.get("stack_local_tasks", "n/a"),
                r.get("stack_cluster_tasks", "n/a"),
            ]
        )
    print()
    print(
        "# per N: s = seconds (median), us/f = microseconds per file, B/f = bytes per file; floor = "
        "os.open+os.pread(4224)+os.close loop (whole files); hdr floor = os.open+os.fstat+os.pread(512)+os.close "
        "loop, run right before each open (re-warming the pages it reads); -hdr = open all minus hdr floor "
        "(npydask's own share); "
        "gc off = open all with the cyclic garbage collector off (what collecting per-file objects costs); "
        "held = RSS after open - before, dataset held; peak = VmHWM - before; traced = tracemalloc; "
        "pickled = pickle of the local graph; sent = bytes Client.compute sends (cluster graph)"
    )
    _common.table(
        table,
        [
            "files",
            "floor s",
            "us/f",
            "hdr floor s",
            "us/f",
            "open all s",
            "us/f",
            "-hdr us/f",
            "gc off s",
            "open first s",
            "us/f",
            "held B/f",
            "peak B/f",
            "traced B/f",
            "stack s",
            "us/f",
            "stack(cl) s",
            "pickled B/f",
            "sent B/f",
            "tasks",
            "tasks(cl)",
        ],
    )
    if not first_mode:
        print("# open first: n/a (this npydask's open_dataset has no headers= argument)")

    big = rows[-1]
    if big.get("sites"):
        print(f"\n# where the held memory goes at {big['n']:,} files (tracemalloc, top sites):")
        sites = [[site, f"{size / big['n']:.1f}", f"{count / big['n']:.2f}"] for site, size, count in big["sites"]]
        _common.table(sites, ["allocation site", "B/file", "blocks/file"])

    sane = (
        all(r.get(f"open_{m}_files", r["n"]) == r["n"] for r in rows for m in ("all", "nogc", "first"))
        and all(not r.get(f"mismatched_{c}") for r in rows for c in ("local", "cluster"))
        and not any(k.endswith("_error") for r in rows for k in r)
    )
    n = big["n"]
    scale = n / GOAL_N
    scaled = "" if n == GOAL_N else f" (at {n:,} files: target scaled by {scale:g})"

    def per_file(key: str) -> float | None:
        v = big.get(key)
        return None if v is None else v / n

    goals = [
        (f"open_dataset headers='all' s{scaled}", big.get("open_all_s"), GOAL_OPEN_ALL * scale, "s"),
        (f"open_dataset headers='first' s{scaled}", big.get("open_first_s"), GOAL_OPEN_FIRST * scale, "s"),
        ("client memory held, B/file (RSS)", per_file("rss_all"), GOAL_MEMORY, "B"),
        (f"stack() build s{scaled}", big.get("stack_local_s"), GOAL_STACK * scale, "s"),
        (f"stack() build s, cluster graph{scaled}", big.get("stack_cluster_s"), GOAL_STACK * scale, "s"),
        ("graph sent by Client.compute, B/file", per_file("sent_cluster"), GOAL_GRAPH, "B"),
    ]
    goal_rows, goal_json = [], []
    for text, got, limit, unit in goals:
        verdict = "n/a" if got is None else ("PASS" if got <= limit else "FAIL")
        goal_rows.append([text, "n/a" if got is None else f"{got:.3g} {unit}", f"<= {limit:.3g} {unit}", verdict])
        goal_json.append({"goal": text, "measured": got, "limit": limit, "pass": None if got is None else got <= limit})
    if len(rows) > 1:
        lo = rows[0]
        if "open_all_s" in lo and "open_all_s" in big:
            growth = ((big["open_all_s"] - big["header_floor_s"]) / n) / (
                (lo["open_all_s"] - lo["header_floor_s"]) / lo["n"]
            )
            goal_rows.append(
                [
                    f"(info) per-file open all minus header floor: {n:,} files / {lo['n']:,} files",
                    f"{growth:.2f}x",
                    "flat = 1x",
                    "info",
                ]
            )
            goal_json.append(
                {"goal": "per-file open all minus header floor growth", "measured": growth, "limit": None, "pass": None}
            )
        for key, what in (
            ("open_all_s", "open all"),
            ("rss_all", "held memory"),
            ("stack_local_s", "stack()"),
            ("sent_cluster", "graph sent"),
        ):
            if lo.get(key) and big.get(key):
                growth = (big[key] / n) / (lo[key] / lo["n"])
                goal_rows.append(
                    [f"(info) per-file {what}: {n:,} files / {lo['n']:,} files", f"{growth:.2f}x", "flat = 1x", "info"]
                )
                goal_json.append({"goal": f"per-file {what} growth", "measured": growth, "limit": None, "pass": None})
    print()
    _common.table(goal_rows, ["goal", "measured", "target", "verdict"])
    for r in rows:
        for k, v in r.items():
            if k.endswith("_error"):
                print(f"# {r['n']:,} files, {k}: {v}")
    print(f"# sampled rows of every stack equal numpy.load and every dataset has N files: {'yes' if sane else 'NO'}")
    return sane, goal_json


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.split("\n", 1)[0], default_size="small", default_repeat=3)
    ap.add_argument(
        "--data", metavar="DIR", help="keep the files here and reuse them (default: a temp folder, removed)"
    )
    ap.add_argument("--counts", help="comma-separated file counts instead of the size's (e.g. 10000,100000)")
    ap.add_argument(
        "--min-free",
        type=float,
        default=20.0,
        metavar="GIB",
        help="free disk (GiB) to keep when writing a set over 1 GiB (default 20)",
    )
    ap.add_argument("--make-only", action="store_true", help="write the files and stop")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # (one measurement, in a fresh process)
    args = ap.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return 0
    counts = [int(c) for c in args.counts.split(",")] if args.counts else list(COUNTS[args.size])
    if any(c < 1 for c in counts):
        raise SystemExit(f"--counts must be positive file counts, found {args.counts!r}")
    counts.sort()

    env = _common.environment()
    _common.print_environment(env)
    first_mode = accepts_headers()
    folder = args.data or tempfile.mkdtemp(prefix="npydask-bench-scale-")
    rows: list[dict[str, Any]] = []
    try:
        sets = []
        for n in counts:
            fs = file_set(folder, n)
            written, took = make_files(fs, args.min_free)
            made = "reused"
            if written:
                made = f"wrote {written:,} files in {took:.1f} s ({took / written * 1e6:.0f} us/file)"
            print(f"# {n:,} files of {SHAPE} {DTYPE.str} ({file_bytes()} bytes each) in {fs.root}: {made}", flush=True)
            sets.append(fs)
        if args.make_only:
            return 0
        print(
            f"# repeat {args.repeat} (opens at {ONCE_FROM:,} files and more: once); headers='first' "
            f"{'accepted' if first_mode else 'not accepted by this npydask: n/a'}",
            flush=True,
        )
        for fs in sets:
            rows.append(measure_count(fs, args.repeat, first_mode))
        print(
            f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores",
            flush=True,
        )
    finally:
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)
    sane, goals = report(rows, first_mode, args)
    _common.write_json(
        args.json,
        {
            "benchmark": "scale",
            "size": args.size,
            "repeat": args.repeat,
            "headers_first_accepted": first_mode,
            "file_bytes": file_bytes(),
            "results": rows,
            "goals": goals,
            "results_agree": sane,
        },
    )
    return 0 if sane else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# total {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
