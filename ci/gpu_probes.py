"""Device probes for ``ci/gpu_check.sh``: what a GPU run must show that no ``pytest -m gpu`` test covers yet.

Each probe writes its files under the work folder, reads them with ``device="gpu"``
and compares the result with ``numpy.load`` (the oracle), exactly. Each prints one
line, ``PASS|FAIL|XFAIL name: detail``, and a failure never stops the others. XFAIL
marks a failure the GPU review predicts and whose fix has not landed (it names the
finding); once fixed, the probe passes.

``--dry-run`` runs every probe at tiny size with numpy standing in for CuPy (the
same stand-in as the CPU tests in ``tests/test_gpu.py``: ``npydask.gpu`` reads into
numpy), so the probes themselves are checked on any machine; a dry PASS says the
probe's logic and the host side work, nothing about a GPU.

Usage::

    python ci/gpu_probes.py --work DIR [--dry-run] [--only NAME[,NAME]] [--scale N]

Exit status: 0 when every probe passed or XFAILed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

PROBE_SECONDS = 60
"""Each probe's limit (an alarm in the main thread); the stage has its own ``timeout`` too."""


class Context:
    """What every probe needs: the array module, the work folder, the size scale, dry or not."""

    def __init__(self, work: str, dry: bool, scale: int) -> None:
        self.work = work
        self.dry = dry
        self.scale = scale
        if dry:
            from npydask import gpu

            gpu.require_gpu = lambda: None  # numpy stands in for CuPy, as in tests/test_gpu.py
            gpu._array_module = lambda: np
            self.xp: Any = np
        else:
            import cupy

            self.xp = cupy

    def path(self, name: str) -> str:
        p = os.path.join(self.work, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def host(self, a: Any) -> np.ndarray:
        """A result brought to the host, after checking it lives on the device (``xp.ndarray``)."""
        if self.dry and isinstance(a, np.generic):  # numpy reduces to a scalar; CuPy to a 0-d array
            return np.asarray(a)
        if not isinstance(a, self.xp.ndarray):
            raise AssertionError(f"expected a {self.xp.__name__}.ndarray, got {type(a).__module__}.{type(a).__name__}")
        return a.get() if hasattr(a, "get") else np.asarray(a)

    def blocks_on_device(self, x: Any) -> None:
        """The array's meta and its first chunk are device arrays."""
        if not isinstance(x._meta, self.xp.ndarray):
            raise AssertionError(f"meta is {type(x._meta).__module__}.{type(x._meta).__name__}")
        first = x.blocks[(0,) * x.ndim].compute() if x.ndim and x.size else x.compute()
        self.host(first)


def same(got: np.ndarray, expected: np.ndarray, what: str) -> str:
    """Raise unless equal bytes, shape and (native) dtype; a short description when equal."""
    expected = np.asarray(expected)
    want = expected.dtype.newbyteorder("=")
    if got.shape != expected.shape or got.dtype != want:
        raise AssertionError(f"{what}: got {got.dtype}{got.shape}, expected {want}{expected.shape}")
    if got.tobytes() != np.ascontiguousarray(expected.astype(want)).tobytes():
        raise AssertionError(f"{what}: values differ from numpy.load")
    return f"{what} {got.dtype}{got.shape} equal"


def data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Values that are never all zeros (a read of nothing is not equal by chance)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(1, 1000, size=shape) if np.dtype(dtype).kind in "iu" else rng.random(shape) + 1).astype(dtype)


# --------------------------------------------------------------------------
# The probes, most valuable first.


def probe_from_npy_c(c: Context) -> str:
    import npydask

    a = data((64 * c.scale, 1024), "<i4", 1)
    np.save(c.path("c.npy"), a)
    x = npydask.from_npy(c.path("c.npy"), device="gpu", chunks=(16 * c.scale, 1024))
    c.blocks_on_device(x)
    total = int(c.host(x.sum(dtype="int64").compute()))
    if total != int(np.load(c.path("c.npy")).sum(dtype="int64")):
        raise AssertionError(f"sum {total} differs from numpy's")
    return same(c.host(x.compute()), a, "C-order int32") + f", sum {total} equal"


