"""Patch training on image and label volumes, then sliding-window inference, with PyTorch on the CPU.

Writes a folder of noisy volumes and a folder of their labels (a bright box
to segment) with the same file names, pairs them with ``zip_datasets``, and
trains a tiny 3-D convolutional network on patches that a ``Foreground``
sampler centres on the label half of the time. Half-way through it saves a
checkpoint (the model, the optimiser and the loader's ``state_dict()``),
then resumes from it in fresh objects and checks that the resumed loader
delivers exactly the batches an uninterrupted run would have. Last, it
predicts every volume tile by tile (``Grid``) and blends the tiles back into
whole volumes (``Stitcher``). Every patch it checks equals numpy's slice of
the file.

Run::

    python examples/patch_train.py [--out DIR] [--epochs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import torch

import npydask
from npydask.samplers import Foreground, Grid, Stitcher

SHAPE = (32, 48, 48)
PATCH = (16, 32, 32)
CASES = 6


def make_cases(folder: str, rng: np.random.Generator) -> None:
    """``images/case_i.npy`` (float32 noise plus the label) and ``labels/case_i.npy`` (uint8, one box)."""
    for sub in ("images", "labels"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    for i in range(CASES):
        label = np.zeros(SHAPE, np.uint8)
        z, y, x = (int(rng.integers(0, n - 10)) for n in SHAPE)
        label[z : z + 8, y : y + 10, x : x + 10] = 1
        image = rng.normal(0.0, 0.5, SHAPE).astype(np.float32) + label
        np.save(os.path.join(folder, "images", f"case_{i}.npy"), image)
        np.save(os.path.join(folder, "labels", f"case_{i}.npy"), label)


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(
        torch.nn.Conv3d(1, 4, kernel_size=3, padding=1), torch.nn.ReLU(), torch.nn.Conv3d(4, 1, kernel_size=1)
    )
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def make_loader(pairs: Any) -> npydask.Loader:
    sampler = Foreground(PATCH, p=0.5, per_file=4)  # half the patches hold a labelled voxel
    return npydask.Loader(pairs, batch_size=4, sampler=sampler, shuffle=True, seed=0, with_index=True)


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> float:
    x = torch.from_numpy(batch["image"])[:, None]  # (B, 1, *PATCH): no copy
    y = torch.from_numpy(batch["label"])[:, None].float()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def same_as_numpy(pairs: Any, batch: dict, index: dict) -> bool:
    """Every patch of the batch equals numpy's slice of its image and label files."""
    ok = True
    for j, f in enumerate(index["file"]):
        box = tuple(slice(a, b) for a, b in zip(index["start"][j], index["stop"][j]))
        for key, member in pairs.members.items():
            ok &= bool(np.array_equal(batch[key][j], np.load(member.files[f])[box]))
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for the volumes (default: a temporary folder, removed)")
    p.add_argument("--epochs", type=int, default=2, help="training epochs (the first one interrupted and resumed)")
    args = p.parse_args(argv)
    folder = args.out or tempfile.mkdtemp(prefix="npydask-patches-")
    try:
        return _run(folder, max(1, args.epochs))
    finally:
        if not args.out:
            shutil.rmtree(folder, ignore_errors=True)


def _run(folder: str, epochs: int) -> int:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    make_cases(folder, np.random.default_rng(0))
    images = npydask.open_dataset(os.path.join(folder, "images"))
    pairs = npydask.zip_datasets({"image": images, "label": npydask.open_dataset(os.path.join(folder, "labels"))})

    # Training, interrupted half-way through the first epoch, just after a checkpoint.
    model, optimizer = make_model()
    loader = make_loader(pairs)
    half = len(loader) // 2
    losses, checked = [], True
    checkpoint = os.path.join(folder, "checkpoint.pt")
    for i, (batch, index) in enumerate(loader):
        checked &= same_as_numpy(pairs, batch, index)
        losses.append(step(model, optimizer, batch))
        if i + 1 == half:
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()},
                checkpoint,
            )
            break  # (the job stops here)

    # Resuming: fresh objects from the checkpoint continue the same epoch, then train on.
    uninterrupted = [index["start"].tolist() for _, index in make_loader(pairs)][half:]
    state = torch.load(checkpoint)
    model, optimizer = make_model()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader = make_loader(pairs)
    loader.load_state_dict(state["loader"])
    rest = []
    for epoch in range(epochs):
        for batch, index in loader:  # epoch 0: the batches not delivered before the checkpoint
            if epoch == 0:
                rest.append(index["start"].tolist())
            checked &= same_as_numpy(pairs, batch, index)
            losses.append(step(model, optimizer, batch))
    print(
        f"resumed after {half} of {len(loader)} batches: {len(rest)} left, the same batches as an "
        f"uninterrupted run: {rest == uninterrupted}"
    )
    print(
        f"{len(losses)} steps on batches of 4 patches {PATCH}: loss {np.mean(losses[:3]):.3f} -> "
        f"{np.mean(losses[-3:]):.3f} (means of the first and last three)"
    )

    # Sliding-window inference: tiles in, whole volumes out.
    grid = Grid(PATCH, overlap=0.25)
    stitcher = Stitcher(grid, images, weights="gaussian")
    identity = Stitcher(grid, images, weights="gaussian")  # blending the input itself gives the input back
    model.eval()
    with torch.no_grad():
        for x, index in npydask.Loader(images, batch_size=4, sampler=grid, with_index=True):
            stitcher.add(torch.sigmoid(model(torch.from_numpy(x)[:, None]))[:, 0].numpy(), index)
            identity.add(x, index)
    probabilities = stitcher.result()
    shapes_ok = all(pr.shape == SHAPE for pr in probabilities)
    blended_ok = all(np.allclose(v, np.load(f), atol=1e-5) for v, f in zip(identity.result(), images.files))
    labels = [np.load(f) for f in pairs.members["label"].files]
    dice = np.mean(
        [2 * ((pr > 0.5) & (lb == 1)).sum() / ((pr > 0.5).sum() + lb.sum()) for pr, lb in zip(probabilities, labels)]
    )
    print(
        f"stitched {len(probabilities)} volumes of {SHAPE}: {shapes_ok}; blended input equals the files: "
        f"{blended_ok}; dice {dice:.2f}"
    )
    print(f"every patch equal to numpy: {checked}")
    ok = checked and shapes_ok and blended_ok and rest == uninterrupted and len(rest) > 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
