"""P6 bounded memory: summing one large float32 file without holding it in anonymous memory.

Data: one C-ordered float32 ``.npy`` file (a cheap repeating pattern), made in
a temp folder (removed at the end) or kept in ``--data DIR`` and reused:

=======  =========  ==========================================================
size     payload    note
=======  =========  ==========================================================
tiny     16 MiB     the CI smoke test
small    512 MiB
full     4 GiB      or the largest multiple of 64 MiB that fits in a quarter of
                    the free disk space (``shutil.disk_usage``)
=======  =========  ==========================================================

Each variant runs in a fresh child process (clean baseline) that builds and
computes the sum, timing both together:

- ``npydask auto``: ``npydask.from_npy(p).sum().compute()``, dask's threaded
  scheduler (whole contiguous chunks are zero-copy views of a shared mapping);
- ``npydask pread``: the same with ``backend="pread"`` (each chunk is read
  into a fresh buffer);
- ``npydask mmap``: the same with ``backend="mmap"``;
- ``np.load``: ``np.load(p).sum()`` (the whole file in memory);
- ``dask from_array(mmap)``: ``da.from_array(np.load(p, mmap_mode="r")).sum()``.

While a child runs, this process samples ``/proc/<pid>/status`` every ~10 ms
(``RssAnon``: anonymous memory, what the process itself allocated, as page-cache
pages of a mapped file are ``RssFile`` and not its memory; and ``VmRSS``), and
a thread in the child samples its own ``RssAnon`` every ~2 ms during the run
(numpy releases the GIL while it reads and sums); the peak is the larger of
the two. The child also reports ``VmHWM`` (the kernel's peak total RSS) and
the ``RssAnon`` it had after its imports (the baseline). The page cache is warmed (the file read
with ``os.pread``) before every run.

Goal P6 (PASS/FAIL): the peak ``RssAnon`` of the npydask ``auto`` and
``pread`` variants stays within ``2 x chunk size x threads + 150 MiB``, with
chunk size dask's ``array.chunk-size`` (128 MiB by default) and threads
dask's thread count. The exit status is 1 only if a sum disagrees with a
float64 reference computed in 64 MiB slabs (relative tolerance 1e-3).

Usage::

    python benchmarks/bench_memory.py [--size tiny|small|full] [--repeat N] [--json out.json] [--data DIR]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

MiB = 1 << 20
SIZES = {"tiny": 16 * MiB, "small": 512 * MiB, "full": 4096 * MiB}
SLAB = 64 * MiB
DTYPE = np.dtype("<f4")
RTOL = 1e-3
ALLOWANCE = 150 * MiB
VARIANTS = ("npydask auto", "npydask pread", "npydask mmap", "np.load", "dask from_array(mmap)")
GOAL_VARIANTS = ("npydask auto", "npydask pread")
SAMPLE_S = 0.010


# ---------------------------------------------------------------------------------------------
# data


def payload_bytes(size: str, folder: str) -> tuple[int, str]:
    """The payload size for ``size``, capped at a quarter of the free disk space (a note says when)."""
    want = SIZES[size]
    free = shutil.disk_usage(folder).free
    cap = (free // 4) // SLAB * SLAB
    if want > cap:
        return max(cap, SLAB), f"capped from {want // MiB} MiB to a quarter of {free // MiB} MiB free"
    return want, ""


def _pattern(start: int, n: int) -> np.ndarray:
    """Element values ``start .. start + n``: a cheap repeating pattern, exact in float32."""
    return ((np.arange(start, start + n, dtype=np.int64) % 4093) * 0.25).astype(DTYPE)


def _header(path: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """numpy's reading of the header: shape, fortran_order, dtype and the payload offset."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        return shape, fortran, dtype, f.tell()


