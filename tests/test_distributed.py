"""npydask on dask.distributed: results equal numpy on clusters of separate processes.

Every test that takes ``cluster`` (or ``client``) runs twice: on a
``LocalCluster`` of two single-threaded nanny-managed worker processes, and on
a scheduler and two workers started as separate processes with the ``dask``
command line (``dask scheduler --scheduler-file`` and ``dask worker
--scheduler-file``, with this folder on their ``PYTHONPATH`` as one deploys
code), reached with ``Client(scheduler_file=...)``. Each cluster starts once
per module and is torn down (process groups terminated, then killed) even
when a test fails. numpy is the oracle throughout, on real files.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest

import npydask
from npydask._buffers import pooled

distributed = pytest.importorskip("distributed")

TESTS = str(Path(__file__).resolve().parent)
BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
N_WORKERS = 2
CLUSTER_TIMEOUT = 60


# ---------------------------------------------------------------------------------------------
# clusters


def _dask_command(*args: str) -> list[str]:
    """The ``dask`` command line of this interpreter's environment."""
    exe = shutil.which("dask", path=os.path.dirname(sys.executable))
    return [exe, *args] if exe else [sys.executable, "-m", "dask", *args]


class CliCluster:
    """A scheduler and workers started as separate processes with the ``dask`` command line.

    Each process leads its own process group (a nanny and its worker), so
    :meth:`close` ends exactly what was started here, even after a failure.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.scheduler_file = str(folder / "scheduler.json")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = self.folder / f"{name}-{len(self.procs)}.log"
        # the graphs name this module's helpers (pickled by reference): deploy it as one deploys code
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, cwd=self.folder, env=env, start_new_session=True
            )
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def start_scheduler(self) -> None:
        self._spawn(
            "scheduler",
            _dask_command(
                "scheduler",
                "--scheduler-file",
                self.scheduler_file,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                ":0",
                "--idle-timeout",
                "600",
            ),
        )
        deadline = time.monotonic() + CLUSTER_TIMEOUT
        while not os.path.exists(self.scheduler_file):
            if self.procs[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the dask scheduler did not start:\n{self.tail()}")
            time.sleep(0.1)

    def start_worker(self) -> subprocess.Popen[bytes]:
        """One nanny-managed worker process with one thread."""
        return self._spawn(
            "worker",
            _dask_command(
                "worker",
                "--scheduler-file",
                self.scheduler_file,
                "--nthreads",
                "1",
                "--nworkers",
                "1",
                "--nanny",
                "--dashboard-address",
                ":0",
                "--local-directory",
                str(self.folder),
                "--death-timeout",
                "60",
            ),
        )

    def tail(self, n: int = 3000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-n:]}" for p in self.logs if p.exists())

    def close(self) -> None:
        """Terminate every process group started here (workers first), killing what lingers."""
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group: a nanny's worker too
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


@dataclass
class Cluster:
    kind: str  # "local" or "cli"
    client: Any
    cli: CliCluster | None = None

    def worker_pids(self) -> dict[str, int]:
        """Each worker's address and process id (of the worker, not of its nanny)."""
        return self.client.run(os.getpid)


@pytest.fixture(scope="module", params=["local", "cli"])
def cluster(request, tmp_path_factory):
    """A LocalCluster of processes, then a command-line cluster; each lives for the module."""
    from distributed import Client, LocalCluster

    if request.param == "local":
        with (
            LocalCluster(
                n_workers=N_WORKERS, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=50
            ) as lc,
            Client(lc) as c,
        ):
            c.wait_for_workers(N_WORKERS, timeout=CLUSTER_TIMEOUT)
            yield Cluster("local", c)
        return
    cli = CliCluster(tmp_path_factory.mktemp("cli-cluster"))
    try:
        cli.start_scheduler()
        for _ in range(N_WORKERS):
            cli.start_worker()
        with Client(scheduler_file=cli.scheduler_file, timeout=CLUSTER_TIMEOUT) as c:
            try:
                c.wait_for_workers(N_WORKERS, timeout=CLUSTER_TIMEOUT)
            except Exception as e:
                raise RuntimeError(f"dask workers did not join:\n{cli.tail()}") from e
            yield Cluster("cli", c, cli)
    finally:
        cli.close()


