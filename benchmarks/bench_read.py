"""Read throughput: npydask against numpy and dask over a set of files and one big file.

Data (built in a temp folder, or kept in ``--data DIR`` and reused):

=======  ==========================================  ================================
size     file set                                    big file
=======  ==========================================  ================================
tiny     4 files of 8x64x64 float32 (512 KiB)        (256, 64, 64) float32, 4 MiB
small    16 files of 32x256x256 float32 (128 MiB)    (1024, 256, 256) float32, 256 MiB
full     64 files of 64x256x256 float32 (1 GiB)      (4096, 256, 256) float32, 1 GiB
=======  ==========================================  ================================

Every variant sums all the data in float32 (``x.sum()``, as ``np.sum`` does
on float32) and the results are checked against each other (relative
tolerance 1e-3). The page cache is re-warmed (every file read with
``os.pread`` in 16 MiB blocks) right before each variant; each time is the
median of ``--repeat`` runs. npydask variants use dask's default threaded
scheduler (one thread per core).

File set (P1): ``floor`` is ``np.sum`` over arrays already in memory, one
file at a time, added up; then a ``np.load`` loop, dask's ``from_array`` over
``np.load(mmap_mode="r")`` (which copies each memmap at build), P1's two
routes: ``da.stack([npydask.from_npy(f) for f in files]).sum().compute()``
(the per-file route) with ``backend`` auto, pread and mmap (timed with the
build, and the build alone), and ``npydask.open_dataset(files=files).stack()
.sum().compute()`` (opening included).

Big file: the reference is a fresh ``np.load(mmap_mode="r")`` summed in
slabs (128 MiB; 1 MiB at ``tiny``) on 2 threads of a ``ThreadPoolExecutor``;
then ``npydask.from_npy(big, chunks=<slab size>)``: the build alone (and
with npydask's handle cache and header memo cleared first), the sum with the
build, and the sum of an already built array.

Both groups also time ``dask floor``: dask over the same data already in
memory, one chunk per file (or per slab), built beforehand. No dask-based
reader can beat it, so it shows how much of a ratio is dask's own scheduling.
The file set also times the graph's share of the build: the same 64 one-layer
graphs (``npydask.graph.build.chunk_array``, what ``from_npy`` builds) and the
stack over files opened beforehand. The two together are the least the
per-file route can take, printed as a ratio to the floor.

Goals (PASS/FAIL): P1, the per-file route's sum incl. build <= 1.25x floor
(the ``open_dataset`` route's ratio beside it, as info); big-file build <= 10
ms; big-file sum (incl. build) <= 1.1x the mmap slab sum. The
``cpu ms`` column is process CPU time (all threads): on a shared 2-core
machine the 2-thread variants lose their second core to other processes and
wall times jump, while CPU time stays put. The exit status is 1 only when the
sums disagree; a FAIL goal is reported, not fatal (so ``--size tiny`` serves
as a CI smoke test).

Usage::

    python benchmarks/bench_read.py [--size tiny|small|full] [--repeat N] [--json out.json] [--data DIR]
                                    [--only TEXT]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import dask  # noqa: E402
import dask.array as da  # noqa: E402
from _common import Result  # noqa: E402
from _datasets import sum_one_by_one  # noqa: E402

import npydask  # noqa: E402

MiB = 1 << 20


@dataclass(frozen=True)
class Size:
    n_files: int
    file_shape: tuple[int, ...]
    big_shape: tuple[int, ...]
    slab: int  # bytes per slab / chunk for the big file


SIZES = {
    "tiny": Size(4, (8, 64, 64), (256, 64, 64), 1 * MiB),
    "small": Size(16, (32, 256, 256), (1024, 256, 256), 128 * MiB),
    "full": Size(64, (64, 256, 256), (4096, 256, 256), 128 * MiB),
}
DTYPE = np.dtype("<f4")
RTOL = 1e-3
GOAL_SET = 1.25
PER_FILE = "npydask auto: build+sum"  # P1's per-file route: da.stack of from_npy, summed
OPEN_ROUTE = "npydask open_dataset(files=...).stack(): open+sum"  # P1's other route
GRAPH_ONLY = "graph floor: the 64 one-layer graphs alone, stacked (build)"
GOAL_BUILD_S = 0.010
GOAL_BIG = 1.1


# ---------------------------------------------------------------------------------------------
# data


def _has(path: str, shape: tuple[int, ...]) -> bool:
    try:
        h = npydask.read_header(path)
    except (OSError, ValueError):
        return False
    return h.shape == shape and h.dtype == DTYPE and not h.fortran_order


def _write(path: str, shape: tuple[int, ...], rng: np.random.Generator, slab: int = 64 * MiB) -> None:
    tmp = path + ".part"
    rows = max(1, slab // (int(np.prod(shape[1:])) * DTYPE.itemsize))
    with open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": DTYPE.str, "fortran_order": False, "shape": shape})
        for start in range(0, shape[0], rows):
            n = min(rows, shape[0] - start)
            rng.random((n,) + shape[1:], dtype=np.float32).tofile(f)
    os.replace(tmp, path)


def make_data(folder: str, size: Size) -> tuple[list[str], str]:
    """The file set and the big file under ``folder``, written only where missing or different."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(20260801)
    files = [os.path.join(folder, f"set-{i:03d}.npy") for i in range(size.n_files)]
    big = os.path.join(folder, "big.npy")
    made = 0
    for p in files:
        if not _has(p, size.file_shape):
            _write(p, size.file_shape, rng)
            made += 1
    if not _has(big, size.big_shape):
        _write(big, size.big_shape, rng)
        made += 1
    if made:
        os.sync()
    return files, big


