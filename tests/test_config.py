"""Settings: defaults, env-var twins, the context manager, snapshots baked into tasks."""

from __future__ import annotations

import numpy as np
import pytest

import npydask
from npydask import config


def test_defaults_and_env_twins(monkeypatch):
    assert config.get("direct_io") is False
    assert config.get("gap_bytes") == 4096
    monkeypatch.setenv("NPYDASK_DIRECT_IO", "yes")
    monkeypatch.setenv("NPYDASK_GAP_BYTES", "1MiB")
    monkeypatch.setenv("NPYDASK_HANDLE_CACHE_SIZE", "7")
    assert config.get("direct_io") is True
    assert config.get("gap_bytes") == 1 << 20
    assert config.get("handle_cache_size") == 7
    monkeypatch.setenv("NPYDASK_DIRECT_IO", "perhaps")
    with pytest.raises(ValueError, match="NPYDASK_DIRECT_IO"):
        config.get("direct_io")


def test_set_is_a_context_manager_and_restores():
    with config.set(gap_bytes=0, direct_io=True):
        assert config.get("gap_bytes") == 0 and config.get("direct_io") is True
        with config.set(gap_bytes="2KiB"):
            assert config.get("gap_bytes") == 2048
        assert config.get("gap_bytes") == 0
    assert config.get("gap_bytes") == 4096 and config.get("direct_io") is False


def test_bad_settings_are_refused():
    with pytest.raises(KeyError, match="known"):
        config.get("speed")
    with pytest.raises(KeyError):
        config.set(speed=1)
    with pytest.raises(TypeError):
        config.set(direct_io=1)
    with pytest.raises(TypeError):
        config.set(gap_bytes=-1)


def test_read_options_are_baked_into_tasks(save):
    p = save(np.arange(10.0))
    with config.set(direct_io=True, gap_bytes=0):
        x = npydask.from_npy(p, chunks=5)
    (task_source,) = {t.ref.options for t in _sources(x)}
    assert task_source.direct_io is True and task_source.gap_bytes == 0
    np.testing.assert_array_equal(x.compute(), np.arange(10.0))


def _sources(x):
    from npydask.array import NpyFileArray

    found = []

    def walk(obj):
        if isinstance(obj, NpyFileArray):
            found.append(obj)
        elif isinstance(obj, (tuple, list)):
            for o in obj:
                walk(o)
        elif hasattr(obj, "args"):  # dask Task objects
            walk(tuple(obj.args))
            walk(tuple(getattr(obj, "kwargs", {}).values()))
        elif hasattr(obj, "value"):
            walk(obj.value)

    for task in dict(x.__dask_graph__()).values():
        walk(task)
    return found
