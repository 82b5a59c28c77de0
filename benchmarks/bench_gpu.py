"""P7: reading ``.npy`` files onto a GPU, against raw kvikio, host reads plus one copy, and the CPU path.

Groups (every result is checked exactly against numpy, so a fast wrong path fails loudly):

big
    one ``int32`` C-order file (1 GiB; ``--full``: 4 GiB) with values ``arange % 1_000_003``, summed
    on the device (``sum(dtype="int64")``): ``npydask.from_npy(p, device="gpu")`` against raw kvikio
    (``CuFile(p).pread`` of the payload into a preallocated CuPy buffer, then the same sum) at the
    same kvikio thread count (1, 8, 16), ``cupy.asarray(np.load(p))``, ``np.load(mmap)`` plus one
    copy, CPU npydask plus one copy, npydask with kvikio hidden (the pinned host-memory path),
    npydask with other chunk sizes (how much each task costs), npydask with the graph built beforehand,
    and dask's own floor (``da.ones(10).sum()`` built and computed, and computed alone), which no
    reader can go under.
roi
    P3's data: 256 volumes of 64x256x256 ``float32`` (a 32^3 ROI of each), stacked on the device:
    ``open_dataset(folder, roi_start, roi_shape, device="gpu").stack()`` against CPU npydask plus
    one copy and the numpy ROI loop (``np.load(mmap)[roi]``) plus one copy.
small
    5,000 files of 32x32 ``float32``, opened, stacked and summed on the device, against the CPU
    path (the same calls with ``device="cpu"``) plus one copy.
swap
    a big-endian Fortran-order ``>i4`` file (256 MiB; ``--full``: 1 GiB), summed on the device:
    npydask against raw kvikio plus a CuPy byte swap and transpose.

Method: data written once to a folder on disk (``--data``, default ``/var/tmp``: not tmpfs, where
``O_DIRECT`` and GPUDirect Storage need a real file system) and left in the page cache, which is
warm for every timed run unless a row says "cold" (those drop the file's pages with
``npydask.testing.drop_page_cache`` before each run; the script reports whether that took effect by
comparing a cold raw read with a warm one). Each variant runs once untimed ("first": CUDA context, NVRTC
compiles, kvikio's pool and pinned buffers) and then ``--repeat`` times (fewer, at least 3, when
its first call shows that would take over 4 s); wall-clock time around work
that ends with ``cupy.cuda.Device().synchronize()``; medians. ``KVIKIO_NTHREADS`` is set to the
first thread count before kvikio is imported, so npydask leaves the pool size to the script.

``--dry-run`` needs no GPU: NumPy stands in for CuPy (as in ``tests/gpu/test_gpu.py``), sizes are tiny,
the kvikio rows are skipped, and every host row and the device path's host side still run and are
checked; the test suite runs it so the script never rots.

Usage::

    python benchmarks/bench_gpu.py [--full] [--repeat N] [--threads 1,8,16] [--only GROUP[,GROUP]]
                                   [--data DIR] [--json out.json] [--dry-run]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

MiB = 1 << 20
VARIANT_BUDGET_S = 4.0
"""Seconds of timed runs a variant gets when its first call is slow (it then runs fewer times, at least 3)."""
GROUPS = ("big", "roi", "small", "swap")


@dataclass(frozen=True)
class Size:
    big_bytes: int
    n_volumes: int
    volume_shape: tuple[int, int, int]
    roi_start: tuple[int, int, int]
    roi_shape: tuple[int, int, int]
    n_small: int
    small_shape: tuple[int, int]
    swap_bytes: int


SIZES = {
    "dry": Size(4 * MiB, 8, (16, 32, 32), (3, 5, 7), (8, 8, 8), 200, (32, 32), 1 * MiB),
    "default": Size(1024 * MiB, 256, (64, 256, 256), (16, 100, 100), (32, 32, 32), 5000, (32, 32), 256 * MiB),
    "full": Size(4096 * MiB, 256, (64, 256, 256), (16, 100, 100), (32, 32, 32), 5000, (32, 32), 1024 * MiB),
}


# ---------------------------------------------------------------- the device, or NumPy standing in
class Device:
    """The array module and its synchronisation; NumPy with ``dry``."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry
        if dry:
            from npydask.gpu import device as gpu

            gpu.require_gpu = lambda: None  # numpy stands in for CuPy, as in tests/gpu/test_gpu.py
            gpu.array_module = lambda: np
            self.xp: Any = np
        else:
            import cupy

            self.xp = cupy

    def sync(self) -> None:
        if not self.dry:
            self.xp.cuda.Device().synchronize()

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(a) if self.dry else self.xp.asnumpy(a)

    def copy_in(self, host: np.ndarray) -> Any:
        """The "one copy" of the host baselines: host memory to the device."""
        return np.array(host, copy=True) if self.dry else self.xp.asarray(host)


