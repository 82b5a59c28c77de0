"""P5 cluster: a dataset of volumes summed on dask.distributed against npydask on threads.

Data: ``bench_dataset.py``'s volumes, in its layout (a folder
``volumes-<n>x<shape>`` under ``--data DIR``, files ``vol-NN.npy``, written
only where missing, with the same generator), so ``--data`` can point at a
folder that benchmark already filled:

=======  =========================================
size     volumes (float32)
=======  =========================================
tiny     4 of 16x64x64 (1 MiB)
small    16 of 32x256x256 (128 MiB)
full     64 of 64x256x256 (1 GiB)
=======  =========================================

Reference: npydask on threads making the same copies a worker makes,
``npydask.open_dataset(root, backend="pread").stack().sum().compute()`` built and
run under ``dask.config.set(scheduler="threads")`` (so ``stack()`` plans for local
threads, not for the cluster whose client exists in this process; dask's threaded
scheduler, one thread per core), measured in the same run while the cluster is up
and idle. A worker's chunks must be copies it owns (``pread`` into its memory),
while on threads the default ``backend="auto"`` sums zero-copy views of mappings
it keeps: that variant is timed too, as info. On a ``LocalCluster(n_workers=2,
threads_per_worker=1, processes=True)``:

* ``npydask cluster: open+stack+sum``, ``open_dataset(root).stack().sum()``
  computed by the cluster's client (the goal, P5: <= 1.5x the reference), and
  with the dataset opened beforehand;
* ``npydask cluster: from_npy per file``: ``da.stack([npydask.from_npy(f)
  for f in files]).sum()``;
* ``dask floor cluster``: the same sum over the same chunks already in the
  workers' memory (``client.persist(stack())`` beforehand): dask.distributed's
  own cost for this reduction on this machine once no file is read (it also
  pays for the persisted keys, so at ``tiny`` size the goal variant can be
  faster). Its ratio to the reference is printed as P5's floor, and the goal
  variant's ratio to it as what reading the files adds;
* (info) ``stack(chunks=(k, *shape))`` with ``k`` files (about 64 MiB) per
  task, and ``backend="mmap"`` (zero-copy views on the workers too): what
  fewer tasks, and no copy, would buy;
* the best hand-rolled dask recipe: ``da.stack([da.from_delayed(
  dask.delayed(np.load)(f), shape, dtype) for f in files]).sum()`` (skipped
  under array query planning, which has no ``from_delayed``);
* ``da.stack([da.from_array(np.load(f, mmap_mode="r")) for f in
  files]).sum()``, which ships every memmap's bytes through the graph (run
  once when a run takes over ``--slow-budget`` seconds; ``--skip-slow``
  skips it).

For context, the numpy loop (``np.load`` + ``np.sum``, the oracle) and the
hand-rolled recipe on threads are timed too. Variants run round-robin (each
repeat runs every variant once, so a shared machine's load drifts over all of
them alike) and the page cache is re-warmed (every file read with
``os.pread``) right before each run; each time is the median of
``--repeat`` runs. Cluster start-up (workers joined, npydask imported on
them) is timed separately and is in no ratio. One more, untimed, run of the
goal variant (and of the grouped one and the recipe) is profiled: tasks, task
and CPU seconds per worker, transfers and bytes between workers.

Sums are float32 and must agree within a relative 1e-3 of numpy's; the exit
status is 1 only when they do not (a FAIL goal is reported, not fatal, so
``--size tiny`` serves as a CI smoke test).

Usage::

    python benchmarks/bench_cluster.py [--size tiny|small|full] [--repeat N] [--json out.json] [--data DIR]
                                       [--workers N] [--skip-slow] [--slow-budget S]
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import bench_dataset  # noqa: E402  (its data layout and generator)
import dask  # noqa: E402
import dask.array as da  # noqa: E402
from _common import Result  # noqa: E402
from _datasets import make_set  # noqa: E402

import npydask  # noqa: E402

MiB = 1 << 20
RTOL = 1e-3
GOAL_P5 = 1.5
REFERENCE = "npydask threads: open+stack+sum, backend='pread' (a worker's copies)"
ZERO_COPY = "npydask threads: open+stack+sum (auto: zero-copy mappings)"
GOAL_VARIANT = "npydask cluster: open+stack+sum"
FLOOR = "dask floor cluster: sum of the same chunks in worker memory"


def make_volumes(folder: str, size_name: str) -> list[str]:
    """The volumes of ``bench_dataset.py`` at ``size_name``, under ``folder``, written only where missing."""
    size = bench_dataset.SIZES[size_name]
    vshape = "x".join(map(str, (size.n_volumes, *size.volume_shape)))
    rng = np.random.default_rng(20260802)  # bench_dataset's seed; the volumes are its first set
    files, made = make_set(
        os.path.join(folder, f"volumes-{vshape}"), "vol", size.n_volumes, size.volume_shape, rng, bench_dataset.DTYPE
    )
    if made:
        os.sync()
    return files


def _query_planning() -> bool:
    return type(da.ones(1)).__module__.startswith("dask.array._array_expr")


def n_tasks(x: da.Array) -> int:
    return len(dict(x.__dask_graph__()))


def _import_npydask() -> str:
    import npydask as m

    return m.__version__


def _counters(dask_worker: Any) -> tuple[int, int, float]:
    """Transfers and bytes this worker sent to other workers so far, and its process CPU seconds."""
    return dask_worker.transfer_outgoing_count_total, dask_worker.transfer_outgoing_bytes_total, time.process_time()


def _on_threads(fn: Any) -> Any:
    """``fn`` with dask's scheduler set to threads while it builds and computes its graph."""

    def run() -> Any:
        with dask.config.set(scheduler="threads"):
            return fn()

    return run


