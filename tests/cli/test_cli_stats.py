"""``npydask stats --device gpu`` on the CPU, through a stand-in for CuPy that refuses host arrays.

numpy as the array module (``tests/gpu/test_gpu.py``'s ``numpy_device``) accepts a
host array stacked with device arrays, as CuPy does not: its ``concatenate``
raises ``TypeError`` for a ``numpy.ndarray``. The stand-in here is a numpy
subclass whose ``stack`` and ``concatenate`` refuse plain numpy arrays, so a
block reduced on "the device" must stay there until it is brought back whole.
What it cannot show (kernels, streams) the device probe ``stats_gpu`` in
``ci/gpu_probes.py`` runs on a GPU.
"""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from npydask.cli.stats import block_partials
from npydask.gpu import device as gpu


class _DeviceArray(np.ndarray):
    """An array "on the device": mixing it with host arrays in stack/concatenate raises, as CuPy does."""

    def __array_function__(self, func, types_, args, kwargs):
        if func in (np.stack, np.concatenate, np.vstack, np.hstack):
            arrays = args[0] if args else kwargs.get("arrays", ())
            if any(not isinstance(a, _DeviceArray) for a in arrays):
                raise TypeError("Only cupy arrays can be concatenated (the stand-in refuses a host array)")
        return super().__array_function__(func, types_, args, kwargs)

    def set(self, host):
        self[...] = host


def _strict_module():
    """A module shaped like CuPy over host memory (the pinned path: no kvikio)."""

    def empty(shape, dtype=float):
        return np.empty(shape, dtype).view(_DeviceArray)

    stream = types.SimpleNamespace(synchronize=lambda: None)
    cuda = types.SimpleNamespace(alloc_pinned_memory=bytearray, get_current_stream=lambda: stream)
    return types.SimpleNamespace(__name__="cupy", ndarray=_DeviceArray, empty=empty, uint8=np.uint8, cuda=cuda,
                                 asarray=lambda a: np.asarray(a).view(_DeviceArray))  # fmt: skip


@pytest.fixture
def strict_device(monkeypatch):
    xp = _strict_module()
    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "array_module", lambda: xp)
    monkeypatch.setitem(sys.modules, "kvikio", None)
    return xp


def test_the_stand_in_refuses_a_host_array_among_device_ones():
    with pytest.raises(TypeError, match="cupy arrays"):
        np.stack([np.zeros(2).view(_DeviceArray), np.zeros(2)])


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 7), (4,), (3, 0)])
def test_block_partials_of_a_device_block_equal_the_host_rows(shape):
    host = np.arange(int(np.prod(shape)), dtype="<f4").reshape(shape) * 1.5 - 3
    rows = block_partials(host.view(_DeviceArray))
    assert type(rows) is np.ndarray  # brought back to the host, whole
    np.testing.assert_array_equal(rows, block_partials(host))


def test_stats_device_gpu_equals_device_cpu_and_numpy(tmp_path, capsys, strict_device):
    from npydask.cli import main

    arrays = [np.arange(60, dtype="<f4").reshape(3, 4, 5) * (i + 1) - 7 for i in range(4)]
    arrays.append(np.asfortranarray(np.linspace(-2, 9, 60).reshape(3, 4, 5)).astype(">f8"))
    arrays.append(np.arange(12, dtype="<i2").reshape(3, 4))  # another ndim: a dataset of its own
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"f{i}.npy", a)
    results = {}
    for device in ("cpu", "gpu"):
        status = main(["stats", str(tmp_path), "--device", device, "--json", "--per-file", "-q"])
        out = capsys.readouterr()
        assert status == 0, out.err
        results[device] = json.loads(out.out)
    assert results["gpu"] == results["cpu"]
    flat = np.concatenate([a.astype(np.float64).ravel() for a in arrays])
    got = results["gpu"]
    assert got["count"] == flat.size and got["min"] == flat.min() and got["max"] == flat.max()
    assert np.isclose(got["mean"], flat.mean(), rtol=1e-12) and np.isclose(got["std"], flat.std(), rtol=1e-12)
