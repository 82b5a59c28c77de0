"""The Foreground and Grid goals of ``bench_patches.py``: data, the measured runs and their goal lines.

Foreground (group ``F``): the first volumes of the patch benchmark paired
with labels holding one compact box of 1% of the volume (value 1), read by
``Loader(zip_datasets(...), 8, sampler=Foreground(patch, p=0.33,
per_file=k), shuffle=True, seed=0, with_index=True)`` over 3 epochs, 600
draws in all (200 an epoch). A draw is foreground-centred when the bound
sampler's public :meth:`~npydask.samplers.foreground.ForegroundBound.draw`
says so (its ``label`` is not ``None``); each delivered box is checked
against that draw and both members against numpy. The label reads are
measured, not inferred: both members are opened with ``backend="pread"``,
so every byte npydask reads is a read system call, and per epoch the bytes
the process read (``rchar`` of ``/proc/self/io``) less the patch bytes
``loader.stats()`` counted are what the candidate scan read. Goal: the
whole labels read once over the 3 epochs (all in the first).

Grid (group ``G``): one volume, ``Loader(ds, B, sampler=Grid(tile,
overlap=0.25), with_index=True, prefetch=1)`` -> a NumPy predictor with
two output channels (``2x+1``, ``x**2``) -> ``Stitcher(grid, ds,
weights="gaussian", sigma_scale=0.125, channels=(2,))``, against MONAI's
``sliding_window_inference(mode="gaussian", sigma_scale=0.125,
sw_batch_size=B)`` on the volume loaded whole. Peak memory: the npydask
pipeline once more with ``out=`` a folder (each plane range written as it
becomes final, so the result is not held), its NumPy allocations traced
(:mod:`tracemalloc`), against two tile batches plus one slab::

    tile batch = B x (1 + channels) x tile^3 x 4 bytes   (the input tiles and their outputs)
    slab       = (channels + 1) x tile x H x W x 4 bytes  (the Stitcher's sums per channel and its weights)

The rise of the process's peak resident memory (``VmHWM``, reset through
``/proc/self/clear_refs``) is reported beside it, and MONAI's (the input
already loaded) as information.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

import npydask
from npydask.samplers import Foreground, Grid, Stitcher

MiB = 1 << 20
F_P = 0.33
F_EPOCHS = 3
F_DRAWS = 600
F_FRACTION = 0.01
F_SEED = 0
F_READS_BAND = (0.9, 1.5)
"""The label bytes the scan read over the epochs, in whole labels, that count as "read once each"."""
G_OVERLAP = 0.25
G_SIGMA = 0.125
G_CHANNELS = 2
G_RTOL = 1e-5
G_ATOL = 1e-6


class ForegroundSize(NamedTuple):
    n_files: int
    per_file: int


class GridSize(NamedTuple):
    side: int
    tile: int
    batch: int


FOREGROUND_SIZES = {"tiny": ForegroundSize(4, 50), "small": ForegroundSize(8, 25), "full": ForegroundSize(8, 25)}
GRID_SIZES = {"tiny": GridSize(64, 16, 4), "small": GridSize(128, 32, 4), "full": GridSize(512, 128, 4)}


# ---------------------------------------------------------------------------------------------
# process counters


def rchar() -> int | None:
    """The bytes read system calls have returned to this process so far (``rchar``), or ``None``."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def peak_rss_reset() -> int | None:
    """Reset the peak resident memory (``VmHWM``) to the current one; the current ``VmRSS`` in bytes, or ``None``."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status("VmRSS")


def peak_rss() -> int | None:
    """The peak resident memory (``VmHWM``) in bytes, or ``None``."""
    return _status("VmHWM")


def _status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


# ---------------------------------------------------------------------------------------------
# foreground


def label_box(shape: Sequence[int], fraction: float, rng: np.random.Generator) -> tuple[slice, ...]:
    """One compact box of about ``fraction`` of ``shape`` (each side scaled alike), placed at random inside."""
    scale = fraction ** (1 / len(shape))
    sides = [max(1, round(n * scale)) for n in shape]
    starts = [int(rng.integers(0, n - s + 1)) for n, s in zip(shape, sides)]
    return tuple(slice(a, a + s) for a, s in zip(starts, sides))


def make_foreground_set(folder: str, images: Sequence[str]) -> tuple[str, str, float]:
    """``folder/images`` (links to ``images``) and ``folder/labels`` (uint8, one box of 1%), made where missing.

    Returns both folders and the foreground's share of a label's voxels.
    """
    rng = np.random.default_rng(20261127)
    shape = np.load(images[0], mmap_mode="r").shape
    fg = math.prod(s.stop - s.start for s in label_box(shape, F_FRACTION, np.random.default_rng(0))) / math.prod(shape)
    out = (os.path.join(folder, "images"), os.path.join(folder, "labels"))
    for d in out:
        os.makedirs(d, exist_ok=True)
    for p in images:
        name = os.path.basename(p)
        link = os.path.join(out[0], name)
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(p), link)
        box = label_box(shape, F_FRACTION, rng)  # (drawn for every file, made or not: the same boxes each run)
        label = os.path.join(out[1], name)
        if not os.path.exists(label):
            a = np.zeros(shape, np.uint8)
            a[box] = 1
            np.save(label, a)
    return out[0], out[1], fg


def foreground_dataset(images: str, labels: str) -> Any:
    """The zipped dataset of ``images`` and ``labels``, both read with ``pread`` (every byte a read call)."""
    return npydask.zip_datasets(
        {"image": npydask.open_dataset(images, backend="pread"), "label": npydask.open_dataset(labels, backend="pread")}
    )


def run_foreground(images: str, labels: str, patch: int, fsize: ForegroundSize, batch: int) -> dict[str, Any]:
    """3 epochs of the Foreground loader: per epoch its time, draws, scan bytes; every sample checked."""
    ds = foreground_dataset(images, labels)
    sampler = Foreground((patch,) * 3, p=F_P, per_file=fsize.per_file)
    loader = npydask.Loader(ds, batch, sampler=sampler, shuffle=True, seed=F_SEED, with_index=True)
    names = sorted(n for n in os.listdir(images) if n.endswith(".npy"))
    maps = {
        k: [np.load(os.path.join(d, n), mmap_mode="r") for n in names]
        for k, d in (("image", images), ("label", labels))
    }
    label_bytes = sum(m.nbytes for m in maps["label"])
    out: dict[str, Any] = {
        "times": [],
        "draws": 0,
        "centred": 0,
        "with_foreground": 0,
        "scan_bytes": [],
        "bad": 0,
        "label_bytes": label_bytes,
        "per_epoch": 0,
    }
    for epoch in range(F_EPOCHS):
        loader.set_epoch(epoch)
        r0, t0 = rchar(), time.perf_counter()
        got = list(loader)
        t1, r1 = time.perf_counter(), rchar()
        stats = loader.stats()
        out["times"].append(t1 - t0)
        out["scan_bytes"].append(None if r0 is None or r1 is None else r1 - r0 - stats.bytes_read)
        position = 0
        for b, index in got:
            for j, (f, a, z) in enumerate(zip(index["file"], index["start"], index["stop"])):
                file, d = loader.bound.draw(epoch, position, seed=F_SEED, shuffle=True)
                box = tuple(slice(int(x), int(y)) for x, y in zip(a, z))
                same = file == int(f) and tuple(d.start) == tuple(int(x) for x in a)
                for key in ("image", "label"):
                    want = maps[key][int(f)][box]
                    same = same and b[key][j].dtype == want.dtype and np.array_equal(b[key][j], want)
                out["bad"] += not same
                out["centred"] += d.class_index is not None
                out["with_foreground"] += bool(b["label"][j].any())
                position += 1
        out["draws"] += position
        out["per_epoch"] = position
    return out


def band(p: float, n: int) -> tuple[float, float]:
    """``p`` plus and minus 3 binomial standard deviations of a fraction of ``n`` draws."""
    sd = math.sqrt(p * (1 - p) / n)
    return p - 3 * sd, p + 3 * sd


def nnunet_rule(batch: int, p: float) -> tuple[float, str]:
    """nnU-Net's per-batch rule: sample ``i`` is forced foreground iff ``not i < round(batch * (1 - p))``."""
    first = round(batch * (1 - p))
    forced = [i for i in range(batch) if not i < first]
    where = f"positions {forced[0]}-{forced[-1]}" if forced else "none"
    text = (
        f"nnU-Net's rule, batch of {batch}: sample i forced foreground iff not i < round({batch} x (1 - {p:g})) "
        f"= {first}: {len(forced)} of {batch}, {where} of every batch"
    )
    return len(forced) / batch, text


