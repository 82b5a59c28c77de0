"""Settings: one home, an environment-variable twin each, and a context manager.

=====================  =============================  =========  ==============================================
setting                environment variable           default    meaning
=====================  =============================  =========  ==============================================
``direct_io``          ``NPYDASK_DIRECT_IO``          ``False``  pread backend opens files with ``O_DIRECT``
``gap_bytes``          ``NPYDASK_GAP_BYTES``          4096       runs closer than this are read as one span
``max_span_bytes``     ``NPYDASK_MAX_SPAN_BYTES``     64 MiB     largest span read to cut runs from
``roi_strategy``       ``NPYDASK_ROI_STRATEGY``       ``auto``   strided regions of local files: ``auto`` (the
                                                                 cost model), ``spans``, ``runs`` or ``mapped``
                                                                 (see :mod:`npydask.plan.read_strategy`)
``patch_read``         ``NPYDASK_PATCH_READ``         ``auto``   a sampler's patches of local files: ``mapped``
                                                                 copies them from the file's mapping,
                                                                 ``spans`` reads merged spans, ``auto`` maps
                                                                 what the page cache holds and reads spans
                                                                 otherwise (see :mod:`npydask.samplers.read`)
``handle_cache_size``  ``NPYDASK_HANDLE_CACHE_SIZE``  128        open files kept per process
``gpu_gap_bytes``      ``NPYDASK_GPU_GAP_BYTES``      64 KiB     GPU reads: runs closer than this are one read
``gpu_task_bytes``     ``NPYDASK_GPU_TASK_BYTES``     0          GPU reads: largest single kvikio ``pread``
                                                                 (0: one per span)
``gpu_alignment``      ``NPYDASK_GPU_ALIGNMENT``      4096       GPU reads: offsets and sizes aligned for GDS
``gpu_host_bytes``     ``NPYDASK_GPU_HOST_BYTES``     1 MiB      GPU reads: a task whose reads average less goes
                                                                 through host memory (one copy); 0: never
``gpu_chunk_bytes``    ``NPYDASK_GPU_CHUNK_BYTES``    1 GiB      ``chunks="auto"`` with ``device="gpu"``: bytes
                                                                 per chunk (host arrays: dask's
                                                                 ``array.chunk-size``)
``pool_bytes``         ``NPYDASK_POOL_BYTES``         256 MiB    idle chunk buffers kept for reuse (0: none)
=====================  =============================  =========  ==============================================

Object storage (``s3://``, ``gs://``, ``az://``, ``https://``; see :mod:`npydask.storage.object`):

===========================  ==================================  =======  ==========================================
setting                      environment variable                default  meaning
===========================  ==================================  =======  ==========================================
``remote_gap_bytes``         ``NPYDASK_REMOTE_GAP_BYTES``        64 KiB   runs closer than this are one range request
``remote_part_bytes``        ``NPYDASK_REMOTE_PART_BYTES``       8 MiB    larger spans are split into parallel requests
``remote_header_bytes``      ``NPYDASK_REMOTE_HEADER_BYTES``     4 KiB    the first range read for a header
``remote_concurrency``       ``NPYDASK_REMOTE_CONCURRENCY``      auto     requests in flight per process: ``auto``
                                                                          (a closed loop from 64, between 4 and
                                                                          256) or a number
``remote_hedge``             ``NPYDASK_REMOTE_HEDGE``            auto     a range GET not answered in time is sent
                                                                          again: ``auto`` (after twice its size
                                                                          class's p90), ``off``, or seconds
``remote_hedge_budget``      ``NPYDASK_REMOTE_HEDGE_BUDGET``     0.03     hedges per request, at most
``remote_connect_timeout``   ``NPYDASK_REMOTE_CONNECT_TIMEOUT``  5        seconds to connect before a retry
``remote_timeout``           ``NPYDASK_REMOTE_TIMEOUT``          30       seconds for one request before a retry
``remote_retries``           ``NPYDASK_REMOTE_RETRIES``          3        retries of a failed request (with backoff)
``remote_retry_timeout``     ``NPYDASK_REMOTE_RETRY_TIMEOUT``    45       seconds after which retrying stops
``cache``                    ``NPYDASK_CACHE``                   ``""``   the node cache's absolute folder (off
                                                                          when empty); read where a task runs
``cache_max_bytes``          ``NPYDASK_CACHE_MAX_BYTES``         10 GiB   bytes of extents the node cache holds
``cache_policy``             ``NPYDASK_CACHE_POLICY``            ``pin``  ``pin`` (admit until full, keep) or ``lru``
===========================  ==================================  =======  ==========================================

The remote settings are captured with the store (a
:class:`~npydask.storage.object.StoreSpec`) when a lazy array is built and
travel inside its tasks, like :class:`ReadOptions`. Retries back off
exponentially from 100 ms up to 5 s between tries. With the defaults a
stopped server fails a read within a few seconds (connections are refused at
once) and a server that stops answering within about a minute
(``remote_timeout`` plus retries, bounded by ``remote_retry_timeout``).

An empty environment variable is unset (the default applies). A value that
cannot work (a size of 0 where one must be positive, a negative, non-finite
or too large one) raises ``ValueError`` naming the variable or setting and
the value, where it is read or set.

Settings that change how bytes are read (``direct_io``, ``gap_bytes``,
``max_span_bytes``, ``roi_strategy``) are captured as :class:`ReadOptions` when a lazy array is
built and travel inside its tasks, because workers do not see the client's
configuration; ``patch_read`` travels with a sampler loader's reads, captured
when it starts an epoch. ``handle_cache_size`` and ``pool_bytes`` are per process and
read where they run (see :mod:`npydask._buffers`).

Examples
--------
>>> import npydask
>>> with npydask.config.set(gap_bytes=0):
...     npydask.config.get("gap_bytes")
0
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["PATCH_READS", "ROI_STRATEGIES", "ReadOptions", "get", "read_options", "set"]


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), found {text!r}")


def _parse_size(text: str) -> int:
    from dask.utils import parse_bytes

    text = text.strip()
    try:
        return int(text) if text.lstrip("+-").isdigit() else int(parse_bytes(text))  # (a float loses digits)
    except OverflowError:  # ("1e400": a float that is infinite)
        raise ValueError(f"expected a finite size, found {text!r}") from None
    except (ValueError, TypeError):
        raise ValueError(f"expected a size in bytes such as 4096, '64KiB' or '1.5MiB', found {text!r}") from None


def _parse_count(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected a whole number, found {text!r}") from None


ROI_STRATEGIES = ("auto", "spans", "runs", "mapped")
"""Values of the ``roi_strategy`` setting."""


def _one_of(choices: tuple[str, ...]) -> Any:
    """A parser of one of ``choices`` (case and surrounding blanks ignored)."""

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {list(choices)}, found {text!r}")
        return value

    return parse


PATCH_READS = ("auto", "mapped", "spans")
"""Values of the ``patch_read`` setting."""

CACHE_POLICIES = ("pin", "lru")
"""Values of the ``cache_policy`` setting."""


def _parse_folder(text: str) -> str:
    """An absolute folder (``~`` expanded); ``""`` is unset before this is called."""
    value = os.path.expanduser(text.strip())
    if not os.path.isabs(value):
        raise ValueError(f"expected an absolute folder such as /local_nvme/npydask-cache, found {text!r}")
    return os.path.normpath(value)


def _parse_concurrency(text: str) -> str | int:
    """``"auto"`` or a number of requests (1 to 4096)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return _concurrency(int(text.strip()))
    except ValueError as e:
        raise ValueError(f"expected 'auto' or a number of requests from 1 to 4,096, found {text!r}") from e