def make_file(path: str, nbytes: int) -> None:
    """Write the file unless one of the right shape is there."""
    n = nbytes // DTYPE.itemsize
    try:
        shape, fortran, dtype, _ = _header(path)
        if shape == (n,) and not fortran and dtype == DTYPE and os.path.getsize(path) >= n * DTYPE.itemsize:
            return
    except (OSError, ValueError):
        pass
    tmp = path + ".part"
    per = SLAB // DTYPE.itemsize
    with open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": DTYPE.str, "fortran_order": False, "shape": (n,)})
        for start in range(0, n, per):
            _pattern(start, min(per, n - start)).tofile(f)
    os.replace(tmp, path)


def reference_sum(path: str) -> float:
    """The float64 sum of the payload, read in 64 MiB slabs (this also warms the page cache)."""
    shape, _, _, offset = _header(path)
    total = 0.0
    n = shape[0]
    per = SLAB // DTYPE.itemsize
    for start in range(0, n, per):
        slab = np.fromfile(path, dtype=DTYPE, count=min(per, n - start), offset=offset + start * DTYPE.itemsize)
        total += float(slab.sum(dtype=np.float64))
    return total


# ---------------------------------------------------------------------------------------------
# the child: one variant, one run


def _status(pid: int | str = "self") -> dict[str, int]:
    """``/proc/<pid>/status`` memory fields in bytes."""
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out


