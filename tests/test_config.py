"""Settings: defaults, env-var twins, the context manager, snapshots baked into tasks."""

from __future__ import annotations

import re

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
    with pytest.raises(ValueError, match="'gap_bytes' = -1"):
        config.set(gap_bytes=-1)
    with pytest.raises(TypeError, match="gap_bytes"):
        config.set(gap_bytes=4096.0)


# Every number setting: (name, smallest value that works, largest, whether it takes units such as "KiB").
NUMBERS = [
    ("gap_bytes", 0, 1 << 62, True),
    ("max_span_bytes", 0, 1 << 62, True),
    ("handle_cache_size", 0, 1 << 20, False),
    ("gpu_gap_bytes", 0, 1 << 62, True),
    ("gpu_task_bytes", 0, 1 << 62, True),
    ("gpu_alignment", 1, 1 << 30, True),
    ("gpu_host_bytes", 0, 1 << 62, True),
    ("gpu_chunk_bytes", 1, 1 << 62, True),
    ("pool_bytes", 0, 1 << 62, True),
    ("cache_max_bytes", 1, 1 << 62, True),
    ("remote_gap_bytes", 0, 1 << 62, True),
    ("remote_part_bytes", 4096, 1 << 62, True),
    ("remote_header_bytes", 64, 1 << 30, True),
    ("remote_connect_timeout", 1, 86400, False),
    ("remote_timeout", 1, 86400, False),
    ("remote_retries", 0, 100, False),
    ("remote_retry_timeout", 0, 86400, False),
]


def test_the_table_covers_every_number_setting():
    numbers = {name for name, s in config._SETTINGS.items() if type(s.default) is int}
    assert numbers == {row[0] for row in NUMBERS}


@pytest.mark.parametrize(
    ("name", "default", "good", "bad_text", "bad_values"),
    [
        (
            "remote_concurrency",
            "auto",
            {"auto": "auto", " AUTO ": "auto", "1": 1, "4096": 4096, "16": 16},
            ["0", "4097", "-1", "lots", "1.5"],
            [0, 4097, 1.5, True, "fast"],
        ),
        (
            "remote_hedge",
            "auto",
            {"auto": "auto", "off": "off", "OFF": "off", "0.05": 0.05, "2": 2.0},
            ["0", "-1", "nan", "inf", "soon"],
            [0, -0.1, float("nan"), True, "soon"],
        ),
        (
            "remote_hedge_budget",
            0.03,
            {"0": 0.0, "0.1": 0.1, "1": 1.0},
            ["-0.1", "1.5", "nan", "lots"],
            [-0.1, 1.5, float("nan"), True, "x"],
        ),
    ],
)
def test_request_settings_take_a_word_or_a_number_and_refuse_the_rest(
    monkeypatch, name, default, good, bad_text, bad_values
):
    env = _env(name)
    monkeypatch.delenv(env, raising=False)
    assert config.get(name) == default
    for text, value in good.items():
        monkeypatch.setenv(env, text)
        assert config.get(name) == value
        monkeypatch.delenv(env)
        with config.set(**{name: text}):
            assert config.get(name) == value
        if not isinstance(value, str):
            with config.set(**{name: value}):
                assert config.get(name) == value
    for text in bad_text:
        monkeypatch.setenv(env, text)
        with pytest.raises(ValueError, match=re.escape(f"{env}={text!r}: expected")):
            config.get(name)
    monkeypatch.delenv(env)
    for value in bad_values:
        with pytest.raises((TypeError, ValueError), match=re.escape(f"setting {name!r} = {value!r}: expected")):
            config.set(**{name: value})
    assert config.get(name) == default  # (nothing refused was kept)


def _env(name):
    return "NPYDASK_" + name.upper()


@pytest.mark.parametrize(("name", "low", "high", "units"), NUMBERS)
def test_number_settings_take_what_works_and_refuse_the_rest_naming_the_variable(monkeypatch, name, low, high, units):
    default = config.get(name)
    env = _env(name)
    for blank in ("", "  "):  # an empty variable is unset
        monkeypatch.setenv(env, blank)
        assert config.get(name) == default
    for good in {low, high, min(max(low, 4096), high)}:
        monkeypatch.setenv(env, str(good))
        assert config.get(name) == good
        with config.set(**{name: good}):
            assert config.get(name) == good
        with config.set(**{name: str(good)}):
            assert config.get(name) == good
    if units:
        monkeypatch.setenv(env, "64KiB")
        assert config.get(name) == 64 << 10
    bad = ["-1", "1e400", str(high + 1), "nan", "lots"] + ([str(low - 1)] if low > 0 else [])
    for text in bad:
        monkeypatch.setenv(env, text)
        with pytest.raises(ValueError, match=re.escape(f"{env}={text!r}: expected")):
            config.get(name)
        with pytest.raises(ValueError, match=re.escape(f"{name!r} = {text!r}: expected")):
            config.set(**{name: text})
    for value in [-1, high + 1] + ([low - 1] if low > 0 else []):
        with pytest.raises(ValueError, match=re.escape(f"{name!r} = {value!r}: expected")):
            config.set(**{name: value})
    monkeypatch.delenv(env)
    assert config.get(name) == default  # (nothing refused was kept)


@pytest.mark.parametrize("name", [n for n, s in config._SETTINGS.items() if type(s.default) is not int])
def test_an_empty_variable_or_value_is_unset_for_every_setting(monkeypatch, name):
    default = config.get(name)
    monkeypatch.setenv(_env(name), "")
    assert config.get(name) == default
    other = {
        "roi_strategy": "spans",
        "patch_read": "spans",
        "cache": "/tmp/npydask-cache",
        "cache_policy": "lru",
        "remote_concurrency": 8,
        "remote_hedge": "off",
        "remote_hedge_budget": 0.5,
    }.get(name, True)
    with config.set(**{name: other}):
        with config.set(**{name: ""}):  # (unset for the block: the environment's or the default)
            assert config.get(name) == default
        assert config.get(name) == other


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