def _concurrency(value: Any) -> str | int:
    """A ``remote_concurrency`` value given as a Python value: ``"auto"`` or an int from 1 to 4096."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected 'auto' or a number of requests (an int), found {value!r}")
    if not 1 <= value <= 4096:
        raise ValueError(f"expected 'auto' or a number of requests from 1 to 4,096, found {value!r}")
    return value


def _parse_hedge(text: str) -> str | float:
    """``"auto"``, ``"off"`` or seconds (a fixed hedge delay)."""
    word = text.strip().lower()
    if word in ("auto", "off"):
        return word
    try:
        seconds = float(word)
    except ValueError:
        raise ValueError(f"expected 'auto', 'off' or a delay in seconds such as 0.05, found {text!r}") from None
    return _hedge(seconds)


def _hedge(value: Any) -> str | float:
    """A ``remote_hedge`` value given as a Python value."""
    if value in ("auto", "off"):
        return str(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected 'auto', 'off' or a delay in seconds (a number), found {value!r}")
    if not 0 < value <= 3600:  # (NaN fails too)
        raise ValueError(f"expected 'auto', 'off' or a delay from 0 (excluded) to 3,600 s, found {value!r}")
    return float(value)


def _parse_fraction(text: str) -> float:
    """A number from 0 to 1."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number from 0 to 1 such as 0.03, found {text!r}") from None
    return _fraction(value)


