"""Sample archives for the tests of several .npz members per sample (``open_dataset(..., key=[...])``).

:func:`write_archives` writes ``N`` archives of members ``x`` (big-endian 4x6), ``y`` (0-d) and
``m`` (uint8 3x5x2); :func:`load_member` is numpy's answer; :func:`open_archives` opens them as
one dataset. Used by ``tests/dataset/test_multikey.py`` and ``tests/test_ray.py``.
"""

from __future__ import annotations

import os

import numpy as np

import npydask

N = 11


def member_arrays(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    return {
        "x": rng.standard_normal((4, 6)).astype(">f4"),  # big-endian: batches come back native
        "y": np.int64(i * 7),  # 0-d
        "m": rng.integers(0, 255, (3, 5, 2), dtype=np.uint8),
    }


def write_archives(root: str, compressed: bool, n: int = N) -> list[str]:
    save = np.savez_compressed if compressed else np.savez
    paths = []
    for i in range(n):
        p = os.path.join(root, f"s{i:03d}.npz")
        save(p, **member_arrays(i))
        paths.append(p)
    return paths


def load_member(path: str, key: str) -> np.ndarray:
    with np.load(path) as z:
        return z[key]


def open_archives(paths, **kw):
    return npydask.open_dataset(os.path.dirname(paths[0]), file_filter="*.npz", key=["x", "y", "m"], **kw)
