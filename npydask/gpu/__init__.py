"""Reading ``.npy`` files into GPU memory: CuPy chunks, read with kvikio or through pinned host memory.

The names other parts of npydask (and users) need are here:
:func:`require_gpu` and :func:`check_gpu_dtype` check a request up front,
:func:`on_device` makes the GPU twin (:class:`DeviceArray`) of a host
array-like, :func:`array_module` is CuPy once it is checked usable,
:func:`check_cuda_fork` refuses a CUDA process forked after CUDA started,
and :func:`describe` says which path reads.

Each name is looked up in the module that defines it when it is used
(``npydask.gpu.require_gpu`` is ``npydask.gpu.device.require_gpu`` at that
moment), so importing this package costs nothing until a name is used, and
imports neither CuPy nor kvikio.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "INSTALL_HINT",
    "WORKER_HINT",
    "DeviceArray",
    "array_module",
    "check_cuda_fork",
    "check_gpu_dtype",
    "describe",
    "on_device",
    "require_gpu",
]

_HOMES = {
    "INSTALL_HINT": "device",
    "WORKER_HINT": "device",
    "DeviceArray": "device",
    "array_module": "device",
    "check_cuda_fork": "process",
    "check_gpu_dtype": "device",
    "describe": "_kvikio",
    "on_device": "device",
    "require_gpu": "device",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