def start_cluster(workers: int, threads: int) -> tuple[Any, Any, float]:
    """A LocalCluster of ``workers`` processes and its client; seconds until workers import npydask."""
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=threads,
        processes=True,
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    )
    client = Client(cluster)
    client.wait_for_workers(workers, timeout=120)
    client.run(_import_npydask)
    return cluster, client, time.perf_counter() - t0


def profile(client: Any, build: Callable[[], da.Array]) -> dict[str, Any]:
    """One untimed cluster run of ``build()``: tasks, where the workers' time went, bytes between workers."""
    from distributed import get_task_stream

    x = build()
    before = client.run(_counters)
    t0 = time.perf_counter()
    with get_task_stream(client=client) as ts:
        client.compute(x, sync=True)
    wall = time.perf_counter() - t0
    after = client.run(_counters)
    busy: dict[str, float] = {}
    moving: list[float] = []
    for rec in ts.data:
        for ss in rec.get("startstops", ()):
            if ss.get("action") == "compute":
                busy[rec["worker"]] = busy.get(rec["worker"], 0.0) + ss["stop"] - ss["start"]
            elif ss.get("action") == "transfer":
                moving.append(ss["stop"] - ss["start"])
    both = [w for w in after if w in before]
    return {
        "graph tasks": n_tasks(x),
        "tasks run": len(ts.data),
        "wall": f"{wall:.3f} s",
        "task s per worker": ", ".join(f"{v:.3f}" for v in sorted(busy.values())),
        "worker cpu s": ", ".join(f"{after[w][2] - before[w][2]:.3f}" for w in both),
        "transfers between workers": sum(after[w][0] - before[w][0] for w in both),
        "bytes between workers": sum(after[w][1] - before[w][1] for w in both),
        "median transfer": f"{_common.median(moving) * 1e3:.1f} ms" if moving else "-",
    }