def probe_from_npy_fortran(c: Context) -> str:
    import npydask

    a = np.asfortranarray(data((48 * c.scale, 300), "<f8", 2))
    np.save(c.path("f.npy"), a)
    x = npydask.from_npy(c.path("f.npy"), device="gpu", chunks=(20 * c.scale, 128))
    c.blocks_on_device(x)
    got = float(c.host(x.sum().compute()))
    if not np.isclose(got, float(np.load(c.path("f.npy")).sum())):
        raise AssertionError(f"sum {got} differs from numpy's")
    return same(c.host(x.compute()), a, "Fortran float64")


def probe_big_endian(c: Context) -> str:
    import npydask

    out = []
    for i, dtype in enumerate((">i4", ">f8", ">c16", "<f2", "?")):
        a = np.asfortranarray(data((9 * c.scale, 17), dtype, 3 + i)) if i % 2 else data((9 * c.scale, 17), dtype, 3 + i)
        p = c.path(f"be/{i}.npy")
        np.save(p, a)
        out.append(same(c.host(npydask.from_npy(p, device="gpu", chunks=(4, 17)).compute()), np.load(p), dtype))
    return "; ".join(out)


def probe_roi(c: Context) -> str:
    import npydask

    vols = [data((16, 24, 20), "<f4", 10 + i) for i in range(6)]
    for i, v in enumerate(vols):
        np.save(c.path(f"vols/{i}.npy"), np.asfortranarray(v) if i == 2 else v)
    start, shape = [3, 5, 7], [8, 9, 10]
    ds = npydask.open_dataset(os.path.dirname(c.path("vols/0.npy")), roi_start=start, roi_shape=shape, device="gpu")
    roi = tuple(slice(s, s + n) for s, n in zip(start, shape))
    want = np.stack([np.load(c.path(f"vols/{i}.npy"))[roi] for i in range(6)])
    stacked = ds.stack()
    c.blocks_on_device(stacked)
    return same(c.host(stacked.compute()), want, "ROI stack of 6 volumes")


def probe_npz_members(c: Context) -> str:
    import npydask

    a, b = data((50 * c.scale, 6), ">f4", 20), data((33, 7), "<i8", 21)
    np.savez(c.path("npz/stored.npz"), a=a, b=b)
    np.savez_compressed(c.path("npz/deflated.npz"), a=a, b=b)
    out = []
    for name in ("stored", "deflated"):
        p = c.path(f"npz/{name}.npz")
        with np.load(p) as z:
            for key in ("a", "b"):
                got = c.host(npydask.from_npy(p, key=key, device="gpu", chunks=(10, -1)).compute())
                out.append(same(got, z[key], f"{name}[{key}]"))
    return "; ".join(out)


def probe_concatenate(c: Context) -> str:
    import npydask

    wide = [data((12, 3 + i % 2), "<f8", 30 + i) for i in range(8)]
    long = [data((3 + i % 3, 5), ">i2", 40 + i) for i in range(8)]
    for i, (w, g) in enumerate(zip(wide, long)):
        np.save(c.path(f"wide/{i}.npy"), np.asfortranarray(w) if i % 4 == 0 else w)
        np.save(c.path(f"long/{i}.npy"), np.asfortranarray(g) if i % 4 == 1 else g)
    out = [
        same(
            c.host(npydask.open_dataset(os.path.dirname(c.path("wide/0.npy")), device="gpu").concatenate(axis=1).compute()),
            np.concatenate(wide, 1),
            "axis 1",
        ),
        same(
            c.host(npydask.open_dataset(os.path.dirname(c.path("long/0.npy")), device="gpu").concatenate(axis=0).compute()),
            np.concatenate(long, 0),
            "axis 0",
        ),
    ]
    return "; ".join(out)


def probe_zero_d_and_empty(c: Context) -> str:
    import npydask

    out = []
    for name, a in (("zero_d", np.array(7.5, "<f8")), ("empty", np.zeros((0, 5), "<i4"))):
        p = c.path(f"edge/{name}.npy")
        np.save(p, a)
        x = npydask.from_npy(p, device="gpu")
        out.append(same(c.host(x.compute()), a, name))
    return "; ".join(out)