@pytest.fixture
def client(cluster):
    """The cluster's client; every test leaves the cluster with all its workers."""
    yield cluster.client
    cluster.client.wait_for_workers(N_WORKERS, timeout=CLUSTER_TIMEOUT)


def nblocks(x) -> int:
    """Chunks of a dask array (``npartitions`` is missing under array query planning)."""
    return math.prod(x.numblocks)


def compute(client, *xs):
    """Compute on the cluster (never the local threads), returning numpy values."""
    futures = client.compute(list(xs))
    return client.gather(futures)


# ---------------------------------------------------------------------------------------------
# oracle helpers


def roi_oracle(a: np.ndarray, start, stop, fill) -> np.ndarray:
    """``a[start:stop]`` where cells outside ``a`` are ``fill`` (numpy's view of DALI's "pad")."""
    out = np.full([b - s for s, b in zip(start, stop)], fill, dtype=a.dtype)
    src = tuple(slice(max(s, 0), min(b, n)) for s, b, n in zip(start, stop, a.shape))
    dst = tuple(slice(max(s, 0) - s, min(b, n) - s) for s, b, n in zip(start, stop, a.shape))
    if all(d.start < d.stop for d in dst):
        out[dst] = a[src]
    return out


def write_folder(root: Path, arrays: list[np.ndarray], orders: list[str] | None = None) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, a in enumerate(arrays):
        p = root / f"f{i:04d}.npy"
        np.save(p, np.array(a, order=(orders[i % len(orders)] if orders else "C")))
        paths.append(str(p))
    return paths


def ownership(block: np.ndarray) -> tuple[bool, str]:
    """Whether ``block`` ends in memory of its own (an owning ndarray, or a pooled buffer), and what it ends in."""
    o: Any = block
    last = block
    while isinstance(o, np.ndarray):
        last, o = o, o.base
    if pooled(block):
        return True, "PooledBuffer"
    return (o is None and last.flags.owndata), type(o).__name__


def _owns_block(block: np.ndarray) -> np.ndarray:
    owns, _ = ownership(block)
    return np.full((1,) * block.ndim, owns)


def _slow_copy(block: np.ndarray) -> np.ndarray:
    time.sleep(0.2)
    return block + 1


# ---------------------------------------------------------------------------------------------
# equal to numpy


@pytest.mark.timeout(120)
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("backend", ["auto", "mmap", "pread"])
def test_cluster_results_equal_numpy(client, save, order, backend):
    a = np.random.default_rng(1).standard_normal((40, 30, 20)).astype(">f4")
    p = save(a, order=order)
    x = npydask.from_npy(p, chunks=(7, 30, 9), backend=backend)
    got, total, roi = compute(client, x, x.astype("f8").sum(), x[5:25, 3, ::2])
    np.testing.assert_array_equal(got, a)
    assert got.dtype == np.load(p).dtype
    assert np.isclose(total, a.astype("f8").sum())
    np.testing.assert_array_equal(roi, a[5:25, 3, ::2])


