"""Shared fixtures: numpy is the oracle, files are real, nothing hangs."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from npydask.storage import _handles

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=int(os.environ.get("NPYDASK_HYPOTHESIS_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
    print_blob=True,
)
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _fresh_handle_cache():
    """Each test starts and ends with an empty per-process handle cache."""
    _handles.clear_cache()
    yield
    _handles.clear_cache()


@pytest.fixture
def save(tmp_path):
    """Write an array with numpy.save (C or Fortran order) and return its path."""
    counter = iter(range(1_000_000))

    def _save(array: np.ndarray, name: str | None = None, *, order: str = "C") -> str:
        path = tmp_path / (name or f"a{next(counter)}.npy")
        np.save(path, np.array(array, order=order, copy=True))
        return str(path)

    return _save