def main(argv: list[str] | None = None) -> int:
    ap = _common.parser(__doc__.split("\n", 1)[0], default_size="small", default_repeat=5)
    ap.add_argument(
        "--data",
        metavar="DIR",
        help="keep the data here and reuse it (default: a temp folder, removed); "
        "bench_dataset.py's --data folder works",
    )
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2, one thread each)")
    ap.add_argument("--skip-slow", action="store_true", help="skip dask's from_array(np.load(mmap_mode='r')) stack")
    ap.add_argument(
        "--slow-budget",
        type=float,
        default=10.0,
        metavar="S",
        help="run a peer once only when its first run takes over S seconds (default 10)",
    )
    args = ap.parse_args(argv)

    env = _common.environment()
    env["workers"] = f"{args.workers} processes x 1 thread"
    env["threaded_num_workers"] = dask.config.get("num_workers", None) or os.cpu_count()
    _common.print_environment(env)

    folder = args.data or tempfile.mkdtemp(prefix="npydask-bench-cluster-")
    try:
        t0 = time.perf_counter()
        files = make_volumes(folder, args.size)
        size = bench_dataset.SIZES[args.size]
        nbytes = len(files) * int(np.prod(size.volume_shape)) * 4
        print(
            f"# size={args.size}: {len(files)} volumes of {size.volume_shape} float32 ({nbytes / MiB:g} MiB) in "
            f"{os.path.dirname(files[0])} ({time.perf_counter() - t0:.1f} s); median of {args.repeat} runs",
            flush=True,
        )
        results, facts = run_all(args, files, nbytes)
    finally:
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)
    ok = report(results, facts, args)
    return 0 if ok else 1


@dataclass
class Variant:
    where: str
    name: str
    fn: Callable[[], Any]
    note: str = ""
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    value: Any = None


