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
``remote_concurrency``       ``NPYDASK_REMOTE_CONCURRENCY``      64       requests in flight per process
``remote_connect_timeout``   ``NPYDASK_REMOTE_CONNECT_TIMEOUT``  5        seconds to connect before a retry
``remote_timeout``           ``NPYDASK_REMOTE_TIMEOUT``          30       seconds for one request before a retry
``remote_retries``           ``NPYDASK_REMOTE_RETRIES``          3        retries of a failed request (with backoff)
``remote_retry_timeout``     ``NPYDASK_REMOTE_RETRY_TIMEOUT``    45       seconds after which retrying stops
===========================  ==================================  =======  ==========================================

The remote settings are captured with the store (a
:class:`~npydask.storage.object.StoreSpec`) when a lazy array is built and
travel inside its tasks, like :class:`ReadOptions`. Retries back off
exponentially from 100 ms up to 5 s between tries. With the defaults a
stopped server fails a read within a few seconds (connections are refused at
once) and a server that stops answering within about a minute
(``remote_timeout`` plus retries, bounded by ``remote_retry_timeout``).

Settings that change how bytes are read (``direct_io``, ``gap_bytes``,
``max_span_bytes``, ``roi_strategy``) are captured as :class:`ReadOptions` when a lazy array is
built and travel inside its tasks, because workers do not see the client's
configuration. ``handle_cache_size`` and ``pool_bytes`` are per process and
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
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), found {text!r}")


def _parse_size(text: str) -> int:
    from dask.utils import parse_bytes

    value = parse_bytes(text.strip())
    if value < 0:
        raise ValueError(f"expected a non-negative size, found {text!r}")
    return int(value)


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


@dataclass(frozen=True)
class _Setting:
    env: str
    default: Any
    parse: Any


_SETTINGS: dict[str, _Setting] = {
    "direct_io": _Setting("NPYDASK_DIRECT_IO", False, _parse_bool),
    "gap_bytes": _Setting("NPYDASK_GAP_BYTES", 4096, _parse_size),
    "max_span_bytes": _Setting("NPYDASK_MAX_SPAN_BYTES", 64 * 1024 * 1024, _parse_size),
    "roi_strategy": _Setting("NPYDASK_ROI_STRATEGY", "auto", _one_of(ROI_STRATEGIES)),
    "patch_read": _Setting("NPYDASK_PATCH_READ", "auto", _one_of(PATCH_READS)),
    "handle_cache_size": _Setting("NPYDASK_HANDLE_CACHE_SIZE", 128, _parse_size),
    "gpu_gap_bytes": _Setting("NPYDASK_GPU_GAP_BYTES", 64 * 1024, _parse_size),
    "gpu_task_bytes": _Setting("NPYDASK_GPU_TASK_BYTES", 0, _parse_size),
    "gpu_alignment": _Setting("NPYDASK_GPU_ALIGNMENT", 4096, _parse_size),
    "gpu_host_bytes": _Setting("NPYDASK_GPU_HOST_BYTES", 1024 * 1024, _parse_size),
    "gpu_chunk_bytes": _Setting("NPYDASK_GPU_CHUNK_BYTES", 1024 * 1024 * 1024, _parse_size),
    "pool_bytes": _Setting("NPYDASK_POOL_BYTES", 256 * 1024 * 1024, _parse_size),
    "remote_gap_bytes": _Setting("NPYDASK_REMOTE_GAP_BYTES", 64 * 1024, _parse_size),
    "remote_part_bytes": _Setting("NPYDASK_REMOTE_PART_BYTES", 8 * 1024 * 1024, _parse_size),
    "remote_header_bytes": _Setting("NPYDASK_REMOTE_HEADER_BYTES", 4096, _parse_size),
    "remote_concurrency": _Setting("NPYDASK_REMOTE_CONCURRENCY", 64, _parse_size),
    "remote_connect_timeout": _Setting("NPYDASK_REMOTE_CONNECT_TIMEOUT", 5, _parse_size),
    "remote_timeout": _Setting("NPYDASK_REMOTE_TIMEOUT", 30, _parse_size),
    "remote_retries": _Setting("NPYDASK_REMOTE_RETRIES", 3, _parse_size),
    "remote_retry_timeout": _Setting("NPYDASK_REMOTE_RETRY_TIMEOUT", 45, _parse_size),
}

_overrides: dict[str, Any] = {}
_lock = threading.Lock()


def get(name: str) -> Any:
    """Current value of a setting: an active :func:`set`, else its env var, else the default."""
    setting = _SETTINGS.get(name)
    if setting is None:
        raise KeyError(f"unknown npydask setting {name!r}; known: {sorted(_SETTINGS)}")
    if name in _overrides:
        return _overrides[name]
    raw = os.environ.get(setting.env)
    if raw is None:
        return setting.default
    try:
        return setting.parse(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {setting.env}={raw!r}: {e}") from e


def _check(name: str, value: Any) -> Any:
    setting = _SETTINGS.get(name)
    if setting is None:
        raise KeyError(f"unknown npydask setting {name!r}; known: {sorted(_SETTINGS)}")
    if isinstance(value, str):
        try:
            return setting.parse(value)
        except ValueError as e:
            raise ValueError(f"setting {name!r}: {e}") from e
    if type(setting.default) is str:
        raise TypeError(f"setting {name!r} takes a string, found {value!r}")
    if type(setting.default) is bool:
        if not isinstance(value, bool):
            raise TypeError(f"setting {name!r} takes a bool, found {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"setting {name!r} takes a non-negative int, found {value!r}")
    return value


class set(contextlib.AbstractContextManager):  # noqa: A001 - mirrors dask.config.set
    """Change settings globally, or for a ``with`` block.

    Parameters
    ----------
    **values
        ``setting=value`` pairs; strings are parsed as the env var would be.
    """

    def __init__(self, **values: Any) -> None:
        checked = {k: _check(k, v) for k, v in values.items()}
        with _lock:
            self._previous = {k: _overrides.get(k, _MISSING) for k in checked}
            _overrides.update(checked)

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
    values.update({k: _check(k, v) for k, v in overrides.items() if v is not None})
    return ReadOptions(**values)

