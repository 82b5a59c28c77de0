"""npydask graphs run under Ray's dask scheduler (``ray.util.dask.ray_dask_get``).

Ray is no dependency of npydask and in no extra: these tests skip, saying
why, where Ray is not installed or does not work with the installed dask.
Ray's dask integration imports ``dask.dataframe`` (pandas and pyarrow), and
importing it replaces ``dask.persist``; the fixture puts that back.
"""

from __future__ import annotations

import warnings

import dask
import dask.array as da
import numpy as np
import pytest

import npydask

pytestmark = pytest.mark.slow  # Ray starts its own cluster of processes (~10-15 s)


@pytest.fixture(scope="module")
def ray_get():
    pytest.importorskip("ray", reason="Ray is not installed (pip install ray); it is in no npydask extra")
    persist, mixin_persist = dask.persist, dask.base.DaskMethodsMixin.persist
    import ray

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from ray.util.dask import ray_dask_get
    except Exception as e:  # an incompatible dask breaks Ray's import of its dask internals
        dask.persist, dask.base.DaskMethodsMixin.persist = persist, mixin_persist
        pytest.skip(f"Ray {ray.__version__} cannot import its dask scheduler with dask {dask.__version__}: {e!r}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            probe = da.ones(4, chunks=2).sum().compute(scheduler=ray_dask_get)
        except Exception as e:
            pytest.skip(f"Ray {ray.__version__} cannot run a trivial dask {dask.__version__} graph: {e!r}")
        if probe != 4:
            pytest.skip(f"Ray {ray.__version__} with dask {dask.__version__} computes da.ones(4).sum() as {probe!r}")
        yield ray_dask_get
    finally:
        if ray.is_initialized():
            ray.shutdown()
        dask.persist, dask.base.DaskMethodsMixin.persist = persist, mixin_persist


def test_from_npy_under_ray(ray_get, tmp_path):
    a = np.random.default_rng(0).standard_normal((40, 30)).astype(">f8")
    np.save(tmp_path / "a.npy", a)
    x = npydask.from_npy(tmp_path / "a.npy", chunks=(7, 30))
    assert np.isclose(x.sum().compute(scheduler=ray_get), a.sum())
    np.testing.assert_array_equal(x[3:33:2].compute(scheduler=ray_get), a[3:33:2])


def test_open_dataset_stack_under_ray(ray_get, tmp_path):
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 1000, (5, 6), dtype="<i4") for _ in range(9)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"f{i}.npy", a)
    stacked = npydask.open_dataset(str(tmp_path)).stack()
    np.testing.assert_array_equal(stacked.compute(scheduler=ray_get), np.stack(arrays))


def test_to_zarr_under_ray(ray_get, tmp_path):
    zarr = pytest.importorskip("zarr", minversion="3.0")
    from npydask.zarr_writer import to_zarr

    a = np.arange(300, dtype="<f4").reshape(30, 10)
    np.save(tmp_path / "a.npy", a)
    lazy = to_zarr(npydask.from_npy(tmp_path / "a.npy", chunks=(7, 10)), str(tmp_path / "a.zarr"),
                   shards=(10, 10), chunks=(5, 5), compute=False)
    assert lazy.compute(scheduler=ray_get) is None
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...], a)