def run_all(args: Any, files: list[str], nbytes: int) -> tuple[list[Result], dict[str, Any]]:
    root = os.path.dirname(files[0])
    facts: dict[str, Any] = {"array query planning": _query_planning()}
    header = npydask.read_header(files[0])
    shape, dtype = header.shape, header.dtype
    group = min(len(files), max(1, (64 * MiB) // (int(np.prod(shape)) * dtype.itemsize)))  # ~64 MiB a task

    def numpy_loop() -> np.float32:
        total = np.float32(0)
        for f in files:
            total += np.load(f).sum()
        return total

    def recipe() -> da.Array:
        return da.stack([da.from_delayed(dask.delayed(np.load)(f), shape, dtype) for f in files]).sum()

    try:
        recipe()
        has_recipe = True
    except NotImplementedError as e:  # dask's array query planning has no from_delayed (yet)
        has_recipe = False
        facts["recipe"] = f"skipped: {e}"

    def memmaps() -> da.Array:
        return da.stack([da.from_array(np.load(f, mmap_mode="r")) for f in files]).sum()

    def per_file() -> da.Array:
        return da.stack([npydask.from_npy(f) for f in files]).sum()

    # the first threaded compute of a process pays for imports and the pool: in no variant
    da.ones((4, 4), chunks=2).sum().compute(scheduler="threads")

    cluster, client, startup = start_cluster(args.workers, 1)
    facts["cluster start-up"] = f"{startup:.2f} s (LocalCluster, workers joined, npydask imported on them)"
    try:
        from distributed import wait

        ds = npydask.open_dataset(root)
        held = client.persist(ds.stack())  # (P5's floor: the data already on the workers)
        wait(held)
        variants = [
            Variant("numpy", "numpy loop: np.load + np.sum (oracle)", numpy_loop, "1 thread"),
            Variant(
                "threads",
                REFERENCE,
                _on_threads(lambda: npydask.open_dataset(root, backend="pread").stack().sum().compute()),
                "reference",
            ),
            Variant(
                "threads",
                ZERO_COPY,
                _on_threads(lambda: npydask.open_dataset(root).stack().sum().compute()),
                "info: no copies",
            ),
            Variant(
                "cluster",
                GOAL_VARIANT,
                lambda: client.compute(npydask.open_dataset(root).stack().sum(), sync=True),
                "goal",
            ),
            Variant(
                "cluster",
                "npydask cluster: stack+sum (opened before)",
                lambda: client.compute(ds.stack().sum(), sync=True),
            ),
            Variant("cluster", FLOOR, lambda: client.compute(held.sum(), sync=True), "persisted before: dask only"),
            Variant(
                "cluster", "npydask cluster: from_npy per file, stacked", lambda: client.compute(per_file(), sync=True)
            ),
            Variant(
                "cluster",
                f"npydask cluster: stack(chunks=({group}, *shape)), {group} files/task",
                lambda: client.compute(npydask.open_dataset(root).stack(chunks=(group, *shape)).sum(), sync=True),
                "info: fewer, larger tasks",
            ),
            Variant(
                "cluster",
                "npydask cluster: backend='mmap' (views on workers)",
                lambda: client.compute(npydask.open_dataset(root, backend="mmap").stack().sum(), sync=True),
                "info: no copy",
            ),
        ]
        if has_recipe:
            variants.insert(
                2,
                Variant(
                    "threads",
                    "dask recipe threads: from_delayed(np.load)",
                    lambda: recipe().compute(scheduler="threads"),
                ),
            )
            variants.append(
                Variant(
                    "cluster",
                    "dask recipe cluster: from_delayed(np.load)",
                    lambda: client.compute(recipe(), sync=True),
                    "best hand-rolled",
                )
            )
        # Round-robin: every repeat runs each variant once, so a shared machine's load drifts
        # over all of them alike; the page cache is re-warmed right before each run.
        for _ in range(max(1, args.repeat)):
            for v in variants:
                _common.warm_page_cache(files)
                times, v.value = _common.measure(v.fn, 1, cpu=v.cpu)
                v.times += times
        for v in variants:
            print(
                f"  {v.name:62s} {_common.fmt_seconds(_common.median(v.times)):>10s}  "
                f"cpu {_common.fmt_seconds(_common.median(v.cpu)):>10s}",
                flush=True,
            )
        if not args.skip_slow:
            slow = Variant(
                "cluster",
                "dask cluster: from_array(np.load(mmap_mode='r'))",
                lambda: client.compute(memmaps(), sync=True),
                "ships the bytes in the graph",
            )
            with warnings.catch_warnings():  # "Sending large graph": what this variant shows
                warnings.simplefilter("ignore", UserWarning)
                for k in range(max(1, args.repeat)):
                    _common.warm_page_cache(files)
                    times, slow.value = _common.measure(slow.fn, 1, cpu=slow.cpu)
                    slow.times += times
                    if k == 0 and args.repeat > 1 and times[0] * args.repeat > args.slow_budget:
                        slow.note += f"; run once ({times[0]:.1f} s)"
                        break
            print(f"  {slow.name:62s} {_common.fmt_seconds(_common.median(slow.times)):>10s}", flush=True)
            variants.append(slow)

        x = ds.stack()
        biggest = tuple(max(c) for c in x.chunks)  # (chunksize is missing under array query planning)
        facts["npydask stack chunks"] = (
            f"{int(np.prod(x.numblocks))} of {biggest} ({np.prod(biggest) * x.dtype.itemsize / MiB:g} MiB)"
        )
        facts["npydask stack().sum() tasks"] = n_tasks(x.sum())
        if has_recipe:
            facts["recipe tasks"] = n_tasks(recipe())
        _common.warm_page_cache(files)
        facts["profile (npydask cluster)"] = profile(client, lambda: npydask.open_dataset(root).stack().sum())
        _common.warm_page_cache(files)
        facts[f"profile (npydask cluster, {group} files/task)"] = profile(
            client, lambda: npydask.open_dataset(root).stack(chunks=(group, *shape)).sum()
        )
        if has_recipe:
            _common.warm_page_cache(files)
            facts["profile (recipe cluster)"] = profile(client, recipe)
    finally:
        held = None
        client.close()
        cluster.close()
    results = [Result(v.where, v.name, v.times, nbytes, float(v.value), v.note, v.cpu) for v in variants]
    return results, facts


def report(results: list[Result], facts: dict[str, Any], args: Any) -> bool:
    by_name = {r.variant: r for r in results}
    oracle = next(r for r in results if r.group == "numpy")
    ref = by_name.get(REFERENCE)
    sane = True
    for r in results:
        if r is oracle or r.value is None:
            continue
        if not np.isclose(r.value, oracle.value, rtol=RTOL, atol=0):
            sane = False
            r.note = (r.note + "; " if r.note else "") + f"MISMATCH {r.value!r} vs {oracle.value!r}"

    rows = []
    for r in results:
        ratio = f"{r.median / ref.median:.2f}x" if ref and ref.median else ""
        rows.append(
            [
                r.group,
                r.variant,
                f"{r.median * 1e3:.1f}",
                f"{r.nbytes / r.median / 1e9:.2f}" if r.median else "",
                ratio,
                f"{min(r.times) * 1e3:.0f}-{max(r.times) * 1e3:.0f}",
                f"{r.cpu_median * 1e3:.0f}",
                r.note,
            ]
        )
    print()
    print(
        f"# ratio: to {REFERENCE!r}; GB/s: payload bytes / median, 1e9; cpu ms: this process only "
        f"(cluster work runs in the workers); size={args.size}"
    )
    _common.table(rows, ["where", "variant", "median ms", "GB/s", "ratio", "min-max ms", "cpu ms", "note"])
    for k, v in facts.items():
        if isinstance(v, dict):
            print(f"# {k}: " + ", ".join(f"{a} = {b}" for a, b in v.items()))
        else:
            print(f"# {k}: {v}")

    goal = by_name.get(GOAL_VARIANT)
    measured = goal.median / ref.median if goal and ref and ref.median else float("nan")
    verdict = "n/a" if measured != measured else ("PASS" if measured <= GOAL_P5 else "FAIL")
    print()
    text = (
        f"P5 cluster: npydask open+stack+sum on {args.workers} worker processes / npydask threads making "
        "the same pread copies"
    )
    _common.table(
        [[text, f"{measured:.2f}x", f"<= {GOAL_P5:.2f}x", verdict]], ["goal", "measured", "target", "verdict"]
    )
    if goal and ref:
        print(
            f"# (info) best run against best run: {min(goal.times) / min(ref.times):.2f}x; on a shared machine "
            "the medians carry its load"
        )
    floor = by_name.get(FLOOR)
    if floor and ref and goal:
        print(
            f"# (info) P5's floor: dask's own sum of the same chunks already in worker memory / reference: "
            f"{floor.median / ref.median:.2f}x; npydask open+stack+sum / that floor: {goal.median / floor.median:.2f}x "
            "(what reading the files adds)"
        )
    zero_copy = by_name.get(ZERO_COPY)
    if zero_copy and goal:
        print(
            f"# (info) npydask open+stack+sum on the cluster / on threads summing zero-copy mappings: "
            f"{goal.median / zero_copy.median:.2f}x"
        )
    print(f"# sums agree with numpy within rtol {RTOL}: {'yes' if sane else 'NO'}")

    _common.write_json(
        args.json,
        {
            "benchmark": "cluster",
            "size": args.size,
            "repeat": args.repeat,
            "workers": args.workers,
            "facts": facts,
            "results": [
                {
                    "where": r.group,
                    "variant": r.variant,
                    "median_s": r.median,
                    "times_s": r.times,
                    "nbytes": r.nbytes,
                    "cpu_median_s": r.cpu_median,
                    "value": r.value,
                    "note": r.note,
                }
                for r in results
            ],
            "goals": [
                {
                    "goal": text,
                    "measured": measured,
                    "limit": GOAL_P5,
                    "pass": None if measured != measured else measured <= GOAL_P5,
                }
            ],
            "results_agree": sane,
        },
    )
    return sane


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# total {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
