"""Data sets of ``.npy`` files for the benchmark scripts, written once and reused, and npydask's caches.

Kept apart from :mod:`_common` (standard library only) because it needs numpy
and npydask.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DatasetSize:
    """The volumes (with a ROI) and the small files of one ``--size``."""

    n_volumes: int
    volume_shape: tuple[int, ...]
    roi_start: tuple[int, ...]
    roi_shape: tuple[int, ...]
    n_small: int
    small_shape: tuple[int, ...]
    roi_volumes: int = 0
    """Volumes of ``volume_shape`` the ROI benchmark cuts (0: ``n_volumes``, the same files)."""

    @property
    def n_roi_volumes(self) -> int:
        """How many volumes the ROI benchmark reads."""
        return self.roi_volumes or self.n_volumes


DATASET_SIZES = {
    "tiny": DatasetSize(4, (16, 64, 64), (0, 20, 20), (16, 16, 16), 200, (32, 32)),
    "small": DatasetSize(16, (32, 256, 256), (0, 100, 100), (32, 32, 32), 5_000, (32, 32)),
    # (P3 at full size: 256 distinct volumes, 4 GiB, so one run takes ~50 ms and its ratios hold to 10%)
    "full": DatasetSize(64, (64, 256, 256), (16, 100, 100), (32, 32, 32), 20_000, (32, 32), roi_volumes=256),
}


def npy_size(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of an ``np.save`` file of ``shape`` and ``dtype`` (a version 1.0 header)."""
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return len(buf.getvalue()) + int(np.prod(shape)) * dtype.itemsize


def make_set(
    folder: str, prefix: str, n: int, shape: tuple[int, ...], rng: np.random.Generator, dtype: np.dtype
) -> tuple[list[str], int]:
    """``n`` random float files of ``shape`` in ``folder``; only missing or wrong-sized ones are written.

    Returns the paths (named ``PREFIX-NUMBER.npy``, in order) and how many
    were written. Raises ``SystemExit`` if ``folder`` holds other ``.npy``
    files (a dataset opened on the folder would read them too).
    """
    os.makedirs(folder, exist_ok=True)
    width = len(str(n - 1))
    files = [os.path.join(folder, f"{prefix}-{i:0{width}d}.npy") for i in range(n)]
    expected = npy_size(shape, dtype)
    made = 0
    for p in files:
        try:
            if os.stat(p).st_size == expected:
                continue
        except FileNotFoundError:
            pass
        np.save(p, rng.random(shape, dtype=dtype))
        made += 1
    names = {e.name for e in os.scandir(folder) if e.name.endswith(".npy")}
    strays = sorted(names - {os.path.basename(p) for p in files})
    if strays:
        raise SystemExit(
            f"{folder} holds {len(strays)} .npy files this benchmark did not write "
            f"(e.g. {strays[0]}); open_dataset would read them too: remove them"
        )
    return files, made


F4 = np.dtype("<f4")  # the default dtype of the benchmark data


def make_data(folder: str, size: DatasetSize, dtype: np.dtype = F4) -> tuple[list[str], list[str]]:
    """The volumes and the small files of ``size`` under ``folder``, written only where missing.

    Each set lives in a folder of its own named after its size (e.g.
    ``volumes-64x64x256x256``), so scripts sharing a ``--data`` folder share
    the files.
    """
    rng = np.random.default_rng(20260802)
    vshape = "x".join(map(str, (size.n_volumes, *size.volume_shape)))
    sshape = "x".join(map(str, (size.n_small, *size.small_shape)))
    volumes, a = make_set(
        os.path.join(folder, f"volumes-{vshape}"), "vol", size.n_volumes, size.volume_shape, rng, dtype
    )
    small, b = make_set(os.path.join(folder, f"small-{sshape}"), "s", size.n_small, size.small_shape, rng, dtype)
    if a or b:
        os.sync()
    return volumes, small


def make_roi_volumes(folder: str, size: DatasetSize, dtype: np.dtype = F4) -> list[str]:
    """The volumes the ROI benchmark reads: ``make_data``'s own when the counts agree, else a set of their own.

    The set lives in ``volumes-COUNTxSHAPE`` like the others (written once,
    only where missing), so a count of its own gets a folder of its own.
    """
    n = size.n_roi_volumes
    vshape = "x".join(map(str, (n, *size.volume_shape)))
    rng = np.random.default_rng(20261123)
    files, made = make_set(os.path.join(folder, f"volumes-{vshape}"), "vol", n, size.volume_shape, rng, dtype)
    if made:
        os.sync()
    return files


def sum_one_by_one(arrays: list[np.ndarray]) -> np.float32:
    """``np.sum`` of each array in turn, added up in float32: the in-memory floor of a dataset's sum."""
    total = np.float32(0)
    for a in arrays:
        total += np.sum(a)
    return total


def clear_npydask_caches() -> None:
    """Forget npydask's per-process caches (as a fresh process would): open files, header memo, object sources.

    Object stores (their connection pools) are kept, as every peer keeps its client.
    """
    from npydask.format import header
    from npydask.storage import clear_cache

    clear_cache()
    for name, value in vars(header).items():
        if "MEMO" in name.upper() and isinstance(value, dict):
            value.clear()
    try:
        from npydask.storage import object as remote
    except ImportError:  # (npydask without object storage)
        return
    remote.clear_sources()
