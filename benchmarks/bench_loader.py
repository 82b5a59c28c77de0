"""Training-loader throughput: ``npydask.Loader`` against PyTorch's usual ``DataLoader`` recipe.

Data: the volumes and the small files of ``bench_dataset.py`` (same sizes,
same folders, so ``--data DIR`` shares them): ``full`` is 64 volumes of
64x256x256 float32 and 20,000 files of 32x32 float32.

For each set, one epoch is timed per run (samples/s = files / median time):

* reference: ``torch.utils.data.DataLoader(num_workers=2)`` over a map-style
  dataset returning ``torch.from_numpy(np.load(f))`` (the usual recipe;
  worker start-up included, as every epoch pays it without
  ``persistent_workers``);
* ``npydask.Loader`` with ``prefetch=2`` (threads) and ``prefetch=0``;
* ``npydask.torch.NpyIterableDataset`` through a ``DataLoader`` with 0 and 2
  workers.

Batches: 4 volumes, or 256 small files. One untimed epoch of every variant
is compared with numpy first (same samples, same values). The page cache is
re-warmed before every run. Goal (issue 5): ``npydask.Loader`` >= 1.5x the
reference's samples/s on both sets. The exit status is 1 only when results
disagree.

Usage::

    python benchmarks/bench_loader.py [--size tiny|small|full] [--repeat N] [--data DIR] [--json out.json]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from bench_dataset import SIZES, make_data  # noqa: E402

import npydask  # noqa: E402

GOAL = 1.5
BATCH = {"volumes": 4, "small": 256}


def torch_or_none() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


class _NpLoad:
    """The usual map-style dataset: one ``np.load`` per sample."""

    def __init__(self, files: list[str], torch: Any) -> None:
        self.files, self.torch = files, torch

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        return self.torch.from_numpy(np.load(self.files[i]))


def variants(files: list[str], root: str, batch: int, torch: Any) -> dict[str, Callable[[], Any]]:
    """name -> a function that runs one epoch and returns its batches' sample ids (first cell)."""
    ds = npydask.open_dataset(root)

    out: dict[str, Callable[[], Any]] = {}
    if torch is not None:
        from npydask.torch import NpyIterableDataset

        out["torch DataLoader(num_workers=2) over np.load"] = lambda: torch.utils.data.DataLoader(
            _NpLoad(files, torch), batch_size=batch, num_workers=2
        )
    out["npydask.Loader(prefetch=2)"] = lambda: npydask.Loader(ds, batch, prefetch=2)
    out["npydask.Loader(prefetch=0)"] = lambda: npydask.Loader(ds, batch, prefetch=0)
    if torch is not None:
        out["DataLoader(NpyIterableDataset, num_workers=0)"] = lambda: torch.utils.data.DataLoader(
            NpyIterableDataset(ds), batch_size=batch, num_workers=0
        )
        out["DataLoader(NpyIterableDataset, num_workers=2)"] = lambda: torch.utils.data.DataLoader(
            NpyIterableDataset(ds), batch_size=batch, num_workers=2
        )
    return out


def epoch_ids(loader: Any) -> list[float]:
    """Run one epoch; the first cell of every sample, in order (for the correctness check)."""
    ids: list[float] = []
    for b in loader:
        a = b.numpy() if hasattr(b, "numpy") else np.asarray(b)
        ids += a.reshape(len(a), -1)[:, 0].tolist()
    return ids


def run_epoch(loader: Any) -> int:
    n = 0
    for b in loader:
        n += len(b)
    return n


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(__doc__.splitlines()[0], default_size="small", default_repeat=3)
    p.add_argument("--data", help="folder for the data sets (kept; default: a temporary folder)")
    args = p.parse_args(argv)
    size = SIZES[args.size]
    torch = torch_or_none()
    folder = args.data or tempfile.mkdtemp(prefix="npydask-bench-loader-")
    try:
        volumes, small = make_data(folder, size)
        rows, results, ok = [], [], True
        ratios: dict[str, float] = {}
        for name, files in (("volumes", volumes), ("small", small)):
            root = os.path.dirname(files[0])
            batch = BATCH[name]
            expected = [float(np.load(f).reshape(-1)[0]) for f in files]
            ref_rate = None
            for variant, make in variants(files, root, batch, torch).items():
                _common.warm_page_cache(files)
                got = epoch_ids(make())
                # DataLoader workers of an IterableDataset take turns yielding batches: same samples,
                # each once, in another order
                interleaved = "NpyIterableDataset, num_workers=2" in variant
                if (sorted(got) if interleaved else got) != (sorted(expected) if interleaved else expected):
                    print(f"MISMATCH: {name} / {variant} gives other samples than numpy", file=sys.stderr)
                    ok = False
                    continue
                times, count = _common.measure(  # (both closures run here, in this iteration)
                    lambda make=make: run_epoch(make()),
                    args.repeat,
                    setup=partial(_common.warm_page_cache, files),
                )
                t = _common.median(times)
                rate = count / t
                if ref_rate is None:
                    ref_rate = rate  # the first variant is the reference
                ratio = rate / ref_rate
                if variant == "npydask.Loader(prefetch=2)":
                    ratios[name] = ratio
                rows.append([name, variant, _common.fmt_seconds(t), f"{rate:,.0f}", f"{ratio:.2f}x"])
                results.append({"set": name, "variant": variant, "median_s": t, "samples_per_s": rate, "ratio": ratio})
        print(
            f"# size={args.size}: {len(volumes)} volumes of {size.volume_shape}, {len(small)} files of "
            f"{size.small_shape} (float32); batches of {BATCH['volumes']} and {BATCH['small']}; "
            f"median of {args.repeat}; ratio: samples/s over the first row of the set"
        )
        _common.table(rows, ["set", "variant", "epoch", "samples/s", "ratio"])
        print()
        verdicts = []
        for name, r in ratios.items():
            verdict = "n/a (torch missing)" if torch is None else ("PASS" if r >= GOAL else "FAIL")
            verdicts.append(
                [
                    f"P-loader {name}: npydask.Loader / DataLoader(np.load, 2 workers)",
                    f"{r:.2f}x",
                    f">= {GOAL:.2f}x",
                    verdict,
                ]
            )
        _common.table(verdicts, ["goal", "measured", "target", "verdict"])
        print(f"# samples equal numpy in every variant: {'yes' if ok else 'NO'}")
        if args.json:
            _common.write_json(args.json, {"results": results, "size": args.size})
        return 0 if ok else 1
    finally:
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