def probe_stats_gpu(c: Context) -> str:
    """``npydask stats --device gpu --json`` equals ``--device cpu`` (C1 crashes with a TypeError)."""
    from npydask.cli import main

    folder = os.path.dirname(c.path("stats/0.npy"))
    for i in range(4):
        np.save(c.path(f"stats/{i}.npy"), data((20, 30), "<f4", 50 + i))
    results = {}
    for device in ("cpu", "gpu"):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["stats", folder, "--device", device, "--json"])
        if rc != 0:
            raise AssertionError(f"stats --device {device} exited {rc}: {err.getvalue().strip()[-300:]}")
        results[device] = json.loads(out.getvalue())
    if results["gpu"] != results["cpu"]:
        raise AssertionError(f"--device gpu {results['gpu']} differs from --device cpu {results['cpu']}")
    return "stats --device gpu --json equals --device cpu"


def probe_to_npy_of_device_array(c: Context) -> str:
    import npydask

    a = data((40 * c.scale, 33), "<f4", 60)
    np.save(c.path("w/src.npy"), a)
    x = npydask.from_npy(c.path("w/src.npy"), device="gpu", chunks=(7, 11))
    npydask.to_npy(x, c.path("w/out.npy"))
    return same(np.load(c.path("w/out.npy")), a, "to_npy round trip")


def _raises(call: Callable[[], Any], kind: type, text: str) -> str | None:
    """``None`` when ``call`` raises ``kind`` with ``text`` in its message; else what happened."""
    try:
        call()
    except kind as e:
        return None if text in str(e) else f"{type(e).__name__}: {str(e)[:120]}"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:120]}"
    return "no error"


def _agreement(cp: Any, kvikio: Any, work: str) -> tuple[list[str], int]:
    """Where ``cp``/``kvikio`` differ from what ``npydask.testing.strict_cupy`` claims of CuPy and kvikio."""
    import kvikio.defaults

    x, h = cp.zeros(3), np.zeros(3)
    claims: list[tuple[str, Callable[[], str | None]]] = [
        ("np.asarray raises", lambda: _raises(lambda: np.asarray(x), TypeError, "Implicit conversion")),
        ("np.stack host+device raises", lambda: _raises(lambda: np.stack([x, h]), TypeError, "Only cupy arrays")),
        ("device + host raises", lambda: _raises(lambda: x + h, TypeError, "Unsupported type")),
        ("host + device raises", lambda: _raises(lambda: h + x, TypeError, "Unsupported type")),
        ("0-d host in a comparison is fine", lambda: None if bool((cp.zeros(3) == np.array(0.0)).all()) else "False"),
        ("reductions give 0-d device arrays",
         lambda: None if isinstance(x.sum(), cp.ndarray) and x.sum().ndim == 0 else repr(type(x.sum()))),
        ("set checks the dtype", lambda: _raises(lambda: x.set(np.zeros(3, np.float32)), TypeError, "cannot be set")),
        ("pinned memory rounds up to a power of two",
         lambda: None if len(np.frombuffer(cp.cuda.alloc_pinned_memory(5000), np.uint8)) == 8192
         else str(len(np.frombuffer(cp.cuda.alloc_pinned_memory(5000), np.uint8)))),
    ]  # fmt: skip
    x[...] = np.arange(3.0)  # (host to device by assignment: allowed)
    differ = [] if x.get().tolist() == [0.0, 1.0, 2.0] else ["x[...] = host did not copy"]
    path = os.path.join(work, "eof.bin")
    with open(path, "wb") as f:
        f.write(bytes(40_000))
    buf = cp.empty(65_536, np.uint8)
    fds = len(os.listdir("/proc/self/fd"))
    with kvikio.CuFile(path, "r") as f:
        opened = len(os.listdir("/proc/self/fd")) - fds
        claims += [
            ("a small read is done at once", lambda: None if f.pread(buf, 100, 0).done() else "not done"),
            ("EOF raises in a small read", lambda: _raises(lambda: f.pread(buf, 8192, 36_000).get(), RuntimeError, "EOF")),
            ("EOF raises in a pool read", lambda: _raises(lambda: f.pread(buf, 65_536, 0).get(), RuntimeError, "EOF")),
            ("a CuFile holds two descriptors", lambda: None if opened == 2 else f"{opened}"),
            ("kvikio.defaults numbers", lambda: None if (kvikio.defaults.get("task_size"),
             kvikio.defaults.get("gds_threshold")) == (4 << 20, 16384) else "other defaults"),
        ]  # fmt: skip
        for what, check in claims:
            got = check()
            if got is not None:
                differ.append(f"{what}: {got}")
    return differ, len(claims) + 1