def _fraction(value: Any) -> float:
    """A number from 0 to 1 given as a Python value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number from 0 to 1 such as 0.03, found {value!r}")
    if not 0 <= value <= 1:  # (NaN fails too)
        raise ValueError(f"expected a number from 0 to 1 such as 0.03, found {value!r}")
    return float(value)


@dataclass(frozen=True)
class _Setting:
    env: str
    default: Any
    parse: Any
    accept: Any = None
    """Settings of several types: checks a value given as a Python value (not a string)."""
    low: int = 0
    """Numbers: the smallest value that works."""
    high: int = 1 << 62
    """Numbers: the largest value that works (sizes: any byte offset of a file)."""
    unit: str = "bytes"


_KiB, _MiB, _GiB = 1 << 10, 1 << 20, 1 << 30
_SIZE, _COUNT = _parse_size, _parse_count

_SETTINGS: dict[str, _Setting] = {
    "direct_io": _Setting("NPYDASK_DIRECT_IO", False, _parse_bool),
    "gap_bytes": _Setting("NPYDASK_GAP_BYTES", 4096, _SIZE),
    "max_span_bytes": _Setting("NPYDASK_MAX_SPAN_BYTES", 64 * _MiB, _SIZE),  # (0: each run alone)
    "roi_strategy": _Setting("NPYDASK_ROI_STRATEGY", "auto", _one_of(ROI_STRATEGIES)),
    "patch_read": _Setting("NPYDASK_PATCH_READ", "auto", _one_of(PATCH_READS)),
    "handle_cache_size": _Setting("NPYDASK_HANDLE_CACHE_SIZE", 128, _COUNT, high=1 << 20, unit="files"),
    "gpu_gap_bytes": _Setting("NPYDASK_GPU_GAP_BYTES", 64 * _KiB, _SIZE),
    "gpu_task_bytes": _Setting("NPYDASK_GPU_TASK_BYTES", 0, _SIZE),
    "gpu_alignment": _Setting("NPYDASK_GPU_ALIGNMENT", 4096, _SIZE, low=1, high=_GiB),
    "gpu_host_bytes": _Setting("NPYDASK_GPU_HOST_BYTES", _MiB, _SIZE),
    "gpu_chunk_bytes": _Setting("NPYDASK_GPU_CHUNK_BYTES", _GiB, _SIZE, low=1),
    "pool_bytes": _Setting("NPYDASK_POOL_BYTES", 256 * _MiB, _SIZE),
    "cache": _Setting("NPYDASK_CACHE", "", _parse_folder),
    "cache_max_bytes": _Setting("NPYDASK_CACHE_MAX_BYTES", 10 * _GiB, _SIZE, low=1),
    "cache_policy": _Setting("NPYDASK_CACHE_POLICY", "pin", _one_of(CACHE_POLICIES)),
    "remote_gap_bytes": _Setting("NPYDASK_REMOTE_GAP_BYTES", 64 * _KiB, _SIZE),
    "remote_part_bytes": _Setting("NPYDASK_REMOTE_PART_BYTES", 8 * _MiB, _SIZE, low=4 * _KiB),
    "remote_header_bytes": _Setting("NPYDASK_REMOTE_HEADER_BYTES", 4096, _SIZE, low=64, high=_GiB),
    "remote_concurrency": _Setting("NPYDASK_REMOTE_CONCURRENCY", "auto", _parse_concurrency, _concurrency),
    "remote_hedge": _Setting("NPYDASK_REMOTE_HEDGE", "auto", _parse_hedge, _hedge),
    "remote_hedge_budget": _Setting("NPYDASK_REMOTE_HEDGE_BUDGET", 0.03, _parse_fraction, _fraction),
    "remote_connect_timeout": _Setting("NPYDASK_REMOTE_CONNECT_TIMEOUT", 5, _COUNT, low=1, high=86400, unit="s"),
    "remote_timeout": _Setting("NPYDASK_REMOTE_TIMEOUT", 30, _COUNT, low=1, high=86400, unit="s"),
    "remote_retries": _Setting("NPYDASK_REMOTE_RETRIES", 3, _COUNT, high=100, unit="retries"),
    "remote_retry_timeout": _Setting("NPYDASK_REMOTE_RETRY_TIMEOUT", 45, _COUNT, high=86400, unit="s"),
}


def _in_range(setting: _Setting, value: Any) -> Any:
    """``value`` of a number setting, refused where it cannot work (too small, too large)."""
    if type(setting.default) is not int or setting.low <= value <= setting.high:
        return value
    unit = f" {setting.unit}" if setting.unit != "s" else " s"
    raise ValueError(
        f"expected from {setting.low:,} to {setting.high:,}{unit}, found {value:,}"
        + (" (0 cannot work here)" if value == 0 else "")
    )


_overrides: dict[str, Any] = {}
_lock = threading.Lock()


def get(name: str) -> Any:
    """Current value of a setting: an active :func:`set`, else its env var (an empty one is unset), else the default.

    Raises
    ------
    KeyError
        For an unknown setting.
    ValueError
        For an environment variable that does not parse or whose value cannot work (a size of 0 where
        one must be positive, a negative or non-finite one, one too large), naming the variable.
    """
    setting = _SETTINGS.get(name)
    if setting is None:
        raise KeyError(f"unknown npydask setting {name!r}; known: {sorted(_SETTINGS)}")
    if name in _overrides:
        return _overrides[name]
    raw = os.environ.get(setting.env)
    if raw is None or not raw.strip():
        return setting.default
    try:
        return _in_range(setting, setting.parse(raw))
    except ValueError as e:
        raise ValueError(
            f"environment variable {setting.env}={raw!r}: {e}; set another value or unset it "
            f"(the default is {setting.default!r})"
        ) from e


def _check(name: str, value: Any) -> Any:
    """``value`` of setting ``name`` as :func:`set` keeps it (:data:`_MISSING` for ``""``: unset)."""
    setting = _SETTINGS.get(name)
    if setting is None:
        raise KeyError(f"unknown npydask setting {name!r}; known: {sorted(_SETTINGS)}")
    if isinstance(value, str):
        if not value.strip():
            return _MISSING  # (an empty value is unset, as an empty environment variable is)
        try:
            return _in_range(setting, setting.parse(value))
        except ValueError as e:
            raise ValueError(f"setting {name!r} = {value!r}: {e}") from e
    if setting.accept is not None:
        try:
            return setting.accept(value)
        except TypeError as e:
            raise TypeError(f"setting {name!r} = {value!r}: {e}") from e
        except ValueError as e:
            raise ValueError(f"setting {name!r} = {value!r}: {e}") from e
    if type(setting.default) is str:
        raise TypeError(f"setting {name!r} takes a string, found {value!r}")
    if type(setting.default) is bool:
        if not isinstance(value, bool):
            raise TypeError(f"setting {name!r} takes a bool, found {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"setting {name!r} takes an int, found {value!r}")
    try:
        return _in_range(setting, value)
    except ValueError as e:
        raise ValueError(f"setting {name!r} = {value!r}: {e}") from e


class set(contextlib.AbstractContextManager):  # noqa: A001 - mirrors dask.config.set
    """Change settings globally, or for a ``with`` block.

    Parameters
    ----------
    **values
        ``setting=value`` pairs; strings are parsed as the env var would be
        (an empty string unsets the setting for the block: its environment
        variable or default applies).

    Raises
    ------
    KeyError
        For an unknown setting.
    TypeError
        For a value of the wrong type (an int for a string setting...).
    ValueError
        For a value that does not parse or cannot work (a size of 0 where
        one must be positive, a negative, non-finite or too large one),
        naming the setting and the value.
    """

    def __init__(self, **values: Any) -> None:
        checked = {k: _check(k, v) for k, v in values.items()}
        with _lock:
            self._previous = {k: _overrides.get(k, _MISSING) for k in checked}
            for k, v in checked.items():
                if v is _MISSING:
                    _overrides.pop(k, None)
                else:
                    _overrides[k] = v

    def __exit__(self, *exc: object) -> None:
        with _lock:
            for k, v in self._previous.items():
                if v is _MISSING:
                    _overrides.pop(k, None)
                else:
                    _overrides[k] = v


_MISSING = object()


@dataclass(frozen=True)
class ReadOptions:
    """The settings that change how bytes are read, frozen into each task."""

    direct_io: bool = False
    gap_bytes: int = 4096
    max_span_bytes: int = 64 * 1024 * 1024
    roi_strategy: str = "auto"


def read_options(**overrides: Any) -> ReadOptions:
    """Snapshot the current read settings (with ``overrides`` applied)."""
    values = {name: get(name) for name in ("direct_io", "gap_bytes", "max_span_bytes", "roi_strategy")}
    values.update({k: c for k, v in overrides.items() if v is not None and (c := _check(k, v)) is not _MISSING})
    return ReadOptions(**values)