# ---------------------------------------------------------------------------------------------
# bookkeeping


def clear_npydask_caches() -> None:
    """Forget npydask's open-file cache and header memo (a first build in a fresh process)."""
    from npydask.format import header
    from npydask.storage import clear_cache

    clear_cache()
    for name, value in vars(header).items():
        if "MEMO" in name.upper() and isinstance(value, dict):
            value.clear()


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.split("\n", 1)[0], default_size="small", default_repeat=5)
    ap.add_argument("--data", metavar="DIR", help="keep the data here and reuse it (default: a temp folder, removed)")
    ap.add_argument(
        "--only",
        default="",
        help="run only variants whose name contains this text, plus the two references (for profiling)",
    )
    args = ap.parse_args(argv)
    size = SIZES[args.size]
    repeat = args.repeat

    env = _common.environment()
    env["dask_scheduler"] = dask.config.get("scheduler", None) or "threads (default)"
    env["dask_num_workers"] = dask.config.get("num_workers", None) or os.cpu_count()
    _common.print_environment(env)

    folder = args.data or tempfile.mkdtemp(prefix="npydask-bench-read-")
    try:
        t0 = time.perf_counter()
        files, big = make_data(folder, size)
        set_bytes = sum(os.path.getsize(p) - npydask.read_header(p).data_offset for p in files)
        big_header = npydask.read_header(big)
        big_bytes = big_header.nbytes
        print(
            f"# size={args.size}: {len(files)} files of {size.file_shape} ({set_bytes / MiB:g} MiB), "
            f"big {size.big_shape} ({big_bytes / MiB:g} MiB), slab/chunk {size.slab // MiB} MiB; "
            f"data in {folder} ({time.perf_counter() - t0:.1f} s); median of {repeat} runs",
            flush=True,
        )
        results = run_all(args, size, files, big, set_bytes, big_bytes)
        print(
            f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
            f"on {os.cpu_count()} cores (other processes compete with the 2-thread variants)",
            flush=True,
        )
    finally:
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)

    ok = report(results, args, size)
    return 0 if ok else 1