ODD_CHUNKS = [(1, 3, 8), (5, 4, 3), 5, "auto", "256B", ((3, 9), (9,), (1, 7)), (12, 9, 8)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("order", ["C", "F"])
def test_odd_chunkings_equal_numpy(client, save, order):
    a = np.arange(12 * 9 * 8, dtype="<i4").reshape(12, 9, 8)
    p = save(a, order=order)
    xs = [npydask.from_npy(p, chunks=c, backend=b) for b in ("auto", "mmap", "pread") for c in ODD_CHUNKS]
    assert max(nblocks(x) for x in xs) >= 36
    for x, got in zip(xs, compute(client, *xs)):
        np.testing.assert_array_equal(got, a, err_msg=f"chunks={x.chunks}")
        assert got.dtype == a.dtype


@pytest.mark.timeout(120)
@pytest.mark.parametrize("savez", [np.savez, np.savez_compressed], ids=["stored", "deflated"])
def test_npz_members_equal_numpy(client, tmp_path, savez):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((50, 16)).astype("<f8")
    b = np.asfortranarray(rng.integers(0, 1000, (12, 9, 5)).astype(">i2"))
    path = tmp_path / "arch.npz"
    savez(path, a=a, b=b)
    xa = npydask.from_npy(path, key="a")
    xa7 = npydask.from_npy(path, key="a", chunks=(7, 5))
    xb = npydask.from_npy(path, key="b", chunks=(5, 4, 5))
    got_a, got_a7, got_b, sub = compute(client, xa, xa7, xb, xb[2:9, 1:, 3])
    np.testing.assert_array_equal(got_a, a)
    np.testing.assert_array_equal(got_a7, a)
    np.testing.assert_array_equal(got_b, b)
    assert got_b.dtype == b.dtype
    np.testing.assert_array_equal(sub, b[2:9, 1:, 3])
    # a dataset of archives, one member each, with a ROI
    root = tmp_path / "archives"
    root.mkdir()
    members = [rng.standard_normal((10, 8)).astype("f4") for _ in range(5)]
    for i, m in enumerate(members):
        savez(root / f"{i}.npz", m=m, other=m[:1])
    ds = npydask.open_dataset(root, file_filter="*.npz", key="m", roi_start=[2, 1], roi_shape=[6, 5])
    (stacked,) = compute(client, ds.stack())
    np.testing.assert_array_equal(stacked, np.stack([m[2:8, 1:6] for m in members]))


@pytest.fixture
def volumes(tmp_path):
    """Six int16 volumes of one shape, C and Fortran order alternating."""
    rng = np.random.default_rng(3)
    arrays = [rng.integers(-500, 500, (10, 12, 14)).astype("<i2") for _ in range(6)]
    paths = write_folder(tmp_path / "vols", arrays, ["C", "F"])
    return str(tmp_path / "vols"), paths, arrays


@pytest.mark.timeout(120)
def test_dataset_rois_and_policies_equal_numpy(client, volumes):
    root, _, arrays = volumes
    pad = npydask.open_dataset(
        root, roi_start=[-2, 3, 5], roi_shape=[8, 12, 12], out_of_bounds_policy="pad", fill_value=10
    )
    trim = npydask.open_dataset(root, roi_start=[5, 8, -3], roi_end=[20, 12, 9], out_of_bounds_policy="trim_to_shape")
    inside = npydask.open_dataset(root, rel_roi_start=[0.1, 0.25, 0.5], rel_roi_shape=[0.5, 0.5, 0.25])
    got_pad, got_trim, got_inside, pad_sum = compute(
        client, pad.stack(), trim.stack(), inside.stack(), pad.stack().astype("i8").sum()
    )
    want_pad = np.stack([roi_oracle(a, (-2, 3, 5), (6, 15, 17), 10) for a in arrays])
    np.testing.assert_array_equal(got_pad, want_pad)
    assert got_pad.dtype == np.int16
    assert pad_sum == want_pad.astype("i8").sum()
    np.testing.assert_array_equal(got_trim, np.stack([a[5:, 8:, :9] for a in arrays]))
    np.testing.assert_array_equal(got_inside, np.stack([a[1:6, 3:9, 7:11] for a in arrays]))


@pytest.mark.timeout(120)
def test_dataset_shards_stack_concatenate_arrays_equal_numpy(client, volumes, tmp_path):
    root, _, arrays = volumes
    shards = [npydask.open_dataset(root, shard_id=k, num_shards=4) for k in range(4)]
    expected_ranges = [(6 * k // 4, 6 * (k + 1) // 4) for k in range(4)]
    got = compute(client, *(s.stack() for s in shards))
    for (a, b), g in zip(expected_ranges, got):
        np.testing.assert_array_equal(g, np.stack(arrays[a:b]))
    ds = npydask.open_dataset(root)
    stack, stack_chunked, joined, joined_ax2 = compute(
        client, ds.stack(), ds.stack(chunks=(4, 5, 12, 7)), ds.concatenate(), ds.concatenate(axis=2)
    )
    np.testing.assert_array_equal(stack, np.stack(arrays))
    np.testing.assert_array_equal(stack_chunked, np.stack(arrays))
    np.testing.assert_array_equal(joined, np.concatenate(arrays))
    np.testing.assert_array_equal(joined_ax2, np.concatenate(arrays, axis=2))
    for g, a in zip(compute(client, *ds.arrays()), arrays):
        np.testing.assert_array_equal(g, a)
    # slabs of different lengths, as from_npy_stack cannot read them
    slabs = [np.full((n, 3, 4), n, dtype="f8") for n in (1, 5, 2, 7)]
    write_folder(tmp_path / "slabs", slabs, ["F", "C"])
    (slab_join,) = compute(client, npydask.open_dataset(tmp_path / "slabs").concatenate(chunks=(3, 3, 2)))
    np.testing.assert_array_equal(slab_join, np.concatenate(slabs))


@pytest.mark.timeout(120)
def test_many_small_files_stack_in_few_tasks(client, tmp_path):
    rng = np.random.default_rng(4)
    arrays = [rng.integers(0, 100, (4, 5)).astype("<i4") for _ in range(600)]
    write_folder(tmp_path / "small", arrays)
    ds = npydask.open_dataset(tmp_path / "small")
    x = ds.stack()
    assert nblocks(x) <= 4, x.numblocks
    got, total = compute(client, x, x.sum())
    np.testing.assert_array_equal(got, np.stack(arrays))
    assert total == np.stack(arrays).sum()


@pytest.mark.timeout(120)
def test_stack_groups_larger_files_per_task_for_a_cluster(client, tmp_path):
    rng = np.random.default_rng(5)
    arrays = [rng.random((64, 1024), dtype=np.float32) for _ in range(16)]  # 256 KiB each
    write_folder(tmp_path / "medium", arrays)
    with dask.config.set({"array.chunk-size": "1MiB"}):
        on_cluster = npydask.open_dataset(tmp_path / "medium").stack()
        with dask.config.set(scheduler="threads"):
            local = npydask.open_dataset(tmp_path / "medium").stack()
    assert nblocks(local) == 16  # locally: one zero-copy chunk per file
    assert nblocks(on_cluster) == 4, on_cluster.chunks  # on the cluster: 1 MiB tasks of 4 whole files
    (got,) = compute(client, on_cluster)
    np.testing.assert_array_equal(got, np.stack(arrays))


# ---------------------------------------------------------------------------------------------
# what workers hold


@pytest.mark.timeout(120)
def test_chunks_on_workers_are_copies_not_mappings(client, save):
    p = save(np.arange(1000, dtype="f8").reshape(10, 100))
    x = npydask.from_npy(p, chunks=(2, 100))  # contiguous chunks: "auto" would map them locally

    flags = client.compute(x.map_blocks(lambda b: np.array([[b.flags.writeable]]), chunks=(1, 1)), sync=True)
    assert flags.all(), "chunks on a distributed worker must be writeable copies"


@pytest.mark.timeout(120)
def test_auto_chunks_own_their_memory_on_workers(client, tmp_path):
    """On a worker an "auto" chunk owns its memory; in the client the same chunk is a view of a mapping."""
    a = np.arange(64 * 1000, dtype="<f4").reshape(64, 1000)
    paths = write_folder(tmp_path / "own", [a, a + 1, a + 2])
    x = npydask.from_npy(paths[0], chunks=(16, 1000))  # whole contiguous chunks: mmap's case
    stacked = npydask.open_dataset(tmp_path / "own").stack()
    # control: locally, "auto" gives zero-copy views of the file mapping
    local = x.map_blocks(_owns_block, chunks=(1, 1), dtype=bool).compute(scheduler="sync")
    assert not local.any(), "the control failed: 'auto' no longer maps whole contiguous chunks locally"
    on_worker, on_worker_stacked = compute(
        client,
        x.map_blocks(_owns_block, chunks=(1, 1), dtype=bool),
        stacked.map_blocks(_owns_block, chunks=(1, 1, 1), dtype=bool),
    )
    assert on_worker.all() and on_worker_stacked.all(), "a worker task got a view of a mapping"

    # what the workers keep in memory after persist: no array viewing a mapping
    kept = client.persist([x, stacked])

    def held(dask_worker) -> list[tuple[bool, str]]:
        data = getattr(dask_worker.data, "fast", dask_worker.data)
        return [ownership(v) for v in list(data.values()) if isinstance(v, np.ndarray)]

    distributed.wait(kept)
    found = [r for rs in client.run(held).values() for r in rs]
    assert len(found) >= nblocks(x) + nblocks(stacked)
    assert all(o for o, _ in found), f"worker memory holds views: {found}"
    for got, want in zip(compute(client, *kept), (a, np.stack([a, a + 1, a + 2]))):
        np.testing.assert_array_equal(got, want)
    del kept


# ---------------------------------------------------------------------------------------------
# names, purity, failures


@pytest.mark.timeout(120)
def test_names_agree_between_client_and_workers(client, volumes, save):
    root, paths, _ = volumes
    p = save(np.arange(300.0).reshape(30, 10), order="F")

    def names(p: str, root: str) -> list[str]:
        # stack() plans for the scheduler it will run on (a cluster groups files differently),
        # so both sides plan for the same one: names must then agree byte for byte.
        with dask.config.set(scheduler="threads"):
            return [
                npydask.from_npy(p).name,
                npydask.from_npy(p, chunks=(7, 3), backend="pread").name,
                npydask.open_dataset(root, roi_start=[1, 2, 3], roi_shape=[4, 5, 6]).stack().name,
                npydask.open_dataset(root).concatenate(axis=1).name,
                npydask.open_dataset(root, shard_id=1, num_shards=2)[0].name,
            ]

    here = names(p, root)
    assert len(set(here)) == len(here)
    there = client.submit(names, p, root, pure=False).result()
    assert there == here
    # each worker process, not just one
    assert all(v == here for v in client.run(names, p, root).values())


@pytest.mark.timeout(120)
def test_tasks_are_pure_and_idempotent(client, volumes):
    root, _, arrays = volumes

    def build():
        ds = npydask.open_dataset(root, roi_start=[0, 2, 2], roi_shape=[10, 8, 8])
        x = ds.stack(chunks=(1, 5, 8, 8))
        return x, (x.astype("f8") ** 2).sum(axis=(1, 2))

    x1, y1 = build()
    x2, y2 = build()
    assert x1.name == x2.name and y1.name == y2.name
    assert x1.__dask_keys__() == x2.__dask_keys__()
    a1, r1 = compute(client, x1, y1)
    a2, r2 = compute(client, x2, y2)
    a3, r3 = compute(client, x1, y1)  # the very same graph again
    want = np.stack([a[:, 2:10, 2:10] for a in arrays])
    for a in (a1, a2, a3):
        np.testing.assert_array_equal(a, want)
    np.testing.assert_array_equal(r1, (want.astype("f8") ** 2).sum(axis=(1, 2)))
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_array_equal(r1, r3)


@pytest.mark.timeout(120)
def test_changed_file_fails_on_the_worker(client, save):
    p = save(np.arange(100.0))
    x = npydask.from_npy(p, chunks=10)
    np.save(p, np.arange(100.0) * 2)
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(npydask.FileChangedError, match=os.path.basename(p)):
        client.compute(x.sum(), sync=True)


@pytest.mark.timeout(180)
def test_worker_killed_mid_compute_still_equals_numpy(cluster, tmp_path):
    """SIGKILL one worker process while ~40 slow tasks run; its nanny restarts it and the result is right."""
    c = cluster.client
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((8, 32, 32)).astype("<f4") for _ in range(40)]
    write_folder(tmp_path / "kill", arrays, ["C", "C", "F"])
    x = npydask.open_dataset(tmp_path / "kill").stack(chunks=(1, 8, 32, 32))
    assert nblocks(x) == 40
    y = x.map_blocks(_slow_copy, dtype=x.dtype)  # ~0.2 s a chunk: ~4 s on two threads
    before = cluster.worker_pids()
    assert len(before) == N_WORKERS
    fut = c.compute(y)
    try:
        deadline = time.monotonic() + 30
        victim = None
        while victim is None and time.monotonic() < deadline:  # a worker running some of it
            busy = {a: ks for a, ks in c.processing().items() if ks}
            victim = next(iter(sorted(busy)), None) if busy else None
            time.sleep(0.05)
        assert victim is not None, "no worker ever started the slow tasks"
        time.sleep(0.8)  # let both workers finish a few chunks first, so some results die with it
        assert not fut.done(), "the compute ended before a worker could be killed: make it slower"
        os.kill(before[victim], signal.SIGKILL)
        got = fut.result(timeout=120)
    finally:
        fut.cancel()
    np.testing.assert_array_equal(got, np.stack(arrays) + 1)
    c.wait_for_workers(N_WORKERS, timeout=CLUSTER_TIMEOUT)
    after = cluster.worker_pids()
    assert before[victim] not in after.values(), "the killed worker is still registered"
    assert len(after) == N_WORKERS
    # the restarted cluster computes the same graph to the same values
    total = c.compute(x.astype("f8").sum(), sync=True)
    assert np.isclose(total, np.stack(arrays).astype("f8").sum(), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# the P5 benchmark stays runnable


@pytest.mark.timeout(240)
def test_cluster_benchmark_runs_at_tiny_size(tmp_path):
    out_json = tmp_path / "out.json"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bench_cluster.py"),
            "--size",
            "tiny",
            "--repeat",
            "1",
            "--json",
            str(out_json),
            "--data",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "P5" in done.stdout and "goal" in done.stdout
    assert out_json.exists()


# ---------------------------------------------------------------------------------------------
# relative paths: the workers run in other folders (the command-line cluster's workers in their
# own, the LocalCluster's in the folder pytest started in), so a task must never depend on its cwd


def test_relative_paths_read_the_client_files_on_workers(client, tmp_path, monkeypatch, capsys):
    import json

    from npydask.cli import main

    data = tmp_path / "rel-data"
    (data / "vols" / "s").mkdir(parents=True)
    rng = np.random.default_rng(11)
    a = rng.standard_normal((6, 5)).astype(">f4")
    np.save(data / "a.npy", a)
    vols = {n: rng.integers(-1000, 1000, size=(3, 4)).astype("<i2") for n in ["0.npy", "1.npy", "s/2.npy", "s/3.npy"]}
    for n, v in vols.items():
        np.save(data / "vols" / n, v)
    np.savez(data / "pair.npz", x=np.arange(10), y=np.eye(3, dtype="<f8"))
    monkeypatch.chdir(data)
    assert str(data) not in client.run(os.getcwd).values()  # the precondition: workers are elsewhere

    x = npydask.from_npy("a.npy", chunks=(2, 5))
    ds = npydask.open_dataset("vols")
    listed = npydask.open_dataset(files=["vols/s/3.npy", "vols/0.npy"])
    member = npydask.from_npy("pair.npz", key="y")
    got = compute(client, x, ds.stack(), ds[2], listed.stack(), member)
    assert ds.files == [os.path.join(str(data / "vols"), n) for n in vols]
    np.testing.assert_array_equal(got[0], a)
    np.testing.assert_array_equal(got[1], np.stack(list(vols.values())))
    np.testing.assert_array_equal(got[2], vols["s/2.npy"])
    np.testing.assert_array_equal(got[3], np.stack([vols["s/3.npy"], vols["0.npy"]]))
    np.testing.assert_array_equal(got[4], np.eye(3))

    client.compute(npydask.to_npy(x, "out.npy", compute=False)).result(timeout=120)
    np.testing.assert_array_equal(np.load(data / "out.npy"), a)
    if importlib.util.find_spec("zarr") is not None:
        import zarr

        client.compute(npydask.to_zarr(x, "out.zarr", compute=False)).result(timeout=120)
        np.testing.assert_array_equal(zarr.open_array(str(data / "out.zarr"), mode="r")[...], a)

    # the command line against that cluster, with paths relative to where it runs
    address = client.scheduler.address
    capsys.readouterr()
    assert main(["stats", "vols", "--json", "--scheduler", address]) == 0
    stats = json.loads(capsys.readouterr().out)
    every = np.stack(list(vols.values())).astype("f8")
    assert stats["count"] == every.size and (stats["min"], stats["max"]) == (every.min(), every.max())
    assert np.isclose(stats["mean"], every.mean()) and np.isclose(stats["std"], every.std())
    assert main(["convert", "a.npy", "c.npy", "--scheduler", address]) == 0
    np.testing.assert_array_equal(np.load(data / "c.npy"), a)