def payload_offset(path: str) -> int:
    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        if major == 1:
            np.lib.format.read_array_header_1_0(f)
        else:
            np.lib.format.read_array_header_2_0(f)
        return f.tell()


# ---------------------------------------------------------------- data
def write_data(folder: str, size: Size, groups: tuple[str, ...]) -> dict[str, Any]:
    """Write each group's files once; returns paths and numpy reference values."""
    data: dict[str, Any] = {}
    t0 = time.perf_counter()
    if "big" in groups:
        n = size.big_bytes // 4
        p = os.path.join(folder, f"big-{size.big_bytes // MiB}MiB.npy")
        if not os.path.exists(p):
            mm = np.lib.format.open_memmap(p + ".part", mode="w+", dtype="<i4", shape=(n,))
            step = 1 << 24
            for i in range(0, n, step):
                mm[i : i + step] = np.arange(i, min(n, i + step), dtype=np.int64) % 1_000_003
            mm.flush()
            del mm
            os.replace(p + ".part", p)
        data["big"] = p
        data["big_sum"] = int(np.load(p, mmap_mode="r").sum(dtype=np.int64))
    if "roi" in groups:
        d = os.path.join(folder, f"vols-{size.n_volumes}x{'x'.join(map(str, size.volume_shape))}")
        if not os.path.isdir(d):
            os.makedirs(d + ".part", exist_ok=True)
            rng = np.random.default_rng(3)
            base = rng.standard_normal(size.volume_shape, dtype=np.float32)
            for i in range(size.n_volumes):
                np.save(os.path.join(d + ".part", f"vol{i:04d}.npy"), base + np.float32(i))
            os.replace(d + ".part", d)
        files = sorted(os.path.join(d, f) for f in os.listdir(d))
        sl = tuple(slice(s, s + n) for s, n in zip(size.roi_start, size.roi_shape))
        data["roi"] = d
        data["roi_files"] = files
        data["roi_ref"] = np.stack([np.load(f, mmap_mode="r")[sl] for f in files])
    if "small" in groups:
        d = os.path.join(folder, f"small-{size.n_small}x{'x'.join(map(str, size.small_shape))}")
        if not os.path.isdir(d):
            os.makedirs(d + ".part", exist_ok=True)
            rng = np.random.default_rng(5)
            for i in range(size.n_small):
                np.save(
                    os.path.join(d + ".part", f"s{i:05d}.npy"), rng.standard_normal(size.small_shape, dtype=np.float32)
                )
            os.replace(d + ".part", d)
        data["small"] = d
        files = sorted(os.path.join(d, f) for f in os.listdir(d))
        data["small_ref"] = np.stack([np.load(f) for f in files])
    if "swap" in groups:
        side = int(np.sqrt(size.swap_bytes // 4))
        p = os.path.join(folder, f"swap-{side}x{side}-be-f.npy")
        if not os.path.exists(p):
            mm = np.lib.format.open_memmap(p + ".part", mode="w+", dtype=">i4", shape=(side, side), fortran_order=True)
            for j in range(0, side, 1024):  # Fortran order: columns are contiguous
                cols = np.arange(j * side, min(side, j + 1024) * side, dtype=np.int64) % 1_000_003
                mm[:, j : j + 1024] = cols.reshape(-1, side).T
            mm.flush()
            del mm
            os.replace(p + ".part", p)
        data["swap"] = p
        data["swap_sum"] = int(np.load(p, mmap_mode="r").sum(dtype=np.int64))
    data["write_seconds"] = time.perf_counter() - t0
    return data


# ---------------------------------------------------------------- timing
@dataclass
class Row:
    group: str
    variant: str
    nbytes: int
    first: float
    times: list[float]
    ok: bool | None
    note: str = ""
    threads: int | None = None
    error: str = ""

    @property
    def median(self) -> float:
        return _common.median(self.times)

    @property
    def gbps(self) -> float:
        return self.nbytes / self.median / 1e9 if self.times and self.median else 0.0


class Bench:
    def __init__(self, dev: Device, repeat: int) -> None:
        self.dev = dev
        self.repeat = repeat
        self.rows: list[Row] = []

    def time(
        self,
        group: str,
        variant: str,
        nbytes: int,
        fn: Callable[[], Any],
        check: Callable[[Any], bool],
        *,
        note: str = "",
        threads: int | None = None,
        before: Callable[[], None] | None = None,
    ) -> Row:
        """One untimed first call, then ``repeat`` timed ones; the last result is checked exactly."""
        times: list[float] = []
        first = 0.0
        value = None
        runs = self.repeat
        try:
            i = 0
            while i <= runs:
                if before is not None:
                    before()
                self.dev.sync()
                t0 = time.perf_counter()
                value = fn()
                self.dev.sync()
                dt = time.perf_counter() - t0
                if i == 0:
                    first = dt
                    # a slow variant runs fewer times (at least 3), so one slow path cannot eat the stage's limit
                    runs = max(min(3, self.repeat), min(self.repeat, int(VARIANT_BUDGET_S / max(dt, 1e-9))))
                else:
                    times.append(dt)
                i += 1
            ok = bool(check(value))
            row = Row(group, variant, nbytes, first, times, ok, note, threads)
        except Exception as e:  # a failing variant is reported, the others still run
            row = Row(
                group, variant, nbytes, first, times, False, note, threads, error=f"{type(e).__name__}: {e}"[:300]
            )
        del value
        self.rows.append(row)
        status = "" if row.ok else ("  WRONG VALUE" if not row.error else f"  ERROR {row.error}")
        print(
            f"  {group:5s} {variant:62s} first {_common.fmt_seconds(row.first):>10s}  median "
            f"{_common.fmt_seconds(row.median):>10s}  {row.gbps:7.2f} GB/s{status}",
            flush=True,
        )
        return row

    def find(self, group: str, variant: str) -> Row | None:
        return next((r for r in self.rows if r.group == group and r.variant == variant and r.ok), None)


# ---------------------------------------------------------------- kvikio
def kvikio_modules() -> tuple[Any, Any] | None:
    try:
        import kvikio
        import kvikio.defaults
    except ImportError:
        return None
    return kvikio, kvikio.defaults


def set_threads(n: int) -> None:
    mods = kvikio_modules()
    if mods is not None:
        mods[1].set("num_threads", n)


@contextlib.contextmanager
def kvikio_hidden() -> Iterator[None]:
    """``import kvikio`` fails inside: npydask takes its pinned host-memory path."""
    saved = {k: v for k, v in sys.modules.items() if k == "kvikio" or k.startswith("kvikio.")}
    for k in saved:
        sys.modules[k] = None  # type: ignore[assignment]
    sys.modules["kvikio"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k == "kvikio" or k.startswith("kvikio.")]:
            del sys.modules[k]
        sys.modules.update(saved)


# ---------------------------------------------------------------- groups
def run_big(b: Bench, data: dict[str, Any], threads: list[int], dry: bool) -> dict[str, Any]:
    import dask.array as da

    import npydask
    from npydask.testing import drop_page_cache

    xp, dev = b.dev.xp, b.dev
    p, expected = data["big"], data["big_sum"]
    nbytes = os.path.getsize(p) - payload_offset(p)
    n = nbytes // 4
    facts: dict[str, Any] = {}

    def same(v: Any) -> bool:
        return int(v) == expected

    def npyd(chunks: Any = "auto") -> Any:
        return npydask.from_npy(p, device="gpu", chunks=chunks).sum(dtype="int64").compute()

    mods = None if dry else kvikio_modules()
    if mods is not None:
        kvikio = mods[0]
        off = payload_offset(p)
        buf = xp.empty(n, dtype=xp.int32)

        def raw() -> Any:
            with kvikio.CuFile(p, "r") as f:
                got = f.pread(buf, nbytes, off).get()
            if got != nbytes:
                raise OSError(f"short read {got} of {nbytes}")
            return buf.sum(dtype=xp.int64)

        for t in threads:
            set_threads(t)
            b.time("big", f"raw kvikio pread, threads={t}", nbytes, raw, same, threads=t, note="baseline")
            b.time("big", f"npydask from_npy(gpu) sum, threads={t}", nbytes, npyd, same, threads=t, note="P7")
        t = threads[-1]
        set_threads(t)
        with npydask.config.set(gpu_task_bytes=4 * MiB):
            b.time(
                "big",
                f"npydask from_npy(gpu) sum, threads={t}, spans cut in 4 MiB reads",
                nbytes,
                npyd,
                same,
                threads=t,
                note="info: kvikio splitting vs npydask's",
            )
        for chunks in ("128MiB", "512MiB"):
            b.time(
                "big",
                f"npydask from_npy(gpu, chunks={chunks}) sum, threads={t}",
                nbytes,
                lambda c=chunks: npyd(c),
                same,
                threads=t,
                note="info: per-task cost",
            )
        cold = lambda: drop_page_cache(p)  # noqa: E731
        rc = b.time(
            "big",
            f"raw kvikio pread, threads={t}, cold",
            nbytes,
            raw,
            same,
            threads=t,
            before=cold,
            note="page cache dropped",
        )
        b.time(
            "big",
            f"npydask from_npy(gpu) sum, threads={t}, cold",
            nbytes,
            npyd,
            same,
            threads=t,
            before=cold,
            note="page cache dropped",
        )
        _common.warm_page_cache([p])
        rw = b.find("big", f"raw kvikio pread, threads={t}")
        if rw is not None and rc.ok:
            facts["page cache drop"] = (
                f"took effect (cold raw {rc.median * 1e3:.1f} ms, warm {rw.median * 1e3:.1f} ms)"
                if rc.median > 1.3 * rw.median
                else f"no visible effect (cold raw {rc.median * 1e3:.1f} ms, warm {rw.median * 1e3:.1f} ms):"
                " cold rows are warm"
            )
        del buf
        with kvikio_hidden():
            b.time(
                "big",
                "npydask from_npy(gpu) sum, kvikio hidden (pinned host path)",
                nbytes,
                npyd,
                same,
                note="fallback",
            )
    else:
        b.time(
            "big",
            "npydask from_npy(gpu) sum (numpy standing in)" if dry else "npydask from_npy(gpu) sum, no kvikio",
            nbytes,
            npyd,
            same,
            note="P7" if not dry else "dry",
        )
    prebuilt = npydask.from_npy(p, device="gpu").sum(dtype="int64")
    b.time(
        "big",
        "npydask from_npy(gpu) sum, graph built beforehand",
        nbytes,
        prebuilt.compute,
        same,
        note="info: dask's build",
    )
    floor = da.ones(10, chunks=10).sum()
    b.time(
        "big",
        "dask's floor: da.ones(10).sum() built and computed",
        80,
        lambda: da.ones(10, chunks=10).sum().compute(),
        lambda v: int(v) == 10,
        note="info: dask's floor",
    )
    b.time(
        "big",
        "dask's floor: da.ones(10).sum() computed, built beforehand",
        80,
        floor.compute,
        lambda v: int(v) == 10,
        note="info: dask's floor",
    )
    b.time(
        "big",
        "cupy.asarray(np.load(p)) sum",
        nbytes,
        lambda: dev.copy_in(np.load(p)).sum(dtype=xp.int64),
        same,
        note="host + copy",
    )
    b.time(
        "big",
        "cupy.asarray(np.load(p, mmap_mode='r')) sum",
        nbytes,
        lambda: dev.copy_in(np.load(p, mmap_mode="r")).sum(dtype=xp.int64),
        same,
        note="host + copy",
    )
    b.time(
        "big",
        "cupy.asarray(CPU npydask from_npy(p).compute()) sum",
        nbytes,
        lambda: dev.copy_in(npydask.from_npy(p).compute()).sum(dtype=xp.int64),
        same,
        note="CPU path + copy",
    )
    return facts


def run_roi(b: Bench, data: dict[str, Any], size: Size) -> None:
    import npydask

    dev = b.dev
    ref = data["roi_ref"]
    nbytes = ref.nbytes
    sl = tuple(slice(s, s + n) for s, n in zip(size.roi_start, size.roi_shape))
    kw = dict(roi_start=list(size.roi_start), roi_shape=list(size.roi_shape))

    def equal(v: Any) -> bool:
        return bool(np.array_equal(dev.to_host(v), ref))

    b.time(
        "roi",
        "npydask open_dataset(roi, device='gpu').stack()",
        nbytes,
        lambda: npydask.open_dataset(data["roi"], device="gpu", **kw).stack().compute(),
        equal,
        note="goal",
    )
    with npydask.config.set(gpu_host_bytes=0):
        b.time(
            "roi",
            "npydask open_dataset(roi, device='gpu').stack(), gpu_host_bytes=0",
            nbytes,
            lambda: npydask.open_dataset(data["roi"], device="gpu", **kw).stack().compute(),
            equal,
            note="info: device plans",
        )
    b.time(
        "roi",
        "cupy.asarray(CPU npydask open_dataset(roi).stack())",
        nbytes,
        lambda: dev.copy_in(npydask.open_dataset(data["roi"], **kw).stack().compute()),
        equal,
        note="CPU path + copy",
    )
    b.time(
        "roi",
        "cupy.asarray(np.stack([np.load(f, mmap)[roi] ...]))",
        nbytes,
        lambda: dev.copy_in(np.stack([np.load(f, mmap_mode="r")[sl] for f in data["roi_files"]])),
        equal,
        note="numpy loop + copy",
    )


def run_small(b: Bench, data: dict[str, Any]) -> None:
    import npydask

    dev, xp = b.dev, b.dev.xp
    ref = data["small_ref"]
    expected = float(ref.sum(dtype=np.float64))

    def close(v: Any) -> bool:
        return abs(float(v) - expected) <= 1e-6 * max(1.0, abs(expected)) * 10

    def equal(v: Any) -> bool:
        return bool(np.array_equal(dev.to_host(v), ref))

    b.time(
        "small",
        "npydask open_dataset(device='gpu').stack()",
        ref.nbytes,
        lambda: npydask.open_dataset(data["small"], device="gpu").stack().compute(),
        equal,
        note="goal",
    )
    with npydask.config.set(gpu_host_bytes=0):
        b.time(
            "small",
            "npydask open_dataset(device='gpu').stack(), gpu_host_bytes=0",
            ref.nbytes,
            lambda: npydask.open_dataset(data["small"], device="gpu").stack().compute(),
            equal,
            note="info: a device plan per file",
        )
    b.time(
        "small",
        "cupy.asarray(CPU npydask open_dataset().stack())",
        ref.nbytes,
        lambda: dev.copy_in(npydask.open_dataset(data["small"]).stack().compute()),
        equal,
        note="CPU path + copy",
    )
    b.time(
        "small",
        "npydask open_dataset(device='gpu').stack().sum()",
        ref.nbytes,
        lambda: npydask.open_dataset(data["small"], device="gpu").stack().sum(dtype="float64").compute(),
        close,
        note="info",
    )
    b.time(
        "small",
        "CPU npydask open_dataset().stack().sum()",
        ref.nbytes,
        lambda: npydask.open_dataset(data["small"]).stack().sum(dtype="float64").compute(),
        close,
        note="info: no device",
    )
    del xp


def run_swap(b: Bench, data: dict[str, Any], dry: bool) -> None:
    import npydask

    xp = b.dev.xp
    p, expected = data["swap"], data["swap_sum"]
    nbytes = os.path.getsize(p) - payload_offset(p)

    def same(v: Any) -> bool:
        return int(v) == expected

    b.time(
        "swap",
        "npydask from_npy(>i4 Fortran, gpu) sum",
        nbytes,
        lambda: npydask.from_npy(p, device="gpu").sum(dtype="int64").compute(),
        same,
        note="info",
    )
    mods = None if dry else kvikio_modules()
    if mods is not None:
        kvikio = mods[0]
        off = payload_offset(p)
        side = int(round((nbytes // 4) ** 0.5))
        raw_buf = xp.empty(nbytes // 4, dtype=xp.uint32)

        def raw() -> Any:
            with kvikio.CuFile(p, "r") as f:
                f.pread(raw_buf, nbytes, off).get()
            native = raw_buf.byteswap().view(xp.int32).reshape(side, side).T  # Fortran: transposed C view
            return xp.ascontiguousarray(native).sum(dtype=xp.int64)

        b.time("swap", "raw kvikio pread + cupy byteswap + transpose", nbytes, raw, same, note="baseline")
    b.time(
        "swap",
        "cupy.asarray(np.load(p)) sum",
        nbytes,
        lambda: b.dev.copy_in(np.ascontiguousarray(np.load(p), dtype="<i4")).sum(dtype=xp.int64),
        same,
        note="host + copy",
    )


# ---------------------------------------------------------------- goals
def goals(b: Bench, threads: list[int], dry: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(
        name: str, num: Row | None, den: Row | None, target: float, higher_is_better: bool, *, speed: bool = True
    ) -> None:
        if num is None or den is None or not num.times or not den.times:
            out.append({"goal": name, "measured": None, "target": target, "verdict": "n/a"})
            return
        # speed: den's time / num's time (how many times faster num is); else num's time / den's time
        value = den.median / num.median if speed else num.median / den.median
        ok = value >= target if higher_is_better else value <= target
        verdict = "info" if dry else ("PASS" if ok else "FAIL")  # numpy standing in says nothing of a GPU
        out.append({"goal": name, "measured": round(value, 3), "target": target, "verdict": verdict})

    if not dry:
        for t in threads:
            add(
                f"P7 npydask / raw kvikio throughput, threads={t}",
                b.find("big", f"npydask from_npy(gpu) sum, threads={t}"),
                b.find("big", f"raw kvikio pread, threads={t}"),
                0.9,
                True,
            )
        t = threads[-1]
        add(
            f"P7 npydask (threads={t}) speed-up over cupy.asarray(np.load(p))",
            b.find("big", f"npydask from_npy(gpu) sum, threads={t}"),
            b.find("big", "cupy.asarray(np.load(p)) sum"),
            2.0,
            True,
        )
    add(
        "ROI stack: npydask gpu / CPU npydask + one copy (time)",
        b.find("roi", "npydask open_dataset(roi, device='gpu').stack()"),
        b.find("roi", "cupy.asarray(CPU npydask open_dataset(roi).stack())"),
        1.2,
        False,
        speed=False,
    )
    add(
        "small files: npydask gpu / CPU npydask + one copy (time)",
        b.find("small", "npydask open_dataset(device='gpu').stack()"),
        b.find("small", "cupy.asarray(CPU npydask open_dataset().stack())"),
        1.0,
        False,
        speed=False,
    )
    return out


def describe_reader() -> str:
    try:
        from npydask.gpu import describe

        return str(describe())
    except Exception as e:  # reported, not fatal: the rows say what ran
        return f"describe() raised {type(e).__name__}: {e}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--full", action="store_true", help="the 4 GiB big file and a 1 GiB swapped one")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per variant after the first (default 5)")
    ap.add_argument("--threads", default="1,8,16", help="kvikio thread counts for the big file (default 1,8,16)")
    ap.add_argument("--only", default="", help="groups to run, comma-separated: " + ", ".join(GROUPS))
    ap.add_argument(
        "--data", metavar="DIR", help="keep the data here and reuse it (default: a folder under /var/tmp, removed)"
    )
    ap.add_argument("--json", metavar="OUT", help="also write the results to this JSON file")
    ap.add_argument(
        "--dry-run", action="store_true", help="no GPU: numpy stands in for CuPy, tiny sizes, no kvikio rows"
    )
    args = ap.parse_args(argv)
    groups = tuple(g for g in (args.only.split(",") if args.only else GROUPS) if g)
    unknown = set(groups) - set(GROUPS)
    if unknown:
        ap.error(f"unknown group(s) {sorted(unknown)}; groups: {', '.join(GROUPS)}")
    threads = [int(t) for t in args.threads.split(",") if t]
    size = SIZES["dry" if args.dry_run else ("full" if args.full else "default")]
    if not args.dry_run:
        os.environ.setdefault("KVIKIO_NTHREADS", str(threads[0]))  # npydask then leaves the pool size to us
    info = _common.environment()
    _common.print_environment(info)
    dev = Device(args.dry_run)
    folder = args.data or tempfile.mkdtemp(prefix="npydask-bench-gpu-", dir=None if args.dry_run else "/var/tmp")
    os.makedirs(folder, exist_ok=True)
    t_all = time.perf_counter()
    try:
        data = write_data(folder, size, groups)
        print(f"# data in {folder}: written or checked in {data['write_seconds']:.1f} s; page cache warm", flush=True)
        bench = Bench(dev, args.repeat)
        facts: dict[str, Any] = {"mode": "dry run: numpy stands in for CuPy" if args.dry_run else "device"}
        if not args.dry_run:
            facts["gpu"] = dev.xp.cuda.runtime.getDeviceProperties(dev.xp.cuda.Device().id)["name"].decode()
        if "big" in groups:
            facts.update(run_big(bench, data, threads, args.dry_run))
        if "roi" in groups:
            run_roi(bench, data, size)
        if "small" in groups:
            run_small(bench, data)
        if "swap" in groups:
            run_swap(bench, data, args.dry_run)
        facts["reader"] = describe_reader()
    finally:
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)
    print("# " + "; ".join(f"{k}: {v}" for k, v in facts.items()))
    print("# medians of the timed runs; first: the untimed first call (context, compiles, pools); GB = 1e9 bytes")
    _common.table(
        [
            [
                r.group,
                r.variant,
                _common.fmt_seconds(r.first),
                f"{r.median * 1e3:.2f}",
                f"{r.gbps:.2f}",
                {True: "yes", False: "NO"}[bool(r.ok)],
                r.note + (f" {r.error}" if r.error else ""),
            ]
            for r in bench.rows
        ],
        ["grp", "variant", "first", "median ms", "GB/s", "exact", "note"],
    )
    gl = goals(bench, threads, args.dry_run)
    print()
    _common.table(
        [
            [g["goal"], "" if g["measured"] is None else f"{g['measured']:.2f}x", f"{g['target']}x", g["verdict"]]
            for g in gl
        ],
        ["goal", "measured", "target", "verdict"],
    )
    all_exact = all(r.ok for r in bench.rows)
    print(f"# every result equal to numpy: {'yes' if all_exact else 'NO'}; total {time.perf_counter() - t_all:.1f} s")
    _common.write_json(
        args.json,
        {
            "benchmark": "gpu",
            "size": "dry" if args.dry_run else ("full" if args.full else "default"),
            "facts": facts,
            "results": [
                {
                    "group": r.group,
                    "variant": r.variant,
                    "nbytes": r.nbytes,
                    "first": r.first,
                    "times": r.times,
                    "median": r.median,
                    "gbps": r.gbps,
                    "exact": r.ok,
                    "threads": r.threads,
                    "note": r.note,
                    "error": r.error,
                }
                for r in bench.rows
            ],
            "goals": gl,
            "all_exact": all_exact,
        },
    )
    verdict = "PASS" if all_exact else "FAIL"
    fails = [g["goal"] for g in gl if g["verdict"] == "FAIL"]
    detail = f"{len(bench.rows)} variants, all exact" if all_exact else "a result differs from numpy"
    if fails:
        detail += f"; goals not met: {'; '.join(fails)}"
    print(f"{verdict} bench{' (dry)' if args.dry_run else ''}: {detail}")
    return 0 if all_exact else 1


if __name__ == "__main__":
    sys.exit(main())