def foreground_goals(fg: dict[str, Any] | None, batch: int) -> list[dict[str, Any]]:
    """The goal lines of the Foreground group (n/a when it did not run)."""
    n = F_DRAWS
    lo, hi = band(F_P, n)
    text = f"P-foreground: foreground-centred draws, p={F_P:g}, {n} over {F_EPOCHS} epochs (within p +/- 3 sd)"
    reads = f"P-foreground: label payload read by the candidate scan over {F_EPOCHS} epochs (once each)"
    if fg is None:
        return [_line(text, None, "", None), _line(reads, None, "", None)]
    frac = fg["centred"] / fg["draws"] if fg["draws"] else 0.0
    out = [
        _line(
            f"P-foreground: foreground-centred draws, p={F_P:g}, {fg['draws']} over {F_EPOCHS} epochs "
            "(within p +/- 3 sd)",
            f"{frac:.3f} ({fg['centred']} of {fg['draws']})",
            f"{lo:.3f}..{hi:.3f}",
            lo <= frac <= hi and fg["draws"] == n,
            value=frac,
        )
    ]
    scans = fg["scan bytes by epoch"]
    if any(s is None for s in scans):
        out.append(_line(reads, None, "", None, why="/proc/self/io is not readable here"))
    else:
        whole = [s / fg["label payload bytes"] for s in scans]
        total = sum(whole)
        out.append(
            _line(
                reads,
                f"{total:.2f}x the labels (by epoch: {' / '.join(f'{w:.2f}' for w in whole)})",
                f"{F_READS_BAND[0]:g}..{F_READS_BAND[1]:g}x",
                F_READS_BAND[0] <= total < F_READS_BAND[1],
                value=total,
            )
        )
    rule, rule_text = nnunet_rule(batch, F_P)
    out.append(_line(f"(info) P-foreground beside it, {rule_text}", f"{rule:.3f}", "", "info"))
    out.append(
        _line(
            "(info) P-foreground: patches whose label holds foreground",
            f"{fg['with foreground'] / max(1, fg['draws']):.3f}",
            "",
            "info",
        )
    )
    return out