def probe_strict_cupy_agrees(c: Context) -> str:
    """CuPy and kvikio here behave as the CPU stand-in (``npydask.testing.strict_cupy``) claims they do.

    A difference means the strict CPU tests simulate something other than the
    device: adjust the stand-in. Dry, the same checks run against the stand-in itself.
    """
    import subprocess

    if c.dry:
        from npydask.testing import strict_cupy

        with strict_cupy.installed() as sim:
            differ, n = _agreement(sim.cupy, sim.kvikio, c.work)
        separate = "False"
    else:
        import cupy
        import kvikio

        differ, n = _agreement(cupy, kvikio, c.work)
        code = "import sys, kvikio; print('kvikio.defaults' in sys.modules)"
        separate = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    if separate != "False":
        differ.append(f"import kvikio imports kvikio.defaults ({separate!r})")
    if differ:
        raise AssertionError("the stand-in differs: " + "; ".join(differ))
    return f"CuPy and kvikio agree with the strict stand-in on {n + 1} checks"


PROBES: dict[str, Callable[[Context], str]] = {
    "from_npy_c": probe_from_npy_c,
    "from_npy_fortran": probe_from_npy_fortran,
    "big_endian": probe_big_endian,
    "roi": probe_roi,
    "npz_members": probe_npz_members,
    "concatenate": probe_concatenate,
    "zero_d_and_empty": probe_zero_d_and_empty,
    "stats_gpu": probe_stats_gpu,
    "to_npy_device": probe_to_npy_of_device_array,
    "strict_cupy_agrees": probe_strict_cupy_agrees,
}

KNOWN: dict[str, tuple[str, str]] = {
    "stats_gpu": ("TypeError", "C1: stats stacks a host np.full with device arrays"),
}
"""Probe name -> (text in the error, finding): a failure matching it is XFAIL until the fix lands."""


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError(f"probe still running after {PROBE_SECONDS} s")


def run(names: list[str], ctx: Context) -> int:
    """Run the probes; print one line each; return how many FAILed."""
    failed = 0
    tag = " (dry: numpy stands in for CuPy)" if ctx.dry else ""
    signal.signal(signal.SIGALRM, _alarm)
    for name in names:
        t0 = time.perf_counter()
        signal.alarm(PROBE_SECONDS)
        try:
            detail = PROBES[name](ctx)
            status = "PASS"
        except Exception as e:  # a probe's failure is reported, never stops the others
            detail = f"{type(e).__name__}: {str(e).strip()[:400]}"
            known = KNOWN.get(name)
            status = "XFAIL" if known and known[0] in detail and not ctx.dry else "FAIL"
            if status == "XFAIL":
                detail = f"{known[1]}; {detail}"
            traceback.print_exc(file=sys.stderr)
        finally:
            signal.alarm(0)
        failed += status == "FAIL"
        print(f"{status} {name}{tag}: {detail} ({time.perf_counter() - t0:.2f} s)", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    """Command line: run the chosen probes (all by default) and exit 1 if one FAILed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--work", required=True, help="a folder on disk for the probes' files")
    ap.add_argument("--dry-run", action="store_true", help="numpy stands in for CuPy, tiny sizes")
    ap.add_argument("--only", default="", help="comma-separated probe names")
    ap.add_argument("--scale", type=int, default=None, help="size multiplier (default 64 on a GPU, 1 dry)")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(PROBES)
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        print(f"gpu_probes: unknown probe(s) {', '.join(unknown)}; known: {', '.join(PROBES)}", file=sys.stderr)
        return 2
    os.makedirs(args.work, exist_ok=True)
    ctx = Context(args.work, args.dry_run, args.scale or (1 if args.dry_run else 64))
    failed = run(names, ctx)
    print(f"{'FAIL' if failed else 'PASS'} probes: {len(names) - failed} of {len(names)} passed or XFAIL", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
