"""A training loop on synthetic volumes with ``npydask.Loader`` (and PyTorch when installed).

Writes a folder of synthetic MRI-like volumes (noise, plus a bright blob in
half of them: the label), opens them as a dataset cut to a fixed ROI around
the centre (DALI-style ``roi_start``/``roi_shape``, padded where a volume is
too small), and trains a tiny classifier for a few epochs with shuffled,
sharded, prefetched batches. Labels are joined through ``with_index=True``.
Half-way through an epoch it saves the loader's ``state_dict()`` and shows
that a fresh loader resumes with exactly the remaining batches.

Run::

    python examples/train_loop.py [--size tiny|small] [--out DIR] [--epochs N]

Without PyTorch the same loop runs a NumPy logistic regression.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

import npydask

SIZES = {"tiny": (24, (20, 40, 40)), "small": (200, (48, 96, 96))}
ROI = (16, 32, 32)


def make_volumes(folder: str, n: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """``n`` noisy volumes of slightly different depths; half hold a bright blob. Returns the labels."""
    labels = rng.integers(0, 2, n)
    for i, label in enumerate(labels):
        depth = shape[0] - int(rng.integers(0, 6))  # ragged depths: the ROI pads the short ones
        vol = rng.normal(0.0, 1.0, (depth, *shape[1:])).astype(np.float32)
        if label:
            z, y, x = depth // 2, shape[1] // 2, shape[2] // 2
            vol[z - 3 : z + 3, y - 4 : y + 4, x - 4 : x + 4] += 3.0
        np.save(os.path.join(folder, f"vol{i:04d}.npy"), vol)
    return labels.astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--out", help="folder for the volumes (default: a temporary folder)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args(argv)

    n, shape = SIZES[args.size]
    folder = args.out or tempfile.mkdtemp(prefix="npydask-train-")
    os.makedirs(folder, exist_ok=True)
    try:
        return _run(args, folder, n, shape)
    finally:
        if not args.out:
            shutil.rmtree(folder, ignore_errors=True)


def _run(args: argparse.Namespace, folder: str, n: int, shape: tuple[int, ...]) -> int:
    labels = make_volumes(folder, n, shape, np.random.default_rng(0))

    start = [(s - r) // 2 for s, r in zip(shape, ROI)]
    ds = npydask.open_dataset(folder, roi_start=start, roi_shape=ROI, out_of_bounds_policy="pad", fill_value=0)
    print(f"dataset: {ds}")
    loader = npydask.Loader(ds, args.batch_size, shuffle=True, seed=1, prefetch=2, with_index=True)
    print(f"loader: {loader}")

    model = _model()
    for epoch in range(args.epochs):
        t0, losses = time.perf_counter(), []
        for batch, idx in loader:
            losses.append(model.step(batch, labels[idx]))
        print(
            f"epoch {epoch}: mean loss {np.mean(losses):.4f} over {len(losses)} batches "
            f"({time.perf_counter() - t0:.2f} s)"
        )

    # Resume: stop half-way, save the state, and let a fresh loader finish the epoch.
    whole = [idx.tolist() for _, idx in loader]
    loader.set_epoch(loader.epoch - 1)
    it = iter(loader)
    head = [next(it)[1].tolist() for _ in range(len(loader) // 2)]
    state = loader.state_dict()
    del it
    fresh = npydask.Loader(ds, args.batch_size, shuffle=True, seed=1, prefetch=2, with_index=True)
    fresh.load_state_dict(state)
    tail = [idx.tolist() for _, idx in fresh]
    resumed = head + tail == whole
    print(
        f"resume from state_dict at batch {state['batches_done']} of epoch {state['epoch']}: "
        f"{'same batches' if resumed else 'DIFFERENT batches'}"
    )
    accuracy = model.accuracy(ds, labels)
    print(f"training accuracy: {accuracy:.2f}")
    return 0 if resumed else 1


def _model():
    try:
        import torch
    except ImportError:
        return _NumpyModel()
    return _TorchModel(torch)


class _TorchModel:
    """Mean of the central voxels -> logistic unit, with torch autograd."""

    def __init__(self, torch):
        self.torch = torch
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.AvgPool3d(4), torch.nn.Flatten(), torch.nn.LazyLinear(1))
        self.net(torch.zeros((1, *ROI)).unsqueeze(1))  # materialise the lazy layer
        self.opt = torch.optim.Adam(self.net.parameters(), lr=0.05)

    def step(self, batch: np.ndarray, y: np.ndarray) -> float:
        t = self.torch
        x = t.from_numpy(batch).unsqueeze(1)  # no copy: Loader batches are writable arrays
        loss = t.nn.functional.binary_cross_entropy_with_logits(self.net(x).squeeze(1), t.from_numpy(y))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def accuracy(self, ds, labels: np.ndarray) -> float:
        with self.torch.no_grad():
            x = self.torch.from_numpy(ds.stack().compute()).unsqueeze(1)
            pred = (self.net(x).squeeze(1) > 0).numpy()
        return float(np.mean(pred == labels.astype(bool)))


class _NumpyModel:
    """The same idea without torch: logistic regression on the central block's mean."""

    def __init__(self):
        self.w, self.b = 0.0, 0.0

    @staticmethod
    def feature(batch: np.ndarray) -> np.ndarray:
        c = [s // 2 for s in ROI]
        return batch[:, c[0] - 3 : c[0] + 3, c[1] - 4 : c[1] + 4, c[2] - 4 : c[2] + 4].mean(axis=(1, 2, 3))

    def step(self, batch: np.ndarray, y: np.ndarray) -> float:
        f = self.feature(batch)
        p = 1 / (1 + np.exp(-(self.w * f + self.b)))
        self.w -= 0.5 * float(np.mean((p - y) * f))
        self.b -= 0.5 * float(np.mean(p - y))
        return float(-np.mean(y * np.log(p + 1e-9) + (1 - y) * np.log(1 - p + 1e-9)))

    def accuracy(self, ds, labels: np.ndarray) -> float:
        f = self.feature(ds.stack().compute())
        return float(np.mean(((self.w * f + self.b) > 0) == labels.astype(bool)))


if __name__ == "__main__":
    raise SystemExit(main())
