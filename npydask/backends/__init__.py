"""Host readers behind one small interface, found through a lazy registry.

A backend turns a :class:`~npydask.plan.region.ReadPlan` into a NumPy array. Each
lives in its own module, imported only when first asked for, so ``import
npydask`` never imports CuPy or kvikio. The registry below is what the
``backend=`` argument chooses from, for ``device="cpu"`` only: the device
reader, :mod:`npydask.gpu._kvikio`, is not a registered backend, and
``device="gpu"`` reads with it whatever ``backend=`` says.

===========  =======================================================  ==========
name         reads with                                               needs
===========  =======================================================  ==========
``pread``    ``os.preadv`` into a fresh C-order buffer (``O_DIRECT``   -
             with the ``direct_io`` setting)
``mmap``     a read-only mapping: zero-copy for whole contiguous      -
             chunks, one strided copy otherwise
``deflate``  inflates a ``savez_compressed`` member up to the region's    -
             last byte, then one strided copy (chosen automatically)
===========  =======================================================  ==========
"""

from __future__ import annotations

import importlib

from npydask.backends.base import Backend

__all__ = ["Backend", "available", "get"]

_REGISTRY: dict[str, tuple[str, str]] = {
    "pread": ("npydask.backends.pread", "PreadBackend"),
    "mmap": ("npydask.backends.mmap", "MmapBackend"),
    "deflate": ("npydask.backends.deflate", "DeflateBackend"),
}
_loaded: dict[str, Backend] = {}


def available() -> tuple[str, ...]:
    """Names of the registered backends."""
    return tuple(_REGISTRY)


def get(name: str) -> Backend:
    """The backend called ``name`` (imported on first use)."""
    backend = _loaded.get(name)
    if backend is None:
        if name not in _REGISTRY:
            raise ValueError(f"unknown backend {name!r}: expected one of {['auto', *_REGISTRY]}")
        module, cls = _REGISTRY[name]
        backend = _loaded[name] = getattr(importlib.import_module(module), cls)()
    return backend