class _Sampler:
    """A thread sampling this process's ``RssAnon`` every ~2 ms (numpy's reads and sums release the GIL)."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _status()["RssAnon"])
            self._stop.wait(0.002)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _status()["RssAnon"])


def child(variant: str, path: str) -> None:
    import dask
    import dask.array as da
    from dask.utils import parse_bytes

    import npydask

    threads = int(dask.config.get("num_workers", None) or dask.system.CPU_COUNT)
    chunk = int(parse_bytes(dask.config.get("array.chunk-size")))
    baseline = _status()["RssAnon"]
    sampler = _Sampler()
    t0 = time.perf_counter()
    data = None
    if variant.startswith("npydask"):
        backend = variant.split()[1]
        value = npydask.from_npy(path, backend=backend).sum().compute(scheduler="threads")
    elif variant == "np.load":
        data = np.load(path)  # kept until the peak is read: it is what this variant holds
        value = data.sum()
    elif variant == "dask from_array(mmap)":
        value = da.from_array(np.load(path, mmap_mode="r")).sum().compute(scheduler="threads")
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    seconds = time.perf_counter() - t0
    peak = sampler.stop()
    del data
    end = _status()
    print(json.dumps({"value": float(value), "seconds": seconds, "threads": threads, "chunk": chunk,
                      "baseline_anon": baseline, "self_peak_anon": peak, "hwm": end["VmHWM"]}),
          flush=True)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# the parent: run children, sample their memory


def run_variant(variant: str, path: str) -> dict[str, Any]:
    """One child run of ``variant``: its report plus the peaks sampled from outside."""
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", variant, path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak_anon = peak_rss = samples = 0
    while proc.poll() is None:
        try:
            st = _status(proc.pid)
        except (OSError, ValueError):  # exiting
            break
        peak_anon = max(peak_anon, st.get("RssAnon", 0))
        peak_rss = max(peak_rss, st.get("VmRSS", 0))
        samples += 1
        time.sleep(SAMPLE_S)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{variant}: child exited with {proc.returncode}:\n{err[-3000:]}")
    report = json.loads(out.strip().splitlines()[-1])
    report.update(peak_anon=max(peak_anon, report["self_peak_anon"]), peak_rss=peak_rss, samples=samples)
    return report


def summarize(variant: str, runs: list[dict[str, Any]], reference: float) -> dict[str, Any]:
    first = runs[0]
    values = [r["value"] for r in runs]
    return {
        "variant": variant,
        "seconds": statistics.median(r["seconds"] for r in runs),
        "times": [r["seconds"] for r in runs],
        "peak_anon": max(r["peak_anon"] for r in runs),
        "baseline_anon": min(r["baseline_anon"] for r in runs),
        "peak_rss": max(r["peak_rss"] for r in runs),
        "hwm": max(r["hwm"] for r in runs),
        "samples": sum(r["samples"] for r in runs),
        "value": values[-1],
        "ok": all(abs(v - reference) <= RTOL * abs(reference) for v in values),
        "threads": first["threads"],
        "chunk": first["chunk"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2])
        return 0
    ap = _common.parser(__doc__.split("\n", 1)[0], default_size="small", default_repeat=1)
    ap.add_argument("--data", metavar="DIR", help="keep the data file here and reuse it (default: a temp folder)")
    args = ap.parse_args(argv)

    env = _common.environment()
    _common.print_environment(env)
    folder = args.data or tempfile.mkdtemp(prefix="npydask-bench-memory-")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"p6-{args.size}.npy")
    try:
        nbytes, note = payload_bytes(args.size, folder)
        t0 = time.perf_counter()
        make_file(path, nbytes)
        made = time.perf_counter() - t0
        reference = reference_sum(path)
        print(f"# size={args.size}: one float32 file of {nbytes // MiB} MiB{' (' + note + ')' if note else ''} "
              f"in {folder} (ready in {made:.1f} s); {args.repeat} fresh child process(es) per variant; "
              f"memory sampled every {SAMPLE_S * 1000:.0f} ms", flush=True)  # fmt: skip
        results = []
        for variant in VARIANTS:
            runs = []
            for _ in range(max(1, args.repeat)):
                _common.warm_page_cache([path])
                runs.append(run_variant(variant, path))
            r = summarize(variant, runs, reference)
            results.append(r)
            print(f"  {variant:24s} {r['seconds']:8.3f} s   peak RssAnon {r['peak_anon'] / MiB:8.1f} MiB   "
                  f"peak VmRSS {r['peak_rss'] / MiB:8.1f} MiB", flush=True)  # fmt: skip
    finally:
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)
    return report(results, args, nbytes, reference)


def report(results: list[dict[str, Any]], args: Any, nbytes: int, reference: float) -> int:
    by = {r["variant"]: r for r in results}
    base = by["np.load"]
    rows = []
    for r in results:
        rows.append([
            r["variant"],
            f"{r['seconds']:.3f}",
            f"{r['baseline_anon'] / MiB:.0f}",
            f"{r['peak_anon'] / MiB:.0f}",
            f"{(r['peak_anon'] - r['baseline_anon']) / MiB:.0f}",
            f"{r['peak_anon'] / base['peak_anon']:.3f}" if base["peak_anon"] else "-",
            f"{r['peak_rss'] / MiB:.0f}",
            f"{r['hwm'] / MiB:.0f}",
            f"{r['seconds'] / base['seconds']:.2f}" if base["seconds"] else "-",
            "ok" if r["ok"] else f"BAD {r['value']:.6g}",
        ])  # fmt: skip
    print()
    _common.table(rows, ["variant", "time s", "anon base MiB", "peak RssAnon MiB", "anon growth MiB",
                         "anon / np.load", "peak VmRSS MiB", "VmHWM MiB", "time / np.load", "sum"])  # fmt: skip
    threads, chunk = results[0]["threads"], results[0]["chunk"]
    bound = 2 * chunk * threads + ALLOWANCE
    worst = max(by[v]["peak_anon"] for v in GOAL_VARIANTS)
    verdict = "PASS" if worst <= bound else "FAIL"
    print(
        f"# reference sum {reference:.9g} (float64, 64 MiB slabs); payload {nbytes // MiB} MiB; "
        f"chunk size {chunk // MiB} MiB, {threads} threads",
        flush=True,
    )
    print(f"P6 bounded memory ({' & '.join(GOAL_VARIANTS)} peak RssAnon {worst / MiB:.0f} MiB "
          f"<= 2 x {chunk // MiB} MiB x {threads} + {ALLOWANCE // MiB} MiB = {bound / MiB:.0f} MiB): {verdict}",
          flush=True)  # fmt: skip
    _common.write_json(args.json, {"benchmark": "bench_memory", "size": args.size, "payload_bytes": nbytes,
                                   "reference": reference, "bound_bytes": bound, "goal": verdict,
                                   "results": results})  # fmt: skip
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