def run_all(args: Any, size: Size, files: list[str], big: str, set_bytes: int, big_bytes: int) -> list[Result]:
    repeat = args.repeat
    results: list[Result] = []

    def want(name: str) -> bool:
        # the two references always run (every ratio needs them), and P1's routes together
        only = args.only.lower()
        return (
            only in name.lower()
            or name.startswith(("floor", "mmap slab sum"))
            or (name == OPEN_ROUTE and only in PER_FILE.lower())
        )

    def run(
        group: str,
        name: str,
        fn: Callable[[], Any],
        paths: list[str],
        nbytes: int,
        *,
        setup: Callable[[], Any] | None = None,
        note: str = "",
    ) -> Result | None:
        if not want(name):
            return None
        _common.warm_page_cache(paths)
        cpu: list[float] = []
        times, value = _common.measure(fn, repeat, setup=setup, cpu=cpu)
        scalar = float(value) if isinstance(value, (np.generic, np.ndarray, float, int)) else None
        del value  # a built dask array (build-only variants) is not computed
        r = Result(group, name, times, nbytes, scalar, note, cpu)
        results.append(r)
        rate = "" if scalar is None else f"{r.gbps:6.2f} GB/s"
        print(
            f"  {group:3s} {name:58s} {_common.fmt_seconds(r.median):>10s}  "
            f"cpu {_common.fmt_seconds(r.cpu_median):>10s}  "
            f"{rate}",
            flush=True,
        )
        return r

    # first dask compute of a process pays for imports and the thread pool: not part of any variant
    da.ones((4, 4), chunks=2).sum().compute()

    # ---- the file set ------------------------------------------------------------------------
    arrays = [np.load(p) for p in files]

    run("set", "floor: np.sum of in-memory arrays", lambda: sum_one_by_one(arrays), files, set_bytes, note="1 thread")
    # the best any dask-based reader can do: the same arrays already in memory, one chunk per file
    name = "dask floor: stack of in-memory arrays, sum (prebuilt)"
    if want(name):
        in_memory = da.stack([da.from_array(a, chunks=a.shape) for a in arrays])
        run("set", name, lambda: in_memory.sum().compute(), files, set_bytes, note="dask overhead only")
        del in_memory
    arrays.clear()  # free 1 GiB before the next variants

    def np_load_loop() -> np.float32:
        total = np.float32(0)
        for p in files:
            total += np.load(p).sum()
        return total

    run("set", "np.load loop + sum", np_load_loop, files, set_bytes, note="1 thread")

    def from_array_build() -> da.Array:
        return da.stack([da.from_array(np.load(p, mmap_mode="r")) for p in files])

    built: dict[str, da.Array] = {}

    def from_array_total() -> np.float32:
        return from_array_build().sum().compute()

    run(
        "set",
        "da.from_array(np.load(mmap)) stack: build",
        from_array_build,
        files,
        set_bytes,
        note="copies each memmap",
    )
    if want("da.from_array(np.load(mmap)) stack: compute"):
        built["from_array"] = from_array_build()
    run(
        "set",
        "da.from_array(np.load(mmap)) stack: compute",
        lambda: built["from_array"].sum().compute(),
        files,
        set_bytes,
        note="data already copied at build",
    )
    built.pop("from_array", None)
    run("set", "da.from_array(np.load(mmap)) stack: build+compute", from_array_total, files, set_bytes)

    # the graph's share of the per-file route's build: the same one-layer graphs over files opened beforehand
    name = GRAPH_ONLY
    if want(name):
        from npydask.array import NpyFileArray, resolve_chunks
        from npydask.graph.build import chunk_array
        from npydask.reader import FileRef

        sources = [NpyFileArray(FileRef.open(p, "auto")) for p in files]
        grids = [resolve_chunks("auto", src) for src in sources]
        meta = np.empty((0,) * len(size.file_shape), DTYPE)

        def graphs_only() -> da.Array:
            return da.stack([chunk_array(src, c, f"floor-{i}", meta) for i, (src, c) in enumerate(zip(sources, grids))])

        run("set", name, graphs_only, files, set_bytes, note="the graph's share of the build")
        del sources

    for backend in ("auto", "pread", "mmap"):

        def build(backend: str = backend) -> da.Array:
            return da.stack([npydask.from_npy(p, backend=backend) for p in files])

        def total(backend: str = backend) -> np.float32:
            return build(backend).sum().compute()

        run("set", f"npydask {backend}: build+sum", total, files, set_bytes)
        if want(f"npydask {backend}: sum (prebuilt)"):
            built[backend] = build()
        run("set", f"npydask {backend}: sum (prebuilt)", lambda b=backend: built[b].sum().compute(), files, set_bytes)
        built.pop(backend, None)
        run("set", f"npydask {backend}: build", build, files, set_bytes)
        if backend == "auto":
            run(
                "set",
                f"npydask {backend}: build, cold caches",
                build,
                files,
                set_bytes,
                setup=clear_npydask_caches,
                note="handle cache + memo cleared",
            )
            # P1's other route, beside the per-file one in the same run
            run(
                "set",
                OPEN_ROUTE,
                lambda: npydask.open_dataset(files=files).stack().sum().compute(),
                files,
                set_bytes,
                note="opening included",
            )

    # ---- the big file ------------------------------------------------------------------------
    row_bytes = int(np.prod(size.big_shape[1:])) * DTYPE.itemsize
    rows = max(1, size.slab // row_bytes)
    pool = ThreadPoolExecutor(2)
    try:

        def slab_sum() -> np.float32:
            m = np.load(big, mmap_mode="r")
            parts = list(pool.map(lambda s: m[s : s + rows].sum(), range(0, m.shape[0], rows)))
            return np.add.reduce(np.array(parts, dtype=np.float32))

        run(
            "big",
            f"mmap slab sum ({size.slab // MiB} MiB slabs, 2 threads)",
            slab_sum,
            [big],
            big_bytes,
            note="reference",
        )
    finally:
        pool.shutdown()

    def big_load() -> np.float32:
        return np.load(big).sum()

    run("big", "np.load + sum", big_load, [big], big_bytes, note="1 thread")

    chunks = f"{size.slab // MiB}MiB"
    name = f"dask floor: in-memory array, {chunks} chunks, sum (prebuilt)"
    if want(name):
        in_memory = da.from_array(np.load(big), chunks=(rows,) + size.big_shape[1:])
        run("big", name, lambda: in_memory.sum().compute(), [big], big_bytes, note="dask overhead only")
        del in_memory

    for backend in ("auto", "pread", "mmap"):

        def build_big(backend: str = backend) -> da.Array:
            return npydask.from_npy(big, chunks=chunks, backend=backend)

        run("big", f"npydask {backend}: build+sum", lambda b=backend: build_big(b).sum().compute(), [big], big_bytes)
        if want(f"npydask {backend}: sum (prebuilt)"):
            built[backend] = build_big()
        run("big", f"npydask {backend}: sum (prebuilt)", lambda b=backend: built[b].sum().compute(), [big], big_bytes)
        built.pop(backend, None)
        run("big", f"npydask {backend}: build", build_big, [big], big_bytes)
        if backend == "auto":
            run(
                "big",
                f"npydask {backend}: build, cold caches",
                build_big,
                [big],
                big_bytes,
                setup=clear_npydask_caches,
                note="handle cache + memo cleared",
            )
    return results


def report(results: list[Result], args: Any, size: Size) -> bool:
    by_name = {(r.group, r.variant): r for r in results}
    refs = {
        "set": next((r for r in results if r.group == "set" and r.variant.startswith("floor")), None),
        "big": next((r for r in results if r.group == "big" and r.variant.startswith("mmap slab sum")), None),
    }

    # sanity: every sum agrees with its group's reference
    sane = True
    for r in results:
        ref = refs[r.group]
        if r.value is None or ref is None or ref.value is None:
            continue
        if not np.isclose(r.value, ref.value, rtol=RTOL, atol=0):
            sane = False
            r.note = (r.note + "; " if r.note else "") + f"MISMATCH {r.value!r} vs {ref.value!r}"

    goals: list[tuple[str, Result | None, float, float, str]] = []  # (text, result, measured, limit, unit)

    def goal(text: str, key: tuple[str, str], value: Callable[[Result], float], limit: float, unit: str) -> None:
        r = by_name.get(key)
        goals.append((text, r, value(r) if r else float("nan"), limit, unit))

    set_ref, big_ref = refs["set"], refs["big"]
    if set_ref:
        goal(
            "P1 file set: da.stack of from_npy (auto), sum incl. build / floor",
            ("set", PER_FILE),
            lambda r: r.median / set_ref.median,
            GOAL_SET,
            "x",
        )
        route = by_name.get(("set", OPEN_ROUTE))
        if route:
            goals.append(
                (
                    "(info) P1 file set: open_dataset(files=...).stack(), sum incl. opening / floor",
                    None,
                    route.median / set_ref.median,
                    float("nan"),
                    "x",
                )
            )
    goal("big file: npydask auto build", ("big", "npydask auto: build"), lambda r: r.median, GOAL_BUILD_S, "s")
    if big_ref:
        goal(
            "big file: npydask auto sum incl. build / mmap slab sum",
            ("big", "npydask auto: build+sum"),
            lambda r: r.median / big_ref.median,
            GOAL_BIG,
            "x",
        )

    # what a dask-based reader can reach at best here: the same data already in memory
    for group, ref in refs.items():
        bound = next((r for r in results if r.group == group and r.variant.startswith("dask floor")), None)
        if ref and bound:
            goals.append(
                (
                    f"(info) {group}: dask over in-memory data / reference",
                    None,
                    bound.median / ref.median,
                    float("nan"),
                    "x",
                )
            )
            mine = by_name.get((group, "npydask auto: build+sum"))
            if mine:
                goals.append(
                    (
                        f"(info) {group}: npydask auto sum incl. build / dask over in-memory data",
                        None,
                        mine.median / bound.median,
                        float("nan"),
                        "x",
                    )
                )
            graphs = by_name.get((group, GRAPH_ONLY))
            if graphs:
                goals.append(
                    (
                        f"(info) {group}: least the per-file route takes (dask over in-memory data "
                        "+ the graphs' build) / reference",
                        None,
                        (bound.median + graphs.median) / ref.median,
                        float("nan"),
                        "x",
                    )
                )

    rows = []
    for r in results:
        ref = refs[r.group]
        ratio = f"{r.median / ref.median:.2f}x" if ref and ref.median else ""
        is_build_only = r.value is None
        rows.append(
            [
                r.group,
                r.variant,
                f"{r.median * 1e3:.2f}",
                "" if is_build_only else f"{r.gbps:.2f}",
                ratio,
                f"{min(r.times) * 1e3:.1f}-{max(r.times) * 1e3:.1f}",
                f"{r.cpu_median * 1e3:.0f}",
                r.note,
            ]
        )
    print()
    print(f"# ratio: to the floor (set) or to the mmap slab sum (big); GB = 1e9 bytes; size={args.size}")
    print("# cpu ms: median process CPU time (user + system, all threads) per run; less noisy than wall time")
    _common.table(rows, ["grp", "variant", "median ms", "GB/s", "ratio", "min-max ms", "cpu ms", "note"])

    print()
    grow = []
    all_pass = True
    for text, r, measured, limit, unit in goals:
        if text.startswith("(info)"):
            verdict = "info"
        elif r is None:
            verdict = "n/a"
        else:
            passed = measured <= limit
            all_pass &= passed
            verdict = "PASS" if passed else "FAIL"
        shown = f"{measured * 1e3:.2f} ms" if unit == "s" else f"{measured:.2f}x"
        want = "" if limit != limit else f"<= {limit * 1e3:.0f} ms" if unit == "s" else f"<= {limit:.2f}x"
        grow.append([text, shown, want, verdict])
    _common.table(grow, ["goal", "measured", "target", "verdict"])
    print(f"# sums agree within rtol {RTOL}: {'yes' if sane else 'NO'}")

    _common.write_json(
        args.json,
        {
            "benchmark": "read",
            "size": args.size,
            "repeat": args.repeat,
            "results": [
                {
                    "group": r.group,
                    "variant": r.variant,
                    "median_s": r.median,
                    "times_s": r.times,
                    "nbytes": r.nbytes,
                    "cpu_median_s": r.cpu_median,
                    "cpu_s": r.cpu,
                    "gb_per_s": r.gbps,
                    "value": r.value,
                    "note": r.note,
                }
                for r in results
            ],
            "goals": [
                {
                    "goal": t,
                    "measured": m,
                    "limit": None if lim != lim else lim,
                    "unit": u,
                    "pass": (None if r is None else m <= lim),
                }
                for t, r, m, lim, u in goals
            ],
            "sums_agree": sane,
        },
    )
    return sane


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# total {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