def _line(
    goal: str, measured: str | None, target: str, ok: bool | str | None, *, value: float | None = None, why: str = ""
) -> dict[str, Any]:
    """A goal line as bench_patches.py's report prints it and its JSON records it."""
    if measured is None:
        return {
            "goal": goal,
            "measured": "n/a",
            "target": target,
            "verdict": "n/a",
            "why": why,
            "value": None,
            "limit": None,
            "pass": None,
        }
    verdict = ok if isinstance(ok, str) else ("PASS" if ok else "FAIL")
    return {
        "goal": goal,
        "measured": measured,
        "target": target,
        "verdict": verdict,
        "value": value,
        "limit": None,
        "pass": ok if isinstance(ok, bool) else None,
    }


# ---------------------------------------------------------------------------------------------
# grid


def predict(x: np.ndarray) -> np.ndarray:
    """The model: ``(B, *tile)`` -> ``(B, 2, *tile)`` float32, channels ``2x+1`` and ``x**2``."""
    out = np.empty((x.shape[0], G_CHANNELS, *x.shape[1:]), np.float32)
    np.multiply(x, 2, out=out[:, 0])
    out[:, 0] += 1
    np.square(x, out=out[:, 1])
    return out


def npydask_grid(folder: str, gsize: GridSize, out: str | None = None) -> tuple[list[Any], int]:
    """The whole pipeline: Loader over the Grid's tiles -> ``predict`` -> gaussian Stitcher; results and tiles."""
    ds = npydask.open_dataset(folder)
    grid = Grid((gsize.tile,) * 3, overlap=G_OVERLAP)
    loader = npydask.Loader(ds, gsize.batch, sampler=grid, with_index=True, prefetch=1)
    assert loader.bound is not None
    stitcher = Stitcher(loader.bound, ds, weights="gaussian", sigma_scale=G_SIGMA, channels=(G_CHANNELS,), out=out)
    n = 0
    for x, index in loader:
        stitcher.add(predict(x), index)
        n += len(x)
    return stitcher.result(), n


def memory_bound(gsize: GridSize) -> tuple[int, str]:
    """Two tile batches plus one slab, in bytes, and the formula."""
    t, b, c = gsize.tile, gsize.batch, G_CHANNELS
    batch = b * (1 + c) * t**3 * 4
    slab = (c + 1) * t * gsize.side**2 * 4
    return 2 * batch + slab, (
        f"2 x tile batch (B={b} x (1 + {c} channels) x {t}^3 x 4 B = {batch / MiB:.1f} MiB) + "
        f"slab ((1 + {c}) x {t} x {gsize.side}^2 x 4 B = {slab / MiB:.1f} MiB)"
    )


