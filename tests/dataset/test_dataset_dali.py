"""open_dataset against NVIDIA DALI's own ``fn.readers.numpy`` (CPU), where DALI is installed.

DALI is not a dependency (``pip install nvidia-dali-cuda120`` to run these).
Each case writes a random folder of small ``.npy`` files (C and Fortran order,
some in immediate subfolders, some deeper or not matching), picks random file
selection, ROI, policy, fill and shard arguments, and reads the folder twice:
with a CPU DALI pipeline (``device_id=None``) and with
``npydask.open_dataset(...)[i].compute()``. Both must read the same files in
the same order, with the same shapes, dtypes and values, or both must refuse.

DALI's pipeline is built with ``stick_to_shard=True`` and a batch of at least
the shard's size, so its first samples are the shard's files in order (the
batch then wraps around inside the shard). Per-file ROI rows are given to
DALI as per-sample inputs of the shard's samples, and to npydask as one row
per file of the whole list: npydask must pick rows ``[lo, hi)`` for its shard.
DALI passes ``fill_value`` through a float32 argument, so the fills here are
exact in float32.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")
from nvidia.dali import fn, pipeline_def  # noqa: E402

import npydask  # noqa: E402

DTYPES = ["u1", "i1", "u2", "i2", "i4", "i8", "f2", "f4", "f8", "?"]
FILLS = [0.0, 10.0, -3.5, 2.5, 0.75, 300.5, -1000.0]
NAMES = ["a", "b", "B", "a10", "a2", "x_1", "Z", ".h", "c.d", "e0"]


def _constant(batch: list[np.ndarray]) -> Any:
    return lambda: batch  # (a one-argument callable would be given the iteration info)


def dali_read(source: dict[str, Any], kw: dict[str, Any], per_file: dict[str, list], shard: tuple[int, int],
              batch_size: int) -> tuple[int, list[str], list[np.ndarray]]:  # fmt: skip
    """(number of files DALI selected, source paths, arrays) of one batch of the shard."""
    shard_id, num_shards = shard

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        args = dict(kw)
        for name, rows in per_file.items():
            dt = np.float32 if name.startswith("rel") else np.int32
            args[name] = fn.external_source(source=_constant([np.asarray(r, dt).reshape(-1) for r in rows]), batch=True)
        return fn.readers.numpy(**source, **args, shard_id=shard_id, num_shards=num_shards, stick_to_shard=True,
                                name="reader")  # fmt: skip

    p = pipe()
    p.build()
    n = p.epoch_size("reader")
    (out,) = p.run()
    return n, [out[i].source_info() for i in range(batch_size)], [np.array(out[i]) for i in range(batch_size)]


def write_case(root: str, rng: np.random.Generator) -> tuple[list[str], str, int]:
    """A random folder; returns the relative paths written, the dtype and ndim."""
    ndim = int(rng.integers(1, 4))
    dtype = str(rng.choice(DTYPES))
    written = []
    for _ in range(int(rng.integers(1, 9))):
        folder = str(rng.choice(["", "", "", "s1", "s0", "s1/deep", "T"]))
        name = str(rng.choice(NAMES)) + str(rng.choice([".npy", ".npy", ".npy", ".NPY", ".npy.bak"]))
        rel = os.path.join(folder, name) if folder else name
        if rel in written:
            continue
        shape = tuple(int(n) for n in rng.integers(1, 8, size=ndim))
        a = rng.integers(0, 100, size=shape).astype(dtype)
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:  # (np.save would add .npy to other names)
            np.save(f, np.asfortranarray(a) if rng.random() < 0.5 else a)
        written.append(rel)
    return written, dtype, ndim


def random_values(rng: np.random.Generator, name: str, count: int) -> list[Any]:
    if name.startswith("rel"):
        pool = [0.0, 0.1, 0.2, 0.25, 0.45, 0.5, 0.7, 0.9, 1.0, -0.5, 1.5, -0.05]
        vals = [
            float(rng.choice(pool)) if rng.random() < 0.6 else float(np.float32(rng.uniform(-0.5, 1.5)))
            for _ in range(count)
        ]
        return [abs(v) for v in vals] if name == "rel_roi_shape" else vals
    return [int(v) for v in rng.integers(0 if name == "roi_shape" else -3, 10, size=count)]


def random_roi(rng: np.random.Generator, ndim: int, n_files: int) -> tuple[dict[str, Any], dict[str, list]]:
    """(shared arguments, per-file rows of the whole list)."""
    kw: dict[str, Any] = {}
    rows: dict[str, list] = {}
    n = ndim
    if rng.random() < 0.4:
        k = int(rng.integers(1, ndim + 1))
        axes = [int(a) for a in rng.permutation(ndim)[:k]]
        kw["roi_axes"] = [a - ndim if rng.random() < 0.3 else a for a in axes]
        n = k
    start = rng.choice([None, "roi_start", "rel_roi_start"])
    end = rng.choice([None, "roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape"])
    for name in (start, end):
        if name is None:
            continue
        name = str(name)
        if rng.random() < 0.3:
            rows[name] = [random_values(rng, name, n) for _ in range(n_files)]
        else:
            kw[name] = random_values(rng, name, 1 if rng.random() < 0.2 else n)
    if rng.random() < 0.03:  # an exclusive pair
        kw["roi_end" if "roi_end" not in kw and "roi_end" not in rows else "roi_shape"] = [1] * n
    kw["out_of_bounds_policy"] = str(rng.choice(["error", "trim_to_shape", "pad"]))
    kw["fill_value"] = float(rng.choice(FILLS))
    return kw, rows


def random_source(rng: np.random.Generator, root: str, written: list[str]) -> tuple[dict[str, Any], int]:
    """DALI's file selection arguments (also npydask's) and the number of files they select."""
    matching = [r for r in written if r.endswith(".npy") and r.count("/") <= 1]
    how = rng.choice(["discover", "discover", "files", "file_list"])
    if how == "discover" or not written:
        return {"file_root": root}, len(matching)
    picks = [str(r) for r in rng.choice(matching or written, size=int(rng.integers(1, 7)))]  # repeats allowed
    if how == "files":
        return {"file_root": root, "files": picks}, len(picks)
    lst = os.path.join(root, "list.txt")
    with open(lst, "w") as f:
        f.write("\n".join(picks) + "\n")
    return {"file_root": root, "file_list": lst}, len(picks)


def compare(tmp_path, rng: np.random.Generator, case: int) -> str:
    root = str(tmp_path / f"case{case}")
    os.makedirs(root)
    written, dtype, ndim = write_case(root, rng)
    source, n_files = random_source(rng, root, written)
    kw, rows = random_roi(rng, ndim, max(n_files, 1))
    num_shards = int(rng.integers(1, n_files + 1)) if n_files and rng.random() < 0.5 else 1
    shard_id = int(rng.integers(0, num_shards))
    lo, hi = n_files * shard_id // num_shards, n_files * (shard_id + 1) // num_shards
    what = (case, source, kw, rows, shard_id, num_shards)

    ours = why = None
    try:
        ds = npydask.open_dataset(**source, **kw, **rows, shard_id=shard_id, num_shards=num_shards)
        ours = [(f, ds[i].compute()) for i, f in enumerate(ds.files)]
    except ValueError as e:  # RoiError included
        why = str(e)
    theirs = dali_why = None
    if n_files:
        try:
            per_sample = {name: [r[lo + j % (hi - lo)] for j in range(n_files)] for name, r in rows.items()}
            n, infos, arrays = dali_read(source, kw, per_sample, (shard_id, num_shards), n_files)
            theirs = list(zip(infos, arrays))[: n * (shard_id + 1) // num_shards - n * shard_id // num_shards]
        except Exception as e:  # noqa: BLE001 - DALI raises RuntimeError or ValueError
            dali_why = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
    else:
        dali_why = "no file matches"
    if ours is None or theirs is None:
        assert ours is None and theirs is None, (what, "npydask:", why, "DALI:", dali_why, "DALI read", theirs)
        return "refused"
    assert len(ours) == len(theirs), (what, [f for f, _ in ours], [f for f, _ in theirs])
    for (path, a), (info, b) in zip(ours, theirs):
        assert os.path.normpath(path) == os.path.normpath(os.path.join(root, info)), (what, path, info)
        assert a.shape == b.shape and a.dtype == b.dtype, (what, path, a.shape, b.shape, a.dtype, b.dtype)
        np.testing.assert_array_equal(a, b, err_msg=f"{what} {path}")
    return "read"


def test_random_folders_rois_and_shards(tmp_path):
    rng = np.random.default_rng(20261122)
    outcomes = {"read": 0, "refused": 0}
    for case in range(250):
        outcomes[compare(tmp_path, rng, case)] += 1
    assert outcomes["read"] > 120 and outcomes["refused"] > 20, outcomes


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5, 8])
def test_shards_read_what_dali_reads_first(tmp_path, num_shards):
    for i in range(8):
        sub = "" if i < 5 else "sub"
        os.makedirs(tmp_path / sub, exist_ok=True)
        np.save(tmp_path / sub / f"{7 - i}.npy", np.full((2, 3), i, "i4"))
    rows = [[i % 3, 0] for i in range(8)]
    for shard_id in range(num_shards):
        ds = npydask.open_dataset(tmp_path, shard_id=shard_id, num_shards=num_shards, roi_start=rows,
                                  roi_shape=[1, 2], out_of_bounds_policy="pad", fill_value=-1)  # fmt: skip
        lo, hi = 8 * shard_id // num_shards, 8 * (shard_id + 1) // num_shards
        per_sample = {"roi_start": [rows[lo + j % (hi - lo)] for j in range(hi - lo)]}
        kw = dict(roi_shape=[1, 2], out_of_bounds_policy="pad", fill_value=-1.0)
        n, infos, arrays = dali_read({"file_root": str(tmp_path)}, kw, per_sample, (shard_id, num_shards), hi - lo)
        assert n == 8
        assert [os.path.normpath(f) for f in ds.files] == [os.path.normpath(os.path.join(tmp_path, i)) for i in infos]
        for i, b in enumerate(arrays):
            np.testing.assert_array_equal(ds[i].compute(), b)
