"""npydask.plan.roi against NVIDIA DALI's own ``fn.readers.numpy`` (CPU), where DALI is installed.

DALI is not a dependency: ``pip install nvidia-dali-cuda120`` to run these. Every
case writes a few small ``.npy`` files (C and Fortran order), reads them with a
CPU pipeline (``device_id=None``) and with :func:`resolve_roi` +
:func:`apply_pad`, and wants the same shapes and values, or both to refuse.

DALI passes ``fill_value`` through a float32 argument; npydask keeps the
user's value, so the fills used here are exact in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

try:
    from nvidia.dali import fn, pipeline_def
except Exception as e:  # noqa: BLE001 - ImportError, or a missing shared library
    pytest.skip(f"nvidia.dali is not usable: {e}", allow_module_level=True)

from npydask.plan.roi import RoiArgs, apply_pad, resolve_roi

NAMES = ["roi_start", "rel_roi_start", "roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape"]
DTYPES = ["u1", "i1", "u2", "i2", "i4", "i8", "f2", "f4", "f8", "?"]
FILLS = [0.0, 10.0, -3.5, 2.5, -2.5, 300.5, 1e10, -1e10, 0.75]


def write_files(tmp_path, shapes, dtype, rng) -> tuple[list[str], list[np.ndarray]]:
    paths, arrays = [], []
    for i, shape in enumerate(shapes):
        a = rng.integers(0, 100, size=shape).astype(dtype)
        path = tmp_path / f"f{len(list(tmp_path.iterdir())):04d}_{i}.npy"
        np.save(path, np.asfortranarray(a) if rng.random() < 0.4 else a)
        paths.append(str(path))
        arrays.append(a)
    return paths, arrays


def dali_read(paths: list[str], kw: dict[str, Any], per_file: tuple[str, ...] = ()) -> list[np.ndarray]:
    @pipeline_def(batch_size=len(paths), num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        args: dict[str, Any] = {}
        for name, value in kw.items():
            if name in per_file:
                dt = np.float32 if name.startswith("rel") else np.int32
                batch = [np.asarray(row, dtype=dt).reshape(-1) for row in value]
                args[name] = fn.external_source(source=_constant(batch), batch=True)
            else:
                args[name] = value
        return fn.readers.numpy(files=paths, **args)

    (out,) = pipe().run()
    return [np.array(out[i]) for i in range(len(paths))]


def _constant(batch: list[np.ndarray]) -> Any:
    return lambda: batch  # (a one-argument callable would be given the iteration info)


def ours_read(paths: list[str], arrays: list[np.ndarray], kw: dict[str, Any]) -> list[np.ndarray]:
    args = RoiArgs.from_user(**kw, n_files=len(paths))
    result = []
    for i, (path, full) in enumerate(zip(paths, arrays)):
        roi = resolve_roi(args, full.shape, full.dtype, index=i, source=path)
        block = full[tuple(slice(a, b) for a, b in zip(roi.box.start, roi.box.stop)) + (...,)]
        result.append(apply_pad(block, roi))
    return result


def compare(paths, arrays, kw, per_file=()) -> str:
    ours = theirs = None
    why = dali_why = "read"
    try:
        ours = ours_read(paths, arrays, kw)
    except ValueError as e:  # RoiError included
        why = str(e)
    try:
        theirs = dali_read(paths, kw, per_file)
    except Exception as e:  # noqa: BLE001 - DALI raises RuntimeError or ValueError
        dali_why = str(e).splitlines()[-1]
    if ours is None or theirs is None:
        assert ours is None and theirs is None, (kw, "npydask:", why, "DALI:", dali_why)
        return "refused"
    for path, a, b in zip(paths, ours, theirs):
        assert a.shape == b.shape, (kw, path, a.shape, b.shape)
        assert a.dtype == b.dtype, (kw, a.dtype, b.dtype)
        np.testing.assert_array_equal(a, b, err_msg=f"{kw} {path}")
    return "read"


# --------------------------------------------------------------------------
# Deterministic cases: the arithmetic corners


@pytest.mark.parametrize(
    "kw",
    [
        dict(rel_roi_end=[0.9]),  # 0.9f * 15 = 13.5f -> 14
        dict(rel_roi_start=[-0.5], out_of_bounds_policy="pad", fill_value=7.0),
        dict(rel_roi_start=[-0.1], out_of_bounds_policy="pad", fill_value=7.0),
        dict(rel_roi_start=[0.16], roi_end=[2]),  # end before the unrounded start
        dict(rel_roi_start=[-0.05], roi_shape=[1], out_of_bounds_policy="pad"),  # unrounded start + shape
        dict(roi_start=[15]),
        dict(roi_start=[16], out_of_bounds_policy="pad"),
        dict(roi_start=[20], roi_end=[22], out_of_bounds_policy="pad", fill_value=5.0),
        dict(roi_start=[-5], roi_end=[-2], out_of_bounds_policy="trim_to_shape"),
        dict(roi_shape=[3], rel_roi_shape=[0.5]),
        dict(roi_start=[1, 2]),  # more values than axes
        dict(roi_start=[1], roi_axes=[0, -1]),  # the same axis twice
        dict(roi_start=[1], roi_axes=[1]),  # out of range
    ],
    ids=repr,
)
def test_corners_extent_15(tmp_path, kw):
    rng = np.random.default_rng(0)
    paths, arrays = write_files(tmp_path, [(15,), (15,)], "i2", rng)
    compare(paths, arrays, kw)


@pytest.mark.parametrize("extent", [3, 5, 10, 15, 20, 25, 30])
def test_float32_products_and_double_sums(tmp_path, extent):
    # one file read many times, one relative value per read (per-file rows)
    rng = np.random.default_rng(extent)
    path, full = write_files(tmp_path, [(extent, 2)], "u1", rng)
    rels = [[round(float(x), 3)] for x in np.arange(0.0, 1.0001, 0.005)]
    paths, arrays = path * len(rels), full * len(rels)
    for name in ["rel_roi_end", "rel_roi_start", "rel_roi_shape"]:
        kw = {name: rels, "roi_axes": [0], "out_of_bounds_policy": "pad"}
        assert compare(paths, arrays, kw, per_file=(name,)) == "read"
    pairs = [(round(float(a), 2), b) for a in np.arange(0.0, 0.7, 0.01) for b in (0.07, 0.29, 0.43, 0.46, 0.7, 0.9)]
    kw = dict(
        rel_roi_start=[[a] for a, _ in pairs],
        rel_roi_shape=[[b] for _, b in pairs],
        roi_axes=[0],
        out_of_bounds_policy="pad",
    )
    n = len(pairs)
    assert compare(path * n, full * n, kw, per_file=("rel_roi_start", "rel_roi_shape")) == "read"


@pytest.mark.parametrize("dtype", DTYPES)
def test_fill_conversion(tmp_path, dtype):
    rng = np.random.default_rng(1)
    paths, arrays = write_files(tmp_path, [(3,)], dtype, rng)
    for fill in FILLS:
        compare(paths, arrays, dict(roi_start=[-1], roi_end=[5], out_of_bounds_policy="pad", fill_value=fill))


# --------------------------------------------------------------------------
# Random cases


def random_values(rng, name: str, count: int, big: int) -> list[Any]:
    if name.startswith("rel"):
        pool = [0.0, 0.1, 0.2, 0.25, 0.35, 0.45, 0.5, 0.7, 0.9, 0.95, 1.0, -0.5, 1.5, -0.05]
        vals = [
            float(rng.choice(pool)) if rng.random() < 0.6 else float(np.float32(rng.uniform(-0.5, 1.5)))
            for _ in range(count)
        ]
        return [abs(v) for v in vals] if name == "rel_roi_shape" else vals
    lo = 0 if name == "roi_shape" else -3
    return [int(v) for v in rng.integers(lo, big + 1, size=count)]


def random_case(rng) -> tuple[list[tuple[int, ...]], str, dict[str, Any], tuple[str, ...]]:
    ndim = int(rng.integers(1, 4))
    n_files = int(rng.integers(1, 5))
    shapes = [tuple(int(n) for n in rng.integers(1, 8, size=ndim)) for _ in range(n_files)]
    dtype = str(rng.choice(DTYPES))
    kw: dict[str, Any] = {}
    n = ndim
    if rng.random() < 0.4:
        k = int(rng.integers(1, ndim + 1))
        axes = [int(a) for a in rng.permutation(ndim)[:k]]
        kw["roi_axes"] = [a - ndim if rng.random() < 0.3 else a for a in axes]
        n = k
    big = 9
    start = rng.choice([None, "roi_start", "rel_roi_start"])
    end = rng.choice([None, "roi_end", "rel_roi_end", "roi_shape", "rel_roi_shape"])
    per_file: tuple[str, ...] = ()
    for name in (start, end):
        if name is None:
            continue
        name = str(name)
        if rng.random() < 0.3:  # one row per file, some empty
            kw[name] = [random_values(rng, name, n, big) if rng.random() < 0.8 else [] for _ in range(n_files)]
            per_file += (name,)
        else:
            count = 1 if rng.random() < 0.2 else n
            kw[name] = random_values(rng, name, count, big)
    if rng.random() < 0.05:  # an exclusive pair
        kw["roi_end" if "roi_end" not in kw else "roi_shape"] = [1] * n
        per_file = tuple(p for p in per_file if p in kw)
    kw["out_of_bounds_policy"] = str(rng.choice(["error", "trim_to_shape", "pad"]))
    # DALI 2.4 bug: Fortran files (ndim >= 2) get int32 fills beyond the range unsaturated (1e10 -> INT_MIN)
    fills = [f for f in FILLS if abs(f) < 2**31] if dtype == "i4" else FILLS
    kw["fill_value"] = float(rng.choice(fills))
    return shapes, dtype, kw, per_file


def test_random_rois(tmp_path):
    rng = np.random.default_rng(20240611)
    outcomes = {"read": 0, "refused": 0}
    for _ in range(300):
        shapes, dtype, kw, per_file = random_case(rng)
        paths, arrays = write_files(tmp_path, shapes, dtype, rng)
        outcomes[compare(paths, arrays, kw, per_file)] += 1
    assert outcomes["read"] > 100 and outcomes["refused"] > 10, outcomes