def traced_peak(fn: Callable[[], Any]) -> int:
    """``fn()``'s peak of traced allocations (NumPy's among them) above their level at the start, in bytes."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def monai_grid(path: str, gsize: GridSize) -> Callable[..., np.ndarray]:
    """MONAI: the volume loaded whole, ``sliding_window_inference(mode="gaussian", sigma_scale=0.125)``."""
    import torch
    from monai.inferers import sliding_window_inference

    def predictor(x: Any) -> Any:
        return torch.cat([2 * x + 1, x * x], dim=1)

    def run(volume: np.ndarray | None = None) -> np.ndarray:
        x = torch.from_numpy(np.load(path) if volume is None else volume)[None, None]
        with torch.no_grad():
            y = sliding_window_inference(
                x,
                roi_size=(gsize.tile,) * 3,
                sw_batch_size=gsize.batch,
                predictor=predictor,
                overlap=G_OVERLAP,
                mode="gaussian",
                sigma_scale=G_SIGMA,
            )
        return np.asarray(y[0].numpy())

    return run


def peak_in_child(way: str, path: str, gsize: GridSize) -> int | None:
    """The rise of a fresh process's peak resident memory over one run of ``way`` (``"npydask"`` or ``"monai"``).

    Measured in a child, so that memory an earlier run freed (and the
    allocator kept) cannot hide it; MONAI's from after its input is loaded,
    npydask's (``out=`` a folder) from after its imports. ``None`` where the
    child could not tell.
    """
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), way, path, *map(str, gsize)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    last = done.stdout.strip().rpartition("\n")[2]
    return int(last) if done.returncode == 0 and last.lstrip("-").isdigit() else None


def _child(way: str, path: str, gsize: GridSize) -> None:
    import tempfile

    if way == "monai":
        run = monai_grid(path, gsize)
        volume = np.load(path)
        base = peak_rss_reset()
        run(volume)
    else:
        with tempfile.TemporaryDirectory(prefix="npydask-bench-grid-") as out:
            base = peak_rss_reset()
            npydask_grid(os.path.dirname(path), gsize, out=out)
    top = peak_rss()
    print(-1 if base is None or top is None else top - base)


def compare(got: np.ndarray, want: Any) -> dict[str, Any]:
    """``allclose(got, want, rtol, atol)`` with the largest differences, a few planes at a time.

    ``want`` is an array of ``got``'s shape, or a function of a plane range
    ``(a, b)`` giving ``got[:, a:b]``'s expected values.
    """
    ok, most_abs, most_rel = True, 0.0, 0.0
    depth = got.shape[1]
    for a in range(0, depth, 16):
        b = min(a + 16, depth)
        g = got[:, a:b].astype(np.float64)
        w = np.asarray(want(a, b) if callable(want) else want[:, a:b], np.float64)
        if g.shape != w.shape:
            return {"shape": list(got.shape), "allclose": False, "why": f"shapes differ at planes {a}:{b}"}
        ok = ok and bool(np.allclose(g, w, G_RTOL, G_ATOL))
        diff = np.abs(g - w)
        most_abs = max(most_abs, float(diff.max()))
        nz = w != 0
        if nz.any():
            most_rel = max(most_rel, float((diff[nz] / np.abs(w[nz])).max()))
    return {
        "shape": list(got.shape),
        "allclose": ok,
        "rtol": G_RTOL,
        "atol": G_ATOL,
        "max abs diff": most_abs,
        "max rel diff": most_rel,
    }


def numpy_oracle(path: str) -> Callable[[int, int], np.ndarray]:
    """The exact stitched values of planes ``a:b``: ``predict`` is per voxel, so every average is ``predict(x)``."""
    x = np.load(path, mmap_mode="r")
    return lambda a, b: predict(np.asarray(x[a:b])[None])[0]


def grid_goals(g: dict[str, Any] | None, gsize: GridSize) -> list[dict[str, Any]]:
    """The goal lines of the Grid group (n/a when it did not run, or without MONAI)."""
    tiles = f"{gsize.side}^3 float32, {gsize.tile}^3 tiles, overlap {G_OVERLAP:g}, 2 channels"
    equal = (
        f"P-grid: npydask Stitcher(gaussian) equals MONAI sliding_window_inference ({tiles}; rtol {G_RTOL:g}, "
        f"atol {G_ATOL:g})"
    )
    memory = "P-grid: npydask pipeline's peak traced memory / (2 tile batches + 1 slab)"
    if g is None:
        return [_line(equal, None, "", None), _line(memory, None, "", None)]
    c = g.get("vs MONAI")
    out = [
        _line(equal, None, "", None, why=g.get("MONAI n/a", ""))
        if c is None
        else _line(equal, f"max rel diff {c['max rel diff']:.1e}", "allclose", c["allclose"], value=c["max rel diff"])
    ]
    ratio = g["peak traced"] / g["bound"]
    out.append(
        _line(
            memory,
            f"{ratio:.2f}x ({g['peak traced'] / MiB:.1f} of {g['bound'] / MiB:.1f} MiB)",
            "<= 1.00x",
            ratio <= 1.0,
            value=ratio,
        )
    )
    for who, key, what in (
        ("npydask", "peak RSS rise", "above its imports (the input's mapped pages included)"),
        ("MONAI", "MONAI peak RSS rise", "above its loaded input"),
    ):
        if g.get(key) is not None:
            out.append(
                _line(
                    f"(info) P-grid: {who}'s peak resident memory {what}, a fresh process",
                    f"{g[key] / MiB:.1f} MiB",
                    "",
                    "info",
                )
            )
    return out


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], GridSize(*map(int, sys.argv[3:6])))
